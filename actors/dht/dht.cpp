#include "actors/dht/dht.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>

#include <caf/all.hpp>

#include "actors/dht/client.hpp"
#include "actors/dht/lookup.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"

namespace starling::actors::dht {

using messages::dht_get_result;
using messages::dht_peer;
using messages::dht_put;
using messages::dht_put_result;
using messages::dht_record;
using messages::dht_request;
using messages::dht_response;
using messages::dht_rpc;
using messages::dht_stats;

node_id id_of(const identity& id) {
  return node_id::of_key(id.public_key);
}

namespace {

/// Token bucket of one sending peer.
struct bucket_state {
  double tokens = 0;
  int64_t last_ns = 0;
};

/// One lookup in progress and what to do when it ends.
struct running_lookup {
  running_lookup(node_id target, node_id self, lookup_options o) : l(target, self, o) {}
  lookup l;
  bool find_value = false;
  std::string key;
  /// Merged live records found (find_value).
  std::map<std::string, dht_record> found;
  bool found_plain = false;
  uint32_t found_hops = 0;
  std::set<node_id> had_value;
  bool finished = false;
  std::function<void(running_lookup&)> on_done;
};

using lookup_ptr = std::shared_ptr<running_lookup>;

class dht_impl {
public:
  dht_impl(caf::event_based_actor* self, caf::actor resolver, dht_options opts)
      : self_(self),
        resolver_(std::move(resolver)),
        opts_(std::move(opts)),
        me_(id_of(opts_.id)),
        table_(me_, opts_.routing),
        store_(opts_.limits) {}

  int64_t now() const { return dht_now_ns(self_); }

  /// This node as its requests name it: a client names no address (nobody can dial it).
  dht_peer me() const {
    return dht_peer{me_.to_bytes(), opts_.client ? std::string{} : opts_.address};
  }

  // -- peer bookkeeping ---------------------------------------------------------------------

  void heard_from(const dht_peer& p) {
    node_id id;
    if (!node_id::from_bytes(p.id, id) || p.address.empty())
      return;
    auto r = table_.add_or_update(id, p.address, now());
    if (r.outcome != add_outcome::full || !r.oldest || pinging_.count(r.oldest->id) > 0)
      return;
    // Kademlia's replacement policy: keep the old peer if it still answers.
    auto oldest = *r.oldest;
    pinging_.insert(oldest.id);
    dht_request req;
    req.kind = static_cast<uint8_t>(dht_rpc::ping);
    req.sender = me();
    rpc(
        oldest.address, std::move(req),
        [this, oldest](dht_response& resp) {
          pinging_.erase(oldest.id);
          heard_from(resp.responder);
        },
        [this, oldest] {
          pinging_.erase(oldest.id);
          table_.mark_failed(oldest.id);
        },
        [this, oldest](dht_response& resp) {
          // Refused, but it answered: it is alive, so it keeps its slot.
          pinging_.erase(oldest.id);
          heard_from(resp.responder);
        });
  }

  bool admit(const std::string& sender) {
    if (opts_.requests_per_peer_per_second <= 0)
      return true;
    auto& b = buckets_[sender];
    auto t = now();
    auto cap = std::max(1.0, opts_.requests_per_peer_per_second);
    if (b.last_ns == 0) {
      b.tokens = cap;
    } else {
      b.tokens = std::min(cap, b.tokens + opts_.requests_per_peer_per_second *
                                              static_cast<double>(t - b.last_ns) * 1e-9);
    }
    b.last_ns = t;
    if (b.tokens < 1.0) {
      ++rate_limited_;
      return false;
    }
    b.tokens -= 1.0;
    return true;
  }

  // -- outgoing RPC -------------------------------------------------------------------------

