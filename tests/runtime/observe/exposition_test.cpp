// The Prometheus text format 0.0.4 (runtime/observe/exposition.hpp): our strict parser accepts
// what the format allows and refuses what it does not, our rendering passes it, and /metrics and
// /status rendered from one snapshot hold the same numbers.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/observe/exposition.hpp"
#include "runtime/observe/snapshot.hpp"
#include "runtime/observe/status.hpp"

namespace starling::test::runtime_observe_exposition_test {

using namespace starling::runtime::observe;

bool parses(const std::string& text) {
  return parse_exposition(text).ok();
}

TEST_CASE("the parser accepts the format's escapes, NaN, infinities and timestamps") {
  auto r = parse_exposition("# HELP a_total Help with \\\\ and \\n.\n"
                            "# TYPE a_total counter\n"
                            "a_total{path=\"/x\\\"y\\\\z\\nw\",code=\"200\"} 3 1700000000000\n"
                            "a_total{path=\"\"} +Inf\n"
                            "# a comment\n"
                            "# HELP b A gauge.\n"
                            "# TYPE b gauge\n"
                            "b NaN\n"
                            "b{x=\"1\"} -Inf\n"
                            "b{x=\"2\"} -1.5e-3\n");
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  REQUIRE(r->size() == 2);
  CHECK((*r)[0].help == "Help with \\ and \n.");
  CHECK((*r)[0].samples[0].labels[0].second == "/x\"y\\z\nw");
  CHECK(std::isinf((*r)[0].samples[1].value));
  CHECK(std::isnan((*r)[1].samples[0].value));
  CHECK(find_sample(*r, "b", {{"x", "2"}}) == -1.5e-3);
}

TEST_CASE("the parser refuses what the format does not allow") {
  const std::string ok = "# HELP g G.\n# TYPE g gauge\n";
  CHECK(parses(ok + "g 1\n"));
  CHECK_FALSE(parses(ok + "g 1"));                   // no final newline
  CHECK_FALSE(parses(""));                           // empty
  CHECK_FALSE(parses("g 1\n"));                      // no HELP/TYPE
  CHECK_FALSE(parses("# TYPE g gauge\ng 1\n"));      // no HELP
  CHECK_FALSE(parses(ok + "g 1\n# HELP g again\n")); // HELP after samples
  CHECK_FALSE(parses(ok + "# TYPE g gauge\ng 1\n")); // TYPE twice
  CHECK_FALSE(parses(ok + "# HELP h H.\n# TYPE h gauge\ng 1\nh 1\ng{a=\"b\"} 2\n")); // apart
  CHECK_FALSE(parses(ok + "g 1\ng 2\n"));                                            // series twice
  CHECK_FALSE(parses(ok + "g{a=\"1\",a=\"2\"} 1\n"));                                // label twice
  CHECK_FALSE(parses(ok + "g{a=\"\\t\"} 1\n"));                                      // bad escape
  CHECK_FALSE(parses(ok + "g{a=\"x} 1\n"));                                          // unterminated
  CHECK_FALSE(parses(ok + "g{1a=\"x\"} 1\n"));                                       // label name
  CHECK_FALSE(parses(ok + "g{__a=\"x\"} 1\n"));  // reserved label
  CHECK_FALSE(parses(ok + "g{a=\"\xff\"} 1\n")); // not UTF-8
  CHECK(parses(ok + "g{a=\"\xc3\xa9t\xc3\xa9\"} 1\n"));
  CHECK_FALSE(parses(ok + "g nan\n"));                          // NaN spelling
  CHECK_FALSE(parses(ok + "g inf\n"));                          // Inf spelling
  CHECK_FALSE(parses(ok + "g 0x10\n"));                         // hex
  CHECK_FALSE(parses(ok + "g 1 2.5\n"));                        // timestamp
  CHECK_FALSE(parses(ok + "g\n"));                              // no value
  CHECK_FALSE(parses("# HELP 9g G.\n# TYPE 9g gauge\n9g 1\n")); // name syntax
  CHECK_FALSE(parses("# HELP c C.\n# TYPE c counter\nc 1\n"));  // counter w/o _total
  CHECK_FALSE(parses("# HELP c_total C.\n# TYPE c_total counter\nc_total -1\n"));
  CHECK_FALSE(parses("# HELP c_total C.\n# TYPE c_total counter\nc_total NaN\n"));
  CHECK_FALSE(parses("# HELP g G.\n# TYPE g gauge2\ng 1\n")); // unknown type
}

TEST_CASE("counters that go down or vanish are caught") {
  auto a = parse_exposition("# HELP c_total C.\n# TYPE c_total counter\nc_total{p=\"x\"} 5\n");
  auto b = parse_exposition("# HELP c_total C.\n# TYPE c_total counter\nc_total{p=\"x\"} 4\n");
  auto c = parse_exposition("# HELP c_total C.\n# TYPE c_total counter\nc_total{p=\"y\"} 9\n");
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(check_counters_grow(*b, *a).ok());
  CHECK_FALSE(check_counters_grow(*a, *b).ok());
  CHECK_FALSE(check_counters_grow(*a, *c).ok());
}

snapshot sample_snapshot() {
  run_description r;
  r.experiment = "ex \"quoted\"\nname";
  r.kind = "swarm";
  r.mode = "local";
  r.nodes = 3;
  r.seed = 18446744073709551615ull;
  r.start_unix_s = 1.7e9;
  r.members = {{"trainer.0", "trainer", 0, 0, -1}, {"stage0.0", "stage0", 1, 0, -1}};
  snapshot_builder b{r};
  std::map<std::string, double> v{{"samples", 8}, {"loss", 3.25}, {"retries", 1}};
  std::map<std::string, std::string> none;
  std::string src = "trainer.0", kind = "microbatch";
  for (int i = 0; i < 5; ++i)
    b.add({1.0 + i, 0, src, kind, v, none});
  std::map<std::string, std::string> refused{{"reason", "bad \"sig\"\\"}};
  std::string wire = "node1/wire", ref = "refused";
  b.add({6, 1, wire, ref, {}, refused});
  return b.make();
}

TEST_CASE("rendered /metrics passes the parser with starling_ names and base units") {
  auto s = sample_snapshot();
  auto text = render_metrics(s);
  auto r = parse_exposition(text);
  REQUIRE_MESSAGE(r.ok(), (r.ok() ? "" : r.error().what));
  for (auto& f : *r) {
    CHECK(f.name.rfind("starling_", 0) == 0);
    CHECK((f.type == "counter" || f.type == "gauge"));
  }
  CHECK(find_sample(*r, "starling_samples_total") == 40);
  CHECK(find_sample(*r, "starling_retries_total") == 5);
  CHECK(find_sample(*r, "starling_loss") == 3.25);
  CHECK(find_sample(*r, "starling_refusals_total", {{"reason", "bad \"sig\"\\"}}) == 1);
  CHECK(find_sample(*r, "starling_run_info",
                    {{"experiment", "ex \"quoted\"\nname"},
                     {"kind", "swarm"},
                     {"mode", "local"},
                     {"seed", "18446744073709551615"}}) == 1);
  CHECK(std::isnan(find_sample(*parse_exposition(render_metrics(snapshot{})), "starling_loss")));
}

TEST_CASE("/metrics and /status rendered from one snapshot agree on every number") {
  auto s = sample_snapshot();
  auto r = parse_exposition(render_metrics(s));
  REQUIRE(r.ok());
  auto j = nlohmann::json::parse(render_status(s));
  CHECK(j["version"] == s.version);
  CHECK(j["run"]["experiment"] == s.run.experiment);
  CHECK(j["run"]["seed"] == s.run.seed);
  CHECK(j["run"]["nodes"] == 3);
  size_t compared = 0;
  for (auto& f : *r) {
    if (f.name == "starling_run_info")
      continue;
    REQUIRE_MESSAGE(j["metrics"].contains(f.name), f.name);
    auto& m = j["metrics"][f.name];
    for (auto& x : f.samples) {
      auto& v = x.labels.empty() ? m : m[x.labels.at(0).second];
      if (std::isnan(x.value))
        CHECK_MESSAGE(v.is_null(), f.name);
      else
        CHECK_MESSAGE(v.get<double>() == x.value, f.name);
      ++compared;
    }
  }
  CHECK(compared > 20);
  CHECK(j["members"].size() == 2);
  CHECK(j["loss_curve"].size() == 5);
}

} // namespace starling::test::runtime_observe_exposition_test

