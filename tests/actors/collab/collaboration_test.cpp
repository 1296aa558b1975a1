// Several peers' cores (coordinator + grad_accumulator) in virtual time, with a DHT and an exact
// averager played by the test: what an actor graph will do, without actors. Checks that the
// collaboration's parameters equal a single process stepping on the union of the samples that
// went into each step, that a newcomer downloads the state and contributes, that a peer leaving
// on purpose stops counting, and that no sample is counted twice.
#include <doctest/doctest.h>

#include <map>
#include <set>

#include "actors/collab/coordinator.hpp"
#include "actors/collab/grad_accumulator.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/mlp.hpp"

namespace starling::test::actors_collaboration_test {

using namespace starling::actors::collab;
using namespace starling::kernels;

namespace {

constexpr int64_t micro = 8;

struct sample_id {
  int peer;
  int index;
  bool operator<(const sample_id& o) const {
    return peer < o.peer || (peer == o.peer && index < o.index);
  }
};

/// A peer's microbatch `index`: a pure function of (peer, index).
std::pair<torch::Tensor, torch::Tensor> data(const mlp_config& cfg, sample_id s) {
  auto gen = seeded_generator(static_cast<uint64_t>(s.peer) * 1'000'003 + s.index);
  return {torch::randn({micro, cfg.inputs}, gen),
          torch::randint(0, cfg.classes, {micro}, gen, torch::kLong)};
}

optimizer_options optim() {
  optimizer_options o;
  o.kind = "adam";
  o.lr = 1e-2;
  o.max_grad_norm = 0.5;
  return o;
}

struct peer {
  int index;
  std::string id;
  int period; // a microbatch every `period` ticks: speeds 1 to 1/3
  std::shared_ptr<stage_module> model;
  coordinator core;
  grad_accumulator acc;
  bool alive = false;
  bool paused = false;
  seconds wake = 1e18;
  int next_micro = 0;
  std::vector<sample_id> pending;
  std::map<uint64_t, taken_gradient> taken;
  std::map<uint64_t, std::vector<sample_id>> taken_samples;
  std::map<uint64_t, torch::Tensor> averaged;

  peer(int i, int period, const mlp_config& cfg, const coordinator_options& o)
      : index(i),
        id("p" + std::to_string(i)),
        period(period),
        model(make_mlp(cfg).value()),
        core(id, o),
        acc(grad_accumulator::make(model->ordered_parameters(), optim()).value()) {}
};

struct round_group {
  struct member {
    peer* p;
    uint64_t id;
    taken_gradient g;
    std::vector<sample_id> samples;
  };
  std::vector<member> members;
  seconds close_at = 0;
};

struct collaboration {
  mlp_config cfg;
  seconds now = 0;
  seconds window = 2.0;
  std::vector<std::unique_ptr<peer>> peers;
  std::map<std::string, progress_entry> dht;
  std::map<uint64_t, round_group> open; // by step
  std::map<uint64_t, std::vector<sample_id>> history;
  std::set<sample_id> dropped;
  int downloads = 0;

  void carry_out(peer& p, std::vector<effect> es) {
    while (!es.empty()) {
      std::vector<effect> next;
      auto feed = [&](std::vector<effect> more) {
        next.insert(next.end(), more.begin(), more.end());
      };
      for (auto& e : es) {
        if (auto* pub = std::get_if<publish_progress>(&e)) {
          dht[p.id] = {p.id, pub->value, pub->expires_at};
        } else if (auto* w = std::get_if<withdraw_progress>(&e)) {
          dht[p.id] = {p.id, w->value, w->expires_at};
        } else if (std::holds_alternative<read_progress>(e)) {
          std::vector<progress_entry> live;
          for (auto& [k, v] : dht)
            if (v.expires_at > now)
              live.push_back(v);
          feed(p.core.progress_read(live, now));
        } else if (auto* wk = std::get_if<wake_at>(&e)) {
          p.wake = wk->at;
        } else if (auto* r = std::get_if<start_round>(&e)) {
          auto g = p.acc.take();
          REQUIRE(g.samples == r->samples);
          REQUIRE(g.samples == p.pending.size() * micro);
          auto& group = open[r->step];
          if (group.members.empty())
            group.close_at = now + window;
          group.members.push_back({&p, r->id, g, p.pending});
          p.taken[r->id] = g;
          p.taken_samples[r->id] = std::move(p.pending);
          p.pending.clear();
        } else if (auto* a = std::get_if<apply_averaged>(&e)) {
          REQUIRE(p.acc.apply(p.averaged.at(a->id)).ok());
        } else if (auto* sa = std::get_if<step_alone>(&e)) {
          // A peer that never saw another steps alone: the step is its own, as in one process.
          auto g = p.acc.take();
          REQUIRE(g.samples == sa->samples);
          REQUIRE(history.count(sa->step) == 0);
          history[sa->step] = std::move(p.pending);
          p.pending.clear();
          REQUIRE(p.acc.apply(g.mean).ok());
        } else if (auto* own = std::get_if<step_own>(&e)) {
          REQUIRE(p.acc.apply(p.taken.at(own->id).mean).ok());
        } else if (std::holds_alternative<pause_compute>(e)) {
          p.paused = true;
        } else if (std::holds_alternative<resume_compute>(e)) {
          p.paused = false;
        } else if (auto* d = std::get_if<download_state>(&e)) {
          peer* donor = nullptr;
          for (auto& q : peers)
            if (q->id == d->donors.front())
              donor = q.get();
          REQUIRE(donor != nullptr);
          REQUIRE(donor->core.step() >= d->step);
          REQUIRE(p.acc.import_state(donor->acc.export_state().value()).ok());
          downloads++;
          feed(p.core.download_done(d->id, donor->core.step(), now));
        } else if (std::holds_alternative<discard_gradients>(e)) {
          p.acc.discard();
          for (auto& s : p.pending)
            dropped.insert(s);
          p.pending.clear();
        }
      }
      es = std::move(next);
    }
  }

