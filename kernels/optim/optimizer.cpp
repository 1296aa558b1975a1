#include "kernels/optim/optimizer.hpp"

#include "kernels/optim/lamb.hpp"
#include "kernels/optim/lamb8.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>

namespace starling::kernels {

result<std::unique_ptr<torch::optim::Optimizer>>
make_optimizer(const optimizer_options& opts, const std::vector<torch::Tensor>& params) {
  if (!(opts.lr >= 0) || !(opts.eps >= 0) || !(opts.weight_decay >= 0) ||
      !(opts.beta1 >= 0 && opts.beta1 < 1) || !(opts.beta2 >= 0 && opts.beta2 < 1))
    return fail(fmt::format("invalid optimizer values: lr {}, betas ({}, {}), eps {}, "
                            "weight_decay {}",
                            opts.lr, opts.beta1, opts.beta2, opts.eps, opts.weight_decay));
  if (opts.kind == "adam") {
    auto o = torch::optim::AdamOptions(opts.lr)
                 .betas({opts.beta1, opts.beta2})
                 .eps(opts.eps)
                 .weight_decay(opts.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::Adam>(params, o));
  }
  if (opts.kind == "lamb" || opts.kind == "lamb8") {
    auto o = lamb_options(opts.lr)
                 .beta1(opts.beta1)
                 .beta2(opts.beta2)
                 .eps(opts.eps)
                 .weight_decay(opts.weight_decay);
    if (opts.kind == "lamb8")
      return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<lamb8>(params, o));
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<lamb>(params, o));
  }
  if (opts.kind == "sgd") {
    if (!(opts.momentum >= 0 && opts.momentum < 1))
      return fail(fmt::format("sgd momentum must be in [0, 1), got {}", opts.momentum));
    if (opts.nesterov && opts.momentum == 0)
      return fail("sgd with nesterov needs a momentum > 0, got 0");
    auto o = torch::optim::SGDOptions(opts.lr)
                 .momentum(opts.momentum)
                 .nesterov(opts.nesterov)
                 .weight_decay(opts.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::SGD>(params, o));
  }
  return fail(fmt::format(
    "optimizer kind must be \"adam\", \"lamb\", \"lamb8\" or \"sgd\", got \"{}\"", opts.kind));
}

double gradient_norm(const std::vector<torch::Tensor>& params) {
  double sq = 0;
  for (auto& p : params)
    if (p.grad().defined())
      sq += p.grad().to(torch::kDouble).pow(2).sum().item<double>();
  return std::sqrt(sq);
}

double clip_by_global_norm(const std::vector<torch::Tensor>& params, double max_norm) {
  auto norm = gradient_norm(params);
  if (max_norm <= 0 || norm <= max_norm)
    return norm;
  torch::NoGradGuard no_grad;
  auto scale = max_norm / (norm + 1e-6);
  for (auto& p : params)
    if (p.grad().defined())
      p.mutable_grad().mul_(scale);
  return norm;
}

double scheduled_lr(const optimizer_options& opts, uint64_t step) {
  if (opts.warmup_steps <= 0)
    return opts.lr;
  auto w = static_cast<double>(opts.warmup_steps);
  return opts.lr * std::min(1.0, (static_cast<double>(step) + 1.0) / w);
}

void set_learning_rate(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups())
    g.options().set_lr(lr);
}

double clipped_step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                    const optimizer_options& opts) {
  auto norm = clip_by_global_norm(params, opts.max_grad_norm);
  opt.step();
  return norm;
}

result<std::string> save_optimizer_state(const torch::optim::Optimizer& opt) {
  try {
    if (auto* l8 = dynamic_cast<const lamb8*>(&opt))
      return l8->save_state();
    torch::serialize::OutputArchive archive;
    opt.save(archive);
    std::ostringstream out;
    archive.save_to(out);
    return out.str();
  } catch (const c10::Error& e) {
    return fail(fmt::format("cannot save optimizer state: {}", e.what_without_backtrace()));
  }
}

