#include "runtime/cli/commands.hpp"

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/auth/identity.hpp"
#include "actors/auth/refusal.hpp"
#include "runtime/cli/signals.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/experiment/serve.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"

#include "runtime/cli/version.hpp"

namespace starling::runtime {

namespace {

int cmd_die(const std::string& what) {
  return print_error(what);
}

/// The command line without `--listen X` / `--listen=X` (the parent gives its child its own).
std::vector<std::string> without_listen(const std::vector<std::string>& argv) {
  std::vector<std::string> out;
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--listen") {
      ++i;
      continue;
    }
    if (argv[i].rfind("--listen=", 0) == 0)
      continue;
    out.push_back(argv[i]);
  }
  return out;
}

/// A child process of the parent: its stdout comes through a pipe the parent echoes.
struct child_process {
  pid_t pid = -1;
  int out = -1;
  std::string buf;
};

child_process spawn_child(const std::vector<std::string>& args) {
  child_process c;
  int fds[2];
  if (::pipe(fds) != 0)
    return c;
  c.pid = ::fork();
  if (c.pid == 0) {
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  ::close(fds[1]);
  c.out = fds[0];
  ::fcntl(c.out, F_SETFL, ::fcntl(c.out, F_GETFL) | O_NONBLOCK);
  return c;
}

/// Echoes what the child printed; remembers the endpoint it listens on and, when it reports the
/// run's clock, aligns `t0` (the parent's start of the run) with it.
void pump(child_process& c, std::string& endpoint, std::chrono::steady_clock::time_point& t0) {
  char tmp[4096];
  for (;;) {
    auto n = ::read(c.out, tmp, sizeof(tmp));
    if (n <= 0)
      break;
    c.buf.append(tmp, static_cast<size_t>(n));
  }
  size_t nl;
  while ((nl = c.buf.find('\n')) != std::string::npos) {
    auto line = c.buf.substr(0, nl);
    c.buf.erase(0, nl + 1);
    fmt::print("{}\n", line);
    std::fflush(stdout);
    if (auto rc = line.find(": run clock "); rc != std::string::npos) {
      char* end = nullptr;
      auto secs = std::strtod(line.c_str() + rc + 12, &end);
      if (end != line.c_str() + rc + 12 && secs >= 0)
        t0 = std::chrono::steady_clock::now()
             - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
               std::chrono::duration<double>(secs));
    }
    auto at = line.find("listening on ");
    if (endpoint.empty() && at != std::string::npos) {
      endpoint = line.substr(at + 13);
      if (auto sp = endpoint.find(' '); sp != std::string::npos)
        endpoint.resize(sp);
    }
  }
}

/// Exit status of a finished child (128 + signal when killed).
int status_of(int st) {
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/// Runs the node as a child process and carries out the plan's kills of this node: SIGKILL at
/// the fault's time, a new incarnation on the same port after the restart delay.
int run_parent(const experiment_graph& g, const node_command& cmd,
               std::vector<planned_fault> kills) {
  install_shutdown_signals();
  auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::steady_clock::now() - t0; };
  std::string endpoint;
  auto base = without_listen(cmd.argv);
  size_t next_kill = 0;
  for (int incarnation = 0;; ++incarnation) {
    auto args = base;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed()).count();
    for (auto x : {std::string{"--child"}, std::string{"--incarnation"}, std::to_string(incarnation),
                   std::string{"--elapsed-ms"}, std::to_string(ms), std::string{"--listen"},
                   endpoint.empty() ? cmd.listen : endpoint})
      args.push_back(x);
    auto child = spawn_child(args);
    if (child.pid < 0)
      return cmd_die("cannot start the node process");
    for (;;) {
      pollfd p{child.out, POLLIN, 0};
      ::poll(&p, 1, 50);
      pump(child, endpoint, t0);
      int st = 0;
      if (::waitpid(child.pid, &st, WNOHANG) == child.pid) {
        pump(child, endpoint, t0);
        ::close(child.out);
        return status_of(st);
      }
      if (auto sig = poll_shutdown_signal(0); sig > 0) {
        ::kill(child.pid, SIGTERM);
        ::waitpid(child.pid, &st, 0);
        pump(child, endpoint, t0);
        ::close(child.out);
        return status_of(st);
      }
      if (next_kill < kills.size() && elapsed() >= kills[next_kill].at)
        break;
    }
    auto& k = kills[next_kill++];
    ::kill(child.pid, SIGKILL);
    int st = 0;
    ::waitpid(child.pid, &st, 0);
    ::close(child.out);
    fmt::print("node{}: killed at {:.1f} s (fault){}\n", cmd.index,
               std::chrono::duration<double>(elapsed()).count(),
               k.never ? ", not restarted"
                       : fmt::format(", restarts in {:.1f} s",
                                     std::chrono::duration<double>(k.restart).count()));
    std::fflush(stdout);
    auto until = k.never ? g.duration : k.at + k.restart;
    while (elapsed() < until) {
      if (poll_shutdown_signal(50) > 0)
        return 0;
    }
    if (k.never)
      return 0;
  }
}

} // namespace

