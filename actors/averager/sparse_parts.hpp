// Top-k parts for the butterfly round (DiLoCo's pseudo-gradients, actors/collab/diloco.hpp).
//
// In a Top-k round every member hands the averager a vector that is already sparse: its
// pseudo-gradient after Top-k with the member's own error feedback over the whole vector. The
// chunks of such a round travel as `sparse_chunk` bytes (the nonzeros only: their indices as
// varint gaps and their fp32 values, `actors/collab/sparse_pack.hpp`), which is lossless for any
// vector, so every member receives the same bytes. Each reducer averages its part as usual, then
// `sparse_part_finisher` re-sparsifies the mean with Top-k and error feedback before the result
// goes out. The reducer keeps one residual for the whole vector: the group, its bandwidths and so
// the part ranges change from round to round, and each round applies and updates only the slice
// of the residual that matches the part it reduces.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/result.hpp"

namespace starling::actors::averager {

/// Encodes a 1-D float chunk as its nonzeros: its element count and nonzero count as LEB128
/// varints, then the packed Top-k payload of exactly those nonzeros (at least one coordinate: a
/// zero one for an all-zero chunk). Lossless for finite values; fails on a tensor that is empty,
/// not 1-D or not finite.
result<std::vector<uint8_t>> encode_sparse_chunk(const at::Tensor& values);

/// Decodes untrusted `encode_sparse_chunk` bytes into a dense 1-D fp32 tensor of at most
/// `max_numel` elements; fails, never throws, on anything malformed, oversized or not finite.
result<at::Tensor> decode_sparse_chunk(const uint8_t* data, size_t size, int64_t max_numel);

/// A reducer's error feedback for Top-k parts: one residual over the whole vector, of which each
/// round uses and updates the slice of the part it reduces.
class sparse_part_finisher {
public:
  /// Keeps `ratio` (0 < ratio <= 1) of each part's coordinates; `error_feedback` carries what
  /// Top-k dropped over to the next part that covers those coordinates.
  sparse_part_finisher(double ratio, bool error_feedback);

  /// Replaces `values` (1-D fp32, elements [offset, offset + values.numel()) of a vector of
  /// `numel` elements) by Top-k(values + residual slice) and, with error feedback, sets that
  /// slice of the residual to what Top-k dropped. The residual starts at zero and starts again
  /// at zero when `numel` changes. Fails (changing nothing) on a range outside the vector.
  status finish(int64_t numel, int64_t offset, at::Tensor& values);

  /// The residual over the whole vector (undefined before the first part or without EF).
  const at::Tensor& residual() const noexcept { return residual_; }
  double ratio() const noexcept { return ratio_; }
  bool error_feedback() const noexcept { return ef_; }

private:
  double ratio_;
  bool ef_;
  at::Tensor residual_;
};

} // namespace starling::actors::averager
