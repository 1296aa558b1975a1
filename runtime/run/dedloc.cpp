// The `dedloc` kind: role type, YAML reader, expansion (peers, auxiliary peers, churn for the
// plan to draw), and the reporter. See dedloc.hpp.
#include "runtime/run/dedloc.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include <caf/all.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/averager/averager.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/dp_peer/dp_peer.hpp"
#include "kernels/compress/format.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/data/token_source.hpp"
#include "kernels/models/torchscript.hpp"
#include "kernels/seeded_hash.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/experiment/final_model.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/graph/model_config.hpp"
#include "runtime/plot/svg.hpp"
#include "runtime/run/kinds.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;
namespace dp = actors::dp_peer;

double dedloc_secs(nanoseconds d) {
  return std::chrono::duration<double>(d).count();
}

/// The peers' data through the source registry, made once per process for each data set and
/// shared by its peers (and the reporter's export).
class data_cache {
public:
  using sources = std::pair<std::shared_ptr<const kernels::data_source>,
                            std::shared_ptr<const kernels::data_source>>;

  result<sources> get(const dedloc_role_options& o) {
    if (o.t2i) {
      auto split = t2i(o);
      if (!split)
        return split.error();
      return sources{split->train, split->eval};
    }
    auto opts = o.data;
    if (o.torchscript)
      kernels::fit_to_model(opts, o.torchscript->seq_len, o.torchscript->vocab);
    auto key = kernels::cache_key(opts);
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto i = cache_.find(key); i != cache_.end())
      return i->second;
    auto made = kernels::make_data_split(opts);
    if (!made)
      return made.error();
    sources s{made->train, made->eval};
    cache_[key] = s;
    return s;
  }

  /// The demo's split: fit once per process (the codebook), shared by its peers and reporter.
  result<kernels::t2i_split> t2i(const dedloc_role_options& o) {
    auto key = kernels::cache_key(*o.t2i);
    std::lock_guard<std::mutex> guard{mtx_};
    if (auto i = t2i_.find(key); i != t2i_.end())
      return i->second;
    auto made = kernels::make_t2i_split(*o.t2i);
    if (!made)
      return made.error();
    fmt::print(stderr,
               "starling: codebook of {} codes fit on {} patches in {:.1f} s ({} iterations, "
               "mse {:.5f}), digest {}\n",
               made->fit.codebook.size(), made->fit.patches, made->fit_seconds,
               made->fit.iterations, made->fit.mse, made->digest);
    t2i_[key] = *made;
    return *made;
  }

private:
  std::mutex mtx_;
  std::map<std::string, sources> cache_;
  std::map<std::string, kernels::t2i_split> t2i_;
};

actors::collab::peer_mode mode_of(const dedloc_role_options& o, size_t index) {
  if (o.cycle > 0 && o.clients > 0 && index % o.cycle >= o.cycle - std::min(o.clients, o.cycle))
    return actors::collab::peer_mode::client;
  return o.peer.collab.mode;
}

/// Bytes per element a codec puts on the wire for large vectors (payload only).
double wire_bytes(kernels::codec_id c) {
  auto b = kernels::payload_bytes_for(1 << 20, c, {});
  return b ? static_cast<double>(*b) / static_cast<double>(1 << 20) : 4.0;
}

/// The LibTorch backend of `o` reading stream `stream` of the run's `seed` (every peer starts
/// from the same parameters: the seeded MLP or the TorchScript files).
dp::torch_backend_options torch_options(const dedloc_role_options& o, uint64_t seed,
                                        uint64_t stream) {
  auto to = o.torch;
  to.model.seed = seed;
  if (o.torchscript)
    to.spec = kernels::torchscript_model(*o.torchscript);
  if (o.gpt && o.t2i) {
    // Every peer starts from the GPT seeded by the run's seed; its vocabulary and length are
    // the layout's.
    auto layout = t2i_layout_of(*o.t2i);
    auto cfg = *o.gpt;
    cfg.vocab = layout.vocab();
    cfg.seq_len = layout.sequence_length() - 1;
    cfg.seed = seed;
    to.spec = kernels::gpt_model(cfg);
    to.t2i = layout;
  }
  to.stream.seed = seed;
  to.stream.stream = stream;
  return to;
}

