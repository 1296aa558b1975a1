// The averager actor in the simulation harness: its shell around the matchmaker and the round
// engine (whose protocols have their own pure tests: matchmaker_test, round_engine_test):
// tensor lists in and out, compression over BASP, persistent groups, cancelling, memory.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include <caf/all.hpp>
#include <torch/torch.h>
#include <malloc.h>
#include <unistd.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "runtime/sim/world.hpp"

namespace starling::test::actors_averager_sim_test {

using namespace starling;
using namespace starling::actors::averager;
using namespace std::chrono_literals;
using messages::average_result;
using messages::part_status;
using messages::round_outcome;
using messages::tensor_list;
using messages::tensor_msg;
namespace sim = starling::runtime::sim;
namespace dht = starling::actors::dht;

namespace {

/// The outcome of one average request, filled in by a short-lived client actor.
struct call {
  bool done = false;
  bool ok = false;
  average_result result;
  std::string error;
};
using call_ptr = std::shared_ptr<call>;

/// n simulated nodes, each with a DHT node (`dht`) and an averager (`averager`).
struct avg_swarm {
  sim::world w;
  uint64_t seed;

  avg_swarm(uint64_t s, size_t n, const std::function<void(size_t, averager_options&)>& tune = {})
    : w(make_world(s)), seed(s) {
    for (size_t i = 0; i < n; ++i) {
      auto& node = w.add_node("n" + std::to_string(i));
      dht::dht_options d;
      d.address = node.endpoint() + "/dht";
      d.id = dht::identity::from_seed(s * 1000 + i);
      if (i > 0)
        d.bootstrap = {"n0:1/dht"};
      averager_options a;
      a.address = node.endpoint() + "/averager";
      a.round_timeout = 10s;
      if (tune)
        tune(i, a);
      node.on_start([d, a](sim::sim_node& nd) {
        auto h = nd.spawn("dht", dht::dht_actor, nd.resolver(), d);
        nd.spawn("averager", averager_actor, h, nd.resolver(), a);
      });
      w.run_for(300ms);
    }
    w.run_for(1s);
  }

  static sim::world_options make_world(uint64_t s) {
    sim::world_options o;
    o.seed = s;
    o.network.defaults.latency = 5ms;
    o.network.defaults.bandwidth = 1e9;
    return o;
  }

  call_ptr average(size_t i, const std::string& key, std::vector<torch::Tensor> ts, double weight,
                   caf::timespan timeout = 60s) {
    auto c = std::make_shared<call>();
    auto avg = w.node(static_cast<int>(i)).lookup("averager");
    tensor_list tl;
    for (auto& t : ts)
      tl.tensors.push_back(tensor_msg{t, kernels::codec_id::none, {}, {}});
    w.node(static_cast<int>(i)).spawn("", [c, avg, key, tl, weight, timeout](
                                              caf::event_based_actor* self) {
      self->request(avg, timeout, average_atom::value, key, tl, weight)
          .then(
              [c, self](average_result& r) {
                c->done = c->ok = true;
                c->result = std::move(r);
                self->quit();
              },
              [c, self](caf::error& e) {
                c->done = true;
                c->error = caf::to_string(e);
                self->quit();
              });
      return caf::behavior{[](int) {}};
    });
    return c;
  }

