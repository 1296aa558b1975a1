// Envelope payloads of the DHT protocol (messages/dht.capnp), torch-free.
#include "messages/codec_util.hpp"
#include "messages/dht.hpp"
#include "messages/envelope.hpp"

namespace starling::messages {

namespace {

constexpr size_t max_key_bytes = 4096;
constexpr size_t max_value_bytes = size_t{1} << 20;
constexpr size_t max_records = 1024;
constexpr size_t max_closer = 256;

void write_peer(wire::DhtPeer::Builder b, const dht_peer& x) {
  b.setId(codec::data(x.id));
  b.setAddress(codec::text(x.address));
}

status read_peer(wire::DhtPeer::Reader r, dht_peer& x) {
  STARLING_TRY(codec::get(r.getId(), "peer id", 20, x.id));
  if (!x.id.empty() && x.id.size() != 20)
    return fail("a peer id has 20 bytes, got " + std::to_string(x.id.size()));
  return codec::get(r.getAddress(), "peer address", codec::max_name_bytes, x.address);
}

void write_record(wire::DhtRecord::Builder b, const dht_record& x) {
  b.setKey(codec::data(x.key));
  b.setHasSubkey(x.has_subkey);
  b.setSubkey(codec::data(x.subkey));
  b.setValue(codec::data(x.value));
  b.setExpirationNs(x.expiration_ns);
  b.setSignature(codec::data(x.signature));
}

status read_record(wire::DhtRecord::Reader r, dht_record& x) {
  STARLING_TRY(codec::get(r.getKey(), "record key", max_key_bytes, x.key));
  x.has_subkey = r.getHasSubkey();
  STARLING_TRY(codec::get(r.getSubkey(), "record subkey", max_key_bytes, x.subkey));
  STARLING_TRY(codec::get(r.getValue(), "record value", max_value_bytes, x.value));
  x.expiration_ns = r.getExpirationNs();
  STARLING_TRY(codec::get(r.getSignature(), "record signature", 64, x.signature));
  if (!x.signature.empty() && x.signature.size() != 64)
    return fail("a record signature has 64 bytes, got " + std::to_string(x.signature.size()));
  return {};
}

void write_records(capnp::List<wire::DhtRecord>::Builder b, const std::vector<dht_record>& xs) {
  for (unsigned i = 0; i < xs.size(); ++i)
    write_record(b[i], xs[i]);
}

status read_records(capnp::List<wire::DhtRecord>::Reader r, std::vector<dht_record>& xs) {
  STARLING_TRY(codec::at_most("records", r.size(), max_records));
  xs.resize(r.size());
  for (unsigned i = 0; i < r.size(); ++i)
    STARLING_TRY(read_record(r[i], xs[i]));
  return {};
}

bool is_dht(const payload_reader& r, wire::DhtMessage::Which w) {
  return r.get().isDht() && r.get().getDht().which() == w;
}

} // namespace

// -- dht_peer ---------------------------------------------------------------------------------

bool wire_codec<dht_peer>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::PEER);
}

status wire_codec<dht_peer>::write(payload_writer& w, const dht_peer& x) {
  write_peer(w.get().initDht().initPeer(), x);
  return {};
}

status wire_codec<dht_peer>::read(const payload_reader& r, dht_peer& x) {
  return read_peer(r.get().getDht().getPeer(), x);
}

// -- dht_record -------------------------------------------------------------------------------

bool wire_codec<dht_record>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::RECORD);
}

status wire_codec<dht_record>::write(payload_writer& w, const dht_record& x) {
  write_record(w.get().initDht().initRecord(), x);
  return {};
}

status wire_codec<dht_record>::read(const payload_reader& r, dht_record& x) {
  return read_record(r.get().getDht().getRecord(), x);
}

// -- dht_request ------------------------------------------------------------------------------

bool wire_codec<dht_request>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::REQUEST);
}

status wire_codec<dht_request>::write(payload_writer& w, const dht_request& x) {
  auto b = w.get().initDht().initRequest();
  b.setKind(x.kind);
  write_peer(b.initSender(), x.sender);
  b.setTarget(codec::data(x.target));
  b.setKey(codec::data(x.key));
  write_records(b.initRecords(static_cast<unsigned>(x.records.size())), x.records);
  return {};
}

status wire_codec<dht_request>::read(const payload_reader& r, dht_request& x) {
  auto m = r.get().getDht().getRequest();
  x.kind = m.getKind();
  STARLING_TRY(codec::within("request kind", x.kind, static_cast<uint64_t>(dht_rpc::find_value)));
  STARLING_TRY(read_peer(m.getSender(), x.sender));
  STARLING_TRY(codec::get(m.getTarget(), "request target", 20, x.target));
  STARLING_TRY(codec::get(m.getKey(), "request key", max_key_bytes, x.key));
  return read_records(m.getRecords(), x.records);
}

// -- dht_response -----------------------------------------------------------------------------

bool wire_codec<dht_response>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::RESPONSE);
}

status wire_codec<dht_response>::write(payload_writer& w, const dht_response& x) {
  auto b = w.get().initDht().initResponse();
  write_peer(b.initResponder(), x.responder);
  auto closer = b.initCloser(static_cast<unsigned>(x.closer.size()));
  for (unsigned i = 0; i < x.closer.size(); ++i)
    write_peer(closer[i], x.closer[i]);
  write_records(b.initRecords(static_cast<unsigned>(x.records.size())), x.records);
  b.setAccepted(capnp::Data::Reader(x.accepted.data(), x.accepted.size()));
  b.setRefused(codec::text(x.refused));
  return {};
}

