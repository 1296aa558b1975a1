// Parameters and gradients as one flat fp32 vector: the unit of state download and averaging.
#pragma once

#include "kernels/result.hpp"

#include "kernels/torch_fwd.hpp"

#include <cstdint>
#include <vector>

namespace starling::kernels {

/// Total number of elements of `tensors`.
int64_t total_numel(const std::vector<torch::Tensor>& tensors);

/// All `params` concatenated in order into one 1-D contiguous fp32 CPU tensor (a copy).
torch::Tensor flatten_parameters(const std::vector<torch::Tensor>& params);

/// Copies `flat` back into `params` in order (converting dtype and device); fails, changing
/// nothing, unless `flat` is 1-D floating point with exactly `total_numel(params)` elements.
status unflatten_parameters(const torch::Tensor& flat, const std::vector<torch::Tensor>& params);

/// All gradients of `params` concatenated like `flatten_parameters`; an absent gradient counts as
/// zeros, so the layout never depends on which parameters were used.
torch::Tensor flatten_gradients(const std::vector<torch::Tensor>& params);

/// Sets the gradients of `params` from `flat` (allocating absent ones); same checks as
/// `unflatten_parameters`.
status unflatten_gradients(const torch::Tensor& flat, const std::vector<torch::Tensor>& params);

} // namespace starling::kernels
