#include <doctest/doctest.h>

#include <set>

#include "runtime/config/config.hpp"
#include "runtime/graph/swarm_graph.hpp"

namespace starling::test::runtime_swarm_graph_test {

using namespace starling;
using namespace starling::runtime;
using namespace starling::runtime::graph;
using namespace std::chrono_literals;

namespace {

/// Reads the `swarm` section of `text`; the config error's message when it is rejected.
std::string read_error(const std::string& text, swarm_graph& g) {
  try {
    auto root = load_yaml_string(text, "x.yaml");
    auto section = root.child("swarm");
    read_swarm_graph(section, g);
    section.finish();
    return {};
  } catch (const config_error& e) {
    return e.what();
  }
}

} // namespace

TEST_CASE("the builder and the YAML front door build the same graph") {
  kernels::gpt_config m;
  m.layers = 4;
  m.width = 32;
  m.heads = 2;
  m.seq_len = 16;
  auto built = swarm_builder{}
                 .model(m)
                 .stage(0, 1, {1.0, 0.5})
                 .stage(1, 4, {0.7})
                 .trainers(3, 4, 50)
                 .compression(kernels::codec_id::fp16)
                 .preemptions(10s, 2s)
                 .averaging(averaging_spec{96, 200ms, 800ms, 5s, kernels::codec_id::fp16})
                 .build();
  REQUIRE(built);
  swarm_graph g;
  auto err = read_error(R"(
experiment: {name: g, kind: swarm}
swarm:
  model: {layers: 4, width: 32, heads: 2, seq_len: 16}
  stages:
    - {peers: [1.0, 0.5], layers: [0, 1]}
    - {peers: [0.7], layers: [1, 4]}
  trainers: 3
  microbatch: 4
  microbatches_per_trainer: 50
  compression: fp16
  preempt_every: 10s
  restart_delay: 2s
  target_batch: 96
  averaging: {progress_period: 200ms, matchmaking_window: 800ms, round_timeout: 5s, codec: fp16}
)",
                        g);
  REQUIRE(err.empty());
  CHECK(g.averaging.enabled());
  CHECK(g.averaging.target_batch == built->averaging.target_batch);
  CHECK(g.averaging.progress_period == built->averaging.progress_period);
  CHECK(g.averaging.matchmaking_window == built->averaging.matchmaking_window);
  CHECK(g.averaging.round_timeout == built->averaging.round_timeout);
  CHECK(g.averaging.codec == built->averaging.codec);
  CHECK(g.model.layers == built->model.layers);
  CHECK(g.stages.size() == 2);
  CHECK(g.stages[1].speeds == built->stages[1].speeds);
  CHECK(g.total_samples() == built->total_samples());
  CHECK(g.compression == built->compression);
  CHECK(g.preempt_every == built->preempt_every);
  auto ranges = stage_ranges(g);
  REQUIRE(ranges);
  CHECK((*ranges)[1] == std::make_pair<int64_t, int64_t>(1, 4));
  CHECK(g.peer_count() == 3);
}

