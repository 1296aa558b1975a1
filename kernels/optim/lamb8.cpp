#include "kernels/optim/lamb8.hpp"

#include "kernels/optim/quant8.hpp"

#include <algorithm>
#include <cmath>
#include <memory>

namespace starling::kernels {

namespace {

/// Elements a step dequantizes at once (64 blocks): the only fp32 copy of a tensor's moments.
constexpr int64_t chunk = 64 * quant8_block;

std::string key_of(const torch::Tensor& p) {
  return c10::guts::to_string(p.unsafeGetTensorImpl());
}

bool is_large(const torch::Tensor& p) {
  return p.numel() >= quant8_min_numel;
}

void check_large(const torch::Tensor& p) {
  TORCH_CHECK(p.is_cpu() && p.scalar_type() == torch::kFloat && p.is_contiguous(),
              "lamb8: a parameter of ", p.numel(),
              " elements (8-bit moments) must be a contiguous fp32 CPU tensor");
}

/// Fresh 8-bit moments (all zero) for `p`.
void init_quantized(lamb8_param_state& st, const torch::Tensor& p) {
  auto n = p.numel();
  auto blocks = quant8_blocks(n);
  auto zero_m = code8_values(code8::dynamic_signed);
  auto zero_code = static_cast<uint8_t>(
      std::find(zero_m.begin(), zero_m.begin() + code8_size(code8::dynamic_signed), 0.0f) -
      zero_m.begin());
  st.m_codes(torch::full({n}, zero_code, torch::kUInt8));
  st.v_codes(torch::zeros({n}, torch::kUInt8));
  st.m_scales(torch::zeros({blocks}, torch::kFloat));
  st.v_scales(torch::zeros({blocks}, torch::kFloat));
}

/// Quantizes `first` and `second` (flat fp32, contiguous) into `st`'s codes and scales.
void quantize_into(lamb8_param_state& st, const torch::Tensor& first, const torch::Tensor& second) {
  auto n = first.numel();
  auto ok = quantize8(code8::dynamic_signed, first.data_ptr<float>(), n,
                      st.m_codes().data_ptr<uint8_t>(), st.m_scales().data_ptr<float>()) &&
            quantize8(code8::log_unsigned, second.data_ptr<float>(), n,
                      st.v_codes().data_ptr<uint8_t>(), st.v_scales().data_ptr<float>());
  TORCH_CHECK(ok, "lamb8: moments to quantize are not finite");
}

} // namespace

lamb8::lamb8(std::vector<torch::Tensor> params, lamb_options defaults)
    : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                              std::make_unique<lamb_options>(defaults)) {
  check_lamb_options(defaults, "LAMB8");
}

