// What a stage peer computes with: a backend serves forward and backward passes of the stage's
// layers and holds the parameters the peer steps, averages and hands to newcomers. Two
// backends: the LibTorch stage module (torch_backend.hpp) and a cost model that computes nothing
// and only says how long the device would take (cost_model.hpp). The stage actor is the same for
// both; the device's queue is the stage's (device_queue.hpp). Pure: no CAF.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/result.hpp"

namespace starling::actors::stage {

/// What a backend computed for one request.
struct compute_result {
  /// Forward: the activations (the scalar loss for the last stage). Backward: the gradient for
  /// the previous stage (undefined for the first stage).
  at::Tensor output;
  /// Backward of the last stage: the recomputed loss.
  double loss = 0;
  /// Device seconds of the request at speed 1 (measured or modeled).
  double device_s = 0;
  /// Of those, the seconds the backend spent computing in the call itself (0 for a model).
  double ran_s = 0;
  /// Training samples the request stands for in throughput reports (a forward and its backward
  /// together count as the microbatch's samples).
  double samples = 0;
};

/// Device seconds of running `work` once.
using device_timer = std::function<double(const std::function<void()>& work)>;

/// A stage's compute: one instance per stage peer, used by one actor at a time.
class backend {
public:
  virtual ~backend() = default;

  /// True when the stage holds the model's input layer (its input has no gradient).
  virtual bool is_first() const = 0;

  /// True when the stage holds the head (needs targets, answers a loss).
  virtual bool is_last() const = 0;

  /// The parameters in a stable order (the optimizer's, and the order of flat states).
  virtual std::vector<at::Tensor> parameters() = 0;

  /// The buffers (batch norm's running statistics and counters) in a stable order: they travel
  /// with the state. None by default (a cost model has none).
  virtual std::vector<at::Tensor> buffers() { return {}; }

  /// A forward pass without autograd; `seed` is the microbatch's dropout seed.
  virtual result<compute_result> forward(const at::Tensor& input, const at::Tensor& targets,
                                         uint64_t seed) = 0;

  /// Recomputes the forward and back-propagates `grad_output` (for the last stage a scalar
  /// scale of the loss, undefined meaning 1); parameter gradients accumulate.
  virtual result<compute_result> backward(const at::Tensor& input, const at::Tensor& grad_output,
                                          const at::Tensor& targets, uint64_t seed) = 0;

  /// Bytes a transfer of the stage's state costs beyond the parameters and optimizer state it
  /// carries: the state a cost model stands for but does not hold (0 for a real model).
  virtual uint64_t modeled_state_bytes() const { return 0; }
};

} // namespace starling::actors::stage
