// Envelopes without CAF or torch: writing one around a payload and reading one from untrusted
// bytes (header, payload kind, every field through the payload's reader, replay window), with a
// refusal reason for everything that is not admitted. `enveloped.hpp` puts this under CAF's
// `inspect`; the fuzzer calls it directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "messages/envelope.capnp.h"
#include "messages/wire_context.hpp"

namespace starling::messages {

/// The payload union of an envelope being written.
class payload_writer {
public:
  /// Wraps the payload builder of an envelope.
  explicit payload_writer(wire::Envelope::Payload::Builder b) : b_(b) {}
  /// The builder: a codec calls one `init...()` on it.
  wire::Envelope::Payload::Builder& get() { return b_; }

private:
  wire::Envelope::Payload::Builder b_;
};

/// The payload union of an envelope being read (untrusted).
class payload_reader {
public:
  /// Wraps the payload reader of an envelope.
  explicit payload_reader(wire::Envelope::Payload::Reader r) : r_(r) {}
  /// The reader.
  wire::Envelope::Payload::Reader get() const { return r_; }

private:
  wire::Envelope::Payload::Reader r_;
};

/// Builds an envelope stamped by `ctx` (version, experiment, sender, sequence, time; without a
/// context only the version), lets `write` fill the payload, and writes it as one flat array.
/// kj exceptions become a failure.
status encode_envelope(wire_context* ctx, const std::function<status(payload_writer&)>& write,
                       std::vector<char>& out);

/// Reads an envelope from untrusted bytes: size, structure, version, sender size, then (with a
/// context) experiment and clock, then `matches` (the payload kind; names `expected` in the
/// refusal), then `read` (every field's range), then (with a context) the replay window. Every
/// refusal is counted in `ctx`. Returns the refusal, or nothing when admitted.
std::optional<wire_refusal>
decode_envelope(const char* bytes, size_t size, wire_context* ctx, const char* expected,
                const std::function<bool(const payload_reader&)>& matches,
                const std::function<status(const payload_reader&)>& read);

/// The name of the payload kind an envelope carries (`"dht.request"`, `"stage.forward"`...).
std::string payload_name(wire::Envelope::Payload::Reader p);

/// Checks an envelope's payload of any kind without torch: payloads of the DHT, MASHA, transfer
/// and runtime types are decoded into them; stage and averager payloads are checked field by
/// field with every tensor's header and payload. What the fuzzer runs.
status check_payload(const payload_reader& p);

/// Checks a stage payload's every field (torch-free; the decoders in stage_codec.cpp call it
/// first and then only copy). With `tensors`, also each tensor's header and payload (the decoders
/// do that while decoding them).
status check_stage(wire::StageMessage::Reader m, bool tensors);

/// Checks an averager payload's every field, like `check_stage`.
status check_averager(wire::AveragerMessage::Reader m, bool tensors);

} // namespace starling::messages
