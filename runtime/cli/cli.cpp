#include "runtime/cli/cli.hpp"

#include <csignal>

#include "runtime/cli/signals.hpp"
#include <cstdio>
#include <filesystem>
#include <pthread.h>
#include <atomic>
#include <optional>
#include <thread>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <fmt/format.h>

#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "runtime/cli/auth_cmd.hpp"
#include "runtime/cli/dht_cmd.hpp"
#include "runtime/cli/join_cmd.hpp"
#include "runtime/config/config.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/cli/commands.hpp"
#include "runtime/experiment/yaml.hpp"

#include "runtime/btard/audit.hpp"
#include "runtime/cli/version.hpp"

namespace starling::runtime {

caf::behavior ping_responder(caf::event_based_actor*, std::string name) {
  return {[name](const messages::ping_msg& m) -> caf::result<messages::ping_msg> {
    // A refused envelope (counted by the wire context) gets the reason, never an empty pong.
    if (!m.wire_error.empty())
      return caf::make_error(caf::sec::invalid_argument, "ping refused: " + m.wire_error);
    return messages::ping_msg{m.seq, name};
  }};
}

namespace {

int cli_die(const std::string& what) {
  return print_error(what);
}

/// Loads and validates an experiment file for `mode` (unset: the file's own); one clear line
/// and nothing created on any error.
result<loaded_experiment> load(const std::string& file, const role_registry& registry,
                               std::optional<run_mode> mode, std::optional<uint64_t> seed,
                               const std::vector<std::string>& sets) {
  graph_load_options lo;
  lo.mode = mode;
  lo.seed = seed;
  lo.overrides = sets;
  return load_experiment_file(file, registry, lo);
}

int cmd_run(std::string file, bool sim, std::optional<uint64_t> seed, std::string out,
            const std::vector<std::string>& sets, size_t nodes, const std::string& resume,
            const std::string& http) {
  // `--http HOST:PORT` overrides `node.http` (checked as that key is).
  if (!http.empty())
    if (auto ep = parse_endpoint(http); !ep)
      return cli_die("--http: " + ep.error().what);
  if (!resume.empty()) {
    if (!out.empty() && out != resume)
      return cli_die(fmt::format("run: --out {} and --resume {} name two folders; a resumed run "
                                 "writes into the folder it continues",
                                 out, resume));
    out = resume;
    // Without a file, the experiment as the stopped run ran it (its `--set`s applied).
    if (file.empty())
      file = resume + "/experiment.yaml";
  } else if (file.empty()) {
    return cli_die("run: an EXPERIMENT.yaml file is required (or --resume RUN_DIR)");
  }
  auto registry = builtin_registry();
  auto ex = load(file, registry, sim ? std::optional<run_mode>{run_mode::sim} : std::nullopt,
                 seed, sets);
  if (!ex)
    return cli_die(ex.error().what);
  set_log_level(parse_log_level(ex->log_level));
  if (!http.empty())
    ex->graph.node.http = http;
  return command_run(ex->graph, registry, ex->mode, nodes, out, ex->source_text,
                     !resume.empty());
}

int cmd_audit(const std::string& file, bool recompute) {
  auto report = btard::check_audit(file, recompute);
  if (!report)
    return cli_die(report.error().what);
  auto& r = *report;
  if (!r.problems.empty()) {
    fmt::print("audit: {} does NOT check ({} problem{}):\n", file, r.problems.size(),
               r.problems.size() == 1 ? "" : "s");
    for (size_t i = 0; i < r.problems.size() && i < 20; ++i)
      fmt::print("  {}\n", r.problems[i]);
    if (r.problems.size() > 20)
      fmt::print("  ... and {} more\n", r.problems.size() - 20);
    return 1;
  }
  fmt::print("audit: {} checks: {} steps, {} aggregations, {} signed statements verified, {} MPRNG "
             "draws, {} aggregate checks recomputed, {} verdicts re-derived ({} recomputed from "
             "checkpoints), {} bans\n",
             file, r.steps, r.attempts, r.statements, r.draws, r.checks, r.verdicts, r.recomputed,
             r.bans);
  if (r.resumed_at)
    fmt::print("  the peer came back into the running group at step {}: the chain starts from "
               "the randomness of the state the group signed (the steps before are in the other "
               "peers' logs)\n",
               *r.resumed_at);
  return 0;
}

int cmd_plan(const std::string& file, const std::string& mode_text, size_t nodes,
             const std::vector<std::string>& sets) {
  auto registry = builtin_registry();
  std::optional<run_mode> mode;
  if (mode_text == "sim")
    mode = run_mode::sim;
  else if (mode_text == "local")
    mode = run_mode::local;
  else if (mode_text == "cluster")
    mode = run_mode::cluster;
  else if (!mode_text.empty())
    return cli_die(fmt::format("--mode: expected sim, local or cluster, got \"{}\"", mode_text));
  auto ex = load(file, registry, mode, std::nullopt, sets);
  if (!ex)
    return cli_die(ex.error().what);
  return command_plan(ex->graph, registry, ex->mode, nodes);
}

/// Options of `starling node` beyond listen/join.
struct node_cli {
  std::string config_file;
  std::string name;
  std::optional<size_t> index;
  std::optional<size_t> nodes;
  std::string out;
  std::vector<std::string> sets;
  bool child = false;
  int incarnation = 0;
  int64_t elapsed_ms = 0;
  std::string authority;
  std::string token;
  std::string key;
  /// `--http HOST:PORT`: overrides `node.http` (node 0 serves the run's page).
  std::string http;
};

/// `starling node` without an experiment: a bare node that answers pings and pings the nodes
/// it joins (a connectivity check).
int bare_node(const std::string& listen, const std::vector<std::string>& join,
              const std::string& given_name, const std::string& config_file,
              const node_cli& cli) {
  node_options node_opts;
  caf_options caf_opts;
  if (!config_file.empty()) {
    auto settings = load_node_settings(config_file);
    if (!settings)
      return cli_die(settings.error().what);
    caf_opts = settings->first;
    node_opts = settings->second;
  }
  if (!listen.empty())
    node_opts.listen = listen;
  if (!join.empty())
    node_opts.join = join;
  if (!cli.authority.empty())
    node_opts.authority = cli.authority;
  if (!cli.token.empty())
    node_opts.token = cli.token;
  if (!cli.key.empty())
    node_opts.key_file = cli.key;
  else if (!cli.out.empty())
    node_opts.key_file = cli.out + "/node.key";
  install_shutdown_signals();
  auto name = given_name.empty() ? std::string{"node"} : given_name;
  auto n = node::start(caf_opts, node_opts, name);
  if (!n)
    return cli_die(n.error().what);
  auto& nd = **n;
  nd.register_actor("ping", nd.system().spawn(ping_responder, name));
  fmt::print("node {} listening on {}\n", name, nd.endpoint());
  print_admission(nd);
  std::fflush(stdout);
  for (auto& ep : node_opts.join) {
    auto joined = nd.join(ep, [](const std::string& who, const std::string& reason) {
      fmt::print("peer {} down: {}\n", who, reason);
      std::fflush(stdout);
    });
    if (!joined) {
      fmt::print(stderr, "starling: warning: {}\n", joined.error().what);
      continue;
    }
    caf::scoped_actor self{nd.system()};
    auto timeout = caf::timespan{caf_opts.connection_timeout};
    auto t0 = std::chrono::steady_clock::now();
    self->request(nd.resolver(), timeout, resolve_atom::value, ep + "/ping")
      .receive(
        [&](const caf::actor& peer) {
          self->request(peer, timeout, messages::ping_msg{1, name})
            .receive(
              [&](const messages::ping_msg& reply) {
                if (!reply.wire_error.empty()) {
                  fmt::print("ping {}: failed: the reply was refused: {}\n", ep, reply.wire_error);
                  return;
                }
                auto ms = std::chrono::duration<double, std::milli>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
                fmt::print("ping {}: reply from {} in {:.2f} ms\n", ep, reply.origin, ms);
              },
              [&](caf::error& e) {
                fmt::print("ping {}: failed: {}\n", ep, nd.system().render(e));
              });
        },
        [&](caf::error& e) { fmt::print("ping {}: failed: {}\n", ep, nd.system().render(e)); });
    std::fflush(stdout);
  }
  int sig = wait_for_shutdown_signal();
  fmt::print("node {} shutting down ({})\n", name, sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  nd.shutdown();
  return 0;
}

int cmd_node(const std::string& listen, const std::vector<std::string>& join,
             const node_cli& cli, const std::vector<std::string>& argv) {
  for (auto& j : join) {
    auto ep = parse_endpoint(j);
    if (!ep || ep->second == 0)
      return cli_die(
          fmt::format("--join: expected HOST:PORT with a port in [1, 65535], got \"{}\"", j));
  }
  if (!listen.empty())
    if (auto ep = parse_endpoint(listen); !ep)
      return cli_die(fmt::format("--listen: {}", ep.error().what));
  if (cli.index) {
    if (!cli.nodes)
      return cli_die("--index and --nodes go together (this node's share of the experiment)");
    if (*cli.nodes < 1 || *cli.index >= *cli.nodes)
      return cli_die(fmt::format("--index {} must be below --nodes {}", *cli.index, *cli.nodes));
    if (cli.config_file.empty())
      return cli_die("--index/--nodes need --config EXPERIMENT.yaml");
  } else if (!cli.sets.empty() && cli.config_file.empty()) {
    return cli_die("--set needs --config EXPERIMENT.yaml");
  } else if (cli.nodes && cli.config_file.empty()) {
    return cli_die("--nodes needs --config EXPERIMENT.yaml");
  }
  if (cli.config_file.empty() || (!cli.index && !cli.nodes))
    return bare_node(listen, join, cli.name, cli.config_file, cli);
  auto registry = builtin_registry();
  auto ex = load(cli.config_file, registry, run_mode::cluster, std::nullopt, cli.sets);
  if (!ex)
    return cli_die(ex.error().what);
  set_log_level(parse_log_level(ex->log_level));
  node_command nc;
  nc.listen = listen.empty() ? ex->graph.node.listen : listen;
  nc.join = join.empty() ? ex->graph.node.join : join;
  nc.volunteer = !cli.index;
  nc.index = cli.index.value_or(0);
  nc.count = *cli.nodes;
  nc.out = cli.out;
  nc.child = cli.child;
  nc.incarnation = cli.incarnation;
  nc.elapsed_ms = cli.elapsed_ms;
  nc.authority = cli.authority;
  nc.token = cli.token;
  nc.key = cli.key;
  nc.argv = argv;
  nc.config_file = cli.config_file;
  nc.sets = cli.sets;
  if (!cli.http.empty())
    ex->graph.node.http = cli.http;
  return command_node(ex->graph, registry, nc);
}

} // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"starling: decentralized training on unreliable, heterogeneous peers "
               "(SWARM, DeDLOC, DiLoCo, MASHA) on CAF actors"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");