  bool settle(const std::vector<call_ptr>& calls, std::chrono::nanoseconds limit = 120s) {
    return w.run_until(
        [&] {
          return std::all_of(calls.begin(), calls.end(), [](const call_ptr& c) { return c->done; });
        },
        limit);
  }
};

std::vector<torch::Tensor> clone_all(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> out;
  for (auto& t : ts)
    out.push_back(t.clone());
  return out;
}

/// Tensors of the given shapes, seeded.
std::vector<torch::Tensor> make_tensors(const std::vector<std::vector<int64_t>>& shapes,
                                        uint64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> out;
  for (auto& s : shapes)
    out.push_back(torch::randn(s));
  return out;
}

/// Σ wᵢ xᵢ / Σ wᵢ in float64, per tensor.
std::vector<torch::Tensor> weighted_mean_of(const std::vector<std::vector<torch::Tensor>>& xs,
                                            const std::vector<double>& ws,
                                            const std::vector<size_t>& who) {
  std::vector<torch::Tensor> out;
  double total = 0;
  for (auto i : who)
    total += ws[i];
  for (size_t t = 0; t < xs[who[0]].size(); ++t) {
    auto acc = torch::zeros_like(xs[who[0]][t], torch::kFloat64);
    for (auto i : who)
      acc += xs[i][t].to(torch::kFloat64) * ws[i];
    out.push_back(acc / total);
  }
  return out;
}

bool close_to(const torch::Tensor& got, const torch::Tensor& want, double tol) {
  if (got.sizes() != want.sizes())
    return false;
  if (got.numel() == 0)
    return true;
  auto d = (got.to(torch::kFloat64) - want.to(torch::kFloat64)).abs().max().item<double>();
  return d <= tol;
}

torch::Tensor flat_of(const std::vector<torch::Tensor>& ts) {
  std::vector<torch::Tensor> v;
  for (auto& t : ts)
    v.push_back(t.reshape({-1}).to(torch::kFloat32));
  return v.empty() ? torch::empty({0}) : torch::cat(v);
}

std::vector<torch::Tensor> tensors_of(const average_result& r) {
  std::vector<torch::Tensor> out;
  for (auto& t : r.tensors)
    out.push_back(t.tensor);
  return out;
}

/// Runs one round on all peers of a fresh swarm and returns the calls.
std::vector<call_ptr> run_round(avg_swarm& s, const std::vector<std::vector<torch::Tensor>>& in,
                                const std::vector<double>& ws, const std::string& key = "g") {
  std::vector<call_ptr> calls;
  for (size_t i = 0; i < in.size(); ++i)
    calls.push_back(s.average(i, key, clone_all(in[i]), ws[i]));
  REQUIRE(s.settle(calls));
  return calls;
}

uint64_t current_rss_bytes() {
  std::ifstream f("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

} // namespace

TEST_CASE("averaging: tensor lists of every shape come back as the weighted mean") {
  std::vector<std::vector<std::vector<int64_t>>> sets = {
      {{1000}},
      {{0}, {}, {17, 3}},
      {{300, 128}, {1, 0}, {}, {3, 5, 7}, {0}},
  };
  std::vector<std::vector<double>> weights = {{1, 1}, {0, .4, .6, 0}};
  uint64_t seed = 1;
  for (size_t si = 0; si < sets.size(); ++si)
    for (auto& ws : weights) {
      ++seed;
      CAPTURE(si);
      CAPTURE(ws.size());
      avg_swarm s(seed, ws.size(), [](size_t, averager_options& o) { o.chunk_bytes = 31337; });
      std::vector<std::vector<torch::Tensor>> in;
      for (size_t i = 0; i < ws.size(); ++i) {
        in.push_back(make_tensors(sets[si], seed * 10 + i));
        if (!in.back().empty()) // one double tensor: dtypes come back as they went
          in.back().back() = in.back().back().to(torch::kFloat64);
      }
      std::vector<size_t> all(ws.size());
      std::iota(all.begin(), all.end(), size_t{0});
      auto want = weighted_mean_of(in, ws, all);
      auto calls = run_round(s, in, ws);
      for (size_t i = 0; i < calls.size(); ++i) {
        CAPTURE(i);
        REQUIRE(calls[i]->ok);
        auto& r = calls[i]->result;
        CHECK(r.report.outcome == round_outcome::complete);
        CHECK(r.report.members.size() == ws.size());
        REQUIRE(r.tensors.size() == in[i].size());
        for (size_t t = 0; t < in[i].size(); ++t) {
          CHECK((r.tensors[t].tensor.sizes() == in[i][t].sizes()));
          CHECK((r.tensors[t].tensor.scalar_type() == in[i][t].scalar_type()));
          CHECK(close_to(r.tensors[t].tensor, want[t], 1e-6));
        }
      }
    }
}

TEST_CASE("a compressed round over BASP stays close to the exact mean") {
  avg_swarm s(501, 4, [&](size_t, averager_options& o) {
    o.codec = kernels::codec_id::blockwise8;
    o.chunk_bytes = 16384;
  });
  std::vector<std::vector<torch::Tensor>> in;
  std::vector<double> ws(4, 1.0);
  for (size_t i = 0; i < 4; ++i)
    in.push_back(make_tensors({{20000}, {100, 50}}, 5010 + i));
  auto want = flat_of(weighted_mean_of(in, ws, {0, 1, 2, 3}));
  auto calls = run_round(s, in, ws);
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(calls[i]->ok);
    CHECK(calls[i]->result.report.outcome == round_outcome::complete);
    auto got = flat_of(tensors_of(calls[i]->result)).to(torch::kFloat64);
    auto mse = (got - want.to(torch::kFloat64)).pow(2).mean().item<double>();
    CHECK(mse <= 1e-2);
    CHECK(mse > 0); // the codec really acted on the remote parts
  }
}

TEST_CASE("a persistent group re-forms at once in later rounds and without a peer that left") {
  // The leader closes early only because its old group is back (the target is larger).
  avg_swarm s(601, 3, [](size_t, averager_options& o) {
    o.target_group_size = 8;
    o.matchmaking_window = 2s;
  });
  std::vector<std::vector<torch::Tensor>> in;
  for (size_t i = 0; i < 3; ++i)
    in.push_back(make_tensors({{5000}}, 6010 + i));
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    auto calls = run_round(s, in, {1, 1, 1}, "persist");
    for (auto& c : calls) {
      REQUIRE(c->ok);
      CHECK(c->result.report.outcome == round_outcome::complete);
      CHECK(c->result.report.members.size() == 3);
      auto elapsed = std::chrono::nanoseconds(c->result.report.elapsed_ns);
      if (round == 0)
        CHECK(elapsed >= 2s); // the first group waits for the window
      else
        CHECK(elapsed < 500ms); // later ones re-form as soon as everyone asked
    }
  }
  // Peer 2 stays away: the others wait for the window and average as a pair.
  std::vector<call_ptr> calls;
  for (size_t i = 0; i < 2; ++i)
    calls.push_back(s.average(i, "persist", clone_all(in[i]), 1.0));
  REQUIRE(s.settle(calls));
  for (auto& c : calls) {
    REQUIRE(c->ok);
    CHECK(c->result.report.outcome == round_outcome::complete);
    CHECK(c->result.report.members.size() == 2);
  }
}

TEST_CASE("a NaN input is refused with an error and its persistent group goes on without it") {
  // Round 1 forms a persistent group of 3; in round 2 peer 2's input holds a NaN. Its request
  // is refused with an error; peers 0 and 1 get every part either averaged between them or their
  // own values, and nothing of peer 2's NaN.
  avg_swarm s(611, 3, [](size_t, averager_options& o) {
    o.target_group_size = 8;
    o.matchmaking_window = 2s;
  });
  std::vector<std::vector<torch::Tensor>> in;
  for (size_t i = 0; i < 3; ++i)
    in.push_back(make_tensors({{3000}}, 6110 + i));
  for (auto& c : run_round(s, in, {1, 1, 1}, "nan"))
    REQUIRE(c->ok);
  auto bad = clone_all(in[2]);
  bad[0][1234] = NAN;
  auto calls = run_round(s, {in[0], in[1], bad}, {1, 1, 1}, "nan");
  REQUIRE(calls[2]->ok);
  CHECK(calls[2]->result.report.outcome == round_outcome::error);
  CHECK(calls[2]->result.report.detail.find("non-finite") != std::string::npos);
  auto pair = weighted_mean_of(in, {1, 1, 1}, {0, 1})[0];
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    REQUIRE(calls[i]->ok);
    auto& r = calls[i]->result;
    REQUIRE(r.tensors.size() == 1);
    auto got = r.tensors[0].tensor;
    CHECK(torch::isfinite(got).all().item<bool>());
    // Told that peer 2 leaves, they do not wait for its parts until the reduce deadline
    // (virtual time).
    CHECK(std::chrono::nanoseconds(r.report.elapsed_ns) < 2s);
    for (auto& p : r.report.parts) {
      if (p.size == 0)
        continue;
      auto g = got.narrow(0, p.offset, p.size);
      if (p.status == part_status::averaged) {
        CHECK(p.contributors.size() == 2);
        CHECK(close_to(g, pair.narrow(0, p.offset, p.size), 1e-5));
      } else {
        CHECK(torch::equal(g, in[i][0].narrow(0, p.offset, p.size)));
      }
    }
  }
  // The two that stayed remember each other as the group: their next round forms as soon as
  // both asked, without waiting out the window for peer 2 (virtual time).
  std::vector<call_ptr> next;
  for (size_t i = 0; i < 2; ++i)
    next.push_back(s.average(i, "nan", clone_all(in[i]), 1.0));
  REQUIRE(s.settle(next));
  for (auto& c : next) {
    REQUIRE(c->ok);
    CHECK(c->result.report.outcome == round_outcome::complete);
    CHECK(c->result.report.members.size() == 2);
    CHECK(std::chrono::nanoseconds(c->result.report.elapsed_ns) < 500ms);
  }
}

