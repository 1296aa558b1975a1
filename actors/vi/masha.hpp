// Extragradient, MASHA1 and MASHA2 (Beznosikov, Richtárik, Diskin, Ryabinin, Gasnikov,
// NeurIPS 2022) as pure worker and server state machines exchanging `vi_uplink` / `vi_downlink`.
// The actors in this folder only move these messages; `run_pure` moves them by function call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "actors/vi/compressor.hpp"
#include "actors/vi/problem.hpp"
#include "kernels/result.hpp"
#include "messages/vi.hpp"

namespace starling::actors::vi {

/// Which method runs.
enum class method_kind {
  /// Uncompressed distributed extragradient: two dense all-reduces per iteration.
  extragradient,
  /// MASHA1: unbiased compressors (Rand-k) on operator differences, both directions.
  masha1,
  /// MASHA2: contractive compressors (Top-k) with error feedback on workers and server.
  masha2,
};

/// Which compressor a side uses.
enum class codec_kind { dense, rand_k, top_k };

/// A compressor choice: kind and k (ignored for dense).
struct codec_spec {
  /// Kind of compressor.
  codec_kind kind = codec_kind::dense;
  /// Number of coordinates kept.
  std::size_t k = 0;
};

/// Builds the compressor a spec names.
std::unique_ptr<vector_compressor> make_compressor(const codec_spec& spec);

/// Everything a method needs besides the problem. Every worker and the server must get the same.
struct method_options {
  /// The method.
  method_kind method = method_kind::masha1;
  /// Step size γ.
  double gamma = 0.1;
  /// MASHA's τ: z̄ = τz + (1 − τ)w, and w ← z with probability 1 − τ after each iteration.
  double tau = 0.9;
  /// Compressor of worker → server messages (MASHA only).
  codec_spec worker_codec{codec_kind::rand_k, 20};
  /// Compressor of server → worker messages (MASHA only); dense turns server compression off.
  codec_spec server_codec{codec_kind::rand_k, 20};
  /// Seeds compressors (per worker and server) and the shared coin, so runs replay exactly.
  uint64_t seed = 1;
  /// Common randomness for Rand-k: in every round all workers and the server draw the Rand-k seed
  /// from one stream derived from `seed` and the round, so the workers' messages share their k
  /// indices, their average is k-sparse and a Rand-k server forwards it exactly on those indices
  /// (its own k is then unused and q_s adds no variance). Off: independent seeds per worker and
  /// server, as in the paper's Algorithm 1.
  bool shared_randomness = false;
};

/// The mean-square Lipschitz constant L_Q of MASHA1's compressed estimator
/// Q_s((1/M) Σ Q_m(F_m(z) − F_m(w))) relative to ‖z − w‖, for the options' codecs (see masha.cpp).
double compressed_lipschitz(const method_options& options, const vi_problem& problem);

/// γ and τ from the theory, for a problem's constants (see the comment in masha.cpp); γ is
/// multiplied by `gamma_scale` (1 = the recommended value).
method_options recommended_options(method_kind method, const vi_problem& problem,
                                   codec_spec worker_codec, codec_spec server_codec,
                                   uint64_t seed = 1, double gamma_scale = 1.0);

/// γ and τ from the theory for `base`'s method, codecs and `shared_randomness` (the rest of
/// `base` is kept); γ is multiplied by `gamma_scale`.
method_options recommended_options(method_options base, const vi_problem& problem,
                                   double gamma_scale = 1.0);

/// One worker's state: its replica of z (and w), its part F_m, its error-feedback memory.
class worker_core {
public:
  /// Worker `index` of `problem`, starting from z0 (w0 = z0).
  worker_core(std::shared_ptr<const vi_problem> problem, std::size_t index, method_options options,
              std::vector<double> z0);
  /// The message this worker sends in the current round (computes F_m once per round).
  messages::vi_uplink uplink();
  /// Applies the server's reply of the current round; fails on a round/phase mismatch or a
  /// malformed vector, leaving the state untouched.
  status downlink(const messages::vi_downlink& msg);
  /// The current iterate z.
  const std::vector<double>& z() const { return z_; }
  /// Completed iterations (z updates).
  std::size_t iterations() const { return iterations_; }
  /// The round the next message belongs to.
  uint64_t round() const { return round_; }
  /// Phase of the current round.
  messages::vi_phase phase() const { return phase_; }
  /// Payload bits this worker has sent.
  uint64_t bits_up() const { return bits_up_; }
  /// Payload bits this worker has received.
  uint64_t bits_down() const { return bits_down_; }

private:
  std::shared_ptr<const vi_problem> problem_;
  std::size_t index_;
  method_options options_;
  std::unique_ptr<vector_compressor> codec_;
  std::mt19937_64 rng_;
  messages::vi_phase phase_;
  uint64_t round_ = 0;
  std::size_t iterations_ = 0;
  std::vector<double> z_, w_, z_bar_, z_half_;
  std::vector<double> f_w_;   // F(w) as received from the server
  std::vector<double> f_m_w_; // own F_m(w), exact
  std::vector<double> scratch_;
  std::vector<double> error_; // MASHA2 error feedback e_m
  uint64_t bits_up_ = 0;
  uint64_t bits_down_ = 0;
};

/// The server's state: the round, the shared coin, the server compressor and its error memory.
class server_core {
public:
  /// A server for vectors of length `dim`.
  server_core(std::size_t dim, method_options options);
  /// Aggregates the uplinks of the current round (from every live worker, any order) into the
  /// downlink; fails on an empty set, a round/phase mismatch or a malformed vector.
  result<messages::vi_downlink> aggregate(const std::vector<messages::vi_uplink>& uplinks);
  /// The round it expects next.
  uint64_t round() const { return round_; }
  /// Phase of the current round.
  messages::vi_phase phase() const { return phase_; }

private:
  std::size_t dim_;
  method_options options_;
  std::unique_ptr<vector_compressor> codec_;
  std::mt19937_64 rng_;
  std::mt19937_64 coin_rng_;
  messages::vi_phase phase_;
  uint64_t round_ = 0;
  std::vector<double> error_; // MASHA2 server error feedback e
};

/// One point of a run's trace, recorded after every iteration.
struct trace_point {
  /// Iterations completed.
  std::size_t iteration = 0;
  /// ‖z − z*‖² / ‖z0 − z*‖².
  double relative_error = 0;
  /// Payload bits one worker has sent so far (all workers send the same amounts).
  uint64_t bits_up = 0;
  /// Payload bits one worker has received so far.
  uint64_t bits_down = 0;
};

/// When a run stops.
struct run_limits {
  /// Upper bound on iterations.
  std::size_t max_iterations = 100000;
  /// Stop once the relative error is at most this (0: run all iterations).
  double target = 0;
};

/// What a run did.
struct run_report {
  /// One point per iteration.
  std::vector<trace_point> trace;
  /// Final z of worker 0 (every replica is identical).
  std::vector<double> z;
  /// Whether `target` was reached.
  bool reached = false;
  /// First iteration at or below `target` (the trace's last point when reached).
  std::size_t iterations = 0;
};

/// Runs the method on any problem with M worker cores (all starting at z0 = 0) and one server
/// core, passing messages by call. After every completed iteration (and the full round it
/// triggered, so the bits include it) calls `observe(worker 0)`; stops when `observe` returns
/// false or after `max_iterations` iterations. Fails on a protocol error.
status run_cores(const std::shared_ptr<const vi_problem>& problem, const method_options& options,
                 std::size_t max_iterations,
                 const std::function<bool(const worker_core&)>& observe);

/// Runs the method with M worker cores and one server core, passing messages by call.
result<run_report> run_pure(const std::shared_ptr<const bilinear_problem>& problem,
                            const method_options& options, const run_limits& limits);

/// "extragradient", "masha1" or "masha2".
std::string to_string(method_kind m);

} // namespace starling::actors::vi