status load_optimizer_state(torch::optim::Optimizer& opt, const std::string& bytes) {
  if (auto* l8 = dynamic_cast<lamb8*>(&opt))
    return l8->load_state(bytes);
  std::vector<torch::Tensor> params;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params())
      params.push_back(p);
  // Loading replaces state as it goes: keep the current state to put back on a mismatch.
  auto before = save_optimizer_state(opt);
  if (!before)
    return fail(before.error().what);
  try {
    std::istringstream in(bytes);
    torch::serialize::InputArchive archive;
    archive.load_from(in);
    opt.load(archive);
  } catch (const c10::Error& e) {
    return fail(fmt::format("cannot load optimizer state: {}", e.what_without_backtrace()));
  }
  // LibTorch matches state to parameters by position only: check the shapes it brought.
  for (auto& p : params) {
    auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    if (it == opt.state().end())
      continue;
    auto* adam = dynamic_cast<torch::optim::AdamParamState*>(it->second.get());
    auto* lmb = dynamic_cast<lamb_param_state*>(it->second.get());
    auto moment = adam ? adam->exp_avg() : lmb ? lmb->exp_avg() : torch::Tensor{};
    if (moment.defined() && moment.sizes() != p.sizes()) {
      auto restored = load_optimizer_state(opt, *before);
      (void)restored; // `before` was saved from this very optimizer: it fits
      return fail(fmt::format("optimizer state of shape {} does not fit a parameter of shape {}",
                              c10::str(moment.sizes()), c10::str(p.sizes())));
    }
  }
  return {};
}

namespace {

std::vector<torch::Tensor> all_params(const torch::optim::Optimizer& opt) {
  std::vector<torch::Tensor> out;
  for (auto& g : opt.param_groups())
    for (auto& p : g.params())
      out.push_back(p);
  return out;
}

/// Which optimizer has a canonical moment form: Adam (without amsgrad, whose extra maximum
/// the form does not carry), LAMB, lamb8 or SGD.
enum class canonical_kind { adam, lamb, lamb8, sgd };

result<canonical_kind> check_canonical(const torch::optim::Optimizer& opt) {
  if (dynamic_cast<const torch::optim::SGD*>(&opt) != nullptr)
    return canonical_kind::sgd;
  if (dynamic_cast<const lamb8*>(&opt) != nullptr)
    return canonical_kind::lamb8;
  bool adam = dynamic_cast<const torch::optim::Adam*>(&opt) != nullptr;
  if (!adam && dynamic_cast<const lamb*>(&opt) == nullptr)
    return fail("only Adam, LAMB, lamb8 and SGD states have a canonical form");
  for (auto& g : opt.param_groups())
    if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&g.options()); o && o->amsgrad())
      return fail("Adam with amsgrad has no canonical form here");
  return adam ? canonical_kind::adam : canonical_kind::lamb;
}

} // namespace

result<optimizer_moments> save_optimizer_moments(const torch::optim::Optimizer& opt,
                                                 moments_form form) {
  auto kind = check_canonical(opt);
  if (!kind)
    return kind.error();
  torch::NoGradGuard guard;
  auto params = all_params(opt);
  const auto* l8 = dynamic_cast<const lamb8*>(&opt);
  if (l8 && form == moments_form::compact) {
    optimizer_moments out;
    out.packed = l8->save_state();
    for (auto& p : params)
      out.steps.push_back(static_cast<uint64_t>(l8->step_of(p)));
    return out;
  }
  std::vector<torch::Tensor> firsts, seconds;
  optimizer_moments out;
  for (auto& p : params) {
    auto it = opt.state().find(c10::guts::to_string(p.unsafeGetTensorImpl()));
    torch::Tensor m, v;
    uint64_t step = 0;
    if (l8) {
      int64_t s = 0;
      std::tie(m, v, s) = l8->moments_of(p);
      step = static_cast<uint64_t>(s);
    } else if (it != opt.state().end()) {
      if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(it->second.get())) {
        m = a->exp_avg();
        v = a->exp_avg_sq();
        step = static_cast<uint64_t>(a->step());
      } else if (auto* l = dynamic_cast<const lamb_param_state*>(it->second.get())) {
        m = l->exp_avg();
        v = l->exp_avg_sq();
        step = static_cast<uint64_t>(l->step());
      } else if (auto* g = dynamic_cast<const torch::optim::SGDParamState*>(it->second.get())) {
        m = g->momentum_buffer();
        step = m.defined() ? 1 : 0;
      }
    }
    auto zeros = torch::zeros({p.numel()}, torch::kFloat);
    firsts.push_back(m.defined() ? m.reshape({-1}).to(torch::kFloat) : zeros);
    seconds.push_back(v.defined() ? v.reshape({-1}).to(torch::kFloat) : zeros);
    out.steps.push_back(step);
  }
  firsts.insert(firsts.end(), seconds.begin(), seconds.end());
  out.moments = firsts.empty() ? torch::zeros({0}, torch::kFloat)
                               : torch::cat(firsts).contiguous();
  return out;
}

