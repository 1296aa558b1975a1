// The contribution ledger's side of a peer (issue 42, items 5 and 6): the small summary every
// peer publishes about itself under `<experiment>/ledger/<shard>` in the DHT, how its bytes are
// encoded and read back, and the rule by which a round's partners credit each other with the
// samples they received. No CAF, no torch, no fmt (the decoder is fuzzed in the clang layer).
//
// Where a peer's numbers come from:
// - Its own counts (samples computed, dropped, rounds, bytes, uptime) are its claims: shown as
//   such, never summed into what the run accepted.
// - Samples accepted come only from its partners. A member k of an averaging round reduces one
//   part of the vector and receives from every sender i its weight w_i (the samples in i's
//   gradient) with i's chunks. When i's contribution reached every element of k's part, k credits
//   i with w_i · size_k / Σ size_r over the reducers r ≠ i: a round whose every partner's part
//   took i's contribution credits i with exactly w_i, a partial one with the share that was
//   averaged, and i's own part (its own claim) with nothing. Each peer keeps the credits it gave
//   (cumulative, per partner) and publishes them in its summary: the ledger sums what partners
//   say, never what i says of itself.
//
// SWARM peers publish the same summary (actors/collab/ledger_publisher.hpp): a trainer's computed
// samples are the microbatches it finished (its claim); a stage peer's are the backward samples
// it applied or lost, its rounds its global steps. Samples accepted of a trainer are what the
// stage-0 peers credit it with: a microbatch's backward reaches stage 0 after every other
// stage's, and the stage-0 peer credits it once it applied its gradient (the trainer confirmed
// that attempt), under the trainer's tag (`trainer_credit_name`: the top 24 bits its microbatch
// ids carry), never on the trainer's word.
//
// Records are signed sub-key records (the sub-key carries the node key's owner marker, as the
// progress records of progress.hpp), 64 shards by a hash of the sub-key so that one read returns
// a bounded share of the run; a reader decodes at most `max_ledger_reply_records` per reply.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernels/result.hpp"

namespace starling::actors::collab {

/// Shards of a run's ledger records (`<experiment>/ledger/0` ... `/63`).
inline constexpr size_t ledger_shards = 64;

/// At most this many records of one DHT reply are decoded (the rest are counted, not read).
inline constexpr size_t max_ledger_reply_records = 1024;

/// At most this many partners are credited by name in one summary; the rest are summed.
inline constexpr size_t max_ledger_credits = 64;

/// Longest sub-key (the publisher's record id) a summary may carry, in bytes.
inline constexpr size_t max_ledger_id_bytes = 255;

/// Longest instance or partner name in a summary, in bytes.
inline constexpr size_t max_ledger_name_bytes = 128;

/// Largest count a summary may carry (2^53: exact as a double).
inline constexpr double max_ledger_count = 9007199254740992.0;

/// Longest token id a summary may carry (hex digits).
inline constexpr size_t max_ledger_token_id_bytes = 64;

/// Largest SWARM stage index a summary may carry (0xffff on the wire: none).
inline constexpr int max_ledger_stage = 4095;

/// Samples one peer credited one partner with, over the whole run.
struct ledger_credit {
  /// The partner's instance name.
  std::string peer;
  /// Samples (fractional in partial rounds).
  double samples = 0;
};

/// What one peer publishes about itself.
struct contribution_summary {
  /// The record id (also the sub-key: a record whose id differs is refused).
  std::string id;
  /// The instance name (`dedloc.3`): the ledger's row.
  std::string name;
  /// When the peer made the record, and when it started (DHT clock, seconds).
  double time = 0;
  double started = 0;
  /// Samples it computed, and of those dropped without reaching an update (its claims).
  double computed = 0;
  double dropped = 0;
  /// Averaging rounds it finished, and of those averaged with partners.
  double rounds = 0;
  double rounds_averaged = 0;
  /// Bytes it sent and received averaging.
  double bytes_sent = 0;
  double bytes_received = 0;
  /// It left on purpose (its last record).
  bool left = false;
  /// Samples it credited each partner with (at most `max_ledger_credits`, in name order), and
  /// the partners beyond that bound summed.
  std::vector<ledger_credit> credits;
  double credits_other = 0;
  /// Its latest training loss (NaN: none), and the global step it reached (negative: none): what
  /// a node other than node 0 draws its tiles and loss curve from.
  double loss;
  double step = -1;
  /// The SWARM stage it serves (negative: none).
  int stage = -1;
  /// In a closed run, the id of its node's token (hex, public: the authority's `issued.log` and
  /// deny lists name tokens by it; never the token itself); empty otherwise.
  std::string token_id;

