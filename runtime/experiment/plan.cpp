#include "runtime/experiment/plan.hpp"

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include <fmt/format.h>

#include "kernels/seeded_hash.hpp"
#include "kernels/stable_hash.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

/// A stable 64-bit hash of text: role names enter seeds, and std::hash may differ between builds.
uint64_t text_hash(const std::string& s) {
  return kernels::stable_hash(s);
}

double seconds(nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

/// The plan's one Poisson generator: the time of the next event after `t` of a process of `rate`
/// events per second (an exponential gap). Preemptions and churn draw from it.
double next_poisson(std::mt19937_64& rng, double t, double rate) {
  return t + std::exponential_distribution<double>{rate}(rng);
}

/// Draws churn `c` (the `j`-th of the graph) into leave and join events of its role, which has
/// `replicas` instances at the start: while the run lasts, leaves come at `per_minute` times the
/// live instances per minute, each of a live instance drawn at random unless only `keep` (or
/// the last that `serves`) would stay; each leave brings a newcomer `rejoin_after` later.
void draw_churn(const churn_spec& c, size_t replicas, nanoseconds duration, uint64_t seed, size_t j,
                std::vector<event_spec>& out) {
  if (!(c.per_minute > 0))
    return;
  // Its own stream (the first churn's is the one the dedloc kind drew its schedule from).
  std::mt19937_64 rng{seed ^ (0xC4A7C4A7ull + j)};
  std::vector<size_t> live;
  for (size_t i = 0; i < replicas; ++i)
    live.push_back(i);
  size_t next_index = replicas;
  // Newcomers scheduled but not yet arrived, by time: they arrive in time order, so their
  // indices follow (the plan numbers a role's joins in time order).
  std::vector<std::pair<double, size_t>> arriving;
  double t = 0;
  auto end = seconds(duration);
  while (true) {
    t = next_poisson(rng, t,
                     c.per_minute * static_cast<double>(std::max<size_t>(live.size(), 1)) / 60.0);
    if (t >= end)
      break;
    while (!arriving.empty() && arriving.front().first <= t) {
      live.push_back(arriving.front().second);
      arriving.erase(arriving.begin());
    }
    if (live.size() <= c.keep)
      continue;
    auto pick = std::uniform_int_distribution<size_t>{0, live.size() - 1}(rng);
    auto victim = live[pick];
    if (c.serves && c.serves(victim) &&
        std::count_if(live.begin(), live.end(), [&](size_t i) { return c.serves(i); }) <= 1)
      continue; // the last instance that can hand the state to newcomers stays
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    auto at = std::chrono::duration_cast<nanoseconds>(std::chrono::duration<double>(t));
    event_spec leave;
    leave.what = event_spec::kind::leave;
    leave.role = c.role;
    leave.instance = victim;
    leave.at = at;
    out.push_back(leave);
    auto join_at = at + c.rejoin_after;
    if (join_at < duration) {
      event_spec join;
      join.what = event_spec::kind::join;
      join.role = c.role;
      join.at = join_at;
      join.count = 1;
      out.push_back(join);
      arriving.emplace_back(seconds(join_at), next_index++);
    }
  }
}

/// Placement state while the plan is built.
struct placer {
  size_t nodes;
  /// Instances per node, in all and per role.
  std::vector<size_t> total;
  std::vector<std::map<size_t, size_t>> per_role;

  explicit placer(size_t n) : nodes(n), total(n, 0), per_role(n) {}

  void put(size_t node, size_t role) {
    total[node]++;
    per_role[node][role]++;
  }

  size_t count(size_t node, size_t role) const {
    auto i = per_role[node].find(role);
    return i == per_role[node].end() ? 0 : i->second;
  }
};

} // namespace

uint64_t instance_seed(uint64_t seed, const std::string& role, size_t index, int generation) {
  using kernels::splitmix64_mix;
  return splitmix64_mix(splitmix64_mix(seed ^ text_hash(role)) + index * 0x100000001b3ULL
                        + static_cast<uint64_t>(generation) * kernels::splitmix64_gamma);
}

