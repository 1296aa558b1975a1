// DiLoCo (Douillard et al., 2023) as pure tensor code: each peer takes H inner steps with its
// local optimizer, then the peers average their pseudo-gradients Δ_i = start − current and every
// peer takes one outer step (SGD with Nesterov momentum) from the common start parameters on the
// average. Pseudo-gradients travel compressed with any kernels/compress codec; with Top-k at 0.5%
// and error feedback both on each peer's pseudo-gradient and on the re-sparsified average (as
// SparseLoCo and DeMo do) they move more than 100× fewer bytes than fp32, counted in both
// directions. Top-k and error feedback are kernels/compress's; the wire form is `sparse_pack`.
//
// Averaging is the owner's: the dp peer hands `outgoing()`, decoded, to the averager's Top-k
// rounds (actors/averager/sparse_parts.hpp: each part's reducer re-sparsifies with its own EF)
// and applies the average with `outer_step`; `diloco_reducer` is that reduction for one reducer
// of the whole vector. Every peer applies the same bytes, so peers that start equal stay equal.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "kernels/compress/codec.hpp"
#include "kernels/optim/optimizer.hpp"
#include "kernels/result.hpp"

namespace starling::actors::collab {

/// DiLoCo's outer optimizer by default: SGD, lr 0.7, Nesterov momentum 0.9, no clipping.
kernels::optimizer_options default_outer_optimizer();

/// Top-k keeping 0.5% of the coordinates.
kernels::codec_params default_pseudo_gradient_codec();

/// Tunables of DiLoCo.
struct diloco_options {
  /// Inner steps between two outer steps (H).
  uint64_t inner_steps = 500;
  /// The outer optimizer (any kernels/optim kind; DiLoCo's is Nesterov SGD).
  kernels::optimizer_options outer = default_outer_optimizer();
  /// The codec pseudo-gradients and averages travel with.
  kernels::codec_id codec = kernels::codec_id::topk;
  /// Its parameters (ratio 0.005 for Top-k).
  kernels::codec_params codec_params = default_pseudo_gradient_codec();
  /// Error feedback on the peer's pseudo-gradient (and on the reducer's re-sparsified average).
  bool error_feedback = true;
};

/// Checks `o`: H >= 1, a codec that resolves for a one-element tensor, no EF with Rand-k.
status validate(const diloco_options& o);

/// A compressed tensor as it travels: the codec header and the packed payload.
struct wire_tensor {
  /// Dtype, shape, codec, resolved parameters.
  kernels::tensor_header header;
  /// The payload in `sparse_pack` form.
  std::vector<uint8_t> bytes;
  /// Bytes on the wire counted for it (the payload; the header is a few bytes either way).
  uint64_t size() const noexcept { return bytes.size(); }
};

/// Bytes counted in each direction.
struct byte_count {
  /// Bytes sent.
  uint64_t sent = 0;
  /// Bytes received.
  uint64_t received = 0;
};

/// Encodes flat fp32 vectors with a codec, optionally with error feedback (one stream).
class wire_encoder {
public:
  /// An encoder with `codec` and `params`; `error_feedback` keeps what the codec dropped.
  wire_encoder(kernels::codec_id codec, kernels::codec_params params, bool error_feedback);

  /// Encodes `x` (+ the residual with EF) and packs it.
  result<wire_tensor> encode(const torch::Tensor& x);

  /// What EF still owes (undefined before the first round or without EF).
  torch::Tensor residual() const;

private:
  kernels::codec_id codec_;
  kernels::codec_params params_;
  std::unique_ptr<kernels::error_feedback> ef_;
};

/// Unpacks and decodes an untrusted wire tensor into a flat fp32 tensor of `numel` elements;
/// fails, never throws, on anything malformed or of another size.
result<torch::Tensor> decode_wire(const wire_tensor& w, int64_t numel);

/// One peer's side of DiLoCo: the start parameters, the inner-step count, the outer optimizer,
/// the EF stream of its pseudo-gradients and its byte counts.
class diloco_peer {
public:
  /// A peer over `params` (the same tensors its inner optimizer steps); the start parameters
  /// are the current ones.
  static result<diloco_peer> make(std::vector<torch::Tensor> params, const diloco_options& opts);

  /// Counts one inner step; true when H inner steps were taken since the last outer step.
  bool inner_step_done();

  /// Inner steps since the last outer step.
  uint64_t inner_steps() const noexcept { return inner_; }

  /// Δ = start − current, flat fp32.
  torch::Tensor pseudo_gradient() const;

  /// Δ compressed (with EF) for sending to the reducer; counts the bytes sent.
  result<wire_tensor> outgoing();

  /// Decodes the averaged pseudo-gradient the reducer sent (counts the bytes received), then
  /// takes the outer step from the start parameters; the result is the new start.
  status outer_step(const wire_tensor& averaged);

  /// The outer step on a dense averaged pseudo-gradient: parameters ← start, gradient ← Δ,
  /// one outer optimizer step (no clipping unless the outer options ask), start ← parameters.
  status outer_step(const torch::Tensor& averaged);

  /// The start parameters of the current outer step.
  const torch::Tensor& start() const noexcept { return start_; }
  /// Outer steps taken.
  uint64_t outer_steps() const noexcept { return outer_steps_; }
  /// Bytes counted.
  const byte_count& bytes() const noexcept { return bytes_; }
  /// The EF residual of the pseudo-gradients.
  torch::Tensor residual() const { return encoder_.residual(); }

private:
  diloco_peer(std::vector<torch::Tensor> params, const diloco_options& opts,
              std::unique_ptr<torch::optim::Optimizer> outer);

  std::vector<torch::Tensor> params_;
  diloco_options opts_;
  std::unique_ptr<torch::optim::Optimizer> outer_;
  torch::Tensor start_;
  wire_encoder encoder_;
  uint64_t inner_ = 0;
  uint64_t outer_steps_ = 0;
  byte_count bytes_;
};

/// The reducer of one part: the weighted mean of the peers' decoded contributions,
/// re-sparsified with its own EF stream before it goes back to them.
class diloco_reducer {
public:
  /// A reducer of `numel` elements using the peers' codec; `error_feedback` on the result.
  diloco_reducer(int64_t numel, kernels::codec_id codec, kernels::codec_params params,
                 bool error_feedback);

  /// Adds one peer's contribution with `weight` (> 0, finite); counts the bytes received.
  /// Fails, adding nothing, on malformed bytes, a wrong size or a bad weight.
  status add(const wire_tensor& contribution, double weight);

  /// Contributions added this round.
  size_t contributions() const noexcept { return count_; }

  /// The weighted mean, compressed with EF, for `recipients` peers (its bytes are counted once
  /// per recipient); starts the next round. Fails when nothing was added.
  result<wire_tensor> finish(size_t recipients);

  /// The exact weighted mean of the round so far (before compression), for tests and metrics.
  torch::Tensor mean() const;

  /// Bytes counted.
  const byte_count& bytes() const noexcept { return bytes_; }
  /// The EF residual of the averages.
  torch::Tensor residual() const { return encoder_.residual(); }

private:
  int64_t numel_;
  wire_encoder encoder_;
  torch::Tensor sum_;
  double weight_ = 0;
  size_t count_ = 0;
  byte_count bytes_;
};

} // namespace starling::actors::collab
