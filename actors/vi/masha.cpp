#include "actors/vi/masha.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "kernels/seeded_hash.hpp"

namespace starling::actors::vi {

using messages::vi_downlink;
using messages::vi_phase;
using messages::vi_uplink;

namespace {

uint8_t as_byte(vi_phase p) {
  return static_cast<uint8_t>(p);
}

const char* phase_name(uint8_t p) {
  switch (static_cast<vi_phase>(p)) {
  case vi_phase::full:
    return "full";
  case vi_phase::compressed:
    return "compressed";
  case vi_phase::eg_point:
    return "eg_point";
  case vi_phase::eg_half:
    return "eg_half";
  }
  return "unknown";
}

/// The per-round stream every party draws the Rand-k seed from under `shared_randomness`.
std::mt19937_64 round_stream(uint64_t seed, uint64_t round) {
  using kernels::splitmix64_mix;
  return std::mt19937_64{splitmix64_mix(splitmix64_mix(seed ^ 0x726f756e64ULL) + round)};
}

vi_phase first_phase(method_kind m) {
  return m == method_kind::extragradient ? vi_phase::eg_point : vi_phase::full;
}

} // namespace

std::unique_ptr<vector_compressor> make_compressor(const codec_spec& spec) {
  switch (spec.kind) {
  case codec_kind::rand_k:
    return make_rand_k(spec.k);
  case codec_kind::top_k:
    return make_top_k(spec.k);
  case codec_kind::dense:
    break;
  }
  return make_dense();
}

std::string to_string(method_kind m) {
  switch (m) {
  case method_kind::extragradient:
    return "extragradient";
  case method_kind::masha1:
    return "masha1";
  case method_kind::masha2:
    return "masha2";
  }
  return "unknown";
}

// Parameter choice.
//
// Extragradient: γ = 1/(2L), L the Lipschitz constant of F (EG converges for γ < 1/L on
// strongly monotone Lipschitz operators; 1/2 keeps the contraction factor near its best).
//
// MASHA1 is a loopless variance-reduced extragradient (Alacaoglu & Malitsky 2021) whose
// stochastic part is the compressed difference g = Q_s((1/M) Σ Q_m(F_m(z_{k+1/2}) − F_m(w))).
// With unbiased compressors of variance parameters q_w (workers) and q_s (server),
//   E‖g‖² ≤ q_s (L² + (q_w − 1) L̃² / M) ‖z_{k+1/2} − w‖² =: L_Q² ‖z_{k+1/2} − w‖²,
// (L̃² = (1/M) Σ L_m²), and MASHA1's theorem needs γ ≲ sqrt(1 − τ) / L_Q (it also caps γ by
// (1 − τ)/μ-type terms that are inactive here). We take
//   1 − τ = 1/q_w   (q_w = d/k for Rand-k): a full round costs 2·32·d bits per worker, a
//                   compressed one about 2·32·k, so refreshing w with probability k/d makes
//                   both kinds of rounds cost the same in expectation — the paper's choice of
//                   τ tied to the compression ratio;
//   γ = sqrt(1 − τ) / L_Q  (the theorem's constant 1/2 dropped: measured on the bilinear
//                   problem it only doubles the iterations; see the README).
//
// MASHA2 replaces Q by Top-k with error feedback (contraction δ = k/d) on both sides. Error
// feedback tolerates only steps of order δ/L (the compressed-away residual is applied up to
// ~1/δ iterations late); we use
//   1 − τ = δ_w, γ = min(sqrt(δ)/(2L), 2δ/L): sqrt(δ)/(2L) keeps the step close to MASHA1's
// where it converges (δ = 0.1: it is the best of the scanned steps), the cap 2δ/L makes δ = 0.01
// converge (sqrt(δ)/(2L) = 5δ/L diverges there). Measured in the README.
double compressed_lipschitz(const method_options& o, const vi_problem& problem) {
  const double m = static_cast<double>(problem.workers());
  const double l = problem.lipschitz();
  const double lt = problem.mean_square_lipschitz();
  const double qw = make_compressor(o.worker_codec)->parameter(problem.dim());
  const double qs = make_compressor(o.server_codec)->parameter(problem.dim());
  if (o.shared_randomness && o.worker_codec.kind == codec_kind::rand_k) {
    // One index set for all: (1/M) Σ Q(Δ_m) = Q(Δ̄), E‖Q(Δ̄)‖² = q_w ‖Δ̄‖² ≤ q_w L² ‖z − w‖²;
    // the server forwards that k-sparse average exactly (dense, or Rand-k on the same seed).
    const bool exact_forward =
        o.server_codec.kind == codec_kind::dense || o.server_codec.kind == codec_kind::rand_k;
    return std::sqrt((exact_forward ? 1.0 : qs) * qw) * l;
  }
  return std::sqrt(qs * (l * l + (qw - 1.0) * lt * lt / m));
}

method_options recommended_options(method_options o, const vi_problem& problem,
                                   double gamma_scale) {
  const double d = static_cast<double>(problem.dim());
  const double l = problem.lipschitz();
  switch (o.method) {
  case method_kind::extragradient:
    o.gamma = 0.5 / l;
    o.tau = 1.0;
    o.worker_codec = {codec_kind::dense, 0};
    o.server_codec = {codec_kind::dense, 0};
    o.shared_randomness = false;
    break;
  case method_kind::masha1: {
    const double qw = make_compressor(o.worker_codec)->parameter(problem.dim());
    o.tau = 1.0 - 1.0 / qw;
    o.gamma = std::sqrt(1.0 - o.tau) / compressed_lipschitz(o, problem);
    break;
  }
  case method_kind::masha2: {
    const double delta = o.worker_codec.kind == codec_kind::dense
                             ? 1.0
                             : std::min(1.0, static_cast<double>(o.worker_codec.k) / d);
    o.tau = 1.0 - delta;
    // sqrt(δ)/(2L) (measured best at δ = 0.1) capped at 2δ/L, the error-feedback scale: at
    // δ = 0.01 the uncapped step diverges (README, bench_masha2_small_k).
    o.gamma = std::min(std::sqrt(delta) / (2.0 * l), 2.0 * delta / l);
    break;
  }
  }
  o.gamma *= gamma_scale;
  return o;
}

method_options recommended_options(method_kind method, const vi_problem& problem,
                                   codec_spec worker_codec, codec_spec server_codec, uint64_t seed,
                                   double gamma_scale) {
  method_options o;
  o.method = method;
  o.worker_codec = worker_codec;
  o.server_codec = server_codec;
  o.seed = seed;
  return recommended_options(o, problem, gamma_scale);
}

// --- worker ---------------------------------------------------------------------------------

worker_core::worker_core(std::shared_ptr<const vi_problem> problem, std::size_t index,
                         method_options options, std::vector<double> z0)
    : problem_(std::move(problem)),
      index_(index),
      options_(options),
      codec_(make_compressor(options.worker_codec)),
      // splitmix64 decorrelates the per-worker and server streams derived from one run seed.
      rng_(kernels::splitmix64_mix(options.seed * 1000003ULL + index + 1)),
      phase_(first_phase(options.method)),
      z_(std::move(z0)) {
  w_ = z_;
  error_.assign(z_.size(), 0.0);
}

vi_uplink worker_core::uplink() {
  vi_uplink up;
  up.worker = static_cast<uint32_t>(index_);
  up.round = round_;
  up.phase = as_byte(phase_);
  const auto n = z_.size();
  switch (phase_) {
  case vi_phase::eg_point:
    problem_->apply(index_, z_, scratch_);
    up.payload = make_dense()->compress(scratch_, rng_).wire;
    break;
  case vi_phase::eg_half:
    problem_->apply(index_, z_half_, scratch_);
    up.payload = make_dense()->compress(scratch_, rng_).wire;
    break;
  case vi_phase::full:
    problem_->apply(index_, w_, f_m_w_);
    up.payload = make_dense()->compress(f_m_w_, rng_).wire;
    break;
  case vi_phase::compressed: {
    // z̄ = τz + (1 − τ)w; z_{k+1/2} = prox(z̄ − γF(w)).
    z_bar_.resize(n);
    z_half_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      z_bar_[i] = options_.tau * z_[i] + (1.0 - options_.tau) * w_[i];
      z_half_[i] = z_bar_[i] - options_.gamma * f_w_[i];
    }
    problem_->prox(z_half_);
    problem_->apply(index_, z_half_, scratch_);
    for (std::size_t i = 0; i < n; ++i)
      scratch_[i] -= f_m_w_[i];
    if (options_.method == method_kind::masha2) {
      // Error feedback: send C(γΔ + e), keep what the compressor dropped.
      for (std::size_t i = 0; i < n; ++i)
        scratch_[i] = options_.gamma * scratch_[i] + error_[i];
      auto c = codec_->compress(scratch_, rng_);
      for (std::size_t i = 0; i < n; ++i)
        error_[i] = scratch_[i] - c.seen[i];
      up.payload = std::move(c.wire);
    } else if (options_.shared_randomness) {
      auto shared = round_stream(options_.seed, round_);
      up.payload = codec_->compress(scratch_, shared).wire;
    } else {
      up.payload = codec_->compress(scratch_, rng_).wire;
    }
    break;
  }
  }
  bits_up_ += messages::payload_bits(up.payload);
  return up;
}

