// BTARD's gradient attacks as pure tensor code: what a Byzantine peer sends instead of its true
// gradient (issue 41, item 8). The peer role decides when it attacks (`attack_schedule`) and
// hands these functions what they need; nothing here talks to the network.
//
//   kind              | sends                                                   | needs
//   sign_flip         | −scale × its true gradient (scale 1000)                 | its gradient
//   random_direction  | per parameter tensor, one Gaussian direction shared by  | its gradient
//                     | every attacker and every step (from the attack seed),   |
//                     | scaled to scale × that tensor's true gradient norm      |
//   label_flip        | the true gradient of its batch with labels y → C−1−y    | its batch
//   delayed           | the gradient it computed `delay` steps earlier, for     | its history
//                     | `duration` steps (1000 and 500 in the paper)            |
//   ipm               | −ε × the mean of the honest gradients (Xie et al. 2020) | honest grads
//   alie              | per coordinate μ − z·σ of the honest gradients, z =     | honest grads
//                     | Φ⁻¹((n−s)/n), s = ⌊n/2 + 1⌋ − b (Baruch et al. 2019)    |
//
// IPM and ALIE need statistics of the honest gradients. Every batch is a public function of the
// step's shared randomness and the peer's key, so a coalition can recompute every honest
// gradient itself: b attackers pay n − b extra gradient computations per attacked step between
// them (or each pays them all). That is the strongest attacker the protocol must survive, and
// what `honest_statistics` takes: the gradients, however the caller got them.
//
// σ in ALIE is the sample standard deviation (n − 1 in the denominator). The quantile Φ⁻¹ is
// computed here (`normal_quantile`: a rational first estimate refined by one Halley step, so
// that Φ(Φ⁻¹(p)) = p to about 1e-13 relative). No CAF.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "kernels/result.hpp"

namespace starling::actors::btard {

/// Which attack a Byzantine peer runs.
enum class attack_kind { none, sign_flip, random_direction, label_flip, delayed, ipm, alie };

/// The YAML name of `k` ("sign_flip", ...).
const char* attack_name(attack_kind k);

/// `attack_name`'s inverse; an error listing the known names otherwise.
result<attack_kind> parse_attack(const std::string& name);

/// When and how hard a Byzantine peer attacks.
struct attack_options {
  /// The attack.
  attack_kind kind = attack_kind::none;
  /// The first step attacked.
  uint64_t start_step = 0;
  /// Attack every k-th step from `start_step` (1: every step). For `delayed`, steps in
  /// [start_step, start_step + duration) are all replayed whatever `every` says.
  uint64_t every = 1;
  /// sign_flip and random_direction: the factor (1000 in the paper).
  double scale = 1000.0;
  /// delayed: how old the replayed gradients are (D).
  uint64_t delay = 1000;
  /// delayed: for how many steps they are replayed (L).
  uint64_t duration = 500;
  /// ipm: ε.
  double epsilon = 0.1;
  /// random_direction: the seed every attacker shares (drawn from the run's seed).
  uint64_t direction_seed = 0;
};

/// Checks `o`: every >= 1, scale > 0 and finite, ε > 0, duration <= delay (a replayed gradient
/// is one computed before the attack began), duration >= 1.
status validate(const attack_options& o);

/// Whether step `step` is attacked.
bool attacks_at(const attack_options& o, uint64_t step);

/// −scale × `g`.
at::Tensor sign_flip(const at::Tensor& g, double scale);

/// Labels y → (classes − 1 − y): an int64 tensor of class ids in [0, classes). An error for a
/// label outside that range.
result<at::Tensor> flip_labels(const at::Tensor& y, int64_t classes);

/// The constant random direction: one unit Gaussian direction per parameter tensor, drawn once
/// from the seed (splitmix64 and Box–Muller: the same numbers on every machine and build).
class random_direction_attack {
public:
  /// Directions for tensors of the given shapes (fp32).
  random_direction_attack(uint64_t seed, const std::vector<std::vector<int64_t>>& shapes);

  /// For each tensor i: direction_i × scale × ‖grads[i]‖. An error when the shapes differ from
  /// the constructor's.
  result<std::vector<at::Tensor>> apply(const std::vector<at::Tensor>& grads, double scale) const;

  /// The unit directions.
  const std::vector<at::Tensor>& directions() const { return dirs_; }

private:
  std::vector<at::Tensor> dirs_;
};

/// The delayed-gradient attack's memory: it keeps the gradients of steps
/// [start − delay, start − delay + duration) as the peer computes them and replays the one of
/// step t − delay at step t in [start, start + duration). Holds at most `duration` gradients.
class delayed_gradients {
public:
  /// For the attack `o` (kind delayed).
  explicit delayed_gradients(const attack_options& o);

  /// The peer's true gradient at `step`; kept when the attack will replay it.
  void record(uint64_t step, const at::Tensor& g);

  /// What to send at `step` instead of the true gradient: the kept gradient of step − delay, or
  /// nothing outside the replay window or when that step was never recorded (the peer joined
  /// later: it then sends its true gradient).
  std::optional<at::Tensor> replay(uint64_t step) const;

  /// Gradients kept now.
  size_t kept() const { return kept_.size(); }

private:
  attack_options o_;
  std::map<uint64_t, at::Tensor> kept_;
};

/// Mean and sample standard deviation per coordinate of the honest gradients (flat, same size).
struct honest_statistics {
  /// The mean.
  at::Tensor mean;
  /// The sample standard deviation (zeros for one gradient).
  at::Tensor std;
  /// How many gradients.
  size_t count = 0;
};

/// The statistics of `grads` (computed in fp64, returned fp32). An error for none or unequal
/// sizes.
result<honest_statistics> statistics_of(const std::vector<at::Tensor>& grads);

/// IPM: −ε × mean.
at::Tensor ipm(const honest_statistics& h, double epsilon);

/// ALIE's z for n peers of which b Byzantine: Φ⁻¹((n − s)/n), s = ⌊n/2 + 1⌋ − b. An error when
/// s is not in [1, n − 1] (then (n − s)/n is no probability strictly between 0 and 1).
result<double> alie_z(uint64_t n, uint64_t b);

/// ALIE: mean − z·std.
at::Tensor alie(const honest_statistics& h, double z);

/// Φ⁻¹(p), the standard normal quantile, for p in (0, 1).
double normal_quantile(double p);

} // namespace starling::actors::btard
