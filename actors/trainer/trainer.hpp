// A SWARM trainer: trains batches 0, 1, ... of its shard of a data source (in epochs without
// replacement, `kernels::sample_loader`) and routes each one forward through every stage and
// backward again, picking each hop's peer with the stochastic wiring policy. A failed or
// timed-out hop is retried on another peer of the same stage; every microbatch is counted exactly
// once, when its backward reaches the first stage, and recorded in a progress store so that a
// restarted trainer redoes exactly the batches that were not done.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

#include "kernels/compress/format.hpp"
#include "kernels/data/loader.hpp"

namespace starling::kernels {
class data_source;
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
  /// The tag its microbatch ids carry in their top 24 bits, by which the stage-0 peers credit
  /// it in the ledger: the run's `collab::trainer_tags`, distinct among its trainers. Negative:
  /// its name's `collab::trainer_tag`.
  int64_t tag = -1;
  /// Number of pipeline stages.
  uint64_t stages = 1;
  /// Samples per microbatch.
  int64_t microbatch = 8;
  /// This trainer's shard of the data (`shard` of `shards`), the seed of its epochs' orders and
  /// its layout: microbatch b holds the ids `sample_loader::batch_at_step(b, microbatch)`.
  kernels::loader_options data;
  /// Microbatches to complete before the trainer stops: batches [0, microbatches) of its shard.
  int64_t microbatches = 100;
  /// Where the trainer records which batches are done, so that a restarted trainer redoes
  /// exactly the others: it asks `(get_atom, name) -> std::string` (a serialized
  /// `kernels::batch_progress`, empty for none) at its start and sends
  /// `(put_atom, name, uint64 total, uint64 batch)` for every batch done. Unset: it starts at
  /// batch 0 and remembers nothing.
  caf::actor progress;
  /// Microbatches in flight at once (pipelining across stages); with `inflight_per_peer` the
  /// window instead follows the live peers (`inflight_target` in wiring.hpp).
  int64_t max_inflight = 2;
  /// Adaptive window: microbatches in flight per live stage peer seen, shared among `trainers`
  /// trainers, at most `inflight_cap`; 0 = the fixed `max_inflight`.
  double inflight_per_peer = 0;
  int64_t inflight_cap = 1024;
  int64_t trainers = 1;
  /// Stochastic routing: probe two candidates per hop for their queued work and send to the one
  /// that would finish first (power of two choices). Stage peers of both backends answer probes; a
  /// probe without answer within `probe_timeout` counts as an infinitely long queue.
  bool probe = false;
  caf::timespan probe_timeout = std::chrono::seconds(2);
  /// With probes: a microbatch's first forward waits at the trainer (and probes again after at
  /// most 10 s) while the stage-0 peer it would go to has more than this many seconds of work
  /// queued; 0 = never. When every window opens at once, each stage-0 peer otherwise queues
  /// minutes of forwards, and every backward through it waits behind them.
  double entry_backlog_s = 0;
  /// With probes: the same for every later forward hop (stages 1 and on; backward hops never
  /// wait): a forward waits at the trainer while the better candidate has more than this many
  /// seconds queued; 0 = never. Backwards then find short queues of forwards ahead of them (the
  /// fill's wave clears faster) while each queue stays first-in first-out, so the probes'
  /// backlogs and the service estimates stay right.
  double forward_backlog_s = 0;
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

/// Spawns a trainer reading `data`. It reports every completed microbatch to `sink` as
/// `(report_atom, name, double loss, int64 samples, int64 retries, double seconds, uint64 batch)`
/// and sends `(stop_atom, name)` when every batch of [0, microbatches) is done (at once when a
/// restarted trainer finds them done). Progress saved for another number of microbatches keeps
/// its done batches below the new number. It exits with an error when the data cannot hold its
/// shard or a batch cannot be read, or the saved progress does not parse.
caf::actor spawn_trainer(caf::actor_system& sys, trainer_options opts,
                         std::shared_ptr<const kernels::data_source> data, caf::actor board,
                         caf::actor sink);

} // namespace starling::actors::trainer
