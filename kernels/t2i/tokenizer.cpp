#include "kernels/t2i/tokenizer.hpp"

#include <torch/torch.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernels/models/stage_module.hpp"
#include "kernels/seeded_hash.hpp"

namespace starling::kernels {

namespace {

/// Rows of the distance computation at a time: 65536 × K floats stays well under a gigabyte.
constexpr int64_t chunk_rows = 65536;

status check_grid(uint32_t patch, std::size_t rows, std::size_t cols) {
  if (patch == 0 || rows == 0 || cols == 0 || rows % patch != 0 || cols % patch != 0)
    return fail(
        fmt::format("patch side {} must divide the image's {}×{} pixels", patch, rows, cols));
  return {};
}

/// [count·grid, patch²] patches of [count, rows, cols] images, patch-grid row-major per image.
torch::Tensor to_patches(const torch::Tensor& images, int64_t patch) {
  auto n = images.size(0), gr = images.size(1) / patch, gc = images.size(2) / patch;
  return images.reshape({n, gr, patch, gc, patch})
      .permute({0, 1, 3, 2, 4})
      .reshape({n * gr * gc, patch * patch})
      .contiguous();
}

/// Per row of `x`, the nearest row of `codes` and its squared distance, in chunks; `x_norms`
/// (|x|² per row) when the caller has them (Lloyd iterations reuse them).
std::pair<torch::Tensor, torch::Tensor> nearest(const torch::Tensor& x, const torch::Tensor& codes,
                                                torch::Tensor x_norms = {}) {
  if (!x_norms.defined())
    x_norms = x.pow(2).sum(1);
  auto code_norms = codes.pow(2).sum(1);
  auto n = x.size(0);
  auto index = torch::empty({n}, torch::kLong);
  auto dist = torch::empty({n}, torch::kFloat);
  for (int64_t begin = 0; begin < n; begin += chunk_rows) {
    auto end = std::min(n, begin + chunk_rows);
    auto xs = x.slice(0, begin, end);
    // |x - c|² = |x|² - 2 x·c + |c|²; |x|² does not change the argmin, added after.
    auto d = torch::addmm(code_norms.unsqueeze(0), xs, codes.t(), 1.0, -2.0);
    auto [best, arg] = d.min(1);
    index.slice(0, begin, end).copy_(arg);
    dist.slice(0, begin, end).copy_((best + x_norms.slice(0, begin, end)).clamp_min(0));
  }
  return {index, dist};
}

/// A double in [0, 1) from the 53 high bits of a splitmix64 draw (the same on every platform).
double unit_draw(uint64_t seed, uint64_t tag) {
  return static_cast<double>(splitmix64_combine(seed, tag) >> 11) * 0x1.0p-53;
}

/// k-means++: the first seed uniform over the pool, each next one drawn with probability
/// proportional to its squared distance to the nearest seed so far.
torch::Tensor kmeans_plus_plus(const torch::Tensor& pool, int64_t k, uint64_t seed) {
  auto n = pool.size(0);
  auto seeds = torch::empty({k, pool.size(1)}, torch::kFloat);
  auto first = static_cast<int64_t>(unit_draw(seed, 0) * static_cast<double>(n));
  seeds[0].copy_(pool[std::min(first, n - 1)]);
  auto closest = (pool - seeds[0]).pow(2).sum(1).to(torch::kDouble);
  for (int64_t i = 1; i < k; ++i) {
    auto cumulative = closest.cumsum(0);
    double total = cumulative[n - 1].item<double>();
    int64_t pick;
    if (total <= 0) {
      // Every pool patch equals a seed already: any patch will do; the draw stays seeded.
      pick = std::min(n - 1, static_cast<int64_t>(unit_draw(seed, i) * static_cast<double>(n)));
    } else {
      auto target = torch::full({1}, unit_draw(seed, i) * total, torch::kDouble);
      pick = std::min(n - 1, torch::searchsorted(cumulative, target, false, true).item<int64_t>());
    }
    seeds[i].copy_(pool[pick]);
    closest = torch::minimum(closest, (pool - seeds[i]).pow(2).sum(1).to(torch::kDouble));
  }
  return seeds;
}

} // namespace

result<codebook_fit> fit_codebook(const image_set& images, const codebook_options& opts) {
  if (auto st = check_grid(opts.patch, images.rows, images.cols); !st)
    return fail(st.what());
  if (opts.patch > codebook_max_patch)
    return fail(fmt::format("patch side {} above the limit {}", opts.patch, codebook_max_patch));
  if (opts.codes < 1 || opts.codes > codebook_max_codes)
    return fail(fmt::format("codebook size {} is outside [1, {}]", opts.codes, codebook_max_codes));
  if (opts.max_iterations < 1 || !(opts.tolerance >= 0))
    return fail("codebook fitting needs max_iterations >= 1 and tolerance >= 0");
  auto count = opts.max_images == 0 ? images.count : std::min(images.count, opts.max_images);
  if (count == 0 || images.pixels.size() < count * images.pixels_per_image())
    return fail("codebook fitting needs at least one image");
  torch::NoGradGuard no_grad;
  auto rows = static_cast<int64_t>(images.rows), cols = static_cast<int64_t>(images.cols);
  auto px = torch::from_blob(const_cast<float*>(images.pixels.data()),
                             {static_cast<int64_t>(count), rows, cols}, torch::kFloat);
  auto x = to_patches(px, opts.patch);
  auto n = x.size(0), k = static_cast<int64_t>(opts.codes);
  if (k > n)
    return fail(fmt::format("codebook size {} exceeds the {} patches it is fit on", k, n));

  // The seeding pool: a seeded subset (a seeded permutation's prefix) when the patches are many.
  auto pool_size = opts.seeding_pool == 0 ? n : std::min<int64_t>(n, opts.seeding_pool);
  torch::Tensor pool = x;
  if (pool_size < n) {
    auto gen = seeded_generator(splitmix64_combine(opts.seed, 1, 0x5eed));
    auto perm = torch::randperm(n, gen, torch::kLong).slice(0, 0, pool_size);
    pool = x.index_select(0, std::get<0>(perm.sort()));
  }
  if (k > pool_size)
    return fail(
        fmt::format("codebook size {} exceeds the seeding pool of {} patches", k, pool_size));
  auto codes = kmeans_plus_plus(pool, k, opts.seed);

  codebook_fit fit;
  fit.patches = static_cast<std::size_t>(n);
  double previous = std::numeric_limits<double>::infinity();
  auto dim = x.size(1);
  auto xd = x.to(torch::kDouble);
  auto x_norms = x.pow(2).sum(1);
  for (int it = 0; it < opts.max_iterations; ++it) {
    auto [index, dist] = nearest(x, codes, x_norms);
    double mse = dist.to(torch::kDouble).sum().item<double>() / static_cast<double>(n * dim);
    fit.iterations = it + 1;
    fit.mse = mse;
    auto sums = torch::zeros({k, dim}, torch::kDouble).index_add_(0, index, xd);
    auto counts = torch::bincount(index, {}, k);
    auto empty = (counts == 0).nonzero().flatten();
    auto means = (sums / counts.clamp_min(1).unsqueeze(1).to(torch::kDouble)).to(torch::kFloat);
    if (empty.numel() > 0) {
      // The farthest patches (distinct, highest distance first, lowest index on ties) take over.
      auto far = std::get<1>(dist.topk(empty.numel(), 0, true, true));
      means.index_copy_(0, empty, x.index_select(0, far));
      fit.reseeded += static_cast<std::size_t>(empty.numel());
    }
    codes = means.clamp(0.0, 1.0);
    bool converged = empty.numel() == 0 && std::isfinite(previous) &&
                     previous - mse <= opts.tolerance * previous;
    previous = mse;
    if (converged)
      break;
  }
  fit.mse = nearest(x, codes, x_norms).second.to(torch::kDouble).sum().item<double>() /
            static_cast<double>(n * dim);
  fit.codebook.patch = opts.patch;
  fit.codebook.codes.assign(codes.data_ptr<float>(), codes.data_ptr<float>() + codes.numel());
  return fit;
}

std::size_t tokens_per_image(const patch_codebook& cb, std::size_t rows, std::size_t cols) {
  return cb.patch == 0 ? 0 : (rows / cb.patch) * (cols / cb.patch);
}

result<std::vector<int64_t>> tokenize_images(const patch_codebook& cb,
                                             const std::vector<float>& pixels, std::size_t count,
                                             std::size_t rows, std::size_t cols) {
  if (auto st = check_grid(cb.patch, rows, cols); !st)
    return fail(st.what());
  if (cb.size() == 0)
    return fail("empty codebook");
  if (pixels.size() != count * rows * cols)
    return fail(fmt::format("expected {} images of {}×{} pixels ({} values), got {} values", count,
                            rows, cols, count * rows * cols, pixels.size()));
  if (count == 0)
    return std::vector<int64_t>{};
  torch::NoGradGuard no_grad;
  auto px = torch::from_blob(
      const_cast<float*>(pixels.data()),
      {static_cast<int64_t>(count), static_cast<int64_t>(rows), static_cast<int64_t>(cols)},
      torch::kFloat);
  auto codes = torch::from_blob(const_cast<float*>(cb.codes.data()),
                                {static_cast<int64_t>(cb.size()), static_cast<int64_t>(cb.dim())},
                                torch::kFloat);
  auto index = nearest(to_patches(px, cb.patch), codes).first;
  return std::vector<int64_t>(index.data_ptr<int64_t>(), index.data_ptr<int64_t>() + index.numel());
}

result<std::vector<float>> detokenize_images(const patch_codebook& cb,
                                             const std::vector<int64_t>& tokens, std::size_t rows,
                                             std::size_t cols) {
  if (auto st = check_grid(cb.patch, rows, cols); !st)
    return fail(st.what());
  auto per = tokens_per_image(cb, rows, cols);
  if (tokens.size() % per != 0)
    return fail(
        fmt::format("{} tokens are not a whole number of images of {} tokens", tokens.size(), per));
  auto k = static_cast<int64_t>(cb.size());
  for (auto t : tokens)
    if (t < 0 || t >= k)
      return fail(fmt::format("image token {} is outside the codebook's [0, {})", t, k));
  std::size_t count = tokens.size() / per, p = cb.patch, gc = cols / p;
  std::vector<float> out(count * rows * cols);
  for (std::size_t i = 0; i < count; ++i)
    for (std::size_t t = 0; t < per; ++t) {
      const float* code =
          cb.codes.data() + static_cast<std::size_t>(tokens[i * per + t]) * cb.dim();
      std::size_t r0 = (t / gc) * p, c0 = (t % gc) * p;
      for (std::size_t r = 0; r < p; ++r)
        std::copy(code + r * p, code + (r + 1) * p,
                  out.begin() +
                      static_cast<std::ptrdiff_t>(i * rows * cols + (r0 + r) * cols + c0));
    }
  return out;
}

} // namespace starling::kernels
