// Messages of the decentralized averager (actors/averager): the request/result interface other
// actors use, the round report, and the peer-to-peer protocol (matchmaking and butterfly chunks).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include "messages/enveloped.hpp"
#include "messages/tensor_msg.hpp"

namespace starling {

/// Averager direct links (kept here, not in atoms.hpp, which nearly every file includes):
///   peer -> averager (BASP): `(avg_plane_atom, std::string sender_address,
///                              std::string sender_transport_id)
///     -> (std::string transport_id, std::string host, uint16_t port, std::string token,
///         uint32_t channel)`
///   (channel 0: no direct transport, chunks travel over BASP; port 0: a client-mode transport,
///   reached over the link it opens);
///   transport -> its averager (local, with the averager's tag; peer = the link's transport id):
///   `(avg_plane_atom, uint64_t tag, std::string peer, avg_chunk)` for a delivered chunk,
///   `(avg_plane_atom, uint64_t tag, std::string peer, std::string error)` for a lost link,
///   `(avg_plane_atom, uint64_t tag, std::string peer)` for a link that came up.
using avg_plane_atom = caf::atom_constant<caf::atom("avg_plane")>;

} // namespace starling

namespace starling::messages {

// -- the round report --------------------------------------------------------------------------

/// One member of an averaging group as every member sees it.
struct member_info {
  /// Address the member's averager is resolved at (`host:port/name`); members are ordered by it.
  std::string address;
  /// Relative bandwidth (> 0); 0 = client mode: cannot accept connections, reduces no part.
  double bandwidth = 1.0;
  /// Auxiliary: reduces a part but contributes no data and keeps its own values.
  bool auxiliary = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, member_info& x) {
  return f(caf::meta::type_name("member_info"), x.address, x.bandwidth, x.auxiliary);
}

/// What happened to one part, from one member's point of view.
enum class part_status : uint8_t {
  /// The reducer's result arrived and replaced this member's values.
  averaged = 0,
  /// The reducer failed, was cut at the deadline or left: this member kept its own values.
  own_value_kept = 1,
  /// The reducer reported that the reduction failed (no usable contribution): own values kept.
  failed = 2,
};

/// Name of a status for reports and logs.
std::string to_string(part_status s);

/// Elements [offset, offset + size) of a part (offsets within the part) and the members whose
/// contributions reached every one of them.
struct part_segment {
  int64_t offset = 0;
  int64_t size = 0;
  std::vector<uint32_t> contributors;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, part_segment& x) {
  return f(caf::meta::type_name("part_segment"), x.offset, x.size, x.contributors);
}

/// One part of a round report.
struct part_report {
  /// Member index of the reducer.
  uint32_t reducer = 0;
  int64_t offset = 0;
  int64_t size = 0;
  /// Members whose contribution reached every element of the part (empty unless averaged).
  std::vector<uint32_t> contributors;
  part_status status = part_status::own_value_kept;
  /// Why the part was not averaged; empty when it was.
  std::string reason;
  /// Empty when every element was averaged over `contributors`. Otherwise (a sender that failed
  /// or was cut while sending reached only the chunks it delivered) the part's segments in order,
  /// each with the members averaged there: the weighted mean reduces chunk by chunk, as it
  /// streams, so a sender's delivered chunks count and only the undelivered ones miss it.
  std::vector<part_segment> segments;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, part_report& x) {
  return f(caf::meta::type_name("part_report"), x.reducer, x.offset, x.size, x.contributors,
           x.status, x.reason, x.segments);
}

/// Overall outcome of a round.
enum class round_outcome : uint8_t {
  /// A group formed and every part was averaged.
  complete = 0,
  /// A group formed; some parts kept this member's own values (see the parts).
  partial = 1,
  /// No partner was found within the matchmaking window: the values are unchanged.
  no_partner = 2,
  /// The round could not run (bad input, plan failure): the values are unchanged.
  error = 3,
};

/// Name of an outcome.
std::string to_string(round_outcome o);

/// Which parts were averaged with whom, as one member saw the round.
struct round_report {
  std::string group_key;
  /// Group id chosen by the leader (0 when no group formed).
  uint64_t group_id = 0;
  /// Members in order; `self` is this member's index.
  std::vector<member_info> members;
  uint32_t self = 0;
  std::vector<part_report> parts;
  round_outcome outcome = round_outcome::no_partner;
  /// Counts of non-empty parts with each status.
  uint32_t averaged = 0;
  uint32_t kept = 0;
  uint32_t failed = 0;
  /// Why the outcome (no partner, error), or empty.
  std::string detail;
  /// Nanoseconds (virtual in simulation) from the request to the reply.
  int64_t elapsed_ns = 0;
  /// Nanoseconds from the group message to the reply (the all-reduce itself).
  int64_t round_ns = 0;
  /// Other members this peer sent to over the averagers' data plane (the rest: BASP).
  uint32_t plane_links = 0;
  /// A Top-k round (actors/averager/sparse_parts.hpp): bytes of chunk values this member sent
  /// and received up to the reply (packed nonzeros over BASP, 4 per element over a direct link;
  /// the chunk metas not counted). 0 in dense rounds.
  uint64_t topk_bytes_sent = 0;
  uint64_t topk_bytes_received = 0;
  /// Per member: the weight its contribution brought to every element of the part this member
  /// reduced (-1 where it did not reach all of it): what the contribution ledger credits.
  std::vector<double> received;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, round_report& x) {
  return f(caf::meta::type_name("round_report"), x.group_key, x.group_id, x.members, x.self,
           x.parts, x.outcome, x.averaged, x.kept, x.failed, x.detail, x.elapsed_ns,
           x.round_ns, x.plane_links, x.topk_bytes_sent, x.topk_bytes_received, x.received);
}

// -- request and result ------------------------------------------------------------------------

/// A list of tensors (the payload of an average request; moved by reference in-process).
struct tensor_list {
  std::vector<tensor_msg> tensors;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<tensor_list> {
  static constexpr const char* name = "averager.tensor_list";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const tensor_list& x);
  static status read(const payload_reader& r, tensor_list& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_list& x) {
  return inspect_enveloped(f, x, "tensor_list", [&] {
    return f(caf::meta::type_name("tensor_list"), x.tensors);
  });
}

/// Answer to `(average_atom, group_key, tensor_list, weight)`: the averaged tensors (same shapes
/// and dtypes as the request's; the inputs themselves where nothing was averaged) and the report.
struct average_result {
  std::vector<tensor_msg> tensors;
  round_report report;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<average_result> {
  static constexpr const char* name = "averager.average_result";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const average_result& x);
  static status read(const payload_reader& r, average_result& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, average_result& x) {
  return inspect_enveloped(f, x, "average_result", [&] {
    return f(caf::meta::type_name("average_result"), x.tensors, x.report);
  });
}

// -- matchmaking -------------------------------------------------------------------------------

/// Follower -> leader: "put me in your group". Answered with `avg_join_reply`.
struct avg_join {
  std::string group_key;
  member_info member;
  /// Elements of the joiner's flat vector: only equal sizes can average.
  int64_t numel = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_join> {
  static constexpr const char* name = "averager.join";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_join& x);
  static status read(const payload_reader& r, avg_join& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_join& x) {
  return inspect_enveloped(f, x, "avg_join", [&] {
    return f(caf::meta::type_name("avg_join"), x.group_key, x.member, x.numel);
  });
}

/// Leader -> follower: accepted, or "ask `redirect` instead", or refused (closed, busy, mismatch).
struct avg_join_reply {
  enum verdict_t : uint8_t { accepted = 0, redirected = 1, refused = 2 };
  uint8_t verdict = refused;
  std::string redirect;
  std::string reason;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_join_reply> {
  static constexpr const char* name = "averager.join_reply";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_join_reply& x);
  static status read(const payload_reader& r, avg_join_reply& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_join_reply& x) {
  return inspect_enveloped(f, x, "avg_join_reply", [&] {
    return f(caf::meta::type_name("avg_join_reply"), x.verdict, x.redirect, x.reason);
  });
}

/// Follower -> old leader ("I left you"), or leader -> follower ("join `leader` instead").
struct avg_leave {
  std::string group_key;
  std::string address;
  /// Set by a leader that now follows someone else: the leader its followers should ask.
  std::string leader;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_leave> {
  static constexpr const char* name = "averager.leave";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_leave& x);
  static status read(const payload_reader& r, avg_leave& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_leave& x) {
  return inspect_enveloped(f, x, "avg_leave", [&] {
    return f(caf::meta::type_name("avg_leave"), x.group_key, x.address, x.leader);
  });
}

/// Leader -> every member: the final, ordered membership of a group.
struct avg_group {
  std::string group_key;
  uint64_t group_id = 0;
  std::vector<member_info> members;
  int64_t numel = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_group> {
  static constexpr const char* name = "averager.group";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_group& x);
  static status read(const payload_reader& r, avg_group& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_group& x) {
  return inspect_enveloped(f, x, "avg_group", [&] {
    return f(caf::meta::type_name("avg_group"), x.group_key, x.group_id, x.members, x.numel);
  });
}

// -- butterfly all-reduce ----------------------------------------------------------------------

/// A bounded piece of a part: a contribution (member -> reducer) or a result (reducer ->
/// member). Compressed chunks carry the Cap'n Proto encoding in `encoded` (the same bytes in and
/// across processes, so lossy codecs act the same everywhere); uncompressed ones carry `values`
/// (by reference in-process, encoded only when serialized).
struct avg_chunk {
  enum kind_t : uint8_t { contribution = 0, result = 1 };
  uint64_t group_id = 0;
  uint8_t kind = contribution;
  /// The part (= index of its reducer).
  uint32_t part = 0;
  /// Member index of the sender.
  uint32_t from = 0;
  /// Sender's weight (contributions).
  double weight = 1.0;
  /// Element offset of this chunk inside the part.
  int64_t offset = 0;
  tensor_msg values;
  std::vector<char> encoded;
  /// Results: the members whose data went into this chunk (the reducer cuts result chunks where
  /// that changes).
  std::vector<uint32_t> contributors;
  /// Results: why the reducer could not reduce (then no values).
  std::string error;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_chunk> {
  static constexpr const char* name = "averager.chunk";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_chunk& x);
  static status read(const payload_reader& r, avg_chunk& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_chunk& x) {
  return inspect_enveloped(f, x, "avg_chunk", [&] {
    return f(caf::meta::type_name("avg_chunk"), x.group_id, x.kind, x.part, x.from, x.weight,
             x.offset, x.values, x.encoded, x.contributors, x.error);
  });
}

/// Receiver -> sender: one chunk arrived (a credit back to the sender's window).
struct avg_ack {
  uint64_t group_id = 0;
  uint8_t kind = 0;
  uint32_t part = 0;
  /// Member index of the acknowledging receiver.
  uint32_t from = 0;
  /// Set on arrival when the envelope was refused (then every other field is empty).
  std::string wire_error;
};

template <>
struct wire_codec<avg_ack> {
  static constexpr const char* name = "averager.ack";
  static bool matches(const payload_reader& r);
  static status write(payload_writer& w, const avg_ack& x);
  static status read(const payload_reader& r, avg_ack& x);
};

/// CAF 0.17 inspect: an envelope across processes (see enveloped.hpp).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, avg_ack& x) {
  return inspect_enveloped(f, x, "avg_ack", [&] {
    return f(caf::meta::type_name("avg_ack"), x.group_id, x.kind, x.part, x.from);
  });
}

/// A refused chunk also marks its values (see `mark_refused` in swarm.hpp).
inline void mark_refused(avg_chunk& x, const std::string& why) {
  x.wire_error = x.values.error = x.error = why;
}

} // namespace starling::messages