const char* to_string(planned_fault::action a) {
  switch (a) {
    case planned_fault::action::kill_instance:
      return "kill_instance";
    case planned_fault::action::kill_node:
      return "kill_node";
    case planned_fault::action::partition:
      return "partition";
    case planned_fault::action::heal:
      return "heal";
    case planned_fault::action::slow_link:
      return "slow_link";
    case planned_fault::action::ban:
      return "ban";
    default:
      return "restore_link";
  }
}

std::vector<size_t> plan::on_node(size_t n) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < instances.size(); ++i)
    if (instances[i].node && *instances[i].node == n)
      out.push_back(i);
  return out;
}

std::vector<size_t> plan::of_role(size_t role) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < instances.size(); ++i)
    if (instances[i].role == role)
      out.push_back(i);
  return out;
}

const planned_instance* plan::find(size_t role, size_t index) const {
  for (auto& x : instances)
    if (x.role == role && x.index == index)
      return &x;
  return nullptr;
}

std::vector<size_t> plan::faults_of(size_t n) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < faults.size(); ++i) {
    auto& f = faults[i];
    bool mine = false;
    switch (f.what) {
      case planned_fault::action::kill_instance:
        mine = instances[f.instance].node && *instances[f.instance].node == n;
        break;
      case planned_fault::action::kill_node:
        mine = f.node == n;
        break;
      case planned_fault::action::partition:
      case planned_fault::action::heal:
        for (auto& g : f.groups)
          mine = mine || std::find(g.begin(), g.end(), n) != g.end();
        break;
      default:
        mine = false; // links with a speed exist only in the simulation's network model
    }
    if (mine)
      out.push_back(i);
  }
  return out;
}

size_t plan::total_nodes() const {
  size_t n = nodes;
  for (auto& x : instances)
    if (x.node)
      n = std::max(n, *x.node + 1);
  return n;
}

namespace {

/// The error of fault `k` naming node `n` of a run of `nodes` nodes.
failure no_such_node(size_t k, size_t n, size_t nodes) {
  return fail(fmt::format("faults[{}]: node {} does not exist (the run has {} node{})", k, n,
                          nodes, nodes == 1 ? "" : "s"));
}

} // namespace

