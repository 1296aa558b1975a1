#include "runtime/config/config.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace starling::runtime {

namespace {

/// Reads `key` as a section: absent keeps defaults; present must be a map with known keys only.
template <class T>
void read_section(config_node& parent, const std::string& key, T& out) {
  if (!parent.has(key))
    return;
  auto c = parent.child(key);
  if (!c.is_map())
    c.expected("a map");
  read_options(c, out);
  c.finish();
}

} // namespace

void read_options(config_node& n, caf_options& out) {
  if (n.has("scheduler")) {
    auto s = n.child("scheduler");
    if (!s.is_map())
      s.expected("a map");
    read_choice(s, "policy", out.scheduler_policy, {"stealing", "sharing"});
    read_int(s, "max_threads", out.max_threads, 1, 256);
    s.finish();
  }
  if (n.has("middleman")) {
    auto m = n.child("middleman");
    if (!m.is_map())
      m.expected("a map");
    read_duration(m, "heartbeat_interval", out.heartbeat_interval);
    read_duration(m, "connection_timeout", out.connection_timeout);
    m.finish();
  }
}

void read_options(config_node& n, node_options& out) {
  if (n.has("listen")) {
    auto c = n.child("listen");
    out.listen = c.as_string();
    if (auto ep = parse_endpoint(out.listen); !ep)
      c.expected("HOST:PORT with a port in [0, 65535]");
  }
  if (n.has("join")) {
    auto c = n.child("join");
    out.join.clear();
    for (auto& item : c.items()) {
      auto s = item.as_string();
      if (auto ep = parse_endpoint(s); !ep || ep->second == 0)
        item.expected("HOST:PORT with a port in [1, 65535]");
      out.join.push_back(s);
    }
  }
  read(n, "data_endpoint", out.data_endpoint);
}

void read_options(config_node& n, link_options& out) {
  read_duration(n, "latency", out.latency);
  read_bandwidth(n, "bandwidth", out.bandwidth);
  read_real(n, "loss", out.loss, 0.0, 1.0);
}

void read_options(config_node& n, network_options& out) {
  read_section(n, "defaults", out.defaults);
  if (n.has("links")) {
    for (auto& item : n.child("links").items()) {
      if (!item.is_map())
        item.expected("a map with from, to and link settings");
      item.allow({"from", "to", "latency", "bandwidth", "loss"});
      link_override o;
      o.link = out.defaults;
      if (!item.has("from") || !item.has("to"))
        item.fail("missing required key 'from' or 'to'");
      read(item, "from", o.from);
      read(item, "to", o.to);
      read_options(item, o.link);
      item.finish();
      out.links.push_back(std::move(o));
    }
  }
}

void read_options(config_node& n, fault_options& out) {
  read_real(n, "preemptions_per_hour", out.preemptions_per_hour, 0.0, 1e6);
  read_duration(n, "restart_delay", out.restart_delay);
  if (n.has("schedule")) {
    for (auto& item : n.child("schedule").items()) {
      if (!item.is_map())
        item.expected("a map with at, action and target");
      item.allow({"at", "action", "target", "peer", "restart_after"});
      fault_event ev;
      if (!item.has("at"))
        item.fail("missing required key 'at'");
      read_duration(item, "at", ev.at);
      if (!item.has("action"))
        item.fail("missing required key 'action'");
      read_choice(item, "action", ev.action,
                  {"kill_node", "kill_actor", "restart_node", "partition", "heal"});
      if (!item.has("target"))
        item.fail("missing required key 'target'");
      read(item, "target", ev.target);
      read(item, "peer", ev.peer);
      if ((ev.action == "partition" || ev.action == "heal") && ev.peer.empty())
        item.fail(fmt::format("action '{}' needs a 'peer' node", ev.action));
      if (item.has("restart_after")) {
        auto c = item.child("restart_after");
        if (c.is_scalar() && c.as_string() == "never")
          ev.restart_after = std::chrono::nanoseconds{-2};
        else
          read_duration(item, "restart_after", ev.restart_after);
      }
      item.finish();
      out.schedule.push_back(std::move(ev));
    }
  }
}

void read_options(config_node& n, experiment_options& out) {
  read(n, "name", out.name);
  read(n, "kind", out.kind);
  int64_t seed = static_cast<int64_t>(out.seed);
  read_int(n, "seed", seed, 0, INT64_MAX);
  out.seed = static_cast<uint64_t>(seed);
  read_choice(n, "mode", out.mode, {"local", "sim", "cluster"});
  read_duration(n, "duration", out.duration);
  read_choice(n, "log_level", out.log_level, {"debug", "info", "warning", "error"});
}

