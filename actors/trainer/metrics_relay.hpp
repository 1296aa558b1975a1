// Turns a trainer's reports (actors/trainer/trainer.hpp, `spawn_trainer`'s `sink`) into metric
// events for a node's metrics sink.
#pragma once

#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::trainer {

/// Options of a metrics relay.
struct metrics_relay_options {
  /// The metrics' source (the trainer's instance name).
  std::string name;
  /// Receives `messages::metric_event`s.
  caf::actor sink;
  /// The trainer's ledger publisher (actors/collab/ledger_publisher.hpp): gets each completed
  /// microbatch's samples (its claim) and loss; unset: none.
  caf::actor ledger;
};

/// Spawns a relay. Protocol (what a trainer sends its sink):
/// - `(report_atom, std::string, double loss, int64_t samples, int64_t retries, double seconds,
///   uint64_t batch)` becomes a `microbatch` event with values `loss`, `samples`, `retries`,
///   `latency_s` and `batch`;
/// - `(stop_atom, std::string)` becomes a `done` event.
/// Events go out anonymously, with `name` as their source.
caf::actor spawn_metrics_relay(caf::actor_system& sys, metrics_relay_options opts);

} // namespace starling::actors::trainer
