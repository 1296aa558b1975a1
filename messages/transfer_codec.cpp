// Envelope payloads of transfer control (messages/transfer.capnp), torch-free.
#include <cstring>

#include "kernels/compress/format.hpp"
#include "messages/chunked.hpp"
#include "messages/codec_util.hpp"
#include "messages/direct.hpp"
#include "messages/envelope.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

constexpr size_t max_chunk_bytes = size_t{64} << 20;
constexpr uint64_t max_total_bytes = uint64_t{1} << 40;

bool is_transfer(const payload_reader& r, wire::TransferMessage::Which w) {
  return r.get().isTransfer() && r.get().getTransfer().which() == w;
}

} // namespace

bool wire_codec<direct_announce>::matches(const payload_reader& r) {
  return is_transfer(r, wire::TransferMessage::ANNOUNCE);
}

status wire_codec<direct_announce>::write(payload_writer& w, const direct_announce& x) {
  auto b = w.get().initTransfer().initAnnounce();
  b.setToken(codec::data(x.token));
  b.setTotalBytes(x.total_bytes);
  b.setDtype(x.dtype);
  auto shape = b.initShape(static_cast<unsigned>(x.shape.size()));
  for (unsigned i = 0; i < x.shape.size(); ++i)
    shape.set(i, x.shape[i]);
  b.setCodec(x.codec);
  return {};
}

status wire_codec<direct_announce>::read(const payload_reader& r, direct_announce& x) {
  auto m = r.get().getTransfer().getAnnounce();
  STARLING_TRY(codec::get(m.getToken(), "announce token", 16, x.token));
  x.total_bytes = m.getTotalBytes();
  STARLING_TRY(codec::within("announced bytes", x.total_bytes, max_message_bytes));
  x.dtype = m.getDtype();
  STARLING_TRY(codec::within("announced dtype", x.dtype, kernels::wire_dtype_count - 1));
  auto shape = m.getShape();
  STARLING_TRY(codec::at_most("announced shape", shape.size(), 64));
  for (auto d : shape) {
    if (d < 0)
      return fail("announced dimension " + std::to_string(d) + " is negative");
    x.shape.push_back(d);
  }
  x.codec = m.getCodec();
  return codec::within("announced codec", x.codec, kernels::codec_count - 1);
}

bool wire_codec<direct_endpoint>::matches(const payload_reader& r) {
  return is_transfer(r, wire::TransferMessage::ENDPOINT);
}

status wire_codec<direct_endpoint>::write(payload_writer& w, const direct_endpoint& x) {
  auto b = w.get().initTransfer().initEndpoint();
  b.setHost(codec::text(x.host));
  b.setPort(x.port);
  return {};
}

status wire_codec<direct_endpoint>::read(const payload_reader& r, direct_endpoint& x) {
  auto m = r.get().getTransfer().getEndpoint();
  x.port = m.getPort();
  return codec::get(m.getHost(), "endpoint host", 255, x.host);
}

bool wire_codec<transfer_report>::matches(const payload_reader& r) {
  return is_transfer(r, wire::TransferMessage::REPORT);
}

status wire_codec<transfer_report>::write(payload_writer& w, const transfer_report& x) {
  auto b = w.get().initTransfer().initReport();
  b.setBytes(x.bytes);
  b.setPath(codec::text(x.path));
  b.setFallbackReason(codec::text(x.fallback_reason));
  return {};
}

status wire_codec<transfer_report>::read(const payload_reader& r, transfer_report& x) {
  auto m = r.get().getTransfer().getReport();
  x.bytes = m.getBytes();
  STARLING_TRY(codec::get(m.getPath(), "report path", 64, x.path));
  return codec::get(m.getFallbackReason(), "fallback reason", codec::max_reason_bytes,
                    x.fallback_reason);
}

bool wire_codec<chunk_msg>::matches(const payload_reader& r) {
  return is_transfer(r, wire::TransferMessage::CHUNK);
}

status wire_codec<chunk_msg>::write(payload_writer& w, const chunk_msg& x) {
  auto b = w.get().initTransfer().initChunk();
  b.setTransferId(x.transfer_id);
  b.setIndex(x.index);
  b.setCount(x.count);
  b.setTotalBytes(x.total_bytes);
  if (x.size() > max_chunk_bytes)
    return fail("a chunk of " + std::to_string(x.size()) + " bytes (at most 64 MiB)");
  auto d = b.initBytes(static_cast<unsigned>(x.size()));
  size_t off = 0;
  auto err = x.view([&](const char* p, size_t n) {
    std::memcpy(d.begin() + off, p, n);
    off += n;
    return caf::error{};
  });
  if (err)
    return fail("reading the chunk's source failed");
  return {};
}

status wire_codec<chunk_msg>::read(const payload_reader& r, chunk_msg& x) {
  auto m = r.get().getTransfer().getChunk();
  x.transfer_id = m.getTransferId();
  x.index = m.getIndex();
  x.count = m.getCount();
  if (x.count > 0 && x.index >= x.count)
    return fail("chunk " + std::to_string(x.index) + " of " + std::to_string(x.count));
  x.total_bytes = m.getTotalBytes();
  STARLING_TRY(codec::within("chunk total bytes", x.total_bytes, max_total_bytes));
  STARLING_TRY(codec::get(m.getBytes(), "chunk bytes", max_chunk_bytes, x.bytes));
  return codec::within("chunk bytes", x.bytes.size(), x.total_bytes);
}

bool wire_codec<chunk_ack_msg>::matches(const payload_reader& r) {
  return is_transfer(r, wire::TransferMessage::CHUNK_ACK);
}

status wire_codec<chunk_ack_msg>::write(payload_writer& w, const chunk_ack_msg& x) {
  auto b = w.get().initTransfer().initChunkAck();
  b.setTransferId(x.transfer_id);
  b.setIndex(x.index);
  b.setDone(x.done);
  b.setError(codec::text(x.error));
  return {};
}

status wire_codec<chunk_ack_msg>::read(const payload_reader& r, chunk_ack_msg& x) {
  auto m = r.get().getTransfer().getChunkAck();
  x.transfer_id = m.getTransferId();
  x.index = m.getIndex();
  x.done = m.getDone();
  return codec::get(m.getError(), "ack error", codec::max_reason_bytes, x.error);
}

} // namespace starling::messages