status load_optimizer_moments(torch::optim::Optimizer& opt, const optimizer_moments& m) {
  auto kind = check_canonical(opt);
  if (!kind)
    return kind.error();
  auto params = all_params(opt);
  if (!m.packed.empty()) {
    auto* l8 = dynamic_cast<lamb8*>(&opt);
    if (l8 == nullptr)
      return fail("the optimizer state is lamb8's 8-bit form, this optimizer is not lamb8 "
                  "(the peers' `optimizer` settings differ)");
    if (m.moments.defined() && m.moments.numel() > 0)
      return fail("an optimizer state with both fp32 and 8-bit moments");
    return l8->load_state(m.packed, &m.steps);
  }
  if (m.steps.size() != params.size())
    return fail(fmt::format("optimizer state for {} parameter tensors, the optimizer has {}",
                            m.steps.size(), params.size()));
  int64_t total = 0;
  for (auto& p : params)
    total += p.numel();
  if (!m.moments.defined() || m.moments.dim() != 1 || m.moments.numel() != 2 * total
      || m.moments.scalar_type() != torch::kFloat)
    return fail(
      fmt::format("optimizer moments must be a flat fp32 vector of {} elements", 2 * total));
  for (auto s : m.steps)
    if (s > (uint64_t{1} << 53))
      return fail(fmt::format("optimizer step count {} is out of range", s));
  torch::NoGradGuard guard;
  if (!torch::isfinite(m.moments).all().item<bool>())
    return fail("optimizer moments are not finite");
  if (total > 0 && m.moments.slice(0, total, 2 * total).lt(0).any().item<bool>())
    return fail("second moments must not be negative");
  int64_t at = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    auto& p = params[i];
    auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
    auto n = p.numel();
    auto first = m.moments.slice(0, at, at + n).view(p.sizes()).to(p.dtype()).clone();
    auto second =
      m.moments.slice(0, total + at, total + at + n).view(p.sizes()).to(p.dtype()).clone();
    at += n;
    if (m.steps[i] == 0) {
      opt.state().erase(key);
      continue;
    }
    auto step = static_cast<int64_t>(m.steps[i]);
    if (*kind == canonical_kind::sgd) {
      auto st = std::make_unique<torch::optim::SGDParamState>();
      st->momentum_buffer(first);
      opt.state()[key] = std::move(st);
    } else if (*kind == canonical_kind::lamb8) {
      static_cast<lamb8&>(opt).set_moments(p, first, second, step);
    } else if (*kind == canonical_kind::adam) {
      auto st = std::make_unique<torch::optim::AdamParamState>();
      st->step(step);
      st->exp_avg(first);
      st->exp_avg_sq(second);
      opt.state()[key] = std::move(st);
    } else {
      auto st = std::make_unique<lamb_param_state>();
      st->step(step);
      st->exp_avg(first);
      st->exp_avg_sq(second);
      opt.state()[key] = std::move(st);
    }
  }
  return {};
}

} // namespace starling::kernels
