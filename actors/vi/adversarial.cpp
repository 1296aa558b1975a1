#include "actors/vi/adversarial.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

// OpenBLAS's own thread count (global); absent when LibTorch uses another BLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace starling::actors::vi {

namespace {

/// OpenMP's thread count is per calling thread: every thread that runs an operator (each CAF
/// scheduler thread) sets it once.
void one_thread_here() {
  static thread_local bool done = false;
  if (!done) {
    at::set_num_threads(1);
    done = true;
  }
}

} // namespace

struct adversarial_problem::impl {
  adversarial_options options;
  int64_t c = 0; // classes
  int64_t p = 0; // pixels per image
  std::vector<kernels::image_set> shards;
  std::vector<torch::Tensor> x;      // per worker n × P, centered, float64
  std::vector<torch::Tensor> y;      // per worker n × C one-hot, float64
  std::vector<torch::Tensor> labels; // per worker n, int64
  std::vector<torch::Tensor> x32;    // x and y in float32: what `apply` computes with
  std::vector<torch::Tensor> y32;
  torch::Tensor test_x;              // T × P, centered, float32
  torch::Tensor test_y;              // T × C one-hot, float32
  torch::Tensor test_labels;         // T, int64
  double lipschitz = 0;
  double mean_square_lipschitz = 0;
  std::string source;
  bool fell_back = false;
};

namespace {

/// (1/2) λ_max((1/n) X̃ᵀX̃) with X̃ = [X, 1]: the Lipschitz constant of the softmax regression's
/// gradient in (W, b) (the softmax's Hessian is at most 1/2 in norm), by power iteration.
double half_top_eigenvalue(const torch::Tensor& x) {
  auto xt = torch::cat({x, torch::ones({x.size(0), 1}, torch::kFloat64)}, 1);
  auto m = xt.t().matmul(xt) / static_cast<double>(x.size(0));
  auto v = torch::ones({m.size(0)}, torch::kFloat64);
  double lam = 0;
  for (int i = 0; i < 100; ++i) {
    auto mv = m.matmul(v);
    lam = mv.norm().item<double>();
    if (lam == 0)
      return 0;
    v = mv / lam;
  }
  return 0.5 * lam;
}

torch::Tensor pixels_of(const kernels::image_set& s, std::size_t first, std::size_t count) {
  const auto p = static_cast<int64_t>(s.pixels_per_image());
  auto t = torch::from_blob(const_cast<float*>(s.pixels.data() + first * s.pixels_per_image()),
                            {static_cast<int64_t>(count), p}, torch::kFloat32);
  return t.to(torch::kFloat64); // copies
}

torch::Tensor labels_of(const kernels::image_set& s, std::size_t first, std::size_t count) {
  auto t = torch::empty({static_cast<int64_t>(count)}, torch::kInt64);
  auto a = t.accessor<int64_t, 1>();
  for (std::size_t i = 0; i < count; ++i)
    a[static_cast<int64_t>(i)] = s.labels[first + i];
  return t;
}

struct model_view {
  torch::Tensor w, b, delta;
};

model_view view_of(const std::vector<double>& z, int64_t c, int64_t p) {
  auto zt = torch::from_blob(const_cast<double*>(z.data()), {static_cast<int64_t>(z.size())},
                             torch::kFloat64);
  return {zt.slice(0, 0, c * p).view({c, p}), zt.slice(0, c * p, c * p + c),
          zt.slice(0, c * p + c, c * p + c + p)};
}

/// Mean cross-entropy and accuracy of (w, b) on x + delta.
std::pair<double, double> loss_and_accuracy(const torch::Tensor& x, const torch::Tensor& labels,
                                            const model_view& mv, const torch::Tensor& delta) {
  auto logits = torch::addmm(mv.b, x + delta, mv.w.t());
  auto logp = torch::log_softmax(logits, 1);
  const double loss = -logp.gather(1, labels.unsqueeze(1)).mean().item<double>();
  const double acc =
    logits.argmax(1).eq(labels).to(torch::kFloat64).mean().item<double>();
  return {loss, acc};
}

} // namespace

