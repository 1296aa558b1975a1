#include "runtime/run/swarm_workload.hpp"
#include "runtime/run/swarm_sim.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "actors/stage/board.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/supervisor/supervisor.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "kernels/flat.hpp"
#include "kernels/models/stage_module.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/log/log.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/node/node.hpp"
#include "runtime/plot/svg.hpp"

namespace starling::runtime {

namespace {

using clock_type = std::chrono::steady_clock;

/// What the collector actor accumulates for the progress line and the summary.
struct swarm_totals {
  std::mutex mtx;
  int64_t microbatches = 0;
  int64_t samples = 0;
  int64_t retries = 0;
  int64_t trainers_done = 0;
  double loss_ema = 0;
  bool has_loss = false;
  std::vector<std::pair<double, double>> loss_curve;       // (seconds, loss EMA)
  std::vector<std::pair<double, int64_t>> sample_marks;     // (seconds, cumulative samples)
};

caf::behavior collector(caf::event_based_actor* self, std::shared_ptr<swarm_totals> totals,
                        std::shared_ptr<jsonl_writer> out, clock_type::time_point t0) {
  return {
    [=](report_atom, const std::string& trainer, double loss, int64_t samples, int64_t retries,
        double seconds) {
      auto t = std::chrono::duration<double>(clock_type::now() - t0).count();
      {
        std::lock_guard<std::mutex> g{totals->mtx};
        totals->microbatches++;
        totals->samples += samples;
        totals->retries += retries;
        totals->loss_ema = totals->has_loss ? 0.95 * totals->loss_ema + 0.05 * loss : loss;
        totals->has_loss = true;
        totals->loss_curve.emplace_back(t, totals->loss_ema);
        totals->sample_marks.emplace_back(t, totals->samples);
      }
      out->write({{"t", t},
                  {"event", "microbatch"},
                  {"trainer", trainer},
                  {"loss", loss},
                  {"samples", samples},
                  {"retries", retries},
                  {"latency_s", seconds}});
    },
    [=](respawn_atom, uint64_t, const std::string& peer, int generation) {
      auto t = std::chrono::duration<double>(clock_type::now() - t0).count();
      out->write({{"t", t}, {"event", "restart"}, {"peer", peer}, {"generation", generation}});
    },
    [=](stop_atom, const std::string& trainer) {
      std::lock_guard<std::mutex> g{totals->mtx};
      totals->trainers_done++;
    },
  };
}

/// Mean held-out loss of the model given as one flat parameter vector per stage.
result<double> evaluate(const kernels::gpt_config& model,
                        const std::vector<std::pair<int64_t, int64_t>>& ranges,
                        const std::vector<torch::Tensor>& flat_params,
                        const std::vector<kernels::text_batch>& batches) {
  std::vector<std::shared_ptr<kernels::stage_module>> stages;
  for (size_t s = 0; s < ranges.size(); ++s) {
    auto m = kernels::make_gpt_stage(model, ranges[s].first, ranges[s].second);
    if (!m)
      return m.error();
    if (flat_params[s].defined()) {
      torch::NoGradGuard guard;
      auto params = (*m)->ordered_parameters();
      if (auto st = kernels::unflatten_parameters(flat_params[s], params); !st)
        return fail(st.what());
    }
    (*m)->eval();
    stages.push_back(*m);
  }
  torch::NoGradGuard guard;
  double total = 0;
  for (auto& b : batches) {
    auto x = b.inputs;
    for (size_t s = 0; s < stages.size(); ++s)
      x = stages[s]->compute(x, b.targets, 0);
    total += x.item<double>();
  }
  return total / static_cast<double>(batches.size());
}

/// What the live stage peers report (`(status_atom)`), summed per stage.
struct stage_report {
  uint64_t peers = 0;
  uint64_t max_steps = 0;  // the stage's global step (averaging) or its most-stepped peer
  uint64_t samples = 0;    // processed by the live peers (a preempted peer's count is gone)
  uint64_t rounds = 0;
  uint64_t averaged = 0;
  uint64_t no_partner = 0;
  uint64_t failed = 0;
  uint64_t caught_up = 0;
  uint64_t downloads = 0; // state downloads of the live peers (initial and catch-ups)
  uint64_t donors = 0;    // summed over those downloads
};

/// Asks every live peer of every stage (found through the board) for its counters.
std::vector<stage_report> stage_reports(caf::scoped_actor& self, const caf::actor& board,
                                        size_t stages, std::chrono::milliseconds timeout) {
  std::vector<stage_report> out(stages);
  for (uint64_t s = 0; s < stages; ++s) {
    std::vector<caf::actor> peers;
    self->request(board, timeout, get_atom::value, s)
      .receive([&](const std::vector<std::string>&, const std::vector<caf::actor>& p) { peers = p; },
               [](caf::error&) {});
    for (auto& p : peers)
      self->request(p, timeout, status_atom::value)
        .receive(
          [&](const std::vector<uint64_t>& v) {
            if (v.size() < 8)
              return;
            auto& r = out[s];
            r.peers++;
            r.max_steps = std::max(r.max_steps, v[0]);
            r.samples += v[1];
            r.rounds += v[2];
            r.averaged += v[3];
            r.no_partner += v[4];
            r.failed += v[5];
            r.caught_up += v[7];
            if (v.size() >= 10) {
              r.downloads += v[8];
              r.donors += v[9];
            }
          },
          [](caf::error&) {});
  }
  return out;
}

/// The pipeline's global step: the least advanced stage's.
uint64_t global_step(const std::vector<stage_report>& reports) {
  uint64_t step = UINT64_MAX;
  for (auto& r : reports)
    if (r.peers > 0)
      step = std::min(step, r.max_steps);
  return step == UINT64_MAX ? 0 : step;
}

std::string stage_counts(const std::vector<uint64_t>& counts) {
  std::string out;
  for (auto c : counts)
    out += (out.empty() ? "" : " ") + std::to_string(c);
  return out;
}

} // namespace

int run_swarm(const experiment_config& cfg, const run_context& ctx) {
  if (ctx.simulate)
    return run_swarm_sim(cfg, ctx); // modeled compute in the virtual-time world (swarm_sim.hpp)
  swarm_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    graph::read_swarm_graph(section, opts);
    section.finish();
  }
  opts.seed = cfg.experiment.seed;
  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg.caf, false);
  caf::actor_system sys{sys_cfg};
  swarm_env env;
  env.sys = &sys;
  env.board = actors::stage::spawn_board(sys, opts.stages.size());
  env.roles = graph::place(opts, 0, 1);
  env.register_actor = [](const std::string&, const caf::actor&) {};
  if (opts.averaging.enabled()) {
    // Averaging needs what a cluster node has: a DHT (one node here: every record is local), a
    // directory of named actors and a resolver for `host:port/name` addresses (this process's
    // endpoint only: the system has no middleman, so nothing leaves the process).
    env.endpoint = "127.0.0.1:1";
    auto directory = spawn_directory(sys);
    env.resolver = spawn_cluster_resolver(sys, directory, env.endpoint, std::chrono::seconds(5));
    actors::dht::dht_options d;
    d.address = env.endpoint + "/dht";
    d.id = actors::dht::identity::generate();
    env.dht = actors::dht::spawn_dht(sys, env.resolver, d);
    caf::anon_send(directory, put_atom::value, std::string{"dht"}, env.dht);
    env.register_actor = [directory](const std::string& name, const caf::actor& a) {
      caf::anon_send(directory, put_atom::value, name, a);
    };
    auto rc = drive_swarm(cfg, opts, ctx.out_dir, env);
    for (auto& a : {env.dht, env.resolver, directory})
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    return rc;
  }
  return drive_swarm(cfg, opts, ctx.out_dir, env);
}