caf::actor spawn_peer(role_context& ctx, const dedloc_role_options& o,
                      const std::shared_ptr<data_cache>& cache) {
  auto& h = ctx.node;
  auto mode = mode_of(o, ctx.index);
  // A node the others cannot dial (a volunteer behind a NAT, a simulated firewalled node) puts
  // its peers in client mode whatever the plan says: the others could not reach it as a
  // reducer or a donor.
  if (!h.reachable() && mode == actors::collab::peer_mode::full)
    mode = actors::collab::peer_mode::client;
  auto speed = o.speeds.empty() ? 1.0 : o.speeds[ctx.index % o.speeds.size()];
  std::shared_ptr<dp::backend> model;
  if (o.backend == "modeled") {
    auto mo = o.modeled;
    mo.microbatch = o.torch.stream.microbatch;
    auto b = dp::make_modeled_backend(mo);
    if (!b)
      return {};
    model = std::move(*b);
  } else {
    if (o.torch_threads > 0 && at::get_num_threads() != static_cast<int>(o.torch_threads))
      at::set_num_threads(static_cast<int>(o.torch_threads));
    auto data = cache->get(o);
    if (!data) {
      fmt::print(stderr, "starling: {}: {}\n", ctx.name, data.error().what);
      return {};
    }
    auto to = torch_options(o, h.graph().seed,
                            (static_cast<uint64_t>(ctx.index) + o.seed_offset) * 1024 +
                                static_cast<uint64_t>(ctx.generation));
    if (mode == actors::collab::peer_mode::auxiliary)
      to.eval_samples = 0;
    auto b = dp::make_torch_backend(to, data->first, data->second);
    if (!b) {
      fmt::print(stderr, "starling: {}: {}\n", ctx.name, b.error().what);
      return {};
    }
    model = std::move(*b);
  }
  auto po = o.peer;
  po.address = ctx.address_of(ctx.role.name, ctx.index);
  po.name = ctx.name;
  po.key_prefix =
      ctx.key_prefix() + "/dp/" + (o.collaboration.empty() ? ctx.role.name : o.collaboration);
  po.generation = ctx.generation;
  po.speed = speed;
  po.collab.mode = mode;
  // Reads come at most every half record lifetime: a record is refreshed before it expires.
  po.collab.progress.max_refresh = std::min(30.0, po.collab.progress.record_lifetime / 2);
  po.diloco.outer.nesterov = po.diloco.outer.nesterov && po.diloco.outer.momentum > 0;
  po.diloco.error_feedback = po.diloco.error_feedback &&
                             po.diloco.codec != kernels::codec_id::randk &&
                             po.diloco.codec != kernels::codec_id::none;
  po.wire_bytes_per_element = wire_bytes(o.averager.codec);
  // The contribution ledger's summaries. A simulation publishes them only when it is served:
  // nobody reads them otherwise, and thousands of simulated peers would pay for the puts.
  po.ledger_experiment = ctx.key_prefix();
  po.token_id = h.token_id();
  auto& node = h.graph().node;
  if (h.mode() != run_mode::sim || !node.http.empty())
    po.ledger_every = node.ledger_every;
  // The averager's name ends in `-avg<generation>`: partners credit this peer under its
  // instance name from it (collab::peer_of_member).
  caf::actor averager;
  {
    // DiLoCo's rounds are the averager's Top-k rounds (the peer asks for them; no chunk codec).
    auto ao = o.averager;
    ao.key_prefix = ctx.key_prefix() + "/avg/";
    ao.bandwidth = mode == actors::collab::peer_mode::client ? 0.0 : 1.0;
    ao.auxiliary = mode == actors::collab::peer_mode::auxiliary;
    ao.poll_interval = ao.matchmaking_window / 8;
    if (po.algo == dp::algorithm::diloco)
      ao.codec = kernels::codec_id::none;
    // The peer hands over fresh vectors (its step's mean gradient, its state flattened) that
    // nothing else reads while the round runs: the result is written into them, one vector
    // less resident. (After a failed round it steps on its gradient as it then stands: its own
    // values, averaged where some of a part's result had arrived.)
    ao.in_place = true;
    averager = h.spawn_averager(fmt::format("{}-avg{}", ctx.name, ctx.generation), ao);
  }
  auto peer = dp::spawn_dp_peer(h.system(), {h.dht(), averager, h.resolver(), h.metrics()},
                                std::move(model), po);
  if (averager)
    peer->attach_functor([averager](const caf::error&) {
      caf::anon_send_exit(averager, caf::exit_reason::user_shutdown);
    });
  return peer;
}

// -- the reporter --------------------------------------------------------------------------------

/// The final model of a collaboration, as the export takes it.
struct final_model {
  messages::stage_state state;
  /// The global steps of every live instance of the role (highest first).
  std::string steps_of_peers;
};

class dedloc_reporter : public reporter {
public:
  /// `stop_at`: the run ends once the collaboration took that many global steps (0: never).
  dedloc_reporter(std::optional<dedloc_export_options> export_model,
                  std::shared_ptr<data_cache> cache, uint64_t stop_at = 0,
                  std::optional<dedloc_export_options> demo = std::nullopt)
      : export_(std::move(export_model)),
        demo_(std::move(demo)),
        cache_(std::move(cache)),
        stop_at_(stop_at) {
    // Data for the export's evaluation come from the peers' cache when they share the process.
  }

  void start(const run_info& info) override { info_ = info; }

  void on_metric(const metric_record& m) override {
    if (m.kind == "dp_step") {
      auto step = static_cast<uint64_t>(m.value("step"));
      auto samples = m.value("samples");
      step_samples_[step] += samples;
      samples_ += samples;
      steps_ = std::max(steps_, step + 1);
      rounds_++;
      if (m.value("averaged") > 0)
        averaged_++;
      round_s_ += m.value("round_s");
      if (std::isfinite(m.value("loss", std::nan(""))))
        train_loss_[step].push_back(m.value("loss"));
      sent_[m.source] = m.value("bytes_sent");
      received_[m.source] = m.value("bytes_received");
      last_t_ = m.t;
    } else if (m.kind == "dp_eval") {
      auto step = static_cast<uint64_t>(m.value("step"));
      auto& e = evals_[step];
      e.accuracy.push_back(m.value("accuracy"));
      e.loss.push_back(m.value("loss"));
      e.bytes.push_back(m.value("bytes_sent"));
    } else if (m.kind == "dp_join") {
      joins_++;
      peers_.insert(m.source);
      if (m.label("mode") == "client")
        clients_.insert(m.source);
    } else if (m.kind == "dp_leave") {
      leaves_++;
    } else if (m.kind == "dp_download") {
      if (m.value("ok") > 0) {
        downloads_++;
        if (m.value("resync") > 0)
          resync_downloads_++;
      } else
        failed_downloads_++;
    } else if (m.kind == "dp_state_round") {
      auto& n = m.value("resync") > 0 ? resyncs_ : periodic_;
      n.first++;
      if (m.value("loaded") <= 0)
        n.second++;
    } else if (m.kind == "dp_dropped") {
      dropped_ += m.value("samples");
    } else if (m.kind == "fault") {
      faults_++;
    }
  }

