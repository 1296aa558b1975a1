#include "runtime/sim/world.hpp"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <limits>
#include <sstream>
#include <stdexcept>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <nlohmann/json.hpp>

#include "actors/auth/admission.hpp"
#include "messages/atoms.hpp"
#include "messages/wire.hpp"
#include "runtime/node/address.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime::sim {

namespace {

/// A cell of a node-pair matrix whose rows grow on demand (`world::greeted_`, `greet_due_`).
bool cell(const std::vector<std::vector<bool>>& m, size_t a, size_t b) {
  return a < m.size() && b < m[a].size() && m[a][b];
}

/// Sets a cell, growing its row to at least `width` (the node count) so that it grows rarely.
void set_cell(std::vector<std::vector<bool>>& m, size_t a, size_t b, size_t width, bool v) {
  if (!v && !cell(m, a, b))
    return;
  if (m.size() <= a)
    m.resize(a + 1);
  if (m[a].size() <= b)
    m[a].resize(std::max(b + 1, width), false);
  m[a][b] = v;
}

const char* drop_name(drop_reason r) {
  switch (r) {
    case drop_reason::loss:
      return "loss";
    case drop_reason::partition:
      return "partition";
    case drop_reason::node_down:
      return "node_down";
    default:
      return "none";
  }
}

/// Counts the bytes CAF's binary serializer would write, without writing them: what a message
/// weighs on a simulated link. Mirrors `caf::serializer_impl` (varbyte sequence sizes, network
/// order integers, IEEE-754 floats); raw bytes (tensor payloads, modeled state bytes) are
/// counted, not copied, so a measure costs no more than walking the message.
class byte_counter final : public caf::serializer {
public:
  explicit byte_counter(caf::actor_system& sys) : caf::serializer(sys) {
    // nop
  }

  uint64_t bytes() const noexcept { return bytes_; }

  caf::error begin_object(uint16_t& nr, std::string& name) override {
    if (nr != 0)
      return apply(nr);
    if (auto err = apply(nr))
      return err;
    return apply(name);
  }

  caf::error end_object() override { return caf::none; }

  caf::error begin_sequence(size_t& size) override {
    auto x = static_cast<uint32_t>(size);
    bytes_ += 1;
    while (x > 0x7f) {
      bytes_ += 1;
      x >>= 7;
    }
    return caf::none;
  }

  caf::error end_sequence() override { return caf::none; }

  caf::error apply_raw(size_t num_bytes, void*) override {
    bytes_ += num_bytes;
    return caf::none;
  }

protected:
  caf::error apply_impl(int8_t&) override { return add(1); }
  caf::error apply_impl(uint8_t&) override { return add(1); }
  caf::error apply_impl(int16_t&) override { return add(2); }
  caf::error apply_impl(uint16_t&) override { return add(2); }
  caf::error apply_impl(int32_t&) override { return add(4); }
  caf::error apply_impl(uint32_t&) override { return add(4); }
  caf::error apply_impl(int64_t&) override { return add(8); }
  caf::error apply_impl(uint64_t&) override { return add(8); }
  caf::error apply_impl(float&) override { return add(4); }
  caf::error apply_impl(double&) override { return add(8); }
  caf::error apply_impl(long double& x) override {
    // As serializer_impl: long double travels as its decimal text.
    std::ostringstream oss;
    oss << std::setprecision(std::numeric_limits<long double>::digits) << x;
    auto text = oss.str();
    return apply_impl(text);
  }
  caf::error apply_impl(std::string& x) override { return text(x.size(), 1); }
  caf::error apply_impl(std::u16string& x) override { return text(x.size(), 2); }
  caf::error apply_impl(std::u32string& x) override { return text(x.size(), 4); }

private:
  caf::error add(uint64_t n) {
    bytes_ += n;
    return caf::none;
  }

  caf::error text(size_t count, uint64_t width) {
    if (auto err = begin_sequence(count))
      return err;
    return add(count * width);
  }

