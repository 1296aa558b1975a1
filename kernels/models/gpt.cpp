#include "kernels/models/gpt.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

namespace {

// Tags of splitmix64_combine: distinct, well-spread seeds for the embedding and the head.
constexpr uint64_t embedding_tag = 0xE3B;
constexpr uint64_t head_tag = 0x4EAD;

void init_linear(torch::nn::Linear& l, double std, at::Generator& gen) {
  l->weight.normal_(0.0, std, gen);
  if (l->bias.defined())
    l->bias.zero_();
}

status check_activations(const torch::Tensor& x, int64_t width, int64_t seq_len) {
  if (!x.is_floating_point() || x.dim() != 3 || x.size(2) != width || x.size(1) > seq_len)
    return fail(fmt::format("expected float activations [B, T<={}, {}], got {} {}", seq_len, width,
                            c10::toString(x.scalar_type()), c10::str(x.sizes())));
  return {};
}

/// Token + position embedding.
class gpt_embedding : public stage_layer {
public:
  explicit gpt_embedding(const gpt_config& cfg) : cfg_(cfg) {
    tokens_ = register_module("tokens", torch::nn::Embedding(cfg.vocab, cfg.width));
    positions_ = register_module("positions", torch::nn::Embedding(cfg.seq_len, cfg.width));
    torch::NoGradGuard no_grad;
    auto gen = seeded_generator(splitmix64_combine(cfg.seed, embedding_tag));
    tokens_->weight.normal_(0.0, 0.02, gen);
    positions_->weight.normal_(0.0, 0.02, gen);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    auto pos = torch::arange(x.size(1), x.options().dtype(torch::kLong));
    auto h = tokens_->forward(x) + positions_->forward(pos).unsqueeze(0);
    return dropout(h, cfg_.dropout);
  }

  status check_input(const torch::Tensor& x) const override {
    if (x.scalar_type() != torch::kLong || x.dim() != 2 || x.size(1) > cfg_.seq_len ||
        x.size(1) < 1)
      return fail(fmt::format("expected int64 tokens [B, 1..{}], got {} {}", cfg_.seq_len,
                              c10::toString(x.scalar_type()), c10::str(x.sizes())));
    if (x.numel() > 0 && (x.min().item<int64_t>() < 0 || x.max().item<int64_t>() >= cfg_.vocab))
      return fail(fmt::format("tokens must lie in [0, {})", cfg_.vocab));
    return {};
  }

private:
  gpt_config cfg_;
  torch::nn::Embedding tokens_{nullptr};
  torch::nn::Embedding positions_{nullptr};
};

/// Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)).
class gpt_block : public stage_layer {
public:
  gpt_block(const gpt_config& cfg, int64_t index) : cfg_(cfg) {
    auto d = cfg.width;
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    qkv_ = register_module("qkv", torch::nn::Linear(d, 3 * d));
    proj_ = register_module("proj", torch::nn::Linear(d, d));
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d})));
    fc_ = register_module("fc", torch::nn::Linear(d, 4 * d));
    out_ = register_module("out", torch::nn::Linear(4 * d, d));
    torch::NoGradGuard no_grad;
    auto gen = seeded_generator(cfg.seed + static_cast<uint64_t>(index));
    // GPT-2: residual projections scaled down by depth so the residual stream's variance stays
    // bounded as blocks are added.
    auto residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(cfg.layers));
    init_linear(qkv_, 0.02, gen);
    init_linear(proj_, residual_std, gen);
    init_linear(fc_, 0.02, gen);
    init_linear(out_, residual_std, gen);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    auto h = x + dropout(proj_->forward(attention(ln1_->forward(x))), cfg_.dropout);
    auto m = out_->forward(torch::gelu(fc_->forward(ln2_->forward(h))));
    return h + dropout(m, cfg_.dropout);
  }

  status check_input(const torch::Tensor& x) const override {
    return check_activations(x, cfg_.width, cfg_.seq_len);
  }

private:
  torch::Tensor attention(const torch::Tensor& x) {
    auto b = x.size(0), t = x.size(1), d = x.size(2), h = cfg_.heads, hd = d / h;
    auto qkv = qkv_->forward(x).reshape({b, t, 3, h, hd}).permute({2, 0, 3, 1, 4});
    auto q = qkv[0], k = qkv[1], v = qkv[2]; // each [B, H, T, hd]
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
    auto future = torch::ones({t, t}, x.options().dtype(torch::kBool)).triu(1);
    scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
    auto weights = dropout(torch::softmax(scores, -1), cfg_.dropout);
    return torch::matmul(weights, v).transpose(1, 2).reshape({b, t, d});
  }

  gpt_config cfg_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, out_{nullptr};
};

/// Final norm and the projection to byte logits.
class gpt_head : public stage_layer {
public:
  explicit gpt_head(const gpt_config& cfg) : cfg_(cfg) {
    ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.width})));
    logits_ = register_module(
        "logits", torch::nn::Linear(torch::nn::LinearOptions(cfg.width, cfg.vocab).bias(false)));
    torch::NoGradGuard no_grad;
    auto gen = seeded_generator(splitmix64_combine(cfg.seed, head_tag));
    logits_->weight.normal_(0.0, 0.02, gen);
  }

  torch::Tensor forward(const torch::Tensor& x) override {
    return logits_->forward(ln_->forward(x));
  }

  status check_input(const torch::Tensor& x) const override {
    return check_activations(x, cfg_.width, cfg_.seq_len);
  }

private:
  gpt_config cfg_;
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear logits_{nullptr};
};

} // namespace

status validate(const gpt_config& cfg) {
  if (cfg.vocab < 1 || cfg.layers < 1 || cfg.width < 1 || cfg.heads < 1 || cfg.seq_len < 1)
    return fail(fmt::format("gpt sizes must be positive: vocab {}, layers {}, width {}, heads {}, "
                            "seq_len {}",
                            cfg.vocab, cfg.layers, cfg.width, cfg.heads, cfg.seq_len));
  if (cfg.width % cfg.heads != 0)
    return fail(fmt::format("gpt heads ({}) must divide width ({})", cfg.heads, cfg.width));
  if (!(cfg.dropout >= 0.0 && cfg.dropout < 1.0))
    return fail(fmt::format("gpt dropout must be in [0, 1), got {}", cfg.dropout));
  return {};
}

result<std::shared_ptr<stage_module>> make_gpt_stage(const gpt_config& cfg, int64_t begin,
                                                     int64_t end) {
  if (auto st = validate(cfg); !st)
    return fail(st.what());
  if (begin < 0 || end > cfg.layers || begin >= end)
    return fail(fmt::format("stage blocks [{}, {}) are not a non-empty range of 0..{}", begin, end,
                            cfg.layers));
  std::shared_ptr<stage_layer> input;
  if (begin == 0)
    input = std::make_shared<gpt_embedding>(cfg);
  std::vector<std::shared_ptr<stage_layer>> blocks;
  for (auto i = begin; i < end; ++i)
    blocks.push_back(std::make_shared<gpt_block>(cfg, i));
  std::shared_ptr<stage_layer> head;
  if (end == cfg.layers)
    head = std::make_shared<gpt_head>(cfg);
  return std::make_shared<stage_module>(cfg.layers, begin, std::move(input), std::move(blocks),
                                        std::move(head));
}

result<std::shared_ptr<stage_module>> make_gpt(const gpt_config& cfg) {
  return make_gpt_stage(cfg, 0, cfg.layers);
}

} // namespace starling::kernels
