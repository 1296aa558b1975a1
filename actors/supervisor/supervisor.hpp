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

#include "actors/supervisor/rebalance.hpp"

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
  /// Respawn a child that died on its own (a crash); killed children follow the kill's orders.
  bool supervised = true;
  /// The first spawn happens this long after the supervisor starts (an instance that joins a
  /// running experiment); 0 = at once.
  caf::timespan start_after = caf::timespan{0};
  /// The child leaves on purpose this long after the supervisor starts (stopped with
  /// `user_shutdown`, never respawned); negative: never.
  caf::timespan leave_after = caf::timespan{-1};
  /// Generation of the first spawn (a node that restarts gives its children a later one, so
  /// that they download their state and keep unique names).
  int first_generation = 0;
  /// A stage peer that may change stage (rebalancing): when set, it is used instead of `spawn`
  /// and gets the stage to serve; `stage` is the initial one.
  std::function<caf::actor(int generation, uint64_t stage)> spawn_at = {};
  uint64_t stage = 0;
  /// With `spawn_at` and a rebalancing board: the first spawn too joins the stage that needs it
  /// most (a volunteer's stage peer). The board cannot tell before every stage reported; the
  /// supervisor asks again (10 times, `join_hold / 10` apart), then starts it in `stage`.
  bool place_first = false;
};

/// Adaptive rebalancing of the supervisor's stage peers (children with `spawn_at`), reading and
/// claiming through a board that speaks the rebalancing protocol (actors/stage/board.hpp).
struct rebalancing_options {
  caf::actor board;
  /// Every `period` (first check at a seeded random phase within the first period) each live
  /// stage peer reads every stage's throughput and, when `decide_migration` says so and the
  /// board grants the claim (at most one move out of a stage per period), is stopped and
  /// respawned at once as a new generation in the bottleneck stage (it downloads that stage's
  /// state before announcing itself). A peer that arrived by a migration does not move again for
  /// two periods. 0 = no migrations.
  caf::timespan period = caf::timespan{0};
  rebalance_options policy;
  /// Respawned (preempted) stage peers join the stage that needs them most
  /// (`stage_for_new_peer`) instead of their old one.
  bool place_new_peers = false;
  /// How long a placed or migrating peer is counted in its new stage before it announced itself
  /// (`(put_atom, load_atom, ...)` to the board).
  caf::timespan join_hold = std::chrono::seconds(60);
  /// A migrating peer is first asked to drain (`(migrate_atom)`: it serves its queue and
  /// refuses new work, then stops itself); one still alive after this long is stopped. 0: stopped
  /// at once (its queued requests fail and are retried elsewhere).
  caf::timespan drain = std::chrono::seconds(60);
  /// Timeout of board requests.
  caf::timespan timeout = std::chrono::seconds(5);
  uint64_t seed = 0;
};

/// Spawns the supervisor with `children` (spawned at once, or after their `start_after`, at
/// their `first_generation`). Protocol:
/// - `(preempt_atom, uint64_t index)` kills child `index` now (fault injection); it comes back
///   after its restart delay. Killing a dead child is a no-op;
/// - `(preempt_atom, uint64_t index, caf::timespan restart, bool never)` kills it and brings it
///   back after `restart` (whatever its policy says), or never;
/// - `(stop_atom, uint64_t index)` stops it for good (a departure on purpose);
/// - `(get_atom, uint64_t index) -> caf::actor` the child's current handle (invalid while dead);
/// - `(status_atom) -> (uint64_t alive, uint64_t respawns)`.
/// Every respawn is reported to `observer` (if set) as `(respawn_atom, uint64_t index,
/// std::string name, int generation)`, every migration or placement in another stage as
/// `(migrate_atom, uint64_t index, std::string name, uint64_t from, uint64_t to,
/// std::vector<double> throughputs)` (before the respawn's report; the stages' summed
/// throughputs the decision saw, empty for a placement), and the first start of a
/// `place_first` child as `(put_atom, load_atom, uint64_t index, std::string name, uint64_t
/// stage, bool by_board)` (false: the board could not tell; it started in its own stage).
/// The children die with the supervisor.
caf::behavior supervisor_actor(caf::event_based_actor* self, std::vector<child_spec> children,
                               caf::actor observer, rebalancing_options rebalancing);

caf::actor spawn_supervisor(caf::actor_system& sys, std::vector<child_spec> children,
                            caf::actor observer = {}, rebalancing_options rebalancing = {});

} // namespace starling::actors::supervisor
