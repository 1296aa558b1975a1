// Checks of averager payloads (messages/averager.capnp) on the untrusted reader, torch-free.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

using namespace codec;

namespace {

constexpr size_t max_members = 4096;
constexpr size_t max_list = 65536;
constexpr int64_t max_numel = int64_t{1} << 40;

status check_member(wire::MemberInfo::Reader m) {
  STARLING_TRY(at_most("member address", m.getAddress().size(), max_name_bytes));
  return finite_at_least("member bandwidth", m.getBandwidth(), 0.0);
}

status check_members(capnp::List<wire::MemberInfo>::Reader ms) {
  STARLING_TRY(at_most("members", ms.size(), max_members));
  for (auto m : ms)
    STARLING_TRY(check_member(m));
  return {};
}

status check_indices(const char* field, capnp::List<uint32_t>::Reader xs) {
  STARLING_TRY(at_most(field, xs.size(), max_members));
  for (auto i : xs)
    STARLING_TRY(within(field, i, max_members - 1));
  return {};
}

status check_range(const char* field, int64_t offset, int64_t size) {
  STARLING_TRY(within(field, offset, 0, max_numel));
  return within(field, size, 0, max_numel);
}

status check_report(wire::RoundReport::Reader r) {
  STARLING_TRY(at_most("group key", r.getGroupKey().size(), max_name_bytes));
  STARLING_TRY(check_members(r.getMembers()));
  if (r.getMembers().size() > 0)
    STARLING_TRY(within("report self", r.getSelf(), r.getMembers().size() - 1));
  auto parts = r.getParts();
  STARLING_TRY(at_most("report parts", parts.size(), max_members));
  for (auto p : parts) {
    STARLING_TRY(within("part reducer", p.getReducer(), max_members - 1));
    STARLING_TRY(check_range("part range", p.getOffset(), p.getSize()));
    STARLING_TRY(check_indices("part contributors", p.getContributors()));
    STARLING_TRY(within("part status", p.getStatus(), 2));
    STARLING_TRY(at_most("part reason", p.getReason().size(), max_reason_bytes));
    auto segs = p.getSegments();
    STARLING_TRY(at_most("part segments", segs.size(), max_list));
    for (auto s : segs) {
      STARLING_TRY(check_range("segment range", s.getOffset(), s.getSize()));
      STARLING_TRY(check_indices("segment contributors", s.getContributors()));
    }
  }
  STARLING_TRY(within("report outcome", r.getOutcome(), 3));
  return at_most("report detail", r.getDetail().size(), max_reason_bytes);
}

status check_slots(capnp::List<wire::TensorSlot>::Reader slots, bool tensors) {
  STARLING_TRY(at_most("tensors", slots.size(), max_list));
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
      STARLING_TRY(at_most("group key", j.getGroupKey().size(), max_name_bytes));
      STARLING_TRY(check_member(j.getMember()));
      return within("join numel", j.getNumel(), 0, max_numel);
    }
    case M::JOIN_REPLY: {
      auto r = m.getJoinReply();
      STARLING_TRY(within("join verdict", r.getVerdict(), 2));
      STARLING_TRY(at_most("redirect", r.getRedirect().size(), max_name_bytes));
      return at_most("join reason", r.getReason().size(), max_reason_bytes);
    }
    case M::LEAVE: {
      auto l = m.getLeave();
      STARLING_TRY(at_most("group key", l.getGroupKey().size(), max_name_bytes));
      STARLING_TRY(at_most("leave address", l.getAddress().size(), max_name_bytes));
      return at_most("leave leader", l.getLeader().size(), max_name_bytes);
    }
    case M::GROUP: {
      auto g = m.getGroup();
      STARLING_TRY(at_most("group key", g.getGroupKey().size(), max_name_bytes));
      STARLING_TRY(check_members(g.getMembers()));
      return within("group numel", g.getNumel(), 0, max_numel);
    }
    case M::CHUNK: {
      auto c = m.getChunk();
      STARLING_TRY(within("chunk kind", c.getKind(), 1));
      STARLING_TRY(within("chunk part", c.getPart(), max_members - 1));
      STARLING_TRY(within("chunk sender", c.getFrom(), max_members - 1));
      if (!std::isfinite(c.getWeight()))
        return fail("chunk weight is not finite");
      STARLING_TRY(within("chunk offset", c.getOffset(), 0, max_numel));
      STARLING_TRY(at_most("encoded chunk", c.getEncoded().size(), size_t{256} << 20));
      STARLING_TRY(check_indices("chunk contributors", c.getContributors()));
      STARLING_TRY(at_most("chunk error", c.getError().size(), max_reason_bytes));
      if (tensors && c.hasValues()) {
        tensor_view v;
        STARLING_TRY(read_tensor(c.getValues(), v));
      }
      return {};
    }
    case M::ACK: {
      auto a = m.getAck();
      STARLING_TRY(within("ack kind", a.getKind(), 1));
      STARLING_TRY(within("ack part", a.getPart(), max_members - 1));
      return within("ack sender", a.getFrom(), max_members - 1);
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
