#include "kernels/t2i/sampler.hpp"

#include <torch/torch.h>

#include <fmt/format.h>

#include <cmath>

#include "kernels/models/stage_module.hpp"

namespace starling::kernels {

result<std::vector<int64_t>> sample_image_tokens(stage_module& gpt, const t2i_layout& layout,
                                                 const std::string& caption, std::size_t samples,
                                                 const sampling_options& opts) {
  auto all = sample_captions(gpt, layout, {caption}, samples, opts);
  if (!all)
    return all.error();
  return std::move(all->front());
}

result<std::vector<std::vector<int64_t>>> sample_captions(stage_module& gpt,
                                                          const t2i_layout& layout,
                                                          const std::vector<std::string>& captions,
                                                          std::size_t samples,
                                                          const sampling_options& opts) {
  if (!gpt.is_first() || !gpt.is_last())
    return fail("sampling needs the whole model (a stage holding the input layer and the head)");
  if (samples == 0)
    return fail("sampling needs at least one sample");
  if (!(opts.temperature >= 0.0) || !std::isfinite(opts.temperature))
    return fail(fmt::format("temperature must be finite and >= 0, got {}", opts.temperature));
  if (opts.top_k < 0)
    return fail(fmt::format("top_k must be >= 0, got {}", opts.top_k));
  if (captions.empty())
    return fail("sampling needs at least one caption");
  std::vector<torch::Tensor> prompts;
  for (auto& caption : captions) {
    auto prompt = prompt_tokens(layout, caption);
    if (!prompt)
      return fail(prompt.error().what);
    prompts.push_back(torch::tensor(*prompt, torch::kLong).unsqueeze(0));
  }
  torch::NoGradGuard no_grad;
  gpt.eval();
  auto n = static_cast<int64_t>(samples);
  auto seq = torch::cat(prompts, 0).repeat_interleave(n, 0);
  auto gen = seeded_generator(opts.seed);
  for (int64_t i = 0; i < layout.image_tokens; ++i) {
    // The model's own input check (vocabulary, sequence length) turns a mismatch into a failure.
    torch::Tensor logits;
    try {
      logits = gpt.predict(seq);
    } catch (const c10::Error& e) {
      return fail(fmt::format("the model cannot take a {}-token sequence: {}", seq.size(1),
                              e.what_without_backtrace()));
    }
    if (logits.dim() != 3 || logits.size(-1) != layout.vocab())
      return fail(fmt::format("the model's vocabulary is {}, the layout's {}", logits.size(-1),
                              layout.vocab()));
    auto last = logits.select(1, -1).slice(1, 0, layout.codes);
    torch::Tensor next;
    if (opts.temperature == 0.0) {
      next = last.argmax(1, true);
    } else {
      last = last / opts.temperature;
      if (opts.top_k > 0 && opts.top_k < layout.codes) {
        auto kth = std::get<0>(last.topk(opts.top_k, 1)).select(1, opts.top_k - 1).unsqueeze(1);
        last = last.masked_fill(last < kth, -std::numeric_limits<float>::infinity());
      }
      next = torch::multinomial(torch::softmax(last, 1), 1, false, gen);
    }
    seq = torch::cat({seq, next}, 1);
  }
  auto image = seq.slice(1, layout.prompt_length()).contiguous();
  std::vector<std::vector<int64_t>> out;
  auto per = n * layout.image_tokens;
  for (std::size_t c = 0; c < captions.size(); ++c) {
    auto* first = image.data_ptr<int64_t>() + static_cast<int64_t>(c) * per;
    out.emplace_back(first, first + per);
  }
  return out;
}

void use_image_loss(stage_module& gpt, const t2i_layout& layout) {
  auto from = layout.prompt_length() - 1;
  auto length = layout.sequence_length() - 1;
  auto vocab = layout.vocab();
  stage_loss l;
  l.compute = [from](const torch::Tensor& output, const torch::Tensor& targets) {
    return mean_cross_entropy(output.slice(1, from), targets.slice(1, from));
  };
  l.check = [length, vocab](const torch::Tensor& input, const torch::Tensor& targets) -> status {
    if (targets.scalar_type() != torch::kLong || targets.dim() != 2 ||
        targets.sizes() != input.sizes() || targets.size(1) != length)
      return fail(fmt::format("targets must be int64 [B, {}] like the input, got {} {}", length,
                              c10::toString(targets.scalar_type()), c10::str(targets.sizes())));
    if (targets.numel() > 0 &&
        (targets.min().item<int64_t>() < 0 || targets.max().item<int64_t>() >= vocab))
      return fail(fmt::format("targets must lie in [0, {})", vocab));
    return {};
  };
  gpt.set_loss(std::move(l));
}

} // namespace starling::kernels