  /// Sends `req` to the peer at `address`: `ok` gets its answer; `err` runs when it failed
  /// (could not be resolved, timed out, died); `refused` when it answered but declined (rate
  /// limit, unknown kind). A refusing peer is alive: it must not be treated as unresponsive
  /// (evicted), so callers pass a `refused` that spares the routing table; without one, `err`
  /// runs.
  ///
  /// A request in flight is also registered under its peer's address, so that the peer's
  /// death ends it at once (`peer_down`); whichever comes first, the answer, the timeout or the
  /// death, settles it, and the others are ignored.
  void rpc(const std::string& address, dht_request req, std::function<void(dht_response&)> ok,
           std::function<void()> err, std::function<void(dht_response&)> refused = nullptr) {
    auto send = [this, address, req = std::move(req), ok, err, refused](const caf::actor& h) {
      auto id = ++next_rpc_;
      auto settled = std::make_shared<bool>(false);
      in_flight_[address][id] = [settled, err] {
        if (!*settled) {
          *settled = true;
          err();
        }
      };
      self_->request(h, opts_.rpc_timeout, req)
          .then(
              [this, address, id, settled, ok, err, refused](dht_response& resp) {
                if (*settled)
                  return;
                *settled = true;
                forget_rpc(address, id);
                // A response whose envelope we refused arrives empty with the reason (already
                // counted by the wire context): a refusal, never an answer to act on.
                if (!resp.wire_error.empty())
                  resp.refused = resp.wire_error;
                if (resp.refused.empty()) {
                  ok(resp);
                  return;
                }
                ++refusals_;
                if (refused)
                  refused(resp);
                else
                  err();
              },
              [this, address, id, settled, err](caf::error& e) {
                if (*settled)
                  return;
                *settled = true;
                forget_rpc(address, id);
                if (std::getenv("STARLING_DHT_DEBUG") != nullptr)
                  std::fprintf(stderr, "dht %s: rpc to %s failed: %s\n", opts_.address.c_str(),
                               address.c_str(), self_->system().render(e).c_str());
                handles_.erase(address);
                err();
              });
    };
    auto it = handles_.find(address);
    if (it != handles_.end()) {
      send(it->second);
      return;
    }
    self_->request(resolver_, opts_.rpc_timeout, resolve_atom::value, address)
        .then(
            [this, address, send](const caf::actor& h) {
              handles_[address] = h;
              // Its death (a killed node's connection closes at once) ends what waits on it.
              self_->monitor(h);
              send(h);
            },
            [this, address, err](caf::error& e) {
              if (std::getenv("STARLING_DHT_DEBUG") != nullptr)
                std::fprintf(stderr, "dht %s: resolving %s failed: %s\n", opts_.address.c_str(),
                             address.c_str(), self_->system().render(e).c_str());
              err();
            });
  }

  /// Request `id` to `address` was answered or timed out: no longer in flight.
  void forget_rpc(const std::string& address, uint64_t id) {
    auto it = in_flight_.find(address);
    if (it == in_flight_.end())
      return;
    it->second.erase(id);
    if (it->second.empty())
      in_flight_.erase(it);
  }

  /// The peer whose DHT actor is `who` is gone (its node died, or the connection to it broke):
  /// its handle is dropped, so the next request resolves it anew (and fails at once if nothing
  /// listens there any more), and every request still waiting for its answer fails now. CAF
  /// would fail those only at their timeout, although a killed process's connection closes at
  /// once: with the dead node among a key's closest peers, every lookup of every node waited
  /// `rpc_timeout` for it, and a collaboration's progress reads and matchmaking polls with them
  /// (the survivors of a SIGKILLed data-parallel peer stalled ~2 s in the 4-process test).
  void peer_down(const caf::actor_addr& who) {
    std::vector<std::string> gone;
    for (auto& [address, h] : handles_)
      if (h.address() == who)
        gone.push_back(address);
    for (auto& address : gone) {
      handles_.erase(address);
      auto it = in_flight_.find(address);
      if (it == in_flight_.end())
        continue;
      // Moved out first: a failure continues its lookup, which may send more requests.
      auto waiting = std::move(it->second);
      in_flight_.erase(it);
      for (auto& [id, fail] : waiting)
        fail();
    }
  }

  // -- incoming RPC -------------------------------------------------------------------------

  std::vector<dht_peer> closest_peers(const node_id& target) const {
    std::vector<dht_peer> out;
    for (auto& p : table_.nearest(target, opts_.routing.k))
      out.push_back(dht_peer{p.id.to_bytes(), p.address});
    return out;
  }

  dht_response handle(dht_request& req) {
    dht_response resp;
    resp.responder = me();
    // A refused envelope arrives empty with its reason: answer it, never act on it.
    if (!req.wire_error.empty()) {
      resp.refused = req.wire_error;
      return resp;
    }
    // Senders without an address (clients) are counted by id, not all in one bucket.
    if (!admit(req.sender.address.empty() ? "id:" + req.sender.id : req.sender.address)) {
      resp.refused = "rate limit";
      return resp;
    }
    if (opts_.client) {
      resp.refused = "client mode: this node serves no DHT requests";
      return resp;
    }
    heard_from(req.sender);
    switch (static_cast<dht_rpc>(req.kind)) {
    case dht_rpc::ping:
      break;
    case dht_rpc::store:
      for (auto& r : req.records)
        resp.accepted.push_back(store_.put(r, now()) == store_status::accepted ? 1 : 0);
      break;
    case dht_rpc::find_node: {
      node_id target;
      if (node_id::from_bytes(req.target, target))
        resp.closer = closest_peers(target);
      break;
    }
    case dht_rpc::find_value:
      resp.records = store_.get(req.key, now());
      resp.closer = closest_peers(node_id::of_key(req.key));
      break;
    default:
      resp.refused = "unknown request kind";
    }
    return resp;
  }

