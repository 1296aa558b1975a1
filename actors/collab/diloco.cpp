#include "actors/collab/diloco.hpp"

#include <cmath>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "actors/collab/sparse_pack.hpp"
#include "kernels/flat.hpp"

namespace starling::actors::collab {

namespace {

/// The codec payload of `e` as one contiguous buffer.
std::vector<uint8_t> gather(const kernels::encoded_tensor& e) {
  std::vector<uint8_t> out;
  out.reserve(e.payload_bytes());
  for (const auto& c : e.chunks)
    out.insert(out.end(), c.begin(), c.end());
  return out;
}

} // namespace

kernels::optimizer_options default_outer_optimizer() {
  kernels::optimizer_options o;
  o.kind = "sgd";
  o.lr = 0.7;
  o.momentum = 0.9;
  o.nesterov = true;
  o.max_grad_norm = 0;
  return o;
}

kernels::codec_params default_pseudo_gradient_codec() {
  kernels::codec_params p;
  p.ratio = 0.005;
  return p;
}

status validate(const diloco_options& o) {
  if (o.inner_steps == 0)
    return fail("inner_steps (H) must be at least 1, got 0");
  if (o.error_feedback && o.codec == kernels::codec_id::randk)
    return fail("error feedback needs a contractive codec; randk is unbiased, use it without EF");
  if (auto p = kernels::resolve_params(1, o.codec, o.codec_params); !p)
    return fail("pseudo-gradient codec: " + p.error().what);
  return {};
}

wire_encoder::wire_encoder(kernels::codec_id codec, kernels::codec_params params,
                           bool error_feedback)
    : codec_(codec), params_(params) {
  if (error_feedback)
    ef_ = std::make_unique<kernels::error_feedback>(codec, params);
}

result<wire_tensor> wire_encoder::encode(const torch::Tensor& x) {
  try {
    auto flat = x.reshape({-1}).to(torch::kFloat).contiguous();
    auto enc = ef_ ? ef_->encode(flat) : kernels::encode(flat, codec_, params_);
    if (!enc)
      return enc.error();
    auto payload = gather(*enc);
    auto packed = pack_payload(enc->header, payload.data(), payload.size());
    if (!packed)
      return packed.error();
    return wire_tensor{enc->header, std::move(*packed)};
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot encode a pseudo-gradient: {}", e.what()));
  }
}

torch::Tensor wire_encoder::residual() const {
  return ef_ ? ef_->residual() : torch::Tensor{};
}

result<torch::Tensor> decode_wire(const wire_tensor& w, int64_t numel) {
  auto n = kernels::checked_numel(w.header.shape);
  if (!n)
    return n.error();
  if (*n != numel || w.header.shape.size() != 1)
    return fail(
        fmt::format("a flat tensor of {} elements was expected, got shape of {}", numel, *n));
  auto payload = unpack_payload(w.header, w.bytes.data(), w.bytes.size());
  if (!payload)
    return payload.error();
  auto t = kernels::decode_payload(w.header, payload->data(), payload->size());
  if (!t)
    return t.error();
  try {
    auto f = t->to(torch::kFloat).reshape({-1});
    if (!torch::isfinite(f).all().item<bool>())
      return fail("the decoded pseudo-gradient is not finite");
    return f;
  } catch (const std::exception& e) {
    return fail(fmt::format("cannot decode a pseudo-gradient: {}", e.what()));
  }
}

result<diloco_peer> diloco_peer::make(std::vector<torch::Tensor> params,
                                      const diloco_options& opts) {
  if (auto s = validate(opts); !s)
    return fail(s.what());
  auto outer = kernels::make_optimizer(opts.outer, params);
  if (!outer)
    return outer.error();
  return diloco_peer(std::move(params), opts, std::move(*outer));
}

diloco_peer::diloco_peer(std::vector<torch::Tensor> params, const diloco_options& opts,
                         std::unique_ptr<torch::optim::Optimizer> outer)
    : params_(std::move(params)),
      opts_(opts),
      outer_(std::move(outer)),
      start_(kernels::flatten_parameters(params_)),
      encoder_(opts.codec, opts.codec_params, opts.error_feedback) {
  // Inner steps count from zero at the start parameters.
}

bool diloco_peer::inner_step_done() {
  inner_++;
  return inner_ >= opts_.inner_steps;
}

torch::Tensor diloco_peer::pseudo_gradient() const {
  return start_ - kernels::flatten_parameters(params_);
}

result<wire_tensor> diloco_peer::outgoing() {
  auto w = encoder_.encode(pseudo_gradient());
  if (w)
    bytes_.sent += w->size();
  return w;
}

status diloco_peer::outer_step(const wire_tensor& averaged) {
  bytes_.received += averaged.size();
  auto delta = decode_wire(averaged, start_.numel());
  if (!delta)
    return fail(delta.error().what);
  return outer_step(*delta);
}

status diloco_peer::outer_step(const torch::Tensor& averaged) {
  if (!averaged.defined() || averaged.numel() != start_.numel())
    return fail(fmt::format("an averaged pseudo-gradient of {} elements was expected, got {}",
                            start_.numel(), averaged.defined() ? averaged.numel() : 0));
  try {
    torch::NoGradGuard guard;
    auto delta = averaged.reshape({-1}).to(torch::kFloat);
    if (!torch::isfinite(delta).all().item<bool>())
      return fail("the averaged pseudo-gradient is not finite");
    // The inner optimizer's `.grad` are its business: keep them as they were.
    auto grads = kernels::flatten_gradients(params_);
    if (auto s = kernels::unflatten_parameters(start_, params_); !s)
      return s;
    (void)kernels::unflatten_gradients(delta, params_); // sizes checked above
    kernels::clipped_step(*outer_, params_, opts_.outer);
    (void)kernels::unflatten_gradients(grads, params_);
    start_ = kernels::flatten_parameters(params_);
    inner_ = 0;
    outer_steps_++;
    return {};
  } catch (const std::exception& e) {
    return fail(fmt::format("the outer step failed: {}", e.what()));
  }
}

diloco_reducer::diloco_reducer(int64_t numel, kernels::codec_id codec, kernels::codec_params params,
                               bool error_feedback)
    : numel_(numel),
      encoder_(codec, params, error_feedback),
      sum_(torch::zeros({numel}, torch::kDouble)) {
  // Rounds start empty.
}

status diloco_reducer::add(const wire_tensor& contribution, double weight) {
  bytes_.received += contribution.size();
  if (!(weight > 0) || !std::isfinite(weight))
    return fail(fmt::format("a contribution's weight must be positive and finite, got {}", weight));
  auto x = decode_wire(contribution, numel_);
  if (!x)
    return fail(x.error().what);
  sum_.add_(x->to(torch::kDouble), weight);
  weight_ += weight;
  count_++;
  return {};
}

torch::Tensor diloco_reducer::mean() const {
  if (weight_ <= 0)
    return torch::zeros({numel_}, torch::kFloat);
  return (sum_ / weight_).to(torch::kFloat);
}

result<wire_tensor> diloco_reducer::finish(size_t recipients) {
  if (count_ == 0)
    return fail("nothing to average: no contribution arrived");
  auto w = encoder_.encode(mean());
  sum_.zero_();
  weight_ = 0;
  count_ = 0;
  if (w)
    bytes_.sent += w->size() * recipients;
  return w;
}

} // namespace starling::actors::collab
