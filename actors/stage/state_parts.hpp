// A stage's state cut into parts, so that a (re)joining peer downloads it from several donors at
// once: each donor sends one contiguous slice of the flat parameters and of the optimizer archive,
// and the newcomer puts the slices together only when every donor sent the same state (same step,
// same sizes, same digest) and the assembled bytes hash to that digest. Pure: no CAF.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kernels/result.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::stage {

/// Most parts a state is cut into (and most donors asked at once).
inline constexpr uint64_t max_state_parts = 16;

/// The half-open range `[begin, end)` of part `part` of `parts` near-equal contiguous slices of
/// `total` items (the first `total % parts` slices are one item longer). Requires
/// `part < parts`.
std::pair<uint64_t, uint64_t> part_range(uint64_t total, uint64_t part, uint64_t parts);

/// BLAKE2b-256 of a state: the flat parameters' bytes (an undefined tensor counts as none; the
/// tensor must be contiguous on the CPU), the optimizer archive, the step and, when the state
/// has any, the buffers and the compact optimizer state.
std::string state_digest(const messages::stage_state& s);

/// Part `part` of `parts` of `whole`, whose digest is `digest` (computed once by the caller for
/// all the parts it cuts); the part carries its share of the modeled state bytes. Fails on
/// `parts` outside [1, max_state_parts] or `part >= parts`.
result<messages::stage_state_part> cut_state_part(const messages::stage_state& whole,
                                                  const std::string& digest, uint64_t part,
                                                  uint64_t parts);

/// Puts the parts of one state together (in any order). Fails, saying why, when a part is
/// missing or repeated, when they disagree on the step, sizes, dtype or digest (the donors were
/// at different states), when a slice does not have its range's length, or when the assembled
/// state does not hash to the digest. `samples` of the result is the first part's; its modeled
/// bytes are the parts' sum.
result<messages::stage_state> assemble_state(const std::vector<messages::stage_state_part>& parts);

} // namespace starling::actors::stage
