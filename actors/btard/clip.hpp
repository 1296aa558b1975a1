// CenteredClip as BTARD's aggregators (and everyone re-checking them) compute it: float32 inputs,
// fp64 arithmetic, the result rounded to float32 once, which the aggregate check's bound assumes
// (aggregate_check.hpp). The result is a public function of the inputs, bit for bit on any
// x86-64 machine (baseline or AVX2: vectorize.hpp), so a re-check that recomputes a part
// compares digests. No CAF, no LibTorch.
//
// The function, exactly (n inputs g_j of D values, weights 1):
//   x ← the coordinate-wise median (the mean of the two middle values in fp64 for even n);
//   d_j ← ‖g_j − x‖ (squares summed in the lanes of vectorize.hpp);
//   repeat up to `max_iterations` times:
//     w_j ← min(1, τ/d_j);  for each k: step_k ← (Σ_j w_j·(g_jk − x_k), j in order) / n;
//     x_k ← x_k + step_k;  d_j ← ‖g_j − x‖ at the new x;
//     stop when ‖step‖ <= tolerance (converged).
// This is kernels::centered_clip's iteration with weights 1 (median start; x += the mean of the
// clipped differences; stop after a step of norm <= tolerance), so the check's bound and its
// iteration bound (`centered_clip_iterations_bound`) hold as stated there. The cost: one pass
// over the inputs for the median (with the first distances), then one pass per iteration: the
// step and the next distances come from the same pass (a block of coordinates is updated, then
// the inputs' distances to the updated block are summed while that block is in cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::btard {

/// What `centered_clip_fp64` produced.
struct clip_outcome {
  /// The aggregate, rounded to float32 once.
  std::vector<float> value;
  /// Iterations run.
  size_t iterations = 0;
  /// Whether the last step was at most the tolerance (false: stopped by the cap).
  bool converged = false;
  /// Norm of the last step.
  double last_step = 0.0;
  /// Inputs farther than τ from the final fp64 estimate.
  size_t clipped = 0;
};

/// Largest input count `centered_clip_fp64` takes (its median network indexes inputs in 16 bits).
inline constexpr size_t max_clip_inputs = 65535;

/// CenteredClip of `inputs`, each pointing at `dim` float32 values (pointers may be null when
/// `dim` is 0), as stated above. Fails on no inputs, more than `max_clip_inputs`, a null input,
/// τ not finite and > 0, or a tolerance not finite and >= 0.
result<clip_outcome> centered_clip_fp64(const std::vector<const float*>& inputs, size_t dim,
                                        double tau, size_t max_iterations, double tolerance);

/// The plain mean of `inputs` (each `dim` float32 values), summed in fp64 in input order and
/// rounded to float32 once. Fails on no inputs or a null input.
result<std::vector<float>> mean_fp64(const std::vector<const float*>& inputs, size_t dim);

/// The comparators (i < j: the smaller value goes to i) of a network that sorts `n` values:
/// Batcher's odd–even merge sort for the next power of two, without the comparators that touch
/// an index >= n (those would only compare with +∞). The median's network; exposed for tests.
std::vector<std::pair<uint16_t, uint16_t>> sorting_network(size_t n);

} // namespace starling::actors::btard
