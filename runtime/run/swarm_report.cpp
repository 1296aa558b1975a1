// The swarm kind's reporters: the progress line, summary and plots of a training run (local and
// cluster mode), and the throughput-against-the-bound report of a simulated run.
#include "runtime/run/swarm.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "actors/stage/checkpoint.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/wiring.hpp"
#include "kernels/data/batch_progress.hpp"
#include "kernels/data/corpus.hpp"
#include "kernels/flat.hpp"
#include "kernels/data/token_source.hpp"
#include "kernels/models/registry.hpp"
#include "kernels/models/stage_module.hpp"
#include "kernels/models/torchscript.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/experiment/final_model.hpp"
#include "runtime/metrics/loss_bursts.hpp"
#include "runtime/metrics/metrics.hpp"
#include "runtime/plot/svg.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

double secs(nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

/// The instance index of `peers.7` (or -1).
long peer_slot(const std::string& name) {
  if (name.rfind("peers.", 0) != 0)
    return -1;
  char* end = nullptr;
  auto v = std::strtol(name.c_str() + 6, &end, 10);
  return *end == '\0' ? v : -1;
}

/// The model's stages with one flat parameter vector per stage (undefined: the seeded or
/// scripted initialization) and, when given, each stage's downloaded state's buffers, in
/// evaluation mode.
result<std::vector<std::shared_ptr<kernels::stage_module>>>
build_model(const swarm_setup& s, const std::vector<torch::Tensor>& flat,
            const std::vector<messages::stage_state>& states = {}) {
  auto models = kernels::model_registry::builtins();
  auto spec = s.graph.model_spec();
  std::vector<std::shared_ptr<kernels::stage_module>> stages;
  for (size_t k = 0; k < s.ranges.size(); ++k) {
    auto m = models->make_stage(spec, s.ranges[k].first, s.ranges[k].second);
    if (!m)
      return m.error();
    if (flat[k].defined()) {
      torch::NoGradGuard guard;
      auto params = (*m)->ordered_parameters();
      if (auto st = kernels::unflatten_parameters(flat[k], params); !st)
        return fail(st.what());
    }
    if (k < states.size()) {
      auto& st = states[k];
      auto flat_of = [](const messages::tensor_msg& m) {
        return m.tensor.defined() ? m.tensor.reshape({-1}) : torch::Tensor{};
      };
      auto b = kernels::split_buffers((*m)->buffers(true));
      if (auto r = kernels::load_buffers(b, flat_of(st.buffers), flat_of(st.int_buffers)); !r)
        return fail(fmt::format("stage {}: {}", k, r.what()));
    }
    (*m)->eval();
    stages.push_back(*m);
  }
  return stages;
}

/// Mean held-out loss of `stages` over `batches`.
result<double> evaluate(const std::vector<std::shared_ptr<kernels::stage_module>>& stages,
                        const std::vector<kernels::text_batch>& batches) {
  torch::NoGradGuard guard;
  double total = 0;
  try {
    for (auto& b : batches) {
      auto x = b.inputs;
      for (auto& st : stages)
        x = st->compute(x, b.targets, 0);
      total += x.item<double>();
    }
  } catch (const std::exception& e) {
    return fail(fmt::format("the held-out evaluation failed: {}", e.what()));
  }
  return total / static_cast<double>(batches.size());
}

/// Mean held-out loss of the model given as one flat parameter vector per stage.
result<double> evaluate(const swarm_setup& s, const std::vector<torch::Tensor>& flat,
                        const std::vector<kernels::text_batch>& batches) {
  auto stages = build_model(s, flat);
  if (!stages)
    return stages.error();
  return evaluate(*stages, batches);
}

/// Held-out batches of a token run: the first `eval_batches` x `microbatch` windows of the
/// held-out token file (or of the training file when there is none), in order.
result<std::vector<kernels::text_batch>> held_out_tokens(const graph::swarm_graph& g) {
  kernels::token_source_options o = g.data.tokens;
  o.seq_len = g.model.seq_len;
  o.file.vocab_size = static_cast<uint64_t>(g.model.vocab);
  if (!g.data.eval_path.empty())
    o.file.path = g.data.eval_path;
  auto src = kernels::token_source::make(o);
  if (!src)
    return src.error();
  std::vector<kernels::text_batch> out;
  uint64_t next = 0;
  for (int64_t b = 0; b < g.eval_batches; ++b) {
    std::vector<uint64_t> ids;
    for (int64_t i = 0; i < g.microbatch && next < (*src)->size(); ++i)
      ids.push_back(next++);
    if (static_cast<int64_t>(ids.size()) < g.microbatch)
      break;
    auto batch = (*src)->batch(ids);
    if (!batch)
      return batch.error();
    out.push_back(kernels::text_batch{batch->inputs, batch->targets});
  }
  if (out.empty())
    return fail(fmt::format("{}: shorter than one held-out batch of {} windows", o.file.path,
                            g.microbatch));
  return out;
}

/// Counters of the live peers of a stage (`(status_atom)` replies summed).
struct stage_report {
  uint64_t peers = 0;
  uint64_t max_steps = 0;
  uint64_t rounds = 0, averaged = 0, no_partner = 0, failed = 0, caught_up = 0;
  /// State rounds (resyncs after a lone step) started and loaded.
  uint64_t state_rounds = 0, state_loaded = 0;
  uint64_t downloads = 0, donors = 0;
  /// The peer whose parameters stand for the stage in the final model, and every live peer's
  /// optimizer steps and distance to it, for the summary.
  std::string chosen;
  std::string steps_of_peers;
  /// Exactly-once gradients: confirmed and applied, dropped unconfirmed (lost work).
  uint64_t applied = 0, lost = 0;
};

const char* const no_stage_state = "a stage had neither a live peer nor a checkpoint at the end";

class swarm_reporter : public reporter {
public:
  explicit swarm_reporter(std::shared_ptr<const swarm_setup> s) : s_(std::move(s)) {}

  void start(const run_info& info) override {
    info_ = info;
    auto& g = s_->graph;
    read_earlier_progress();
    std::string layout;
    for (size_t k = 0; k < g.stages.size(); ++k) {
      layout += fmt::format("{}stage {} = blocks [{}, {}) on {} peers (speeds", k == 0 ? "" : "; ",
                            k, s_->ranges[k].first, s_->ranges[k].second, g.stages[k].speeds.size());
      for (auto v : g.stages[k].speeds)
        layout += fmt::format(" {}", v);
      layout += ")";
    }
    fmt::print("model: {}; {}\n", g.describe_model(), layout);
    if (g.data.kind == "tokens") {
      auto batches = held_out_tokens(g);
      if (!batches) {
        fmt::print(stderr, "starling: warning: no held-out evaluation: {}\n",
                   batches.error().what);
      } else {
        held_out_ = std::move(*batches);
        fmt::print("data: tokens {} (held out: the first {} windows of {})\n",
                   g.data.tokens.file.path, held_out_.size() * static_cast<size_t>(g.microbatch),
                   g.data.eval_path.empty() ? g.data.tokens.file.path : g.data.eval_path);
      }
    } else {
      kernels::corpus_options co;
      auto data = kernels::load_corpus(co);
      if (!data) {
        fmt::print(stderr, "starling: warning: no held-out evaluation: {}\n", data.error().what);
      } else {
        auto batches =
          kernels::held_out_batches(*data, g.microbatch, g.model.seq_len, g.eval_batches);
        if (batches) {
          held_out_ = std::move(*batches);
          fmt::print("data: {} ({:.1f} MB, {:.1f} MB for training)\n", data->source(),
                     static_cast<double>(data->size()) / 1e6,
                     static_cast<double>(data->train_size()) / 1e6);
        }
      }
    }
    if (!held_out_.empty()) {
      auto l0 = evaluate(*s_, std::vector<torch::Tensor>(s_->ranges.size()), held_out_);
      if (l0)
        loss0_ = *l0;
      else
        fmt::print(stderr, "starling: warning: {}\n", l0.error().what);
      fmt::print("held-out loss before training: {:.4f} (cross-entropy per {}, ln {} = {:.4f})\n",
                 loss0_, g.data.kind == "tokens" ? "token" : "byte", g.model.vocab,
                 std::log(static_cast<double>(g.model.vocab)));
    }
    std::fflush(stdout);
  }

  void on_metric(const metric_record& m) override {
    if (m.kind == "microbatch") {
      microbatches_++;
      // A trainer's batch numbers name its samples (a pure function of seed, shard and batch):
      // a batch seen twice would be samples trained twice.
      auto batch = static_cast<uint64_t>(m.value("batch", -1));
      if (!batches_[m.source].insert(batch).second)
        repeated_++;
      else if (auto e = earlier_.find(m.source); e != earlier_.end() && e->second.count(batch))
        redone_++;
      if (microbatches_ == 1)
        first_batch_ = {m.t, static_cast<int64_t>(m.value("samples"))};
      samples_ += static_cast<int64_t>(m.value("samples"));
      retries_ += static_cast<int64_t>(m.value("retries"));
      auto loss = m.value("loss");
      bursts_.add(m.t, loss);
      ema_ = has_loss_ ? 0.95 * ema_ + 0.05 * loss : loss;
      has_loss_ = true;
      loss_curve_.emplace_back(m.t, ema_);
      if (marks_.empty() || m.t - marks_.back().first >= 1.0)
        marks_.emplace_back(m.t, samples_);
    } else if (m.kind == "done") {
      done_++;
    } else if (m.kind == "fault" && peer_slot(m.label("instance")) >= 0) {
      preemptions_++;
      auto slot = static_cast<size_t>(peer_slot(m.label("instance")));
      markers_.emplace_back(m.t, fmt::format("x s{}", slot < s_->slots.size() ? s_->slots[slot].first : 0));
    } else if (m.kind == "restart") {
      restarts_++;
    } else if (m.kind == "placed") {
      placements_.push_back(fmt::format("{} in stage {} at {:.1f} s{}", m.source,
                                        static_cast<uint64_t>(m.value("stage")), m.t,
                                        m.label("by") == "board" ? "" : " (no reports yet)"));
    } else if (m.kind == "migrate") {
      auto from = static_cast<uint64_t>(m.value("from"));
      auto to = static_cast<uint64_t>(m.value("to"));
      std::string seen;
      double slowest = -1;
      for (size_t k = 0; k < s_->graph.stages.size(); ++k)
        if (auto v = m.value(fmt::format("stage{}", k), -2); v > -2) {
          seen += fmt::format("{}{:.0f}", seen.empty() ? "" : "/", v);
          slowest = slowest < 0 ? v : std::min(slowest, v);
        }
      if (migrations_.empty())
        slowest_before_ = slowest;
      migrations_.push_back(fmt::format("{} stage {} -> {} at {:.1f} s{}", m.source, from, to, m.t,
                                        seen.empty() ? "" : " (stages at " + seen + " samples/s)"));
      migration_times_.emplace_back(m.t, samples_);
      markers_.emplace_back(m.t, fmt::format("m {}>{}", from, to));
    } else if (m.kind == "checkpoint") {
      checkpoints_++;
      checkpoint_bytes_ += m.value("bytes");
      checkpoint_s_ += m.value("seconds");
      checkpoint_max_s_ = std::max(checkpoint_max_s_, m.value("seconds"));
      checkpoint_actor_s_ += m.value("actor_seconds");
    } else if (m.kind == "restore") {
      restores_.push_back(static_cast<uint64_t>(m.value("steps")));
      if (m.value("replica") > 0)
        from_replicas_++;
    } else if (m.kind == "replica") {
      replicas_++;
      replica_bytes_ += m.value("bytes");
    } else if (m.kind == "pending_restored") {
      pending_taken_ += static_cast<int64_t>(m.value("samples"));
    } else if (m.kind == "checkpoint_rejected") {
      rejected_checkpoints_++;
    }
  }

  bool tick(double t) override {
    auto total = s_->trainers * s_->graph.microbatches_per_trainer;
    if (info_.tty || t >= next_line_) {
      next_line_ = t + 2.0;
      auto rate = t > 0 ? static_cast<double>(samples_) / t : 0.0;
      auto requested = total * s_->graph.microbatch;
      auto left = rate > 0 ? static_cast<double>(requested - samples_) / rate : 0.0;
      fmt::print(stderr,
                 "{}  {:6.1f} s | {:5}/{} microbatches | loss {:.3f} | {:6.1f} samples/s | "
                 "retries {} | preempted {} | restarts {} | ~{:.0f} s left   {}",
                 info_.tty ? "\r" : "", t, microbatches_, total, has_loss_ ? ema_ : 0.0, rate,
                 retries_, preemptions_, restarts_, left, info_.tty ? "" : "\n");
    }
    return done_ >= s_->trainers;
  }

  int finish(finish_context& ctx) override {
    if (info_.tty)
      fmt::print(stderr, "\n");
    auto& g = s_->graph;
    auto board = swarm_board(ctx.node(), *s_);
    auto taken = take_final_model(ctx, board);
    auto& reports = taken.reports;
    auto loss1 = taken.loss;
    auto requested = s_->trainers * g.microbatches_per_trainer * g.microbatch;
    auto rss = peak_rss_bytes();
    fmt::print("\nswarm summary{}\n", ctx.timed_out  ? " (stopped at experiment.duration)"
                                      : ctx.stopped ? " (stopped by signal)"
                                                    : "");
    fmt::print("  {:<34} {}\n", "microbatches completed", microbatches_);
    if (earlier_batches_ == 0) {
      fmt::print("  {:<34} {} of {} requested\n", "samples", samples_, requested);
      fmt::print("  {:<34} {} distinct, {} completed twice\n", "batches",
                 microbatches_ - repeated_, repeated_);
    } else {
      // A resumed run: its batches and the earlier runs' together.
      auto earlier = static_cast<int64_t>(earlier_batches_);
      fmt::print("  {:<34} {} of {} requested ({} in earlier runs, {} in this one)\n", "samples",
                 samples_ + earlier * g.microbatch, requested, earlier * g.microbatch, samples_);
      fmt::print("  {:<34} {} distinct, {} completed twice ({} in earlier runs)\n", "batches",
                 microbatches_ - repeated_ - redone_ + earlier, repeated_ + redone_, earlier);
    }
    if (ctx.stopped || ctx.timed_out)
      print_progress_files(microbatches_ - repeated_ - redone_
                           + static_cast<int64_t>(earlier_batches_));
    fmt::print("  {:<34} {:.1f} s, {:.1f} samples/s\n", "run time", ctx.run_s,
               static_cast<double>(samples_) / std::max(1e-9, ctx.run_s));
    // A migration respawns its peer in the new stage: not a restart after a preemption.
    fmt::print("  {:<34} {} ({} restarts, {} hop retries)\n", "preemptions", preemptions_,
               restarts_ - static_cast<int64_t>(migrations_.size()), retries_);
    if (g.rebalance.enabled())
      print_migrations(ctx, board);
    fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "training loss (EMA, first -> last)",
               loss_curve_.empty() ? 0.0 : loss_curve_.front().second, ema_);
    print_bursts();
    std::string steps;
    stage_report sum;
    for (auto& r : reports) {
      steps += fmt::format("{}{}", steps.empty() ? "" : " ", r.max_steps);
      sum.rounds += r.rounds;
      sum.averaged += r.averaged;
      sum.no_partner += r.no_partner;
      sum.failed += r.failed;
      sum.caught_up += r.caught_up;
      sum.state_rounds += r.state_rounds;
      sum.state_loaded += r.state_loaded;
      sum.downloads += r.downloads;
      sum.donors += r.donors;
      sum.applied += r.applied;
      sum.lost += r.lost;
    }
    if (g.averaging.enabled()) {
      fmt::print("  {:<34} [{}] (target batch {})\n", "global steps per stage", steps,
                 g.averaging.target_batch);
      fmt::print("  {:<34} {} rounds of live peers: {} averaged, {} without partner, {} failed; "
                 "{} catch-ups; {} resyncs after a lone step ({} loaded)\n",
                 "gradient averaging", sum.rounds, sum.averaged, sum.no_partner, sum.failed,
                 sum.caught_up, sum.state_rounds, sum.state_loaded);
    } else {
      fmt::print("  {:<34} [{}] (local batch {}, parameters gossiped)\n",
                 "optimizer steps (most per stage)", steps, g.local_batch);
    }
    fmt::print("  {:<34} {} by live peers, from {:.1f} donors on average\n", "state downloads",
               sum.downloads,
               sum.downloads > 0 ? static_cast<double>(sum.donors) / static_cast<double>(sum.downloads)
                                 : 0.0);
    fmt::print("  {:<34} {} confirmed and applied by live peers, {} computed but never "
               "confirmed (lost work, dropped)\n",
               "stage gradients (exactly once)", sum.applied, sum.lost);
    if (checkpoints_ > 0 || !restores_.empty()) {
      auto n = static_cast<double>(std::max<int64_t>(checkpoints_, 1));
      fmt::print("  {:<34} {} written, {:.2f} MB and {:.1f} ms each on average (max {:.1f} ms; "
                 "{:.1f} ms of it in the stage peer's actor)\n",
                 "stage checkpoints", checkpoints_, checkpoint_bytes_ / n / 1e6,
                 1e3 * checkpoint_s_ / n, 1e3 * checkpoint_max_s_,
                 1e3 * checkpoint_actor_s_ / n);
      std::string steps_text;
      for (auto st : restores_)
        steps_text += fmt::format("{}{}", steps_text.empty() ? "" : ", ", st);
      auto replicated = replicas_ > 0 || from_replicas_ > 0
                          ? fmt::format("; {} from replicas on other nodes", from_replicas_)
                          : std::string{};
      fmt::print("  {:<34} {} (at steps: {}{}), {} checkpoint files rejected, {} samples of "
                 "accumulated gradients taken up\n",
                 "resumed from checkpoints", restores_.size(),
                 steps_text.empty() ? "-" : steps_text, replicated, rejected_checkpoints_,
                 pending_taken_);
      if (replicas_ > 0)
        fmt::print("  {:<34} {} written by nodes serving no peer of their stage, {:.2f} MB each\n",
                   "checkpoint replicas", replicas_,
                   replica_bytes_ / static_cast<double>(replicas_) / 1e6);
    }
    for (size_t k = 0; k < reports.size(); ++k)
      fmt::print("  {:<34} stage {}: {} ({})\n", k == 0 ? "final model taken from" : "", k,
                 reports[k].chosen.empty() ? "no live peer" : reports[k].chosen,
                 reports[k].steps_of_peers);
    if (loss1 >= 0)
      fmt::print("  {:<34} {:.4f} -> {:.4f}\n", "held-out loss (before -> after)", loss0_, loss1);
    else
      fmt::print("  {:<34} unavailable: {}\n", "held-out loss", taken.note);
    fmt::print("  {:<34} {:.0f} MiB\n", "peak resident memory", static_cast<double>(rss) / 1048576);
    if (g.export_model)
      export_model(taken.model, loss1);
    write_summary(ctx, loss1);
    write_plots();
    std::fflush(stdout);
    return loss1 >= 0 && loss1 < loss0_ ? 0 : 1;
  }

private:
  /// The loss-burst line: how many microbatches exceeded the recent median by the margin, and
  /// when (runtime/metrics/loss_bursts.hpp).
  void print_bursts() const {
    auto& o = bursts_.settings();
    auto& bs = bursts_.bursts();
    if (bs.empty()) {
      fmt::print("  {:<34} none (no microbatch above the median of the last {} by > {:.2f}; "
                 "largest excess {:+.2f})\n",
                 "loss bursts", o.window, o.margin, bursts_.largest_excess());
      return;
    }
    std::string when;
    for (size_t i = 0; i < bs.size() && i < 5; ++i)
      when += fmt::format("{}{:.1f}-{:.1f} s ({} batches, peak {:.2f} = +{:.2f})",
                          i ? ", " : "", bs[i].start_t, bs[i].end_t, bs[i].batches,
                          bs[i].peak_loss, bs[i].peak_excess);
    if (bs.size() > 5)
      when += fmt::format(", and {} more", bs.size() - 5);
    fmt::print("  {:<34} {} microbatches in {} bursts above the median of the last {} by > "
               "{:.2f}: {}\n",
               "loss bursts", bursts_.flagged(), bs.size(), o.window, o.margin, when);
  }

  /// `<out>/summary.json`: the numbers of the summary a script compares (scripts/compare-runs).
  void write_summary(const finish_context& ctx, double loss1) const {
    if (info_.out_dir.empty())
      return;
    nlohmann::json j;
    j["microbatches"] = microbatches_;
    j["samples"] = samples_;
    j["run_s"] = ctx.run_s;
    j["preemptions"] = preemptions_;
    j["hop_retries"] = retries_;
    j["ema_loss"] = ema_;
    j["held_out_before"] = loss0_;
    if (loss1 >= 0)
      j["held_out_after"] = loss1;
    j["burst_margin"] = bursts_.settings().margin;
    j["burst_batches"] = bursts_.flagged();
    j["largest_excess"] = bursts_.largest_excess();
    auto list = nlohmann::json::array();
    for (auto& b : bursts_.bursts())
      list.push_back({{"start_t", b.start_t}, {"end_t", b.end_t}, {"batches", b.batches},
                      {"peak_loss", b.peak_loss}, {"peak_excess", b.peak_excess},
                      {"reference", b.reference}});
    j["bursts"] = list;
    std::ofstream f(info_.out_dir + "/summary.json");
    f << j.dump(2) << "\n";
  }

  /// Writes the final model into `<out>/export`: per stage its TorchScript files (scripted
  /// models) and state dicts, and `export.json` with the held-out losses.
  void export_model(const std::vector<std::shared_ptr<kernels::stage_module>>& model,
                    double loss1) {
    if (info_.out_dir.empty() || model.empty()) {
      fmt::print("  {:<34} skipped: {}\n", "export",
                 model.empty() ? no_stage_state : "no output directory");
      return;
    }
    auto dir = info_.out_dir + "/export";
    std::vector<kernels::stage_module*> modules;
    for (auto& m : model)
      modules.push_back(m.get());
    nlohmann::json j;
    j["held_out_loss_before"] = loss0_;
    j["held_out_loss"] = loss1;
    j["held_out_batches"] = held_out_.size();
    j["microbatch"] = s_->graph.microbatch;
    j["seq_len"] = s_->graph.model.seq_len;
    auto files = export_final_model(modules, dir, j);
    if (!files) {
      fmt::print("  {:<34} failed: {}\n", "export", files.error().what);
      return;
    }
    fmt::print("  {:<34} {} files in {} (export.json: held-out loss {:.6f})\n", "export",
               files->size(), dir, loss1);
  }

  /// The stage migrations of the run, and the pipeline's throughput before the first one and
  /// after the last one (the moved peers' state downloads included).
  void print_migrations(finish_context& ctx, const caf::actor& board) const {
    auto run_s = ctx.run_s;
    if (!placements_.empty()) {
      std::string list;
      for (auto& p : placements_)
        list += fmt::format("{}{}", list.empty() ? "" : "; ", p);
      fmt::print("  {:<34} {}\n", "volunteers placed (least throughput)", list);
    }
    if (migrations_.empty()) {
      fmt::print("  {:<34} none\n", "migrations (rebalancing)");
      return;
    }
    std::string list;
    for (auto& m : migrations_)
      list += fmt::format("{}{}", list.empty() ? "" : "; ", m);
    fmt::print("  {:<34} {} ({})\n", "migrations (rebalancing)", migrations_.size(), list);
    auto [first, done_first] = migration_times_.front();
    auto [last, done_last] = migration_times_.back();
    auto end = std::max(run_s, last);
    // From the first completed microbatch (the start-up is not the pipeline's throughput).
    auto [t0, n0] = first_batch_;
    auto before = first > t0 ? static_cast<double>(done_first - n0) / (first - t0) : 0.0;
    auto after = end > last ? static_cast<double>(samples_ - done_last) / (end - last) : 0.0;
    fmt::print("  {:<34} {:.1f} samples/s before the first migration ({:.1f}-{:.1f} s), {:.1f} "
               "after the last ({:.1f}-{:.1f} s)\n",
               "throughput around migrations", before, t0, first, after, last, end);
    // The stages' capacities (samples per busy device second, as the peers report them): the
    // pipeline's bound is the slowest; wall-clock windows above also see the machine's load.
    auto loads = ask<std::vector<double>, std::vector<int64_t>, double>(
      ctx, board, std::chrono::seconds(5), get_atom::value, load_atom::value, caf::actor{});
    if (!loads || std::get<0>(*loads).empty())
      return;
    std::string now;
    double slowest = -1;
    for (auto v : std::get<0>(*loads)) {
      now += fmt::format("{}{:.0f}", now.empty() ? "" : "/", v);
      if (v >= 0)
        slowest = slowest < 0 ? v : std::min(slowest, v);
    }
    fmt::print("  {:<34} {} samples/s at the end; the slowest stage {:.0f} (before the first "
               "migration: {:.0f})\n",
               "stage capacities", now, slowest, slowest_before_);
  }

  void write_plots() {
    auto& dir = info_.out_dir;
    if (dir.empty())
      return;
    plot::line_plot lp;
    lp.title = "SWARM training loss (EMA) with preemptions";
    lp.x_label = "seconds";
    lp.y_label = "cross-entropy per byte";
    lp.lines.push_back({"training loss", loss_curve_});
    lp.markers = markers_;
    plot::write_svg(lp, dir + "/loss.svg");
    plot::line_plot tp;
    tp.title = "SWARM throughput with preemptions";
    tp.x_label = "seconds";
    tp.y_label = "samples / s (5 s window)";
    plot::series thr{"throughput", {}};
    for (size_t i = 0, j = 0; i < marks_.size(); ++i) {
      while (marks_[i].first - marks_[j].first > 5.0)
        ++j;
      if (marks_[i].first - marks_[j].first > 0.5)
        thr.points.emplace_back(marks_[i].first,
                                static_cast<double>(marks_[i].second - marks_[j].second)
                                  / (marks_[i].first - marks_[j].first));
    }
    tp.lines.push_back(thr);
    tp.markers = markers_;
    plot::write_svg(tp, dir + "/throughput.svg");
    fmt::print("  {:<34} {}/metrics.jsonl, {}/loss.svg, {}/throughput.svg\n", "output", dir, dir,
               dir);
  }

  std::shared_ptr<const swarm_setup> s_;
  run_info info_;
  std::vector<kernels::text_batch> held_out_;
  double loss0_ = 0;
  int64_t microbatches_ = 0, samples_ = 0, retries_ = 0, done_ = 0;
  int64_t preemptions_ = 0, restarts_ = 0;
  /// The final model as the summary reports it.
  struct final_stages {
    /// Per stage: where its state came from, and its live peers' counters.
    std::vector<stage_report> reports;
    /// The stages loaded with their final states (empty when a stage had none).
    std::vector<std::shared_ptr<kernels::stage_module>> model;
    /// Its held-out loss (-1: not evaluated, `note` says why).
    double loss = -1;
    std::string note;
  };

  /// The final model: per stage the state of the live peer with the most optimizer steps (a
  /// stage's trained peers agree closely; one just restarted may still hold its
  /// initialization), and every live peer's counters; evaluated on the held-out batches.
  final_stages take_final_model(finish_context& ctx, const caf::actor& board) {
    auto stages = s_->graph.stages.size();
    final_stages out;
    out.reports.resize(stages);
    std::vector<messages::stage_state> finals(stages);
    // A stage whose peers were all preempted as the run ended stands in the final model with its
    // newest checkpoint in the run's folders; when there is none here (a cluster node sees its
    // own folder only), its restarted peers get a while to resume from theirs and announce
    // (waited for on the run's clock: in simulation the run goes on meanwhile).
    const nanoseconds patience = std::chrono::seconds(15);
    const nanoseconds again = std::chrono::milliseconds(500);
    nanoseconds waited{0};
    for (uint64_t k = 0; k < stages; ++k) {
      auto& r = out.reports[k];
      for (bool first = true;; first = false) {
        r = stage_report{};
        survey_stage(ctx, board, k, finals[k], r);
        if (finals[k].params.tensor.defined())
          break;
        if (auto c = newest_checkpoint_of(k)) {
          finals[k] = c->state;
          auto rel = std::filesystem::path(c->file.path).lexically_relative(info_.out_dir);
          r.chosen = "checkpoint " + rel.string();
          r.steps_of_peers = fmt::format("no live peer; checkpoint of step {}, digest {}",
                                         c->state.steps,
                                         actors::stage::digest_hex(c->digest).substr(0, 16));
          break;
        }
        if (waited >= patience)
          break;
        if (first)
          fmt::print(stderr, "starling: stage {} has no live peer; waiting up to {:.0f} s for its "
                             "restarted peers\n",
                     k, secs(patience - waited));
        pass_time(ctx, again);
        waited += again;
      }
    }
    bool complete = true;
    std::vector<torch::Tensor> final_params;
    for (auto& f : finals) {
      complete = complete && f.params.tensor.defined();
      final_params.push_back(f.params.tensor);
    }
    if (complete) {
      if (auto m = build_model(*s_, final_params, finals))
        out.model = std::move(*m);
      else
        out.note = m.error().what;
    }
    if (!held_out_.empty() && !out.model.empty()) {
      if (auto l = evaluate(out.model, held_out_))
        out.loss = *l;
      else
        out.note = l.error().what;
    } else if (out.note.empty()) {
      out.note = held_out_.empty() ? "no held-out data" : no_stage_state;
    }
    return out;
  }

  /// The live peers of stage `k` (the board's list, each asked for its counters): their counters
  /// summed into `r`, and the state of the one with the most optimizer steps into `chosen`
  /// (its parameters left undefined when none answered).
  void survey_stage(finish_context& ctx, const caf::actor& board, uint64_t k,
                    messages::stage_state& chosen, stage_report& r) {
    using namespace actors::stage;
    auto listed = ask<std::vector<std::string>, std::vector<caf::actor>>(
      ctx, board, std::chrono::seconds(5), get_atom::value, k);
    if (!listed)
      return;
    auto& names = std::get<0>(*listed);
    auto& peers = std::get<1>(*listed);
    final_model_options fo;
    fo.steps_at = st_steps;
    fo.min_counters = st_count;
    fo.ask_timeout = std::chrono::seconds(5);
    fo.download.timeout = std::chrono::seconds(10);
    auto answered = survey_peers(ctx, peers, names, fo, [&](const final_candidate& c) {
      auto& v = c.counters;
      r.steps_of_peers += fmt::format("{}{} at step {}", r.steps_of_peers.empty() ? "live: " : ", ",
                                      c.name, v[st_steps]);
      r.peers++;
      r.max_steps = std::max(r.max_steps, v[st_steps]);
      r.rounds += v[st_rounds];
      r.averaged += v[st_averaged];
      r.no_partner += v[st_no_partner];
      r.failed += v[st_failed];
      r.caught_up += v[st_caught_up];
      r.downloads += v[st_downloads];
      r.donors += v[st_donors];
      r.state_rounds += v[st_state_rounds];
      r.state_loaded += v[st_state_rounds_loaded];
      auto commits = ask<std::vector<uint64_t>>(ctx, c.peer, std::chrono::seconds(5),
                                                status_atom::value, messages::commit_atom::value);
      if (commits && std::get<0>(*commits).size() >= 2) {
        r.applied += std::get<0>(*commits)[0];
        r.lost += std::get<0>(*commits)[1];
      }
    });
    if (!answered.empty()) {
      r.chosen = rank_candidates(answered).front().name;
      if (auto got = download_most_trained(ctx, answered, fo))
        chosen = std::move(got->state);
    }
    // How far the stage's replicas drifted apart: each live peer's distance to the chosen one.
    const auto& final = chosen.params.tensor;
    if (final.defined()) {
      auto norm = final.norm().item<double>();
      std::string spread;
      for (auto& peer : peers) {
        auto other = download_from(ctx, peer, fo.download.timeout);
        if (!other || !other->state.params.tensor.defined()
            || other->state.params.tensor.numel() != final.numel())
          continue;
        auto d = (other->state.params.tensor - final).norm().item<double>();
        spread += fmt::format("{}{:.2g}", spread.empty() ? "" : " ", d / std::max(norm, 1e-12));
      }
      r.steps_of_peers += "; replicas' relative distance to it: " + spread;
    }
  }

  /// A stopped run: the trainers' progress files may hold batches completed after the stop
  /// (their metrics no longer reach the reporters); says how many, since they count as done for
  /// `--resume`.
  void print_progress_files(int64_t counted) const {
    if (info_.out_dir.empty())
      return;
    auto saved = read_run_progress(info_.out_dir);
    if (!saved)
      return;
    int64_t done = 0;
    for (auto& [name, p] : *saved)
      done += static_cast<int64_t>(p.done_count());
    if (done > counted)
      fmt::print("  {:<34} {} (the trainers' progress files: {} completed after the stop, not in "
                 "the counts above; `--resume` does not redo them)\n",
                 "batches done", done, done - counted);
  }

  /// The batches that trainers completed in earlier runs of a resumed run (their progress files
  /// in the run's node folders, by trainer name: the source of their metrics).
  void read_earlier_progress() {
    if (info_.out_dir.empty())
      return;
    auto saved = read_run_progress(info_.out_dir);
    if (!saved)
      return; // the run refused to start on it (`--resume` checks every file)
    for (auto& [name, p] : *saved) {
      auto& done = earlier_[name];
      for (uint64_t b = 0; b < p.total(); ++b)
        if (p.done(b))
          done.insert(b);
      earlier_batches_ += p.done_count();
    }
  }

  /// The newest checkpoint of stage `k` that reads and verifies, in any node folder of the run
  /// (`<out>/<node>/checkpoints`); none without an output folder.
  std::optional<actors::stage::checkpoint_loaded> newest_checkpoint_of(uint64_t k) const {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (info_.out_dir.empty() || !fs::is_directory(info_.out_dir, ec))
      return std::nullopt;
    std::vector<std::string> dirs;
    for (auto& e : fs::directory_iterator(info_.out_dir, ec))
      if (fs::is_directory(e.path() / "checkpoints", ec))
        dirs.push_back((e.path() / "checkpoints").string());
    std::sort(dirs.begin(), dirs.end());
    actors::stage::checkpoint_key key{k, s_->ranges[k].first, s_->ranges[k].second};
    return actors::stage::newest_checkpoint(dirs, key).found;
  }

  /// Batches done in earlier runs (a resumed run), by trainer, and their count.
  std::map<std::string, std::set<uint64_t>> earlier_;
  uint64_t earlier_batches_ = 0;
  /// This run's batches that an earlier run had completed already.
  int64_t redone_ = 0;
  /// Stage checkpoints written (count, bytes, seconds), restores (their steps), rejected files.
  int64_t checkpoints_ = 0;
  double checkpoint_bytes_ = 0, checkpoint_s_ = 0, checkpoint_max_s_ = 0, checkpoint_actor_s_ = 0;
  std::vector<uint64_t> restores_;
  int64_t rejected_checkpoints_ = 0;
  /// Samples of gradients accumulated before a stop that resumed peers took up.
  int64_t pending_taken_ = 0;
  /// Restores from replicas on other nodes; replicas written (cluster runs) and their bytes.
  int64_t from_replicas_ = 0;
  int64_t replicas_ = 0;
  double replica_bytes_ = 0;
  /// Completed batch numbers per trainer, and completions of a batch already completed.
  std::map<std::string, std::set<uint64_t>> batches_;
  int64_t repeated_ = 0;
  double ema_ = 0;
  bool has_loss_ = false;
  burst_detector bursts_;
  std::vector<std::pair<double, double>> loss_curve_;
  std::vector<std::pair<double, int64_t>> marks_;
  std::vector<std::pair<double, std::string>> markers_;
  /// Stage migrations (rebalancing): one line each, and when they happened (seconds since the
  /// start, samples completed by then).
  std::vector<std::string> migrations_;
  /// Volunteers' stage peers placed when they started ("placed" events).
  std::vector<std::string> placements_;
  std::vector<std::pair<double, int64_t>> migration_times_;
  /// The slowest stage's throughput the first migration's decision saw (-1: none).
  double slowest_before_ = -1;
  /// When the first microbatch completed, and its samples.
  std::pair<double, int64_t> first_batch_{0.0, 0};
  double next_line_ = 0;
};

