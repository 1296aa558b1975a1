// `starling join` as a volunteer would run it: a closed dedloc run of two `starling node`
// processes (node 1 serves the same experiment unsigned), a volunteer with only a key of its
// own (`starling key init`) and a token issued for its public key file (`starling token issue
// --peer-key`). Joining through node 1 alone is refused with one line (unsigned), and so is
// joining without a token (the run is closed: the line says how to get one); joining
// through node 1 then node 0 fetches the signed experiment from node 0, takes the open slot,
// trains and is credited by its partners (its progress line says so); SIGINT makes it leave
// gracefully (tombstone and slot release acknowledged) and node 0 hears of the leave. The slot
// it released takes a second volunteer in client mode (--client), credited for its own work
// (not its predecessor's). The run's `caf:` settings apply to volunteers. A volunteer whose
// token expires during the run is warned and leaves gracefully before the run's gates refuse
// it. A `starling node` with another file than the run's is refused with one line, exit 2. A
// node serving the signed experiment with another node count than the signed one is refused
// by joiners.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "runtime/experiment/package.hpp"
#include "runtime/experiment/serve.hpp"
#include "support/join_fixtures.hpp"
#include "support/node_fixtures.hpp"
#include "support/paths.hpp"
#include "support/raw_socket.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_join_cluster_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
namespace auth = starling::actors::auth;

