#include "runtime/experiment/yaml.hpp"

#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

size_t read_index(config_node n, const char* what) {
  auto v = n.as_int();
  if (v < 0)
    n.expected(what);
  return static_cast<size_t>(v);
}

std::vector<size_t> read_nodes(config_node n) {
  std::vector<size_t> out;
  if (n.is_scalar()) {
    out.push_back(read_index(n, "a node index (0, 1, ...)"));
    return out;
  }
  for (auto& item : n.items())
    out.push_back(read_index(item, "a node index (0, 1, ...)"));
  if (out.empty())
    n.expected("at least one node index");
  return out;
}

std::vector<std::string> read_names(config_node n) {
  std::vector<std::string> out;
  if (n.is_scalar()) {
    out.push_back(n.as_string());
    return out;
  }
  for (auto& item : n.items())
    out.push_back(item.as_string());
  return out;
}

void read_restart_after(config_node& item, restart_after& out) {
  if (!item.has("restart_after"))
    return;
  auto c = item.child("restart_after");
  if (c.is_scalar() && c.as_string() == "never") {
    out.never = true;
    return;
  }
  auto d = c.as_duration();
  if (d < nanoseconds{0})
    c.expected("a non-negative duration or `never`");
  out.delay = d;
}

const std::vector<std::string>& fault_kinds() {
  static const std::vector<std::string> kinds{"kill", "kill_node", "preempt", "partition",
                                              "slow_link", "ban"};
  return kinds;
}

void read_role(config_node& n, const std::string& name, const role_registry& registry,
               role_spec& out) {
  if (!n.is_map())
    n.expected("a map {type: ROLE_TYPE, replicas: N, options: {...}, restart: {...}}");
  out.name = name;
  if (!n.has("type"))
    n.fail("missing required key 'type' (a registered role type)");
  auto tn = n.child("type");
  out.type = tn.as_string();
  auto* t = registry.find(out.type);
  if (!t) {
    std::string known;
    for (auto& k : registry.type_names())
      known += (known.empty() ? "" : ", ") + k;
    tn.fail(fmt::format("unknown role type '{}' (known: {})", out.type, known));
  }
  if (n.has("replicas")) {
    int64_t r = 1;
    read_int(n, "replicas", r, 0, 1000000);
    out.replicas = static_cast<size_t>(r);
  }
  out.options = t->make_default();
  if (n.has("options")) {
    auto o = n.child("options");
    if (!o.is_map())
      o.expected("a map of the role type's options");
    t->read(o, out.options);
    o.finish();
    if (auto st = t->check(out.options); !st)
      o.fail(st.what());
  }
  if (n.has("restart")) {
    auto r = n.child("restart");
    if (!r.is_map())
      r.expected("a map {supervised: BOOL, delay: DURATION, download_state: BOOL}");
    read(r, "supervised", out.restart.supervised);
    read_duration(r, "delay", out.restart.delay);
    read(r, "download_state", out.restart.download_state);
    r.finish();
  }
  n.finish();
}

void read_placement(config_node& n, placement_spec& out) {
  if (!n.is_map())
    n.expected("a map {pin: [NODES] | spread: BOOL, nodes: [NODES], colocate: ROLE, avoid: "
               "[ROLES], open: BOOL}");
  if (n.has("pin")) {
    out.nodes = read_nodes(n.child("pin"));
    out.spread = false;
    if (n.has("spread") || n.has("nodes"))
      n.fail("`pin` lists the nodes itself: give either `pin` or `spread`/`nodes`");
  }
  read(n, "spread", out.spread);
  if (n.has("nodes"))
    out.nodes = read_nodes(n.child("nodes"));
  read(n, "colocate", out.colocate);
  if (n.has("avoid"))
    out.avoid = read_names(n.child("avoid"));
  read(n, "open", out.open);
  n.finish();
}

event_spec read_event(config_node& item) {
  if (!item.is_map())
    item.expected("a map {join: ROLE, at: TIME, count: N} or {leave: ROLE, instance: I, at: TIME}");
  event_spec e;
  bool join = item.has("join");
  bool leave = item.has("leave");
  if (join == leave)
    item.fail("an event is either `join: ROLE` or `leave: ROLE`");
  e.what = join ? event_spec::kind::join : event_spec::kind::leave;
  e.role = item.child(join ? "join" : "leave").as_string();
  if (!item.has("at"))
    item.fail("missing required key 'at'");
  read_duration(item, "at", e.at);
  if (join) {
    int64_t c = 1;
    read_int(item, "count", c, 1, 1000000);
    e.count = static_cast<size_t>(c);
  } else {
    if (!item.has("instance"))
      item.fail("a leave needs the departing `instance`");
    e.instance = read_index(item.child("instance"), "an instance index (0, 1, ...)");
  }
  item.finish();
  return e;
}

} // namespace

