#include "actors/btard/board_actor.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <fmt/format.h>

#include "actors/auth/ban_service.hpp"
#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::btard {

namespace {

using board_clock = std::chrono::steady_clock;

/// Board reads a wait needs before its deadline can pass.
constexpr uint64_t board_min_polls = 5;

struct board_state {
  explicit board_state(board_peer_options opts) : o(std::move(opts)) {}
  board_peer_options o;
  std::unique_ptr<peer_core> core;
  std::vector<std::string> members;
  bool busy = false;
  bool finished = false;
  uint64_t steps_done = 0;
  board_clock::time_point started = board_clock::now();
  // Where the core's current wait began.
  std::tuple<uint64_t, uint32_t, int> waiting{~uint64_t{0}, 0, -1};
  board_clock::time_point wait_since = board_clock::now();
  /// Polls of the board completed since the wait began.
  uint64_t polls_in_wait = 0;
  uint64_t failed_puts = 0;
  uint64_t ticks = 0;
  /// Statement sub-keys of the current step already verified and offered: a poll returns every
  /// statement of the step, and checking each signature again on every poll cost more than the
  /// whole protocol (16 peers on 2 cores). A sub-key counts only when the value under it is a
  /// valid statement whose digest it names, so junk stored under an honest sub-key is read
  /// again and does not hide the honest value.
  uint64_t seen_step = ~uint64_t{0};
  std::set<std::string> seen;
  const caf::actor& reader() const { return o.reader ? o.reader : o.dht; }
  /// Bans already handed to the node.
  std::set<std::string> enforced;
  bool colluders_known = false;
};

} // namespace

std::string data_key(const std::string& prefix, const data_ref& ref) {
  return fmt::format("{}/d{}.{}.{}.{}", prefix, ref.step, ref.attempt,
                     static_cast<unsigned>(ref.kind), ref.part);
}

std::string data_subkey(const data_ref& ref, size_t chunk, size_t chunks) {
  return fmt::format("{}.{}.{}.{}", auth::to_hex(ref.sender), digest_hex(ref.committed), chunk,
                     chunks);
}

