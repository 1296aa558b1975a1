// The inner loops of the codecs on raw buffers: no torch, no CAF, no allocation. Callers split
// work into ranges (threads); every function handles one contiguous range. Loops are compiled
// for AVX2 and baseline x86-64 and picked at load time (GCC target_clones).
#pragma once

#include <cstddef>
#include <cstdint>

namespace starling::kernels::detail {

/// Sum, sum of squares, min and max of a range, and whether every element is finite.
struct range_stats {
  double sum = 0;     ///< Σ x
  double sum_sq = 0;  ///< Σ x²
  float min = 0;      ///< smallest element (meaningless when `!finite` or n = 0)
  float max = 0;      ///< largest element
  bool finite = true; ///< no inf or NaN seen
};

/// Statistics of `x[0, n)`; n may be 0.
range_stats stats(const float* x, size_t n);

/// Merges statistics of two disjoint ranges (b of n_b elements).
void merge(range_stats& a, const range_stats& b, size_t n_a, size_t n_b);

/// True when every element of `x[0, n)` is finite.
bool all_finite(const float* x, size_t n);

/// Largest |x| of a range, or a negative value when a non-finite element was seen.
float absmax_or_negative(const float* x, size_t n);

/// uint8 codes: round((clamp(x, lo, lo + 255·step) − lo) / step); `inv_step` is 1/step or 0.
void uniform8_encode(const float* x, uint8_t* out, size_t n, float lo, float inv_step);

/// x = lo + code · step.
void uniform8_decode(const uint8_t* in, float* x, size_t n, float lo, float step);

/// int8 codes of one block: round(x · 127 / absmax), clamped to [−127, 127].
void blockwise8_encode_block(const float* x, int8_t* out, size_t n, float absmax);

/// x = code · absmax / 127 for one block.
void blockwise8_decode_block(const int8_t* in, float* x, size_t n, float absmax);

/// Index of the nearest of 256 sorted levels given the 255 midpoints between them.
void quantile8_encode(const float* x, uint8_t* out, size_t n, const float* midpoints255);

/// x = table[code].
void quantile8_decode(const uint8_t* in, float* x, size_t n, const float* table256);

/// fp32 → IEEE half (round to nearest even). False when an input is non-finite or overflows.
bool to_fp16(const float* x, uint16_t* out, size_t n);

/// IEEE half → fp32.
void from_fp16(const uint16_t* in, float* x, size_t n);

/// fp32 → bfloat16 (round to nearest even). False when an input is non-finite or overflows.
bool to_bf16(const float* x, uint16_t* out, size_t n);

/// bfloat16 → fp32.
void from_bf16(const uint16_t* in, float* x, size_t n);

} // namespace starling::kernels::detail
