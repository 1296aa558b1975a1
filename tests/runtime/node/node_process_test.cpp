#include <doctest/doctest.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "support/subprocess.hpp"

using starling::testing::subprocess;
using namespace std::chrono_literals;

namespace {

/// Writes a config with fast failure detection (heartbeat 100 ms, connection timeout 1 s).
std::string fast_config() {
  auto path = std::filesystem::temp_directory_path()
              / fmt::format("starling-node-test-{}.yaml", getpid());
  std::ofstream out{path};
  out << "experiment: {name: node-test}\n"
         "caf:\n"
         "  middleman: {heartbeat_interval: 100ms, connection_timeout: 1s}\n";
  return path.string();
}

std::string port_of(const std::string& listening_line) {
  return listening_line.substr(listening_line.rfind(':') + 1);
}

} // namespace

TEST_CASE("two starling node processes ping, and a SIGKILLed one is reported dead") {
  auto cfg = fast_config();
  subprocess a{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", cfg, "--name",
                "a"}};
  auto la = a.wait_for("listening on", 30s);
  REQUIRE(la);
  auto port = port_of(*la);
  subprocess b{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--join",
                "127.0.0.1:" + port, "--config", cfg, "--name", "b"}};
  auto pong = b.wait_for("ping 127.0.0.1:" + port, 30s);
  REQUIRE(pong);
  CHECK(pong->find("reply from a") != std::string::npos);
  a.signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto down = b.wait_for("down", 30s);
  auto detected = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(down);
  CHECK(down->find("peer 127.0.0.1:" + port) != std::string::npos);
  MESSAGE("dead peer reported after " << detected << " s (connection timeout 1 s)");
  b.signal(SIGTERM);
  auto t1 = std::chrono::steady_clock::now();
  auto rc = b.wait_exit(30s);
  auto stopped = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  REQUIRE(rc);
  CHECK(*rc == 0);
  MESSAGE("SIGTERM to exit: " << stopped << " s");
  std::filesystem::remove(cfg);
}

TEST_CASE("a starling node stops cleanly on SIGINT") {
  subprocess a{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--name", "a"}};
  REQUIRE(a.wait_for("listening on", 30s));
  a.signal(SIGINT);
  auto rc = a.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 0);
  CHECK(a.output().find("shutting down (SIGINT)") != std::string::npos);
}

TEST_CASE("the CLI rejects bad input with one clear line and a non-zero exit") {
  subprocess bad_listen{{STARLING_BINARY, "node", "--listen", "127.0.0.1:99999"}};
  auto rc = bad_listen.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 2);
  CHECK(bad_listen.output().find("starling: error: --listen: expected a port") == 0);
  subprocess no_file{{STARLING_BINARY, "run", "/nonexistent.yaml"}};
  rc = no_file.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc == 2);
  CHECK(no_file.output() == "starling: error: /nonexistent.yaml: cannot open the file\n");
  subprocess no_cmd{{STARLING_BINARY}};
  rc = no_cmd.wait_exit(30s);
  REQUIRE(rc);
  CHECK(*rc != 0);
}
