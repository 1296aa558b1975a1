// `starling run --http` end to end: a local ping run with preemptions serves /metrics and
// /status while it runs; every scrape parses, counters never decrease from one scrape to the
// next while pingers are killed and come back, and the run ends as it would without the page.
// A bad or taken endpoint fails the run at once with one clear line.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/role.hpp"
#include "runtime/experiment/yaml.hpp"
#include "runtime/observe/exposition.hpp"
#include "runtime/observe/http_server.hpp"
#include "runtime/observe/snapshot.hpp"
#include "support/http_client.hpp"
#include "support/scratch.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_observe_watch_run_test {

using namespace std::chrono_literals;
namespace obs = starling::runtime::observe;

using testing::scratch;

std::string ping_yaml(const scratch& dir) {
  auto file = (dir.path / "watch-ping.yaml").string();
  std::ofstream{file} << "experiment: {name: watch-ping, kind: ping, seed: 3, mode: local, "
                         "duration: 4s}\n"
                         "ping: {nodes: 3, payload: 1KB, interval: 100ms, timeout: 1s}\n"
                         "faults:\n"
                         "  - {preempt: pinger, every: 1s, restart_after: 300ms}\n";
  return file;
}

uint16_t port_of(const std::string& line) {
  auto at = line.find("http://127.0.0.1:");
  if (at == std::string::npos)
    return 0;
  return static_cast<uint16_t>(std::atoi(line.c_str() + at + 17));
}

TEST_CASE("a local run serves /metrics and /status while it runs, counters only growing") {
  scratch dir{"starling-watch-run"};
  auto yaml = ping_yaml(dir);
  testing::subprocess run{{STARLING_BINARY, "run", yaml, "--out", (dir.path / "out").string(),
                           "--http", "127.0.0.1:0"}};
  auto line = run.wait_for("watch the run at", 60s);
  REQUIRE_MESSAGE(line, run.output());
  auto port = port_of(*line);
  REQUIRE(port > 0);
  std::vector<obs::metric_family> before;
  int scrapes = 0;
  double last_version = 0;
  double most_faults = 0;
  double most_restarts = 0;
  bool agreed = false;
  std::optional<int> exit;
  while (!(exit = run.wait_exit(0ms))) {
    auto m = testing::http_get(port, "/metrics", 2000ms);
    auto st = testing::http_get(port, "/status", 2000ms);
    if (m && st) {
      REQUIRE(m->status == 200);
      auto parsed = obs::parse_exposition(m->body);
      REQUIRE_MESSAGE(parsed.ok(), (parsed.ok() ? "" : parsed.error().what));
      if (!before.empty()) {
        auto grew = obs::check_counters_grow(before, *parsed);
        CHECK_MESSAGE(grew.ok(), grew.what());
      }
      auto version = obs::find_sample(*parsed, "starling_snapshot_version");
      CHECK(version >= last_version);
      last_version = version;
      most_faults = std::max(most_faults, obs::find_sample(*parsed, "starling_faults_total",
                                                           {{"action", "kill_instance"}}));
      most_restarts = std::max(most_restarts, obs::find_sample(*parsed, "starling_restarts_total"));
      auto j = nlohmann::json::parse(st->body);
      if (j["version"].get<double>() == version) {
        agreed = true;
        CHECK(j["metrics"]["starling_events_total"].get<double>() ==
              obs::find_sample(*parsed, "starling_events_total"));
      }
      CHECK(j["run"]["experiment"] == "watch-ping");
      CHECK(j["run"]["mode"] == "local");
      before = std::move(*parsed);
      ++scrapes;
    }
    // Paced by the run's own output (a bounded wait that also notices its end).
    run.read_line(100ms);
  }
  CHECK(*exit == 0);
  MESSAGE(scrapes << " scrapes, last snapshot version " << last_version);
  CHECK(scrapes >= 5);
  CHECK(agreed);
  CHECK(most_faults >= 1);
  CHECK(most_restarts >= 1);
  CHECK(obs::find_sample(before, "starling_events_total") > 10);
}

TEST_CASE("a bad or taken --http endpoint fails the run with one clear line") {
  scratch dir{"starling-watch-bad"};
  auto yaml = ping_yaml(dir);
  {
    testing::subprocess run{{STARLING_BINARY, "run", yaml, "--out", (dir.path / "a").string(),
                             "--http", "127.0.0.1:99999"}};
    auto code = run.wait_exit(30s);
    REQUIRE(code);
    CHECK(*code != 0);
    CHECK(run.output().find("--http") != std::string::npos);
  }
  auto store = std::make_shared<obs::snapshot_store>();
  auto taken = obs::http_server::start(store, obs::http_options{});
  REQUIRE(taken.ok());
  testing::subprocess run{{STARLING_BINARY, "run", yaml, "--out", (dir.path / "b").string(),
                           "--http", "127.0.0.1:" + std::to_string((*taken)->port())}};
  auto code = run.wait_exit(30s);
  REQUIRE(code);
  CHECK(*code != 0);
  CHECK(run.output().find("cannot bind") != std::string::npos);
}

} // namespace starling::test::runtime_observe_watch_run_test

namespace starling::test::runtime_observe_watch_run_test {

TEST_CASE("node.http is read and checked with the file") {
  using namespace starling::runtime;
  auto ok = read_experiment(
      load_yaml_string(
          "experiment: {name: x, kind: ping}\nnode: {http: \"127.0.0.1:0\"}\nping: {}\n", "x.yaml"),
      builtin_registry(), {});
  CHECK(ok.graph.node.http == "127.0.0.1:0");
  auto none =
      read_experiment(load_yaml_string("experiment: {name: x, kind: ping}\nping: {}\n", "x.yaml"),
                      builtin_registry(), {});
  CHECK(none.graph.node.http.empty());
  std::string error;
  try {
    read_experiment(
        load_yaml_string("experiment: {name: x, kind: ping}\nnode: {http: nonsense}\nping: {}\n",
                         "x.yaml"),
        builtin_registry(), {});
  } catch (const config_error& e) {
    error = e.what();
  }
  CHECK(error.find("node.http") != std::string::npos);
  CHECK(error.find("HOST:PORT") != std::string::npos);
}

} // namespace starling::test::runtime_observe_watch_run_test
