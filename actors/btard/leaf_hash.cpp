#include "actors/btard/leaf_hash.hpp"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace starling::actors::btard::detail {

namespace {

constexpr uint64_t leaf_iv[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL};

constexpr uint8_t leaf_sigma[12][16] = {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
                                        {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
                                        {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
                                        {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
                                        {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
                                        {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
                                        {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
                                        {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
                                        {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
                                        {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
                                        {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
                                        {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3}};

/// Bytes per BLAKE2b block, and per superblock (one block for each of the four leaves).
constexpr uint64_t leaf_block = 128;
constexpr uint64_t leaf_superblock = 4 * leaf_block;

inline uint64_t leaf_rotr(uint64_t x, int c) {
  return (x >> c) | (x << (64 - c));
}

inline uint64_t leaf_load64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

/// RFC 7693's F on leaf `l` of the word-major state, `block` of 128 bytes, counter `t`.
void leaf_compress(uint64_t h[8][4], size_t l, const unsigned char* block, uint64_t t, bool last) {
  uint64_t m[16], v[16];
  for (int i = 0; i < 16; ++i)
    m[i] = leaf_load64(block + 8 * i);
  for (int i = 0; i < 8; ++i) {
    v[i] = h[i][l];
    v[i + 8] = leaf_iv[i];
  }
  v[12] ^= t;
  if (last)
    v[14] = ~v[14];
  auto g = [&](int a, int b, int c, int d, uint64_t x, uint64_t y) {
    v[a] = v[a] + v[b] + x;
    v[d] = leaf_rotr(v[d] ^ v[a], 32);
    v[c] = v[c] + v[d];
    v[b] = leaf_rotr(v[b] ^ v[c], 24);
    v[a] = v[a] + v[b] + y;
    v[d] = leaf_rotr(v[d] ^ v[a], 16);
    v[c] = v[c] + v[d];
    v[b] = leaf_rotr(v[b] ^ v[c], 63);
  };
  for (const auto& s : leaf_sigma) {
    g(0, 4, 8, 12, m[s[0]], m[s[1]]);
    g(1, 5, 9, 13, m[s[2]], m[s[3]]);
    g(2, 6, 10, 14, m[s[4]], m[s[5]]);
    g(3, 7, 11, 15, m[s[6]], m[s[7]]);
    g(0, 5, 10, 15, m[s[8]], m[s[9]]);
    g(1, 6, 11, 12, m[s[10]], m[s[11]]);
    g(2, 7, 8, 13, m[s[12]], m[s[13]]);
    g(3, 4, 9, 14, m[s[14]], m[s[15]]);
  }
  for (int i = 0; i < 8; ++i)
    h[i][l] ^= v[i] ^ v[i + 8];
}

#if defined(__x86_64__) && defined(__GNUC__)
#define STARLING_LEAF_AVX2 1

/// `count` superblocks from `p`, none holding a leaf's last block: the four leaves' F at once,
/// lane l of each register being leaf l. `t` is each leaf's byte count before the first.
__attribute__((target("avx2"))) void leaf_superblocks_avx2(uint64_t h[8][4], const unsigned char* p,
                                                           size_t count, uint64_t t) {
  const __m256i rot24 = _mm256_setr_epi8(3, 4, 5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10, 3, 4,
                                         5, 6, 7, 0, 1, 2, 11, 12, 13, 14, 15, 8, 9, 10);
  const __m256i rot16 = _mm256_setr_epi8(2, 3, 4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9, 2, 3,
                                         4, 5, 6, 7, 0, 1, 10, 11, 12, 13, 14, 15, 8, 9);
  __m256i hv[8];
  for (int i = 0; i < 8; ++i)
    hv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(h[i]));
  for (size_t sb = 0; sb < count; ++sb, p += leaf_superblock) {
    t += leaf_block;
    // Word j of the four leaves' blocks into one register: a 4×4 transpose per four words.
    __m256i m[16];
    for (int q = 0; q < 4; ++q) {
      __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * q));
      __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * q));
      __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256 + 32 * q));
      __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 384 + 32 * q));
      __m256i t0 = _mm256_unpacklo_epi64(a, b);
      __m256i t1 = _mm256_unpackhi_epi64(a, b);
      __m256i t2 = _mm256_unpacklo_epi64(c, d);
      __m256i t3 = _mm256_unpackhi_epi64(c, d);
      m[4 * q + 0] = _mm256_permute2x128_si256(t0, t2, 0x20);
      m[4 * q + 1] = _mm256_permute2x128_si256(t1, t3, 0x20);
      m[4 * q + 2] = _mm256_permute2x128_si256(t0, t2, 0x31);
      m[4 * q + 3] = _mm256_permute2x128_si256(t1, t3, 0x31);
    }
    __m256i v[16];
    for (int i = 0; i < 8; ++i) {
      v[i] = hv[i];
      v[i + 8] = _mm256_set1_epi64x(static_cast<long long>(leaf_iv[i]));
    }
    v[12] = _mm256_set1_epi64x(static_cast<long long>(leaf_iv[4] ^ t));
    // A macro, not a lambda: a lambda's body would not inherit the function's AVX2 target.
#define STARLING_LEAF_G4(a, b, c, d, x, y)                                                         \
  do {                                                                                             \
    v[a] = _mm256_add_epi64(_mm256_add_epi64(v[a], v[b]), x);                                      \
    v[d] = _mm256_shuffle_epi32(_mm256_xor_si256(v[d], v[a]), 0xB1);                               \
    v[c] = _mm256_add_epi64(v[c], v[d]);                                                           \
    v[b] = _mm256_shuffle_epi8(_mm256_xor_si256(v[b], v[c]), rot24);                               \
    v[a] = _mm256_add_epi64(_mm256_add_epi64(v[a], v[b]), y);                                      \
    v[d] = _mm256_shuffle_epi8(_mm256_xor_si256(v[d], v[a]), rot16);                               \
    v[c] = _mm256_add_epi64(v[c], v[d]);                                                           \
    __m256i z_ = _mm256_xor_si256(v[b], v[c]);                                                     \
    v[b] = _mm256_or_si256(_mm256_srli_epi64(z_, 63), _mm256_add_epi64(z_, z_));                   \
  } while (0)
    for (const auto& s : leaf_sigma) {
      STARLING_LEAF_G4(0, 4, 8, 12, m[s[0]], m[s[1]]);
      STARLING_LEAF_G4(1, 5, 9, 13, m[s[2]], m[s[3]]);
      STARLING_LEAF_G4(2, 6, 10, 14, m[s[4]], m[s[5]]);
      STARLING_LEAF_G4(3, 7, 11, 15, m[s[6]], m[s[7]]);
      STARLING_LEAF_G4(0, 5, 10, 15, m[s[8]], m[s[9]]);
      STARLING_LEAF_G4(1, 6, 11, 12, m[s[10]], m[s[11]]);
      STARLING_LEAF_G4(2, 7, 8, 13, m[s[12]], m[s[13]]);
      STARLING_LEAF_G4(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
#undef STARLING_LEAF_G4
    for (int i = 0; i < 8; ++i)
      hv[i] = _mm256_xor_si256(hv[i], _mm256_xor_si256(v[i], v[i + 8]));
  }
  for (int i = 0; i < 8; ++i)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(h[i]), hv[i]);
}

bool leaf_has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

} // namespace

leaf_hasher::leaf_hasher(uint64_t total, bool portable_only) : total_(total) {
  for (int w = 0; w < 8; ++w)
    for (int l = 0; l < 4; ++l)
      h_[w][l] = leaf_iv[w];
  // Parameter block: digest length 32, no key, fanout 1, depth 1.
  for (int l = 0; l < 4; ++l)
    h_[0][l] ^= 0x01010020ULL;
#ifdef STARLING_LEAF_AVX2
  avx2_ = !portable_only && leaf_has_avx2();
#else
  (void)portable_only;
#endif
}

void leaf_hasher::full_superblock(const unsigned char* p) {
  // Leaf l's block here is its last when no byte lies a superblock further on.
  const uint64_t t = done_ / 4 + leaf_block;
  for (size_t l = 0; l < 4; ++l)
    leaf_compress(h_, l, p + leaf_block * l, t, done_ + leaf_block * l + leaf_superblock >= total_);
  done_ += leaf_superblock;
}

void leaf_hasher::update(const unsigned char* bytes, size_t n) {
  while (n > 0) {
    if (buffered_ > 0 || n < leaf_superblock) {
      size_t take = std::min(n, static_cast<size_t>(leaf_superblock) - buffered_);
      std::memcpy(buf_ + buffered_, bytes, take);
      buffered_ += take;
      bytes += take;
      n -= take;
      if (buffered_ == leaf_superblock) {
        full_superblock(buf_);
        buffered_ = 0;
      }
      continue;
    }
    // Superblocks straight from the input. Those that hold no leaf's last block (one more
    // superblock and a block of bytes follow) go four leaves at a time.
    size_t whole = n / leaf_superblock;
    size_t inner = 0;
    if (done_ + 7 * leaf_block < total_)
      inner =
          std::min<uint64_t>(whole, (total_ - done_ - 7 * leaf_block - 1) / leaf_superblock + 1);
#ifdef STARLING_LEAF_AVX2
    if (avx2_ && inner > 0) {
      leaf_superblocks_avx2(h_, bytes, inner, done_ / 4);
      done_ += inner * leaf_superblock;
      bytes += inner * leaf_superblock;
      n -= inner * leaf_superblock;
      whole -= inner;
    }
#endif
    for (size_t s = 0; s < whole; ++s) {
      full_superblock(bytes);
      bytes += leaf_superblock;
      n -= leaf_superblock;
    }
  }
}

leaf_digests leaf_hasher::finish() {
  // The last, short superblock: each leaf with bytes in it ends there.
  unsigned char block[leaf_block];
  for (size_t l = 0; l < 4; ++l) {
    uint64_t start = leaf_block * l;
    if (start < buffered_) {
      size_t len = std::min<size_t>(leaf_block, buffered_ - start);
      std::memset(block, 0, sizeof(block));
      std::memcpy(block, buf_ + start, len);
      leaf_compress(h_, l, block, done_ / 4 + len, true);
    } else if (done_ == 0) {
      // A leaf that got no byte: BLAKE2b of the empty string.
      std::memset(block, 0, sizeof(block));
      leaf_compress(h_, l, block, 0, true);
    }
  }
  done_ += buffered_;
  buffered_ = 0;
  leaf_digests out{};
  for (size_t l = 0; l < 4; ++l)
    for (size_t w = 0; w < 4; ++w)
      for (size_t b = 0; b < 8; ++b)
        out[l][8 * w + b] = static_cast<uint8_t>((h_[w][l] >> (8 * b)) & 0xff);
  return out;
}

} // namespace starling::actors::btard::detail

#undef STARLING_LEAF_AVX2