/// Throughput of a simulated run against the bounds (see runtime/run/SWARM-SIM.md): the fluid
/// bound (every live peer's speed over the whole pipeline's work), the assigned bound (the
/// slowest stage with the peers it has) and Little's law (microbatches in flight over the
/// fastest possible microbatch), integrated over the run after the warm-up.
class swarm_sim_reporter : public reporter {
public:
  swarm_sim_reporter(std::shared_ptr<const swarm_setup> s, std::shared_ptr<swarm_sim_outcome> out)
    : s_(std::move(s)),
      // With an outcome to fill, a study prints the row: no summary of its own.
      quiet_(static_cast<bool>(out)),
      out_(out ? std::move(out) : std::make_shared<swarm_sim_outcome>()) {
    auto& g = s_->graph;
    auto& sim = s_->sim;
    auto stages = g.stages.size();
    work_.resize(stages);
    for (size_t k = 0; k < stages; ++k)
      work_[k] = sim.forward_s * (sim.stage_work.empty() ? 1.0 : sim.stage_work[k])
                 * (1.0 + sim.backward_factor);
    for (auto& [stage, speed] : s_->slots)
      slots_.push_back({speed, stage, true});
    double wsum = 0;
    for (auto w : work_)
      wsum += w;
    double vmax = 0;
    for (auto& sl : slots_)
      vmax = std::max(vmax, sl.speed);
    wsum_ = wsum;
    int64_t inflight = g.trainers * g.max_inflight;
    if (sim.routing != swarm_routing::fixed && sim.inflight_per_peer > 0)
      inflight = g.trainers
                 * actors::trainer::inflight_target(s_->slots.size(), g.trainers,
                                                    sim.inflight_per_peer, sim.inflight_cap,
                                                    g.max_inflight);
    auto m = static_cast<double>(g.microbatch);
    double bytes = m * static_cast<double>(std::max<int64_t>(1, sim.payload)) * 4 + 256;
    double t_min = m * wsum / std::max(vmax, 1e-9)
                   + 4.0 * static_cast<double>(stages) * (secs(s_->latency) + bytes / s_->bandwidth);
    out_->little_bound = static_cast<double>(inflight) * m / t_min;
  }

