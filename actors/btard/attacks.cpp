#include "actors/btard/attacks.hpp"

#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <torch/torch.h>

#include "actors/btard/aggregate_check.hpp"

namespace starling::actors::btard {

namespace {

struct named_attack {
  attack_kind kind;
  const char* name;
};

constexpr named_attack attack_names[] = {
  {attack_kind::none, "none"},
  {attack_kind::sign_flip, "sign_flip"},
  {attack_kind::random_direction, "random_direction"},
  {attack_kind::label_flip, "label_flip"},
  {attack_kind::delayed, "delayed"},
  {attack_kind::ipm, "ipm"},
  {attack_kind::alie, "alie"},
};

/// Φ(x) for the Halley refinement.
double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

/// A first estimate of Φ⁻¹(p): Acklam's rational approximation (relative error ~1e-9).
double quantile_estimate(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double low = 0.02425;
  if (p < low) {
    double q = std::sqrt(-2 * std::log(p));
    return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
           / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  if (p > 1 - low) {
    double q = std::sqrt(-2 * std::log1p(-p));
    return -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5])
           / ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  double q = p - 0.5;
  double r = q * q;
  return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q
         / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
}

} // namespace

const char* attack_name(attack_kind k) {
  for (auto& n : attack_names)
    if (n.kind == k)
      return n.name;
  return "unknown";
}

result<attack_kind> parse_attack(const std::string& name) {
  std::string known;
  for (auto& n : attack_names) {
    if (name == n.name)
      return n.kind;
    known += known.empty() ? n.name : std::string{", "} + n.name;
  }
  return fail(fmt::format("unknown attack '{}' (known: {})", name, known));
}

status validate(const attack_options& o) {
  if (o.every == 0)
    return fail("attack.every must be at least 1");
  if (!(o.scale > 0) || !std::isfinite(o.scale))
    return fail(fmt::format("attack.scale must be positive and finite, got {}", o.scale));
  if (!(o.epsilon > 0) || !std::isfinite(o.epsilon))
    return fail(fmt::format("attack.epsilon must be positive and finite, got {}", o.epsilon));
  if (o.kind == attack_kind::delayed) {
    if (o.duration == 0)
      return fail("attack.duration must be at least 1");
    if (o.duration > o.delay)
      return fail(fmt::format("attack.duration ({}) must not exceed attack.delay ({}): a "
                              "replayed gradient is one computed before the attack began",
                              o.duration, o.delay));
  }
  return {};
}

bool attacks_at(const attack_options& o, uint64_t step) {
  if (o.kind == attack_kind::none || step < o.start_step)
    return false;
  if (o.kind == attack_kind::delayed)
    return step - o.start_step < o.duration;
  return (step - o.start_step) % o.every == 0;
}

at::Tensor sign_flip(const at::Tensor& g, double scale) { return g * (-scale); }

result<at::Tensor> flip_labels(const at::Tensor& y, int64_t classes) {
  if (classes < 1)
    return fail(fmt::format("label flip needs at least one class, got {}", classes));
  if (y.scalar_type() != torch::kLong)
    return fail("label flip takes int64 class ids");
  if (y.numel() > 0) {
    auto lo = y.min().item<int64_t>();
    auto hi = y.max().item<int64_t>();
    if (lo < 0 || hi >= classes)
      return fail(fmt::format("a label outside [0, {}): {}", classes, lo < 0 ? lo : hi));
  }
  return (classes - 1) - y;
}

random_direction_attack::random_direction_attack(uint64_t seed,
                                                 const std::vector<std::vector<int64_t>>& shapes) {
  for (size_t i = 0; i < shapes.size(); ++i) {
    int64_t n = 1;
    for (auto s : shapes[i])
      n *= s;
    // One stream per tensor, so a tensor's direction does not depend on the tensors before it.
    auto z = gaussian_direction(seed ^ (0x9e3779b97f4a7c15ULL * (i + 1)), static_cast<size_t>(n));
    auto t = torch::from_blob(z.data(), {n}, torch::kDouble).clone();
    auto norm = t.norm().item<double>();
    if (norm > 0)
      t.div_(norm);
    dirs_.push_back(t.to(torch::kFloat).reshape(shapes[i]));
  }
}

result<std::vector<at::Tensor>> random_direction_attack::apply(const std::vector<at::Tensor>& grads,
                                                               double scale) const {
  if (grads.size() != dirs_.size())
    return fail(fmt::format("random direction: {} gradient tensors, {} directions", grads.size(),
                            dirs_.size()));
  std::vector<at::Tensor> out;
  out.reserve(grads.size());
  for (size_t i = 0; i < grads.size(); ++i) {
    if (grads[i].sizes() != dirs_[i].sizes())
      return fail(fmt::format("random direction: tensor {} has shape {}, the direction {}", i,
                              fmt::join(grads[i].sizes(), "x"), fmt::join(dirs_[i].sizes(), "x")));
    auto norm = grads[i].to(torch::kDouble).norm().item<double>();
    out.push_back(dirs_[i] * (scale * norm));
  }
  return out;
}

delayed_gradients::delayed_gradients(const attack_options& o) : o_(o) {}

void delayed_gradients::record(uint64_t step, const at::Tensor& g) {
  if (o_.start_step < o_.delay)
    return; // the replayed window would start before step 0: nothing to keep
  auto first = o_.start_step - o_.delay;
  if (step >= first && step - first < o_.duration)
    kept_[step] = g.detach().clone();
}

std::optional<at::Tensor> delayed_gradients::replay(uint64_t step) const {
  if (!attacks_at(o_, step) || step < o_.delay)
    return std::nullopt;
  auto it = kept_.find(step - o_.delay);
  if (it == kept_.end())
    return std::nullopt;
  return it->second;
}

result<honest_statistics> statistics_of(const std::vector<at::Tensor>& grads) {
  if (grads.empty())
    return fail("statistics of no honest gradients");
  auto n = grads.front().numel();
  std::vector<at::Tensor> flat;
  for (auto& g : grads) {
    if (g.numel() != n)
      return fail(fmt::format("honest gradients of {} and {} elements", n, g.numel()));
    flat.push_back(g.reshape({-1}).to(torch::kDouble));
  }
  auto all = torch::stack(flat);
  honest_statistics h;
  h.count = grads.size();
  h.mean = all.mean(0).to(torch::kFloat);
  h.std = grads.size() > 1 ? all.std(0, /*unbiased=*/true).to(torch::kFloat)
                           : torch::zeros({n}, torch::kFloat);
  return h;
}

at::Tensor ipm(const honest_statistics& h, double epsilon) { return h.mean * (-epsilon); }

result<double> alie_z(uint64_t n, uint64_t b) {
  auto s = static_cast<int64_t>(n / 2 + 1) - static_cast<int64_t>(b);
  if (s < 1 || s > static_cast<int64_t>(n) - 1)
    return fail(fmt::format("ALIE with n = {} and b = {}: s = floor(n/2 + 1) - b = {} is not in "
                            "[1, n - 1]",
                            n, b, s));
  return normal_quantile(static_cast<double>(static_cast<int64_t>(n) - s) / static_cast<double>(n));
}

at::Tensor alie(const honest_statistics& h, double z) { return h.mean - h.std * z; }

double normal_quantile(double p) {
  if (!(p > 0) || !(p < 1))
    return std::numeric_limits<double>::quiet_NaN();
  double x = quantile_estimate(p);
  // One Halley step on Φ(x) − p brings the estimate to full double precision.
  double e = normal_cdf(x) - p;
  double u = e * std::sqrt(2 * M_PI) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

} // namespace starling::actors::btard
