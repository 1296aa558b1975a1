// The contribution ledger of a watched run (issue 42, item 6): one row per peer with what it
// computed, what its partners accepted of it, what it dropped, its uptime, bytes, refusals and
// ban. A pure fold (no CAF, no I/O) of two sources that each see part of the run:
// - the run's metric stream (node 0's full log: `dp_step`, `dp_dropped`, `dp_credit`, `dp_join`,
//   `dp_leave`, trainers' `microbatch`, `refused` and `ban` events that name a `peer`), and
// - the peers' signed summaries read from the DHT (actors/collab/ledger_record.hpp), which is all
//   a node other than node 0 has, and which outlive node 0.
// Every number is a counter that only grows within one incarnation of a peer, so where both
// sources know it the ledger shows the larger (each is a lower bound of the truth). Incarnations
// (a peer that restarted counts from 0 again) are told apart by their start time and summed.
//
// Samples accepted of a peer are the sum of the credits its partners gave it (the rule of
// ledger_record.hpp), never its own claim. In a SWARM run the stage-0 peers credit trainers
// under their tags (`mb:<hex>`, collab::trainer_credit_name): the ledger gives such a credit to
// the row whose name has that tag. A peer stays in the ledger once seen: a record that
// expired keeps its last numbers, marked `expired`. Rows are bounded (`max_rows`; later peers
// are summed into the row `other`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace starling::runtime::observe {

struct event_view;

/// One peer's line of the ledger.
struct ledger_row {
  /// Instance name (`dedloc.3`), or `other`.
  std::string peer;
  /// The owner key of its DHT record id (hex, first 16 digits), when a record was read.
  std::string peer_id;
  /// Samples it computed (its claim).
  double computed = 0;
  /// Samples its round partners credited it with.
  double accepted = 0;
  /// Samples it dropped without an update (its claim).
  double dropped = 0;
  /// Averaging rounds it took part in, and of those averaged with partners (its claims).
  double rounds = 0;
  double rounds_averaged = 0;
  /// Seconds it was seen working (over all incarnations).
  double uptime_s = 0;
  /// Bytes it sent and received averaging.
  double bytes_sent = 0;
  double bytes_received = 0;
  /// Envelopes of it that were refused.
  uint64_t refusals = 0;
  /// The run's gates (nodes) that refused it: the serving node's, and those whose gate records
  /// the ledger read.
  uint64_t refused_by = 0;
  /// Banned, and why.
  bool banned = false;
  std::string ban_reason;
  /// It left on purpose.
  bool left = false;
  /// Its summary in the DHT: `live` (fresh at the last read), `expired`, or `none` (only the
  /// metric stream knows it).
  std::string record = "none";
  /// From its latest summary: the SWARM stage it serves (negative: none or unknown), its latest
  /// loss (NaN: none) and the global step it reached (negative: none).
  int stage = -1;
  double loss;
  double step = -1;
  /// In a closed run, its node's token id (hex; never the token or a key); empty otherwise.
  std::string token_id;

  ledger_row();
};

/// What the serving node's gate refused of one party whose key it knew (runtime/node/gate.hpp:
/// a hello that proved the key, or a peer admitted before).
struct gate_refused_peer {
  /// The first 16 hex digits of its public key: the `peer_id` of its rows.
  std::string peer_id;
  /// Its refusals so far.
  uint64_t refusals = 0;
  /// Why it is out of the run (a `banned` or `revoked` refusal's words), empty otherwise.
  std::string ban_reason;
};

/// Limits of a ledger.
struct ledger_options {
  /// Peers with a row of their own; later ones are summed into `other`.
  size_t max_rows = 4096;
};

/// One sub-key record of a DHT read, still untrusted.
struct ledger_entry {
  /// The sub-key it was stored under.
  std::string subkey;
  /// Its value bytes.
  std::vector<char> value;
  /// Its expiry on the DHT clock, seconds.
  double expires_at = 0;
  /// Read under `<experiment>/ledger/gates`: a node's gate record
  /// (`actors::collab::gate_summary`), not a peer's summary.
  bool gate = false;
};

/// What one read did.
struct ledger_read_stats {
  /// Records taken (new or newer than the one held).
  size_t accepted = 0;
  /// Records refused: malformed, or an id that is not their sub-key.
  size_t rejected = 0;
};

