// The averager data plane's wire framing (see data_plane.hpp), pure: no CAF and no LibTorch, so
// the fuzzer links it. All integers are little-endian.
//
//   connection preamble (24 bytes, once per connection, sender -> receiver):
//     magic "SAP1" (u32 0x31504153), version (u16, 1), flags (u16, 0), token (16 bytes)
//   then any number of frames:
//     frame header (16 bytes): magic "SAF1" (u32 0x31464153), meta length (u32, 32 .. 65536),
//                              payload length (u64, 0 .. 2^31)
//     meta: group id (u64), kind (u8: 0 contribution, 1 result), part (u32), from (u32),
//           weight (f64 bits as u64), offset (i64), contributor count (u32, <= 4096) and that many
//           u32, error length (u32, <= 4096) and that many bytes
//     payload: a Cap'n Proto `Tensor` (messages/tensor.capnp), absent when the error is set
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::averager {

inline constexpr size_t plane_preamble_bytes = 24;
inline constexpr size_t plane_frame_header_bytes = 16;
inline constexpr uint32_t plane_max_meta_bytes = 65536;
inline constexpr uint64_t plane_max_payload_bytes = uint64_t{1} << 31;
inline constexpr uint32_t plane_max_contributors = 4096;
inline constexpr uint32_t plane_max_error_bytes = 4096;

using plane_token = std::array<uint8_t, 16>;

/// What a chunk says about itself (the fields of `messages::avg_chunk` but its values).
struct plane_meta {
  uint64_t group_id = 0;
  uint8_t kind = 0;
  uint32_t part = 0;
  uint32_t from = 0;
  double weight = 1.0;
  int64_t offset = 0;
  std::vector<uint32_t> contributors;
  std::string error;
};

/// Lengths announced by a frame header.
struct plane_frame_header {
  uint32_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
};

void write_plane_preamble(const plane_token& token, uint8_t* out);
/// Parses an untrusted preamble; fails on a wrong size, magic, version or flags.
result<plane_token> parse_plane_preamble(const uint8_t* bytes, size_t size);

void write_plane_frame_header(const plane_frame_header& h, uint8_t* out);
/// Parses an untrusted frame header; fails on a wrong size or magic, or lengths out of range.
result<plane_frame_header> parse_plane_frame_header(const uint8_t* bytes, size_t size);

/// Encodes `m` (fails when it has too many contributors or too long an error).
result<std::vector<uint8_t>> encode_plane_meta(const plane_meta& m);
/// Decodes untrusted meta bytes; fails unless they are exactly one well-formed meta with kind 0
/// or 1, a finite non-negative weight and a non-negative offset.
result<plane_meta> decode_plane_meta(const uint8_t* bytes, size_t size);

/// 32 lowercase hex digits of a token, and back (fails on anything else).
std::string token_to_hex(const plane_token& t);
result<plane_token> token_from_hex(const std::string& s);

} // namespace starling::actors::averager