fault_spec read_fault(config_node& item) {
  if (!item.is_map())
    item.expected("a map such as {kill: ROLE, at: 20s}, {kill_node: 2, at: 30s}, {preempt: ROLE, "
                  "every: 20s}, {partition: [[0, 1], [2, 3]], at: 40s}, {slow_link: [0, 2], "
                  "bandwidth: 1MB/s, at: 50s} or {ban: 3, at: 60s, reason: TEXT}");
  fault_spec f;
  f.line = item.line();
  std::string kind;
  for (auto& k : fault_kinds())
    if (item.has(k)) {
      if (!kind.empty())
        item.fail(fmt::format("a fault has one kind, got both `{}` and `{}`", kind, k));
      kind = k;
    }
  if (kind.empty()) {
    std::string keys;
    for (auto& k : fault_kinds())
      keys += (keys.empty() ? "" : ", ") + k;
    item.fail(fmt::format("a fault needs its kind as a key: one of {}", keys));
  }
  auto c = item.child(kind);
  if (kind == "kill") {
    f.kind = fault_kind::kill;
    f.role = c.as_string();
    if (item.has("instance"))
      f.instance = read_index(item.child("instance"), "an instance index (0, 1, ...)");
  } else if (kind == "kill_node") {
    f.kind = fault_kind::kill_node;
    f.node = read_index(c, "a node index (0, 1, ...)");
  } else if (kind == "preempt") {
    f.kind = fault_kind::preempt;
    f.role = c.as_string();
    if (!item.has("every"))
      item.fail("preemptions need `every` (the mean time between two, over the whole role)");
    read_duration(item, "every", f.every);
    if (f.every <= nanoseconds{0})
      item.child("every").expected("a positive duration");
  } else if (kind == "partition") {
    f.kind = fault_kind::partition;
    for (auto& g : c.items())
      f.groups.push_back(read_nodes(g));
    if (f.groups.size() < 2)
      c.expected("two or more groups of nodes, e.g. [[0, 1], [2, 3]]");
  } else if (kind == "ban") {
    f.kind = fault_kind::ban;
    f.node = read_index(c, "a node index (0, 1, ...)");
    f.reason = "banned by the run's authority";
    if (item.has("reason"))
      f.reason = item.child("reason").as_string();
  } else {
    f.kind = fault_kind::slow_link;
    auto ends = read_nodes(c);
    if (ends.size() != 2)
      c.expected("the two nodes of the link, e.g. [0, 2]");
    f.node = ends[0];
    f.peer = ends[1];
    read_duration(item, "latency", f.latency);
    read_bandwidth(item, "bandwidth", f.bandwidth);
    if (!item.has("latency") && !item.has("bandwidth"))
      item.fail("a slow link needs `latency` and/or `bandwidth`");
  }
  if (f.kind != fault_kind::preempt && !item.has("at"))
    item.fail("missing required key 'at'");
  read_duration(item, "at", f.at);
  if (f.kind == fault_kind::kill || f.kind == fault_kind::kill_node
      || f.kind == fault_kind::preempt)
    read_restart_after(item, f.restart);
  if (f.kind != fault_kind::kill && f.kind != fault_kind::kill_node && item.has("until")) {
    nanoseconds u{0};
    read_duration(item, "until", u);
    f.until = u;
  }
  item.finish();
  return f;
}

