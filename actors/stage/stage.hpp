// A stage peer of a SWARM pipeline: serves forward and backward passes of layers [begin, end)
// of a model, accumulates gradients, and downloads its state from a live peer of the same stage
// before it announces itself. It computes with a backend (backend.hpp): the LibTorch stage
// module of a registered model, or a cost model that only says how long the device would take
// (simulation at scale). Either way the device is one queue on CAF's clock (device_queue.hpp):
// one request at a time in arrival order (or backwards first, `backward_first`), and replies
// leave when their compute is done, while the peer keeps
// answering probes, load reports, state requests and its averaging.
// Two stepping modes:
// - local (default, `averaging.averager` unset): steps its optimizer every `local_batch` samples
//   and keeps close to its stage's other peers by gossip-averaging parameters;
// - collaborative (`averaging` set): the peer owns a `collab::coordinator` (the decision core
//   the data-parallel peers drive too, actors/collab/COLLAB.md) and carries out its effects as
//   its own messages: it publishes its progress record (owned and signed by its node's key) under
//   `<prefix>/stage<i>/progress`, reads its stage's, and when the stage's samples reach
//   `target_batch` (or their ETA passed) averages its mean gradient, weighted by its samples,
//   with the stage's other peers through the averager under group key
//   `<prefix>/stage<i>/step<N>`, then clips and steps on the averaged gradient (on its own
//   after a failed round, counted) and moves to step N+1. A backward's samples count for the
//   core once its trainer confirmed it (`commit_atom`). Backwards confirmed while a round runs
//   accumulate towards step N+1 (delayed updates): the gradient of step N is taken out when the
//   round starts. A peer that sees others at a later step downloads their state (parameters,
//   optimizer, step) and keeps the gradients it accumulated meanwhile for its next step. After
//   a lone step it averages parameters and optimizer state with its stage (a resync, under
//   `<prefix>/stage<i>/state<N>`).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>
#include <caf/atom.hpp>

#include "actors/stage/backend.hpp"
#include "actors/stage/cost_model.hpp"
#include "kernels/compress/format.hpp"
#include "kernels/models/registry.hpp"
#include "kernels/optim/optimizer.hpp"

