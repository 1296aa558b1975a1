// The wire framing of the direct transport (transport.hpp): one framing for every bulk tensor
// path (the averager's chunks, tensor transfers, state downloads). Pure: no CAF and no LibTorch,
// so the fuzzer links it. All integers are little-endian.
//
//   link preamble (24 bytes, once per link, from the side that connected):
//     magic "STL1" (u32 0x314c5453), version (u16, 1), flags (u16, 0), token (16 bytes)
//   then, in both directions, any number of frames:
//     frame header (16 bytes): magic "STF1" (u32 0x31465453), meta length (u32, 4 .. 65536),
//                              payload length (u64, 0 .. 2^31)
//     meta: channel (u32), then the channel's own bytes (e.g. an averager chunk's meta)
//     payload: a Cap'n Proto `Tensor` (messages/tensor.capnp), or nothing
//   on a same-host link with shared-memory rings (shm_ring.hpp), also ring frames:
//     frame header with magic "STR1" (u32 0x31525453), the same lengths (payload at least 1)
//     meta, as above
//     ring position (u64): where the payload lies in the sender's ring (not in the stream)
//
// Channel 1 carries tensor transfers (meta: the transfer's 16-byte token), channel 2 their
// status (meta: the token, a status length (u32, <= 4096) and that much text; empty = delivered).
// Channels from 16 on are handed out to local users (each averager has one).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::transfer {

inline constexpr size_t link_preamble_bytes = 24;
inline constexpr size_t link_frame_header_bytes = 16;
/// Meta bytes a frame may carry, the channel included.
inline constexpr uint32_t link_min_meta_bytes = 4;
inline constexpr uint32_t link_max_meta_bytes = 65536;
inline constexpr uint64_t link_max_payload_bytes = uint64_t{1} << 31;
/// Largest status text of a transfer (longer ones are cut).
inline constexpr uint32_t max_status_bytes = 4096;

/// Channels with a fixed meaning.
inline constexpr uint32_t transfer_channel = 1;
inline constexpr uint32_t transfer_status_channel = 2;
/// The first channel handed out by `transport::add_channel`.
inline constexpr uint32_t first_dynamic_channel = 16;

using link_token = std::array<uint8_t, 16>;

/// Lengths announced by a frame header.
struct link_frame_header {
  /// Meta bytes, the channel included.
  uint32_t meta_bytes = 0;
  uint64_t payload_bytes = 0;
  /// A ring frame: the payload lies in the sender's shared-memory ring, and a ring position
  /// (`link_ring_position_bytes`) follows the meta instead of it.
  bool in_ring = false;
};

/// Bytes of a ring frame's position.
inline constexpr size_t link_ring_position_bytes = 8;

/// Reads an `n`-byte little-endian unsigned integer.
uint64_t read_le(const uint8_t* p, int n);
/// Writes `v` as an `n`-byte little-endian unsigned integer.
void write_le(uint8_t* p, uint64_t v, int n);

/// Preamble versions: plaintext frames, sealed records (link_crypto.hpp).
inline constexpr uint16_t link_plain_version = 1;
inline constexpr uint16_t link_sealed_version = 2;
/// A plaintext link over the same-host Unix socket (`local_link_name`): the listener answers a
/// preamble whose token it accepted with the byte `link_local_ack`, then frames as version 1.
inline constexpr uint16_t link_local_version = 3;
inline constexpr uint8_t link_local_ack = 0x4b;

/// The abstract-namespace Unix socket name on which a transport listening on `host:port` (an
/// IPv4 literal) also accepts same-host links.
std::string local_link_name(const std::string& host, uint16_t port);

void write_link_preamble(const link_token& token, uint8_t* out,
                         uint16_t version = link_plain_version);
/// Parses an untrusted preamble that must announce `version`; fails on a wrong size, magic,
/// version or flags.
result<link_token> parse_link_preamble(const uint8_t* bytes, size_t size,
                                       uint16_t version = link_plain_version);

void write_link_frame_header(const link_frame_header& h, uint8_t* out);
/// Parses an untrusted frame header (either magic); fails on a wrong size or magic, or lengths
/// out of range (a ring frame without payload included).
result<link_frame_header> parse_link_frame_header(const uint8_t* bytes, size_t size);

/// The meta of a frame: the channel, then `body`.
std::vector<uint8_t> make_link_meta(uint32_t channel, const std::vector<uint8_t>& body);

/// The meta body of a transfer status: the token, the status length and text (cut to
/// `max_status_bytes`).
std::vector<uint8_t> encode_transfer_status(const link_token& token, const std::string& status);
/// Decodes an untrusted status body; fails unless it is exactly one well-formed status.
result<std::pair<link_token, std::string>> decode_transfer_status(const uint8_t* bytes,
                                                                   size_t size);

/// 32 lowercase hex digits of a token, and back (fails on anything else).
std::string token_to_hex(const link_token& t);
result<link_token> token_from_hex(const std::string& s);

/// Succeeds when `host` is an IPv4 literal or "localhost" (the transport listens on the node's
/// configured address: any interface, loopback in tests).
status check_ipv4(const std::string& host);

/// Succeeds when peers can connect to `host`: an IPv4 literal (or "localhost") that is not the
/// wildcard 0.0.0.0.
status check_listen_host(const std::string& host);

} // namespace starling::actors::transfer
