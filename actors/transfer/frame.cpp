#include "actors/transfer/frame.hpp"

#include <arpa/inet.h>
#include <cstring>
#include <netinet/in.h>

#include "messages/wire.hpp"

namespace starling::actors::transfer {

namespace {

constexpr uint32_t frame_magic = 0x31434453; // "SDC1" read as little-endian u32
constexpr uint16_t frame_version = 1;

} // namespace

uint64_t read_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i)
    v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void write_le(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void write_frame_header(const frame_header& h, uint8_t* out) {
  write_le(out, frame_magic, 4);
  write_le(out + 4, frame_version, 2);
  write_le(out + 6, 0, 2);
  std::memcpy(out + 8, h.token.data(), h.token.size());
  write_le(out + 24, h.length, 8);
}

result<frame_header> parse_frame_header(const uint8_t* bytes, size_t size) {
  if (size != frame_header_bytes)
    return fail("frame header of " + std::to_string(size) + " bytes, expected " +
                std::to_string(frame_header_bytes));
  if (auto magic = read_le(bytes, 4); magic != frame_magic)
    return fail("not a starling data frame (magic " + std::to_string(magic) + ")");
  if (auto v = read_le(bytes + 4, 2); v != frame_version)
    return fail("data frame version " + std::to_string(v) + ", expected " +
                std::to_string(frame_version));
  if (auto flags = read_le(bytes + 6, 2); flags != 0)
    return fail("unknown data frame flags " + std::to_string(flags));
  frame_header h;
  std::memcpy(h.token.data(), bytes + 8, h.token.size());
  h.length = read_le(bytes + 24, 8);
  if (h.length == 0 || h.length > messages::max_message_bytes)
    return fail("data frame declares " + std::to_string(h.length) + " bytes (1 .. " +
                std::to_string(messages::max_message_bytes) + ")");
  return h;
}

status check_loopback(const std::string& host) {
  if (host == "localhost")
    return {};
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1)
    return fail("'" + host + "' is not an IPv4 address; the data channel is loopback only");
  if ((ntohl(a.s_addr) >> 24) != 127)
    return fail(host + " is not a loopback address (127.0.0.0/8); the data channel carries "
                       "unencrypted tensors and is loopback only");
  return {};
}

} // namespace starling::actors::transfer
