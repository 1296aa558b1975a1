#include "runtime/cli/join_cmd.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/cli/signals.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/serve.hpp"
#include "runtime/experiment/yaml.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/address.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime {

namespace auth = actors::auth;

namespace {

int join_fail(const std::string& what, int rc = 2) {
  fmt::print(stderr, "starling: error: {}\n", what);
  return rc;
}

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// The local IPv4 address this machine would use to reach `host:port` (no packet is sent: a
/// UDP socket is only connected), or 127.0.0.1 when it cannot tell.
std::string local_address_toward(const std::string& host, uint16_t port) {
  std::string out = "127.0.0.1";
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0)
    return out;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  if (::inet_pton(AF_INET, host == "localhost" ? "127.0.0.1" : host.c_str(), &to.sin_addr) == 1 &&
      ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    char text[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        ::inet_ntop(AF_INET, &me.sin_addr, text, sizeof(text)))
      out = text;
  }
  ::close(fd);
  return out;
}

/// True when two CAF settings are the same.
bool same_caf(const caf_options& a, const caf_options& b) {
  return a.scheduler_policy == b.scheduler_policy && a.max_threads == b.max_threads &&
         a.heartbeat_interval == b.heartbeat_interval &&
         a.connection_timeout == b.connection_timeout;
}

/// What the running actor system of `nd` holds of the settings the run's file sets (read back
/// from CAF, not from the file).
std::string caf_settings_text(node& nd) {
  auto& cfg = nd.system().config();
  auto ms = [](caf::timespan t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(t).count();
  };
  return fmt::format("scheduler {} with {} thread{}, heartbeat {} ms, connection timeout {} ms",
                     caf::to_string(caf::get_or(cfg, "scheduler.policy", caf::atom("?"))),
                     nd.system().scheduler().num_workers(),
                     nd.system().scheduler().num_workers() == 1 ? "" : "s",
                     ms(caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0})),
                     ms(caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0})));
}

} // namespace

token_expiry_plan plan_token_expiry(std::chrono::nanoseconds left) {
  using namespace std::chrono_literals;
  token_expiry_plan p;
  auto half = std::max(left, std::chrono::nanoseconds{0}) / 2;
  p.warn_before = std::min<std::chrono::nanoseconds>(60s, half);
  p.leave_before = std::min<std::chrono::nanoseconds>(30s, p.warn_before / 2);
  return p;
}

std::string duration_text(std::chrono::nanoseconds d) {
  auto t = std::chrono::duration_cast<std::chrono::seconds>(d).count();
  if (t < 0)
    t = 0;
  if (t >= 3600)
    return fmt::format("{} h {:02d} min", t / 3600, (t % 3600) / 60);
  if (t >= 60)
    return fmt::format("{} min {:02d} s", t / 60, t % 60);
  return fmt::format("{} s", t);
}

std::string join_refusal_hint(const std::string& line, bool with_token) {
  if (!with_token && (line.find("disconnect_during_handshake") != std::string::npos ||
                      line.find("unauthorized") != std::string::npos ||
                      line.find("no_token") != std::string::npos ||
                      line.find("admits token holders only") != std::string::npos))
    return "the run is closed: get a token from its owner (starling key init, then the owner "
           "runs starling token issue --peer-key YOUR_KEY.pub; join with --token FILE)";
  if (line.find("revoked") != std::string::npos)
    return "your token was revoked: ask the run's owner why, and for a new one";
  if (line.find("banned") != std::string::npos)
    return "your node key is banned from this run: ask the run's owner";
  if (line.find("expired") != std::string::npos)
    return "your token expired: ask the run's owner for a new one";
  if (line.find("disconnect_during_handshake") != std::string::npos ||
      line.find("unauthorized") != std::string::npos)
    return "the run is closed and did not take your credentials: get a token from its owner "
           "(starling key init, send them FILE.pub)";
  if (line.find("cannot_connect") != std::string::npos ||
      line.find("unreachable") != std::string::npos)
    return "nothing answers there: check the address, or try another node of the run";
  return {};
}

