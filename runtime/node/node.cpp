#include "runtime/node/node.hpp"

#include <algorithm>
#include <map>
#include <set>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include "actors/auth/admission.hpp"
#include "actors/auth/authority.hpp"
#include "actors/auth/certificates.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"
#include "messages/wire.hpp"
#include "messages/wire_context.hpp"
#include "runtime/log/log.hpp"
#include "runtime/node/address.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/openssl_errors.hpp"

namespace starling::runtime {

void configure_system(caf::actor_system_config& cfg, const caf_options& opts, bool middleman) {
  messages::register_types(cfg);
  cfg.set("scheduler.policy", opts.scheduler_policy == "sharing" ? caf::atom("sharing")
                                                                  : caf::atom("stealing"));
  cfg.set("scheduler.max-threads", static_cast<size_t>(opts.max_threads));
  cfg.set("logger.verbosity", caf::atom("quiet"));
  cfg.set("logger.console", caf::atom("none"));
  if (middleman) {
    cfg.load<caf::io::middleman>();
    cfg.set("middleman.heartbeat-interval", caf::timespan{opts.heartbeat_interval});
    cfg.set("middleman.connection-timeout", caf::timespan{opts.connection_timeout});
    // Without this, every remote actor's termination is only seen when someone talks to it.
    cfg.set("middleman.enable-automatic-connections", false);
  }
}

caf::actor spawn_directory(caf::actor_system& sys, std::shared_ptr<node_gate> gate) {
  return sys.spawn([gate](caf::event_based_actor* self) -> caf::behavior {
    auto names = std::make_shared<std::map<std::string, caf::actor>>();
    // Entries disappear with their actors, so a lookup never returns a dead handle.
    self->set_down_handler([names](const caf::down_msg& dm) {
      for (auto i = names->begin(); i != names->end();)
        i = i->second.address() == dm.source ? names->erase(i) : std::next(i);
    });
    // Another process's sender: admitted only after its node's hello.
    auto stranger = [=] {
      auto& sender = self->current_sender();
      return gate && sender && sender->node() != self->node()
             && !gate->node_admitted(sender->node());
    };
    auto remote = [=] {
      auto& sender = self->current_sender();
      return sender && sender->node() != self->node();
    };
    auto refused = [](const std::string& what) {
      return caf::make_error(caf::sec::request_receiver_down,
                             "refused (no_hello): " + what + " before this node's gate admitted "
                             "yours (say hello to '" + std::string{gate_name} + "' first)");
    };
    return {
      [=](put_atom, const std::string& name, const caf::actor& who) -> caf::result<void> {
        if (gate && remote())
          return caf::make_error(caf::sec::request_receiver_down,
                                 "refused (role_denied): only this node registers names");
        self->monitor(who);
        (*names)[name] = who;
        return caf::unit;
      },
      [=](get_atom, const std::string& name) -> caf::result<caf::actor> {
        if (name != gate_name && stranger())
          return refused("a lookup of '" + name + "'");
        auto i = names->find(name);
        if (i == names->end())
          return caf::make_error(caf::sec::remote_lookup_failed, "no actor named '" + name + "'");
        return i->second;
      },
      [=](list_atom) -> caf::result<std::vector<std::string>> {
        if (stranger())
          return refused("a list of names");
        std::vector<std::string> out;
        for (auto& kv : *names)
          out.push_back(kv.first);
        return out;
      },
    };
  });
}

namespace {

/// Connects tried per `reach` when CAF ends the connect as `connection_timeout` (see below).
constexpr int connect_attempts = 4;

} // namespace

caf::actor spawn_cluster_resolver(caf::actor_system& sys, caf::actor own_directory,
                                  std::string own_endpoint, caf::timespan timeout,
                                  std::shared_ptr<node_gate> gate, caf::actor connector,
                                  caf::timespan defer) {
  auto mm = connector ? connector
                      : sys.has_middleman()
                          ? caf::actor_cast<caf::actor>(sys.middleman().actor_handle())
                          : caf::actor{};
  return sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    auto dirs = std::make_shared<std::map<std::string, caf::actor>>();
    self->set_down_handler([dirs, gate](const caf::down_msg& dm) {
      for (auto i = dirs->begin(); i != dirs->end();)
        if (i->second.address() == dm.source) {
          if (gate)
            gate->forget_node(i->second.node());
          i = dirs->erase(i);
        } else {
          i = std::next(i);
        }
    });
    auto ask = [=](caf::actor dir, std::string name, caf::typed_response_promise<caf::actor> rp) {
      self->request(dir, timeout, get_atom::value, name)
        .then([rp](const caf::actor& a) mutable { rp.deliver(a); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
    };
    using connect_fn = std::function<void(const std::string&, const std::string&, uint16_t,
                                          caf::typed_response_promise<caf::actor>,
                                          std::function<void(caf::actor)>, int)>;
    // Owned by the behaviour below; the callbacks that call it again die with the actor too.
    auto connect = std::make_shared<connect_fn>();
    // The directory of the node at `ep`, connected and (with a gate) admitted both ways, then
    // `then(dir)`; an error goes to `rp`.
    auto dial = [=](const std::string& ep, const std::string& host, uint16_t port,
                    caf::typed_response_promise<caf::actor> rp,
                    std::function<void(caf::actor)> then) mutable {
      if (auto i = dirs->find(ep); i != dirs->end()) {
        then(i->second);
        return;
      }
      // A node that connected here and said hello already gave its directory: use that
      // connection (a second one between the same two nodes breaks the first one under TLS, see
      // node_gate::add_endpoint). Both nodes admitted each other in that hello.
      if (gate)
        if (auto dir = gate->directory_at(ep)) {
          self->monitor(dir);
          (*dirs)[ep] = dir;
          then(dir);
          return;
        }
      if (is_client_endpoint(ep)) {
        rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                   "peer " + ep.substr(0, ep.find('.'))
                                     + " is in client mode (it accepts no connections) and has "
                                       "no connection open to this node"));
        return;
      }
      if (!mm) {
        rp.deliver(caf::make_error(caf::sec::runtime_error, "no middleman: cannot reach " + ep));
        return;
      }
      (*connect)(ep, host, port, std::move(rp), std::move(then), connect_attempts);
    };
    // Dials waiting for the other node's own dial, per endpoint (see `defer`).
    auto waiting = std::make_shared<std::map<std::string, std::vector<std::function<void()>>>>();
    auto reach = [=](const std::string& ep, const std::string& host, uint16_t port,
                     caf::typed_response_promise<caf::actor> rp,
                     std::function<void(caf::actor)> then) mutable {
      // Two nodes that dial each other at once end with two BASP connections, which breaks
      // both under TLS like a redundant one (node_gate::add_endpoint): the larger endpoint
      // lets the smaller one's dial go first, and uses the connection it brings (the gate wakes
      // this wait when its hello passed and its claim of `ep` was verified). A dial of an
      // endpoint whose claim is being verified waits for the verification too.
      auto pending = gate && gate->claim_pending(ep);
      if (gate && dirs->count(ep) == 0 && !gate->directory_at(ep) && !is_client_endpoint(ep)
          && (pending || (defer.count() > 0 && ep < own_endpoint))) {
        auto& w = (*waiting)[ep];
        w.push_back([=]() mutable { dial(ep, host, port, rp, then); });
        // A verification ends within the probe's time limit, which the connection timeout
        // bounds; the timer is a last resort.
        if (w.size() == 1)
          self->delayed_send(self, pending ? timeout : defer, hello_atom::value, ep);
        return;
      }
      dial(ep, host, port, std::move(rp), std::move(then));
    };
    auto* again = connect.get();
    *connect = [=](const std::string& ep, const std::string& host, uint16_t port,
                   caf::typed_response_promise<caf::actor> rp,
                   std::function<void(caf::actor)> then, int attempts) mutable {
      self->request(mm, timeout, caf::connect_atom::value, host, port)
        .then(
          [=](const caf::node_id&, caf::strong_actor_ptr& ptr,
              const std::set<std::string>&) mutable {
            if (!ptr) {
              rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                         "no directory published at " + ep));
              return;
            }
            auto dir = caf::actor_cast<caf::actor>(ptr);
            auto admitted = [=]() mutable {
              self->monitor(dir);
              (*dirs)[ep] = dir;
              then(dir);
            };
            if (!gate) {
              admitted();
              return;
            }
            say_hello(self, dir, gate, timeout, [=](std::string why) mutable {
              if (why.empty())
                admitted();
              else
                rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                           "node " + ep + ": " + why));
            });
          },
          [=](caf::error& e) mutable {
            // CAF 0.17's BASP broker opens a connecting context without `last_seen`, so the
            // first heartbeat tick ends it as `connection_timeout` unless the acceptor's
            // handshake came first. A slow acceptor loses that race (TLS: caf_openssl builds
            // a fresh SSL context per accepted connection, behind a backlog of other
            // connections; 5 of 10 joins failed at a node holding 64 garbage connections):
            // such a failure, which comes within one heartbeat interval, is tried again.
            if (e == caf::sec::connection_timeout && attempts > 1) {
              (*again)(ep, host, port, std::move(rp), std::move(then), attempts - 1);
              return;
            }
            rp.deliver(std::move(e));
          });
    };
    // The gate ends a wait when the awaited node's hello passed.
    if (gate)
      gate->set_resolver(caf::actor_cast<caf::actor>(self));
    return {
      // The wait for `ep` ends: its node's hello passed (and the gate verified its claim of
      // `ep`, kept or not), or `defer` is over. While the claim is being verified the wait goes
      // on: the gate wakes it when the verification ends.
      [=](hello_atom, const std::string& ep) {
        auto i = waiting->find(ep);
        if (i == waiting->end() || (gate && gate->claim_pending(ep)))
          return;
        auto dials = std::move(i->second);
        waiting->erase(i);
        for (auto& d : dials)
          d();
      },
      [=](resolve_atom, const std::string& text) mutable -> caf::result<caf::actor> {
        auto addr = peer_address::parse(text);
        if (!addr)
          return caf::make_error(caf::sec::invalid_argument, addr.error().what);
        auto rp = self->make_response_promise<caf::actor>();
        auto ep = addr->endpoint();
        if (ep == own_endpoint) {
          ask(own_directory, addr->name, rp);
          return rp;
        }
        auto name = addr->name;
        reach(ep, addr->host, addr->port, rp,
              [=](caf::actor dir) mutable { ask(dir, name, rp); });
        return rp;
      },
      [=](join_atom, const std::string& endpoint) mutable -> caf::result<caf::actor> {
        auto parsed = parse_endpoint(endpoint);
        if (!parsed)
          return caf::make_error(caf::sec::invalid_argument, parsed.error().what);
        auto rp = self->make_response_promise<caf::actor>();
        auto ep = parsed->first + ":" + std::to_string(parsed->second);
        reach(ep, parsed->first, parsed->second, rp,
              [=](caf::actor dir) mutable { rp.deliver(dir); });
        return rp;
      },
    };
  });
}

