#include "actors/btard/digest.hpp"

#include <sodium.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "actors/btard/bytes.hpp"
#include "actors/btard/leaf_hash.hpp"

namespace starling::actors::btard {

namespace {

constexpr std::string_view part_tag = "starling.btard.part.v2";

/// The bytes hashed before the leaves: tag, step, part index, element count.
std::string part_header(uint64_t step, uint64_t part, uint64_t count) {
  std::string h{part_tag};
  detail::put_u64(h, step);
  detail::put_u64(h, part);
  detail::put_u64(h, count);
  return h;
}

/// Feeds float32 values as little-endian bytes (converted in blocks on a big-endian host).
void update_floats(detail::leaf_hasher& h, const float* values, size_t n) {
  if (n == 0)
    return;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  h.update(reinterpret_cast<const unsigned char*>(values), n * sizeof(float));
#else
  unsigned char block[4096];
  size_t done = 0;
  while (done < n) {
    size_t take = std::min(n - done, sizeof(block) / 4);
    for (size_t i = 0; i < take; ++i) {
      uint32_t bits = 0;
      std::memcpy(&bits, values + done + i, 4);
      for (int b = 0; b < 4; ++b)
        block[4 * i + b] = static_cast<unsigned char>((bits >> (8 * b)) & 0xff);
    }
    h.update(block, 4 * take);
    done += take;
  }
#endif
}

/// The part digest from its header and its leaves.
digest root_of(const std::string& header, const detail::leaf_digests& leaves) {
  if (sodium_init() < 0)
    std::abort();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, digest_bytes);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(header.data()),
                            header.size());
  for (auto& leaf : leaves)
    crypto_generichash_update(&st, leaf.data(), leaf.size());
  digest out{};
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

} // namespace

struct part_hasher::state {
  state(uint64_t step, uint64_t part, uint64_t count)
      : header(part_header(step, part, count)),
        leaves(count <= max_part_elems ? count * sizeof(float) : 0) {}
  std::string header;
  detail::leaf_hasher leaves;
};

digest part_digest(uint64_t step, uint64_t part, const float* values, size_t count) {
  detail::leaf_hasher leaves(uint64_t{count} * sizeof(float));
  update_floats(leaves, values, count);
  return root_of(part_header(step, part, count), leaves.finish());
}

digest part_digest(uint64_t step, uint64_t part, const std::vector<float>& values) {
  return part_digest(step, part, values.data(), values.size());
}

digest hash_bytes(std::string_view bytes) {
  if (sodium_init() < 0)
    std::abort();
  digest out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  return out;
}

std::string digest_string(const digest& d) {
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

result<digest> digest_of_string(std::string_view bytes) {
  if (bytes.size() != digest_bytes)
    return fail(fmt::format("a digest is {} bytes, got {}", digest_bytes, bytes.size()));
  digest d{};
  std::memcpy(d.data(), bytes.data(), d.size());
  return d;
}

std::string digest_hex(const digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * d.size());
  for (auto c : d) {
    s.push_back(digits[c >> 4]);
    s.push_back(digits[c & 15]);
  }
  return s;
}

part_hasher::part_hasher(uint64_t step, uint64_t part, uint64_t count)
    : state_(std::make_unique<state>(step, part, count)), count_(count) {}

part_hasher::~part_hasher() = default;
part_hasher::part_hasher(part_hasher&&) noexcept = default;
part_hasher& part_hasher::operator=(part_hasher&&) noexcept = default;

void part_hasher::feed(const float* values, size_t n) {
  update_floats(state_->leaves, values, n);
  next_ += n;
}

status part_hasher::add(uint64_t offset, const float* values, size_t n) {
  if (finished_)
    return fail("part_hasher: a chunk came after finish()");
  if (count_ > max_part_elems)
    return fail(fmt::format("part_hasher: a part of {} values is larger than the {} allowed",
                            count_, max_part_elems));
  if (offset > count_ || n > count_ - offset)
    return fail(fmt::format("part_hasher: chunk [{}, +{}) reaches past the part's {} values",
                            offset, n, count_));
  if (n == 0)
    return {};
  if (values == nullptr)
    return fail("part_hasher: a chunk of values without data");
  if (offset < next_)
    return fail(fmt::format("part_hasher: chunk [{}, +{}) overlaps values already hashed "
                            "(before {})",
                            offset, n, next_));
  // The pending chunks are disjoint and sorted: only the neighbours can overlap.
  auto after = pending_.lower_bound(offset);
  if (after != pending_.end() && after->first < offset + n)
    return fail(fmt::format("part_hasher: chunk [{}, +{}) overlaps a chunk at {} that arrived "
                            "earlier",
                            offset, n, after->first));
  if (after != pending_.begin()) {
    auto before = std::prev(after);
    if (before->first + before->second.size() > offset)
      return fail(fmt::format("part_hasher: chunk [{}, +{}) overlaps a chunk at {} that arrived "
                              "earlier",
                              offset, n, before->first));
  }
  received_ += n;
  if (offset != next_) {
    pending_.emplace(offset, std::vector<float>(values, values + n));
    return {};
  }
  feed(values, n);
  for (auto it = pending_.begin(); it != pending_.end() && it->first == next_;
       it = pending_.erase(it))
    feed(it->second.data(), it->second.size());
  return {};
}

result<digest> part_hasher::finish() {
  if (finished_)
    return fail("part_hasher: finish() called twice");
  if (count_ > max_part_elems)
    return fail(fmt::format("part_hasher: a part of {} values is larger than the {} allowed",
                            count_, max_part_elems));
  if (!complete())
    return fail(fmt::format("part_hasher: {} of {} values arrived ({} in order); the digest "
                            "needs the whole part",
                            received_, count_, next_));
  finished_ = true;
  return root_of(state_->header, state_->leaves.finish());
}

} // namespace starling::actors::btard