TEST_CASE("a cancelled request is answered with an error and the next one is served") {
  avg_swarm s(701, 1);
  auto in = make_tensors({{10}}, 7);
  auto first = s.average(0, "alone", clone_all(in), 1.0);
  s.w.run_for(200ms);
  caf::anon_send(s.w.node(0).lookup("averager"), average_atom::value, stop_atom::value);
  auto second = s.average(0, "alone", clone_all(in), 1.0);
  REQUIRE(s.settle({first, second}));
  CHECK_FALSE(first->ok);
  REQUIRE(second->ok);
  CHECK(second->result.report.outcome == round_outcome::no_partner);
}

TEST_CASE("a peer without partners reports no_partner with its values unchanged") {
  avg_swarm s(7, 2);
  auto in = make_tensors({{10}, {2, 2}}, 7);
  auto c = s.average(0, "lonely", clone_all(in), 1.0);
  REQUIRE(s.settle({c}));
  REQUIRE(c->ok);
  CHECK(c->result.report.outcome == round_outcome::no_partner);
  CHECK_FALSE(c->result.report.detail.empty());
  for (size_t t = 0; t < in.size(); ++t)
    CHECK(torch::equal(c->result.tensors[t].tensor, in[t]));
  // Bad input gives an error outcome, not a hang.
  auto bad = s.average(1, "", clone_all(in), 1.0);
  auto neg = s.average(1, "x", clone_all(in), -1.0);
  REQUIRE(s.settle({bad, neg}));
  CHECK(bad->result.report.outcome == round_outcome::error);
  CHECK(neg->result.report.outcome == round_outcome::error);
}

