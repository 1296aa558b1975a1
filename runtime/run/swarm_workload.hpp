// The `swarm` workload: SWARM pipeline training of a byte-level GPT on stage peers of different
// speeds, with preemptions and restarts, in one process (local mode).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "runtime/graph/swarm_graph.hpp"
#include "runtime/node/node.hpp"
#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// The `swarm` section is an experiment graph (runtime/graph).
using swarm_options = graph::swarm_graph;

/// Where a driver runs its share of a graph: the actor system, the board (in-process or
/// DHT-backed), the roles of this node, how to register a named actor on the node, and when to stop.
struct swarm_env {
  caf::actor_system* sys = nullptr;
  caf::actor board;
  graph::placement roles;
  bool cluster = false;
  std::function<void(const std::string&, const caf::actor&)> register_actor;
  std::function<bool()> stop_requested;
  /// For gradient averaging (graph.averaging enabled): the node's DHT actor, its resolver
  /// (`host:port/name` -> actor) and its endpoint (`host:port`), under which the stage peers'
  /// averagers are registered through `register_actor`.
  caf::actor dht;
  caf::actor resolver;
  std::string endpoint;
};

/// Runs the workload (local mode: one process, in-process board).
int run_swarm(const experiment_config& cfg, const run_context& ctx);

/// Cluster mode: this node's share of the graph (a DHT node, a DHT-backed board, its stage peers
/// and trainers) on a started node, until its trainers are done or `ctx.stop()` holds.
int run_swarm_node(const experiment_config& cfg, node& nd, const cluster_context& ctx);

/// Runs `env.roles` of `graph` with progress output; prints the summary where trainers run.
int drive_swarm(const experiment_config& cfg, const swarm_options& graph, const std::string& out_dir,
                swarm_env& env);

} // namespace starling::runtime
