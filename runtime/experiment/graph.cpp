#include "runtime/experiment/graph.hpp"

#include <cctype>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "runtime/experiment/role.hpp"

namespace starling::runtime {

const char* to_string(run_mode m) {
  switch (m) {
    case run_mode::sim:
      return "sim";
    case run_mode::local:
      return "local";
    default:
      return "cluster";
  }
}

const char* to_string(fault_kind k) {
  switch (k) {
    case fault_kind::kill:
      return "kill";
    case fault_kind::kill_node:
      return "kill_node";
    case fault_kind::preempt:
      return "preempt";
    case fault_kind::partition:
      return "partition";
    case fault_kind::ban:
      return "ban";
    default:
      return "slow_link";
  }
}

const role_spec* experiment_graph::find(const std::string& n) const {
  for (auto& r : roles)
    if (r.name == n)
      return &r;
  return nullptr;
}

size_t experiment_graph::instance_count() const {
  size_t n = 0;
  for (auto& r : roles)
    n += r.replicas;
  return n;
}

bool supports(run_mode mode, fault_kind kind) {
  switch (kind) {
    case fault_kind::slow_link:
    case fault_kind::ban:
      return mode == run_mode::sim;
    case fault_kind::partition:
      // Local mode's nodes share one process and reach each other by reference: there is no
      // link to cut.
      return mode != run_mode::local;
    default:
      return true;
  }
}

namespace {

/// Role names end up in addresses (`@<node>/<role>.<i>`) and DHT keys.
status check_name(const std::string& what, const std::string& name) {
  if (name.empty())
    return fail(fmt::format("{}: a role needs a name", what));
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
      return fail(fmt::format("{}: role name '{}' may use letters, digits, '_' and '-' only",
                              what, name));
  return {};
}

std::string where(const fault_spec& f, size_t i) {
  return f.line > 0 ? fmt::format("faults[{}] (line {})", i, f.line) : fmt::format("faults[{}]", i);
}

} // namespace

status validate(const experiment_graph& g, const role_registry& registry, run_mode mode) {
  if (g.duration <= std::chrono::nanoseconds{0})
    return fail("experiment.duration: expected a positive duration");
  // A study without roles (the `btard` kind) runs its own in-process computation.
  if (g.roles.empty() && !g.study)
    return fail("roles: an experiment needs at least one role");
  std::set<std::string> names;
  std::map<std::string, size_t> joins;
  for (auto& e : g.events)
    if (e.what == event_spec::kind::join)
      joins[e.role] += e.count;
  for (auto& r : g.roles) {
    auto what = fmt::format("roles.{}", r.name);
    if (auto st = check_name(what, r.name); !st)
      return st;
    if (!names.insert(r.name).second)
      return fail(fmt::format("{}: the role is defined twice", what));
    auto* t = registry.find(r.type);
    if (!t) {
      std::string known;
      for (auto& n : registry.type_names())
        known += (known.empty() ? "" : ", ") + n;
      return fail(fmt::format("{}.type: unknown role type '{}' (known: {})", what, r.type, known));
    }
    if (!r.options.has_value() || r.options.type() != *t->options_type)
      return fail(fmt::format("{}.options: expected the options of role type '{}'", what, r.type));
    if (auto st = t->check(r.options); !st)
      return fail(fmt::format("{}.options: {}", what, st.what()));
    if (r.replicas == 0 && joins[r.name] == 0)
      return fail(fmt::format("{}.replicas: a role needs at least one instance (or a join event)",
                              what));
    if (r.restart.delay < std::chrono::nanoseconds{0})
      return fail(fmt::format("{}.restart.delay: expected a non-negative duration", what));
  }
  for (auto& r : g.roles) {
    auto& p = r.placement;
    auto what = fmt::format("placement.{}", r.name);
    if (!p.colocate.empty()) {
      if (!g.find(p.colocate))
        return fail(fmt::format("{}.colocate: no role named '{}'", what, p.colocate));
      if (p.colocate == r.name)
        return fail(fmt::format("{}.colocate: a role cannot colocate with itself", what));
      if (p.open)
        return fail(fmt::format("{}: an open (volunteer) role cannot colocate", what));
    }
    for (auto& a : p.avoid)
      if (!g.find(a))
        return fail(fmt::format("{}.avoid: no role named '{}'", what, a));
    if (!p.spread && p.nodes.empty() && p.colocate.empty() && !p.open)
      return fail(fmt::format("{}: a role that does not spread needs `pin: [nodes]`", what));
  }
  // Colocation chains must end in a role that is placed on its own.
  for (auto& r : g.roles) {
    std::set<std::string> seen{r.name};
    const role_spec* cur = &r;
    while (!cur->placement.colocate.empty()) {
      cur = g.find(cur->placement.colocate);
      if (!seen.insert(cur->name).second)
        return fail(fmt::format("placement.{}.colocate: colocation forms a cycle", r.name));
    }
  }
  for (size_t i = 0; i < g.events.size(); ++i) {
    auto& e = g.events[i];
    auto what = fmt::format("events[{}]", i);
    auto* r = g.find(e.role);
    if (!r)
      return fail(fmt::format("{}: no role named '{}'", what, e.role));
    if (e.at < std::chrono::nanoseconds{0} || e.at > g.duration)
      return fail(fmt::format("{}: time {:.3f} s is outside the run (0 to {:.3f} s)", what,
                              std::chrono::duration<double>(e.at).count(),
                              std::chrono::duration<double>(g.duration).count()));
    if (e.what == event_spec::kind::join && e.count == 0)
      return fail(fmt::format("{}: a join needs a positive count", what));
    if (e.what == event_spec::kind::leave && e.instance >= r->replicas + joins[e.role])
      return fail(fmt::format("{}: role '{}' has no instance {} (it has {})", what, e.role,
                              e.instance, r->replicas + joins[e.role]));
  }
  std::set<std::string> churned;
  for (size_t i = 0; i < g.churn.size(); ++i) {
    auto& c = g.churn[i];
    auto what = fmt::format("churn[{}]", i);
    if (!g.find(c.role))
      return fail(fmt::format("{}: no role named '{}'", what, c.role));
    if (!(c.per_minute >= 0) || !std::isfinite(c.per_minute))
      return fail(fmt::format("{}: expected leaves per minute >= 0, got {}", what, c.per_minute));
    if (c.rejoin_after < std::chrono::nanoseconds{0})
      return fail(fmt::format("{}: rejoin_after must not be negative", what));
    if (!churned.insert(c.role).second)
      return fail(fmt::format("{}: role '{}' has churn already", what, c.role));
    for (auto& e : g.events)
      if (e.role == c.role)
        return fail(fmt::format("{}: role '{}' also has join or leave events (churn draws its "
                                "instances' comings and goings alone)",
                                what, c.role));
  }
  for (size_t i = 0; i < g.faults.size(); ++i) {
    auto& f = g.faults[i];
    auto what = where(f, i);
    if (!supports(mode, f.kind))
      return fail(fmt::format("{}: fault kind '{}' is not supported in {} mode{}", what,
                              to_string(f.kind), to_string(mode),
                              f.kind == fault_kind::slow_link
                                ? " (links have a speed only in the simulation's network model)"
                              : f.kind == fault_kind::ban
                                ? " (a simulated run has its own authority; a live closed run "
                                  "bans with `starling deny --authority DIR --push HOST:PORT`)"
                                : " (local mode's nodes share one process: no link to cut)"));
    if (f.at < std::chrono::nanoseconds{0} || f.at > g.duration)
      return fail(fmt::format("{}: time {:.3f} s is outside the run (0 to {:.3f} s)", what,
                              std::chrono::duration<double>(f.at).count(),
                              std::chrono::duration<double>(g.duration).count()));
    if (f.until && *f.until < f.at)
      return fail(fmt::format("{}: `until` comes before `at`", what));
    if (f.restart.delay && *f.restart.delay < std::chrono::nanoseconds{0})
      return fail(fmt::format("{}: restart_after must be non-negative", what));
    switch (f.kind) {
      case fault_kind::kill:
      case fault_kind::preempt: {
        auto* r = g.find(f.role);
        if (!r)
          return fail(fmt::format("{}: no role named '{}'", what, f.role));
        if (f.instance && *f.instance >= r->replicas + joins[f.role])
          return fail(fmt::format("{}: role '{}' has no instance {} (it has {})", what, f.role,
                                  *f.instance, r->replicas + joins[f.role]));
        if (f.kind == fault_kind::preempt && f.every <= std::chrono::nanoseconds{0})
          return fail(fmt::format("{}: preemptions need a positive mean gap `every`", what));
        break;
      }
      case fault_kind::partition: {
        if (f.groups.size() < 2)
          return fail(fmt::format("{}: a partition needs at least two groups of nodes", what));
        std::set<size_t> seen;
        for (auto& grp : f.groups) {
          if (grp.empty())
            return fail(fmt::format("{}: a partition group is empty", what));
          for (auto n : grp)
            if (!seen.insert(n).second)
              return fail(fmt::format("{}: node {} is in two groups", what, n));
        }
        break;
      }
      case fault_kind::slow_link:
        if (f.node == f.peer)
          return fail(fmt::format("{}: a slow link needs two different nodes", what));
        if (f.bandwidth <= 0 && f.latency <= std::chrono::nanoseconds{0})
          return fail(fmt::format("{}: a slow link needs a latency or a bandwidth", what));
        break;
      case fault_kind::ban:
        if (f.reason.size() > 256)
          return fail(fmt::format("{}: a ban's reason has at most 256 bytes", what));
        break;
      case fault_kind::kill_node:
        break;
    }
  }
  return {};
}

// -- builder ------------------------------------------------------------------------------------

using role_ref = experiment_builder::role_ref;

role_ref& role_ref::replicas(size_t n) {
  spec().replicas = n;
  return *this;
}

role_ref& role_ref::restart_delay(std::chrono::nanoseconds d) {
  spec().restart.delay = d;
  return *this;
}

role_ref& role_ref::unsupervised() {
  spec().restart.supervised = false;
  return *this;
}

role_ref& role_ref::download_state(bool on) {
  spec().restart.download_state = on;
  return *this;
}

role_ref& role_ref::pin(std::vector<size_t> nodes) {
  spec().placement.nodes = std::move(nodes);
  spec().placement.spread = false;
  return *this;
}

role_ref& role_ref::spread(std::vector<size_t> nodes) {
  spec().placement.nodes = std::move(nodes);
  spec().placement.spread = true;
  return *this;
}

role_ref& role_ref::colocate(std::string role) {
  spec().placement.colocate = std::move(role);
  return *this;
}

role_ref& role_ref::avoid(std::vector<std::string> roles) {
  spec().placement.avoid = std::move(roles);
  return *this;
}

role_ref& role_ref::open() {
  spec().placement.open = true;
  return *this;
}

experiment_builder::experiment_builder(std::string name) {
  g_.name = std::move(name);
}

experiment_builder& experiment_builder::seed(uint64_t s) {
  g_.seed = s;
  return *this;
}

experiment_builder& experiment_builder::duration(std::chrono::nanoseconds d) {
  g_.duration = d;
  return *this;
}

experiment_builder& experiment_builder::nodes(size_t n) {
  g_.nodes = n;
  return *this;
}

experiment_builder& experiment_builder::network(const network_options& n) {
  g_.network = n;
  return *this;
}

role_ref experiment_builder::role(const std::string& name) {
  for (size_t i = 0; i < g_.roles.size(); ++i)
    if (g_.roles[i].name == name)
      return role_ref{&g_, i};
  throw std::invalid_argument("experiment_builder: no role named " + name);
}

experiment_builder& experiment_builder::kill(std::string role, std::optional<size_t> instance,
                                             std::chrono::nanoseconds at, restart_after r) {
  fault_spec f;
  f.kind = fault_kind::kill;
  f.role = std::move(role);
  f.instance = instance;
  f.at = at;
  f.restart = r;
  return fault(std::move(f));
}

experiment_builder& experiment_builder::kill_node(size_t node, std::chrono::nanoseconds at,
                                                  restart_after r) {
  fault_spec f;
  f.kind = fault_kind::kill_node;
  f.node = node;
  f.at = at;
  f.restart = r;
  return fault(std::move(f));
}

experiment_builder& experiment_builder::preempt(std::string role, std::chrono::nanoseconds every,
                                                restart_after r) {
  fault_spec f;
  f.kind = fault_kind::preempt;
  f.role = std::move(role);
  f.every = every;
  f.restart = r;
  return fault(std::move(f));
}

experiment_builder& experiment_builder::partition(std::vector<std::vector<size_t>> groups,
                                                  std::chrono::nanoseconds at,
                                                  std::optional<std::chrono::nanoseconds> until) {
  fault_spec f;
  f.kind = fault_kind::partition;
  f.groups = std::move(groups);
  f.at = at;
  f.until = until;
  return fault(std::move(f));
}

experiment_builder& experiment_builder::slow_link(size_t a, size_t b,
                                                  std::chrono::nanoseconds latency,
                                                  double bandwidth, std::chrono::nanoseconds at,
                                                  std::optional<std::chrono::nanoseconds> until) {
  fault_spec f;
  f.kind = fault_kind::slow_link;
  f.node = a;
  f.peer = b;
  f.latency = latency;
  f.bandwidth = bandwidth;
  f.at = at;
  f.until = until;
  return fault(std::move(f));
}

experiment_builder& experiment_builder::ban(size_t node, std::chrono::nanoseconds at,
                                            std::string reason) {
  fault_spec f;
  f.kind = fault_kind::ban;
  f.node = node;
  f.at = at;
  f.reason = std::move(reason);
  return fault(std::move(f));
}

experiment_builder& experiment_builder::fault(fault_spec f) {
  g_.faults.push_back(std::move(f));
  return *this;
}

experiment_builder& experiment_builder::join(std::string role, std::chrono::nanoseconds at,
                                             size_t count) {
  event_spec e;
  e.what = event_spec::kind::join;
  e.role = std::move(role);
  e.at = at;
  e.count = count;
  g_.events.push_back(std::move(e));
  return *this;
}

experiment_builder& experiment_builder::churn(churn_spec c) {
  g_.churn.push_back(std::move(c));
  return *this;
}

experiment_builder& experiment_builder::leave(std::string role, size_t instance,
                                              std::chrono::nanoseconds at) {
  event_spec e;
  e.what = event_spec::kind::leave;
  e.role = std::move(role);
  e.instance = instance;
  e.at = at;
  g_.events.push_back(std::move(e));
  return *this;
}

experiment_builder& experiment_builder::reporter(reporter_factory f) {
  g_.reporters.push_back(std::move(f));
  return *this;
}

result<experiment_graph> experiment_builder::build(const role_registry& registry,
                                                   run_mode mode) const {
  if (auto st = validate(g_, registry, mode); !st)
    return fail(st.what());
  return g_;
}

} // namespace starling::runtime
