// The four leaves of a BTARD part digest (digest.hpp): a byte string is cut into 128-byte blocks
// (the last one may be short), block b goes to leaf b mod 4, and each leaf is the standard
// BLAKE2b-256 (RFC 7693, no key) of the blocks it got, in order. Four independent BLAKE2b
// instances over interleaved blocks run four at a time in one AVX2 register per state word
// (1.86 against 0.48 GB/s for libsodium's BLAKE2b: docs/results.md); without AVX2 the same bits
// come from a portable compression function. Internal to actors/btard. No CAF, no LibTorch.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace starling::actors::btard::detail {

/// Leaves of a part digest, in leaf order.
using leaf_digests = std::array<std::array<uint8_t, 32>, 4>;

/// The four leaves of a byte string of a length known in advance, fed in order in any cut.
class leaf_hasher {
public:
  /// A hasher for `total` bytes; `portable_only` skips the AVX2 path (tests compare the two).
  explicit leaf_hasher(uint64_t total, bool portable_only = false);

  /// Feeds the next `n` bytes (no more than the total in all).
  void update(const unsigned char* bytes, size_t n);

  /// The leaves; only once every byte of the total has been fed.
  leaf_digests finish();

private:
  void full_superblock(const unsigned char* p);

  uint64_t total_ = 0;
  /// Bytes compressed or dealt so far (a multiple of 512 until `finish`).
  uint64_t done_ = 0;
  /// State word w of leaf l at h_[w][l] (one AVX2 register per word).
  uint64_t h_[8][4];
  unsigned char buf_[512];
  size_t buffered_ = 0;
  bool avx2_ = false;
};

} // namespace starling::actors::btard::detail