TEST_CASE("memory: 200 consecutive rounds do not grow resident memory beyond the first ones") {
  // glibc's dynamic mmap threshold moves 1 MiB tensors from mmap to the heap after the first
  // free, and the heap then fragments: measured here, RSS grew ~0.5 MiB per round for 1 MiB
  // vectors with default settings and 0.003 MiB per round (the harness's dead client actors) with
  // a fixed threshold, i.e. nothing is retained by the averager. Fix the threshold, as the
  // `starling` command does at start (runtime/experiment/allocator.hpp), so that the test measures retention, not the allocator.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  avg_swarm s(9, 2, [](size_t, averager_options& o) {
    o.matchmaking_window = 500ms;
    o.poll_interval = 100ms;
  });
  std::vector<std::vector<torch::Tensor>> in;
  for (size_t i = 0; i < 2; ++i)
    in.push_back(make_tensors({{1 << 18}}, 900 + i));
  uint64_t early_peak = 0, last = 0;
  for (int round = 0; round < 200; ++round) {
    auto calls = run_round(s, in, {1, 1}, "mem");
    for (auto& c : calls)
      REQUIRE(c->result.report.outcome == round_outcome::complete);
    s.w.clear_trace();
    s.w.run_for(3s); // let announcements expire between rounds
    last = current_rss_bytes();
    if (round < 50)
      early_peak = std::max(early_peak, last);
  }
  MESSAGE("rss over the first 50 rounds (peak): " << early_peak / 1024 << " KiB; after 200: "
                                                   << last / 1024 << " KiB");
  // One vector is 1 MiB: keeping even 2% of one per round would add 3 MiB over the last 150
  // rounds. Allow 4 MiB for the harness (its dead client actors, ~3 KiB a round) and the allocator.
  CHECK(last <= early_peak + (uint64_t{4} << 20));
}

TEST_CASE("in place, the result is written into the request's vector, and otherwise the request's "
          "tensors stay as they were") {
  // Peers 0 and 1 average in place; peer 1 sends two tensors (concatenated into a private
  // vector first, so its own stay unchanged); peer 2 does not average in place.
  avg_swarm s(701, 3, [](size_t i, averager_options& o) {
    o.chunk_bytes = 1024;
    o.in_place = i < 2;
  });
  auto x0 = make_tensors({{1000}}, 7010);
  auto x1 = make_tensors({{600}, {400}}, 7011);
  auto x2 = make_tensors({{1000}}, 7012);
  std::vector<std::vector<torch::Tensor>> before = {clone_all(x0), clone_all(x1), clone_all(x2)};
  auto want = flat_of(weighted_mean_of({{flat_of(x0)}, {flat_of(x1)}, {flat_of(x2)}}, {1, 2, 1},
                                       {0, 1, 2}));
  std::vector<call_ptr> calls = {s.average(0, "g", x0, 1), s.average(1, "g", x1, 2),
                                 s.average(2, "g", x2, 1)};
  REQUIRE(s.settle(calls));
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(calls[i]->ok);
    CHECK(calls[i]->result.report.outcome == round_outcome::complete);
    CHECK(close_to(flat_of(tensors_of(calls[i]->result)), want, 1e-6));
  }
  // Peer 0: its vector holds the mean, and the reply's tensor is that vector.
  CHECK(close_to(x0[0], want, 1e-6));
  CHECK(calls[0]->result.tensors[0].tensor.data_ptr() == x0[0].data_ptr());
  // Peers 1 and 2: their tensors as they were, the replies elsewhere.
  for (size_t t = 0; t < 2; ++t)
    CHECK(torch::equal(x1[t], before[1][t]));
  CHECK(torch::equal(x2[0], before[2][0]));
  CHECK(calls[2]->result.tensors[0].tensor.data_ptr() != x2[0].data_ptr());
}

} // namespace starling::test::actors_averager_sim_test