namespace {

/// What a run folder's `run.json` says about the run in it.
const char* const run_record = "run.json";

/// Checks that `dir` holds a stopped run of `g` in `mode` that can continue: its record names
/// the same experiment, kind, seed and mode, and the kind reads what it left. Returns the number
/// of runs so far and what the run continues from.
result<std::pair<int64_t, std::string>> check_resume(const experiment_graph& g, run_mode mode,
                                                      const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return fail(fmt::format("--resume {}: no such folder", dir));
  std::ifstream in{dir + "/" + run_record};
  if (!in)
    return fail(fmt::format("--resume {}: no {} in it (not a run folder, or one written before "
                            "runs could be resumed)",
                            dir, run_record));
  auto j = nlohmann::json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return fail(fmt::format("--resume {}: {} is not a JSON object", dir, run_record));
  auto field = [&](const char* k) {
    return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string{"?"};
  };
  auto seed = j.contains("seed") && j["seed"].is_number_unsigned() ? j["seed"].get<uint64_t>() : 0;
  auto runs = j.contains("runs") && j["runs"].is_number_integer() ? j["runs"].get<int64_t>() : 0;
  std::string differs;
  if (field("experiment") != g.name)
    differs = fmt::format("experiment '{}', this one '{}'", field("experiment"), g.name);
  else if (field("kind") != g.kind)
    differs = fmt::format("kind '{}', this one '{}'", field("kind"), g.kind);
  else if (seed != g.seed)
    differs = fmt::format("seed {}, this one {}", seed, g.seed);
  else if (field("mode") != to_string(mode))
    differs = fmt::format("{} mode, this one {} mode", field("mode"), to_string(mode));
  if (!differs.empty())
    return fail(fmt::format("--resume {}: the run there is another one ({})", dir, differs));
  if (runs < 1)
    return fail(fmt::format("--resume {}: {} has no run count", dir, run_record));
  if (!g.not_resumable.empty() || !g.inspect_resume)
    return fail(fmt::format("--resume {}: '{}' cannot be resumed: {}", dir, g.name,
                            g.not_resumable.empty() ? "no resume support" : g.not_resumable));
  auto what = g.inspect_resume(dir);
  if (!what)
    return fail(fmt::format("--resume {}: {}", dir, what.error().what));
  return std::make_pair(runs, *what);
}

/// Moves the previous run's results (metrics, plots, export) into `<dir>/run<k>/`, so that the
/// continued run writes its own and nothing is lost; node folders (checkpoints, progress, keys)
/// stay where the continued run reads them.
status keep_previous_results(const std::string& dir, int64_t k) {
  namespace fs = std::filesystem;
  std::error_code ec;
  auto keep = fs::path{dir} / fmt::format("run{}", k);
  fs::create_directories(keep, ec);
  if (ec)
    return fail(fmt::format("{}: {}", keep.string(), ec.message()));
  for (auto& e : fs::directory_iterator(dir, ec)) {
    auto name = e.path().filename().string();
    bool result_file = e.is_regular_file(ec) && name != run_record;
    if (!result_file && name != "export")
      continue;
    fs::rename(e.path(), keep / name, ec);
    if (ec)
      return fail(fmt::format("cannot move {} into {}: {}", e.path().string(), keep.string(),
                              ec.message()));
  }
  return {};
}

} // namespace

