// Problem (b) of issue 8: adversarial training of a softmax-regression classifier on Fashion-MNIST
// (or a generated stand-in) as a min-max between the model and a universal input perturbation in
// an L∞ ball, split over M workers that each hold a shard of the training images. It implements
// `vi_problem`, so extragradient, MASHA1 and MASHA2 (masha.hpp) and their actors run it as is.
// LibTorch stays in the .cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/vi/problem.hpp"
#include "kernels/data/idx.hpp"
#include "kernels/result.hpp"

namespace starling::actors::vi {

/// Makes LibTorch compute on the calling thread only. Each worker's operator is a few small
/// matrix products; the workers (actors) already run in parallel, and LibTorch's own thread pool
/// only contends with them (measured: the example ran several times slower without this).
void use_one_torch_thread();

/// Options of the adversarial-training problem.
struct adversarial_options {
  /// Number of workers M; worker m holds training images [m·n, (m+1)·n).
  std::size_t workers = 10;
  /// Training images per worker n.
  std::size_t train_per_worker = 100;
  /// Held-out images for the accuracies.
  std::size_t test_images = 1000;
  /// Radius ε of the L∞ ball the perturbation δ lives in (pixels are in [0, 1]).
  double epsilon = 0.1;
  /// Weight decay λ on the weights W (not the bias): strong convexity in the model.
  double lambda = 1e-3;
  /// −(β/2)‖δ‖² in the objective: concavity in δ (0: only the ball bounds the adversary).
  double beta = 0.0;
  /// Folder with the Fashion-MNIST idx files.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  /// Use the generated stand-in even when the data set is present (tests, quick runs).
  bool synthetic = false;
  /// Image side of the generated stand-in (Fashion-MNIST's is 28).
  std::size_t synthetic_side = 28;
  /// Classes of the generated stand-in (Fashion-MNIST has 10).
  std::size_t synthetic_classes = 10;
  /// Projected sign-gradient steps of the evaluation attack.
  std::size_t attack_steps = 10;
  /// Seed of the generated stand-in.
  uint64_t seed = 1;
};

/// Accuracies and losses of a model on the held-out images.
struct adversarial_eval {
  /// Accuracy on the clean images.
  double clean_accuracy = 0;
  /// Accuracy under the evaluation attack (see `adversarial_problem::evaluate`).
  double adversarial_accuracy = 0;
  /// Mean cross-entropy on the clean images.
  double clean_loss = 0;
  /// Mean cross-entropy under the attack.
  double adversarial_loss = 0;
};

/// min over θ = (W, b), max over ‖δ‖∞ ≤ ε of
///   (1/M) Σ_m (1/n) Σ_{i ∈ shard m} CE(W(x_i + δ) + b, y_i) + (λ/2)‖W‖² − (β/2)‖δ‖²,
/// x_i centered by the training images' mean pixel values. z = (W row-major C × P, b, δ), F_m(z) =
/// (∇_W f_m, ∇_b f_m, −∇_δ f_m), prox = clamping δ to [−ε, ε].
/// Note: the cross-entropy of a linear model is convex in its input, so f is convex (not concave)
/// in δ unless β is large; F is then not monotone and the methods' guarantees do not apply (as
/// for any adversarial training); the ball keeps everything bounded.
/// `apply` and `evaluate` compute in float32 and set LibTorch to one thread on the calling thread
/// (once per thread; see `use_one_torch_thread`).
class adversarial_problem final : public vi_problem {
public:
  /// Loads Fashion-MNIST from `options.data_dir` (the first M·n training and `test_images` test
  /// images), or generates the stand-in when `options.synthetic` is set or the data set is absent
  /// (`fell_back()` then says so). Fails on invalid options or a malformed data file.
  static result<adversarial_problem> make(const adversarial_options& options);
  /// Builds the problem from given images (train is split into M shards of n, the rest unused).
  static result<adversarial_problem> make(const adversarial_options& options,
                                          const kernels::image_set& train,
                                          const kernels::image_set& test);

  std::size_t dim() const override;
  std::size_t workers() const override;
  void apply(std::size_t m, const std::vector<double>& z, std::vector<double>& out) const override;
  void prox(std::vector<double>& z) const override;
  /// Estimate: (1/2) λ_max of the second moment of (x, 1) over all shards + λ (the W, b block's
  /// constant; the δ and cross blocks scale with ‖W‖ and are not included).
  double lipschitz() const override;
  /// The same estimate per shard, root-mean-squared.
  double mean_square_lipschitz() const override;

  /// f_m(z), the worker's objective (with both regularizers).
  double loss(std::size_t m, const std::vector<double>& z) const;
  /// Clean accuracy and loss of z's model on the held-out images, and under the attack: projected
  /// sign-gradient ascent on one universal δ (`attack_steps` steps of 2.5ε/steps from δ = 0 and
  /// from z's own δ), keeping the δ with the larger loss. Deterministic.
  adversarial_eval evaluate(const std::vector<double>& z) const;

  /// Pixels per image P.
  std::size_t pixels() const;
  /// Classes C.
  std::size_t classes() const;
  /// Offset of δ in z (= C·P + C).
  std::size_t delta_offset() const;
  /// Worker m's shard, pixels centered as the operator sees them.
  const kernels::image_set& shard(std::size_t m) const;
  /// The options it was made from.
  const adversarial_options& options() const;
  /// Where the training images came from.
  const std::string& data_source() const;
  /// True when Fashion-MNIST was asked for but absent, so the stand-in was generated.
  bool fell_back() const;

private:
  struct impl;
  adversarial_problem() = default;
  std::shared_ptr<const impl> impl_;
};

} // namespace starling::actors::vi
