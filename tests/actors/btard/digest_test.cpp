#include "actors/btard/digest.hpp"
#include "actors/btard/leaf_hash.hpp"

#include <doctest/doctest.h>

#include <sodium.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/seeded_hash.hpp"

namespace starling::test::btard_digest {

namespace btard = starling::actors::btard;

namespace {

std::vector<float> random_values(uint64_t seed, size_t n) {
  kernels::splitmix64_stream rng{seed};
  std::vector<float> v(n);
  for (auto& x : v)
    x = static_cast<float>(static_cast<int64_t>(rng.next() >> 40) - (int64_t{1} << 23)) / 1024.0f;
  return v;
}

/// BLAKE2b-256 of `bytes` (libsodium: the oracle for the leaves).
std::array<uint8_t, 32> blake2b(const std::string& bytes) {
  std::array<uint8_t, 32> out{};
  crypto_generichash(out.data(), out.size(), reinterpret_cast<const unsigned char*>(bytes.data()),
                     bytes.size(), nullptr, 0);
  return out;
}

/// The four leaves as leaf_hash.hpp states them, by libsodium over the gathered blocks.
btard::detail::leaf_digests leaves_by_hand(const std::string& bytes) {
  std::string stripe[4];
  for (size_t b = 0; 128 * b < bytes.size(); ++b)
    stripe[b % 4] += bytes.substr(128 * b, 128);
  btard::detail::leaf_digests out{};
  for (size_t l = 0; l < 4; ++l)
    out[l] = blake2b(stripe[l]);
  return out;
}

std::string le_bytes(const std::vector<float>& v) {
  std::string out;
  for (float x : v) {
    uint32_t bits = 0;
    std::memcpy(&bits, &x, 4);
    for (int i = 0; i < 4; ++i)
      out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  }
  return out;
}

/// The digest as the header states it, built by hand.
btard::digest by_hand(uint64_t step, uint64_t part, const std::vector<float>& v) {
  std::string in = "starling.btard.part.v2";
  for (uint64_t f : {step, part, static_cast<uint64_t>(v.size())})
    for (int i = 0; i < 8; ++i)
      in.push_back(static_cast<char>((f >> (8 * i)) & 0xff));
  for (auto& leaf : leaves_by_hand(le_bytes(v)))
    in.append(reinterpret_cast<const char*>(leaf.data()), leaf.size());
  return blake2b(in);
}

btard::detail::leaf_digests leaves_of(const std::string& bytes, bool portable_only,
                                      kernels::splitmix64_stream* cuts = nullptr) {
  btard::detail::leaf_hasher h(bytes.size(), portable_only);
  auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t done = 0;
  while (done < bytes.size()) {
    size_t take = bytes.size() - done;
    if (cuts)
      take = std::min(take, static_cast<size_t>(cuts->below(2000)));
    h.update(p + done, take);
    done += take;
  }
  return h.finish();
}

} // namespace

TEST_CASE("the leaves are BLAKE2b-256 of the blocks dealt round robin, AVX2 or not, any cut") {
  REQUIRE(sodium_init() >= 0);
  kernels::splitmix64_stream rng{4301};
  // Lengths around the block (128), superblock (512) and the last-block edges (896).
  std::vector<size_t> sizes{0,   1,   4,   127, 128,  129,  255,  256,  384,  511,  512,  513,
                            640, 895, 896, 897, 1024, 1025, 1408, 1536, 1537, 4096, 65540};
  for (int r = 0; r < 20; ++r)
    sizes.push_back(static_cast<size_t>(rng.below(20000)));
  for (size_t n : sizes) {
    std::string bytes(n, '\0');
    for (auto& c : bytes)
      c = static_cast<char>(rng.next() & 0xff);
    auto want = leaves_by_hand(bytes);
    CAPTURE(n);
    CHECK(leaves_of(bytes, false) == want);
    CHECK(leaves_of(bytes, true) == want);
    CHECK(leaves_of(bytes, false, &rng) == want);
    CHECK(leaves_of(bytes, true, &rng) == want);
  }
}

TEST_CASE("a part digest is BLAKE2b-256 of tag, step, part, count and the four leaves") {
  REQUIRE(sodium_init() >= 0);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    auto v = random_values(n + 3, n);
    CHECK(btard::part_digest(5, 2, v) == by_hand(5, 2, v));
  }
  // Pinned, so that a change of the encoding (which audit logs depend on) is seen.
  CHECK(btard::digest_hex(btard::part_digest(0, 0, std::vector<float>{})) ==
        "7418b2142d8346d44f6e3a51e5deb631c8bcd0b4a853d511e800e057eae657d0");
  CHECK(btard::digest_hex(btard::part_digest(1, 2, std::vector<float>{1.0f, -2.5f})) ==
        "f923887980573ba8ee166b198a451257f23a4c497ae37331335389ea99a64b41");
}

