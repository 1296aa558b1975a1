// Choosing and configuring an optimizer (SGD with momentum, Adam, LAMB or LAMB with 8-bit moments)
// and clipping by global norm.
#pragma once

#include "kernels/result.hpp"

#include "kernels/torch_fwd.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace starling::kernels {

/// Which optimizer and its hyper-parameters.
struct optimizer_options {
  /// "adam", "lamb", "lamb8" (LAMB with blockwise 8-bit moments, kernels/optim/lamb8.hpp) or
  /// "sgd".
  std::string kind = "adam";
  /// Learning rate.
  double lr = 1e-3;
  /// First moment decay.
  double beta1 = 0.9;
  /// Second moment decay.
  double beta2 = 0.999;
  /// Denominator epsilon.
  double eps = 1e-8;
  /// Weight decay (L2 for Adam and SGD, decoupled for LAMB and lamb8).
  double weight_decay = 0.0;
  /// SGD: momentum in [0, 1); 0 is plain SGD.
  double momentum = 0.0;
  /// SGD: Nesterov momentum (needs momentum > 0), as DiLoCo's outer optimizer uses.
  bool nesterov = false;
  /// Gradients are clipped to this global L2 norm before each step; <= 0 disables clipping.
  double max_grad_norm = 1.0;
  /// Linear learning-rate warmup: step k (0-based, the run's global step) uses
  /// lr * min(1, (k + 1) / warmup_steps); 0 = `lr` from the first step. Adam's first steps are
  /// sign-like moves of `lr` on every coordinate: without warmup, lr 3e-3 on the byte GPT
  /// of configs/swarm-tiny.yaml sends the loss from 3.8 to 7.6 at step 4 in a single-process
  /// run (docs/results.md, "Loss spikes").
  int64_t warmup_steps = 0;
};

/// The learning rate of global step `step` under `opts`' warmup.
double scheduled_lr(const optimizer_options& opts, uint64_t step);

/// Sets every parameter group's learning rate of `opt` to `lr`.
void set_learning_rate(torch::optim::Optimizer& opt, double lr);

/// Builds the optimizer `opts` names over `params`; fails on an unknown kind or invalid values.
result<std::unique_ptr<torch::optim::Optimizer>>
make_optimizer(const optimizer_options& opts, const std::vector<torch::Tensor>& params);

/// Global L2 norm of the gradients of `params` (absent gradients count as zero).
double gradient_norm(const std::vector<torch::Tensor>& params);

/// Scales all gradients of `params` so their global L2 norm is at most `max_norm`; returns the
/// norm before clipping. Does nothing when `max_norm <= 0`.
double clip_by_global_norm(const std::vector<torch::Tensor>& params, double max_norm);

/// Clips by `opts.max_grad_norm`, then steps `opt`; returns the norm before clipping.
double clipped_step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                    const optimizer_options& opts);

/// The optimizer's state (moments, step counts, options) as bytes, so a newly spawned stage peer
/// can download it from a live one. lamb8's are its codes, scales and step counts
/// (`encode_lamb8_state`, kernels/optim/quant8.hpp), not fp32 moments.
result<std::string> save_optimizer_state(const torch::optim::Optimizer& opt);

/// Loads bytes from `save_optimizer_state` into an optimizer of the same kind over parameters of
/// the same shapes in the same order; fails on malformed bytes or a mismatch, leaving the state
/// as it was after a shape mismatch (lamb8: after any failure; its bytes are validated first).
status load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes);

/// An optimizer's per-parameter state in a canonical form, which equal states share bit for bit
/// (LibTorch's own archive keys each state by its tensor's address, so equal states of two
/// processes give different bytes and cannot be compared or put together from pieces).
struct optimizer_moments {
  /// The first moments of every parameter, then the second moments, flat fp32 in parameter
  /// order: twice the parameters' element count. Zero where a parameter has no state yet.
  /// Undefined when `packed` holds the state instead.
  torch::Tensor moments;
  /// Steps per parameter tensor; 0 where it has no state yet.
  std::vector<uint64_t> steps;
  /// The compact form (`moments_form::compact`) of an optimizer that has one: lamb8's codes and
  /// scales (`lamb8::save_state`), about a quarter of the fp32 moments. Empty otherwise.
  std::string packed;
};

/// Which form `save_optimizer_moments` writes.
enum class moments_form : uint8_t {
  /// fp32 moments (`optimizer_moments::moments`): what state rounds average (lamb8's are
  /// dequantized, and requantized on load).
  canonical,
  /// lamb8: its codes and scales (`optimizer_moments::packed`), for downloads and checkpoints;
  /// other kinds have no compact form and write the canonical one.
  compact,
};

/// The canonical (or compact) state of an Adam (without amsgrad), LAMB, lamb8 or SGD optimizer.
/// SGD's momentum buffers are its first moments; its second moments are zeros and its step count
/// is 1 where a buffer exists (LibTorch's SGD keeps no count), so that every kind has one layout.
result<optimizer_moments> save_optimizer_moments(const torch::optim::Optimizer& opt,
                                                 moments_form form = moments_form::canonical);

/// Loads a canonical or compact state (untrusted: from another peer) into an optimizer of the
/// same kind over parameters of the same sizes in the same order. Fails, changing nothing, on a
/// count or size mismatch, non-finite moments, negative second moments, a step count above
/// 2^53, or a compact state for another kind or malformed (kernels/optim/quant8.hpp).
status load_optimizer_moments(torch::optim::Optimizer& opt, const optimizer_moments& m);

} // namespace starling::kernels
