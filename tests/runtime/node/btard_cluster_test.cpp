// The `btard` kind across processes: four `starling node` processes, one BTARD peer each (signing
// with its node's key), train one model with the DHT as the board. One peer (drawn from the seed) sends a part holding a NaN
// at step 2 (committed to, so its proof is public): it is banned in that step. An honest peer's
// process is SIGKILLed mid-run and started again at once (same key): it is silent at the
// deadline, removed, and after its cool-down it comes back with the state the others sign,
// commits afresh and takes every remaining step; it is never banned, and its new audit log
// (starting where it came back) passes `starling audit`. Every step's peers hold the same
// parameters (node 0's
// reporter compares the digests every peer reports; the test reads them from metrics.jsonl
// too), every ban reaches the honest nodes' gates (the attacker's node, restarted with its key,
// is refused by the node it dials and exits 2; node 0's ledger shows that refusal through the
// refusing node's gate record), and every live honest process exits 0.
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/http_client.hpp"
#include "support/node_fixtures.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_btard_cluster_test {

using starling::testing::subprocess;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

std::string write_config(const std::string& dir) {
  auto path = dir + "/btard-cluster.yaml";
  std::ofstream f{path};
  f << "experiment: {name: btard-cluster-test, kind: btard, seed: 5, duration: 3min}\n"
       "caf:\n"
       "  scheduler: {policy: sharing, max_threads: 2}\n"
       "  middleman: {heartbeat_interval: 500ms, connection_timeout: 2s}\n"
       "btard:\n"
       "  peers: 4\n"
       "  byzantine: 1\n"
       "  steps: 14\n"
       "  attack: non_finite_part\n"
       "  attack_start: 2\n"
       "  hidden: 16\n"
       "  batch: 8\n"
       "  lr: 0.05\n"
       "  cool_down: 2\n"
       "  silences_to_ban: 3\n" // a restarted peer late under load gets a second chance
       "  eval_every: 7\n"
       "  synthetic: true\n"
       "  train_samples: 2000\n"
       "  eval_samples: 200\n"
       "  phase_deadline: 8s\n"
       "  poll: 50ms\n"
       "node: {http: 127.0.0.1:0, ledger_every: 1s}\n";
  return path;
}

/// The rows of node 0's metrics.jsonl of one kind.
std::vector<nlohmann::json> rows_of(const std::string& path, const std::string& kind) {
  std::vector<nlohmann::json> out;
  std::ifstream in{path};
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == kind)
      out.push_back(j);
  }
  return out;
}

std::string label(const nlohmann::json& row, const std::string& key) {
  if (row.contains("labels") && row["labels"].contains(key))
    return row["labels"][key].get<std::string>();
  if (row.contains(key) && row[key].is_string())
    return row[key].get<std::string>();
  return {};
}

double value(const nlohmann::json& row, const std::string& key) {
  if (row.contains("values") && row["values"].contains(key))
    return row["values"][key].get<double>();
  if (row.contains(key) && row[key].is_number())
    return row[key].get<double>();
  return -1;
}

} // namespace