namespace {

caf::behavior board_peer(caf::event_based_actor* self, board_peer_options opts) {
  auto st = std::make_shared<board_state>(std::move(opts));
  auto expires = [self, st] {
    return dht::expires_in(self, std::chrono::duration_cast<caf::timespan>(st->o.record_lifetime));
  };
  // A put is retried until a replica takes it (5 tries, 500 ms apart): a record the others
  // never see makes this peer silent.
  auto put = [self](messages::dht_put p) { self->send(self, put_atom::value, std::move(p), 0); };
  auto finish = [self, st](const std::string& error) {
    if (st->finished)
      return;
    st->finished = true;
    if (st->o.on_finish)
      st->o.on_finish(error);
    self->quit();
  };
  auto flush = [st, put, expires] {
    for (auto& s : st->core->take_statements()) {
      auto bytes = encode(s);
      put(dht::make_subkey_put(fmt::format("{}/s{}", st->o.prefix, s.body.step),
                               digest_hex(statement_digest(s)),
                               std::vector<char>(bytes.begin(), bytes.end()), expires()));
    }
    for (auto& [ref, values] : st->core->take_data()) {
      size_t chunks = std::max<size_t>(1, (values.size() + board_chunk_floats - 1) /
                                              board_chunk_floats);
      for (size_t c = 0; c < chunks; ++c) {
        size_t begin = c * board_chunk_floats;
        size_t end = std::min(values.size(), begin + board_chunk_floats);
        std::vector<char> bytes((end - begin) * sizeof(float));
        if (!bytes.empty())
          std::memcpy(bytes.data(), values.data() + begin, bytes.size());
        put(dht::make_subkey_put(data_key(st->o.prefix, ref), data_subkey(ref, c, chunks),
                                 std::move(bytes), expires()));
      }
    }
  };
  // Hands this peer's new bans to the node's gate and DHT (their own checks refuse a message
  // from another node, so only the node's actors can).
  auto enforce = [self, st] {
    if (!st->o.enforce_bans || !st->core)
      return;
    for (auto& [key, why] : st->core->bans()) {
      if (key == st->core->key() || !st->enforced.insert(key).second)
        continue; // its own key: a peer does not refuse itself
      auto reason = why.substr(0, auth::verified_ban_reason_bytes);
      std::replace(reason.begin(), reason.end(), '\n', ' ');
      if (st->o.directory)
        self->request(st->o.directory, std::chrono::seconds(5), get_atom::value,
                      std::string("gate"))
          .then(
            [self, st, key, reason](caf::actor gate) {
              if (!gate)
                return;
              self->request(gate, std::chrono::seconds(5), auth::verified_ban_atom::value, key,
                            reason)
                .then(
                  [st, key](uint64_t removed) {
                    if (st->o.on_enforced)
                      st->o.on_enforced(key, removed);
                  },
                  [](caf::error&) {});
            },
            [](caf::error&) {});
      self->request(st->o.dht, std::chrono::seconds(5), dht::ban_atom::value, key)
        .then([](uint64_t) {}, [](caf::error&) {});
    }
  };
  auto note_wait = [st] {
    std::tuple<uint64_t, uint32_t, int> now{st->core->step(), st->core->attempt(),
                                            static_cast<int>(st->core->phase())};
    if (now != st->waiting) {
      st->waiting = now;
      st->wait_since = board_clock::now();
      st->polls_in_wait = 0;
    }
  };
  // Starts the next step, or ends the run.
  auto next_step = [st, flush, finish, note_wait]() {
    while (!st->finished) {
      if (st->steps_done >= st->o.steps || st->core->phase() == peer_phase::banned) {
        finish("");
        return;
      }
      if (auto s = st->core->begin_step(); !s) {
        finish(s.what());
        return;
      }
      flush();
      note_wait();
      if (st->core->phase() != peer_phase::idle && st->core->phase() != peer_phase::banned)
        return;
      // Out of the group without a ban: it was found silent, or in its view too few peers
      // are left. Coming back needs a state download into the running group, which is not
      // offered across processes yet.
      auto rec = st->core->take_record();
      if (st->o.on_left)
        st->o.on_left(fmt::format(
            "left the group at step {}: {}; rejoining a running group across processes is not "
            "supported yet",
            rec.step,
            st->core->cooling_down()
                ? "the others found this peer silent"
                : "in this peer's view fewer than two peers are left (it found the others "
                  "silent or banned)"));
      finish("");
      return;
    }
  };
  // After a poll: advance when the wait is over or its deadline passed.
  auto evaluate = [st, flush, finish, note_wait, next_step, enforce] {
    if (st->finished)
      return;
    // The deadline passes once its time is up and the board was read a few times since: a
    // peer whose own thread or DHT reads were slow (a dead node stalls lookups for an RPC
    // timeout until it is evicted) does not call the others silent before it has looked.
    ++st->polls_in_wait;
    auto late = board_clock::now() - st->wait_since >= st->o.phase_deadline &&
                st->polls_in_wait >= board_min_polls;
    if (!st->core->ready() && !late)
      return;
    auto ended = st->core->advance();
    if (!ended) {
      finish(ended.error().what);
      return;
    }
    flush();
    note_wait();
    if (!*ended)
      return;
    auto rec = st->core->take_record();
    ++st->steps_done;
    if (st->o.on_step)
      st->o.on_step(rec, *st->core);
    enforce();
    next_step();
  };
  auto poll_members = [self, st, finish, next_step] {
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  st->o.prefix + "/members")
      .then(
        [self, st, finish, next_step](const messages::dht_get_result& r) {
          st->busy = false;
          std::set<std::string> keys;
          for (auto& rec : r.records) {
            auto k = auth::from_hex(rec.subkey);
            if (rec.has_subkey && k && k->size() == 32 &&
                std::string(rec.value.begin(), rec.value.end()) == *k)
              keys.insert(*k);
          }
          if (keys.size() > st->o.peers) {
            finish(fmt::format("{} peers announced themselves for a run of {}", keys.size(),
                               st->o.peers));
            return;
          }
          if (keys.size() < st->o.peers) {
            if (board_clock::now() - st->started >= st->o.join_deadline)
              finish(fmt::format("only {} of {} peers announced themselves within {} s",
                                 keys.size(), st->o.peers,
                                 std::chrono::duration_cast<std::chrono::seconds>(
                                     st->o.join_deadline)
                                     .count()));
            return;
          }
          st->members.assign(keys.begin(), keys.end());
          if (st->o.colluders > 0) {
            st->busy = true;
            self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                          st->o.prefix + "/colluders")
              .then(
                [st, finish, next_step](const messages::dht_get_result& c) {
                  st->busy = false;
                  std::set<std::string> found;
                  for (auto& rec : c.records) {
                    auto k = auth::from_hex(rec.subkey);
                    if (rec.has_subkey && k && k->size() == 32 &&
                        std::binary_search(st->members.begin(), st->members.end(), *k))
                      found.insert(*k);
                  }
                  if (found.size() < st->o.colluders) {
                    if (board_clock::now() - st->started >= st->o.join_deadline)
                      finish(fmt::format("only {} of {} colluders announced themselves",
                                         found.size(), st->o.colluders));
                    return;
                  }
                  st->o.core.colluders = found;
                  st->colluders_known = true;
                },
                [st](caf::error&) { st->busy = false; });
            if (!st->colluders_known)
              return;
          }
          auto core_o = st->o.core;
          if (st->o.calibrate) {
            auto tau = st->o.calibrate(st->members);
            if (!tau) {
              finish(tau.error().what);
              return;
            }
            if (*tau)
              core_o.group.tau = **tau;
          }
          auto made = peer_core::make(core_o, st->o.model, *st->o.key, st->members);
          if (!made) {
            finish(made.error().what);
            return;
          }
          st->core = std::move(*made);
          next_step();
        },
        [st](caf::error&) { st->busy = false; });
  };
  auto poll_board = [self, st, evaluate] {
    auto step = st->core->step();
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  fmt::format("{}/s{}", st->o.prefix, step))
      .then(
        [self, st, evaluate, step](const messages::dht_get_result& r) {
          if (st->finished || st->core->step() != step) {
            st->busy = false;
            return;
          }
          if (st->seen_step != step) {
            st->seen_step = step;
            st->seen.clear();
          }
          for (auto& rec : r.records) {
            if (!rec.has_subkey || st->seen.count(rec.subkey))
              continue;
            auto s = decode(std::string_view(rec.value.data(), rec.value.size()));
            if (!s)
              continue;
            st->core->offer(*s);
            if (digest_hex(statement_digest(*s)) == rec.subkey)
              st->seen.insert(rec.subkey);
          }
          if (st->core->behind()) {
            if (st->o.on_left)
              st->o.on_left(fmt::format(
                  "left the group at step {}: most peers went on to a later aggregation "
                  "without this peer's view of who was silent; rejoining a running group "
                  "across processes is not supported yet",
                  step));
            st->busy = false;
            self->send(self, stop_atom::value);
            return;
          }
          // The data the core waits for, one DHT key at a time.
          std::map<std::string, std::vector<data_ref>> by_key;
          for (auto& ref : st->core->wanted())
            by_key[data_key(st->o.prefix, ref)].push_back(ref);
          if (by_key.empty()) {
            st->busy = false;
            evaluate();
            return;
          }
          auto pending = std::make_shared<size_t>(by_key.size());
          for (auto& [key, refs] : by_key) {
            auto done = [st, pending, evaluate] {
              if (--*pending == 0) {
                st->busy = false;
                evaluate();
              }
            };
            self->request(st->reader(), std::chrono::seconds(10), get_atom::value, key)
              .then(
                [st, refs = refs, done](const messages::dht_get_result& got) {
                  if (!st->finished)
                    for (auto& ref : refs) {
                      auto head = data_subkey(ref, 0, 0);
                      head = head.substr(0, head.size() - 3); // "<sender>.<digest>."
                      std::map<size_t, const std::vector<char>*> parts;
                      size_t chunks = 0;
                      for (auto& rec : got.records) {
                        if (!rec.has_subkey || rec.subkey.compare(0, head.size(), head) != 0)
                          continue;
                        unsigned long c = 0, n = 0;
                        if (std::sscanf(rec.subkey.c_str() + head.size(), "%lu.%lu", &c, &n) !=
                                2 ||
                            n == 0 || c >= n || n > 4096)
                          continue;
                        chunks = n;
                        parts[c] = &rec.value;
                      }
                      if (chunks == 0 || parts.size() != chunks)
                        continue;
                      std::vector<char> bytes;
                      for (auto& [c, v] : parts)
                        bytes.insert(bytes.end(), v->begin(), v->end());
                      if (bytes.size() % sizeof(float) != 0)
                        continue;
                      std::vector<float> values(bytes.size() / sizeof(float));
                      if (!bytes.empty())
                        std::memcpy(values.data(), bytes.data(), bytes.size());
                      st->core->offer(ref, values);
                    }
                  done();
                },
                [done](caf::error&) { done(); });
          }
        },
        [st](caf::error&) { st->busy = false; });
  };
  // Announce, then poll.
  auto announce = [st, put, expires] {
    auto pk = st->o.key->public_key();
    put(dht::make_subkey_put(st->o.prefix + "/members", auth::to_hex(pk),
                             std::vector<char>(pk.begin(), pk.end()), expires()));
    if (st->o.colluders > 0)
      put(dht::make_subkey_put(st->o.prefix + "/colluders", auth::to_hex(pk),
                               std::vector<char>(pk.begin(), pk.end()), expires()));
  };
  announce();
  self->send(self, tick_atom::value);
  return {
    [self, st](put_atom, messages::dht_put& p, int attempt) {
      self->request(st->o.dht, std::chrono::seconds(10), p)
        .then(
          [self, st, p, attempt](const messages::dht_put_result& r) {
            if (r.wire_error.empty() && r.accepted > 0)
              return;
            ++st->failed_puts;
            if (attempt < 4 && !st->finished)
              self->delayed_send(self, std::chrono::milliseconds(500), put_atom::value, p,
                                 attempt + 1);
          },
          [self, st, p, attempt](caf::error&) {
            ++st->failed_puts;
            if (attempt < 4 && !st->finished)
              self->delayed_send(self, std::chrono::milliseconds(500), put_atom::value, p,
                                 attempt + 1);
          });
    },
    [finish](stop_atom) { finish(""); },
    [self, st, poll_members, poll_board, announce](tick_atom) {
      if (st->finished)
        return;
      if (!st->busy) {
        st->busy = true;
        if (!st->core) {
          if (++st->ticks % 50 == 0)
            announce(); // again, for a node that joined the DHT after the first put
          poll_members();
        } else {
          poll_board();
        }
      }
      self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(st->o.poll),
                         tick_atom::value);
    },
  };
}

