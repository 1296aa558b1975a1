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

result<double> step_on(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& optimizer,
                       double max_grad_norm, const torch::Tensor& mean_gradient) {
  auto numel = kernels::total_numel(params);
  if (!mean_gradient.defined() || mean_gradient.numel() != numel ||
      !mean_gradient.is_floating_point())
    return fail(fmt::format("a mean gradient of {} floating-point elements was expected, got {}",
                            numel, mean_gradient.defined() ? mean_gradient.numel() : 0));
  try {
    torch::NoGradGuard guard;
    auto flat = mean_gradient.reshape({-1});
    if (!torch::isfinite(flat).all().item<bool>())
      return fail("the mean gradient to step on is not finite");
    // Whatever `.grad` holds now (a backward not yet accumulated) waits for the next step.
    auto meanwhile = kernels::flatten_gradients(params);
    if (auto s = kernels::unflatten_gradients(flat, params); !s)
      return fail(s.what());
    kernels::optimizer_options clip;
    clip.max_grad_norm = max_grad_norm;
    auto norm = kernels::clipped_step(optimizer, params, clip);
    (void)kernels::unflatten_gradients(meanwhile, params); // fits: taken from them
    return norm;
  } catch (const std::exception& e) {
    return fail(fmt::format("the optimizer step failed: {}", e.what()));
  }
}

result<model_state> export_state(const std::vector<torch::Tensor>& params,
                                 const torch::optim::Optimizer& optimizer,
                                 const kernels::module_buffers& buffers,
                                 kernels::moments_form form) {
  try {
    model_state s;
    s.params = kernels::flatten_parameters(params);
    if (!buffers.empty()) {
      s.buffers = kernels::flatten_parameters(buffers.floats);
      s.int_buffers = kernels::flatten_integers(buffers.integers);
    }
    auto m = kernels::save_optimizer_moments(optimizer, form);
    if (!m)
      return m.error();
    s.optimizer = std::move(*m);
    return s;
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot export the state: {}", e.what()));
  }
}

status import_state(const std::vector<torch::Tensor>& params, torch::optim::Optimizer& optimizer,
                    const model_state& s, const kernels::module_buffers& buffers) {
  auto numel = kernels::total_numel(params);
  try {
    torch::NoGradGuard guard;
    if (!s.params.defined() || s.params.dim() != 1 || s.params.numel() != numel)
      return fail(fmt::format("state parameters must be a flat vector of {} elements", numel));
    if (!torch::isfinite(s.params).all().item<bool>())
      return fail("state parameters are not finite");
    auto before = kernels::flatten_parameters(params);
    auto floats_before = kernels::flatten_parameters(buffers.floats);
    auto integers_before = kernels::flatten_integers(buffers.integers);
    // Buffers first: `load_buffers` checks everything before it writes.
    if (auto r = kernels::load_buffers(buffers, s.buffers, s.int_buffers); !r)
      return r;
    auto undo = [&] { // fits: taken from them
      (void)kernels::unflatten_parameters(before, params);
      (void)kernels::load_buffers(buffers, floats_before, integers_before);
    };
    if (auto r = kernels::unflatten_parameters(s.params, params); !r) {
      undo();
      return r;
    }
    if (auto r = kernels::load_optimizer_moments(optimizer, s.optimizer); !r) {
      undo();
      return r;
    }
    return {};
  } catch (const std::exception& e) {
    return fail_from("cannot import the state", e);
  }
}

result<torch::Tensor> state_vector(const std::vector<torch::Tensor>& params,
                                   const torch::optim::Optimizer& optimizer,
                                   const kernels::module_buffers& buffers) {
  auto s = export_state(params, optimizer, buffers);
  if (!s)
    return s.error();
  if (buffers.floats.empty())
    return torch::cat({s->params, s->optimizer.moments});
  return torch::cat({s->params, s->optimizer.moments, s->buffers});
}

status load_state_vector(const std::vector<torch::Tensor>& params,
                         torch::optim::Optimizer& optimizer, const torch::Tensor& v,
                         const kernels::module_buffers& buffers) {
  auto numel = kernels::total_numel(params);
  auto own = kernels::save_optimizer_moments(optimizer);
  if (!own)
    return fail(own.error().what);
  auto moments = own->moments.numel();
  auto floats = kernels::total_numel(buffers.floats);
  auto total = numel + moments + floats;
  if (!v.defined() || v.dim() != 1 || v.numel() != total)
    return fail(fmt::format("a state vector of {} elements was expected, got {}", total,
                            v.defined() ? v.numel() : 0));
  try {
    auto f = v.to(torch::kFloat);
    model_state s;
    s.params = f.slice(0, 0, numel).contiguous();
    s.optimizer.moments = f.slice(0, numel, numel + moments).contiguous();
    s.optimizer.steps = own->steps;
    // Integer buffers are not averaged: the peer keeps its own.
    s.buffers = f.slice(0, numel + moments, total).contiguous();
    s.int_buffers = kernels::flatten_integers(buffers.integers);
    return import_state(params, optimizer, s, buffers);
  } catch (const std::exception& e) {
    return fail_from("cannot load the state vector", e);
  }
}

result<double> grad_accumulator::apply(const torch::Tensor& mean_gradient) {
  auto norm = step_on(params_, *optimizer_, max_grad_norm_, mean_gradient);
  if (norm)
    steps_++;
  return norm;
}

result<model_state> grad_accumulator::export_state(kernels::moments_form form) const {
  return collab::export_state(params_, *optimizer_, buffers_, form);
}

status grad_accumulator::import_state(const model_state& s) {
  return collab::import_state(params_, *optimizer_, s, buffers_);
}

result<torch::Tensor> grad_accumulator::state_vector() const {
  return collab::state_vector(params_, *optimizer_, buffers_);
}

status grad_accumulator::load_state_vector(const torch::Tensor& v) {
  return collab::load_state_vector(params_, *optimizer_, v, buffers_);
}

} // namespace starling::actors::collab
