// Fetching a stage's state from its live peers: what a (re)joining peer, a peer that fell behind
// and a modeled peer all do before serving.
#pragma once

#include <cstdint>
#include <functional>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "messages/swarm.hpp"

namespace starling::actors::stage {

/// Asks `board` for the live peers of `stage` and every one of them but `self` for its state at
/// once. `got` runs with the first state of at least `min_steps` steps; otherwise `none` runs
/// once, with true when the stage had no other peer (or the board did not answer) and false when
/// every donor failed or was behind.
void fetch_stage_state(caf::event_based_actor* self, const caf::actor& board, uint64_t stage,
                       caf::timespan timeout, uint64_t min_steps,
                       std::function<void(const messages::stage_state&)> got,
                       std::function<void(bool stage_empty)> none);

} // namespace starling::actors::stage
