#include "actors/auth/gatekeeper.hpp"

#include <sodium.h>

#include <algorithm>

#include <capnp/message.h>

#include "messages/auth.capnp.h"
#include "messages/wire.hpp"

namespace starling::actors::auth {

namespace {

capnp::Data::Reader data(const std::string& s) {
  return {reinterpret_cast<const kj::byte*>(s.data()), s.size()};
}

std::string bytes(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

std::string short_id(std::string_view peer_id) {
  return to_hex(peer_id).substr(0, 12);
}

} // namespace

std::string make_hello(const key_pair& node, const hello& h) {
  capnp::MallocMessageBuilder b;
  auto body = b.initRoot<wire::HelloBody>();
  body.setProtocolVersion(h.version);
  body.setExperimentId(h.experiment);
  body.setPeerKey(data(node.public_key()));
  body.setToken(data(h.token));
  body.setChallenge(data(h.challenge));
  body.setAcceptorPeerId(data(h.acceptor_peer_id));
  body.setTimeNs(h.time_ns);
  std::vector<char> flat;
  messages::write_flat(b, flat);
  return seal(hello_domain, std::string_view(flat.data(), flat.size()), node);
}

namespace {

checked<hello> decode_hello_body(const sealed& s) {
  hello h;
  auto st = messages::read_flat(s.body.data(), s.body.size(), [&](capnp::MessageReader& r) -> status {
    auto b = r.getRoot<wire::HelloBody>();
    h.version = b.getProtocolVersion();
    auto exp = b.getExperimentId();
    if (exp.size() > max_experiment_bytes)
      return fail("an experiment id of " + std::to_string(exp.size()) + " bytes");
    h.experiment.assign(exp.begin(), exp.size());
    h.peer_key = bytes(b.getPeerKey());
    if (h.peer_key.size() != public_key_bytes)
      return fail("a peer key of " + std::to_string(h.peer_key.size()) + " bytes, expected 32");
    auto token = b.getToken();
    if (token.size() > max_token_bytes)
      return fail("a token of " + std::to_string(token.size()) + " bytes");
    h.token = bytes(token);
    h.challenge = bytes(b.getChallenge());
    if (h.challenge.size() < 16 || h.challenge.size() > 64)
      return fail("a challenge of " + std::to_string(h.challenge.size()) + " bytes (16..64)");
    h.acceptor_peer_id = bytes(b.getAcceptorPeerId());
    if (h.acceptor_peer_id.size() != peer_id_bytes)
      return fail("an acceptor peer id of " + std::to_string(h.acceptor_peer_id.size())
                  + " bytes, expected 20");
    h.time_ns = b.getTimeNs();
    return {};
  });
  if (!st)
    return refuse(reason::malformed, "hello: " + st.what());
  return h;
}

} // namespace

checked<hello> decode_hello(std::string_view bytes) {
  auto s = unseal(bytes, max_hello_bytes, "hello");
  if (!s)
    return s.error();
  return decode_hello_body(*s);
}

std::map<std::string, std::vector<std::string>> default_policy() {
  return {
    {"dht.", {"*"}},
    {"transfer.", {"*"}},
    {"ping", {"*"}},
    {"tensor", {"*"}},
    {"blob", {"*"}},
    {"metric", {"*"}},
    {"stage.forward", {"trainer"}},
    {"stage.backward", {"trainer"}},
    {"stage.backward_reply", {"*"}},
    {"stage.state", {"stage"}},
    {"stage.state_part", {"stage"}},
    {"averager.", {"stage", "averager", "collab", "dp_peer"}},
    {"vi.", {"trainer", "dp_peer"}},
  };
}

gatekeeper::gatekeeper(gatekeeper_options opts) : opts_(std::move(opts)) {
  if (opts_.policy.empty())
    opts_.policy = default_policy();
  if (!opts_.random)
    opts_.random = [](uint8_t* p, size_t n) { randombytes_buf(p, n); };
  self_peer_id_ = peer_id_of(opts_.self_key);
  deny_.experiment = opts_.trust.experiment;
}

std::string gatekeeper::open(uint64_t conn) {
  session s;
  s.challenge.resize(challenge_bytes);
  opts_.random(reinterpret_cast<uint8_t*>(s.challenge.data()), s.challenge.size());
  auto c = s.challenge;
  sessions_[conn] = std::move(s);
  return c;
}

void gatekeeper::close(uint64_t conn) {
  sessions_.erase(conn);
}

refusal gatekeeper::count(refusal r) {
  refusals_.add(r.why);
  return r;
}

refusal gatekeeper::refuse_session(session& s, refusal r) {
  s.st = state::refused;
  return count(std::move(r));
}

checked<peer_info> gatekeeper::admit_hello(uint64_t conn, std::string_view bytes, int64_t now_ns) {
  refused_key_.clear();
  auto i = sessions_.find(conn);
  if (i == sessions_.end())
    return count(refuse(reason::protocol_violation, "a hello on a connection never opened"));
  auto& s = i->second;
  if (s.st != state::challenged)
    return count(refuse(reason::protocol_violation,
                        s.st == state::admitted ? "a second hello on an admitted connection"
                                                : "a hello after a refusal"));
  auto sealed_hello = unseal(bytes, max_hello_bytes, "hello");
  if (!sealed_hello)
    return refuse_session(s, sealed_hello.error());
  auto h = decode_hello_body(*sealed_hello);
  if (!h)
    return refuse_session(s, h.error());
  if (h->version != opts_.protocol_version)
    return refuse_session(s, refuse(reason::version_mismatch,
                                    "protocol version " + std::to_string(h->version)
                                      + " (another starling build), this node speaks "
                                      + std::to_string(opts_.protocol_version)));
  if (h->experiment != opts_.trust.experiment)
    return refuse_session(s, refuse(reason::foreign_experiment,
                                    "hello for experiment '" + h->experiment + "', this run is '"
                                      + opts_.trust.experiment + "'"));
  if (!verify_sealed(hello_domain, *sealed_hello, h->peer_key))
    return refuse_session(s, refuse(reason::forged, "the hello is not signed by its node key"));
  // From here on the hello proved its key: a refusal names whom it refused.
  refused_key_ = h->peer_key;
  if (h->challenge != s.challenge || h->acceptor_peer_id != self_peer_id_)
    return refuse_session(s, refuse(reason::wrong_challenge,
                                    "the hello answers another connection's challenge"));
  auto skew = static_cast<__int128>(h->time_ns) - now_ns;
  if (skew > opts_.trust.max_clock_skew_ns || -skew > opts_.trust.max_clock_skew_ns)
    return refuse_session(s, refuse(reason::stale, "hello clock " + format_time(h->time_ns)
                                                     + ", this node's " + format_time(now_ns)));
  peer_info p;
  p.peer_key = h->peer_key;
  p.peer_id = peer_id_of(h->peer_key);
  p.self = h->peer_key == opts_.self_key;
  p.authority = !opts_.trust.open() && h->peer_key == opts_.trust.authority_key;
  if (auto e = deny_.banned(p.peer_key, now_ns))
    return refuse_session(s, refuse(reason::banned, "peer " + short_id(p.peer_id) + " banned: "
                                                      + (e->reason.empty() ? "no reason given"
                                                                           : e->reason)));
  if (opts_.trust.open()) {
    // An open run (loopback demos, tests): every role but administration.
    p.roles = {std::string{any_role}};
  } else if (!p.self && !p.authority) {
    if (h->token.empty())
      return refuse_session(s, refuse(reason::no_token, "this run admits token holders only; "
                                                        "ask its owner for a token"));
    auto t = verify_token(h->token, opts_.trust, now_ns, &deny_);
    if (!t)
      return refuse_session(s, t.error());
    if (t->peer_key != p.peer_key)
      return refuse_session(s, refuse(reason::wrong_key,
                                      "the token belongs to peer " + short_id(peer_id_of(t->peer_key))
                                        + ", the hello comes from " + short_id(p.peer_id)));
    p.roles = t->roles;
    p.token_id = t->id;
    p.expires_at_ns = t->expires_at_ns;
  }
  refused_key_.clear();
  s.st = state::admitted;
  s.peer = p;
  ++admitted_;
  return p;
}

const std::vector<std::string>* gatekeeper::rule_for(std::string_view kind) const {
  const std::vector<std::string>* best = nullptr;
  size_t best_len = 0;
  for (auto& [key, roles] : opts_.policy) {
    bool prefix = !key.empty() && key.back() == '.';
    bool match = prefix ? kind.substr(0, key.size()) == key : kind == key;
    if (match && key.size() >= best_len) {
      best = &roles;
      best_len = key.size();
    }
  }
  return best;
}

checked<const peer_info*> gatekeeper::check(uint64_t conn, std::string_view kind,
                                            int64_t now_ns) {
  auto i = sessions_.find(conn);
  if (i == sessions_.end() || i->second.st == state::challenged) {
    if (i != sessions_.end())
      i->second.st = state::refused;
    return count(refuse(reason::no_hello, "the first message must be the hello, got '"
                                            + std::string{kind} + "'"));
  }
  auto& s = i->second;
  if (s.st == state::refused)
    return count(refuse(reason::protocol_violation, "a message after a refusal"));
  auto& p = s.peer;
  if (p.expires_at_ns != 0 && now_ns >= p.expires_at_ns)
    return refuse_session(s, refuse(reason::expired, "token expired at "
                                                       + format_time(p.expires_at_ns)));
  if (kind.substr(0, 6) == "admin.") {
    if (p.self || p.authority)
      return &p;
    return count(refuse(reason::role_denied, "'" + std::string{kind}
                                               + "' is accepted only from this node or the "
                                                 "run's authority"));
  }
  auto rule = rule_for(kind);
  if (!rule)
    return count(refuse(reason::role_denied, "no role may send '" + std::string{kind} + "'"));
  if (p.self || p.authority)
    return &p;
  for (auto& role : *rule)
    if (role == "*")
      return &p;
  for (auto& role : *rule)
    if (std::find(p.roles.begin(), p.roles.end(), role) != p.roles.end()
        || std::find(p.roles.begin(), p.roles.end(), any_role) != p.roles.end())
      return &p;
  std::string allowed;
  for (auto& role : *rule)
    allowed += (allowed.empty() ? "" : ", ") + role;
  return count(refuse(reason::role_denied, "'" + std::string{kind} + "' needs one of the roles "
                                             + allowed));
}

checked<std::vector<uint64_t>> gatekeeper::update_deny_list(std::string_view signed_list,
                                                             int64_t now_ns) {
  auto list = verify_deny_list(signed_list, opts_.trust);
  if (!list)
    return list.error();
  if (list->serial <= deny_.serial && deny_.serial != 0)
    return refuse(reason::malformed, "deny list serial " + std::to_string(list->serial)
                                       + " is not newer than " + std::to_string(deny_.serial));
  deny_ = std::move(*list);
  std::vector<uint64_t> gone;
  for (auto& [conn, s] : sessions_) {
    if (s.st != state::admitted)
      continue;
    if (auto e = deny_.banned(s.peer.peer_key, now_ns)) {
      refuse_session(s, refuse(reason::banned, e->reason));
      gone.push_back(conn);
    } else if (!s.peer.token_id.empty() && deny_.revoked(s.peer.token_id, now_ns)) {
      refuse_session(s, refuse(reason::revoked, "token revoked"));
      gone.push_back(conn);
    }
  }
  return gone;
}

} // namespace starling::actors::auth
