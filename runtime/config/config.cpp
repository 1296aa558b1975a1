#include "runtime/config/config.hpp"

#include <fmt/format.h>

#include "actors/transfer/socket_io.hpp"

namespace starling::runtime {

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
  if (n.has("congestion_control")) {
    auto c = n.child("congestion_control");
    out.congestion_control = c.as_string();
    // Whether this kernel has it is checked when the node opens its endpoint (one it lacks
    // leaves the system's, said in the log).
    if (!actors::transfer::congestion_control_name(out.congestion_control))
      c.expected("a TCP congestion control's name (cubic, bbr, reno...) or system");
  }
  if (n.has("authority"))
    out.authority = n.child("authority").as_string();
  if (n.has("token"))
    out.token = n.child("token").as_string();
  if (n.has("http")) {
    auto c = n.child("http");
    out.http = c.as_string();
    if (!out.http.empty() && !parse_endpoint(out.http))
      c.expected("HOST:PORT with a port in [0, 65535] (or \"\" for no endpoint)");
  }
  read(n, "tls", out.tls);
  read(n, "sign_envelopes", out.sign_envelopes);
  read_duration(n, "ledger_every", out.ledger_every);
  read(n, "client", out.client);
  read_int(n, "max_volunteers", out.max_volunteers, 0, 1000000);
  if (out.authority.empty() != out.token.empty())
    n.child(out.authority.empty() ? "token" : "authority")
      .expected(out.authority.empty() ? "node.authority (the run's authority.pub) beside node.token"
                                      : "node.token (this node's token file) beside node.authority");
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
  if (n.has("firewalled")) {
    out.firewalled.clear();
    for (auto& item : n.child("firewalled").items()) {
      auto s = item.as_string();
      if (s.empty())
        item.expected("a node's name (node3)");
      out.firewalled.push_back(s);
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
  if (n.has("nodes")) {
    auto c = n.child("nodes");
    if (c.is_scalar() && c.as_string() == "auto")
      out.nodes = 0;
    else
      read_int(n, "nodes", out.nodes, 1, 1000000);
  }
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
