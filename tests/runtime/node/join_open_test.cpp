// `starling join EP` into an OPEN run (no authority, no token): a one-node dedloc run started
// without node.authority/node.token, and a volunteer with no token and no key of its own (its
// HOME is an empty folder: no ~/.starling/node.key). The volunteer learns the run's name from the
// node it reached, makes a fresh node key in its run folder (mode 0600), says in one line that
// the run is open and its experiment unsigned, takes the open slot, is credited by its partners
// and leaves gracefully on SIGINT with exit 0. (The closed run joined without a token is step 1b
// of join_cluster_test.cpp, whose closed run is started there already.) Before the run: a --key
// that does not exist is an error, and an endpoint where nothing listens is exit 3. A closed
// run without TLS is refused by the first node's hello (it shows a token), in one line.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

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
#include "support/join_fixtures.hpp"
#include "support/node_fixtures.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_join_open_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
namespace auth = starling::actors::auth;


TEST_CASE("starling join without a token joins an open run: a fresh key in its run folder, the "
          "experiment accepted unsigned and said so, the slot, credits, a graceful leave") {
  auto began = std::chrono::steady_clock::now();
  starling::testing::temp_dir dir{"starling-join-open"};
  auto d = dir.path;
  REQUIRE(std::filesystem::exists("/usr/bin/env"));
  // Before any run: a --key that does not exist is an error (only the default path is made up
  // for), and an endpoint where nothing listens (a port bound, never listened on) is exit 3 with
  // the hint, no key made.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    auto dead = fmt::format("127.0.0.1:{}", ntohs(a.sin_port));
    subprocess keyless{{STARLING_BINARY, "join", dead, "--key", d + "/none/node.key", "--out",
                        d + "/k-out"}};
    CHECK(keyless.wait_exit(30s) == 2);
    while (keyless.read_line(0ms)) {
    }
    CHECK_MESSAGE(keyless.output().find("make one with starling key init --out " + d +
                                        "/none/node.key") != std::string::npos,
                  keyless.output());
    std::filesystem::create_directories(d + "/empty-home");
    subprocess nobody{{"/usr/bin/env", "HOME=" + d + "/empty-home", STARLING_BINARY, "join", dead,
                       "--listen", "127.0.0.1:0", "--out", d + "/x-out"}};
    CHECK(nobody.wait_exit(30s) == 3);
    while (nobody.read_line(0ms)) {
    }
    CHECK_MESSAGE(nobody.output().find("nothing answers there") != std::string::npos,
                  nobody.output());
    CHECK_FALSE(std::filesystem::exists(d + "/x-out/node.key"));
    ::close(fd);
  }
  auto config = d + "/run.yaml";
  std::ofstream{config} << starling::testing::join_run_config("join-open-test", 7);
  auto nodes = starling::testing::start_nodes(1, [&](int) {
    return std::vector<std::string>{STARLING_BINARY, "node",  "--listen", "127.0.0.1:0",
                                    "--config",      config,  "--index",  "0",
                                    "--nodes",       "1",     "--out",    d + "/n0"};
  });
  REQUIRE(nodes.size() == 1);
  auto ep0 = starling::testing::endpoint_of(nodes[0]->output());
  auto served = nodes[0]->wait_for("serves its experiment", 30s);
  REQUIRE_MESSAGE(served, nodes[0]->output());
  CHECK(served->find("an open run: unsigned") != std::string::npos);
  CHECK(nodes[0]->output().find("this run is open") != std::string::npos);
  auto drain = [&] {
    while (nodes[0]->read_line(0ms)) {
    }
  };

  // The volunteer's HOME holds no key (the subprocess helper passes no environment of its own:
  // /usr/bin/env sets HOME, and execs starling, so the signals below reach it).
  auto home = d + "/home";
  std::filesystem::create_directories(home);
  auto out = d + "/v-out";
  auto joined_at = std::chrono::steady_clock::now();
  subprocess vol{{"/usr/bin/env", "HOME=" + home, STARLING_BINARY, "join", ep0, "--listen",
                  "127.0.0.1:0", "--out", out}};
  auto made = vol.wait_for("made a fresh node key", 30s);
  REQUIRE_MESSAGE(made, vol.output());
  CHECK_MESSAGE(made->find(out + "/node.key") != std::string::npos, *made);
  CHECK_MESSAGE(made->find("no key at " + home + "/.starling/node.key") != std::string::npos,
                *made);
  std::smatch m;
  REQUIRE(std::regex_search(*made, m, std::regex{R"(\(peer id ([0-9a-f]{12})\))"}));
  auto peer = m[1].str();
  struct stat st {};
  REQUIRE(::stat((out + "/node.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  CHECK_FALSE(std::filesystem::exists(home + "/.starling"));
  auto who = vol.wait_for("volunteer " + out + "/node.key", 30s);
  REQUIRE_MESSAGE(who, vol.output());
  CHECK_MESSAGE(who->find("(peer id " + peer + ")") != std::string::npos, *who);
  CHECK_MESSAGE(who->find("no token: joining the open run 'join-open-test'") != std::string::npos,
                *who);
  auto joined = vol.wait_for("joined an open run through " + ep0, 30s);
  REQUIRE_MESSAGE(joined, vol.output());
  CHECK_MESSAGE(joined->find("experiment 'join-open-test'") != std::string::npos, *joined);
  CHECK_MESSAGE(joined->find("its experiment is unsigned (no authority): you trust the node you "
                             "reached") != std::string::npos,
                *joined);
  CHECK_MESSAGE(vol.wait_for("full mode", 10s), vol.output());
  CHECK_MESSAGE(vol.wait_for("holds slot volunteers.0", 60s), vol.output());
  // No token, no authority: nothing of either in its run folder.
  CHECK_FALSE(std::filesystem::exists(out + "/authority.pub"));
  std::ifstream written{out + "/experiment.yaml"};
  std::string got((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  CHECK(got == starling::testing::join_run_config("join-open-test", 7));

  // Credited by its partners (the progress line follows the ledger): accepted > 0, never more
  // than it computed.
  std::regex progress{R"(your contribution: (\d+) samples, (\d+) accepted, uptime)"};
  double samples = 0, accepted = 0;
  int inconsistent = 0;
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (accepted <= 0 && std::chrono::steady_clock::now() < deadline) {
    drain();
    auto line = vol.read_line(500ms);
    std::smatch x;
    if (line && std::regex_search(*line, x, progress)) {
      samples = std::stod(x[1]);
      accepted = std::stod(x[2]);
      inconsistent += accepted > samples ? 1 : 0;
    }
    if (vol.wait_exit(0ms))
      break;
  }
  auto credited_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at).count();
  REQUIRE_MESSAGE(accepted > 0, "the volunteer was never credited:\n" << vol.output());
  CHECK(inconsistent == 0);

  // SIGINT: a graceful leave, acknowledged, exit 0.
  auto leave_s = starling::testing::graceful_leave(vol);
  // No token: no expiry plan, so no warning ever.
  CHECK(vol.output().find("your token expires") == std::string::npos);
  CHECK(vol.output().find("starling: error") == std::string::npos);

  drain();
  nodes[0]->signal(SIGINT);
  CHECK(nodes[0]->wait_exit(60s) == 0);
  MESSAGE(fmt::format("wall {:.1f} s; join to first credit {:.1f} s ({:.0f} samples, {:.0f} "
                      "accepted); SIGINT to exit {:.1f} s",
                      std::chrono::duration<double>(std::chrono::steady_clock::now() - began)
                        .count(),
                      credited_s, samples, accepted, leave_s));
}

TEST_CASE("starling join without a token refuses a closed run without TLS by the acceptor's "
          "hello (it shows a token): one line with the fix, exit 2, no key made") {
  // With TLS (join_cluster_test's closed run) the handshake refuses the joiner first; without
  // it the first node's hello is what says the run is closed.
  starling::testing::temp_dir dir{"starling-join-closed-plain"};
  auto d = dir.path;
  REQUIRE(std::filesystem::exists("/usr/bin/env"));
  auth::authority_init_options ao;
  ao.dir = d + "/auth";
  ao.experiment = "plain-closed";
  ao.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count() -
              60'000'000'000;
  auto authority = auth::init_authority(ao);
  REQUIRE(authority.ok());
  auto k = auth::load_or_create_key(d + "/n0/node.key", auth::key_role::node);
  REQUIRE(k.ok());
  auto t = auth::issue_token(
    *authority, {k->key.public_key(), {"any"}, ao.now_ns, int64_t{3600} * 1'000'000'000, {}});
  REQUIRE(t.ok());
  REQUIRE(auth::write_file_atomically(d + "/n0.token", t->file_text, 0600).ok());
  // A bare node (no experiment) of the closed run, TLS off.
  std::ofstream{d + "/node.yaml"} << "node: {tls: false}\n";
  auto nodes = starling::testing::start_nodes(1, [&](int) {
    return std::vector<std::string>{STARLING_BINARY, "node", "--listen", "127.0.0.1:0",
                                    "--config", d + "/node.yaml", "--authority",
                                    ao.dir + "/authority.pub", "--token", d + "/n0.token",
                                    "--key", d + "/n0/node.key"};
  });
  REQUIRE(nodes.size() == 1);
  auto ep0 = starling::testing::endpoint_of(nodes[0]->output());
  auto closed = nodes[0]->wait_for("closed run plain-closed", 30s);
  REQUIRE_MESSAGE(closed, nodes[0]->output());
  CHECK(closed->find("NOT encrypted") != std::string::npos);
  auto joiner = starling::testing::join_without_token(d + "/home", ep0, d + "/j-out");
  auto& o = joiner.output;
  CHECK_MESSAGE(joiner.rc == 2, o);
  CHECK_MESSAGE(o.find(ep0 + ": a node of the closed run 'plain-closed' (its hello shows a "
                       "token)") != std::string::npos,
                o);
  CHECK_MESSAGE(o.find("the run is closed: get a token from its owner (starling key init, then "
                       "the owner runs starling token issue --peer-key YOUR_KEY.pub") !=
                  std::string::npos,
                o);
  CHECK(o.find("made a fresh node key") == std::string::npos);
  CHECK(o.find("joined") == std::string::npos);
  CHECK_FALSE(std::filesystem::exists(d + "/j-out/node.key"));
  nodes[0]->signal(SIGINT);
  CHECK(nodes[0]->wait_exit(30s).has_value());
}

} // namespace starling::test::runtime_join_open_test
