#include "runtime/node/node.hpp"

#include <map>
#include <set>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/auth/identity.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"
#include "messages/wire_context.hpp"
#include "runtime/log/log.hpp"
#include "runtime/node/address.hpp"

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

caf::actor spawn_directory(caf::actor_system& sys) {
  return sys.spawn([](caf::event_based_actor* self) -> caf::behavior {
    auto names = std::make_shared<std::map<std::string, caf::actor>>();
    // Entries disappear with their actors, so a lookup never returns a dead handle.
    self->set_down_handler([names](const caf::down_msg& dm) {
      for (auto i = names->begin(); i != names->end();)
        i = i->second.address() == dm.source ? names->erase(i) : std::next(i);
    });
    return {
      [=](put_atom, const std::string& name, const caf::actor& who) {
        self->monitor(who);
        (*names)[name] = who;
      },
      [=](get_atom, const std::string& name) -> caf::result<caf::actor> {
        auto i = names->find(name);
        if (i == names->end())
          return caf::make_error(caf::sec::remote_lookup_failed, "no actor named '" + name + "'");
        return i->second;
      },
      [=](list_atom) {
        std::vector<std::string> out;
        for (auto& kv : *names)
          out.push_back(kv.first);
        return out;
      },
    };
  });
}

caf::actor spawn_cluster_resolver(caf::actor_system& sys, caf::actor own_directory,
                                  std::string own_endpoint, caf::timespan timeout) {
  auto mm = sys.has_middleman() ? caf::actor_cast<caf::actor>(sys.middleman().actor_handle())
                                : caf::actor{};
  return sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    auto dirs = std::make_shared<std::map<std::string, caf::actor>>();
    self->set_down_handler([dirs](const caf::down_msg& dm) {
      for (auto i = dirs->begin(); i != dirs->end();)
        i = i->second.address() == dm.source ? dirs->erase(i) : std::next(i);
    });
    auto ask = [=](caf::actor dir, std::string name, caf::typed_response_promise<caf::actor> rp) {
      self->request(dir, timeout, get_atom::value, name)
        .then([rp](const caf::actor& a) mutable { rp.deliver(a); },
              [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
    };
    return {
      [=](resolve_atom, const std::string& text) -> caf::result<caf::actor> {
        auto addr = peer_address::parse(text);
        if (!addr)
          return caf::make_error(caf::sec::invalid_argument, addr.error().what);
        auto rp = self->make_response_promise<caf::actor>();
        auto ep = addr->endpoint();
        if (ep == own_endpoint) {
          ask(own_directory, addr->name, rp);
          return rp;
        }
        if (auto i = dirs->find(ep); i != dirs->end()) {
          ask(i->second, addr->name, rp);
          return rp;
        }
        if (!mm)
          return caf::make_error(caf::sec::runtime_error, "no middleman: cannot reach " + ep);
        self->request(mm, timeout, caf::connect_atom::value, addr->host, addr->port)
          .then(
            [=](const caf::node_id&, caf::strong_actor_ptr& ptr,
                const std::set<std::string>&) mutable {
              if (!ptr) {
                rp.deliver(caf::make_error(caf::sec::cannot_connect_to_node,
                                           "no directory published at " + ep));
                return;
              }
              auto dir = caf::actor_cast<caf::actor>(ptr);
              self->monitor(dir);
              (*dirs)[ep] = dir;
              ask(dir, addr->name, rp);
            },
            [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
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

/// A node's CAF config: also the holder through which envelopes find the node's wire context.
struct node_config : caf::actor_system_config, messages::wire_context_holder {};

} // namespace

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
  n->key_ = std::make_unique<actors::auth::key_pair>(std::move(key));
  messages::wire_options wo;
  wo.experiment = opts.experiment;
  wo.peer_id = n->peer_id_;
  // Every node has an identity, so every envelope between nodes names its sender: one without
  // could not be checked for replays.
  wo.require_sender = true;
  n->wire_ = std::make_shared<messages::wire_context>(std::move(wo));
  auto cfg = std::make_unique<node_config>();
  cfg->wire = n->wire_;
  n->cfg_ = std::move(cfg);
  configure_system(*n->cfg_, caf_opts, true);
  if (configure)
    configure(*n->cfg_);
  n->sys_ = std::make_unique<caf::actor_system>(*n->cfg_);
  n->directory_ = std::make_unique<caf::actor>(spawn_directory(*n->sys_));
  auto port = n->sys_->middleman().publish(*n->directory_, ep->second, n->host_.c_str(), true);
  if (!port) {
    auto why = n->sys_->render(port.error());
    n->shutdown();
    return fail(fmt::format("cannot listen on {}: {}", opts.listen, why));
  }
  n->port_ = *port;
  if (opts.data_endpoint && actors::transfer::check_listen_host(n->host_).ok()) {
    actors::transfer::data_channel_options dopts;
    dopts.host = n->host_;
    auto data = actors::transfer::data_endpoint::open(dopts);
    if (!data) {
      n->shutdown();
      return fail(fmt::format("node {}: {}", n->name_, data.error().what));
    }
    n->data_ = std::move(*data);
  }
  n->resolver_ = std::make_unique<caf::actor>(
    spawn_cluster_resolver(*n->sys_, *n->directory_, n->endpoint(), n->timeout_));
  return n;
}

node::~node() {
  shutdown();
}

caf::actor_system& node::system() {
  return *sys_;
}

std::string node::endpoint() const {
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
  auto dir = sys_->middleman().remote_actor(ep->first, ep->second);
  if (!dir)
    return fail(fmt::format("cannot join {}: {}", endpoint, sys_->render(dir.error())));
  owned_.push_back(sys_->spawn(watcher, *dir, endpoint, std::move(cb)));
  return *dir;
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
    if (port_ != 0)
      sys_->middleman().unpublish(*directory_, port_);
    caf::anon_send_exit(*directory_, caf::exit_reason::user_shutdown);
  }
  // The endpoint's threads hold sink handles: they must end before the actor system does.
  if (data_)
    data_->stop();
  data_.reset();
  directory_.reset();
  resolver_.reset();
  sys_.reset(); // waits for the node's actors, which have all been told to exit
  cfg_.reset();
}

} // namespace starling::runtime
