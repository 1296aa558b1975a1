#include "kernels/t2i/t2i_source.hpp"

#include <torch/torch.h>

#include <fmt/format.h>

#include <chrono>
#include <cstring>

namespace starling::kernels {

namespace {

/// An image split as `opts.images` names it (the synthetic stand-in when allowed and absent).
result<std::shared_ptr<const image_set>> t2i_load_split(const idx_source_options& o, bool train,
                                                        std::size_t max_items) {
  if (o.synthetic_when_absent && !fashion_mnist_present(o.dir)) {
    const std::size_t count = max_items > 0 ? max_items : train ? 60000 : 10000;
    return std::make_shared<const image_set>(
        make_synthetic_images(count, 28, 10, o.synthetic_seed, train ? 0 : 1));
  }
  auto set = load_fashion_mnist(o.dir, train, max_items);
  if (!set)
    return set.error();
  return std::make_shared<const image_set>(std::move(*set));
}

bool t2i_is_hex_digest(const std::string& s) {
  if (s.size() != 64)
    return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  return true;
}

} // namespace

status validate(const t2i_data_options& opts) {
  auto& c = opts.codebook;
  if (c.codes < 2 || c.codes > 4096)
    return fail(fmt::format("the codebook needs 2..4096 codes, got {}", c.codes));
  if (c.patch < 1 || 28 % c.patch != 0)
    return fail(fmt::format("the patch side must divide 28 (1, 2, 4, 7, 14, 28), got {}", c.patch));
  if (c.max_iterations < 1 || c.max_iterations > 1000)
    return fail(fmt::format("codebook iterations must be in [1, 1000], got {}", c.max_iterations));
  if (!opts.codebook_digest.empty() && !t2i_is_hex_digest(opts.codebook_digest))
    return fail(fmt::format("codebook_digest must be 64 lowercase hex digits (what a run prints "
                            "as 'codebook digest'), got '{}'",
                            opts.codebook_digest));
  return {};
}

t2i_source::t2i_source(std::shared_ptr<const image_set> images,
                       std::shared_ptr<const patch_codebook> codebook, t2i_layout layout,
                       uint64_t caption_seed)
    : images_(std::move(images)),
      codebook_(std::move(codebook)),
      layout_(layout),
      caption_seed_(caption_seed) {}

result<std::shared_ptr<const t2i_source>>
t2i_source::make(std::shared_ptr<const image_set> images,
                 std::shared_ptr<const patch_codebook> codebook, uint64_t caption_seed) {
  if (images == nullptr || images->count == 0 || images->pixels_per_image() == 0 ||
      images->pixels.size() != images->count * images->pixels_per_image() ||
      images->labels.size() != images->count)
    return fail("captioned images: no images, or pixels and labels that do not match the count");
  if (codebook == nullptr)
    return fail("captioned images: no codebook");
  if (auto st = validate(*codebook); !st)
    return fail(st.what());
  if (images->rows % codebook->patch != 0 || images->cols % codebook->patch != 0)
    return fail(fmt::format("captioned images: patch side {} does not tile {}x{} images",
                            codebook->patch, images->rows, images->cols));
  t2i_layout layout;
  layout.codes = static_cast<int64_t>(codebook->size());
  layout.image_tokens =
      static_cast<int64_t>(tokens_per_image(*codebook, images->rows, images->cols));
  return std::shared_ptr<const t2i_source>(
      new t2i_source(std::move(images), std::move(codebook), layout, caption_seed));
}

std::string t2i_source::describe() const {
  return fmt::format("captioned images {} ({} of {}x{} as {} tokens, {} codes)", images_->source,
                     images_->count, images_->rows, images_->cols, layout_.image_tokens,
                     layout_.codes);
}

sample_shape t2i_source::shape() const {
  return {{layout_.sequence_length() - 1}, layout_.vocab()};
}

result<sample_batch> t2i_source::batch(const std::vector<uint64_t>& ids) const {
  const auto p = images_->pixels_per_image();
  std::vector<float> pixels(ids.size() * p);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] >= images_->count)
      return fail(fmt::format("captioned images {}: sample {} requested, it has {} images",
                              images_->source, ids[i], images_->count));
    std::memcpy(pixels.data() + i * p, images_->pixels.data() + ids[i] * p, p * sizeof(float));
  }
  auto tokens = tokenize_images(*codebook_, pixels, ids.size(), images_->rows, images_->cols);
  if (!tokens)
    return tokens.error();
  const auto n = layout_.sequence_length();
  const auto per = static_cast<std::size_t>(layout_.image_tokens);
  auto seq = torch::empty({static_cast<int64_t>(ids.size()), n}, torch::kLong);
  auto* out = seq.data_ptr<int64_t>();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto caption = caption_for(images_->labels[ids[i]], phrasing_for(caption_seed_, ids[i]));
    if (!caption)
      return caption.error();
    std::vector<int64_t> image(tokens->begin() + static_cast<std::ptrdiff_t>(i * per),
                               tokens->begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
    auto s = joint_sequence(layout_, *caption, image);
    if (!s)
      return s.error();
    std::memcpy(out + static_cast<int64_t>(i) * n, s->data(), s->size() * sizeof(int64_t));
  }
  return sample_batch{seq.slice(1, 0, n - 1).contiguous(), seq.slice(1, 1).contiguous()};
}

result<t2i_split> make_t2i_split(const t2i_data_options& opts) {
  if (auto st = validate(opts); !st)
    return fail(st.what());
  auto train = t2i_load_split(opts.images, true, opts.images.max_items);
  if (!train)
    return train.error();
  auto test = t2i_load_split(opts.images, false, opts.eval_images);
  if (!test)
    return test.error();
  t2i_split out;
  auto began = std::chrono::steady_clock::now();
  auto fit = fit_codebook(**train, opts.codebook);
  if (!fit)
    return fail(fmt::format("the codebook: {}", fit.error().what));
  out.fit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  out.digest = codebook_digest(fit->codebook);
  if (!opts.codebook_digest.empty() && out.digest != opts.codebook_digest)
    return fail(fmt::format(
        "the codebook fit here has digest {}, the run's file pins {}: this process fit it from "
        "other images, another seed or another LibTorch build (the same data, seed and build give "
        "the same codebook); remove codebook_digest to train with this one alone, or run the "
        "run's build on the same data",
        out.digest, opts.codebook_digest));
  auto cb = std::make_shared<const patch_codebook>(fit->codebook);
  out.fit = std::move(*fit);
  auto tr = t2i_source::make(*train, cb, opts.caption_seed);
  if (!tr)
    return tr.error();
  auto ev = t2i_source::make(*test, cb, opts.caption_seed);
  if (!ev)
    return ev.error();
  out.train = *tr;
  out.eval = *ev;
  return out;
}

std::string cache_key(const t2i_data_options& opts) {
  auto& i = opts.images;
  auto& c = opts.codebook;
  return fmt::format("t2i|{} {} {} {}|{} {} {} {} {} {} {}|{} {} {}", i.dir, i.max_items,
                     i.synthetic_when_absent, i.synthetic_seed, c.codes, c.patch, c.max_images,
                     c.seeding_pool, c.max_iterations, c.tolerance, c.seed, opts.codebook_digest,
                     opts.caption_seed, opts.eval_images);
}

} // namespace starling::kernels
