#include "kernels/seeded_hash.hpp"

#include <doctest/doctest.h>

#include <cstdint>

// Pinned values, computed by the hand-written copies these functions replaced: a change here
// silently changes simulation trace digests, data orders, model initializations and saved runs.
namespace starling::kernels::seeded_hash_test {

constexpr uint64_t all_ones = ~uint64_t{0};

// Usable at compile time.
static_assert(splitmix64_mix(0) == 0xe220a8397b1dcdafULL);
static_assert(splitmix64_stream{}.next() == 0xe220a8397b1dcdafULL);

TEST_CASE("splitmix64_finalize and splitmix64_mix are splitmix64 with its pinned outputs") {
  CHECK(splitmix64_gamma == 0x9e3779b97f4a7c15ULL);
  CHECK(splitmix64_finalize(0) == 0);
  CHECK(splitmix64_finalize(1) == 0x5692161d100b05e5ULL);
  CHECK(splitmix64_finalize(42) == 0xa759ea27d4727622ULL);
  CHECK(splitmix64_finalize(all_ones) == 0xb4d055fcf2cbbd7bULL);
  CHECK(splitmix64_mix(0) == 0xe220a8397b1dcdafULL);
  CHECK(splitmix64_mix(1) == 0x910a2dec89025cc1ULL);
  CHECK(splitmix64_mix(42) == 0xbdd732262feb6e95ULL);
  CHECK(splitmix64_mix(all_ones) == 0xe4d971771b652c20ULL);
  for (uint64_t x : {uint64_t{0}, uint64_t{7}, all_ones, uint64_t{1} << 63})
    CHECK(splitmix64_mix(x) == splitmix64_finalize(x + splitmix64_gamma));
}

TEST_CASE("splitmix64_combine finalizes seed plus tag times gamma plus an optional offset") {
  // The GPT models' seeds: (seed, tag).
  CHECK(splitmix64_combine(0, 0) == 0);
  CHECK(splitmix64_combine(0, 1) == 0xe220a8397b1dcdafULL);
  CHECK(splitmix64_combine(42, 0xE3B) == 0x49c26b486b4abbd9ULL);
  CHECK(splitmix64_combine(42, 0x4EAD) == 0x9e37852a03c68615ULL);
  CHECK(splitmix64_combine(all_ones, all_ones) == 0xde0a564cbcd060c4ULL);
  CHECK(splitmix64_combine(7, 3) == 0xe6984080bab12a02ULL);
  // The data-parallel peers' stream seeds: (seed, stream) with an offset.
  constexpr uint64_t offset = 0x632BE59BD9B4E019ULL;
  CHECK(splitmix64_combine(0, 0, offset) == 0x6db6ca64564daeaaULL);
  CHECK(splitmix64_combine(0, 1, offset) == 0x5cc60547776902baULL);
  CHECK(splitmix64_combine(42, 0xE3B, offset) == 0x029d830481a62b1bULL);
  CHECK(splitmix64_combine(all_ones, all_ones, offset) == 0xee911288b2575648ULL);
  CHECK(splitmix64_combine(7, 3, offset) == 0x0499840389dedee1ULL);
  // The per-layer dropout seeds: (seed, tag + 1), which wraps to a zero tag for the input layer.
  CHECK(splitmix64_combine(0, 0 + 1) == 0xe220a8397b1dcdafULL);
  CHECK(splitmix64_combine(42, 0xE3B + 1) == 0x2644e4a61d046fabULL);
  CHECK(splitmix64_combine(7, 3 + 1) == 0x953aeb70673e29cbULL);
  CHECK(splitmix64_combine(all_ones, all_ones + 1) == 0xb4d055fcf2cbbd7bULL);
  // One more step of tag is one more gamma: combine(seed, tag + 1) is mix(seed + tag * gamma).
  CHECK(splitmix64_combine(7, 3 + 1) == splitmix64_mix(7 + 3 * splitmix64_gamma));
}

TEST_CASE("splitmix64_combine_two_rounds keeps the MLP seeds, which skip the middle round") {
  CHECK(splitmix64_combine_two_rounds(0, 0) == 0);
  CHECK(splitmix64_combine_two_rounds(0, 1) == 0x6f68261b8937eb46ULL);
  CHECK(splitmix64_combine_two_rounds(42, 0xE3B) == 0x2f8aea665acbb5d4ULL);
  CHECK(splitmix64_combine_two_rounds(42, 0x4EAD) == 0xd4b274fe8f307713ULL);
  CHECK(splitmix64_combine_two_rounds(all_ones, all_ones) == 0x0023734757a141feULL);
  CHECK(splitmix64_combine_two_rounds(7, 3) == 0x6cf9292325483738ULL);
  CHECK(splitmix64_combine_two_rounds(7, 3) != splitmix64_combine(7, 3));
}

TEST_CASE("splitmix64_stream steps its state by gamma and draws the finalized state") {
  splitmix64_stream s{0};
  CHECK(s.next() == 0xe220a8397b1dcdafULL);
  CHECK(s.next() == 0x6e789e6aa1b965f4ULL);
  CHECK(s.next() == 0x06c45d188009454fULL);
  CHECK(s.state == 0xdaa66d2c7ddf743fULL);
  for (uint64_t x : {uint64_t{0}, uint64_t{42}, all_ones}) {
    splitmix64_stream t{x};
    CHECK(t.next() == splitmix64_mix(x));
    CHECK(t.state == x + splitmix64_gamma);
  }
}

TEST_CASE("splitmix64_stream below draws the pinned bounded values, rejecting when it must") {
  // The Rand-k indices' stream: seed ^ gamma.
  splitmix64_stream a{0 ^ splitmix64_gamma};
  CHECK(a.below(10) == 4);
  CHECK(a.below(1000) == 26);
  CHECK(a.below(1) == 0);
  CHECK(a.below((uint64_t{1} << 63) + 1) == 980875101213047373ULL);
  CHECK(a.below(all_ones) == 6038094601263162089ULL);
  CHECK(a.next() == 3207296026000306913ULL);

  splitmix64_stream b{42 ^ splitmix64_gamma};
  CHECK(b.below(10) == 1);
  CHECK(b.below(1000) == 278);
  CHECK(b.below(1) == 0);
  CHECK(b.below((uint64_t{1} << 63) + 1) == 8007990562831494531ULL);
  CHECK(b.below(all_ones) == 4028864712777624924ULL);
  CHECK(b.next() == 14769051326987775908ULL);

  // From state 0 the first two draws fall in the rejected sliver of 2^63 + 1: the third is used.
  splitmix64_stream c{0};
  CHECK(c.below((uint64_t{1} << 63) + 1) == 243808509735772839ULL);
  CHECK(c.state == 3 * splitmix64_gamma);
  CHECK(c.next() == 0xf88bb8a8724c81ecULL);
}

} // namespace starling::kernels::seeded_hash_test
