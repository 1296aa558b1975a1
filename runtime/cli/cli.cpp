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
#include "runtime/cli/dht_cmd.hpp"
#include "runtime/config/config.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/run/workload.hpp"

#ifndef STARLING_VERSION
#  define STARLING_VERSION "0.1.0"
#endif

namespace starling::runtime {

namespace {

/// Prints one clear line and returns the failure exit code.
int die(const std::string& what) {
  fmt::print(stderr, "starling: error: {}\n", what);
  return 2;
}

/// How the CLI loads an experiment file: `--set` overrides, and the kinds there are.
load_options cli_load_options(const std::vector<std::string>& sets) {
  load_options opts;
  opts.overrides = sets;
  for (auto& kv : workloads())
    opts.kinds.push_back(kv.first);
  return opts;
}

/// Runs the kind's own reader over its section; the error line, or empty when it is valid.
std::string validate_kind(const workload& w, const experiment_config& cfg, bool simulate) {
  try {
    w.validate(cfg, simulate);
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

int cmd_run(const std::string& file, bool sim, std::optional<uint64_t> seed,
            const std::string& out_opt, const std::vector<std::string>& sets) {
  const auto& table = workloads();
  auto cfg = load_experiment(file, cli_load_options(sets));
  if (!cfg)
    return die(cfg.error().what);
  if (seed)
    cfg->experiment.seed = *seed;
  set_log_level(parse_log_level(cfg->experiment.log_level));
  auto i = table.find(cfg->experiment.kind);
  if (i == table.end()) {
    std::string known;
    for (auto& kv : table)
      known += (known.empty() ? "" : ", ") + kv.first;
    return die(fmt::format("{}: experiment.kind: unknown kind '{}' (known: {})", file,
                           cfg->experiment.kind, known));
  }
  run_context ctx;
  ctx.simulate = sim || cfg->experiment.mode == "sim";
  // The whole file, the kind's section included, validates before anything is created.
  if (auto why = validate_kind(i->second, *cfg, ctx.simulate); !why.empty())
    return die(why);
  ctx.out_dir = out_opt.empty() ? default_out_dir(cfg->experiment.name) : out_opt;
  std::string why;
  if (!make_dirs(ctx.out_dir, why))
    return die(why);
  if (auto st = save_experiment(file, *cfg, sets, ctx.out_dir + "/experiment.yaml"); !st)
    return die(st.what());
  fmt::print("starling {}: running '{}' ({}, {} mode, seed {}), output in {}\n",
             STARLING_VERSION, cfg->experiment.name, cfg->experiment.kind,
             ctx.simulate ? "sim" : cfg->experiment.mode, cfg->experiment.seed, ctx.out_dir);
  try {
    return i->second.run(*cfg, ctx);
  } catch (const config_error& e) {
    return die(e.what());
  }
}

/// Options of `starling node` beyond listen/join.
struct node_cli {
  std::string config_file;
  std::string name;
  std::optional<size_t> index;
  std::optional<size_t> nodes;
  std::string out;
  /// `--set key.path=value` overrides of the experiment file.
  std::vector<std::string> sets;
};

int cmd_node(const std::string& listen, const std::vector<std::string>& join,
             const node_cli& cli) {
  caf_options caf_opts;
  node_options node_opts;
  std::optional<experiment_config> experiment;
  if (!cli.sets.empty() && cli.config_file.empty())
    return die("--set needs --config EXPERIMENT.yaml");
  if (!cli.config_file.empty()) {
    auto cfg = load_experiment(cli.config_file, cli_load_options(cli.sets));
    if (!cfg)
      return die(cfg.error().what);
    // The kind's section validates before the node starts or creates anything.
    if (auto w = workloads().find(cfg->experiment.kind); w != workloads().end())
      if (auto why = validate_kind(w->second, *cfg, false); !why.empty())
        return die(why);
    caf_opts = cfg->caf;
    node_opts = cfg->node;
    experiment = std::move(*cfg);
  }
  const workload* job = nullptr;
  if (cli.index || cli.nodes) {
    if (!cli.index || !cli.nodes)
      return die("--index and --nodes go together (this node's share of the experiment)");
    if (*cli.nodes < 1 || *cli.index >= *cli.nodes)
      return die(fmt::format("--index {} must be below --nodes {}", *cli.index, *cli.nodes));
    if (!experiment)
      return die("--index/--nodes need --config EXPERIMENT.yaml");
    auto i = workloads().find(experiment->experiment.kind);
    if (i == workloads().end() || !i->second.cluster)
      return die(fmt::format("{}: experiment kind '{}' has no cluster mode", cli.config_file,
                             experiment->experiment.kind));
    job = &i->second;
    set_log_level(parse_log_level(experiment->experiment.log_level));
  }
  if (!listen.empty()) {
    if (auto ep = parse_endpoint(listen); !ep)
      return die(fmt::format("--listen: {}", ep.error().what));
    node_opts.listen = listen;
  }
  for (auto& j : join) {
    auto ep = parse_endpoint(j);
    if (!ep || ep->second == 0)
      return die(fmt::format("--join: expected HOST:PORT with a port in [1, 65535], got \"{}\"",
                             j));
    node_opts.join.push_back(j);
  }
  install_shutdown_signals();
  auto name = cli.name.empty() ? std::string{"node"} : cli.name;
  auto n = node::start(caf_opts, node_opts, name);
  if (!n)
    return die(n.error().what);
  auto& nd = **n;
  nd.register_actor("ping", nd.system().spawn([name](caf::event_based_actor*) -> caf::behavior {
    return {[=](const messages::ping_msg& m) { return messages::ping_msg{m.seq, name}; }};
  }));
  fmt::print("node {} listening on {}\n", name, nd.endpoint());
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
  if (job) {
    // The experiment runs on this thread; a watcher thread turns SIGINT/SIGTERM into a stop flag.
    cluster_context ctx;
    ctx.index = *cli.index;
    ctx.count = *cli.nodes;
    ctx.join = node_opts.join;
    ctx.out_dir = cli.out.empty() ? default_out_dir(experiment->experiment.name + "-node"
                                                    + std::to_string(ctx.index))
                                  : cli.out;
    std::string why;
    if (!make_dirs(ctx.out_dir, why))
      return die(why);
    auto stop = std::make_shared<std::atomic<bool>>(false);
    ctx.stop = [stop] { return stop->load(); };
    std::thread watcher{[stop] {
      if (wait_for_shutdown_signal() != 0)
        stop->store(true);
    }};
    int rc = 2;
    try {
      rc = job->cluster(*experiment, nd, ctx);
    } catch (const config_error& e) {
      rc = die(e.what());
    }
    if (!stop->load())
      wake_shutdown_waiter();
    watcher.join();
    fmt::print("node {} shutting down\n", name);
    std::fflush(stdout);
    nd.shutdown();
    return rc;
  }
  int sig = wait_for_shutdown_signal();
  fmt::print("node {} shutting down ({})\n", name, sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  nd.shutdown();
  return 0;
}

} // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"starling: decentralized training on unreliable, heterogeneous peers "
               "(SWARM, BTARD, MASHA, DeDLOC) on CAF actors"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");

  auto* run = app.add_subcommand("run", "Run an experiment file (configs/*.yaml)");
  std::string run_file;
  bool run_sim = false;
  std::optional<uint64_t> run_seed;
  std::string run_out;
  run->add_option("experiment", run_file, "Experiment YAML file")->required();
  run->add_flag("--sim", run_sim, "Simulate: virtual time and the network model");
  run->add_option("--seed", run_seed, "Override experiment.seed");
  run->add_option("--out", run_out, "Output folder (default runs/<timestamp>-<name>)");
  std::vector<std::string> run_sets;
  run->add_option("--set", run_sets,
                  "Override one value of the file: KEY.PATH=VALUE, e.g. swarm.trainers=3 or "
                  "swarm.stages[1].peers[0]=0.5 (repeatable)")
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
  nodec->add_option("--index", node_opts.index,
                    "Run share INDEX of the experiment in --config (cluster mode)");
  nodec->add_option("--nodes", node_opts.nodes, "Number of nodes the experiment is spread over");
  nodec->add_option("--out", node_opts.out, "Output folder (default runs/<timestamp>-<name>)");
  nodec->add_option("--set", node_opts.sets,
                    "Override one value of --config: KEY.PATH=VALUE (repeatable)")
    ->allow_extra_args(false);

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

  app.add_subcommand("version", "Print the version");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0)
      return app.exit(e);
    return die(e.what());
  }
  if (run->parsed())
    return cmd_run(run_file, run_sim, run_seed, run_out, run_sets);
  if (nodec->parsed())
    return cmd_node(listen, join, node_opts);
  if (dhtc->parsed()) {
    if (dht_get->parsed())
      return cmd_dht_get(dht_node, dht_key);
    if (dht_store->parsed())
      return cmd_dht_store(dht_node, dht_key, dht_value, dht_subkey, dht_ttl);
    if (dht_listen.empty())
      return die("dht: expected --listen HOST:PORT, or a get/store subcommand");
    return cmd_dht_serve(dht_listen, dht_join);
  }
  fmt::print("starling {}\n", STARLING_VERSION);
  return 0;
}

} // namespace starling::runtime