  auto* run = app.add_subcommand("run", "Run an experiment file (configs/*.yaml) in this process");
  std::string run_file;
  bool run_sim = false;
  std::optional<uint64_t> run_seed;
  std::string run_out;
  std::vector<std::string> run_sets;
  size_t run_nodes = 0;
  std::string run_resume;
  run->add_option("experiment", run_file,
                  "Experiment YAML file (with --resume: default RUN_DIR/experiment.yaml)");
  run->add_flag("--sim", run_sim, "Simulate: virtual time and the network model");
  run->add_option("--seed", run_seed, "Override experiment.seed");
  run->add_option("--out", run_out, "Output folder (default runs/<timestamp>-<name>)");
  run->add_option("--nodes", run_nodes, "Number of nodes (default: experiment.nodes)");
  run->add_option("--resume", run_resume,
                  "Continue the stopped run in RUN_DIR (its checkpoints and trainers' progress; "
                  "same experiment, seed and mode)");
  std::string run_http;
  run->add_option("--http", run_http,
                  "Serve the run's live page, /status and /metrics at HOST:PORT (local mode; port "
                  "0: a free port, printed; default: node.http, off)");
  run->add_option("--set", run_sets,
                  "Override one value of the file: KEY.PATH=VALUE, e.g. swarm.trainers=3 or "
                  "swarm.stages[1].peers[0]=0.5 (repeatable)")
    ->allow_extra_args(false);

