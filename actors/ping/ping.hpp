// The ping actors: an echo that answers every ping with its payload, and a pinger that pings a
// random target every interval and reports each round trip (or its loss) as a metric. A network
// check, and the small role the fault matrix test runs on every (fault kind, mode) pair.
//
// Protocol:
// - echo: `blob_msg{tag, bytes} -> blob_msg{"pong", bytes}`; a blob whose envelope was refused
//   on arrival gets an error naming the reason instead (an empty pong would pass for a round
//   trip);
// - pinger: asks `(resolve_atom, address) -> caf::actor` of its resolver once per target (again
//   after a failed ping) and sends `messages::metric_event`s to its sink: kind `ping` with value
//   `rtt_ms`, or kind `lost` (label `reason` when one is known); both labelled `target`.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::ping {

/// Options of one pinger.
struct pinger_options {
  /// Its metrics' source.
  std::string name = "pinger";
  /// Addresses its resolver knows (`@<node>/<instance>`); each tick pings one, drawn uniformly.
  std::vector<std::string> targets;
  /// Bytes carried by each ping (and its reply).
  uint64_t payload = 1'000'000;
  /// Time between two pings.
  caf::timespan interval = std::chrono::seconds(1);
  /// A ping (or a resolution) without answer by then counts as lost.
  caf::timespan timeout = std::chrono::seconds(2);
  /// Seed of the draws of targets.
  uint64_t seed = 0;
  /// Answers `(resolve_atom, std::string address) -> caf::actor`.
  caf::actor resolver;
  /// Receives the metrics.
  caf::actor sink;
};

/// Spawns an echo.
caf::actor spawn_echo(caf::actor_system& sys);

/// Spawns a pinger; its first ping goes out one `interval` after the start.
caf::actor spawn_pinger(caf::actor_system& sys, pinger_options opts);

} // namespace starling::actors::ping
