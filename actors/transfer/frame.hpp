// The direct data channel's wire framing (see data_channel.hpp): the header that opens a data
// connection and the loopback check. No CAF and no LibTorch, so the fuzzer can link it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/result.hpp"

namespace starling::actors::transfer {

/// Size of the frame header that opens a data connection.
inline constexpr size_t frame_header_bytes = 32;

/// Largest status text a receiver writes back (longer texts are cut).
inline constexpr uint32_t max_status_bytes = 4096;

/// The frame header, little-endian on the wire: magic "SDC1" (u32 0x31434453), version (u16, 1),
/// flags (u16, 0), token (16 bytes), length (u64, bytes that follow, 1 .. 2^31).
struct frame_header {
  /// The one-time token of the announcement.
  std::array<uint8_t, 16> token{};
  /// Bytes of the encoded tensor that follow the header.
  uint64_t length = 0;
};

/// Reads an `n`-byte little-endian unsigned integer.
uint64_t read_le(const uint8_t* p, int n);

/// Writes `v` as an `n`-byte little-endian unsigned integer.
void write_le(uint8_t* p, uint64_t v, int n);

/// Writes `h` as the 32 header bytes into `out`.
void write_frame_header(const frame_header& h, uint8_t* out);

/// Parses an untrusted frame header; fails on a wrong size, magic, version, flags or a length
/// outside 1 .. 2^31 bytes.
result<frame_header> parse_frame_header(const uint8_t* bytes, size_t size);

/// Succeeds when `host` is an IPv4 loopback literal (127.0.0.0/8) or "localhost".
status check_loopback(const std::string& host);

} // namespace starling::actors::transfer
