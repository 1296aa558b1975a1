// The plan: a pure function (graph, mode, number of nodes, seed) -> role instances with their
// nodes and start/stop times, and the fault plan with times and victims. Every host of a run
// computes the same plan from the same inputs and carries out its own share of it; nothing here
// touches an actor.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/experiment/graph.hpp"

namespace starling::runtime {

/// One role instance of the run.
struct planned_instance {
  /// Index into the graph's roles, and the instance's index within its role.
  size_t role = 0;
  size_t index = 0;
  /// `<role>.<index>`.
  std::string name;
  /// The node it runs on; unset for an open (volunteer) slot in cluster mode.
  std::optional<size_t> node;
  /// When it starts (0, or a join event's time) and leaves on purpose (a leave event).
  std::chrono::nanoseconds start{0};
  std::optional<std::chrono::nanoseconds> leave;
};

/// One action of the fault plan.
struct planned_fault {
  enum class action {
    /// Kill `instance` (an index into the plan's instances); respawned after `restart` unless
    /// `never`.
    kill_instance,
    /// Kill node `node` and everything on it; restarted after `restart` unless `never`.
    kill_node,
    /// Cut the links between nodes of different `groups`.
    partition,
    /// Restore every link cut by the partition started by fault `origin`.
    heal,
    /// Set the link between `node` and `peer` (both directions) to `latency`/`bandwidth`.
    slow_link,
    /// Restore that link to the network defaults.
    restore_link,
    /// The run's authority bans node `node` (simulation), telling it `reason`.
    ban,
  };
  std::chrono::nanoseconds at{0};
  action what = action::kill_instance;
  size_t instance = 0;
  size_t node = 0;
  size_t peer = 0;
  std::chrono::nanoseconds restart{0};
  bool never = false;
  std::vector<std::vector<size_t>> groups;
  std::chrono::nanoseconds latency{0};
  double bandwidth = 0;
  /// `ban`: why.
  std::string reason;
  /// Index of the graph fault this action comes from.
  size_t origin = 0;
};

/// `kill_instance`, `kill_node`, `partition`, `heal`, `slow_link`, `restore_link` or `ban`.
const char* to_string(planned_fault::action a);

/// A whole plan.
struct plan {
  run_mode mode = run_mode::local;
  /// Numbered nodes (open slots come on top in sim and local mode).
  size_t nodes = 1;
  uint64_t seed = 0;
  std::vector<planned_instance> instances;
  /// Sorted by time (ties keep the graph's order).
  std::vector<planned_fault> faults;

  /// Indices of the instances on node `n`.
  std::vector<size_t> on_node(size_t n) const;
  /// Indices of the instances of graph role `role`.
  std::vector<size_t> of_role(size_t role) const;
  /// The instance `index` of graph role `role`, or null.
  const planned_instance* find(size_t role, size_t index) const;
  /// The fault actions a node carries out: kills of its instances, its own kill, partitions
  /// that include it (`slow_link`s: none outside simulation).
  std::vector<size_t> faults_of(size_t n) const;
  /// Total nodes a sim or local run creates (numbered plus one per open slot).
  size_t total_nodes() const;
};

/// Builds the plan for `nodes` nodes (0: the graph's `nodes`, which 0 makes one node per
/// instance). Deterministic for (graph, mode, nodes, seed). Fails with a clear reason when a
/// placement cannot be met (a pin beyond the last node, colocation with a missing role).
result<plan> make_plan(const experiment_graph& g, run_mode mode, size_t nodes, uint64_t seed);

/// A human-readable listing of the plan: nodes with their instances, then the fault plan.
std::string describe(const experiment_graph& g, const plan& p);

/// Per-instance seeds: a stable mix of the run's seed, the role name, the index and the
/// generation.
uint64_t instance_seed(uint64_t seed, const std::string& role, size_t index, int generation);

} // namespace starling::runtime
