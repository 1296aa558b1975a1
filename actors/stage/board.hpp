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
/// - `(list_atom) -> std::vector<uint64_t>` the number of live peers per stage (index = stage);
/// rebalancing (what the DHT's throughput and migration records hold in cluster mode):
/// - `(load_atom, uint64_t stage, std::string name, double throughput, double queue)` a live
///   peer's measured throughput (samples/s) and queue length (ignored for unknown peers);
/// - `(get_atom, load_atom, caf::actor peer) -> (std::vector<double> throughput,
///   std::vector<int64_t> peers, double mine)`: per stage, the live peers and their summed
///   throughput (a peer that has not reported yet counts as its stage's reported average; a
///   stage with live peers none of which reported is -1, unknown), and `peer`'s own reported
///   throughput (-1 when unknown);
/// - `(put_atom, load_atom, uint64_t stage, double throughput, caf::timespan hold)` a peer is
///   joining `stage` (placed there or migrating) and will announce itself after its state
///   download: until it announces (the next announcement in that stage) or `hold` passes, it
///   counts as a live peer of that stage with `throughput` (the stage's average when <= 0), so
///   that others deciding meanwhile do not all pick the same stage;
/// - `(put_atom, load_atom, caf::timespan hold) -> uint64_t` places a new peer: the stage with
///   the least throughput (joiners included; stages whose throughput is unknown are skipped),
///   registered as joining it at once (as above, at the stage's average); the largest uint64_t
///   when no stage is known; `(put_atom, load_atom, caf::timespan hold, bool all_known)` the
///   same, and with `all_known` the largest uint64_t as well while some stage is unknown or no
///   peer has reported yet (a volunteer's first placement waits for a pipeline that ran);
/// - `(migrate_atom, uint64_t from, caf::timespan period, uint64_t slots) -> bool` a migration
///   claim: granted (true) when fewer than `slots` moves out of stage `from` were granted during
///   the last `period`, so at most `slots` peers leave a stage per period (the claimant sizes
///   `slots` to the imbalance it sees); `(migrate_atom, from, period)` is the same with one slot.
caf::actor spawn_board(caf::actor_system& sys, size_t stages);

} // namespace starling::actors::stage