  auto* planc = app.add_subcommand("plan", "Print an experiment's graph and plan");
  std::string plan_file;
  std::string plan_mode;
  size_t plan_nodes = 0;
  std::vector<std::string> plan_sets;
  planc->add_option("experiment", plan_file, "Experiment YAML file")->required();
  planc->add_option("--mode", plan_mode, "sim | local | cluster (default: experiment.mode)");
  planc->add_option("--nodes", plan_nodes, "Number of nodes (default: experiment.nodes)");
  planc->add_option("--set", plan_sets, "Override one value: KEY.PATH=VALUE (repeatable)")
    ->allow_extra_args(false);

  auto* nodec = app.add_subcommand("node", "Run a cluster node until SIGINT/SIGTERM");
  std::string listen;
  std::vector<std::string> join;
  node_cli node_opts;
  nodec->add_option("--listen", listen, "HOST:PORT to listen on (port 0: the OS chooses)");
  nodec->add_option("--join", join, "HOST:PORT of a node to connect to (repeatable)");
  nodec->add_option("--config", node_opts.config_file,
                    "Experiment file (caf/node settings; with --index/--nodes, the experiment)");
  nodec->add_option("--name", node_opts.name, "Node name for logs");
  std::string node_http;
  nodec->add_option("--http", node_http,
                    "Serve the run's live page, /status, /metrics and /ledger.csv at HOST:PORT "
                    "(node 0: the full metric stream; any node: the peers' ledger; port 0: a "
                    "free port, printed; default: node.http, off)");
  nodec->add_option("--index", node_opts.index,
                    "Run share INDEX of the experiment in --config (cluster mode)");
  nodec->add_option("--nodes", node_opts.nodes, "Number of nodes the experiment is spread over");
  nodec->add_option("--out", node_opts.out, "Output folder (default runs/<timestamp>-<name>)");
  nodec->add_option("--set", node_opts.sets,
                    "Override one value of --config: KEY.PATH=VALUE (repeatable)")
    ->allow_extra_args(false);
  nodec->add_option("--authority", node_opts.authority,
                    "The run authority's public key file (authority.pub): a closed run");
  nodec->add_option("--token", node_opts.token,
                    "This node's token file (starling token issue); needs --authority");
  nodec->add_option("--key", node_opts.key,
                    "This node's key file (default OUT/node.key; created on first start)");
  // Set by a node's parent process when it (re)starts the node after a kill_node fault.
  nodec->add_flag("--child", node_opts.child)->group("");
  nodec->add_option("--incarnation", node_opts.incarnation)->group("");
  nodec->add_option("--elapsed-ms", node_opts.elapsed_ms)->group("");

