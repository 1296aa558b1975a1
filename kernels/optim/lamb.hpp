// LAMB (You et al., "Large Batch Optimization for Deep Learning", 2020): Adam's update rescaled
// per parameter tensor by the trust ratio ||w|| / ||update||. LibTorch 1.13 has no LAMB.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace starling::kernels {

/// Hyper-parameters of LAMB.
struct lamb_options : public torch::optim::OptimizerCloneableOptions<lamb_options> {
  /// Learning rate.
  lamb_options(double lr = 1e-3) : lr_(lr) {}
  /// Learning rate.
  TORCH_ARG(double, lr) = 1e-3;
  /// Decay rates of the first and second moment estimates.
  TORCH_ARG(double, beta1) = 0.9;
  /// Decay rate of the second moment estimate.
  TORCH_ARG(double, beta2) = 0.999;
  /// Added to the root of the second moment.
  TORCH_ARG(double, eps) = 1e-6;
  /// Decoupled weight decay, added to the update before the trust ratio.
  TORCH_ARG(double, weight_decay) = 0.0;
  /// Upper clamp of ||w|| in the trust ratio (the paper's φ); <= 0 disables the clamp.
  TORCH_ARG(double, max_weight_norm) = 10.0;

public:
  /// Reads the options from an optimizer checkpoint.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the options into an optimizer checkpoint.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  /// For learning-rate schedulers.
  double get_lr() const override { return lr(); }
  /// For learning-rate schedulers.
  void set_lr(const double lr) override { this->lr(lr); }
};

/// Per-parameter state of LAMB.
struct lamb_param_state : public torch::optim::OptimizerCloneableParamState<lamb_param_state> {
  /// Steps taken with this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// First moment estimate.
  TORCH_ARG(torch::Tensor, exp_avg);
  /// Second moment estimate.
  TORCH_ARG(torch::Tensor, exp_avg_sq);

public:
  /// Reads the state from an optimizer checkpoint.
  void serialize(torch::serialize::InputArchive& archive) override;
  /// Writes the state into an optimizer checkpoint.
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

/// LAMB as a `torch::optim::Optimizer`, interchangeable with `torch::optim::Adam`.
/// Checks LAMB's hyper-parameters (shared by `lamb` and `lamb8`): a TORCH_CHECK failure whose
/// message starts with `who` (e.g. "LAMB: invalid beta1 1.5").
void check_lamb_options(const lamb_options& o, const char* who);

class lamb : public torch::optim::Optimizer {
public:
  /// An optimizer over `params` with `defaults`; throws `c10::Error` on invalid options.
  explicit lamb(std::vector<torch::Tensor> params, lamb_options defaults = {});

  /// One update from the parameters' current gradients; parameters without a gradient are skipped.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Writes options and per-parameter state (what `torch::save` of an optimizer writes).
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Reads what `save` wrote; the parameters are matched by position.
  void load(torch::serialize::InputArchive& archive) override;

  /// The trust ratio applied to each parameter (in order) at the last step, for diagnostics.
  const std::vector<double>& last_trust_ratios() const noexcept { return trust_ratios_; }

private:
  std::vector<double> trust_ratios_;
};

} // namespace starling::kernels
