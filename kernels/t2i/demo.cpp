#include "kernels/t2i/demo.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/models/stage_module.hpp"
#include "kernels/seeded_hash.hpp"
#include "kernels/t2i/png.hpp"
#include "kernels/t2i/sampler.hpp"

namespace starling::kernels {

namespace {

double t2i_demo_secs(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

} // namespace

status validate(const t2i_demo_options& o) {
  if (o.grid_samples < 1 || o.grid_samples > 64)
    return fail(fmt::format("grid_samples must be in [1, 64], got {}", o.grid_samples));
  if (o.quality_samples < 1 || o.quality_samples > 10000)
    return fail(fmt::format("quality_samples must be in [1, 10000], got {}", o.quality_samples));
  if (!(o.temperature >= 0) || !std::isfinite(o.temperature))
    return fail(fmt::format("temperature must be finite and >= 0, got {}", o.temperature));
  if (o.top_k < 0)
    return fail(fmt::format("top_k must be >= 0, got {}", o.top_k));
  if (o.test_images < 1)
    return fail("test_images must be at least 1");
  if (o.classifier.epochs < 1 || o.classifier.batch < 1 || o.classifier.hidden < 1 ||
      !(o.classifier.learning_rate > 0))
    return fail("the classifier needs epochs, batch, hidden and learning rate above 0");
  return {};
}

result<t2i_demo_outputs> write_t2i_demo(stage_module& gpt, const t2i_source& train,
                                        const t2i_source& test, const std::string& digest,
                                        const t2i_demo_options& o, const std::string& dir) {
  if (auto st = validate(o); !st)
    return fail(st.what());
  t2i_demo_outputs out;
  auto& report = out.report;
  report.codebook_digest = digest;
  auto began = std::chrono::steady_clock::now();
  auto classifier = image_classifier::train(train.images(), o.classifier);
  if (!classifier)
    return fail(fmt::format("the classifier: {}", classifier.error().what));

  // Real test images and their codebook reconstructions: the ceiling of generated images.
  auto& t = test.images();
  auto n = std::min(o.test_images, t.count);
  auto per = t.pixels_per_image();
  std::vector<float> real(t.pixels.begin(),
                          t.pixels.begin() + static_cast<std::ptrdiff_t>(n * per));
  std::vector<uint8_t> labels(t.labels.begin(), t.labels.begin() + static_cast<std::ptrdiff_t>(n));
  auto& cb = train.codebook();
  auto tokens = tokenize_images(cb, real, n, t.rows, t.cols);
  if (!tokens)
    return tokens.error();
  auto recon = detokenize_images(cb, *tokens, t.rows, t.cols);
  if (!recon)
    return recon.error();
  auto acc_real = classifier->accuracy(real, labels);
  auto acc_recon = classifier->accuracy(*recon, labels);
  if (!acc_real || !acc_recon)
    return fail("the classifier cannot judge the test images");
  report.real = *acc_real;
  report.reconstruction = *acc_recon;
  report.test_images = n;
  out.classifier_seconds = t2i_demo_secs(began);

  began = std::chrono::steady_clock::now();
  auto& layout = train.layout();
  auto drawn = std::max(o.grid_samples, o.quality_samples);
  std::vector<std::string> captions;
  for (std::size_t c = 0; c < caption_classes; ++c) {
    auto caption = caption_for(c, 0);
    if (!caption)
      return caption.error();
    captions.push_back(*caption);
  }
  sampling_options so;
  so.temperature = o.temperature;
  so.top_k = o.top_k;
  so.seed = splitmix64_combine(o.seed, 0x7215A);
  // Every caption's samples in one batch: 49 forward passes in all.
  auto drawn_tokens = sample_captions(gpt, layout, captions, drawn, so);
  if (!drawn_tokens)
    return fail(fmt::format("sampling: {}", drawn_tokens.error().what));
  std::vector<std::vector<float>> rows;
  for (std::size_t c = 0; c < caption_classes; ++c) {
    auto& caption = captions[c];
    auto images = detokenize_images(cb, (*drawn_tokens)[c], t.rows, t.cols);
    if (!images)
      return images.error();
    std::vector<float> judged(
        images->begin(), images->begin() + static_cast<std::ptrdiff_t>(o.quality_samples * per));
    auto acc = classifier->accuracy(
        judged, std::vector<uint8_t>(o.quality_samples, static_cast<uint8_t>(c)));
    if (!acc)
      return acc.error();
    report.generated.push_back({caption, c, o.quality_samples, *acc});
    rows.emplace_back(images->begin(),
                      images->begin() + static_cast<std::ptrdiff_t>(o.grid_samples * per));
  }
  out.sampling_seconds = t2i_demo_secs(began);
  auto grid = image_grid(rows, t.rows, t.cols);
  if (!grid)
    return grid.error();
  out.grid_png = dir + "/grid.png";
  out.quality_json = dir + "/quality.json";
  if (auto st = write_png_gray(out.grid_png, *grid); !st)
    return fail(st.what());
  if (auto st = write_quality_json(out.quality_json, report); !st)
    return fail(st.what());
  return out;
}

} // namespace starling::kernels
