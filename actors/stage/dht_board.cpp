#include "actors/stage/dht_board.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <memory>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/dht/client.hpp"
#include "actors/stage/load_view.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "messages/rebalance_atoms.hpp"

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
  /// Rebalancing: ids of this board's joining records not yet matched by an announcement, per
  /// stage (oldest first), with their expiration; and a counter for unique sub-keys.
  std::map<uint64_t, std::vector<std::pair<std::string, int64_t>>> joiners;
  uint64_t next_id = 0;
  /// Continuations waiting for a `(tick_atom, ticket)` (claims settling).
  std::map<uint64_t, std::function<void()>> later;
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

std::string sub_key(const std::string& prefix, size_t stage, const char* what) {
  return fmt::format("{}/stage{}/{}", prefix, stage, what);
}

/// Unexpired values by sub-key of a dictionary record.
std::map<std::string, std::string> values_of(const dht_get_result& r, int64_t now) {
  std::map<std::string, std::string> out;
  for (auto& rec : r.records)
    if (rec.has_subkey && rec.expiration_ns > now)
      out[rec.subkey] = std::string(rec.value.begin(), rec.value.end());
  return out;
}

/// Reads every stage's peers, reports and joiners (3 reads per stage, at once) and calls
/// `done(loads, report by address)`; a read that fails counts as an empty record.
template <class Done>
void read_loads(caf::event_based_actor* self, const data_ptr& d, Done done) {
  auto stages = d->opts.stages;
  struct acc {
    std::vector<std::vector<std::string>> live;
    std::vector<std::map<std::string, std::string>> reports, joining;
    size_t pending = 0;
  };
  auto on_done = std::make_shared<Done>(std::move(done));
  auto a = std::make_shared<acc>();
  a->live.resize(stages);
  a->reports.resize(stages);
  a->joining.resize(stages);
  a->pending = 3 * stages;
  auto finish = [=] {
    if (--a->pending > 0)
      return;
    std::vector<stage_load> loads(stages);
    std::map<std::string, double> by_addr;
    for (size_t k = 0; k < stages; ++k) {
      loads[k].live = static_cast<int64_t>(a->live[k].size());
      for (auto& addr : a->live[k]) {
        auto i = a->reports[k].find(addr);
        if (i == a->reports[k].end())
          continue;
        if (auto tp = decode_load_report(i->second)) {
          loads[k].reported.push_back(*tp);
          by_addr[addr] = *tp;
        }
      }
      for (auto& [id, v] : a->joining[k]) {
        if (v == "done")
          continue;
        char* end = nullptr;
        auto tp = std::strtod(v.c_str(), &end);
        if (!v.empty() && end && *end == '\0' && std::isfinite(tp))
          loads[k].joining.push_back(tp);
      }
    }
    (*on_done)(std::move(loads), std::move(by_addr));
  };
  if (stages == 0) {
    a->pending = 1;
    finish();
    return;
  }
  // Reads `key` and hands the answer to `take`; a failed read leaves the slot empty.
  auto read = [=](std::string key, std::function<void(const dht_get_result&)> take) {
    dht::dht_get(
        self, d->dht, std::move(key), d->opts.timeout,
        [=](const dht_get_result& r) {
          take(r);
          finish();
        },
        [=](caf::error&) { finish(); });
  };
  for (size_t k = 0; k < stages; ++k) {
    read(stage_key(d->opts.prefix, k), [=](const dht_get_result& r) {
      a->live[k] = live_addresses(d, r, dht::dht_now_ns(self));
    });
    read(sub_key(d->opts.prefix, k, "load"),
         [=](const dht_get_result& r) { a->reports[k] = values_of(r, dht::dht_now_ns(self)); });
    read(sub_key(d->opts.prefix, k, "joining"),
         [=](const dht_get_result& r) { a->joining[k] = values_of(r, dht::dht_now_ns(self)); });
  }
}

std::vector<char> bytes_of(const std::string& s) {
  return {s.begin(), s.end()};
}

