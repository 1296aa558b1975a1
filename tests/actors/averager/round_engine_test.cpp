// The butterfly round engine on a deterministic test network (no actors): the weighted mean
// for many sizes, chunkings and weights; client and auxiliary modes; the 7-pair fault matrix
// over 100 seeds (faults injected by decorating the engine's sink); duplicates, compression,
// and the BTARD hooks (part digests, a reducer that sees whole contributions).
#include "actors/averager/round_engine.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <queue>
#include <random>

#include <torch/torch.h>

#include "kernels/compress/codec.hpp"

namespace starling::test::actors_round_engine_test {

using namespace starling;
using namespace starling::actors::averager;

namespace {

/// Virtual time in microseconds.
using usec = int64_t;

/// What goes wrong with one peer (injected by sink decorators and the harness, never inside the
/// engine).
enum class fault {
  none,
  /// Crashes at its first send.
  fail_before,
  /// Crashes after sending half of its contribution chunks.
  fail_sending,
  /// Crashes at its first result send (it had everything to reduce).
  fail_reducing,
  /// Every contribution chunk arrives `delay` late.
  slow_sending,
  /// Every result chunk arrives `delay` late.
  slow_reducing,
  /// Leaves the round as soon as it starts (its peers are told so).
  cancel,
};

struct net_options {
  usec latency = 5000;
  usec jitter = 3000;
  /// Credit window of links that need one (links draw 0 or this, per pair and seed).
  uint32_t window = 4;
  usec round_timeout = 10'000'000;
  double reduce_fraction = 0.6;
  kernels::codec_id codec = kernels::codec_id::none;
  round_engine_options engine;
  /// Every chunk is delivered twice.
  bool duplicate = false;
  /// Each engine writes its result into (a copy of) its own vector (`out_buffer` = `flat`).
  bool in_place = false;
};

class test_net;

/// The sink every peer's engine sends through: delivers over the test network.
struct net_sink : round_sink {
  test_net* net;
  uint32_t self;
  net_sink(test_net* n, uint32_t s) : net(n), self(s) {}
  void send(uint32_t to, const out_chunk_ptr& c) override;
};

/// A decorator: forwards to `inner` until the peer crashes, then drops everything; may delay
/// one kind of chunk.
struct fault_sink : round_sink {
  round_sink& inner;
  test_net* net;
  uint32_t self;
  fault f;
  usec delay;
  uint64_t contributions_total = 0;
  uint64_t contributions_sent = 0;
  bool crashed = false;
  fault_sink(round_sink& in, test_net* n, uint32_t s, fault fl, usec d)
    : inner(in), net(n), self(s), f(fl), delay(d) {}
  void send(uint32_t to, const out_chunk_ptr& c) override;
};

struct peer {
  std::unique_ptr<net_sink> base;
  std::unique_ptr<fault_sink> sink;
  std::unique_ptr<round_engine> engine;
  /// The vector the engine was given.
  at::Tensor flat;
  bool dead = false;
  std::optional<round_result> result;
  usec ready_at = -1;
  part_digests digests;
  bool finished = false;
};

class test_net {
public:
  test_net(uint64_t seed, std::vector<member_info> members, std::vector<at::Tensor> flats,
           std::vector<double> weights, net_options opts, std::vector<fault> faults = {},
           usec fault_delay = 0)
    : rng_(seed), opts_(std::move(opts)) {
    auto n = members.size();
    faults.resize(n, fault::none);
    auto plan = make_plan(members, flats[0].numel());
    REQUIRE_MESSAGE(plan.ok(), (plan.ok() ? "" : plan.error().what));
    peers_.resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      auto& p = peers_[i];
      p.base = std::make_unique<net_sink>(this, i);
      p.sink = std::make_unique<fault_sink>(*p.base, this, i, faults[i], fault_delay);
      // In place, the engine overwrites its vector: a copy, so that the callers' stay the inputs.
      auto flat = opts_.in_place ? flats[i].clone() : flats[i];
      p.flat = flat;
      p.engine = std::make_unique<round_engine>(42, *plan, i, flat, weights[i], opts_.engine,
                                                *p.sink, opts_.in_place ? flat : at::Tensor{});
      p.sink->contributions_total = p.engine->contribution_chunks();
      faults_.push_back(faults[i]);
    }
    for (uint32_t i = 0; i < n; ++i) {
      if (faults[i] == fault::cancel) {
        crash(i, "left the round");
        continue;
      }
      // Links open in a random order, each with or without a credit window.
      for (uint32_t j = 0; j < n; ++j)
        if (j != i) {
          auto window = rng_() % 2 == 0 ? 0u : opts_.window;
          at(uniform(0, 4 * opts_.latency), [this, i, j, window] {
            with(i, [&](round_engine& e) { e.open(j, window); });
          });
        }
      at(static_cast<usec>(static_cast<double>(opts_.round_timeout) * opts_.reduce_fraction),
         [this, i] { with(i, [](round_engine& e) { e.reduce_deadline(); }); });
      at(opts_.round_timeout, [this, i] { with(i, [](round_engine& e) { e.round_deadline(); }); });
    }
    for (uint32_t i = 0; i < n; ++i)
      settle(i);
  }

