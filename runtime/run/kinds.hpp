// The role types and kind shorthands starling ships, each kind in a file of its own:
// ping.cpp (`ping`), swarm.cpp (`swarm`), masha.cpp (`masha`, `masha-adversarial`), dedloc.cpp
// (`dedloc`), btard.cpp (`btard`).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <caf/fwd.hpp>

#include "runtime/experiment/role.hpp"

namespace starling::runtime {

/// Options of `ping.echo` and `ping.pinger` (the `ping:` section's keys, besides `nodes`).
struct ping_options {
  /// Bytes carried by each ping (and its reply).
  uint64_t payload = 1'000'000;
  /// Each pinger pings one random instance of `targets` on another node this often.
  std::chrono::nanoseconds interval = std::chrono::seconds(1);
  /// A ping without reply by then counts as lost.
  std::chrono::nanoseconds timeout = std::chrono::seconds(2);
  /// The role whose instances a pinger pings.
  std::string targets = "echo";
};

/// Registers `ping.echo`, `ping.pinger` and the `ping` kind.
void add_ping(role_registry& reg);

/// Registers `swarm.stage`, `swarm.trainer` and the `swarm` kind.
void add_swarm(role_registry& reg);

/// Registers `vi.server`, `vi.worker` and the `masha` and `masha-adversarial` kinds.
void add_masha(role_registry& reg);

/// Registers `dedloc.peer` and the `dedloc` kind (runtime/run/dedloc.hpp).
void add_dedloc(role_registry& reg);

/// Registers the `btard` kind (runtime/run/btard.cpp; one process, no roles).
void add_btard(role_registry& reg);

} // namespace starling::runtime