result<adversarial_problem> adversarial_problem::make(const adversarial_options& o) {
  if (o.workers == 0 || o.train_per_worker == 0 || o.test_images == 0)
    return fail(fmt::format("adversarial problem: workers = {}, train_per_worker = {}, "
                            "test_images = {}, expected all > 0",
                            o.workers, o.train_per_worker, o.test_images));
  const std::size_t train_count = o.workers * o.train_per_worker;
  const bool present = kernels::fashion_mnist_present(o.data_dir);
  if (!o.synthetic && present) {
    if (train_count > 60000)
      return fail(fmt::format("adversarial problem: workers × train_per_worker = {} training "
                              "images, Fashion-MNIST has 60000",
                              train_count));
    if (o.test_images > 10000)
      return fail(fmt::format("adversarial problem: test_images = {}, Fashion-MNIST has 10000",
                              o.test_images));
    auto train = kernels::load_fashion_mnist(o.data_dir, true, train_count);
    if (!train)
      return train.error();
    auto test = kernels::load_fashion_mnist(o.data_dir, false, o.test_images);
    if (!test)
      return test.error();
    return make(o, *train, *test);
  }
  if (o.synthetic_side == 0 || o.synthetic_side > 64)
    return fail(fmt::format("adversarial problem: synthetic_side = {}, expected 1 to 64",
                            o.synthetic_side));
  if (o.synthetic_classes < 2 || o.synthetic_classes > 100)
    return fail(fmt::format("adversarial problem: synthetic_classes = {}, expected 2 to 100",
                            o.synthetic_classes));
  auto train = kernels::make_synthetic_images(train_count, o.synthetic_side, o.synthetic_classes,
                                              o.seed, 0);
  auto test = kernels::make_synthetic_images(o.test_images, o.synthetic_side, o.synthetic_classes,
                                             o.seed, 1);
  auto made = make(o, train, test);
  if (made && !o.synthetic) {
    auto d = std::make_shared<impl>(*made->impl_);
    d->fell_back = true;
    made->impl_ = std::move(d);
  }
  return made;
}

