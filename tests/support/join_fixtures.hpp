// What the `starling join` tests share: the small dedloc run a volunteer joins, and a joiner
// started with an empty HOME (no key at ~/.starling/node.key) and no token.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <doctest/doctest.h>
#include <fmt/format.h>

#include "support/subprocess.hpp"

namespace starling::testing {

/// Two data-parallel peers on the run's nodes and one open slot; summaries every second, so
/// that a volunteer's credits show within seconds.
inline std::string join_run_config(const std::string& name, uint64_t seed) {
  return fmt::format("experiment: {{name: {}, kind: dedloc, seed: {}, duration: 3min}}\n", name,
                     seed) +
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

/// SIGINT to a working volunteer: a graceful leave whose tombstone and slot release were
/// stored, then exit 0. Returns the seconds from the signal to the exit.
inline double graceful_leave(subprocess& vol) {
  auto sigint_at = std::chrono::steady_clock::now();
  vol.signal(SIGINT);
  auto left = vol.wait_for("volunteer: left:", std::chrono::seconds(60));
  REQUIRE_MESSAGE(left, vol.output());
  CHECK_MESSAGE(left->find("tombstone stored on") != std::string::npos, *left);
  CHECK_MESSAGE(left->find("released (stored on") != std::string::npos, *left);
  CHECK(vol.wait_exit(std::chrono::seconds(30)) == 0);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - sigint_at).count();
}

/// How a joiner ended: its exit code (none: it did not end within the wait) and all it said.
struct join_outcome {
  std::optional<int> rc;
  std::string output;
};

/// `starling join EP --listen 127.0.0.1:0 --out OUT` with no token, HOME set to the empty
/// folder `home` (through /usr/bin/env), waited for up to 30 s.
inline join_outcome join_without_token(const std::string& home, const std::string& endpoint,
                                       const std::string& out) {
  REQUIRE(std::filesystem::exists("/usr/bin/env"));
  std::filesystem::create_directories(home);
  subprocess p{{"/usr/bin/env", "HOME=" + home, STARLING_BINARY, "join", endpoint, "--listen",
                "127.0.0.1:0", "--out", out}};
  join_outcome o;
  o.rc = p.wait_exit(std::chrono::seconds(30));
  while (p.read_line(std::chrono::milliseconds(0))) {
  }
  o.output = p.output();
  return o;
}

} // namespace starling::testing
