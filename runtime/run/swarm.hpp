// The `swarm` kind: SWARM pipeline training as a graph of two role types. `swarm.stage`
// (instance i is peer slot i of the pipeline: its first stage and speed come from the `stages`
// list; rebalancing may move it) and `swarm.trainer`. Stage peers and trainers meet on a board:
// the DHT-backed board of their node in local and cluster mode, an idealized in-process board in
// simulation (seen from each node through link proxies, so every hop and state download is
// modeled). In simulation the peers compute with the cost model; otherwise with the model.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/data/batch_progress.hpp"
#include "runtime/experiment/reporter.hpp"
#include "runtime/experiment/role.hpp"
#include "runtime/graph/swarm_graph.hpp"

namespace starling::runtime {

/// How trainers route microbatches.
enum class swarm_routing { stochastic, uniform, fixed };

/// The `swarm.sim:` section: cost model, routing and rebalancing of simulated runs.
struct swarm_sim_options {
  /// `compute: torch`: the stage peers run the model itself (real activations, gradients,
  /// steps, averaging of real tensors, checkpoints) with the device time modeled as below, on
  /// the real data: a real loss curve in virtual time, the same for every run of a seed
  /// (LibTorch single-threaded). `compute: model` (default): the cost model, no learning.
  bool real_compute = false;
  /// Forward seconds per sample at speed 1, times the stage's `stage_work` (empty = all 1).
  double forward_s = 0.01;
  std::vector<double> stage_work;
  double backward_factor = 2.0;
  /// Sigma of each request's lognormal compute noise (mean 1).
  double noise = 0.0;
  /// Placeholder floats per sample in activations and gradients.
  int64_t payload = 4;
  /// How long a whole stage state takes over a default link (the cost model's state bytes).
  std::chrono::nanoseconds state_transfer = std::chrono::seconds(2);
  swarm_routing routing = swarm_routing::stochastic;
  /// Microbatches in flight per live stage peer, shared by the trainers, at most `inflight_cap`
  /// per trainer; 0 = the graph's fixed `max_inflight` (the default with `compute: torch`).
  double inflight_per_peer = 6.0;
  int64_t inflight_cap = 1024;
  /// Stochastic routing probes two candidates per hop (power of two choices).
  bool probe = true;
  /// With probes: a microbatch's first forward waits at its trainer while the stage-0 peer it
  /// would join has more than this much work queued (trainer_options::entry_backlog_s); 0 = off.
  std::chrono::nanoseconds entry_backlog{0};
  /// The same for every later forward hop (trainer_options::forward_backlog_s); 0 = off.
  std::chrono::nanoseconds forward_backlog{0};
  /// Rebalancing period (0 = off), threshold, and placing restarted peers where needed.
  std::chrono::nanoseconds rebalance_period = std::chrono::seconds(60);
  double rebalance_threshold = 0.05;
  bool place_new_peers = true;
  std::chrono::nanoseconds report_every = std::chrono::seconds(10);
  std::chrono::nanoseconds refresh_every = std::chrono::seconds(5);
  /// The bound and the measured samples count from here on.
  std::chrono::nanoseconds warmup = std::chrono::seconds(0);
  /// Peers per stage drawn with lognormal speeds (0: the `stages` list's speeds).
  int64_t peers_per_stage = 0;
  double speed_sigma = 0.5;
  /// Run the strategy comparison and the rebalancing-period sweep instead of one run.
  bool study = false;
  std::vector<std::chrono::nanoseconds> study_periods;
  /// Record every message in the trace.
  bool trace_messages = false;
};

/// Everything the swarm roles and reporters share, fixed for a run.
struct swarm_setup {
  graph::swarm_graph graph;
  /// (stage, speed) of every peer slot, stage-major.
  std::vector<std::pair<uint64_t, double>> slots;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  /// DHT key prefix of the experiment (`swarm/<name>`).
  std::string prefix;
  /// Cost-model compute (simulation) instead of the model.
  bool modeled = false;
  swarm_sim_options sim;
  /// The network's default link (for the cost model's state bytes and the Little bound).
  double bandwidth = 100e6;
  std::chrono::nanoseconds latency{0};
  /// Number of trainer instances (pipelines in fixed routing).
  int64_t trainers = 1;
  /// The tags of the trainers' microbatch ids (`collab::trainer_tags` of `trainer.0`...
  /// `trainer.<trainers-1>`, the plan's order): distinct, so that no two trainers share ids or
  /// credits.
  std::map<std::string, uint64_t> trainer_tags;
};

/// The options of both swarm role types: the run's shared setup.
struct swarm_role_options {
  std::shared_ptr<const swarm_setup> setup;
  /// A volunteer's stage peer (role `volunteers`, an open slot): full speed, placed by the
  /// board when it starts, and it downloads its stage's state.
  bool volunteer = false;
};

/// The board of the node `h`: a DHT board (local, cluster) or a view of the simulation's shared
/// board.
caf::actor swarm_board(host& h, const swarm_setup& s);

/// The progress files of every node folder of the run in `run_dir` (`<node>/progress/`, each
/// read by actors::trainer::read_progress_dir).
result<std::map<std::string, kernels::batch_progress>>
read_run_progress(const std::string& run_dir);

/// The reporter of local and cluster runs: progress line, summary, held-out loss, plots.
std::unique_ptr<reporter> make_swarm_reporter(std::shared_ptr<const swarm_setup> s);

/// What a simulated run measured (the study's rows).
struct swarm_sim_outcome {
  int64_t samples = 0;
  int64_t microbatches = 0;
  int64_t retries = 0;
  int64_t migrations = 0;
  int64_t preemptions = 0;
  int64_t restarts = 0;
  double measured_samples = 0;
  double measured_s = 0;
  double bound_samples = 0;
  double assigned_bound_samples = 0;
  double little_bound = 0;
  double wall_s = 0;
  double run_s = 0;
  std::vector<int64_t> peers_per_stage;
};

/// The reporter of simulated runs: throughput against the fluid and Little bounds; fills `out`
/// (when set) for a study's table.
std::unique_ptr<reporter> make_swarm_sim_reporter(std::shared_ptr<const swarm_setup> s,
                                                  std::shared_ptr<swarm_sim_outcome> out = {});

/// Draws `count` lognormal speeds (sigma `sigma`, median 1) scaled into (0, 1], seeded.
std::vector<double> lognormal_speeds(size_t count, double sigma, uint64_t seed);

} // namespace starling::runtime
