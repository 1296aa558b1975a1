#include "actors/btard/task.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

#include "kernels/data/data_source.hpp"
#include "kernels/data/loader.hpp"

namespace starling::actors::btard {

status validate(const mlp_task_options& o) {
  if (o.hidden < 1)
    return fail(fmt::format("hidden must be at least 1, not {}", o.hidden));
  if (o.batch < 1)
    return fail("batch must be at least 1");
  return {};
}

namespace {

class mlp_task final : public task {
public:
  mlp_task(std::shared_ptr<const kernels::data_source> train,
           std::shared_ptr<const kernels::data_source> eval, const mlp_task_options& o,
           int64_t inputs, int64_t classes)
      : train_(std::move(train)), eval_(std::move(eval)), o_(o), in_(inputs), classes_(classes) {}

  size_t dim() const override {
    return static_cast<size_t>(o_.hidden * in_ + o_.hidden + classes_ * o_.hidden + classes_);
  }

  std::vector<float> initial() const override {
    // PyTorch's Linear default: U(−1/√fan_in, 1/√fan_in) for weights and biases.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o_.seed);
    auto layer = [&](int64_t out, int64_t in) {
      double bound = 1.0 / std::sqrt(static_cast<double>(in));
      auto w = at::empty({out * in + out}, at::kFloat);
      w.uniform_(-bound, bound, gen);
      return w;
    };
    auto p = at::cat({layer(o_.hidden, in_), layer(classes_, o_.hidden)});
    return {p.data_ptr<float>(), p.data_ptr<float>() + p.numel()};
  }

  result<std::vector<uint64_t>> batch_ids(uint64_t batch_seed) const override {
    kernels::loader_options lo;
    lo.seed = batch_seed;
    return kernels::batch_for_step(train_->size(), lo, 0, o_.batch);
  }

  result<std::vector<float>> gradient(const std::vector<float>& params, uint64_t batch_seed,
                                      bool flip_labels) const override {
    if (params.size() != dim())
      return fail(
        fmt::format("parameters of size {}, the model has {}", params.size(), dim()));
    auto ids = batch_ids(batch_seed);
    if (!ids)
      return fail(ids.error().what);
    auto b = train_->batch(*ids);
    if (!b)
      return fail(b.error().what);
    auto y = b->targets;
    if (flip_labels)
      y = (classes_ - 1) - y;
    torch::AutoGradMode on(true);
    auto p = torch::from_blob(const_cast<float*>(params.data()),
                              {static_cast<int64_t>(params.size())}, at::kFloat)
               .clone()
               .requires_grad_(true);
    auto loss = torch::nn::functional::cross_entropy(logits(p, b->inputs), y);
    auto g = torch::autograd::grad({loss}, {p})[0].contiguous();
    return std::vector<float>(g.data_ptr<float>(), g.data_ptr<float>() + g.numel());
  }

  task_evaluation evaluate(const std::vector<float>& params) const override {
    torch::NoGradGuard off;
    auto p = torch::from_blob(const_cast<float*>(params.data()),
                              {static_cast<int64_t>(params.size())}, at::kFloat);
    uint64_t n = o_.eval_samples == 0 ? eval_->size() : std::min(o_.eval_samples, eval_->size());
    double correct = 0, loss = 0;
    const uint64_t chunk = 2000;
    for (uint64_t begin = 0; begin < n; begin += chunk) {
      std::vector<uint64_t> ids;
      for (uint64_t i = begin; i < std::min(n, begin + chunk); ++i)
        ids.push_back(i);
      auto b = eval_->batch(ids);
      if (!b)
        return {};
      auto z = logits(p, b->inputs);
      loss += torch::nn::functional::cross_entropy(
                z, b->targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                .item<double>();
      correct += z.argmax(1).eq(b->targets).sum().item<double>();
    }
    return {correct / static_cast<double>(std::max<uint64_t>(n, 1)),
            loss / static_cast<double>(std::max<uint64_t>(n, 1))};
  }

  std::string describe() const override {
    return fmt::format("MLP {}-{}-{} ({} parameters), batch {} per peer, on {}", in_, o_.hidden,
                       classes_, dim(), o_.batch, train_->describe());
  }

private:
  at::Tensor logits(const at::Tensor& p, const at::Tensor& x) const {
    int64_t h = o_.hidden, at = 0;
    auto take = [&](int64_t n) {
      auto v = p.narrow(0, at, n);
      at += n;
      return v;
    };
    auto w1 = take(h * in_).view({h, in_});
    auto b1 = take(h);
    auto w2 = take(classes_ * h).view({classes_, h});
    auto b2 = take(classes_);
    auto hid = torch::relu(torch::addmm(b1, x, w1.t()));
    return torch::addmm(b2, hid, w2.t());
  }

  std::shared_ptr<const kernels::data_source> train_, eval_;
  mlp_task_options o_;
  int64_t in_, classes_;
};

} // namespace

result<std::shared_ptr<const task>> make_mlp_task(std::shared_ptr<const kernels::data_source> train,
                                                  std::shared_ptr<const kernels::data_source> eval,
                                                  const mlp_task_options& o) {
  if (auto st = validate(o); !st)
    return fail(st.what());
  if (!train)
    return fail("no training data");
  auto shape = train->shape();
  if (shape.input.size() != 1 || shape.classes < 2)
    return fail(fmt::format("the MLP needs flat labeled samples; {} has {}-dimensional inputs "
                               "and {} classes",
                               train->describe(), shape.input.size(), shape.classes));
  if (train->size() < o.batch)
    return fail(fmt::format("batch {} is larger than the data set ({} samples)", o.batch,
                               train->size()));
  if (!eval)
    eval = train;
  return std::shared_ptr<const task>(
    std::make_shared<mlp_task>(train, eval, o, shape.input[0], shape.classes));
}

} // namespace starling::actors::btard