  auto* dhtc = app.add_subcommand("dht", "Run a standalone DHT node, or get/store through one");
  std::string dht_listen;
  std::string dht_join;
  dhtc->add_option("--listen", dht_listen, "HOST:PORT to listen on (runs a node until SIGINT)");
  dhtc->add_option("--join", dht_join, "HOST:PORT of a DHT node to bootstrap from");
  dhtc->require_subcommand(0, 1);
  auto* dht_get = dhtc->add_subcommand("get", "Read a key through a running DHT node");
  std::string dht_node;
  std::string dht_key;
  dht_get->add_option("--node", dht_node, "HOST:PORT of the DHT node")->required();
  dht_get->add_option("key", dht_key, "Key")->required();
  auto* dht_store = dhtc->add_subcommand("store", "Store a value through a running DHT node");
  std::string dht_value;
  std::string dht_subkey;
  std::string dht_ttl = "60s";
  dht_store->add_option("--node", dht_node, "HOST:PORT of the DHT node")->required();
  dht_store->add_option("key", dht_key, "Key")->required();
  dht_store->add_option("value", dht_value, "Value")->required();
  dht_store->add_option("--subkey", dht_subkey, "Store as this sub-key of a dictionary record");
  dht_store->add_option("--ttl", dht_ttl, "Time to live (60s, 5m, 500ms)");

