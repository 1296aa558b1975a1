// The supervisor of one node: spawns the node's roles, monitors them, and respawns a role that
// died (a preempted stage peer) after its restart delay, as a new generation. What a new
// generation does when it starts (a stage peer downloads its state from live peers of its stage
// before announcing itself) is the role's business; the supervisor only guarantees that every
// role is either alive or scheduled to come back.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::supervisor {

/// One supervised role.
struct child_spec {
  /// Name for logs and reports.
  std::string name;
  /// Spawns generation `g` of the role (0 at start) and returns its handle; runs on the
  /// supervisor's thread.
  std::function<caf::actor(int generation)> spawn;
  /// Delay before a dead child is respawned; negative: never respawn.
  caf::timespan restart_delay = std::chrono::seconds(5);
};

/// Spawns the supervisor with `children` (all spawned at once, generation 0). Protocol:
/// - `(preempt_atom, uint64_t index)` kills child `index` now (fault injection); it comes back
///   after its restart delay. Killing a dead child is a no-op;
/// - `(get_atom, uint64_t index) -> caf::actor` the child's current handle (invalid while dead);
/// - `(status_atom) -> (uint64_t alive, uint64_t respawns)`.
/// Every respawn is reported to `observer` (if set) as `(respawn_atom, uint64_t index,
/// std::string name, int generation)`. The children die with the supervisor.
caf::behavior supervisor_actor(caf::event_based_actor* self, std::vector<child_spec> children,
                               caf::actor observer);

caf::actor spawn_supervisor(caf::actor_system& sys, std::vector<child_spec> children,
                            caf::actor observer = {});

} // namespace starling::actors::supervisor