  bool tick(double t) override {
    if (t >= next_) {
      next_ = t + 10;
      auto acc = latest_accuracy();
      fmt::print(stderr, "  {:6.1f} s: step {}, {:.0f} samples, {} peers joined, {} left{}\n", t,
                 steps_, samples_, joins_, leaves_,
                 acc ? fmt::format(", test accuracy {:.2f}%", 100 * acc->second) : "");
    }
    return stop_at_ > 0 && steps_ >= stop_at_;
  }

  int finish(finish_context& ctx) override {
    auto mean = [](const std::vector<double>& v) {
      double s = 0;
      for (auto x : v)
        s += x;
      return v.empty() ? std::nan("") : s / static_cast<double>(v.size());
    };
    double sent = 0, received = 0;
    for (auto& [k, v] : sent_)
      sent += v;
    for (auto& [k, v] : received_)
      received += v;
    auto per_peer = sent_.empty() ? 0.0 : sent / static_cast<double>(sent_.size());
    auto per_peer_in = received_.empty() ? 0.0 : received / static_cast<double>(received_.size());
    auto acc = latest_accuracy();
    fmt::print("\ndedloc summary ({} mode, {:.1f} s of run time, {:.1f} s wall)\n",
               to_string(info_.mode), ctx.run_s, ctx.wall_s);
    fmt::print("  {:<34} {}\n", "global steps", steps_);
    fmt::print("  {:<34} {:.0f} ({:.1f}/s over {:.1f} s)\n", "samples in updates", samples_,
               last_t_ > 0 ? samples_ / last_t_ : 0.0, last_t_);
    fmt::print("  {:<34} {:.0f}\n", "samples dropped", dropped_);
    fmt::print("  {:<34} {} ({} averaged, mean {:.2f} s from start to update)\n", "peer updates",
               rounds_, averaged_, rounds_ > 0 ? round_s_ / static_cast<double>(rounds_) : 0.0);
    fmt::print("  {:<34} {} lone\n", "peer updates on own gradient", rounds_ - averaged_);
    fmt::print("  {:<34} {} resyncs after lone updates ({} failed), {} periodic ({} failed)\n",
               "state averaging rounds (per peer)", resyncs_.first, resyncs_.second,
               periodic_.first, periodic_.second);
    fmt::print("  {:<34} {} distinct ({} starts, {} in client mode), {} left on purpose\n", "peers",
               peers_.size(), joins_, clients_.size(), leaves_);
    fmt::print("  {:<34} {} done ({} by peers that had stepped alone), {} failed\n",
               "state downloads", downloads_, resync_downloads_, failed_downloads_);
    fmt::print("  {:<34} {:.2f} MB sent, {:.2f} MB received (mean per peer)\n", "traffic",
               per_peer / 1e6, per_peer_in / 1e6);
    fmt::print("  {:<34} {}\n", "faults", faults_);
    if (acc)
      fmt::print("  {:<34} {:.2f}% (loss {:.4f}) after step {}\n", "test accuracy",
                 100 * acc->second, mean(evals_.at(acc->first).loss), acc->first);
    if (export_)
      export_model(ctx);
    if (demo_)
      write_demo(ctx);
    write_plots(mean);
    return steps_ > 0 ? 0 : 1;
  }

private:
  /// The state of the live full-mode peer with the most global steps: every live instance of the
  /// role is asked for its counters, then, highest step first, for its whole state as one part
  /// (a request only full-mode peers serve) until one answers.
  result<final_model> take_final_model(finish_context& ctx, const std::string& role) {
    if (chosen_)
      return *chosen_;
    using namespace std::chrono_literals;
    final_model_options fo;
    fo.steps_at = dp::st_step;
    fo.ask_timeout = 10s;
    fo.donors = SIZE_MAX; // every live peer in turn, the most trained first
    fo.download.timeout = 60s;
    fo.download.parts = false;
    fo.download.whole = actors::collab::whole_policy::in_turn;
    fo.download.whole_as_part = true; // verified, and served by full-mode peers only
    auto peers = survey_peers(ctx, ctx.live(role), {}, fo);
    if (peers.empty())
      return fail(fmt::format("no live instance of '{}' answered at the end", role));
    final_model out;
    for (auto& p : rank_candidates(peers))
      out.steps_of_peers += fmt::format("{}{}", out.steps_of_peers.empty() ? "" : " ", p.steps);
    auto got = download_most_trained(ctx, peers, fo);
    if (!got)
      return fail(fmt::format("no live full-mode peer served its state ({}; steps of the live "
                              "peers: {})",
                              got.error().what, out.steps_of_peers));
    out.state = std::move(got->state);
    chosen_ = out;
    return out;
  }

