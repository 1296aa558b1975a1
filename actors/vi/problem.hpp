// Variational-inequality problems split over workers: worker m holds F_m, the method needs
// F = (1/M) Σ F_m. Pure C++ (LibTorch only to generate data and solve for z*), no CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::vi {

/// A finite-sum operator F = (1/M) Σ_m F_m on R^dim; worker m evaluates only its F_m.
class vi_problem {
public:
  virtual ~vi_problem() = default;
  /// Length of z.
  virtual std::size_t dim() const = 0;
  /// Number of parts M.
  virtual std::size_t workers() const = 0;
  /// out = F_m(z); `out` is resized to dim().
  virtual void apply(std::size_t m, const std::vector<double>& z, std::vector<double>& out) const = 0;
  /// The prox of the constraint set: projects z onto it in place (identity when unconstrained).
  /// The methods apply it wherever the paper's algorithms do (z_{k+1/2} and z_{k+1}).
  virtual void prox(std::vector<double>& z) const {}
  /// Lipschitz constant L of F (or an estimate), for the step sizes of `recommended_options`.
  virtual double lipschitz() const = 0;
  /// sqrt((1/M) Σ L_m²) with L_m the Lipschitz constant of F_m (or an estimate).
  virtual double mean_square_lipschitz() const = 0;
};

/// Parameters of the regularized bilinear saddle point of issue 8.
struct bilinear_options {
  /// Dimension of x and of y (z has twice this).
  std::size_t dim_per_player = 100;
  /// Number of workers M.
  std::size_t workers = 10;
  /// A_m = A + h·B_m: A (shared) and every B_m (worker's own) have singular values spread evenly
  /// over [sigma_min, sigma_max]; h sets how different the workers' parts are.
  double heterogeneity = 0.5;
  /// Smallest singular value of A and of each B_m.
  double sigma_min = 0.1;
  /// Largest singular value of A and of each B_m.
  double sigma_max = 1.0;
  /// Regularization λ: F is λ-strongly monotone.
  double lambda = 0.1;
  /// Scale of the linear terms a_m, b_m (standard normal × this).
  double linear_scale = 1.0;
  /// Seed of every random draw.
  uint64_t seed = 1;
};

/// min_x max_y (1/M) Σ_m [xᵀA_m y + a_mᵀx − b_mᵀy] + (λ/2)‖x‖² − (λ/2)‖y‖², z = (x, y).
/// F_m(z) = (A_m y + a_m + λx, −A_mᵀx + b_m + λy): the gradient in x and minus the gradient in y,
/// so F is monotone and z* solves F(z*) = 0.
class bilinear_problem final : public vi_problem {
public:
  /// Generates A_m = A + h·B_m, each of A, B_m = U diag(s) Vᵀ with U, V orthogonal from QR of
  /// Gaussians, then a_m, b_m, and
  /// solves the linear system F(z*) = 0 directly. Fails on invalid options.
  static result<bilinear_problem> make(const bilinear_options& options);

  std::size_t dim() const override { return 2 * n_; }
  std::size_t workers() const override { return a_.size(); }
  void apply(std::size_t m, const std::vector<double>& z, std::vector<double>& out) const override;

  /// F(z) = (1/M) Σ_m F_m(z).
  void apply_mean(const std::vector<double>& z, std::vector<double>& out) const;
  /// The objective value at (x, y) = z.
  double objective(const std::vector<double>& z) const;
  /// The exact solution z*.
  const std::vector<double>& solution() const { return solution_; }
  /// λ, the strong-monotonicity constant of F.
  double mu() const { return options_.lambda; }
  /// Lipschitz constant of F: sqrt(σ_max(Ā)² + λ²).
  double lipschitz() const override { return lipschitz_; }
  /// sqrt((1/M) Σ L_m²) with L_m the Lipschitz constant of F_m.
  double mean_square_lipschitz() const override { return mean_square_lipschitz_; }
  /// ‖z − z*‖² / ‖z0 − z*‖² with z0 = 0, the error measure of issue 8.
  double relative_error(const std::vector<double>& z) const;
  /// The options it was made from.
  const bilinear_options& options() const { return options_; }

private:
  bilinear_problem() = default;
  bilinear_options options_;
  std::size_t n_ = 0;
  std::vector<std::vector<double>> a_mat_; // A_m row-major n × n
  std::vector<std::vector<double>> a_;     // a_m
  std::vector<std::vector<double>> b_;     // b_m
  std::vector<double> solution_;
  double solution_sq_norm_ = 0;
  double lipschitz_ = 0;
  double mean_square_lipschitz_ = 0;
};

} // namespace starling::actors::vi
