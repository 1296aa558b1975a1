// Envelope payloads of the runtime's own messages (ping, blob), torch-free.
#include "messages/codec_util.hpp"
#include "messages/envelope.hpp"
#include "messages/types.hpp"

namespace starling::messages {

using namespace codec;

bool wire_codec<ping_msg>::matches(const payload_reader& r) {
  return r.get().isPing();
}

status wire_codec<ping_msg>::write(payload_writer& w, const ping_msg& x) {
  auto b = w.get().initPing();
  b.setSeq(x.seq);
  b.setOrigin(text(x.origin));
  return {};
}

status wire_codec<ping_msg>::read(const payload_reader& r, ping_msg& x) {
  auto m = r.get().getPing();
  x.seq = m.getSeq();
  return get(m.getOrigin(), "ping origin", 256, x.origin);
}

bool wire_codec<blob_msg>::matches(const payload_reader& r) {
  return r.get().isBlob();
}

status wire_codec<blob_msg>::write(payload_writer& w, const blob_msg& x) {
  auto b = w.get().initBlob();
  b.setTag(text(x.tag));
  b.setBytes(data(x.bytes));
  return {};
}

status wire_codec<blob_msg>::read(const payload_reader& r, blob_msg& x) {
  auto m = r.get().getBlob();
  STARLING_TRY(get(m.getTag(), "blob tag", 256, x.tag));
  return get(m.getBytes(), "blob bytes", size_t{256} << 20, x.bytes);
}

} // namespace starling::messages
