// BTARD's aggregate check: every peer verifies, without the inputs, that each part's published
// aggregate ĝ is CenteredClip of the n contributions g_j (weights 1) with the run's τ.
//
// The check: CenteredClip's fixed point x satisfies F(x) = Σ_j (g_j − x)·min(1, τ/‖g_j − x‖) = 0.
// After the step's commitments (part and result digests) are public, the MPRNG draws r_t and
// from it a direction z_i per part i. Every peer j publishes, signed, s_ij = ⟨z_i, g_j[i] − ĝ[i]⟩
// and n_ij = ‖g_j[i] − ĝ[i]‖ (fp64); then everyone checks
//     |Σ_j s_ij·min(1, τ/n_ij)| = |⟨z_i, F(ĝ[i])⟩| <= bound,
// summing in key order so that every honest peer computes the same number bit for bit. The
// aggregator i, which holds every g_j[i], recomputes each (s_ij, n_ij) and accuses a peer whose
// published values differ (`projection_matches`); a pair with |s| > ‖z‖·n is impossible
// (Cauchy–Schwarz) and convicts its signer before anyone re-checks (`impossible` below).
//
// Why z is Gaussian (N(0, I), Box–Muller over splitmix64), not Rademacher: ĝ and the g_j are
// fixed by their digests before z is drawn, so ⟨z, F(ĝ)⟩ is exactly N(0, ‖F(ĝ)‖²) whatever the
// shape of F. An honest aggregate then fails with chance at most P(|N(0,1)| > sigmas) (about
// 2·10⁻⁹ for 6), and a wrong one with residual vector F_w passes with chance at most
// √(2/π)·bound/‖F_w‖, however the aggregator shapes F_w. With Rademacher z an aggregator can
// shape F_w so that ⟨z, F_w⟩ = 0 with chance 1/2 whatever its size (F_w = (a, −a, 0, …)).
//
// The bound (`aggregate_check_outcome::bound`), with u32 = 2⁻²⁴, u64 = 2⁻⁵³, D the part's
// size, γ = (D + n + 4)·u64 / (1 − (D + n + 4)·u64), A = Σ_j min(n_ij, τ):
//   ‖F(ĝ)‖ <= B = n·(2·tolerance + 2·u32·‖ĝ‖ + √D·2⁻¹⁴⁹) + n·γ·τ
//   bound = sigmas·B + (γ + projection_rel_tolerance)·‖z‖·A
// Derivation. Each term (g_j − x)·min(1, τ/‖g_j − x‖) is the projection of g_j − x onto the
// ball of radius τ, so it is 1-Lipschitz in x and F is n-Lipschitz. kernels::centered_clip
// stops after the step from x_prev to x = x_prev + step with ‖step‖ <= tolerance, and the exact
// step is F(x_prev)/n; so ‖F(x_prev)‖ <= n·(tolerance + e), e the fp64 error of the computed
// step (<= γ·τ: n terms of norm <= τ, each with a D-term norm, a division and a product), and
// ‖F(x)‖ <= ‖F(x_prev)‖ + n·‖step‖. Rounding x once to float32 moves it by at most u32·‖x‖ (plus
// 2⁻¹⁴⁹ per coordinate below the normal range), and fp64 rounding of x_prev + step by
// u64·‖x‖; 2·u32·‖ĝ‖ covers both. So ‖F(ĝ)‖ <= B, and ⟨z, F(ĝ)⟩ <= sigmas·B but for a chance
// P(|N(0,1)| > sigmas). The second term covers the fp64 rounding of the published s_ij, n_ij
// and of the sum (each s_ij·min(1, τ/n_ij) has error <= γ·‖z‖·min(n_ij, τ)), and the relative
// slack `projection_matches` grants each published pair, which a liar may use without being
// caught. The sums run in eight lanes (vectorize.hpp), not left to right: any summation tree
// of D terms has at most D − 1 rounded additions on a path (adding a lane's initial 0 is
// exact), so the γ above covers either order. This holds only when the aggregator computes
// CenteredClip in fp64 (float32 inputs widened: clip.hpp's centered_clip_fp64, or
// kernels::centered_clip on double tensors) and rounds its result to float32 once: a float32
// iteration's rounding (up to D·u32 relative in the norms) is far above this bound. How the
// aggregator finds x_prev does not enter the bound: only that its last step, computed from
// x_prev as above, had norm <= tolerance.
//
// Convergence and the iteration cap: a non-converged aggregate fails the check (its residual is
// about n times its last step). With weights 1 an iteration is x ← T(x) = (1/n)·Σ_j (x + φ_j(x)),
// φ_j the clipped difference; x + φ_j(x) is constant (= g_j) for an unclipped input and has a
// Jacobian of norm <= 1 for a clipped one, so T contracts by q <= c/n where at most c inputs are
// clipped. With τ set from the honest spread (honest inputs unclipped near the fixed point) and
// b < n/2 Byzantine inputs, q <= b/n < 1/2. Each step is at most q times the one before
// (step_{k+1} = T(x_{k+1}) − T(x_k)) and the first is at most τ (a mean of vectors of norm <= τ),
// so the step falls below the tolerance by iteration 1 + ⌈log(τ/tolerance)/log(n/c)⌉
// (`centered_clip_iterations_bound`): 18 for τ/tolerance = 10⁶, n = 16, c = 7. A run's cap must
// be at least that bound (the YAML validator can call it); an aggregator that hits the cap
// publishes an aggregate the check rejects. The premise does not always hold: τ from the honest
// spread clips some honest inputs too (about a fifth in bench_btard), so c can exceed b, q
// approach 1, and an honest aggregate stop at the cap (seen: seed 3, random direction, 7
// attackers, step 50, residual 2.96e-4 against a bound of 2.07e-4). So a rejected check is not
// yet a verdict: protocol.hpp recomputes the part from the committed contributions (CenteredClip
// is deterministic bit for bit: clip.hpp) and blames the aggregator only when the digest differs,
// a projection signer only when its pair is false; when neither, the aggregate is verified the
// expensive way and applied (`check_record::recomputed`).
// No CAF, no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::btard {