  // -- lookups ------------------------------------------------------------------------------

  lookup_ptr start_lookup(const node_id& target) {
    auto lp =
        std::make_shared<running_lookup>(target, me_, lookup_options{opts_.routing.k, opts_.alpha});
    for (auto& p : table_.nearest(target, opts_.routing.k))
      lp->l.add(p.id, p.address, 1);
    return lp;
  }

  void merge_found(running_lookup& lk, std::vector<dht_record>& recs) {
    for (auto& r : recs) {
      if (r.key != lk.key || !verify(r) || r.expiration_ns <= now() || store_.signer_banned(r))
        continue; // readers ignore the records of signers this node banned
      auto slot = r.has_subkey ? "s" + r.subkey : std::string{"p"};
      auto it = lk.found.find(slot);
      if (it == lk.found.end() || it->second.expiration_ns < r.expiration_ns)
        lk.found[slot] = std::move(r);
    }
  }

  void pump(const lookup_ptr& lp) {
    if (lp->finished)
      return;
    if (lp->l.done()) {
      lp->finished = true;
      lp->on_done(*lp);
      return;
    }
    for (auto& c : lp->l.next()) {
      dht_request req;
      req.sender = me();
      if (lp->find_value) {
        req.kind = static_cast<uint8_t>(dht_rpc::find_value);
        req.key = lp->key;
      } else {
        req.kind = static_cast<uint8_t>(dht_rpc::find_node);
        req.target = lp->l.target().to_bytes();
      }
      auto id = c.id;
      auto depth = c.depth;
      rpc(
          c.address, std::move(req),
          [this, lp, id, depth](dht_response& resp) {
            heard_from(resp.responder);
            std::vector<std::pair<node_id, std::string>> closer_peers;
            for (auto& p : resp.closer) {
              node_id pid;
              if (node_id::from_bytes(p.id, pid) && !p.address.empty())
                closer_peers.emplace_back(pid, p.address);
            }
            lp->l.on_response(id, closer_peers);
            if (lp->find_value && !resp.records.empty()) {
              auto before = lp->found.size();
              merge_found(*lp, resp.records);
              if (lp->found.size() > 0) {
                lp->had_value.insert(id);
                if (before == 0)
                  lp->found_hops = depth;
                // A plain value ends the lookup; a dictionary's sub-keys are spread over the
                // replicas of its writers, so the lookup goes on and collects them all.
                bool dictionary = std::any_of(lp->found.begin(), lp->found.end(),
                                              [](auto& kv) { return kv.second.has_subkey; });
                if (!dictionary)
                  lp->l.stop();
              }
            }
            pump(lp);
          },
          [this, lp, id] {
            table_.mark_failed(id);
            lp->l.on_failure(id);
            pump(lp);
          },
          [this, lp, id](dht_response& resp) {
            // A refusal (rate limit) ends this peer's part in the lookup but is no sign of
            // unresponsiveness: the peer stays in our buckets.
            heard_from(resp.responder);
            lp->l.on_failure(id);
            pump(lp);
          });
    }
    if (lp->l.done() && !lp->finished) {
      lp->finished = true;
      lp->on_done(*lp);
    }
  }

  // -- client operations -------------------------------------------------------------------

