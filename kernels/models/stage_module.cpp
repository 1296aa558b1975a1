#include "kernels/models/stage_module.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

stage_module::stage_module(int64_t depth, int64_t begin, std::shared_ptr<stage_layer> input,
                           std::vector<std::shared_ptr<stage_layer>> blocks,
                           std::shared_ptr<stage_layer> head)
    : depth_(depth),
      begin_(begin),
      input_(std::move(input)),
      blocks_(std::move(blocks)),
      head_(std::move(head)) {
  TORCH_CHECK(begin_ >= 0 && end() <= depth_, "stage blocks [", begin_, ", ", end(),
              ") outside a model of depth ", depth_);
  TORCH_CHECK((begin_ == 0) == (input_ != nullptr), "the input layer belongs to stage 0 only");
  TORCH_CHECK((end() == depth_) == (head_ != nullptr), "the head belongs to the last stage only");
  TORCH_CHECK(input_ || head_ || !blocks_.empty(), "a stage must hold at least one layer");
  if (input_)
    register_module("input", input_);
  for (size_t i = 0; i < blocks_.size(); ++i)
    register_module("block" + std::to_string(begin_ + static_cast<int64_t>(i)), blocks_[i]);
  if (head_)
    register_module("head", head_);
}

status stage_module::check(const torch::Tensor& input, const torch::Tensor& targets) const {
  if (!input.defined())
    return fail("stage input is undefined");
  auto& first = input_ ? *input_ : blocks_.empty() ? *head_ : *blocks_.front();
  if (auto st = first.check_input(input); !st)
    return st;
  if (!is_last())
    return {};
  if (!targets.defined())
    return fail("the last stage needs targets");
  if (loss_.check)
    return loss_.check(input, targets);
  if (targets.scalar_type() != torch::kLong)
    return fail(fmt::format("targets must be int64, got {}", c10::toString(targets.scalar_type())));
  // Targets cover every position of the input but its feature dimension, when it has one.
  auto expected = input.sizes().vec();
  if (!is_first() || input.is_floating_point())
    expected.pop_back();
  if (targets.sizes().vec() != expected)
    return fail(fmt::format("targets must have shape {}, got {}",
                            c10::str(c10::IntArrayRef(expected)), c10::str(targets.sizes())));
  return {};
}

namespace {

/// Independent dropout streams per layer: splitmix64 of (seed, tag + 1).
uint64_t layer_seed(uint64_t seed, uint64_t tag) {
  return splitmix64_combine(seed, tag + 1);
}

constexpr uint64_t input_tag = ~uint64_t{0};
constexpr uint64_t head_layer_tag = ~uint64_t{0} - 1;

} // namespace

void stage_layer::reseed_dropout(uint64_t seed) {
  dropout_gen_ = seeded_generator(seed);
}

torch::Tensor stage_layer::dropout(const torch::Tensor& x, double p) {
  if (!is_training() || p <= 0.0)
    return x;
  if (!dropout_gen_)
    reseed_dropout(0);
  // Masks are drawn on the CPU from our generator (device generators differ), then moved.
  auto keep = torch::empty(x.sizes(), torch::kFloat).bernoulli_(1.0 - p, *dropout_gen_);
  return x * keep.to(x.options()) / (1.0 - p);
}

torch::Tensor stage_module::body(const torch::Tensor& input, uint64_t dropout_seed) {
  torch::Tensor x = input;
  if (input_) {
    input_->reseed_dropout(layer_seed(dropout_seed, input_tag));
    x = input_->forward(input);
  }
  for (size_t i = 0; i < blocks_.size(); ++i) {
    blocks_[i]->reseed_dropout(layer_seed(dropout_seed, static_cast<uint64_t>(begin_) + i));
    x = blocks_[i]->forward(x);
  }
  return x;
}

torch::Tensor stage_module::predict(const torch::Tensor& input, uint64_t dropout_seed) {
  TORCH_CHECK(is_last(), "predict needs the stage holding the head");
  auto x = body(input, dropout_seed);
  head_->reseed_dropout(layer_seed(dropout_seed, head_layer_tag));
  return head_->forward(x);
}

torch::Tensor stage_module::loss(const torch::Tensor& output, const torch::Tensor& targets) const {
  return loss_.compute ? loss_.compute(output, targets) : mean_cross_entropy(output, targets);
}

