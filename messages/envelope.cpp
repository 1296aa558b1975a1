#include "messages/envelope.hpp"

#include <exception>

#include <capnp/message.h>
#include <kj/exception.h>
#include <sodium.h>

#include "messages/enveloped.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

/// Longest experiment id carried, in bytes.
constexpr size_t max_experiment_bytes = 128;
/// A sender id's size (BLAKE2b-160 of the node key).
constexpr size_t sender_bytes = 20;

/// A first segment (2 KiB) that holds a control message in one allocation; a large payload gets
/// a segment of its own size anyway, and a bigger first segment would be zeroed for nothing.
constexpr unsigned envelope_segment_words = 256;

/// What an envelope's digest starts with: signatures of envelopes are of nothing else.
constexpr char digest_domain[] = "starling envelope v3";

/// BLAKE2b-256 of the domain and `pieces` (an envelope's flat bytes).
std::string envelope_digest(const std::vector<std::pair<const char*, size_t>>& pieces) {
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, envelope_digest_bytes);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(digest_domain),
                            sizeof digest_domain);
  for (auto& [p, n] : pieces)
    crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(p), n);
  std::string out(envelope_digest_bytes, '\0');
  crypto_generichash_final(&st, reinterpret_cast<unsigned char*>(out.data()), out.size());
  return out;
}

/// The signature of `pieces` by `ctx`'s node, or a failure (a signer that returned no
/// signature of the right size).
result<std::string> sign_pieces(wire_context& ctx,
                                const std::vector<std::pair<const char*, size_t>>& pieces) {
  auto sig = ctx.sign(envelope_digest(pieces));
  if (sig.size() != envelope_signature_bytes)
    return fail("encoding failed: the node's signer returned " + std::to_string(sig.size())
                + " bytes, expected a 64-byte signature");
  return sig;
}

/// The size of the flat Cap'n Proto message at the start of `bytes` by its segment table, or
/// nothing when the table does not fit (the reader then says why).
std::optional<uint64_t> flat_size(const char* bytes, size_t size) {
  if (size < 4)
    return std::nullopt;
  auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i)
      v = (v << 8) | static_cast<uint8_t>(bytes[at + static_cast<size_t>(i)]);
    return v;
  };
  uint64_t count = uint64_t{le32(0)} + 1;
  if (count > 512) // capnp's own limit on segments
    return std::nullopt;
  uint64_t table = ((count + 2) & ~uint64_t{1}) * 4;
  if (size < table)
    return std::nullopt;
  uint64_t words = 0;
  for (uint64_t i = 0; i < count; ++i)
    words += le32(4 + 4 * static_cast<size_t>(i));
  return table + words * sizeof(capnp::word);
}

} // namespace

namespace {

/// Writes the header: the version, and with a context the experiment, sender, sequence, time.
void stamp(wire::Envelope::Builder env, wire_context* ctx) {
  env.setProtocolVersion(protocol_version);
  if (!ctx)
    return;
  auto& o = ctx->options();
  env.setExperimentId(o.experiment);
  env.setSenderPeerId(
    capnp::Data::Reader(reinterpret_cast<const kj::byte*>(o.peer_id.data()), o.peer_id.size()));
  auto [seq, t] = ctx->stamp();
  env.setSequence(seq);
  env.setSendTimeNs(t);
}

} // namespace