  uint64_t bytes_ = 0;
};

/// "Actor `target` as seen from node `from`": relays every message to the target through the
/// network model, replacing the sender by the sender as seen from the target's node, and keeping
/// the message id so that responses find their requests. Keeps no per-request state.
/// Overrides `consume`, which CAF 0.17.6 marks internal (recheck on any CAF upgrade).
class link_proxy : public caf::event_based_actor {
public:
  link_proxy(caf::actor_config& cfg, world* w, int from, int to, caf::actor target)
    : caf::event_based_actor(cfg), world_(w), from_(from), to_(to), target_(std::move(target)) {
    // nop
  }

  caf::behavior make_behavior() override {
    monitor(target_);
    // A behavior only so the actor stays alive; `consume` handles every message.
    return {[](stop_atom) {}};
  }

  caf::invoke_message_result consume(caf::mailbox_element& x) override {
    auto& content = x.content();
    if (content.match_elements<caf::down_msg>()) {
      auto& dm = content.get_as<caf::down_msg>(0);
      if (dm.source == target_.address()) {
        quit(dm.reason);
        return caf::invoke_message_result::consumed;
      }
    }
    if (content.match_elements<caf::exit_msg>()) {
      quit(content.get_as<caf::exit_msg>(0).reason);
      return caf::invoke_message_result::consumed;
    }
    auto msg = x.move_content_to_message();
    uint64_t bytes = 0;
    std::string error;
    const auto& from_name = world_->node(from_).name();
    const auto& to_name = world_->node(to_).name();
    if (!world_->serialized_size(msg, bytes, error)) {
      world_->record("unserializable", from_name, to_name, 0, error);
      if (x.mid.is_request() && x.sender) {
        // A message that cannot cross a node boundary is a bug: fail the request at once.
        auto err = caf::make_error(caf::sec::unknown_type, error);
        x.sender->enqueue(caf::make_mailbox_element(nullptr, x.mid.response_id(), {},
                                                    caf::make_message(std::move(err))),
                          context());
      }
      return caf::invoke_message_result::consumed;
    }
    world_->greet_if_due(from_, to_);
    if (auto why = world_->admits(to_, from_); !why.empty()) {
      // As a live node's envelope check: counted by the receiver's gate, a request answered.
      world_->record("refused", from_name, to_name, bytes, why);
      if (x.mid.is_request() && x.sender)
        x.sender->enqueue(caf::make_mailbox_element(
                            nullptr, x.mid.response_id(), {},
                            caf::make_message(caf::make_error(caf::sec::request_receiver_down,
                                                              "unauthorized: " + why))),
                          context());
      return caf::invoke_message_result::consumed;
    }
    if (!world_->passes_firewall(from_, to_)) {
      // The firewalled node accepts no connection: as a dial that nobody answers.
      world_->record("unsolicited", from_name, to_name, bytes, world_->type_names(msg));
      if (x.mid.is_request() && x.sender)
        x.sender->enqueue(caf::make_mailbox_element(
                            nullptr, x.mid.response_id(), {},
                            caf::make_message(caf::make_error(
                              caf::sec::cannot_connect_to_node,
                              "the node accepts no connection (network.firewalled)"))),
                          context());
      return caf::invoke_message_result::consumed;
    }
    auto now = clock().now();
    auto r = world_->network().transfer(from_, to_, bytes, world_->elapsed().count());
    if (!world_->node(to_).alive())
      r.reason = drop_reason::node_down;
    if (r.reason != drop_reason::none) {
      if (world_->trace_messages())
        world_->record("drop", from_name, to_name, bytes,
                     std::string{drop_name(r.reason)} + " " + world_->type_names(msg));
      return caf::invoke_message_result::consumed;
    }
    caf::strong_actor_ptr sender = x.sender;
    if (sender) {
      auto sender_node = world_->node_of(sender->address());
      if (sender_node >= 0 && sender_node != to_)
        sender = caf::actor_cast<caf::strong_actor_ptr>(
          world_->proxy(to_, caf::actor_cast<caf::actor>(sender), false));
    }
    if (world_->trace_messages())
      world_->record("send", from_name, to_name, bytes,
                     std::to_string(r.arrival_ns) + " " + world_->type_names(msg));
    auto due = now + std::chrono::nanoseconds{r.arrival_ns - world_->elapsed().count()};
    clock().schedule_message(due, caf::actor_cast<caf::strong_actor_ptr>(target_),
                             caf::make_mailbox_element(std::move(sender), x.mid,
                                                       std::move(x.stages), std::move(msg)));
    return caf::invoke_message_result::consumed;
  }

private:
  world* world_;
  int from_;
  int to_;
  caf::actor target_;
};

/// The simulated resolver of one node: answers from the world's registry with link proxies.
caf::behavior sim_resolver(caf::event_based_actor* self, world* w, int from) {
  return {
    [=](resolve_atom, const std::string& address) -> caf::result<caf::actor> {
      auto r = w->resolve(from, address);
      if (!r)
        return std::move(r.error());
      return *r;
    },
  };
}

} // namespace

