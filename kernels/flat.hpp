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

/// A module's buffers as a collaboration treats them: floating-point buffers (batch norm's
/// running statistics) travel flat in fp32 with the state and are averaged in state rounds;
/// integer buffers (`num_batches_tracked`) travel flat in int64 and come from the donor.
struct module_buffers {
  /// Floating-point buffers, in the module's order.
  std::vector<torch::Tensor> floats;
  /// Integer (and boolean) buffers, in the module's order.
  std::vector<torch::Tensor> integers;

  /// True when the module has no buffer at all.
  bool empty() const noexcept { return floats.empty() && integers.empty(); }
};

/// Sorts `buffers` (a module's `buffers(true)`) into floating-point and integer ones, keeping
/// their order; the tensors are the module's own (loading writes into them).
module_buffers split_buffers(const std::vector<torch::Tensor>& buffers);

/// The integer buffers concatenated in order into one 1-D int64 CPU tensor (a copy).
torch::Tensor flatten_integers(const std::vector<torch::Tensor>& buffers);

/// Copies the float buffers `floats` (fp32, 1-D) and integer buffers `integers` (int64, 1-D)
/// into `b`, all or nothing: fails, changing nothing, on a size or dtype that does not fit or a
/// non-finite float. An undefined tensor stands for an empty one.
status load_buffers(const module_buffers& b, const torch::Tensor& floats,
                    const torch::Tensor& integers);

} // namespace starling::kernels
