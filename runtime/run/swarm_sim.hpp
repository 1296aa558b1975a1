// SWARM in simulation mode (`starling run <swarm config> --sim`): the same stage, trainer and
// supervisor actors as local and cluster mode, in the deterministic virtual-time world
// (runtime/sim), with modeled compute (a stage peer's forward/backward takes work / speed virtual
// seconds and carries placeholder tensors) and every actor-to-actor hop going through the network
// model. The board (who serves which stage, measured throughputs, migration claims) is the
// in-process board standing for the DHT; its traffic is not modeled.
//
// The throughput bound. A training sample costs stage s `w_s = forward_s * stage_work[s] *
// (1 + backward_factor)` seconds of a speed-1 device, so a peer of speed v gives v / w_s samples
// per second to stage s. At time t with live peers L(t):
// - assigned bound: min over s of sum_{p in L(t) serving s} v_p / w_s (the bound, for the
//   assignment of peers to stages in effect; rebalancing changes it);
// - fluid bound: sum_{p in L(t)} v_p / sum_s w_s (the best any assignment can do, even with
//   peers split fractionally between stages; the same for every strategy);
// - communication: with N microbatches of m samples in flight and a microbatch needing at least
//   T_min = sum_s m w_s / v_max + 4 S (latency + bytes / bandwidth) (compute at the fastest peer
//   plus a request and a reply per hop, 2 S hops), throughput is at most N m / T_min (Little's
//   law).
// The reported bound integrates min(fluid, Little) over the run; fractions are completed samples
// divided by it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/config/config.hpp"
#include "runtime/graph/swarm_graph.hpp"
#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// How trainers route microbatches in a simulation.
enum class sim_routing { stochastic, uniform, fixed };

/// Settings of one simulated SWARM run (the graph gives stages, speeds, trainers, microbatches).
struct swarm_sim_settings {
  /// Forward seconds per sample at speed 1, times the stage's `stage_work` (empty = all 1).
  double forward_s = 0.01;
  std::vector<double> stage_work;
  double backward_factor = 2.0;
  /// Sigma of each request's lognormal compute noise (mean 1).
  double noise = 0.0;
  /// Placeholder floats per sample in activations and gradients.
  int64_t payload = 4;
  /// Extra time a state download takes (the modeled parameter transfer).
  std::chrono::nanoseconds state_transfer = std::chrono::seconds(2);
  sim_routing routing = sim_routing::stochastic;
  /// Microbatches in flight: `inflight_per_peer` per live stage peer, shared by the trainers,
  /// at most `inflight_cap` per trainer (trainer.hpp); 0 = the graph's fixed `max_inflight`.
  /// Fixed pipelines get the same total as a fixed window per pipeline.
  double inflight_per_peer = 6.0;
  int64_t inflight_cap = 1024;
  /// Stochastic routing probes two candidates per hop and picks the one that finishes first.
  bool probe = true;
  /// Rebalancing: period (0 = off), threshold, and whether restarted peers join the stage that
  /// needs them most.
  std::chrono::nanoseconds rebalance_period = std::chrono::seconds(60);
  double rebalance_threshold = 0.05;
  bool place_new_peers = true;
  std::chrono::nanoseconds report_every = std::chrono::seconds(10);
  std::chrono::nanoseconds refresh_every = std::chrono::seconds(5);
  /// Preemptions: each peer at this rate per simulated hour (plus the graph's `preempt_every`
  /// for the whole swarm), restarted after the graph's `restart_delay`.
  double preemptions_per_hour = 0.0;
  /// Explicit preemptions: (time, peer slot); `kills_restart` false = the peer never returns.
  std::vector<std::pair<std::chrono::nanoseconds, size_t>> kills;
  bool kills_restart = true;
  /// Explicit losses of a peer for good (whatever `kills_restart` says).
  std::vector<std::pair<std::chrono::nanoseconds, size_t>> kills_for_good;
  network_options network;
  std::chrono::nanoseconds duration = std::chrono::minutes(10);
  /// The bound and the measured samples count from here on (the pipeline fills up before).
  std::chrono::nanoseconds warmup = std::chrono::seconds(0);
  /// Throughput is sampled every `bucket`.
  std::chrono::nanoseconds bucket = std::chrono::seconds(10);
  /// Stop when every trainer completed its microbatches (else run the whole duration).
  bool stop_when_done = true;
  /// Record every message in the trace (small runs; the digest then covers them).
  bool trace_messages = false;
  uint64_t seed = 42;
};

/// What a simulated run measured.
struct swarm_sim_result {
  /// Per bucket: end time (s), samples completed in it, and the bounds (samples/s) averaged over
  /// it; live peers per stage at its end.
  std::vector<double> t;
  std::vector<double> samples;
  std::vector<double> fluid_bound;
  std::vector<double> assigned_bound;
  std::vector<std::vector<int64_t>> peers_per_stage;
  /// Little's-law bound (samples/s) from the microbatches in flight.
  double little_bound = 0;
  int64_t total_samples = 0;
  int64_t microbatches = 0;
  int64_t retries = 0;
  int64_t migrations = 0;
  int64_t preemptions = 0;
  int64_t respawns = 0;
  /// Respawns and migrations (including placements of restarted peers in another stage) as
  /// "<seconds> <what>".
  std::vector<std::string> events;
  double simulated_s = 0;
  double wall_s = 0;
  uint64_t digest = 0;
  /// Samples completed after the warm-up, and the integrals of min(fluid, Little) and
  /// min(assigned, Little) over the same time, in samples.
  double measured_samples = 0;
  double measured_s = 0;
  double bound_samples = 0;
  double assigned_bound_samples = 0;
};

/// Runs `graph` in the simulated world with modeled compute.
result<swarm_sim_result> simulate_swarm(const graph::swarm_graph& graph,
                                        const swarm_sim_settings& settings);

/// Draws `count` lognormal speeds (sigma `sigma`, median 1) scaled into (0, 1] (divided by the
/// largest), seeded.
std::vector<double> lognormal_speeds(size_t count, double sigma, uint64_t seed);

/// Reads the `sim` section under `swarm` as `run_swarm_sim` does, and discards it; throws
/// config_error.
void validate_swarm_sim_section(config_node& sim);

/// `starling run <swarm config> --sim`: reads `swarm` (and its optional `sim` section), runs one
/// simulation, or with `sim.study` the strategy comparison and the rebalancing-period sweep, and
/// prints the results.
int run_swarm_sim(const experiment_config& cfg, const run_context& ctx);

} // namespace starling::runtime