int drive_swarm(const experiment_config& cfg, const swarm_options& opts, const std::string& out_dir,
                swarm_env& env) {
  auto& sys = *env.sys;
  auto board = env.board;
  bool has_trainers = !env.roles.trainers.empty();
  torch::set_num_threads(static_cast<int>(opts.torch_threads));
  auto model = opts.model;
  model.seed = opts.seed;
  auto ranges = graph::stage_ranges(opts);
  if (!ranges) {
    fmt::print(stderr, "starling: error: {}\n", ranges.error().what);
    return 2;
  }
  std::string layout;
  for (size_t s = 0; s < opts.stages.size(); ++s) {
    layout += fmt::format("{}stage {} = blocks [{}, {}) on {} peers (speeds", s == 0 ? "" : "; ", s,
                          (*ranges)[s].first, (*ranges)[s].second, opts.stages[s].speeds.size());
    for (auto v : opts.stages[s].speeds)
      layout += fmt::format(" {}", v);
    layout += ")";
  }
  fmt::print("model: GPT {} layers, width {}, {} heads, seq {}; {}\n", model.layers, model.width,
             model.heads, model.seq_len, layout);
  // Trainers need the data and the held-out batches; stage-only nodes do not.
  std::shared_ptr<const kernels::corpus> corpus;
  std::vector<kernels::text_batch> held_out;
  double loss0 = 0;
  if (has_trainers) {
    kernels::corpus_options co;
    auto data = kernels::load_corpus(co);
    if (!data) {
      fmt::print(stderr, "starling: error: {}\n", data.error().what);
      return 2;
    }
    corpus = std::make_shared<const kernels::corpus>(std::move(*data));
    auto batches = kernels::held_out_batches(*corpus, opts.microbatch, model.seq_len,
                                             opts.eval_batches);
    if (!batches) {
      fmt::print(stderr, "starling: error: {}\n", batches.error().what);
      return 2;
    }
    held_out = std::move(*batches);
    fmt::print("data: {} ({:.1f} MB, {:.1f} MB for training)\n", corpus->source(),
               static_cast<double>(corpus->size()) / 1e6,
               static_cast<double>(corpus->train_size()) / 1e6);
    std::vector<torch::Tensor> initial(opts.stages.size());
    auto l0 = evaluate(model, *ranges, initial, held_out);
    if (!l0) {
      fmt::print(stderr, "starling: error: {}\n", l0.error().what);
      return 2;
    }
    loss0 = *l0;
    fmt::print("held-out loss before training: {:.4f} (cross-entropy per byte, ln 256 = {:.4f})\n",
               loss0, std::log(256.0));
  }
  std::fflush(stdout);

  auto out = std::make_shared<jsonl_writer>(out_dir + "/metrics.jsonl");
  auto totals = std::make_shared<swarm_totals>();
  auto t0 = clock_type::now();
  auto sink = sys.spawn(collector, totals, out, t0);

  // The node's stage peers live under a supervisor, which respawns a preempted one after
  // `restart_delay` as a new generation (that downloads its state before serving).
  auto all_slots = graph::peer_slots(opts);
  std::vector<actors::supervisor::child_spec> children;
  std::vector<uint64_t> child_stage;
  auto ranges_v = *ranges;
  auto register_actor = env.register_actor;
  for (auto index : env.roles.peers) {
    auto stage = all_slots[index].first;
    auto speed = all_slots[index].second;
    actors::supervisor::child_spec spec;
    spec.name = fmt::format("s{}p{}", stage, index);
    spec.restart_delay = std::chrono::duration_cast<caf::timespan>(opts.restart_delay);
    auto avg = opts.averaging;
    auto stage_peers = opts.stages[stage].speeds.size();
    auto prefix = "swarm/" + cfg.experiment.name;
    auto dht = env.dht;
    auto resolver = env.resolver;
    auto endpoint = env.endpoint;
    auto cluster = env.cluster;
    spec.spawn = [&sys, opts, model, ranges_v, board, register_actor, index, stage, speed, avg,
                  stage_peers, prefix, dht, resolver, endpoint, cluster](int generation) {
      actors::stage::stage_options so;
      so.stage = stage;
      so.name = fmt::format("s{}p{}g{}", stage, index, generation);
      so.model = kernels::gpt_model(model);
      so.begin = ranges_v[stage].first;
      so.end = ranges_v[stage].second;
      so.optimizer = opts.optimizer;
      so.local_batch = opts.local_batch;
      so.speed = speed;
      so.download_state = generation > 0;
      so.codec = opts.compression;
      so.seed = opts.seed * 1000 + index * 10 + static_cast<uint64_t>(generation);
      caf::actor averager;
      if (avg.enabled()) {
        // One averager per stage peer (a node may host peers of several stages, each averaging
        // on its own schedule); it lives and dies with its peer.
        actors::averager::averager_options ao;
        auto avg_name = "avg-" + so.name;
        ao.address = endpoint + "/" + avg_name;
        ao.target_group_size = static_cast<uint32_t>(stage_peers);
        ao.key_prefix = prefix + "/avg/";
        ao.matchmaking_window = caf::timespan{avg.matchmaking_window};
        ao.poll_interval = std::min(caf::timespan{avg.progress_period},
                                    caf::timespan{avg.matchmaking_window / 4});
        ao.round_timeout = caf::timespan{avg.round_timeout};
        ao.codec = avg.codec;
        if (cluster) // chunks between nodes take the averagers' data plane (in-process: BASP-free)
          ao.data_host = endpoint.substr(0, endpoint.rfind(':'));
        averager = actors::averager::spawn_averager(sys, dht, resolver, ao);
        register_actor(avg_name, averager);
        so.averaging.averager = averager;
        so.averaging.dht = dht;
        so.averaging.prefix = prefix;
        so.averaging.target_batch = avg.target_batch;
        so.averaging.progress_period = caf::timespan{avg.progress_period};
        so.averaging.average_timeout =
          caf::timespan{avg.matchmaking_window + ao.join_grace + avg.round_timeout
                        + std::chrono::seconds(5)};
      }
      auto peer = actors::stage::spawn_stage(sys, so, board);
      if (averager)
        peer->attach_functor([averager](const caf::error&) {
          caf::anon_send_exit(averager, caf::exit_reason::user_shutdown);
        });
      register_actor(so.name, peer);
      return peer;
    };
    children.push_back(std::move(spec));
    child_stage.push_back(stage);
  }
  auto supervisor = actors::supervisor::spawn_supervisor(sys, std::move(children), sink);
  std::vector<std::optional<clock_type::time_point>> down_until(child_stage.size());

  std::vector<caf::actor> trainers;
  for (auto i : env.roles.trainers) {
    actors::trainer::trainer_options to;
    to.name = fmt::format("trainer{}", i);
    to.stages = opts.stages.size();
    to.microbatch = opts.microbatch;
    to.seq_len = model.seq_len;
    to.shard = i;
    to.shards = opts.trainers;
    to.microbatches = opts.microbatches_per_trainer;
    to.max_inflight = opts.max_inflight;
    to.hop_timeout = caf::timespan{opts.hop_timeout};
    to.codec = opts.compression;
    to.seed = opts.seed * 7919 + static_cast<uint64_t>(i);
    trainers.push_back(actors::trainer::spawn_trainer(sys, to, corpus, board, sink));
  }
  fmt::print("this node: {} stage peers, {} trainers\n", child_stage.size(), trainers.size());
  std::fflush(stdout);

  // Preemptions: a Poisson process over the run, each killing one live local stage peer, restarted
  // after `restart_delay` with a fresh generation that downloads its state from a live peer.
  std::mt19937_64 rng{opts.seed ^ 0x5eedULL ^ (env.roles.peers.empty() ? 0 : env.roles.peers[0])};
  auto preempt_mean = std::chrono::duration<double>(opts.preempt_every).count();
  std::exponential_distribution<double> gap{preempt_mean > 0 ? 1.0 / preempt_mean : 1.0};
  double next_preempt = preempt_mean > 0 && !child_stage.empty() ? gap(rng) : -1;
  int64_t preemptions = 0;
  std::vector<std::pair<double, std::string>> markers;
  auto total_samples = static_cast<int64_t>(trainers.size()) * opts.microbatches_per_trainer
                       * opts.microbatch;
  auto total_microbatches = static_cast<int64_t>(trainers.size()) * opts.microbatches_per_trainer;
  auto deadline = t0 + cfg.experiment.duration;
  caf::scoped_actor self{sys};
  bool timed_out = false;
  bool stopped = false;
  bool tty = ::isatty(2) != 0;
  double next_log_line = 0;
  double next_status = 0;
  uint64_t step = 0;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    auto now = clock_type::now();
    auto t = std::chrono::duration<double>(now - t0).count();
    if (next_preempt >= 0 && t >= next_preempt) {
      next_preempt = t + gap(rng);
      std::vector<size_t> live;
      for (size_t i = 0; i < down_until.size(); ++i)
        if (!down_until[i] || now >= *down_until[i])
          live.push_back(i);
      if (!live.empty()) {
        auto victim = live[std::uniform_int_distribution<size_t>{0, live.size() - 1}(rng)];
        self->send(supervisor, preempt_atom::value, static_cast<uint64_t>(victim));
        down_until[victim] = now + opts.restart_delay;
        preemptions++;
        markers.emplace_back(t, fmt::format("x s{}", child_stage[victim]));
        out->write({{"t", t},
                    {"event", "preempt"},
                    {"stage", child_stage[victim]},
                    {"peer", env.roles.peers[victim]}});
        if (has_trainers && tty)
          fmt::print(stderr, "\n");
        log(log_level::info, "swarm", "preempted peer {} of stage {}; restart in {:.0f} s",
            env.roles.peers[victim], child_stage[victim],
            std::chrono::duration<double>(opts.restart_delay).count());
      }
    }
    if (env.stop_requested && env.stop_requested()) {
      stopped = true;
      break;
    }
    if (!has_trainers) {
      if (now >= deadline && !env.cluster) {
        timed_out = true;
        break;
      }
      continue; // a stage-only cluster node serves until it is told to stop
    }
    std::vector<uint64_t> counts;
    self->request(board, std::chrono::seconds(5), list_atom::value)
      .receive([&](const std::vector<uint64_t>& c) { counts = c; }, [](caf::error&) {});
    if (t >= next_status) {
      next_status = t + 2.0;
      step = global_step(stage_reports(self, board, opts.stages.size(),
                                       std::chrono::milliseconds(500)));
    }
    int64_t done_trainers = 0;
    {
      std::lock_guard<std::mutex> g{totals->mtx};
      auto rate = t > 0 ? static_cast<double>(totals->samples) / t : 0.0;
      auto left = rate > 0 ? static_cast<double>(total_samples - totals->samples) / rate : 0.0;
      // One line updated in place on a terminal; a line every 2 s into a log or pipe.
      if (tty || t >= next_log_line) {
        next_log_line = t + 2.0;
        fmt::print(stderr,
                   "{}  {:6.1f} s | step {:3} | {:5}/{} microbatches | loss {:.3f} | "
                   "{:6.1f} samples/s | peers/stage [{}] | retries {} | preempted {} | "
                   "~{:.0f} s left   {}",
                   tty ? "\r" : "", t, step, totals->microbatches, total_microbatches,
                   totals->has_loss ? totals->loss_ema : 0.0, rate, stage_counts(counts),
                   totals->retries, preemptions, left, tty ? "" : "\n");
      }
      done_trainers = totals->trainers_done;
      if (t - (totals->sample_marks.empty() ? 0.0 : totals->sample_marks.back().first) >= 1.0)
        totals->sample_marks.emplace_back(t, totals->samples);
    }
    if (done_trainers >= static_cast<int64_t>(trainers.size()))
      break;
    if (now >= deadline) {
      timed_out = true;
      break;
    }
  }
  auto wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  auto shut_down = [&] {
    self->send_exit(supervisor, caf::exit_reason::user_shutdown);
    for (auto& tr : trainers)
      self->send_exit(tr, caf::exit_reason::user_shutdown);
    self->send_exit(sink, caf::exit_reason::user_shutdown);
  };
  if (!has_trainers) {
    shut_down();
    fmt::print("swarm node stopping{}: {} stage peers, {} preemptions, {:.1f} s\n",
               stopped ? " (signal)" : "", child_stage.size(), preemptions, wall);
    return 0;
  }
  if (tty)
    fmt::print(stderr, "\n");

  // Final model: one live peer per stage (restart any still-dead local one first).
  std::vector<torch::Tensor> finals(opts.stages.size());
  for (uint64_t s = 0; s < opts.stages.size(); ++s) {
    for (int attempt = 0; attempt < 80 && !finals[s].defined(); ++attempt) {
      self->request(board, std::chrono::seconds(5), get_atom::value, s)
        .receive(
          [&](const std::vector<std::string>&, const std::vector<caf::actor>& peers) {
            for (auto& p : peers) {
              self->request(p, std::chrono::seconds(10), get_atom::value, state_atom::value)
                .receive([&](const messages::stage_state& st) { finals[s] = st.params.tensor; },
                         [](caf::error&) {});
              if (finals[s].defined())
                break;
            }
          },
          [](caf::error&) {});
      if (!finals[s].defined())
        std::this_thread::sleep_for(std::chrono::milliseconds(250)); // the supervisor respawns
    }
  }
  auto reports = stage_reports(self, board, opts.stages.size(), std::chrono::seconds(5));
  shut_down();

  auto loss1 = evaluate(model, *ranges, finals, held_out);
  std::lock_guard<std::mutex> g{totals->mtx};
  double first_loss = totals->loss_curve.empty() ? 0 : totals->loss_curve.front().second;
  auto rss = peak_rss_bytes();
  fmt::print("\nswarm summary{}\n",
             timed_out ? " (stopped at experiment.duration)" : stopped ? " (stopped by signal)" : "");
  fmt::print("  {:<34} {}\n", "microbatches completed", totals->microbatches);
  fmt::print("  {:<34} {} of {} requested\n", "samples", totals->samples, total_samples);
  fmt::print("  {:<34} {:.1f} s, {:.1f} samples/s\n", "wall time", wall,
             static_cast<double>(totals->samples) / wall);
  fmt::print("  {:<34} {} ({} hop retries)\n", "preemptions", preemptions, totals->retries);
  fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "training loss (EMA, first -> last)", first_loss,
             totals->loss_ema);
  std::string steps_text;
  for (auto& r : reports)
    steps_text += fmt::format("{}{}", steps_text.empty() ? "" : " ", r.max_steps);
  if (opts.averaging.enabled()) {
    // Samples per global step: every completed sample went through every stage once.
    std::string batch_text;
    stage_report sum;
    for (auto& r : reports) {
      batch_text += fmt::format("{}{:.0f}", batch_text.empty() ? "" : " ",
                                r.max_steps > 0 ? static_cast<double>(totals->samples)
                                                      / static_cast<double>(r.max_steps)
                                                : 0.0);
      sum.rounds += r.rounds;
      sum.averaged += r.averaged;
      sum.no_partner += r.no_partner;
      sum.failed += r.failed;
      sum.caught_up += r.caught_up;
    }
    fmt::print("  {:<34} [{}] (target batch {}; [{}] samples per step on average)\n",
               "global steps per stage", steps_text, opts.averaging.target_batch, batch_text);
    fmt::print("  {:<34} {} rounds of live peers: {} averaged, {} without partner, {} failed; "
               "{} catch-ups\n",
               "gradient averaging", sum.rounds, sum.averaged, sum.no_partner, sum.failed,
               sum.caught_up);
  } else {
    fmt::print("  {:<34} [{}] (local batch {}, parameters gossiped)\n",
               "optimizer steps (most per stage)", steps_text, opts.local_batch);
  }
  {
    uint64_t downloads = 0, donors = 0;
    for (auto& r : reports) {
      downloads += r.downloads;
      donors += r.donors;
    }
    fmt::print("  {:<34} {} by live peers, from {:.1f} donors on average\n", "state downloads",
               downloads,
               downloads > 0 ? static_cast<double>(donors) / static_cast<double>(downloads) : 0.0);
  }
  if (loss1)
    fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "held-out loss (before -> after)", loss0, *loss1);
  else
    fmt::print("  {:<34} unavailable: {}\n", "held-out loss", loss1.error().what);
  fmt::print("  {:<34} {:.0f} MiB\n", "peak resident memory", static_cast<double>(rss) / 1048576);
  out->write({{"event", "summary"},
              {"samples", totals->samples},
              {"requested", total_samples},
              {"wall_s", wall},
              {"preemptions", preemptions},
              {"retries", totals->retries},
              {"eval_before", loss0},
              {"eval_after", loss1 ? *loss1 : -1.0},
              {"peak_rss_bytes", rss}});
  plot::line_plot lp;
  lp.title = "SWARM training loss (EMA) with preemptions";
  lp.x_label = "seconds";
  lp.y_label = "cross-entropy per byte";
  lp.lines.push_back({"training loss", totals->loss_curve});
  lp.markers = markers;
  auto loss_plot = out_dir + "/loss.svg";
  plot::write_svg(lp, loss_plot);
  plot::line_plot tp;
  tp.title = "SWARM throughput with preemptions";
  tp.x_label = "seconds";
  tp.y_label = "samples / s (5 s window)";
  plot::series thr{"throughput", {}};
  auto& marks = totals->sample_marks;
  for (size_t i = 0, j = 0; i < marks.size(); ++i) {
    while (marks[i].first - marks[j].first > 5.0)
      ++j;
    if (marks[i].first - marks[j].first > 0.5)
      thr.points.emplace_back(marks[i].first,
                              static_cast<double>(marks[i].second - marks[j].second)
                                / (marks[i].first - marks[j].first));
  }
  tp.lines.push_back(thr);
  tp.markers = markers;
  auto thr_plot = out_dir + "/throughput.svg";
  plot::write_svg(tp, thr_plot);
  fmt::print("  {:<34} {}/metrics.jsonl, {}, {}\n", "output", out_dir, loss_plot, thr_plot);
  std::fflush(stdout);
  return loss1 && *loss1 < loss0 ? 0 : 1;
}