  /// Runs every event; returns the virtual time at the end.
  usec run() {
    while (!events_.empty()) {
      auto ev = events_.top();
      events_.pop();
      now_ = ev.t;
      ev.fn();
    }
    return now_;
  }

  peer& operator[](size_t i) { return peers_[i]; }
  size_t size() const { return peers_.size(); }
  usec now() const { return now_; }
  const net_options& opts() const { return opts_; }

  /// Delivers `c` from `from` to `to` after the link's latency (in order per link), plus
  /// `extra` (a slow peer's delay, outside the link's order).
  void deliver(uint32_t from, uint32_t to, const out_chunk_ptr& c, usec extra) {
    auto values = c->values;
    if (values.defined() && opts_.codec != kernels::codec_id::none) {
      // What a transport does: encode at the sender, decode at the receiver.
      auto enc = kernels::encode(values, opts_.codec, kernels::codec_params{});
      REQUIRE(enc.ok());
      auto dec = kernels::decode(*enc);
      REQUIRE(dec.ok());
      values = *dec;
    }
    auto meta = c->meta;
    auto t = extra > 0 ? now_ + extra + opts_.latency : link_time(from, to);
    auto copies = opts_.duplicate ? 2 : 1;
    for (int k = 0; k < copies; ++k)
      at(t + k, [this, from, to, meta, values] {
        auto kind = meta.kind;
        bool acked = false;
        with(to, [&](round_engine& e) {
          e.on_chunk(meta, values);
          acked = true;
        });
        // The receiver acknowledges every chunk (a credit back on links with a window).
        if (acked)
          at(link_time(to, from), [this, from, to, kind] {
            with(from, [&](round_engine& e) { e.on_ack(to, kind); });
          });
      });
  }

  /// Peer `i` is gone (crashed, or left): its peers learn it after a latency.
  void crash(uint32_t i, const std::string& why) {
    auto& p = peers_[i];
    if (p.dead)
      return;
    p.dead = true;
    p.engine.reset();
    for (uint32_t j = 0; j < peers_.size(); ++j)
      if (j != i)
        at(now_ + opts_.latency + uniform(0, opts_.jitter),
           [this, i, j, why] { with(j, [&](round_engine& e) { e.member_gone(i, why); }); });
  }

  usec uniform(usec lo, usec hi) {
    return lo + static_cast<usec>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }

private:
  struct event {
    usec t;
    uint64_t seq;
    std::function<void()> fn;
    bool operator<(const event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };

  void at(usec t, std::function<void()> fn) { events_.push({t, seq_++, std::move(fn)}); }

  usec link_time(uint32_t from, uint32_t to) {
    auto& last = link_clock_[{from, to}];
    last = std::max(last + 1, now_ + opts_.latency + uniform(0, opts_.jitter));
    return last;
  }

  /// Calls `f` on peer `i`'s engine if it lives, then handles a crash and records progress.
  template <class F>
  void with(uint32_t i, F&& f) {
    auto& p = peers_[i];
    if (p.dead || !p.engine)
      return;
    f(*p.engine);
    settle(i);
  }

  void settle(uint32_t i) {
    auto& p = peers_[i];
    if (p.sink->crashed) {
      crash(i, "went down");
      return;
    }
    if (!p.engine)
      return;
    if (p.engine->ready() && !p.result) {
      p.result = p.engine->result(); // its buffer is not reused: the engine runs one round
      p.ready_at = now_;
    }
    if (p.engine->finished() && !p.finished) {
      p.finished = true;
      p.digests = p.engine->digests();
    }
  }

