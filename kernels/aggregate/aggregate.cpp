#include "kernels/aggregate/aggregate.hpp"

#include <cmath>
#include <string>

#include <fmt/format.h>
#include <torch/torch.h>

namespace starling::kernels {

namespace {

std::string shape_str(const at::Tensor& t) {
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    out += (i ? ", " : "") + std::to_string(t.size(i));
  return out + "]";
}

/// Checks non-emptiness and equal shapes, then stacks the inputs as rows of an [n, numel]
/// float64 matrix: every aggregate is computed in double so float32 inputs lose nothing extra.
result<at::Tensor> stack_rows(const std::vector<at::Tensor>& inputs, const char* who) {
  if (inputs.empty())
    return fail(fmt::format("{}: expected at least one input tensor, got none", who));
  const auto& first = inputs.front();
  if (!first.defined())
    return fail(fmt::format("{}: input 0 is an undefined tensor", who));
  std::vector<at::Tensor> rows;
  rows.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    if (!t.defined())
      return fail(fmt::format("{}: input {} is an undefined tensor", who, i));
    if (t.sizes() != first.sizes())
      return fail(fmt::format("{}: input {} has shape {}, expected {} like input 0", who, i,
                              shape_str(t), shape_str(first)));
    rows.push_back(t.reshape({-1}).to(torch::kFloat64));
  }
  return torch::stack(rows);
}

/// Validates the weights against the input count and returns them as a float64 column.
result<at::Tensor> weight_column(const std::vector<double>& weights, std::size_t n,
                                 const char* who) {
  if (weights.size() != n)
    return fail(fmt::format("{}: expected {} weights (one per input), got {}", who, n,
                            weights.size()));
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0.0)
      return fail(fmt::format("{}: weight {} is {}, expected a finite value >= 0", who, i,
                              weights[i]));
    total += weights[i];
  }
  if (total <= 0.0)
    return fail(fmt::format("{}: weights sum to {}, expected a positive sum", who, total));
  return torch::tensor(weights, torch::kFloat64).reshape({static_cast<int64_t>(n), 1});
}

at::Tensor like_input(const at::Tensor& flat, const at::Tensor& model) {
  return flat.reshape(model.sizes()).to(model.scalar_type());
}

} // namespace

result<at::Tensor> weighted_mean(const std::vector<at::Tensor>& inputs,
                                 const std::vector<double>& weights) {
  auto rows = stack_rows(inputs, "weighted_mean");
  if (!rows)
    return rows.error();
  auto w = weight_column(weights, inputs.size(), "weighted_mean");
  if (!w)
    return w.error();
  auto mean = (*rows * *w).sum(0) / w->sum();
  return like_input(mean, inputs.front());
}

result<at::Tensor> coordinate_median(const std::vector<at::Tensor>& inputs) {
  auto rows = stack_rows(inputs, "coordinate_median");
  if (!rows)
    return rows.error();
  auto sorted = std::get<0>(rows->sort(0));
  const auto n = static_cast<int64_t>(inputs.size());
  // torch::median returns the lower middle value; the symmetric median is the mean of both.
  auto med = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
  return like_input(med, inputs.front());
}

result<at::Tensor> trimmed_mean(const std::vector<at::Tensor>& inputs, double trim) {
  if (!(trim >= 0.0 && trim < 0.5))
    return fail(fmt::format("trimmed_mean: trim is {}, expected a value in [0, 0.5)", trim));
  auto rows = stack_rows(inputs, "trimmed_mean");
  if (!rows)
    return rows.error();
  const auto n = static_cast<int64_t>(inputs.size());
  const auto cut = static_cast<int64_t>(std::floor(trim * static_cast<double>(n)));
  auto sorted = std::get<0>(rows->sort(0));
  auto kept = sorted.narrow(0, cut, n - 2 * cut);
  return like_input(kept.mean(0), inputs.front());
}

result<centered_clip_outcome> centered_clip(const std::vector<at::Tensor>& inputs,
                                            const std::vector<double>& weights,
                                            const centered_clip_options& options) {
  if (!(options.tau > 0.0) || !std::isfinite(options.tau))
    return fail(fmt::format("centered_clip: tau is {}, expected a finite value > 0", options.tau));
  if (!(options.tolerance >= 0.0))
    return fail(fmt::format("centered_clip: tolerance is {}, expected >= 0", options.tolerance));
  auto rows = stack_rows(inputs, "centered_clip");
  if (!rows)
    return rows.error();
  auto w = weight_column(weights, inputs.size(), "centered_clip");
  if (!w)
    return w.error();
  const auto& g = *rows;
  const auto total = w->sum();
  // The median is a robust start: with a minority of outliers it lies among the honest inputs,
  // so the honest ones are unclipped from the first iteration on.
  auto sorted = std::get<0>(g.sort(0));
  const auto n = g.size(0);
  auto x = n % 2 == 1 ? sorted[n / 2].clone() : (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0;
  centered_clip_outcome out;
  for (std::size_t it = 0; it < options.max_iterations; ++it) {
    auto diff = g - x;                                   // [n, D]
    auto dist = diff.norm(2, {1}, true);                 // [n, 1]
    // min(1, τ/‖·‖) with ‖·‖ = 0 giving 1 (a point at x contributes nothing either way).
    auto scale = (options.tau / dist.clamp_min(1e-300)).clamp_max(1.0);
    auto step = (diff * scale * *w).sum(0) / total;
    x += step;
    out.iterations = it + 1;
    out.last_step = step.norm().item<double>();
    if (out.last_step <= options.tolerance) {
      out.converged = true;
      break;
    }
  }
  out.value = like_input(x, inputs.front());
  return out;
}

} // namespace starling::kernels
