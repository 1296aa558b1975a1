#include "actors/stage/torch_backend.hpp"

#include <chrono>
#include <optional>

#include <torch/torch.h>

namespace starling::actors::stage {

namespace {

class torch_backend final : public backend {
public:
  torch_backend(std::shared_ptr<kernels::stage_module> module, device_timer timer,
                double modeled_forward_s, double modeled_backward_factor)
      : module_(std::move(module)), timer_(std::move(timer)), modeled_s_(modeled_forward_s),
        backward_factor_(modeled_backward_factor) {
  }

  bool is_first() const override { return module_->is_first(); }

  bool is_last() const override { return module_->is_last(); }

  std::vector<at::Tensor> parameters() override { return module_->ordered_parameters(); }

  std::vector<at::Tensor> buffers() override { return module_->buffers(true); }

  result<compute_result> forward(const at::Tensor& input, const at::Tensor& targets,
                                 uint64_t seed) override {
    std::optional<result<torch::Tensor>> out;
    auto dt = time([&] { out.emplace(module_->forward(input, targets, seed)); }, input, 1.0);
    if (!*out)
      return out->error();
    compute_result r;
    r.output = **out;
    r.device_s = dt;
    r.ran_s = modeled_s_ > 0 ? 0.0 : dt;
    r.samples = 0; // counted with the backward
    return r;
  }

  result<compute_result> backward(const at::Tensor& input, const at::Tensor& grad_output,
                                  const at::Tensor& targets, uint64_t seed) override {
    std::optional<result<kernels::stage_gradients>> g;
    auto dt = time([&] { g.emplace(module_->backward(input, grad_output, targets, seed)); },
                   input, backward_factor_);
    if (!*g)
      return g->error();
    compute_result r;
    r.output = (*g)->grad_input;
    if (module_->is_last())
      r.loss = (*g)->output.item<double>();
    r.device_s = dt;
    r.ran_s = modeled_s_ > 0 ? 0.0 : dt;
    r.samples = static_cast<double>(input.size(0));
    return r;
  }

private:
  /// Device seconds of `work` on `input`: measured, or modeled (`factor` x the forward's).
  double time(const std::function<void()>& work, const at::Tensor& input, double factor) {
    if (modeled_s_ <= 0)
      return timer_(work);
    work();
    auto batch = input.defined() && input.dim() > 0 ? std::max<int64_t>(1, input.size(0)) : 1;
    return modeled_s_ * factor * static_cast<double>(batch);
  }

  std::shared_ptr<kernels::stage_module> module_;
  device_timer timer_;
  double modeled_s_ = 0;
  double backward_factor_ = 2.0;
};

} // namespace

double measure_wall_time(const std::function<void()>& work) {
  auto t0 = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

result<std::unique_ptr<backend>> make_torch_backend(torch_backend_options opts) {
  auto models = opts.models ? opts.models : kernels::model_registry::builtins();
  auto module = models->make_stage(opts.model, opts.begin, opts.end);
  if (!module)
    return module.error();
  auto timer = opts.timer ? std::move(opts.timer) : device_timer{measure_wall_time};
  return std::unique_ptr<backend>{std::make_unique<torch_backend>(
    *module, std::move(timer), opts.modeled_forward_s, opts.modeled_backward_factor)};
}

} // namespace starling::actors::stage
