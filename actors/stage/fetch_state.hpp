// Fetching a stage's state from its live peers: what a (re)joining peer does before serving and
// a peer that fell behind does to catch up.
#pragma once

#include <cstdint>
#include <functional>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "messages/swarm.hpp"

namespace starling::actors::stage {

/// Asks `board` for the live peers of `stage` and downloads the state from them
/// (`collab::fetch_state`: parts from several donors at once, whole states raced when a donor
/// fails or the donors were at different states). With `newest` (replicas, which may lag each
/// other), the whole-state race waits for every donor and takes the state with the most steps.
/// `got` runs with a state of at least `min_steps` steps and the number of donors it came from;
/// otherwise `none` runs once, with true when the stage had no other peer (or the board did not
/// answer) and false when every donor failed or was behind.
void fetch_stage_state(caf::event_based_actor* self, const caf::actor& board, uint64_t stage,
                       caf::timespan timeout, uint64_t min_steps,
                       std::function<void(const messages::stage_state&, size_t donors)> got,
                       std::function<void(bool stage_empty)> none, bool newest = false);

/// When a joining peer gives up on its stage's state and starts from its own.
struct join_options {
  /// Keep asking until a donor answers; false: start as soon as the stage turns out empty.
  bool download_state = false;
  /// Per request to the board and to each donor.
  caf::timespan timeout;
  /// Between attempts.
  caf::timespan retry_every;
  /// An empty stage for this long ends the wait even when `download_state` is set.
  caf::timespan patience;
};

/// The download a peer runs before serving, as a function to call again for each retry: it
/// fetches the stage's state (`fetch_stage_state`) and hands it to `take` (false: rejected, ask
/// again); when the stage is empty it first calls `restore` (if set: the peer resumes from a
/// checkpoint, true when it did); otherwise, and when every donor failed, it either schedules a
/// retry (sends `state_atom` to `self` after `retry_every`: the peer's `(state_atom)` handler
/// calls the function again while not ready) or gives up. `start` runs once the state was taken
/// or restored, or the peer gave up on it. With `replicas` (a board listing the holders of each
/// stage's checkpoint replicas, replica_keeper.hpp), a stage that is empty and has no checkpoint
/// `restore` can read is downloaded from its replicas the same way, handed to `take_replica`.
std::function<void()>
make_join_download(caf::event_based_actor* self, caf::actor board, uint64_t stage,
                   join_options opts,
                   std::function<bool(const messages::stage_state&, size_t donors)> take,
                   std::function<void()> start, std::function<bool()> restore = {},
                   caf::actor replicas = {},
                   std::function<bool(const messages::stage_state&, size_t holders)>
                     take_replica = {});

} // namespace starling::actors::stage
