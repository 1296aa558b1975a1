// The driver of one extragradient / MASHA run as a role: resolves the workers, spawns the
// method's server over them (linked to it), and runs it segment by segment, each segment's
// length decided by a policy from the report so far, every segment reported as a metric.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/vi/vi.hpp"

namespace starling::messages {
struct metric_event;
struct vi_report;
} // namespace starling::messages

namespace starling::actors::vi {

/// Decides the next segment of iterations from the report so far (null before the first
/// segment; 0: the run is over) and adds what it measured to that report's metric.
using segment_policy =
    std::function<uint64_t(const messages::vi_report* r, messages::metric_event& m)>;

/// Options of a driver.
struct driver_options {
  /// Its metrics' source.
  std::string name = "server";
  /// The workers' addresses, resolved through `resolver` (each within 10 s).
  std::vector<std::string> workers;
  /// Answers `(resolve_atom, std::string address) -> caf::actor`.
  caf::actor resolver;
  /// Receives the metrics: `segment` per segment (values `iterations`, `bits_up`, `bits_down`,
  /// `live_workers` and what the policy adds), `done` at the end, or `failed` with label
  /// `reason`.
  caf::actor sink;
  /// Length of the problem's vectors.
  std::size_t dim = 0;
  /// The server's options.
  server_options server;
  /// The run's schedule (it may keep the run's counters).
  segment_policy next;
};

/// Spawns a driver. It answers `(stop_atom)` (ignored: the run ends by its policy or its
/// failure; the role's supervision stops it).
caf::actor spawn_driver(caf::actor_system& sys, driver_options opts);

} // namespace starling::actors::vi
