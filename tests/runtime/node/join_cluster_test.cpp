// `starling join` as a volunteer would run it: a closed dedloc run of two `starling node`
// processes (node 1 serves the same experiment unsigned), a volunteer with only a key of its
// own (`starling key init`) and a token issued for its public key file (`starling token issue
// --peer-key`). Joining through node 1 alone is refused with one line (unsigned); joining
// through node 1 then node 0 fetches the signed experiment from node 0, takes the open slot,
// trains and is credited by its partners (its progress line says so); SIGINT makes it leave
// gracefully (tombstone and slot release acknowledged) and node 0 hears of the leave. The slot
// it released takes a second volunteer in client mode (--client), credited too.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "support/node_fixtures.hpp"
#include "support/paths.hpp"
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

/// Two data-parallel peers and one open slot; summaries every second, so that a volunteer's
/// credits show within seconds.
std::string config_text() {
  return "experiment: {name: join-test, kind: dedloc, seed: 5, duration: 3min}\n"
         "caf:\n"
         "  scheduler: {policy: sharing, max_threads: 2}\n"
         "  middleman: {heartbeat_interval: 500ms, connection_timeout: 2s}\n"
         "node: {ledger_every: 1s}\n"
         "dedloc:\n"
         "  peers: 2\n"
         "  volunteers: 1\n"
         "  width: 16\n"
         "  microbatch: 16\n"
         "  target_batch: 128\n"
         "  compute_time: 20ms\n"
         "  window: 500ms\n"
         "  averager_timeout: 4s\n"
         "  round_timeout: 6s\n"
         "  record_lifetime: 6s\n"
         "  eval_every: 0\n"
         "  train_samples: 2000\n"
         "  synthetic: true\n";
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
  for (auto n : {"n0", "n1", "r"}) {
    auto k = auth::load_or_create_key(d + "/" + n + "/node.key", auth::key_role::node);
    REQUIRE(k.ok());
    auto t = auth::issue_token(
        *authority, {k->key.public_key(), {"any"}, ao.now_ns, int64_t{3600} * 1'000'000'000, {}});
    REQUIRE(t.ok());
    REQUIRE(auth::write_file_atomically(d + "/" + n + ".token", t->file_text, 0600).ok());
  }
  auto config = d + "/run.yaml";
  std::filesystem::create_directories(d + "/unsigned");
  auto unsigned_config = d + "/unsigned/run.yaml";
  std::ofstream{config} << config_text();
  std::ofstream{unsigned_config} << config_text();
  auto signed_out = run_cli({"authority", "sign-experiment", config, "--authority", ao.dir});
  CHECK(signed_out.find("wrote " + config + ".sig") != std::string::npos);
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
  drain();

  // 2. Node 1, then node 0: the signed experiment from node 0, the open slot, work, credits.
  auto joined_at = std::chrono::steady_clock::now();
  subprocess vol{join_argv({ep1, ep0}, "v", "v-out")};
  auto joined = vol.wait_for("joined through", 60s);
  REQUIRE_MESSAGE(joined, vol.output());
  CHECK(joined->find(ep0) != std::string::npos);
  CHECK(joined->find("signed by the run's authority") != std::string::npos);
  auto reach = vol.wait_for("full mode", 10s);
  CHECK_MESSAGE(reach, vol.output());
  CHECK_MESSAGE(vol.wait_for("holds slot volunteers.0", 60s), vol.output());
  std::ifstream written{d + "/v-out/experiment.yaml"};
  std::string got((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  CHECK(got == config_text());
  double samples = 0, accepted = 0;
  std::regex progress{R"(your contribution: (\d+) samples, (\d+) accepted, uptime)"};
  auto deadline = std::chrono::steady_clock::now() + 90s;
  while ((accepted <= 0 || samples <= 0) && std::chrono::steady_clock::now() < deadline) {
    drain();
    auto line = vol.read_line(500ms);
    std::smatch m;
    if (line && std::regex_search(*line, m, progress)) {
      samples = std::stod(m[1]);
      accepted = std::stod(m[2]);
    }
    if (vol.wait_exit(0ms))
      break;
  }
  auto credited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at).count();
  REQUIRE_MESSAGE(accepted > 0, "the volunteer was never credited:\n" << vol.output());
  // (Accepted comes from the partners' summaries, computed from the volunteer's own: read at
  // different moments, either may be ahead.)
  CHECK(samples > 0);

  // 3. SIGINT: a graceful leave, acknowledged, exit 0; node 0 hears of it.
  auto sigint_at = std::chrono::steady_clock::now();
  vol.signal(SIGINT);
  auto left = vol.wait_for("volunteer: left:", 60s);
  REQUIRE_MESSAGE(left, vol.output());
  CHECK_MESSAGE(left->find("tombstone stored on") != std::string::npos, *left);
  CHECK_MESSAGE(left->find("released (stored on") != std::string::npos, *left);
  CHECK(vol.wait_exit(30s) == 0);
  auto leave_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sigint_at).count();
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
  CHECK_MESSAGE(client.wait_for("client mode (--client)", 60s), client.output());
  CHECK_MESSAGE(client.wait_for("holds slot volunteers.0", 60s), client.output());
  double client_accepted = 0;
  deadline = std::chrono::steady_clock::now() + 60s;
  while (client_accepted <= 0 && std::chrono::steady_clock::now() < deadline) {
    drain();
    auto line = client.read_line(500ms);
    std::smatch m;
    if (line && std::regex_search(*line, m, progress))
      client_accepted = std::stod(m[2]);
    if (client.wait_exit(0ms))
      break;
  }
  CHECK_MESSAGE(client_accepted > 0, "the client-mode volunteer was never credited:\n"
                                         << client.output());
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

  nodes[0]->signal(SIGINT);
  CHECK(nodes[0]->wait_exit(60s) == 0);
  CHECK(nodes[1]->wait_exit(60s) == 0);
  MESSAGE(
      fmt::format("wall {:.1f} s; join to first credit {:.1f} s ({:.0f} samples, {:.0f} "
                  "accepted); SIGINT to exit {:.1f} s",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count(),
                  credited_s, samples, accepted, leave_s));
}

} // namespace starling::test::runtime_join_cluster_test
