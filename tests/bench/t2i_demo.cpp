// The text-to-image demo reduced to one process (issue 43, item 4): the patch codebook, a
// Fashion-MNIST classifier, the built-in GPT trained on [caption | separator | 49 image tokens]
// sequences, then a grid of samples per caption and their quality. Prints a table of the phases'
// times and the three accuracies; writes codebook.bin, grid.png and quality.json into --out.
//
// usage: bench_t2i_demo [--images N] [--codes K] [--steps S] [--batch B] [--layers L]
//                       [--width W] [--samples N] [--top-k K] [--temperature T] [--seed S]
//                       [--out DIR]
// Defaults: 10000 training images, K = 256, 300 steps of 32 sequences, a 4-layer GPT of width
// 128, 8 samples per caption, top-k 0, temperature 1, out = the current folder.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <torch/torch.h>

#include "kernels/data/idx.hpp"
#include "kernels/models/gpt.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/seeded_hash.hpp"
#include "kernels/t2i/captions.hpp"
#include "kernels/t2i/codebook.hpp"
#include "kernels/t2i/png.hpp"
#include "kernels/t2i/quality.hpp"
#include "kernels/t2i/sampler.hpp"
#include "kernels/t2i/tokenizer.hpp"

namespace kernels = starling::kernels;

namespace {

template <class T>
T must(starling::result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "t2i_demo: %s: %s\n", what, r.error().what.c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

void must(const starling::status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "t2i_demo: %s: %s\n", what, s.what().c_str());
    std::exit(1);
  }
}

/// A phase's start: wall clock and this process's CPU time (the machine may be shared, so the
/// wall time alone can mislead).
struct stamp {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  std::clock_t cpu = std::clock();
};

/// One table row: the phase, its wall and CPU seconds since `t0`.
void row(const std::string& what, const stamp& t0) {
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0.wall).count();
  double cpu = static_cast<double>(std::clock() - t0.cpu) / CLOCKS_PER_SEC;
  fmt::print("{:<72} {:>8.2f} {:>8.2f}\n", what, wall, cpu);
}

} // namespace

