// A node's view of a board it shares with other nodes (the simulation's one board): it forwards
// announcements and load reports, and hands a stage's peer list back with every handle passed
// through `view` (a simulation's link proxies: handles as seen from this node).
#pragma once

#include <functional>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

namespace starling::actors::stage {

/// Options of a board view.
struct board_view_options {
  /// The shared board (actors/stage/board.hpp's protocol).
  caf::actor board;
  /// A peer's handle as seen from the viewing node; unset: handles are listed as they are (for
  /// a user that views only the handles it messages, as stage gossip does).
  std::function<caf::actor(const caf::actor&)> view;
};

/// Spawns a board view. Protocol (a subset of the board's, actors/stage/board.hpp):
/// - `(put_atom, uint64_t stage, std::string name, caf::actor peer)` forwarded;
/// - `(load_atom, uint64_t stage, std::string name, double throughput, double queue)` forwarded;
/// - `(get_atom, uint64_t stage) -> (std::vector<std::string>, std::vector<caf::actor>)` the
///   board's answer, each handle through `view`; the board's error when it fails.
caf::actor spawn_board_view(caf::actor_system& sys, board_view_options opts);

} // namespace starling::actors::stage
