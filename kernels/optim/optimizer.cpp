#include "kernels/optim/optimizer.hpp"

#include "kernels/optim/lamb.hpp"

#include <fmt/format.h>

#include <cmath>
#include <sstream>

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
  if (opts.kind == "lamb") {
    auto o = lamb_options(opts.lr)
                 .beta1(opts.beta1)
                 .beta2(opts.beta2)
                 .eps(opts.eps)
                 .weight_decay(opts.weight_decay);
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<lamb>(params, o));
  }
  return fail(fmt::format("optimizer kind must be \"adam\" or \"lamb\", got \"{}\"", opts.kind));
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

double clipped_step(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                    const optimizer_options& opts) {
  auto norm = clip_by_global_norm(params, opts.max_grad_norm);
  opt.step();
  return norm;
}

result<std::string> save_optimizer_state(const torch::optim::Optimizer& opt) {
  try {
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

} // namespace starling::kernels
