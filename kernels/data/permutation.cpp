#include "kernels/data/permutation.hpp"

namespace starling::kernels {

uint64_t mix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t derive_key(uint64_t a, uint64_t b) noexcept {
  return mix64(mix64(a) ^ (b * 0xd6e8feb86659fd93ULL + 0x632be59bd9b4e019ULL));
}

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
  return mix64(half ^ round_keys_[round]) & half_mask_;
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