namespace {

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

/// Runs a short starling command to its end; its output.
std::string run_cli(const std::vector<std::string>& args, int want_rc = 0) {
  std::vector<std::string> argv{STARLING_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  subprocess p{argv};
  auto rc = p.wait_exit(30s);
  while (p.read_line(0ms)) {
  }
  CHECK_MESSAGE(rc == want_rc, fmt::format("{}: {}", args[0], p.output()));
  return p.output();
}

std::string config_text() { return starling::testing::join_run_config("join-test", 5); }

/// A node key `<d>/<name>/node.key` and a one-hour token `<d>/<name>.token` for each name.
template <class Authority>
void write_tokens(const Authority& authority, int64_t now_ns, const std::string& d,
                  std::initializer_list<const char*> names) {
  for (auto n : names) {
    auto k = auth::load_or_create_key(d + "/" + n + "/node.key", auth::key_role::node);
    REQUIRE(k.ok());
    auto t = auth::issue_token(
        authority, {k->key.public_key(), {"any"}, now_ns, int64_t{3600} * 1'000'000'000, {}});
    REQUIRE(t.ok());
    REQUIRE(auth::write_file_atomically(d + "/" + std::string(n) + ".token", t->file_text, 0600)
                .ok());
  }
}

} // namespace

TEST_CASE("starling join: a token and an endpoint are enough; an unsigned experiment is refused "
          "with one line; the volunteer trains, is credited, and leaves gracefully on SIGINT") {
  auto began = std::chrono::steady_clock::now();
  starling::testing::temp_dir dir{"starling-join"};
  auto d = dir.path;
  // The run's owner: an authority, tokens for its two nodes.
  auth::authority_init_options ao;
  ao.dir = d + "/auth";
  ao.now_ns = unix_now_ns() - 60'000'000'000;
  auto authority = auth::init_authority(ao);
  REQUIRE(authority.ok());
  // Tokens for the two nodes, and for a second volunteer (the refused attempt: a key of its own).
  write_tokens(*authority, ao.now_ns, d, {"n0", "n1", "r"});
  auto config = d + "/run.yaml";
  std::filesystem::create_directories(d + "/unsigned");
  auto unsigned_config = d + "/unsigned/run.yaml";
  std::ofstream{config} << config_text();
  std::ofstream{unsigned_config} << config_text();
  // Without the node count nothing is signed: joiners trust only a signed count.
  CHECK(
      run_cli({"authority", "sign-experiment", config, "--authority", ao.dir}, 2).find("--nodes") !=
      std::string::npos);
  auto signed_out =
      run_cli({"authority", "sign-experiment", config, "--authority", ao.dir, "--nodes", "2"});
  CHECK(signed_out.find("wrote " + config + ".sig") != std::string::npos);
  CHECK(signed_out.find("2 nodes") != std::string::npos);
  // The volunteer's side of the recipe, and the owner's token for its public key file.
  auto key_out = run_cli({"key", "init", "--out", d + "/v/node.key"});
  CHECK(key_out.find("peer id") != std::string::npos);
  run_cli({"token", "issue", "--authority", ao.dir, "--peer-key", d + "/v/node.key.pub", "--role",
           "any", "--expires", "1h", "--out", d + "/v.token"});

  auto argv_of = [&](int i) {
    auto n = "n" + std::to_string(i);
    return std::vector<std::string>{STARLING_BINARY, "node",
                                    "--listen",      "127.0.0.1:0",
                                    "--config",      i == 0 ? config : unsigned_config,
                                    "--index",       std::to_string(i),
                                    "--nodes",       "2",
                                    "--out",         d + "/" + n,
                                    "--authority",   ao.dir + "/authority.pub",
                                    "--token",       d + "/" + n + ".token",
                                    "--key",         d + "/" + n + "/node.key"};
  };
  auto nodes = starling::testing::start_nodes(2, argv_of);
  REQUIRE(nodes.size() == 2);
  auto ep0 = starling::testing::endpoint_of(nodes[0]->output());
  auto ep1 = starling::testing::endpoint_of(nodes[1]->output());
  for (auto& n : nodes)
    for (int i = 0; i < 100 && n->output().find("serves its experiment") == std::string::npos; ++i)
      (void)n->read_line(100ms);
  CHECK_MESSAGE(nodes[0]->output().find("signed by the authority") != std::string::npos,
                nodes[0]->output());
  CHECK_MESSAGE(nodes[1]->output().find("NOT signed") != std::string::npos, nodes[1]->output());
  auto drain = [&] {
    for (auto& n : nodes)
      while (n->read_line(0ms)) {
      }
  };
  auto join_argv = [&](std::vector<std::string> endpoints, const std::string& who,
                       const std::string& out) {
    std::vector<std::string> a{STARLING_BINARY, "join"};
    a.insert(a.end(), endpoints.begin(), endpoints.end());
    a.insert(a.end(), {"--token", d + "/" + who + ".token", "--key", d + "/" + who + "/node.key",
                       "--listen", "127.0.0.1:0", "--out", d + "/" + out});
    return a;
  };

  // 1. Node 1 serves the experiment unsigned: refused, one line, exit 2.
  {
    subprocess refused{join_argv({ep1}, "r", "r-out")};
    auto rc = refused.wait_exit(60s);
    while (refused.read_line(0ms)) {
    }
    CHECK_MESSAGE(rc == 2, refused.output());
    CHECK_MESSAGE(refused.output().find("not signed by its authority") != std::string::npos,
                  refused.output());
    CHECK(refused.output().find("could not join through any of the 1 endpoint") !=
          std::string::npos);
  }
  // 1b. No token at all (and no key: an empty HOME, set through /usr/bin/env): the run is closed,
  //     so it refuses the joiner (its TLS handshake, before any hello): one line with the reason
  //     and the fix, exit 2, and no key made for a run that never took it.
  {
    auto bare = starling::testing::join_without_token(d + "/home", ep0, d + "/b-out");
    auto& o = bare.output;
    CHECK_MESSAGE(bare.rc == 2, o);
    auto at = o.find("the run is closed: get a token from its owner (starling key init, then the "
                     "owner runs starling token issue --peer-key YOUR_KEY.pub");
    CHECK_MESSAGE(at != std::string::npos, o);
    CHECK_MESSAGE(o.find("the run is closed", at + 1) == std::string::npos, o);
    CHECK(o.find(ep0 + ": ") != std::string::npos);
    CHECK(o.find("made a fresh node key") == std::string::npos);
    CHECK(o.find("holds slot") == std::string::npos);
    CHECK_FALSE(std::filesystem::exists(d + "/b-out/node.key"));
  }
  drain();

  // 2. Node 1, then node 0: the signed experiment from node 0, the open slot, work, credits.
  auto joined_at = std::chrono::steady_clock::now();
  subprocess vol{join_argv({ep1, ep0}, "v", "v-out")};
  auto joined = vol.wait_for("joined through", 60s);
  REQUIRE_MESSAGE(joined, vol.output());
  CHECK(joined->find(ep0) != std::string::npos);
  CHECK(joined->find("signed with its node count by the run's authority") != std::string::npos);
  auto reach = vol.wait_for("full mode", 10s);
  CHECK_MESSAGE(reach, vol.output());
  // The run's caf: section, as the volunteer's actor system holds it (read back from CAF).
  auto settings = vol.wait_for("the run's settings apply", 30s);
  REQUIRE_MESSAGE(settings, vol.output());
  CHECK_MESSAGE(settings->find("scheduler sharing with 2 threads, heartbeat 500 ms, connection "
                               "timeout 2000 ms") != std::string::npos,
                *settings);
  CHECK_MESSAGE(vol.wait_for("holds slot volunteers.0", 60s), vol.output());
  std::ifstream written{d + "/v-out/experiment.yaml"};
  std::string got((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  CHECK(got == config_text());
  double samples = 0, accepted = 0;
  std::regex progress{R"(your contribution: (\d+) samples, (\d+) accepted, uptime)"};
  // Every progress line: what partners credited is at most what the volunteer computed.
  int lines = 0, inconsistent = 0;
  auto read_progress = [&](subprocess& p, double& n, double& m) {
    auto line = p.read_line(500ms);
    std::smatch x;
    if (line && std::regex_search(*line, x, progress)) {
      n = std::stod(x[1]);
      m = std::stod(x[2]);
      ++lines;
      if (m > n) {
        ++inconsistent;
        MESSAGE("accepted > samples: " << *line);
      }
    }
  };
  // Reads `p`'s progress lines until its partners credited it (60 s at most).
  auto wait_credited = [&](subprocess& p, double& n, double& m) {
    auto until = std::chrono::steady_clock::now() + 60s;
    while (m <= 0 && std::chrono::steady_clock::now() < until) {
      drain();
      read_progress(p, n, m);
      if (p.wait_exit(0ms))
        break;
    }
  };
  auto deadline = std::chrono::steady_clock::now() + 90s;
  while ((accepted <= 0 || samples <= 0) && std::chrono::steady_clock::now() < deadline) {
    drain();
    read_progress(vol, samples, accepted);
    if (vol.wait_exit(0ms))
      break;
  }
  auto credited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at).count();
  REQUIRE_MESSAGE(accepted > 0, "the volunteer was never credited:\n" << vol.output());
  CHECK(samples > 0);
  CHECK(accepted <= samples);

  // 3. SIGINT: a graceful leave, acknowledged, exit 0; node 0 hears of it.
  auto leave_s = starling::testing::graceful_leave(vol);
  bool heard = false;
  for (int i = 0; i < 50 && !heard; ++i) {
    drain();
    std::ifstream log{d + "/n0/metrics.jsonl"};
    std::string line;
    while (std::getline(log, line))
      heard = heard || (line.find("\"dp_leave\"") != std::string::npos &&
                        line.find("volunteers.0") != std::string::npos);
    if (!heard)
      (void)nodes[0]->read_line(200ms);
  }
  CHECK_MESSAGE(heard, "node 0 never heard of the volunteer's leave");

  // 4. The released slot takes the next volunteer: in client mode (--client), it is credited
  //    too, and leaves like the first.
  auto client_argv = join_argv({ep0}, "r", "c-out");
  client_argv.push_back("--client");
  subprocess client{client_argv};
  // It listens nowhere from the start and goes by its peer id (`<hex>.client.invalid:1`):
  // whatever the run does with it goes over the connections it opened.
  auto named = client.wait_for("in client mode (listening nowhere), named", 30s);
  REQUIRE_MESSAGE(named, client.output());
  std::smatch port_match;
  REQUIRE(std::regex_search(*named, port_match,
                            std::regex{R"(peer id ([0-9a-f]{12})\) in client mode \(listening nowhere\), named ([0-9a-f]{40})\.client\.invalid:1,)"}));
  CHECK(std::string{port_match[2]}.rfind(port_match[1], 0) == 0);
  CHECK_MESSAGE(client.wait_for("client mode (--client)", 60s), client.output());
  CHECK_MESSAGE(client.wait_for("holds slot volunteers.0", 60s), client.output());
  // 4b. Meanwhile a volunteer whose advertised endpoint the run cannot reach (a port bound and
  //     never listened on, as a NAT without the forward would leave it) is told so, starts
  //     again in client mode (its own port closed too) and takes an instance beyond the plan.
  int unreachable_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(unreachable_fd >= 0);
  sockaddr_in unreachable{};
  unreachable.sin_family = AF_INET;
  unreachable.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t unreachable_len = sizeof unreachable;
  REQUIRE(::bind(unreachable_fd, reinterpret_cast<sockaddr*>(&unreachable), sizeof unreachable)
          == 0);
  REQUIRE(::getsockname(unreachable_fd, reinterpret_cast<sockaddr*>(&unreachable),
                        &unreachable_len)
          == 0);
  auto natted_argv = join_argv({ep0}, "v", "n-out");
  natted_argv.push_back("--advertise");
  natted_argv.push_back(fmt::format("127.0.0.1:{}", ntohs(unreachable.sin_port)));
  subprocess natted{natted_argv};
  auto natted_first = natted.wait_for("advertised as 127.0.0.1:", 30s);
  REQUIRE_MESSAGE(natted_first, natted.output());
  REQUIRE(std::regex_search(*natted_first, port_match,
                            std::regex{R"(listening on 127\.0\.0\.1:(\d+), advertised)"}));
  auto natted_port = static_cast<uint16_t>(std::stoul(port_match[1]));
  auto verdict = natted.wait_for("client mode: ", 60s);
  REQUIRE_MESSAGE(verdict, natted.output());
  CHECK_MESSAGE(verdict->find(fmt::format("could not reach this node at 127.0.0.1:{}",
                                          ntohs(unreachable.sin_port)))
                  != std::string::npos,
                *verdict);
  CHECK_MESSAGE(verdict->find("forward 127.0.0.1:") != std::string::npos, *verdict);
  CHECK_MESSAGE(natted.wait_for("started again in client mode", 30s), natted.output());
  CHECK_MESSAGE(natted.wait_for("holds slot volunteers.1", 60s), natted.output());
  // Its numbers count from when it took the slot (its predecessor's credits are the slot's
  // too): credited, and never more than it computed.
  double client_samples = 0, client_accepted = 0;
  wait_credited(client, client_samples, client_accepted);
  CHECK_MESSAGE(client_accepted > 0, "the client-mode volunteer was never credited:\n"
                                         << client.output());
  double natted_samples = 0, natted_accepted = 0;
  wait_credited(natted, natted_samples, natted_accepted);
  CHECK_MESSAGE(natted_accepted > 0, "the volunteer in client mode by the run's verdict was never "
                                     "credited:\n" << natted.output());
  CHECK_FALSE(testing::loopback_port_accepts(natted_port));
  natted.signal(SIGINT);
  CHECK_MESSAGE(natted.wait_for("volunteer: left:", 30s), natted.output());
  CHECK(natted.wait_exit(30s) == 0);
  ::close(unreachable_fd);
  CHECK(client_accepted <= client_samples);
  // 4c. Node 1 is killed and started again (a new process on a new port): the client-mode
  //     volunteer, which the run reaches only over connections it opened, connects to it again
  //     by itself.
  nodes[1]->signal(SIGKILL);
  CHECK(nodes[1]->wait_exit(30s).has_value());
  auto restart = argv_of(1);
  restart.push_back("--join");
  restart.push_back(ep0);
  nodes[1] = std::make_unique<subprocess>(restart);
  auto restarted = nodes[1]->wait_for("listening on", 60s);
  REQUIRE_MESSAGE(restarted, nodes[1]->output());
  auto ep1_again = starling::testing::endpoint_of(*restarted);
  CHECK_MESSAGE(client.wait_for("client mode: connected to " + ep1_again, 30s), client.output());
  client.signal(SIGINT);
  CHECK_MESSAGE(client.wait_for("volunteer: left:", 30s), client.output());
  CHECK(client.wait_exit(30s) == 0);
  bool client_joined = false;
  {
    std::ifstream log{d + "/n0/metrics.jsonl"};
    std::string line;
    while (std::getline(log, line))
      client_joined = client_joined || (line.find("\"dp_join\"") != std::string::npos &&
                                        line.find("volunteers.0") != std::string::npos &&
                                        line.find("\"client\"") != std::string::npos);
  }
  CHECK(client_joined);
  CHECK_MESSAGE(lines > 0, "no progress line");
  CHECK_MESSAGE(inconsistent == 0, inconsistent << " progress line(s) with accepted > samples");

  // 5. A token that expires during the run: 30 s from now, so the warning and the leave scale
  //    down (warned 15 s before, leaving 7.5 s before, while the gates still admit it). The
  //    volunteer leaves gracefully and exits 0 before its token expires.
  {
    auto k = auth::load_or_create_key(d + "/e/node.key", auth::key_role::node);
    REQUIRE(k.ok());
    auto issued_at = unix_now_ns();
    auto lifetime = int64_t{30} * 1'000'000'000;
    auto t = auth::issue_token(*authority, {k->key.public_key(), {"any"}, issued_at, lifetime, {}});
    REQUIRE(t.ok());
    REQUIRE(auth::write_file_atomically(d + "/e.token", t->file_text, 0600).ok());
    subprocess expiring{join_argv({ep0}, "e", "e-out")};
    CHECK_MESSAGE(expiring.wait_for("valid for 2", 30s), expiring.output());
    CHECK_MESSAGE(expiring.wait_for("holds slot volunteers.0", 60s), expiring.output());
    auto warning = expiring.wait_for("warning: your token expires in", 60s);
    REQUIRE_MESSAGE(warning, expiring.output());
    CHECK_MESSAGE(warning->find("leaves the run gracefully in") != std::string::npos, *warning);
    CHECK_MESSAGE(expiring.wait_for("leaving the run gracefully now", 30s), expiring.output());
    auto left = expiring.wait_for("volunteer: left:", 60s);
    REQUIRE_MESSAGE(left, expiring.output());
    CHECK_MESSAGE(left->find("tombstone stored on") != std::string::npos, *left);
    CHECK_MESSAGE(left->find("released (stored on") != std::string::npos, *left);
    CHECK_MESSAGE(
        expiring.wait_for("left ahead of its token's expiry (every acknowledgement in)", 30s),
        expiring.output());
    CHECK(expiring.wait_exit(30s) == 0);
    auto exited = unix_now_ns();
    CHECK_MESSAGE(exited < issued_at + lifetime + 5'000'000'000,
                  "the volunteer outlived its token");
    MESSAGE(fmt::format("a 30 s token: the volunteer exited {:.1f} s before its expiry",
                        static_cast<double>(issued_at + lifetime - exited) / 1e9));
    // The order: warned, then leaving, then left.
    auto& o = expiring.output();
    CHECK(o.find("warning: your token expires") < o.find("leaving the run gracefully now"));
    CHECK(o.find("leaving the run gracefully now") < o.find("volunteer: left:"));
  }
  drain();

  // 6. A node whose file is not the run's: one line, exit code 2, before it takes any part.
  {
    std::filesystem::create_directories(d + "/other");
    auto other = d + "/other/run.yaml";
    auto text = config_text();
    text.replace(text.find("seed: 5"), 7, "seed: 6");
    std::ofstream{other} << text;
    subprocess stray{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", other,
                      "--nodes", "2", "--join", ep0, "--out", d + "/stray", "--authority",
                      ao.dir + "/authority.pub", "--token", d + "/r.token", "--key",
                      d + "/r/node.key"}};
    auto rc = stray.wait_exit(60s);
    while (stray.read_line(0ms)) {
    }
    CHECK_MESSAGE(rc == 2, stray.output());
    CHECK_MESSAGE(stray.output().find("is not the experiment of the run at " + ep0 +
                                      ": the file's bytes differ") != std::string::npos,
                  stray.output());
    CHECK(stray.output().find("holds slot") == std::string::npos);
  }
  drain();

  nodes[0]->signal(SIGINT);
  CHECK(nodes[0]->wait_exit(60s) == 0);
  CHECK(nodes[1]->wait_exit(60s) == 0);
  MESSAGE(
      fmt::format("wall {:.1f} s; join to first credit {:.1f} s ({:.0f} samples, {:.0f} "
                  "accepted); SIGINT to exit {:.1f} s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(),
                  credited_s, samples, accepted, leave_s));
}

TEST_CASE("a joiner refuses a signed experiment served with another node count than the signed "
          "one, in one line that names the count") {
  starling::testing::temp_dir dir{"starling-join-count"};
  auto authority = auth::key_pair::from_test_seed(11);
  runtime::experiment_package p;
  p.yaml = "experiment: {name: count-test, kind: dedloc}\n";
  p.nodes = 2;
  p.digest = runtime::experiment_digest(p.yaml, p.sets, p.files);
  p.signature = authority.sign(runtime::experiment_signing_message(p.digest, 2));
  auto joiner = starling::testing::start_node("joiner", "count-test");
  auto host = starling::testing::start_node("host", "count-test");
  host->register_actor(runtime::experiment_server_name,
                       runtime::spawn_experiment_server(host->system(), p, host->gate()));
  auto ok = runtime::fetch_experiment(*joiner, host->endpoint(), authority.public_key(),
                                      dir.path + "/a", 10s);
  REQUIRE_MESSAGE(ok.ok(), (ok.ok() ? "" : ok.error().what));
  CHECK(ok->package.nodes == 2);
  // Another node serves the same file and signature with 3 nodes: the joiner's plan would put
  // the run's instances on nodes that do not hold them.
  auto liar = starling::testing::start_node("liar", "count-test");
  auto tampered = p;
  tampered.nodes = 3;
  liar->register_actor(runtime::experiment_server_name,
                       runtime::spawn_experiment_server(liar->system(), tampered, liar->gate()));
  auto refused = runtime::fetch_experiment(*joiner, liar->endpoint(), authority.public_key(),
                                           dir.path + "/b", 10s);
  REQUIRE_FALSE(refused.ok());
  CHECK_MESSAGE(refused.error().what.find("the node count it came with (3 nodes)") !=
                    std::string::npos,
                refused.error().what);
  CHECK(refused.error().what.find("refused") != std::string::npos);
  liar->shutdown();
  host->shutdown();
  joiner->shutdown();
}

TEST_CASE("starling join --client serves a SWARM stage: the trainers reach it by its peer id, "
          "over the connection it opened") {
  // A client-mode node listens nowhere; it goes by the name its peer id gives
  // (`<hex>.client.invalid:1`), and the run's node reaches it through the connection the
  // volunteer opened. Its stage peer announces that name like any address: the trainer's
  // microbatches cross the volunteer's own connection, and stage 1 (the bottleneck at a
  // quarter speed) gets a second peer that really works.
  starling::testing::temp_dir dir{"starling-join-swarm"};
  auto d = dir.path;
  auth::authority_init_options ao;
  ao.dir = d + "/auth";
  ao.now_ns = unix_now_ns() - 60'000'000'000;
  auto authority = auth::init_authority(ao);
  REQUIRE(authority.ok());
  write_tokens(*authority, ao.now_ns, d, {"n0", "v"});
  auto config = d + "/swarm.yaml";
  std::ofstream{config} << "experiment: {name: swarm-join, kind: swarm, seed: 5, duration: 60s}\n"
                           "caf:\n"
                           "  scheduler: {policy: sharing, max_threads: 2}\n"
                           "swarm:\n"
                           "  model: {layers: 2, width: 32, heads: 2, seq_len: 32}\n"
                           "  data: {kind: text}\n"
                           "  stages: [{peers: [1.0]}, {peers: [0.25]}]\n"
                           "  trainers: 1\n"
                           "  microbatch: 8\n"
                           "  microbatches_per_trainer: 400\n"
                           "  max_inflight: 4\n"
                           "  target_batch: 0\n"
                           "  local_batch: 16\n"
                           "  preempt_every: 0s\n"
                           "  rebalance: {every: 60s, threshold: 10, report_every: 500ms}\n"
                           "  volunteers: 1\n"
                           "  eval_batches: 1\n"
                           "  torch_threads: 1\n";
  run_cli({"authority", "sign-experiment", config, "--authority", ao.dir, "--nodes", "1"});
  auto nodes = starling::testing::start_nodes(1, [&](int) {
    return std::vector<std::string>{STARLING_BINARY, "node", "--listen", "127.0.0.1:0",
                                    "--config", config, "--index", "0", "--nodes", "1",
                                    "--out", d + "/n0", "--authority", ao.dir + "/authority.pub",
                                    "--token", d + "/n0.token", "--key", d + "/n0/node.key"};
  });
  REQUIRE(nodes.size() == 1);
  auto ep0 = starling::testing::endpoint_of(nodes[0]->output());
  subprocess client{{STARLING_BINARY, "join", ep0, "--token", d + "/v.token", "--key",
                     d + "/v/node.key", "--listen", "127.0.0.1:0", "--client", "--out",
                     d + "/v-out"}};
  auto slot = client.wait_for("holds slot", 60s);
  INFO(client.output());
  REQUIRE(slot);
  CHECK(client.output().find(".client.invalid:1 by its peer id") != std::string::npos);
  // The trainer's 400 microbatches end the run; node 0's summary lists the volunteer's stage
  // peer among stage 1's with its optimizer steps: the trainer's microbatches reached it.
  auto rc0 = nodes[0]->wait_exit(120s);
  auto& summary = nodes[0]->output();
  INFO(summary);
  CHECK(rc0 == 0);
  CHECK(summary.find("3200 of 3200 requested") != std::string::npos);
  CHECK(summary.find("volunteers placed (least throughput) volunteers.0 in stage 1") !=
        std::string::npos);
  std::smatch m;
  REQUIRE(std::regex_search(summary, m,
                            std::regex{R"([0-9a-f]{40}\.client\.invalid:1/s1v0g0 at step (\d+))"}));
  CHECK(std::stoi(m[1]) > 0);
  CHECK(client.wait_exit(30s).has_value());
}

} // namespace starling::test::runtime_join_cluster_test