int main(int argc, char** argv) {
  std::size_t images = 10000, codes = 256, samples = 8;
  int64_t steps = 300, batch = 32, layers = 4, width = 128, top_k = 0;
  double temperature = 1.0;
  uint64_t seed = 1;
  std::string out = ".";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--images")
      images = std::stoul(v);
    else if (k == "--codes")
      codes = std::stoul(v);
    else if (k == "--steps")
      steps = std::stol(v);
    else if (k == "--batch")
      batch = std::stol(v);
    else if (k == "--layers")
      layers = std::stol(v);
    else if (k == "--width")
      width = std::stol(v);
    else if (k == "--samples")
      samples = std::stoul(v);
    else if (k == "--top-k")
      top_k = std::stol(v);
    else if (k == "--temperature")
      temperature = std::stod(v);
    else if (k == "--seed")
      seed = std::stoull(v);
    else if (k == "--out")
      out = v;
    else {
      std::fprintf(stderr, "t2i_demo: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::filesystem::create_directories(out);
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  auto train = must(kernels::load_fashion_mnist(dir, true, images), "training images");
  auto test = must(kernels::load_fashion_mnist(dir, false, 1000), "test images");
  fmt::print("t2i demo: {} training images, {} test images, K = {}, threads = {}\n", train.count,
             test.count, codes, torch::get_num_threads());
  fmt::print("{:<72} {:>8} {:>8}\n", "phase", "wall s", "cpu s");

  stamp t0;
  kernels::codebook_options co;
  co.codes = codes;
  co.max_images = images;
  co.seed = seed;
  auto fit = must(kernels::fit_codebook(train, co), "codebook");
  row(fmt::format("codebook ({} patches, {} iterations, mse {:.5f}, {} re-seeded)", fit.patches,
                  fit.iterations, fit.mse, fit.reseeded),
      t0);
  auto& cb = fit.codebook;
  must(kernels::save_codebook(out + "/codebook.bin", cb), "codebook.bin");
  auto digest = kernels::codebook_digest(cb);

  t0 = stamp{};
  auto train_tokens =
      must(kernels::tokenize_images(cb, train.pixels, train.count, 28, 28), "tokens");
  auto test_tokens = must(kernels::tokenize_images(cb, test.pixels, test.count, 28, 28), "tokens");
  auto recon = must(kernels::detokenize_images(cb, test_tokens, 28, 28), "reconstruction");
  row("tokenize train + test, reconstruct test", t0);

  t0 = stamp{};
  kernels::classifier_options clo;
  clo.seed = seed;
  auto classifier = must(kernels::image_classifier::train(train, clo), "classifier");
  kernels::quality_report report;
  report.real = must(classifier.accuracy(test.pixels, test.labels), "accuracy");
  report.reconstruction = must(classifier.accuracy(recon, test.labels), "accuracy");
  report.test_images = test.count;
  report.codebook_digest = digest;
  row("classifier (3 epochs) and its two accuracies", t0);

  // Every training image as one sequence with its seeded phrasing.
  kernels::t2i_layout layout{static_cast<int64_t>(cb.size()), 49};
  auto len = layout.sequence_length();
  std::vector<int64_t> all;
  all.reserve(train.count * static_cast<std::size_t>(len));
  for (std::size_t i = 0; i < train.count; ++i) {
    auto caption =
        must(kernels::caption_for(train.labels[i], kernels::phrasing_for(seed, i)), "caption");
    std::vector<int64_t> img(train_tokens.begin() + static_cast<std::ptrdiff_t>(i * 49),
                             train_tokens.begin() + static_cast<std::ptrdiff_t>((i + 1) * 49));
    auto seq = must(kernels::joint_sequence(layout, caption, img), "sequence");
    all.insert(all.end(), seq.begin(), seq.end());
  }
  auto sequences =
      torch::tensor(all, torch::kLong).reshape({static_cast<int64_t>(train.count), len});

  kernels::gpt_config gc;
  gc.vocab = layout.vocab();
  gc.layers = layers;
  gc.width = width;
  gc.heads = 4;
  gc.seq_len = len - 1;
  gc.seed = seed;
  auto gpt = must(kernels::make_gpt(gc), "gpt");
  // The loss on the image positions only: the captions are given, not learned.
  kernels::use_image_loss(*gpt, layout);
  torch::optim::AdamW opt(gpt->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  t0 = stamp{};
  auto gen = kernels::seeded_generator(seed);
  double first_loss = 0, last_loss = 0;
  gpt->train();
  for (int64_t s = 0; s < steps; ++s) {
    auto ids = torch::randint(sequences.size(0), {batch}, gen, torch::kLong);
    auto seq = sequences.index_select(0, ids);
    auto input = seq.slice(1, 0, len - 1), target = seq.slice(1, 1);
    auto loss = gpt->compute(input, target, static_cast<uint64_t>(s));
    opt.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(gpt->parameters(), 1.0);
    opt.step();
    auto l = loss.item<double>();
    if (s == 0)
      first_loss = l;
    if (s + 10 >= steps)
      last_loss += l / static_cast<double>(std::min<int64_t>(10, steps));
  }
  row(fmt::format("GPT {} steps × {} (loss {:.3f} → {:.3f})", steps, batch, first_loss, last_loss),
      t0);

  t0 = stamp{};
  std::vector<std::vector<float>> rows;
  for (std::size_t c = 0; c < kernels::caption_classes; ++c) {
    auto caption = must(kernels::caption_for(c, 0), "caption");
    kernels::sampling_options so;
    so.temperature = temperature;
    so.top_k = top_k;
    so.seed = kernels::splitmix64_combine(seed, c);
    auto tokens = must(kernels::sample_image_tokens(*gpt, layout, caption, samples, so), "sample");
    auto pixels = must(kernels::detokenize_images(cb, tokens, 28, 28), "images");
    std::vector<uint8_t> labels(samples, static_cast<uint8_t>(c));
    auto acc = must(classifier.accuracy(pixels, labels), "accuracy");
    report.generated.push_back({caption, c, samples, acc});
    rows.push_back(std::move(pixels));
  }
  auto grid = must(kernels::image_grid(rows, 28, 28), "grid");
  must(kernels::write_png_gray(out + "/grid.png", grid), "grid.png");
  must(kernels::write_quality_json(out + "/quality.json", report), "quality.json");
  row(fmt::format("sample {} per caption, grid, quality", samples), t0);
  fmt::print("accuracy: real {:.3f}, reconstruction (ceiling) {:.3f}, generated {:.3f}\n",
             report.real, report.reconstruction, report.generated_mean());
  for (auto& g : report.generated)
    fmt::print("  {:<36} {:.3f}\n", g.caption, g.accuracy);
  fmt::print("codebook digest {}\nwrote {}/grid.png, {}/quality.json, {}/codebook.bin\n", digest,
             out, out, out);
  return 0;
}