  /// Writes grid.png and quality.json from the final model (the demo's outputs), with a line
  /// each.
  void write_demo(finish_context& ctx) {
    auto skipped = [](const std::string& why) {
      fmt::print("  {:<34} skipped: {}\n", "grid.png, quality.json", why);
    };
    if (info_.out_dir.empty())
      return skipped("no output directory");
    auto& o = demo_->peer;
    if (!o.t2i || !o.gpt)
      return skipped("not a text-to-image run (model kind gpt)");
    auto chosen = take_final_model(ctx, demo_->role);
    if (!chosen)
      return skipped(chosen.error().what);
    auto split = cache_->t2i(o);
    if (!split)
      return skipped(split.error().what);
    auto seed = info_.graph ? info_.graph->seed : 0;
    auto model = dp::make_torch_backend(torch_options(o, seed, 0), split->train, split->eval);
    if (!model)
      return skipped(model.error().what);
    auto& b = **model;
    if (auto st = b.import_state(chosen->state); !st)
      return skipped(st.what());
    auto held_out = b.evaluate();
    auto demo = o.demo;
    demo.seed = kernels::splitmix64_combine(seed, 0xDE30);
    demo.classifier.seed = seed;
    auto out = kernels::write_t2i_demo(*b.module(), *split->train, *split->eval, split->digest,
                                       demo, info_.out_dir);
    if (!out)
      return skipped(out.error().what);
    auto& r = out->report;
    fmt::print("  {:<34} {} (step {}{}; classifier {:.1f} s, sampling {:.1f} s)\n", "grid.png",
               out->grid_png, chosen->state.steps,
               held_out ? fmt::format(", held-out image-token loss {:.4f}, accuracy {:.2f}%",
                                      held_out->loss, 100 * held_out->accuracy)
                        : "",
               out->classifier_seconds, out->sampling_seconds);
    fmt::print("  {:<34} {} (classifier accuracy: real {:.3f}, reconstructions {:.3f}, generated "
               "{:.3f} over {} captions of {} samples)\n",
               "quality.json", out->quality_json, r.real, r.reconstruction, r.generated_mean(),
               r.generated.size(), demo.quality_samples);
  }

  /// Writes the final model into `<out>/export` with `export.json`, and one summary line.
  void export_model(finish_context& ctx) {
    auto skipped = [](const std::string& why) {
      fmt::print("  {:<34} skipped: {}\n", "export", why);
    };
    auto failed = [](const std::string& why) {
      fmt::print("  {:<34} failed: {}\n", "export", why);
    };
    auto began = std::chrono::steady_clock::now();
    if (info_.out_dir.empty())
      return skipped("no output directory");
    auto& o = export_->peer;
    if (auto st = check_dedloc_export(o); !st)
      return skipped(st.what());
    auto chosen = take_final_model(ctx, export_->role);
    if (!chosen)
      return skipped(chosen.error().what);
    auto data = cache_->get(o);
    if (!data)
      return failed(data.error().what);
    auto seed = info_.graph ? info_.graph->seed : 0;
    // A peer as every one starts (the initial held-out loss), then loaded with the final state.
    auto model = dp::make_torch_backend(torch_options(o, seed, 0), data->first, data->second);
    if (!model)
      return failed(model.error().what);
    auto& b = **model;
    auto before = b.evaluate();
    if (auto st = b.import_state(chosen->state); !st)
      return failed(st.what());
    auto after = b.evaluate();
    auto dir = info_.out_dir + "/export";
    b.module()->eval(); // saved in evaluation mode, as SWARM's export saves its stages
    auto loss_or_null = [](const std::optional<dp::evaluation>& e) {
      return e ? nlohmann::json(e->loss) : nlohmann::json(nullptr);
    };
    nlohmann::json j;
    j["step"] = chosen->state.steps;
    j["steps_of_live_peers"] = chosen->steps_of_peers;
    j["held_out_loss_before"] = loss_or_null(before);
    j["held_out_loss"] = loss_or_null(after);
    j["held_out_accuracy"] = after ? nlohmann::json(after->accuracy) : nlohmann::json(nullptr);
    // The held-out loss is the mean over the first `held_out_samples` samples of the eval data,
    // i.e. one batch of that many (windows of seq_len + 1 tokens for a token model).
    auto samples = after ? after->samples : 0;
    j["held_out_samples"] = samples;
    j["held_out_batches"] = samples > 0 ? 1 : 0;
    j["microbatch"] = samples;
    if (o.torchscript && o.torchscript->input_shape.empty())
      j["seq_len"] = o.torchscript->seq_len;
    else if (o.torchscript)
      j["input_shape"] = o.torchscript->input_shape; // images: the first held_out_samples
                                                     // test images, pixels / 255
    auto files = export_final_model({b.module().get()}, dir, j);
    if (!files)
      return failed(files.error().what);
    auto n = files->size();
    // Wall time of the whole export: the state's download, the evaluations, the files.
    auto ms = 1e3 * dedloc_secs(std::chrono::steady_clock::now() - began);
    auto written_files = fmt::format("{} file{} in {}", n, n == 1 ? "" : "s", dir);
    if (after)
      fmt::print("  {:<34} {} (export.json: held-out loss {:.6f}, step {}; {:.0f} ms)\n", "export",
                 written_files, after->loss, chosen->state.steps, ms);
    else
      fmt::print("  {:<34} {} (export.json: step {}; no held-out loss: no held-out data or "
                 "eval_samples 0; {:.0f} ms)\n",
                 "export", written_files, chosen->state.steps, ms);
  }

  struct eval_points {
    std::vector<double> accuracy, loss, bytes;
  };

