// A node's side of the wire contract, without CAF or torch: who it is (peer id), which run it
// belongs to (experiment), the sequence numbers it stamps on envelopes, the replay windows of
// the senders it hears from, and refusals counted by reason. Thread-safe: CAF serializes and
// deserializes on several threads.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace starling::messages {

/// Why an arriving envelope was refused.
enum class wire_reason : uint8_t {
  /// Not a Cap'n Proto Envelope (empty, ragged, truncated, bad pointers).
  malformed = 0,
  /// Larger than the receiver accepts.
  too_large,
  /// Another protocol version.
  version,
  /// Another experiment (run).
  experiment,
  /// A sender id of the wrong size, or none where one is required.
  sender,
  /// A send time too far from the receiver's clock.
  stale,
  /// A sequence number this sender used before, or below its window.
  replay,
  /// A payload of another kind than the message type (another protocol, or an unknown one).
  wrong_payload,
  /// A field out of its range (sizes, counts, enumerations, indices, tensor headers).
  out_of_range,
  /// A sender this node has not admitted (no hello, expired, revoked or banned), or whose roles
  /// do not allow the payload's kind (the gatekeeper's reason is in the detail).
  unauthorized,
  /// A signature missing where the run requires one, or one that is not the sender's own over
  /// this envelope (another member speaking for it, or bytes changed on the way).
  signature,
};

/// Number of reasons.
inline constexpr size_t wire_reason_count = static_cast<size_t>(wire_reason::signature) + 1;

/// Bytes of the digest an envelope's signature signs (BLAKE2b-256 of its flat bytes).
inline constexpr size_t envelope_digest_bytes = 32;
/// Bytes of an envelope's signature trailer (Ed25519).
inline constexpr size_t envelope_signature_bytes = 64;

/// The stable name of a reason (`"replay"`, `"out_of_range"`...).
std::string_view to_string(wire_reason r);

/// A refused envelope: the reason and what was expected and what came.
struct wire_refusal {
  /// The counted reason.
  wire_reason why = wire_reason::malformed;
  /// One line of detail.
  std::string detail;
  /// `"envelope refused (<reason>): <detail>"`.
  std::string line() const;
};

/// The header of an envelope as read (sizes checked).
struct envelope_header {
  /// The sender's protocol version.
  uint16_t version = 0;
  /// Its experiment id.
  std::string experiment;
  /// Its peer id (20 bytes, or empty).
  std::string sender;
  /// Its sequence number.
  uint64_t sequence = 0;
  /// Its clock when it sent (Unix ns).
  int64_t time_ns = 0;
};

/// Settings of a wire context.
struct wire_options {
  /// This node's experiment id; arriving envelopes must carry the same.
  std::string experiment;
  /// This node's peer id (20 bytes; empty for a node without an identity).
  std::string peer_id;
  /// Refuse envelopes without a sender id (a run with an authority sets this).
  bool require_sender = false;
  /// Sequence numbers remembered per sender below its highest (a multiple of 64). Default 1024.
  size_t replay_window = 1024;
  /// How far a sender's clock may be from ours; 0: not checked. Default 5 min.
  int64_t max_clock_skew_ns = int64_t{300} * 1'000'000'000;
  /// Senders whose windows are kept; beyond, the least recently heard is forgotten (its old
  /// envelopes then fail the clock check instead). Default 65536.
  size_t max_senders = 65536;
  /// Largest envelope accepted, in bytes. Default 2^31 (BASP's own limit).
  size_t max_envelope_bytes = size_t{1} << 31;
  /// The clock (Unix ns); empty: the system clock. Simulations pass their virtual clock.
  std::function<int64_t()> clock;
  /// The node's admission check of a sender for a payload kind (`"dht.request"`...): empty when
  /// admitted, else the gatekeeper's refusal line (counted as `unauthorized`). Empty function:
  /// every sender that passes the header checks is admitted. Called on CAF's threads.
  std::function<std::string(const std::string& sender, std::string_view kind)> admit;
  /// Signs the digest of an outgoing envelope (`envelope_digest_bytes`) with this node's key:
  /// the 64-byte signature, sent after the envelope. Empty: envelopes go unsigned.
  std::function<std::string(std::string_view digest)> sign;
  /// Checks the signature of an arriving envelope from `sender` over its digest: empty when it
  /// is the sender's, else the refusal's detail. Empty function: signatures are not checked.
  std::function<std::string(const std::string& sender, std::string_view digest,
                            std::string_view signature)>
    verify;
  /// Refuse unsigned envelopes (a closed run sets this, with `sign` and `verify`).
  bool require_signature = false;
};

