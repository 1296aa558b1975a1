// Checks of stage payloads (messages/stage.capnp) on the untrusted reader, torch-free.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

constexpr size_t max_steps_list = size_t{1} << 20;
/// Modeled state bytes (a cost model's stand-in for parameters and optimizer state): 1 PiB.
constexpr uint64_t max_modeled_bytes = uint64_t{1} << 50;

status check_tensor(bool tensors, bool has, wire::Tensor::Reader r) {
  if (!tensors || !has)
    return {};
  tensor_view v;
  return read_tensor(r, v);
}

} // namespace

status check_stage(wire::StageMessage::Reader m, bool tensors) {
  using M = wire::StageMessage;
  switch (m.which()) {
    case M::FORWARD: {
      auto f = m.getForward();
      STARLING_TRY(check_tensor(tensors, f.hasInput(), f.getInput()));
      return check_tensor(tensors, f.hasTargets(), f.getTargets());
    }
    case M::BACKWARD: {
      auto b = m.getBackward();
      STARLING_TRY(codec::within("attempt", b.getAttempt(), 1u << 20));
      STARLING_TRY(check_tensor(tensors, b.hasInput(), b.getInput()));
      STARLING_TRY(check_tensor(tensors, b.hasGradOutput(), b.getGradOutput()));
      return check_tensor(tensors, b.hasTargets(), b.getTargets());
    }
    case M::BACKWARD_REPLY: {
      auto r = m.getBackwardReply();
      return check_tensor(tensors, r.hasGradInput(), r.getGradInput());
    }
    case M::STATE: {
      auto s = m.getState();
      STARLING_TRY(codec::at_most("optimizer steps", s.getOptimizerSteps().size(), max_steps_list));
      STARLING_TRY(codec::within("modeled bytes", s.getModeledBytes(), max_modeled_bytes));
      STARLING_TRY(check_tensor(tensors, s.hasParams(), s.getParams()));
      STARLING_TRY(check_tensor(tensors, s.hasMoments(), s.getMoments()));
      if (s.hasMoments() && s.getPackedMoments().size() > 0)
        return fail("a state carries both fp32 and compact optimizer moments");
      STARLING_TRY(check_tensor(tensors, s.hasBuffers(), s.getBuffers()));
      return check_tensor(tensors, s.hasIntBuffers(), s.getIntBuffers());
    }
    case M::STATE_PART: {
      auto p = m.getStatePart();
      STARLING_TRY(codec::within("state parts", p.getParts(), 65536));
      if (p.getParts() == 0 || p.getPart() >= p.getParts())
        return fail("state part " + std::to_string(p.getPart()) + " of "
                    + std::to_string(p.getParts()));
      STARLING_TRY(codec::within("params numel", p.getParamsNumel(), uint64_t{1} << 40));
      STARLING_TRY(codec::within("params dtype", p.getParamsDtype(), 0, 63));
      STARLING_TRY(codec::within("moments numel", p.getMomentsNumel(), uint64_t{1} << 41));
      STARLING_TRY(codec::at_most("optimizer steps", p.getOptimizerSteps().size(), max_steps_list));
      STARLING_TRY(codec::within("modeled bytes", p.getModeledBytes(), max_modeled_bytes));
      auto digest = p.getDigest().size();
      if (digest != 0 && digest != 32)
        return fail("a state digest has 32 bytes, got " + std::to_string(digest));
      STARLING_TRY(check_tensor(tensors, p.hasParams(), p.getParams()));
      STARLING_TRY(check_tensor(tensors, p.hasMoments(), p.getMoments()));
      STARLING_TRY(codec::within("packed bytes", p.getPackedBytes(), uint64_t{1} << 42));
      if (p.getPackedMoments().size() > p.getPackedBytes())
        return fail("a state part carries " + std::to_string(p.getPackedMoments().size())
                    + " bytes of a compact state of " + std::to_string(p.getPackedBytes()));
      if (p.getPackedBytes() > 0 && p.getMomentsNumel() > 0)
        return fail("a state carries both fp32 and compact optimizer moments");
      STARLING_TRY(check_tensor(tensors, p.hasBuffers(), p.getBuffers()));
      return check_tensor(tensors, p.hasIntBuffers(), p.getIntBuffers());
    }
  }
  return fail("unknown stage payload " + std::to_string(static_cast<int>(m.which())));
}

} // namespace starling::messages