TEST_CASE("invalid graphs are rejected with the field named") {
  kernels::gpt_config m;
  m.layers = 2;
  CHECK_FALSE(swarm_builder{}.model(m).build()); // no stages
  auto three = swarm_builder{}.model(m).stage({1.0}).stage({1.0}).stage({1.0}).build();
  REQUIRE_FALSE(three);
  CHECK(three.error().what.find("at least as many model layers") != std::string::npos);
  auto gap = swarm_builder{}.model(m).stage(0, 1, {1.0}).stage(1, 1, {1.0}).build();
  REQUIRE_FALSE(gap);
  CHECK(gap.error().what.find("stages[1]") != std::string::npos);
  auto speed = swarm_builder{}.model(m).stage({1.5}).build();
  REQUIRE_FALSE(speed);
  CHECK(speed.error().what.find("(0, 1]") != std::string::npos);
  auto trainers = swarm_builder{}.model(m).stage({1.0}).trainers(0, 4, 4).build();
  REQUIRE_FALSE(trainers);
  CHECK(trainers.error().what.find("trainers") != std::string::npos);
  swarm_graph g;
  auto err = read_error(R"(
experiment: {name: g, kind: swarm}
swarm:
  model: {layers: 2}
  stages: [{peers: [1.0], layers: [0, 1]}, {peers: [1.0], layers: [1, 3]}]
)",
                        g);
  CHECK(err.find("x.yaml:") != std::string::npos);
  CHECK(err.find("stages") != std::string::npos);
  CHECK(read_error("experiment: {name: g, kind: swarm}\nswarm: {stages: [{peers: []}]}\n", g)
          .find("at least one peer") != std::string::npos);
  // Averaging: a window no longer than the progress period would lose late peers' rounds.
  auto slow = averaging_spec{};
  slow.target_batch = 64;
  slow.matchmaking_window = slow.progress_period;
  auto window = swarm_builder{}.model(m).stage({1.0}).averaging(slow).build();
  REQUIRE_FALSE(window);
  CHECK(window.error().what.find("matchmaking_window") != std::string::npos);
  CHECK_FALSE(swarm_builder{}.model(m).stage({1.0}).averaging(-1).build());
  CHECK(read_error("experiment: {name: g, kind: swarm}\nswarm: {stages: [{peers: [1.0]}], "
                   "averaging: {progress_period: 1s, matchmaking_window: 500ms}}\n",
                   g)
          .find("matchmaking_window") != std::string::npos);
  CHECK(read_error("experiment: {name: g, kind: swarm}\nswarm: {stages: [{peers: [1.0]}], "
                   "averaging: {codec: topk}}\n",
                   g)
          .find("codec") != std::string::npos);
  CHECK(read_error("experiment: {name: g, kind: swarm}\nswarm: {stages: [{peers: [1.0]}], "
                   "target_batch: -5}\n",
                   g)
          .find("target_batch") != std::string::npos);
}


TEST_CASE("rebalancing of real stage peers: the YAML section, the builder, and bad settings") {
  kernels::gpt_config m;
  m.layers = 2;
  rebalance_spec r;
  r.every = 4s;
  r.threshold = 0.1;
  r.report_every = 1s;
  auto built = swarm_builder{}.model(m).stage({1.0}).stage({0.5}).rebalance(r).build();
  REQUIRE(built);
  swarm_graph g;
  REQUIRE(read_error("experiment: {name: g, kind: swarm}\nswarm: {model: {layers: 2}, stages: "
                     "[{peers: [1.0]}, {peers: [0.5]}], rebalance: {every: 4s, threshold: 0.1, "
                     "report_every: 1s}}\n",
                     g)
            .empty());
  CHECK(g.rebalance.enabled());
  CHECK(g.rebalance.every == built->rebalance.every);
  CHECK(g.rebalance.threshold == built->rebalance.threshold);
  CHECK(g.rebalance.report_every == built->rebalance.report_every);
  CHECK_FALSE(g.rebalance.place_new_peers);
  // Off unless asked for.
  CHECK_FALSE(swarm_builder{}.model(m).stage({1.0}).build()->rebalance.enabled());
  // A check needs a fresh report of every stage: reports no rarer than checks.
  r.report_every = 5s;
  auto rare = swarm_builder{}.model(m).stage({1.0}).rebalance(r).build();
  REQUIRE_FALSE(rare);
  CHECK(rare.error().what.find("report_every") != std::string::npos);
  auto head = std::string{"experiment: {name: g, kind: swarm}\nswarm: {stages: [{peers: [1.0]}], "};
  CHECK(read_error(head + "rebalance: {every: 2s, report_every: 3s}}\n", g).find("report_every")
        != std::string::npos);
  CHECK(read_error(head + "rebalance: {every: 2s, threshold: -1}}\n", g).find("threshold")
        != std::string::npos);
  CHECK(read_error(head + "rebalance: {every: 2s, period: 3s}}\n", g).find("period")
        != std::string::npos);
  CHECK(read_error(head + "rebalance: 2s}\n", g).find("a map") != std::string::npos);
}

