// Messages of SWARM pipeline training: trainers ask stage peers for forward and backward passes;
// a new stage peer downloads its state from a live one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/meta/type_name.hpp>

#include "messages/tensor_msg.hpp"

namespace starling::messages {

/// Forward pass request: the stage's input (tokens for the first stage, activations otherwise),
/// the targets (used by the last stage only) and the microbatch's dropout seed.
struct stage_forward {
  tensor_msg input;
  tensor_msg targets;
  uint64_t seed = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_forward& x) {
  return f(caf::meta::type_name("stage_forward"), x.input, x.targets, x.seed);
}

/// Backward pass request: the stage recomputes its forward on `input` (it keeps nothing between
/// forward and backward), back-propagates `grad_output` (undefined for the last stage, whose
/// output is the loss) and accumulates parameter gradients.
struct stage_backward {
  tensor_msg input;
  tensor_msg grad_output;
  tensor_msg targets;
  uint64_t seed = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_backward& x) {
  return f(caf::meta::type_name("stage_backward"), x.input, x.grad_output, x.targets, x.seed);
}

/// Answer to a backward request: the gradient for the previous stage (undefined for the first
/// stage) and the recomputed loss (last stage only, else 0).
struct stage_backward_reply {
  tensor_msg grad_input;
  double loss = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_backward_reply& x) {
  return f(caf::meta::type_name("stage_backward_reply"), x.grad_input, x.loss);
}

/// A stage peer's full state for a newcomer: flat parameters, optimizer state in a canonical
/// form (equal states are equal bit for bit, whichever peer holds them), steps taken.
struct stage_state {
  tensor_msg params;
  /// The optimizer's first then second moments, flat fp32 in parameter order (twice the
  /// parameters' element count), and each parameter tensor's step count (0: no state yet).
  tensor_msg moments;
  std::vector<uint64_t> optimizer_steps;
  uint64_t steps = 0;
  uint64_t samples = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_state& x) {
  return f(caf::meta::type_name("stage_state"), x.params, x.moments, x.optimizer_steps, x.steps,
           x.samples);
}

/// One part of a stage peer's state, for a newcomer that downloads from several donors at once:
/// part `part` of `parts` of the flat parameters and of the flat optimizer moments, each cut
/// into near-equal contiguous slices, with the sizes and the digest of the whole so that the
/// parts of several donors are put together only when they are one and the same state.
struct stage_state_part {
  uint64_t steps = 0;
  uint64_t samples = 0;
  uint64_t part = 0;
  uint64_t parts = 1;
  /// Elements of the whole flat parameter vector, and its dtype (`c10::ScalarType` as int).
  uint64_t params_numel = 0;
  int32_t params_dtype = 0;
  /// Elements of the whole flat moment vector (fp32).
  uint64_t moments_numel = 0;
  /// The whole state's per-parameter optimizer step counts (small: sent in every part).
  std::vector<uint64_t> optimizer_steps;
  /// BLAKE2b-256 of the whole state (parameter and moment bytes, step counts, step).
  std::string digest;
  /// This part's slices of the parameters and of the moments.
  tensor_msg params;
  tensor_msg moments;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_state_part& x) {
  return f(caf::meta::type_name("stage_state_part"), x.steps, x.samples, x.part, x.parts,
           x.params_numel, x.params_dtype, x.moments_numel, x.optimizer_steps, x.digest, x.params,
           x.moments);
}

} // namespace starling::messages