status worker_core::downlink(const vi_downlink& msg) {
  if (msg.round != round_ || msg.phase != as_byte(phase_))
    return fail(fmt::format("worker {}: reply for round {} ({}), expected round {} ({})", index_,
                            msg.round, phase_name(msg.phase), round_, phase_name(as_byte(phase_))));
  auto v = decode(msg.payload, z_.size());
  if (!v)
    return fail(fmt::format("worker {}: {}", index_, v.error().what));
  const auto& g = *v;
  const auto n = z_.size();
  bits_down_ += messages::payload_bits(msg);
  switch (phase_) {
  case vi_phase::eg_point:
    z_half_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      z_half_[i] = z_[i] - options_.gamma * g[i];
    problem_->prox(z_half_);
    phase_ = vi_phase::eg_half;
    break;
  case vi_phase::eg_half:
    for (std::size_t i = 0; i < n; ++i)
      z_[i] -= options_.gamma * g[i];
    problem_->prox(z_);
    ++iterations_;
    phase_ = vi_phase::eg_point;
    break;
  case vi_phase::full:
    f_w_ = g;
    phase_ = vi_phase::compressed;
    break;
  case vi_phase::compressed: {
    // MASHA1 receives the compressed difference, MASHA2 the compressed γ-scaled one.
    const double scale = options_.method == method_kind::masha2 ? 1.0 : options_.gamma;
    for (std::size_t i = 0; i < n; ++i)
      z_[i] = z_bar_[i] - options_.gamma * f_w_[i] - scale * g[i];
    problem_->prox(z_);
    ++iterations_;
    if (msg.coin) {
      w_ = z_;
      phase_ = vi_phase::full;
    }
    break;
  }
  }
  ++round_;
  return {};
}

