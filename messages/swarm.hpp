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

/// A stage peer's full state for a newcomer: flat parameters, optimizer state, steps taken.
struct stage_state {
  tensor_msg params;
  std::vector<char> optimizer;
  uint64_t steps = 0;
  uint64_t samples = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, stage_state& x) {
  return f(caf::meta::type_name("stage_state"), x.params, x.optimizer, x.steps, x.samples);
}

} // namespace starling::messages
