#include "actors/vi/problem.hpp"

#include <cmath>

#include <fmt/format.h>
#include <torch/torch.h>

namespace starling::actors::vi {

namespace {

std::vector<double> to_vec(const torch::Tensor& t) {
  auto c = t.contiguous().to(torch::kFloat64);
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

torch::Tensor random_orthogonal(int64_t n, at::Generator& gen) {
  auto g = torch::randn({n, n}, gen, torch::kFloat64);
  auto qr = torch::linalg::qr(g);
  // Fix the signs so the draw is Haar-distributed and does not depend on LAPACK's conventions.
  auto d = std::get<1>(qr).diagonal().sign();
  return std::get<0>(qr) * d.unsqueeze(0);
}

} // namespace

result<bilinear_problem> bilinear_problem::make(const bilinear_options& o) {
  if (o.dim_per_player == 0 || o.workers == 0)
    return fail(fmt::format("bilinear problem: dim_per_player = {} and workers = {}, expected both "
                            "> 0",
                            o.dim_per_player, o.workers));
  if (!(o.sigma_min >= 0 && o.sigma_max >= o.sigma_min))
    return fail(fmt::format("bilinear problem: sigma range [{}, {}], expected 0 <= min <= max",
                            o.sigma_min, o.sigma_max));
  if (!(o.heterogeneity >= 0))
    return fail(fmt::format("bilinear problem: heterogeneity = {}, expected >= 0", o.heterogeneity));
  if (!(o.lambda > 0))
    return fail(fmt::format("bilinear problem: lambda = {}, expected > 0 (strong monotonicity)",
                            o.lambda));
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  const auto n = static_cast<int64_t>(o.dim_per_player);
  bilinear_problem p;
  p.options_ = o;
  p.n_ = o.dim_per_player;
  auto s = torch::linspace(o.sigma_max, o.sigma_min, n, torch::kFloat64);
  auto a_sum = torch::zeros({n, n}, torch::kFloat64);
  auto lin_a = torch::zeros({n}, torch::kFloat64);
  auto lin_b = torch::zeros({n}, torch::kFloat64);
  auto controlled = [&] {
    auto u = random_orthogonal(n, gen);
    auto v = random_orthogonal(n, gen);
    return u.matmul(torch::diag(s)).matmul(v.t());
  };
  auto shared = controlled();
  double sum_sq_lipschitz = 0.0;
  for (std::size_t m = 0; m < o.workers; ++m) {
    auto am = shared + o.heterogeneity * controlled();
    const double am_norm = torch::linalg::matrix_norm(am, at::Scalar(2.0), {-2, -1}, false,
                                                      c10::nullopt)
                             .item<double>();
    sum_sq_lipschitz += am_norm * am_norm + o.lambda * o.lambda;
    auto a = o.linear_scale * torch::randn({n}, gen, torch::kFloat64);
    auto b = o.linear_scale * torch::randn({n}, gen, torch::kFloat64);
    a_sum += am;
    lin_a += a;
    lin_b += b;
    p.a_mat_.push_back(to_vec(am));
    p.a_.push_back(to_vec(a));
    p.b_.push_back(to_vec(b));
  }
  const double inv_m = 1.0 / static_cast<double>(o.workers);
  auto abar = a_sum * inv_m;
  // F(z) = K z + c with K = [[λI, Ā], [−Āᵀ, λI]], c = (ā, b̄); z* = −K⁻¹ c.
  auto eye = torch::eye(n, torch::kFloat64);
  auto k = torch::cat({torch::cat({o.lambda * eye, abar}, 1), torch::cat({-abar.t(), o.lambda * eye}, 1)},
                      0);
  auto c = torch::cat({lin_a, lin_b}) * inv_m;
  auto z_star = torch::linalg::solve(k, -c, true);
  p.solution_ = to_vec(z_star);
  p.solution_sq_norm_ = z_star.dot(z_star).item<double>();
  // K = λI + skew, so KᵀK = λ²I + SᵀS and ‖K‖ = sqrt(λ² + σ_max(Ā)²); the same for each K_m.
  const double abar_norm = torch::linalg::matrix_norm(abar, at::Scalar(2.0), {-2, -1}, false, c10::nullopt).item<double>();
  p.lipschitz_ = std::sqrt(abar_norm * abar_norm + o.lambda * o.lambda);
  p.mean_square_lipschitz_ = std::sqrt(sum_sq_lipschitz * inv_m);
  return p;
}

void bilinear_problem::apply(std::size_t m, const std::vector<double>& z,
                             std::vector<double>& out) const {
  // Plain loops: at n = 100 a LibTorch call costs more in dispatch than the arithmetic, and the
  // pure runs need tens of thousands of evaluations.
  const auto n = n_;
  const double lambda = options_.lambda;
  const double* x = z.data();
  const double* y = z.data() + n;
  const auto& am = a_mat_[m];
  out.assign(2 * n, 0.0);
  double* fx = out.data();
  double* fy = out.data() + n;
  for (std::size_t i = 0; i < n; ++i) {
    const double* row = am.data() + i * n;
    double acc = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
      acc += row[j] * y[j];
      fy[j] -= row[j] * x[i]; // (−A_mᵀ x)_j accumulates row i's contribution
    }
    fx[i] = acc + a_[m][i] + lambda * x[i];
  }
  for (std::size_t j = 0; j < n; ++j)
    fy[j] += b_[m][j] + lambda * y[j];
}

void bilinear_problem::apply_mean(const std::vector<double>& z, std::vector<double>& out) const {
  out.assign(dim(), 0.0);
  std::vector<double> part;
  for (std::size_t m = 0; m < workers(); ++m) {
    apply(m, z, part);
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] += part[i];
  }
  for (auto& v : out)
    v /= static_cast<double>(workers());
}

double bilinear_problem::objective(const std::vector<double>& z) const {
  const auto n = n_;
  double total = 0.0;
  for (std::size_t m = 0; m < workers(); ++m) {
    const auto& am = a_mat_[m];
    for (std::size_t i = 0; i < n; ++i) {
      double row = 0.0;
      for (std::size_t j = 0; j < n; ++j)
        row += am[i * n + j] * z[n + j];
      total += z[i] * row + a_[m][i] * z[i] - b_[m][i] * z[n + i];
    }
  }
  total /= static_cast<double>(workers());
  double xx = 0.0, yy = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    xx += z[i] * z[i];
    yy += z[n + i] * z[n + i];
  }
  return total + 0.5 * options_.lambda * (xx - yy);
}

double bilinear_problem::relative_error(const std::vector<double>& z) const {
  double acc = 0.0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double d = z[i] - solution_[i];
    acc += d * d;
  }
  return acc / solution_sq_norm_;
}

} // namespace starling::actors::vi
