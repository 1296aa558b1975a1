#include "runtime/node/gate.hpp"

#include <map>
#include <memory>
#include <vector>

#include <caf/all.hpp>

#include "actors/auth/ban_service.hpp"
#include "actors/auth/identity.hpp"
#include "messages/atoms.hpp"
#include "runtime/config/config.hpp"
#include "runtime/log/log.hpp"

namespace starling::runtime {

namespace auth = actors::auth;

namespace {
constexpr std::string_view client_suffix = ".client.invalid:1";
} // namespace

std::string client_endpoint(const std::string& peer_id) {
  return auth::to_hex(peer_id).append(client_suffix);
}

bool is_client_endpoint(const std::string& endpoint) {
  constexpr size_t hex_chars = 2 * auth::peer_id_bytes;
  if (endpoint.size() != hex_chars + client_suffix.size()
      || endpoint.compare(hex_chars, std::string::npos, client_suffix) != 0)
    return false;
  for (size_t i = 0; i < hex_chars; ++i) {
    auto c = endpoint[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return false;
  }
  return true;
}

std::string_view to_string(claim_refusal r) {
  switch (r) {
    case claim_refusal::malformed:
      return "malformed";
    case claim_refusal::taken:
      return "taken";
    case claim_refusal::busy:
      return "busy";
    case claim_refusal::unreachable:
      return "unreachable";
    case claim_refusal::other_node:
      return "other_node";
    case claim_refusal::other_key:
      return "other_key";
  }
  return "unknown";
}

void node_gate::admit_node(const caf::node_id& n, const std::string& peer_id) {
  std::lock_guard<std::mutex> guard{mtx_};
  nodes_[n] = peer_id;
}

bool node_gate::node_admitted(const caf::node_id& n) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return nodes_.count(n) != 0;
}

void node_gate::forget_node(const caf::node_id& n) {
  std::lock_guard<std::mutex> guard{mtx_};
  nodes_.erase(n);
  gates_.erase(n);
  verdicts_.erase(n);
  for (auto i = endpoints_.begin(); i != endpoints_.end();)
    i = i->second.first == n ? endpoints_.erase(i) : std::next(i);
}

bool node_gate::add_endpoint(const caf::node_id& n, const std::string& endpoint,
                             const caf::actor& dir) {
  if (!dir || dir.node() != n)
    return false;
  std::lock_guard<std::mutex> guard{mtx_};
  if (nodes_.count(n) == 0)
    return false;
  auto i = endpoints_.find(endpoint);
  // The first live claim holds (the gate forgets it when that node goes); a client-mode name is
  // the key's, proven by the hello just passed: the latest node with that key takes it (a
  // restarted client may say hello before its old connection's end is noticed).
  if (i != endpoints_.end() && i->second.first != n && !is_client_endpoint(endpoint))
    return false;
  endpoints_[endpoint] = {n, dir.address()};
  return true;
}

caf::node_id node_gate::claimant_of(const std::string& endpoint) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = endpoints_.find(endpoint);
  return i == endpoints_.end() ? caf::node_id{} : i->second.first;
}

void node_gate::set_probe_options(probe_options opts) {
  std::lock_guard<std::mutex> guard{mtx_};
  probe_ = std::move(opts);
}

probe_options node_gate::probe_settings() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return probe_;
}

bool node_gate::begin_claim(const std::string& endpoint) {
  std::lock_guard<std::mutex> guard{mtx_};
  if (probes_ >= max_probes || !pending_claims_.insert(endpoint).second)
    return false;
  ++probes_;
  return true;
}

void node_gate::probe_done() {
  std::lock_guard<std::mutex> guard{mtx_};
  if (probes_ > 0)
    --probes_;
}

void node_gate::end_claim(const std::string& endpoint) {
  std::lock_guard<std::mutex> guard{mtx_};
  pending_claims_.erase(endpoint);
}

bool node_gate::claim_pending(const std::string& endpoint) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return pending_claims_.count(endpoint) != 0;
}

void node_gate::set_verdict(const caf::node_id& n, claim_verdict v) {
  std::lock_guard<std::mutex> guard{mtx_};
  verdicts_[n] = std::move(v);
}

std::optional<claim_verdict> node_gate::verdict_of(const caf::node_id& n) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = verdicts_.find(n);
  if (i == verdicts_.end())
    return std::nullopt;
  return i->second;
}

