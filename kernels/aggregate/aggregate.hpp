// Robust aggregation of same-shape tensors: weighted mean, coordinate-wise median, trimmed mean
// and CenteredClip (Karimireddy et al. 2021, as used by BTARD). No CAF here.
#pragma once

#include <cstddef>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/result.hpp"

namespace starling::kernels {

/// Parameters of CenteredClip.
struct centered_clip_options {
  /// Clipping radius: an input farther than `tau` from the current estimate pulls with norm `tau`.
  double tau = 1.0;
  /// Upper bound on fixed-point iterations.
  std::size_t max_iterations = 100;
  /// Stop once one iteration moves the estimate by at most this much (Euclidean norm).
  double tolerance = 1e-6;
};

/// What CenteredClip produced and how it got there.
struct centered_clip_outcome {
  /// The aggregate, same shape and dtype as the inputs.
  at::Tensor value;
  /// Iterations run (0 when the median was already a fixed point within `tolerance`).
  std::size_t iterations = 0;
  /// Whether the last step was at most `tolerance` (false: stopped by `max_iterations`).
  bool converged = false;
  /// Norm of the last step taken.
  double last_step = 0.0;
};

/// Σ wᵢ gᵢ / Σ wᵢ. Fails on empty input, mismatched shapes, a weight count that differs from the
/// input count, negative or non-finite weights, or weights that sum to zero.
result<at::Tensor> weighted_mean(const std::vector<at::Tensor>& inputs,
                                 const std::vector<double>& weights);

/// Per coordinate, the median of the inputs (the mean of the two middle values for an even count).
/// Fails on empty input or mismatched shapes.
result<at::Tensor> coordinate_median(const std::vector<at::Tensor>& inputs);

/// Per coordinate, drops the ⌊trim·n⌋ smallest and largest values and averages the rest.
/// `trim` must lie in [0, 0.5). Fails on empty input or mismatched shapes.
result<at::Tensor> trimmed_mean(const std::vector<at::Tensor>& inputs, double trim);

/// CenteredClip: starts at the coordinate-wise median and iterates
/// x ← x + Σ wᵢ (gᵢ − x) min(1, τ/‖gᵢ − x‖) / Σ wᵢ until a step is at most `tolerance`.
/// Same input checks as `weighted_mean`, plus τ > 0.
result<centered_clip_outcome> centered_clip(const std::vector<at::Tensor>& inputs,
                                            const std::vector<double>& weights,
                                            const centered_clip_options& options);

} // namespace starling::kernels