namespace starling::test::runtime_observe_exposition_test {

TEST_CASE("a large snapshot renders in bounded size (the cost of one scrape is printed)") {
  run_description r;
  r.experiment = "big";
  for (int i = 0; i < 1000; ++i)
    r.members.push_back({"peers." + std::to_string(i), "peers", size_t(i % 50), 0, -1});
  snapshot_builder b{r};
  std::string kind = "dp_step";
  std::map<std::string, std::string> none;
  for (int i = 0; i < 20000; ++i) {
    auto src = "peers." + std::to_string(i % 1000);
    b.add({i * 0.01, 0, src, kind, {{"samples", 16}, {"loss", 3.0}, {"step", i / 100.0}}, none});
  }
  auto s = b.make();
  auto t0 = std::chrono::steady_clock::now();
  size_t bytes_m = 0, bytes_s = 0;
  for (int i = 0; i < 20; ++i) {
    bytes_m = render_metrics(s).size();
    bytes_s = render_status(s).size();
  }
  auto per = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0) / 20;
  MESSAGE("1000 instances: /metrics " << bytes_m << " B, /status " << bytes_s
                                      << " B, both rendered in " << per.count() << " ms");
  CHECK(bytes_m < 10000); // bounded labels: no per-instance series
  CHECK(s.peer_samples_total.size() == 21);
  CHECK(s.members.size() == 1000);
}

} // namespace starling::test::runtime_observe_exposition_test