void node_gate::count_claim_kept() {
  std::lock_guard<std::mutex> guard{mtx_};
  ++claims_kept_;
}

void node_gate::count_claim_refused(claim_refusal why) {
  std::lock_guard<std::mutex> guard{mtx_};
  ++claims_refused_[static_cast<size_t>(why)];
}

uint64_t node_gate::claims_kept() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return claims_kept_;
}

uint64_t node_gate::claims_refused(claim_refusal why) const {
  std::lock_guard<std::mutex> guard{mtx_};
  return claims_refused_[static_cast<size_t>(why)];
}

uint64_t node_gate::claims_refused() const {
  std::lock_guard<std::mutex> guard{mtx_};
  uint64_t n = 0;
  for (auto c : claims_refused_)
    n += c;
  return n;
}

caf::actor node_gate::directory_at(const std::string& endpoint) const {
  std::lock_guard<std::mutex> guard{mtx_};
  auto i = endpoints_.find(endpoint);
  return i == endpoints_.end() ? caf::actor{} : caf::actor_cast<caf::actor>(i->second.second);
}

void node_gate::set_resolver(const caf::actor& resolver) {
  std::lock_guard<std::mutex> guard{mtx_};
  resolver_ = resolver.address();
}

caf::actor node_gate::resolver() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return caf::actor_cast<caf::actor>(resolver_);
}

void node_gate::set_own_directory(const std::string& endpoint, const caf::actor& dir,
                                  bool listening) {
  std::lock_guard<std::mutex> guard{mtx_};
  own_endpoint_ = endpoint;
  own_directory_ = dir.address();
  listening_ = listening;
}

bool node_gate::listening() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return listening_;
}

std::string node_gate::own_endpoint() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return own_endpoint_;
}

caf::actor node_gate::own_directory() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return caf::actor_cast<caf::actor>(own_directory_);
}

void node_gate::add_gate(const caf::node_id& n, const caf::actor& gate) {
  if (!gate)
    return;
  std::lock_guard<std::mutex> guard{mtx_};
  gates_[n] = gate.address();
}

std::vector<caf::actor> node_gate::gates() const {
  std::lock_guard<std::mutex> guard{mtx_};
  std::vector<caf::actor> out;
  for (auto& [n, addr] : gates_)
    if (auto h = caf::actor_cast<caf::actor>(addr))
      out.push_back(std::move(h));
  return out;
}

void node_gate::set_own_gate(const caf::actor& gate) {
  std::lock_guard<std::mutex> guard{mtx_};
  own_gate_ = gate.address();
}

caf::actor node_gate::own_gate() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return caf::actor_cast<caf::actor>(own_gate_);
}

bool node_gate::install_deny_list(const std::string& signed_list, std::string& why) {
  auto gone = admission_->update_deny_list(signed_list);
  if (!gone) {
    why = gone.error().line();
    return false;
  }
  std::lock_guard<std::mutex> guard{mtx_};
  deny_list_ = signed_list;
  // The revoked peers' processes lose their directory access and their gates too.
  drop_peers(*gone);
  return true;
}

size_t node_gate::ban_verified(const std::string& node_key, const std::string& why) {
  auto gone = admission_->ban_verified(node_key, why);
  std::lock_guard<std::mutex> guard{mtx_};
  drop_peers(gone);
  return gone.size();
}

void node_gate::drop_peers(const std::vector<std::string>& peers) {
  for (auto& peer : peers)
    for (auto i = nodes_.begin(); i != nodes_.end();)
      if (i->second == peer) {
        gates_.erase(i->first);
        for (auto e = endpoints_.begin(); e != endpoints_.end();)
          e = e->second.first == i->first ? endpoints_.erase(e) : std::next(e);
        i = nodes_.erase(i);
      } else {
        ++i;
      }
}

std::string node_gate::deny_list() const {
  std::lock_guard<std::mutex> guard{mtx_};
  return deny_list_;
}

namespace {

/// Passes a deny list on to every known gate but those of `skip`'s node (no answer is asked).
void pass_on(const node_gate& gate, const std::string& list, const caf::node_id& skip) {
  for (auto& g : gate.gates())
    if (g.node() != skip)
      caf::anon_send(g, deny_atom::value, list);
}

} // namespace