  std::mt19937_64 rng_;
  net_options opts_;
  std::vector<peer> peers_;
  std::vector<fault> faults_;
  std::priority_queue<event> events_;
  uint64_t seq_ = 0;
  usec now_ = 0;
  std::map<std::pair<uint32_t, uint32_t>, usec> link_clock_;
};

void net_sink::send(uint32_t to, const out_chunk_ptr& c) {
  net->deliver(self, to, c, 0);
}

void fault_sink::send(uint32_t to, const out_chunk_ptr& c) {
  if (crashed)
    return;
  bool contribution = c->meta.kind == contribution_chunk;
  if (f == fault::fail_before || (f == fault::fail_reducing && !contribution)) {
    crashed = true;
    return;
  }
  if ((f == fault::slow_sending && contribution) || (f == fault::slow_reducing && !contribution))
    net->deliver(self, to, c, delay);
  else
    inner.send(to, c);
  if (contribution && f == fault::fail_sending
      && ++contributions_sent * 2 >= contributions_total)
    crashed = true;
}

std::vector<member_info> members_of(size_t n, const std::function<void(size_t, member_info&)>&
                                                  tune = {}) {
  std::vector<member_info> out;
  for (size_t i = 0; i < n; ++i) {
    member_info m{"10.0.0." + std::to_string(i) + ":7/averager", 1.0, false};
    if (tune)
      tune(i, m);
    out.push_back(m);
  }
  return out;
}

std::vector<at::Tensor> random_flats(size_t n, int64_t numel, uint64_t seed) {
  std::vector<at::Tensor> out;
  torch::manual_seed(seed);
  for (size_t i = 0; i < n; ++i)
    out.push_back(torch::randn({numel}));
  return out;
}

/// Σ wᵢ xᵢ / Σ wᵢ over `who`, in float64.
at::Tensor mean_of(const std::vector<at::Tensor>& xs, const std::vector<double>& ws,
                   const std::vector<size_t>& who) {
  auto acc = torch::zeros_like(xs[who[0]], torch::kFloat64);
  double total = 0;
  for (auto i : who) {
    acc += xs[i].to(torch::kFloat64) * ws[i];
    total += ws[i];
  }
  return acc / total;
}

double max_diff(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0)
    return 0;
  if (b.scalar_type() == torch::kFloat32) // big vectors: compared in fp32 (see the callers)
    return (a - b).abs().max().item<double>();
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

int64_t elems(uint64_t chunk_bytes) {
  return chunk_bytes == 0 ? std::numeric_limits<int64_t>::max() / 4
                          : static_cast<int64_t>(std::max<uint64_t>(1, chunk_bytes / 4));
}

} // namespace

TEST_CASE("round engine: results equal the weighted mean for sizes, chunkings, weights, seeds") {
  // Sizes of the flattened tensor sets of the former actor matrix: {1000}; {0, [], 17x3};
  // {30000x128, 1x0, [], 3x5x7, 0}.
  std::vector<int64_t> sizes = {1000, 52, 30000 * 128 + 1 + 105};
  std::vector<uint64_t> chunk_bytes = {31337, uint64_t{1} << 20, 0};
  std::vector<std::vector<double>> weights = {{1, 1}, {.333, .1667, .5003}, {1, 0}, {0, .4, .6, 0}};
  uint64_t seed = 1;
  for (size_t si = 0; si < sizes.size(); ++si)
    for (auto& ws : weights) {
      // The small vectors run over 10 seeds; the big one once (its inputs and their mean are
      // made once for every chunking), with many small chunks for one weight set only.
      for (int k = 0; k < (si == 2 ? 1 : 10); ++k) {
        ++seed;
        auto xs = random_flats(ws.size(), sizes[si], seed);
        std::vector<size_t> all(ws.size());
        std::iota(all.begin(), all.end(), size_t{0});
        auto want = mean_of(xs, ws, all);
        // The big vector is compared in fp32 (a float64 copy per peer and chunking cost more
        // than the rounds): the exact mean rounded to fp32 adds half an ulp (< 5e-7 here).
        auto tol = 1e-6;
        if (si == 2) {
          want = want.to(torch::kFloat32);
          tol = 2e-6;
        }
        for (auto cb : chunk_bytes) {
          if (si == 2 && cb == 31337 && ws.size() != 2)
            continue;
          CAPTURE(si);
          CAPTURE(cb);
          CAPTURE(ws.size());
          CAPTURE(seed);
          net_options o;
          o.engine.chunk_elems = elems(cb);
          o.in_place = seed % 2 == 0; // every other run writes its result into its own vector
          CAPTURE(o.in_place);
          test_net net(seed, members_of(ws.size()), xs, ws, o);
          net.run();
          for (size_t i = 0; i < ws.size(); ++i) {
            CAPTURE(i);
            REQUIRE(net[i].result);
            CHECK(net[i].finished);
            CHECK(net[i].ready_at < o.round_timeout * o.reduce_fraction); // no deadline waited
            auto& r = *net[i].result;
            for (auto& p : r.parts)
              CHECK(p.status == part_status::averaged);
            CHECK(max_diff(r.values, want) <= tol);
            if (sizes[si] > 0)
              CHECK((r.values.data_ptr() == net[i].flat.data_ptr()) == o.in_place);
          }
        }
      }
    }
}

TEST_CASE("round engine: client and auxiliary peers in every combination average over the data "
          "peers") {
  uint64_t seed = 100;
  for (int clients = 0; clients <= 2; ++clients)
    for (int aux = 0; aux <= 2; ++aux)
      for (int k = 0; k < 10; ++k) {
        ++seed;
        CAPTURE(clients);
        CAPTURE(aux);
        CAPTURE(seed);
        // Peers 0..clients-1 are clients; the last `aux` peers are auxiliary.
        auto members = members_of(4, [&](size_t i, member_info& m) {
          if (static_cast<int>(i) < clients)
            m.bandwidth = 0;
          if (static_cast<int>(i) >= 4 - aux)
            m.auxiliary = true;
        });
        auto xs = random_flats(4, 521, seed);
        std::vector<double> ws(4, 1.0);
        std::vector<size_t> data;
        for (size_t i = 0; i < static_cast<size_t>(4 - aux); ++i)
          data.push_back(i);
        auto want = mean_of(xs, ws, data);
        net_options o;
        o.engine.chunk_elems = 256;
        test_net net(seed, members, xs, ws, o);
        net.run();
        for (size_t i = 0; i < 4; ++i) {
          CAPTURE(i);
          REQUIRE(net[i].result);
          CHECK(net[i].finished);
          auto& r = *net[i].result;
          bool is_aux = static_cast<int>(i) >= 4 - aux;
          if (is_aux)
            CHECK(torch::equal(r.values, xs[i])); // auxiliary: unchanged
          else
            CHECK(max_diff(r.values, want) <= 1e-6);
          if (static_cast<int>(i) < clients) // clients reduce nothing
            CHECK(r.parts[i].size == 0);
          if (is_aux && r.parts[i].size > 0) // an auxiliary reducer averaged for the others
            CHECK(r.parts[i].contributors.size() == data.size());
        }
      }
}

TEST_CASE("round engine faults: with 5 peers, peers 2-4 always finish with results they can "
          "explain (7 fault pairs x 100 seeds)") {
  using F = fault;
  std::vector<std::pair<F, F>> cases = {
      {F::none, F::fail_before},          {F::fail_before, F::fail_before},
      {F::slow_sending, F::fail_sending}, {F::fail_sending, F::fail_before},
      {F::slow_reducing, F::fail_sending}, {F::fail_reducing, F::fail_reducing},
      {F::none, F::cancel},
  };
  const usec round_timeout = 6'000'000;
  std::vector<double> ws = {1, 2, 1, 3, 1};
  // Parts that a sender failing mid-way reached in some chunks only (reported as segments).
  size_t split_parts = 0;
  // In place: parts that ended unaveraged after some of their result had arrived.
  size_t mixed_parts = 0;
  for (bool in_place : {false, true})
  for (size_t ci = 0; ci < cases.size(); ++ci)
    for (uint64_t seed = 1; seed <= 100; ++seed) {
      auto [f0, f1] = cases[ci];
      auto members = members_of(5, [](size_t i, member_info& m) {
        if (i == 1)
          m.bandwidth = 0; // client mode
      });
      net_options o;
      o.engine.chunk_elems = 50; // every part travels in several chunks
      o.window = 2;
      o.round_timeout = round_timeout;
      o.in_place = in_place;
      auto xs = random_flats(5, 800, seed * 100 + ci);
      // A slow sender delivers its first chunks before the reducers' deadline (0.6 x 6 s) and the
      // rest after it: reducers count it where it arrived.
      test_net net(seed * 7 + ci, members, xs, ws, o, {f0, f1}, 2'500'000);
      net.run();
      for (size_t i = 2; i < 5; ++i) {
        CAPTURE(in_place);
        CAPTURE(ci);
        CAPTURE(seed);
        CAPTURE(i);
        REQUIRE(net[i].result);
        CHECK(net[i].finished);
        CHECK(net[i].ready_at <= round_timeout); // nobody waits past the round's deadline
        auto& r = *net[i].result;
        for (auto& p : r.parts) {
          if (p.size == 0)
            continue;
          CAPTURE(p.reducer);
          auto seg = r.values.narrow(0, p.offset, p.size);
          if (p.status == part_status::averaged) {
            REQUIRE_FALSE(p.contributors.empty());
            // Healthy senders always reach a part whose reducer averaged it.
            for (uint32_t h = 2; h < 5; ++h)
              CHECK(std::count(p.contributors.begin(), p.contributors.end(), h) == 1);
            auto segments = p.segments;
            if (segments.empty())
              segments.push_back({0, p.size, p.contributors});
            int64_t covered = 0;
            for (auto& sg : segments) {
              CAPTURE(sg.offset);
              REQUIRE(sg.offset == covered);
              covered += sg.size;
              for (auto c : p.contributors) // those that reached the whole part reached it all
                CHECK(std::count(sg.contributors.begin(), sg.contributors.end(), c) == 1);
              if (f0 == F::fail_before || f0 == F::cancel)
                CHECK(std::count(sg.contributors.begin(), sg.contributors.end(), 0u) == 0);
              if (f1 == F::fail_before || f1 == F::cancel)
                CHECK(std::count(sg.contributors.begin(), sg.contributors.end(), 1u) == 0);
              auto acc = torch::zeros({sg.size}, torch::kFloat64);
              double total = 0;
              for (auto c : sg.contributors) {
                acc += xs[c].narrow(0, p.offset + sg.offset, sg.size).to(torch::kFloat64) * ws[c];
                total += ws[c];
              }
              CHECK(max_diff(seg.narrow(0, sg.offset, sg.size), acc / total) <= 1e-5);
            }
            CHECK(covered == p.size);
            if (p.segments.size() > 1)
              ++split_parts;
          } else {
            auto own = xs[i].narrow(0, p.offset, p.size);
            auto at = p.reason.find(" elements of its result had arrived");
            if (!in_place || at == std::string::npos) {
              CHECK(torch::equal(seg, own));
            } else {
              // The elements of the result that had arrived hold it; all others the own values.
              auto open = p.reason.rfind('(', at);
              REQUIRE(open != std::string::npos);
              long long arrived = 0, of = 0;
              REQUIRE(std::sscanf(p.reason.c_str() + open, "(%lld of %lld", &arrived, &of) == 2);
              CHECK(of == p.size);
              CHECK(arrived > 0);
              CHECK(arrived < p.size);
              CHECK(seg.ne(own).sum().item<int64_t>() <= arrived);
              ++mixed_parts;
            }
            CHECK_FALSE(p.reason.empty());
            CHECK(p.reducer == 0u); // only faulty reducers lose their parts
          }
        }
      }
    }
  MESSAGE("parts that a sender reached in some chunks only: " << split_parts);
  MESSAGE("parts unaveraged in place after some of their result arrived: " << mixed_parts);
  CHECK(split_parts > 0);
}

TEST_CASE("round engine: every chunk delivered twice changes nothing") {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    CAPTURE(seed);
    std::vector<double> ws = {1, 2, 3};
    auto xs = random_flats(3, 999, seed);
    net_options o;
    o.engine.chunk_elems = 64;
    o.duplicate = true;
    test_net net(seed, members_of(3), xs, ws, o);
    net.run();
    auto want = mean_of(xs, ws, {0, 1, 2});
    for (size_t i = 0; i < 3; ++i) {
      REQUIRE(net[i].result);
      for (auto& p : net[i].result->parts)
        CHECK(p.status == part_status::averaged);
      CHECK(max_diff(net[i].result->values, want) <= 1e-6);
    }
  }
}

