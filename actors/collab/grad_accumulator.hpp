// The tensor side of the collaborative optimizer: accumulates a peer's gradients weighted by
// samples, takes the step's mean gradient out for averaging while later backwards accumulate
// into the next step, steps any kernels/optim optimizer (SGD, Adam, LAMB) on the averaged or own
// gradient with clipping, and exports/imports parameters plus optimizer state for state
// averaging and state download. The owning actor carries out the coordinator's effects with it.
// LibTorch, no CAF; kept apart from the coordinator so that the decision core builds without
// torch.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "kernels/flat.hpp"
#include "kernels/optim/optimizer.hpp"
#include "kernels/result.hpp"

namespace starling::actors::collab {

/// A step's gradient taken out of the accumulator.
struct taken_gradient {
  /// The mean gradient over the step's samples, flat fp32 in parameter order (zeros when no
  /// sample was accumulated).
  torch::Tensor mean;
  /// Samples in it (the averaging weight).
  uint64_t samples = 0;
};

/// Parameters and optimizer state: what a donor serves and a state round averages.
struct model_state {
  /// All parameters, flat fp32 in order.
  torch::Tensor params;
  /// The optimizer's canonical state.
  kernels::optimizer_moments optimizer;
  /// The model's floating-point buffers (running statistics), flat fp32 in order; undefined or
  /// empty for a model without them.
  torch::Tensor buffers;
  /// The model's integer buffers (`num_batches_tracked`), flat int64 in order; taken from the
  /// donor, never averaged.
  torch::Tensor int_buffers;
};

/// Steps `optimizer` (built over `params`) on the flat `mean_gradient` (an averaged or own mean
/// gradient), clipped by global norm to `max_grad_norm` (<= 0: no clipping); the parameters'
/// `.grad` are left as they were (a backward accumulated meanwhile waits for the next step).
/// Returns the norm before clipping. Fails, changing nothing, on a wrong size or a non-finite
/// gradient (from the network). What `grad_accumulator::apply` does, for owners that keep their
/// gradients themselves (the SWARM stage).
result<double> step_on(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& optimizer,
                       double max_grad_norm, const torch::Tensor& mean_gradient);

/// Parameters, optimizer state and `buffers` of `params` and `optimizer`; the optimizer state in
/// `form` (compact: lamb8's codes and scales, for donors; canonical: fp32, for state rounds).
result<model_state> export_state(const std::vector<torch::Tensor>& params,
                                 const torch::optim::Optimizer& optimizer,
                                 const kernels::module_buffers& buffers = {},
                                 kernels::moments_form form = kernels::moments_form::canonical);

/// Loads a (downloaded, untrusted) state into `params`, `optimizer` and `buffers`, all or
/// nothing (the state must carry exactly the model's buffers).
status import_state(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& optimizer,
                    const model_state& s, const kernels::module_buffers& buffers = {});

/// Parameters, optimizer moments, then the float `buffers` in one flat fp32 vector: the unit a
/// state round averages (elementwise means of Adam's or LAMB's moments stay valid moments, and
/// means of running statistics are running statistics). Integer buffers are not in it.
result<torch::Tensor> state_vector(const std::vector<torch::Tensor>& params,
                                   const torch::optim::Optimizer& optimizer,
                                   const kernels::module_buffers& buffers = {});

/// Loads an averaged `state_vector` into `params`, `optimizer` and the float `buffers`, keeping
/// the optimizer's own step counts and the integer buffers; all or nothing.
status load_state_vector(const std::vector<torch::Tensor>& params,
                         torch::optim::Optimizer& optimizer, const torch::Tensor& v,
                         const kernels::module_buffers& buffers = {});

/// Accumulates and steps one peer's gradients. Not thread-safe: one owner (the actor).
class grad_accumulator {
public:
  /// An accumulator over `params` stepping `optimizer` (built over the same tensors) with
  /// gradients clipped to `max_grad_norm` (<= 0: no clipping).
  grad_accumulator(std::vector<torch::Tensor> params,
                   std::unique_ptr<torch::optim::Optimizer> optimizer, double max_grad_norm);

  /// Builds the optimizer `opts` names over `params`; fails where `make_optimizer` fails.
  static result<grad_accumulator> make(std::vector<torch::Tensor> params,
                                       const kernels::optimizer_options& opts);

  /// The model's buffers, which the state (export, import, state vector) carries from now on.
  void set_buffers(kernels::module_buffers b) { buffers_ = std::move(b); }

  /// Adds the gradients now in the parameters' `.grad`, the gradient of a mean loss over
  /// `samples` samples, weighted by `samples`, and zeroes `.grad`. Fails, adding nothing, on a
  /// non-finite gradient.
  status accumulate(uint64_t samples);

  /// Samples accumulated since the last `take` or `discard`.
  uint64_t samples() const noexcept { return samples_; }

  /// Takes the mean gradient out; the accumulator starts again from zero, so later backwards
  /// count towards the next step.
  taken_gradient take();

  /// Drops what was accumulated (the samples are lost).
  void discard();

  /// Steps the optimizer on `mean_gradient` (flat, one element per parameter element: an
  /// averaged or own mean gradient), clipped by global norm; the parameters' `.grad` are left as
  /// they were. Returns the norm before clipping. Fails, changing nothing, on a wrong size or a
  /// non-finite gradient (from the network).
  result<double> apply(const torch::Tensor& mean_gradient);

  /// Parameters, optimizer state (in `form`) and buffers, for a state round or a donor.
  result<model_state> export_state(
    kernels::moments_form form = kernels::moments_form::canonical) const;

  /// Loads a (downloaded, untrusted) state: parameters, optimizer state and buffers, all or
  /// nothing.
  status import_state(const model_state& s);

  /// Parameters, optimizer moments, then float buffers in one flat fp32 vector: the unit a
  /// state round averages (elementwise means of Adam's or LAMB's moments stay valid moments).
  result<torch::Tensor> state_vector() const;

  /// Loads an averaged `state_vector`, keeping the peer's own optimizer step counts; all or
  /// nothing.
  status load_state_vector(const torch::Tensor& v);

  /// The parameters.
  const std::vector<torch::Tensor>& params() const noexcept { return params_; }
  /// The optimizer.
  torch::optim::Optimizer& optimizer() noexcept { return *optimizer_; }
  /// Optimizer steps taken through `apply`.
  uint64_t steps() const noexcept { return steps_; }
  /// Element count of the parameters (and of every flat gradient).
  int64_t numel() const noexcept { return numel_; }

private:
  std::vector<torch::Tensor> params_;
  kernels::module_buffers buffers_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  double max_grad_norm_;
  int64_t numel_;
  /// Σ samples_i · gradient_i, in fp64 so that a long step's sum loses nothing to rounding.
  torch::Tensor sum_;
  uint64_t samples_ = 0;
  uint64_t steps_ = 0;
};

} // namespace starling::actors::collab