status encode_envelope(wire_context* ctx, const std::function<status(payload_writer&)>& write,
                       std::vector<char>& out) {
  try {
    capnp::MallocMessageBuilder msg(envelope_segment_words);
    auto env = msg.initRoot<wire::Envelope>();
    stamp(env, ctx);
    payload_writer w{env.getPayload()};
    if (auto st = write(w); !st)
      return st;
    write_flat(msg, out);
    if (ctx && ctx->signs()) {
      auto sig = sign_pieces(*ctx, {{out.data(), out.size()}});
      if (!sig)
        return sig.error();
      out.insert(out.end(), sig->begin(), sig->end());
    }
    return {};
  } catch (const kj::Exception& e) {
    return fail("encoding failed: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"encoding failed: "} + e.what());
  }
}

std::optional<wire_refusal>
decode_envelope(const char* bytes, size_t size, wire_context* ctx, const char* expected,
                const std::function<bool(const payload_reader&)>& matches,
                const std::function<status(const payload_reader&)>& read) {
  std::optional<wire_refusal> refusal;
  auto refuse = [&](wire_reason why, std::string detail) {
    refusal = wire_refusal{why, std::move(detail)};
    return fail("refused");
  };
  envelope_header h;
  auto limit = ctx ? ctx->options().max_envelope_bytes : max_message_bytes;
  // A signature follows the flat message when the bytes exceed it by exactly one.
  std::string_view signature;
  if (auto flat = flat_size(bytes, size);
      flat && size >= envelope_signature_bytes && *flat == size - envelope_signature_bytes) {
    signature = std::string_view{bytes + *flat, envelope_signature_bytes};
    size = static_cast<size_t>(*flat);
  }
  if (size > limit) {
    refusal = wire_refusal{wire_reason::too_large, "an envelope of " + std::to_string(size)
                                                     + " bytes, at most "
                                                     + std::to_string(limit) + " accepted"};
  } else {
    auto st = read_flat(bytes, size, [&](capnp::MessageReader& r) -> status {
      auto env = r.getRoot<wire::Envelope>();
      h.version = env.getProtocolVersion();
      if (h.version != protocol_version)
        return refuse(wire_reason::version, "protocol version " + std::to_string(h.version)
                                              + " (another starling build), this node speaks "
                                              + std::to_string(protocol_version));
      auto exp = env.getExperimentId();
      if (exp.size() > max_experiment_bytes)
        return refuse(wire_reason::out_of_range,
                      "an experiment id of " + std::to_string(exp.size()) + " bytes (at most 128)");
      h.experiment.assign(exp.begin(), exp.size());
      auto sender = env.getSenderPeerId();
      if (sender.size() != 0 && sender.size() != sender_bytes)
        return refuse(wire_reason::sender, "a sender peer id of " + std::to_string(sender.size())
                                             + " bytes, expected 20");
      h.sender.assign(reinterpret_cast<const char*>(sender.begin()), sender.size());
      h.sequence = env.getSequence();
      h.time_ns = env.getSendTimeNs();
      wire_refusal why;
      if (ctx && !ctx->check(h, why))
        return refuse(why.why, why.detail);
      payload_reader p{env.getPayload()};
      if (!matches(p))
        return refuse(wire_reason::wrong_payload, "carries " + payload_name(p.get())
                                                    + ", expected " + expected);
      // Admission before the payload is read: an unadmitted sender costs no decoding.
      if (ctx && !ctx->authorize(h, expected, why))
        return refuse(why.why, why.detail);
      // The signature before anything is recorded: a forged envelope must not use up its
      // victim's sequence numbers.
      if (ctx && (!signature.empty() || ctx->options().require_signature)
          && !ctx->verify(h,
                          signature.empty() ? std::string{}
                                            : envelope_digest({{bytes, size}}),
                          signature, why))
        return refuse(why.why, why.detail);
      try {
        if (auto st = read(p); !st)
          return refuse(wire_reason::out_of_range, std::string{expected} + ": " + st.what());
      } catch (const kj::Exception& e) {
        return refuse(wire_reason::malformed, std::string{expected} + ": "
                                                + e.getDescription().cStr());
      }
      if (ctx && !ctx->record(h, why))
        return refuse(why.why, why.detail);
      return {};
    });
    if (!st && !refusal)
      refusal = wire_refusal{wire_reason::malformed, st.what()};
  }
  if (ctx) {
    if (refusal)
      ctx->count(refusal->why);
    else
      ctx->count_admitted();
  }
  return refusal;
}

std::string payload_name(wire::Envelope::Payload::Reader p) {
  using P = wire::Envelope::Payload;
  switch (p.which()) {
    case P::TENSOR:
      return "tensor";
    case P::PING:
      return "ping";
    case P::BLOB:
      return "blob";
    case P::METRIC:
      return "metric";
    case P::DHT:
      switch (p.getDht().which()) {
        case wire::DhtMessage::REQUEST:
          return "dht.request";
        case wire::DhtMessage::RESPONSE:
          return "dht.response";
        case wire::DhtMessage::PUT:
          return "dht.put";
        case wire::DhtMessage::PUT_RESULT:
          return "dht.put_result";
        case wire::DhtMessage::GET_RESULT:
          return "dht.get_result";
        case wire::DhtMessage::STATS:
          return "dht.stats";
        case wire::DhtMessage::PEER:
          return "dht.peer";
        case wire::DhtMessage::RECORD:
          return "dht.record";
      }
      return "dht.unknown(" + std::to_string(static_cast<int>(p.getDht().which())) + ")";
    case P::AVERAGER:
      return "averager." + std::to_string(static_cast<int>(p.getAverager().which()));
    case P::STAGE:
      return "stage." + std::to_string(static_cast<int>(p.getStage().which()));
    case P::VI:
      return "vi." + std::to_string(static_cast<int>(p.getVi().which()));
    case P::TRANSFER:
      return "transfer." + std::to_string(static_cast<int>(p.getTransfer().which()));
  }
  return "unknown payload " + std::to_string(static_cast<int>(p.which()));
}

struct encoded_envelope::impl {
  capnp::MallocMessageBuilder msg{envelope_segment_words};
  std::vector<uint32_t> table;
  std::string signature;
};

encoded_envelope::encoded_envelope() = default;

encoded_envelope::~encoded_envelope() = default;

status encoded_envelope::build(wire_context* ctx,
                               status (*write)(payload_writer&, const void*), const void* x) {
  try {
    impl_ = std::make_unique<impl>();
    auto env = impl_->msg.initRoot<wire::Envelope>();
    stamp(env, ctx);
    payload_writer w{env.getPayload()};
    if (auto st = write(w, x); !st)
      return st;
    auto segs = impl_->msg.getSegmentsForOutput();
    // The stream framing of capnp::writeMessage: (count - 1), each size in words, padded to 8.
    auto& table = impl_->table;
    table.assign((segs.size() + 2) & ~size_t{1}, 0);
    table[0] = static_cast<uint32_t>(segs.size() - 1);
    for (size_t i = 0; i < segs.size(); ++i)
      table[i + 1] = static_cast<uint32_t>(segs[i].size());
    pieces_.clear();
    size_ = table.size() * sizeof(uint32_t);
    pieces_.emplace_back(reinterpret_cast<const char*>(table.data()), size_);
    for (auto seg : segs) {
      auto bytes = seg.size() * sizeof(capnp::word);
      pieces_.emplace_back(reinterpret_cast<const char*>(seg.begin()), bytes);
      size_ += bytes;
    }
    if (ctx && ctx->signs()) {
      auto sig = sign_pieces(*ctx, pieces_);
      if (!sig)
        return sig.error();
      impl_->signature = std::move(*sig);
      pieces_.emplace_back(impl_->signature.data(), impl_->signature.size());
      size_ += impl_->signature.size();
    }
    return {};
  } catch (const kj::Exception& e) {
    return fail("encoding failed: " + std::string{e.getDescription().cStr()});
  } catch (const std::exception& e) {
    return fail(std::string{"encoding failed: "} + e.what());
  }
}

std::string decode_with(const std::vector<char>& bytes, wire_context* ctx, const char* expected,
                        bool (*matches)(const payload_reader&),
                        status (*read)(const payload_reader&, void*), void* x) {
  auto r = decode_envelope(
    bytes.data(), bytes.size(), ctx, expected, matches,
    [&](const payload_reader& p) { return read(p, x); });
  return r ? r->line() : std::string{};
}

} // namespace starling::messages
