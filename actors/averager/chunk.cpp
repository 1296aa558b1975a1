#include "actors/averager/chunk.hpp"

#include <cmath>
#include <cstring>

namespace starling::actors::averager {

namespace {

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

result<std::vector<uint8_t>> encode_chunk_meta(const chunk_meta& m) {
  if (m.contributors.size() > chunk_max_contributors)
    return fail("averager chunk: too many contributors");
  if (m.error.size() > chunk_max_error_bytes)
    return fail("averager chunk: error text too long");
  std::vector<uint8_t> out(chunk_meta_fixed_bytes + 4 * m.contributors.size() + m.error.size());
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

result<chunk_meta> decode_chunk_meta(const uint8_t* bytes, size_t size) {
  if (size < chunk_meta_fixed_bytes || size > chunk_meta_fixed_bytes + 4 * chunk_max_contributors
                                                 + chunk_max_error_bytes)
    return fail("averager chunk: meta of " + std::to_string(size) + " bytes");
  chunk_meta m;
  m.group_id = get(bytes, 8);
  m.kind = static_cast<uint8_t>(get(bytes + 8, 1));
  m.part = static_cast<uint32_t>(get(bytes + 9, 4));
  m.from = static_cast<uint32_t>(get(bytes + 13, 4));
  auto wbits = get(bytes + 17, 8);
  std::memcpy(&m.weight, &wbits, 8);
  m.offset = static_cast<int64_t>(get(bytes + 25, 8));
  auto count = get(bytes + 33, 4);
  if (m.kind > 1)
    return fail("averager chunk: unknown kind " + std::to_string(m.kind));
  if (!std::isfinite(m.weight) || m.weight < 0)
    return fail("averager chunk: weight must be finite and >= 0");
  if (m.offset < 0)
    return fail("averager chunk: negative offset");
  if (count > chunk_max_contributors || chunk_meta_fixed_bytes + 4 * count > size)
    return fail("averager chunk: " + std::to_string(count) + " contributors do not fit");
  const uint8_t* p = bytes + 37;
  m.contributors.reserve(count);
  for (uint64_t i = 0; i < count; ++i, p += 4)
    m.contributors.push_back(static_cast<uint32_t>(get(p, 4)));
  auto err = get(p, 4);
  if (err > chunk_max_error_bytes || chunk_meta_fixed_bytes + 4 * count + err != size)
    return fail("averager chunk: meta length does not match its contents");
  m.error.assign(reinterpret_cast<const char*>(p + 4), err);
  return m;
}

} // namespace starling::actors::averager
