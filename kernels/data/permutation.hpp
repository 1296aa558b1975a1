// A keyed pseudo-random permutation of [0, n) that needs no memory: a balanced Feistel network
// over the smallest even number of bits that holds n, restricted to [0, n) by cycle-walking.
// Used by the loader to shuffle up to ~10^8 samples per epoch without a shuffled vector.
#pragma once

#include <cstdint>

#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

/// A key derived from `a` and `b` (order matters): chains `splitmix64_mix` so that e.g. (seed, shard) and
/// (shard, seed) give unrelated keys.
inline uint64_t derive_key(uint64_t a, uint64_t b) noexcept {
  return splitmix64_mix(splitmix64_mix(a) ^ (b * 0xd6e8feb86659fd93ULL + 0x632be59bd9b4e019ULL));
}

/// A bijection of [0, n) chosen by `key`.
///
/// A Feistel network is a bijection of [0, 4^h) whatever its round function, so the map is
/// exact, not approximately a permutation. Cycle-walking (apply it again while the value is
/// >= n) keeps the bijection on [0, n): starting from x < n, the walk follows x's cycle of the
/// big permutation and stops at the first element of that cycle below n, which no other start
/// below n reaches first. Since 4^h < 4n, a walk takes fewer than 4 steps on average.
class feistel_permutation {
public:
  /// The permutation of [0, n) for `key`; `n` must be in [1, 2^62].
  feistel_permutation(uint64_t n, uint64_t key) noexcept;

  /// The image of `x` (x < n).
  uint64_t operator()(uint64_t x) const noexcept;

  /// The preimage of `y` (y < n): `inverse((*this)(x)) == x`.
  uint64_t inverse(uint64_t y) const noexcept;

  /// The domain size n.
  uint64_t size() const noexcept { return n_; }

private:
  /// Rounds: 3 make a pseudo-random permutation for a random round function (Luby-Rackoff);
  /// 6 leave a margin for the hash used as one.
  static constexpr int rounds = 6;

  uint64_t round_function(int round, uint64_t half) const noexcept;
  uint64_t encrypt(uint64_t x) const noexcept;
  uint64_t decrypt(uint64_t y) const noexcept;

  uint64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t round_keys_[rounds];
};

} // namespace starling::kernels