result<adversarial_problem> adversarial_problem::make(const adversarial_options& o,
                                                      const kernels::image_set& train,
                                                      const kernels::image_set& test) {
  if (o.workers == 0 || o.train_per_worker == 0)
    return fail(fmt::format("adversarial problem: workers = {} and train_per_worker = {}, "
                            "expected both > 0",
                            o.workers, o.train_per_worker));
  if (!(std::isfinite(o.epsilon) && o.epsilon >= 0))
    return fail(fmt::format("adversarial problem: epsilon = {}, expected >= 0", o.epsilon));
  if (!(std::isfinite(o.lambda) && o.lambda >= 0))
    return fail(fmt::format("adversarial problem: lambda = {}, expected >= 0", o.lambda));
  if (!(std::isfinite(o.beta) && o.beta >= 0))
    return fail(fmt::format("adversarial problem: beta = {}, expected >= 0", o.beta));
  const std::size_t train_count = o.workers * o.train_per_worker;
  if (train.count < train_count)
    return fail(fmt::format("adversarial problem: {} workers × {} images need {} training "
                            "images, {} has {}",
                            o.workers, o.train_per_worker, train_count, train.source,
                            train.count));
  if (test.count == 0)
    return fail(fmt::format("adversarial problem: no test images in {}", test.source));
  if (train.pixels_per_image() == 0 || test.pixels_per_image() != train.pixels_per_image() ||
      test.classes != train.classes || train.classes < 2)
    return fail(fmt::format("adversarial problem: training images {}x{} with {} classes, test "
                            "images {}x{} with {}: expected equal sizes and >= 2 classes",
                            train.rows, train.cols, train.classes, test.rows, test.cols,
                            test.classes));
  torch::NoGradGuard no_grad;
  auto d = std::make_shared<impl>();
  d->options = o;
  d->c = static_cast<int64_t>(train.classes);
  d->p = static_cast<int64_t>(train.pixels_per_image());
  d->source = train.source;
  // Center by the training images' mean pixel values (one fixed preprocessing for all workers).
  auto all = pixels_of(train, 0, train_count);
  auto mean = all.mean(0);
  const auto n = o.train_per_worker;
  double sum_sq = 0;
  for (std::size_t m = 0; m < o.workers; ++m) {
    auto x = (pixels_of(train, m * n, n) - mean).contiguous();
    auto labels = labels_of(train, m * n, n);
    d->x.push_back(x);
    d->labels.push_back(labels);
    d->y.push_back(torch::one_hot(labels, d->c).to(torch::kFloat64));
    d->x32.push_back(x.to(torch::kFloat32).contiguous());
    d->y32.push_back(d->y.back().to(torch::kFloat32).contiguous());
    const double lm = half_top_eigenvalue(x) + o.lambda;
    sum_sq += lm * lm;
    kernels::image_set s;
    s.count = n;
    s.rows = train.rows;
    s.cols = train.cols;
    s.classes = train.classes;
    s.source = fmt::format("{} [{}, {})", train.source, m * n, (m + 1) * n);
    s.labels.assign(train.labels.begin() + static_cast<std::ptrdiff_t>(m * n),
                    train.labels.begin() + static_cast<std::ptrdiff_t>((m + 1) * n));
    auto xf = x.to(torch::kFloat32).contiguous();
    s.pixels.assign(xf.data_ptr<float>(), xf.data_ptr<float>() + xf.numel());
    d->shards.push_back(std::move(s));
  }
  d->lipschitz = half_top_eigenvalue(all - mean) + o.lambda;
  d->mean_square_lipschitz = std::sqrt(sum_sq / static_cast<double>(o.workers));
  const auto t = std::min(test.count, std::max<std::size_t>(1, o.test_images));
  d->test_x = (pixels_of(test, 0, t) - mean).contiguous();
  d->test_labels = labels_of(test, 0, t);
  d->test_y = torch::one_hot(d->test_labels, d->c).to(torch::kFloat32);
  d->test_x = d->test_x.to(torch::kFloat32).contiguous();
  adversarial_problem out;
  out.impl_ = std::move(d);
  return out;
}

std::size_t adversarial_problem::dim() const {
  return static_cast<std::size_t>(impl_->c * impl_->p + impl_->c + impl_->p);
}
std::size_t adversarial_problem::workers() const { return impl_->x.size(); }
std::size_t adversarial_problem::pixels() const { return static_cast<std::size_t>(impl_->p); }
std::size_t adversarial_problem::classes() const { return static_cast<std::size_t>(impl_->c); }
std::size_t adversarial_problem::delta_offset() const {
  return static_cast<std::size_t>(impl_->c * impl_->p + impl_->c);
}
const kernels::image_set& adversarial_problem::shard(std::size_t m) const {
  return impl_->shards.at(m);
}
const adversarial_options& adversarial_problem::options() const { return impl_->options; }
const std::string& adversarial_problem::data_source() const { return impl_->source; }
bool adversarial_problem::fell_back() const { return impl_->fell_back; }
double adversarial_problem::lipschitz() const { return impl_->lipschitz; }
double adversarial_problem::mean_square_lipschitz() const { return impl_->mean_square_lipschitz; }