// -- sim_node ---------------------------------------------------------------------------------

sim_node::sim_node(world* w, std::string name, int index, std::string identity)
  : world_(w), name_(std::move(name)), index_(index), identity_(std::move(identity)) {
  // nop
}

std::string sim_node::endpoint() const {
  return name_ + ":1";
}

void sim_node::adopt(const std::string& name, const caf::actor& a) {
  world_->track(index_, a);
  actors_.push_back(a);
  if (!name.empty())
    named_[name] = a;
}

void sim_node::on_start(std::function<void(sim_node&)> hook) {
  hooks_.push_back(hook);
  if (alive_)
    hook(*this);
}

caf::actor sim_node::lookup(const std::string& name) const {
  auto i = named_.find(name);
  return i == named_.end() ? caf::actor{} : i->second;
}

// -- world ------------------------------------------------------------------------------------

world::world(world_options opts)
  : opts_(std::move(opts)),
    net_(opts_.network.defaults, opts_.seed ^ 0x9e3779b97f4a7c15ULL),
    rng_(opts_.seed),
    gate_rng_(opts_.seed ^ 0x6a7e6a7e6a7e6a7eULL) {
  if (!opts_.trace_path.empty()) {
    trace_out_ = std::make_unique<std::ofstream>(opts_.trace_path, std::ios::trunc);
    if (!*trace_out_) {
      trace_error_ = "cannot write " + opts_.trace_path;
      trace_out_.reset();
    }
  }
  cfg_ = std::make_unique<caf::actor_system_config>();
  caf_options caf_opts;
  configure_system(*cfg_, caf_opts, false);
  if (opts_.configure)
    opts_.configure(*cfg_);
  cfg_->set("scheduler.policy", caf::atom("testing"));
  cfg_->set("logger.inline-output", true);
  sys_ = std::make_unique<caf::actor_system>(*cfg_);
  start_ = sched().clock().now();
}

world::~world() {
  for (auto& n : nodes_) {
    for (auto& a : n->actors_)
      caf::anon_send_exit(a, caf::exit_reason::kill);
    if (n->resolver_)
      caf::anon_send_exit(n->resolver_, caf::exit_reason::kill);
  }
  for (auto& kv : proxies_)
    caf::anon_send_exit(kv.second, caf::exit_reason::kill);
  proxies_.clear();
  sched().run();
  // Pending delayed messages and request timeouts hold references; drop them before teardown.
  sched().clock().cancel_all();
  sched().run();
  for (auto& n : nodes_) {
    n->actors_.clear();
    n->named_.clear();
    n->resolver_ = nullptr;
  }
  sys_.reset();
}

caf::scheduler::test_coordinator& world::sched() {
  return dynamic_cast<caf::scheduler::test_coordinator&>(sys_->scheduler());
}

bool world::passes_firewall(int from, int to) {
  if (firewalled_.empty())
    return true; // every simulated message asks: most runs have no firewall
  if (firewalled_.count(from) > 0)
    opened_.emplace(from, to);
  if (firewalled_.count(to) == 0 || opened_.count({to, from}) > 0)
    return true;
  ++unsolicited_;
  return false;
}

sim_node& world::add_node(const std::string& name) {
  if (by_name_.count(name) > 0)
    throw std::invalid_argument("duplicate simulated node name: " + name);
  auto index = static_cast<int>(nodes_.size());
  // The identity is derived from the seed so that replays name nodes identically.
  std::mt19937_64 gen{opts_.seed * 1000003ULL + static_cast<uint64_t>(index)};
  auto identity = fmt::format("{:016x}{:016x}", gen(), gen());
  nodes_.emplace_back(new sim_node(this, name, index, identity));
  auto& n = *nodes_.back();
  by_name_.emplace(name, index);
  by_endpoint_.emplace(n.endpoint(), index);
  for (auto& f : opts_.network.firewalled)
    if (f == name)
      firewalled_.insert(index);
  for (auto& l : opts_.network.links) {
    for (auto& other : nodes_) {
      if (l.from == name && l.to == other->name())
        net_.set_link(index, other->index(), l.link);
      if (l.to == name && l.from == other->name())
        net_.set_link(other->index(), index, l.link);
    }
  }
  start_node(n);
  return n;
}