result<plan> make_plan(const experiment_graph& g, run_mode mode, size_t nodes, uint64_t seed) {
  plan p;
  p.mode = mode;
  p.seed = seed;
  // Instances: the replicas of every role, then the arrivals of join events in time order.
  struct pending {
    size_t role;
    size_t index;
    nanoseconds start;
  };
  std::vector<pending> todo;
  std::vector<size_t> next_index(g.roles.size(), 0);
  std::map<std::string, size_t> role_of;
  for (size_t r = 0; r < g.roles.size(); ++r) {
    role_of[g.roles[r].name] = r;
    for (size_t i = 0; i < g.roles[r].replicas; ++i)
      todo.push_back({r, next_index[r]++, nanoseconds{0}});
  }
  // The graph's events, then the churn's leaves and joins.
  auto events = g.events;
  for (size_t j = 0; j < g.churn.size(); ++j) {
    auto r = role_of.find(g.churn[j].role);
    if (r == role_of.end())
      return fail(fmt::format("churn[{}]: no role named '{}'", j, g.churn[j].role));
    draw_churn(g.churn[j], g.roles[r->second].replicas, g.duration, seed, j, events);
  }
  std::vector<size_t> order(events.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return events[a].at < events[b].at; });
  for (auto e : order) {
    auto& ev = events[e];
    if (ev.what != event_spec::kind::join)
      continue;
    auto r = role_of.at(ev.role);
    for (size_t k = 0; k < ev.count; ++k)
      todo.push_back({r, next_index[r]++, ev.at});
  }
  // Nodes: as asked, else the graph's, else one per instance placed on its own (pinned roles
  // share their pinned nodes; colocated and open instances need none of their own).
  if (nodes == 0)
    nodes = g.nodes;
  if (nodes == 0) {
    size_t pinned = 0;
    size_t own = 0;
    for (auto& t : todo) {
      auto& pl = g.roles[t.role].placement;
      if (pl.open || !pl.colocate.empty())
        continue;
      if (!pl.spread) {
        for (auto n : pl.nodes)
          pinned = std::max(pinned, n + 1);
      } else {
        own++;
      }
    }
    nodes = std::max<size_t>(1, pinned + own);
  }
  p.nodes = nodes;
  // Roles placed on their own come first; colocated ones after the role they follow.
  std::vector<size_t> role_order;
  std::set<size_t> placed_roles;
  while (role_order.size() < g.roles.size()) {
    bool progress = false;
    for (size_t r = 0; r < g.roles.size(); ++r) {
      if (placed_roles.count(r))
        continue;
      auto& c = g.roles[r].placement.colocate;
      if (!c.empty() && !placed_roles.count(role_of.at(c)))
        continue;
      role_order.push_back(r);
      placed_roles.insert(r);
      progress = true;
    }
    if (!progress)
      return fail("placement: colocation forms a cycle");
  }
  placer pl{nodes};
  std::vector<std::vector<size_t>> by_role(g.roles.size()); // plan indices per role
  size_t next_open = nodes;
  // Pending instances grouped by role, keeping their order (replicas, then arrivals).
  std::vector<std::vector<pending>> todo_of(g.roles.size());
  for (auto& t : todo)
    todo_of[t.role].push_back(t);
  for (auto r : role_order) {
    auto& spec = g.roles[r];
    auto& place = spec.placement;
    for (auto& t : todo_of[r]) {
      planned_instance x;
      x.role = r;
      x.index = t.index;
      x.name = fmt::format("{}.{}", spec.name, t.index);
      x.start = t.start;
      if (place.open) {
        // Volunteer slots: nobody numbered runs them; in sim and local mode each gets an extra
        // node of its own, standing for the volunteer's machine.
        if (mode != run_mode::cluster)
          x.node = next_open++;
      } else if (!place.colocate.empty()) {
        auto& targets = by_role[role_of.at(place.colocate)];
        if (targets.empty())
          return fail(fmt::format("placement.{}.colocate: role '{}' has no instances", spec.name,
                                  place.colocate));
        auto& target = p.instances[targets[t.index % targets.size()]];
        if (!target.node)
          return fail(fmt::format("placement.{}.colocate: role '{}' runs in volunteer slots",
                                  spec.name, place.colocate));
        x.node = target.node;
      } else {
        std::vector<size_t> eligible = place.nodes;
        if (eligible.empty())
          for (size_t n = 0; n < nodes; ++n)
            eligible.push_back(n);
        for (auto n : eligible)
          if (n >= nodes)
            return fail(fmt::format("placement.{}: node {} does not exist (the run has {} node{})",
                                    spec.name, n, nodes, nodes == 1 ? "" : "s"));
        if (!place.spread) {
          x.node = eligible[t.index % eligible.size()];
        } else {
          // Prefer nodes without the avoided roles, if any are left.
          std::vector<size_t> preferred;
          for (auto n : eligible) {
            bool clash = false;
            for (auto& a : place.avoid)
              clash = clash || pl.count(n, role_of.at(a)) > 0;
            if (!clash)
              preferred.push_back(n);
          }
          if (!preferred.empty())
            eligible = preferred;
          auto best = eligible.front();
          for (auto n : eligible)
            if (std::make_pair(pl.count(n, r), pl.total[n])
                < std::make_pair(pl.count(best, r), pl.total[best]))
              best = n;
          x.node = best;
        }
      }
      if (x.node && *x.node < nodes)
        pl.put(*x.node, r);
      by_role[r].push_back(p.instances.size());
      p.instances.push_back(std::move(x));
    }
  }
  // Keep the instances in graph order (role, then index) whatever the placement order was.
  std::vector<size_t> perm(p.instances.size());
  for (size_t i = 0; i < perm.size(); ++i)
    perm[i] = i;
  std::stable_sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    auto& x = p.instances[a];
    auto& y = p.instances[b];
    return std::make_pair(x.role, x.index) < std::make_pair(y.role, y.index);
  });
  std::vector<planned_instance> sorted;
  for (auto i : perm)
    sorted.push_back(std::move(p.instances[i]));
  p.instances = std::move(sorted);
  for (auto& ev : events)
    if (ev.what == event_spec::kind::leave) {
      for (auto& x : p.instances)
        if (x.role == role_of.at(ev.role) && x.index == ev.instance)
          x.leave = ev.at;
    }
  // The fault plan: each graph fault draws from a generator of its own (seed, fault index), so
  // adding a fault leaves the others' times and victims as they were.
  auto instances_of = [&](size_t r, nanoseconds at) {
    std::vector<size_t> out;
    for (size_t i = 0; i < p.instances.size(); ++i) {
      auto& x = p.instances[i];
      if (x.role == r && x.start <= at && (!x.leave || *x.leave > at))
        out.push_back(i);
    }
    return out;
  };
  auto index_of = [&](size_t r, size_t index) -> size_t {
    for (size_t i = 0; i < p.instances.size(); ++i)
      if (p.instances[i].role == r && p.instances[i].index == index)
        return i;
    return p.instances.size();
  };
  const nanoseconds default_node_restart = std::chrono::seconds(5);
  for (size_t k = 0; k < g.faults.size(); ++k) {
    auto& f = g.faults[k];
    std::mt19937_64 rng{kernels::splitmix64_mix(seed ^ kernels::splitmix64_mix(0xfa017ULL + k))};
    auto end = f.until ? *f.until : g.duration;
    planned_fault a;
    a.origin = k;
    a.at = f.at;
    a.never = f.restart.never;
    switch (f.kind) {
      case fault_kind::kill:
      case fault_kind::preempt: {
        auto r = role_of.at(f.role);
        a.what = planned_fault::action::kill_instance;
        a.restart = f.restart.delay ? *f.restart.delay : g.roles[r].restart.delay;
        auto victim = [&](nanoseconds t) -> std::optional<size_t> {
          if (f.instance) {
            auto i = index_of(r, *f.instance);
            return i < p.instances.size() ? std::optional<size_t>{i} : std::nullopt;
          }
          auto live = instances_of(r, t);
          if (live.empty())
            return std::nullopt;
          return live[std::uniform_int_distribution<size_t>{0, live.size() - 1}(rng)];
        };
        if (f.kind == fault_kind::kill) {
          if (auto v = victim(f.at)) {
            a.instance = *v;
            p.faults.push_back(a);
          }
          break;
        }
        auto rate = 1.0 / seconds(f.every);
        for (double t = next_poisson(rng, seconds(f.at), rate); t < seconds(end);
             t = next_poisson(rng, t, rate)) {
          auto when = nanoseconds{static_cast<int64_t>(t * 1e9)};
          if (auto v = victim(when)) {
            a.at = when;
            a.instance = *v;
            p.faults.push_back(a);
          }
        }
        break;
      }
      case fault_kind::kill_node:
        if (f.node >= nodes)
          return no_such_node(k, f.node, nodes);
        a.what = planned_fault::action::kill_node;
        a.node = f.node;
        a.restart = f.restart.delay ? *f.restart.delay : default_node_restart;
        p.faults.push_back(a);
        break;
      case fault_kind::partition:
        for (auto& grp : f.groups)
          for (auto n : grp)
            if (n >= nodes)
              return no_such_node(k, n, nodes);
        a.what = planned_fault::action::partition;
        a.groups = f.groups;
        p.faults.push_back(a);
        if (f.until) {
          a.what = planned_fault::action::heal;
          a.at = *f.until;
          p.faults.push_back(a);
        }
        break;
      case fault_kind::ban:
        if (f.node >= nodes)
          return no_such_node(k, f.node, nodes);
        a.what = planned_fault::action::ban;
        a.node = f.node;
        a.reason = f.reason;
        p.faults.push_back(a);
        break;
      case fault_kind::slow_link:
        if (f.node >= nodes || f.peer >= nodes)
          return no_such_node(k, std::max(f.node, f.peer), nodes);
        a.what = planned_fault::action::slow_link;
        a.node = f.node;
        a.peer = f.peer;
        a.latency = f.latency;
        a.bandwidth = f.bandwidth;
        p.faults.push_back(a);
        if (f.until) {
          a.what = planned_fault::action::restore_link;
          a.at = *f.until;
          p.faults.push_back(a);
        }
        break;
    }
  }
  std::stable_sort(p.faults.begin(), p.faults.end(),
                   [](const planned_fault& x, const planned_fault& y) { return x.at < y.at; });
  return p;
}

