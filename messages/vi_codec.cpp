// Envelope payloads of the MASHA protocol (messages/vi.capnp), torch-free.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/vi.hpp"

namespace starling::messages {

namespace {

constexpr uint32_t max_dim = uint32_t{1} << 28;

void write_vector(wire::ViVector::Builder b, const vi_vector& x) {
  b.setCodec(x.codec);
  b.setDim(x.dim);
  b.setSeed(x.seed);
  auto idx = b.initIndices(static_cast<unsigned>(x.indices.size()));
  for (unsigned i = 0; i < x.indices.size(); ++i)
    idx.set(i, x.indices[i]);
  auto val = b.initValues(static_cast<unsigned>(x.values.size()));
  for (unsigned i = 0; i < x.values.size(); ++i)
    val.set(i, x.values[i]);
}

/// Structure only; `actors/vi/compressor.cpp`'s decode checks the codec's semantics.
status read_vector(wire::ViVector::Reader r, vi_vector& x) {
  x.codec = r.getCodec();
  STARLING_TRY(codec::within("vi codec", x.codec, static_cast<uint64_t>(vi_codec::top_k)));
  x.dim = r.getDim();
  STARLING_TRY(codec::within("vi dim", x.dim, max_dim));
  x.seed = r.getSeed();
  auto idx = r.getIndices();
  auto val = r.getValues();
  STARLING_TRY(codec::at_most("vi values", val.size(), x.dim));
  STARLING_TRY(codec::at_most("vi indices", idx.size(), x.dim));
  x.indices.reserve(idx.size());
  for (auto i : idx) {
    if (i >= x.dim)
      return fail("vi index " + std::to_string(i) + " is not below dim " + std::to_string(x.dim));
    x.indices.push_back(i);
  }
  x.values.reserve(val.size());
  for (auto v : val)
    x.values.push_back(v);
  return {};
}

status check_phase(uint8_t phase) {
  return codec::within("vi phase", phase, static_cast<uint64_t>(vi_phase::eg_half));
}

bool is_vi(const payload_reader& r, wire::ViMessage::Which w) {
  return r.get().isVi() && r.get().getVi().which() == w;
}

} // namespace

bool wire_codec<vi_vector>::matches(const payload_reader& r) {
  return is_vi(r, wire::ViMessage::VECTOR);
}

status wire_codec<vi_vector>::write(payload_writer& w, const vi_vector& x) {
  write_vector(w.get().initVi().initVector(), x);
  return {};
}

status wire_codec<vi_vector>::read(const payload_reader& r, vi_vector& x) {
  return read_vector(r.get().getVi().getVector(), x);
}

bool wire_codec<vi_uplink>::matches(const payload_reader& r) {
  return is_vi(r, wire::ViMessage::UPLINK);
}

status wire_codec<vi_uplink>::write(payload_writer& w, const vi_uplink& x) {
  auto b = w.get().initVi().initUplink();
  b.setWorker(x.worker);
  b.setRound(x.round);
  b.setPhase(x.phase);
  write_vector(b.initPayload(), x.payload);
  return {};
}

status wire_codec<vi_uplink>::read(const payload_reader& r, vi_uplink& x) {
  auto m = r.get().getVi().getUplink();
  x.worker = m.getWorker();
  x.round = m.getRound();
  x.phase = m.getPhase();
  STARLING_TRY(check_phase(x.phase));
  return read_vector(m.getPayload(), x.payload);
}

bool wire_codec<vi_downlink>::matches(const payload_reader& r) {
  return is_vi(r, wire::ViMessage::DOWNLINK);
}

status wire_codec<vi_downlink>::write(payload_writer& w, const vi_downlink& x) {
  auto b = w.get().initVi().initDownlink();
  b.setRound(x.round);
  b.setPhase(x.phase);
  b.setCoin(x.coin);
  write_vector(b.initPayload(), x.payload);
  return {};
}

status wire_codec<vi_downlink>::read(const payload_reader& r, vi_downlink& x) {
  auto m = r.get().getVi().getDownlink();
  x.round = m.getRound();
  x.phase = m.getPhase();
  STARLING_TRY(check_phase(x.phase));
  x.coin = m.getCoin();
  return read_vector(m.getPayload(), x.payload);
}

bool wire_codec<vi_report>::matches(const payload_reader& r) {
  return is_vi(r, wire::ViMessage::REPORT);
}

status wire_codec<vi_report>::write(payload_writer& w, const vi_report& x) {
  auto b = w.get().initVi().initReport();
  b.setIterations(x.iterations);
  auto z = b.initZ(static_cast<unsigned>(x.z.size()));
  for (unsigned i = 0; i < x.z.size(); ++i)
    z.set(i, x.z[i]);
  b.setBitsUp(x.bits_up);
  b.setBitsDown(x.bits_down);
  b.setLiveWorkers(x.live_workers);
  return {};
}

status wire_codec<vi_report>::read(const payload_reader& r, vi_report& x) {
  auto m = r.get().getVi().getReport();
  x.iterations = m.getIterations();
  auto z = m.getZ();
  STARLING_TRY(codec::at_most("vi report z", z.size(), max_dim));
  x.z.reserve(z.size());
  for (auto v : z)
    x.z.push_back(v);
  x.bits_up = m.getBitsUp();
  x.bits_down = m.getBitsDown();
  x.live_workers = m.getLiveWorkers();
  return {};
}

} // namespace starling::messages