TEST_CASE("round engine: each reducer reports the weight every complete contribution brought "
          "to its part, and none for a sender that failed mid-way") {
  std::vector<double> ws = {3, 5, 7};
  auto xs = random_flats(3, 900, 9);
  net_options o;
  o.engine.chunk_elems = 32;
  test_net net(9, members_of(3), xs, ws, o);
  net.run();
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(net[i].result);
    CHECK(net[i].result->received == ws);
  }
  // Peer 0 crashes after half of its contribution chunks: no reducer that missed part of its
  // contribution reports a weight for it; the two that live report each other's.
  test_net cut(9, members_of(3), xs, ws, o, {fault::fail_sending});
  cut.run();
  size_t missed = 0;
  for (size_t i = 1; i < 3; ++i) {
    REQUIRE(cut[i].result);
    auto& r = cut[i].result->received;
    REQUIRE(r.size() == 3);
    CHECK(r[1] == 5);
    CHECK(r[2] == 7);
    // Either all of peer 0's chunks for this part went out before the crash, or none counts.
    CHECK((r[0] == 3 || r[0] == -1));
    missed += r[0] == -1 ? 1 : 0;
  }
  CHECK(missed >= 1);
}

TEST_CASE("round engine: compressed chunks stay close to the exact mean (fp16, 8-bit)") {
  struct codec_case {
    kernels::codec_id codec;
    double max_mse;
  };
  for (auto cc : {codec_case{kernels::codec_id::fp16, 1e-5},
                  codec_case{kernels::codec_id::blockwise8, 1e-2},
                  codec_case{kernels::codec_id::uniform8, 1e-2}}) {
    CAPTURE(static_cast<int>(cc.codec));
    auto xs = random_flats(4, 25000, 500);
    std::vector<double> ws(4, 1.0);
    net_options o;
    o.codec = cc.codec;
    o.engine.chunk_elems = 4096;
    test_net net(7, members_of(4), xs, ws, o);
    net.run();
    auto want = mean_of(xs, ws, {0, 1, 2, 3});
    for (size_t i = 0; i < 4; ++i) {
      REQUIRE(net[i].result);
      auto mse = (net[i].result->values.to(torch::kFloat64) - want).pow(2).mean().item<double>();
      CHECK(mse <= cc.max_mse);
      CHECK(mse > 0); // the codec really acted on the remote parts
    }
  }
}

