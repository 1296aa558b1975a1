// Envelope payloads of the runtime's own messages (ping, blob, metric events), torch-free.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/metrics.hpp"
#include "messages/types.hpp"

namespace starling::messages {

bool wire_codec<ping_msg>::matches(const payload_reader& r) {
  return r.get().isPing();
}

status wire_codec<ping_msg>::write(payload_writer& w, const ping_msg& x) {
  auto b = w.get().initPing();
  b.setSeq(x.seq);
  b.setOrigin(codec::text(x.origin));
  return {};
}

status wire_codec<ping_msg>::read(const payload_reader& r, ping_msg& x) {
  auto m = r.get().getPing();
  x.seq = m.getSeq();
  return codec::get(m.getOrigin(), "ping origin", 256, x.origin);
}

bool wire_codec<blob_msg>::matches(const payload_reader& r) {
  return r.get().isBlob();
}

status wire_codec<blob_msg>::write(payload_writer& w, const blob_msg& x) {
  auto b = w.get().initBlob();
  b.setTag(codec::text(x.tag));
  b.setBytes(codec::data(x.bytes));
  return {};
}

status wire_codec<blob_msg>::read(const payload_reader& r, blob_msg& x) {
  auto m = r.get().getBlob();
  STARLING_TRY(codec::get(m.getTag(), "blob tag", 256, x.tag));
  return codec::get(m.getBytes(), "blob bytes", size_t{256} << 20, x.bytes);
}

bool wire_codec<metric_event>::matches(const payload_reader& r) {
  return r.get().isMetric();
}

status wire_codec<metric_event>::write(payload_writer& w, const metric_event& x) {
  auto b = w.get().initMetric();
  b.setSource(codec::text(x.source));
  b.setKind(codec::text(x.kind));
  auto values = b.initValues(static_cast<unsigned>(x.values.size()));
  unsigned i = 0;
  for (auto& [k, v] : x.values) {
    values[i].setKey(codec::text(k));
    values[i++].setValue(v);
  }
  auto labels = b.initLabels(static_cast<unsigned>(x.labels.size()));
  i = 0;
  for (auto& [k, v] : x.labels) {
    labels[i].setKey(codec::text(k));
    labels[i++].setValue(codec::text(v));
  }
  b.setT(x.t);
  return {};
}

status wire_codec<metric_event>::read(const payload_reader& r, metric_event& x) {
  constexpr size_t max_entries = 1024;
  auto m = r.get().getMetric();
  STARLING_TRY(codec::get(m.getSource(), "metric source", 256, x.source));
  STARLING_TRY(codec::get(m.getKind(), "metric kind", 256, x.kind));
  auto values = m.getValues();
  STARLING_TRY(codec::at_most("metric values", values.size(), max_entries));
  for (auto e : values) {
    std::string k;
    STARLING_TRY(codec::get(e.getKey(), "metric value name", 256, k));
    if (!x.values.emplace(std::move(k), e.getValue()).second)
      return fail("metric value named twice");
  }
  auto labels = m.getLabels();
  STARLING_TRY(codec::at_most("metric labels", labels.size(), max_entries));
  for (auto e : labels) {
    std::string k, v;
    STARLING_TRY(codec::get(e.getKey(), "metric label name", 256, k));
    STARLING_TRY(codec::get(e.getValue(), "metric label", codec::max_reason_bytes, v));
    if (!x.labels.emplace(std::move(k), std::move(v)).second)
      return fail("metric label named twice");
  }
  x.t = m.getT();
  if (std::isnan(x.t))
    return fail("metric time is not a number");
  return {};
}

} // namespace starling::messages
