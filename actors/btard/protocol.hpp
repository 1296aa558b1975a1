// BTARD-SGD (Gorbunov et al. 2022, Algorithms 1–3) for a group of peers in one process: every
// peer computes its public batch's gradient, commits to its parts, sends them to their
// aggregators, which run CenteredClip (fp64) and commit to their results; then the group draws
// shared randomness (MPRNG), checks every aggregate along random directions, validators recompute
// their targets' gradients, accusations are re-checked and decided by the verdict rules, and the
// aggregation is redone without anyone removed or banned until a step ends clean. Only then does
// any peer apply the aggregate, so every honest peer applies the same vector.
//
// What is real here: keys and signatures (Ed25519 statements of commitment.hpp), part digests,
// MPRNG commit/reveal, the aggregate check's bound, validators drawn from r_t, verdicts by
// verdict.hpp's table, bans by membership.hpp's rules, the attacks of attacks.hpp, LibTorch
// gradients of public batches. What is simulated: the network. The public board stands for the
// DHT after honest peers re-store what they read (so a statement one honest peer saw, every
// honest peer sees by the deadline, and two conflicting signed values for one slot are a proof);
// a part "sent" to an aggregator is read in place from its sender's vector (a copy only where
// an attack changes it), as the plain mean reads its inputs. Peers run in lockstep, one phase
// after another, which is the order the deadlines impose.
//
// Decisions: each honest peer keeps its own membership view (bans, silences, cool-downs) and
// decides every verdict itself from the public board and its re-checks; re-checks are pure
// functions of public values (the batch seed, parameters every honest peer holds, committed
// parts), so the engine computes each once and hands the outcome to every honest view.
//
// Validators contribute to the step they validate: r_t is drawn after the step's commitments,
// so validators are known only once their own gradients are committed (in the paper they skip
// their own computation; here validation costs one extra gradient per validator and step).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/btard/aggregate_check.hpp"
#include "actors/btard/attacks.hpp"
#include "actors/btard/commitment.hpp"
#include "actors/btard/membership.hpp"
#include "actors/btard/mprng.hpp"
#include "actors/btard/task.hpp"
#include "actors/btard/verdict.hpp"
#include "kernels/result.hpp"

namespace starling::actors::auth {
class key_pair;
} // namespace starling::actors::auth