/// z ~ N(0, I) of `size` coordinates from `seed` (mprng.hpp's direction_seed): splitmix64
/// draws u1 in (0, 1], u2 in [0, 1) with 53 bits each, then Box–Muller (√(−2 ln u1)·cos 2πu2,
/// √(−2 ln u1)·sin 2πu2) for each pair of coordinates.
std::vector<double> gaussian_direction(uint64_t seed, size_t size);

/// ‖v‖ in fp64, the squares summed in the lanes of vectorize.hpp (lane k mod 8, in index
/// order, lanes in order).
double norm_of(const double* v, size_t size);
/// ‖v‖ of float32 values, in fp64.
double norm_of(const float* v, size_t size);

/// A peer's published pair for one part.
struct projection {
  /// ⟨z_i, g_j[i] − ĝ[i]⟩.
  double s = 0.0;
  /// ‖g_j[i] − ĝ[i]‖.
  double n = 0.0;
};

/// (s, n) of contribution `g` against aggregate `agg` along `z`, in fp64, summed in the lanes of
/// vectorize.hpp (as `norm_of`).
projection project(const double* z, const float* g, const float* agg, size_t size);

/// Settings of the check; τ and tolerance are the run's CenteredClip options.
struct aggregate_check_options {
  /// CenteredClip's τ.
  double tau = 1.0;
  /// CenteredClip's stop tolerance (a step of at most this ends the iteration).
  double tolerance = 1e-6;
  /// Standard deviations of ⟨z, F(ĝ)⟩ an honest aggregate may reach (6: false alarm <= 2e-9).
  double sigmas = 6.0;
  /// Relative difference `projection_matches` allows between a published pair and the
  /// aggregator's own (fp64 summation order and libm differences in z; far below 1e-9 for parts
  /// up to 10^6 values).
  double projection_rel_tolerance = 1e-9;
};

/// Public facts of one part, known to every peer.
struct part_facts {
  /// Values in the part (D).
  size_t size = 0;
  /// ‖ĝ[i]‖ of the published aggregate.
  double aggregate_norm = 0.0;
  /// ‖z_i‖ of the part's direction.
  double direction_norm = 0.0;
};

/// What the check found for one part.
struct aggregate_check_outcome {
  /// True when the residual is within the bound and no pair is impossible.
  bool accepted = false;
  /// |Σ_j s_ij·min(1, τ/n_ij)|, summed in key order.
  double residual = 0.0;
  /// The bound it was compared with (see the header).
  double bound = 0.0;
  /// Keys whose pair has |s| > ‖z‖·n beyond rounding: their signed projection convicts them
  /// (then the residual says nothing about the aggregator, and the part is not accepted).
  std::vector<std::string> impossible;
};

/// Checks part i's aggregate from every group member's published pair (keyed by member key;
/// the caller makes sure every member of the step's group is there). Fails on empty input, a
/// non-finite value, n < 0, or invalid options.
result<aggregate_check_outcome> check_aggregate(const std::map<std::string, projection>& pairs,
                                                const part_facts& part,
                                                const aggregate_check_options& options);

/// The aggregator's check of one published pair against its own `project` of the contribution
/// it holds: |s − s_own| <= rel·‖z‖·n_own and |n − n_own| <= rel·n_own.
bool projection_matches(const projection& published, const projection& own, double direction_norm,
                        double rel_tolerance);

/// Iterations after which CenteredClip's step is at most `tolerance` when at most `clipped` of
/// `n` inputs are clipped along the way: 1 + ⌈log(τ/tolerance)/log(n/clipped)⌉ (2 when none is
/// clipped: the first step lands on the mean, the second is 0; 1 when τ <= tolerance). Fails
/// unless 0 <= clipped < n, τ > 0 and tolerance > 0.
result<size_t> centered_clip_iterations_bound(double tau, double tolerance, size_t clipped,
                                              size_t n);

} // namespace starling::actors::btard