namespace {

/// Watches one remote directory; reports its loss once.
caf::behavior watcher(caf::event_based_actor* self, caf::actor target, std::string endpoint,
                      node::down_callback cb) {
  self->monitor(target);
  self->set_down_handler([=](const caf::down_msg& dm) {
    auto reason = self->system().render(dm.reason);
    if (cb)
      cb(endpoint, reason);
    self->quit();
  });
  return {[](stop_atom) {}};
}

} // namespace

namespace {

/// A port the OS picks on `host` (bound and freed at once): the name of a client-mode node
/// started without one. Nothing listens there afterwards.
result<uint16_t> free_port_name(const std::string& host) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  if (inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &a.sin_addr) != 1)
    a.sin_addr.s_addr = htonl(INADDR_ANY);
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return fail(fmt::format("no socket for a client node's name: {}", std::strerror(errno)));
  socklen_t len = sizeof a;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0
            && ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  auto err = errno;
  ::close(fd);
  if (!ok)
    return fail(fmt::format("no port on {} for a client node's name: {}", host,
                            std::strerror(err)));
  return static_cast<uint16_t>(ntohs(a.sin_port));
}

/// A node's CAF config: also the holder through which envelopes find the node's wire context.
struct node_config : caf::actor_system_config, messages::wire_context_holder {};

