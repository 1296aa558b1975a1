// Tensor codec formats, without torch or CAF: codec ids, parameters, headers, exact payload
// sizes and validation of untrusted headers and payloads (the part a fuzzer exercises).
//
// A codec turns a tensor of any supported dtype into a `tensor_header` (dtype, shape, codec and
// the codec's resolved parameters) plus payload bytes, and back. The payload layout of every codec
// is fixed by (numel, codec, params) alone, so `payload_bytes` is exact and a decoder can check a
// payload's size before reading it. Multi-byte values in payloads are little-endian.
//
// Payload layouts (n = numel):
//   none        n × fp32
//   fp16        n × IEEE binary16
//   bf16        n × bfloat16 (round to nearest even)
//   uniform8    fp32 lo, fp32 step, n × uint8; x ≈ lo + code·step over [mean−6σ, mean+6σ]
//               (clipped to [min, max])
//   blockwise8  ⌈n/B⌉ × fp32 absmax, n × int8; x ≈ code·absmax/127, B = params.block_size
//   quantile8   256 × fp32 table, n × uint8; x ≈ table[code]; table = sample quantiles
//   topk        k × index (int32 or int64 per params.index_bits), k × fp32 values; indices
//               strictly increasing; the rest is zero
//   randk       k × fp32 values at `randk_indices(n, k, params.seed)`; decode scales by n/k
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kernels/result.hpp"

namespace starling::kernels {

/// Which encoding a payload uses. The numeric values travel on the wire: never renumber.
enum class codec_id : uint8_t {
  none = 0,       ///< fp32, lossless for fp32/fp16/bf16 input; the only codec accepting inf/NaN
  fp16 = 1,       ///< IEEE half precision; |x| must be ≤ 65504
  bf16 = 2,       ///< bfloat16, round to nearest even
  uniform8 = 3,   ///< 256 uniform levels over mean ± 6σ (clipped to the data's range)
  blockwise8 = 4, ///< signed 8-bit per block, scale = block absmax / 127
  quantile8 = 5,  ///< 256 levels at sample quantiles, codes plus a lookup table
  topk = 6,       ///< the k largest magnitudes: indices plus fp32 values (contractive, biased)
  randk = 7,      ///< k coordinates drawn from a shared seed, only values travel (unbiased)
};

/// Number of codecs; valid ids are `0 .. codec_count - 1`.
inline constexpr uint8_t codec_count = 8;

/// The dtype a tensor had before encoding and gets back after decoding. Travels on the wire:
/// never renumber. Integer and bool tensors are encoded through fp32 and rounded on decode.
enum class wire_dtype : uint8_t {
  float32 = 0,  ///< torch::kFloat32
  float16 = 1,  ///< torch::kFloat16
  bfloat16 = 2, ///< torch::kBFloat16
  float64 = 3,  ///< torch::kFloat64
  uint8 = 4,    ///< torch::kUInt8
  int8 = 5,     ///< torch::kInt8
  int16 = 6,    ///< torch::kInt16
  int32 = 7,    ///< torch::kInt32
  int64 = 8,    ///< torch::kInt64
  boolean = 9,  ///< torch::kBool
};

/// Number of wire dtypes; valid values are `0 .. wire_dtype_count - 1`.
inline constexpr uint8_t wire_dtype_count = 10;

/// Largest payload chunk: keeps every Cap'n Proto `Data` blob far below its 512 MiB cap.
inline constexpr uint64_t max_chunk_bytes = uint64_t{64} << 20;

/// Largest element count a header may declare (2^40); larger shapes are rejected on decode.
inline constexpr int64_t max_numel = int64_t{1} << 40;

/// Codec parameters. Fields a codec does not use are ignored by it; `resolve_params` fills the
/// derived ones (k, index width) so that the header alone determines the payload layout.
struct codec_params {
  /// topk/randk: fraction of coordinates kept, in (0, 1]; used when `k == 0`.
  double ratio = 0.01;
  /// topk/randk: number of coordinates kept; 0 means ⌈ratio · numel⌉ (at least 1 if numel > 0).
  uint64_t k = 0;
  /// randk: the shared seed choosing the coordinates; quantile8: the seed choosing the sample;
  /// topk: the seed of the sample that estimates the threshold (the result does not depend on it).
  uint64_t seed = 0;
  /// blockwise8: elements per block (≥ 1).
  uint32_t block_size = 4096;
  /// quantile8: how many elements are sampled to estimate the quantiles (≥ 1).
  uint32_t sample_size = 1u << 16;
  /// topk: index width in bits, 32 or 64; 0 means 32 when numel ≤ 2^31 − 1, else 64.
  uint8_t index_bits = 0;
  /// Largest payload chunk in bytes, 1 .. `max_chunk_bytes`.
  uint64_t chunk_bytes = max_chunk_bytes;
};

/// Everything except the payload: enough to validate and decode it.
struct tensor_header {
  /// The original dtype, restored by decode.
  wire_dtype dtype = wire_dtype::float32;
  /// The original shape (empty for a 0-d tensor).
  std::vector<int64_t> shape;
  /// The encoding of the payload.
  codec_id codec = codec_id::none;
  /// The resolved codec parameters (see `resolve_params`).
  codec_params params;
};

/// Human-readable codec name ("none", "fp16", ..., "randk").
std::string_view to_string(codec_id c) noexcept;

/// Parses a codec name as printed by `to_string`.
result<codec_id> parse_codec(std::string_view name);

/// Human-readable dtype name ("float32", ...).
std::string_view to_string(wire_dtype d) noexcept;

/// Element count of a shape; fails on negative dimensions or a product above `max_numel`.
result<int64_t> checked_numel(const std::vector<int64_t>& shape);

/// Validates `params` for `codec` and `numel` and fills the derived fields (k, index_bits).
result<codec_params> resolve_params(int64_t numel, codec_id codec, const codec_params& params);

/// Exact payload size in bytes for `numel` elements; `params` must be resolved.
uint64_t payload_bytes(int64_t numel, codec_id codec, const codec_params& resolved) noexcept;

/// Exact payload size after resolving `params`; fails where `resolve_params` fails.
result<uint64_t> payload_bytes_for(int64_t numel, codec_id codec, const codec_params& params);

/// Checks a header from an untrusted source: known dtype and codec, valid shape and parameters,
/// parameters that `resolve_params` would have produced.
status validate_header(const tensor_header& header);

/// Checks an untrusted header and the size of its payload without decoding anything.
status validate(const tensor_header& header, uint64_t payload_size);

/// Checks an untrusted header and its contiguous payload: size plus the codec's invariants
/// (uniform8 range finite, blockwise8 scales finite and ≥ 0, quantile8 table finite, top-k
/// indices strictly increasing and below numel). A payload passing this decodes safely.
status check_payload(const tensor_header& header, const uint8_t* data, size_t size);

/// The coordinates Rand-k keeps: `k` distinct indices in [0, numel), strictly increasing, a pure
/// function of (numel, k, seed) identical on every platform.
std::vector<int64_t> randk_indices(int64_t numel, int64_t k, uint64_t seed);

} // namespace starling::kernels
