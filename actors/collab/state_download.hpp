// The one client of the state-download protocol: a newcomer, a peer that fell behind or stepped
// alone, a replica keeper and a run's final-model reporter all download a peer's state
// (`messages::stage_state`: flat parameters, optimizer moments and step counts) through it.
//
// Protocol (what donors serve; stage peers, data-parallel peers and replica servers do):
//   `(get_atom, state_atom) -> stage_state`                        the whole state;
//   `(get_atom, state_atom, part, parts) -> stage_state_part`      part `part` of `parts`, with
//                                                                  the whole state's digest.
//
// The download:
// 1. with several donors, part i of n from donor i, all at once (n = the donors, at most
//    `stage::max_state_parts`), put together only when every part belongs to one state (same
//    step, sizes and digest, and the assembled bytes hash to that digest: state_parts.hpp);
// 2. when a donor fails, is behind `min_steps`, or the parts disagree (a donor stepped
//    meanwhile), whole states: from every donor at once (`race`: the first at `min_steps` wins,
//    or with `newest` the most trained once all answered) or from one donor after another
//    (`in_turn`: less traffic, the first at `min_steps` wins).
// It runs in the caller's actor (handlers of `self`), so the caller's state is never touched from
// another actor, and ends with exactly one call of `got` or `none`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/timespan.hpp>

#include "messages/swarm.hpp"

namespace starling::actors::collab {

/// Where the donors come from: how many there are, and how to reach donor `i` (a handle at
/// hand, or one resolved from a name: `resolve` calls exactly one of its two continuations).
struct donor_source {
  size_t count = 0;
  std::function<void(size_t i, std::function<void(caf::actor)> ok,
                     std::function<void(std::string why)> failed)>
    resolve;
  /// Told when a request to donor `i` failed (a cached handle may be stale); may be empty.
  std::function<void(size_t i)> forget;

  /// Donors known by handle, in the order given.
  static donor_source of(std::vector<caf::actor> donors);
};

/// How whole states are asked for when parts are not used or did not work.
enum class whole_policy : uint8_t {
  /// Every donor at once.
  race,
  /// One donor after another, in the source's order.
  in_turn,
};

struct download_options {
  /// Per request to a donor.
  caf::timespan timeout{0};
  /// A state of fewer global steps is of no use.
  uint64_t min_steps = 0;
  /// Cut the state among several donors (false: whole states only).
  bool parts = true;
  /// Give up on parts at the first failure or mismatch (true), or only once every part
  /// answered (false).
  bool parts_fail_fast = true;
  whole_policy whole = whole_policy::race;
  /// With `race`: wait for every donor and take the most trained state.
  bool newest = false;
  /// Ask a whole state as its one part (`(get_atom, state_atom, 0, 1)`): verified against the
  /// digest the donor sends, and served only by donors that serve parts (full-mode peers).
  bool whole_as_part = false;
  /// Why a state is of no use to the caller although it has the steps (another model's sizes,
  /// say), or empty when it is; may be empty. A whole state it refuses counts as that donor's
  /// failure; refused parts as parts that failed.
  std::function<std::string(const messages::stage_state&)> refuse;
  /// True once the caller no longer wants the state: nothing more is asked, and neither `got`
  /// nor `none` runs. May be empty.
  std::function<bool()> cancelled;
};

/// A downloaded state and where it came from.
struct downloaded_state {
  messages::stage_state state;
  /// How many donors served it (its parts, or 1 for a whole state).
  size_t donors = 0;
};

/// Downloads a state from `donors` as `opts` says, in `self`'s handlers. `got` runs with a state
/// of at least `opts.min_steps` steps; otherwise `none` runs once, with the reason (no donor,
/// every donor failed or was behind), unless `opts.cancelled` said so first.
void fetch_state(caf::event_based_actor* self, donor_source donors, download_options opts,
                    std::function<void(downloaded_state)> got,
                    std::function<void(const std::string& why)> none);

} // namespace starling::actors::collab
