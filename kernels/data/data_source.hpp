// The one interface between sample ids (from a loader) and tensors (for a model): text windows,
// labeled images and token files are data sources; a registry makes one by name
// (source_registry.hpp).
#pragma once

#include "kernels/result.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace starling::kernels {

/// Samples stacked along a first dimension: what a model's forward takes and what its loss
/// compares against.
struct sample_batch {
  /// Model inputs: int64 [B, T] tokens, or float32 [B, P] / [B, 1, H, W] pixels.
  at::Tensor inputs;
  /// Targets: int64 [B, T] next tokens, or int64 [B] class labels.
  at::Tensor targets;
};

/// What one sample is to a model: the sizes its input layer and its output layer need.
struct sample_shape {
  /// Sizes of one input: {P} pixels or {1, H, W} for images, {T} token ids for windows.
  std::vector<int64_t> input;
  /// Targets lie in [0, classes): the class count of labeled images, the vocabulary of tokens.
  int64_t classes = 0;
};

/// A data set addressed by sample id: ids [0, size()) map to tensors. Immutable once made, so
/// one source serves every trainer of a process.
class data_source {
public:
  virtual ~data_source() = default;

  /// Number of samples.
  virtual uint64_t size() const = 0;

  /// What it reads, for logs.
  virtual std::string describe() const = 0;

  /// The shape of every sample: a model's input size and class count come from here.
  virtual sample_shape shape() const = 0;

  /// The samples `ids` in order, stacked; fails on an id not below `size()` (naming it) or on
  /// data that fails validation as it is read.
  virtual result<sample_batch> batch(const std::vector<uint64_t>& ids) const = 0;
};

} // namespace starling::kernels
