// A tiny multilayer perceptron classifier, split into stages like the GPT, for quick tests.
#pragma once

#include "kernels/models/stage_module.hpp"
#include "kernels/result.hpp"

#include <cstdint>
#include <memory>

namespace starling::kernels {

/// Shape and initialization of the MLP: input projection, `layers` hidden blocks, a class head.
struct mlp_config {
  /// Input features.
  int64_t inputs = 16;
  /// Hidden width.
  int64_t width = 32;
  /// Hidden blocks (the unit stages are cut by).
  int64_t layers = 3;
  /// Output classes.
  int64_t classes = 4;
  /// Block i is initialized from `seed + i`; input and head from seeds mixed from `seed`.
  uint64_t seed = 0;
};

/// The stage holding hidden blocks [begin, end): float features [B, inputs] in for the first
/// stage, activations [B, width] between stages, int64 labels [B] and the mean loss at the last.
result<std::shared_ptr<stage_module>> make_mlp_stage(const mlp_config& cfg, int64_t begin,
                                                     int64_t end);

/// The whole MLP as one stage.
result<std::shared_ptr<stage_module>> make_mlp(const mlp_config& cfg);

} // namespace starling::kernels
