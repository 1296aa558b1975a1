// Stochastic wiring (SWARM): for each stage, route the next microbatch to the peer with the
// smallest accumulated expected time, then charge that peer `work / throughput`. Pure: no CAF, no
// clock (time is passed in), so simulations replay exactly.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "actors/trainer/ready_list.hpp"

namespace starling::actors::trainer {

/// Bias-corrected exponential moving average (Adam-style): unbiased from the first sample.
class throughput_ema {
public:
  /// An average with smoothing factor `alpha` in (0, 1].
  explicit throughput_ema(double alpha = 0.1) : alpha_(alpha) {}

  /// Adds one measurement.
  void add(double sample);

  /// True after at least one measurement.
  bool measured() const noexcept { return count_ > 0; }

  /// Number of measurements.
  int64_t count() const noexcept { return count_; }

  /// The bias-corrected average; 0 before any measurement.
  double value() const noexcept;

private:
  double alpha_;
  double raw_ = 0.0;
  double decay_ = 1.0; // (1 - alpha)^count, the bias correction's denominator complement
  int64_t count_ = 0;
};

/// Microbatches one trainer keeps in flight (the adaptive window): `per_peer` times the live stage
/// peers it sees over all stages, shared among `trainers` trainers, rounded up and clamped to
/// [1, cap]. A microbatch sits at one stage peer at a time, so by Little's law every peer needs
/// several queued (not about one) to stay busy while the others' replies travel and its own
/// share fluctuates. `fallback` (the fixed window) when `per_peer` is not positive, no peer is
/// seen yet or `trainers` is not positive.
int64_t inflight_target(size_t peers_seen, int64_t trainers, double per_peer, int64_t cap,
                        int64_t fallback);

/// Direction of a hop through a stage.
enum class pass { forward, backward };

/// Tunables of the wiring policy.
struct wiring_options {
  /// Smoothing factor of the throughput averages.
  double alpha = 0.1;
  /// Backward work relative to forward for a peer whose backward was never measured.
  double backward_factor = 2.5;
  /// Forward samples/second assumed for a stage none of whose peers was measured yet.
  double default_throughput = 1.0;
  /// Nonzero: a new peer enters at the heap's minimum plus a seeded random nudge (up to
  /// `tie_break` seconds), so that trainers with different seeds do not all try a stage's new
  /// peers in the same (name) order; 0 = ties broken by name.
  uint64_t seed = 0;
  double tie_break = 1e-3;
};

/// Per-stage min-heaps of peers keyed by accumulated expected time, with measured throughputs and
/// temporary exclusions of failed peers.
class wiring_policy {
public:
  /// A policy for a pipeline of `stages` stages, no peers yet.
  explicit wiring_policy(size_t stages, wiring_options opts = {});

  /// Number of stages.
  size_t stages() const noexcept { return stages_.size(); }

  /// Sets the stage's peers to `peers` (e.g. after reading the DHT): absent ones are removed, new
  /// ones enter at the heap's current minimum so they are tried soon; known ones keep their state.
  void refresh(size_t stage, const std::vector<std::string>& peers);

  /// Adds one peer at the heap's current minimum; no effect if already known.
  void add_peer(size_t stage, const std::string& peer);

  /// Forgets a peer; no effect if unknown.
  void remove_peer(size_t stage, const std::string& peer);

  /// The peer to serve `samples` samples of `dir` work at time `now`, charged its expected time;
  /// nullopt when the stage has no peer that is not excluded. Same as `peek` then `charge`.
  std::optional<std::string> pick(size_t stage, pass dir, double samples, double now);

  /// The peer `pick` would choose at time `now` (the least accumulated expected time), without
  /// charging it; nullopt when the stage has no peer that is not excluded.
  std::optional<std::string> peek(size_t stage, double now);

  /// Up to `count` distinct candidates for the next hop at time `now`, none charged: first the
  /// peer `peek` gives, then peers drawn at random from the other ready ones with probability
  /// proportional to their estimated forward throughput (seeded). Fewer when fewer are ready.
  std::vector<std::string> sample(size_t stage, double now, size_t count);

  /// Charges `peer` the expected time of `samples` samples of `dir` work (it moves down the
  /// heap); no effect for an unknown or excluded peer.
  void charge(size_t stage, const std::string& peer, pass dir, double samples);

  /// Takes back a `charge` of the same work (a reservation that was not used); the peer's load
  /// does not drop below the heap's minimum. No effect for an unknown or excluded peer.
  void refund(size_t stage, const std::string& peer, pass dir, double samples);

  /// Live peers known over all stages (excluded ones included).
  size_t peer_count() const;

  /// Records that `peer` processed `samples` samples of `dir` work in `seconds`.
  void report_success(size_t stage, const std::string& peer, pass dir, double samples,
                      double seconds);

  /// Excludes `peer` (it returned an error) until time `until`; it then re-enters at the heap's
  /// current minimum.
  void exclude(size_t stage, const std::string& peer, double until);

  /// True if `peer` is known and excluded at time `now`.
  bool excluded(size_t stage, const std::string& peer, double now) const;

  /// Estimated samples/second of `peer` for `dir`; nullopt for an unknown peer.
  std::optional<double> throughput(size_t stage, const std::string& peer, pass dir) const;

  /// The stage's known peers (excluded ones included), sorted.
  std::vector<std::string> peers(size_t stage) const;

private:
  struct peer_state {
    double load = 0.0;
    throughput_ema forward;
    throughput_ema backward;
    std::optional<double> excluded_until;
  };

  struct stage_state {
    std::map<std::string, peer_state> peers;
    /// (load, id) of the peers that are not excluded: the min-heap (ordered, to allow removal),
    /// each with its measured forward throughput (the value) so that a walk needs no lookups.
    ready_list ready;
    /// (until, id) of the excluded peers: readmission looks at the expired ones only.
    std::set<std::pair<double, std::string>> excluded;
    /// The measured peers' forward throughputs in name order (names borrowed from `peers`).
    std::vector<std::pair<const std::string*, double>> measured;
    /// Their mean (what an unmeasured peer is assumed to do), summed in name order as the walk
    /// over `peers` summed it and kept until a peer or a forward measurement changes: the same
    /// number, computed once per change instead of once per unmeasured peer.
    mutable std::optional<double> mean_forward;
  };

  double min_load(const stage_state& s) const;
  double mean_forward(const stage_state& s) const;
  double expected_seconds(const stage_state& s, const peer_state& p, pass dir,
                          double samples) const;
  void readmit_expired(stage_state& s, double now);
  void add_load(size_t stage, const std::string& peer, double delta);

  wiring_options opts_;
  std::vector<stage_state> stages_;
  std::mt19937_64 rng_;
};

} // namespace starling::actors::trainer
