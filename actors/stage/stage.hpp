// A stage peer of a SWARM pipeline: serves forward and backward passes of layers [begin, end)
// of a model, accumulates gradients, steps its optimizer every `local_batch` samples, keeps close
// to its stage's other peers by gossip averaging, and downloads its state from a live peer of
// the same stage before it announces itself.
#pragma once

#include <cstdint>
#include <string>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "kernels/compress/format.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/optim/optimizer.hpp"

namespace starling::actors::stage {

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
};

/// Spawns a stage peer that announces itself on `board` once ready (after downloading state
/// from a live peer of its stage, if there is one). Errors in requests are replied as errors;
/// the actor never dies from bad input.
caf::actor spawn_stage(caf::actor_system& sys, stage_options opts, caf::actor board);

} // namespace starling::actors::stage
