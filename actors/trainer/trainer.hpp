// A SWARM trainer: draws microbatches from its data shard and routes each one forward through
// every stage and backward again, picking each hop's peer with the stochastic wiring policy.
// A failed or timed-out hop is retried on another peer of the same stage; every microbatch is
// counted exactly once, when its backward reaches the first stage.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "kernels/compress/format.hpp"

namespace starling::kernels {
class corpus;
} // namespace starling::kernels

namespace starling::actors::trainer {

/// How a trainer picks each hop's stage peer.
enum class routing_kind {
  /// SWARM's stochastic wiring (wiring.hpp).
  stochastic,
  /// A uniformly random live peer of the stage (a baseline).
  uniform,
  /// Always the same peer per stage (`fixed_route`): a GPipe-style fixed pipeline; while that
  /// peer is down the hop waits for it to come back.
  fixed,
};

/// Options of one trainer.
struct trainer_options {
  std::string name = "trainer";
  /// Number of pipeline stages.
  uint64_t stages = 1;
  /// Samples per microbatch and bytes per sample.
  int64_t microbatch = 8;
  int64_t seq_len = 64;
  /// This trainer's shard of the corpus (of `shards`).
  int64_t shard = 0;
  int64_t shards = 1;
  /// Microbatches to complete before the trainer stops.
  int64_t microbatches = 100;
  /// Microbatches in flight at once (pipelining across stages); with `inflight_per_peer` the
  /// window instead follows the live peers (`inflight_target` in wiring.hpp).
  int64_t max_inflight = 2;
  /// Adaptive window: microbatches in flight per live stage peer seen, shared among `trainers`
  /// trainers, at most `inflight_cap`; 0 = the fixed `max_inflight`.
  double inflight_per_peer = 0;
  int64_t inflight_cap = 1024;
  int64_t trainers = 1;
  /// Stochastic routing: probe two candidates per hop for their queued work and send to the one
  /// that would finish first (power of two choices). Only modeled stage peers answer probes; a
  /// probe without answer within `probe_timeout` counts as an infinitely long queue.
  bool probe = false;
  caf::timespan probe_timeout = std::chrono::seconds(2);
  /// A hop without answer by then is retried elsewhere.
  caf::timespan hop_timeout = std::chrono::seconds(10);
  /// A peer that failed is not picked again for this long.
  caf::timespan exclude_for = std::chrono::seconds(5);
  /// How often the stage peer lists are refreshed from the board.
  caf::timespan refresh_every = std::chrono::seconds(1);
  /// Codec of the activations and gradients the trainer forwards.
  kernels::codec_id codec = kernels::codec_id::blockwise8;
  uint64_t seed = 0;
  routing_kind routing = routing_kind::stochastic;
  /// For `routing_kind::fixed`: per stage, the prefix of the names of the one peer to use (a
  /// peer's generations share the prefix, e.g. `s1p7g`).
  std::vector<std::string> fixed_route;
};

/// Spawns a trainer. It reports every completed microbatch to `sink` as
/// `(report_atom, name, double loss, int64 samples, int64 retries, double seconds)` and sends
/// `(stop_atom, name)` when it has completed `microbatches`.
caf::actor spawn_trainer(caf::actor_system& sys, trainer_options opts,
                         std::shared_ptr<const kernels::corpus> data, caf::actor board,
                         caf::actor sink);

} // namespace starling::actors::trainer