// --- server ---------------------------------------------------------------------------------

server_core::server_core(std::size_t dim, method_options options)
    : dim_(dim),
      options_(options),
      codec_(make_compressor(options.server_codec)),
      rng_(kernels::splitmix64_mix(options.seed * 1000003ULL)),
      // Own stream: coins do not depend on codecs.
      coin_rng_(kernels::splitmix64_mix(options.seed ^ 0x636f696eULL)),
      phase_(first_phase(options.method)) {
  error_.assign(dim, 0.0);
}

result<vi_downlink> server_core::aggregate(const std::vector<vi_uplink>& uplinks) {
  if (uplinks.empty())
    return fail(fmt::format("server: no worker contributions for round {}", round_));
  std::vector<double> avg(dim_, 0.0);
  for (const auto& up : uplinks) {
    if (up.round != round_ || up.phase != as_byte(phase_))
      return fail(fmt::format("server: worker {} sent round {} ({}), expected round {} ({})",
                              up.worker, up.round, phase_name(up.phase), round_,
                              phase_name(as_byte(phase_))));
    if (phase_ == vi_phase::compressed && options_.shared_randomness &&
        up.payload.codec == static_cast<uint8_t>(messages::vi_codec::rand_k) &&
        up.payload.seed != round_stream(options_.seed, round_)())
      return fail(fmt::format("server: worker {} used Rand-k seed {} in round {}, expected the "
                              "round's shared seed {}",
                              up.worker, up.payload.seed, round_,
                              round_stream(options_.seed, round_)()));
    auto v = decode(up.payload, dim_);
    if (!v)
      return fail(fmt::format("server: worker {}: {}", up.worker, v.error().what));
    for (std::size_t i = 0; i < dim_; ++i)
      avg[i] += (*v)[i];
  }
  for (auto& x : avg)
    x /= static_cast<double>(uplinks.size());
  vi_downlink out;
  out.round = round_;
  out.phase = as_byte(phase_);
  switch (phase_) {
  case vi_phase::eg_point:
    out.payload = make_dense()->compress(avg, rng_).wire;
    phase_ = vi_phase::eg_half;
    break;
  case vi_phase::eg_half:
    out.payload = make_dense()->compress(avg, rng_).wire;
    phase_ = vi_phase::eg_point;
    break;
  case vi_phase::full:
    out.payload = make_dense()->compress(avg, rng_).wire;
    phase_ = vi_phase::compressed;
    break;
  case vi_phase::compressed: {
    if (options_.method == method_kind::masha2) {
      for (std::size_t i = 0; i < dim_; ++i)
        avg[i] += error_[i];
      auto c = codec_->compress(avg, rng_);
      for (std::size_t i = 0; i < dim_; ++i)
        error_[i] = avg[i] - c.seen[i];
      out.payload = std::move(c.wire);
    } else if (options_.shared_randomness && options_.server_codec.kind == codec_kind::rand_k &&
               options_.worker_codec.kind == codec_kind::rand_k) {
      // Every worker drew its Rand-k seed from the round's stream, so `avg` is zero outside
      // those k indices: the server sends them under the same seed, unscaled by k/d so the
      // receiver's d/k scale restores `avg` exactly (no second compression variance).
      messages::vi_vector w;
      w.codec = static_cast<uint8_t>(messages::vi_codec::rand_k);
      w.dim = static_cast<uint32_t>(dim_);
      w.seed = round_stream(options_.seed, round_)();
      const auto k = std::min(options_.worker_codec.k, dim_);
      const double unscale = static_cast<double>(k) / static_cast<double>(dim_);
      for (auto i : rand_k_indices(w.seed, dim_, k))
        w.values.push_back(static_cast<float>(avg[i] * unscale));
      out.payload = std::move(w);
    } else {
      out.payload = codec_->compress(avg, rng_).wire;
    }
    // One shared coin: with probability 1 − τ every replica moves w to the new z.
    out.coin = std::bernoulli_distribution{1.0 - options_.tau}(coin_rng_);
    if (out.coin)
      phase_ = vi_phase::full;
    break;
  }
  }
  ++round_;
  return out;
}

