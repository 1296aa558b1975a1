#include "actors/averager/plane_frame.hpp"

#include <cmath>
#include <cstring>

namespace starling::actors::averager {

namespace {

constexpr uint32_t preamble_magic = 0x31504153; // "SAP1"
constexpr uint32_t frame_magic = 0x31464153;    // "SAF1"
constexpr uint16_t version = 1;
/// Fixed part of the meta: id, kind, part, from, weight, offset, count, error length.
constexpr size_t meta_fixed = 8 + 1 + 4 + 4 + 8 + 8 + 4 + 4;

uint64_t get(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

void put(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) {
    p[i] = static_cast<uint8_t>(v & 0xff);
    v >>= 8;
  }
}

} // namespace

void write_plane_preamble(const plane_token& token, uint8_t* out) {
  put(out, preamble_magic, 4);
  put(out + 4, version, 2);
  put(out + 6, 0, 2);
  std::memcpy(out + 8, token.data(), token.size());
}

result<plane_token> parse_plane_preamble(const uint8_t* bytes, size_t size) {
  if (size != plane_preamble_bytes)
    return fail("averager data plane: the preamble has " + std::to_string(size) + " bytes, not 24");
  if (get(bytes, 4) != preamble_magic)
    return fail("averager data plane: bad preamble magic");
  if (get(bytes + 4, 2) != version)
    return fail("averager data plane: unsupported version " + std::to_string(get(bytes + 4, 2)));
  if (get(bytes + 6, 2) != 0)
    return fail("averager data plane: unknown preamble flags");
  plane_token t;
  std::memcpy(t.data(), bytes + 8, t.size());
  return t;
}

void write_plane_frame_header(const plane_frame_header& h, uint8_t* out) {
  put(out, frame_magic, 4);
  put(out + 4, h.meta_bytes, 4);
  put(out + 8, h.payload_bytes, 8);
}

result<plane_frame_header> parse_plane_frame_header(const uint8_t* bytes, size_t size) {
  if (size != plane_frame_header_bytes)
    return fail("averager data plane: a frame header of " + std::to_string(size) + " bytes");
  if (get(bytes, 4) != frame_magic)
    return fail("averager data plane: bad frame magic");
  plane_frame_header h;
  h.meta_bytes = static_cast<uint32_t>(get(bytes + 4, 4));
  h.payload_bytes = get(bytes + 8, 8);
  if (h.meta_bytes < meta_fixed || h.meta_bytes > plane_max_meta_bytes)
    return fail("averager data plane: meta of " + std::to_string(h.meta_bytes) + " bytes");
  if (h.payload_bytes > plane_max_payload_bytes)
    return fail("averager data plane: payload of " + std::to_string(h.payload_bytes) + " bytes");
  return h;
}

result<std::vector<uint8_t>> encode_plane_meta(const plane_meta& m) {
  if (m.contributors.size() > plane_max_contributors)
    return fail("averager data plane: too many contributors");
  if (m.error.size() > plane_max_error_bytes)
    return fail("averager data plane: error text too long");
  std::vector<uint8_t> out(meta_fixed + 4 * m.contributors.size() + m.error.size());
  auto* p = out.data();
  uint64_t wbits = 0;
  std::memcpy(&wbits, &m.weight, 8);
  put(p, m.group_id, 8);
  put(p + 8, m.kind, 1);
  put(p + 9, m.part, 4);
  put(p + 13, m.from, 4);
  put(p + 17, wbits, 8);
  put(p + 25, static_cast<uint64_t>(m.offset), 8);
  put(p + 33, m.contributors.size(), 4);
  p += 37;
  for (auto c : m.contributors) {
    put(p, c, 4);
    p += 4;
  }
  put(p, m.error.size(), 4);
  std::memcpy(p + 4, m.error.data(), m.error.size());
  return out;
}

result<plane_meta> decode_plane_meta(const uint8_t* bytes, size_t size) {
  if (size < meta_fixed || size > plane_max_meta_bytes)
    return fail("averager data plane: meta of " + std::to_string(size) + " bytes");
  plane_meta m;
  m.group_id = get(bytes, 8);
  m.kind = static_cast<uint8_t>(get(bytes + 8, 1));
  m.part = static_cast<uint32_t>(get(bytes + 9, 4));
  m.from = static_cast<uint32_t>(get(bytes + 13, 4));
  auto wbits = get(bytes + 17, 8);
  std::memcpy(&m.weight, &wbits, 8);
  m.offset = static_cast<int64_t>(get(bytes + 25, 8));
  auto count = get(bytes + 33, 4);
  if (m.kind > 1)
    return fail("averager data plane: unknown chunk kind " + std::to_string(m.kind));
  if (!std::isfinite(m.weight) || m.weight < 0)
    return fail("averager data plane: weight must be finite and >= 0");
  if (m.offset < 0)
    return fail("averager data plane: negative offset");
  if (count > plane_max_contributors || meta_fixed + 4 * count > size)
    return fail("averager data plane: " + std::to_string(count) + " contributors do not fit");
  const uint8_t* p = bytes + 37;
  m.contributors.reserve(count);
  for (uint64_t i = 0; i < count; ++i, p += 4)
    m.contributors.push_back(static_cast<uint32_t>(get(p, 4)));
  auto err = get(p, 4);
  if (err > plane_max_error_bytes || meta_fixed + 4 * count + err != size)
    return fail("averager data plane: meta length does not match its contents");
  m.error.assign(reinterpret_cast<const char*>(p + 4), err);
  return m;
}

std::string token_to_hex(const plane_token& t) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (auto b : t) {
    s.push_back(digits[b >> 4]);
    s.push_back(digits[b & 15]);
  }
  return s;
}

result<plane_token> token_from_hex(const std::string& s) {
  plane_token t{};
  if (s.size() != 2 * t.size())
    return fail("averager data plane: a token has 32 hex digits");
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
      return fail("averager data plane: a token has 32 lowercase hex digits");
    t[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return t;
}

} // namespace starling::actors::averager
