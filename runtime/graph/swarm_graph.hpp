// The experiment graph of SWARM pipeline training: which stages exist (layer ranges, peers and
// their speeds), trainers, batch sizes, optimizer, compression and faults. Two front doors build
// the same graph: the C++ builder below and the `swarm` section of a YAML experiment file
// (`read_swarm_graph`). The `swarm` kind (runtime/run/swarm.hpp) turns it into roles of the
// experiment graph, which runs in every mode.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/compress/format.hpp"
#include "kernels/data/loader.hpp"
#include "kernels/data/source_registry.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/torchscript.hpp"
#include "kernels/optim/optimizer.hpp"
#include "kernels/result.hpp"

namespace starling::runtime {
class config_node;
} // namespace starling::runtime

namespace starling::runtime::graph {

/// One pipeline stage: blocks [begin, end) of the model (both -1: an even split) and the relative
/// speed of each peer serving it (1 = full speed, 0.5 = half).
struct stage_spec {
  int64_t begin = -1;
  int64_t end = -1;
  std::vector<double> speeds;
};

/// Gradient averaging between the peers of a stage (collaborative global steps).
struct averaging_spec {
  /// Samples per global step, summed over a stage's peers: when the stage's peers together have
  /// processed this many (their counts meet in the DHT) they average their gradients through the
  /// averager and step. 0 = no averaging: each peer steps alone every `local_batch` samples and
  /// keeps close to its siblings by gossiping parameters.
  int64_t target_batch = 0;
  /// How often a peer publishes its sample count and reads its stage's total.
  std::chrono::nanoseconds progress_period = std::chrono::milliseconds(250);
  /// How long the peers of a step gather before the group closes; longer than `progress_period`
  /// so that every peer that saw the target in time joins.
  std::chrono::nanoseconds matchmaking_window = std::chrono::seconds(1);
  /// Deadline of one all-reduce round once the group formed.
  std::chrono::nanoseconds round_timeout = std::chrono::seconds(10);
  /// Codec of the gradient parts between peers.
  kernels::codec_id codec = kernels::codec_id::none;
  /// A step's averaging group re-forms at once while the last step's members are back (the
  /// averager's `family_groups`, as `dedloc.persistent_rounds`); off (default, not yet measured
  /// for stages): every step's group gathers for `matchmaking_window`.
  bool persistent_rounds = false;
  /// Parameters and optimizer state are averaged after every this many global steps (0: never).
  int64_t average_state_every = 0;
  /// After a peer stepped on its own gradient, it takes the stage's state again (a download
  /// from peers at its step that did not, or a state round with those that did too).
  bool resync_after_lone_step = true;

  bool enabled() const { return target_batch > 0; }
};

/// Checkpoints of stage peers' states in their nodes' run directories, so that a stage whose
/// every peer is gone resumes from the newest one instead of its seeded initialization.
struct checkpoint_spec {
  /// How often a stage peer writes one when its state changed (0: never; peers still resume
  /// from checkpoints found on their node).
  std::chrono::nanoseconds every = std::chrono::seconds(2);
  /// How many of its own newest checkpoints each peer keeps.
  int64_t keep = 2;
  /// Cluster runs: how many other nodes, serving no peer of a stage, keep a replica of its
  /// newest state (actors/stage/replica_keeper.hpp); 0 = none.
  int64_t replicas = 2;
};

/// Adaptive rebalancing of real stage peers (local and cluster runs; simulated runs tune theirs
/// in `sim:`, which starts from these settings when they are given). Every `every` each node's
/// supervisor asks the DHT board for every stage's measured throughput and moves one of its stage
/// peers to the bottleneck stage when that raises the pipeline's minimum by more than
/// `threshold` (at most one move out of a stage per period, agreed through the DHT): the peer is
/// stopped (it writes a last checkpoint), respawned for the new stage's layers, downloads that
/// stage's state from its live peers and announces itself there.
struct rebalance_spec {
  /// Period of the checks; 0 = no rebalancing.
  std::chrono::nanoseconds every{0};
  /// Minimum relative gain of the pipeline's slowest stage for a move.
  double threshold = 0.05;
  /// How often each stage peer reports its measured throughput (samples per busy device
  /// second) to the board; at most `every`.
  std::chrono::nanoseconds report_every = std::chrono::seconds(2);
  /// Respawned (preempted) stage peers join the stage that needs them most instead of their own.
  bool place_new_peers = false;

