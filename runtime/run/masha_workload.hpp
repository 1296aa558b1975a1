// The `masha` workload: extragradient, MASHA1 and MASHA2 on the regularized bilinear saddle point
// of issue 8, run by the server and worker actors of `actors/vi` in one process.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/vi/vi.hpp"
#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// Options of the `masha` section.
struct masha_workload_options {
  /// Dimension of x and of y (z has twice this).
  int64_t dim = 100;
  /// Number of workers M.
  int64_t workers = 10;
  /// Regularization λ (strong monotonicity).
  double lambda = 0.1;
  /// How different the workers' matrices are (A_m = A + h·B_m).
  double heterogeneity = 0.5;
  /// Seed of the problem, the compressors and the coins.
  uint64_t seed = 1;
  /// Methods to run, in order: any of "extragradient", "masha1", "masha2".
  std::vector<std::string> methods{"extragradient", "masha1", "masha2"};
  /// Compressor sizes as fractions of d, each in (0, 1].
  std::vector<double> k{0.01, 0.10};
  /// Relative error ‖z − z*‖²/‖z0 − z*‖² at which a method stops.
  double target = 1e-6;
  /// A method that has not reached `target` after this many iterations stops there.
  int64_t max_iterations = 200000;
  /// What the server does when a worker is lost.
  actors::vi::worker_loss_policy on_worker_loss = actors::vi::worker_loss_policy::fail;
  /// How long the server waits for a worker's reply.
  std::chrono::nanoseconds timeout = std::chrono::seconds(5);
};

/// Reads the `masha` section, validating every key.
void read_options(config_node& n, masha_workload_options& out);

/// Runs the comparison with actors (local mode); prints progress and the table, writes
/// `metrics.jsonl` and `masha-bilinear.svg` into `ctx.out_dir`. Returns the exit code.
int run_masha(const experiment_config& cfg, const run_context& ctx);

} // namespace starling::runtime
