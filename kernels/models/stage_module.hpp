// One pipeline stage of a layered model: an optional input layer, blocks [a, b), an optional head
// with its loss. Stateless between forward and backward: backward recomputes the forward.
#pragma once

#include "kernels/result.hpp"

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace starling::kernels {

/// A module mapping one tensor to one tensor: an input layer, a block or a head of a stage.
class stage_layer : public torch::nn::Module {
public:
  /// Applies the layer; autograd records it when grad mode is on.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;

  /// Checks that `x` is an acceptable input (dtype, rank, sizes), so untrusted input from the
  /// network becomes a failure rather than a LibTorch exception deep inside the layer.
  virtual status check_input(const torch::Tensor& x) const = 0;

  /// Restarts the layer's dropout stream from `seed`: the same seed gives the same masks, which is
  /// what makes a recomputed forward equal the original one.
  virtual void reseed_dropout(uint64_t seed);

protected:
  /// Inverted dropout with masks from the layer's own generator; identity when not training or
  /// `p == 0`.
  torch::Tensor dropout(const torch::Tensor& x, double p);

private:
  c10::optional<at::Generator> dropout_gen_;
};

/// What `stage_module::backward` returns.
struct stage_gradients {
  /// Gradient of the loss with respect to the stage's input; undefined for the first stage,
  /// whose input (integer tokens or raw features) has no gradient.
  torch::Tensor grad_input;
  /// The recomputed output (the loss, for the last stage), detached.
  torch::Tensor output;
};

/// How the last stage turns its head's output into the loss. Unset, a stage uses the mean
/// cross-entropy against int64 targets covering its input's positions.
struct stage_loss {
  /// The scalar loss of the head's output against the targets.
  std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& targets)> compute;
  /// Checks untrusted targets against the stage's input before anything is computed.
  std::function<status(const torch::Tensor& input, const torch::Tensor& targets)> check;
};

/// Blocks [begin, end) of a layered model, plus its input layer when `begin == 0` and its head and
/// loss (mean cross-entropy over all target positions) when `end` is the model's depth.
/// Parameter names are the full model's (`input.*`, `block<i>.*`, `head.*`), so a stage's
/// `named_parameters()` match the unsplit model's for the same layers.
class stage_module : public torch::nn::Module {
public:
  /// A stage over blocks `[begin, begin + blocks.size())` of a model of `depth` blocks; `input`
  /// must be given iff `begin == 0` and `head` iff the stage ends at `depth`.
  stage_module(int64_t depth, int64_t begin, std::shared_ptr<stage_layer> input,
               std::vector<std::shared_ptr<stage_layer>> blocks, std::shared_ptr<stage_layer> head);

  /// True when the stage holds the input layer (takes the model's raw input).
  bool is_first() const noexcept { return input_ != nullptr; }

  /// True when the stage holds the head and the loss (needs targets, returns a loss).
  bool is_last() const noexcept { return head_ != nullptr; }

  /// First block index held.
  int64_t begin() const noexcept { return begin_; }

  /// One past the last block index held.
  int64_t end() const noexcept { return begin_ + static_cast<int64_t>(blocks_.size()); }

  /// Number of blocks of the whole model.
  int64_t depth() const noexcept { return depth_; }

  /// Pass without autograd: returns the stage's output activations, or for the last stage the
  /// scalar mean loss against `targets` (required there, ignored elsewhere). Dropout (in training
  /// mode) draws its masks from `dropout_seed`: the microbatch's trainer picks it and sends it with
  /// both the forward and the backward request.
  result<torch::Tensor> forward(const torch::Tensor& input, const torch::Tensor& targets = {},
                                uint64_t dropout_seed = 0);

  /// Recomputes the forward with autograd on and back-propagates `grad_output` (for the last stage:
  /// a scalar scale of the loss, undefined meaning 1). Parameter gradients accumulate into
  /// `.grad()`; returns the gradient with respect to `input` (undefined for the first stage).
  /// The buffers (running statistics) are left as the recomputation found them: the forward
  /// already counted the microbatch.
  result<stage_gradients> backward(const torch::Tensor& input, const torch::Tensor& grad_output,
                                   const torch::Tensor& targets = {}, uint64_t dropout_seed = 0);

  /// The forward with autograd as the caller's grad mode says, without input checks: what the
  /// unsplit model uses for training in one process.
  /// Each layer's dropout stream is seeded from (`dropout_seed`, the layer's place in the whole
  /// model), so a split model draws the same masks as the unsplit one.
  torch::Tensor compute(const torch::Tensor& input, const torch::Tensor& targets = {},
                        uint64_t dropout_seed = 0);

  /// The head's output (logits) without the loss, autograd as the caller's grad mode says; for
  /// evaluation of a whole model (a stage holding every layer).
  torch::Tensor predict(const torch::Tensor& input, uint64_t dropout_seed = 0);

  /// The loss of the head's output `output` against `targets` (the stage's loss function).
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& targets) const;

  /// Replaces the default cross-entropy; both functions of `l` must be set.
  void set_loss(stage_loss l);

  /// All parameters in a stable order (input, blocks in order, head): the order of flat vectors.
  std::vector<torch::Tensor> ordered_parameters() const { return parameters(true); }

private:
  torch::Tensor body(const torch::Tensor& input, uint64_t dropout_seed);
  status check(const torch::Tensor& input, const torch::Tensor& targets) const;
  result<stage_gradients> backward_checked(const torch::Tensor& input,
                                           const torch::Tensor& grad_output,
                                           const torch::Tensor& targets, uint64_t dropout_seed);

  int64_t depth_;
  int64_t begin_;
  std::shared_ptr<stage_layer> input_;
  std::vector<std::shared_ptr<stage_layer>> blocks_;
  std::shared_ptr<stage_layer> head_;
  stage_loss loss_;
};

/// Mean cross-entropy of `logits` [..., C] against integer `targets` [...].
torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets);

/// A CPU generator seeded with `seed`, for reproducible parameter initialization.
at::Generator seeded_generator(uint64_t seed);

/// Splits `depth` blocks into `stages` contiguous ranges as evenly as possible (earlier stages get
/// the extra blocks); fails unless 1 <= stages <= depth.
result<std::vector<std::pair<int64_t, int64_t>>> even_stage_ranges(int64_t depth, int64_t stages);

} // namespace starling::kernels