loaded_experiment read_experiment(config_node root, const role_registry& registry,
                                  const graph_load_options& opts) {
  if (!root.is_map())
    root.expected("a map of sections (experiment, roles, placement, faults, events, caf, node, "
                  "network, or a kind's section)");
  loaded_experiment out;
  auto& g = out.graph;
  if (!root.has("experiment"))
    root.fail("missing required section 'experiment'");
  experiment_options eo;
  read_section(root, "experiment", eo);
  // Every top-level key is known before any section is read, so that a misspelt section is
  // reported as what it is rather than as a consequence.
  std::vector<std::string> known{"experiment", "caf",   "node",     "network",
                                 "faults",     "events", "roles", "placement"};
  if (!eo.kind.empty()) {
    if (!registry.find_kind(eo.kind)) {
      std::string kinds;
      for (auto& k : registry.kind_names())
        kinds += (kinds.empty() ? "" : ", ") + k;
      root.child("experiment")
        .child("kind")
        .fail(fmt::format("unknown kind '{}' (known: {}; or leave it out and give `roles:`)",
                          eo.kind, kinds));
    }
    known.push_back(eo.kind);
  }
  root.allow(known);
  if (opts.seed)
    eo.seed = *opts.seed;
  if (opts.mode) {
    out.mode = *opts.mode;
  } else if (eo.mode == "sim") {
    out.mode = run_mode::sim;
  } else if (eo.mode == "cluster") {
    root.child("experiment")
      .child("mode")
      .fail("cluster mode runs as `starling node --config FILE --index I --nodes N` on each node");
  } else {
    out.mode = run_mode::local;
  }
  out.log_level = eo.log_level;
  g.name = eo.name;
  g.kind = eo.kind;
  g.seed = eo.seed;
  g.duration = eo.duration;
  g.nodes = static_cast<size_t>(eo.nodes);
  read_section(root, "caf", g.caf);
  read_section(root, "node", g.node);
  read_section(root, "network", g.network);
  if (!eo.kind.empty()) {
    if (!root.has(eo.kind))
      root.child("experiment")
        .child("kind")
        .fail(fmt::format("kind '{}' needs a section '{}' with its options", eo.kind, eo.kind));
    auto section = root.child(eo.kind);
    if (!section.is_map())
      section.expected(fmt::format("a map with the options of kind '{}'", eo.kind));
    expand_context ctx;
    ctx.mode = out.mode;
    ctx.experiment = &eo;
    registry.find_kind(eo.kind)->expand(section, g, ctx);
    section.finish();
  }
  if (root.has("roles")) {
    auto roles = root.child("roles");
    if (!roles.is_map())
      roles.expected("a map of role name -> {type, replicas, options, restart}");
    for (auto& name : roles.keys()) {
      auto r = roles.child(name);
      if (g.find(name))
        r.fail(fmt::format("role '{}' exists already{}", name,
                           eo.kind.empty() ? "" : fmt::format(" (kind '{}' defines it)", eo.kind)));
      role_spec spec;
      read_role(r, name, registry, spec);
      g.roles.push_back(std::move(spec));
    }
  } else if (eo.kind.empty()) {
    root.fail("missing `roles:` (or an `experiment.kind` whose section expands into roles)");
  }
  if (root.has("placement")) {
    auto pl = root.child("placement");
    if (!pl.is_map())
      pl.expected("a map of role name -> placement");
    for (auto& name : pl.keys()) {
      auto p = pl.child(name);
      auto i = std::find_if(g.roles.begin(), g.roles.end(),
                            [&](const role_spec& r) { return r.name == name; });
      if (i == g.roles.end())
        p.fail(fmt::format("no role named '{}'", name));
      i->placement = placement_spec{};
      read_placement(p, i->placement);
    }
  }
  if (root.has("faults")) {
    auto fs = root.child("faults");
    if (!fs.is_sequence())
      fs.expected("a list of faults, e.g. [{kill: ROLE, at: 20s}, {preempt: ROLE, every: 30s}]");
    for (auto& item : fs.items()) {
      auto f = read_fault(item);
      if ((f.kind == fault_kind::kill || f.kind == fault_kind::preempt) && !g.find(f.role))
        item.child(f.kind == fault_kind::kill ? "kill" : "preempt")
          .fail(fmt::format("no role named '{}'", f.role));
      if (!supports(out.mode, f.kind))
        item.fail(fmt::format("fault kind '{}' is not supported in {} mode", to_string(f.kind),
                              to_string(out.mode)));
      g.faults.push_back(std::move(f));
    }
  }
  if (root.has("events")) {
    auto es = root.child("events");
    if (!es.is_sequence())
      es.expected("a list of events, e.g. [{join: ROLE, at: 30s}, {leave: ROLE, instance: 2, "
                  "at: 60s}]");
    for (auto& item : es.items()) {
      auto e = read_event(item);
      if (!g.find(e.role))
        item.child(e.what == event_spec::kind::join ? "join" : "leave")
          .fail(fmt::format("no role named '{}'", e.role));
      g.events.push_back(std::move(e));
    }
  }
  root.finish();
  if (auto st = validate(g, registry, out.mode); !st)
    throw config_error(fmt::format("{}: {}", root.file(), st.what()));
  return out;
}

result<loaded_experiment> load_experiment_file(const std::string& path,
                                               const role_registry& registry,
                                               const graph_load_options& opts) {
  try {
    auto root = load_yaml_file(path);
    for (auto& o : opts.overrides)
      if (auto st = apply_override(root, o); !st)
        return fail(st.what());
    auto out = read_experiment(root, registry, opts);
    // Kept beside the results: the file itself, or with overrides the tree as it ran, headed by
    // the `--set` arguments (the file's comments are then lost).
    std::ifstream in{path};
    std::stringstream text;
    text << in.rdbuf();
    out.source_text = text.str();
    if (!opts.overrides.empty()) {
      YAML::Emitter em;
      em << root.raw();
      std::string head = "# " + path;
      for (auto& o : opts.overrides)
        head += " --set " + o;
      out.source_text = head + "\n" + em.c_str() + "\n";
    }
    return out;
  } catch (const config_error& e) {
    return fail(e.what());
  }
}

result<std::pair<caf_options, node_options>> load_node_settings(const std::string& path) {
  try {
    auto root = load_yaml_file(path);
    if (!root.is_map())
      root.expected("a map of sections");
    std::pair<caf_options, node_options> out;
    read_section(root, "caf", out.first);
    read_section(root, "node", out.second);
    return out;
  } catch (const config_error& e) {
    return fail(e.what());
  }
}

} // namespace starling::runtime