/// What a node of a closed run holds: the authority it trusts, its token, the run's id, and the
/// PEM certificates of its token file.
struct credentials {
  actors::auth::trust_anchor trust;
  std::string token;
  /// The token's id in hex (public; empty in an open run).
  std::string token_id;
  std::string experiment;
  std::string node_cert;
  std::string ca_cert;
};

result<credentials> load_credentials(const node_options& opts) {
  namespace auth = actors::auth;
  credentials c;
  c.experiment = opts.experiment;
  c.trust.experiment = opts.experiment;
  if (opts.authority.empty() && opts.token.empty())
    return c;
  if (opts.authority.empty() || opts.token.empty())
    return fail("a closed run needs both the authority's public key (node.authority, --authority) "
                "and this node's token (node.token, --token)");
  if (opts.key_file.empty())
    return fail("a closed run needs the node's key file (--key FILE): its token is issued for "
                "that key");
  auto authority = auth::load_public_key_file(opts.authority, auth::key_role::authority);
  if (!authority)
    return fail("node.authority: " + authority.error().what);
  auto file = auth::read_token_file(opts.token);
  if (!file)
    return fail("node.token: " + file.error().what);
  auto& t = file->content;
  c.token = file->signed_token;
  c.token_id = auth::to_hex(t.id);
  c.experiment = t.experiment;
  c.trust.authority_key = *authority;
  c.trust.experiment = t.experiment;
  auto pems = auth::pem_certificates(file->text);
  if (pems.size() >= 2) {
    c.node_cert = pems[0];
    c.ca_cert = pems[1];
  }
  return c;
}

