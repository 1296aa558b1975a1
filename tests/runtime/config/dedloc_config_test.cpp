#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>

#include <fmt/format.h>

#include "runtime/config/reader.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/yaml.hpp"
#include "runtime/run/dedloc.hpp"
#include "runtime/run/kinds.hpp"
#include "support/python_fixtures.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_dedloc_config_test {

using namespace starling::runtime;

namespace {

/// Reads a dedloc section with `body`; returns the error message (empty if valid).
std::string section_error(const std::string& body) {
  try {
    read_experiment(
        load_yaml_string("experiment: {name: x, kind: dedloc}\ndedloc:\n  peers: 4\n" + body,
                         "x.yaml"),
        builtin_registry(), {});
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

/// The `dedloc.peer` options of a 2-peer dedloc section with `body`.
dedloc_role_options role(const std::string& body) {
  auto cfg = read_experiment(
      load_yaml_string("experiment: {name: x, kind: dedloc}\ndedloc:\n  peers: 2\n" + body,
                       "x.yaml"),
      builtin_registry(), {});
  REQUIRE(cfg.graph.find("peers"));
  return std::any_cast<const dedloc_role_options&>(cfg.graph.find("peers")->options);
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST_CASE("configs/dedloc-fmnist.yaml and diloco-fmnist.yaml are 8 peers with 2 clients and "
          "seeded churn") {
  for (auto name : {"dedloc-fmnist", "diloco-fmnist"}) {
    CAPTURE(name);
    for (auto mode : {run_mode::sim, run_mode::local}) {
      graph_load_options lo;
      lo.mode = mode;
      auto cfg = load_experiment_file(std::string(STARLING_SOURCE_DIR + "/configs/") + name + ".yaml",
                                      builtin_registry(), lo);
      REQUIRE_MESSAGE(cfg.ok(), (cfg.ok() ? "" : cfg.error().what));
      auto& g = cfg->graph;
      REQUIRE(g.find("peers"));
      CHECK(g.find("peers")->replicas == 8);
      auto& o = std::any_cast<const dedloc_role_options&>(g.find("peers")->options);
      CHECK(o.cycle == 8);
      CHECK(o.clients == 2);
      CHECK(o.peer.collab.progress.target_batch >= 1024);
      CHECK(o.speeds.front() == 1.0);
      CHECK(o.speeds.back() == 0.25);
      auto p = make_plan(g, mode, 0, g.seed);
      REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().what));
      // About 20% of 8 peers per minute over 3 minutes: a handful of leaves, each replaced.
      size_t joins = 0, leaves = 0;
      for (auto& x : p->instances) {
        joins += x.start > std::chrono::nanoseconds{0} ? 1 : 0;
        leaves += x.leave ? 1 : 0;
      }
      CHECK(leaves >= 2);
      CHECK(leaves <= 12);
      CHECK(joins + 1 >= leaves);
    }
  }
}

namespace {

/// The plan's joins and leaves of a graph with churn, in time order: (time, +index or -index).
std::vector<std::pair<int64_t, std::string>> churn_events(const experiment_graph& g,
                                                          uint64_t seed) {
  auto p = make_plan(g, run_mode::sim, 0, seed);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().what));
  std::vector<std::pair<int64_t, std::string>> out;
  for (auto& x : p->instances) {
    if (x.start > std::chrono::nanoseconds{0})
      out.emplace_back(x.start.count(), fmt::format("+{}", x.index));
    if (x.leave)
      out.emplace_back(x.leave->count(), fmt::format("-{}", x.index));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

/// A graph of `replicas` peers over `duration` with `churn` on them.
experiment_graph churned(size_t replicas, std::chrono::nanoseconds duration, churn_spec churn) {
  experiment_graph g;
  g.duration = duration;
  role_spec r;
  r.name = "peers";
  r.replicas = replicas;
  g.roles.push_back(r);
  churn.role = "peers";
  g.churn.push_back(std::move(churn));
  return g;
}

} // namespace

TEST_CASE("the churn schedule is a function of the seed") {
  auto events = [](uint64_t seed) {
    churn_spec c;
    c.per_minute = 0.2;
    std::string out;
    for (auto& [at, what] : churn_events(churned(8, std::chrono::minutes(5), c), seed))
      out += fmt::format("{}@{};", what, at);
    return out;
  };
  CHECK(events(1) == events(1));
  CHECK(events(1) != events(2));
  CHECK(!events(1).empty());
}

TEST_CASE("churn never takes the last peer that can hand the state to newcomers") {
  // Instances 2 and 3 of every 4 are clients (they serve no state). With only clients left, the
  // newcomers of a dedloc run found no donor and started the model anew at step 0 beside them
  // (configs/dedloc-fmnist.yaml --sim, churn 6, seed 3, modeled: from 27 s on).
  auto full = [](size_t i) { return i % 4 < 2; };
  // Replays the schedule; true when a full-mode instance was live throughout.
  auto keeps_full = [&](uint64_t seed, bool guarded) {
    churn_spec c;
    c.per_minute = 6.0;
    if (guarded)
      c.serves = full;
    auto events = churn_events(churned(4, std::chrono::minutes(10), c), seed);
    std::set<size_t> live = {0, 1, 2, 3};
    for (auto& [at, what] : events) {
      auto index = static_cast<size_t>(std::stoul(what.substr(1)));
      if (what[0] == '+')
        live.insert(index);
      else
        live.erase(index);
      if (std::none_of(live.begin(), live.end(), full))
        return false;
    }
    REQUIRE(events.size() > 20);
    return true;
  };
  size_t unguarded_lost = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    CHECK(keeps_full(seed, true));
    unguarded_lost += keeps_full(seed, false) ? 0 : 1;
  }
  CHECK(unguarded_lost > 0); // the guard is what keeps one
}

TEST_CASE("bad dedloc options are rejected with the key named") {
  CHECK(section_error("  target_batch: 2048\n").empty());
  CHECK(has(section_error("  algorithm: sgd\n"), "one of dedloc | diloco"));
  CHECK(has(section_error("  speeds: [1, 0]\n"), "positive speed"));
  CHECK(has(section_error("  target_batch: 8\n  microbatch: 32\n"), "below one microbatch"));
  CHECK(has(section_error("  mode: auxiliary\n"), "auxiliary: N"));
  CHECK(has(section_error("  compute_time: 0s\n"), "compute_time must be positive"));
  CHECK(has(section_error("  bogus: 1\n"), "bogus: unknown key"));
}

TEST_CASE("dedloc.optimizer takes lamb8 (LAMB with 8-bit moments) and names the choices") {
  CHECK(role("  optimizer: lamb8\n").torch.optimizer.kind == "lamb8");
  CHECK(has(section_error("  optimizer: lamb4\n"), "lamb8"));
}

TEST_CASE("dedloc.resync_after_lone_step is true by default, false on request, and strict") {
  CHECK(role("").peer.collab.resync_after_lone_step);
  CHECK(role("  resync_after_lone_step: true\n").peer.collab.resync_after_lone_step);
  CHECK_FALSE(role("  resync_after_lone_step: false\n").peer.collab.resync_after_lone_step);
  auto bad = section_error("  resync_after_lone_step: sometimes\n");
  CHECK(has(bad, "resync_after_lone_step"));
  CHECK(has(bad, "true or false"));
  CHECK(has(section_error("  resync_after_lone_steps: true\n"), "unknown key"));
  CHECK(role("").averager.family_groups); // the default
  CHECK_FALSE(role("  persistent_rounds: false\n").averager.family_groups);
  CHECK(role("  persistent_rounds: true\n").averager.family_groups);
  CHECK(has(section_error("  persistent_rounds: 2\n"), "persistent_rounds"));
  CHECK(role("").peer.collab.resync_by_download); // the default
  CHECK_FALSE(role("  resync_by_download: false\n").peer.collab.resync_by_download);
}

TEST_CASE("dedloc's keys land in the options of the components they configure, --set too") {
  auto o = role("  window: 3s\n  averager_timeout: 7s\n  codec: fp16\n  group_size: 5\n"
                "  round_timeout: 12s\n  record_lifetime: 40s\n  mode: client\n"
                "  algorithm: diloco\n  outer_codec: blockwise8\n  outer_ratio: 0.01\n"
                "  outer_lr: 0.5\n  inner_batch: 64\n  lr: 0.01\n  optimizer: sgd\n"
                "  microbatch: 16\n  width: 48\n  modeled_params: 999\n  eval_every: 3\n");
  CHECK(o.averager.matchmaking_window == std::chrono::seconds(3));
  CHECK(o.averager.round_timeout == std::chrono::seconds(7));
  CHECK(o.averager.codec == kernels::codec_id::fp16);
  CHECK(o.averager.target_group_size == 5);
  CHECK(o.peer.collab.round_timeout == 12.0);
  CHECK(o.peer.collab.progress.record_lifetime == 40.0);
  CHECK(o.peer.collab.mode == actors::collab::peer_mode::client);
  CHECK(o.peer.algo == actors::dp_peer::algorithm::diloco);
  CHECK(o.peer.diloco.codec == kernels::codec_id::blockwise8);
  CHECK(o.peer.diloco.codec_params.ratio == 0.01);
  CHECK(o.peer.diloco.outer.lr == 0.5);
  CHECK(o.peer.inner_batch == 64);
  CHECK(o.peer.eval_every == 3);
  CHECK(o.torch.optimizer.lr == 0.01);
  CHECK(o.torch.optimizer.kind == "sgd");
  CHECK(o.torch.stream.microbatch == 16);
  CHECK(o.torch.model.width == 48);
  CHECK(o.modeled.numel == 999);
  // The kind's defaults where they differ from the components' own.
  auto d = role("");
  CHECK(d.averager.target_group_size == 64);
  CHECK(d.averager.round_timeout == std::chrono::seconds(15));
  CHECK(d.peer.collab.progress.target_batch == 1024);
  CHECK(d.peer.inner_batch == 128);
  CHECK(d.torch.model.width == 128);
  CHECK(d.data.kind == "idx");
  // The same keys through `--set`.
  auto root =
      load_yaml_string("experiment: {name: x, kind: dedloc}\ndedloc:\n  peers: 2\n", "x.yaml");
  for (auto set : {"dedloc.window=4s", "dedloc.outer_codec=none", "dedloc.record_lifetime=50s"})
    REQUIRE(apply_override(root, set).ok());
  auto cfg = read_experiment(root, builtin_registry(), {});
  auto& s = std::any_cast<const dedloc_role_options&>(cfg.graph.find("peers")->options);
  CHECK(s.averager.matchmaking_window == std::chrono::seconds(4));
  CHECK(s.peer.diloco.codec == kernels::codec_id::none);
  CHECK(s.peer.collab.progress.record_lifetime == 50.0);
  CHECK(has(section_error("  codec: topk\n"), "one of none | fp16 | blockwise8 | quantile8"));
}

TEST_CASE("dedloc.data is read by swarm.data's reader, with the kinds dedloc trains on") {
  CHECK(has(section_error("  data: {kind: text}\n"), "one of idx | tokens"));
  CHECK(has(section_error("  data: {kind: idx, path: a.bin}\n"), "belong to kind: tokens"));
  CHECK(has(section_error("  data: {kind: idx, stride: 4}\n"), "belongs to kind: text or tokens"));
  CHECK(has(section_error("  data: {kind: tokens}\n"), "missing required key 'path'"));
  CHECK(has(section_error("  data: {kind: idx, bogus: 1}\n"), "bogus"));
}

TEST_CASE("dedloc.delay_updates is off by default and belongs to algorithm dedloc") {
  CHECK_FALSE(role("").peer.collab.delay_updates);
  CHECK(role("  delay_updates: true\n").peer.collab.delay_updates);
  CHECK(has(section_error("  delay_updates: later\n"), "delay_updates"));
  auto diloco = section_error("  algorithm: diloco\n  delay_updates: true\n");
  CHECK(has(diloco, "delay_updates belongs to algorithm dedloc"));
  CHECK(section_error("  algorithm: diloco\n  delay_updates: false\n").empty());
}

TEST_CASE("dedloc.export is true or false and needs the torch backend") {
  CHECK(section_error("  export: true\n").empty());
  CHECK(section_error("  export: false\n  backend: modeled\n").empty());
  CHECK(has(section_error("  export: maybe\n"), "true or false"));
  auto modeled = section_error("  export: true\n  backend: modeled\n");
  CHECK(has(modeled, "export"));
  CHECK(has(modeled, "export needs the torch backend"));
}

TEST_CASE("a TorchScript model of images takes 784 features and at least 10 classes") {
  auto dir = starling::testing::python_fixtures(
    STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py", {"--channels", "4", "--seed", "1"},
    {STARLING_SOURCE_DIR + "/examples/torchscript/image_model.py"});
  auto model = [&](const std::string& shape, int vocab) {
    return fmt::format("  model: {{kind: torchscript, files: [{}/cnn.pt], input_shape: {}, "
                       "vocab: {}}}\n",
                       dir, shape, vocab);
  };
  CHECK(section_error(model("[1, 28, 28]", 10)).empty());
  // The CNN takes images of any size (adaptive pooling), but the data's are 28x28.
  auto e = section_error(model("[1, 32, 32]", 10));
  CHECK(has(e, "784 features"));
  CHECK(has(e, "got [1, 32, 32]"));
  // Loading names what does not fit: flat rows for a convolution, fewer classes than outputs.
  e = section_error(model("[784]", 10));
  CHECK(has(e, "cnn.pt: does not accept the model's input (Float [2, 784])"));
  e = section_error(model("[1, 28, 28]", 5));
  CHECK(has(e, "the cross_entropy loss needs float [2, 5] (vocab 5)"));
  // A model of images does not read token files.
  e = section_error(model("[1, 28, 28]", 10) + "  data: {kind: tokens, path: t.bin}\n");
  CHECK(has(e, "data kind tokens needs a TorchScript model of tokens"));
}

} // namespace starling::test::runtime_dedloc_config_test
