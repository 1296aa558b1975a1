#include "actors/collab/grad_accumulator.hpp"

#include <exception>
#include <string>

#include <fmt/format.h>

#include "kernels/flat.hpp"

namespace starling::actors::collab {

namespace {

status fail_from(const char* what, const std::exception& e) {
  return fail(fmt::format("{}: {}", what, e.what()));
}

} // namespace

grad_accumulator::grad_accumulator(std::vector<torch::Tensor> params,
                                   std::unique_ptr<torch::optim::Optimizer> optimizer,
                                   double max_grad_norm)
    : params_(std::move(params)),
      optimizer_(std::move(optimizer)),
      max_grad_norm_(max_grad_norm),
      numel_(kernels::total_numel(params_)),
      sum_(torch::zeros({numel_}, torch::kDouble)) {
  // The accumulator starts empty.
}

result<grad_accumulator> grad_accumulator::make(std::vector<torch::Tensor> params,
                                                const kernels::optimizer_options& opts) {
  auto opt = kernels::make_optimizer(opts, params);
  if (!opt)
    return opt.error();
  return grad_accumulator(std::move(params), std::move(*opt), opts.max_grad_norm);
}

status grad_accumulator::accumulate(uint64_t samples) {
  try {
    torch::NoGradGuard guard;
    auto g = kernels::flatten_gradients(params_);
    if (!torch::isfinite(g).all().item<bool>())
      return fail("the gradient to accumulate is not finite");
    sum_.add_(g.to(torch::kDouble), static_cast<double>(samples));
    samples_ += samples;
    for (auto& p : params_)
      if (p.grad().defined())
        p.mutable_grad().zero_();
    return {};
  } catch (const std::exception& e) {
    return fail_from("cannot accumulate the gradient", e);
  }
}

taken_gradient grad_accumulator::take() {
  taken_gradient t;
  t.samples = samples_;
  t.mean = samples_ > 0 ? (sum_ / static_cast<double>(samples_)).to(torch::kFloat)
                        : torch::zeros({numel_}, torch::kFloat);
  sum_.zero_();
  samples_ = 0;
  return t;
}

void grad_accumulator::discard() {
  sum_.zero_();
  samples_ = 0;
}

result<double> grad_accumulator::apply(const torch::Tensor& mean_gradient) {
  if (!mean_gradient.defined() || mean_gradient.numel() != numel_ ||
      !mean_gradient.is_floating_point())
    return fail(fmt::format("a mean gradient of {} floating-point elements was expected, got {}",
                            numel_, mean_gradient.defined() ? mean_gradient.numel() : 0));
  try {
    torch::NoGradGuard guard;
    auto flat = mean_gradient.reshape({-1});
    if (!torch::isfinite(flat).all().item<bool>())
      return fail("the mean gradient to step on is not finite");
    // Whatever `.grad` holds now (a backward not yet accumulated) waits for the next step.
    auto meanwhile = kernels::flatten_gradients(params_);
    if (auto s = kernels::unflatten_gradients(flat, params_); !s)
      return fail(s.what());
    kernels::optimizer_options clip;
    clip.max_grad_norm = max_grad_norm_;
    auto norm = kernels::clipped_step(*optimizer_, params_, clip);
    (void)kernels::unflatten_gradients(meanwhile, params_); // fits: taken from them
    steps_++;
    return norm;
  } catch (const std::exception& e) {
    return fail(fmt::format("the optimizer step failed: {}", e.what()));
  }
}

result<model_state> grad_accumulator::export_state() const {
  try {
    model_state s;
    s.params = kernels::flatten_parameters(params_);
    auto m = kernels::save_optimizer_moments(*optimizer_);
    if (!m)
      return m.error();
    s.optimizer = std::move(*m);
    return s;
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot export the state: {}", e.what()));
  }
}

status grad_accumulator::import_state(const model_state& s) {
  try {
    torch::NoGradGuard guard;
    if (!s.params.defined() || s.params.dim() != 1 || s.params.numel() != numel_)
      return fail(fmt::format("state parameters must be a flat vector of {} elements", numel_));
    if (!torch::isfinite(s.params).all().item<bool>())
      return fail("state parameters are not finite");
    auto before = kernels::flatten_parameters(params_);
    if (auto r = kernels::unflatten_parameters(s.params, params_); !r)
      return r;
    if (auto r = kernels::load_optimizer_moments(*optimizer_, s.optimizer); !r) {
      (void)kernels::unflatten_parameters(before, params_); // fits: taken from them
      return r;
    }
    return {};
  } catch (const std::exception& e) {
    return fail_from("cannot import the state", e);
  }
}

result<torch::Tensor> grad_accumulator::state_vector() const {
  auto s = export_state();
  if (!s)
    return s.error();
  return torch::cat({s->params, s->optimizer.moments});
}

status grad_accumulator::load_state_vector(const torch::Tensor& v) {
  auto own = kernels::save_optimizer_moments(*optimizer_);
  if (!own)
    return fail(own.error().what);
  auto moments = own->moments.numel();
  if (!v.defined() || v.dim() != 1 || v.numel() != numel_ + moments)
    return fail(fmt::format("a state vector of {} elements was expected, got {}", numel_ + moments,
                            v.defined() ? v.numel() : 0));
  try {
    auto f = v.to(torch::kFloat);
    model_state s;
    s.params = f.slice(0, 0, numel_).contiguous();
    s.optimizer.moments = f.slice(0, numel_, numel_ + moments).contiguous();
    s.optimizer.steps = own->steps;
    return import_state(s);
  } catch (const std::exception& e) {
    return fail_from("cannot load the state vector", e);
  }
}

} // namespace starling::actors::collab
