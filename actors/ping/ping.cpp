#include "actors/ping/ping.hpp"

#include <map>
#include <random>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/types.hpp"

namespace starling::actors::ping {

namespace {

using messages::blob_msg;

/// The echo keeps nothing but its name.
struct echo_state {
  static constexpr const char* name = "ping_echo";
};

caf::behavior echo_actor(caf::stateful_actor<echo_state>*) {
  return {[](const blob_msg& m) -> caf::result<blob_msg> {
    // A ping whose envelope was refused (counted by the wire context) is answered with the
    // reason: an empty pong would pass for a successful round trip.
    if (!m.wire_error.empty())
      return caf::make_error(caf::sec::invalid_argument, "ping refused: " + m.wire_error);
    return blob_msg{"pong", m.bytes};
  }};
}

struct pinger_state {
  static constexpr const char* name = "pinger";
  pinger_options opts;
  std::mt19937_64 rng;
  /// Targets resolved so far (a target is resolved again after a failed ping).
  std::map<std::string, caf::actor> peers;
};

using pinger_actor = caf::stateful_actor<pinger_state>;

void report(pinger_actor* self, const std::string& target, double rtt_ms, bool lost,
            const std::string& reason = {}) {
  messages::metric_event e;
  e.source = self->state.opts.name;
  e.kind = lost ? "lost" : "ping";
  e.labels["target"] = target;
  if (!reason.empty())
    e.labels["reason"] = reason;
  if (!lost)
    e.values["rtt_ms"] = rtt_ms;
  self->send(self->state.opts.sink, std::move(e));
}

void ping(pinger_actor* self, const caf::actor& peer, const std::string& target) {
  auto& o = self->state.opts;
  auto t0 = self->clock().now();
  self->request(peer, o.timeout, blob_msg{"ping", std::vector<char>(o.payload, 'p')})
      .then(
          [=](const blob_msg& reply) {
            if (!reply.wire_error.empty()) {
              // The pong's envelope was refused here: counted by the wire context, and a loss.
              report(self, target, 0, true, reply.wire_error);
              return;
            }
            auto rtt = std::chrono::duration<double, std::milli>(self->clock().now() - t0);
            report(self, target, rtt.count(), false);
          },
          [=](caf::error& e) {
            self->state.peers.erase(target);
            report(self, target, 0, true, self->system().render(e));
          });
}

caf::behavior pinger(pinger_actor* self, pinger_options opts) {
  self->state.rng.seed(opts.seed);
  self->state.opts = std::move(opts);
  self->delayed_send(self, self->state.opts.interval, tick_atom::value);
  return {
      [=](tick_atom) {
        auto& st = self->state;
        self->delayed_send(self, st.opts.interval, tick_atom::value);
        if (st.opts.targets.empty())
          return;
        std::uniform_int_distribution<size_t> pick{0, st.opts.targets.size() - 1};
        auto target = st.opts.targets[pick(st.rng)];
        if (auto i = st.peers.find(target); i != st.peers.end()) {
          ping(self, i->second, target);
          return;
        }
        self->request(st.opts.resolver, st.opts.timeout, resolve_atom::value, target)
            .then(
                [=](const caf::actor& peer) {
                  self->state.peers[target] = peer;
                  ping(self, peer, target);
                },
                [=](caf::error&) { report(self, target, 0, true); });
      },
  };
}

} // namespace

caf::actor spawn_echo(caf::actor_system& sys) {
  return sys.spawn(echo_actor);
}

caf::actor spawn_pinger(caf::actor_system& sys, pinger_options opts) {
  return sys.spawn(pinger, std::move(opts));
}

} // namespace starling::actors::ping