TEST_CASE("the data a swarm's trainers read is an option: the text corpus or a token file") {
  const std::string head = "swarm:\n  model: {layers: 2, width: 16, heads: 2, seq_len: 8}\n"
                           "  stages: [{peers: [1.0]}]\n";
  swarm_graph g;
  REQUIRE(read_error(head, g).empty());
  CHECK(g.data.kind == "text"); // the default: the KJV text
  CHECK(g.layout == kernels::shard_layout::scattered);
  swarm_graph t;
  REQUIRE(read_error(head + "  data: {kind: tokens, path: /tmp/x.bin, dtype: uint32, stride: 4, "
                            "layout: contiguous}\n",
                     t)
            .empty());
  CHECK(t.data.kind == "tokens");
  CHECK(t.data.tokens.file.path == "/tmp/x.bin");
  CHECK(t.data.tokens.file.dtype == kernels::token_dtype::uint32);
  CHECK(t.data.tokens.stride == 4);
  CHECK(t.layout == kernels::shard_layout::contiguous);
  // One clear line each for a token file without a path, a path for the text, an unknown kind or
  // dtype, and a misspelt key.
  swarm_graph x;
  CHECK(read_error(head + "  data: {kind: tokens}\n", x).find("missing required key 'path'")
        != std::string::npos);
  CHECK(read_error(head + "  data: {kind: text, path: a.bin}\n", x).find("belong to kind: tokens")
        != std::string::npos);
  CHECK(read_error(head + "  data: {kind: images}\n", x).find("text") != std::string::npos);
  CHECK(read_error(head + "  data: {kind: tokens, path: a, dtype: int8}\n", x).find("uint16")
        != std::string::npos);
  CHECK(read_error(head + "  data: {knd: text}\n", x).find("knd") != std::string::npos);
}

TEST_CASE("swarm.backward_first is off by default, on by request, and strict") {
  const std::string base = "swarm:\n  stages: [{peers: [1.0]}, {peers: [1.0]}]\n";
  swarm_graph a;
  CHECK(read_error(base, a).empty());
  CHECK_FALSE(a.backward_first);
  swarm_graph b;
  CHECK(read_error(base + "  backward_first: true\n", b).empty());
  CHECK(b.backward_first);
  swarm_graph c;
  auto e = read_error(base + "  backward_first: often\n", c);
  CHECK(e.find("backward_first") != std::string::npos);
}

TEST_CASE("swarm.averaging takes persistent_rounds, average_state_every and resync_after_lone_step") {
  const std::string base = "swarm:\n  stages: [{peers: [1.0]}, {peers: [1.0]}]\n  target_batch: 64\n";
  swarm_graph a;
  CHECK(read_error(base, a).empty());
  CHECK_FALSE(a.averaging.persistent_rounds);
  CHECK(a.averaging.average_state_every == 0);
  CHECK(a.averaging.resync_after_lone_step);
  swarm_graph b;
  CHECK(read_error(base + "  averaging: {persistent_rounds: true, average_state_every: 10, "
                          "resync_after_lone_step: false}\n",
                   b)
          .empty());
  CHECK(b.averaging.persistent_rounds);
  CHECK(b.averaging.average_state_every == 10);
  CHECK_FALSE(b.averaging.resync_after_lone_step);
  swarm_graph c;
  CHECK(read_error(base + "  averaging: {average_state_every: -1}\n", c)
          .find("average_state_every") != std::string::npos);
  swarm_graph d;
  CHECK(read_error(base + "  averaging: {persistent_round: true}\n", d).find("unknown key") !=
        std::string::npos);
}

} // namespace starling::test::runtime_swarm_graph_test