torch::Tensor lamb8::step(LossClosure closure) {
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
      const auto& grad = p.grad();
      TORCH_CHECK(!grad.is_sparse(), "LAMB8 does not support sparse gradients");
      auto key = key_of(p);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto st = std::make_unique<lamb8_param_state>();
        if (is_large(p)) {
          check_large(p);
          init_quantized(*st, p);
        } else {
          st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        }
        it = state_.emplace(key, std::move(st)).first;
      }
      auto& st = static_cast<lamb8_param_state&>(*it->second);
      st.step(st.step() + 1);
      auto bc1 = 1 - std::pow(opt.beta1(), static_cast<double>(st.step()));
      auto bc2 = 1 - std::pow(opt.beta2(), static_cast<double>(st.step()));
      double trust = 1.0;
      auto w_norm = p.norm().item<double>();
      if (opt.max_weight_norm() > 0)
        w_norm = std::min(w_norm, opt.max_weight_norm());
      if (!st.quantized()) {
        // Small tensor: LAMB exactly (kernels/optim/lamb.cpp).
        auto& m = st.exp_avg();
        auto& v = st.exp_avg_sq();
        m.mul_(opt.beta1()).add_(grad, 1 - opt.beta1());
        v.mul_(opt.beta2()).addcmul_(grad, grad, 1 - opt.beta2());
        auto update = (m / bc1) / ((v / bc2).sqrt() + opt.eps());
        if (opt.weight_decay() > 0)
          update.add_(p, opt.weight_decay());
        auto u_norm = update.norm().item<double>();
        trust = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
        trust_ratios_.push_back(trust);
        p.add_(update, -opt.lr() * trust);
        continue;
      }
      check_large(p);
      auto g = grad.to(torch::kFloat).contiguous();
      const float* gp = g.data_ptr<float>();
      float* w = p.data_ptr<float>();
      auto* mc = st.m_codes().data_ptr<uint8_t>();
      auto* vc = st.v_codes().data_ptr<uint8_t>();
      auto* ms = st.m_scales().data_ptr<float>();
      auto* vs = st.v_scales().data_ptr<float>();
      auto n = p.numel();
      auto b1 = static_cast<float>(opt.beta1()), b2 = static_cast<float>(opt.beta2());
      auto ibc1 = static_cast<float>(1 / bc1), ibc2 = static_cast<float>(1 / bc2);
      auto eps = static_cast<float>(opt.eps()), wd = static_cast<float>(opt.weight_decay());
      std::vector<float> m(static_cast<size_t>(std::min(chunk, n)));
      std::vector<float> v(m.size());
      auto update = [&](int64_t i, int64_t at) {
        return (m[i] * ibc1) / (std::sqrt(v[i] * ibc2) + eps) + wd * w[at];
      };
      // Pass 1: advance the moments chunk by chunk (the stored codes are the state), and the
      // update's norm from the moments as stored.
      double u_sq = 0;
      for (int64_t a = 0; a < n; a += chunk) {
        auto len = std::min(chunk, n - a);
        auto blk = a / quant8_block;
        dequantize8(code8::dynamic_signed, mc + a, ms + blk, len, m.data());
        dequantize8(code8::log_unsigned, vc + a, vs + blk, len, v.data());
        for (int64_t i = 0; i < len; ++i) {
          auto gi = gp[a + i];
          m[i] = b1 * m[i] + (1 - b1) * gi;
          v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        }
        TORCH_CHECK(quantize8(code8::dynamic_signed, m.data(), len, mc + a, ms + blk) &&
                        quantize8(code8::log_unsigned, v.data(), len, vc + a, vs + blk),
                    "LAMB8: the moments are not finite (a non-finite gradient)");
        dequantize8(code8::dynamic_signed, mc + a, ms + blk, len, m.data());
        dequantize8(code8::log_unsigned, vc + a, vs + blk, len, v.data());
        for (int64_t i = 0; i < len; ++i) {
          double u = update(i, a + i);
          u_sq += u * u;
        }
      }
      auto u_norm = std::sqrt(u_sq);
      // Zero norms (fresh zero-initialized tensors, zero gradients) fall back to Adam's step.
      trust = (w_norm > 0 && u_norm > 0) ? w_norm / u_norm : 1.0;
      trust_ratios_.push_back(trust);
      auto scale = static_cast<float>(opt.lr() * trust);
      // Pass 2: the same update again from the stored moments, applied.
      for (int64_t a = 0; a < n; a += chunk) {
        auto len = std::min(chunk, n - a);
        auto blk = a / quant8_block;
        dequantize8(code8::dynamic_signed, mc + a, ms + blk, len, m.data());
        dequantize8(code8::log_unsigned, vc + a, vs + blk, len, v.data());
        for (int64_t i = 0; i < len; ++i)
          w[a + i] -= scale * update(i, a + i);
      }
    }
  }
  return loss;
}

std::string lamb8::save_state() const {
  std::vector<lamb8_tensor_ref> refs;
  std::vector<torch::Tensor> keep; // fp32 contiguous copies of small moments, alive until encoded
  for (const auto& g : param_groups_)
    for (const auto& p : g.params()) {
      lamb8_tensor_ref r;
      r.numel = static_cast<uint64_t>(p.numel());
      auto it = state_.find(key_of(p));
      if (it != state_.end()) {
        const auto& st = static_cast<const lamb8_param_state&>(*it->second);
        r.step = static_cast<uint64_t>(st.step());
        if (st.quantized()) {
          r.form = lamb8_form::quantized;
          r.m_codes = st.m_codes().data_ptr<uint8_t>();
          r.v_codes = st.v_codes().data_ptr<uint8_t>();
          r.m_scales = st.m_scales().data_ptr<float>();
          r.v_scales = st.v_scales().data_ptr<float>();
        } else {
          r.form = lamb8_form::full;
          keep.push_back(st.exp_avg().to(torch::kFloat).contiguous());
          r.m = keep.back().data_ptr<float>();
          keep.push_back(st.exp_avg_sq().to(torch::kFloat).contiguous());
          r.v = keep.back().data_ptr<float>();
        }
      }
      refs.push_back(r);
    }
  return encode_lamb8_state(refs);
}