int command_run(const experiment_graph& g, const role_registry& registry, run_mode mode,
                size_t nodes, const std::string& out, const std::string& source_text,
                bool resume) {
  auto p = make_plan(g, mode, nodes, g.seed);
  if (!p)
    return cmd_die(p.error().what);
  auto dir = out.empty() ? default_out_dir(g.name) : out;
  int64_t runs = 0;
  if (resume) {
    auto r = check_resume(g, mode, dir);
    if (!r)
      return cmd_die(r.error().what);
    runs = r->first;
    if (auto st = keep_previous_results(dir, runs); !st)
      return cmd_die(st.what());
    fmt::print("resuming run {} of '{}' in {} (the earlier results are in {}/run{}):\n  {}\n",
               runs + 1, g.name, dir, dir, runs, r->second);
  } else {
    std::error_code ec;
    if (std::filesystem::exists(dir + "/" + run_record, ec)
        || std::filesystem::exists(dir + "/experiment.yaml", ec))
      return cmd_die(fmt::format("{} holds a run already: continue it with --resume {}, or choose "
                                 "another --out",
                                 dir, dir));
  }
  std::string why;
  if (!make_dirs(dir, why))
    return cmd_die(why);
  {
    nlohmann::json j{{"experiment", g.name}, {"kind", g.kind}, {"seed", g.seed},
                     {"mode", to_string(mode)}, {"runs", runs + 1},
                     {"starling", starling_version}};
    std::ofstream{dir + "/" + run_record} << j.dump(2) << "\n";
  }
  if (!source_text.empty())
    std::ofstream{dir + "/experiment.yaml"} << source_text;
  fmt::print("starling {}: running '{}'{} in {} mode, seed {}, {} node{}; output in {}\n",
             starling_version, g.name, g.kind.empty() ? "" : fmt::format(" ({})", g.kind),
             to_string(mode), g.seed, p->total_nodes(), p->total_nodes() == 1 ? "" : "s", dir);
  std::fflush(stdout);
  run_settings s;
  s.nodes = nodes;
  s.out_dir = dir;
  // SIGINT/SIGTERM end a local run with its summary (and, for kinds that keep their state in
  // the folder, a run that `--resume` continues).
  std::optional<signal_watcher> signals;
  if (mode == run_mode::local) {
    signals.emplace(true, "stopping; the summary follows (a second signal ends the process at "
                          "once)");
    s.stop = signals->stopped();
  }
  if (g.study)
    return g.study(g, [&](const experiment_graph& variant) {
      auto settings = s;
      settings.write_trace = false;
      settings.trace_messages = false;
      return run_in_process(variant, registry, mode, settings);
    }, dir);
  auto r = run_in_process(g, registry, mode, s);
  if (mode == run_mode::sim)
    fmt::print("  {:<34} {:016x} ({} events; {:.1f} s simulated in {:.1f} s wall)\n",
               "trace digest", r.trace_digest, r.trace_events, r.run_s, r.wall_s);
  if (mode == run_mode::sim)
    fmt::print("  {:<34} {}\n", "link proxies made", r.proxies_made);
  if (mode == run_mode::sim && !g.network.firewalled.empty())
    fmt::print("  {:<34} {} (dropped: {} accept no connection)\n",
               "unsolicited messages to firewalled", r.unsolicited,
               fmt::join(g.network.firewalled, ", "));
  std::fflush(stdout);
  return r.exit_code;
}

int command_plan(const experiment_graph& g, const role_registry& registry, run_mode mode,
                 size_t nodes) {
  if (auto st = validate(g, registry, mode); !st)
    return cmd_die(st.what());
  auto p = make_plan(g, mode, nodes, g.seed);
  if (!p)
    return cmd_die(p.error().what);
  fmt::print("{}", describe(g, *p));
  return 0;
}

void print_admission(const node& nd) {
  if (nd.open_run())
    fmt::print("this run is open: any node that reaches {} and says hello may join (set "
               "node.authority and node.token to admit token holders only)\n",
               nd.endpoint());
  else
    fmt::print("closed run {}: token holders only, {}\n", nd.experiment(),
               nd.tls() ? "connections encrypted (TLS, the run's CA)"
                        : "connections NOT encrypted (node.tls is off)");
}