  bool enabled() const { return every.count() > 0; }
};

/// A graph of SWARM pipeline training (configs/swarm-tiny.yaml documents each field).
struct swarm_graph {
  /// The built-in GPT; with `torchscript` set, only its `layers` (the number of files), `vocab`
  /// and `seq_len` (the scripted model's) are used.
  kernels::gpt_config model;
  /// A scripted PyTorch model instead of the built-in GPT (`model: {kind: torchscript, ...}`).
  std::optional<kernels::torchscript_config> torchscript;
  /// What the trainers read, from the data-source registry: the byte-level text corpus (KJV) by
  /// default, or a token file. Its windows are the model's `seq_len`; its vocabulary the
  /// model's. Kind tokens: the held-out token file (`data.eval_path`, same dtype) whose first
  /// windows the report evaluates; empty: the first windows of the training file.
  kernels::data_source_options data;
  /// How the samples are dealt to the trainers' shards.
  kernels::shard_layout layout = kernels::shard_layout::scattered;
  std::vector<stage_spec> stages;
  int64_t trainers = 2;
  int64_t microbatch = 8;
  int64_t microbatches_per_trainer = 400;
  int64_t max_inflight = 2;
  /// Samples a stage peer accumulates before an optimizer step (without averaging).
  int64_t local_batch = 32;
  /// Stage peers serve a waiting backward pass before waiting forward passes, alternating
  /// while both wait (1F1B order); off by default (see actors/stage/stage.hpp).
  bool backward_first = false;
  /// Gradient averaging within stages (off by default).
  averaging_spec averaging;
  /// Stage state checkpoints (local and cluster mode; simulated cost-model peers hold no learned
  /// state and write none).
  checkpoint_spec checkpoint;
  /// Moving stage peers to the bottleneck stage (off by default).
  rebalance_spec rebalance;
  /// Open slots for volunteers' stage peers (`starling join`, or `starling node` without
  /// `--index`): role `volunteers`, each instance placed in the stage with the least throughput
  /// in the rebalancing board's reports when it starts (needs `rebalance`). 0: none.
  int64_t volunteers = 0;
  kernels::optimizer_options optimizer;
  kernels::codec_id compression = kernels::codec_id::blockwise8;
  std::chrono::nanoseconds hop_timeout = std::chrono::seconds(10);
  /// Mean time between preemptions of a random stage peer (0 = none), and the restart delay.
  std::chrono::nanoseconds preempt_every = std::chrono::seconds(20);
  std::chrono::nanoseconds restart_delay = std::chrono::seconds(5);
  /// Held-out batches of the evaluation at the start and the end.
  int64_t eval_batches = 8;
  /// Save the final model into `<out>/export` (state dicts, and TorchScript files for a scripted
  /// model) with the held-out loss in `<out>/export/export.json`.
  bool export_model = false;
  /// LibTorch intra-op threads (per process).
  int64_t torch_threads = 1;
  uint64_t seed = 0;

  /// The model every stage builds its layers of (the GPT seeded with `seed`, or the scripted one).
  kernels::model_spec model_spec() const;
  /// One line naming the model, for reports.
  std::string describe_model() const;
  /// Total stage peers.
  size_t peer_count() const;
  /// Samples all trainers together will complete.
  int64_t total_samples() const { return trainers * microbatches_per_trainer * microbatch; }
};

/// Checks a graph and fills in even layer ranges; the error names the offending field.
result<std::vector<std::pair<int64_t, int64_t>>> stage_ranges(const swarm_graph& g);

/// Checks rebalancing settings (every >= 0; when on, 0 < report_every <= every, threshold in
/// [0, 10]).
status check_rebalance(const rebalance_spec& r);

/// Checks averaging settings (target_batch >= 0, positive periods, a matchmaking window longer
/// than the progress period).
status check_averaging(const averaging_spec& a);

/// The C++ front door: a fluent builder whose `build()` validates like the YAML reader.
///
///     kernels::gpt_config m;
///     m.layers = 4;
///     auto g = swarm_builder{}
///                .model(m)
///                .stage({1.0, 0.5}).stage({1.0}).trainers(2, 16, 100)
///                .preemptions(std::chrono::seconds(20), std::chrono::seconds(5))
///                .build();
class swarm_builder {
public:
  swarm_builder& model(const kernels::gpt_config& m);
  /// A scripted model (its files checked by `build()`); replaces the built-in GPT.
  swarm_builder& model(const kernels::torchscript_config& m);
  /// Adds a stage with an even share of the blocks, served by peers of the given speeds.
  swarm_builder& stage(std::vector<double> speeds);
  /// Adds a stage of blocks [begin, end).
  swarm_builder& stage(int64_t begin, int64_t end, std::vector<double> speeds);
  swarm_builder& trainers(int64_t count, int64_t microbatch, int64_t microbatches_each);
  swarm_builder& max_inflight(int64_t n);
  swarm_builder& local_batch(int64_t samples);
  /// Global steps of `target_batch` samples per stage, gradients averaged between its peers.
  swarm_builder& averaging(int64_t target_batch);
  swarm_builder& averaging(const averaging_spec& a);
  swarm_builder& optimizer(const kernels::optimizer_options& o);
  swarm_builder& compression(kernels::codec_id c);
  swarm_builder& hop_timeout(std::chrono::nanoseconds t);
  swarm_builder& preemptions(std::chrono::nanoseconds every, std::chrono::nanoseconds restart);
  /// Stage peers checkpoint their state every `every` (0: never) and keep `keep` of their own.
  swarm_builder& checkpoints(std::chrono::nanoseconds every, int64_t keep);
  /// Stage peers move to the bottleneck stage (checked every `r.every`; see `rebalance_spec`).
  swarm_builder& rebalance(const rebalance_spec& r);
  swarm_builder& seed(uint64_t s);
  /// The graph, or why it is invalid.
  result<swarm_graph> build() const;

private:
  swarm_graph g_;
};

/// The YAML front door: reads a `swarm` section into `g` (strict: unknown keys, bad types and
/// out-of-range values are config errors naming the line).
void read_swarm_graph(config_node& n, swarm_graph& g);

/// Stage of every peer slot, in slot order (stage-major).
std::vector<std::pair<uint64_t, double>> peer_slots(const swarm_graph& g);

} // namespace starling::runtime::graph