  void start(const run_info& info) override {
    warmup_ = secs(s_->sim.warmup);
    if (quiet_)
      return;
    auto& g = s_->graph;
    auto& sim = s_->sim;
    double speed_sum = 0;
    for (auto& sl : slots_)
      speed_sum += sl.speed;
    fmt::print("swarm simulation (cost-model compute): {} stages, {} peers (mean speed {:.3f}), "
               "{} trainers, forward {:.4g} s/sample at speed 1, backward x{}, noise {}, routing "
               "{}{}, {:.0f} s simulated\n",
               g.stages.size(), slots_.size(), speed_sum / static_cast<double>(slots_.size()),
               s_->trainers, sim.forward_s, sim.backward_factor, sim.noise,
               sim.routing == swarm_routing::uniform ? "uniform"
               : sim.routing == swarm_routing::fixed ? "fixed"
                                                     : "stochastic",
               sim.rebalance_period.count() > 0 && sim.routing == swarm_routing::stochastic
                 ? fmt::format(" + rebalancing every {:.0f} s", secs(sim.rebalance_period))
                 : std::string{},
               secs(info.graph->duration));
    std::fflush(stdout);
  }

  void on_metric(const metric_record& m) override {
    if (m.kind == "microbatch") {
      out_->microbatches++;
      auto n = static_cast<int64_t>(m.value("samples"));
      out_->samples += n;
      out_->retries += static_cast<int64_t>(m.value("retries"));
      if (m.t >= warmup_)
        out_->measured_samples += static_cast<double>(n);
    } else if (m.kind == "done") {
      done_++;
    } else if (m.kind == "fault") {
      auto slot = peer_slot(m.label("instance"));
      if (slot >= 0 && static_cast<size_t>(slot) < slots_.size()) {
        if (slots_[static_cast<size_t>(slot)].alive)
          out_->preemptions++;
        slots_[static_cast<size_t>(slot)].alive = false;
      }
    } else if (m.kind == "restart") {
      auto slot = peer_slot(m.source);
      if (slot >= 0 && static_cast<size_t>(slot) < slots_.size())
        slots_[static_cast<size_t>(slot)].alive = true;
      out_->restarts++;
    } else if (m.kind == "migrate") {
      auto slot = peer_slot(m.source);
      if (slot >= 0 && static_cast<size_t>(slot) < slots_.size())
        slots_[static_cast<size_t>(slot)].stage = static_cast<uint64_t>(m.value("to"));
      out_->migrations++;
    }
  }

