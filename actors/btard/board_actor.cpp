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
  /// Polls of the board completed since the wait began, and deadline extensions in it.
  uint64_t polls_in_wait = 0;
  uint64_t extensions = 0;
  /// Since when (and in which step and aggregation) most of the group has been in a later
  /// aggregation than this peer.
  std::pair<uint64_t, uint32_t> behind_at{~uint64_t{0}, 0};
  board_clock::time_point behind_since = board_clock::now();
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
  // -- a member's side of a peer coming back --------------------------------------------------
  /// The step running (its state is exported when a peer asks), and whom it expected.
  uint64_t boundary_step = ~uint64_t{0};
  std::vector<std::string> boundary_expected;
  /// Those that took the step before (a peer among them is back: no more offers to it).
  std::vector<std::string> boundary_active;
  /// Whether this step's first wait was extended for members coming back (at most once).
  bool returning_grace = false;
  /// Offers made per (peer, first step asked): at most three boundaries each.
  std::map<std::pair<std::string, uint64_t>, int> offered;
  // -- this peer coming back --------------------------------------------------------------------
  /// Whether `P/at` was read at the start (has the group started without this peer?), and the
  /// highest step a member announced there.
  bool at_known = false;
  uint64_t group_at = 0;
  bool rejoining = false;
  uint64_t rejoin_from = 0;
  uint64_t rejoins = 0;
  board_clock::time_point rejoin_since = board_clock::now();
  /// The offers seen for the latest step offered: their signature count, and since when.
  uint64_t offer_step = ~uint64_t{0};
  size_t offer_signers = 0;
  board_clock::time_point offer_changed = board_clock::now();
};

/// How long the signatures offered for a state must stay unchanged before a peer coming back
/// picks the state most of them sign.
constexpr auto offer_settle = std::chrono::seconds(1);
/// Bytes per chunk of a state on the DHT.
constexpr size_t state_chunk_bytes = board_chunk_floats * sizeof(float);
/// Members that store an offered state's bytes.
constexpr size_t state_donors = 3;

bool parse_decimal(const std::vector<char>& v, uint64_t& out) {
  if (v.empty() || v.size() > 19)
    return false;
  out = 0;
  for (char c : v) {
    if (c < '0' || c > '9')
      return false;
    out = out * 10 + static_cast<uint64_t>(c - '0');
  }
  return true;
}

