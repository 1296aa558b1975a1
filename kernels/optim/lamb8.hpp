// LAMB with both moments in blockwise 8-bit codes (kernels/optim/quant8.hpp): the same update as
// kernels/optim/lamb.hpp, for about a quarter of its optimizer state. A tensor of
// `quant8_min_numel` elements or more keeps one byte per moment and element plus one fp32 scale
// per block of 256; smaller tensors keep fp32 moments. A step works through each tensor in
// chunks (dequantize, update, requantize), so no fp32 copy of the moments exists beyond one
// chunk, and computes the update from the moments as stored, so that a peer that downloads the
// codes continues exactly as the donor would have.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/optim/lamb.hpp"
#include "kernels/result.hpp"

namespace starling::kernels {

/// Per-parameter state of lamb8: fp32 moments (small tensors) or codes and scales.
struct lamb8_param_state : public torch::optim::OptimizerCloneableParamState<lamb8_param_state> {
  /// Steps taken with this parameter.
  TORCH_ARG(int64_t, step) = 0;
  /// Small tensors: the first moment (fp32, the parameter's shape); else undefined.
  TORCH_ARG(torch::Tensor, exp_avg);
  /// Small tensors: the second moment.
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  /// Large tensors: first-moment codes (uint8, flat, one per element).
  TORCH_ARG(torch::Tensor, m_codes);
  /// Large tensors: second-moment codes.
  TORCH_ARG(torch::Tensor, v_codes);
  /// Large tensors: first-moment block scales (fp32, one per 256 elements).
  TORCH_ARG(torch::Tensor, m_scales);
  /// Large tensors: second-moment block scales.
  TORCH_ARG(torch::Tensor, v_scales);

public:
  /// Whether the moments are held in 8 bits.
  bool quantized() const { return m_codes().defined(); }
};

/// LAMB with 8-bit moments as a `torch::optim::Optimizer`. Parameters of `quant8_min_numel`
/// elements or more must be contiguous fp32 CPU tensors (checked at the first step).
class lamb8 : public torch::optim::Optimizer {
public:
  /// An optimizer over `params` with `defaults` (LAMB's); throws `c10::Error` on invalid options.
  explicit lamb8(std::vector<torch::Tensor> params, lamb_options defaults = {});

  /// One update from the parameters' current gradients; parameters without a gradient are skipped.
  torch::Tensor step(LossClosure closure = nullptr) override;

  /// Writes the options and the state's byte form (`save_state`) into a LibTorch archive.
  void save(torch::serialize::OutputArchive& archive) const override;

  /// Reads what `save` wrote; throws `c10::Error` (changing nothing) on malformed state.
  void load(torch::serialize::InputArchive& archive) override;

  /// The state as codes, scales and step counts (`encode_lamb8_state`), in parameter order.
  std::string save_state() const;

  /// Loads untrusted bytes of `save_state` for parameters of the same sizes in the same order;
  /// fails with the reason, changing nothing, on malformed bytes or a size mismatch, or when
  /// `steps` is given and differs from the state's step counts.
  status load_state(const std::string& bytes, const std::vector<uint64_t>* steps = nullptr);

  /// Bytes the state holds in memory (codes, scales, fp32 moments of small tensors, steps).
  uint64_t state_bytes() const;

  /// The first and second moments of parameter `p` as fp32 tensors of its shape (dequantized
  /// where stored in 8 bits), and its step count; undefined tensors and 0 without state.
  std::tuple<torch::Tensor, torch::Tensor, int64_t> moments_of(const torch::Tensor& p) const;

  /// Steps taken with parameter `p` (0 without state).
  int64_t step_of(const torch::Tensor& p) const;

  /// Sets parameter `p`'s state to `first`, `second` (fp32, its element count, already
  /// validated: finite, second >= 0) after `step` steps (0 removes the state), quantizing them
  /// when `p` is large.
  void set_moments(const torch::Tensor& p, const torch::Tensor& first, const torch::Tensor& second,
                   int64_t step);

  /// The trust ratio applied to each parameter (in order) at the last step, for diagnostics.
  const std::vector<double>& last_trust_ratios() const noexcept { return trust_ratios_; }

private:
  std::vector<double> trust_ratios_;
};

} // namespace starling::kernels