  void put(dht_put p, caf::response_promise rp) {
    if (must_rejoin()) {
      rejoin_then([this, p = std::move(p), rp]() mutable { put(std::move(p), rp); });
      return;
    }
    dht_record r;
    r.key = std::move(p.key);
    r.has_subkey = p.has_subkey;
    r.subkey = std::move(p.subkey);
    r.value = std::move(p.value);
    r.expiration_ns = p.expiration_ns;
    if (p.sign)
      sign(r, opts_.id);
    auto target = node_id::of_key(r.key);
    auto lp = start_lookup(target);
    lp->on_done = [this, r, rp, target](running_lookup& lk) mutable {
      // The replicas: the closest peers that answered, plus ourselves if we are among them.
      auto best = lk.l.closest_responded(opts_.num_replicas);
      bool self_in = !opts_.client
                     && (best.size() < opts_.num_replicas || closer(target, me_, best.back().id));
      if (self_in && best.size() == opts_.num_replicas)
        best.pop_back();
      auto result = std::make_shared<dht_put_result>();
      result->hops = lk.l.hops();
      result->replicas = static_cast<uint32_t>(best.size() + (self_in ? 1 : 0));
      if (self_in && store_.put(r, now()) == store_status::accepted)
        result->accepted++;
      auto remaining = std::make_shared<size_t>(best.size());
      if (*remaining == 0) {
        rp.deliver(*result);
        return;
      }
      for (auto& c : best) {
        dht_request req;
        req.kind = static_cast<uint8_t>(dht_rpc::store);
        req.sender = me();
        req.records.push_back(r);
        auto finish = [rp, result, remaining]() mutable {
          if (--*remaining == 0)
            rp.deliver(*result);
        };
        rpc(
            c.address, std::move(req),
            [result, finish](dht_response& resp) mutable {
              if (!resp.accepted.empty() && resp.accepted[0] == 1)
                result->accepted++;
              finish();
            },
            [finish]() mutable { finish(); });
      }
    };
    pump(lp);
  }

  void get(const std::string& key, caf::response_promise rp) {
    if (must_rejoin()) {
      rejoin_then([this, key, rp]() mutable { get(key, rp); });
      return;
    }
    auto local = store_.get(key, now());
    // A local plain value answers at once. A local dictionary may be partial (writers that did
    // not count us among the key's replicas stored their sub-keys elsewhere: the averager's
    // matchmaking then never saw its partners), so the lookup runs and merges it in.
    bool dictionary = std::any_of(local.begin(), local.end(),
                                  [](const dht_record& r) { return r.has_subkey; });
    if (!local.empty() && !dictionary) {
      rp.deliver(dht_get_result{true, std::move(local), 0});
      return;
    }
    auto lp = start_lookup(node_id::of_key(key));
    lp->find_value = true;
    lp->key = key;
    lp->on_done = [this, rp, local = std::move(local)](running_lookup& lk) mutable {
      merge_found(lk, local);
      dht_get_result res;
      res.hops = lk.found.empty() ? lk.l.hops() : lk.found_hops;
      for (auto& kv : lk.found)
        res.records.push_back(kv.second);
      res.found = !res.records.empty();
      if (res.found && opts_.cache_on_path) {
        // Kademlia caching: the closest peer on the path that did not hold the value.
        for (auto& c : lk.l.closest_responded(opts_.routing.k)) {
          if (lk.had_value.count(c.id) > 0)
            continue;
          dht_request req;
          req.kind = static_cast<uint8_t>(dht_rpc::store);
          req.sender = me();
          req.records = res.records;
          rpc(
              c.address, std::move(req), [](dht_response&) {}, [] {});
          break;
        }
      }
      rp.deliver(std::move(res));
    };
    pump(lp);
  }

  void join(const std::string& address, caf::response_promise rp) {
    join_then(
        address, [this, rp]() mutable { rp.deliver(static_cast<uint32_t>(table_.size())); },
        [rp, address]() mutable {
          rp.deliver(
              caf::make_error(caf::sec::cannot_connect_to_node, "dht: cannot reach " + address));
        });
  }

  /// Pings `address` and, when it answers, looks up our own id (which fills the buckets near us
  /// and announces us to our neighbours); then `done`, or `failed` when it did not answer.
  void join_then(const std::string& address, std::function<void()> done,
                 std::function<void()> failed) {
    dht_request req;
    req.kind = static_cast<uint8_t>(dht_rpc::ping);
    req.sender = me();
    rpc(
        address, std::move(req),
        [this, done](dht_response& resp) {
          heard_from(resp.responder);
          auto lp = start_lookup(me_);
          lp->on_done = [done](running_lookup&) { done(); };
          pump(lp);
        },
        [failed] { failed(); });
  }

  /// A node whose routing table emptied (every peer it knew failed: a partition, a network
  /// outage) would otherwise keep every record to itself forever: a put or get that finds the
  /// table empty (`must_rejoin`) joins the bootstrap peers again and runs once that join ends
  /// (`rejoin_then`), instead of running at once on the node's own store, which answered
  /// with the node's own records only for seconds after a partition ended. One join at a time;
  /// requests that come while it runs wait for it too. While the node stays cut off each request
  /// waits up to one ping's timeout and then runs on its own store, as before.
  bool must_rejoin() const {
    return table_.size() == 0 && !opts_.bootstrap.empty() && !resuming_;
  }