int command_join(const join_command& cmd) {
  if (cmd.endpoints.empty())
    return join_fail("join: expected HOST:PORT of one or more nodes of the run");
  for (auto& e : cmd.endpoints) {
    auto ep = parse_endpoint(e);
    if (!ep || ep->second == 0)
      return join_fail(fmt::format("join: expected HOST:PORT with a port in [1, 65535], got \"{}\"", e));
  }
  // Without a token the run must be open: no authority, admission with a plain hello, its
  // experiment accepted unsigned from the node reached. A closed run refuses such a joiner at
  // its gate (said in one line with the fix, exit 2).
  const bool open_join = cmd.token.empty();
  std::optional<auth::token> tok;
  auto now = unix_now_ns();
  if (!open_join) {
    // The token: whose run, signed by which authority, for which key, until when.
    auto file = auth::read_token_file(cmd.token);
    if (!file)
      return join_fail("--token: " + file.error().what);
    tok = std::move(file->content);
    if (tok->expires_at_ns <= now)
      return join_fail(fmt::format("--token {}: your token expired {:.0f} min ago: ask the run's "
                                   "owner for a new one",
                                   cmd.token, static_cast<double>(now - tok->expires_at_ns) / 60e9));
  }
  auto key_file = cmd.key;
  if (key_file.empty()) {
    const char* home = std::getenv("HOME");
    key_file = std::string{home ? home : "."} + "/.starling/node.key";
  }
  // An open run's joiner without a key of its own (none given, none at the default path) gets
  // a fresh one in its run folder; a key named with --key must exist.
  // (A path that cannot be looked at is loaded below, and fails with why.)
  std::error_code exists_ec;
  const bool fresh_key = open_join && cmd.key.empty() &&
                         !std::filesystem::exists(key_file, exists_ec) && !exists_ec;
  std::optional<auth::key_pair> key;
  if (!fresh_key) {
    auto loaded = auth::load_secret_key_file(key_file, auth::key_role::node);
    if (!loaded)
      return join_fail(fmt::format("--key: {} (make one with starling key init --out {})",
                                   loaded.error().what, key_file));
    key = std::move(*loaded);
  }
  if (tok && key->public_key() != tok->peer_key)
    return join_fail(fmt::format("--token {} is for peer {}, not for the key {} (peer {}): use the key "
                           "the token was issued for (--key)",
                           cmd.token, auth::to_hex(auth::peer_id_of(tok->peer_key)).substr(0, 12),
                           key_file, auth::to_hex(key->peer_id()).substr(0, 12)));
  // Without a token the experiment's name is known only once a node of the run answered.
  auto out = !cmd.out.empty() ? cmd.out
             : tok          ? default_out_dir("join-" + tok->experiment)
                            : default_out_dir("join-open");
  std::string why;
  if (!make_dirs(out, why))
    return join_fail(why);
  // The authority the token names is the one this volunteer trusts (the run's nodes check the
  // token against their own: another authority's token is refused at the hello). An open run
  // has none: the experiment is accepted unsigned from the node reached.
  const std::string authority_key = tok ? tok->authority_key : std::string{};
  auto authority_file = out + "/authority.pub";
  if (tok)
    if (auto st = auth::write_public_key_file(authority_file, tok->authority_key,
                                              auth::key_role::authority);
        !st)
      return join_fail(st.what());

  // Signals first: the actor system's threads block them (signals.hpp). A first SIGINT is a
  // graceful leave, a second quits at once.
  signal_watcher signals{true, ""};
  auto registry = builtin_registry();
  auto configure = [&registry](caf::actor_system_config& cfg) { registry.configure(cfg); };
  node_options no;
  if (!cmd.listen.empty()) {
    no.listen = cmd.listen;
  } else {
    auto first = parse_endpoint(cmd.endpoints.front());
    no.listen = local_address_toward(first->first, first->second) + ":0";
  }
  // --client: nothing listens from the start (the run's gates probe no endpoint of it).
  no.client = cmd.client;
  no.advertise = cmd.advertise;
  if (tok) {
    no.authority = authority_file;
    no.token = cmd.token;
    no.experiment = tok->experiment;
  }
  // CAF's defaults until the run's file is here (its `caf:` section applies afterwards).
  caf_options fetch_caf;
  // Which endpoints to try for admission and the experiment, in turn.
  std::vector<std::string> tries = cmd.endpoints;
  bool refused = false;
  auto report = [&](const std::string& ep, const std::string& line) {
    auto hint = join_refusal_hint(line, !open_join);
    refused = refused || (hint.find("nothing answers") == std::string::npos && !hint.empty()) ||
              line.find("refused") != std::string::npos;
    fmt::print(stderr, "starling: {}: {}{}\n", ep, line, hint.empty() ? "" : " — " + hint);
    std::fflush(stderr);
  };
  auto none_joined = [&] {
    return join_fail(fmt::format("could not join through any of the {} endpoint{} given (above)",
                                 cmd.endpoints.size(), cmd.endpoints.size() == 1 ? "" : "s"),
                     refused ? 2 : 3);
  };
  if (open_join) {
    // A hello names the run it is for, and an open run's name is its experiment's: a node in
    // client mode (it claims no endpoint) asks the endpoints in turn with no name, and the first
    // that answers names its run in its own hello (this node refuses it, having no name; see
    // admission::take_foreign_acceptor). The volunteer's node then starts with that name.
    // (Its key is a throwaway one: it never says hello.)
    node_options probe_no = no;
    probe_no.client = true;
    probe_no.advertise.clear();
    probe_no.key_file.clear();
    auto probe = node::start(fetch_caf, probe_no, "volunteer", configure);
    if (!probe)
      return join_fail(probe.error().what);
    for (size_t i = 0; i < cmd.endpoints.size() && no.experiment.empty(); ++i) {
      auto& ep = cmd.endpoints[i];
      auto asked = fetch_package(**probe, ep, std::chrono::seconds(20));
      auto run = (*probe)->gate()->admission().take_foreign_acceptor();
      if (run.closed) {
        // Its hello shows a token: its gate would refuse this hello, which has none.
        report(ep, fmt::format("a node of the closed run '{}' (its hello shows a token): it "
                               "admits token holders only",
                               run.experiment));
      } else if (!run.experiment.empty()) {
        no.experiment = run.experiment;
        tries.assign(cmd.endpoints.begin() + static_cast<std::ptrdiff_t>(i),
                     cmd.endpoints.end());
      } else {
        report(ep, asked ? std::string{"answered without naming its run"} : asked.error().what);
      }
    }
    (*probe)->shutdown();
    if (no.experiment.empty())
      return none_joined();
  }
  if (fresh_key) {
    // Made once a node of the run answered: a refused joiner leaves no key behind.
    auto made_file = out + "/node.key";
    auto made = auth::load_or_create_key(made_file, auth::key_role::node);
    if (!made)
      return join_fail(fmt::format("{} (no key at {} either: make one with starling key init)",
                                   made.error().what, key_file));
    fmt::print("{} {} (peer id {}): no key at {}; it is this run folder's own (keep it to come "
               "back as the same peer, or make yours with starling key init)\n",
               made->created ? "made a fresh node key" : "using the node key made earlier at",
               made_file, auth::to_hex(made->key.peer_id()).substr(0, 12), key_file);
    std::fflush(stdout);
    key_file = made_file;
  }
  no.key_file = key_file;
  auto started = node::start(fetch_caf, no, "volunteer", configure);
  if (!started)
    return join_fail(started.error().what);
  std::unique_ptr<node> ndp = std::move(*started);
  // No token, no expiry: an open run's volunteer leaves on SIGINT or at the run's end.
  std::optional<token_expiry_plan> expiry;
  if (tok)
    expiry = plan_token_expiry(std::chrono::nanoseconds{tok->expires_at_ns - now});
  auto where = !ndp->listening()
                 ? "in client mode (listening nowhere), named " + ndp->endpoint()
               : cmd.advertise.empty()
                 ? "listening on " + ndp->endpoint()
                 : fmt::format("listening on {}:{}, advertised as {}",
                               no.listen.substr(0, no.listen.rfind(':')), ndp->port(),
                               ndp->endpoint());
  if (tok)
    fmt::print("volunteer {} (peer id {}) {}, token {} valid for {}\n", key_file,
               auth::to_hex(ndp->peer_id()).substr(0, 12), where,
               auth::to_hex(tok->id).substr(0, 12),
               duration_text(std::chrono::nanoseconds{tok->expires_at_ns - now}));
  else
    fmt::print("volunteer {} (peer id {}) {}, no token: joining the open run '{}'\n", key_file,
               auth::to_hex(ndp->peer_id()).substr(0, 12), where, no.experiment);
  std::fflush(stdout);

  // Admission and the experiment: the endpoints in turn.
  std::optional<fetched_experiment> got;
  std::string from;
  for (auto& ep : tries) {
    auto f = fetch_experiment(*ndp, ep, authority_key, out, std::chrono::seconds(20));
    if (f) {
      got = std::move(*f);
      from = ep;
      break;
    }
    report(ep, f.error().what);
  }
  if (!got) {
    ndp->shutdown();
    return none_joined();
  }
  auto& pkg = got->package;
  auto yaml_file = out + "/experiment.yaml";
  if (auto st = auth::write_file_atomically(yaml_file, pkg.yaml, 0644); !st)
    return join_fail(st.what());
  if (!pkg.signature.empty())
    if (auto st = auth::write_file_atomically(
            yaml_file + ".sig", format_experiment_signature({pkg.digest, pkg.nodes, pkg.signature}),
            0644);
        !st)
      return join_fail(st.what());
  if (got->signature_checked)
    fmt::print("joined through {}: experiment digest {} (signed with its node count by the run's "
               "authority), {} node{}, {} named file{}; written to {}\n",
               from, auth::to_hex(pkg.digest).substr(0, 16), pkg.nodes, pkg.nodes == 1 ? "" : "s",
               pkg.files.size(), pkg.files.size() == 1 ? "" : "s", yaml_file);
  else
    fmt::print("joined an open run through {}: experiment '{}' digest {}, {} node{}, {} named "
               "file{}, written to {}; {} (no authority): you trust the node you reached\n",
               from, no.experiment, auth::to_hex(pkg.digest).substr(0, 16), pkg.nodes,
               pkg.nodes == 1 ? "" : "s", pkg.files.size(), pkg.files.size() == 1 ? "" : "s",
               yaml_file,
               pkg.signature.empty() ? "its experiment is unsigned"
                                     : "its experiment's signature is not checked");

  // Reachability: the gate's verdict on the endpoint this node's hello claimed.
  auto overrides = pkg.sets;
  overrides.insert(overrides.end(), got->file_sets.begin(), got->file_sets.end());
  bool client = cmd.client || !pkg.reachable;
  if (cmd.client) {
    fmt::print("client mode (--client): this node accepts no connections (the run reaches it "
               "over the ones it opens), averages with bandwidth 0 and serves no state; its DHT "
               "node serves nobody and enters no routing table\n");
  } else if (!pkg.reachable) {
    if (cmd.advertise.empty())
      fmt::print("client mode: {} could not reach this node at {} ({}); to work in full mode, "
                 "open TCP port {} to this machine (or forward it) and join again\n",
                 from, pkg.endpoint.empty() ? ndp->endpoint() : pkg.endpoint, pkg.reach_detail,
                 ndp->port());
    else
      fmt::print("client mode: {} could not reach this node at {} ({}); to work in full mode, "
                 "forward {} to port {} of this machine and join again\n",
                 from, pkg.endpoint.empty() ? ndp->endpoint() : pkg.endpoint, pkg.reach_detail,
                 ndp->endpoint(), ndp->port());
  } else {
    fmt::print("reachable: {} reached this node at {}; full mode\n", from, pkg.endpoint);
  }
  std::fflush(stdout);
  if (client) {
    // (node.client is set on the loaded graph below: `--set` cannot add a key to a file without
    // a `node:` section.)
    if (pkg.yaml.find("dedloc:") != std::string::npos)
      overrides.push_back("dedloc.mode=client");
    else if (pkg.yaml.find("swarm:") != std::string::npos)
      fmt::print("client mode: the trainers reach this volunteer's stage over the connections it "
                 "opens to every node of the run (nodes that start later too)\n");
    else
      fmt::print("note: this run's kind has no client mode; its peers may fail to reach this "
                 "node\n");
  }
  graph_load_options lo;
  lo.mode = run_mode::cluster;
  lo.overrides = overrides;
  auto ex = load_experiment_file(yaml_file, registry, lo);
  if (!ex) {
    ndp->shutdown();
    return join_fail("the run's experiment does not load here: " + ex.error().what);
  }
  set_log_level(parse_log_level(ex->log_level));
  auto& g = ex->graph;
  if (open_join && g.name != no.experiment) {
    // An open run's envelopes carry its experiment's name: a node that names its run one way
    // and serves an experiment named another could not be worked with.
    ndp->shutdown();
    return join_fail(fmt::format("{} names its run '{}' and serves the experiment '{}': not an "
                                 "open run's node this volunteer can work with",
                                 from, no.experiment, g.name));
  }
  g.node.client = client;
  if (!cmd.http.empty())
    g.node.http = cmd.http;
  auto p = make_plan(g, run_mode::cluster, pkg.nodes, g.seed);
  if (!p) {
    ndp->shutdown();
    return join_fail(p.error().what);
  }
  size_t open = 0;
  for (auto& x : p->instances)
    open += x.node ? 0 : 1;
  if (open == 0) {
    ndp->shutdown();
    return join_fail(fmt::format("the run '{}' takes no volunteers: its file plans no open slot "
                                 "(for dedloc: dedloc.volunteers)",
                                 g.name));
  }
  // The run's CAF settings (scheduler, heartbeats, connection timeout) and its run-wide node
  // settings (the data endpoint, its congestion control) are read when a node starts: the node
  // starts again with them, on the port the run just checked (the reachability verdict holds
  // for it). Where a node runs and whom it trusts (listen, join, keys, tokens, the authority)
  // stay this volunteer's own; TLS and envelope signing are what this node already used to be
  // admitted.
  // A node the run cannot reach starts again in client mode: it stops listening (nothing the
  // run does may depend on dialling it) and keeps its endpoint as its name.
  if (!same_caf(g.caf, fetch_caf) || g.node.data_endpoint != no.data_endpoint ||
      g.node.congestion_control != no.congestion_control || (client && ndp->listening())) {
    auto listen = fmt::format("{}:{}", no.listen.substr(0, no.listen.rfind(':')), ndp->port());
    ndp->shutdown();
    ndp.reset();
    no.listen = listen;
    no.client = client;
    no.data_endpoint = g.node.data_endpoint;
    no.congestion_control = g.node.congestion_control;
    auto again = node::start(g.caf, no, "volunteer", configure);
    if (!again)
      return join_fail(fmt::format("the node could not start again with the run's settings on {} "
                                   "(the port the run checked): {}; join again",
                                   listen, again.error().what),
                       3);
    ndp = std::move(*again);
    if (client)
      fmt::print("the run's settings apply: {} (the node started again in client mode, named "
                 "{} by its peer id: nothing listens, the run reaches it over the connections "
                 "it opens)\n",
                 caf_settings_text(*ndp), ndp->endpoint());
    else
      fmt::print("the run's settings apply: {} (the node started again on {})\n",
                 caf_settings_text(*ndp), ndp->endpoint());
  } else {
    fmt::print("the run's settings apply: {}\n", caf_settings_text(*ndp));
  }
  std::fflush(stdout);
  auto& nd = *ndp;
  // Later joiners may come through this node too.
  {
    auto served = pkg;
    served.reachable = false;
    served.endpoint.clear();
    served.reach_detail.clear();
    nd.register_actor(experiment_server_name,
                      spawn_experiment_server(nd.system(), std::move(served), nd.gate()));
  }
  // Stop on the first signal, or ahead of the token's expiry (warned before): the run's gates
  // refuse the token from its expiry on, so the leave is stored while they still admit it.
  auto stopped = signals.stopped();
  auto expires = tok ? tok->expires_at_ns : int64_t{0};
  auto warn_at = expiry ? expires - expiry->warn_before.count() : int64_t{0};
  auto leave_at = expiry ? expires - expiry->leave_before.count() : int64_t{0};
  const bool expiring = expiry.has_value();
  auto warned = std::make_shared<bool>(false);
  auto expired = std::make_shared<bool>(false);
  cluster_settings s;
  s.volunteer = true;
  s.count = pkg.nodes;
  s.join = {from};
  for (auto& ep : cmd.endpoints)
    if (ep != from)
      s.join.push_back(ep);
  s.out_dir = out;
  s.graceful_leave = true;
  s.watch_nodes = true;
  // The line follows the ledger: the summaries it reads are published every `ledger_every`.
  s.contribution_every =
      std::max<std::chrono::nanoseconds>(std::chrono::seconds(1), g.node.ledger_every);
  s.stop = [=] {
    if (stopped())
      return true;
    if (!expiring)
      return false;
    auto t = unix_now_ns();
    if (!*warned && t >= warn_at) {
      *warned = true;
      fmt::print("warning: your token expires in {}; this node leaves the run gracefully in {}, "
                 "while the run still admits it (ask the run's owner for a new token)\n",
                 duration_text(std::chrono::nanoseconds{expires - t}),
                 duration_text(std::chrono::nanoseconds{std::max<int64_t>(0, leave_at - t)}));
      std::fflush(stdout);
    }
    if (t >= leave_at && !*expired) {
      *expired = true;
      fmt::print("your token expires in {}: leaving the run gracefully now\n",
                 duration_text(std::chrono::nanoseconds{expires - t}));
      std::fflush(stdout);
    }
    return *expired;
  };
  int rc = run_cluster_node(g, registry, nd, s);
  if (*expired)
    fmt::print("volunteer: left ahead of its token's expiry ({}); join again with a new token\n",
               rc == 0 ? "every acknowledgement in" : "an acknowledgement missing");
  fmt::print("volunteer shutting down\n");
  std::fflush(stdout);
  nd.shutdown();
  return rc;
}

} // namespace starling::runtime