struct reader_entry {
  board_clock::time_point fetched{};
  bool valid = false;
  bool in_flight = false;
  messages::dht_get_result result;
  std::vector<caf::response_promise> waiting;
};

caf::behavior board_reader(caf::event_based_actor* self, caf::actor dht,
                           std::chrono::milliseconds fresh) {
  auto entries = std::make_shared<std::map<std::string, reader_entry>>();
  return {
    [self, dht, fresh, entries](get_atom, const std::string& key) -> caf::response_promise {
      auto now = board_clock::now();
      // Forget keys nobody asked for in a minute (old steps).
      if (entries->size() > 256)
        for (auto it = entries->begin(); it != entries->end();)
          it = (!it->second.in_flight && now - it->second.fetched > std::chrono::minutes(1))
                   ? entries->erase(it)
                   : std::next(it);
      auto& e = (*entries)[key];
      auto rp = self->make_response_promise();
      if (e.valid && !e.in_flight && now - e.fetched < fresh) {
        rp.deliver(e.result);
        return rp;
      }
      e.waiting.push_back(rp);
      if (!e.in_flight) {
        e.in_flight = true;
        self->request(dht, std::chrono::seconds(10), get_atom::value, key)
          .then(
            [entries, key](messages::dht_get_result& r) {
              auto& x = (*entries)[key];
              x.in_flight = false;
              x.valid = true;
              x.fetched = board_clock::now();
              x.result = r;
              for (auto& w : x.waiting)
                w.deliver(r);
              x.waiting.clear();
            },
            [entries, key](caf::error& err) {
              auto& x = (*entries)[key];
              x.in_flight = false;
              for (auto& w : x.waiting)
                w.deliver(err);
              x.waiting.clear();
            });
      }
      return rp;
    },
  };
}

} // namespace

caf::actor spawn_board_reader(caf::actor_system& sys, caf::actor dht,
                              std::chrono::milliseconds fresh) {
  return sys.spawn(board_reader, std::move(dht), fresh);
}

caf::actor spawn_board_peer(caf::actor_system& sys, board_peer_options o) {
  if (!o.key || !o.dht || !o.model)
    return {};
  return sys.spawn<caf::detached>(board_peer, std::move(o));
}

} // namespace starling::actors::btard
