#include "actors/auth/admission.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace starling::actors::auth {

namespace {

/// The refusal of a node whose key the peers' verdict banned (`admission::ban_verified`).
refusal verified_ban_refusal(const std::string& why) {
  return refuse(reason::banned, "this node's key is banned by the peers' verdict: " + why);
}

int64_t system_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

gatekeeper_options keeper_options(const admission_options& o) {
  gatekeeper_options g;
  g.trust = o.trust;
  g.self_key = o.key ? o.key->public_key() : std::string{};
  g.protocol_version = o.protocol_version;
  g.policy = o.policy;
  g.random = o.random;
  return g;
}

std::string short_hex(std::string_view peer_id) {
  return to_hex(peer_id).substr(0, 12);
}

} // namespace

status check_own_token(const admission_options& opts) {
  if (!opts.key)
    return fail("admission: no node key");
  if (opts.trust.open())
    return {};
  if (opts.token.empty())
    return fail("this run has an authority: the node needs a token (starling token issue "
                "--authority DIR --peer-key node.key.pub ...) given as node.token or --token");
  auto now = opts.clock ? opts.clock() : system_now();
  auto t = verify_token(opts.token, opts.trust, now);
  if (!t)
    return fail("this node's token is not valid for the run: " + t.error().line());
  if (t->peer_key != opts.key->public_key())
    return fail("this node's token belongs to peer " + short_hex(peer_id_of(t->peer_key))
                + ", this node is " + short_hex(opts.key->peer_id())
                + " (a token is issued for one node key)");
  return {};
}

admission::admission(admission_options opts)
  : opts_(std::move(opts)),
    peer_id_(opts_.key ? opts_.key->peer_id() : std::string{}),
    keeper_(keeper_options(opts_)),
    refused_peers_(opts_.max_refused_peers) {
  if (!opts_.clock)
    opts_.clock = system_now;
  if (opts_.max_pending == 0)
    opts_.max_pending = 1;
}

int64_t admission::now() const {
  return opts_.clock();
}

std::string admission::hello_for(std::string_view challenge,
                                 std::string_view acceptor_peer_id) const {
  hello h;
  h.version = opts_.protocol_version;
  h.experiment = opts_.trust.experiment;
  h.peer_key = opts_.key->public_key();
  h.token = opts_.token;
  h.challenge = std::string{challenge};
  h.acceptor_peer_id = std::string{acceptor_peer_id};
  h.time_ns = now();
  return make_hello(*opts_.key, h);
}

std::string admission::begin(uint64_t& session) {
  std::lock_guard<std::mutex> guard{mtx_};
  session = next_session_++;
  pending_.push_back(session);
  while (pending_.size() > opts_.max_pending) {
    keeper_.close(pending_.front());
    pending_.erase(pending_.begin());
  }
  return keeper_.open(session);
}

admission::opening admission::open(std::string_view their_challenge,
                                   std::string_view their_peer_id) {
  opening o;
  o.challenge = begin(o.session);
  o.hello = hello_for(their_challenge, their_peer_id);
  return o;
}

checked<peer_info> admission::admit(uint64_t session, std::string_view hello_bytes) {
  auto t = now();
  std::lock_guard<std::mutex> guard{mtx_};
  auto pending = std::find(pending_.begin(), pending_.end(), session);
  if (pending == pending_.end()) {
    // Not opened, already used or dropped as the oldest of too many: the gatekeeper counts it.
    return keeper_.admit_hello(session, hello_bytes, t);
  }
  pending_.erase(pending);
  auto p = keeper_.admit_hello(session, hello_bytes, t);
  if (!p) {
    // A hello that proved its key (banned, revoked, no token...) names whom this node refused.
    if (auto& key = keeper_.refused_key(); !key.empty())
      refused_peers_.add(peer_id_of(key), key, p.error());
    keeper_.close(session);
    return p;
  }
  if (auto b = verified_bans_.find(p->peer_key); b != verified_bans_.end()) {
    keeper_.close(session);
    auto r = verified_ban_refusal(b->second);
    strangers_.add(r.why);
    refused_peers_.add(p->peer_id, p->peer_key, r);
    gone_[p->peer_id] = gone_peer{r, p->peer_key};
    return r;
  }
  // A peer that comes again (a restarted process with the same key) replaces its old session.
  auto& slot = by_peer_[p->peer_id];
  if (slot.session != 0)
    keeper_.close(slot.session);
  slot = admitted_peer{session, *p};
  gone_.erase(p->peer_id);
  return p;
}

std::string handshake(admission& connector, admission& acceptor) {
  uint64_t mine = 0;
  auto challenge = connector.begin(mine);
  auto o = acceptor.open(challenge, connector.peer_id());
  auto admitted_acceptor = connector.admit_acceptor(mine, o.hello);
  if (!admitted_acceptor)
    return "the node refused here: " + admitted_acceptor.error().line();
  auto admitted = acceptor.admit(
    o.session, connector.hello_for(o.challenge, admitted_acceptor->peer_id));
  return admitted ? std::string{} : admitted.error().line();
}

checked<peer_info> admission::admit_acceptor(uint64_t session, std::string_view hello_bytes) {
  auto p = admit(session, hello_bytes);
  if (!p && p.error().why == reason::foreign_experiment)
    if (auto h = decode_hello(hello_bytes); h && check_experiment_id(h->experiment).ok()) {
      std::lock_guard<std::mutex> guard{mtx_};
      foreign_acceptor_ = foreign_run{h->experiment, !h->token.empty()};
    }
  return p;
}

