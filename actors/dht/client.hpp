// The client API other actors use to talk to their node's DHT actor: asynchronous store and get
// with timeouts, byte values, and an announcer that re-stores a record every period T with
// expiration now + 2T.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>

#include "messages/atoms.hpp"
#include "messages/dht.hpp"

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
