// Envelope payloads of the averager protocol (messages/averager.capnp). Readers run
// `check_averager` (every field's range, torch-free) and then copy, decoding tensors.
#include "messages/averager.hpp"
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/tensor_wire.hpp"

namespace starling::messages {

namespace {

using M = wire::AveragerMessage;

bool is_averager(const payload_reader& r, M::Which w) {
  return r.get().isAverager() && r.get().getAverager().which() == w;
}

/// The checked averager payload of `r` (fails when a field is out of range).
result<M::Reader> checked(const payload_reader& r) {
  auto m = r.get().getAverager();
  if (auto st = check_averager(m, false); !st)
    return fail(st.what());
  return m;
}

std::string str(capnp::Text::Reader t) {
  return std::string(t.begin(), t.size());
}

template <class List>
std::vector<uint32_t> u32s(List l) {
  std::vector<uint32_t> out;
  out.reserve(l.size());
  for (auto v : l)
    out.push_back(v);
  return out;
}

void put_u32s(capnp::List<uint32_t>::Builder b, const std::vector<uint32_t>& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    b.set(i, xs[i]);
}

void write_member(wire::MemberInfo::Builder b, const member_info& x) {
  b.setAddress(codec::text(x.address));
  b.setBandwidth(x.bandwidth);
  b.setAuxiliary(x.auxiliary);
}

member_info read_member(wire::MemberInfo::Reader r) {
  return member_info{str(r.getAddress()), r.getBandwidth(), r.getAuxiliary()};
}

void write_members(capnp::List<wire::MemberInfo>::Builder b, const std::vector<member_info>& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    write_member(b[i], xs[i]);
}

std::vector<member_info> read_members(capnp::List<wire::MemberInfo>::Reader r) {
  std::vector<member_info> out;
  for (auto m : r)
    out.push_back(read_member(m));
  return out;
}

void write_report(wire::RoundReport::Builder b, const round_report& x) {
  b.setGroupKey(codec::text(x.group_key));
  b.setGroupId(x.group_id);
  write_members(b.initMembers(static_cast<unsigned>(x.members.size())), x.members);
  b.setSelf(x.self);
  auto parts = b.initParts(static_cast<unsigned>(x.parts.size()));
  for (unsigned i = 0; i < x.parts.size(); ++i) {
    auto& p = x.parts[i];
    auto w = parts[i];
    w.setReducer(p.reducer);
    w.setOffset(p.offset);
    w.setSize(p.size);
    put_u32s(w.initContributors(static_cast<unsigned>(p.contributors.size())), p.contributors);
    w.setStatus(static_cast<uint8_t>(p.status));
    w.setReason(codec::text(p.reason));
    auto segs = w.initSegments(static_cast<unsigned>(p.segments.size()));
    for (unsigned j = 0; j < p.segments.size(); ++j) {
      segs[j].setOffset(p.segments[j].offset);
      segs[j].setSize(p.segments[j].size);
      put_u32s(segs[j].initContributors(static_cast<unsigned>(p.segments[j].contributors.size())),
               p.segments[j].contributors);
    }
  }
  b.setOutcome(static_cast<uint8_t>(x.outcome));
  b.setAveraged(x.averaged);
  b.setKept(x.kept);
  b.setFailed(x.failed);
  b.setDetail(codec::text(x.detail));
  b.setElapsedNs(x.elapsed_ns);
  b.setRoundNs(x.round_ns);
  b.setPlaneLinks(x.plane_links);
  b.setTopkBytesSent(x.topk_bytes_sent);
  b.setTopkBytesReceived(x.topk_bytes_received);
  auto rec = b.initReceived(static_cast<unsigned>(x.received.size()));
  for (unsigned i = 0; i < x.received.size(); ++i)
    rec.set(i, x.received[i]);
}

round_report read_report(wire::RoundReport::Reader r) {
  round_report x;
  x.group_key = str(r.getGroupKey());
  x.group_id = r.getGroupId();
  x.members = read_members(r.getMembers());
  x.self = r.getSelf();
  for (auto p : r.getParts()) {
    part_report q;
    q.reducer = p.getReducer();
    q.offset = p.getOffset();
    q.size = p.getSize();
    q.contributors = u32s(p.getContributors());
    q.status = static_cast<part_status>(p.getStatus());
    q.reason = str(p.getReason());
    for (auto s : p.getSegments())
      q.segments.push_back(part_segment{s.getOffset(), s.getSize(), u32s(s.getContributors())});
    x.parts.push_back(std::move(q));
  }
  x.outcome = static_cast<round_outcome>(r.getOutcome());
  x.averaged = r.getAveraged();
  x.kept = r.getKept();
  x.failed = r.getFailed();
  x.detail = str(r.getDetail());
  x.elapsed_ns = r.getElapsedNs();
  x.round_ns = r.getRoundNs();
  x.plane_links = r.getPlaneLinks();
  x.topk_bytes_sent = r.getTopkBytesSent();
  x.topk_bytes_received = r.getTopkBytesReceived();
  for (auto w : r.getReceived())
    x.received.push_back(w);
  return x;
}

status write_slots(capnp::List<wire::TensorSlot>::Builder b, const std::vector<tensor_msg>& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    if (xs[i].tensor.defined())
      STARLING_TRY(write_tensor_msg(b[i].initTensor(), xs[i]));
  return {};
}

status read_slots(capnp::List<wire::TensorSlot>::Reader r, std::vector<tensor_msg>& xs) {
  xs.resize(r.size());
  for (unsigned i = 0; i < r.size(); ++i)
    if (r[i].hasTensor())
      STARLING_TRY(read_tensor_msg(r[i].getTensor(), xs[i]));
  return {};
}

} // namespace

// -- matchmaking --------------------------------------------------------------------------------

bool wire_codec<avg_join>::matches(const payload_reader& r) {
  return is_averager(r, M::JOIN);
}

status wire_codec<avg_join>::write(payload_writer& w, const avg_join& x) {
  auto b = w.get().initAverager().initJoin();
  b.setGroupKey(codec::text(x.group_key));
  write_member(b.initMember(), x.member);
  b.setNumel(x.numel);
  return {};
}

status wire_codec<avg_join>::read(const payload_reader& r, avg_join& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto j = m->getJoin();
  x.group_key = str(j.getGroupKey());
  x.member = read_member(j.getMember());
  x.numel = j.getNumel();
  return {};
}

bool wire_codec<avg_join_reply>::matches(const payload_reader& r) {
  return is_averager(r, M::JOIN_REPLY);
}

status wire_codec<avg_join_reply>::write(payload_writer& w, const avg_join_reply& x) {
  auto b = w.get().initAverager().initJoinReply();
  b.setVerdict(x.verdict);
  b.setRedirect(codec::text(x.redirect));
  b.setReason(codec::text(x.reason));
  return {};
}

status wire_codec<avg_join_reply>::read(const payload_reader& r, avg_join_reply& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto j = m->getJoinReply();
  x.verdict = j.getVerdict();
  x.redirect = str(j.getRedirect());
  x.reason = str(j.getReason());
  return {};
}

bool wire_codec<avg_leave>::matches(const payload_reader& r) {
  return is_averager(r, M::LEAVE);
}

status wire_codec<avg_leave>::write(payload_writer& w, const avg_leave& x) {
  auto b = w.get().initAverager().initLeave();
  b.setGroupKey(codec::text(x.group_key));
  b.setAddress(codec::text(x.address));
  b.setLeader(codec::text(x.leader));
  return {};
}

status wire_codec<avg_leave>::read(const payload_reader& r, avg_leave& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto l = m->getLeave();
  x.group_key = str(l.getGroupKey());
  x.address = str(l.getAddress());
  x.leader = str(l.getLeader());
  return {};
}

bool wire_codec<avg_group>::matches(const payload_reader& r) {
  return is_averager(r, M::GROUP);
}

status wire_codec<avg_group>::write(payload_writer& w, const avg_group& x) {
  auto b = w.get().initAverager().initGroup();
  b.setGroupKey(codec::text(x.group_key));
  b.setGroupId(x.group_id);
  write_members(b.initMembers(static_cast<unsigned>(x.members.size())), x.members);
  b.setNumel(x.numel);
  return {};
}

status wire_codec<avg_group>::read(const payload_reader& r, avg_group& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto g = m->getGroup();
  x.group_key = str(g.getGroupKey());
  x.group_id = g.getGroupId();
  x.members = read_members(g.getMembers());
  x.numel = g.getNumel();
  return {};
}

// -- butterfly all-reduce -----------------------------------------------------------------------

bool wire_codec<avg_chunk>::matches(const payload_reader& r) {
  return is_averager(r, M::CHUNK);
}

status wire_codec<avg_chunk>::write(payload_writer& w, const avg_chunk& x) {
  auto b = w.get().initAverager().initChunk();
  b.setGroupId(x.group_id);
  b.setKind(x.kind);
  b.setPart(x.part);
  b.setFrom(x.from);
  b.setWeight(x.weight);
  b.setOffset(x.offset);
  if (x.values.tensor.defined())
    STARLING_TRY(write_tensor_msg(b.initValues(), x.values));
  b.setEncoded(codec::data(x.encoded));
  put_u32s(b.initContributors(static_cast<unsigned>(x.contributors.size())), x.contributors);
  b.setError(codec::text(x.error));
  return {};
}

status wire_codec<avg_chunk>::read(const payload_reader& r, avg_chunk& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto c = m->getChunk();
  x.group_id = c.getGroupId();
  x.kind = c.getKind();
  x.part = c.getPart();
  x.from = c.getFrom();
  x.weight = c.getWeight();
  x.offset = c.getOffset();
  if (c.hasValues())
    STARLING_TRY(read_tensor_msg(c.getValues(), x.values));
  auto enc = c.getEncoded();
  x.encoded.assign(reinterpret_cast<const char*>(enc.begin()),
                   reinterpret_cast<const char*>(enc.end()));
  x.contributors = u32s(c.getContributors());
  x.error = str(c.getError());
  return {};
}

bool wire_codec<avg_ack>::matches(const payload_reader& r) {
  return is_averager(r, M::ACK);
}

status wire_codec<avg_ack>::write(payload_writer& w, const avg_ack& x) {
  auto b = w.get().initAverager().initAck();
  b.setGroupId(x.group_id);
  b.setKind(x.kind);
  b.setPart(x.part);
  b.setFrom(x.from);
  return {};
}

status wire_codec<avg_ack>::read(const payload_reader& r, avg_ack& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto a = m->getAck();
  x.group_id = a.getGroupId();
  x.kind = a.getKind();
  x.part = a.getPart();
  x.from = a.getFrom();
  return {};
}

// -- request and result -------------------------------------------------------------------------

bool wire_codec<tensor_list>::matches(const payload_reader& r) {
  return is_averager(r, M::TENSOR_LIST);
}

status wire_codec<tensor_list>::write(payload_writer& w, const tensor_list& x) {
  auto b = w.get().initAverager().initTensorList();
  return write_slots(b.initTensors(static_cast<unsigned>(x.tensors.size())), x.tensors);
}

status wire_codec<tensor_list>::read(const payload_reader& r, tensor_list& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  return read_slots(m->getTensorList().getTensors(), x.tensors);
}

bool wire_codec<average_result>::matches(const payload_reader& r) {
  return is_averager(r, M::AVERAGE_RESULT);
}

status wire_codec<average_result>::write(payload_writer& w, const average_result& x) {
  auto b = w.get().initAverager().initAverageResult();
  STARLING_TRY(write_slots(b.initTensors(static_cast<unsigned>(x.tensors.size())), x.tensors));
  write_report(b.initReport(), x.report);
  return {};
}

status wire_codec<average_result>::read(const payload_reader& r, average_result& x) {
  auto m = checked(r);
  if (!m)
    return m.error();
  auto a = m->getAverageResult();
  STARLING_TRY(read_slots(a.getTensors(), x.tensors));
  x.report = read_report(a.getReport());
  return {};
}

} // namespace starling::messages
