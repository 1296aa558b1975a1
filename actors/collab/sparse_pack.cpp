#include "actors/collab/sparse_pack.hpp"

#include <cstring>

#include <fmt/format.h>

namespace starling::actors::collab {

namespace {

using kernels::codec_id;

/// LEB128: 7 bits per byte, low bits first; a 64-bit value takes at most 10 bytes.
void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

/// Reads one varint at `p` (before `end`); fails on truncation or more than 64 bits.
result<uint64_t> get_varint(const uint8_t*& p, const uint8_t* end) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p == end)
      return fail("packed top-k: an index varint is cut off");
    uint8_t b = *p++;
    uint64_t bits = b & 0x7f;
    if (shift == 63 && bits > 1)
      return fail("packed top-k: an index varint exceeds 64 bits");
    v |= bits << shift;
    if ((b & 0x80) == 0)
      return v;
  }
  return fail("packed top-k: an index varint is longer than 10 bytes");
}

} // namespace

result<std::vector<uint8_t>> pack_payload(const kernels::tensor_header& header,
                                          const uint8_t* payload, size_t size) {
  if (auto s = kernels::check_payload(header, payload, size); !s)
    return fail("cannot pack an invalid payload: " + s.what());
  if (header.codec != codec_id::topk)
    return std::vector<uint8_t>(payload, payload + size);
  auto k = static_cast<size_t>(header.params.k);
  size_t ib = header.params.index_bits / 8;
  std::vector<uint8_t> out;
  out.reserve(2 * k + 4 * k);
  int64_t prev = -1;
  for (size_t i = 0; i < k; ++i) {
    int64_t index = 0;
    if (ib == 4) {
      int32_t v = 0;
      std::memcpy(&v, payload + 4 * i, 4);
      index = v;
    } else {
      std::memcpy(&index, payload + 8 * i, 8);
    }
    // check_payload guarantees strictly increasing indices: the gap is >= 0.
    put_varint(out, static_cast<uint64_t>(index - prev - 1));
    prev = index;
  }
  const uint8_t* values = payload + k * ib;
  out.insert(out.end(), values, values + 4 * k);
  return out;
}

result<std::vector<uint8_t>> unpack_payload(const kernels::tensor_header& header,
                                            const uint8_t* data, size_t size) {
  if (auto s = kernels::validate_header(header); !s)
    return fail("packed payload with an invalid header: " + s.what());
  auto numel = kernels::checked_numel(header.shape);
  if (!numel)
    return numel.error();
  if (header.codec != codec_id::topk) {
    if (auto s = kernels::check_payload(header, data, size); !s)
      return fail(s.what());
    return std::vector<uint8_t>(data, data + size);
  }
  auto k = header.params.k;
  size_t ib = header.params.index_bits / 8;
  // Every varint takes at least one byte and every value four: refuse absurd k before
  // allocating anything for it.
  if (k > size / 5)
    return fail(fmt::format("packed top-k of {} bytes cannot hold k = {} entries", size, k));
  std::vector<uint8_t> out(static_cast<size_t>(k) * (ib + 4));
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  uint64_t next = 0; // the smallest index the next entry may have
  for (uint64_t i = 0; i < k; ++i) {
    auto gap = get_varint(p, end);
    if (!gap)
      return gap.error();
    if (*gap >= static_cast<uint64_t>(*numel) || next + *gap >= static_cast<uint64_t>(*numel))
      return fail(fmt::format("packed top-k: index past numel = {}", *numel));
    uint64_t index = next + *gap;
    next = index + 1;
    if (ib == 4) {
      auto v = static_cast<int32_t>(index);
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      auto v = static_cast<int64_t>(index);
      std::memcpy(out.data() + 8 * i, &v, 8);
    }
  }
  if (static_cast<uint64_t>(end - p) != 4 * k)
    return fail(
        fmt::format("packed top-k: {} value bytes after the indices, expected {}", end - p, 4 * k));
  if (k > 0)
    std::memcpy(out.data() + k * ib, p, 4 * k);
  if (auto s = kernels::check_payload(header, out.data(), out.size()); !s)
    return fail(s.what());
  return out;
}

} // namespace starling::actors::collab