status lamb8::load_state(const std::string& bytes, const std::vector<uint64_t>* steps) {
  std::vector<torch::Tensor> params;
  std::vector<uint64_t> numels;
  for (const auto& g : param_groups_)
    for (const auto& p : g.params()) {
      params.push_back(p);
      numels.push_back(static_cast<uint64_t>(p.numel()));
    }
  auto decoded = decode_lamb8_state(bytes.data(), bytes.size(), &numels);
  if (!decoded)
    return decoded.error();
  if (steps) {
    std::vector<uint64_t> own;
    for (const auto& t : *decoded)
      own.push_back(t.step);
    if (own != *steps)
      return fail("the lamb8 state's step counts differ from the steps sent with it");
  }
  try {
    // Everything is built before anything is replaced: a failure changes nothing.
    std::vector<std::unique_ptr<lamb8_param_state>> fresh;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& t = (*decoded)[i];
      const auto& p = params[i];
      if (t.form == lamb8_form::empty) {
        fresh.emplace_back();
        continue;
      }
      auto st = std::make_unique<lamb8_param_state>();
      st->step(static_cast<int64_t>(t.step));
      auto n = p.numel();
      if (t.form == lamb8_form::full) {
        auto from = [&](std::vector<float>& x) {
          return torch::from_blob(x.data(), {n}, torch::kFloat)
              .view(p.sizes())
              .to(p.dtype())
              .clone();
        };
        st->exp_avg(from(t.m));
        st->exp_avg_sq(from(t.v));
      } else {
        check_large(p);
        auto blocks = quant8_blocks(n);
        st->m_codes(torch::from_blob(t.m_codes.data(), {n}, torch::kUInt8).clone());
        st->v_codes(torch::from_blob(t.v_codes.data(), {n}, torch::kUInt8).clone());
        st->m_scales(torch::from_blob(t.m_scales.data(), {blocks}, torch::kFloat).clone());
        st->v_scales(torch::from_blob(t.v_scales.data(), {blocks}, torch::kFloat).clone());
      }
      fresh.push_back(std::move(st));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      auto key = key_of(params[i]);
      if (fresh[i])
        state_[key] = std::move(fresh[i]);
      else
        state_.erase(key);
    }
    return {};
  } catch (const c10::Error& e) {
    return fail(std::string{"cannot load the lamb8 state: "} + e.what_without_backtrace());
  }
}

uint64_t lamb8::state_bytes() const {
  uint64_t total = 0;
  for (const auto& [key, s] : state_) {
    const auto& st = static_cast<const lamb8_param_state&>(*s);
    total += sizeof(int64_t);
    for (const auto* t : {&st.exp_avg(), &st.exp_avg_sq(), &st.m_codes(), &st.v_codes(),
                          &st.m_scales(), &st.v_scales()})
      if (t->defined())
        total += t->nbytes();
  }
  return total;
}

std::tuple<torch::Tensor, torch::Tensor, int64_t> lamb8::moments_of(const torch::Tensor& p) const {
  auto it = state_.find(key_of(p));
  if (it == state_.end())
    return {};
  const auto& st = static_cast<const lamb8_param_state&>(*it->second);
  if (!st.quantized())
    return {st.exp_avg(), st.exp_avg_sq(), st.step()};
  auto n = p.numel();
  auto m = torch::empty({n}, torch::kFloat);
  auto v = torch::empty({n}, torch::kFloat);
  dequantize8(code8::dynamic_signed, st.m_codes().data_ptr<uint8_t>(),
              st.m_scales().data_ptr<float>(), n, m.data_ptr<float>());
  dequantize8(code8::log_unsigned, st.v_codes().data_ptr<uint8_t>(),
              st.v_scales().data_ptr<float>(), n, v.data_ptr<float>());
  return {m.view(p.sizes()), v.view(p.sizes()), st.step()};
}

int64_t lamb8::step_of(const torch::Tensor& p) const {
  auto it = state_.find(key_of(p));
  return it == state_.end() ? 0 : static_cast<const lamb8_param_state&>(*it->second).step();
}

void lamb8::set_moments(const torch::Tensor& p, const torch::Tensor& first,
                        const torch::Tensor& second, int64_t step) {
  auto key = key_of(p);
  if (step == 0) {
    state_.erase(key);
    return;
  }
  auto st = std::make_unique<lamb8_param_state>();
  st->step(step);
  if (is_large(p)) {
    check_large(p);
    init_quantized(*st, p);
    quantize_into(*st, first.reshape({-1}).to(torch::kFloat).contiguous(),
                  second.reshape({-1}).to(torch::kFloat).contiguous());
  } else {
    st->exp_avg(first.reshape(p.sizes()).to(p.dtype()).clone());
    st->exp_avg_sq(second.reshape(p.sizes()).to(p.dtype()).clone());
  }
  state_[key] = std::move(st);
}

void lamb8::save(torch::serialize::OutputArchive& archive) const {
  auto bytes = save_state();
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  std::copy(bytes.begin(), bytes.end(), reinterpret_cast<char*>(t.data_ptr<uint8_t>()));
  archive.write("lamb8_state", t);
}

void lamb8::load(torch::serialize::InputArchive& archive) {
  torch::Tensor t;
  archive.read("lamb8_state", t);
  TORCH_CHECK(t.defined() && t.scalar_type() == torch::kUInt8 && t.dim() == 1,
              "lamb8: the archive's state is not a flat byte tensor");
  auto c = t.contiguous();
  std::string bytes(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()),
                    static_cast<size_t>(c.numel()));
  auto r = load_state(bytes);
  TORCH_CHECK(r.ok(), r.what());
}

} // namespace starling::kernels