TEST_CASE("a part digest changes with the step, the part, the count and any value") {
  auto v = random_values(1, 64);
  auto d = btard::part_digest(10, 3, v);
  CHECK(btard::part_digest(11, 3, v) != d);
  CHECK(btard::part_digest(10, 4, v) != d);
  auto longer = v;
  longer.push_back(0.0f);
  CHECK(btard::part_digest(10, 3, longer) != d);
  auto shorter = v;
  shorter.pop_back();
  CHECK(btard::part_digest(10, 3, shorter) != d);
  for (size_t i : {size_t{0}, size_t{31}, size_t{63}}) {
    auto w = v;
    w[i] = std::nextafter(w[i], 1e30f);
    CHECK(btard::part_digest(10, 3, w) != d);
  }
  // Bytes, not numbers: -0 and +0 differ (a receiver compares what was sent).
  CHECK(btard::part_digest(0, 0, std::vector<float>{0.0f}) !=
        btard::part_digest(0, 0, std::vector<float>{-0.0f}));
}

TEST_CASE("the streaming digest equals the whole one for any cut and any arrival order") {
  kernels::splitmix64_stream rng{99};
  for (int trial = 0; trial < 200; ++trial) {
    size_t n = 1 + static_cast<size_t>(rng.below(trial < 150 ? 300 : 5000));
    auto v = random_values(static_cast<uint64_t>(trial), n);
    auto want = btard::part_digest(7, static_cast<uint64_t>(trial), v);
    // Random cut points, then a random order of the chunks.
    std::vector<size_t> cuts{0, n};
    for (size_t k = rng.below(12); k > 0; --k)
      cuts.push_back(static_cast<size_t>(rng.below(n + 1)));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::pair<size_t, size_t>> chunks;
    for (size_t i = 0; i + 1 < cuts.size(); ++i)
      chunks.emplace_back(cuts[i], cuts[i + 1] - cuts[i]);
    for (size_t i = chunks.size(); i > 1; --i)
      std::swap(chunks[i - 1], chunks[static_cast<size_t>(rng.below(i))]);
    btard::part_hasher h(7, static_cast<uint64_t>(trial), n);
    for (size_t i = 0; i < chunks.size(); ++i) {
      CHECK_FALSE(h.complete());
      REQUIRE(h.add(chunks[i].first, v.data() + chunks[i].first, chunks[i].second));
    }
    CHECK(h.complete());
    CHECK(h.received() == n);
    auto got = h.finish();
    REQUIRE(got);
    CHECK(*got == want);
  }
}

TEST_CASE("the streaming digest refuses overlaps, chunks past the end and an early finish") {
  auto v = random_values(5, 10);
  btard::part_hasher h(1, 1, 10);
  REQUIRE(h.add(6, v.data() + 6, 2));
  auto past = h.add(8, v.data() + 8, 3);
  CHECK_FALSE(past);
  CHECK(past.what().find("past the part") != std::string::npos);
  auto overlap = h.add(5, v.data() + 5, 2);
  CHECK_FALSE(overlap);
  CHECK(overlap.what().find("overlaps") != std::string::npos);
  CHECK_FALSE(h.add(7, v.data() + 7, 3)); // overlaps the pending [6, 8) from the right side
  REQUIRE(h.add(0, v.data(), 4));
  CHECK(h.contiguous() == 4);
  CHECK_FALSE(h.add(3, v.data() + 3, 1)); // already hashed
  auto early = h.finish();
  REQUIRE_FALSE(early);
  CHECK(early.error().what.find("6 of 10") != std::string::npos);
  // Refused chunks changed nothing: the rest completes the same digest.
  REQUIRE(h.add(4, v.data() + 4, 2));
  CHECK(h.contiguous() == 8);
  REQUIRE(h.add(8, v.data() + 8, 2));
  auto d = h.finish();
  REQUIRE(d);
  CHECK(*d == btard::part_digest(1, 1, v));
  CHECK_FALSE(h.finish());
  CHECK_FALSE(h.add(0, v.data(), 1));
}

TEST_CASE("an empty part's streaming digest needs no chunk, and zero-length chunks are no-ops") {
  btard::part_hasher h(3, 0, 0);
  CHECK(h.complete());
  CHECK(h.add(0, nullptr, 0));
  auto d = h.finish();
  REQUIRE(d);
  CHECK(*d == btard::part_digest(3, 0, nullptr, 0));
}

TEST_CASE("digest strings round-trip and other sizes are refused") {
  auto d = btard::hash_bytes("abc");
  auto s = btard::digest_string(d);
  CHECK(s.size() == 32);
  auto back = btard::digest_of_string(s);
  REQUIRE(back);
  CHECK(*back == d);
  auto bad = btard::digest_of_string(s.substr(1));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().what.find("31") != std::string::npos);
  CHECK(btard::digest_hex(d).size() == 64);
}

} // namespace starling::test::btard_digest