TEST_CASE("round engine: a malformed contribution excludes its sender, a malformed result keeps "
          "own values") {
  struct null_sink : round_sink {
    std::vector<std::pair<uint32_t, out_chunk_ptr>> sent;
    void send(uint32_t to, const out_chunk_ptr& c) override { sent.emplace_back(to, c); }
  } sink;
  auto plan = make_plan(members_of(3), 30);
  REQUIRE(plan.ok());
  auto x = torch::ones({30});
  round_engine e(9, *plan, 0, x, 1.0, {}, sink);
  for (uint32_t m : {1u, 2u})
    e.open(m, 0);
  CHECK(sink.sent.size() == 2); // part 1 and part 2, one chunk each
  auto part0 = plan->sizes[0];
  chunk_meta c;
  c.group_id = 9;
  c.kind = contribution_chunk;
  c.part = 0;
  c.from = 1;
  c.offset = 0;
  e.on_chunk(c, torch::full({part0 + 1}, 2.0f)); // too long: member 1 is excluded
  c.from = 2;
  e.on_chunk(c, torch::full({part0}, 4.0f));
  // Part 0 reduced over members 0 and 2, and its result went out to 1 and 2.
  CHECK(sink.sent.size() == 4);
  auto r = e.result();
  CHECK(r.parts[0].contributors == std::vector<uint32_t>{0, 2});
  CHECK(torch::allclose(r.values.narrow(0, 0, part0), torch::full({part0}, 2.5f)));
  chunk_meta bad;
  bad.group_id = 9;
  bad.kind = result_chunk;
  bad.part = 1;
  bad.from = 1;
  bad.offset = plan->sizes[1]; // past the end of the part
  e.on_chunk(bad, torch::ones({1}));
  CHECK(e.result().parts[1].status == part_status::own_value_kept);
  CHECK(e.result().parts[1].reason.find("malformed") != std::string::npos);
  chunk_meta other = bad; // another round's chunk is ignored
  other.group_id = 10;
  other.part = other.from = 2;
  other.offset = 0;
  e.on_chunk(other, torch::ones({plan->sizes[2]}));
  CHECK_FALSE(e.ready());
}

