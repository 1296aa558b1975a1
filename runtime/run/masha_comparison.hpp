// The bilinear comparison of issue 8 shared by `examples/masha` and the `masha` workload: which
// methods run with which parameters, the table of bits to a target error, the SVG plot.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "actors/vi/masha.hpp"
#include "runtime/plot/svg.hpp"

namespace starling::runtime {

/// One method of the comparison with its parameters.
struct masha_entry {
  /// Row label, e.g. "MASHA1 rand-k 10% shared seed".
  std::string label;
  /// Parameters (γ, τ from `recommended_options`).
  actors::vi::method_options options;
};

/// Which methods and compressor sizes a comparison runs.
struct masha_comparison_options {
  /// Include extragradient (the uncompressed baseline).
  bool extragradient = true;
  /// Include MASHA1 with Rand-k.
  bool masha1 = true;
  /// Include MASHA2 with Top-k.
  bool masha2 = true;
  /// Compressor sizes as fractions of d (each 0 < k ≤ 1; k = max(1, round(fraction · d))).
  std::vector<double> k_fractions{0.01, 0.10};
  /// Seed of the compressors and coins.
  uint64_t seed = 1;
};

/// The entries for `problem`: extragradient at γ = 1/(2L); per k, MASHA1 with Rand-k on workers
/// and a dense downlink, MASHA1 with shared-seed Rand-k in both directions, and MASHA2 with
/// Top-k and error feedback on both sides (γ, τ from `recommended_options`).
std::vector<masha_entry> masha_entries(const actors::vi::vi_problem& problem,
                                       const masha_comparison_options& options);

/// The outcome of one entry's run.
struct masha_outcome {
  /// The entry's label.
  std::string label;
  /// Relative error and bits per iteration.
  std::vector<actors::vi::trace_point> trace;
  /// Whether the target was reached.
  bool reached = false;
  /// Iterations run.
  std::size_t iterations = 0;
  /// Why the run stopped early (e.g. it diverged); empty otherwise.
  std::string note;
};

/// The table of bits per worker (both directions and uplink only) to reach `target`, with the
/// ratio extragradient / method when an extragradient row is present (first row labeled so).
std::string masha_table(const std::vector<masha_outcome>& outcomes, double target);

/// Relative error vs bits per worker (both directions), log y, one series per outcome.
plot::line_plot masha_plot(const std::vector<masha_outcome>& outcomes, const std::string& title);

} // namespace starling::runtime