void adversarial_problem::apply(std::size_t m, const std::vector<double>& z,
                                std::vector<double>& out) const {
  torch::NoGradGuard no_grad;
  one_thread_here();
  const auto& d = *impl_;
  const auto c = d.c, p = d.p;
  // float32 arithmetic: twice as fast as float64 and far below the float32 wire precision.
  auto z32 = torch::from_blob(const_cast<double*>(z.data()), {static_cast<int64_t>(z.size())},
                              torch::kFloat64)
               .to(torch::kFloat32);
  model_view mv{z32.slice(0, 0, c * p).view({c, p}), z32.slice(0, c * p, c * p + c),
                z32.slice(0, c * p + c, c * p + c + p)};
  const auto& x = d.x32[m];
  auto xa = x + mv.delta;                                   // n × P
  auto probs = torch::softmax(torch::addmm(mv.b, xa, mv.w.t()), 1); // n × C
  auto g = (probs - d.y32[m]) / static_cast<double>(x.size(0));       // ∂f/∂logits
  auto gsum = g.sum(0);                                     // C
  out.resize(dim());
  auto ot = torch::from_blob(out.data(), {static_cast<int64_t>(out.size())}, torch::kFloat64);
  // ∇_W = gᵀ(x + δ) + λW, ∇_b = Σ g, ∇_δ = (Σ g)ᵀ W; the δ part enters F with a minus sign.
  ot.slice(0, 0, c * p).view({c, p}).copy_(torch::addmm(mv.w, g.t(), xa, d.options.lambda, 1.0));
  ot.slice(0, c * p, c * p + c).copy_(gsum);
  ot.slice(0, c * p + c, c * p + c + p)
    .copy_(d.options.beta * mv.delta - gsum.unsqueeze(0).matmul(mv.w).squeeze(0));
}

void use_one_torch_thread() {
  one_thread_here();
  if (openblas_set_num_threads)
    openblas_set_num_threads(1);
}

void adversarial_problem::prox(std::vector<double>& z) const {
  const double eps = impl_->options.epsilon;
  for (std::size_t i = delta_offset(); i < z.size(); ++i)
    z[i] = std::clamp(z[i], -eps, eps);
}

double adversarial_problem::loss(std::size_t m, const std::vector<double>& z) const {
  torch::NoGradGuard no_grad;
  const auto& d = *impl_;
  auto mv = view_of(z, d.c, d.p);
  const double ce = loss_and_accuracy(d.x[m], d.labels[m], mv, mv.delta).first;
  return ce + 0.5 * d.options.lambda * mv.w.pow(2).sum().item<double>() -
         0.5 * d.options.beta * mv.delta.pow(2).sum().item<double>();
}

adversarial_eval adversarial_problem::evaluate(const std::vector<double>& z) const {
  torch::NoGradGuard no_grad;
  one_thread_here();
  const auto& d = *impl_;
  const auto c = d.c, p = d.p;
  auto z32 = torch::tensor(z, torch::kFloat64).to(torch::kFloat32);
  model_view mv{z32.slice(0, 0, c * p).view({c, p}), z32.slice(0, c * p, c * p + c),
                z32.slice(0, c * p + c, c * p + c + p)};
  adversarial_eval e;
  auto zero = torch::zeros({d.p}, torch::kFloat32);
  std::tie(e.clean_loss, e.clean_accuracy) = loss_and_accuracy(d.test_x, d.test_labels, mv, zero);
  const double eps = d.options.epsilon;
  const auto steps = d.options.attack_steps;
  const double alpha = steps > 0 ? 2.5 * eps / static_cast<double>(steps) : 0.0;
  e.adversarial_loss = e.clean_loss;
  e.adversarial_accuracy = e.clean_accuracy;
  for (const auto& start : {zero, mv.delta.clamp(-eps, eps)}) {
    auto delta = start.clone();
    for (std::size_t s = 0; s <= steps; ++s) {
      auto la = loss_and_accuracy(d.test_x, d.test_labels, mv, delta);
      if (la.first > e.adversarial_loss) {
        e.adversarial_loss = la.first;
        e.adversarial_accuracy = la.second;
      }
      if (s == steps)
        break;
      auto probs = torch::softmax(torch::addmm(mv.b, d.test_x + delta, mv.w.t()), 1);
      auto grad = (probs - d.test_y).mean(0).unsqueeze(0).matmul(mv.w).squeeze(0);
      delta = (delta + alpha * grad.sign()).clamp(-eps, eps);
    }
  }
  return e;
}

} // namespace starling::actors::vi