  void rejoin_then(std::function<void()> then) {
    after_rejoin_.push_back(std::move(then));
    if (joins_in_flight_ > 0)
      return;
    joins_in_flight_ = opts_.bootstrap.size();
    for (auto& addr : opts_.bootstrap)
      join_then(addr, [this] { rejoin_ended(); }, [this] { rejoin_ended(); });
  }

  void rejoin_ended() {
    if (--joins_in_flight_ > 0)
      return;
    // What waited runs now, whatever the join's outcome (a failed one leaves it on its own
    // store, as before); `resuming_` keeps it from queueing behind a new join of its own.
    auto waiting = std::move(after_rejoin_);
    after_rejoin_.clear();
    resuming_ = true;
    for (auto& f : waiting)
      f();
    resuming_ = false;
  }

  dht_stats stats() const {
    dht_stats s;
    s.records = store_.size();
    s.peers = table_.size();
    auto& c = store_.counters();
    s.rejected_too_large = c.too_large;
    s.rejected_store_full = c.full;
    s.rejected_older = c.older;
    s.rejected_expired = c.expired;
    s.rejected_bad_signature = c.bad_signature;
    s.rejected_banned = c.banned;
    s.rejected_rate_limit = rate_limited_;
    s.evicted_peers = table_.evictions();
    return s;
  }

  const dht_options& options() const { return opts_; }

  size_t ban_signer(const std::string& public_key) { return store_.ban_signer(public_key); }

private:
  caf::event_based_actor* self_;
  caf::actor resolver_;
  dht_options opts_;
  node_id me_;
  routing_table table_;
  record_store store_;
  std::unordered_map<std::string, caf::actor> handles_;
  /// Requests waiting for an answer, by peer address and request number: what fails each one.
  std::unordered_map<std::string, std::map<uint64_t, std::function<void()>>> in_flight_;
  uint64_t next_rpc_ = 0;
  std::unordered_map<std::string, bucket_state> buckets_;
  std::set<node_id> pinging_;
  uint64_t rate_limited_ = 0;
  /// Joins of the bootstrap peers in flight after the table emptied, the requests waiting for
  /// them, the waiting requests being run (they must not wait again).
  size_t joins_in_flight_ = 0;
  std::vector<std::function<void()>> after_rejoin_;
  bool resuming_ = false;
  /// Our requests that peers refused (rate limit, unknown kind).
  uint64_t refusals_ = 0;
};

} // namespace

caf::behavior dht_actor(caf::event_based_actor* self, caf::actor resolver, dht_options opts) {
  auto impl = std::make_shared<dht_impl>(self, std::move(resolver), std::move(opts));
  // The shell is the actor's only owner of the impl; it dies with the behaviour.
  // A request, not a send: a failed join must come back as a response (an unsolicited error
  // message would reach the default error handler and stop the actor).
  for (auto& addr : impl->options().bootstrap)
    self->request(caf::actor_cast<caf::actor>(self), 30 * impl->options().rpc_timeout,
                  join_atom::value, addr)
        .then([](uint32_t) {}, [](caf::error&) {});
  self->set_down_handler([impl](const caf::down_msg& m) { impl->peer_down(m.source); });
  return {
      [impl](dht_request& req) { return impl->handle(req); },
      [impl, self](dht_put& p) {
        auto rp = self->make_response_promise();
        // A put whose envelope was refused (counted by the wire context) has an empty key and
        // value: storing it would write a record nobody asked for. Answered with the reason.
        if (!p.wire_error.empty()) {
          rp.deliver(caf::make_error(caf::sec::invalid_argument, "dht put refused: " + p.wire_error));
          return rp;
        }
        impl->put(std::move(p), rp);
        return rp;
      },
      [impl, self](get_atom, const std::string& key) {
        auto rp = self->make_response_promise();
        impl->get(key, rp);
        return rp;
      },
      [impl, self](join_atom, const std::string& address) {
        auto rp = self->make_response_promise();
        impl->join(address, rp);
        return rp;
      },
      [impl](status_atom) { return impl->stats(); },
      [impl](dht_key_atom) { return impl->options().id.public_key; },
      [impl, self](ban_atom, const std::string& public_key) -> caf::result<uint64_t> {
        // Only an actor of this node may ban here: a remote one could silence anyone.
        auto sender = self->current_sender();
        if (!sender || sender->node() != self->node())
          return caf::make_error(caf::sec::invalid_argument, "dht: a ban comes from this node only");
        return static_cast<uint64_t>(impl->ban_signer(public_key));
      },
  };
}

caf::actor spawn_dht(caf::actor_system& sys, caf::actor resolver, dht_options opts) {
  return sys.spawn(dht_actor, std::move(resolver), std::move(opts));
}

} // namespace starling::actors::dht
