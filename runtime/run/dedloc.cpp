// The `dedloc` kind: role type, YAML reader, expansion (peers, auxiliary peers, a seeded churn
// schedule), and the reporter. See dedloc.hpp.
#include "runtime/run/dedloc.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include <caf/all.hpp>
#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "actors/averager/averager.hpp"
#include "actors/dp_peer/backend.hpp"
#include "actors/dp_peer/dp_peer.hpp"
#include "kernels/compress/format.hpp"
#include "kernels/data/idx_source.hpp"
#include "kernels/data/token_source.hpp"
#include "kernels/models/torchscript.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/experiment/download.hpp"
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

/// Fashion-MNIST (or its synthetic stand-in), loaded once per process and shared by its peers.
class data_cache {
public:
  using sources = std::pair<std::shared_ptr<const kernels::data_source>,
                            std::shared_ptr<const kernels::data_source>>;

  result<sources> get(const dedloc_role_options& o) {
    std::lock_guard<std::mutex> guard{mtx_};
    auto key = fmt::format("{}|{}|{}|{}|{}", o.data_dir, o.synthetic, o.train_samples,
                           o.tokens_path, o.tokens_eval_path);
    if (auto i = cache_.find(key); i != cache_.end())
      return i->second;
    if (o.data_kind == "tokens") {
      kernels::token_source_options to;
      to.file.path = o.tokens_path;
      to.file.dtype = o.tokens_dtype;
      to.file.vocab_size = static_cast<uint64_t>(o.torchscript ? o.torchscript->vocab : 0);
      to.seq_len = o.torchscript ? o.torchscript->seq_len : 0;
      auto train = kernels::token_source::make(to);
      if (!train)
        return train.error();
      sources s{*train, nullptr};
      if (!o.tokens_eval_path.empty()) {
        to.file.path = o.tokens_eval_path;
        auto eval = kernels::token_source::make(to);
        if (!eval)
          return eval.error();
        s.second = *eval;
      }
      cache_[key] = s;
      return s;
    }
    kernels::idx_source_options io;
    io.dir = o.data_dir;
    io.train = true;
    io.max_items = o.train_samples;
    io.synthetic_when_absent = o.synthetic;
    auto train = kernels::idx_source::load(io);
    if (!train)
      return train.error();
    io.train = false;
    io.max_items = 0;
    auto test = kernels::idx_source::load(io);
    if (!test)
      return test.error();
    sources s{*train, *test};
    cache_[key] = s;
    return s;
  }

private:
  std::mutex mtx_;
  std::map<std::string, sources> cache_;
};

actors::collab::peer_mode mode_of(const dedloc_role_options& o, size_t index) {
  if (o.cycle > 0 && o.clients > 0 && index % o.cycle >= o.cycle - std::min(o.clients, o.cycle))
    return actors::collab::peer_mode::client;
  if (o.mode == "client")
    return actors::collab::peer_mode::client;
  if (o.mode == "auxiliary")
    return actors::collab::peer_mode::auxiliary;
  return actors::collab::peer_mode::full;
}

kernels::codec_id codec_of(const std::string& name) {
  auto c = kernels::parse_codec(name);
  return c ? *c : kernels::codec_id::none;
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
  dp::torch_backend_options to;
  to.model.inputs = 784;
  to.model.width = o.width;
  to.model.layers = o.layers;
  to.model.classes = 10;
  to.model.seed = seed;
  if (o.torchscript)
    to.spec = kernels::torchscript_model(*o.torchscript);
  to.optimizer.kind = o.optimizer;
  to.optimizer.lr = o.lr;
  to.optimizer.momentum = o.momentum;
  to.optimizer.max_grad_norm = o.max_grad_norm;
  to.stream.seed = seed;
  to.stream.stream = stream;
  to.stream.microbatch = o.microbatch;
  to.eval_samples = o.eval_samples;
  return to;
}

