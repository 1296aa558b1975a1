// The contribution ledger of a real run: a short local dedloc collaboration with churn (peers
// leave and newcomers join on the plan's seeded schedule), watched over HTTP. At the end
// `<run>/ledger.csv` credits each peer, from its partners' word, with the samples metrics.jsonl
// says it had averaged: all of them for rounds whose every part took every member's
// contribution (dp_step's `contributors` = `group`), a share for partial rounds (only the parts
// that took it count), so the sums agree exactly when no round was partial. The file is written
// again once the run's actors stopped, with every event metrics.jsonl got: each peer's samples
// computed are at least what its events in metrics.jsonl say, to the last one (its summary may
// claim more: samples accumulated for a round it never took). Accepted samples
// lie between the complete rounds (all but those of the last 200 ms: the run stops its peers
// one after another, and a round's last credit can be cut off) and every averaged update in the
// file, plus what partners credited after the peer's last update and its lone updates: a round
// in flight when the run stopped its peers one after another is credited by the partners that
// got their answer first, while the contributor, stopped before its own answer, writes no
// `dp_step` for it (a flake once: three peers +32 samples each, one third of a 96-sample
// contribution in a group of four, and their partner -96, totals equal); a peer whose own side
// of a round failed steps on its own gradient, which may have reached the partners' parts.
// Every peer that left is listed once, and `/ledger.csv` answered while the run ran.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "support/http_client.hpp"
#include "support/scratch.hpp"
#include "support/paths.hpp"
#include "support/subprocess.hpp"

