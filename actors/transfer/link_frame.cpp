#include "actors/transfer/link_frame.hpp"

#include <algorithm>
#include <arpa/inet.h>
#include <cstring>
#include <netinet/in.h>

namespace starling::actors::transfer {

namespace {

constexpr uint32_t preamble_magic = 0x314c5453; // "STL1"
constexpr uint32_t frame_magic = 0x31465453;    // "STF1"
constexpr uint32_t ring_magic = 0x31525453;     // "STR1"

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

void write_link_preamble(const link_token& token, uint8_t* out, uint16_t version) {
  write_le(out, preamble_magic, 4);
  write_le(out + 4, version, 2);
  write_le(out + 6, 0, 2);
  std::memcpy(out + 8, token.data(), token.size());
}

result<link_token> parse_link_preamble(const uint8_t* bytes, size_t size, uint16_t version) {
  std::string what = version == link_sealed_version ? "sealed link" : "direct link";
  if (size != link_preamble_bytes)
    return fail(what + ": a preamble of " + std::to_string(size) + " bytes, expected 24");
  if (read_le(bytes, 4) != preamble_magic)
    return fail(what + ": bad preamble magic");
  if (auto v = read_le(bytes + 4, 2); v != version)
    return fail(what + ": version " + std::to_string(v) + ", expected " + std::to_string(version)
                + " (a closed run's direct links are sealed, version 2; 1 is plaintext, 3 "
                  "plaintext on the same host)");
  if (read_le(bytes + 6, 2) != 0)
    return fail(what + ": unknown preamble flags");
  link_token t;
  std::memcpy(t.data(), bytes + 8, t.size());
  return t;
}

std::string local_link_name(const std::string& host, uint16_t port) {
  return "starling-link/" + (host == "localhost" ? std::string{"127.0.0.1"} : host) + ":"
         + std::to_string(port);
}

void write_link_frame_header(const link_frame_header& h, uint8_t* out) {
  write_le(out, h.in_ring ? ring_magic : frame_magic, 4);
  write_le(out + 4, h.meta_bytes, 4);
  write_le(out + 8, h.payload_bytes, 8);
}

result<link_frame_header> parse_link_frame_header(const uint8_t* bytes, size_t size) {
  if (size != link_frame_header_bytes)
    return fail("direct link: a frame header of " + std::to_string(size) + " bytes, expected 16");
  auto magic = read_le(bytes, 4);
  if (magic != frame_magic && magic != ring_magic)
    return fail("direct link: bad frame magic (not a starling frame)");
  link_frame_header h;
  h.in_ring = magic == ring_magic;
  h.meta_bytes = static_cast<uint32_t>(read_le(bytes + 4, 4));
  h.payload_bytes = read_le(bytes + 8, 8);
  if (h.meta_bytes < link_min_meta_bytes || h.meta_bytes > link_max_meta_bytes)
    return fail("direct link: a frame declares " + std::to_string(h.meta_bytes)
                + " meta bytes (4 .. 65536)");
  if (h.payload_bytes > link_max_payload_bytes)
    return fail("direct link: a frame declares " + std::to_string(h.payload_bytes)
                + " payload bytes (0 .. 2^31)");
  if (h.in_ring && h.payload_bytes == 0)
    return fail("direct link: a ring frame without payload");
  return h;
}

std::vector<uint8_t> make_link_meta(uint32_t channel, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> out(4 + body.size());
  write_le(out.data(), channel, 4);
  if (!body.empty())
    std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

std::vector<uint8_t> encode_transfer_status(const link_token& token, const std::string& status) {
  auto n = static_cast<uint32_t>(std::min<size_t>(status.size(), max_status_bytes));
  std::vector<uint8_t> out(token.size() + 4 + n);
  std::memcpy(out.data(), token.data(), token.size());
  write_le(out.data() + token.size(), n, 4);
  std::memcpy(out.data() + token.size() + 4, status.data(), n);
  return out;
}

result<std::pair<link_token, std::string>> decode_transfer_status(const uint8_t* bytes,
                                                                   size_t size) {
  link_token t;
  if (size < t.size() + 4)
    return fail("direct link: a transfer status of " + std::to_string(size) + " bytes");
  std::memcpy(t.data(), bytes, t.size());
  auto n = read_le(bytes + t.size(), 4);
  if (n > max_status_bytes || t.size() + 4 + n != size)
    return fail("direct link: a transfer status whose length does not match its text");
  return std::make_pair(t, std::string(reinterpret_cast<const char*>(bytes) + t.size() + 4, n));
}

std::string token_to_hex(const link_token& t) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : t) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

result<link_token> token_from_hex(const std::string& s) {
  link_token t{};
  if (s.size() != 2 * t.size())
    return fail("direct link: a token has 32 hex digits");
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < t.size(); ++i) {
    int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return fail("direct link: a token has 32 lowercase hex digits");
    t[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return t;
}

status check_ipv4(const std::string& host) {
  if (host == "localhost")
    return {};
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) != 1)
    return fail("'" + host + "' is not an IPv4 address");
  return {};
}

status check_listen_host(const std::string& host) {
  if (auto st = check_ipv4(host); !st)
    return st;
  if (host == "0.0.0.0")
    return fail("0.0.0.0 is the wildcard address: peers cannot connect to it");
  return {};
}

} // namespace starling::actors::transfer
