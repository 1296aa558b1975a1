// The compute side of a data-parallel peer: what the `dp_peer` actor asks of the model it
// trains, whatever computes it. Two backends: `torch_backend` (a whole LibTorch model on a data
// source, gradients accumulated by actors/collab's grad_accumulator) and `modeled_backend` (the
// cost model of large simulations: no model, a flat vector of the model's size so that averaging
// moves real bytes; the actor charges compute time by speed either way). No CAF.
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "actors/collab/grad_accumulator.hpp"
#include "kernels/data/data_source.hpp"
#include "kernels/data/loader.hpp"
#include "kernels/models/mlp.hpp"
#include "kernels/models/registry.hpp"
#include "kernels/optim/optimizer.hpp"
#include "kernels/result.hpp"
#include "kernels/t2i/captions.hpp"
#include "messages/swarm.hpp"

namespace starling::actors::dp_peer {

/// What one microbatch gave.
struct microbatch_result {
  /// Samples whose gradient was accumulated.
  uint64_t samples = 0;
  /// Mean training loss of the microbatch (NaN when the backend computes no loss).
  double loss = std::numeric_limits<double>::quiet_NaN();
};

/// Held-out quality of the current parameters.
struct evaluation {
  /// Mean loss (cross-entropy, unless the model has another loss).
  double loss = 0;
  /// Fraction of correct top-1 predictions (per target: per sample, or per token).
  double accuracy = 0;
  /// Samples evaluated.
  uint64_t samples = 0;
};

/// A model being trained data-parallel, as the peer actor sees it. Not thread-safe: one owner.
class backend {
public:
  virtual ~backend();

  /// One line for logs.
  virtual std::string describe() const = 0;

  /// Elements of the flat parameter (and gradient) vector.
  virtual int64_t numel() const = 0;

  /// Computes microbatch `index` of this peer's stream (a pure function of the seed, the peer's
  /// stream key and `index`) and accumulates its gradient.
  virtual result<microbatch_result> compute(uint64_t index) = 0;

  /// Samples accumulated since the last `take` or `discard`.
  virtual uint64_t accumulated() const = 0;

  /// Takes the mean gradient out (later microbatches count towards the next step).
  virtual collab::taken_gradient take() = 0;

  /// Drops what was accumulated.
  virtual void discard() = 0;

  /// Steps the optimizer on a flat mean gradient (averaged or own); fails, changing nothing, on
  /// a wrong size or non-finite values.
  virtual status apply(const torch::Tensor& mean_gradient) = 0;

  /// Parameters and optimizer state as a donor serves them (`steps` = the global step).
  virtual result<messages::stage_state> export_state(uint64_t step) const = 0;

  /// Loads a downloaded (untrusted) state, all or nothing.
  virtual status import_state(const messages::stage_state& s) = 0;

  /// Parameters, optimizer moments, then float buffers (running statistics), flat: what a
  /// state-averaging round averages.
  virtual result<torch::Tensor> state_vector() const = 0;

  /// Loads an averaged state vector, all or nothing.
  virtual status load_state_vector(const torch::Tensor& v) = 0;

  /// Held-out loss and accuracy of the current parameters, in evaluation mode (dropout off,
  /// batch norm on its running statistics); none when the backend has no model.
  virtual std::optional<evaluation> evaluate() = 0;

  /// The parameters an optimizer steps (DiLoCo's inner and outer steps); empty without a model.
  virtual std::vector<torch::Tensor> parameters() = 0;

  /// Steps the local optimizer on the peer's own accumulated gradient (a DiLoCo inner step) and
  /// returns the samples in it (0: nothing accumulated, no step).
  virtual result<uint64_t> inner_step() = 0;

  /// The model whose parameters the backend trains (what an export saves); null without one.
  virtual std::shared_ptr<kernels::stage_module> module() = 0;
};

/// How a peer reads its training samples: a pure function of (seed, stream, index).
struct stream_options {
  /// The run's data seed.
  uint64_t seed = 0;
  /// The peer's stream key (its instance and generation): different peers read different
  /// orders, and a validator recomputes any peer's microbatch from public values.
  uint64_t stream = 0;
  /// Samples per microbatch.
  uint64_t microbatch = 32;
};

/// The microbatch `index` of `s` over a data set of `samples` ids: `batch_for_step` of a loader
/// seeded with (seed, stream), so that every peer walks the whole data set in its own order.
result<std::vector<uint64_t>> microbatch_ids(uint64_t samples, const stream_options& s,
                                             uint64_t index);

/// Settings of the LibTorch backend.
struct torch_backend_options {
  /// The model (an MLP classifier; `seed` is the collaboration's: every peer starts equal;
  /// `inputs` and `classes` 0: the training source's sample size and class count).
  kernels::mlp_config model;
  /// A registered model trained whole instead of the MLP (e.g. a TorchScript model, whose files
  /// give every peer the same initial parameters); empty: the MLP.
  std::optional<kernels::model_spec> spec;
  /// A GPT of the text-to-image demo (`spec` a GPT over this layout's vocabulary): its loss and
  /// held-out accuracy count the image positions only (kernels::use_image_loss).
  std::optional<kernels::t2i_layout> t2i;
  /// The optimizer the collaboration steps (its `max_grad_norm` clips each step).
  kernels::optimizer_options optimizer;
  /// Where microbatches come from.
  stream_options stream;
  /// Held-out samples evaluated by `evaluate` (the first ones of `eval`; 0: no evaluation).
  uint64_t eval_samples = 1000;
};

/// Makes a LibTorch backend training on `train` and evaluating on `eval` (may be null).
result<std::unique_ptr<backend>> make_torch_backend(const torch_backend_options& opts,
                                                    std::shared_ptr<const kernels::data_source> train,
                                                    std::shared_ptr<const kernels::data_source> eval);

/// Settings of the cost-model backend.
struct modeled_backend_options {
  /// Elements of the modeled parameter vector (what averaging moves: 4 bytes each in fp32).
  int64_t numel = 100'000;
  /// Samples per microbatch.
  uint64_t microbatch = 32;
};

/// Makes a cost-model backend: no model; gradients are zeros; state is zeros of the right size.
result<std::unique_ptr<backend>> make_modeled_backend(const modeled_backend_options& opts);

/// The logits of a whole model (a stage holding every layer, e.g. from `kernels::make_mlp`) for
/// `input`.
result<torch::Tensor> mlp_logits(kernels::stage_module& model, const torch::Tensor& input);

} // namespace starling::actors::dp_peer
