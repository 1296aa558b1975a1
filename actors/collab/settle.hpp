// What a collaborating peer steps on after a gradient (or state) averaging round: the one rule,
// enforced here for the SWARM stage peer and the data-parallel peer alike.
//
// The rule. A peer steps on
//   - the complete average (every part averaged), or
//   - its own values with its own weight (nothing averaged, or the round failed), or
//   - a partial average in which each part is either the part's average, exactly as its reducer
//     sent it (every coordinate the weighted mean of the contributions the reducer reports), or
//     the peer's own values for the whole part;
// never on a buffer some of whose coordinates are sums not yet divided, stale, another round's,
// or written by the averager after the peer stopped waiting for it.
//
// How it is enforced. The averager (in place) writes the result into the vector it is handed,
// chunk by chunk, as results arrive; a part whose reducer fails after some of its result arrived
// holds averaged values where they arrived and own values elsewhere, and after an abandoned round
// the averager may go on writing while the peer steps. So the peer never hands the averager the
// vector it steps on: `averaging_input` keeps the own values apart and hands over a copy, and
// `settle` builds the vector to step on from the report's part statuses: an averaged part from the
// result, every other part from the kept own values. The copy costs one vector of the round's
// size while the round runs (the in-place mode still saves the averager's separate output).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

namespace starling::messages {
struct average_result;
}

namespace starling::actors::collab {

/// What a round's answer gives to step on.
enum class settled_kind : uint8_t {
  /// Every non-empty part averaged: the complete average.
  averaged,
  /// Some parts averaged, the others the own values (whole parts).
  partial,
  /// Nothing usable: the own values (the caller steps alone on them or skips the step).
  own,
};

/// The vector to step on and how it was made.
struct settled_round {
  settled_kind kind = settled_kind::own;
  /// Flat fp32, the own vector's size; shares no storage with the averager's buffer unless
  /// complete (then it is the averager's finished result, which nobody writes any more).
  at::Tensor values;
  /// Non-empty parts averaged and kept own.
  uint32_t parts_averaged = 0;
  uint32_t parts_own = 0;
  /// Why not averaged (empty when it was).
  std::string why;
};

/// One averaging round's input: the own values kept by the peer, and the copy the averager gets
/// (and may write into, in place, even after the peer gave up on the round).
class averaging_input {
public:
  /// Keeps `own` (flat; not copied: the caller hands it over and does not modify it).
  explicit averaging_input(at::Tensor own);

  /// The own values (never written by the averager).
  const at::Tensor& own() const noexcept { return own_; }

  /// A fresh copy of the own values for the averager's request (call once per request).
  at::Tensor for_averager() const;

private:
  at::Tensor own_;
};

/// Applies the rule to an averager's answer for the one-tensor request of `input`: the complete
/// average, a partial one (whole parts), or the own values. `min_members`: a group smaller than
/// that counts as no average (a data-parallel peer wants a partner).
settled_round settle(const messages::average_result& res, const averaging_input& input,
                     size_t min_members = 1);

} // namespace starling::actors::collab