namespace {

/// `(probe_atom) -> (reached, node id, certified key or why not)`: asked once of a prober.
using probe_atom = caf::atom_constant<caf::atom("probe")>;

/// A prober: answers one `probe_atom` with what `probe_listener` learned at `host:port`, then
/// quits. Spawned detached: the probe blocks its own thread, never the gate's.
caf::behavior prober(caf::event_based_actor* self, const std::string& host, uint16_t port,
                     const probe_options& opts, const std::shared_ptr<node_gate>& gate) {
  return {
    [=](probe_atom) -> std::tuple<bool, caf::node_id, std::string> {
      self->quit();
      auto id = probe_listener(host, port, opts);
      gate->probe_done();
      if (!id)
        return {false, caf::node_id{}, id.error().what};
      return {true, id->node, id->certified_key};
    },
  };
}

} // namespace

caf::actor spawn_gate(caf::actor_system& sys, std::shared_ptr<node_gate> gate) {
  return sys.spawn([gate](caf::event_based_actor* self) -> caf::behavior {
    // A connector's directory goes down with its node: its endpoint is forgotten with it.
    self->set_down_handler(
      [gate](const caf::down_msg& dm) { gate->forget_node(dm.source.node()); });
    // `peer_id` gets the admitted peer's id.
    auto admit = [=](uint64_t session, const std::string& hello, const caf::actor& their_gate,
                     std::string& peer_id) -> std::string {
      auto p = gate->admission().admit(session, hello);
      if (!p)
        return p.error().line();
      peer_id = p->peer_id;
      if (auto& sender = self->current_sender(); sender) {
        gate->admit_node(sender->node(), p->peer_id);
        if (their_gate && their_gate.node() == sender->node())
          gate->add_gate(sender->node(), their_gate);
      }
      // A node that joins late learns the revocations in force.
      if (auto list = gate->deny_list(); !list.empty() && their_gate)
        caf::anon_send(their_gate, deny_atom::value, list);
      return std::string{};
    };
    // Claims being verified, by endpoint: the claimant, and the answers owed to its repeated
    // hellos (a connector that reconnects while its first claim's probe runs), delivered with
    // the verdict instead of refused as busy.
    struct in_flight {
      caf::node_id claimant;
      std::vector<caf::typed_response_promise<std::string>> waiting;
    };
    auto probing = std::make_shared<std::map<std::string, in_flight>>();
    // A claim not kept: counted by reason, one line in the log.
    auto refuse_claim = [gate](const caf::node_id& claimant, claim_refusal why,
                               const std::string& endpoint, const std::string& detail) {
      gate->count_claim_refused(why);
      gate->set_verdict(claimant, {endpoint, false, std::string{to_string(why)} + ": " + detail});
      log(log_level::warning, "gate", "endpoint claim {} refused ({}): {}", endpoint,
          to_string(why), detail);
    };
    return {
      [=](hello_atom, const std::string& peer_id, const std::string& challenge)
        -> caf::result<uint64_t, std::string, std::string> {
        // Sizes are checked here because the hello this node signs answers them; the gatekeeper
        // checks the other node's hello itself.
        if (peer_id.size() != auth::peer_id_bytes || challenge.size() < 16
            || challenge.size() > 64)
          return caf::make_error(caf::sec::invalid_argument,
                                 "refused (malformed): a hello request needs a 20-byte peer id "
                                 "and a 16..64-byte challenge");
        auto o = gate->admission().open(challenge, peer_id);
        return {o.session, std::move(o.challenge), std::move(o.hello)};
      },
      [=](hello_atom, uint64_t session, const std::string& hello,
          const caf::actor& their_gate) -> std::string {
        std::string peer_id;
        return admit(session, hello, their_gate, peer_id);
      },
      [=](hello_atom, uint64_t session, const std::string& hello, const caf::actor& their_gate,
          const caf::actor& their_directory) -> std::string {
        // A client-mode connector: nothing to probe. It goes by the name its proven key gives
        // (`client_endpoint`), which nobody else can claim; this node reaches it through this
        // connection under that name, and forgets it when the connection goes.
        std::string peer_id;
        auto refused = admit(session, hello, their_gate, peer_id);
        auto sender = self->current_sender();
        if (!refused.empty() || !sender)
          return refused;
        if (their_directory && their_directory.node() == sender->node()
            && gate->add_endpoint(sender->node(), client_endpoint(peer_id), their_directory))
          self->monitor(their_directory);
        return refused;
      },
      [=](hello_atom, uint64_t session, const std::string& hello, const caf::actor& their_gate,
          const std::string& their_endpoint,
          const caf::actor& their_directory) -> caf::result<std::string> {
        std::string peer_id;
        auto refused = admit(session, hello, their_gate, peer_id);
        auto sender = self->current_sender();
        if (!refused.empty() || !sender)
          return refused;
        // The claim is kept only once verified, and before the answer: whatever the connector
        // sends once admitted comes later, so this node never opens a second connection to it
        // (see node_gate::add_endpoint). A claim not kept leaves the connector admitted.
        auto claimant = sender->node();
        auto ep = parse_endpoint(their_endpoint);
        if (!ep || !their_directory || their_directory.node() != claimant) {
          refuse_claim(claimant, claim_refusal::malformed, their_endpoint,
                       ep ? "the directory it names is not on the claiming node"
                          : ep.error().what);
          return refused;
        }
        auto endpoint = ep->first + ":" + std::to_string(ep->second);
        if (is_client_endpoint(endpoint)) {
          // Such a name is given by a key's hello in client mode, never claimed.
          refuse_claim(claimant, claim_refusal::malformed, endpoint,
                       "a client-mode name (a peer id's), which no hello claims");
          return refused;
        }
        if (auto holder = gate->claimant_of(endpoint); holder && holder != claimant) {
          refuse_claim(claimant, claim_refusal::taken, endpoint,
                       "another live node's verified claim holds it");
          return refused;
        }
        if (!gate->begin_claim(endpoint)) {
          if (auto it = probing->find(endpoint);
              it != probing->end() && it->second.claimant == claimant) {
            auto again = self->make_response_promise<std::string>();
            it->second.waiting.push_back(again);
            return again;
          }
          refuse_claim(claimant, claim_refusal::busy, endpoint,
                       "a claim of it is being verified, or too many probes are running");
          return refused;
        }
        (*probing)[endpoint] = in_flight{claimant, {}};
        // The node listening there must be the claimant: its BASP server handshake names the
        // claimant's node, and under TLS its certificate certifies the key the claimant was
        // admitted with (a node id is only what a CAF process says it is; a key is proven).
        auto opts = gate->probe_settings();
        auto admitted_key = gate->admission().key_of(peer_id);
        auto rp = self->make_response_promise<std::string>();
        auto probe = self->spawn<caf::detached>(prober, ep->first, ep->second, opts, gate);
        auto finish = [=](bool reached, const caf::node_id& listener,
                          const std::string& key_or_why) mutable {
          gate->end_claim(endpoint);
          if (!reached)
            refuse_claim(claimant, claim_refusal::unreachable, endpoint, key_or_why);
          else if (listener != claimant)
            refuse_claim(claimant, claim_refusal::other_node, endpoint,
                         "node " + caf::to_string(listener) + " listens there, not the claimant "
                           + caf::to_string(claimant));
          else if (opts.tls() && (admitted_key.empty() || key_or_why != admitted_key))
            refuse_claim(claimant, claim_refusal::other_key, endpoint,
                         "the listener's certificate is not for the key the claimant was "
                         "admitted with");
          else if (!gate->add_endpoint(claimant, endpoint, their_directory))
            refuse_claim(claimant, claim_refusal::taken, endpoint,
                         "another node's claim was kept meanwhile, or the claimant left");
          else {
            gate->count_claim_kept();
            gate->set_verdict(claimant, {endpoint, true, {}});
            self->monitor(their_directory);
          }
          // A dial of that endpoint waiting for the verification goes on: through this
          // connection when the claim was kept, to whoever listens there when not.
          if (auto r = gate->resolver())
            caf::anon_send(r, hello_atom::value, endpoint);
          rp.deliver(std::string{});
          if (auto it = probing->find(endpoint); it != probing->end()) {
            for (auto& w : it->second.waiting)
              w.deliver(std::string{});
            probing->erase(it);
          }
        };
        // The verdict comes within the connector's wait for the answer (the node sets the
        // probe's time to 3/5 of it: this is 4/5) even when a TLS handshake is carried on past
        // the probe's time (probe_options::tls_grace).
        self->request(probe, opts.timeout * 4 / 3, probe_atom::value)
          .then(
            [=](bool reached, const caf::node_id& listener, const std::string& key) mutable {
              finish(reached, listener, key);
            },
            [=](caf::error& e) mutable {
              finish(false, caf::node_id{}, "the probe failed: " + self->system().render(e));
            });
        return rp;
      },
      [=](deny_atom, const std::string& signed_list) -> caf::result<uint64_t> {
        std::string why;
        if (!gate->install_deny_list(signed_list, why))
          return caf::make_error(caf::sec::invalid_argument, why);
        auto& sender = self->current_sender();
        pass_on(*gate, signed_list, sender ? sender->node() : caf::node_id{});
        return gate->admission().deny_serial();
      },
      [=](actors::auth::verified_ban_atom, const std::string& node_key,
          const std::string& why) -> caf::result<uint64_t> {
        // Only this node's own actors hand it their verdicts (actors/auth/ban_service.hpp).
        auto& sender = self->current_sender();
        if (!sender || sender->node() != self->node())
          return caf::make_error(caf::sec::invalid_argument,
                                 "refused: a verified ban comes from this node's own actors");
        if (node_key.size() != actors::auth::verified_ban_key_bytes
            || why.size() > actors::auth::verified_ban_reason_bytes
            || why.find('\n') != std::string::npos)
          return caf::make_error(caf::sec::invalid_argument,
                                 "refused (malformed): a verified ban needs a 32-byte node key and "
                                 "a one-line reason of at most 512 bytes");
        auto removed = gate->ban_verified(node_key, why);
        log(log_level::warning, "gate", "banned peer key {} by this node's verdict: {} ({} "
                                        "admitted peer(s) removed)",
            actors::auth::to_hex(node_key).substr(0, 12), why, removed);
        return static_cast<uint64_t>(removed);
      },
    };
  });
}