void stage_module::set_loss(stage_loss l) {
  TORCH_CHECK(l.compute && l.check, "a stage loss needs both its function and its target check");
  loss_ = std::move(l);
}

torch::Tensor stage_module::compute(const torch::Tensor& input, const torch::Tensor& targets,
                                    uint64_t dropout_seed) {
  if (head_)
    return loss(predict(input, dropout_seed), targets);
  return body(input, dropout_seed);
}

result<torch::Tensor> stage_module::forward(const torch::Tensor& input,
                                            const torch::Tensor& targets, uint64_t dropout_seed) {
  if (auto st = check(input, targets); !st)
    return fail(st.what());
  torch::NoGradGuard no_grad;
  try {
    return compute(input, targets, dropout_seed);
  } catch (const c10::Error& e) {
    // Checks cover shapes and dtypes; values (e.g. a target out of range) are caught here.
    return fail(fmt::format("stage forward failed: {}", e.what_without_backtrace()));
  }
}

result<stage_gradients> stage_module::backward(const torch::Tensor& input,
                                               const torch::Tensor& grad_output,
                                               const torch::Tensor& targets,
                                               uint64_t dropout_seed) {
  if (auto st = check(input, targets); !st)
    return fail(st.what());
  try {
    return backward_checked(input, grad_output, targets, dropout_seed);
  } catch (const c10::Error& e) {
    return fail(fmt::format("stage backward failed: {}", e.what_without_backtrace()));
  }
}

result<stage_gradients> stage_module::backward_checked(const torch::Tensor& input,
                                                       const torch::Tensor& grad_output,
                                                       const torch::Tensor& targets,
                                                       uint64_t dropout_seed) {
  torch::AutoGradMode grad_on(true);
  // A leaf copy of the input, so its gradient is ours alone even if the caller's tensor is shared.
  auto leaf = input;
  if (!is_first()) {
    leaf = input.detach().clone();
    leaf.set_requires_grad(true);
  }
  // The recomputation must not count twice in the buffers the forward already updated (batch
  // norm's running statistics): it puts back what it found, after the backward pass (autograd
  // saved the buffers it read and refuses them changed in place).
  struct restore_buffers {
    std::vector<torch::Tensor> own;
    std::vector<torch::Tensor> found;
    ~restore_buffers() {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < found.size(); ++i)
        own[i].copy_(found[i]);
    }
  } restore{buffers(true), {}};
  if (is_training())
    for (const auto& b : restore.own)
      restore.found.push_back(b.detach().clone());
  auto out = compute(leaf, targets, dropout_seed);
  if (is_last()) {
    if (grad_output.defined() && grad_output.numel() != 1)
      return fail(fmt::format("the last stage's grad_output must be a scalar scale, got shape {}",
                              c10::str(grad_output.sizes())));
    auto scale = grad_output.defined() ? grad_output.reshape({}).to(out.options())
                                       : torch::ones({}, out.options());
    out.backward(scale);
  } else {
    if (!grad_output.defined() || grad_output.sizes() != out.sizes())
      return fail(fmt::format("grad_output must have shape {}, got {}", c10::str(out.sizes()),
                              grad_output.defined() ? c10::str(grad_output.sizes())
                                                    : std::string{"undefined"}));
    out.backward(grad_output.to(out.options()));
  }
  stage_gradients g;
  g.output = out.detach();
  if (!is_first())
    g.grad_input = leaf.grad();
  return g;
}

torch::Tensor mean_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets) {
  auto classes = logits.size(-1);
  return torch::nn::functional::cross_entropy(logits.reshape({-1, classes}), targets.reshape({-1}));
}

at::Generator seeded_generator(uint64_t seed) {
  return at::detail::createCPUGenerator(seed);
}

result<std::vector<std::pair<int64_t, int64_t>>> even_stage_ranges(int64_t depth, int64_t stages) {
  if (stages < 1 || stages > depth)
    return fail(fmt::format("cannot cut {} blocks into {} stages", depth, stages));
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t at = 0;
  for (int64_t s = 0; s < stages; ++s) {
    auto n = depth / stages + (s < depth % stages ? 1 : 0);
    out.emplace_back(at, at + n);
    at += n;
  }
  return out;
}

} // namespace starling::kernels