/// The ledger's state (see the file comment). Not thread-safe.
class ledger_book {
public:
  explicit ledger_book(ledger_options opts = {});

  /// One metric event (other kinds are ignored).
  void add(const event_view& e);

  /// `peer` was banned, for `reason`.
  void ban(const std::string& peer, const std::string& reason);
  /// An envelope of `peer` was refused.
  void refuse(const std::string& peer);

  /// The run's SWARM trainers in the plan's order: a stage's credit to a tag goes to the
  /// trainer `collab::trainer_tags` gives it (distinct tags, as the trainers' own). Without
  /// them every row's name is a candidate for its `collab::trainer_tag`, and a tag two names
  /// share credits neither.
  void set_trainers(const std::vector<std::string>& trainers);

  /// The serving node's gate's refusals by party, as it counts them now (cumulative). Each row
  /// whose `peer_id` is the party's shows them (every instance of its node: the gate does not
  /// know which one sent), and its ban reason; a party without a row gets one of its own
  /// (`peer:<peer_id>`). A party the gate stopped listing keeps the numbers last seen.
  /// Other nodes' gates come as gate records (`add_records`): a row shows the sum over the
  /// run's gates.
  void set_gate_refusals(const std::vector<gate_refused_peer>& peers);

  /// The record id the serving node's gate publishes under (`actors::collab::gate_summary`):
  /// its record read from the DHT and what `set_gate_refusals` says are one gate, not two.
  void set_own_gate_id(const std::string& id);

  /// Records of one DHT read at `now` (the DHT clock, seconds); at most
  /// `actors::collab::max_ledger_reply_records` of them are decoded, the rest counted rejected.
  ledger_read_stats add_records(const std::vector<ledger_entry>& entries, double now);

  /// The DHT clock moved to `now` without a read (records expire).
  void advance(double now);

  /// The rows, by peer name (`other` last).
  std::vector<ledger_row> rows() const;

private:
  /// What one source knows of one incarnation.
  struct counts {
    double computed = 0, dropped = 0, rounds = 0, rounds_averaged = 0;
    double bytes_sent = 0, bytes_received = 0;
    double first_s = -1, last_s = -1;
    bool left = false;
    int stage = -1;
    double loss = 0, step = -1;
    bool has_loss = false;
    /// Credits given, by partner.
    std::map<std::string, double> credits;
  };
  /// One incarnation's record as last read.
  struct held {
    std::string name;
    std::string peer_id;
    std::string token_id;
    double time = 0;
    double expires_at = 0;
    counts c;
  };
  /// What the metric stream says of one peer: earlier incarnations folded, the current one.
  struct streamed {
    counts total;
    /// The current incarnation's cumulative byte counters (dp_step carries them).
    double bytes_sent_now = 0, bytes_received_now = 0;
    /// Uptime of the incarnations before the current one.
    double uptime_before = 0;
    uint64_t refusals = 0;
    bool banned = false;
    std::string ban_reason;
  };

  /// The row key of `name` under the bound (`other` beyond it).
  std::string slot(const std::string& name);

  ledger_options opts_;
  std::map<std::string, streamed> stream_;
  /// (record id, start time) -> the record.
  std::map<std::pair<std::string, double>, held> records_;
  /// Names with a row (bounded).
  std::map<std::string, bool> names_;
  /// Credit names (`mb:<tag>`) of the run's trainers -> their names (`set_trainers`).
  std::map<std::string, std::string> trainer_tags_;
  /// What one gate refused, by party (bounded), as last seen; counts only grow.
  struct gate_held {
    std::map<std::string, gate_refused_peer> parties;
    double time = -1;
  };
  /// Merges `p` into `g` (the larger count; the latest ban reason).
  void merge_gate_party(gate_held& g, const gate_refused_peer& p, size_t bound);
  /// The run's gates by record id (the serving node's under `own_gate_id_`; bounded).
  std::map<std::string, gate_held> gates_;
  std::string own_gate_id_;
  double now_ = 0;
};

/// The rows as CSV (RFC 4180; a header line, then one line per row).
std::string render_ledger_csv(const std::vector<ledger_row>& rows);

} // namespace starling::runtime::observe