TEST_CASE("btard across 4 starling node processes: a NaN part bans its sender in its step, a "
          "SIGKILLed and restarted peer is removed at the deadline and comes back with the "
          "group's state after its cool-down, and every step's peers hold the same parameters") {
  starling::testing::temp_dir dir{"starling-btard-cluster"};
  auto config = write_config(dir.path);
  auto nodes = starling::testing::start_nodes(4, [&](int i) {
    return std::vector<std::string>{STARLING_BINARY, "node",   "--listen", "127.0.0.1:0",
                                    "--config",      config,   "--index",  std::to_string(i),
                                    "--nodes",       "4",      "--out",
                                    dir.path + "/n" + std::to_string(i)};
  });
  REQUIRE(nodes.size() == 4);
  const auto metrics = dir.path + "/n0/metrics.jsonl";
  auto drain = [&] {
    for (size_t i = 1; i < nodes.size(); ++i)
      if (nodes[i])
        while (nodes[i]->read_line(0ms)) {
        }
  };
  // Which peer attacks (the seed draws it; instance i runs on node i).
  int victim = -1;
  std::string victim_peer;
  auto deadline = clock_type::now() + 90s;
  while (victim < 0 && clock_type::now() < deadline) {
    drain();
    (void)nodes[0]->read_line(100ms);
    std::map<std::string, std::string> attack_of;
    uint64_t latest = 0;
    for (auto& r : rows_of(metrics, "btard_step")) {
      attack_of[r.value("source", "")] = label(r, "attack");
      latest = std::max<uint64_t>(latest, static_cast<uint64_t>(value(r, "step")));
    }
    if (attack_of.size() == 4 && latest >= 4)
      for (int i = 1; i < 4 && victim < 0; ++i)
        if (attack_of["peer." + std::to_string(i)].empty())
          victim = i;
  }
  REQUIRE(victim > 0);
  for (auto& r : rows_of(metrics, "btard_step"))
    if (r.value("source", "") == "peer." + std::to_string(victim))
      victim_peer = label(r, "peer");
  auto line_with = [](const std::string& text, const std::string& what) {
    auto at = text.find(what);
    return at == std::string::npos ? std::string{} : text.substr(at, text.find('\n', at) - at);
  };
  nodes[static_cast<size_t>(victim)]->signal(SIGKILL);
  (void)nodes[static_cast<size_t>(victim)]->wait_exit(10s);
  // The same node again (its key is in the same --out folder), joining through node 0.
  nodes[static_cast<size_t>(victim)] = std::make_unique<subprocess>(std::vector<std::string>{
      STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", config, "--index",
      std::to_string(victim), "--nodes", "4", "--out", dir.path + "/n" + std::to_string(victim),
      "--join",
      starling::testing::endpoint_of(line_with(nodes[0]->output(), "listening on"))});

  // The attacker's node, banned at step 2, comes back with its key (the same --out folder)
  // through the honest node other than node 0: that node refuses it, and it says so and exits 2.
  int attacker_node = -1;
  for (auto& r : rows_of(metrics, "btard_step"))
    if (!label(r, "attack").empty())
      attacker_node = std::stoi(r.value("source", "peer.-1").substr(5));
  REQUIRE(attacker_node > 0);
  REQUIRE(attacker_node != victim);
  int refuser = 6 - victim - attacker_node; // the honest node of 1..3 that is neither
  REQUIRE(refuser > 0);
  REQUIRE(refuser < 4);
  {
    auto& a = nodes[static_cast<size_t>(attacker_node)];
    a->signal(SIGKILL);
    (void)a->wait_exit(10s);
    subprocess again{{STARLING_BINARY, "node", "--listen", "127.0.0.1:0", "--config", config,
                      "--index", std::to_string(attacker_node), "--nodes", "4", "--out",
                      dir.path + "/n" + std::to_string(attacker_node), "--join",
                      starling::testing::endpoint_of(line_with(
                          nodes[static_cast<size_t>(refuser)]->output(), "listening on"))}};
    std::string said;
    std::optional<int> code;
    auto until = clock_type::now() + 60s;
    while (!code && clock_type::now() < until) {
      drain();
      (void)nodes[0]->read_line(0ms);
      if (auto line = again.read_line(100ms))
        said += *line + "\n";
      code = again.wait_exit(0ms);
    }
    while (auto line = again.read_line(0ms))
      said += *line + "\n";
    CAPTURE(said);
    REQUIRE(code);
    CHECK(*code == 2);
    CHECK(said.find("refused (banned)") != std::string::npos);
    a.reset();
  }

  // Node 0's ledger lists that refusal, which node 0's gate did not make: the refusing node's
  // gate publishes what it refused, and node 0's page reads it: the banned party's row counts
  // two or more gates that refused it (node 0's own gate counts one at most: it refused the
  // attacker's first process after the ban; the others' come from their gate records).
  std::string seen_refused;
  double waited_s = 0;
  std::optional<int> rc; // node 0's exit code, once it ended the run
  {
    auto page = line_with(nodes[0]->output(), "watch the run at http://127.0.0.1:");
    REQUIRE_FALSE(page.empty());
    auto port = static_cast<uint16_t>(
        std::stoi(page.substr(page.find("127.0.0.1:") + std::string("127.0.0.1:").size())));
    auto from = clock_type::now();
    auto until = from + 30s;
    while (seen_refused.empty() && clock_type::now() < until &&
           !(rc = nodes[0]->wait_exit(0ms))) {
      drain();
      (void)nodes[0]->read_line(200ms);
      auto r = starling::testing::http_get(port, "/status", 2s);
      if (!r || r->status != 200)
        continue;
      auto j = nlohmann::json::parse(r->body, nullptr, false);
      if (j.is_discarded())
        continue;
      for (auto& row : j["ledger"])
        if (row.value("banned", false) && row.value("refused_by", 0) >= 2)
          seen_refused = row.dump();
    }
    waited_s = std::chrono::duration<double>(clock_type::now() - from).count();
  }
  CAPTURE(waited_s);
  CHECK_MESSAGE(!seen_refused.empty(),
                "node 0's ledger shows no party refused by two gates within 30 s");

  // Node 0 ends the run once the live peers are done.
  std::vector<std::string> out;
  deadline = clock_type::now() + 120s;
  while (!rc && clock_type::now() < deadline) {
    drain();
    if (auto line = nodes[0]->read_line(100ms))
      out.push_back(*line);
    rc = nodes[0]->wait_exit(0ms);
  }
  while (auto line = nodes[0]->read_line(0ms))
    out.push_back(*line);
  if (!rc) {
    // What every process said, to see where the run stalled.
    std::string all;
    for (size_t i = 0; i < nodes.size(); ++i)
      if (nodes[i])
        all += "--- node " + std::to_string(i) + "\n" + nodes[i]->output();
    CAPTURE(all);
    FAIL("node 0 did not end the run");
  }
  const std::string& text = nodes[0]->output(); // every line node 0 printed
  CAPTURE(text);
  CHECK(*rc == 0);
  CHECK(text.find("steps where peers held different parameters: 0") != std::string::npos);
  // One peer per node: the peers sign with their nodes' keys, and every verdict's ban reaches
  // the node's gate, which refuses the banned node from then on.
  CHECK(text.find("by this node's verdict") != std::string::npos);
  CHECK(text.find("bans taken by the nodes' gates: none") == std::string::npos);
  for (size_t i = 1; i < nodes.size(); ++i) {
    if (!nodes[i])
      continue;
    auto code = nodes[i]->wait_exit(30s);
    REQUIRE(code);
    CHECK(*code == 0);
  }

  // The attacker is banned at step 2 in every live honest view; the killed peer later.
  std::string attacker_peer;
  std::map<uint64_t, std::set<std::string>> digests;
  std::map<std::string, uint64_t> last_step;
  std::map<uint64_t, std::set<std::string>> bans_at;
  for (auto& r : rows_of(metrics, "btard_step")) {
    auto src = r.value("source", "");
    auto step = static_cast<uint64_t>(value(r, "step"));
    if (!label(r, "attack").empty())
      attacker_peer = label(r, "peer");
    if (value(r, "applied") > 0)
      digests[step].insert(label(r, "params"));
    last_step[src] = std::max(last_step[src], step);
    std::string bans = label(r, "bans");
    size_t start = 0;
    while (start < bans.size()) {
      auto comma = bans.find(',', start);
      if (comma == std::string::npos)
        comma = bans.size();
      bans_at[step].insert(bans.substr(start, comma - start));
      start = comma + 1;
    }
  }
  REQUIRE(!attacker_peer.empty());
  CHECK(attacker_peer != victim_peer);
  for (auto& [step, ds] : digests) {
    CAPTURE(step);
    CHECK(ds.size() == 1);
  }
  CHECK(digests.size() == 14);
  CHECK(bans_at[2].count(attacker_peer) == 1);
  // The restarted peer came back after its cool-down, took the last step, and nobody banned it.
  CHECK(bans_at[13].count(victim_peer) == 0);
  CHECK(bans_at[13].size() == 1);
  CHECK(last_step["peer." + std::to_string(victim)] == 13);
  auto rejoins = rows_of(metrics, "btard_rejoin");
  REQUIRE(!rejoins.empty());
  for (auto& r : rejoins)
    CHECK(r.value("source", "") == "peer." + std::to_string(victim));
  CHECK(text.find("came back at step") != std::string::npos);
  {
    auto victim_out = nodes[static_cast<size_t>(victim)]->output();
    CAPTURE(victim_out);
    CHECK(victim_out.find("took the group's state at step") != std::string::npos);
  }

  // Each live honest peer's audit log passes `starling audit`: signatures, the MPRNG chain,
  // validators, aggregate checks and every verdict's rule, from what that peer read.
  size_t audited = 0, audited_resumed = 0;
  for (auto& entry : std::filesystem::recursive_directory_iterator(dir.path)) {
    auto name = entry.path().filename().string();
    const std::string suffix = ".btard-audit.jsonl";
    if (name.size() < suffix.size() || name.substr(name.size() - suffix.size()) != suffix)
      continue;
    bool resumed = name.find(".from-") != std::string::npos;
    if (name.rfind("peer." + std::to_string(victim) + ".", 0) == 0 && !resumed)
      continue; // killed mid-step: its first log ends where it died
    subprocess audit{{STARLING_BINARY, "audit", entry.path().string()}};
    std::string said;
    while (auto line = audit.read_line(5s))
      said += *line + "\n";
    auto code = audit.wait_exit(30s);
    CAPTURE(said);
    REQUIRE(code);
    CHECK(*code == 0);
    if (resumed) {
      CHECK(said.find("came back into the running group at step") != std::string::npos);
      ++audited_resumed;
    } else {
      ++audited;
    }
  }
  CHECK(audited == 3);         // the live peers' logs from step 0
  CHECK(audited_resumed >= 1); // the restarted peer's, from where it came back
}

} // namespace starling::test::runtime_btard_cluster_test
