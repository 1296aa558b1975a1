// The `masha-adversarial` workload: extragradient, MASHA1 and MASHA2 on adversarial training of a
// softmax-regression classifier on Fashion-MNIST (problem (b) of issue 8), run by the server and
// worker actors of `actors/vi` in one process under a common budget of bits.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "actors/vi/vi.hpp"
#include "runtime/run/workload.hpp"

namespace starling::runtime {

/// Options of the `masha-adversarial` section.
struct masha_adversarial_options {
  /// Number of workers M.
  int64_t workers = 10;
  /// Training images per worker.
  int64_t train_per_worker = 100;
  /// Held-out images for the accuracies.
  int64_t test_images = 1000;
  /// Radius of the L∞ ball of the universal perturbation (pixels in [0, 1]).
  double epsilon = 0.1;
  /// Weight decay on the weights.
  double lambda = 1e-3;
  /// −(β/2)‖δ‖² in the objective.
  double beta = 0.0;
  /// `auto` (Fashion-MNIST when present, else the generated stand-in with a warning),
  /// `fashion-mnist` (required) or `synthetic`.
  std::string data = "auto";
  /// Folder of the Fashion-MNIST idx files.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  /// Seed of the generated data, the compressors and the coins.
  uint64_t seed = 1;
  /// Methods to run, in order.
  std::vector<std::string> methods{"extragradient", "masha1", "masha2"};
  /// Compressor sizes as fractions of dim(z), each in (0, 1].
  std::vector<double> k{0.01, 0.10};
  /// Bits budget per worker = what extragradient sends in this many iterations.
  int64_t budget_eg_iterations = 100;
  /// Evaluations per run (evenly spaced in bits).
  int64_t checkpoints = 10;
  /// A method stops here even below the budget.
  int64_t max_iterations = 5000;
  /// Multiplies every method's recommended step size.
  double gamma_scale = 1.0;
  /// Steps of the evaluation attack.
  int64_t attack_steps = 10;
  /// What the server does when a worker is lost.
  actors::vi::worker_loss_policy on_worker_loss = actors::vi::worker_loss_policy::fail;
  /// How long the server waits for a worker's reply.
  std::chrono::nanoseconds timeout = std::chrono::seconds(5);
};

/// Reads the `masha-adversarial` section, validating every key.
void read_options(config_node& n, masha_adversarial_options& out);

/// Runs the comparison with actors (local mode); prints progress and the table, writes
/// `metrics.jsonl`, `masha-adversarial.svg` (adversarial accuracy vs bits) and
/// `masha-adversarial-clean.svg` into `ctx.out_dir`. Returns the exit code.
int run_masha_adversarial(const experiment_config& cfg, const run_context& ctx);

} // namespace starling::runtime