/// A node's wire state. Share one per actor system (see `wire_context_holder`).
class wire_context {
public:
  /// A context with `opts`; the first sequence number is the clock's reading in ns.
  explicit wire_context(wire_options opts);

  /// The settings.
  const wire_options& options() const noexcept { return opts_; }

  /// The clock's reading (Unix ns).
  int64_t now() const;

  /// The sequence number and send time of the next outgoing envelope.
  std::pair<uint64_t, int64_t> stamp();

  /// Checks an arriving header against this node (experiment, sender, clock); nothing recorded.
  bool check(const envelope_header& h, wire_refusal& why) const;

  /// Asks the admission hook whether `h`'s sender may send `kind`; false with the refusal.
  bool authorize(const envelope_header& h, std::string_view kind, wire_refusal& why) const;

  /// True when outgoing envelopes are signed.
  bool signs() const noexcept { return static_cast<bool>(opts_.sign); }
  /// The signature of an outgoing envelope's digest (empty when this context does not sign).
  std::string sign(std::string_view digest) const;

  /// Checks an arriving envelope's signature (`signature` empty when it came without one) over
  /// its digest: false with the refusal when one is required and missing, or present and not
  /// the sender's. Call after `authorize` (the sender's key is the admitted one's) and before
  /// `record` (a forged envelope must not use up its victim's sequence numbers).
  bool verify(const envelope_header& h, std::string_view digest, std::string_view signature,
              wire_refusal& why) const;

  /// Records `h`'s sequence number in its sender's window; false (a replay) when it was seen
  /// before or lies below the window. Senders without an id are not tracked.
  bool record(const envelope_header& h, wire_refusal& why);

  /// Counts a refusal.
  void count(wire_reason r) { refused_[static_cast<size_t>(r)].fetch_add(1); }
  /// Counts an admitted envelope.
  void count_admitted() { admitted_.fetch_add(1); }
  /// Refusals of reason `r` so far.
  uint64_t refused(wire_reason r) const { return refused_[static_cast<size_t>(r)].load(); }
  /// All refusals so far.
  uint64_t refused_total() const;
  /// Envelopes admitted so far.
  uint64_t admitted() const { return admitted_.load(); }
  /// `"replay=2 experiment=1"`: non-zero refusal counts in reason order.
  std::string summary() const;

private:
  struct window {
    uint64_t highest = 0;
    bool any = false;
    int64_t last_heard = 0;
    std::unique_ptr<uint64_t[]> bits;
  };

  wire_options opts_;
  std::atomic<uint64_t> next_seq_;
  std::array<std::atomic<uint64_t>, wire_reason_count> refused_{};
  std::atomic<uint64_t> admitted_{0};
  std::mutex mtx_;
  std::unordered_map<std::string, window> windows_;
};

/// How CAF-level code finds a system's wire context: a node's `actor_system_config` also derives
/// from this class and sets `wire`. A system without one encodes envelopes with an empty header
/// and checks arriving ones for structure only (version, sizes, ranges).
struct wire_context_holder {
  virtual ~wire_context_holder() = default;
  /// The system's wire context.
  std::shared_ptr<wire_context> wire;
};

} // namespace starling::messages
