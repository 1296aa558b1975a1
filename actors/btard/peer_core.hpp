// One BTARD peer on its own, for peers in different processes: the same protocol as
// protocol.hpp's lockstep group (commitments, deliveries, CenteredClip per part, MPRNG, the
// aggregate check, validators, verdicts, redo until a step ends clean), cut into phases that a
// driver runs against a public board it reads and writes (actors/btard/board_actor.hpp: the DHT).
// No CAF, no clock: the driver says when a phase's deadline passed.
//
// The board holds two things. Signed statements (commitment.hpp), self-authenticating: anyone
// may store or re-store them, and two conflicting ones of one signer and slot are a proof. And
// data — a part a member sends its aggregator, an aggregator's result — addressed by the digest
// its sender committed to, so a reader takes only the bytes that match the commitment and a
// stranger cannot overwrite them with others. Data on the board is public: every peer can fetch
// every contribution, which is what the re-checks need (a recomputed aggregate, a validator's
// comparison, a lying projection), and a part that never reached the board is a public fact
// rather than a word against a word (the "missing part" dispute is still decided by the
// paper's remove-both rule, kept for the case of a board that lost a record).
//
// Phases of one aggregation (attempt a); each ends with the peer's signed `phase_done` marker
// listing the accusations it filed in it, and a peer waits for every member's marker (and every
// accusation a marker lists) before it decides anything, so honest peers decide on the same
// accusations:
//   0 commit      the part digests (one statement), the parts on the board;
//   1 aggregate   an aggregator checks each contribution to its part against its commitment
//                 (missing: missing_part; non-finite: wrong_gradient), then runs CenteredClip
//                 and publishes its result's digest and the result;
//   2 results     every member checks every result against its digest (missing: missing_part;
//                 non-finite: wrong_aggregate) and commits to its MPRNG secret;
//   3 reveal      MPRNG reveals; r = BLAKE2b of the reveals in key order;
//   4 project     (s, n) of each own part against each result along z_i from r;
//   5 check       aggregators check the pairs against the parts they hold, every peer runs
//                 the aggregate check (a failed one: recompute the part from the committed
//                 contributions, blame the aggregator or a lying pair), validators recompute
//                 their targets' gradients;
// after each marker wait: equivocation proofs ban their signers, a member without a marker is
// silent (removed for the step; banned after repeated silences), accusations are re-checked by
// every peer and decided by verdict.hpp's table. Any removal ends the aggregation and the next
// one runs without the removed on the same gradients. After phase 5 with nobody removed every
// member applies the results (SGD with Nesterov momentum), so honest peers hold the same
// parameters.
//
// What views can differ: a peer decides that a marker is missing at its own deadline. A member
// that publishes exactly around the deadline can be silent in one honest view and present in
// another (the groups then differ and the step fails for both); deadlines far above the
// board's latency make it rare, and a crashed peer (the common case) is silent in every view.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "actors/btard/protocol.hpp"

namespace starling::actors::auth {
class key_pair;
} // namespace starling::actors::auth

namespace starling::actors::btard {

/// What a datum on the board is.
enum class data_kind : uint8_t {
  /// A member's contribution to one part, sent to that part's aggregator.
  part = 1,
  /// An aggregator's result for its part.
  result = 2,
};

/// A datum on the board: addressed by (step, attempt, kind, part, sender) and the digest its
/// sender committed to (`part_digest(step, part, values)`).
struct data_ref {
  uint64_t step = 0;
  uint32_t attempt = 0;
  data_kind kind = data_kind::part;
  uint64_t part = 0;
  /// The sender's 32-byte key (a result's sender is its aggregator).
  std::string sender;
  digest committed{};
  bool operator<(const data_ref& o) const;
  bool operator==(const data_ref& o) const;
};

/// The phases of an aggregation (see the header).
enum class peer_phase : uint8_t {
  commit = 0,
  aggregate = 1,
  results = 2,
  reveal = 3,
  project = 4,
  check = 5,
  /// The step ended (applied or not); `begin_step` starts the next one.
  idle = 6,
  /// This peer is banned in its own view (its verdicts found it guilty): it takes no more part.
  banned = 7,
};
const char* phase_name(peer_phase p);

/// One peer's settings.
struct peer_core_options {
  /// The group's protocol settings (rule must be btard).
  group_options group;
  /// The peer's own gradient attack (kind none: honest) and protocol attack.
  attack_options gradient;
  protocol_attack protocol = protocol_attack::none;
  uint64_t protocol_step = 0;
  /// The keys of every peer whose gradients attack, itself included (IPM and ALIE attackers
  /// collude: they recompute the others' gradients from the public seeds and take the honest
  /// statistics from them; n − b gradients per attacker and step).
  std::set<std::string> colluders;
};

/// Checks `o`: the group's options with rule btard, and colluders for IPM and ALIE. Every
/// protocol attack is
/// staged; on the board `different_results` is a second signed result digest (the data is
/// addressed by digest) and `part_not_committed` is data that does not match its digest.
status validate(const peer_core_options& o);

/// The digest a peer signs for an exported state (`statement_kind::state_digest`).
digest state_digest_of(std::string_view state);

/// The step an exported state starts (0 for bytes that are not a state).
uint64_t state_step(std::string_view state);

/// One BTARD peer driven phase by phase.
class peer_core {
public:
  /// A peer with key `key` among `members` (every peer of the run, its own key included: their
  /// public keys). Fails on invalid options, fewer than 2 members, or its key not among them.
  static result<std::unique_ptr<peer_core>> make(const peer_core_options& o,
                                                 std::shared_ptr<const task> t,
                                                 auth::key_pair key,
                                                 std::vector<std::string> members);
  /// A peer coming back into a running group: `make`, then the state another peer exported at
  /// the start of a step (`export_state`; untrusted bytes, checked field by field: the run, the
  /// model's size, finite values, the membership). The peer starts that step when
  /// `begin_step` is called. Fails as `make` does, on a malformed state, or when the state
  /// says this peer is banned.
  static result<std::unique_ptr<peer_core>> resume(const peer_core_options& o,
                                                   std::shared_ptr<const task> t,
                                                   auth::key_pair key,
                                                   std::vector<std::string> members,
                                                   std::string_view state);
  ~peer_core();
  peer_core(const peer_core&) = delete;
  peer_core& operator=(const peer_core&) = delete;