void world::reset_gate(int index) {
  if (!opts_.gate)
    return;
  auto i = static_cast<size_t>(index);
  if (gates_.size() <= i)
    gates_.resize(i + 1);
  actors::auth::admission_options o;
  o.key = std::make_shared<const actors::auth::key_pair>(node_key(i));
  o.protocol_version = messages::protocol_version;
  o.clock = [this] { return now_ns(); };
  o.random = [this](uint8_t* p, size_t n) {
    for (size_t k = 0; k < n; ++k)
      p[k] = static_cast<uint8_t>(gate_rng_());
  };
  if (opts_.closed) {
    if (!authority_)
      authority_ = std::make_unique<actors::auth::key_pair>(
        actors::auth::key_pair::from_test_seed(opts_.seed * 1000003ULL + 0xa07));
    o.trust.authority_key = authority_->public_key();
    o.trust.experiment = experiment();
    // A token per start of the node, as a volunteer's client would fetch one.
    actors::auth::token t;
    t.id.resize(16);
    for (auto& c : t.id)
      c = static_cast<char>(gate_rng_());
    t.peer_key = o.key->public_key();
    t.roles = {"any"};
    t.experiment = experiment();
    t.issued_at_ns = std::max<int64_t>(0, now_ns());
    t.expires_at_ns = t.issued_at_ns + std::max<int64_t>(1, opts_.token_lifetime.count());
    auto signed_token = actors::auth::encode_token(t, *authority_);
    if (!signed_token)
      throw std::runtime_error("sim: cannot issue node " + std::to_string(i)
                               + "'s token: " + signed_token.error().what);
    o.token = std::move(*signed_token);
  }
  gates_[i] = std::make_unique<actors::auth::admission>(std::move(o));
  if (!deny_signed_.empty())
    (void) gates_[i]->update_deny_list(deny_signed_); // the list in force, as a gate gets it
  // The node's new process has greeted nobody, and nobody has greeted it.
  for (auto* pairs : {&greeted_, &greet_due_}) {
    if (i < pairs->size())
      (*pairs)[i].clear();
    for (auto& row : *pairs)
      if (i < row.size())
        row[i] = false;
  }
}

actors::auth::key_pair world::node_key(size_t index) const {
  return actors::auth::key_pair::from_test_seed(opts_.seed * 1000003ULL + index + 0x5eed);
}

std::string world::experiment() const {
  return "sim-" + std::to_string(opts_.seed);
}

std::string world::ban(const std::string& name, const std::string& reason) {
  if (!opts_.gate || !opts_.closed || !authority_)
    return "ban: an open run has no authority to sign a deny list (world_options::closed)";
  auto it = by_name_.find(name);
  if (it == by_name_.end())
    return "ban: no node '" + name + "'";
  auto index = static_cast<size_t>(it->second);
  actors::auth::deny_entry e;
  e.kind = actors::auth::deny_entry::kind_t::peer;
  e.id = node_key(index).public_key();
  e.reason = reason;
  e.added_at_ns = now_ns();
  auto next = deny_;
  next.experiment = experiment();
  next.serial = deny_.serial + 1;
  next.issued_at_ns = now_ns();
  next.entries.push_back(e);
  auto list = actors::auth::encode_deny_list(next, *authority_);
  if (!list)
    return "ban: " + list.error().what;
  deny_ = std::move(next);
  deny_signed_ = std::move(*list);
  for (size_t g = 0; g < gates_.size(); ++g)
    if (gates_[g]) {
      auto removed = gates_[g]->update_deny_list(deny_signed_);
      if (!removed)
        return "ban: node " + std::to_string(g) + "'s gate refused the list: "
               + removed.error().line();
    }
  record("ban", name, "", 0, reason);
  return {};
}