namespace starling::actors::btard {

/// How a step's gradients are combined.
enum class aggregation_rule : uint8_t {
  /// The plain mean, no protocol.
  mean,
  /// CenteredClip per part (fp64), no protocol: what a trusted server would do.
  centered_clip,
  /// CenteredClip per part with commitments, MPRNG, checks, validators and bans.
  btard,
};
const char* rule_name(aggregation_rule r);
result<aggregation_rule> parse_rule(const std::string& name);

/// What a Byzantine peer does to the protocol itself (once, at `protocol_step`).
enum class protocol_attack : uint8_t {
  none,
  /// As aggregator: publishes and sends CenteredClip + a large offset (committed consistently).
  gross_aggregate,
  /// As aggregator: CenteredClip with τ/4 instead of τ.
  other_tau,
  /// As aggregator: CenteredClip without one contribution.
  leave_one_out,
  /// Sends an aggregator values other than its commitment.
  part_not_committed,
  /// Publishes two different digests for one part (different DHT replicas).
  equivocate_digest,
  /// As aggregator: sends one receiver a result other than its published digest.
  different_results,
  /// Accuses an honest peer of a wrong gradient.
  false_accusation,
  /// Commits to MPRNG and does not reveal.
  withhold_reveal,
  /// Sends an aggregator nothing.
  missing_part,
  /// Publishes a false projection pair for one part.
  lie_projection,
  /// Commits to and sends an aggregator a part holding a NaN (the digest matches: only the
  /// values are wrong, and no CenteredClip may read them).
  non_finite_part,
  /// As aggregator: publishes and sends a result holding a NaN (committed consistently).
  non_finite_result,
};
const char* protocol_attack_name(protocol_attack a);
result<protocol_attack> parse_protocol_attack(const std::string& name);
/// Every protocol attack but `none`, in declaration order.
std::vector<protocol_attack> protocol_attacks();

/// One peer of a simulated group.
struct peer_spec {
  /// Its gradient attack (kind none: honest gradients).
  attack_options gradient;
  /// Its protocol attack.
  protocol_attack protocol = protocol_attack::none;
  /// The step of the protocol attack.
  uint64_t protocol_step = 0;
  /// Offline (crashed) for steps [crash_at, crash_at + crash_steps), and again every
  /// `crash_every` steps after crash_at when that is not 0 (a flapping peer).
  uint64_t crash_at = 0;
  uint64_t crash_steps = 0;
  uint64_t crash_every = 0;
  /// Byzantine: any attack.
  bool byzantine() const {
    return gradient.kind != attack_kind::none || protocol != protocol_attack::none;
  }
  bool offline_at(uint64_t step) const {
    if (crash_steps == 0 || step < crash_at)
      return false;
    return (crash_every == 0 ? step - crash_at : (step - crash_at) % crash_every) < crash_steps;
  }
};

/// Settings of a group.
struct group_options {
  /// The run's id (bound into every signed statement).
  std::string run_id = "btard";
  aggregation_rule rule = aggregation_rule::btard;
  /// CenteredClip: τ, iteration cap, stop tolerance (YAML `tau`, `iterations`, `tolerance`).
  double tau = 1.0;
  size_t max_iterations = 100;
  double tolerance = 1e-6;
  /// Validators per step.
  size_t validators = 1;
  /// 0: validators compare digests (bitwise: one process, one LibTorch thread); else the largest
  /// ‖recomputed − sent‖/‖recomputed‖ per part accepted (across machines).
  double validation_rel_tolerance = 0.0;
  /// The aggregate check's false-alarm margin (standard deviations).
  double sigmas = 6.0;
  membership_options membership;
  /// SGD with Nesterov momentum, no clipping.
  double lr = 0.1;
  double momentum = 0.9;
  /// Seed of the first step's shared randomness (r_{-1}).
  uint64_t seed = 0;
  /// Aggregations of one step at most (each redo removes at least one peer).
  size_t max_attempts = 64;
};
status validate(const group_options& o);

/// A decided accusation, as logged.
struct verdict_record {
  signed_statement accusation;
  recheck outcome = recheck::refuted;
  std::optional<equivocation_proof> proof;
  verdict decision;
  std::vector<std::string> newly_banned;
};

/// The aggregate check of one part.
struct check_record {
  uint64_t part = 0;
  /// ‖ĝ[i]‖ of the published aggregate (a public fact of the check).
  double aggregate_norm = 0.0;
  double residual = 0.0;
  double bound = 0.0;
  bool accepted = false;
  /// The check failed and nobody was to blame: the published aggregate is CenteredClip of the
  /// committed contributions with the run's τ, iteration cap and tolerance, as every honest peer
  /// found by recomputing it (it had not converged within the cap: aggregate_check.hpp). The
  /// part is applied.
  bool recomputed = false;
};

/// One aggregation of a step (a redo starts a new one).
struct attempt_record {
  uint32_t attempt = 0;
  /// The group, in key order (member i aggregates part i).
  std::vector<std::string> members;
  /// Every signed statement of the attempt, in publication order (part digests, results, MPRNG
  /// commits and reveals, projections, accusations; an equivocator's second statements too).
  std::vector<signed_statement> statements;
  /// The MPRNG value (absent when the attempt ended before the draw).
  std::optional<digest> r;
  /// MPRNG attempt numbers used by this aggregation (its commitments' slots).
  uint32_t mprng_attempt = 0;
  std::vector<validation> validations;
  std::vector<check_record> checks;
  std::vector<verdict_record> verdicts;
  /// Equivocation proofs found on the board (each bans its signer).
  std::vector<equivocation_proof> proofs;
  /// Members that published nothing (crashed): removed for the step.
  std::vector<std::string> silent;
  /// Keys banned in this attempt (as the first honest peer decided).
  std::vector<std::string> banned;
  /// Whether this attempt's aggregate was applied.
  bool applied = false;
  /// CenteredClip: inputs farther than τ from the part's aggregate, and inputs in all.
  size_t clipped = 0, inputs = 0;
  /// CenteredClip: the most iterations any part took, and whether every part converged.
  size_t iterations = 0;
  bool converged = true;
  /// Bytes the group moved: parts and results between members (each member keeps its own
  /// part), and the signed statements published (each counted once, not per replica).
  uint64_t bytes_data = 0;
  uint64_t bytes_statements = 0;
  /// Wall time per phase in milliseconds (commit, deliver, aggregate, mprng, check, validate,
  /// verdicts, other), the whole group in one thread; the part digests of every phase are
  /// counted apart, as "hash".
  std::map<std::string, double> ms;
};

/// One step of the group.
struct step_record {
  uint64_t step = 0;
  /// The shared randomness the step's seeds come from (the last applied r, or r_{-1}).
  digest r_prev{};
  /// Batch seed per member.
  std::map<std::string, uint64_t> seeds;
  std::vector<attempt_record> attempts;
  /// Digest of every online peer's parameters after the step (honest ones are equal).
  std::map<std::string, digest> params;
  /// Whether an aggregate was applied (false: too few members left).
  bool applied = false;
  /// Peers that took part in the applied aggregation.
  size_t contributors = 0;
  /// What banned peers that are still online tried this step and every honest peer refused:
  /// their statements (ignored by readers, refused by gates) and their parts (never taken by an
  /// aggregator). A ban is by key, so a banned peer that restarts stays refused.
  size_t refused_statements = 0;
  size_t refused_parts = 0;
  /// Wall time of the members' gradients and of the attacks (ms).
  double ms_gradients = 0.0;
  double ms_attacks = 0.0;
  /// Wall time of applying the aggregate and of every peer's parameter digest (ms).
  double ms_apply = 0.0;
};

/// Digest of a parameter vector (BLAKE2b-256 of its float32 bytes).
digest params_digest(const std::vector<float>& params);

/// The first step's shared randomness of a run.
digest initial_randomness(const std::string& run_id, uint64_t seed);

/// The shared randomness after a step whose last aggregation drew none (too few members, or
/// a plain rule): a hash of the one before.
digest skipped_randomness(const digest& r_prev);

/// A group of peers training one model with BTARD (or a plain rule) in one process.
class simulated_group {
public:
  /// Peers get the keys given (one per spec; their public keys order the group). Fails on invalid
  /// options, attack options, a key count that differs from the spec count, or fewer than 2 peers.
  static result<std::unique_ptr<simulated_group>>
  make(const group_options& o, std::shared_ptr<const task> t, std::vector<peer_spec> specs,
       std::vector<auth::key_pair> keys);
  ~simulated_group();
  simulated_group(const simulated_group&) = delete;
  simulated_group& operator=(const simulated_group&) = delete;

  /// Runs the next step. Fails on a task error (a gradient of the wrong size); a step where too
  /// few members remain is recorded with applied = false.
  result<step_record> step();

  /// The step `step()` runs next.
  uint64_t next_step() const;
  size_t size() const;
  /// Public key of peer i (in spec order).
  const std::string& key_of(size_t i) const;
  /// Index of a public key (in spec order); fails on an unknown key.
  std::optional<size_t> index_of(const std::string& key) const;
  const peer_spec& spec_of(size_t i) const;
  /// Peer i's parameters.
  const std::vector<float>& params_of(size_t i) const;
  /// Keys peer i has banned, with reasons.
  const std::map<std::string, std::string>& bans_of(size_t i) const;
  /// The first honest peer's parameters (the run's model).
  const std::vector<float>& model() const;
  const task& model_task() const;
  const group_options& options() const;

private:
  struct impl;
  explicit simulated_group(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

} // namespace starling::actors::btard