// --- pure run -------------------------------------------------------------------------------

status run_cores(const std::shared_ptr<const vi_problem>& problem, const method_options& options,
                 std::size_t max_iterations,
                 const std::function<bool(const worker_core&)>& observe) {
  const auto m = problem->workers();
  std::vector<worker_core> workers;
  workers.reserve(m);
  for (std::size_t i = 0; i < m; ++i)
    workers.emplace_back(problem, i, options, std::vector<double>(problem->dim(), 0.0));
  server_core server{problem->dim(), options};
  std::vector<vi_uplink> ups(m);
  std::size_t recorded = 0;
  while (workers[0].iterations() < max_iterations || workers[0].phase() == vi_phase::full) {
    for (std::size_t i = 0; i < m; ++i)
      ups[i] = workers[i].uplink();
    auto down = server.aggregate(ups);
    if (!down)
      return down.error();
    for (auto& w : workers)
      if (auto st = w.downlink(*down); !st)
        return fail(st.what());
    const auto& w0 = workers[0];
    // Observe once an iteration is complete and any full round it triggered is paid for.
    if (w0.iterations() == recorded || w0.phase() == vi_phase::full)
      continue;
    recorded = w0.iterations();
    if (!observe(w0))
      break;
  }
  return {};
}

result<run_report> run_pure(const std::shared_ptr<const bilinear_problem>& problem,
                            const method_options& options, const run_limits& limits) {
  run_report report;
  std::string diverged;
  auto st = run_cores(problem, options, limits.max_iterations, [&](const worker_core& w0) {
    trace_point p{w0.iterations(), problem->relative_error(w0.z()), w0.bits_up(), w0.bits_down()};
    report.trace.push_back(p);
    report.z = w0.z();
    report.iterations = w0.iterations();
    if (!std::isfinite(p.relative_error)) {
      diverged = fmt::format("{} diverged at iteration {}", to_string(options.method), p.iteration);
      return false;
    }
    if (limits.target > 0 && p.relative_error <= limits.target) {
      report.reached = true;
      return false;
    }
    return true;
  });
  if (!st)
    return fail(st.what());
  if (!diverged.empty())
    return fail(diverged);
  return report;
}

} // namespace starling::actors::vi