/// Writes the TLS files caf_openssl reads (certificate, key, CA) into `dir` (mode 0700, the key
/// 0600) and points `cfg` at them. The three are set together: a CA file without a certificate
/// makes caf_openssl throw on the first connection.
status write_tls_files(const std::string& dir, const credentials& c,
                       const actors::auth::key_pair& key, caf::actor_system_config& cfg) {
  namespace auth = actors::auth;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return fail("cannot create " + dir + ": " + std::strerror(errno));
  auto cert_key = auth::certified_key(c.node_cert);
  if (!cert_key)
    return fail("node.token: its certificate: " + cert_key.error().what);
  if (*cert_key != key.public_key())
    return fail("node.token: its certificate is for another node key than this node's");
  auto pem = auth::private_key_pem(key);
  if (!pem)
    return fail(pem.error().what);
  auto cert = dir + "/node.crt", secret = dir + "/node.key.pem", ca = dir + "/ca.crt";
  if (auto st = auth::write_file_atomically(cert, c.node_cert, 0644); !st)
    return st;
  if (auto st = auth::write_file_atomically(secret, *pem, 0600); !st)
    return st;
  if (auto st = auth::write_file_atomically(ca, c.ca_cert, 0644); !st)
    return st;
  cfg.openssl_certificate = cert;
  cfg.openssl_key = secret;
  cfg.openssl_cafile = ca;
  return {};
}

} // namespace

bool node::open_run() const {
  return !gate_ || gate_->admission().open_run();
}