  void tick(int t) {
    for (auto& p : peers) {
      if (!p->alive || p->paused || t % p->period != 0)
        continue;
      sample_id s{p->index, p->next_micro++};
      auto [x, y] = data(cfg, s);
      p->model->compute(x, y).backward();
      REQUIRE(p->acc.accumulate(micro).ok());
      p->pending.push_back(s);
      carry_out(*p, p->core.samples_done(micro, now));
    }
    for (auto& p : peers)
      if (p->alive && now >= p->wake)
        carry_out(*p, p->core.timer(now));
    // The averager: a group closes `window` after its first member joined, with the exact
    // weighted mean of what its members sent.
    for (auto it = open.begin(); it != open.end();) {
      auto& [step, group] = *it;
      if (now < group.close_at) {
        ++it;
        continue;
      }
      REQUIRE(history.count(step) == 0); // one group per step
      auto sum = torch::zeros({group.members.front().p->acc.numel()});
      double weight = 0;
      for (auto& m : group.members) {
        sum += m.g.mean * static_cast<double>(m.g.samples);
        weight += static_cast<double>(m.g.samples);
        for (auto& s : m.samples)
          history[step].push_back(s);
      }
      auto mean = weight > 0 ? sum / weight : sum;
      for (auto& m : group.members) {
        if (!m.p->alive)
          continue;
        m.p->averaged[m.id] = mean;
        carry_out(*m.p, m.p->core.round_done(m.id, now));
      }
      it = open.erase(it);
    }
  }
};

} // namespace

TEST_CASE("a collaboration of peers with different speeds, a newcomer and a leaver equals a "
          "single process stepping on the same samples") {
  coordinator_options o;
  o.progress.target_batch = 96;
  o.round_timeout = 10;
  collaboration c;
  int periods[] = {1, 1, 2, 3, 1};
  for (int i = 0; i < 5; ++i)
    c.peers.push_back(std::make_unique<peer>(i, periods[i], c.cfg, o));
  // p0..p3 start together; p4 joins at 20 s; p3 leaves on purpose at 30 s.
  constexpr int join_tick = 80, leave_tick = 120, ticks = 240;
  for (int t = 0; t < ticks; ++t) {
    c.now = t * 0.25;
    for (int i = 0; i < 4 && t == 0; ++i) {
      c.peers[static_cast<size_t>(i)]->alive = true;
      c.carry_out(*c.peers[static_cast<size_t>(i)], c.peers[static_cast<size_t>(i)]->core.start(0));
    }
    if (t == join_tick) {
      auto& p = *c.peers[4];
      p.alive = true;
      c.carry_out(p, p.core.start(c.now));
    }
    if (t == leave_tick) {
      auto& p = *c.peers[3];
      c.carry_out(p, p.core.leave(c.now));
      p.alive = false;
      for (auto& s : p.pending)
        c.dropped.insert(s);
    }
    c.tick(t);
  }
  // The newcomer downloaded the state and then took part in rounds.
  auto& newcomer = *c.peers[4];
  CHECK(c.downloads >= 1);
  CHECK(newcomer.core.stats().downloads_done >= 1);
  CHECK(newcomer.core.stats().rounds_averaged > 0);
  // The leaver's tombstone is in the DHT: nobody counts it any more.
  CHECK(decode_progress(c.dht.at("p3").value)->withdrawn);
  CHECK(c.peers[0]->core.estimate(c.now).peers <= 4);
  // Every round was averaged (no peer stepped alone, so everyone's history is the same).
  for (auto& p : c.peers) {
    CAPTURE(p->id);
    CHECK(p->core.stats().own_steps == 0);
  }
  // No sample counted twice: every microbatch is in at most one step, never also dropped.
  std::set<sample_id> seen;
  size_t in_steps = 0;
  for (auto& [step, samples] : c.history)
    for (auto& s : samples) {
      CHECK(seen.insert(s).second);
      CHECK(c.dropped.count(s) == 0);
      in_steps++;
    }
  CHECK(in_steps > 0);
  // The single process: one mean loss over each step's samples, in order.
  auto single = make_mlp(c.cfg).value();
  auto ps = single->ordered_parameters();
  auto opt = std::move(make_optimizer(optim(), ps)).value();
  std::vector<torch::Tensor> after{flatten_parameters(ps)};
  for (uint64_t step = 0; c.history.count(step) != 0; ++step) {
    std::vector<torch::Tensor> xs, ys;
    for (auto& s : c.history[step]) {
      auto [x, y] = data(c.cfg, s);
      xs.push_back(x);
      ys.push_back(y);
    }
    opt->zero_grad();
    single->compute(torch::cat(xs), torch::cat(ys)).backward();
    clipped_step(*opt, ps, optim());
    after.push_back(flatten_parameters(ps));
  }
  CHECK(after.size() > 5);
  for (auto& p : c.peers) {
    if (!p->alive)
      continue;
    CAPTURE(p->id);
    auto step = p->core.step();
    REQUIRE(step < after.size());
    auto diff = (flatten_parameters(p->acc.params()) - after[step]).abs().max().item<double>();
    CHECK(diff <= 1e-6);
  }
}

} // namespace starling::test::actors_collaboration_test
