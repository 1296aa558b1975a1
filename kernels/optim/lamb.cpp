#include "kernels/optim/lamb.hpp"

#include <torch/optim/serialize.h>

#include <cmath>

namespace starling::kernels {

void check_lamb_options(const lamb_options& o, const char* who) {
  TORCH_CHECK(o.lr() >= 0, who, ": invalid learning rate ", o.lr());
  TORCH_CHECK(o.eps() >= 0, who, ": invalid epsilon ", o.eps());
  TORCH_CHECK(o.beta1() >= 0 && o.beta1() < 1, who, ": invalid beta1 ", o.beta1());
  TORCH_CHECK(o.beta2() >= 0 && o.beta2() < 1, who, ": invalid beta2 ", o.beta2());
  TORCH_CHECK(o.weight_decay() >= 0, who, ": invalid weight decay ", o.weight_decay());
}

lamb::lamb(std::vector<torch::Tensor> params, lamb_options defaults)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<lamb_options>(defaults)) {
  check_lamb_options(defaults, "LAMB");
}

torch::Tensor lamb::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode grad_on(true);
    loss = closure();
  }
  trust_ratios_.clear();
  for (auto& group : param_groups_) {
    auto& opt = static_cast<lamb_options&>(group.options());
    for (auto& p : group.params()) {
      if (!p.grad().defined())
        continue;
      auto& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "LAMB does not support sparse gradients");
      auto key = c10::guts::to_string(p.unsafeGetTensorImpl());
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<lamb_param_state>();
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<lamb_param_state&>(*it->second);
      st.step(st.step() + 1);
      auto& m = st.exp_avg();
      auto& v = st.exp_avg_sq();
      m.mul_(opt.beta1()).add_(grad, 1 - opt.beta1());
      v.mul_(opt.beta2()).addcmul_(grad, grad, 1 - opt.beta2());
      auto bc1 = 1 - std::pow(opt.beta1(), static_cast<double>(st.step()));
      auto bc2 = 1 - std::pow(opt.beta2(), static_cast<double>(st.step()));
      auto update = (m / bc1) / ((v / bc2).sqrt() + opt.eps());
      if (opt.weight_decay() > 0)
        update.add_(p, opt.weight_decay());
      auto w_norm = p.norm().item<double>();
      if (opt.max_weight_norm() > 0)
        w_norm = std::min(w_norm, opt.max_weight_norm());
      auto u_norm = update.norm().item<double>();
      // Zero norms (fresh zero-initialized biases, zero gradients) fall back to Adam's step size.
      auto trust = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
      trust_ratios_.push_back(trust);
      p.add_(update, -opt.lr() * trust);
    }
  }
  return loss;
}

void lamb_options::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, beta1);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, beta2);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, max_weight_norm);
}

void lamb_options::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta1);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(beta2);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(max_weight_norm);
}

void lamb_param_state::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

void lamb_param_state::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void lamb::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<lamb_param_state, lamb_options>(archive, *this);
}

void lamb::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<lamb_param_state, lamb_options>(archive, *this);
}

} // namespace starling::kernels