TEST_CASE("round engine: the streamed mean sends each result chunk once every sender delivered "
          "it, before the reduction") {
  struct log_sink : round_sink {
    std::vector<std::pair<uint32_t, out_chunk_ptr>> sent;
    void send(uint32_t to, const out_chunk_ptr& c) override { sent.emplace_back(to, c); }
    std::vector<out_chunk_ptr> results_to(uint32_t to) const {
      std::vector<out_chunk_ptr> out;
      for (auto& [t, c] : sent)
        if (t == to && c->meta.kind == result_chunk)
          out.push_back(c);
      return out;
    }
  } sink;
  // 3 members; member 0 reduces part 0 (40 elements) in chunks of 10.
  auto plan = make_plan(members_of(3), 120);
  REQUIRE(plan.ok());
  auto part0 = plan->sizes[0];
  REQUIRE(part0 == 40);
  torch::manual_seed(5);
  std::vector<at::Tensor> xs = {torch::randn({120}), torch::randn({120}), torch::randn({120})};
  std::vector<double> ws = {1, 2, 3};
  round_engine_options o;
  o.chunk_elems = 10;
  o.hash_parts = true;
  round_engine e(7, *plan, 0, xs[0], ws[0], o, sink);
  for (uint32_t m : {1u, 2u})
    e.open(m, 0);
  auto contribute = [&](uint32_t from, int64_t off) {
    chunk_meta c;
    c.group_id = 7;
    c.kind = contribution_chunk;
    c.part = 0;
    c.from = from;
    c.weight = ws[from];
    c.offset = off;
    e.on_chunk(c, xs[from].narrow(0, off, 10));
  };
  auto mean = [&](std::vector<size_t> who, int64_t off, int64_t n) {
    at::Tensor acc = torch::zeros({n}, torch::kFloat64);
    double total = 0;
    for (auto i : who) {
      acc += xs[i].narrow(0, off, n).to(torch::kFloat64) * ws[i];
      total += ws[i];
    }
    return (acc / total).to(torch::kFloat32);
  };
  // Member 1 sends its first three chunks, member 2 its first one: only [0, 10) is complete.
  for (int64_t off : {0, 10, 20})
    contribute(1, off);
  CHECK(sink.results_to(1).empty());
  contribute(2, 0);
  for (uint32_t to : {1u, 2u}) {
    auto rs = sink.results_to(to);
    REQUIRE(rs.size() == 1);
    CHECK(rs[0]->meta.offset == 0);
    CHECK(rs[0]->meta.contributors == std::vector<uint32_t>{0, 1, 2});
    CHECK(torch::allclose(rs[0]->values, mean({0, 1, 2}, 0, 10), 1e-6, 1e-6));
  }
  CHECK(sink.results_to(1)[0] == sink.results_to(2)[0]); // one chunk for every destination
  CHECK_FALSE(e.ready());
  // Member 2 catches up to [0, 30): two more go out, in order.
  contribute(2, 10);
  contribute(2, 20);
  REQUIRE(sink.results_to(1).size() == 3);
  CHECK(sink.results_to(1)[2]->meta.offset == 20);
  // Member 2 goes away before [30, 40): the reduction counts it where it had delivered; the
  // last chunk waits for member 1 (still owed), then goes out with members 0 and 1.
  e.member_gone(2, "went down");
  CHECK(sink.results_to(1).size() == 3);
  contribute(1, 30);
  auto rs = sink.results_to(1);
  REQUIRE(rs.size() == 4);
  CHECK(rs[3]->meta.offset == 30);
  CHECK(rs[3]->meta.contributors == std::vector<uint32_t>{0, 1});
  CHECK(torch::allclose(rs[3]->values, mean({0, 1}, 30, 10), 1e-6, 1e-6));
  // The own part of the result is the same values, each range divided once.
  auto r = e.result();
  CHECK(torch::allclose(r.values.narrow(0, 0, 30), mean({0, 1, 2}, 0, 30), 1e-6, 1e-6));
  CHECK(torch::allclose(r.values.narrow(0, 30, 10), mean({0, 1}, 30, 10), 1e-6, 1e-6));
  CHECK(r.parts[0].status == part_status::averaged);
  REQUIRE(r.parts[0].segments.size() == 2);
  CHECK(r.parts[0].segments[0].size == 30);
  // Its digest covers the chunks as they went out.
  digest zero{};
  CHECK(e.digests().result_sent != zero);
}

