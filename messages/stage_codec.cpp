// Envelope payloads of the stage protocol (messages/stage.capnp). Readers run `check_stage`
// (every field's range, torch-free) and then copy, decoding tensors.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/swarm.hpp"
#include "messages/tensor_wire.hpp"

namespace starling::messages {

namespace {

using stage_msg = wire::StageMessage;

bool is_stage(const payload_reader& r, stage_msg::Which w) {
  return r.get().isStage() && r.get().getStage().which() == w;
}

result<stage_msg::Reader> checked_stage(const payload_reader& r) {
  auto m = r.get().getStage();
  if (auto st = check_stage(m, false); !st)
    return fail(st.what());
  return m;
}

/// Writes a defined tensor into the field `init` creates; an undefined one stays unset.
template <class Init>
status put(const tensor_msg& x, Init&& init) {
  if (!x.tensor.defined())
    return {};
  return write_tensor_msg(init(), x);
}

status take(bool has, wire::Tensor::Reader r, tensor_msg& x) {
  return has ? read_tensor_msg(r, x) : status{};
}

std::vector<uint64_t> u64s(capnp::List<uint64_t>::Reader l) {
  std::vector<uint64_t> out;
  out.reserve(l.size());
  for (auto v : l)
    out.push_back(v);
  return out;
}

void put_u64s(capnp::List<uint64_t>::Builder b, const std::vector<uint64_t>& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    b.set(i, xs[i]);
}

} // namespace

bool wire_codec<stage_forward>::matches(const payload_reader& r) {
  return is_stage(r, stage_msg::FORWARD);
}

status wire_codec<stage_forward>::write(payload_writer& w, const stage_forward& x) {
  auto b = w.get().initStage().initForward();
  STARLING_TRY(put(x.input, [&] { return b.initInput(); }));
  STARLING_TRY(put(x.targets, [&] { return b.initTargets(); }));
  b.setSeed(x.seed);
  return {};
}

status wire_codec<stage_forward>::read(const payload_reader& r, stage_forward& x) {
  auto m = checked_stage(r);
  if (!m)
    return m.error();
  auto f = m->getForward();
  STARLING_TRY(take(f.hasInput(), f.getInput(), x.input));
  STARLING_TRY(take(f.hasTargets(), f.getTargets(), x.targets));
  x.seed = f.getSeed();
  return {};
}

bool wire_codec<stage_backward>::matches(const payload_reader& r) {
  return is_stage(r, stage_msg::BACKWARD);
}

status wire_codec<stage_backward>::write(payload_writer& w, const stage_backward& x) {
  auto b = w.get().initStage().initBackward();
  STARLING_TRY(put(x.input, [&] { return b.initInput(); }));
  STARLING_TRY(put(x.grad_output, [&] { return b.initGradOutput(); }));
  STARLING_TRY(put(x.targets, [&] { return b.initTargets(); }));
  b.setSeed(x.seed);
  b.setMicrobatchId(x.microbatch_id);
  b.setAttempt(x.attempt);
  return {};
}

status wire_codec<stage_backward>::read(const payload_reader& r, stage_backward& x) {
  auto m = checked_stage(r);
  if (!m)
    return m.error();
  auto b = m->getBackward();
  STARLING_TRY(take(b.hasInput(), b.getInput(), x.input));
  STARLING_TRY(take(b.hasGradOutput(), b.getGradOutput(), x.grad_output));
  STARLING_TRY(take(b.hasTargets(), b.getTargets(), x.targets));
  x.seed = b.getSeed();
  x.microbatch_id = b.getMicrobatchId();
  x.attempt = b.getAttempt();
  return {};
}

bool wire_codec<stage_backward_reply>::matches(const payload_reader& r) {
  return is_stage(r, stage_msg::BACKWARD_REPLY);
}

status wire_codec<stage_backward_reply>::write(payload_writer& w, const stage_backward_reply& x) {
  auto b = w.get().initStage().initBackwardReply();
  STARLING_TRY(put(x.grad_input, [&] { return b.initGradInput(); }));
  b.setLoss(x.loss);
  return {};
}

status wire_codec<stage_backward_reply>::read(const payload_reader& r, stage_backward_reply& x) {
  auto m = checked_stage(r);
  if (!m)
    return m.error();
  auto b = m->getBackwardReply();
  STARLING_TRY(take(b.hasGradInput(), b.getGradInput(), x.grad_input));
  x.loss = b.getLoss();
  return {};
}

bool wire_codec<stage_state>::matches(const payload_reader& r) {
  return is_stage(r, stage_msg::STATE);
}

namespace {

/// Cap'n Proto's limit on one `Data` blob.
constexpr size_t max_blob = (size_t{1} << 29) - 1;

status check_packed(const std::string& packed) {
  if (packed.size() > max_blob)
    return fail("a compact optimizer state of " + std::to_string(packed.size())
                + " bytes is over one message's 512 MiB: it travels in parts");
  return {};
}

} // namespace

status wire_codec<stage_state>::write(payload_writer& w, const stage_state& x) {
  STARLING_TRY(check_packed(x.packed_moments));
  auto b = w.get().initStage().initState();
  STARLING_TRY(put(x.params, [&] { return b.initParams(); }));
  STARLING_TRY(put(x.moments, [&] { return b.initMoments(); }));
  put_u64s(b.initOptimizerSteps(static_cast<unsigned>(x.optimizer_steps.size())),
           x.optimizer_steps);
  b.setSteps(x.steps);
  b.setSamples(x.samples);
  b.setModeledBytes(x.modeled.size);
  STARLING_TRY(put(x.buffers, [&] { return b.initBuffers(); }));
  STARLING_TRY(put(x.int_buffers, [&] { return b.initIntBuffers(); }));
  b.setPackedMoments(codec::data(x.packed_moments));
  return {};
}

status wire_codec<stage_state>::read(const payload_reader& r, stage_state& x) {
  auto m = checked_stage(r);
  if (!m)
    return m.error();
  auto s = m->getState();
  STARLING_TRY(take(s.hasParams(), s.getParams(), x.params));
  STARLING_TRY(take(s.hasMoments(), s.getMoments(), x.moments));
  x.optimizer_steps = u64s(s.getOptimizerSteps());
  x.steps = s.getSteps();
  x.samples = s.getSamples();
  x.modeled.size = s.getModeledBytes();
  STARLING_TRY(take(s.hasBuffers(), s.getBuffers(), x.buffers));
  auto packed = s.getPackedMoments();
  x.packed_moments.assign(reinterpret_cast<const char*>(packed.begin()), packed.size());
  return take(s.hasIntBuffers(), s.getIntBuffers(), x.int_buffers);
}

bool wire_codec<stage_state_part>::matches(const payload_reader& r) {
  return is_stage(r, stage_msg::STATE_PART);
}

status wire_codec<stage_state_part>::write(payload_writer& w, const stage_state_part& x) {
  STARLING_TRY(check_packed(x.packed_moments));
  auto b = w.get().initStage().initStatePart();
  b.setSteps(x.steps);
  b.setSamples(x.samples);
  b.setPart(x.part);
  b.setParts(x.parts);
  b.setParamsNumel(x.params_numel);
  b.setParamsDtype(x.params_dtype);
  b.setMomentsNumel(x.moments_numel);
  put_u64s(b.initOptimizerSteps(static_cast<unsigned>(x.optimizer_steps.size())),
           x.optimizer_steps);
  b.setDigest(codec::data(x.digest));
  STARLING_TRY(put(x.params, [&] { return b.initParams(); }));
  STARLING_TRY(put(x.moments, [&] { return b.initMoments(); }));
  b.setModeledBytes(x.modeled.size);
  STARLING_TRY(put(x.buffers, [&] { return b.initBuffers(); }));
  b.setPackedBytes(x.packed_bytes);
  b.setPackedMoments(codec::data(x.packed_moments));
  return put(x.int_buffers, [&] { return b.initIntBuffers(); });
}

status wire_codec<stage_state_part>::read(const payload_reader& r, stage_state_part& x) {
  auto m = checked_stage(r);
  if (!m)
    return m.error();
  auto p = m->getStatePart();
  x.steps = p.getSteps();
  x.samples = p.getSamples();
  x.part = p.getPart();
  x.parts = p.getParts();
  x.params_numel = p.getParamsNumel();
  x.params_dtype = p.getParamsDtype();
  x.moments_numel = p.getMomentsNumel();
  x.modeled.size = p.getModeledBytes();
  x.optimizer_steps = u64s(p.getOptimizerSteps());
  auto d = p.getDigest();
  x.digest.assign(reinterpret_cast<const char*>(d.begin()), d.size());
  STARLING_TRY(take(p.hasParams(), p.getParams(), x.params));
  STARLING_TRY(take(p.hasMoments(), p.getMoments(), x.moments));
  STARLING_TRY(take(p.hasBuffers(), p.getBuffers(), x.buffers));
  x.packed_bytes = p.getPackedBytes();
  auto packed = p.getPackedMoments();
  x.packed_moments.assign(reinterpret_cast<const char*>(packed.begin()), packed.size());
  return take(p.hasIntBuffers(), p.getIntBuffers(), x.int_buffers);
}

} // namespace starling::messages
