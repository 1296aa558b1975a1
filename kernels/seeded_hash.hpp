// Seeded hashing: splitmix64 (Steele, Lea & Flood, 2014, with Vigna's finalizer constants) and
// the variants of it that the project's seeds, streams and draws were built with. Each function
// is a fixed function of its inputs on every platform and build (unlike std::hash and the
// <random> distributions). Their outputs reach simulation trace digests, data orders, model
// initializations and saved runs: changing one changes all of those, so tests pin their values.
#pragma once

#include <cstdint>

namespace starling::kernels {

/// splitmix64's increment, 2^64 over the golden ratio (odd): the stream's step and the tag scale.
inline constexpr uint64_t splitmix64_gamma = 0x9e3779b97f4a7c15ULL;

/// splitmix64's output function applied to z itself (no gamma added): a bijection of 64-bit values.
inline constexpr uint64_t splitmix64_finalize(uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// One splitmix64 step from state x, `splitmix64_finalize(x + splitmix64_gamma)`: neighbouring
/// inputs give unrelated outputs.
inline constexpr uint64_t splitmix64_mix(uint64_t x) noexcept {
  return splitmix64_finalize(x + splitmix64_gamma);
}

/// A seed for each (seed, tag), `splitmix64_finalize(seed + tag * splitmix64_gamma + offset)`: the
/// state splitmix64 would reach from `seed + offset` after `tag` steps, finalized.
inline constexpr uint64_t splitmix64_combine(uint64_t seed, uint64_t tag,
                                             uint64_t offset = 0) noexcept {
  return splitmix64_finalize(seed + tag * splitmix64_gamma + offset);
}

/// NOT splitmix64: `splitmix64_combine` without the finalizer's second xor-shift-multiply (>> 27,
/// * 0x94d049bb133111eb), so weaker; kept because the MLP models' initial weights come from it.
inline constexpr uint64_t splitmix64_combine_two_rounds(uint64_t seed, uint64_t tag) noexcept {
  uint64_t z = seed + tag * splitmix64_gamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  return z ^ (z >> 31);
}

/// The splitmix64 generator: `next()` adds gamma to `state` and returns the finalized new state.
struct splitmix64_stream {
  /// The state; the first draw is `splitmix64_mix(state)`.
  uint64_t state = 0;

  /// The next 64-bit draw.
  constexpr uint64_t next() noexcept {
    state += splitmix64_gamma;
    return splitmix64_finalize(state);
  }

  /// A uniform draw in [0, bound) for bound >= 1, unbiased (Lemire's multiply-and-reject): one
  /// `next()`, more only when the first falls in the rejected sliver of size 2^64 mod bound.
  constexpr uint64_t below(uint64_t bound) noexcept {
    __extension__ typedef unsigned __int128 u128; // GCC and Clang; quiet under -Wpedantic
    u128 m = static_cast<u128>(next()) * bound;
    auto low = static_cast<uint64_t>(m);
    if (low < bound) {
      uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<u128>(next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

} // namespace starling::kernels