result<std::unique_ptr<node>>
node::start(const caf_options& caf_opts, const node_options& opts, std::string name,
            const std::function<void(caf::actor_system_config&)>& configure) {
  auto ep = parse_endpoint(opts.listen);
  if (!ep)
    return ep.error();
  std::unique_ptr<node> n{new node};
  n->name_ = std::move(name);
  n->host_ = ep->first;
  n->timeout_ = caf::timespan{caf_opts.connection_timeout};
  auto key = actors::auth::key_pair::generate();
  if (!opts.key_file.empty()) {
    auto loaded = actors::auth::load_or_create_key(opts.key_file, actors::auth::key_role::node);
    if (!loaded)
      return fail(fmt::format("node {}: {}", n->name_, loaded.error().what));
    key = std::move(loaded->key);
    n->key_created_ = loaded->created;
  }
  n->peer_id_ = key.peer_id();
  n->key_ = std::make_shared<const actors::auth::key_pair>(std::move(key));
  auto creds = load_credentials(opts);
  if (!creds)
    return fail(fmt::format("node {}: {}", n->name_, creds.error().what));
  n->experiment_ = creds->experiment;
  n->token_id_ = creds->token_id;
  actors::auth::admission_options ao;
  ao.trust = creds->trust;
  ao.key = n->key_;
  ao.token = creds->token;
  ao.protocol_version = messages::protocol_version;
  if (auto st = actors::auth::check_own_token(ao); !st)
    return fail(fmt::format("node {}: {}", n->name_, st.what()));
  n->gate_ = std::make_shared<node_gate>(std::make_shared<actors::auth::admission>(ao));
  messages::wire_options wo;
  wo.experiment = creds->experiment;
  wo.peer_id = n->peer_id_;
  // Every node has an identity, so every envelope between nodes names its sender: one without
  // could not be checked for replays.
  wo.require_sender = true;
  wo.admit = [gate = n->gate_](const std::string& sender, std::string_view kind) {
    auto refused = gate->admission().allow(sender, kind);
    return refused ? refused->line() : std::string{};
  };
  if (!creds->trust.open() && opts.sign_envelopes) {
    // A closed run signs every envelope with the node key and checks each arriving one against
    // the key its sender was admitted with: a member cannot speak for another member.
    wo.sign = [key = n->key_](std::string_view digest) { return key->sign(digest); };
    wo.verify = [gate = n->gate_](const std::string& sender, std::string_view digest,
                                  std::string_view signature) {
      auto key = gate->admission().key_of(sender);
      if (key.empty())
        return std::string{"a signed envelope from a sender this node has not admitted"};
      if (!actors::auth::verify_signature(key, digest, signature))
        return std::string{"not signed by the key its sender was admitted with (another node "
                           "speaking for it, or bytes changed on the way)"};
      return std::string{};
    };
    wo.require_signature = true;
  }
  n->wire_ = std::make_shared<messages::wire_context>(std::move(wo));
  if (!creds->trust.open()) {
    // A closed run seals its direct links: each side proves its node key, and the other must be
    // a node this gate admitted (the hello over BASP comes first: a link's token is handed out
    // only to an admitted peer).
    auto sec = std::make_shared<actors::transfer::link_security>();
    sec->key = n->key_;
    sec->experiment = creds->experiment;
    sec->admit = [gate = n->gate_](const std::string& peer_id) {
      auto refused = gate->admission().allow_any(peer_id);
      return refused ? refused->line() : std::string{};
    };
    n->link_security_ = std::move(sec);
  }
  auto cfg = std::make_unique<node_config>();
  cfg->wire = n->wire_;
  n->cfg_ = std::move(cfg);
  configure_system(*n->cfg_, caf_opts, true);
  n->tls_ = !creds->trust.open() && opts.tls;
  if (n->tls_) {
    if (creds->node_cert.empty())
      return fail(fmt::format("node {}: node.token {} carries no certificates (a token file "
                              "written by `starling token issue` has them); set node.tls: false "
                              "to run without encryption",
                              n->name_, opts.token));
    // Beside the key file (a closed run always has one: its token names that key).
    auto slash = opts.key_file.rfind('/');
    auto dir = (slash == std::string::npos ? std::string{"."} : opts.key_file.substr(0, slash))
               + "/tls";
    if (auto st = write_tls_files(dir, *creds, *n->key_, *n->cfg_); !st)
      return fail(fmt::format("node {}: {}", n->name_, st.what()));
    n->cfg_->load<caf::openssl::manager>();
    if (!openssl_errors_guarded())
      log(log_level::warning, "node",
          "{}: TLS I/O calls do not clear OpenSSL's error queue (runtime/node/openssl_errors.hpp):"
          " a connection that fails its handshake can break this node's other connections",
          n->name_);
  }
  if (configure)
    configure(*n->cfg_);
  // Claims of endpoints in hellos are verified by a probe of that endpoint, which ends well
  // within the connector's wait for its answer (the connection timeout). Set before the
  // gate can get a hello.
  probe_options probe;
  if (n->timeout_.count() > 0)
    probe.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::min<caf::timespan>(n->timeout_ * 3 / 5, std::chrono::seconds(5)));
  if (n->tls_) {
    probe.certificate = n->cfg_->openssl_certificate;
    probe.key = n->cfg_->openssl_key;
    probe.cafile = n->cfg_->openssl_cafile;
  }
  n->gate_->set_probe_options(std::move(probe));
  n->sys_ = std::make_unique<caf::actor_system>(*n->cfg_);
  n->directory_ = std::make_unique<caf::actor>(spawn_directory(*n->sys_, n->gate_));
  // Registered before the directory is published: the first connection finds it.
  auto gate = spawn_gate(*n->sys_, n->gate_);
  n->gate_->set_own_gate(gate);
  n->register_actor(gate_name, gate);
  if (opts.client) {
    // Client mode: nothing listens. The endpoint only names the node (the port a volunteer's
    // reachability check used, or one the OS picks and frees at once); the nodes this one
    // reaches answer over the connections it opened, and its hellos claim no endpoint.
    auto name_port = ep->second != 0 ? ep->second : free_port_name(n->host_);
    if (!name_port)
      return fail(fmt::format("node {}: {}", n->name_, name_port.error().what));
    n->port_ = *name_port;
    n->listening_ = false;
  } else {
    auto port = n->tls_
                  ? caf::openssl::publish(*n->directory_, ep->second, n->host_.c_str(), true)
                  : n->sys_->middleman().publish(*n->directory_, ep->second, n->host_.c_str(),
                                                 true);
    if (!port) {
      auto why = n->sys_->render(port.error());
      n->shutdown();
      return fail(fmt::format("cannot listen on {}: {}", opts.listen, why));
    }
    n->port_ = *port;
  }
  if (!opts.advertise.empty()) {
    auto adv = parse_endpoint(opts.advertise);
    if (!adv || adv->second == 0) {
      n->shutdown();
      return fail(fmt::format("node {}: the advertised endpoint '{}' is not HOST:PORT with a "
                              "port in [1, 65535]",
                              n->name_, opts.advertise));
    }
    n->advertised_ = fmt::format("{}:{}", adv->first, adv->second);
  }
  n->gate_->set_own_directory(n->endpoint(), *n->directory_, n->listening_);
  if (opts.data_endpoint && actors::transfer::check_listen_host(n->host_).ok()) {
    actors::transfer::data_channel_options dopts;
    dopts.host = opts.client ? std::string{} : n->host_;
    dopts.security = n->link_security_;
    dopts.congestion_control =
      opts.congestion_control == "system" ? std::string{} : opts.congestion_control;
    auto data = actors::transfer::data_endpoint::open(dopts);
    if (!data) {
      n->shutdown();
      return fail(fmt::format("node {}: {}", n->name_, data.error().what));
    }
    n->data_ = std::move(*data);
    auto links = n->data_->link_layer();
    if (!dopts.congestion_control.empty() && links->congestion_control().empty())
      log(log_level::warning, "node", "{}: {}", n->name_, links->last_error());
  }
  auto connector =
    n->tls_ ? caf::actor_cast<caf::actor>(n->sys_->openssl_manager().actor_handle())
            : caf::actor{};
  // Under TLS two connections between two nodes break both (node_gate::add_endpoint): a node
  // lets a smaller endpoint's dial go first for a while (a TLS handshake and the hello take
  // ~15 ms on loopback).
  auto defer = n->tls_ && n->listening_ ? std::min<caf::timespan>(n->timeout_ / 5, std::chrono::milliseconds(200))
                       : caf::timespan{0};
  n->resolver_ = std::make_unique<caf::actor>(spawn_cluster_resolver(
    *n->sys_, *n->directory_, n->endpoint(), n->timeout_, n->gate_, connector, defer));
  return n;
}

