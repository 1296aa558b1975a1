// Blockwise 8-bit codes for optimizer moments (Dettmers et al., "8-bit Optimizers via Block-wise
// Quantization", 2022) and the byte form of a `lamb8` state (kernels/optim/lamb8.hpp). Each block
// of `quant8_block` values keeps one fp32 scale (its absolute maximum) and one byte per value: the
// index of the nearest entry of a fixed table of values in [-1, 1] (or [0, 1]) times the scale.
//
// Two tables, one per moment:
// - the first moment (signed) uses a *dynamic* code, the paper's choice: 0, ±1 and, per sign, 64
//   linearly spaced values in [0.1, 1], 32 in [0.01, 0.1], ... 2 in [1e-6, 1e-5] (126 per sign,
//   255 entries; byte 255 is not a code). A gradient's moments are heavy-tailed: one large entry
//   sets a block's scale, and a linear code would flush every entry under scale/254 to zero,
//   whereas this one keeps small entries' sign and magnitude while the large entries, which
//   dominate the update's direction and norm, get the finest absolute steps (at most 0.0071 of
//   the scale);
// - the second moment (non-negative, a mean of squares spanning many orders of magnitude) uses a
//   *logarithmic* code: 0 and 255 values 10^(-8 (255 - i) / 254), i = 1..255, so every value in
//   [1e-8, 1] of its block's scale is kept within 3.7% (relative; 1.8% on its square root, which
//   is what the update divides by), and a positive value is never rounded to 0: one below 1e-8 of
//   the scale becomes 1e-8 of it. Rounding a second moment up only shortens that coordinate's
//   step; rounding it to 0 would divide the first moment by epsilon.
//
// Torch-free and without fmt: the fuzzer (tests/fuzz) links the state decoder.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::kernels {

/// Values per block (one fp32 scale each).
inline constexpr int64_t quant8_block = 256;

/// Tensors with fewer elements keep fp32 moments (biases, norms: the scales and the bookkeeping
/// would cost more than they save, and these tensors are a small share of any real model).
inline constexpr int64_t quant8_min_numel = 4096;

/// The two codes.
enum class code8 : uint8_t {
  /// Signed dynamic code for first moments (255 entries).
  dynamic_signed,
  /// Unsigned logarithmic code for second moments (256 entries).
  log_unsigned,
};

/// The code's values in ascending order (unused trailing entries are 0); `code8_size` are valid.
const std::array<float, 256>& code8_values(code8 c) noexcept;

/// Valid entries of the code: 255 for `dynamic_signed`, 256 for `log_unsigned`.
int code8_size(code8 c) noexcept;

/// Blocks of `n` values.
inline int64_t quant8_blocks(int64_t n) noexcept {
  return (n + quant8_block - 1) / quant8_block;
}

/// Quantizes `n` finite values (`n` a multiple of `quant8_block` except at the tensor's end)
/// into `n` codes and `quant8_blocks(n)` scales. `log_unsigned` needs values >= 0 (a negative one
/// is taken as 0). Returns false, with the outputs unspecified, when a value is not finite.
bool quantize8(code8 c, const float* x, int64_t n, uint8_t* codes, float* scales) noexcept;

/// The values `quantize8` encoded (codes must be valid for `c`; see `code8_size`).
void dequantize8(code8 c, const uint8_t* codes, const float* scales, int64_t n, float* y) noexcept;

/// How a lamb8 state holds one parameter tensor's moments.
enum class lamb8_form : uint8_t {
  /// No state yet (the parameter was never stepped).
  empty = 0,
  /// fp32 moments (a tensor under `quant8_min_numel` elements).
  full = 1,
  /// 8-bit codes and per-block scales (a tensor of `quant8_min_numel` elements or more).
  quantized = 2,
};

/// One parameter tensor's state, as written (pointers into the optimizer's tensors).
struct lamb8_tensor_ref {
  /// Elements of the parameter.
  uint64_t numel = 0;
  /// Steps taken (0 exactly when `form` is `empty`).
  uint64_t step = 0;
  /// How the moments are held.
  lamb8_form form = lamb8_form::empty;
  /// `full`: `numel` fp32 first and second moments.
  const float* m = nullptr;
  const float* v = nullptr;
  /// `quantized`: `quant8_blocks(numel)` scales and `numel` codes per moment.
  const float* m_scales = nullptr;
  const float* v_scales = nullptr;
  const uint8_t* m_codes = nullptr;
  const uint8_t* v_codes = nullptr;
};

/// One parameter tensor's state, as read (owned and validated).
struct lamb8_tensor_state {
  /// Elements of the parameter.
  uint64_t numel = 0;
  /// Steps taken.
  uint64_t step = 0;
  /// How the moments are held.
  lamb8_form form = lamb8_form::empty;
  /// `full`: the fp32 moments.
  std::vector<float> m, v;
  /// `quantized`: per-block scales of each moment.
  std::vector<float> m_scales, v_scales;
  /// `quantized`: codes of each moment.
  std::vector<uint8_t> m_codes, v_codes;
};

/// Version of the byte form below; a reader refuses any other, naming both.
inline constexpr uint32_t lamb8_format_version = 1;

/// The byte form of a lamb8 state: "STL8", u32 format version, u32 block size, u32 tensor count,
/// then per tensor u64 numel, u64 step, u8 form and its arrays (`full`: m then v as fp32;
/// `quantized`: m scales, v scales (fp32), m codes, v codes (bytes)); little-endian, no padding.
std::string encode_lamb8_state(const std::vector<lamb8_tensor_ref>& tensors);

/// Reads untrusted bytes of `encode_lamb8_state`. When `numels` is given, the state must be for
/// tensors of exactly these sizes in this order. Fails with the reason on a bad magic, version
/// or block size, a truncated or oversized input, a form that does not fit the tensor's size, a
/// step count of 0 with moments or above 2^53, non-finite or negative scales or moments (second
/// moments must be >= 0), or a first-moment code outside the code (255).
result<std::vector<lamb8_tensor_state>>
decode_lamb8_state(const char* data, size_t size, const std::vector<uint64_t>* numels = nullptr);

} // namespace starling::kernels
