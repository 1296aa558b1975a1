// What a peer steps on after an averaging round (actors/collab/settle.hpp): the rule on crafted
// answers, and on real in-place averagers in the simulation whose partner dies at every point of
// a round (before it, during the contributions, during the results).
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <set>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/collab/settle.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "runtime/sim/world.hpp"

namespace starling::test::actors_collab_settle_test {

using namespace std::chrono_literals;
using actors::collab::averaging_input;
using actors::collab::settle;
using actors::collab::settled_kind;
using messages::average_result;
using messages::part_report;
using messages::part_status;
using messages::round_outcome;

namespace {

/// An answer of `outcome` with `values` and one part per (offset, size, status).
average_result answer(round_outcome outcome, torch::Tensor values,
                      std::vector<std::tuple<int64_t, int64_t, part_status>> parts,
                      size_t members = 2) {
  average_result r;
  r.report.outcome = outcome;
  r.report.members.resize(members);
  for (auto& [off, size, st] : parts) {
    part_report p;
    p.offset = off;
    p.size = size;
    p.status = st;
    if (st != part_status::averaged)
      p.reason = "reducer left";
    r.report.parts.push_back(p);
  }
  r.tensors.push_back(messages::tensor_msg{values, kernels::codec_id::none, {}, {}});
  return r;
}

bool same_values(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(a, b);
}

} // namespace

TEST_CASE("settle: a complete round is stepped on as answered, a failed one on the own values") {
  auto own = torch::arange(8, torch::kFloat32);
  averaging_input in{own};
  auto avg = torch::full({8}, 3.5f);
  auto all = answer(round_outcome::complete, avg,
                    {{0, 4, part_status::averaged}, {4, 4, part_status::averaged}});
  auto s = settle(all, in);
  CHECK(s.kind == settled_kind::averaged);
  CHECK(same_values(s.values, avg));
  CHECK(s.parts_averaged == 2);

  for (auto outcome : {round_outcome::no_partner, round_outcome::error}) {
    auto none = answer(outcome, avg, {});
    auto n = settle(none, in);
    CHECK(n.kind == settled_kind::own);
    CHECK(same_values(n.values, own));
    CHECK_FALSE(n.why.empty());
  }
  // A group of one where two are wanted (the data-parallel peer) is no average.
  auto alone = answer(round_outcome::complete, avg, {{0, 8, part_status::averaged}}, 1);
  CHECK(settle(alone, in, 2).kind == settled_kind::own);
  CHECK(settle(alone, in, 1).kind == settled_kind::averaged);
}

TEST_CASE("settle: a partial round takes whole parts, the failed ones from the kept own values") {
  auto own = torch::arange(8, torch::kFloat32);
  averaging_input in{own};
  auto sent = in.for_averager();
  CHECK(sent.data_ptr() != own.data_ptr()); // the averager writes elsewhere
  // What an in-place averager leaves: part 0 averaged; part 1's reducer died after 2 of its 4
  // result elements arrived (written into the averager's vector over the own values).
  sent.narrow(0, 0, 4).fill_(10.f);
  sent.narrow(0, 4, 2).fill_(20.f);
  auto res = answer(round_outcome::partial, sent,
                    {{0, 4, part_status::averaged}, {4, 4, part_status::own_value_kept}});
  auto s = settle(res, in);
  CHECK(s.kind == settled_kind::partial);
  CHECK(s.parts_averaged == 1);
  CHECK(s.parts_own == 1);
  auto want = own.clone();
  want.narrow(0, 0, 4).fill_(10.f);
  CHECK(same_values(s.values, want));
  CHECK(same_values(own, torch::arange(8, torch::kFloat32)));
  // Every part failed: the own values, not the averager's half-written vector.
  auto none = answer(round_outcome::partial, sent,
                     {{0, 4, part_status::failed}, {4, 4, part_status::own_value_kept}});
  auto n = settle(none, in);
  CHECK(n.kind == settled_kind::own);
  CHECK(same_values(n.values, own));
}

TEST_CASE("settle: malformed answers are no average") {
  auto own = torch::arange(8, torch::kFloat32);
  averaging_input in{own};
  auto v = torch::ones({8});
  // Parts outside the vector, overlapping or not covering it; a tensor of another size.
  CHECK(settle(answer(round_outcome::complete, v, {{0, 4, part_status::averaged},
                                                   {6, 4, part_status::averaged}}),
               in)
          .kind == settled_kind::own);
  CHECK(settle(answer(round_outcome::complete, v, {{0, 4, part_status::averaged}}), in).kind
        == settled_kind::own);
  CHECK(settle(answer(round_outcome::complete, v, {{0, 8, part_status::averaged},
                                                   {0, 4, part_status::averaged}}),
               in)
          .kind == settled_kind::own);
  CHECK(settle(answer(round_outcome::complete, torch::ones({7}), {{0, 7, part_status::averaged}}),
               in)
          .kind == settled_kind::own);
  auto two = answer(round_outcome::complete, v, {{0, 8, part_status::averaged}});
  two.tensors.push_back(two.tensors[0]);
  CHECK(settle(two, in).kind == settled_kind::own);
}

namespace {

/// One round between two simulated in-place averagers (latency 5 ms, 256-byte chunks, a credit
/// window of 1: a part takes ~40 chunk round trips), with node 1 killed `kill_at` after node 0's
/// request (never when negative). Returns node 0's answer, its input, and its averager's vector.
struct killed_round {
  bool answered = false;
  average_result res;
  torch::Tensor own, sent, partner;
  double w0 = 1, w1 = 3;
};

killed_round run_killed_round(std::chrono::nanoseconds kill_at) {
  runtime::sim::world_options wo;
  wo.seed = 3801;
  wo.network.defaults.latency = 5ms;
  wo.network.defaults.bandwidth = 1e7;
  runtime::sim::world w{wo};
  for (int i = 0; i < 2; ++i) {
    auto& node = w.add_node("n" + std::to_string(i));
    actors::dht::dht_options d;
    d.address = node.endpoint() + "/dht";
    d.id = actors::dht::identity::from_seed(3801 * 1000 + static_cast<uint64_t>(i));
    if (i > 0)
      d.bootstrap = {"n0:1/dht"};
    actors::averager::averager_options a;
    a.address = node.endpoint() + "/averager";
    a.target_group_size = 2;
    a.matchmaking_window = 1s;
    a.round_timeout = 5s;
    a.chunk_bytes = 256;
    a.window = 1;
    a.in_place = true;
    node.on_start([d, a](runtime::sim::sim_node& nd) {
      auto h = nd.spawn("dht", actors::dht::dht_actor, nd.resolver(), d);
      nd.spawn("averager", actors::averager::averager_actor, h, nd.resolver(), a);
    });
    w.run_for(300ms);
  }
  w.run_for(1s);
  killed_round k;
  torch::manual_seed(3801);
  k.own = torch::randn({3000});
  k.partner = torch::randn({3000});
  auto own_copy = k.own.clone();
  averaging_input in{own_copy};
  k.sent = in.for_averager();
  auto result = std::make_shared<std::pair<bool, average_result>>();
  auto ask = [&](int node, torch::Tensor t, double weight,
                 std::shared_ptr<std::pair<bool, average_result>> out) {
    auto avg = w.node(node).lookup("averager");
    messages::tensor_list tl;
    tl.tensors.push_back(messages::tensor_msg{t, kernels::codec_id::none, {}, {}});
    w.node(node).spawn("", [avg, tl, weight, out](caf::event_based_actor* self) {
      self->request(avg, caf::timespan{30s}, average_atom::value, std::string{"g"}, tl, weight)
        .then(
          [out, self](average_result& r) {
            if (out)
              *out = {true, std::move(r)};
            self->quit();
          },
          [out, self](caf::error&) {
            if (out)
              out->first = true;
            self->quit();
          });
      return caf::behavior{[](int) {}};
    });
  };
  ask(0, k.sent, k.w0, result);
  ask(1, k.partner.clone(), k.w1, nullptr);
  if (kill_at >= std::chrono::nanoseconds{0})
    w.at(w.elapsed() + kill_at, "kill n1", [&w] { w.kill_node("n1", -1s); });
  REQUIRE(w.run_until([&] { return result->first; }, 60s));
  // Node 0's own values were handed over as a copy: untouched whatever happened.
  CHECK(torch::equal(own_copy, k.own));
  k.answered = true;
  k.res = std::move(result->second);
  // What settle builds, from the kept own values.
  return k;
}

} // namespace

TEST_CASE("settle on real in-place averagers: whatever point of the round the partner dies at, "
          "each part stepped on is its exact weighted mean or the own values, never a mix") {
  // The round without a kill: when it ends, to spread the kill times over it.
  auto clean = run_killed_round(-1ns);
  REQUIRE(clean.res.report.outcome == round_outcome::complete);
  auto full = settle(clean.res, averaging_input{clean.own});
  auto mean = (clean.own.to(torch::kFloat64) * clean.w0 + clean.partner.to(torch::kFloat64) * clean.w1)
              / (clean.w0 + clean.w1);
  CHECK(full.kind == settled_kind::averaged);
  CHECK((full.values.to(torch::kFloat64) - mean).abs().max().item<double>() < 1e-5);
  std::set<int> kinds;
  int mixed = 0, partial = 0;
  // Node 0 asks at t; matchmaking takes up to the 1 s window, then ~0.5 s of chunks.
  for (int ms = 0; ms <= 2000; ms += 25) {
    CAPTURE(ms);
    auto k = run_killed_round(std::chrono::milliseconds(ms));
    auto in = averaging_input{k.own};
    auto s = settle(k.res, in);
    kinds.insert(static_cast<int>(s.kind));
    // The reference, built from the inputs and the report's part statuses alone.
    auto want = k.own.to(torch::kFloat64).clone();
    auto exact = (k.own.to(torch::kFloat64) * k.w0 + k.partner.to(torch::kFloat64) * k.w1)
                 / (k.w0 + k.w1);
    bool any_averaged = false;
    for (auto& p : k.res.report.parts) {
      if (p.size == 0)
        continue;
      auto part_sent = k.sent.narrow(0, p.offset, p.size);
      auto part_own = k.own.narrow(0, p.offset, p.size);
      if (p.status == part_status::averaged) {
        any_averaged = true;
        if (p.segments.empty() && p.contributors.size() == 2) {
          want.narrow(0, p.offset, p.size).copy_(exact.narrow(0, p.offset, p.size));
        } else {
          // Segments averaged over fewer members: each the mean of those it names.
          for (auto& seg : p.segments) {
            auto range = [&](const torch::Tensor& t) {
              return t.narrow(0, p.offset + seg.offset, seg.size);
            };
            if (seg.contributors.size() == 2)
              range(want).copy_(range(exact));
            else if (seg.contributors.size() == 1 && seg.contributors[0] == k.res.report.self)
              range(want).copy_(range(k.own.to(torch::kFloat64)));
            else if (seg.contributors.size() == 1)
              range(want).copy_(range(k.partner.to(torch::kFloat64)));
          }
        }
      } else {
        // Some of this part's result arrived in the averager's vector before the reducer died:
        // the case a step on that vector would mix.
        auto changed = (part_sent != part_own).sum().item<int64_t>();
        if (changed > 0 && changed < p.size)
          mixed++;
      }
    }
    if (s.kind == settled_kind::partial)
      partial++;
    if (s.kind == settled_kind::own) {
      CHECK(torch::equal(s.values, k.own));
    } else {
      CHECK(any_averaged);
      CHECK((s.values.to(torch::kFloat64) - want).abs().max().item<double>() < 1e-5);
    }
  }
  // The kill times reached each case: no average, a partial one, a complete one (a kill after
  // the round), and parts whose result had partly arrived when their reducer died.
  CHECK(kinds.count(static_cast<int>(settled_kind::own)) == 1);
  CHECK(partial > 0);
  CHECK(kinds.count(static_cast<int>(settled_kind::averaged)) == 1);
  CHECK(mixed > 0);
}

} // namespace starling::test::actors_collab_settle_test