  bool tick(double t) override {
    // The bounds of the second that ended, with the peers alive now.
    auto dt = t - last_;
    last_ = t;
    if (t - dt >= warmup_ - 1e-9 && dt > 0) {
      double live = 0;
      std::vector<double> per(work_.size(), 0.0);
      for (auto& sl : slots_)
        if (sl.alive) {
          live += sl.speed;
          per[sl.stage] += sl.speed;
        }
      double assigned = INFINITY;
      for (size_t k = 0; k < work_.size(); ++k)
        assigned = std::min(assigned, per[k] / work_[k]);
      out_->bound_samples += std::min(live / wsum_, out_->little_bound) * dt;
      out_->assigned_bound_samples += std::min(assigned, out_->little_bound) * dt;
      out_->measured_s += dt;
    }
    if (dt > 0) {
      double live = 0;
      for (auto& sl : slots_)
        live += sl.alive ? sl.speed : 0.0;
      minute_fluid_ += std::min(live / wsum_, out_->little_bound) * dt;
    }
    if (t >= next_minute_) {
      // Each simulated minute's samples against its own bound (where a run loses: filling,
      // faults, migrations), printed with the summary.
      next_minute_ = t + 60;
      auto got = static_cast<double>(out_->samples - minute_samples_);
      per_minute_.push_back(100 * got / std::max(1.0, minute_fluid_));
      minute_samples_ = out_->samples;
      minute_fluid_ = 0;
    }
    if (t >= next_line_) {
      next_line_ = t + 600;
      fmt::print(stderr, "  {:7.0f} s simulated: {} samples, {} retries, {} migrations\n", t,
                 out_->samples, out_->retries, out_->migrations);
    }
    return done_ >= s_->trainers;
  }