  std::optional<std::pair<uint64_t, double>> latest_accuracy() const {
    if (evals_.empty())
      return std::nullopt;
    auto& [step, e] = *evals_.rbegin();
    double s = 0;
    for (auto a : e.accuracy)
      s += a;
    return std::make_pair(step, s / static_cast<double>(e.accuracy.size()));
  }

  template <class Mean>
  void write_plots(const Mean& mean) {
    if (info_.out_dir.empty() || evals_.empty())
      return;
    // Samples before the update that made step s: every update of steps < s.
    std::map<uint64_t, double> cumulative;
    double run = 0;
    uint64_t s = 0;
    for (auto& [step, n] : step_samples_) {
      for (; s <= step; ++s)
        cumulative[s] = run;
      run += n;
    }
    cumulative[s] = run;
    auto samples_at = [&](uint64_t step) {
      auto it = cumulative.upper_bound(step);
      return it == cumulative.begin() ? 0.0 : std::prev(it)->second;
    };
    plot::series acc_s{"test accuracy", {}}, loss_s{"test loss", {}}, train_s{"training loss", {}};
    plot::series acc_b{"test accuracy", {}}, loss_b{"test loss", {}};
    for (auto& [step, e] : evals_) {
      auto x = samples_at(step);
      acc_s.points.emplace_back(x, mean(e.accuracy));
      loss_s.points.emplace_back(x, mean(e.loss));
      acc_b.points.emplace_back(mean(e.bytes) / 1e6, mean(e.accuracy));
      loss_b.points.emplace_back(mean(e.bytes) / 1e6, mean(e.loss));
    }
    for (auto& [step, v] : train_loss_)
      train_s.points.emplace_back(samples_at(step + 1), mean(v));
    auto dir = info_.out_dir;
    plot::line_plot p;
    p.title = "test accuracy against samples";
    p.x_label = "samples in updates";
    p.y_label = "accuracy";
    p.lines = {acc_s};
    (void)plot::write_svg(p, dir + "/accuracy.svg");
    p.title = "loss against samples";
    p.y_label = "cross-entropy";
    p.lines = {loss_s, train_s};
    (void)plot::write_svg(p, dir + "/loss.svg");
    p.title = "test accuracy against bytes sent";
    p.x_label = "MB sent per peer";
    p.y_label = "accuracy";
    p.lines = {acc_b};
    (void)plot::write_svg(p, dir + "/accuracy_bytes.svg");
    p.title = "test loss against bytes sent";
    p.y_label = "cross-entropy";
    p.lines = {loss_b};
    (void)plot::write_svg(p, dir + "/loss_bytes.svg");
    fmt::print("  {:<34} {}/accuracy.svg, loss.svg, accuracy_bytes.svg, loss_bytes.svg\n", "plots",
               dir);
  }

  std::optional<dedloc_export_options> export_;
  std::optional<dedloc_export_options> demo_;
  /// The final model, downloaded once for the export and the demo's outputs.
  std::optional<final_model> chosen_;
  std::shared_ptr<data_cache> cache_;
  run_info info_;
  std::map<uint64_t, double> step_samples_;
  std::map<uint64_t, std::vector<double>> train_loss_;
  std::map<uint64_t, eval_points> evals_;
  std::map<std::string, double> sent_, received_;
  std::set<std::string> peers_, clients_;
  double samples_ = 0, dropped_ = 0, round_s_ = 0, last_t_ = 0;
  uint64_t stop_at_ = 0;
  uint64_t steps_ = 0, rounds_ = 0, averaged_ = 0;
  uint64_t joins_ = 0, leaves_ = 0, downloads_ = 0, failed_downloads_ = 0, faults_ = 0;
  uint64_t resync_downloads_ = 0;
  /// State rounds a peer took part in: (ended, of which not loaded), resyncs and periodic ones.
  std::pair<uint64_t, uint64_t> resyncs_, periodic_;
  double next_ = 10;
};

void read_reals(config_node& n, const std::string& key, std::vector<double>& out) {
  if (!n.has(key))
    return;
  auto c = n.child(key);
  out.clear();
  for (auto& item : c.items()) {
    auto v = item.as_double();
    if (!(v > 0) || !std::isfinite(v))
      item.expected("a positive speed");
    out.push_back(v);
  }
  if (out.empty())
    c.expected("at least one speed");
}

/// Reads a duration into the collaborative optimizer's seconds.
void read_seconds(config_node& n, const std::string& key, actors::collab::seconds& out) {
  auto d = std::chrono::duration_cast<nanoseconds>(std::chrono::duration<double>(out));
  read_duration(n, key, d);
  out = dedloc_secs(d);
}

/// Reads one of `choices`' names into its value.
template <class Enum>
void read_enum(config_node& n, const std::string& key, Enum& out,
               const std::vector<std::pair<std::string, Enum>>& choices) {
  std::string name;
  std::vector<std::string> names;
  for (auto& [k, v] : choices) {
    names.push_back(k);
    if (v == out)
      name = k;
  }
  read_choice(n, key, name, names);
  for (auto& [k, v] : choices)
    if (k == name)
      out = v;
}

/// Reads a codec that must be one of `choices`.
void read_codec(config_node& n, const std::string& key, kernels::codec_id& out,
                const std::vector<std::string>& choices) {
  std::string name{kernels::to_string(out)};
  read_choice(n, key, name, choices);
  out = *kernels::parse_codec(name);
}