  auto* auditc = app.add_subcommand(
    "audit", "Check a BTARD audit log (btard-audit.jsonl): its chain, signatures, MPRNG draws, "
             "validators, aggregate checks and verdicts");
  std::string audit_file;
  bool audit_recompute = false;
  auditc->add_option("file", audit_file, "The audit log")->required();
  auditc->add_flag("--recompute", audit_recompute,
                   "Also recompute each wrong-gradient re-check from the parameter checkpoints "
                   "the run kept (btard-checkpoints/ beside the log)");

  auto* joinc = app.add_subcommand(
    "join", "Join a running run as a volunteer: admission (with a token in a closed run; "
            "without one in an open run), the run's experiment from the node reached (signed by "
            "its authority in a closed run; unsigned in an open one: you trust the node you "
            "reached), an open slot, work; Ctrl-C leaves gracefully");
  join_command jc;
  joinc->add_option("endpoints", jc.endpoints, "HOST:PORT of nodes of the run, tried in turn")
    ->required();
  joinc->add_option("--token", jc.token,
                    "Your token file (from the run's owner); leave it out to join an open run "
                    "(no authority, no token)");
  joinc->add_option("--key", jc.key,
                    "The node key the token was issued for (default ~/.starling/node.key; "
                    "joining an open run without one there makes a fresh key in the run folder)");
  joinc->add_flag("--client", jc.client,
                  "Client mode whatever the run says of this node's reachability (accept no "
                  "connection)");
  joinc->add_option("--http", jc.http, "Serve the run's live page at HOST:PORT (port 0: free)");
  joinc->add_option("--listen", jc.listen,
                    "HOST:PORT to listen on (default: the address that routes to the first "
                    "endpoint, a free port)");
  joinc->add_option("--advertise", jc.advertise,
                    "HOST:PORT the run should dial, where a NAT forwards a port to --listen "
                    "(default: where it listens); the run checks it, and client mode follows "
                    "when it cannot reach it");
  joinc->add_option("--out", jc.out,
                    "Run folder (default runs/<timestamp>-join-<experiment>; without a token "
                    "runs/<timestamp>-join-open)");

  app.add_subcommand("version", "Print the version");
  auth_commands auth{app};

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0)
      return app.exit(e);
    return cli_die(e.what());
  }
  if (auto rc = auth.run())
    return *rc;
  if (run->parsed())
    return cmd_run(run_file, run_sim, run_seed, run_out, run_sets, run_nodes, run_resume,
                   run_http);
  if (planc->parsed())
    return cmd_plan(plan_file, plan_mode, plan_nodes, plan_sets);
  if (nodec->parsed()) {
    std::vector<std::string> args(argv, argv + argc);
    if (!node_http.empty()) {
      if (node_opts.config_file.empty())
        return cli_die("--http needs --config EXPERIMENT.yaml (the endpoint serves a run)");
      if (auto ep = parse_endpoint(node_http); !ep)
        return cli_die("--http: " + ep.error().what);
      node_opts.http = node_http;
    }
    return cmd_node(listen, join, node_opts, args);
  }
  if (joinc->parsed()) {
    if (!jc.http.empty())
      if (auto ep = parse_endpoint(jc.http); !ep)
        return cli_die("--http: " + ep.error().what);
    if (!jc.listen.empty())
      if (auto ep = parse_endpoint(jc.listen); !ep)
        return cli_die("--listen: " + ep.error().what);
    return command_join(jc);
  }
  if (auditc->parsed())
    return cmd_audit(audit_file, audit_recompute);
  if (dhtc->parsed()) {
    if (dht_get->parsed())
      return cmd_dht_get(dht_node, dht_key);
    if (dht_store->parsed())
      return cmd_dht_store(dht_node, dht_key, dht_value, dht_subkey, dht_ttl);
    if (dht_listen.empty())
      return cli_die("dht: expected --listen HOST:PORT, or a get/store subcommand");
    return cmd_dht_serve(dht_listen, dht_join);
  }
  fmt::print("starling {}\n", starling_version);
  return 0;
}

} // namespace starling::runtime

