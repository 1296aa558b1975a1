// The progress core of a collaboration (DeDLOC): what one peer publishes about its own work, how
// those records are encoded for the DHT, and how the collaboration's progress towards the next
// global step is estimated from them. No CAF, no torch; time is a plain value passed in.
//
// Every peer publishes a record (step, samples accumulated at that step, samples per second,
// the time it was made, client-mode flag) under its own sub-key of the collaboration's progress
// key, signed with its node key by the DHT layer. Any peer estimates the collaboration's samples
// at time t as
//
//     S(t) = Σ samples_i + Σ rate_i · (t − t_i)        over fresh records at the current step,
//
// (its own count exact, not extrapolated), the time left to the target batch B as
// ETA = max(0, B − S(t)) / Σ rate_i, and reads again after ETA·N / max(N + 3, 1.2·N) clipped to
// [min_refresh, max_refresh]: the more peers, the sooner the estimate goes stale (hivemind's
// ProgressTracker). For the refresh only, peers whose records say rate 0 (not measured yet) are
// presumed at the measured peers' mean rate, as hivemind's new peers publish an unbounded rate. A record stops counting when it expires (its peer left without a word) or at
// once when its peer withdrew it (a tombstone record, published when leaving on purpose).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::collab {

/// Seconds on the collaboration's clock (DHT time): what every `now`, record time and expiry is.
using seconds = double;

/// Longest peer id a record may carry, in bytes.
inline constexpr size_t max_peer_id_bytes = 128;

/// Largest sample count a record may carry (2^53: exact as a double).
inline constexpr uint64_t max_record_samples = uint64_t{1} << 53;

/// Largest rate a record may carry, in samples per second (a larger one is a lie or a bug).
inline constexpr double max_record_rate = 1e12;

/// One peer's progress as it publishes it.
struct progress_record {
  /// The publisher's peer id; also the record's sub-key (a record whose id differs is refused).
  std::string peer;
  /// The global step the samples belong to (optimizer updates the peer has taken).
  uint64_t step = 0;
  /// Samples accumulated towards `step`'s update.
  uint64_t samples = 0;
  /// Samples per second, an exponential moving average.
  double rate = 0;
  /// When the record was made.
  seconds time = 0;
  /// The peer is in client mode: nobody can connect to it (it is no state donor).
  bool client_mode = false;
  /// A tombstone: the peer left on purpose and its earlier record must stop counting at once.
  bool withdrawn = false;
  /// The peer averages its state after the update of `step` (it took a lone step before): peers
  /// finishing the same step join that state round.
  bool resync = false;
};

/// The record's value bytes (little-endian): version 1, flags (client, withdrawn, resync), step,
/// samples, rate, time, peer id length and bytes. Decode accepts exactly what this produces.
std::vector<char> encode_progress(const progress_record& r);

/// Decodes value bytes from the network: fails, never throws, on a wrong size or version, unknown
/// flags, samples above 2^53, a negative, non-finite or absurd rate, a non-finite time or an empty
/// or oversized peer id.
result<progress_record> decode_progress(const std::vector<char>& bytes);

/// A record as a DHT read returns it: the sub-key it was stored under, its value bytes (still
/// untrusted) and when it expires.
struct progress_entry {
  /// The sub-key (the publisher's peer id).
  std::string subkey;
  /// Value bytes.
  std::vector<char> value;
  /// Expiry on the collaboration's clock.
  seconds expires_at = 0;
};

/// A decoded record that is held with its expiry.
struct held_record {
  /// The record.
  progress_record record;
  /// It stops counting at this time.
  seconds expires_at = 0;
  /// Not read but presumed (`progress_tracker::presume_stepped`): the peer's own record from
  /// before the step replaces it only when it is newer.
  bool presumed = false;
  /// When the peer made the record whose rate this one carries (for a presumed record, the
  /// record it was presumed from, or a later one of the same peer that updated its rate).
  seconds rate_time = 0;
};

/// Tunables of the estimate and of the refresh period.
struct progress_options {
  /// Samples per global step summed over the collaboration.
  uint64_t target_batch = 4096;
  /// Shortest time between two reads of the collaboration's progress.
  seconds min_refresh = 0.5;
  /// Longest time between two reads (also the period while nobody makes progress).
  seconds max_refresh = 30;
  /// Peers expected to appear before the next read (the "+ 3" of the refresh formula).
  double expected_drift_peers = 3;
  /// Fraction of peers expected to appear before the next read (the "1.2" of the formula).
  double expected_drift_rate = 0.2;
  /// A published record expires this long after it was made (a silent leaver stops counting).
  seconds record_lifetime = 60;
};

/// Checks `o`: a positive target, 0 < min_refresh <= max_refresh, drifts >= 0, lifetime > 0.
status validate(const progress_options& o);

/// A peer the estimate saw at a later step than ours.
struct ahead_peer {
  /// Its id.
  std::string peer;
  /// Its step.
  uint64_t step = 0;
  /// Whether it is in client mode (then it cannot serve its state).
  bool client_mode = false;
};