namespace starling::test::runtime_observe_ledger_run_test {

using namespace std::chrono_literals;

namespace {

using testing::scratch;

uint16_t port_of(const std::string& line) {
  auto at = line.find("http://127.0.0.1:");
  return at == std::string::npos ? 0 : static_cast<uint16_t>(std::atoi(line.c_str() + at + 17));
}

/// CSV lines split at commas (the ledger's fields here hold no commas or quotes).
std::vector<std::map<std::string, std::string>> read_csv(const std::string& text) {
  std::istringstream in{text};
  std::string line;
  std::vector<std::string> head;
  std::vector<std::map<std::string, std::string>> rows;
  auto split = [](const std::string& l) {
    std::vector<std::string> out;
    std::string cell;
    std::istringstream s{l};
    while (std::getline(s, cell, ','))
      out.push_back(cell);
    if (!l.empty() && l.back() == ',')
      out.emplace_back();
    return out;
  };
  while (std::getline(in, line)) {
    if (head.empty()) {
      head = split(line);
      continue;
    }
    auto cells = split(line);
    REQUIRE(cells.size() == head.size());
    std::map<std::string, std::string> row;
    for (size_t i = 0; i < head.size(); ++i)
      row[head[i]] = cells[i];
    rows.push_back(std::move(row));
  }
  return rows;
}

} // namespace

TEST_CASE("a local dedloc run with churn credits every averaged sample to its peer, from its "
          "partners, and keeps every leaver in the ledger") {
  scratch dir{"starling-ledger-run"};
  auto yaml = (dir.path / "ledger-churn.yaml").string();
  std::ofstream{yaml}
      << "experiment: {name: ledger-churn, kind: dedloc, seed: 11, mode: local, duration: 9s}\n"
         "caf: {scheduler: {policy: sharing, max_threads: 2}}\n"
         "node: {ledger_every: 1s}\n"
         "dedloc: {peers: 4, churn: 8, backend: modeled, modeled_params: 20000, microbatch: 32,\n"
         "         compute_time: 20ms, target_batch: 384, window: 400ms, averager_timeout: 3s,\n"
         "         round_timeout: 4s, record_lifetime: 4s, eval_every: 0}\n";
  auto out = dir.path / "out";
  testing::subprocess run{
      {STARLING_BINARY, "run", yaml, "--out", out.string(), "--http", "127.0.0.1:0"}};
  auto url = run.wait_for("watch the run at", 60s);
  REQUIRE(url);
  auto port = port_of(*url);
  REQUIRE(port != 0);
  // The endpoint answers the ledger while the run goes on.
  auto csv = testing::http_get(port, "/ledger.csv", 5s);
  REQUIRE(csv);
  CHECK(csv->status == 200);
  CHECK(csv->body.rfind("peer,peer_id,samples_computed,samples_accepted", 0) == 0);
  auto rc = run.wait_exit(90s);
  INFO(run.output());
  REQUIRE(rc);
  REQUIRE(*rc == 0);

  // What metrics.jsonl says: samples of updates averaged with partners (all, and in complete
  // rounds before the last second of the run's 9), and who left.
  std::map<std::string, double> averaged, complete, computed, lone, last_step, late_credit;
  std::vector<std::tuple<double, std::string, double>> credited; // (t, partner, samples)
  std::set<std::string> left;
  size_t credits = 0;
  std::vector<nlohmann::json> events;
  {
    std::ifstream jl{out / "metrics.jsonl"};
    REQUIRE(jl);
    std::string line;
    while (std::getline(jl, line))
      events.push_back(nlohmann::json::parse(line));
  }
  double last_t = 0;
  for (auto& j : events)
    last_t = std::max(last_t, j.value("t", 0.0));
  for (auto& j : events) {
    auto ev = j.value("event", "");
    auto source = j.value("source", "");
    if (ev == "dp_step" || ev == "dp_dropped")
      computed[source] += j.value("samples", 0.0);
    if (ev == "dp_step")
      last_step[source] = std::max(last_step[source], j.value("t", 0.0));
    if (ev == "dp_step" && j.value("averaged", 0.0) > 0) {
      averaged[source] += j.value("samples", 0.0);
      if (j.value("contributors", 0.0) == j.value("group", -1.0)
          && j.value("t", 99.0) < last_t - 0.2)
        complete[source] += j.value("samples", 0.0);
    } else if (ev == "dp_step")
      lone[source] += j.value("samples", 0.0);
    else if (ev == "dp_leave")
      left.insert(j.value("source", ""));
    else if (ev == "dp_credit") {
      credits++;
      // The partners credited are the event's fields besides its own.
      for (auto& [partner, v] : j.items())
        if (v.is_number() && partner != "t" && partner != "node")
          credited.emplace_back(j.value("t", 0.0), partner, v.get<double>());
    }
  }
  for (auto& [t, partner, v] : credited)
    if (t > last_step[partner])
      late_credit[partner] += v;
  std::ifstream lf{out / "ledger.csv"};
  REQUIRE(lf);
  std::stringstream text;
  text << lf.rdbuf();
  auto rows = read_csv(text.str());
  double accepted = 0, all_averaged = 0, all_complete = 0;
  std::map<std::string, int> seen;
  for (auto& r : rows) {
    auto& peer = r["peer"];
    seen[peer]++;
    auto acc = std::stod(r["samples_accepted"]);
    accepted += acc;
    all_averaged += averaged[peer];
    all_complete += complete[peer];
    CAPTURE(peer);
    CAPTURE(averaged[peer]);
    CAPTURE(lone[peer]);
    CAPTURE(late_credit[peer]);
    CHECK(acc <= (averaged[peer] + lone[peer] + late_credit[peer]) * (1 + 1e-9) + 1e-6);
    CHECK(acc >= complete[peer] * (1 - 1e-9) - 1e-6);
    // The peer's last events are in the file too.
    CHECK(std::stod(r["samples_computed"]) >= computed[peer]);
    if (left.count(peer))
      CHECK(r["left"] == "1");
  }
  MESSAGE("averaged " << all_averaged << " samples in metrics.jsonl (" << all_complete
                      << " in complete rounds before " << last_t - 0.2 << " s), ledger accepted "
                      << accepted << ", "
                      << left.size() << " peer(s) left, " << rows.size() << " ledger rows, "
                      << credits << " dp_credit events");
  REQUIRE(all_complete > 0);
  REQUIRE_FALSE(left.empty());
  for (auto& peer : left)
    CHECK_MESSAGE(seen[peer] == 1, peer << " appears " << seen[peer] << " times");
  for (auto& [peer, n] : seen)
    CHECK_MESSAGE(n == 1, peer << " appears " << n << " times");
  // Peers published their summaries: rows carry the owner key of their records.
  size_t with_id = 0;
  for (auto& r : rows)
    with_id += r["peer_id"].size() == 16 ? 1 : 0;
  CHECK(with_id > 0);
}

} // namespace starling::test::runtime_observe_ledger_run_test