status wire_codec<dht_response>::read(const payload_reader& r, dht_response& x) {
  auto m = r.get().getDht().getResponse();
  STARLING_TRY(read_peer(m.getResponder(), x.responder));
  auto closer = m.getCloser();
  STARLING_TRY(codec::at_most("closer peers", closer.size(), max_closer));
  x.closer.resize(closer.size());
  for (unsigned i = 0; i < closer.size(); ++i)
    STARLING_TRY(read_peer(closer[i], x.closer[i]));
  STARLING_TRY(read_records(m.getRecords(), x.records));
  auto acc = m.getAccepted();
  STARLING_TRY(codec::at_most("accepted flags", acc.size(), max_records));
  x.accepted.assign(acc.begin(), acc.end());
  for (auto a : x.accepted)
    STARLING_TRY(codec::within("accepted flag", a, 1));
  return codec::get(m.getRefused(), "refusal", codec::max_reason_bytes, x.refused);
}

// -- dht_put ----------------------------------------------------------------------------------

bool wire_codec<dht_put>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::PUT);
}

status wire_codec<dht_put>::write(payload_writer& w, const dht_put& x) {
  auto b = w.get().initDht().initPut();
  b.setKey(codec::data(x.key));
  b.setHasSubkey(x.has_subkey);
  b.setSubkey(codec::data(x.subkey));
  b.setValue(codec::data(x.value));
  b.setExpirationNs(x.expiration_ns);
  b.setSign(x.sign);
  return {};
}

status wire_codec<dht_put>::read(const payload_reader& r, dht_put& x) {
  auto m = r.get().getDht().getPut();
  STARLING_TRY(codec::get(m.getKey(), "put key", max_key_bytes, x.key));
  x.has_subkey = m.getHasSubkey();
  STARLING_TRY(codec::get(m.getSubkey(), "put subkey", max_key_bytes, x.subkey));
  STARLING_TRY(codec::get(m.getValue(), "put value", max_value_bytes, x.value));
  x.expiration_ns = m.getExpirationNs();
  x.sign = m.getSign();
  return {};
}

// -- dht_put_result ---------------------------------------------------------------------------

bool wire_codec<dht_put_result>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::PUT_RESULT);
}

status wire_codec<dht_put_result>::write(payload_writer& w, const dht_put_result& x) {
  auto b = w.get().initDht().initPutResult();
  b.setAccepted(x.accepted);
  b.setReplicas(x.replicas);
  b.setHops(x.hops);
  return {};
}

status wire_codec<dht_put_result>::read(const payload_reader& r, dht_put_result& x) {
  auto m = r.get().getDht().getPutResult();
  x.accepted = m.getAccepted();
  x.replicas = m.getReplicas();
  x.hops = m.getHops();
  return codec::within("accepted replicas", x.accepted, x.replicas);
}

// -- dht_get_result ---------------------------------------------------------------------------

bool wire_codec<dht_get_result>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::GET_RESULT);
}

status wire_codec<dht_get_result>::write(payload_writer& w, const dht_get_result& x) {
  auto b = w.get().initDht().initGetResult();
  b.setFound(x.found);
  write_records(b.initRecords(static_cast<unsigned>(x.records.size())), x.records);
  b.setHops(x.hops);
  return {};
}

status wire_codec<dht_get_result>::read(const payload_reader& r, dht_get_result& x) {
  auto m = r.get().getDht().getGetResult();
  x.found = m.getFound();
  x.hops = m.getHops();
  return read_records(m.getRecords(), x.records);
}

// -- dht_stats --------------------------------------------------------------------------------

bool wire_codec<dht_stats>::matches(const payload_reader& r) {
  return is_dht(r, wire::DhtMessage::STATS);
}

status wire_codec<dht_stats>::write(payload_writer& w, const dht_stats& x) {
  auto b = w.get().initDht().initStats();
  b.setRecords(x.records);
  b.setPeers(x.peers);
  b.setRejectedTooLarge(x.rejected_too_large);
  b.setRejectedStoreFull(x.rejected_store_full);
  b.setRejectedOlder(x.rejected_older);
  b.setRejectedExpired(x.rejected_expired);
  b.setRejectedBadSignature(x.rejected_bad_signature);
  b.setRejectedBanned(x.rejected_banned);
  b.setRejectedRateLimit(x.rejected_rate_limit);
  b.setEvictedPeers(x.evicted_peers);
  return {};
}

status wire_codec<dht_stats>::read(const payload_reader& r, dht_stats& x) {
  auto m = r.get().getDht().getStats();
  x.records = m.getRecords();
  x.peers = m.getPeers();
  x.rejected_too_large = m.getRejectedTooLarge();
  x.rejected_store_full = m.getRejectedStoreFull();
  x.rejected_older = m.getRejectedOlder();
  x.rejected_expired = m.getRejectedExpired();
  x.rejected_bad_signature = m.getRejectedBadSignature();
  x.rejected_banned = m.getRejectedBanned();
  x.rejected_rate_limit = m.getRejectedRateLimit();
  x.evicted_peers = m.getEvictedPeers();
  return {};
}

} // namespace starling::messages