actors::auth::admission* world::gate(int index) {
  if (!opts_.gate || index < 0 || static_cast<size_t>(index) >= gates_.size())
    return nullptr;
  return gates_[static_cast<size_t>(index)].get();
}

std::string world::say_hello(int from, int to) {
  if (!opts_.gate || from == to)
    return {};
  auto f = static_cast<size_t>(from), t = static_cast<size_t>(to);
  if (cell(greeted_, f, t))
    return {};
  if (auto why = actors::auth::handshake(*gates_[f], *gates_[t]); !why.empty())
    return why;
  set_cell(greeted_, f, t, nodes_.size(), true);
  set_cell(greeted_, t, f, nodes_.size(), true);
  if (opts_.trace_messages)
    record("hello", nodes_[f]->name(), nodes_[t]->name(), 0, "admitted both ways");
  return {};
}

std::string world::admits(int to, int from) {
  if (!opts_.gate || from == to)
    return {};
  auto& b = *gates_[static_cast<size_t>(to)];
  auto refused = b.allow_any(gates_[static_cast<size_t>(from)]->peer_id());
  return refused ? refused->line() : std::string{};
}

void world::start_node(sim_node& n) {
  reset_gate(n.index());
  n.alive_ = true;
  n.resolver_ = sys_->spawn(sim_resolver, this, n.index());
  track(n.index(), n.resolver_);
  for (auto& h : n.hooks_)
    h(n);
}

sim_node& world::node(const std::string& name) {
  if (auto i = by_name_.find(name); i != by_name_.end())
    return *nodes_[static_cast<size_t>(i->second)];
  throw std::out_of_range("no simulated node named " + name);
}

sim_node& world::node(int index) {
  return *nodes_.at(static_cast<size_t>(index));
}

int world::node_of(const caf::actor_addr& a) const {
  auto id = a.id();
  return id < actor_node_.size() ? actor_node_[id] : -1;
}

void world::track(int node, const caf::actor& a) {
  auto id = a.id();
  if (actor_node_.size() <= id)
    actor_node_.resize(std::max<size_t>(id + 1, actor_node_.size() * 2), -1);
  actor_node_[id] = node;
}

int64_t world::now_ns() const {
  auto& self = const_cast<world&>(*this);
  return std::chrono::duration_cast<std::chrono::nanoseconds>(self.sched().clock().now() - start_)
    .count();
}

std::chrono::nanoseconds world::elapsed() const {
  return std::chrono::nanoseconds{now_ns()};
}

void world::run() {
  sched().run();
}

void world::apply_due_faults() {
  while (!pending_.empty() && pending_.begin()->first <= now_ns()) {
    auto action = std::move(pending_.begin()->second.second);
    pending_.erase(pending_.begin());
    action();
    sched().run();
  }
}

void world::run_for(std::chrono::nanoseconds d) {
  auto target = now_ns() + d.count();
  for (;;) {
    sched().run();
    apply_due_faults();
    auto& clk = sched().clock();
    int64_t next = INT64_MAX;
    if (clk.has_pending_timeout())
      next = std::chrono::duration_cast<std::chrono::nanoseconds>(
               clk.schedule().begin()->first - start_)
               .count();
    if (!pending_.empty())
      next = std::min(next, pending_.begin()->first);
    if (next == INT64_MAX || next > target)
      break;
    auto now = now_ns();
    if (next > now)
      clk.advance_time(std::chrono::nanoseconds{next - now});
    else if (clk.has_pending_timeout()
             && clk.schedule().begin()->first <= clk.now())
      clk.trigger_timeout();
  }
  auto now = now_ns();
  if (target > now)
    sched().clock().advance_time(std::chrono::nanoseconds{target - now});
  sched().run();
  apply_due_faults();
}

