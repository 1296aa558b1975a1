#include "kernels/data/permutation.hpp"

namespace starling::kernels {

feistel_permutation::feistel_permutation(uint64_t n, uint64_t key) noexcept : n_(n) {
  // Smallest h with 4^h >= n, at least 1 so that n = 1 still has two halves.
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n)
    ++bits;
  half_bits_ = bits < 2 ? 1 : (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < rounds; ++r)
    round_keys_[r] = derive_key(key, static_cast<uint64_t>(r));
}

uint64_t feistel_permutation::round_function(int round, uint64_t half) const noexcept {
  return splitmix64_mix(half ^ round_keys_[round]) & half_mask_;
}

uint64_t feistel_permutation::encrypt(uint64_t x) const noexcept {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < rounds; ++r) {
    const uint64_t next = left ^ round_function(r, right);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t feistel_permutation::decrypt(uint64_t y) const noexcept {
  uint64_t left = y >> half_bits_, right = y & half_mask_;
  for (int r = rounds - 1; r >= 0; --r) {
    const uint64_t prev = right ^ round_function(r, left);
    right = left;
    left = prev;
  }
  return (left << half_bits_) | right;
}

uint64_t feistel_permutation::operator()(uint64_t x) const noexcept {
  do
    x = encrypt(x);
  while (x >= n_);
  return x;
}

uint64_t feistel_permutation::inverse(uint64_t y) const noexcept {
  do
    y = decrypt(y);
  while (y >= n_);
  return y;
}

} // namespace starling::kernels
