#include "runtime/run/swarm_sim.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/stage/board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/supervisor/supervisor.hpp"
#include "actors/trainer/trainer.hpp"
#include "actors/trainer/wiring.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/config/reader.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/sim/world.hpp"

namespace starling::runtime {

namespace {

using clock_type = std::chrono::steady_clock;

/// One stage peer slot: its speed, current stage and whether it is up.
struct slot_state {
  double speed = 1;
  uint64_t stage = 0;
  bool alive = true;
};

/// What the collector sees (trainer reports, supervisor notes) plus the slots' state.
struct sim_shared {
  std::vector<slot_state> slots;
  int64_t samples = 0;
  int64_t microbatches = 0;
  int64_t retries = 0;
  int64_t stops = 0;
  int64_t migrations = 0;
  int64_t respawns = 0;
  /// Faults, respawns and migrations, as "<seconds> <what>".
  std::vector<std::string> events;
};

caf::behavior sim_collector(caf::event_based_actor*, std::shared_ptr<sim_shared> sh,
                            sim::world* w) {
  return {
    [=](report_atom, const std::string&, double, int64_t samples, int64_t retries, double) {
      sh->microbatches++;
      sh->samples += samples;
      sh->retries += retries;
    },
    [=](stop_atom, const std::string&) { sh->stops++; },
    [=](respawn_atom, uint64_t, const std::string& name, int generation) {
      auto slot = std::stoul(name.substr(1)); // child names are "p<slot>"
      if (slot < sh->slots.size())
        sh->slots[slot].alive = true;
      sh->respawns++;
      w->record("respawn", name, "", 0, std::to_string(generation));
      sh->events.push_back(fmt::format("{:.1f} respawn {} g{}", w->elapsed().count() / 1e9, name,
                                       generation));
    },
    [=](migrate_atom, uint64_t, const std::string& name, uint64_t from, uint64_t to) {
      auto slot = std::stoul(name.substr(1));
      if (slot < sh->slots.size())
        sh->slots[slot].stage = to;
      sh->migrations++;
      w->record("migrate", name, "", 0, fmt::format("{} -> {}", from, to));
      sh->events.push_back(fmt::format("{:.1f} migrate {} {} -> {}", w->elapsed().count() / 1e9,
                                       name, from, to));
    },
  };
}

/// The board as seen from one simulated node: announcements and reports go to the shared
/// in-process board; peer lists come back with handles replaced by link proxies, so that every
/// hop and state download goes through the network model.
caf::behavior board_view(caf::event_based_actor* self, sim::world* w, int node, caf::actor board) {
  return {
    [=](put_atom, uint64_t stage, const std::string& name, const caf::actor& peer) {
      self->send(board, put_atom::value, stage, name, peer);
    },
    [=](load_atom, uint64_t stage, const std::string& name, double throughput, double queue) {
      self->send(board, load_atom::value, stage, name, throughput, queue);
    },
    [=](get_atom, uint64_t stage)
      -> caf::result<std::vector<std::string>, std::vector<caf::actor>> {
      auto rp = self->make_response_promise<std::vector<std::string>, std::vector<caf::actor>>();
      self->request(board, caf::infinite, get_atom::value, stage)
        .then(
          [=](std::vector<std::string>& names, std::vector<caf::actor>& handles) mutable {
            for (auto& h : handles)
              if (w->node_of(h.address()) != node)
                h = w->proxy(node, h);
            rp.deliver(std::move(names), std::move(handles));
          },
          [=](caf::error& e) mutable { rp.deliver(std::move(e)); });
      return rp;
    },
  };
}

caf::timespan span(std::chrono::nanoseconds d) {
  return std::chrono::duration_cast<caf::timespan>(d);
}

std::shared_ptr<const kernels::corpus> synthetic_corpus() {
  std::string text;
  for (int i = 0; i < 200; ++i)
    text += "In the beginning God created the heaven and the earth. And the earth was without "
            "form, and void; and darkness was upon the face of the deep. ";
  return std::make_shared<const kernels::corpus>(text, 0.05, "synthetic (modeled compute)");
}

} // namespace

std::vector<double> lognormal_speeds(size_t count, double sigma, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::normal_distribution<double> z{0.0, 1.0};
  std::vector<double> out(count);
  double top = 0;
  for (auto& v : out) {
    v = std::exp(sigma * std::clamp(z(rng), -4.0, 4.0));
    top = std::max(top, v);
  }
  for (auto& v : out)
    v = std::max(1e-3, v / top);
  return out;
}

result<swarm_sim_result> simulate_swarm(const graph::swarm_graph& g,
                                        const swarm_sim_settings& s) {
  auto wall0 = clock_type::now();
  auto ranges = graph::stage_ranges(g);
  if (!ranges)
    return ranges.error();
  auto stages = g.stages.size();
  if (!s.stage_work.empty() && s.stage_work.size() != stages)
    return fail(fmt::format("sim.stage_work: {} values for {} stages", s.stage_work.size(),
                            stages));
  if (!(s.forward_s > 0) || !(s.backward_factor > 0) || s.noise < 0)
    return fail("sim: forward time and backward factor must be positive, noise non-negative");
  std::vector<double> work(stages); // seconds per training sample at speed 1, per stage
  std::vector<double> forward(stages);
  for (size_t k = 0; k < stages; ++k) {
    forward[k] = s.forward_s * (s.stage_work.empty() ? 1.0 : s.stage_work[k]);
    if (!(forward[k] > 0))
      return fail("sim.stage_work: values must be positive");
    work[k] = forward[k] * (1.0 + s.backward_factor);
  }
  sim::world_options wo;
  wo.seed = s.seed;
  wo.network = s.network;
  wo.trace_messages = s.trace_messages;
  sim::world w{wo};
  auto& sys = w.system();
  auto sh = std::make_shared<sim_shared>();
  auto slots = graph::peer_slots(g);
  for (auto& [stage, speed] : slots)
    sh->slots.push_back(slot_state{speed, stage, true});

  auto& hub = w.add_node("hub");
  auto board = actors::stage::spawn_board(sys, stages);
  hub.adopt("board", board);
  auto collector = hub.spawn("collector", sim_collector, sh, &w);
  auto model = g.model;
  model.seed = g.seed;

  // Stage peers: one node per slot, with its supervisor (one child) and board view.
  bool rebalancing = s.routing == sim_routing::stochastic
                     && s.rebalance_period > std::chrono::nanoseconds{0};
  std::vector<caf::actor> supervisors;
  auto ranges_v = *ranges;
  for (size_t slot = 0; slot < slots.size(); ++slot) {
    auto& n = w.add_node(fmt::format("p{}", slot));
    auto view = n.spawn("board", board_view, &w, n.index(), board);
    actors::supervisor::child_spec spec;
    spec.name = fmt::format("p{}", slot);
    spec.stage = slots[slot].first;
    spec.restart_delay = span(g.restart_delay);
    auto speed = slots[slot].second;
    spec.spawn_at = [&sys, &n, view, model, ranges_v, forward, g, s, slot, speed](
                      int generation, uint64_t stage) {
      actors::stage::stage_options so;
      so.stage = stage;
      so.name = fmt::format("s{}p{}g{}", stage, slot, generation);
      so.model = model;
      so.begin = ranges_v[stage].first;
      so.end = ranges_v[stage].second;
      so.local_batch = g.local_batch;
      so.speed = speed;
      so.codec = kernels::codec_id::none;
      so.download_state = generation > 0;
      so.timeout = caf::timespan{std::chrono::seconds(30)};
      so.retry_every = caf::timespan{std::chrono::seconds(2)};
      so.download_patience = caf::timespan{std::chrono::seconds(30)};
      so.seed = g.seed * 1000003ULL + slot * 101 + static_cast<uint64_t>(generation);
      so.modeled.enabled = true;
      so.modeled.forward_s = forward[stage];
      so.modeled.backward_factor = s.backward_factor;
      so.modeled.noise = s.noise;
      so.modeled.payload = s.payload;
      so.modeled.state_transfer = span(s.state_transfer);
      so.report_every = span(s.report_every);
      auto peer = actors::stage::spawn_stage(sys, so, view);
      n.adopt(so.name, peer);
      return peer;
    };
    actors::supervisor::rebalancing_options ro;
    ro.board = board;
    ro.period = rebalancing ? span(s.rebalance_period) : caf::timespan{0};
    ro.policy.threshold = s.rebalance_threshold;
    ro.place_new_peers = rebalancing && s.place_new_peers;
    ro.seed = s.seed * 7777 + slot;
    std::vector<actors::supervisor::child_spec> children{spec};
    auto sup = actors::supervisor::spawn_supervisor(sys, children, collector, ro);
    n.adopt("supervisor", sup);
    supervisors.push_back(sup);
  }
  w.run();

  // Trainers: one node each. The fixed strategy runs one trainer per pipeline (peer k of every
  // stage), the others the graph's trainers; all keep the same total in flight.
  int64_t per_trainer = actors::trainer::inflight_target(
    slots.size(), g.trainers, s.inflight_per_peer, s.inflight_cap, g.max_inflight);
  auto total_inflight = g.trainers * per_trainer;
  std::vector<std::vector<size_t>> by_stage(stages);
  for (size_t slot = 0; slot < slots.size(); ++slot)
    by_stage[slots[slot].first].push_back(slot);
  int64_t trainers = g.trainers;
  int64_t inflight = g.max_inflight;
  bool adaptive = s.inflight_per_peer > 0;
  if (s.routing == sim_routing::fixed) {
    // A fixed pipeline runs at its slowest peer's pace: a window deeper than the graph's fixed
    // one only queues at that peer, past the hop timeout (a timed-out hop is retried on the same
    // peer, which still computes the first copy). So the pipelines share the graph's window.
    adaptive = false;
    total_inflight = g.trainers * g.max_inflight;
    size_t pipelines = slots.size();
    for (auto& v : by_stage)
      pipelines = std::min(pipelines, v.size());
    trainers = static_cast<int64_t>(pipelines);
    inflight = (total_inflight + trainers - 1) / trainers;
  }
  auto corpus = synthetic_corpus();
  for (int64_t i = 0; i < trainers; ++i) {
    auto& n = w.add_node(fmt::format("t{}", i));
    auto view = n.spawn("board", board_view, &w, n.index(), board);
    actors::trainer::trainer_options to;
    to.name = fmt::format("trainer{}", i);
    to.stages = stages;
    to.microbatch = g.microbatch;
    to.seq_len = model.seq_len;
    to.shard = i;
    to.shards = trainers;
    to.microbatches = g.microbatches_per_trainer;
    if (s.routing == sim_routing::fixed)
      to.microbatches = (g.microbatches_per_trainer * g.trainers + trainers - 1) / trainers;
    to.max_inflight = inflight;
    if (adaptive) {
      to.inflight_per_peer = s.inflight_per_peer;
      to.inflight_cap = s.inflight_cap;
      to.trainers = trainers;
    }
    to.probe = s.probe && s.routing == sim_routing::stochastic;
    to.hop_timeout = caf::timespan{g.hop_timeout};
    to.refresh_every = span(s.refresh_every);
    to.exclude_for = span(s.refresh_every);
    to.codec = kernels::codec_id::none;
    to.seed = g.seed * 7919 + static_cast<uint64_t>(i);
    using actors::trainer::routing_kind;
    to.routing = s.routing == sim_routing::uniform ? routing_kind::uniform
                 : s.routing == sim_routing::fixed ? routing_kind::fixed
                                                   : routing_kind::stochastic;
    if (s.routing == sim_routing::fixed)
      for (size_t k = 0; k < stages; ++k)
        to.fixed_route.push_back(fmt::format("s{}p{}g", k, by_stage[k][static_cast<size_t>(i)]));
    n.adopt(to.name, actors::trainer::spawn_trainer(sys, to, corpus, view, collector));
  }

  // Preemptions: a seeded Poisson process over the whole swarm; each picks a random slot and
  // kills its peer (a no-op when it is already down); the supervisor restarts it.
  swarm_sim_result res;
  std::mt19937_64 rng{s.seed ^ 0x5eedULL};
  double rate = s.preemptions_per_hour / 3600.0 * static_cast<double>(slots.size());
  auto every = std::chrono::duration<double>(g.preempt_every).count();
  if (every > 0)
    rate += 1.0 / every;
  auto horizon = std::chrono::duration<double>(s.duration).count();
  auto preempt = [&w, sh, supervisors, &res](size_t slot) {
    if (slot >= sh->slots.size() || !sh->slots[slot].alive)
      return;
    sh->slots[slot].alive = false;
    res.preemptions++;
    w.record("preempt", fmt::format("p{}", slot), "", 0,
             std::to_string(sh->slots[slot].stage));
    caf::anon_send(supervisors[slot], preempt_atom::value, uint64_t{0});
  };
  if (rate > 0) {
    std::exponential_distribution<double> gap{rate};
    std::uniform_int_distribution<size_t> pick{0, slots.size() - 1};
    for (double t = gap(rng); t < horizon; t += gap(rng)) {
      auto slot = pick(rng);
      w.at(std::chrono::nanoseconds{static_cast<int64_t>(t * 1e9)}, "preempt",
           [preempt, slot] { preempt(slot); });
    }
  }
  auto kills = s.kills;
  std::vector<bool> for_good(kills.size(), !s.kills_restart);
  for (auto& k : s.kills_for_good) {
    kills.push_back(k);
    for_good.push_back(true);
  }
  for (size_t i = 0; i < kills.size(); ++i) {
    auto [at, slot] = kills[i];
    if (slot >= slots.size())
      return fail(fmt::format("sim: no peer slot {}", slot));
    bool forever = for_good[i];
    auto sup = supervisors[slot];
    w.at(at, "kill", [&w, sh, sup, slot, forever, &res] {
      if (!sh->slots[slot].alive)
        return;
      sh->slots[slot].alive = false;
      res.preemptions++;
      w.record("kill", fmt::format("p{}", slot), "", 0, forever ? "for good" : "");
      // For good: the supervisor goes too (its child dies with it and is never respawned).
      if (forever)
        caf::anon_send_exit(sup, caf::exit_reason::kill);
      else
        caf::anon_send(sup, preempt_atom::value, uint64_t{0});
    });
  }

  // The bounds at the current instant (samples/s).
  double wsum = 0;
  for (auto x : work)
    wsum += x;
  double vmax = 0;
  for (auto& sl : sh->slots)
    vmax = std::max(vmax, sl.speed);
  auto bounds = [&] {
    double live = 0;
    std::vector<double> per(stages, 0.0);
    for (auto& sl : sh->slots)
      if (sl.alive) {
        live += sl.speed;
        per[sl.stage] += sl.speed;
      }
    double assigned = INFINITY;
    for (size_t k = 0; k < stages; ++k)
      assigned = std::min(assigned, per[k] / work[k]);
    return std::make_pair(live / wsum, assigned);
  };
  {
    auto& link = s.network.defaults;
    double lat = std::chrono::duration<double>(link.latency).count();
    auto m = static_cast<double>(g.microbatch);
    double bytes = m * static_cast<double>(std::max<int64_t>(1, s.payload)) * 4 + 256;
    double t_min = m * wsum / std::max(vmax, 1e-9)
                   + 4.0 * static_cast<double>(stages) * (lat + bytes / link.bandwidth);
    res.little_bound = static_cast<double>(total_inflight) * m / t_min;
  }

  auto bucket_s = std::chrono::duration<double>(s.bucket).count();
  auto warmup_s = std::chrono::duration<double>(s.warmup).count();
  int64_t last_samples = 0;
  for (double t = 0; t < horizon - 1e-9;) {
    auto step = std::min(bucket_s, horizon - t);
    auto before = bounds();
    w.run_for(std::chrono::nanoseconds{static_cast<int64_t>(step * 1e9)});
    t += step;
    auto after = bounds();
    auto fluid = 0.5 * (before.first + after.first);
    auto assigned = 0.5 * (before.second + after.second);
    res.t.push_back(t);
    res.samples.push_back(static_cast<double>(sh->samples - last_samples));
    w.record("bucket", "", "", static_cast<uint64_t>(sh->samples - last_samples),
             fmt::format("{:.0f}", t));
    last_samples = sh->samples;
    res.fluid_bound.push_back(fluid);
    res.assigned_bound.push_back(assigned);
    std::vector<int64_t> per(stages, 0);
    for (auto& sl : sh->slots)
      if (sl.alive)
        per[sl.stage]++;
    res.peers_per_stage.push_back(per);
    if (t - step >= warmup_s - 1e-9) {
      res.measured_samples += res.samples.back();
      res.measured_s += step;
      res.bound_samples += std::min(fluid, res.little_bound) * step;
      res.assigned_bound_samples += std::min(assigned, res.little_bound) * step;
    }
    res.simulated_s = t;
    if (s.stop_when_done && sh->stops >= trainers)
      break;
  }
  res.total_samples = sh->samples;
  res.microbatches = sh->microbatches;
  res.retries = sh->retries;
  res.migrations = sh->migrations;
  res.respawns = sh->respawns;
  res.events = sh->events;
  res.digest = w.trace_digest();
  res.wall_s = std::chrono::duration<double>(clock_type::now() - wall0).count();
  return res;
}

namespace {

std::string routing_name(sim_routing r) {
  switch (r) {
    case sim_routing::uniform:
      return "uniform";
    case sim_routing::fixed:
      return "fixed";
    default:
      return "stochastic";
  }
}

/// Reads the optional `sim` section of the swarm workload.
void read_sim_section(config_node& n, swarm_sim_settings& s, int64_t& peers_per_stage,
                      double& speed_sigma, bool& study, std::vector<std::chrono::nanoseconds>& periods) {
  std::chrono::nanoseconds fwd{static_cast<int64_t>(s.forward_s * 1e9)};
  read_duration(n, "forward_per_sample", fwd);
  if (fwd.count() <= 0)
    n.child("forward_per_sample").expected("a positive duration");
  s.forward_s = std::chrono::duration<double>(fwd).count();
  if (n.has("stage_work")) {
    s.stage_work.clear();
    for (auto& item : n.child("stage_work").items()) {
      auto v = item.as_double();
      if (!(v > 0 && v <= 1000))
        item.expected("a work multiplier in (0, 1000]");
      s.stage_work.push_back(v);
    }
  }
  read_real(n, "backward_factor", s.backward_factor, 0.01, 100.0);
  read_real(n, "noise", s.noise, 0.0, 3.0);
  read_int(n, "payload", s.payload, 1, 1 << 20);
  read_duration(n, "state_transfer", s.state_transfer);
  std::string routing = routing_name(s.routing);
  read_choice(n, "routing", routing, {"stochastic", "uniform", "fixed"});
  s.routing = routing == "uniform" ? sim_routing::uniform
              : routing == "fixed" ? sim_routing::fixed
                                   : sim_routing::stochastic;
  bool rebalance = s.rebalance_period.count() > 0;
  read(n, "rebalance", rebalance);
  read_duration(n, "rebalance_period", s.rebalance_period);
  if (!rebalance)
    s.rebalance_period = std::chrono::nanoseconds{0};
  read_real(n, "rebalance_threshold", s.rebalance_threshold, 0.0, 10.0);
  read(n, "place_new_peers", s.place_new_peers);
  read_real(n, "inflight_per_peer", s.inflight_per_peer, 0.0, 1000.0);
  read_int(n, "inflight_cap", s.inflight_cap, 1, 1 << 20);
  read(n, "probe", s.probe);
  read_duration(n, "report_every", s.report_every);
  read_duration(n, "refresh_every", s.refresh_every);
  read_duration(n, "bucket", s.bucket);
  read_duration(n, "warmup", s.warmup);
  if (s.report_every.count() <= 0 || s.refresh_every.count() <= 0 || s.bucket.count() <= 0)
    n.fail("report_every, refresh_every and bucket must be positive durations");
  read_int(n, "peers_per_stage", peers_per_stage, 0, 100000);
  read_real(n, "speed_sigma", speed_sigma, 0.0, 3.0);
  read(n, "study", study);
  if (n.has("study_periods")) {
    periods.clear();
    for (auto& item : n.child("study_periods").items()) {
      auto d = item.as_duration();
      if (d.count() <= 0)
        item.expected("a positive duration");
      periods.push_back(d);
    }
  }
  n.finish();
}

void print_row(const std::string& name, const swarm_sim_result& r) {
  auto sec = r.measured_s > 0 ? r.measured_s : 1.0;
  fmt::print("  {:<38} {:>9} {:>9.2f} {:>8.1f}% {:>8.1f}% {:>6} {:>6} {:>7} {:>8.1f}\n", name,
             r.total_samples, r.measured_samples / sec,
             r.bound_samples > 0 ? 100.0 * r.measured_samples / r.bound_samples : 0.0,
             r.assigned_bound_samples > 0 ? 100.0 * r.measured_samples / r.assigned_bound_samples
                                          : 0.0,
             r.migrations, r.preemptions, r.retries, r.wall_s);
  std::fflush(stdout);
}

void print_header() {
  fmt::print("  {:<38} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7} {:>8}\n", "strategy", "samples",
             "samples/s", "of bound", "of assign", "moves", "preem", "retries", "wall s");
}

nlohmann::json to_json(const std::string& name, const swarm_sim_result& r) {
  return {{"event", "sim_run"},        {"strategy", name},
          {"samples", r.total_samples}, {"simulated_s", r.simulated_s},
          {"measured_samples", r.measured_samples}, {"measured_s", r.measured_s},
          {"bound_samples", r.bound_samples},
          {"assigned_bound_samples", r.assigned_bound_samples},
          {"little_bound", r.little_bound}, {"migrations", r.migrations},
          {"preemptions", r.preemptions}, {"retries", r.retries},
          {"wall_s", r.wall_s},         {"digest", fmt::format("{:016x}", r.digest)},
          {"t", r.t},                   {"bucket_samples", r.samples},
          {"fluid_bound", r.fluid_bound}, {"assigned_bound", r.assigned_bound}};
}

} // namespace

void validate_swarm_sim_section(config_node& sim) {
  swarm_sim_settings s;
  int64_t peers_per_stage = 0;
  double speed_sigma = 0;
  bool study = false;
  std::vector<std::chrono::nanoseconds> periods;
  read_sim_section(sim, s, peers_per_stage, speed_sigma, study, periods);
}

int run_swarm_sim(const experiment_config& cfg, const run_context& ctx) {
  graph::swarm_graph g;
  swarm_sim_settings s;
  int64_t peers_per_stage = 0;
  double speed_sigma = 0.5;
  bool study = false;
  std::vector<std::chrono::nanoseconds> periods;
  if (cfg.workload) {
    auto section = *cfg.workload;
    if (section.has("sim")) {
      auto sim = section.child("sim");
      read_sim_section(sim, s, peers_per_stage, speed_sigma, study, periods);
    }
    graph::read_swarm_graph(section, g);
    section.finish();
  }
  g.seed = cfg.experiment.seed;
  if (peers_per_stage > 0) {
    auto speeds = lognormal_speeds(static_cast<size_t>(peers_per_stage) * g.stages.size(),
                                   speed_sigma, g.seed ^ 0x5bee5ULL);
    for (size_t k = 0; k < g.stages.size(); ++k)
      g.stages[k].speeds.assign(speeds.begin() + static_cast<long>(k * peers_per_stage),
                                speeds.begin() + static_cast<long>((k + 1) * peers_per_stage));
  }
  if (auto r = graph::stage_ranges(g); !r) {
    fmt::print(stderr, "starling: error: {}\n", r.error().what);
    return 2;
  }
  s.seed = cfg.experiment.seed;
  s.network = cfg.network;
  s.preemptions_per_hour = cfg.faults.preemptions_per_hour;
  s.duration = cfg.experiment.duration;
  double speed_sum = 0;
  for (auto& st : g.stages)
    for (auto v : st.speeds)
      speed_sum += v;
  fmt::print("swarm simulation (modeled compute): {} stages, {} peers (mean speed {:.3f}), {} "
             "trainers x {} microbatches of {} in flight, forward {:.4g} s/sample at speed 1, "
             "backward x{}, noise {}, {} per peer-hour + one per {:.0f} s preempted (restart {:.0f} s), "
             "link {:.0f} ms / {:.0f} MB/s, {:.0f} s simulated\n",
             g.stages.size(), g.peer_count(), speed_sum / static_cast<double>(g.peer_count()),
             g.trainers,
             s.inflight_per_peer > 0
               ? std::to_string(actors::trainer::inflight_target(
                   g.peer_count(), g.trainers, s.inflight_per_peer, s.inflight_cap,
                   g.max_inflight))
               : std::to_string(g.max_inflight),
             g.microbatch, s.forward_s, s.backward_factor, s.noise,
             s.preemptions_per_hour, std::chrono::duration<double>(g.preempt_every).count(),
             std::chrono::duration<double>(g.restart_delay).count(),
             std::chrono::duration<double>(s.network.defaults.latency).count() * 1e3,
             s.network.defaults.bandwidth / 1e6, std::chrono::duration<double>(s.duration).count());
  if (g.averaging.enabled())
    fmt::print("note: modeled stage peers compute no gradients, so target_batch {} and gradient "
               "averaging are not simulated (only throughput is)\n",
               g.averaging.target_batch);
  if (s.inflight_per_peer > 0)
    fmt::print("in flight: {} per live stage peer over the trainers (at most {} per trainer, "
               "following the peers they see); hop routing {}\n",
               s.inflight_per_peer, s.inflight_cap,
               s.probe ? "probes two candidates' queues (power of two choices)"
                       : "by the wiring alone");
  std::fflush(stdout);
  jsonl_writer out{ctx.out_dir + "/metrics.jsonl"};
  auto run_one = [&](const std::string& name, swarm_sim_settings x) -> std::optional<swarm_sim_result> {
    auto r = simulate_swarm(g, x);
    if (!r) {
      fmt::print(stderr, "starling: error: {}\n", r.error().what);
      return std::nullopt;
    }
    out.write(to_json(name, *r));
    return *r;
  };
  if (!study) {
    auto name = routing_name(s.routing)
                + (s.routing == sim_routing::stochastic && s.rebalance_period.count() > 0
                     ? fmt::format(" + rebalancing (T={:.0f}s)",
                                   std::chrono::duration<double>(s.rebalance_period).count())
                     : std::string{});
    auto r = run_one(name, s);
    if (!r)
      return 2;
    fmt::print("\nswarm simulation summary ({})\n", name);
    fmt::print("  {:<34} {:.0f} s simulated in {:.1f} s wall\n", "time", r->simulated_s,
               r->wall_s);
    fmt::print("  {:<34} {} ({} microbatches, {} hop retries)\n", "samples", r->total_samples,
               r->microbatches, r->retries);
    fmt::print("  {:<34} {:.2f} samples/s (after the {:.0f} s warm-up)\n", "throughput",
               r->measured_samples / std::max(1.0, r->measured_s),
               std::chrono::duration<double>(s.warmup).count());
    fmt::print("  {:<34} {:.1f}% of min(fluid, Little) = {:.0f} samples; {:.1f}% of the "
               "assigned bound\n",
               "vs. the upper bound", 100.0 * r->measured_samples / std::max(1.0, r->bound_samples),
               r->bound_samples,
               100.0 * r->measured_samples / std::max(1.0, r->assigned_bound_samples));
    fmt::print("  {:<34} {:.2f} samples/s\n", "Little's-law bound", r->little_bound);
    fmt::print("  {:<34} {} preemptions, {} respawns, {} migrations\n", "faults", r->preemptions,
               r->respawns, r->migrations);
    std::string last;
    if (!r->peers_per_stage.empty())
      for (auto c : r->peers_per_stage.back())
        last += (last.empty() ? "" : " ") + std::to_string(c);
    fmt::print("  {:<34} [{}]\n", "live peers per stage at the end", last);
    fmt::print("  {:<34} {:016x}\n", "trace digest", r->digest);
    fmt::print("  {:<34} {}/metrics.jsonl\n", "output", ctx.out_dir);
    return 0;
  }
  if (periods.empty())
    periods = {std::chrono::seconds(30), std::chrono::seconds(120), std::chrono::seconds(300)};
  fmt::print("\nstudy: same workload, seed and preemption schedule for every strategy; bound = "
             "integral of min(fluid, Little) after the {:.0f} s warm-up; 'of assign' = vs. the bound of "
             "the stage assignment in effect\n", std::chrono::duration<double>(s.warmup).count());
  print_header();
  auto total0 = clock_type::now();
  auto with = [&](sim_routing routing, std::chrono::nanoseconds period) {
    auto x = s;
    x.routing = routing;
    x.rebalance_period = period;
    return x;
  };
  auto main_t = s.rebalance_period.count() > 0 ? s.rebalance_period : std::chrono::seconds(60);
  auto tname = [](std::chrono::nanoseconds d) {
    return fmt::format("{:.0f}s", std::chrono::duration<double>(d).count());
  };
  std::vector<std::pair<std::string, swarm_sim_settings>> runs{
    {"stochastic + rebalancing (T=" + tname(main_t) + ")", with(sim_routing::stochastic, main_t)},
    {"stochastic, no rebalancing", with(sim_routing::stochastic, std::chrono::nanoseconds{0})},
    {"uniform random routing", with(sim_routing::uniform, std::chrono::nanoseconds{0})},
    {"fixed pipelines (GPipe-style)", with(sim_routing::fixed, std::chrono::nanoseconds{0})},
  };
  for (auto p : periods)
    if (p != main_t)
      runs.emplace_back("  sweep: stochastic + rebal. T=" + tname(p),
                        with(sim_routing::stochastic, p));
  for (auto& [name, x] : runs) {
    auto r = run_one(name, x);
    if (!r)
      return 2;
    print_row(name, *r);
  }
  fmt::print("  total wall time {:.1f} s; per-run JSON in {}/metrics.jsonl\n",
             std::chrono::duration<double>(clock_type::now() - total0).count(), ctx.out_dir);
  return 0;
}

} // namespace starling::runtime