  /// Starts the next step: computes the gradient of its public batch and publishes its
  /// commitments and parts (taken with `take_statements` / `take_data`). Fails outside `idle`.
  status begin_step();

  /// What to publish now (drained).
  std::vector<signed_statement> take_statements();
  std::vector<std::pair<data_ref, std::vector<float>>> take_data();

  /// A statement read from the board (untrusted: verified here; another run's, a banned
  /// signer's, an old step's, or a bad one is dropped and counted).
  void offer(const signed_statement& s);
  /// A datum read from the board (untrusted): kept when it is one `wanted` names and its values
  /// match the digest; dropped otherwise.
  void offer(const data_ref& ref, const std::vector<float>& values);

  /// The data the current phase still waits for.
  std::vector<data_ref> wanted() const;
  /// True when the current phase's wait is over: every member's marker, every accusation a
  /// marker lists, every wanted datum.
  bool ready() const;
  /// Ends the current wait (ready, or its deadline passed) and runs the next phase's work.
  /// Returns true when the step ended (then `take_record` gives its record). Fails on a task
  /// error or an aggregate that failed its check with nobody to blame.
  result<bool> advance();

  /// The record of the step that ended.
  step_record take_record();

  peer_phase phase() const;
  /// The step running (or the next one, when idle).
  uint64_t step() const;
  /// The current aggregation's attempt and group.
  uint32_t attempt() const;
  const step_group& group() const;
  const std::string& key() const;
  const std::vector<float>& params() const;
  /// Keys this peer has banned, with reasons.
  const std::map<std::string, std::string>& bans() const;
  /// τ, CenteredClip's clipping radius (a resumed peer takes the group's).
  double tau() const;
  /// The shared randomness the next step's seeds come from.
  const digest& randomness() const;
  /// Whether more than half of the current group already marked a phase of a later aggregation
  /// of this step: they went on without someone this peer still counts (its view of who was
  /// silent differs from theirs). Such a peer leaves rather than go on in a group of its own
  /// (a minority cannot fake it: it takes a majority's signed markers).
  bool behind() const;
  /// Whether more than half of the current group already marked a later phase of this
  /// aggregation than the one this peer waits for: they read every marker this peer still
  /// misses (they could not have gone on otherwise), so a missing marker is late on this peer's
  /// board, not silence. The driver extends the wait's deadline while this holds (a bounded
  /// number of times), instead of calling those members silent in a view the majority does
  /// not share. A Byzantine minority cannot make it hold.
  bool majority_ahead() const;
  /// Whether this peer waits for the step's commitments (the first phase of its first
  /// aggregation) and the only members without a marker are coming back at this step (cooled
  /// down and expected again: each takes the state the group offers before it can commit).
  /// The driver gives that wait one more deadline, once per step: every honest peer holds the
  /// same membership, so each waits alike.
  bool only_coming_back_missing() const;
  /// Whether this peer is cooling down in its own view (found silent) at the next step.
  bool cooling_down() const;
  /// Statements and data refused (bad, foreign, from banned signers), over the run.
  uint64_t refused() const;

  /// Everything a peer needs to take the next step with the group: the step, τ, the shared
  /// randomness, the parameters, the momentum and the membership, as they were when the step
  /// (`step()`) began: while idle, the next step's; during a step, that step's start (nothing
  /// but the membership changes before its end). Honest peers export the same bytes at the
  /// same step, so a peer coming back takes the state that most members sign (`state_digest`).
  std::string export_state() const;
  /// The keys the next step's group starts from (while idle): every member neither banned nor
  /// cooling down at `step()`.
  std::vector<std::string> expected() const;
  /// Of those, the members that took the last step (while idle): joined, not coming back after
  /// a cool-down. They are the ones who can sign a state offered to a peer coming back.
  std::vector<std::string> active() const;

private:
  struct impl;
  explicit peer_core(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

} // namespace starling::actors::btard
