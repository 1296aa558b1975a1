// Checks of averager payloads (messages/averager.capnp) on the untrusted reader, torch-free.
#include <cmath>

#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

constexpr size_t max_members = 4096;
constexpr size_t max_list = 65536;
constexpr int64_t max_numel = int64_t{1} << 40;

status check_member(wire::MemberInfo::Reader m) {
  STARLING_TRY(codec::at_most("member address", m.getAddress().size(), codec::max_name_bytes));
  return codec::finite_at_least("member bandwidth", m.getBandwidth(), 0.0);
}

status check_members(capnp::List<wire::MemberInfo>::Reader ms) {
  STARLING_TRY(codec::at_most("members", ms.size(), max_members));
  for (auto m : ms)
    STARLING_TRY(check_member(m));
  return {};
}

status check_indices(const char* field, capnp::List<uint32_t>::Reader xs) {
  STARLING_TRY(codec::at_most(field, xs.size(), max_members));
  for (auto i : xs)
    STARLING_TRY(codec::within(field, i, max_members - 1));
  return {};
}

status check_range(const char* field, int64_t offset, int64_t size) {
  STARLING_TRY(codec::within(field, offset, 0, max_numel));
  return codec::within(field, size, 0, max_numel);
}

status check_report(wire::RoundReport::Reader r) {
  STARLING_TRY(codec::at_most("group key", r.getGroupKey().size(), codec::max_name_bytes));
  STARLING_TRY(check_members(r.getMembers()));
  if (r.getMembers().size() > 0)
    STARLING_TRY(codec::within("report self", r.getSelf(), r.getMembers().size() - 1));
  auto parts = r.getParts();
  STARLING_TRY(codec::at_most("report parts", parts.size(), max_members));
  for (auto p : parts) {
    STARLING_TRY(codec::within("part reducer", p.getReducer(), max_members - 1));
    STARLING_TRY(check_range("part range", p.getOffset(), p.getSize()));
    STARLING_TRY(check_indices("part contributors", p.getContributors()));
    STARLING_TRY(codec::within("part status", p.getStatus(), 2));
    STARLING_TRY(codec::at_most("part reason", p.getReason().size(), codec::max_reason_bytes));
    auto segs = p.getSegments();
    STARLING_TRY(codec::at_most("part segments", segs.size(), max_list));
    for (auto s : segs) {
      STARLING_TRY(check_range("segment range", s.getOffset(), s.getSize()));
      STARLING_TRY(check_indices("segment contributors", s.getContributors()));
    }
  }
  STARLING_TRY(codec::within("report outcome", r.getOutcome(), 3));
  auto received = r.getReceived();
  STARLING_TRY(codec::at_most("report received weights", received.size(), r.getMembers().size()));
  for (auto w : received)
    if (!(w == -1.0 || (std::isfinite(w) && w >= 0)))
      return fail("report received weight is neither -1 nor a finite weight >= 0");
  return codec::at_most("report detail", r.getDetail().size(), codec::max_reason_bytes);
}

status check_slots(capnp::List<wire::TensorSlot>::Reader slots, bool tensors) {
  STARLING_TRY(codec::at_most("tensors", slots.size(), max_list));
  if (tensors)
    for (auto s : slots)
      if (s.hasTensor()) {
        tensor_view v;
        STARLING_TRY(read_tensor(s.getTensor(), v));
      }
  return {};
}

} // namespace

status check_averager(wire::AveragerMessage::Reader m, bool tensors) {
  using M = wire::AveragerMessage;
  switch (m.which()) {
    case M::JOIN: {
      auto j = m.getJoin();
      STARLING_TRY(codec::at_most("group key", j.getGroupKey().size(), codec::max_name_bytes));
      STARLING_TRY(check_member(j.getMember()));
      return codec::within("join numel", j.getNumel(), 0, max_numel);
    }
    case M::JOIN_REPLY: {
      auto r = m.getJoinReply();
      STARLING_TRY(codec::within("join verdict", r.getVerdict(), 2));
      STARLING_TRY(codec::at_most("redirect", r.getRedirect().size(), codec::max_name_bytes));
      return codec::at_most("join reason", r.getReason().size(), codec::max_reason_bytes);
    }
    case M::LEAVE: {
      auto l = m.getLeave();
      STARLING_TRY(codec::at_most("group key", l.getGroupKey().size(), codec::max_name_bytes));
      STARLING_TRY(codec::at_most("leave address", l.getAddress().size(), codec::max_name_bytes));
      return codec::at_most("leave leader", l.getLeader().size(), codec::max_name_bytes);
    }
    case M::GROUP: {
      auto g = m.getGroup();
      STARLING_TRY(codec::at_most("group key", g.getGroupKey().size(), codec::max_name_bytes));
      STARLING_TRY(check_members(g.getMembers()));
      return codec::within("group numel", g.getNumel(), 0, max_numel);
    }
    case M::CHUNK: {
      auto c = m.getChunk();
      STARLING_TRY(codec::within("chunk kind", c.getKind(), 1));
      STARLING_TRY(codec::within("chunk part", c.getPart(), max_members - 1));
      STARLING_TRY(codec::within("chunk sender", c.getFrom(), max_members - 1));
      if (!std::isfinite(c.getWeight()))
        return fail("chunk weight is not finite");
      STARLING_TRY(codec::within("chunk offset", c.getOffset(), 0, max_numel));
      STARLING_TRY(codec::at_most("encoded chunk", c.getEncoded().size(), size_t{256} << 20));
      STARLING_TRY(check_indices("chunk contributors", c.getContributors()));
      STARLING_TRY(codec::at_most("chunk error", c.getError().size(), codec::max_reason_bytes));
      if (tensors && c.hasValues()) {
        tensor_view v;
        STARLING_TRY(read_tensor(c.getValues(), v));
      }
      return {};
    }
    case M::ACK: {
      auto a = m.getAck();
      STARLING_TRY(codec::within("ack kind", a.getKind(), 1));
      STARLING_TRY(codec::within("ack part", a.getPart(), max_members - 1));
      return codec::within("ack sender", a.getFrom(), max_members - 1);
    }
    case M::TENSOR_LIST:
      return check_slots(m.getTensorList().getTensors(), tensors);
    case M::AVERAGE_RESULT: {
      auto r = m.getAverageResult();
      STARLING_TRY(check_slots(r.getTensors(), tensors));
      return check_report(r.getReport());
    }
    case M::MEMBER_INFO:
      return check_member(m.getMemberInfo());
    case M::PART_SEGMENT: {
      auto s = m.getPartSegment();
      STARLING_TRY(check_range("segment range", s.getOffset(), s.getSize()));
      return check_indices("segment contributors", s.getContributors());
    }
    case M::PART_REPORT:
    case M::ROUND_REPORT:
      return m.which() == M::ROUND_REPORT ? check_report(m.getRoundReport())
                                           : fail("a part report is not sent alone");
  }
  return fail("unknown averager payload " + std::to_string(static_cast<int>(m.which())));
}

} // namespace starling::messages