  int finish(finish_context& ctx) override {
    auto& o = *out_;
    o.wall_s = ctx.wall_s;
    o.run_s = ctx.run_s;
    o.peers_per_stage.assign(work_.size(), 0);
    for (auto& sl : slots_)
      if (sl.alive)
        o.peers_per_stage[sl.stage]++;
    if (quiet_)
      return 0;
    fmt::print("\nswarm simulation summary\n");
    fmt::print("  {:<34} {:.0f} s simulated in {:.1f} s wall\n", "time", o.run_s, o.wall_s);
    fmt::print("  {:<34} {} ({} microbatches, {} hop retries)\n", "samples", o.samples,
               o.microbatches, o.retries);
    fmt::print("  {:<34} {:.2f} samples/s (after the {:.0f} s warm-up)\n", "throughput",
               o.measured_samples / std::max(1.0, o.measured_s), warmup_);
    fmt::print("  {:<34} {:.1f}% of min(fluid, Little) = {:.0f} samples; {:.1f}% of the "
               "assigned bound\n",
               "vs. the upper bound", 100.0 * o.measured_samples / std::max(1.0, o.bound_samples),
               o.bound_samples, 100.0 * o.measured_samples / std::max(1.0, o.assigned_bound_samples));
    fmt::print("  {:<34} {:.2f} samples/s\n", "Little's-law bound", o.little_bound);
    fmt::print("  {:<34} {} preemptions, {} restarts, {} migrations\n", "faults", o.preemptions,
               o.restarts, o.migrations);
    std::string last;
    for (auto c : o.peers_per_stage)
      last += (last.empty() ? "" : " ") + std::to_string(c);
    fmt::print("  {:<34} [{}]\n", "live peers per stage at the end", last);
    for (size_t k = 0; k < per_minute_.size(); k += 15) {
      std::string row;
      for (size_t j = k; j < std::min(per_minute_.size(), k + 15); ++j)
        row += fmt::format("{:4.0f}", per_minute_[j]);
      fmt::print("  {:<34}{}\n",
                 k == 0 ? std::string{"% of fluid bound, per minute"}
                        : fmt::format("  minutes {}-", k + 1),
                 row);
    }
    return 0;
  }

private:
  struct slot_state {
    double speed;
    uint64_t stage;
    bool alive;
  };
  std::shared_ptr<const swarm_setup> s_;
  bool quiet_;
  std::shared_ptr<swarm_sim_outcome> out_;
  std::vector<double> work_;
  std::vector<slot_state> slots_;
  double wsum_ = 1;
  double warmup_ = 0;
  double last_ = 0;
  double next_line_ = 600;
  double next_minute_ = 60;
  int64_t minute_samples_ = 0;
  double minute_fluid_ = 0;
  std::vector<double> per_minute_;
  int64_t done_ = 0;
};

} // namespace

std::unique_ptr<reporter> make_swarm_reporter(std::shared_ptr<const swarm_setup> s) {
  return std::make_unique<swarm_reporter>(std::move(s));
}

std::unique_ptr<reporter> make_swarm_sim_reporter(std::shared_ptr<const swarm_setup> s,
                                                  std::shared_ptr<swarm_sim_outcome> out) {
  return std::make_unique<swarm_sim_reporter>(std::move(s), std::move(out));
}

} // namespace starling::runtime