std::vector<char> decimal(uint64_t v) {
  auto s = std::to_string(v);
  return {s.begin(), s.end()};
}

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
      st->extensions = 0;
    }
  };
  // This peer is out of the running group without a ban (found silent, behind the others, or
  // started after them): it asks for the state from step `from` on (see the header).
  auto start_rejoin = [st, put, expires, finish](const std::string& why, uint64_t from) {
    if (st->rejoins >= st->o.max_rejoins) {
      if (st->o.on_left)
        st->o.on_left(fmt::format("{}; it came back {} times already, and leaves", why,
                                  st->rejoins));
      finish("");
      return;
    }
    ++st->rejoins;
    st->rejoining = true;
    st->rejoin_from = from;
    st->rejoin_since = board_clock::now();
    st->offer_step = ~uint64_t{0};
    st->offer_signers = 0;
    put(dht::make_subkey_put(st->o.prefix + "/rejoin", auth::to_hex(st->o.key->public_key()),
                             decimal(from), expires()));
    if (st->o.on_rejoin)
      st->o.on_rejoin(fmt::format("{}: asking the group for its state (from step {} on)", why,
                                  from),
                      0);
  };
  // A member's side: offers its state at the start of the step running to every peer that
  // asked to come back and that the membership rules expect in this step.
  auto offer_state = [st, put, expires](const std::string& peer) {
    auto pk = st->o.key->public_key();
    auto x = st->boundary_step;
    // Exported only when asked (the parameters and momentum are copied), and only while the
    // step runs: its state is still the one it began with.
    if (st->core->step() != x || st->core->phase() == peer_phase::idle)
      return;
    auto b = st->core->export_state();
    auto d = state_digest_of(b);
    statement body{statement_kind::state_digest, st->o.core.group.run_id, x, pk, peer,
                   digest_payload(d)};
    auto signed_st = sign_statement(std::move(body), *st->o.key);
    if (!signed_st)
      return;
    auto bytes = encode(*signed_st);
    put(dht::make_subkey_put(fmt::format("{}/statesig.{}", st->o.prefix, auth::to_hex(peer)),
                             fmt::format("{}.{}", x, auth::to_hex(pk)),
                             std::vector<char>(bytes.begin(), bytes.end()), expires()));
    // Three members store the bytes, in an order drawn from the peer and the step.
    std::vector<std::pair<digest, std::string>> order;
    for (auto& k : st->boundary_expected)
      if (k != peer)
        order.emplace_back(hash_bytes(peer + k + std::to_string(x)), k);
    std::sort(order.begin(), order.end());
    bool donor = false;
    for (size_t i = 0; i < order.size() && i < state_donors; ++i)
      donor = donor || order[i].second == pk;
    if (!donor)
      return;
    size_t chunks = std::max<size_t>(1, (b.size() + state_chunk_bytes - 1) / state_chunk_bytes);
    for (size_t c = 0; c < chunks; ++c) {
      size_t begin = c * state_chunk_bytes;
      size_t end = std::min(b.size(), begin + state_chunk_bytes);
      put(dht::make_subkey_put(
          fmt::format("{}/state{}", st->o.prefix, x),
          fmt::format("{}.{}.{}.{}", auth::to_hex(pk), digest_hex(d), c, chunks),
          std::vector<char>(b.begin() + static_cast<std::ptrdiff_t>(begin),
                            b.begin() + static_cast<std::ptrdiff_t>(end)),
          expires()));
    }
  };
  auto check_requests = [self, st, offer_state] {
    auto step = st->boundary_step;
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  st->o.prefix + "/rejoin")
      .then(
        [st, offer_state, step](const messages::dht_get_result& r) {
          if (st->finished || st->rejoining || st->boundary_step != step)
            return;
          auto pk = st->o.key->public_key();
          for (auto& rec : r.records) {
            auto k = auth::from_hex(rec.subkey);
            uint64_t from = 0;
            if (!rec.has_subkey || !k || k->size() != 32 || *k == pk ||
                !parse_decimal(rec.value, from) || step < from ||
                !std::binary_search(st->boundary_expected.begin(), st->boundary_expected.end(),
                                    *k) ||
                std::binary_search(st->boundary_active.begin(), st->boundary_active.end(), *k))
              continue; // not expected back here, or back already
            auto& times = st->offered[{*k, from}];
            if (times >= 3 || st->core->step() != step)
              continue;
            ++times;
            offer_state(*k);
          }
        },
        [](caf::error&) {});
  };
  // Starts the next step, or ends the run.
  auto next_step = [st, flush, finish, note_wait, start_rejoin, check_requests]() {
    while (!st->finished) {
      if (st->steps_done >= st->o.steps || st->core->phase() == peer_phase::banned) {
        finish("");
        return;
      }
      st->boundary_step = st->core->step();
      st->boundary_expected = st->core->expected();
      st->boundary_active = st->core->active();
      st->returning_grace = false;
      if (auto s = st->core->begin_step(); !s) {
        finish(s.what());
        return;
      }
      flush();
      note_wait();
      if (st->core->phase() != peer_phase::idle && st->core->phase() != peer_phase::banned) {
        check_requests();
        return;
      }
      // Out of the group without a ban: it was found silent, or in its view too few peers
      // are left. It comes back through the state the group offers.
      auto rec = st->core->take_record();
      start_rejoin(fmt::format("out of the group at step {}: {}", rec.step,
                               st->core->cooling_down()
                                   ? "the others found this peer silent"
                                   : "in this peer's view fewer than two peers are left"),
                   rec.step + 1);
      return;
    }
  };
  // After a poll: advance when the wait is over or its deadline passed.
  auto evaluate = [st, flush, finish, note_wait, next_step, enforce, put, expires] {
    if (st->finished || st->rejoining)
      return;
    // The deadline passes once its time is up and the board was read a few times since: a
    // peer whose own thread or DHT reads were slow (a dead node stalls lookups for an RPC
    // timeout until it is evicted) does not call the others silent before it has looked.
    ++st->polls_in_wait;
    auto late = board_clock::now() - st->wait_since >= st->o.phase_deadline &&
                st->polls_in_wait >= board_min_polls;
    if (!st->core->ready() && !late)
      return;
    // Most of the group is past this wait: they read what this peer misses, which is late on
    // this peer's board rather than silent. Wait again instead of splitting from them.
    if (!st->core->ready() && st->core->majority_ahead() &&
        st->extensions < st->o.max_extensions) {
      ++st->extensions;
      st->wait_since = board_clock::now();
      st->polls_in_wait = 0;
      if (st->o.on_extended)
        st->o.on_extended(st->core->step(), st->extensions);
      return;
    }
    // A member coming back at this step (cooled down, expected by the membership rules) takes
    // the state offered at the step's start, then commits: the download comes first. When only
    // such members' commitments are missing, the first wait of the step runs one more deadline
    // (once per step). Every honest peer holds the same membership, so each waits alike; a
    // member that still does not come is silent as before.
    if (!st->core->ready() && !st->returning_grace && st->core->only_coming_back_missing()) {
      st->returning_grace = true;
      st->wait_since = board_clock::now();
      st->polls_in_wait = 0;
      if (st->o.on_returning_wait)
        st->o.on_returning_wait(st->core->step());
      return;
    }
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
    put(dht::make_subkey_put(st->o.prefix + "/at", auth::to_hex(st->o.key->public_key()),
                             decimal(st->core->step()), expires()));
    next_step();
  };
  auto poll_members = [self, st, finish, next_step, start_rejoin] {
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  st->o.prefix + "/members")
      .then(
        [self, st, finish, next_step, start_rejoin](const messages::dht_get_result& r) {
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
          // Has the group started without this peer (a restart, or a start slower than a
          // whole step)? Then it comes back through the state.
          if (!st->at_known) {
            st->busy = true;
            self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                          st->o.prefix + "/at")
              .then(
                [st](const messages::dht_get_result& a) {
                  st->busy = false;
                  auto pk = st->o.key->public_key();
                  for (auto& rec : a.records) {
                    auto k = auth::from_hex(rec.subkey);
                    uint64_t at = 0;
                    if (rec.has_subkey && k && *k != pk &&
                        std::binary_search(st->members.begin(), st->members.end(), *k) &&
                        parse_decimal(rec.value, at))
                      st->group_at = std::max(st->group_at, at);
                  }
                  st->at_known = true;
                },
                [st](caf::error&) { st->busy = false; });
            return;
          }
          if (st->group_at > 0) {
            start_rejoin(fmt::format("the group is already at step {}", st->group_at),
                         st->group_at);
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
  auto poll_board = [self, st, evaluate, start_rejoin] {
    auto step = st->core->step();
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  fmt::format("{}/s{}", st->o.prefix, step))
      .then(
        [self, st, evaluate, step, start_rejoin](const messages::dht_get_result& r) {
          if (st->finished || st->rejoining || st->core->step() != step) {
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
          // Most of the group is in a later aggregation. Usually they only reached their
          // deadline first (waits start at different times) and removed whom this peer is
          // about to remove at its own: it catches up then. Only when that does not happen
          // within a phase deadline do the views differ, and it comes back with the state.
          if (st->core->behind()) {
            std::pair<uint64_t, uint32_t> at{step, st->core->attempt()};
            if (st->behind_at != at) {
              st->behind_at = at;
              st->behind_since = board_clock::now();
            }
            if (board_clock::now() - st->behind_since >= st->o.phase_deadline) {
              st->busy = false;
              start_rejoin(fmt::format("behind the group at step {}: most peers went on to a "
                                       "later aggregation without this peer's view of who was "
                                       "silent",
                                       step),
                           step + 1);
              return;
            }
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
  // Coming back: reads the offers, takes the state most members sign (see the header).
  auto poll_rejoin = [self, st, finish, next_step, put, expires] {
    if (board_clock::now() - st->rejoin_since >= st->o.rejoin_deadline) {
      st->busy = false;
      if (st->o.on_left)
        st->o.on_left(fmt::format(
            "no state offered within {} s of asking to come back (the group ended, or this "
            "peer is banned in its view)",
            std::chrono::duration_cast<std::chrono::seconds>(st->o.rejoin_deadline).count()));
      finish("");
      return;
    }
    auto pk = st->o.key->public_key();
    if (++st->ticks % 50 == 0) // again, in case the first put was lost
      put(dht::make_subkey_put(st->o.prefix + "/rejoin", auth::to_hex(pk),
                               decimal(st->rejoin_from), expires()));
    self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                  fmt::format("{}/statesig.{}", st->o.prefix, auth::to_hex(pk)))
      .then(
        [self, st, next_step, pk](const messages::dht_get_result& r) {
          // step -> digest -> signers
          std::map<uint64_t, std::map<digest, std::set<std::string>>> offers;
          for (auto& rec : r.records) {
            auto s = decode(std::string_view(rec.value.data(), rec.value.size()));
            if (!s || s->body.kind != statement_kind::state_digest ||
                s->body.run_id != st->o.core.group.run_id || s->body.slot != pk ||
                s->body.signer == pk || s->body.step < st->rejoin_from ||
                !std::binary_search(st->members.begin(), st->members.end(), s->body.signer))
              continue;
            auto d = digest_of_string(s->body.payload);
            if (d)
              offers[s->body.step][*d].insert(s->body.signer);
          }
          if (offers.empty()) {
            st->busy = false;
            return;
          }
          auto& [x, by] = *offers.rbegin();
          size_t total = 0;
          for (auto& [d, who] : by)
            total += who.size();
          if (x != st->offer_step || total != st->offer_signers) {
            st->offer_step = x;
            st->offer_signers = total;
            st->offer_changed = board_clock::now();
          }
          if (board_clock::now() - st->offer_changed < offer_settle) {
            st->busy = false;
            return;
          }
          // The digest most members sign (a tie: wait for more).
          const digest* best = nullptr;
          size_t most = 0;
          bool tie = false;
          for (auto& [d, who] : by) {
            if (who.size() > most) {
              best = &d;
              most = who.size();
              tie = false;
            } else if (who.size() == most) {
              tie = true;
            }
          }
          if (!best || tie) {
            st->busy = false;
            return;
          }
          auto want = *best;
          auto signers = by.at(want);
          self->request(st->reader(), std::chrono::seconds(10), get_atom::value,
                        fmt::format("{}/state{}", st->o.prefix, x))
            .then(
              [st, next_step, x, want, signers](const messages::dht_get_result& got) {
                st->busy = false;
                if (st->finished || !st->rejoining)
                  return;
                // Chunks by sender, for the wanted digest only.
                auto tail = "." + digest_hex(want) + ".";
                std::map<std::string, std::map<size_t, const std::vector<char>*>> by_sender;
                std::map<std::string, size_t> counts;
                for (auto& rec : got.records) {
                  if (!rec.has_subkey)
                    continue;
                  auto at = rec.subkey.find(tail);
                  unsigned long c = 0, n = 0;
                  if (at == std::string::npos ||
                      std::sscanf(rec.subkey.c_str() + at + tail.size(), "%lu.%lu", &c, &n) !=
                          2 ||
                      n == 0 || c >= n || n > 65536)
                    continue;
                  auto sender = rec.subkey.substr(0, at);
                  counts[sender] = n;
                  by_sender[sender][c] = &rec.value;
                }
                for (auto& [sender, chunks] : by_sender) {
                  if (chunks.size() != counts[sender])
                    continue;
                  std::string bytes;
                  for (auto& [c, v] : chunks)
                    bytes.append(v->begin(), v->end());
                  if (state_digest_of(bytes) != want)
                    continue;
                  auto core = peer_core::resume(st->o.core, st->o.model, *st->o.key, st->members,
                                                bytes);
                  if (!core)
                    continue;
                  // The state must expect this peer back, and its signers must be more than
                  // half of the members it says took the last step (peers coming back after a
                  // cool-down, like this one, cannot sign).
                  auto expected = (*core)->expected();
                  auto active = (*core)->active();
                  auto pk = st->o.key->public_key();
                  if (!std::binary_search(expected.begin(), expected.end(), pk))
                    continue;
                  size_t others = active.size() - (std::binary_search(active.begin(),
                                                                      active.end(), pk)
                                                       ? 1
                                                       : 0),
                         signed_by = 0;
                  for (auto& k : signers)
                    signed_by += std::binary_search(active.begin(), active.end(), k) ? 1 : 0;
                  if (2 * signed_by <= others)
                    continue;
                  st->core = std::move(*core);
                  st->rejoining = false;
                  st->steps_done = x;
                  if (st->o.on_rejoin)
                    st->o.on_rejoin(fmt::format("took the group's state at step {} (its digest "
                                                "signed by {} of the {} members that took the "
                                                "step before)",
                                                x, signed_by, others),
                                    x);
                  next_step();
                  return;
                }
              },
              [st](caf::error&) { st->busy = false; });
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
    [self, st, poll_members, poll_board, poll_rejoin, announce](tick_atom) {
      if (st->finished)
        return;
      if (!st->busy) {
        st->busy = true;
        if (st->rejoining) {
          poll_rejoin();
        } else if (!st->core) {
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