namespace {

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (auto& x : names)
    out += (out.empty() ? "" : ", ") + x;
  return out;
}

bool contains(const std::vector<std::string>& names, const std::string& x) {
  return std::find(names.begin(), names.end(), x) != names.end();
}

} // namespace

experiment_config parse_experiment(config_node root, const std::vector<std::string>& kinds) {
  if (!root.is_map())
    root.expected("a map of sections (experiment, caf, node, network, faults, ...)");
  std::vector<std::string> sections{"experiment", "caf", "node", "network", "faults"};
  experiment_config cfg;
  cfg.document = root.raw();
  if (!root.has("experiment")) {
    // A misspelt `experiment:` is an unknown key, not a missing section.
    if (!kinds.empty()) {
      auto all = sections;
      all.insert(all.end(), kinds.begin(), kinds.end());
      root.allow(all);
    }
    root.fail("missing required section 'experiment'");
  }
  // The experiment section names the kind, whose section is the one other top-level key allowed;
  // every top-level key is checked before the other sections are read.
  read_section(root, "experiment", cfg.experiment);
  const auto& kind = cfg.experiment.kind;
  if (!kinds.empty() && !kind.empty() && !contains(kinds, kind))
    root.child("experiment")
      .child("kind")
      .expected(fmt::format("a known kind ({})", join(kinds)));
  const YAML::Node& top = root.raw(); // a lookup that neither inserts nor marks a key known
  if (kind.empty())
    for (auto& k : kinds)
      if (top[k].IsDefined())
        root.child(k).fail(fmt::format("a '{}' section needs 'kind: {}' in the experiment section",
                                       k, k));
  auto allowed = sections;
  if (!kind.empty())
    allowed.push_back(kind);
  root.allow(allowed);
  read_section(root, "caf", cfg.caf);
  read_section(root, "node", cfg.node);
  read_section(root, "network", cfg.network);
  read_section(root, "faults", cfg.faults);
  if (!cfg.experiment.kind.empty()) {
    if (!root.has(cfg.experiment.kind)) {
      auto e = root.child("experiment").child("kind");
      e.fail(fmt::format("kind '{}' needs a section '{}' with its options",
                         cfg.experiment.kind, cfg.experiment.kind));
    }
    cfg.workload = root.child(cfg.experiment.kind);
  }
  root.finish();
  return cfg;
}

result<experiment_config> load_experiment(const std::string& path, const load_options& opts) {
  try {
    auto root = load_yaml_file(path);
    for (auto& o : opts.overrides)
      if (auto st = apply_override(root, o); !st)
        return fail(st.what());
    return parse_experiment(root, opts.kinds);
  } catch (const config_error& e) {
    return fail(e.what());
  }
}

status save_experiment(const std::string& file, const experiment_config& cfg,
                       const std::vector<std::string>& overrides, const std::string& to) {
  std::error_code ec;
  if (overrides.empty()) {
    std::filesystem::copy_file(file, to, std::filesystem::copy_options::overwrite_existing, ec);
    if (ec)
      return fail(fmt::format("cannot copy {} to {}: {}", file, to, ec.message()));
    return {};
  }
  std::ofstream out{to};
  out << "# " << file;
  for (auto& o : overrides)
    out << " --set " << o;
  out << "\n" << YAML::Dump(cfg.document) << "\n";
  if (!out)
    return fail(fmt::format("cannot write {}", to));
  return {};
}

result<std::pair<std::string, uint16_t>> parse_endpoint(const std::string& text) {
  auto pos = text.rfind(':');
  if (pos == std::string::npos || pos == 0 || pos + 1 == text.size())
    return fail(fmt::format("expected HOST:PORT, got \"{}\"", text));
  auto host = text.substr(0, pos);
  auto port_str = text.substr(pos + 1);
  uint32_t port = 0;
  for (char c : port_str) {
    if (c < '0' || c > '9' || port > 65535)
      return fail(fmt::format("expected a port in [0, 65535], got \"{}\"", port_str));
    port = port * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port > 65535)
    return fail(fmt::format("expected a port in [0, 65535], got \"{}\"", port_str));
  return std::make_pair(host, static_cast<uint16_t>(port));
}

} // namespace starling::runtime