/// The collaboration's progress at one time, as one peer sees it.
struct progress_estimate {
  /// The step estimated (the peer's own).
  uint64_t step = 0;
  /// Estimated samples at `step` now, own count included.
  double samples = 0;
  /// Summed rate of the peers counted, samples per second.
  double rate = 0;
  /// Peers counted (fresh records at `step`, the peer itself included).
  size_t peers = 0;
  /// Of those, peers whose rate is 0 (not measured yet, or idle): the refresh period presumes
  /// they go at the measured peers' mean rate (the ETA and `reached` do not).
  size_t unmeasured = 0;
  /// Seconds until the target is reached, >= 0; infinite when nobody makes progress.
  seconds eta = 0;
  /// The time the target is reached (`now + eta`).
  seconds eta_at = 0;
  /// How long until the next read (the refresh formula over the ETA with unmeasured peers at
  /// the measured peers' mean rate, clipped).
  seconds refresh_in = 0;
  /// The estimate reached the target.
  bool reached = false;
  /// Fresh records at later steps, highest step first (then by id): the collaboration moved on.
  std::vector<ahead_peer> ahead;
  /// Fresh records at earlier steps (peers that will catch up).
  size_t behind = 0;
};

/// The refresh period for an ETA and a peer count: eta·n / max(n + drift, (1 + rate)·n),
/// clipped to [min_refresh, max_refresh]; max_refresh when eta is infinite.
seconds refresh_period(seconds eta, size_t peers, const progress_options& o);

/// The estimate at `now` for a peer at `step` with `own_samples` accumulated and rate `own_rate`
/// from the `others`' records (its own record among them is ignored: its count is exact).
/// Records expired at `now` or withdrawn do not count.
progress_estimate estimate_progress(const std::vector<held_record>& others, const std::string& self,
                                    uint64_t step, uint64_t own_samples, double own_rate,
                                    seconds now, const progress_options& o);

/// Counts of one DHT read.
struct read_summary {
  /// Records taken into the view.
  size_t accepted = 0;
  /// Records refused: malformed value or a peer id that differs from the sub-key.
  size_t rejected = 0;
  /// Tombstones seen (their peers were dropped).
  size_t withdrawn = 0;
};

/// The collaboration's records as last read, with the estimate over them.
class progress_tracker {
public:
  /// A tracker for the peer `self`.
  progress_tracker(std::string self, progress_options opts);

  /// Replaces the view with one DHT read: a peer absent from it expired or withdrew. The
  /// peer's own record and records already expired at `now` are skipped.
  read_summary observe(const std::vector<progress_entry>& entries, seconds now);

  /// Drops `peer` at once (its owner learned that it left).
  void forget(const std::string& peer);

  /// This peer finished the round of `step` at `now` with an averaged update: the peers held at
  /// `step` went into the same round (one key per step) and are presumed at `step + 1` from
  /// `now` on, with no samples yet and their last rate, so that the next step's ETA is known at
  /// once instead of after a read. A read right after the step still returns their records from
  /// before it (their new ones are being stored): such a record (at an earlier step, made no
  /// later than `now`) leaves the presumed one in place and only refreshes its rate when it is
  /// newer than the one it carries, and its expiry too when it shows samples accumulated (its
  /// peer is at work); any other record of theirs replaces it.
  void presume_stepped(uint64_t step, seconds now);

  /// The estimate at `now` (see `estimate_progress`).
  progress_estimate estimate(uint64_t step, uint64_t own_samples, double own_rate,
                             seconds now) const;

  /// The records held.
  const std::vector<held_record>& records() const noexcept { return records_; }

  /// The options.
  const progress_options& options() const noexcept { return opts_; }

private:
  std::string self_;
  progress_options opts_;
  std::vector<held_record> records_;
};

/// The peer's own side: samples accumulated since the last `take` and the rate as an EMA of
/// seconds per sample with bias correction (hivemind's PerformanceEMA), so a few slow or fast
/// microbatches do not swing the collaboration's ETA.
class local_progress {
public:
  /// A counter whose EMA weighs a new measurement by `alpha` in (0, 1].
  explicit local_progress(double alpha = 0.1);

  /// Counts `samples` finished at `now`. The rate is measured over the time since the previous
  /// call (or `idle`); several calls at one instant are measured together at the next later one.
  void add(uint64_t samples, seconds now);

  /// The peer did no work since the last call (it waited, downloaded, was paused): the next
  /// measurement starts at `now`.
  void idle(seconds now);

  /// Samples counted since the last `take`.
  uint64_t samples() const noexcept { return samples_; }

  /// Returns the samples counted and starts counting from zero.
  uint64_t take();

  /// Samples per second; 0 until one interval was measured.
  double rate() const;

private:
  double alpha_;
  uint64_t samples_ = 0;
  bool has_mark_ = false;
  seconds mark_ = 0;
  uint64_t since_mark_ = 0;
  double ema_seconds_per_sample_ = 0;
  uint64_t updates_ = 0;
};

} // namespace starling::actors::collab
