#include "kernels/compress/detail/loops.hpp"

#include <cmath>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

// GCC's -O2 cost model ("very cheap") skips loops that need an epilogue; these loops are the hot
// path, so they get the dynamic cost model and an AVX2 clone picked at load time. Not under
// ThreadSanitizer: the clones' resolver runs while the dynamic loader relocates, before TSan's
// runtime is up, and its instrumented prologue crashes every program (`make tsan`).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define STARLING_VECTORIZE                                                                         \
  __attribute__((target_clones("avx2", "default"), optimize("vect-cost-model=dynamic")))
#else
#define STARLING_VECTORIZE
#endif

namespace starling::kernels::detail {

namespace {

constexpr size_t lanes = 16;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Portable fp32 <-> fp16 (round to nearest even), after Maratyszcza's FP16 library.
uint16_t fp16_from_fp32(float f) {
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  uint32_t w = bits_of(f);
  uint32_t shl1_w = w + w;
  uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u)
    bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  uint32_t b = bits_of(base);
  uint32_t exp_bits = (b >> 13) & 0x00007C00u;
  uint32_t mantissa_bits = b & 0x00000FFFu;
  uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float fp32_from_fp16(uint16_t h) {
  uint32_t w = static_cast<uint32_t>(h) << 16;
  uint32_t sign = w & 0x80000000u;
  uint32_t two_w = w + w;
  float normalized = float_of((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  float denormalized = float_of((two_w >> 17) | (126u << 23)) - 0.5f;
  uint32_t r = sign | (two_w < (1u << 27) ? bits_of(denormalized) : bits_of(normalized));
  return float_of(r);
}

bool half_bad(uint16_t h) {
  return (h & 0x7C00u) == 0x7C00u;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,f16c"))) size_t to_fp16_f16c(const float* x, uint16_t* out, size_t n,
                                                         bool& bad) {
  const __m128i mask = _mm_set1_epi16(0x7C00);
  __m128i acc = _mm_setzero_si128();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    acc = _mm_or_si128(acc, _mm_cmpeq_epi16(_mm_and_si128(h, mask), mask));
  }
  bad = _mm_movemask_epi8(acc) != 0;
  return i;
}

__attribute__((target("avx2,f16c"))) size_t from_fp16_f16c(const uint16_t* in, float* x, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  return i;
}

// Same arithmetic as the scalar loop (sub, mul, clamp, +0.5, truncate) on 8 elements.
__attribute__((target("avx2"))) inline __m256i uniform8_codes(const float* p, __m256 lo,
                                                              __m256 inv_step) {
  __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(p), lo), inv_step);
  v = _mm256_min_ps(_mm256_max_ps(v, _mm256_setzero_ps()), _mm256_set1_ps(255.0f));
  return _mm256_cvttps_epi32(_mm256_add_ps(v, _mm256_set1_ps(0.5f)));
}

// 32 elements a step; returns how many were encoded.
__attribute__((target("avx2"))) size_t uniform8_encode_avx2(const float* x, uint8_t* out, size_t n,
                                                            float lo, float inv_step) {
  const __m256 vlo = _mm256_set1_ps(lo);
  const __m256 vinv = _mm256_set1_ps(inv_step);
  // packs/packus interleave 128-bit lanes; this restores element order per 4-byte group.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256i ab =
        _mm256_packs_epi32(uniform8_codes(x + i, vlo, vinv), uniform8_codes(x + i + 8, vlo, vinv));
    __m256i cd = _mm256_packs_epi32(uniform8_codes(x + i + 16, vlo, vinv),
                                    uniform8_codes(x + i + 24, vlo, vinv));
    __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), bytes);
  }
  return i;
}

bool have_f16c() {
  static const bool yes = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2");
  return yes;
}
#endif

} // namespace

STARLING_VECTORIZE range_stats stats(const float* x, size_t n) {
  range_stats r;
  if (n == 0)
    return r;
  double s[lanes] = {};
  double q[lanes] = {};
  float mn[lanes];
  float mx[lanes];
  for (size_t j = 0; j < lanes; ++j)
    mn[j] = mx[j] = x[0];
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    for (size_t j = 0; j < lanes; ++j) {
      float v = x[i + j];
      mn[j] = v < mn[j] ? v : mn[j];
      mx[j] = v > mx[j] ? v : mx[j];
      s[j] += v;
      q[j] += static_cast<double>(v) * v;
    }
  }
  for (; i < n; ++i) {
    float v = x[i];
    mn[0] = v < mn[0] ? v : mn[0];
    mx[0] = v > mx[0] ? v : mx[0];
    s[0] += v;
    q[0] += static_cast<double>(v) * v;
  }
  r.min = mn[0];
  r.max = mx[0];
  for (size_t j = 0; j < lanes; ++j) {
    r.sum += s[j];
    r.sum_sq += q[j];
    r.min = mn[j] < r.min ? mn[j] : r.min;
    r.max = mx[j] > r.max ? mx[j] : r.max;
  }
  // Any inf or NaN makes a sum or the sum of squares non-finite; finite floats cannot overflow
  // a double accumulator below 2^40 elements.
  r.finite = std::isfinite(r.sum) && std::isfinite(r.sum_sq);
  return r;
}

void merge(range_stats& a, const range_stats& b, size_t n_a, size_t n_b) {
  if (n_b == 0)
    return;
  if (n_a == 0) {
    a = b;
    return;
  }
  a.sum += b.sum;
  a.sum_sq += b.sum_sq;
  a.min = b.min < a.min ? b.min : a.min;
  a.max = b.max > a.max ? b.max : a.max;
  a.finite = a.finite && b.finite;
}

