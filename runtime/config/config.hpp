// Typed, validated options of an experiment file (see configs/reference.yaml for every key).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/result.hpp"
#include "runtime/config/reader.hpp"

namespace starling::runtime {

using namespace std::chrono_literals;

/// CAF's own settings; 0.17.6 leaves heartbeats and connection timeouts off unless set.
struct caf_options {
  /// `stealing` (CAF's default) or `sharing` (fewer idle polling threads next to LibTorch).
  std::string scheduler_policy = "stealing";
  /// Scheduler worker threads.
  int64_t max_threads = 2;
  /// How often a node sends BASP heartbeats to connected nodes.
  std::chrono::milliseconds heartbeat_interval{1000};
  /// A connected node silent for this long is considered dead (its actors go down).
  std::chrono::milliseconds connection_timeout{5000};
};

/// Where a node listens and whom it contacts first.
struct node_options {
  /// `HOST:PORT` to publish on; port 0 lets the OS choose.
  std::string listen = "127.0.0.1:0";
  /// `HOST:PORT` the node claims in its hellos and names itself by, where others reach it (a
  /// port forwarded to `listen` through a NAT); empty: `listen` as bound. (`starling join
  /// --advertise`; not a YAML key.)
  std::string advertise;
  /// `HOST:PORT` of nodes to connect to at start.
  std::vector<std::string> join;
  /// Open a direct data endpoint for bulk tensor transfers (actors/transfer/data_channel.hpp)
  /// beside BASP. Only where `listen` is a loopback host: other nodes use BASP chunks.
  bool data_endpoint = true;
  /// TCP congestion control of the data endpoint's links (the averager's rounds, state
  /// downloads, tensor transfers): an algorithm of this kernel ("cubic", "bbr", "reno"...), or
  /// "system" for the kernel's default (actors/transfer/transport.hpp says why cubic by default).
  std::string congestion_control = "cubic";
  /// The experiment id every envelope this node sends carries and every arriving one must carry
  /// (set by the runner from the experiment's name, not read from a file; empty for a node
  /// outside an experiment, such as `starling dht`).
  std::string experiment;
  /// The node's identity: a secret key file, created with a fresh key on the first start (mode
  /// 0600) and loaded on later ones; its peer id is the sender of every envelope. Empty: a fresh
  /// key for this process only.
  std::string key_file;
  /// The run authority's public key file (`authority.pub`): the run admits only nodes with a
  /// token it signed, over encrypted channels. Empty: an open run (said at start).
  std::string authority;
  /// This node's token file (`starling token issue ... --out FILE`: the token, the node's TLS
  /// certificate and the run's CA). Required with `authority`; its experiment id becomes the
  /// node's.
  std::string token;
  /// Encrypt and authenticate connections with caf_openssl when the token file carries the
  /// node's certificate and the run's CA. Default on (only with `authority`).
  bool tls = true;
  /// Sign every envelope with the node key, and refuse arriving envelopes that are not signed by
  /// the key their sender was admitted with (messages/README.md, "Signed envelopes"), so that a
  /// member cannot speak for another. Default on (only with `authority`; both sides of a run
  /// must agree: a node that signs refuses unsigned envelopes).
  bool sign_envelopes = true;
  /// `HOST:PORT` of the node's HTTP endpoint (the live page, `/status`, `/metrics`; port 0: a
  /// free one, printed at start). Empty: none. Loopback unless the user names another address.
  std::string http;
  /// How often each peer publishes its contribution summary in the DHT (the ledger any node's
  /// page reads; 0: never). In simulation only a run that is served (`http`) publishes.
  std::chrono::milliseconds ledger_every{5000};
  /// Client mode (`starling join --client`, or a joiner the run cannot reach): the node listens
  /// nowhere (no BASP listener, a data endpoint without listener; its hellos claim no endpoint,
  /// and the nodes it reaches answer over the connections it opened), and its DHT serves nobody
  /// and enters no routing table (actors/dht: `dht_options::client`). `listen` still names the
  /// node (port 0: a port the OS picks and frees at once).
  bool client = false;
  /// The most volunteers (nodes started without `--index`) the run takes at once, the plan's
  /// open slots included; 0: no limit (beyond the open slots, a volunteer takes an extra
  /// instance of an open role). Read from the run's file.
  int64_t max_volunteers = 0;
};

/// One simulated link direction.
struct link_options {
  /// One-way propagation delay.
  std::chrono::nanoseconds latency = 20ms;
  /// Bytes per second; transfers on a link queue behind each other.
  double bandwidth = 100e6;
  /// Probability that a message is dropped.
  double loss = 0.0;
};

/// A link between two simulated nodes that differs from the default.
struct link_override {
  std::string from;
  std::string to;
  link_options link;
};

/// The simulation's network model.
struct network_options {
  link_options defaults;
  std::vector<link_override> links;
  /// Simulated nodes (`node3`) that accept no connection, as behind a firewall or a NAT: a
  /// message reaches one only from a node it sent to first (the connection it opened); any
  /// other is dropped and counted. Its DHT node is a client (it serves nobody).
  std::vector<std::string> firewalled;
};

/// What the experiment is and how it runs.
struct experiment_options {
  /// A name for logs and the output folder.
  std::string name = "experiment";
  /// Which workload runs; the file holds a section of the same name with its options.
  std::string kind;
  /// Seed of every random choice in the run.
  uint64_t seed = 42;
  /// `local` (one process, real time), `sim` (virtual time) or `cluster`.
  std::string mode = "local";
  /// How long the run lasts (wall or virtual time, by mode).
  std::chrono::nanoseconds duration = 60s;
  /// Log level: `debug`, `info`, `warning` or `error`.
  std::string log_level = "info";
  /// Nodes of the run (`starling node --nodes` overrides it in cluster mode); 0 or `auto` = one
  /// node per role instance (pinned roles share their pinned nodes).
  int64_t nodes = 0;
};

/// Reads each options struct from its section (absent keys keep their defaults).
void read_options(config_node& n, caf_options& out);
void read_options(config_node& n, node_options& out);
void read_options(config_node& n, link_options& out);
void read_options(config_node& n, network_options& out);
void read_options(config_node& n, experiment_options& out);

/// Reads `key` of `parent` as a section into `out`: absent keeps the defaults; present must be a
/// map with known keys only (`read_options(config_node&, T&)` reads it).
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

/// Splits `HOST:PORT` (port 0–65535); failure names the bad part.
result<std::pair<std::string, uint16_t>> parse_endpoint(const std::string& text);

} // namespace starling::runtime