TEST_CASE("round engine: a reducer cut at its deadline sends what it finished early once, and "
          "the rest by segment") {
  struct log_sink : round_sink {
    std::vector<out_chunk_ptr> sent;
    void send(uint32_t to, const out_chunk_ptr& c) override {
      if (to == 1 && c->meta.kind == result_chunk)
        sent.push_back(c);
    }
  } sink;
  auto plan = make_plan(members_of(3), 120);
  REQUIRE(plan.ok());
  auto x = torch::ones({120});
  round_engine_options o;
  o.chunk_elems = 10;
  round_engine e(8, *plan, 0, x, 1.0, o, sink);
  for (uint32_t m : {1u, 2u})
    e.open(m, 0);
  chunk_meta c;
  c.group_id = 8;
  c.kind = contribution_chunk;
  c.part = 0;
  c.weight = 1.0;
  for (uint32_t from : {1u, 2u}) {
    c.from = from;
    c.offset = 0;
    e.on_chunk(c, torch::full({10}, 4.0f)); // [0, 10) complete: goes out early
  }
  c.from = 1;
  c.offset = 10;
  e.on_chunk(c, torch::full({10}, 4.0f)); // member 2 never sends [10, 40)
  REQUIRE(sink.sent.size() == 1);
  e.reduce_deadline();
  // [10, 20) with members 0 and 1, [20, 40) with member 0 alone; nothing twice.
  std::vector<std::pair<int64_t, size_t>> got;
  for (auto& ch : sink.sent)
    got.emplace_back(ch->meta.offset, ch->meta.contributors.size());
  CHECK(got == std::vector<std::pair<int64_t, size_t>>{{0, 3}, {10, 2}, {20, 1}, {30, 1}});
  auto r = e.result();
  CHECK(torch::allclose(r.values.narrow(0, 0, 10), torch::full({10}, 3.0f)));
  CHECK(torch::allclose(r.values.narrow(0, 10, 10), torch::full({10}, 2.5f)));
  CHECK(torch::allclose(r.values.narrow(0, 20, 20), torch::ones({20})));
}