/// Reads `model: {kind: gpt, ...}`: the GPT's shape and the codebook of the demo's data.
void read_t2i_model(config_node& m, dedloc_role_options& o) {
  kernels::gpt_config g;
  g.layers = 2;
  g.width = 64;
  g.heads = 4;
  read_positive(m, "layers", g.layers);
  read_positive(m, "width", g.width);
  read_positive(m, "heads", g.heads);
  read_real(m, "dropout", g.dropout, 0, 0.9);
  kernels::t2i_data_options t;
  t.codebook.codes = 256;
  t.codebook.max_images = 2000;
  t.codebook.max_iterations = 20;
  read_positive(m, "codes", t.codebook.codes);
  read_positive(m, "patch", t.codebook.patch);
  read_non_negative(m, "codebook_images", t.codebook.max_images);
  read_positive(m, "codebook_iterations", t.codebook.max_iterations);
  read_non_negative(m, "codebook_seed", t.codebook.seed);
  t.caption_seed = t.codebook.seed;
  read(m, "codebook_digest", t.codebook_digest);
  if (auto st = kernels::validate(t); !st)
    m.fail(st.what());
  auto layout = t2i_layout_of(t);
  g.vocab = layout.vocab();
  g.seq_len = layout.sequence_length() - 1;
  if (auto st = kernels::validate(g); !st)
    m.fail(st.what());
  o.gpt = g;
  o.t2i = t;
}

/// Reads `demo:`, what the end of a text-to-image run samples and measures.
void read_t2i_demo(config_node& d, kernels::t2i_demo_options& o) {
  read_positive(d, "grid_samples", o.grid_samples);
  read_positive(d, "quality_samples", o.quality_samples);
  read_real(d, "temperature", o.temperature, 0, 100);
  read_non_negative(d, "top_k", o.top_k);
  read_positive(d, "test_images", o.test_images);
  read_positive(d, "classifier_epochs", o.classifier.epochs);
  if (auto st = kernels::validate(o); !st)
    d.fail(st.what());
}

} // namespace

kernels::t2i_layout t2i_layout_of(const kernels::t2i_data_options& t) {
  kernels::t2i_layout l;
  l.codes = static_cast<int64_t>(t.codebook.codes);
  auto side = t.codebook.patch == 0 ? 0 : 28 / static_cast<int64_t>(t.codebook.patch);
  l.image_tokens = side * side;
  return l;
}

dedloc_role_options::dedloc_role_options() {
  peer.compute_time = std::chrono::milliseconds(50);
  peer.eval_every = 5;
  peer.inner_batch = 128;
  peer.collab.progress.target_batch = 1024;
  peer.collab.progress.record_lifetime = 30;
  averager.target_group_size = 64;
  averager.round_timeout = std::chrono::seconds(15);
  averager.family_groups = true;
  torch.model.inputs = 0; // the data's
  torch.model.classes = 0;
  torch.model.width = 128;
  torch.model.layers = 1;
  torch.eval_samples = 2000;
  data.kind = "idx";
}

void read_dedloc_role(config_node& n, dedloc_role_options& o) {
  auto& p = o.peer;
  auto& c = p.collab;
  auto& a = o.averager;
  auto& t = o.torch;
  read_choice(n, "backend", o.backend, {"torch", "modeled"});
  read_non_negative(n, "clients", o.clients);
  read_non_negative(n, "cycle", o.cycle);
  read_reals(n, "speeds", o.speeds);
  // The peer and its collaborative optimizer.
  read_enum(n, "algorithm", p.algo,
            {{"dedloc", dp::algorithm::dedloc}, {"diloco", dp::algorithm::diloco}});
  read_enum(n, "mode", c.mode,
            {{"full", actors::collab::peer_mode::full},
             {"client", actors::collab::peer_mode::client},
             {"auxiliary", actors::collab::peer_mode::auxiliary}});
  read_duration(n, "compute_time", p.compute_time);
  read_non_negative(n, "eval_every", p.eval_every);
  read_positive(n, "target_batch", c.progress.target_batch);
  read_seconds(n, "record_lifetime", c.progress.record_lifetime);
  read_seconds(n, "round_timeout", c.round_timeout);
  read_non_negative(n, "average_state_every", c.average_state_every);
  read(n, "resync_after_lone_step", c.resync_after_lone_step);
  read(n, "resync_by_download", c.resync_by_download);
  read(n, "delay_updates", c.delay_updates);
  // DiLoCo: the inner batch, the outer SGD step and the pseudo-gradients' codec.
  read_positive(n, "inner_batch", p.inner_batch);
  read_real(n, "outer_lr", p.diloco.outer.lr, 0, 10);
  read_real(n, "outer_momentum", p.diloco.outer.momentum, 0, 0.999);
  read(n, "outer_nesterov", p.diloco.outer.nesterov);
  read_codec(n, "outer_codec", p.diloco.codec, {"none", "fp16", "blockwise8", "quantile8", "topk"});
  read_real(n, "outer_ratio", p.diloco.codec_params.ratio, 1e-6, 1);
  read(n, "error_feedback", p.diloco.error_feedback);
  // DeDLOC's averager.
  read_duration(n, "window", a.matchmaking_window);
  read_duration(n, "averager_timeout", a.round_timeout);
  read_codec(n, "codec", a.codec, {"none", "fp16", "blockwise8", "quantile8"});
  read_positive(n, "group_size", a.target_group_size);
  read(n, "persistent_rounds", a.family_groups);
  // The backends.
  read_positive(n, "microbatch", t.stream.microbatch);
  read_positive(n, "width", t.model.width);
  read_positive(n, "layers", t.model.layers);
  read_choice(n, "optimizer", t.optimizer.kind, {"adam", "lamb", "lamb8", "sgd"});
  read_real(n, "lr", t.optimizer.lr, 0, 10);
  read_real(n, "momentum", t.optimizer.momentum, 0, 0.999);
  read_real(n, "max_grad_norm", t.optimizer.max_grad_norm, 0, 1e9);
  read_non_negative(n, "eval_samples", t.eval_samples);
  read_int(n, "torch_threads", o.torch_threads, 0, 256);
  read_positive(n, "modeled_params", o.modeled.numel);
  read(n, "data_dir", o.data.idx.dir);
  read(n, "synthetic", o.data.idx.synthetic_when_absent);
  read_non_negative(n, "train_samples", o.data.idx.max_items);
  if (n.has("model")) {
    auto m = n.child("model");
    std::string kind = "mlp";
    read_choice(m, "kind", kind, {"mlp", "torchscript", "gpt"});
    if (kind == "torchscript") {
      m.allow(graph::torchscript_keys());
      o.torchscript = graph::read_torchscript_model(m);
    } else if (kind == "gpt") {
      read_t2i_model(m, o);
    }
    m.finish();
  }
  if (n.has("demo")) {
    auto d = n.child("demo");
    if (!o.gpt)
      d.fail("demo belongs to the text-to-image demo (model: {kind: gpt, ...})");
    read_t2i_demo(d, o.demo);
    d.finish();
  }
  if (n.has("data")) {
    auto d = n.child("data");
    graph::read_data_section(d, o.data, {"idx", "tokens"});
    d.finish();
  }
  if (o.t2i) {
    // The demo reads Fashion-MNIST (data_dir, train_samples, synthetic), held out: the test
    // images its evaluations and its quality measure.
    o.t2i->images = o.data.idx;
    o.t2i->eval_images = std::max<std::size_t>(o.torch.eval_samples, o.demo.test_images);
  }
}

