// A stage peer of a SWARM pipeline: serves forward and backward passes of layers [begin, end)
// of a model, accumulates gradients, and downloads its state from a live peer of the same stage
// before it announces itself. Two stepping modes:
// - local (default, `averaging.averager` unset): steps its optimizer every `local_batch` samples
//   and keeps close to its stage's other peers by gossip-averaging parameters;
// - collaborative (`averaging` set): publishes its accumulated sample count for the current
//   global step N in the DHT under `<prefix>/stage<i>/progress` (sub-key = its name, value =
//   "N samples", short expiration) every `progress_period`, reads the total of the peers at the
//   same step, and when it reaches `target_batch` averages its mean gradient, weighted by its
//   samples, with the stage's other peers through the averager under group key
//   `<prefix>/stage<i>/step<N>`, then clips and steps on the averaged gradient and moves to step
//   N+1. While its round runs it keeps publishing the samples it put into it, so peers still
//   deciding see the stage's total and join. A `no_partner` (or failed) round steps on its own
//   gradient (counted). A peer that sees another at a later step (it missed that round, or
//   restarted) downloads that peer's state (parameters, optimizer, step) and keeps the gradients
//   it accumulated meanwhile for its next step. Backward requests that arrive while a round is in
//   flight accumulate into the gradients of step N+1: the gradient of step N is taken out
//   (flattened and zeroed) when the round starts, and the in-flight accumulation is restored
//   after the optimizer stepped on the averaged one.
#pragma once

#include <cstdint>
#include <string>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "kernels/compress/format.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/optim/optimizer.hpp"

namespace starling::actors::stage {

/// Collaborative stepping: average gradients with the stage's peers when their summed samples
/// reach a target batch. Enabled when `averager` is set.
struct averaging_options {
  /// The node's averager (`(average_atom, key, tensor_list, weight) -> average_result`).
  caf::actor averager;
  /// The node's DHT actor (progress records).
  caf::actor dht;
  /// Key prefix shared by the experiment (e.g. `swarm/<experiment>`, as the DHT board's).
  std::string prefix = "swarm";
  /// Samples per global step, summed over the stage's peers.
  int64_t target_batch = 64;
  /// How often the peer publishes its progress and reads its stage's total; records expire after
  /// three periods.
  caf::timespan progress_period = std::chrono::milliseconds(500);
  /// Timeout of one average request (matchmaking + round) and of DHT calls (the latter capped at
  /// `progress_period`).
  caf::timespan average_timeout = std::chrono::seconds(30);
};

/// Modeled compute (simulation mode): the peer builds no model; a forward of `b` samples takes
/// `forward_s * b / speed` virtual seconds (backward `backward_factor` times that), times a
/// seeded lognormal noise factor of mean 1, served one request at a time in arrival order (a
/// FIFO queue, like one device); replies carry placeholder tensors of `payload` floats per
/// sample (the last stage answers a constant loss). Everything else (announcing, state download,
/// messages, the network model) is as for a real peer.
struct modeled_compute {
  bool enabled = false;
  /// Forward seconds per sample at speed 1.
  double forward_s = 0.01;
  double backward_factor = 2.0;
  /// Sigma of the per-request lognormal noise (0 = none).
  double noise = 0.0;
  /// Placeholder floats per sample in activations and gradients.
  int64_t payload = 4;
  /// Extra virtual time a donor takes to answer a state download (models the parameter and
  /// optimizer-state transfer that the placeholder state does not carry).
  caf::timespan state_transfer = std::chrono::seconds(0);
};

/// Everything a stage peer needs to know.
struct stage_options {
  /// Stage index in the pipeline.
  uint64_t stage = 0;
  /// Unique peer name (what trainers and logs call it).
  std::string name;
  /// The whole model's shape; the peer builds blocks [begin, end) of it.
  kernels::gpt_config model;
  int64_t begin = 0;
  int64_t end = 1;
  /// Optimizer and gradient clipping.
  kernels::optimizer_options optimizer;
  /// Samples accumulated before each optimizer step.
  int64_t local_batch = 64;
  /// Relative device speed in (0, 1]: a peer of speed s answers after compute / s, emulating a
  /// slower device on the same machine.
  double speed = 1.0;
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
  /// Seed of gossip partner choices.
  uint64_t seed = 0;
  /// Collaborative stepping (off when `averaging.averager` is unset: local steps + gossip).
  averaging_options averaging;
  /// Modeled compute for simulation mode (off: the peer runs the model).
  modeled_compute modeled;
  /// How often the peer reports its measured throughput (training samples per second of busy
  /// compute time, forward and backward) and queue length to its board as
  /// `(load_atom, stage, name, throughput, queue)`, for rebalancing; 0 = never. Both boards
  /// handle it (the in-process one, and the DHT-backed one in DHT records).
  caf::timespan report_every = caf::timespan{0};
};

/// The DHT key of stage `stage`'s progress records (`<prefix>/stage<i>/progress`).
std::string progress_key(const std::string& prefix, uint64_t stage);

/// The averager group key of stage `stage`'s global step `step` (`<prefix>/stage<i>/step<N>`).
std::string step_key(const std::string& prefix, uint64_t stage, uint64_t step);

/// Spawns a stage peer that announces itself on `board` once ready (after downloading state
/// from a live peer of its stage, if there is one). Errors in requests are replied as errors;
/// the actor never dies from bad input.
caf::actor spawn_stage(caf::actor_system& sys, stage_options opts, caf::actor board);

/// Spawns a stage peer with modeled compute (what `spawn_stage` does when `opts.modeled.enabled`).
caf::actor spawn_modeled_stage(caf::actor_system& sys, stage_options opts, caf::actor board);

} // namespace starling::actors::stage
