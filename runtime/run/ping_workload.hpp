// The `ping` workload: every node pings random other nodes and measures round trips.
#pragma once

#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// Options of the `ping` section.
struct ping_options {
  /// Number of nodes.
  int64_t nodes = 4;
  /// Bytes carried by each ping (and its reply).
  uint64_t payload = 1'000'000;
  /// Each node pings one random other node this often.
  std::chrono::nanoseconds interval = std::chrono::seconds(1);
  /// A ping without reply by then counts as lost.
  std::chrono::nanoseconds timeout = std::chrono::seconds(2);
};

/// Reads the `ping` section.
void read_options(config_node& n, ping_options& out);

/// Runs the workload in simulation (virtual time) or local mode (loopback, real time).
int run_ping(const experiment_config& cfg, const run_context& ctx);

} // namespace starling::runtime
