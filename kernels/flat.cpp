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

} // namespace starling::kernels