namespace starling::actors::stage {

/// `(status_atom, checkpoint_atom)`: a stage peer's checkpoint counters; `(checkpoint_atom)`:
/// its checkpoint timer.
using checkpoint_atom = caf::atom_constant<caf::atom("checkpoint")>;

/// Collaborative stepping: average gradients with the stage's peers when their summed samples
/// reach a target batch. Enabled when `averager` is set. Mapped onto the coordinator's options
/// (actors/collab/coordinator.hpp) by stage.cpp's `core_options`.
struct averaging_options {
  /// The node's averager (`(average_atom, key, tensor_list, weight) -> average_result`).
  caf::actor averager;
  /// The node's DHT actor (progress records).
  caf::actor dht;
  /// Key prefix shared by the experiment (e.g. `swarm/<experiment>`, as the DHT board's).
  std::string prefix = "swarm";
  /// Samples per global step, summed over the stage's peers.
  int64_t target_batch = 64;
  /// The shortest time between two reads of the stage's progress and between two publications
  /// after new samples; reads come at least every four periods, records expire after four.
  caf::timespan progress_period = std::chrono::milliseconds(500);
  /// Timeout of one averaging round (matchmaking + round), gradients or state; DHT calls time
  /// out after two progress periods.
  caf::timespan average_timeout = std::chrono::seconds(30);
  /// Parameters and optimizer state averaged after every this many global steps (0: never).
  uint64_t average_state_every = 0;
  /// After a lone step, take the stage's state again (collab::coordinator_options).
  bool resync_after_lone_step = true;
};

/// Checkpoints of a stage peer's state on disk (actors/stage/checkpoint.hpp): the stage's learned
/// state outlives its peers. Off when `dir` is empty.
struct checkpoint_options {
  /// Where the peer writes its checkpoints (its node's run directory); empty: it writes none and
  /// restores none.
  std::string dir;
  /// Further directories a peer that finds no live donor reads checkpoints of its stage from,
  /// besides `dir`.
  std::vector<std::string> search;
  /// How often the peer writes a checkpoint when its state changed since the last one, on CAF's
  /// clock; 0: never (it still restores from `dir` and `search`).
  caf::timespan every = std::chrono::seconds(2);
  /// How many of its own newest checkpoints the peer keeps (older ones are removed).
  uint32_t keep = 2;
  /// The peer's slot: a name that stays the same across its generations (e.g. `s2p5`). When
  /// set, a peer stopped on purpose also saves the gradient it had accumulated towards its next
  /// step (`<dir>/pending/`), and the slot's next peer that resumes at that step takes it up, so
  /// that a stopped run's done batches are not lost. Empty: not saved.
  std::string slot;
  /// The replica board of a cluster run (replica_keeper.hpp): a peer that finds no live donor
  /// and no checkpoint on its disk downloads its stage's newest replica from other nodes.
  /// Unset: none.
  caf::actor replicas;
  /// Write periodic checkpoints on a thread of their own (the peer's actor only takes the
  /// snapshot and keeps serving); the last one, on a stop on purpose, is always written at once.
  /// Real clocks only: a simulation writes at once, so that its runs stay deterministic.
  bool background = false;
  /// Report the writes' wall-clock seconds in the `checkpoint` metric; a simulation leaves them
  /// out (they differ from run to run and its trace, metrics included, must not).
  bool wall_times = true;
};

/// What a stage peer computes with.
enum class compute_backend {
  /// The LibTorch stage module of `stage_options::model`.
  torch,
  /// `stage_options::cost_model`: no model runs (simulation at scale).
  cost_model,
};

/// Everything a stage peer needs to know.
struct stage_options {
  /// Stage index in the pipeline.
  uint64_t stage = 0;
  /// Unique peer name (what trainers and logs call it).
  std::string name;
  /// The whole model by name and options (e.g. `kernels::gpt_model(cfg)`); the peer builds
  /// blocks [begin, end) of it. The cost model only takes its depth.
  kernels::model_spec model;
  /// Where `model` is found; null: the built-in models.
  std::shared_ptr<const kernels::model_registry> models;
  int64_t begin = 0;
  int64_t end = 1;
  /// The backend: the model itself (default) or a cost model.
  compute_backend backend = compute_backend::torch;
  /// The cost model's settings (with `backend == compute_backend::cost_model`).
  cost_model_options cost_model;
  /// The LibTorch backend's measure of a call's device seconds; empty: its wall time. Tests
  /// pass a fixed cost.
  device_timer timer;
  /// > 0: the LibTorch backend's device time is modeled (torch_backend_options): simulation
  /// with real compute.
  double modeled_forward_s = 0;
  double modeled_backward_factor = 2.0;
  /// Optimizer and gradient clipping.
  kernels::optimizer_options optimizer;
  /// Samples accumulated before each optimizer step.
  int64_t local_batch = 64;
  /// Relative device speed in (0, 1]: a request occupies the device for its compute / s (with
  /// the LibTorch backend the time beyond the real compute is queue time on CAF's clock),
  /// emulating a slower device on the same machine.
  double speed = 1.0;
  /// A waiting backward pass takes the device before waiting forward passes, alternating with
  /// them while both wait (1F1B; device_queue.hpp). Off (default): one arrival order for both.
  /// Measured worse in the 1000-peer simulation (runtime/run/SWARM-SIM.md).
  bool backward_first = false;
  /// Codec for the activations and gradients the peer sends back.
  kernels::codec_id codec = kernels::codec_id::blockwise8;
  /// Timeout of state downloads and gossip exchanges.
  caf::timespan timeout = std::chrono::seconds(10);
  /// Whether the peer must start from a live peer's state: true for peers that (re)join a running
  /// pipeline. Such a peer keeps asking (every `retry_every`) until a donor answers and only then
  /// announces itself; a peer of the initial generation starts from the seeded initialization
  /// when its stage has no live peer yet.
  bool download_state = false;
  caf::timespan retry_every = std::chrono::milliseconds(500);
  /// How long a (re)joining peer keeps finding its stage empty before it concludes that every
  /// peer of the stage is gone (the stage's training state is lost) and starts from the seeded
  /// initialization rather than never serving. A donor that exists but fails does not count.
  caf::timespan download_patience = std::chrono::seconds(10);
  /// How long a computed gradient waits for its trainer's confirmation (`commit_atom`) after its
  /// reply left before it is dropped as lost work; a confirmation after that is ignored.
  caf::timespan commit_timeout = std::chrono::seconds(30);
  /// Seed of gossip partner choices and of the cost model's noise.
  uint64_t seed = 0;
  /// Where gossip lists the stage's peers (unset: the board the peer was spawned with), and
  /// what turns a listed handle into one this peer can message (unset: the handle itself). The
  /// simulation lists raw handles here and views only the partner drawn: each view is a link
  /// proxy, and a gossip exchange in a 1250-peer stage made 1249 of them to use one.
  caf::actor gossip_board;
  std::function<caf::actor(const caf::actor&)> view;
  /// Collaborative stepping (off when `averaging.averager` is unset: local steps + gossip).
  averaging_options averaging;
  /// Checkpoints on disk, and where a peer without a live donor resumes from.
  checkpoint_options checkpoint;
  /// Where the peer reports its checkpoints and restores as `messages::metric_event`s (kinds
  /// `checkpoint`: bytes, seconds, steps; `restore`: steps; `checkpoint_rejected`); unset:
  /// nowhere.
  caf::actor metrics;
  /// The peer's ledger publisher (actors/collab/ledger_publisher.hpp); unset: none. It gets the
  /// samples of every backward the peer applied (a confirmed attempt) or lost (computed, never
  /// confirmed: dropped), its collaborative global steps (rounds; averaged ones), and, on a
  /// stage-0 peer, a credit per applied microbatch to its trainer (`collab::trainer_credit_name`):
  /// its backward reached stage 0 after every other stage's, so the microbatch went all the way.
  caf::actor ledger;
  /// How often the peer reports its measured throughput (training samples per second of busy
  /// device time, forward and backward) and queue length to its board as
  /// `(load_atom, stage, name, throughput, queue)`, for rebalancing; 0 = never. Both boards
  /// handle it (the in-process one, and the DHT-backed one in DHT records).
  caf::timespan report_every = caf::timespan{0};
};

/// Order of a stage peer's `(status_atom)` counters. The coordinator's (collaborative stepping;
/// 0 otherwise): rounds started, averaged, found no partner, failed otherwise or timed out,
/// skipped (no partner and no samples); catch-up downloads finished; samples in averaged
/// updates, in own steps, dropped; samples pending towards the next step; state rounds
/// (resyncs after a lone step) started and loaded.
enum status_fields : size_t {
  st_steps,
  st_samples,
  st_rounds,
  st_averaged,
  st_no_partner,
  st_failed,
  st_skipped,
  st_caught_up,
  st_downloads,
  st_donors,
  st_queued,
  st_samples_averaged,
  st_samples_alone,
  st_samples_dropped,
  st_pending,
  st_state_rounds,
  st_state_rounds_loaded,
  st_count,
};

/// The DHT key of stage `stage`'s progress records (`<prefix>/stage<i>/progress`).
std::string progress_key(const std::string& prefix, uint64_t stage);

/// The averager group key of stage `stage`'s global step `step` (`<prefix>/stage<i>/step<N>`).
std::string step_key(const std::string& prefix, uint64_t stage, uint64_t step);

/// Spawns a stage peer that announces itself on `board` once ready (after downloading state
/// from a live peer of its stage, if there is one). Errors in requests are replied as errors;
/// the actor never dies from bad input. It quits at once (with the reason) when its options are
/// invalid or its backend cannot be built. Its protocol:
/// - `stage_forward -> tensor_msg`, `stage_backward -> stage_backward_reply` (queued on the
///   device; a reply still queued when the peer dies fails at once); a backward's gradient is
///   held until its trainer confirms that attempt (`(commit_atom, microbatch_id, attempt)`),
///   then applied once; unconfirmed ones are dropped after `commit_timeout` (lost work);
/// - `(status_atom, commit_atom) -> [applied, lost, duplicate confirmations, held]`,
///   `(get_atom, commit_atom) -> [id, times applied, id, times applied, ...]` (recent ids);
/// - `(get_atom, state_atom) -> stage_state`, `(get_atom, state_atom, part, parts) ->
///   stage_state_part` (answered at once, also while the device is busy);
/// - `(probe_atom) -> double`: seconds of device time queued ahead of a request arriving now;
/// - `(migrate_atom)`: leave the stage (a migration): new forward and backward requests are
///   refused (and probes answer 1e9 s), the queued ones are served, and once every computed
///   gradient was confirmed or expired the peer writes its last checkpoint and quits with
///   `user_shutdown`;
/// - `(status_atom) -> [steps, samples, rounds, averaged, no_partner, failed, skipped,
///   caught_up, downloads, donors summed over downloads, queued requests, ...]` (`status_fields`);
/// - `(status_atom, checkpoint_atom) -> ([written, bytes written, restored (0 or 1), restored
///   steps, rejected files, write failures, samples of a pending gradient taken up], restored
///   digest (raw, empty when none))`.
/// A peer that finds no live donor of its stage resumes from the newest checkpoint of its stage
/// and layer range that reads and verifies (rejected files are logged), else it waits for a donor
/// or starts from the seeded initialization as `download_state` says.
caf::actor spawn_stage(caf::actor_system& sys, stage_options opts, caf::actor board);

} // namespace starling::actors::stage