node::~node() {
  shutdown();
}

caf::actor_system& node::system() {
  return *sys_;
}

std::string node::endpoint() const {
  if (!listening_) // client mode: named by its peer id (gate.hpp)
    return client_endpoint(peer_id_);
  if (!advertised_.empty())
    return advertised_;
  return fmt::format("{}:{}", host_, port_);
}

caf::actor node::directory() const {
  return *directory_;
}

caf::actor node::resolver() const {
  return *resolver_;
}

caf::actor node::spawn_transfer_receiver(caf::actor sink,
                                         actors::transfer::receiver_options opts) {
  auto h = actors::transfer::spawn_direct_receiver(*sys_, std::move(sink), data_, opts);
  owned_.push_back(h);
  return h;
}

caf::actor node::spawn_transfer_sender(actors::transfer::direct_sender_options opts) {
  if (!opts.endpoint)
    opts.endpoint = data_; // the node's link pool
  auto h = actors::transfer::spawn_direct_sender(*sys_, opts);
  owned_.push_back(h);
  return h;
}

void node::register_actor(const std::string& name, const caf::actor& handle) {
  caf::anon_send(*directory_, put_atom::value, name, handle);
  owned_.push_back(handle);
}

result<caf::actor> node::join(const std::string& endpoint, down_callback cb) {
  auto ep = parse_endpoint(endpoint);
  if (!ep)
    return ep.error();
  caf::scoped_actor self{*sys_};
  caf::actor dir;
  std::string why;
  // The resolver's own timeouts answer within the connection timeout; the margin covers the
  // three requests of the hello.
  self->request(*resolver_, timeout_ * 4, join_atom::value, endpoint)
    .receive([&](const caf::actor& d) { dir = d; },
             [&](caf::error& e) { why = sys_->render(e); });
  if (!dir)
    return fail(fmt::format("cannot join {}: {}", endpoint, why));
  owned_.push_back(sys_->spawn(watcher, dir, endpoint, std::move(cb)));
  return dir;
}

void node::shutdown() {
  if (stopped_ || !sys_)
    return;
  stopped_ = true;
  for (auto& a : owned_)
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  owned_.clear();
  if (resolver_)
    caf::anon_send_exit(*resolver_, caf::exit_reason::user_shutdown);
  if (directory_) {
    if (port_ != 0 && listening_)
      sys_->middleman().unpublish(*directory_, port_);
    caf::anon_send_exit(*directory_, caf::exit_reason::user_shutdown);
  }
  // The endpoint's threads hold sink handles: they must end before the actor system does.
  if (data_)
    data_->stop();
  data_.reset();
  // Wait for the node's actors (all told to exit) while the system, the directory and the
  // resolver still exist: one may still be inside a handler that uses them, e.g. a supervisor
  // spawning a role whose start (a volunteer's codebook fit, ~10 s) a SIGINT interrupted; it
  // calls system() on return. `sys_.reset()` nulls the pointer before ~actor_system waits, so
  // that call dereferenced null (SIGSEGV in actor_system::spawn_impl).
  sys_->await_all_actors_done();
  directory_.reset();
  resolver_.reset();
  sys_.reset();
  cfg_.reset();
}

} // namespace starling::runtime