STARLING_VECTORIZE bool all_finite(const float* x, size_t n) {
  // x·0 is 0 for finite x and NaN otherwise; NaN survives the sum.
  float acc[lanes] = {};
  size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (size_t j = 0; j < lanes; ++j)
      acc[j] += x[i + j] * 0.0f;
  for (; i < n; ++i)
    acc[0] += x[i] * 0.0f;
  float total = 0.0f;
  for (size_t j = 0; j < lanes; ++j)
    total += acc[j];
  return total == 0.0f;
}

STARLING_VECTORIZE float absmax_or_negative(const float* x, size_t n) {
  float m[lanes] = {};
  float z[lanes] = {};
  size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (size_t j = 0; j < lanes; ++j) {
      float a = std::fabs(x[i + j]);
      m[j] = a > m[j] ? a : m[j];
      z[j] += x[i + j] * 0.0f;
    }
  for (; i < n; ++i) {
    float a = std::fabs(x[i]);
    m[0] = a > m[0] ? a : m[0];
    z[0] += x[i] * 0.0f;
  }
  float r = 0.0f;
  float zs = 0.0f;
  for (size_t j = 0; j < lanes; ++j) {
    r = m[j] > r ? m[j] : r;
    zs += z[j];
  }
  return zs == 0.0f ? r : -1.0f;
}

static STARLING_VECTORIZE void uniform8_encode_scalar(const float* __restrict x,
                                                      uint8_t* __restrict out, size_t n, float lo,
                                                      float inv_step) {
  for (size_t i = 0; i < n; ++i) {
    float v = (x[i] - lo) * inv_step;
    v = v < 0.0f ? 0.0f : v;
    v = v > 255.0f ? 255.0f : v;
    out[i] = static_cast<uint8_t>(static_cast<int32_t>(v + 0.5f));
  }
}

void uniform8_encode(const float* x, uint8_t* out, size_t n, float lo, float inv_step) {
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  // The narrowing float -> int32 -> uint8 of the scalar loop vectorizes poorly (17% of memcpy).
  if (__builtin_cpu_supports("avx2"))
    i = uniform8_encode_avx2(x, out, n, lo, inv_step);
#endif
  uniform8_encode_scalar(x + i, out + i, n - i, lo, inv_step);
}

STARLING_VECTORIZE void uniform8_decode(const uint8_t* __restrict in, float* __restrict x, size_t n,
                                        float lo, float step) {
  for (size_t i = 0; i < n; ++i)
    x[i] = lo + static_cast<float>(in[i]) * step;
}

STARLING_VECTORIZE void blockwise8_encode_block(const float* __restrict x, int8_t* __restrict out,
                                                size_t n, float absmax) {
  float inv = absmax > 0.0f ? 127.0f / absmax : 0.0f;
  for (size_t i = 0; i < n; ++i) {
    // Shift to a positive range so that truncation rounds half up, then shift back.
    float v = x[i] * inv + 128.5f;
    v = v < 1.0f ? 1.0f : v;
    v = v > 255.0f ? 255.0f : v;
    out[i] = static_cast<int8_t>(static_cast<int32_t>(v) - 128);
  }
}

STARLING_VECTORIZE void blockwise8_decode_block(const int8_t* __restrict in, float* __restrict x,
                                                size_t n, float absmax) {
  float scale = absmax / 127.0f;
  for (size_t i = 0; i < n; ++i)
    x[i] = static_cast<float>(in[i]) * scale;
}

STARLING_VECTORIZE void quantile8_encode(const float* __restrict x, uint8_t* __restrict out,
                                         size_t n, const float* __restrict mid) {
  for (size_t i = 0; i < n; ++i) {
    float v = x[i];
    uint32_t pos = 0;
    pos += v > mid[pos + 127] ? 128u : 0u;
    pos += v > mid[pos + 63] ? 64u : 0u;
    pos += v > mid[pos + 31] ? 32u : 0u;
    pos += v > mid[pos + 15] ? 16u : 0u;
    pos += v > mid[pos + 7] ? 8u : 0u;
    pos += v > mid[pos + 3] ? 4u : 0u;
    pos += v > mid[pos + 1] ? 2u : 0u;
    pos += v > mid[pos] ? 1u : 0u;
    out[i] = static_cast<uint8_t>(pos);
  }
}

STARLING_VECTORIZE void quantile8_decode(const uint8_t* __restrict in, float* __restrict x,
                                         size_t n, const float* __restrict table) {
  for (size_t i = 0; i < n; ++i)
    x[i] = table[in[i]];
}

bool to_fp16(const float* x, uint16_t* out, size_t n) {
  size_t i = 0;
  bool bad = false;
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_f16c())
    i = to_fp16_f16c(x, out, n, bad);
#endif
  for (; i < n; ++i) {
    out[i] = fp16_from_fp32(x[i]);
    bad = bad || half_bad(out[i]);
  }
  return !bad;
}

void from_fp16(const uint16_t* in, float* x, size_t n) {
  size_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
  if (have_f16c())
    i = from_fp16_f16c(in, x, n);
#endif
  for (; i < n; ++i)
    x[i] = fp32_from_fp16(in[i]);
}

STARLING_VECTORIZE bool to_bf16(const float* __restrict x, uint16_t* __restrict out, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    // Non-finite input, or rounding that overflowed to infinity.
    bad |= static_cast<uint32_t>((u & 0x7F800000u) == 0x7F800000u) |
           static_cast<uint32_t>((r & 0x7F80u) == 0x7F80u);
    out[i] = static_cast<uint16_t>(r);
  }
  return bad == 0;
}

STARLING_VECTORIZE void from_bf16(const uint16_t* __restrict in, float* __restrict x, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(x + i, &u, 4);
  }
}

} // namespace starling::kernels::detail

#undef STARLING_VECTORIZE
