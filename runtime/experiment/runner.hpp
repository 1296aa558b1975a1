// One runner, three hosts: the same plan runs on simulated nodes in virtual time, on logical
// nodes in one process in real time, or as one `starling node` process per node. Each node
// carries out its own share of the plan: it spawns its role instances under its supervisor,
// injects its own faults on CAF's clock, and reports metrics to its sink.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/experiment/graph.hpp"
#include "runtime/experiment/role.hpp"

namespace starling::runtime {

class node;

/// What a run gives back besides its printed report.
struct run_result {
  /// The reporters' verdict (the first non-zero exit code), 0 when all are content.
  int exit_code = 0;
  /// Simulation only: a hash of the whole trace (faults, restarts, metrics, and every message
  /// when traced), equal for two runs of the same plan and seed.
  uint64_t trace_digest = 0;
  /// Run time (virtual in simulation) and wall time, in seconds.
  double run_s = 0;
  double wall_s = 0;
  /// Events in the simulation trace.
  size_t trace_events = 0;
  /// Simulation only: link proxies spawned (handles of one node's actors as seen from another).
  uint64_t proxies_made = 0;
  /// Simulation only: messages to firewalled nodes that they had not asked for (dropped).
  uint64_t unsolicited = 0;
  bool timed_out = false;
};

/// Settings of an in-process run (simulation or local mode).
struct run_settings {
  /// Number of nodes (0: the graph's `nodes`, whose 0 is one node per instance).
  size_t nodes = 0;
  /// Output folder (created by the caller): metrics.jsonl, trace.jsonl, plots.
  std::string out_dir;
  /// Simulation: record every message in the trace (small runs).
  bool trace_messages = true;
  /// Write trace.jsonl (simulation).
  bool write_trace = true;
  /// Local mode: true once the run was asked to stop (SIGINT/SIGTERM); it then ends as at its
  /// duration, with its summary (and the kind's state kept for `--resume`). Unset: never.
  std::function<bool()> stop;
};

/// Runs `g` in simulation or local mode in this process; prints progress and the reporters'
/// summaries.
run_result run_in_process(const experiment_graph& g, const role_registry& registry, run_mode mode,
                          const run_settings& settings);

/// Settings of one cluster node.
struct cluster_settings {
  /// This node's index and the number of nodes (`--index`, `--nodes`).
  size_t index = 0;
  size_t count = 1;
  /// A volunteer (`starling node` without `--index`): claims one of the plan's open slots
  /// through the DHT and runs it (`index` is then ignored).
  bool volunteer = false;
  /// `host:port` of nodes to bootstrap from (`--join`).
  std::vector<std::string> join;
  std::string out_dir;
  /// True once the node was asked to stop (SIGINT/SIGTERM).
  std::function<bool()> stop;
  /// How many times this node's process was restarted (by its `starling node` parent after a
  /// `kill_node` fault): respawned instances download their state and take fresh names.
  int incarnation = 0;
  /// Run time that passed before this process started (a restarted node continues the plan).
  std::chrono::nanoseconds elapsed{0};
  /// A volunteer that leaves gracefully on `stop`: its instances finish the averaging round they
  /// are in (at most its deadline) and store their progress tombstones, its slot is released,
  /// each acknowledged by the DHT, before it returns (0; 1 when an acknowledgement is missing).
  bool graceful_leave = false;
  /// A volunteer's progress line (`your contribution: N samples, M accepted, uptime T`, from the
  /// run's ledger) every this long; 0: none.
  std::chrono::nanoseconds contribution_every{0};
  /// A volunteer watches the nodes of the run's table when it starts; once every one is gone it
  /// says so and returns 3 (instead of waiting for a run nobody serves).
  bool watch_nodes = false;
};

/// Runs node `s.index` of a cluster run on the started node `nd` until the run ends (node 0
/// decides and tells the others through the DHT), its duration passes, or `s.stop()`. Returns
/// the exit code (node 0: the reporters' verdict).
int run_cluster_node(const experiment_graph& g, const role_registry& registry, node& nd,
                     const cluster_settings& s);

} // namespace starling::runtime
