#include "runtime/run/swarm_workload.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>
#include <thread>

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "actors/stage/board.hpp"
#include "actors/stage/stage.hpp"
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
    [=](stop_atom, const std::string& trainer) {
      std::lock_guard<std::mutex> g{totals->mtx};
      totals->trainers_done++;
    },
  };
}

/// Mean held-out loss of the model given as one flat parameter vector per stage.
result<double> evaluate(const swarm_options& opts,
                        const std::vector<std::pair<int64_t, int64_t>>& ranges,
                        const std::vector<torch::Tensor>& flat_params,
                        const std::vector<kernels::text_batch>& batches) {
  std::vector<std::shared_ptr<kernels::stage_module>> stages;
  for (size_t s = 0; s < ranges.size(); ++s) {
    auto m = kernels::make_gpt_stage(opts.model, ranges[s].first, ranges[s].second);
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

std::string stage_counts(const std::vector<uint64_t>& counts) {
  std::string out;
  for (auto c : counts)
    out += (out.empty() ? "" : " ") + std::to_string(c);
  return out;
}

} // namespace

void read_options(config_node& n, swarm_options& out) {
  if (n.has("model")) {
    auto m = n.child("model");
    read_int(m, "layers", out.model.layers, 1, 64);
    read_int(m, "width", out.model.width, 8, 4096);
    read_int(m, "heads", out.model.heads, 1, 64);
    read_int(m, "seq_len", out.model.seq_len, 2, 4096);
    read_real(m, "dropout", out.model.dropout, 0.0, 0.9);
    if (out.model.width % out.model.heads != 0)
      m.child("heads").expected(fmt::format("a divisor of width {}", out.model.width));
    m.finish();
  }
  if (!n.has("stages"))
    n.fail("missing required key 'stages' (a list of {peers: [speed, ...]})");
  out.stages.clear();
  for (auto& item : n.child("stages").items()) {
    if (!item.is_map() || !item.has("peers"))
      item.expected("a map {peers: [speed, ...]}");
    std::vector<double> speeds;
    for (auto& p : item.child("peers").items()) {
      auto v = p.as_double();
      if (!(v > 0 && v <= 1))
        p.expected("a speed in (0, 1]");
      speeds.push_back(v);
    }
    if (speeds.empty())
      item.child("peers").expected("at least one peer");
    item.finish();
    out.stages.push_back(speeds);
  }
  if (static_cast<int64_t>(out.stages.size()) > out.model.layers)
    n.child("stages").fail(fmt::format("{} stages need at least as many model layers (have {})",
                                       out.stages.size(), out.model.layers));
  read_int(n, "trainers", out.trainers, 1, 1024);
  read_int(n, "microbatch", out.microbatch, 1, 4096);
  read_int(n, "microbatches_per_trainer", out.microbatches_per_trainer, 1, INT64_MAX);
  read_int(n, "max_inflight", out.max_inflight, 1, 64);
  read_int(n, "local_batch", out.local_batch, 1, INT64_MAX);
  if (n.has("optimizer")) {
    auto o = n.child("optimizer");
    read_choice(o, "kind", out.optimizer.kind, {"adam", "lamb"});
    read_real(o, "lr", out.optimizer.lr, 0.0, 10.0);
    read_real(o, "weight_decay", out.optimizer.weight_decay, 0.0, 1.0);
    read_real(o, "max_grad_norm", out.optimizer.max_grad_norm, 0.0, 1e9);
    o.finish();
  }
  if (n.has("compression")) {
    auto c = n.child("compression");
    auto id = kernels::parse_codec(c.as_string());
    if (!id)
      c.expected("a codec: none | fp16 | bf16 | uniform8 | blockwise8 | quantile8");
    out.compression = *id;
  }
  read_duration(n, "hop_timeout", out.hop_timeout);
  read_duration(n, "preempt_every", out.preempt_every);
  read_duration(n, "restart_delay", out.restart_delay);
  read_int(n, "eval_batches", out.eval_batches, 1, 10000);
  read_int(n, "torch_threads", out.torch_threads, 1, 256);
}

int run_swarm(const experiment_config& cfg, const run_context& ctx) {
  swarm_options opts;
  if (cfg.workload) {
    auto section = *cfg.workload;
    read_options(section, opts);
    section.finish();
  }
  if (ctx.simulate) {
    fmt::print(stderr, "starling: error: the swarm workload runs in local mode; modeled compute "
                       "for simulation is not implemented yet\n");
    return 2;
  }
  torch::set_num_threads(static_cast<int>(opts.torch_threads));
  opts.model.seed = cfg.experiment.seed;
  auto ranges = kernels::even_stage_ranges(opts.model.layers,
                                           static_cast<int64_t>(opts.stages.size()));
  if (!ranges) {
    fmt::print(stderr, "starling: error: {}\n", ranges.error().what);
    return 2;
  }
  kernels::corpus_options co;
  auto data = kernels::load_corpus(co);
  if (!data) {
    fmt::print(stderr, "starling: error: {}\n", data.error().what);
    return 2;
  }
  auto corpus = std::make_shared<const kernels::corpus>(std::move(*data));
  auto held_out = kernels::held_out_batches(*corpus, opts.microbatch, opts.model.seq_len,
                                            opts.eval_batches);
  if (!held_out) {
    fmt::print(stderr, "starling: error: {}\n", held_out.error().what);
    return 2;
  }
  fmt::print("data: {} ({:.1f} MB, {:.1f} MB for training)\n", corpus->source(),
             static_cast<double>(corpus->size()) / 1e6,
             static_cast<double>(corpus->train_size()) / 1e6);
  std::string layout;
  for (size_t s = 0; s < opts.stages.size(); ++s) {
    layout += fmt::format("{}stage {} = blocks [{}, {}) on {} peers (speeds", s == 0 ? "" : "; ", s,
                          (*ranges)[s].first, (*ranges)[s].second, opts.stages[s].size());
    for (auto v : opts.stages[s])
      layout += fmt::format(" {}", v);
    layout += ")";
  }
  fmt::print("model: GPT {} layers, width {}, {} heads, seq {}; {}\n", opts.model.layers,
             opts.model.width, opts.model.heads, opts.model.seq_len, layout);
  std::vector<torch::Tensor> initial(opts.stages.size());
  auto loss0 = evaluate(opts, *ranges, initial, *held_out);
  if (!loss0) {
    fmt::print(stderr, "starling: error: {}\n", loss0.error().what);
    return 2;
  }
  fmt::print("held-out loss before training: {:.4f} (cross-entropy per byte, ln 256 = {:.4f})\n",
             *loss0, std::log(256.0));

  caf::actor_system_config sys_cfg;
  configure_system(sys_cfg, cfg.caf, false);
  caf::actor_system sys{sys_cfg};
  auto out = std::make_shared<jsonl_writer>(ctx.out_dir + "/metrics.jsonl");
  auto totals = std::make_shared<swarm_totals>();
  auto t0 = clock_type::now();
  auto sink = sys.spawn(collector, totals, out, t0);
  auto board = actors::stage::spawn_board(sys, opts.stages.size());

  struct peer_slot {
    uint64_t stage;
    double speed;
    int generation = 0;
    caf::actor handle;
    std::optional<clock_type::time_point> restart_at;
  };
  std::vector<peer_slot> slots;
  auto spawn_peer = [&](peer_slot& slot, size_t index) {
    actors::stage::stage_options so;
    so.stage = slot.stage;
    so.name = fmt::format("s{}p{}g{}", slot.stage, index, slot.generation);
    so.model = opts.model;
    so.begin = (*ranges)[slot.stage].first;
    so.end = (*ranges)[slot.stage].second;
    so.optimizer = opts.optimizer;
    so.local_batch = opts.local_batch;
    so.speed = slot.speed;
    so.download_state = slot.generation > 0;
    so.codec = opts.compression;
    so.seed = cfg.experiment.seed * 1000 + index * 10 + static_cast<uint64_t>(slot.generation);
    slot.handle = actors::stage::spawn_stage(sys, so, board);
  };
  for (size_t s = 0; s < opts.stages.size(); ++s)
    for (auto speed : opts.stages[s])
      slots.push_back(peer_slot{s, speed});
  for (size_t i = 0; i < slots.size(); ++i)
    spawn_peer(slots[i], i);

  std::vector<caf::actor> trainers;
  for (int64_t i = 0; i < opts.trainers; ++i) {
    actors::trainer::trainer_options to;
    to.name = fmt::format("trainer{}", i);
    to.stages = opts.stages.size();
    to.microbatch = opts.microbatch;
    to.seq_len = opts.model.seq_len;
    to.shard = i;
    to.shards = opts.trainers;
    to.microbatches = opts.microbatches_per_trainer;
    to.max_inflight = opts.max_inflight;
    to.hop_timeout = caf::timespan{opts.hop_timeout};
    to.codec = opts.compression;
    to.seed = cfg.experiment.seed * 7919 + static_cast<uint64_t>(i);
    trainers.push_back(actors::trainer::spawn_trainer(sys, to, corpus, board, sink));
  }

  // Preemptions: a Poisson process over the run, each killing one live stage peer, restarted
  // after `restart_delay` with a fresh generation that downloads its state from a live peer.
  std::mt19937_64 rng{cfg.experiment.seed ^ 0x5eedULL};
  auto preempt_mean = std::chrono::duration<double>(opts.preempt_every).count();
  std::exponential_distribution<double> gap{preempt_mean > 0 ? 1.0 / preempt_mean : 1.0};
  double next_preempt = preempt_mean > 0 ? gap(rng) : -1;
  int64_t preemptions = 0;
  std::vector<std::pair<double, std::string>> markers;
  auto total_samples = opts.trainers * opts.microbatches_per_trainer * opts.microbatch;
  auto deadline = t0 + cfg.experiment.duration;
  caf::scoped_actor self{sys};
  bool timed_out = false;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    auto now = clock_type::now();
    auto t = std::chrono::duration<double>(now - t0).count();
    for (size_t i = 0; i < slots.size(); ++i) {
      auto& slot = slots[i];
      if (slot.restart_at && now >= *slot.restart_at) {
        slot.restart_at.reset();
        slot.generation++;
        spawn_peer(slot, i);
        out->write({{"t", t}, {"event", "restart"}, {"stage", slot.stage}, {"peer", i}});
      }
    }
    if (next_preempt >= 0 && t >= next_preempt) {
      next_preempt = t + gap(rng);
      std::vector<size_t> live;
      for (size_t i = 0; i < slots.size(); ++i)
        if (!slots[i].restart_at)
          live.push_back(i);
      if (!live.empty()) {
        auto victim = live[std::uniform_int_distribution<size_t>{0, live.size() - 1}(rng)];
        auto& slot = slots[victim];
        self->send_exit(slot.handle, caf::exit_reason::kill);
        slot.restart_at = now + opts.restart_delay;
        preemptions++;
        markers.emplace_back(t, fmt::format("x s{}", slot.stage));
        out->write({{"t", t}, {"event", "preempt"}, {"stage", slot.stage}, {"peer", victim}});
        fmt::print(stderr, "\n");
        log(log_level::info, "swarm", "preempted peer {} of stage {}; restart in {:.0f} s",
            victim, slot.stage, std::chrono::duration<double>(opts.restart_delay).count());
      }
    }
    std::vector<uint64_t> counts;
    self->request(board, std::chrono::seconds(5), list_atom::value)
      .receive([&](const std::vector<uint64_t>& c) { counts = c; }, [](caf::error&) {});
    int64_t done_trainers = 0;
    {
      std::lock_guard<std::mutex> g{totals->mtx};
      auto rate = t > 0 ? static_cast<double>(totals->samples) / t : 0.0;
      auto left = rate > 0 ? static_cast<double>(total_samples - totals->samples) / rate : 0.0;
      fmt::print(stderr,
                 "\r  {:6.1f} s | {:5}/{} microbatches | loss {:.3f} | {:6.1f} samples/s | "
                 "peers/stage [{}] | retries {} | preempted {} | ~{:.0f} s left   ",
                 t, totals->microbatches, opts.trainers * opts.microbatches_per_trainer,
                 totals->has_loss ? totals->loss_ema : 0.0, rate, stage_counts(counts),
                 totals->retries, preemptions, left);
      done_trainers = totals->trainers_done;
      if (t - (totals->sample_marks.empty() ? 0.0 : totals->sample_marks.back().first) >= 1.0)
        totals->sample_marks.emplace_back(t, totals->samples);
    }
    if (done_trainers >= opts.trainers)
      break;
    if (now >= deadline) {
      timed_out = true;
      break;
    }
  }
  fmt::print(stderr, "\n");
  auto wall = std::chrono::duration<double>(clock_type::now() - t0).count();

  // Final model: one live peer per stage (restart any still-dead one first).
  std::vector<torch::Tensor> finals(opts.stages.size());
  for (uint64_t s = 0; s < opts.stages.size(); ++s) {
    for (int attempt = 0; attempt < 40 && !finals[s].defined(); ++attempt) {
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
      if (!finals[s].defined()) {
        for (size_t i = 0; i < slots.size(); ++i)
          if (slots[i].stage == s && slots[i].restart_at) {
            slots[i].restart_at.reset();
            slots[i].generation++;
            spawn_peer(slots[i], i);
          }
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
    }
  }
  for (auto& slot : slots)
    self->send_exit(slot.handle, caf::exit_reason::user_shutdown);
  for (auto& tr : trainers)
    self->send_exit(tr, caf::exit_reason::user_shutdown);
  self->send_exit(board, caf::exit_reason::user_shutdown);
  self->send_exit(sink, caf::exit_reason::user_shutdown);

  auto loss1 = evaluate(opts, *ranges, finals, *held_out);
  std::lock_guard<std::mutex> g{totals->mtx};
  double first_loss = totals->loss_curve.empty() ? 0 : totals->loss_curve.front().second;
  auto rss = peak_rss_bytes();
  fmt::print("\nswarm summary{}\n", timed_out ? " (stopped at experiment.duration)" : "");
  fmt::print("  {:<34} {}\n", "microbatches completed", totals->microbatches);
  fmt::print("  {:<34} {} of {} requested\n", "samples", totals->samples, total_samples);
  fmt::print("  {:<34} {:.1f} s, {:.1f} samples/s\n", "wall time", wall,
             static_cast<double>(totals->samples) / wall);
  fmt::print("  {:<34} {} ({} hop retries)\n", "preemptions", preemptions, totals->retries);
  fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "training loss (EMA, first -> last)", first_loss,
             totals->loss_ema);
  if (loss1)
    fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "held-out loss (before -> after)", *loss0, *loss1);
  else
    fmt::print("  {:<34} unavailable: {}\n", "held-out loss", loss1.error().what);
  fmt::print("  {:<34} {:.0f} MiB\n", "peak resident memory", static_cast<double>(rss) / 1048576);
  out->write({{"event", "summary"},
              {"samples", totals->samples},
              {"requested", total_samples},
              {"wall_s", wall},
              {"preemptions", preemptions},
              {"retries", totals->retries},
              {"eval_before", *loss0},
              {"eval_after", loss1 ? *loss1 : -1.0},
              {"peak_rss_bytes", rss}});
  plot::line_plot lp;
  lp.title = "SWARM training loss (EMA) with preemptions";
  lp.x_label = "seconds";
  lp.y_label = "cross-entropy per byte";
  lp.lines.push_back({"training loss", totals->loss_curve});
  lp.markers = markers;
  auto loss_plot = ctx.out_dir + "/loss.svg";
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
  auto thr_plot = ctx.out_dir + "/throughput.svg";
  plot::write_svg(tp, thr_plot);
  fmt::print("  {:<34} {}/metrics.jsonl, {}, {}\n", "output", ctx.out_dir, loss_plot, thr_plot);
  return loss1 && *loss1 < *loss0 ? 0 : 1;
}

} // namespace starling::runtime