std::string describe(const experiment_graph& g, const plan& p) {
  std::string out;
  out += fmt::format("experiment '{}'{}: {} mode, {} node{}, seed {}, duration {:.1f} s\n", g.name,
                     g.kind.empty() ? "" : fmt::format(" (kind {})", g.kind), to_string(p.mode),
                     p.nodes, p.nodes == 1 ? "" : "s", p.seed, seconds(g.duration));
  out += "roles:\n";
  for (size_t r = 0; r < g.roles.size(); ++r) {
    auto& spec = g.roles[r];
    auto& pl = spec.placement;
    std::string where = pl.open                ? "open (volunteer slots)"
                        : !pl.colocate.empty() ? "with " + pl.colocate
                        : pl.spread            ? "spread"
                                               : "pinned";
    if (!pl.nodes.empty()) {
      std::string ns;
      for (auto n : pl.nodes)
        ns += (ns.empty() ? "" : ",") + std::to_string(n);
      where += " on [" + ns + "]";
    }
    if (!pl.avoid.empty()) {
      std::string av;
      for (auto& a : pl.avoid)
        av += (av.empty() ? "" : ",") + a;
      where += ", avoiding " + av;
    }
    out += fmt::format("  {:<12} {:<16} x{:<4} restart {} after {:.1f} s{}, {}\n", spec.name,
                       spec.type, spec.replicas, spec.restart.supervised ? "supervised" : "on faults",
                       seconds(spec.restart.delay),
                       spec.restart.download_state ? " (state download)" : "", where);
  }
  out += "nodes:\n";
  for (size_t n = 0; n < p.total_nodes(); ++n) {
    std::string names;
    for (auto i : p.on_node(n)) {
      auto& x = p.instances[i];
      names += (names.empty() ? "" : " ") + x.name;
      if (x.start > nanoseconds{0})
        names += fmt::format("(+{:.1f}s)", seconds(x.start));
      if (x.leave)
        names += fmt::format("(-{:.1f}s)", seconds(*x.leave));
    }
    out += fmt::format("  node{:<4}{} {}\n", n, n >= p.nodes ? " (volunteer)" : "",
                       names.empty() ? "-" : names);
  }
  std::string open;
  for (auto& x : p.instances)
    if (!x.node)
      open += (open.empty() ? "" : " ") + x.name;
  if (!open.empty())
    out += fmt::format("open slots (taken by nodes started without --index): {}\n", open);
  out += fmt::format("faults: {}\n", p.faults.empty() ? "none" : "");
  for (auto& f : p.faults) {
    std::string what;
    auto restart = f.never ? std::string{"never restarted"}
                           : fmt::format("restarted after {:.1f} s", seconds(f.restart));
    switch (f.what) {
      case planned_fault::action::kill_instance: {
        auto& x = p.instances[f.instance];
        what = fmt::format("kill {} on node{}, {}", x.name,
                           x.node ? std::to_string(*x.node) : std::string{"?"}, restart);
        break;
      }
      case planned_fault::action::kill_node:
        what = fmt::format("kill node{}, {}", f.node, restart);
        break;
      case planned_fault::action::partition:
      case planned_fault::action::heal: {
        std::string gs;
        for (auto& grp : f.groups) {
          std::string one;
          for (auto n : grp)
            one += (one.empty() ? "" : ",") + std::to_string(n);
          gs += (gs.empty() ? "" : " | ") + one;
        }
        what = fmt::format("{} {}", f.what == planned_fault::action::partition ? "partition" : "heal",
                           gs);
        break;
      }
      case planned_fault::action::slow_link:
        what = fmt::format("slow link node{} <-> node{}: {:.1f} ms, {:.3g} B/s", f.node, f.peer,
                           seconds(f.latency) * 1e3, f.bandwidth);
        break;
      case planned_fault::action::restore_link:
        what = fmt::format("restore link node{} <-> node{}", f.node, f.peer);
        break;
      case planned_fault::action::ban:
        what = fmt::format("ban node{}: {}", f.node, f.reason);
        break;
    }
    out += fmt::format("  {:>9.3f} s  {}\n", seconds(f.at), what);
  }
  return out;
}

} // namespace starling::runtime
