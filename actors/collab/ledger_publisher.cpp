#include "actors/collab/ledger_publisher.hpp"

#include <algorithm>
#include <cmath>

#include <caf/all.hpp>

#include "actors/collab/ledger_record.hpp"
#include "actors/collab/shell.hpp"
#include "actors/dht/client.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::collab {

namespace {

using ledger_tick_atom = caf::atom_constant<caf::atom("ledgertick")>;

struct ledger_publisher_state {
  static inline const char* name = "ledger_publisher";
  ledger_publisher_options opts;
  /// The record id (empty until the node key came, when signing).
  std::string id;
  contribution_summary sum;
  credit_book credits;
  bool left = false;
};

using publisher_actor = caf::stateful_actor<ledger_publisher_state>;

/// An increment as the publisher takes it: finite and > 0, else 0.
double ledger_increment(double v) {
  return std::isfinite(v) && v > 0 ? v : 0.0;
}

/// Stores the summary; `then` runs once the put was answered (or failed).
template <class Then>
void publish_ledger_summary(publisher_actor* self, Then then) {
  auto& s = self->state;
  if (s.id.empty() || s.opts.every.count() <= 0) {
    then();
    return;
  }
  auto now = now_s(self);
  auto sum = s.sum;
  sum.id = s.id;
  sum.name = s.opts.name;
  sum.stage = s.opts.stage;
  sum.token_id = s.opts.token_id;
  sum.time = now;
  sum.left = s.left;
  sum.dropped = std::min(sum.dropped, sum.computed);
  sum.rounds_averaged = std::min(sum.rounds_averaged, sum.rounds);
  sum.credits = s.credits.list();
  sum.credits_other = s.credits.other();
  auto lifetime = 4 * std::chrono::duration<double>(s.opts.every).count();
  auto put = dht::make_subkey_put(ledger_key(s.opts.experiment, ledger_shard(s.id)), s.id,
                                  encode_summary(sum), ns_of(now + lifetime), s.opts.sign);
  auto timeout = std::chrono::duration_cast<caf::timespan>(s.opts.rpc_timeout);
  dht::dht_store(
      self, s.opts.dht, std::move(put), timeout,
      [then](const messages::dht_put_result&) { then(); }, [then](caf::error&) { then(); });
}

caf::behavior ledger_publisher(publisher_actor* self, ledger_publisher_options opts) {
  auto& s = self->state;
  s.opts = std::move(opts);
  s.sum.started = now_s(self);
  auto every = std::chrono::duration_cast<caf::timespan>(s.opts.every);
  if (s.opts.every.count() > 0 && s.opts.dht) {
    if (!s.opts.sign) {
      s.id = s.opts.address;
    } else {
      auto timeout = std::chrono::duration_cast<caf::timespan>(s.opts.rpc_timeout);
      self->request(s.opts.dht, timeout, dht_key_atom::value)
          .then(
              [=](const std::string& key) {
                self->state.id = record_id(self->state.opts.address, key);
              },
              [](caf::error&) {}); // unsigned records would be refused: it publishes nothing
    }
    self->delayed_send(self, every, ledger_tick_atom::value);
  }
  return {
      [=](ledger_add_atom, double computed, double dropped, double rounds, double averaged) {
        auto& x = self->state.sum;
        x.computed = std::min(max_ledger_count, x.computed + ledger_increment(computed));
        x.dropped = std::min(max_ledger_count, x.dropped + ledger_increment(dropped));
        x.rounds = std::min(max_ledger_count, x.rounds + ledger_increment(rounds));
        x.rounds_averaged =
            std::min(max_ledger_count, x.rounds_averaged + ledger_increment(averaged));
      },
      [=](ledger_credit_atom, const std::string& partner, double samples) {
        self->state.credits.add(partner, samples);
      },
      [=](ledger_gauge_atom, double loss, double step) {
        auto& x = self->state.sum;
        if (std::isfinite(loss))
          x.loss = loss;
        if (std::isfinite(step) && step >= 0 && step <= max_ledger_count)
          x.step = std::max(x.step, step);
      },
      [=](ledger_tick_atom) {
        if (self->state.left)
          return;
        publish_ledger_summary(self, [] {});
        self->delayed_send(self, every, ledger_tick_atom::value);
      },
      [=](ledger_left_atom) {
        if (self->state.left)
          return;
        self->state.left = true;
        publish_ledger_summary(self, [self] { self->quit(); });
      },
  };
}

} // namespace

caf::actor spawn_ledger_publisher(caf::actor_system& sys, ledger_publisher_options opts) {
  return sys.spawn(ledger_publisher, std::move(opts));
}

} // namespace starling::actors::collab