bool world::run_until(const std::function<bool()>& pred, std::chrono::nanoseconds limit) {
  auto deadline = now_ns() + limit.count();
  // One job at a time, so that the predicate sees every intermediate state.
  auto drain = [&] {
    while (sched().try_run_once())
      if (pred())
        return true;
    return false;
  };
  for (;;) {
    if (pred() || drain())
      return true;
    apply_due_faults();
    if (pred() || drain())
      return true;
    auto& clk = sched().clock();
    int64_t next = INT64_MAX;
    if (clk.has_pending_timeout())
      next = std::chrono::duration_cast<std::chrono::nanoseconds>(
               clk.schedule().begin()->first - start_)
               .count();
    if (!pending_.empty())
      next = std::min(next, pending_.begin()->first);
    auto now = now_ns();
    if (next == INT64_MAX || next > deadline) {
      if (deadline > now)
        clk.advance_time(std::chrono::nanoseconds{deadline - now});
      return pred() || drain();
    }
    if (next > now)
      clk.advance_time(std::chrono::nanoseconds{next - now});
    else if (clk.has_pending_timeout() && clk.schedule().begin()->first <= clk.now())
      clk.trigger_timeout();
  }
}

void world::kill_node(const std::string& name, std::chrono::nanoseconds restart_after) {
  auto& n = node(name);
  if (!n.alive_)
    return;
  n.alive_ = false;
  record("kill_node", name, "", 0,
         restart_after.count() >= 0 ? fmt::format("restart in {} ns", restart_after.count())
                                    : "no restart");
  for (auto& a : n.actors_)
    caf::anon_send_exit(a, caf::exit_reason::kill);
  caf::anon_send_exit(n.resolver_, caf::exit_reason::kill);
  // Proxies held on behalf of the node's actors die with it.
  for (auto i = proxies_.begin(); i != proxies_.end();) {
    if (i->first.first == n.index()) {
      caf::anon_send_exit(i->second, caf::exit_reason::kill);
      i = proxies_.erase(i);
    } else {
      ++i;
    }
  }
  n.actors_.clear();
  n.named_.clear();
  n.resolver_ = nullptr;
  net_.reset_node(n.index());
  sched().run();
  if (restart_after.count() >= 0)
    at(elapsed() + restart_after, "restart " + name, [this, name] { restart_node(name); });
}

void world::restart_node(const std::string& name) {
  auto& n = node(name);
  if (n.alive_)
    return;
  record("restart_node", name, "", 0, "");
  start_node(n);
  sched().run();
}

void world::kill_actor(const std::string& node_name, const std::string& actor) {
  auto& n = node(node_name);
  auto a = n.lookup(actor);
  if (!a)
    return;
  record("kill_actor", node_name, actor, 0, "");
  caf::anon_send_exit(a, caf::exit_reason::kill);
  n.named_.erase(actor);
  sched().run();
}

void world::partition(const std::string& a, const std::string& b) {
  record("partition", a, b, 0, "");
  net_.partition(node(a).index(), node(b).index());
}

void world::heal(const std::string& a, const std::string& b) {
  record("heal", a, b, 0, "");
  net_.heal(node(a).index(), node(b).index());
}

void world::at(std::chrono::nanoseconds when, std::string what, std::function<void()> action) {
  pending_.emplace(when.count(), std::make_pair(std::move(what), std::move(action)));
}

caf::actor world::proxy(int from, const caf::actor& target, bool greet) {
  auto to = node_of(target.address());
  // A refused hello leaves the proxy in place: its messages are refused on arrival, with why.
  if (greet && to >= 0)
    say_hello(from, to);
  auto key = std::make_pair(from, target.id());
  if (auto i = proxies_.find(key); i != proxies_.end())
    return i->second;
  auto p = sys_->spawn<link_proxy>(this, from, to, target);
  ++proxies_made_;
  track(from, p);
  proxies_.emplace(key, p);
  return p;
}

caf::actor world::lazy_proxy(int from, const caf::actor& target) {
  if (opts_.trace_messages || !opts_.gate)
    return proxy(from, target, true);
  auto to = node_of(target.address());
  if (to >= 0 && to != from) {
    auto f = static_cast<size_t>(from), t = static_cast<size_t>(to);
    if (!cell(greeted_, f, t))
      set_cell(greet_due_, f, t, nodes_.size(), true);
  }
  return proxy(from, target, false);
}

void world::greet_if_due(int from, int to) {
  auto f = static_cast<size_t>(from), t = static_cast<size_t>(to);
  if (!cell(greet_due_, f, t) && !cell(greet_due_, t, f))
    return;
  set_cell(greet_due_, f, t, 0, false);
  set_cell(greet_due_, t, f, 0, false);
  say_hello(from, to);
}

