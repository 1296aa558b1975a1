// BTARD's multi-party random number generator (MPRNG), once per step, after every commitment of
// the step is public, and what the step's shared randomness decides.
//
// Round (attempt a of step t): each participant draws 32 random bytes r, publishes the
// commitment BLAKE2b(tag | t | a | its key | r), and once the commitments are closed (all in, or
// the deadline passed) publishes r. The value is r_t = BLAKE2b(tag | t | a | count | (key | r)
// for each committer in key order). The commitment is bound to its signer's key: a copied
// commitment does not open for the copier, who would have to reveal someone else's r under its
// own key and fails the check. A participant that commits and then does not reveal (or reveals
// an r that does not open its commitment) is a withholder: banned, and the value is drawn again
// as attempt a + 1 by the others, with FRESH r's (reusing them would let the withholder know the
// redraw's value before choosing to withhold). The last revealer can see the others' r and
// choose between the value and a redraw it cannot predict; each such choice costs it a ban, so
// an attacker gets at most one redraw per ban. A participant that does not commit by the commit
// deadline is silent: removed for the rest of the step (a crash is the common cause), not banned.
//
// Everything drawn from r_t is a pure function stated here: a check direction seed per part
// (aggregate_check.hpp expands it), m validators and their targets among the peers not banned,
// and next step's batch seed per peer. Peers are always named by their 32-byte public keys, and
// every draw runs over the keys in sorted order, so bans that change n change nothing else.
// No CAF.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/btard/digest.hpp"
#include "kernels/result.hpp"

namespace starling::actors::btard {

/// The commitment to `r` of the peer with public key `key` at attempt `attempt` of step `step`.
digest mprng_commitment(uint64_t step, uint32_t attempt, std::string_view key, const digest& r);

/// r_t of the reveals (by key; iterated in key order).
digest mprng_value(uint64_t step, uint32_t attempt, const std::map<std::string, digest>& reveals);

/// Where a round is.
enum class mprng_phase : uint8_t {
  /// Taking commitments.
  commits,
  /// Commitments closed; taking reveals.
  reveals,
  /// `finish` was called.
  finished,
};

/// The end of a round.
struct mprng_outcome {
  /// r_t, when every committer revealed (and at least one committed).
  std::optional<digest> value;
  /// Committed but did not reveal, or revealed an r that does not open the commitment: ban.
  std::vector<std::string> withholders;
  /// Participants that did not commit before the commitments closed: removed for the step.
  std::vector<std::string> silent;
  /// Who draws again when there is no value: the committers that are not withholders.
  std::vector<std::string> next_participants;
  /// The attempt number of the redraw.
  uint32_t next_attempt = 0;
};

/// One MPRNG attempt of one step: a state machine fed with verified commitments and reveals (the
/// caller checked their signatures; conflicting signed ones are the ledger's equivocation).
class mprng_round {
public:
  /// A round among `participants` (32-byte keys, no duplicates; at least one).
  static result<mprng_round> start(uint64_t step, uint32_t attempt,
                                   std::vector<std::string> participants);

  /// Takes `key`'s commitment. Fails for a non-participant, after the commitments closed, or for
  /// a second, different commitment (the first stays); the same one again is accepted.
  status add_commit(std::string_view key, const digest& commitment);

  /// The commit deadline passed: no more commitments. `finish` calls it when needed.
  void close_commits();

  /// Takes `key`'s reveal. Fails for a key without a commitment (a reveal before its commitment
  /// arrived: offer it again later), and for an r that does not open the commitment: the key is
  /// then a withholder for good, whatever it reveals next. A reveal that comes before the
  /// commitments close is kept but closes nothing (else one fast peer could shut out the slow
  /// ones); an honest peer reveals only once its own view of the commitments has closed.
  status add_reveal(std::string_view key, const digest& r);

  /// True when every participant committed and every committer revealed: `finish` need not
  /// wait for the deadline.
  bool complete() const;

  /// Ends the round (the reveal deadline passed, or `complete()`).
  mprng_outcome finish();

  /// The phase.
  mprng_phase phase() const noexcept { return phase_; }
  /// The step.
  uint64_t step() const noexcept { return step_; }
  /// The attempt.
  uint32_t attempt() const noexcept { return attempt_; }
  /// The participants, sorted.
  const std::vector<std::string>& participants() const noexcept { return participants_; }

private:
  mprng_round(uint64_t step, uint32_t attempt, std::vector<std::string> participants)
      : step_(step), attempt_(attempt), participants_(std::move(participants)) {}
  bool participant(std::string_view key) const;

  uint64_t step_;
  uint32_t attempt_;
  std::vector<std::string> participants_;
  mprng_phase phase_ = mprng_phase::commits;
  std::map<std::string, digest, std::less<>> commits_;
  std::map<std::string, digest> reveals_;
  std::set<std::string, std::less<>> cheated_;
};

/// The seed of part `part`'s check direction z_i (`aggregate_check.hpp`'s gaussian_direction).
/// r_t must be the value drawn after the commitments of the aggregation it checks: a redone
/// aggregation needs a fresh draw, else its aggregators would know z before committing.
uint64_t direction_seed(const digest& r_t, uint64_t part);

/// The batch seed of the peer with key `key` for the step after r_t's (for `batch_for_step`).
uint64_t batch_seed(const digest& r_t, std::string_view key);

/// A validator and the peer whose gradient it recomputes.
struct validation {
  /// The validator's key.
  std::string validator;
  /// The target's key (never the validator's).
  std::string target;
};

/// How validators are drawn.
struct validator_options {
  /// Validators per step (m).
  size_t count = 1;
  /// Targets are drawn among the peers that are not validators (the paper: validators do not
  /// contribute a gradient that step, so there is nothing of theirs to check). False: among all
  /// peers but the validator itself.
  bool targets_exclude_validators = true;
};

/// m validators (distinct, uniform without replacement among the peers not banned) and each
/// one's target (uniform among the eligible others, independently per validator), from r_t. With
/// m = 1 a given peer is the target of an honest validator with chance (h/n)·1/(n−1) for h honest
/// of n. Fails on malformed or duplicate keys and when there are too few peers (n >= 2, and
/// m < n when targets exclude validators, m <= n otherwise).
result<std::vector<validation>> draw_validators(const digest& r_t,
                                                const std::vector<std::string>& peers,
                                                const std::set<std::string>& banned,
                                                const validator_options& options);

} // namespace starling::actors::btard
