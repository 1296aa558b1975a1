#include "actors/stage/cost_model.hpp"

#include <cmath>
#include <random>

#include <fmt/format.h>
#include <torch/torch.h>

#include "kernels/models/stage_module.hpp"

namespace starling::actors::stage {

namespace {

int64_t cost_batch_of(const at::Tensor& t) {
  return t.defined() && t.dim() > 0 ? std::max<int64_t>(1, t.size(0)) : 1;
}

class cost_model final : public backend {
public:
  cost_model(cost_model_options opts, bool first, bool last, uint64_t seed, uint64_t init_seed)
      : opts_(opts), first_(first), last_(last), rng_(seed) {
    auto gen = kernels::seeded_generator(init_seed);
    params_ = torch::randn({opts_.placeholder_params}, gen).mul_(0.02).set_requires_grad(true);
  }

  bool is_first() const override { return first_; }

  bool is_last() const override { return last_; }

  std::vector<at::Tensor> parameters() override { return {params_}; }

  result<compute_result> forward(const at::Tensor& input, const at::Tensor&, uint64_t) override {
    auto batch = cost_batch_of(input);
    compute_result r;
    r.output = last_ ? torch::full({}, placeholder_loss) : placeholder(batch);
    r.device_s = opts_.forward_s * static_cast<double>(batch) * noise();
    // A forward of b samples is b / (1 + backward_factor) of a training sample's work.
    r.samples = static_cast<double>(batch) / (1.0 + opts_.backward_factor);
    return r;
  }

  result<compute_result> backward(const at::Tensor& input, const at::Tensor&, const at::Tensor&,
                                  uint64_t seed) override {
    auto batch = cost_batch_of(input);
    // A microbatch's placeholder gradient, drawn from its seed: peers of a stage accumulate
    // different gradients, so stepping and averaging them is observable.
    {
      torch::NoGradGuard guard;
      auto gen = kernels::seeded_generator(seed);
      auto g = torch::randn({opts_.placeholder_params}, gen);
      if (params_.grad().defined())
        params_.mutable_grad().add_(g);
      else
        params_.mutable_grad() = g;
    }
    compute_result r;
    if (!first_)
      r.output = placeholder(batch);
    if (last_)
      r.loss = placeholder_loss;
    r.device_s = opts_.forward_s * opts_.backward_factor * static_cast<double>(batch) * noise();
    r.samples = static_cast<double>(batch) * opts_.backward_factor / (1.0 + opts_.backward_factor);
    return r;
  }

  uint64_t modeled_state_bytes() const override { return opts_.state_bytes; }

private:
  at::Tensor placeholder(int64_t batch) const { return torch::zeros({batch, opts_.payload}); }

  /// A lognormal factor of mean 1.
  double noise() {
    if (opts_.noise <= 0)
      return 1.0;
    std::normal_distribution<double> z{0.0, 1.0};
    return std::exp(opts_.noise * z(rng_) - 0.5 * opts_.noise * opts_.noise);
  }

  cost_model_options opts_;
  bool first_;
  bool last_;
  std::mt19937_64 rng_;
  at::Tensor params_;
};

} // namespace

result<std::unique_ptr<backend>> make_cost_model(const cost_model_options& opts, int64_t depth,
                                                 int64_t begin, int64_t end, uint64_t seed,
                                                 uint64_t init_seed) {
  if (!(opts.forward_s > 0) || !(opts.backward_factor > 0) || !(opts.noise >= 0))
    return fail(fmt::format("a cost model needs forward_s > 0, backward_factor > 0 and noise >= "
                            "0, got {}, {} and {}",
                            opts.forward_s, opts.backward_factor, opts.noise));
  if (opts.payload < 1 || opts.placeholder_params < 1)
    return fail(fmt::format("a cost model needs payload >= 1 and placeholder_params >= 1, got {} "
                            "and {}",
                            opts.payload, opts.placeholder_params));
  if (begin < 0 || end <= begin || end > depth)
    return fail(fmt::format("a model of {} blocks cannot hold [{}, {})", depth, begin, end));
  return std::unique_ptr<backend>{
    std::make_unique<cost_model>(opts, begin == 0, end == depth, seed, init_seed)};
}

} // namespace starling::actors::stage