caf::actor spawn_peer(role_context& ctx, const dedloc_role_options& o,
                      const std::shared_ptr<data_cache>& cache) {
  auto& h = ctx.node;
  auto mode = mode_of(o, ctx.index);
  auto speed = o.speeds.empty() ? 1.0 : o.speeds[ctx.index % o.speeds.size()];
  std::shared_ptr<dp::backend> model;
  if (o.backend == "modeled") {
    dp::modeled_backend_options mo;
    mo.numel = o.modeled_params;
    mo.microbatch = o.microbatch;
    auto b = dp::make_modeled_backend(mo);
    if (!b)
      return {};
    model = std::move(*b);
  } else {
    auto data = cache->get(o);
    if (!data) {
      fmt::print(stderr, "starling: {}: {}\n", ctx.name, data.error().what);
      return {};
    }
    auto to = torch_options(o, h.graph().seed,
                            static_cast<uint64_t>(ctx.index) * 1024 +
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
  dp::dp_peer_options po;
  po.address = ctx.address_of(ctx.role.name, ctx.index);
  po.name = ctx.name;
  po.key_prefix = ctx.key_prefix() + "/dp/" + ctx.role.name;
  po.generation = ctx.generation;
  po.algo = o.algorithm == "diloco" ? dp::algorithm::diloco : dp::algorithm::dedloc;
  po.speed = speed;
  po.compute_time = o.compute_time;
  po.eval_every = o.eval_every;
  auto& c = po.collab;
  c.mode = mode;
  c.progress.target_batch = o.target_batch;
  c.progress.record_lifetime = dedloc_secs(o.record_lifetime);
  c.progress.max_refresh = std::min(30.0, dedloc_secs(o.record_lifetime) / 2);
  c.round_timeout = dedloc_secs(o.round_timeout);
  c.average_state_every = o.average_state_every;
  c.resync_after_lone_step = o.resync_after_lone_step;
  c.resync_by_download = o.resync_by_download;
  c.delay_updates = o.delay_updates;
  po.inner_batch = o.inner_batch;
  po.diloco.outer.kind = "sgd";
  po.diloco.outer.lr = o.outer_lr;
  po.diloco.outer.momentum = o.outer_momentum;
  po.diloco.outer.nesterov = o.outer_nesterov && o.outer_momentum > 0;
  po.diloco.outer.max_grad_norm = 0;
  po.diloco.codec = codec_of(o.outer_codec);
  po.diloco.codec_params.ratio = o.outer_ratio;
  po.diloco.error_feedback = o.error_feedback && po.diloco.codec != kernels::codec_id::randk &&
                             po.diloco.codec != kernels::codec_id::none;
  auto codec = codec_of(o.codec);
  po.wire_bytes_per_element = wire_bytes(codec);
  caf::actor averager;
  {
    // DiLoCo's rounds are the averager's Top-k rounds (the peer asks for them; no chunk codec).
    actors::averager::averager_options ao;
    ao.key_prefix = ctx.key_prefix() + "/avg/";
    ao.bandwidth = mode == actors::collab::peer_mode::client ? 0.0 : 1.0;
    ao.auxiliary = mode == actors::collab::peer_mode::auxiliary;
    ao.target_group_size = static_cast<uint32_t>(o.group_size);
    ao.family_groups = o.persistent_rounds;
    ao.matchmaking_window = std::chrono::duration_cast<caf::timespan>(o.window);
    ao.poll_interval = std::chrono::duration_cast<caf::timespan>(o.window / 8);
    ao.round_timeout = std::chrono::duration_cast<caf::timespan>(o.averager_timeout);
    ao.codec = po.algo == dp::algorithm::diloco ? kernels::codec_id::none : codec;
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
                  std::shared_ptr<data_cache> cache, uint64_t stop_at = 0)
      : export_(std::move(export_model)), cache_(std::move(cache)), stop_at_(stop_at) {
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
    write_plots(mean);
    return steps_ > 0 ? 0 : 1;
  }

private:
  /// The state of the live full-mode peer with the most global steps: every live instance of the
  /// role is asked for its counters, then, highest step first, for its whole state as one part
  /// (a request only full-mode peers serve) until one answers.
  result<final_model> take_final_model(finish_context& ctx) {
    using namespace std::chrono_literals;
    std::vector<std::pair<uint64_t, caf::actor>> peers;
    for (auto& a : ctx.live(export_->role)) {
      auto c = ask<std::vector<uint64_t>>(ctx, a, 10s, status_atom::value);
      if (c && std::get<0>(*c).size() > dp::st_step)
        peers.emplace_back(std::get<0>(*c)[dp::st_step], a);
    }
    if (peers.empty())
      return fail(fmt::format("no live instance of '{}' answered at the end", export_->role));
    std::stable_sort(peers.begin(), peers.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    final_model out;
    for (auto& [step, a] : peers)
      out.steps_of_peers += fmt::format("{}{}", out.steps_of_peers.empty() ? "" : " ", step);
    std::vector<caf::actor> donors;
    for (auto& [step, a] : peers)
      donors.push_back(a);
    actors::collab::download_options o;
    o.timeout = 60s;
    o.parts = false;
    o.whole = actors::collab::whole_policy::in_turn;
    o.whole_as_part = true; // verified, and served by full-mode peers only
    auto got = download_state(ctx, actors::collab::donor_source::of(std::move(donors)), o,
                              o.timeout * static_cast<int64_t>(peers.size()) + 1s);
    if (!got)
      return fail(fmt::format("no live full-mode peer served its state ({}; steps of the live "
                              "peers: {})",
                              got.error().what, out.steps_of_peers));
    out.state = std::move(got->state);
    return out;
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
    auto chosen = take_final_model(ctx);
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
    auto written = kernels::export_stage(*b.module(), 0, dir);
    if (!written)
      return failed(written.error().what);
    nlohmann::json files = nlohmann::json::array();
    for (auto& f : written->torchscript)
      files.push_back(f);
    for (auto& f : written->state_dicts)
      files.push_back(f);
    auto loss_or_null = [](const std::optional<dp::evaluation>& e) {
      return e ? nlohmann::json(e->loss) : nlohmann::json(nullptr);
    };
    nlohmann::json j;
    j["files"] = files;
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
    std::ofstream out{dir + "/export.json"};
    out << j.dump(2) << "\n";
    out.close();
    if (!out)
      return failed(fmt::format("{}/export.json: cannot write", dir));
    auto n = files.size();
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

} // namespace

void read_dedloc_role(config_node& n, dedloc_role_options& o) {
  read_choice(n, "algorithm", o.algorithm, {"dedloc", "diloco"});
  read_choice(n, "backend", o.backend, {"torch", "modeled"});
  read_choice(n, "mode", o.mode, {"full", "client", "auxiliary"});
  read_non_negative(n, "clients", o.clients);
  read_non_negative(n, "cycle", o.cycle);
  read_reals(n, "speeds", o.speeds);
  read_duration(n, "compute_time", o.compute_time);
  read_positive(n, "microbatch", o.microbatch);
  read_positive(n, "target_batch", o.target_batch);
  read_positive(n, "width", o.width);
  read_positive(n, "layers", o.layers);
  read_choice(n, "optimizer", o.optimizer, {"adam", "lamb", "sgd"});
  read_real(n, "lr", o.lr, 0, 10);
  read_real(n, "momentum", o.momentum, 0, 0.999);
  read_real(n, "max_grad_norm", o.max_grad_norm, 0, 1e9);
  read_non_negative(n, "eval_every", o.eval_every);
  read_non_negative(n, "eval_samples", o.eval_samples);
  read(n, "data_dir", o.data_dir);
  read(n, "synthetic", o.synthetic);
  read_non_negative(n, "train_samples", o.train_samples);
  read_positive(n, "modeled_params", o.modeled_params);
  read_duration(n, "window", o.window);
  read_duration(n, "averager_timeout", o.averager_timeout);
  read_choice(n, "codec", o.codec, {"none", "fp16", "blockwise8", "quantile8"});
  read_positive(n, "group_size", o.group_size);
  read_duration(n, "round_timeout", o.round_timeout);
  read_non_negative(n, "average_state_every", o.average_state_every);
  read(n, "resync_after_lone_step", o.resync_after_lone_step);
  read(n, "resync_by_download", o.resync_by_download);
  read(n, "persistent_rounds", o.persistent_rounds);
  read(n, "delay_updates", o.delay_updates);
  read_duration(n, "record_lifetime", o.record_lifetime);
  read_positive(n, "inner_batch", o.inner_batch);
  read_real(n, "outer_lr", o.outer_lr, 0, 10);
  read_real(n, "outer_momentum", o.outer_momentum, 0, 0.999);
  read(n, "outer_nesterov", o.outer_nesterov);
  read_choice(n, "outer_codec", o.outer_codec, {"none", "fp16", "blockwise8", "quantile8", "topk"});
  read_real(n, "outer_ratio", o.outer_ratio, 1e-6, 1);
  read(n, "error_feedback", o.error_feedback);
  if (n.has("model")) {
    auto m = n.child("model");
    std::string kind = "mlp";
    read_choice(m, "kind", kind, {"mlp", "torchscript"});
    if (kind == "torchscript") {
      m.allow(graph::torchscript_keys());
      o.torchscript = graph::read_torchscript_model(m);
    }
    m.finish();
  }
  if (n.has("data")) {
    auto d = n.child("data");
    d.allow({"kind", "path", "eval_path", "dtype"});
    read_choice(d, "kind", o.data_kind, {"idx", "tokens"});
    if (o.data_kind == "tokens") {
      if (!d.has("path"))
        d.fail("missing required key 'path' (a raw uint16 or uint32 token file)");
      o.tokens_path = d.child("path").as_string();
      read(d, "eval_path", o.tokens_eval_path);
      if (d.has("dtype")) {
        auto t = kernels::parse_token_dtype(d.child("dtype").as_string());
        if (!t)
          d.child("dtype").expected("uint16 | uint32");
        o.tokens_dtype = *t;
      }
    } else if (d.has("path") || d.has("eval_path") || d.has("dtype")) {
      d.fail("'path', 'eval_path' and 'dtype' belong to kind: tokens (kind idx reads data_dir)");
    }
    d.finish();
  }
}

status check_dedloc_role(const dedloc_role_options& o) {
  if (o.algorithm != "dedloc" && o.algorithm != "diloco")
    return fail(fmt::format("algorithm must be dedloc or diloco, got '{}'", o.algorithm));
  if (o.backend != "torch" && o.backend != "modeled")
    return fail(fmt::format("backend must be torch or modeled, got '{}'", o.backend));
  if (o.mode != "full" && o.mode != "client" && o.mode != "auxiliary")
    return fail(fmt::format("mode must be full, client or auxiliary, got '{}'", o.mode));
  if (o.speeds.empty())
    return fail("speeds needs at least one value");
  for (auto v : o.speeds)
    if (!(v > 0) || !std::isfinite(v))
      return fail(fmt::format("speeds must be positive, got {}", v));
  if (o.compute_time <= nanoseconds{0})
    return fail("compute_time must be positive (it paces the peers in every mode)");
  if (o.microbatch == 0 || o.target_batch == 0 || o.width < 1 || o.layers < 1)
    return fail("microbatch, target_batch, width and layers must be positive");
  if (o.target_batch < o.microbatch)
    return fail(
        fmt::format("target_batch {} is below one microbatch ({})", o.target_batch, o.microbatch));
  for (auto* c : {&o.codec, &o.outer_codec})
    if (!kernels::parse_codec(*c))
      return fail(fmt::format("unknown codec '{}'", *c));
  if (o.window <= nanoseconds{0} || o.averager_timeout <= nanoseconds{0} ||
      o.round_timeout <= nanoseconds{0} || o.record_lifetime <= nanoseconds{0})
    return fail("window, averager_timeout, round_timeout and record_lifetime must be positive");
  if (o.clients > 0 && o.cycle == 0)
    return fail("clients needs cycle (the instances it counts in)");
  if (o.delay_updates && o.algorithm == "diloco")
    return fail("delay_updates belongs to algorithm dedloc (DiLoCo's outer step replaces the "
                "parameters the inner steps would have moved meanwhile)");
  bool token_model = o.torchscript && o.torchscript->input_shape.empty();
  if (token_model && o.data_kind != "tokens")
    return fail("a TorchScript model of tokens needs data: {kind: tokens, path: F}");
  if (o.data_kind == "tokens" && !token_model)
    return fail("data kind tokens needs a TorchScript model of tokens (model: {kind: "
                "torchscript, files: [...]}); the MLP reads images");
  if (o.torchscript && !token_model) {
    // A scripted model of images reads the idx images: 28x28 pixels, 10 classes.
    if (c10::multiply_integers(o.torchscript->input_shape) != 784)
      return fail(fmt::format("a TorchScript model of images reads 28x28 images (Fashion-MNIST): "
                              "model.input_shape must hold 784 features ([1, 28, 28], [28, 28] "
                              "or [784]), got [{}]",
                              fmt::join(o.torchscript->input_shape, ", ")));
    if (o.torchscript->vocab < 10)
      return fail(fmt::format("model.vocab is the class count of a TorchScript model of images "
                              "(its output's features): at least Fashion-MNIST's 10, got {}",
                              o.torchscript->vocab));
  }
  return {};
}

void add_churn(experiment_graph& g, const std::string& role, size_t replicas, double per_minute,
               uint64_t seed, nanoseconds rejoin_after, size_t keep,
               const std::function<bool(size_t)>& serves) {
  if (!(per_minute > 0))
    return;
  std::mt19937_64 rng{seed ^ 0xC4A7C4A7ull};
  std::vector<size_t> live;
  for (size_t i = 0; i < replicas; ++i)
    live.push_back(i);
  size_t next_index = replicas;
  // Joins scheduled but not yet arrived, by time: they arrive in time order, so indices follow.
  std::vector<std::pair<double, size_t>> arriving;
  double t = 0;
  auto end = dedloc_secs(g.duration);
  while (true) {
    auto rate = per_minute * static_cast<double>(std::max<size_t>(live.size(), 1)) / 60.0;
    t += std::exponential_distribution<double>{rate}(rng);
    if (t >= end)
      break;
    // Newcomers that arrived by now are live.
    while (!arriving.empty() && arriving.front().first <= t) {
      live.push_back(arriving.front().second);
      arriving.erase(arriving.begin());
    }
    if (live.size() <= keep)
      continue;
    auto pick = std::uniform_int_distribution<size_t>{0, live.size() - 1}(rng);
    auto victim = live[pick];
    if (serves && serves(victim) &&
        std::count_if(live.begin(), live.end(), [&](size_t i) { return serves(i); }) <= 1)
      continue; // the last peer that can hand the state to newcomers stays
    live.erase(live.begin() + static_cast<std::ptrdiff_t>(pick));
    auto at = std::chrono::duration_cast<nanoseconds>(std::chrono::duration<double>(t));
    event_spec leave;
    leave.what = event_spec::kind::leave;
    leave.role = role;
    leave.instance = victim;
    leave.at = at;
    g.events.push_back(leave);
    auto join_at = at + rejoin_after;
    if (join_at < g.duration) {
      event_spec join;
      join.what = event_spec::kind::join;
      join.role = role;
      join.at = join_at;
      join.count = 1;
      g.events.push_back(join);
      arriving.emplace_back(dedloc_secs(join_at), next_index++);
    }
  }
}

status check_dedloc_export(const dedloc_role_options& o) {
  if (o.backend != "torch")
    return fail(fmt::format("export needs the torch backend (the {} backend has no parameters "
                            "to export)",
                            o.backend));
  return {};
}

std::unique_ptr<reporter> make_dedloc_reporter(std::optional<dedloc_export_options> export_model) {
  return std::make_unique<dedloc_reporter>(std::move(export_model), std::make_shared<data_cache>());
}

void add_dedloc(role_registry& reg) {
  auto cache = std::make_shared<data_cache>();
  reg.add<dedloc_role_options>(
      "dedloc.peer",
      "a data-parallel peer (DeDLOC or DiLoCo) with a LibTorch MLP, a TorchScript model or the "
      "cost model",
      [cache](role_context& ctx, const dedloc_role_options& o) {
        return spawn_peer(ctx, o, cache);
      },
      read_dedloc_role, check_dedloc_role,
      [](const dedloc_role_options& o) {
        return fmt::format("{} {} backend, target batch {}, microbatch {}, {} speeds, {} clients "
                           "per {}",
                           o.algorithm, o.backend, o.target_batch, o.microbatch, o.speeds.size(),
                           o.clients, o.cycle);
      });
  kind_type k;
  k.name = "dedloc";
  k.summary = "data-parallel peers training together (DeDLOC or DiLoCo), joining and leaving";
  k.expand = [cache](config_node& n, experiment_graph& g, const expand_context& ctx) {
    int64_t peers = 8, auxiliary = 0, steps = 0;
    double churn = 0;
    bool export_model = false;
    read_int(n, "peers", peers, 1, 100000);
    read_int(n, "steps", steps, 0, int64_t{1} << 40);
    read_int(n, "auxiliary", auxiliary, 0, 100000);
    read_real(n, "churn", churn, 0, 60);
    read(n, "export", export_model);
    dedloc_role_options o;
    o.cycle = static_cast<uint64_t>(peers);
    read_dedloc_role(n, o);
    if (auto st = check_dedloc_role(o); !st)
      n.fail(st.what());
    if (o.mode == "auxiliary")
      n.fail("mode: the peers of the kind compute; add auxiliary peers with `auxiliary: N`");
    if (export_model)
      if (auto st = check_dedloc_export(o); !st)
        n.child("export").fail(st.what());
    role_spec r;
    r.name = "peers";
    r.type = "dedloc.peer";
    r.replicas = static_cast<size_t>(peers);
    r.options = o;
    r.restart.delay = std::chrono::seconds(5);
    g.roles.push_back(r);
    if (auxiliary > 0) {
      auto a = o;
      a.mode = "auxiliary";
      a.clients = 0;
      role_spec aux;
      aux.name = "aux";
      aux.type = "dedloc.peer";
      aux.replicas = static_cast<size_t>(auxiliary);
      aux.options = a;
      g.roles.push_back(aux);
    }
    (void)ctx;
    // Client-mode peers serve no state: with only clients left, newcomers would start anew.
    add_churn(g, "peers", static_cast<size_t>(peers), churn, g.seed, std::chrono::seconds(5), 2,
              [o](size_t i) { return mode_of(o, i) == actors::collab::peer_mode::full; });
    std::optional<dedloc_export_options> ex;
    if (export_model)
      ex = dedloc_export_options{"peers", o};
    g.reporters.push_back([ex, cache, steps]() -> std::unique_ptr<reporter> {
      return std::make_unique<dedloc_reporter>(ex, cache, static_cast<uint64_t>(steps));
    });
  };
  reg.add_kind(std::move(k));
}

} // namespace starling::runtime
