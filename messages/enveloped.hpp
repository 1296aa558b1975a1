// The CAF side of envelopes: a message type that crosses processes declares a `wire_codec`
// (its payload's writer and reader) and an `inspect` that calls `inspect_enveloped`. Serializing
// writes one Cap'n Proto Envelope (a byte vector for CAF); deserializing checks it and, when it
// is refused, still succeeds with the message marked (`wire_error`, and each tensor's `error`):
// CAF 0.17 would otherwise drop the message silently and leave the requester to its timeout,
// while this way the receiving actor answers with the reason. Inside a process nothing is encoded.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/deserializer.hpp>
#include <caf/error.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include "kernels/result.hpp"

namespace starling::messages {

class payload_writer;
class payload_reader;
class wire_context;

/// Specialized per message type:
///   `static constexpr const char* name` (the payload kind, e.g. "dht.request"),
///   `static bool matches(const payload_reader&)`,
///   `static status write(payload_writer&, const T&)`,
///   `static status read(const payload_reader&, T&)` (checks every field's range).
template <class T>
struct wire_codec;

/// The wire context of the actor system `unit` belongs to (see `wire_context_holder`), or null.
wire_context* wire_context_of(caf::execution_unit* unit);

/// An envelope built in its Cap'n Proto builder, seen as the pieces of its flat serialization
/// (segment table, then segments): a serializer copies them straight into its buffer, and a
/// tensor payload that references the tensor's memory is copied once, from the tensor.
class encoded_envelope {
public:
  encoded_envelope();
  ~encoded_envelope();
  encoded_envelope(const encoded_envelope&) = delete;
  encoded_envelope& operator=(const encoded_envelope&) = delete;

  /// Builds the envelope of `x` stamped by `ctx` (see `encode_envelope`).
  status build(wire_context* ctx, status (*write)(payload_writer&, const void*), const void* x);

  /// Bytes of the flat serialization.
  uint64_t size() const noexcept { return size_; }

  /// The pieces, in order.
  const std::vector<std::pair<const char*, size_t>>& pieces() const noexcept { return pieces_; }

private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::vector<std::pair<const char*, size_t>> pieces_;
  uint64_t size_ = 0;
};

/// Decodes an envelope into `x`; the refusal's line, or an empty string when admitted.
std::string decode_with(const std::vector<char>& bytes, wire_context* ctx, const char* expected,
                        bool (*matches)(const payload_reader&),
                        status (*read)(const payload_reader&, void*), void* x);

/// Marks a refused message: its `wire_error` (overloads also mark tensors, see swarm.hpp).
template <class T>
void mark_refused(T& x, const std::string& why) {
  x.wire_error = why;
}

/// The body of `inspect` for enveloped message types; `fields` is used by other inspectors
/// (to_string), as a plain `inspect` would be.
template <class Inspector, class T, class Fields>
typename Inspector::result_type inspect_enveloped(Inspector& f, T& x, const char* type_name,
                                                  Fields&& fields) {
  if constexpr (std::is_base_of<caf::serializer, Inspector>::value) {
    auto write = [](payload_writer& w, const void* p) {
      return wire_codec<T>::write(w, *static_cast<const T*>(p));
    };
    encoded_envelope env;
    if (auto st = env.build(wire_context_of(f.context()), write, &x); !st)
      return caf::make_error(caf::sec::invalid_argument, std::string{type_name} + ": " + st.what());
    // Written exactly as CAF writes a std::vector<char> (a length, then the raw bytes), which is
    // what the deserializer reads, without gathering the pieces into one vector first.
    auto n = static_cast<size_t>(env.size());
    if (auto err = f.begin_sequence(n))
      return err;
    for (auto& [p, len] : env.pieces())
      if (auto err = f.apply_raw(len, const_cast<char*>(p)))
        return err;
    return f.end_sequence();
  } else if constexpr (std::is_base_of<caf::deserializer, Inspector>::value) {
    std::vector<char> buf;
    if (auto err = f(caf::meta::type_name(type_name), buf))
      return err;
    x = T{};
    auto read = [](const payload_reader& r, void* p) {
      return wire_codec<T>::read(r, *static_cast<T*>(p));
    };
    auto why = decode_with(buf, wire_context_of(f.context()), wire_codec<T>::name,
                           &wire_codec<T>::matches, read, &x);
    if (!why.empty()) {
      x = T{};
      mark_refused(x, why);
    }
    return caf::none;
  } else {
    return fields();
  }
}

} // namespace starling::messages