admission::foreign_run admission::take_foreign_acceptor() {
  std::lock_guard<std::mutex> guard{mtx_};
  return std::exchange(foreign_acceptor_, foreign_run{});
}

refusal admission::not_admitted(std::string_view sender, std::string_view what) {
  if (auto g = gone_.find(sender); g != gone_.end()) {
    strangers_.add(g->second.why.why);
    refused_peers_.add(sender, g->second.key, g->second.why);
    return g->second.why;
  }
  strangers_.add(reason::no_hello);
  return refuse(reason::no_hello, "peer " + short_hex(sender) + " sent " + std::string{what}
                                    + " without having been admitted (hello first)");
}

std::optional<refusal> admission::allow(std::string_view sender, std::string_view kind) {
  auto t = now();
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = by_peer_.find(sender);
  if (i == by_peer_.end())
    return not_admitted(sender, "'" + std::string{kind} + "'");
  auto c = keeper_.check(i->second.session, kind, t);
  if (c)
    return std::nullopt;
  auto r = c.error();
  refused_peers_.add(sender, i->second.info.peer_key, r);
  if (r.why == reason::expired || r.why == reason::revoked || r.why == reason::banned) {
    keeper_.close(i->second.session);
    gone_[std::string{sender}] = gone_peer{r, i->second.info.peer_key};
    by_peer_.erase(i);
  }
  return r;
}

std::optional<refusal> admission::allow_any(std::string_view sender) {
  auto t = now();
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = by_peer_.find(sender);
  if (i == by_peer_.end())
    return not_admitted(sender, "a message");
  auto& p = i->second.info;
  if (p.expires_at_ns != 0 && t >= p.expires_at_ns) {
    auto r = refuse(reason::expired, "token expired at " + format_time(p.expires_at_ns));
    strangers_.add(r.why);
    refused_peers_.add(sender, p.peer_key, r);
    keeper_.close(i->second.session);
    gone_[std::string{sender}] = gone_peer{r, p.peer_key};
    by_peer_.erase(i);
    return r;
  }
  return std::nullopt;
}

std::optional<peer_info> admission::peer(std::string_view peer_id) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = by_peer_.find(peer_id);
  if (i == by_peer_.end())
    return std::nullopt;
  return i->second.info;
}

std::string admission::key_of(std::string_view peer_id) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = by_peer_.find(peer_id);
  return i == by_peer_.end() ? std::string{} : i->second.info.peer_key;
}

checked<std::vector<std::string>> admission::update_deny_list(std::string_view signed_list) {
  auto t = now();
  std::lock_guard<std::mutex> guard{mtx_};
  auto gone = keeper_.update_deny_list(signed_list, t);
  if (!gone)
    return gone.error();
  std::vector<std::string> peers;
  for (auto conn : *gone)
    for (auto i = by_peer_.begin(); i != by_peer_.end(); ++i)
      if (i->second.session == conn) {
        auto& deny = keeper_.current_deny_list();
        auto& info = i->second.info;
        // The refused peer is told the authority's reason, and the ledger shows it.
        auto why = [](const std::string& reason) {
          return reason.empty() ? std::string{"no reason given"} : reason;
        };
        refusal r;
        if (auto e = deny.banned(info.peer_key, t))
          r = refuse(reason::banned, "this node's key is banned from the run: " + why(e->reason));
        else if (auto e = deny.revoked(info.token_id, t))
          r = refuse(reason::revoked, "this node's token " + to_hex(info.token_id).substr(0, 12)
                                        + " was revoked: " + why(e->reason));
        else
          r = refuse(reason::revoked, "this node's token was revoked");
        refused_peers_.add(i->first, info.peer_key, r);
        gone_[i->first] = gone_peer{r, info.peer_key};
        peers.push_back(i->first);
        keeper_.close(conn);
        by_peer_.erase(i);
        break;
      }
  return peers;
}

std::vector<std::string> admission::ban_verified(std::string_view node_key, std::string why) {
  std::lock_guard<std::mutex> guard{mtx_};
  verified_bans_[std::string{node_key}] = why;
  std::vector<std::string> peers;
  for (auto i = by_peer_.begin(); i != by_peer_.end();) {
    if (i->second.info.peer_key != node_key) {
      ++i;
      continue;
    }
    auto r = verified_ban_refusal(why);
    refused_peers_.add(i->first, i->second.info.peer_key, r);
    gone_[i->first] = gone_peer{r, i->second.info.peer_key};
    peers.push_back(i->first);
    keeper_.close(i->second.session);
    i = by_peer_.erase(i);
  }
  return peers;
}

std::optional<std::string> admission::verified_ban(std::string_view node_key) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = verified_bans_.find(node_key);
  if (i == verified_bans_.end())
    return std::nullopt;
  return i->second;
}

uint64_t admission::deny_serial() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return keeper_.current_deny_list().serial;
}

refusal_counts admission::refusals() const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto all = keeper_.refusals();
  all.merge(strangers_);
  return all;
}

peer_refusal_tally admission::refused_peers() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return refused_peers_;
}

std::string admission::summary() const {
  return refusals().summary();
}

uint64_t admission::admitted() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return keeper_.admitted();
}

} // namespace starling::actors::auth