status check_dedloc_role(const dedloc_role_options& o) {
  auto& p = o.peer;
  auto& c = p.collab;
  auto& a = o.averager;
  if (o.backend != "torch" && o.backend != "modeled")
    return fail(fmt::format("backend must be torch or modeled, got '{}'", o.backend));
  if (o.speeds.empty())
    return fail("speeds needs at least one value");
  for (auto v : o.speeds)
    if (!(v > 0) || !std::isfinite(v))
      return fail(fmt::format("speeds must be positive, got {}", v));
  if (p.compute_time <= nanoseconds{0})
    return fail("compute_time must be positive (it paces the peers in every mode)");
  auto microbatch = o.torch.stream.microbatch;
  if (microbatch == 0 || c.progress.target_batch == 0 || o.torch.model.width < 1 ||
      o.torch.model.layers < 1)
    return fail("microbatch, target_batch, width and layers must be positive");
  if (c.progress.target_batch < microbatch)
    return fail(fmt::format("target_batch {} is below one microbatch ({})", c.progress.target_batch,
                            microbatch));
  if (a.matchmaking_window <= nanoseconds{0} || a.round_timeout <= nanoseconds{0} ||
      !(c.round_timeout > 0) || !(c.progress.record_lifetime > 0))
    return fail("window, averager_timeout, round_timeout and record_lifetime must be positive");
  if (o.clients > 0 && o.cycle == 0)
    return fail("clients needs cycle (the instances it counts in)");
  if (c.delay_updates && p.algo == dp::algorithm::diloco)
    return fail("delay_updates belongs to algorithm dedloc (DiLoCo's outer step replaces the "
                "parameters the inner steps would have moved meanwhile)");
  if (o.gpt) {
    if (!o.t2i)
      return fail("model kind gpt needs its data options (the demo's codebook)");
    if (o.backend != "torch")
      return fail("model kind gpt trains with backend: torch");
    if (o.data.kind != "idx")
      return fail(fmt::format("model kind gpt reads captioned Fashion-MNIST images (data kind "
                              "idx, the default), got data kind {}",
                              o.data.kind));
    if (auto st = kernels::validate(*o.t2i); !st)
      return st;
    if (auto st = kernels::validate(o.demo); !st)
      return st;
  }
  bool token_model = o.torchscript && o.torchscript->input_shape.empty();
  if (token_model && o.data.kind != "tokens")
    return fail("a TorchScript model of tokens needs data: {kind: tokens, path: F}");
  if (o.data.kind == "tokens" && !token_model)
    return fail("data kind tokens needs a TorchScript model of tokens (model: {kind: "
                "torchscript, files: [...]}); the MLP reads images");
  return {};
}

status check_dedloc_data(const dedloc_role_options& o, const kernels::sample_shape& data) {
  if (!o.torchscript || o.torchscript->input_shape.empty())
    return {}; // the MLP takes its sizes from the data; a token model's vocabulary is the data's
  auto& ts = *o.torchscript;
  auto features = [](const std::vector<int64_t>& shape) {
    return std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
  };
  if (features(ts.input_shape) != features(data.input))
    return fail(fmt::format("a TorchScript model of images reads the data's samples: "
                            "model.input_shape must hold their {} features (samples of [{}]; "
                            "any shape of as many), got [{}]",
                            features(data.input), fmt::join(data.input, ", "),
                            fmt::join(ts.input_shape, ", ")));
  if (ts.vocab < data.classes)
    return fail(fmt::format("model.vocab is the class count of a TorchScript model of images "
                            "(its output's features): at least the data's {} classes, got {}",
                            data.classes, ts.vocab));
  return {};
}

