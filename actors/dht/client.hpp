// The client API other actors use to talk to their node's DHT actor: asynchronous store and get
// with timeouts, byte values, typed values (a Cap'n Proto struct encoded as the value bytes) and
// an announcer that re-stores a record every period T with expiration now + 2T.
//
// Typed values: the DHT itself stores opaque bytes (records are compared, signed and limited as
// bytes, so every node can serve keys whose schema it does not know). Typing lives at the edges:
// `encode_value<S>` builds a struct `S` into a flat array, `decode_value<S>` reads an untrusted
// value back with `messages::read_flat`'s checks (size, alignment, traversal limit, exceptions).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <capnp/message.h>

#include "kernels/result.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/wire.hpp"

namespace starling::actors::dht {

/// DHT time now, in the clock of `self` (virtual in simulation).
template <class Self>
int64_t dht_now_ns(Self* self) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             self->clock().now().time_since_epoch())
      .count();
}

/// The absolute expiration `ttl` from now.
template <class Self>
int64_t expires_in(Self* self, caf::timespan ttl) {
  return dht_now_ns(self) + std::chrono::duration_cast<std::chrono::nanoseconds>(ttl).count();
}

/// A put of a plain value.
inline messages::dht_put make_put(std::string key, std::vector<char> value, int64_t expiration_ns,
                                  bool sign = false) {
  messages::dht_put p;
  p.key = std::move(key);
  p.value = std::move(value);
  p.expiration_ns = expiration_ns;
  p.sign = sign;
  return p;
}

/// A put of one sub-key of a dictionary record.
inline messages::dht_put make_subkey_put(std::string key, std::string subkey,
                                         std::vector<char> value, int64_t expiration_ns,
                                         bool sign = false) {
  auto p = make_put(std::move(key), std::move(value), expiration_ns, sign);
  p.has_subkey = true;
  p.subkey = std::move(subkey);
  return p;
}

/// Encodes the Cap'n Proto struct `S` that `fill(typename S::Builder)` writes as a DHT value.
template <class S, class Fill>
std::vector<char> encode_value(Fill&& fill) {
  capnp::MallocMessageBuilder msg;
  fill(msg.initRoot<S>());
  std::vector<char> out;
  messages::write_flat(msg, out);
  return out;
}

/// Reads an untrusted value as the Cap'n Proto struct `S` and calls `read(typename S::Reader)`
/// (which returns `status`) while the message lives; malformed bytes and exceptions thrown by
/// the reader give a failure, never a crash.
template <class S, class Read>
status decode_value(const std::vector<char>& value, Read&& read) {
  return messages::read_flat(value.data(), value.size(),
                             [&](capnp::MessageReader& r) -> status {
                               return read(r.getRoot<S>());
                             });
}

/// A put whose value is the Cap'n Proto struct `S` built by `fill` (see `encode_value`).
template <class S, class Fill>
messages::dht_put make_typed_put(std::string key, Fill&& fill, int64_t expiration_ns,
                                 bool sign = false) {
  return make_put(std::move(key), encode_value<S>(std::forward<Fill>(fill)), expiration_ns, sign);
}

/// A sub-key put whose value is the Cap'n Proto struct `S` built by `fill`.
template <class S, class Fill>
messages::dht_put make_typed_subkey_put(std::string key, std::string subkey, Fill&& fill,
                                        int64_t expiration_ns, bool sign = false) {
  return make_subkey_put(std::move(key), std::move(subkey),
                         encode_value<S>(std::forward<Fill>(fill)), expiration_ns, sign);
}

/// Stores `put`; `ok(const dht_put_result&)` or `err(caf::error&)` within `timeout`.
template <class Self, class OnOk, class OnErr>
void dht_store(Self* self, const caf::actor& dht, messages::dht_put put, caf::timespan timeout,
               OnOk ok, OnErr err) {
  self->request(dht, timeout, std::move(put)).then(std::move(ok), std::move(err));
}

/// Reads `key`; `ok(const dht_get_result&)` or `err(caf::error&)` within `timeout`.
template <class Self, class OnOk, class OnErr>
void dht_get(Self* self, const caf::actor& dht, std::string key, caf::timespan timeout, OnOk ok,
             OnErr err) {
  self->request(dht, timeout, get_atom::value, std::move(key)).then(std::move(ok), std::move(err));
}

/// State of an announcer: how many announcements were accepted by at least one replica.
struct announcer_state {
  uint64_t accepted = 0;
  uint64_t failed = 0;
};

/// Stores `put` now and every `period`, each time with expiration now + 2 * period, until it
/// is killed. Spawn with `spawn(dht_announcer, dht, put, period)`.
inline caf::behavior dht_announcer(caf::stateful_actor<announcer_state>* self, caf::actor dht,
                                   messages::dht_put put, caf::timespan period) {
  self->send(self, tick_atom::value);
  return {
      [=](tick_atom) {
        auto p = put;
        p.expiration_ns = expires_in(self, 2 * period);
        dht_store(
            self, dht, std::move(p), period,
            [=](const messages::dht_put_result& r) {
              if (r.accepted > 0)
                self->state.accepted++;
              else
                self->state.failed++;
            },
            [=](caf::error&) { self->state.failed++; });
        self->delayed_send(self, period, tick_atom::value);
      },
  };
}

} // namespace starling::actors::dht
