// The simulated network: per-link latency, bandwidth (links queue), loss and partitions.
// Pure: no CAF, time is passed in as nanoseconds since the start of the simulation.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>

#include "runtime/config/config.hpp"

namespace starling::runtime::sim {

/// Why a transfer did not happen.
enum class drop_reason { none, loss, partition, node_down };

/// Outcome of one transfer request.
struct transfer_result {
  /// Arrival time in ns since start; meaningful when `reason == drop_reason::none`.
  int64_t arrival_ns = 0;
  drop_reason reason = drop_reason::none;
};

/// Directed links between numbered nodes; unspecified links use the defaults.
class network_model {
public:
  /// Uses `defaults` for every link and `seed` for loss decisions.
  network_model(link_options defaults, uint64_t seed);

  /// Overrides the link from `from` to `to` (one direction).
  void set_link(int from, int to, const link_options& opts);
  /// The settings of the link from `from` to `to`.
  const link_options& link(int from, int to) const;

  /// Gives every link without an override its own latency, drawn uniformly from [lo, hi] by a
  /// hash of the model's seed and the (unordered) pair of nodes: both directions agree and the
  /// same seed gives the same latencies. Off (the defaults' latency) until called.
  void set_latency_range(std::chrono::nanoseconds lo, std::chrono::nanoseconds hi);
  /// One-way latency of the link from `from` to `to` in ns.
  int64_t latency_ns(int from, int to) const;

  /// Cuts both directions between `a` and `b`.
  void partition(int a, int b);
  /// Restores both directions between `a` and `b`.
  void heal(int a, int b);
  /// True while `a` and `b` are partitioned.
  bool partitioned(int a, int b) const;

  /// Sends `bytes` from `from` to `to` at `now_ns`: the transfer starts when the link is free,
  /// takes bytes / bandwidth, then latency. Loss and partitions drop it (queue unchanged).
  transfer_result transfer(int from, int to, uint64_t bytes, int64_t now_ns);

  /// Forgets queued transfers on links touching `n` (its sockets are gone).
  void reset_node(int n);

private:
  link_options defaults_;
  uint64_t seed_;
  int64_t latency_lo_ns_ = -1;
  int64_t latency_hi_ns_ = -1;
  std::map<std::pair<int, int>, link_options> links_;
  /// Hashes a pair of small integers (node indices, actor ids) for the hot lookups.
  struct pair_hash {
    size_t operator()(const std::pair<int, int>& p) const noexcept {
      return std::hash<uint64_t>{}((static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32) |
                                   static_cast<uint32_t>(p.second));
    }
  };
  /// When each link is free again (looked up for every message: hashed, not ordered).
  std::unordered_map<std::pair<int, int>, int64_t, pair_hash> busy_until_;
  std::set<std::pair<int, int>> cut_;
  std::mt19937_64 rng_;
};

} // namespace starling::runtime::sim
