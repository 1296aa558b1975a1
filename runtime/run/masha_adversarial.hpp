// The adversarial-training comparison of issue 8 shared by `examples/masha_adversarial` and the
// `masha-adversarial` workload: every method gets the same budget of bits per worker (what
// extragradient sends in a given number of iterations); clean and adversarial accuracy are
// measured at evenly spaced fractions of that budget; a table and SVG plots summarize them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/vi/adversarial.hpp"
#include "actors/vi/masha.hpp"
#include "runtime/plot/svg.hpp"
#include "runtime/run/masha_comparison.hpp"

namespace starling::runtime {

/// One evaluation of a run.
struct adversarial_point {
  /// Iterations completed.
  std::size_t iteration = 0;
  /// Payload bits one worker has sent.
  uint64_t bits_up = 0;
  /// Payload bits one worker has received.
  uint64_t bits_down = 0;
  /// Accuracies and losses on the held-out images.
  actors::vi::adversarial_eval eval;
};

/// What one method did under the budget.
struct adversarial_outcome {
  /// Row label.
  std::string label;
  /// Step size and τ used.
  double gamma = 0, tau = 0;
  /// The evaluations: at the start, then at each checkpoint.
  std::vector<adversarial_point> points;
  /// Why the run stopped early (diverged, iteration cap); empty otherwise.
  std::string note;
};

/// Bits per worker, both directions, of `eg_iterations` extragradient iterations on `problem`
/// (4 dense float32 vectors of dim() per iteration: two uplinks, two downlinks).
uint64_t adversarial_budget(const actors::vi::vi_problem& problem, std::size_t eg_iterations);

/// Runs `entry` with the pure cores until one worker has moved `budget` bits (both directions)
/// or `max_iterations` iterations are done, evaluating at the start and whenever the bits cross
/// budget·j/checkpoints (j = 1..checkpoints). A run whose iterate stops being finite ends with a
/// note. Fails only on a protocol error.
result<adversarial_outcome>
run_adversarial_pure(const std::shared_ptr<const actors::vi::adversarial_problem>& problem,
                     const masha_entry& entry, uint64_t budget, std::size_t checkpoints,
                     std::size_t max_iterations);

/// True when every value of z is finite.
bool all_finite(const std::vector<double>& z);

/// Table of clean / adversarial accuracy (percent) at 1/4, 1/2 and all of the budget, per method.
std::string adversarial_table(const std::vector<adversarial_outcome>& outcomes, uint64_t budget);

/// Accuracy (adversarial when `adversarial`, else clean) vs bits per worker, one line per method.
plot::line_plot adversarial_plot(const std::vector<adversarial_outcome>& outcomes,
                                 bool adversarial, const std::string& title);

} // namespace starling::runtime
