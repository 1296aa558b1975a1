// What a butterfly chunk says about itself, and its byte encoding for the direct transport. Pure:
// no CAF and no LibTorch, so the fuzzer links it. Integers are little-endian.
//
//   meta: group id (u64), kind (u8: 0 contribution, 1 result), part (u32), from (u32),
//         weight (f64 bits as u64), offset (i64), contributor count (u32, <= 4096) and that many
//         u32, error length (u32, <= 4096) and that many bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::averager {

inline constexpr uint32_t chunk_max_contributors = 4096;
inline constexpr uint32_t chunk_max_error_bytes = 4096;
/// Bytes of a meta without contributors and error text.
inline constexpr size_t chunk_meta_fixed_bytes = 8 + 1 + 4 + 4 + 8 + 8 + 4 + 4;

/// Kind of a chunk: member -> reducer, a piece of the member's part.
inline constexpr uint8_t contribution_chunk = 0;
/// Kind of a chunk: reducer -> member, a piece of the reduced part.
inline constexpr uint8_t result_chunk = 1;

/// The fields of a chunk but its values (those of `messages::avg_chunk`).
struct chunk_meta {
  uint64_t group_id = 0;
  uint8_t kind = contribution_chunk;
  /// The part (= index of its reducer).
  uint32_t part = 0;
  /// Member index of the sender.
  uint32_t from = 0;
  /// Sender's weight (contributions).
  double weight = 1.0;
  /// Element offset of the chunk inside the part.
  int64_t offset = 0;
  /// Results: the members averaged into this chunk.
  std::vector<uint32_t> contributors;
  /// Results: why the reducer could not reduce (then no values).
  std::string error;
};

/// Encodes `m` (fails when it has too many contributors or too long an error).
result<std::vector<uint8_t>> encode_chunk_meta(const chunk_meta& m);

/// Decodes untrusted meta bytes; fails unless they are exactly one well-formed meta with kind 0
/// or 1, a finite non-negative weight and a non-negative offset.
result<chunk_meta> decode_chunk_meta(const uint8_t* bytes, size_t size);

} // namespace starling::actors::averager
