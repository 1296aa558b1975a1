// Tensor codecs on torch tensors: encode any dtype into a `tensor_header` plus payload bytes and
// back. The torch-free part (ids, parameters, header validation, payload sizes) is in format.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/compress/format.hpp"
#include "kernels/result.hpp"

namespace starling::kernels {

/// An encoded tensor: header plus payload split into chunks of at most `params.chunk_bytes`.
struct encoded_tensor {
  /// Dtype, shape, codec and resolved parameters.
  tensor_header header;
  /// The payload, in order; concatenated they form the codec's layout.
  std::vector<std::vector<uint8_t>> chunks;

  /// Total payload bytes over all chunks.
  uint64_t payload_bytes() const noexcept;
};

/// The wire dtype of a torch scalar type; fails for unsupported ones (complex, quantized...).
result<wire_dtype> to_wire_dtype(c10::ScalarType t);

/// The torch scalar type of a wire dtype.
c10::ScalarType to_scalar_type(wire_dtype d) noexcept;

/// The header `encode` would produce for `t` (dtype, shape, resolved parameters).
result<tensor_header> make_header(const at::Tensor& t, codec_id codec, const codec_params& params);

/// Encodes `t` into exactly `payload_bytes(numel, ...)` bytes at `out` (any alignment), using
/// a header made by `make_header` for the same tensor. Fails on non-finite input (except for
/// `none`) or values out of the codec's range.
status encode_into(const at::Tensor& t, const tensor_header& header, uint8_t* out, size_t size);

/// Encodes `t` with `codec`; the payload is split into chunks of at most `params.chunk_bytes`.
result<encoded_tensor> encode(const at::Tensor& t, codec_id codec, const codec_params& params);

/// Decodes a contiguous payload (any alignment) into a CPU tensor of the header's dtype and
/// shape. Validates header and size first and checks codec invariants (table values finite,
/// top-k indices increasing and in range); never throws.
result<at::Tensor> decode_payload(const tensor_header& header, const uint8_t* data, size_t size);

/// Decodes an encoded tensor (chunks are gathered when there is more than one).
result<at::Tensor> decode(const encoded_tensor& e);

/// Decodes a contiguous payload (any alignment) into `out`, a tensor the caller allocated once
/// and reuses: it must be a defined, contiguous CPU tensor of the header's dtype and shape.
/// For float32 output the codec writes straight into `out` (no allocation, no page faults on a
/// warm tensor); other dtypes go through an fp32 temporary. Same checks as `decode_payload`.
status decode_into(const tensor_header& header, const uint8_t* data, size_t size, at::Tensor& out);

/// Decodes an encoded tensor into `out` (see the payload overload for the requirements on it).
status decode_into(const encoded_tensor& e, at::Tensor& out);

/// Error feedback (EF) around a codec: each round encodes `x + residual` and keeps what the codec
/// dropped as the next residual, so over many rounds everything is transmitted. Meant for
/// contractive codecs (topk, and the 8/16-bit ones); Rand-k is rejected (it is unbiased, not
/// contractive: use it without EF). Not thread-safe; one object per stream of tensors.
class error_feedback {
public:
  /// An EF stream encoding with `codec` and `params`.
  error_feedback(codec_id codec, codec_params params);

  /// Encodes `x + residual`, updates the residual; the shape must stay the same across rounds
  /// (a changed shape or dtype is an error; call `reset` to start over).
  result<encoded_tensor> encode(const at::Tensor& x);

  /// The current residual (fp32, shape of the last input; undefined before the first round).
  const at::Tensor& residual() const noexcept { return residual_; }

  /// Forgets the residual.
  void reset();

  /// The codec used.
  codec_id codec() const noexcept { return codec_; }

private:
  codec_id codec_;
  codec_params params_;
  at::Tensor residual_;
};

} // namespace starling::kernels