bool world::serialized_size(const caf::message& msg, uint64_t& bytes, std::string& error) {
  if (msg.empty()) {
    bytes = 0;
    return true;
  }
  byte_counter sink{*sys_};
  auto err = caf::message::save(sink, msg.content());
  if (err) {
    error = sys_->render(err) + " (" + type_names(msg) + ")";
    return false;
  }
  bytes = sink.bytes();
  return true;
}

std::string world::type_names(const caf::message& msg) const {
  std::string out;
  for (size_t i = 0; i < msg.size(); ++i) {
    if (!out.empty())
      out += ",";
    auto rtti = msg.type(i);
    const auto& name = sys_->types().portable_name(rtti);
    out += name.empty() ? std::string{"?"} : name;
  }
  return out;
}

caf::expected<caf::actor> world::resolve(int from, const std::string& address) {
  // `@<index>/<name>`: an actor of node <index> of the run (runtime/experiment addresses).
  if (auto inst = instance_address::parse(address)) {
    if (inst->node < 0 || static_cast<size_t>(inst->node) >= nodes_.size())
      return caf::make_error(caf::sec::cannot_connect_to_node,
                             "no node " + std::to_string(inst->node) + " in this run");
    return resolve(from, nodes_[static_cast<size_t>(inst->node)]->endpoint() + "/" + inst->name);
  }
  auto addr = peer_address::parse(address);
  if (!addr)
    return caf::make_error(caf::sec::invalid_argument, addr.error().what);
  if (auto i = by_endpoint_.find(addr->endpoint()); i != by_endpoint_.end()) {
    auto& n = nodes_[static_cast<size_t>(i->second)];
    if (!n->alive_ || net_.partitioned(from, n->index()))
      return caf::make_error(caf::sec::cannot_connect_to_node, "cannot reach " + n->endpoint());
    auto a = n->lookup(addr->name);
    if (!a)
      return caf::make_error(caf::sec::remote_lookup_failed,
                             "no actor named '" + addr->name + "' on " + n->name());
    if (n->index() == from)
      return a;
    if (auto why = say_hello(from, n->index()); !why.empty())
      return caf::make_error(caf::sec::cannot_connect_to_node, n->endpoint() + ": " + why);
    return proxy(from, a, false);
  }
  return caf::make_error(caf::sec::cannot_connect_to_node, "no node at " + addr->endpoint());
}

namespace {

std::string trace_line(const trace_event& e) {
  nlohmann::json j{{"t_ns", e.t_ns}, {"kind", e.kind},   {"from", e.from},
                   {"to", e.to},     {"bytes", e.bytes}, {"detail", e.detail}};
  return j.dump();
}

} // namespace

void world::on_record(std::function<void(const trace_event&)> f) {
  observer_ = std::move(f);
}

void world::record(std::string kind, std::string from, std::string to, uint64_t bytes,
                   std::string detail) {
  trace_event e{now_ns(), std::move(kind), std::move(from), std::move(to), bytes,
                std::move(detail)};
  // FNV-1a over every field: cheap, order-sensitive, enough to tell two runs apart.
  auto mix = [this](const std::string& s) {
    for (unsigned char c : s) {
      digest_ ^= c;
      digest_ *= 1099511628211ULL;
    }
    digest_ ^= 0xff;
    digest_ *= 1099511628211ULL;
  };
  mix(std::to_string(e.t_ns));
  mix(e.kind);
  mix(e.from);
  mix(e.to);
  mix(std::to_string(e.bytes));
  mix(e.detail);
  ++events_;
  if (observer_)
    observer_(e);
  if (trace_out_) {
    *trace_out_ << trace_line(e) << '\n';
    if (!*trace_out_ && trace_error_.empty()) {
      trace_error_ = "writing " + opts_.trace_path + " failed (disk full?)";
      trace_out_.reset();
    }
  }
  if (opts_.keep_trace)
    trace_.push_back(std::move(e));
}

void world::write_trace_jsonl(const std::string& path) const {
  std::ofstream out{path};
  for (auto& e : trace_)
    out << trace_line(e) << '\n';
}

uint64_t world::trace_digest() const { return digest_; }

} // namespace starling::runtime::sim