int run_swarm_node(const experiment_config& cfg, node& nd, const cluster_context& ctx) {
  swarm_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    graph::read_swarm_graph(section, opts);
    section.finish();
  }
  opts.seed = cfg.experiment.seed;
  if (ctx.count < 1 || ctx.index >= ctx.count) {
    fmt::print(stderr, "starling: error: --index {} is not below --nodes {}\n", ctx.index,
               ctx.count);
    return 2;
  }
  auto& sys = nd.system();
  actors::dht::dht_options d;
  d.address = nd.endpoint() + "/dht";
  d.id = actors::dht::identity::generate();
  for (auto& j : ctx.join)
    d.bootstrap.push_back(j + "/dht");
  auto dht = actors::dht::spawn_dht(sys, nd.resolver(), d);
  nd.register_actor("dht", dht);
  actors::stage::dht_board_options b;
  b.prefix = "swarm/" + cfg.experiment.name;
  b.endpoint = nd.endpoint();
  b.stages = opts.stages.size();
  auto board = actors::stage::spawn_dht_board(sys, dht, nd.resolver(), b);
  nd.register_actor("board", board);
  swarm_env env;
  env.sys = &sys;
  env.board = board;
  env.roles = graph::place(opts, ctx.index, ctx.count);
  env.cluster = true;
  auto directory = nd.directory();
  env.register_actor = [directory](const std::string& name, const caf::actor& a) {
    caf::anon_send(directory, put_atom::value, name, a); // dies with the supervisor, not the node
  };
  env.stop_requested = ctx.stop;
  env.dht = dht;
  env.resolver = nd.resolver();
  env.endpoint = nd.endpoint();
  fmt::print("swarm node {} of {}: {} stage peers, {} trainers\n", ctx.index, ctx.count,
             env.roles.peers.size(), env.roles.trainers.size());
  std::fflush(stdout);
  return drive_swarm(cfg, opts, ctx.out_dir, env);
}

} // namespace starling::runtime