status check_dedloc_export(const dedloc_role_options& o) {
  if (o.backend != "torch")
    return fail(fmt::format("export needs the torch backend (the {} backend has no parameters "
                            "to export)",
                            o.backend));
  return {};
}

std::unique_ptr<reporter> make_dedloc_reporter(std::optional<dedloc_export_options> export_model,
                                               std::optional<dedloc_export_options> demo) {
  return std::make_unique<dedloc_reporter>(std::move(export_model), std::make_shared<data_cache>(),
                                           0, std::move(demo));
}

void add_dedloc(role_registry& reg) {
  auto cache = std::make_shared<data_cache>();
  reg.add<dedloc_role_options>(
      "dedloc.peer",
      "a data-parallel peer (DeDLOC or DiLoCo) with a LibTorch MLP, the text-to-image GPT, a "
      "TorchScript model or the cost model",
      [cache](role_context& ctx, const dedloc_role_options& o) {
        return spawn_peer(ctx, o, cache);
      },
      read_dedloc_role, check_dedloc_role,
      [](const dedloc_role_options& o) {
        return fmt::format("{} {} backend, target batch {}, microbatch {}, {} speeds, {} clients "
                           "per {}",
                           dp::to_string(o.peer.algo), o.backend,
                           o.peer.collab.progress.target_batch, o.torch.stream.microbatch,
                           o.speeds.size(), o.clients, o.cycle);
      });
  kind_type k;
  k.name = "dedloc";
  k.summary = "data-parallel peers training together (DeDLOC or DiLoCo), joining and leaving";
  k.expand = [cache](config_node& n, experiment_graph& g, const expand_context& ctx) {
    int64_t peers = 8, auxiliary = 0, steps = 0, volunteers = 0;
    double churn = 0;
    bool export_model = false;
    read_int(n, "peers", peers, 1, 100000);
    read_int(n, "steps", steps, 0, int64_t{1} << 40);
    read_int(n, "auxiliary", auxiliary, 0, 100000);
    read_int(n, "volunteers", volunteers, 0, 100000);
    read_real(n, "churn", churn, 0, 60);
    read(n, "export", export_model);
    dedloc_role_options o;
    o.cycle = static_cast<uint64_t>(peers);
    read_dedloc_role(n, o);
    if (auto st = check_dedloc_role(o); !st)
      n.fail(st.what());
    if (o.peer.collab.mode == actors::collab::peer_mode::auxiliary)
      n.fail("mode: the peers of the kind compute; add auxiliary peers with `auxiliary: N`");
    if (export_model)
      if (auto st = check_dedloc_export(o); !st)
        n.child("export").fail(st.what());
    if (o.backend == "torch" && o.torchscript && !o.torchscript->input_shape.empty()) {
      // A scripted model of images is checked against the data it will read, so that a mismatch
      // is a config error: the shape of a source made of its first sample (the peers load it
      // whole when they start).
      auto probe = o.data;
      probe.idx.max_items = 1;
      auto data = kernels::make_data_source(probe);
      if (!data)
        n.fail(data.error().what);
      if (auto st = check_dedloc_data(o, (*data)->shape()); !st)
        n.child("model").fail(st.what());
    }
    role_spec r;
    r.name = "peers";
    r.type = "dedloc.peer";
    r.replicas = static_cast<size_t>(peers);
    r.options = o;
    r.restart.delay = std::chrono::seconds(5);
    g.roles.push_back(r);
    if (volunteers > 0) {
      // Open slots (`starling join`, or `starling node` without --index): data-parallel peers
      // like the others, in the mode the volunteer's own reachability gives it (`mode`), never
      // a client by position.
      auto v = o;
      v.clients = 0;
      v.seed_offset = static_cast<uint64_t>(peers);
      v.collaboration = "peers";
      role_spec vr;
      vr.name = "volunteers";
      vr.type = "dedloc.peer";
      vr.replicas = static_cast<size_t>(volunteers);
      vr.options = v;
      vr.placement.open = true;
      g.roles.push_back(vr);
    }
    if (auxiliary > 0) {
      auto a = o;
      a.peer.collab.mode = actors::collab::peer_mode::auxiliary;
      a.clients = 0;
      role_spec aux;
      aux.name = "aux";
      aux.type = "dedloc.peer";
      aux.replicas = static_cast<size_t>(auxiliary);
      aux.options = a;
      g.roles.push_back(aux);
    }
    (void)ctx;
    if (churn > 0) {
      churn_spec c;
      c.role = "peers";
      c.per_minute = churn;
      c.rejoin_after = std::chrono::seconds(5);
      c.keep = 2;
      // Client-mode peers serve no state: with only clients left, newcomers would start anew.
      c.serves = [o](size_t i) { return mode_of(o, i) == actors::collab::peer_mode::full; };
      g.churn.push_back(std::move(c));
    }
    std::optional<dedloc_export_options> ex, demo;
    if (export_model)
      ex = dedloc_export_options{"peers", o};
    if (o.gpt)
      demo = dedloc_export_options{"peers", o};
    g.reporters.push_back([ex, demo, cache, steps]() -> std::unique_ptr<reporter> {
      return std::make_unique<dedloc_reporter>(ex, cache, static_cast<uint64_t>(steps), demo);
    });
  };
  reg.add_kind(std::move(k));
}

} // namespace starling::runtime