  contribution_summary();
};

/// The value bytes (little-endian): version 2, flags (left, has loss, has step), two times and
/// seven counts as doubles, id, name (length-prefixed), credit count (u16) and each credit (name,
/// double), then the loss and the step (doubles, 0 when absent), the stage (u16, 0xffff: none)
/// and the token id (length-prefixed, may be empty). Names longer than the bounds are cut; a
/// token id that is not lower-case hex of at most `max_ledger_token_id_bytes` is left out.
std::vector<char> encode_summary(const contribution_summary& s);

/// Decodes value bytes from the network: fails, never throws, on a wrong size or version,
/// unknown flags, a count that is negative, not finite or above 2^53, a non-finite time, an
/// empty or oversized id or name, more than `max_ledger_credits` credits, a loss that is not
/// finite, an absent loss or step that is not 0, a stage above `max_ledger_stage`, a token id
/// that is not lower-case hex or too long, or trailing bytes.
result<contribution_summary> decode_summary(const std::vector<char>& bytes);

/// Decodes a record read from the DHT under `subkey`: `decode_summary`, and its id must be the
/// sub-key it was stored under (the DHT checked that the sub-key's owner signed it).
result<contribution_summary> decode_summary_record(const std::string& subkey,
                                                   const std::vector<char>& bytes);

/// The shard of record id `id` (a seeded hash of its bytes, mod `ledger_shards`).
size_t ledger_shard(const std::string& id);

/// `<experiment>/ledger/<shard>`.
std::string ledger_key(const std::string& experiment, size_t shard);

/// What one node's gate refused, as the node publishes it under `<experiment>/ledger/gates`
/// (sub-key: its record id, with the node key's owner marker) so that every node's ledger shows
/// the refusals of the whole run, not only of its own gate (issue 42, item 5). A refused party
/// cannot publish anything itself: the gates that refused it speak for it. Each gate's counts are
/// cumulative within the node's incarnation (`started`); a ledger sums them over the gates.
struct gate_party {
  /// The first hex digits (at most `max_ledger_token_id_bytes`) of the party's public key: the
  /// `peer_id` of the ledger's rows. Only parties whose key the gate knew (a hello that proved
  /// it): a claim the gate could not verify is counted under its reason, never under a name.
  std::string peer_id;
  /// Its refusals at this gate.
  double refusals = 0;
  /// Why it is out of the run (a `banned` or `revoked` refusal's words), empty otherwise.
  std::string ban_reason;
};

/// At most this many parties in one gate record (the gate keeps the same bound); the rest summed.
inline constexpr size_t max_gate_parties = 64;

/// At most this many refusal reasons in one gate record.
inline constexpr size_t max_gate_reasons = 32;

/// Longest refusal reason, and longest ban reason, in bytes.
inline constexpr size_t max_gate_reason_bytes = 64;
inline constexpr size_t max_gate_ban_reason_bytes = 255;

/// One node's gate's refusals (see `gate_party`).
struct gate_summary {
  /// The record id (also the sub-key).
  std::string id;
  /// When the node made the record, and when its gate started counting (DHT clock, seconds).
  double time = 0;
  double started = 0;
  /// Refusals by reason (`expired`, `banned`, ...; at most `max_gate_reasons`, by name).
  std::map<std::string, double> by_reason;
  /// The parties it refused by key (at most `max_gate_parties`), and the refusals of the
  /// parties beyond that bound summed.
  std::vector<gate_party> parties;
  double others = 0;
};

/// `<experiment>/ledger/gates`.
std::string gate_ledger_key(const std::string& experiment);

/// The value bytes (little-endian): version 1, two times and `others` as doubles, the id, the
/// reason count (u8) and each reason (text, double), the party count (u16) and each party (peer
/// id, double, ban reason: length-prefixed, the ban reason may be empty). Longer lists and
/// texts are cut to their bounds.
std::vector<char> encode_gate_summary(const gate_summary& s);

/// Decodes value bytes from the network: fails, never throws, on a wrong size or version, a
/// non-finite time, a count that is negative, not finite or above 2^53, an empty or oversized id,
/// more reasons or parties than the bounds, a reason that is not `[a-z0-9_]`, reasons out of ascending order, a
/// party listed twice, a peer id that is not lower-case hex of 1 to `max_ledger_token_id_bytes` digits, or
/// trailing bytes.
result<gate_summary> decode_gate_summary(const std::vector<char>& bytes);

/// `decode_gate_summary` of a record read under `subkey`: its id must be the sub-key.
result<gate_summary> decode_gate_record(const std::string& subkey, const std::vector<char>& bytes);

/// The credit member `self` gives each member of one round: `part_sizes[m]` is the size of the
/// part member m reduced (0 for a client or when it reduced none), `received[m]` the weight that
/// reached every element of `self`'s part from m (negative: its contribution did not). Member
/// m ≠ self gets received[m] · part_sizes[self] / Σ_{r ≠ m} part_sizes[r] (0 when that sum is 0);
/// `self` gets 0. Sizes and weights that are negative or not finite count as 0.
std::vector<double> round_credits(const std::vector<int64_t>& part_sizes,
                                  const std::vector<double>& received, uint32_t self);

/// The instance name of a round member from its averager's address: the part after the last
/// `/`, without the `-avg<generation>` suffix the data-parallel kinds give their averagers
/// (`@2/dedloc.3-avg1` -> `dedloc.3`); the address itself when it has no such suffix.
std::string peer_of_member(const std::string& address);

/// The tag a SWARM trainer's microbatch ids carry (their top 24 bits): the top 24 bits of the
/// stable hash of its name (actors/trainer/trainer.cpp builds its ids from it).
uint64_t trainer_tag(const std::string& trainer);

/// Tags of 24 bits: two trainers of one run whose names' `trainer_tag`s collide (one pair in
/// about 16 million; with a thousand trainers, one run in 30) would share microbatch ids and
/// credits. The run's trainers get distinct tags: in the order of shorter names first, then
/// alphabetical (`trainer.9` before `trainer.10`: the order of their indices), each its name's
/// `trainer_tag`, unless a trainer before it holds that one; then the first of
/// `trainer_tag("<name>#1")`, `#2`... that none before it holds. The order of `trainers` does not
/// matter, and a trainer's tag depends only on the names before it: every node derives the same
/// tags from the plan, and names added at the end (later indices) leave the others' tags as
/// they were. Names repeated count once; at most 2^24 names get tags.
std::map<std::string, uint64_t> trainer_tags(const std::vector<std::string>& trainers);

/// The credit name of `tag` (`mb:` and 6 hex digits).
std::string trainer_credit_name_of_tag(uint64_t tag);

/// The name a stage peer credits the trainer of microbatch `microbatch_id` under (`mb:` and its
/// tag in 6 hex digits); the ledger finds the trainer whose `trainer_tag` it is.
std::string trainer_credit_name(uint64_t microbatch_id);

/// `trainer_credit_name` of the trainer named `trainer`.
std::string trainer_credit_name_of(const std::string& trainer);

/// The credits one peer gave, per partner, cumulative and bounded: the first
/// `max_ledger_credits` partners keep their own entry, later ones are summed into `other`.
class credit_book {
public:
  /// Adds `samples` (finite, > 0; anything else is ignored) for `peer`.
  void add(const std::string& peer, double samples);
  /// The named credits.
  const std::map<std::string, double>& named() const noexcept { return named_; }
  /// The sum of the partners beyond the bound.
  double other() const noexcept { return other_; }
  /// The credits as a summary carries them.
  std::vector<ledger_credit> list() const;

private:
  std::map<std::string, double> named_;
  double other_ = 0;
};

} // namespace starling::actors::collab