TEST_CASE("round engine BTARD hooks: part digests agree between sender and receiver, and a "
          "custom reducer sees whole contributions") {
  std::vector<double> ws = {1, 1, 2, 1};
  auto xs = random_flats(4, 3001, 77);
  auto seen = std::make_shared<std::vector<std::pair<size_t, int64_t>>>();
  net_options o;
  o.engine.chunk_elems = 100;
  o.engine.hash_parts = true;
  o.engine.reducer = [seen](const std::vector<at::Tensor>& parts,
                            const std::vector<double>& weights) -> result<at::Tensor> {
    for (auto& p : parts)
      seen->emplace_back(parts.size(), p.numel());
    auto acc = torch::zeros_like(parts[0]);
    double total = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      acc += parts[i] * weights[i];
      total += weights[i];
    }
    return acc / total;
  };
  test_net net(3, members_of(4), xs, ws, o);
  net.run();
  auto want = mean_of(xs, ws, {0, 1, 2, 3});
  for (size_t i = 0; i < 4; ++i) {
    REQUIRE(net[i].finished);
    CHECK(max_diff(net[i].result->values, want) <= 1e-5);
  }
  // Every reducer got 4 whole contributions of its part's size.
  REQUIRE(seen->size() == 16);
  for (auto& [count, numel] : *seen)
    CHECK(count == 4);
  digest zero{};
  for (size_t i = 0; i < 4; ++i)
    for (size_t j = 0; j < 4; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      // What i sent to j is what j received from i; what j sent back is what i received.
      CHECK(net[i].digests.sent[j] == net[j].digests.received[i]);
      CHECK(net[j].digests.result_sent == net[i].digests.result_received[j]);
      CHECK(net[i].digests.sent[j] != zero);
      if (i != j)
        CHECK(net[i].digests.sent[j] != net[j].digests.sent[i]);
    }
}

} // namespace starling::test::actors_round_engine_test