/// Stores a joining record of this board in `stage` for `hold`.
void put_joiner(caf::event_based_actor* self, const data_ptr& d, uint64_t stage, double throughput,
                caf::timespan hold) {
  auto id = fmt::format("{}/j{}", d->opts.endpoint, d->next_id++);
  auto expires = dht::expires_in(self, hold);
  d->joiners[stage].emplace_back(id, expires);
  dht::dht_store(
      self, d->dht,
      dht::make_subkey_put(sub_key(d->opts.prefix, stage, "joining"), id,
                           bytes_of(fmt::format("{:.17g}", throughput)), expires),
      d->opts.timeout, [](const messages::dht_put_result&) {}, [](caf::error&) {});
}

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
          return caf::make_error(
              caf::sec::invalid_argument,
              fmt::format("no stage {} (the pipeline has {})", stage, d->opts.stages));
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
        d->announcers[addr] =
            self->spawn(dht::dht_announcer, d->dht, std::move(put), d->opts.announce_period);
        // The joiner announced itself (the oldest one of this board there, as far as we know).
        auto& js = d->joiners[stage];
        auto now = dht::dht_now_ns(self);
        js.erase(std::remove_if(js.begin(), js.end(), [&](auto& j) { return j.second <= now; }),
                 js.end());
        if (!js.empty()) {
          auto [id, expires] = js.front();
          js.erase(js.begin());
          dht::dht_store(
              self, d->dht,
              dht::make_subkey_put(sub_key(d->opts.prefix, stage, "joining"), id, bytes_of("done"),
                                   expires + 1),
              d->opts.timeout, [](const messages::dht_put_result&) {}, [](caf::error&) {});
        }
        return caf::unit;
      },
      [=](get_atom, uint64_t stage) -> caf::response_promise {
        auto g = std::make_shared<gather>();
        g->rp = self->make_response_promise();
        if (stage >= d->opts.stages) {
          g->rp.deliver(caf::make_error(
              caf::sec::invalid_argument,
              fmt::format("no stage {} (the pipeline has {})", stage, d->opts.stages)));
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
      // -- rebalancing (board.hpp) ---------------------------------------------------------------
      [=](load_atom, uint64_t stage, const std::string& name, double throughput, double queue) {
        if (stage >= d->opts.stages || name.empty() || name.find('/') != std::string::npos ||
            !decode_load_report(encode_load_report(throughput, queue)))
          return;
        auto addr = d->opts.endpoint + "/" + name;
        dht::dht_store(
            self, d->dht,
            dht::make_subkey_put(sub_key(d->opts.prefix, stage, "load"), addr,
                                 bytes_of(encode_load_report(throughput, queue)),
                                 dht::expires_in(self, d->opts.load_ttl)),
            d->opts.timeout, [](const messages::dht_put_result&) {}, [](caf::error&) {});
      },
      [=](get_atom, load_atom, const caf::actor& peer) -> caf::response_promise {
        auto rp = self->make_response_promise();
        std::string mine_addr;
        if (peer)
          if (auto i = d->local.find(peer.address()); i != d->local.end())
            mine_addr = i->second;
        read_loads(
            self, d,
            [=](std::vector<stage_load> loads, std::map<std::string, double> by_addr) mutable {
              std::vector<double> throughput;
              std::vector<int64_t> peers;
              for (auto& l : loads) {
                auto t = total_of(l);
                throughput.push_back(t.throughput);
                peers.push_back(t.peers);
              }
              double mine = -1;
              if (auto i = by_addr.find(mine_addr); !mine_addr.empty() && i != by_addr.end())
                mine = i->second;
              rp.deliver(std::move(throughput), std::move(peers), mine);
            });
        return rp;
      },
      [=](put_atom, load_atom, caf::timespan hold) {
        return self->delegate(caf::actor_cast<caf::actor>(self), put_atom::value,
                              load_atom::value, hold, false);
      },
      [=](put_atom, load_atom, caf::timespan hold, bool all_known) -> caf::response_promise {
        auto rp = self->make_response_promise();
        read_loads(
            self, d, [=](std::vector<stage_load> loads, std::map<std::string, double>) mutable {
              auto best = stage_for_newcomer(loads, all_known);
              if (!best) {
                rp.deliver(std::numeric_limits<uint64_t>::max()); // nothing known: keep your stage
                return;
              }
              auto& l = loads[*best];
              double sum = 0;
              for (auto x : l.reported)
                sum += x;
              put_joiner(self, d, *best, l.reported.empty() ? 0 : sum / l.reported.size(), hold);
              rp.deliver(static_cast<uint64_t>(*best));
            });
        return rp;
      },
      [=](put_atom, load_atom, uint64_t stage, double throughput, caf::timespan hold) {
        if (stage >= d->opts.stages || !std::isfinite(throughput) || hold <= caf::timespan{0})
          return;
        put_joiner(self, d, stage, throughput, hold);
      },
      [=](migrate_atom, uint64_t from, caf::timespan period) {
        return self->delegate(caf::actor_cast<caf::actor>(self), migrate_atom::value, from,
                              period, uint64_t{1});
      },
      [=](migrate_atom, uint64_t from, caf::timespan period,
          uint64_t slots) -> caf::response_promise {
        auto rp = self->make_response_promise();
        if (from >= d->opts.stages || period <= caf::timespan{0} || slots == 0) {
          rp.deliver(false);
          return rp;
        }
        auto id = fmt::format("{}/m{}", d->opts.endpoint, d->next_id++);
        auto expires = dht::expires_in(self, period);
        auto key = sub_key(d->opts.prefix, from, "migration");
        dht::dht_store(
            self, d->dht, dht::make_subkey_put(key, id, bytes_of("claim"), expires),
            d->opts.timeout,
            [=](const messages::dht_put_result& r) mutable {
              if (r.accepted == 0) {
                rp.deliver(false);
                return;
              }
              auto ticket = d->next_id++;
              d->later[ticket] = [=]() mutable {
                dht::dht_get(
                    self, d->dht, key, d->opts.timeout,
                    [=](const dht_get_result& g) mutable {
                      auto now = dht::dht_now_ns(self);
                      // Granted when among the `slots` earliest unexpired claims.
                      std::pair<int64_t, std::string> mine{expires, id};
                      bool seen = false;
                      uint64_t ahead = 0;
                      for (auto& rec : g.records) {
                        if (!rec.has_subkey || rec.expiration_ns <= now)
                          continue;
                        seen = seen || rec.subkey == id;
                        if (std::pair{rec.expiration_ns, rec.subkey} < mine)
                          ++ahead;
                      }
                      rp.deliver(seen && ahead < slots);
                    },
                    [=](caf::error&) mutable { rp.deliver(false); });
              };
              self->delayed_send(self, d->opts.claim_settle, tick_atom::value, ticket);
            },
            [=](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
      [=](tick_atom, uint64_t ticket) {
        auto i = d->later.find(ticket);
        if (i == d->later.end())
          return;
        auto f = std::move(i->second);
        d->later.erase(i);
        f();
      },
  };
}

caf::actor spawn_dht_board(caf::actor_system& sys, caf::actor dht, caf::actor resolver,
                           dht_board_options opts) {
  return sys.spawn(dht_board_actor, std::move(dht), std::move(resolver), std::move(opts));
}

} // namespace starling::actors::stage
