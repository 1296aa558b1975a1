#include "kernels/flat.hpp"

#include <torch/torch.h>
#include <fmt/format.h>

namespace starling::kernels {

namespace {

torch::Tensor flat_cpu(const torch::Tensor& t) {
  return t.detach().reshape({-1}).to(torch::kCPU, torch::kFloat);
}

status check_flat(const torch::Tensor& flat, const std::vector<torch::Tensor>& params) {
  auto n = total_numel(params);
  if (!flat.defined() || flat.dim() != 1 || !flat.is_floating_point() || flat.numel() != n)
    return fail(fmt::format("expected a 1-D float vector of {} elements, got {}", n,
                            flat.defined() ? fmt::format("{} {}", c10::toString(flat.scalar_type()),
                                                         c10::str(flat.sizes()))
                                           : std::string{"undefined"}));
  return {};
}

} // namespace

int64_t total_numel(const std::vector<torch::Tensor>& tensors) {
  int64_t n = 0;
  for (auto& t : tensors)
    n += t.numel();
  return n;
}

torch::Tensor flatten_parameters(const std::vector<torch::Tensor>& params) {
  if (params.empty())
    return torch::zeros({0}, torch::kFloat);
  std::vector<torch::Tensor> parts;
  parts.reserve(params.size());
  for (auto& p : params)
    parts.push_back(flat_cpu(p));
  return torch::cat(parts);
}

status unflatten_parameters(const torch::Tensor& flat, const std::vector<torch::Tensor>& params) {
  if (auto st = check_flat(flat, params); !st)
    return st;
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto& p : params) {
    auto n = p.numel();
    p.copy_(flat.narrow(0, at, n).reshape(p.sizes()));
    at += n;
  }
  return {};
}

torch::Tensor flatten_gradients(const std::vector<torch::Tensor>& params) {
  if (params.empty())
    return torch::zeros({0}, torch::kFloat);
  std::vector<torch::Tensor> parts;
  parts.reserve(params.size());
  for (auto& p : params) {
    auto& g = p.grad();
    parts.push_back(g.defined() ? flat_cpu(g) : torch::zeros({p.numel()}, torch::kFloat));
  }
  return torch::cat(parts);
}

status unflatten_gradients(const torch::Tensor& flat, const std::vector<torch::Tensor>& params) {
  if (auto st = check_flat(flat, params); !st)
    return st;
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto& p : params) {
    auto n = p.numel();
    auto part = flat.narrow(0, at, n).reshape(p.sizes()).to(p.options());
    if (p.grad().defined())
      p.mutable_grad().copy_(part);
    else
      p.mutable_grad() = part.clone();
    at += n;
  }
  return {};
}

module_buffers split_buffers(const std::vector<torch::Tensor>& buffers) {
  module_buffers out;
  for (const auto& b : buffers)
    (b.is_floating_point() ? out.floats : out.integers).push_back(b);
  return out;
}

torch::Tensor flatten_integers(const std::vector<torch::Tensor>& buffers) {
  if (buffers.empty())
    return torch::zeros({0}, torch::kLong);
  std::vector<torch::Tensor> parts;
  parts.reserve(buffers.size());
  for (const auto& b : buffers)
    parts.push_back(b.detach().to(torch::kCPU, torch::kLong).reshape({-1}));
  return torch::cat(parts).contiguous();
}

status load_buffers(const module_buffers& b, const torch::Tensor& floats,
                    const torch::Tensor& integers) {
  auto nf = total_numel(b.floats);
  auto ni = total_numel(b.integers);
  auto numel = [](const torch::Tensor& t) { return t.defined() ? t.numel() : int64_t{0}; };
  if (numel(floats) != nf || numel(integers) != ni)
    return fail(fmt::format("the state carries {} float and {} integer buffer elements, the model "
                            "has {} and {}",
                            numel(floats), numel(integers), nf, ni));
  if (nf > 0 && (floats.dim() != 1 || !floats.is_floating_point()))
    return fail("float buffers must be a flat floating-point vector");
  if (ni > 0 && (integers.dim() != 1 || integers.scalar_type() != torch::kLong))
    return fail("integer buffers must be a flat int64 vector");
  torch::NoGradGuard no_grad;
  if (nf > 0 && !torch::isfinite(floats).all().item<bool>())
    return fail("float buffers are not finite");
  if (nf > 0)
    (void)unflatten_parameters(floats, b.floats); // fits: checked above
  int64_t at = 0;
  for (const auto& t : b.integers) {
    auto n = t.numel();
    t.copy_(integers.narrow(0, at, n).reshape(t.sizes()));
    at += n;
  }
  return {};
}

} // namespace starling::kernels
