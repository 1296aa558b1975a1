#include "runtime/node/gate.hpp"

#include <caf/all.hpp>

#include "actors/auth/identity.hpp"
#include "messages/atoms.hpp"
#include "runtime/config/config.hpp"

namespace starling::runtime {

namespace auth = actors::auth;

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
  if (i != endpoints_.end() && i->second.first != n)
    return false; // the first live claim holds (the gate forgets it when that node goes)
  endpoints_[endpoint] = {n, dir.address()};
  return true;
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

void node_gate::set_own_directory(const std::string& endpoint, const caf::actor& dir) {
  std::lock_guard<std::mutex> guard{mtx_};
  own_endpoint_ = endpoint;
  own_directory_ = dir.address();
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
  for (auto& peer : *gone)
    for (auto i = nodes_.begin(); i != nodes_.end();)
      if (i->second == peer) {
        gates_.erase(i->first);
        for (auto e = endpoints_.begin(); e != endpoints_.end();)
          e = e->second.first == i->first ? endpoints_.erase(e) : std::next(e);
        i = nodes_.erase(i);
      } else {
        ++i;
      }
  return true;
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

caf::actor spawn_gate(caf::actor_system& sys, std::shared_ptr<node_gate> gate) {
  return sys.spawn([gate](caf::event_based_actor* self) -> caf::behavior {
    // A connector's directory goes down with its node: its endpoint is forgotten with it.
    self->set_down_handler(
      [gate](const caf::down_msg& dm) { gate->forget_node(dm.source.node()); });
    auto admit = [=](uint64_t session, const std::string& hello,
                     const caf::actor& their_gate) -> std::string {
      auto p = gate->admission().admit(session, hello);
      if (!p)
        return p.error().line();
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
        return admit(session, hello, their_gate);
      },
      [=](hello_atom, uint64_t session, const std::string& hello, const caf::actor& their_gate,
          const std::string& their_endpoint, const caf::actor& their_directory) -> std::string {
        auto refused = admit(session, hello, their_gate);
        // Kept before the answer: whatever the connector sends once admitted comes later, so
        // this node never opens a second connection to it (see node_gate::add_endpoint). A
        // malformed endpoint is not kept; the connector is admitted all the same.
        auto& sender = self->current_sender();
        if (refused.empty() && sender && parse_endpoint(their_endpoint).ok()
            && gate->add_endpoint(sender->node(), their_endpoint, their_directory)) {
          self->monitor(their_directory);
          if (auto r = gate->resolver())
            caf::anon_send(r, hello_atom::value, their_endpoint);
        }
        return refused;
      },
      [=](deny_atom, const std::string& signed_list) -> caf::result<uint64_t> {
        std::string why;
        if (!gate->install_deny_list(signed_list, why))
          return caf::make_error(caf::sec::invalid_argument, why);
        auto& sender = self->current_sender();
        pass_on(*gate, signed_list, sender ? sender->node() : caf::node_id{});
        return gate->admission().deny_serial();
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
              // With this node's endpoint and directory: the acceptor reaches this node
              // through this connection instead of opening a second one.
              self->request(remote_gate, timeout, hello_atom::value, theirs, hello,
                            gate->own_gate(), gate->own_endpoint(), gate->own_directory())
                .then(
                  [=](const std::string& refused) {
                    if (!refused.empty()) {
                      fail_with(refused);
                      return;
                    }
                    gate->add_gate(remote_node, remote_gate);
                    if (auto list = gate->deny_list(); !list.empty())
                      caf::anon_send(remote_gate, deny_atom::value, list);
                    done(std::string{});
                  },
                  [=](caf::error& e) { fail_with(self->system().render(e)); });
            },
            [=](caf::error& e) { fail_with(self->system().render(e)); });
      },
      [=](caf::error& e) {
        fail_with("no gate: " + self->system().render(e));
      });
}

} // namespace starling::runtime
