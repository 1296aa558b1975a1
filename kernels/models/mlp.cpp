#include "kernels/models/mlp.hpp"

#include <fmt/format.h>

#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

namespace {

/// Linear layer (optionally followed by tanh) initialized from its own seed.
class mlp_layer : public stage_layer {
public:
  mlp_layer(int64_t in, int64_t out, bool activate, uint64_t seed) : in_(in), activate_(activate) {
    linear_ = register_module("linear", torch::nn::Linear(in, out));
    torch::NoGradGuard no_grad;
    auto gen = seeded_generator(seed);
    // Xavier-like scale keeps tanh out of saturation at any width.
    linear_->weight.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(in)), gen);
    linear_->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    auto y = linear_->forward(x);
    return activate_ ? torch::tanh(y) : y;
  }

  status check_input(const torch::Tensor& x) const override {
    if (!x.is_floating_point() || x.dim() != 2 || x.size(1) != in_)
      return fail(fmt::format("expected float input [B, {}], got {} {}", in_,
                              c10::toString(x.scalar_type()), c10::str(x.sizes())));
    return {};
  }

private:
  int64_t in_;
  bool activate_;
  torch::nn::Linear linear_{nullptr};
};

} // namespace

result<std::shared_ptr<stage_module>> make_mlp_stage(const mlp_config& cfg, int64_t begin,
                                                     int64_t end) {
  if (cfg.inputs < 1 || cfg.width < 1 || cfg.layers < 1 || cfg.classes < 1)
    return fail(fmt::format("mlp sizes must be positive: inputs {}, width {}, layers {}, "
                            "classes {}",
                            cfg.inputs, cfg.width, cfg.layers, cfg.classes));
  if (begin < 0 || end > cfg.layers || begin >= end)
    return fail(fmt::format("stage blocks [{}, {}) are not a non-empty range of 0..{}", begin, end,
                            cfg.layers));
  std::shared_ptr<stage_layer> input;
  if (begin == 0)
    input = std::make_shared<mlp_layer>(cfg.inputs, cfg.width, true,
                                        splitmix64_combine_two_rounds(cfg.seed, 1));
  std::vector<std::shared_ptr<stage_layer>> blocks;
  for (auto i = begin; i < end; ++i)
    blocks.push_back(std::make_shared<mlp_layer>(cfg.width, cfg.width, true,
                                                 cfg.seed + static_cast<uint64_t>(i)));
  std::shared_ptr<stage_layer> head;
  if (end == cfg.layers)
    head = std::make_shared<mlp_layer>(cfg.width, cfg.classes, false,
                                       splitmix64_combine_two_rounds(cfg.seed, 2));
  return std::make_shared<stage_module>(cfg.layers, begin, std::move(input), std::move(blocks),
                                        std::move(head));
}

result<std::shared_ptr<stage_module>> make_mlp(const mlp_config& cfg) {
  return make_mlp_stage(cfg, 0, cfg.layers);
}

} // namespace starling::kernels
