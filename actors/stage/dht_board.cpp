#include "actors/stage/dht_board.hpp"

#include <map>
#include <memory>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/dht/client.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"

namespace starling::actors::stage {

namespace {

using messages::dht_get_result;

struct board_data {
  dht_board_options opts;
  caf::actor dht;
  caf::actor resolver;
  /// Local peers: their announcers, and address by actor.
  std::map<std::string, caf::actor> announcers;
  std::map<caf::actor_addr, std::string> local;
  /// Resolved handles by address, and the reverse for down messages.
  std::map<std::string, caf::actor> cache;
  std::map<caf::actor_addr, std::string> watched;
  /// Addresses seen dead, ignored until the given DHT time (their record's latest expiry).
  std::map<std::string, int64_t> dead;
};

using data_ptr = std::shared_ptr<board_data>;

int64_t ns(caf::timespan t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t).count();
}

/// Addresses of a stage's record that are not known dead.
std::vector<std::string> live_addresses(const data_ptr& d, const dht_get_result& r, int64_t now) {
  std::vector<std::string> out;
  for (auto& rec : r.records) {
    if (!rec.has_subkey)
      continue;
    auto i = d->dead.find(rec.subkey);
    if (i != d->dead.end()) {
      if (now < i->second)
        continue;
      d->dead.erase(i);
    }
    out.push_back(rec.subkey);
  }
  return out;
}

/// Collects a get's answer: names and handles in DHT order, delivered when every resolve ended.
struct gather {
  caf::response_promise rp;
  std::vector<std::string> names;
  std::vector<caf::actor> handles;
  size_t pending = 0;
  void finish() {
    if (pending == 0)
      rp.deliver(std::move(names), std::move(handles));
  }
};

} // namespace

std::string stage_key(const std::string& prefix, size_t stage) {
  return fmt::format("{}/stage{}", prefix, stage);
}

caf::behavior dht_board_actor(caf::event_based_actor* self, caf::actor dht, caf::actor resolver,
                              dht_board_options opts) {
  auto d = std::make_shared<board_data>();
  d->opts = std::move(opts);
  d->dht = std::move(dht);
  d->resolver = std::move(resolver);
  // Announcers die with the board.
  self->attach_functor([d] {
    for (auto& kv : d->announcers)
      caf::anon_send_exit(kv.second, caf::exit_reason::user_shutdown);
  });
  auto forget_for = [=] { return dht::dht_now_ns(self) + 2 * ns(d->opts.announce_period); };
  self->set_down_handler([=](const caf::down_msg& dm) {
    if (auto i = d->local.find(dm.source); i != d->local.end()) {
      auto addr = i->second;
      d->local.erase(i);
      if (auto a = d->announcers.find(addr); a != d->announcers.end()) {
        self->send_exit(a->second, caf::exit_reason::user_shutdown);
        d->announcers.erase(a);
      }
      d->cache.erase(addr);
      d->dead[addr] = forget_for();
    }
    if (auto i = d->watched.find(dm.source); i != d->watched.end()) {
      d->cache.erase(i->second);
      d->dead[i->second] = forget_for();
      d->watched.erase(i);
    }
  });
  return {
    [=](put_atom, uint64_t stage, const std::string& name,
        const caf::actor& peer) -> caf::result<void> {
      if (stage >= d->opts.stages)
        return caf::make_error(caf::sec::invalid_argument,
                               fmt::format("no stage {} (the pipeline has {})", stage,
                                           d->opts.stages));
      if (name.empty() || name.find('/') != std::string::npos || !peer)
        return caf::make_error(caf::sec::invalid_argument,
                               "a stage peer needs a handle and a name without '/'");
      auto addr = d->opts.endpoint + "/" + name;
      if (d->announcers.count(addr))
        return caf::make_error(caf::sec::invalid_argument, "already announced: " + addr);
      self->monitor(peer);
      d->local[peer.address()] = addr;
      d->cache[addr] = peer;
      d->dead.erase(addr);
      auto put = dht::make_subkey_put(stage_key(d->opts.prefix, stage), addr,
                                      std::vector<char>(name.begin(), name.end()), 0);
      d->announcers[addr] = self->spawn(dht::dht_announcer, d->dht, std::move(put),
                                        d->opts.announce_period);
      return caf::unit;
    },
    [=](get_atom, uint64_t stage) -> caf::response_promise {
      auto g = std::make_shared<gather>();
      g->rp = self->make_response_promise();
      if (stage >= d->opts.stages) {
        g->rp.deliver(caf::make_error(caf::sec::invalid_argument,
                                      fmt::format("no stage {} (the pipeline has {})", stage,
                                                  d->opts.stages)));
        return g->rp;
      }
      dht::dht_get(
        self, d->dht, stage_key(d->opts.prefix, stage), d->opts.timeout,
        [=](const dht_get_result& r) {
          auto addrs = live_addresses(d, r, dht::dht_now_ns(self));
          g->pending = addrs.size();
          for (auto& addr : addrs) {
            if (auto i = d->cache.find(addr); i != d->cache.end()) {
              g->names.push_back(addr);
              g->handles.push_back(i->second);
              g->pending--;
              continue;
            }
            self->request(d->resolver, d->opts.timeout, resolve_atom::value, addr)
              .then(
                [=](const caf::actor& a) {
                  if (a && !d->dead.count(addr)) {
                    if (!d->cache.count(addr)) {
                      d->cache[addr] = a;
                      d->watched[a.address()] = addr;
                      self->monitor(a);
                    }
                    g->names.push_back(addr);
                    g->handles.push_back(a);
                  }
                  g->pending--;
                  g->finish();
                },
                [=](caf::error&) {
                  // Unreachable now: skip it until one period passed.
                  d->dead[addr] = dht::dht_now_ns(self) + ns(d->opts.announce_period);
                  g->pending--;
                  g->finish();
                });
          }
          g->finish();
        },
        [=](caf::error&) {
          g->finish(); // nothing found in time: no peers (the caller retries later)
        });
      return g->rp;
    },
    [=](list_atom) -> caf::response_promise {
      auto rp = self->make_response_promise();
      auto counts = std::make_shared<std::vector<uint64_t>>(d->opts.stages, 0);
      auto pending = std::make_shared<size_t>(d->opts.stages);
      for (size_t s = 0; s < d->opts.stages; ++s) {
        auto done = [=]() mutable {
          if (--*pending == 0)
            rp.deliver(*counts);
        };
        dht::dht_get(
          self, d->dht, stage_key(d->opts.prefix, s), d->opts.timeout,
          [=](const dht_get_result& r) mutable {
            (*counts)[s] = live_addresses(d, r, dht::dht_now_ns(self)).size();
            done();
          },
          [=](caf::error&) mutable { done(); });
      }
      return rp;
    },
  };
}

caf::actor spawn_dht_board(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                           dht_board_options opts) {
  return sys.spawn(dht_board_actor, std::move(dht), std::move(resolver), std::move(opts));
}

} // namespace starling::actors::stage