void serve_experiment(node& nd, const std::string& file, const std::vector<std::string>& sets,
                      size_t nodes, const std::string& who) {
  auto pkg = make_package(file, sets, nodes);
  if (!pkg) {
    fmt::print(stderr, "starling: warning: {} serves no experiment to joiners: {}\n", who,
               pkg.error().what);
    return;
  }
  auto digest = actors::auth::to_hex(pkg->digest).substr(0, 16);
  auto signed_ = !pkg->signature.empty();
  auto files = pkg->files.size();
  nd.register_actor(experiment_server_name,
                    spawn_experiment_server(nd.system(), std::move(*pkg), nd.gate()));
  fmt::print("{}: serves its experiment to joiners (digest {}, {} named file{}, {})\n", who,
             digest, files, files == 1 ? "" : "s",
             signed_          ? "signed by the authority"
             : nd.open_run()  ? "an open run: unsigned"
                              : "NOT signed: joiners refuse it; starling authority "
                                "sign-experiment FILE");
  std::fflush(stdout);
}

int compare_with_run(node& nd, const std::string& file, const std::vector<std::string>& sets,
                     size_t nodes, const std::vector<std::string>& join) {
  auto mine = make_package(file, sets, nodes, false);
  if (!mine)
    return 0; // serve_experiment said why already
  for (auto& ep : join) {
    auto theirs = fetch_package(nd, ep, std::chrono::seconds(10));
    if (!theirs && theirs.error().what.find(fmt::format(
                       "refused ({})", actors::auth::to_string(actors::auth::reason::banned))) !=
                       std::string::npos) {
      // A ban is by key: this node comes back with the key that was banned, and every node of
      // the run refuses it (a new key needs a new token in a closed run).
      fmt::print(stderr,
                 "starling: error: the run at {} refuses this node: {}; a ban is by key and "
                 "stays across restarts\n",
                 ep, theirs.error().what);
      return 2;
    }
    if (!theirs) {
      fmt::print(stderr,
                 "starling: warning: cannot compare this node's experiment with the "
                 "run's at {}: {}\n",
                 ep, theirs.error().what);
      continue;
    }
    auto diff = describe_package_difference(*mine, *theirs);
    if (!diff.empty()) {
      fmt::print(stderr,
                 "starling: error: {} is not the experiment of the run at {}: {} (digest "
                 "{} here, {} there); start this node with the run's file, overrides and "
                 "--nodes (or join as a volunteer: starling join {} --token FILE)\n",
                 file, ep, diff, actors::auth::to_hex(mine->digest).substr(0, 16),
                 actors::auth::to_hex(theirs->digest).substr(0, 16), ep);
      return 2;
    }
    fmt::print("the run at {} has the same experiment (digest {}, {} nodes)\n", ep,
               actors::auth::to_hex(mine->digest).substr(0, 16), mine->nodes);
    return 0;
  }
  return 0;
}