void say_hello(caf::event_based_actor* self, caf::actor remote_dir,
               std::shared_ptr<node_gate> gate, caf::timespan timeout,
               std::function<void(std::string)> done) {
  auto fail_with = [done](const std::string& what) { done(what); };
  auto remote_node = remote_dir.node();
  self->request(remote_dir, timeout, get_atom::value, std::string{gate_name})
    .then(
      [=](const caf::actor& remote_gate) {
        uint64_t mine = 0;
        auto challenge = gate->admission().begin(mine);
        self->request(remote_gate, timeout, hello_atom::value, gate->admission().peer_id(),
                      challenge)
          .then(
            [=](uint64_t theirs, const std::string& their_challenge,
                const std::string& their_hello) {
              // The acceptor proves who it is first: this node goes on only with a member.
              auto acceptor = gate->admission().admit_acceptor(mine, their_hello);
              if (!acceptor) {
                fail_with("the node refused here: " + acceptor.error().line());
                return;
              }
              gate->admit_node(remote_node, acceptor->peer_id);
              auto hello = gate->admission().hello_for(their_challenge, acceptor->peer_id);
              auto answered = [=](const std::string& refused) {
                if (!refused.empty()) {
                  fail_with(refused);
                  return;
                }
                gate->add_gate(remote_node, remote_gate);
                if (auto list = gate->deny_list(); !list.empty())
                  caf::anon_send(remote_gate, deny_atom::value, list);
                done(std::string{});
              };
              auto failed = [=](caf::error& e) { fail_with(self->system().render(e)); };
              // With this node's endpoint and directory: the acceptor reaches this node
              // through this connection instead of opening a second one. A node in client mode
              // claims no endpoint (nothing listens there to probe): it gives its directory, and
              // the acceptor reaches it under its peer id's name (`client_endpoint`).
              if (!gate->listening())
                self->request(remote_gate, timeout, hello_atom::value, theirs, hello,
                              gate->own_gate(), gate->own_directory())
                  .then(answered, failed);
              else
                self->request(remote_gate, timeout, hello_atom::value, theirs, hello,
                              gate->own_gate(), gate->own_endpoint(), gate->own_directory())
                  .then(answered, failed);
            },
            [=](caf::error& e) { fail_with(self->system().render(e)); });
      },
      [=](caf::error& e) {
        fail_with("no gate: " + self->system().render(e));
      });
}

} // namespace starling::runtime
