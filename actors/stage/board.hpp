// The stage board: where stage peers announce themselves and trainers look them up. It keeps
// what the DHT will keep (issue 4): per stage, the live peers with their handles; a peer's entry
// disappears when the peer dies (monitored) or when it is withdrawn.
#pragma once

#include <caf/fwd.hpp>
#include <caf/actor.hpp>

namespace starling::actors::stage {

/// Spawns a board. Protocol:
/// - `(put_atom, uint64_t stage, std::string name, caf::actor peer)` announces a peer;
/// - `(get_atom, uint64_t stage) -> (std::vector<std::string>, std::vector<caf::actor>)` lists
///   a stage's live peers (names and handles, same order);
/// - `(list_atom) -> std::vector<uint64_t>` the number of live peers per stage (index = stage).
caf::actor spawn_board(caf::actor_system& sys, size_t stages);

} // namespace starling::actors::stage