int command_node(const experiment_graph& g, const role_registry& registry,
                 const node_command& cmd) {
  if (cmd.count < 1 || (!cmd.volunteer && cmd.index >= cmd.count))
    return cmd_die(fmt::format("--index {} must be below --nodes {}", cmd.index, cmd.count));
  if (cmd.volunteer && cmd.join.empty())
    return cmd_die("a volunteer node (no --index) needs --join HOST:PORT of a node of the run");
  auto p = make_plan(g, run_mode::cluster, cmd.count, g.seed);
  if (!p)
    return cmd_die(p.error().what);
  std::vector<planned_fault> kills;
  for (auto& f : p->faults)
    if (!cmd.volunteer && f.what == planned_fault::action::kill_node && f.node == cmd.index)
      kills.push_back(f);
  if (!cmd.child && !kills.empty())
    return run_parent(g, cmd, std::move(kills));
  install_shutdown_signals();
  node_options no = g.node;
  no.listen = cmd.listen;
  no.join = cmd.join;
  auto name = cmd.volunteer ? std::string{"volunteer"} : fmt::format("node{}", cmd.index);
  auto out = cmd.out.empty() ? default_out_dir(g.name + "-" + name) : cmd.out;
  std::string why;
  if (!make_dirs(out, why))
    return cmd_die(why);
  // Envelopes carry the experiment's name and this node's peer id; the key stays in the output
  // folder, so a restarted node (same folder) keeps its identity.
  no.experiment = g.name;
  no.key_file = cmd.key.empty() ? out + "/node.key" : cmd.key;
  if (!cmd.authority.empty())
    no.authority = cmd.authority;
  if (!cmd.token.empty())
    no.token = cmd.token;
  signal_watcher signals{false, ""};
  auto nd = node::start(g.caf, no, name,
                        [&registry](caf::actor_system_config& cfg) { registry.configure(cfg); });
  if (!nd)
    return cmd_die(nd.error().what);
  fmt::print("node {} listening on {} (peer id {})\n", name, (*nd)->endpoint(),
             actors::auth::to_hex((*nd)->peer_id()));
  print_admission(**nd);
  std::fflush(stdout);
  if (!cmd.config_file.empty()) {
    serve_experiment(**nd, cmd.config_file, cmd.sets, cmd.count, name);
    if (!cmd.join.empty()) {
      if (auto rc = compare_with_run(**nd, cmd.config_file, cmd.sets, cmd.count, cmd.join);
          rc != 0) {
        (*nd)->shutdown();
        return rc;
      }
      std::fflush(stdout);
    }
  }
  auto stop = signals.stopped();
  cluster_settings s;
  s.index = cmd.index;
  s.count = cmd.count;
  s.volunteer = cmd.volunteer;
  s.join = cmd.join;
  s.out_dir = out;
  s.stop = stop;
  s.incarnation = cmd.incarnation;
  s.elapsed = std::chrono::milliseconds{cmd.elapsed_ms};
  int rc = run_cluster_node(g, registry, **nd, s);
  fmt::print("node {} shutting down\n", name);
  std::fflush(stdout);
  (*nd)->shutdown();
  return rc;
}

int experiment_main(int argc, char** argv, const role_registry& registry,
                    const std::function<result<experiment_graph>(run_mode)>& build) {
  CLI::App app{"a starling experiment built in C++"};
  bool sim = false;
  std::optional<uint64_t> seed;
  size_t nodes = 0;
  std::string out;
  app.add_flag("--sim", sim, "Simulate: virtual time and the network model");
  app.add_option("--seed", seed, "Override the graph's seed");
  app.add_option("--nodes", nodes, "Number of nodes (default: the graph's)");
  app.add_option("--out", out, "Output folder (default runs/<timestamp>-<name>)");
  auto* planc = app.add_subcommand("plan", "Print the plan");
  bool plan_cluster = false;
  planc->add_flag("--cluster", plan_cluster, "The plan of a cluster run (default: local)");
  auto* nodec = app.add_subcommand("node", "Run one node of a cluster run");
  node_command nc;
  std::optional<size_t> index;
  nodec->add_option("--index", index, "This node's index (none: a volunteer taking an open slot)");
  nodec->add_option("--nodes", nc.count, "Number of nodes")->required();
  nodec->add_option("--listen", nc.listen, "HOST:PORT to listen on (port 0: the OS chooses)");
  nodec->add_option("--join", nc.join, "HOST:PORT of a node to join (repeatable)");
  nodec->add_option("--out", nc.out, "Output folder");
  nodec->add_flag("--child", nc.child)->group("");
  nodec->add_option("--incarnation", nc.incarnation)->group("");
  nodec->add_option("--elapsed-ms", nc.elapsed_ms)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0)
      return app.exit(e);
    return cmd_die(e.what());
  }
  auto mode = nodec->parsed() || (planc->parsed() && plan_cluster) ? run_mode::cluster
              : sim                                                ? run_mode::sim
                                                                   : run_mode::local;
  auto g = build(mode);
  if (!g)
    return cmd_die(g.error().what);
  if (seed)
    g->seed = *seed;
  if (auto st = validate(*g, registry, mode); !st)
    return cmd_die(st.what());
  if (planc->parsed())
    return command_plan(*g, registry, mode, nodes);
  if (nodec->parsed()) {
    nc.volunteer = !index;
    nc.index = index.value_or(0);
    for (int i = 0; i < argc; ++i)
      nc.argv.emplace_back(argv[i]);
    return command_node(*g, registry, nc);
  }
  return command_run(*g, registry, mode, nodes, out);
}

} // namespace starling::runtime

