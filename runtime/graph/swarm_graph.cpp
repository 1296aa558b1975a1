#include "runtime/graph/swarm_graph.hpp"

#include <fmt/format.h>

#include "kernels/models/stage_module.hpp"
#include "runtime/config/reader.hpp"
#include "runtime/graph/model_config.hpp"

namespace starling::runtime::graph {

size_t swarm_graph::peer_count() const {
  size_t n = 0;
  for (auto& s : stages)
    n += s.speeds.size();
  return n;
}

kernels::model_spec swarm_graph::model_spec() const {
  if (torchscript)
    return kernels::torchscript_model(*torchscript);
  auto m = model;
  m.seed = seed;
  return kernels::gpt_model(m);
}

std::string swarm_graph::describe_model() const {
  if (torchscript)
    return fmt::format("TorchScript, {} files ({}), vocab {}, seq {}, {} loss",
                       torchscript->files.size(), fmt::join(torchscript->files, ", "),
                       torchscript->vocab, torchscript->seq_len, to_string(torchscript->loss));
  return fmt::format("GPT {} layers, width {}, {} heads, seq {}", model.layers, model.width,
                     model.heads, model.seq_len);
}

result<std::vector<std::pair<int64_t, int64_t>>> stage_ranges(const swarm_graph& g) {
  if (g.stages.empty())
    return fail("stages: a pipeline needs at least one stage");
  auto count = static_cast<int64_t>(g.stages.size());
  if (count > g.model.layers)
    return fail(fmt::format("stages: {} stages need at least as many model layers (have {})",
                            count, g.model.layers));
  for (size_t s = 0; s < g.stages.size(); ++s) {
    if (g.stages[s].speeds.empty())
      return fail(fmt::format("stages[{}]: a stage needs at least one peer", s));
    for (auto v : g.stages[s].speeds)
      if (!(v > 0 && v <= 1))
        return fail(fmt::format("stages[{}]: peer speed {} is not in (0, 1]", s, v));
  }
  bool explicit_ranges = g.stages.front().begin >= 0;
  if (!explicit_ranges) {
    for (auto& s : g.stages)
      if (s.begin >= 0 || s.end >= 0)
        return fail("stages: give layer ranges for every stage or for none");
    return kernels::even_stage_ranges(g.model.layers, count);
  }
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t next = 0;
  for (size_t s = 0; s < g.stages.size(); ++s) {
    auto& st = g.stages[s];
    if (st.begin != next || st.end <= st.begin || st.end > g.model.layers)
      return fail(fmt::format("stages[{}]: layers [{}, {}) must start at {} and end in ({}, {}]",
                              s, st.begin, st.end, next, next, g.model.layers));
    out.emplace_back(st.begin, st.end);
    next = st.end;
  }
  if (next != g.model.layers)
    return fail(fmt::format("stages: the ranges cover layers [0, {}) of {}", next,
                            g.model.layers));
  return out;
}

status check_rebalance(const rebalance_spec& r) {
  using std::chrono::nanoseconds;
  if (r.every < nanoseconds{0})
    return fail("rebalance.every: expected a duration >= 0 (0 = no rebalancing)");
  if (!(r.threshold >= 0 && r.threshold <= 10))
    return fail(fmt::format("rebalance.threshold: expected a number in [0, 10], got {}",
                            r.threshold));
  if (r.enabled() && (r.report_every <= nanoseconds{0} || r.report_every > r.every))
    return fail("rebalance.report_every must be positive and at most rebalance.every (a check "
                "needs a fresh throughput report of every stage)");
  return {};
}

status check_averaging(const averaging_spec& a) {
  using std::chrono::nanoseconds;
  if (a.target_batch < 0)
    return fail(fmt::format("target_batch: expected 0 (no averaging) or a positive number, got {}",
                            a.target_batch));
  if (a.progress_period <= nanoseconds{0} || a.matchmaking_window <= nanoseconds{0}
      || a.round_timeout <= nanoseconds{0})
    return fail("averaging: progress_period, matchmaking_window and round_timeout must be positive");
  if (a.codec == kernels::codec_id::topk || a.codec == kernels::codec_id::randk)
    return fail("averaging.codec: sparsifying codecs (topk, randk) need error feedback or shared "
                "seeds the averager does not keep; use none, fp16, bf16, uniform8, blockwise8 or "
                "quantile8");
  if (a.matchmaking_window <= a.progress_period)
    return fail("averaging.matchmaking_window must be longer than averaging.progress_period, or "
                "peers that see the target one period late miss the round");
  return {};
}

// -- builder ------------------------------------------------------------------------------------

swarm_builder& swarm_builder::model(const kernels::gpt_config& m) {
  g_.model = m;
  return *this;
}

swarm_builder& swarm_builder::model(const kernels::torchscript_config& m) {
  g_.torchscript = m;
  g_.model.layers = static_cast<int64_t>(m.files.size());
  g_.model.vocab = m.vocab;
  g_.model.seq_len = m.seq_len;
  return *this;
}

swarm_builder& swarm_builder::stage(std::vector<double> speeds) {
  g_.stages.push_back({-1, -1, std::move(speeds)});
  return *this;
}

swarm_builder& swarm_builder::stage(int64_t begin, int64_t end, std::vector<double> speeds) {
  g_.stages.push_back({begin, end, std::move(speeds)});
  return *this;
}

swarm_builder& swarm_builder::trainers(int64_t count, int64_t microbatch,
                                       int64_t microbatches_each) {
  g_.trainers = count;
  g_.microbatch = microbatch;
  g_.microbatches_per_trainer = microbatches_each;
  return *this;
}

swarm_builder& swarm_builder::max_inflight(int64_t n) {
  g_.max_inflight = n;
  return *this;
}

swarm_builder& swarm_builder::local_batch(int64_t samples) {
  g_.local_batch = samples;
  return *this;
}

swarm_builder& swarm_builder::averaging(int64_t target_batch) {
  g_.averaging.target_batch = target_batch;
  return *this;
}

swarm_builder& swarm_builder::averaging(const averaging_spec& a) {
  g_.averaging = a;
  return *this;
}

swarm_builder& swarm_builder::optimizer(const kernels::optimizer_options& o) {
  g_.optimizer = o;
  return *this;
}

swarm_builder& swarm_builder::compression(kernels::codec_id c) {
  g_.compression = c;
  return *this;
}

swarm_builder& swarm_builder::hop_timeout(std::chrono::nanoseconds t) {
  g_.hop_timeout = t;
  return *this;
}

swarm_builder& swarm_builder::preemptions(std::chrono::nanoseconds every,
                                          std::chrono::nanoseconds restart) {
  g_.preempt_every = every;
  g_.restart_delay = restart;
  return *this;
}

swarm_builder& swarm_builder::checkpoints(std::chrono::nanoseconds every, int64_t keep) {
  g_.checkpoint.every = every;
  g_.checkpoint.keep = keep;
  return *this;
}

swarm_builder& swarm_builder::rebalance(const rebalance_spec& r) {
  g_.rebalance = r;
  return *this;
}

swarm_builder& swarm_builder::seed(uint64_t s) {
  g_.seed = s;
  return *this;
}

result<swarm_graph> swarm_builder::build() const {
  auto& g = g_;
  if (g.torchscript) {
    if (auto layout = kernels::inspect_torchscript(*g.torchscript); !layout)
      return fail("model: " + layout.error().what);
  } else if (g.model.width % g.model.heads != 0)
    return fail(fmt::format("model.heads: {} does not divide width {}", g.model.heads,
                            g.model.width));
  if (auto r = stage_ranges(g); !r)
    return r.error();
  auto positive = [](int64_t v, const char* what) -> status {
    if (v < 1)
      return fail(fmt::format("{}: expected a positive number, got {}", what, v));
    return {};
  };
  for (auto st : {positive(g.trainers, "trainers"), positive(g.microbatch, "microbatch"),
                  positive(g.microbatches_per_trainer, "microbatches_per_trainer"),
                  positive(g.max_inflight, "max_inflight"), positive(g.local_batch, "local_batch"),
                  positive(g.eval_batches, "eval_batches"),
                  positive(g.torch_threads, "torch_threads")})
    if (!st)
      return fail(st.what());
  if (g.hop_timeout <= std::chrono::nanoseconds{0})
    return fail("hop_timeout: expected a positive duration");
  if (auto st = check_averaging(g.averaging); !st)
    return fail(st.what());
  if (g.checkpoint.every < std::chrono::nanoseconds{0} || g.checkpoint.keep < 1)
    return fail("checkpoint: expected every >= 0 and keep >= 1");
  if (auto st = check_rebalance(g.rebalance); !st)
    return fail(st.what());
  if (g.volunteers < 0)
    return fail(fmt::format("volunteers: expected a count >= 0, got {}", g.volunteers));
  if (g.volunteers > 0 && !g.rebalance.enabled())
    return fail("volunteers: a volunteer's stage is the one with the least throughput in the "
                "rebalancing board's reports; set rebalance (e.g. rebalance: {every: 10s})");
  if (g.preempt_every < std::chrono::nanoseconds{0} || g.restart_delay < std::chrono::nanoseconds{0})
    return fail("preempt_every, restart_delay: expected durations >= 0");
  return g;
}

// -- YAML ---------------------------------------------------------------------------------------

void read_swarm_graph(config_node& n, swarm_graph& out) {
  // Declared up front so that a misspelt key is reported before the errors its absence causes
  // (a missing `stages`, ranges checked against the default model). `sim` tunes simulated runs
  // and is read by the swarm kind (runtime/run/swarm.cpp).
  n.allow({"model", "data", "stages", "trainers", "microbatch", "microbatches_per_trainer", "max_inflight",
           "local_batch", "target_batch", "averaging", "optimizer", "compression", "hop_timeout",
           "preempt_every", "restart_delay", "eval_batches", "torch_threads", "export", "checkpoint",
           "rebalance", "sim", "backward_first", "volunteers"});
  if (n.has("model")) {
    auto m = n.child("model");
    std::string kind = "gpt";
    read_choice(m, "kind", kind, {"gpt", "torchscript"});
    if (kind == "torchscript") {
      m.allow(torchscript_keys());
      auto ts = read_torchscript_model(m);
      out.model.layers = static_cast<int64_t>(ts.files.size());
      out.model.vocab = ts.vocab;
      out.model.seq_len = ts.seq_len;
      out.torchscript = std::move(ts);
      m.finish();
    }
  }
  if (n.has("model") && !out.torchscript) {
    // A fresh view of the section: `kind` (gpt) was read above.
    auto m = n.child("model");
    m.has("kind");
    read_int(m, "layers", out.model.layers, 1, 64);
    read_int(m, "width", out.model.width, 8, 4096);
    read_int(m, "heads", out.model.heads, 1, 64);
    read_int(m, "seq_len", out.model.seq_len, 2, 4096);
    read_real(m, "dropout", out.model.dropout, 0.0, 0.9);
    if (out.model.width % out.model.heads != 0)
      m.child("heads").expected(fmt::format("a divisor of width {}", out.model.width));
    m.finish();
  }
  if (n.has("data")) {
    auto d = n.child("data");
    read_data_section(d, out.data, {"text", "tokens"}, {"layout"});
    std::string layout = kernels::to_string(out.layout);
    read_choice(d, "layout", layout, {"scattered", "contiguous"});
    out.layout = layout == "contiguous" ? kernels::shard_layout::contiguous
                                        : kernels::shard_layout::scattered;
    d.finish();
  }
  if (!n.has("stages"))
    n.fail("missing required key 'stages' (a list of {peers: [speed, ...], layers: [a, b]})");
  out.stages.clear();
  for (auto& item : n.child("stages").items()) {
    if (!item.is_map())
      item.expected("a map {peers: [speed, ...]} (optionally with layers: [begin, end])");
    item.allow({"peers", "layers"});
    if (!item.has("peers"))
      item.fail("missing required key 'peers' (the speed of each peer: peers: [1.0, 0.5])");
    stage_spec spec;
    for (auto& p : item.child("peers").items()) {
      auto v = p.as_double();
      if (!(v > 0 && v <= 1))
        p.expected("a speed in (0, 1]");
      spec.speeds.push_back(v);
    }
    if (spec.speeds.empty())
      item.child("peers").expected("at least one peer");
    if (item.has("layers")) {
      auto l = item.child("layers");
      auto range = l.items();
      if (range.size() != 2)
        l.expected("[begin, end]");
      spec.begin = range[0].as_int();
      spec.end = range[1].as_int();
    }
    item.finish();
    out.stages.push_back(spec);
  }
  if (auto r = stage_ranges(out); !r)
    n.child("stages").fail(r.error().what);
  read_int(n, "trainers", out.trainers, 1, 1024);
  read_int(n, "volunteers", out.volunteers, 0, 1024);
  read_int(n, "microbatch", out.microbatch, 1, 4096);
  read_int(n, "microbatches_per_trainer", out.microbatches_per_trainer, 1, INT64_MAX);
  read_int(n, "max_inflight", out.max_inflight, 1, 64);
  read_int(n, "local_batch", out.local_batch, 1, INT64_MAX);
  read(n, "backward_first", out.backward_first);
  read_int(n, "target_batch", out.averaging.target_batch, 0, INT64_MAX);
  if (n.has("averaging")) {
    auto a = n.child("averaging");
    read_duration(a, "progress_period", out.averaging.progress_period);
    read_duration(a, "matchmaking_window", out.averaging.matchmaking_window);
    read_duration(a, "round_timeout", out.averaging.round_timeout);
    read(a, "persistent_rounds", out.averaging.persistent_rounds);
    read_int(a, "average_state_every", out.averaging.average_state_every, 0, INT64_MAX);
    read(a, "resync_after_lone_step", out.averaging.resync_after_lone_step);
    if (a.has("codec")) {
      auto c = a.child("codec");
      auto id = kernels::parse_codec(c.as_string());
      if (!id || *id == kernels::codec_id::topk || *id == kernels::codec_id::randk)
        c.expected("a dense codec: none | fp16 | bf16 | uniform8 | blockwise8 | quantile8");
      out.averaging.codec = *id;
    }
    if (auto st = check_averaging(out.averaging); !st)
      a.fail(st.what());
    a.finish();
  }
  if (n.has("checkpoint")) {
    auto c = n.child("checkpoint");
    if (!c.is_map())
      c.expected("a map {every: 2s, keep: 2, replicas: 2}");
    read_duration(c, "every", out.checkpoint.every);
    read_int(c, "keep", out.checkpoint.keep, 1, 1000);
    read_int(c, "replicas", out.checkpoint.replicas, 0, 16);
    c.finish();
  }
  if (n.has("rebalance")) {
    auto r = n.child("rebalance");
    if (!r.is_map())
      r.expected("a map {every: 10s, threshold: 0.05, report_every: 2s, place_new_peers: false}");
    r.allow({"every", "threshold", "report_every", "place_new_peers"});
    read_duration(r, "every", out.rebalance.every);
    read_real(r, "threshold", out.rebalance.threshold, 0.0, 10.0);
    read_duration(r, "report_every", out.rebalance.report_every);
    read(r, "place_new_peers", out.rebalance.place_new_peers);
    if (auto st = check_rebalance(out.rebalance); !st)
      r.fail(st.what());
    r.finish();
  }
  if (n.has("optimizer")) {
    auto o = n.child("optimizer");
    read_choice(o, "kind", out.optimizer.kind, {"adam", "lamb", "lamb8"});
    read_real(o, "lr", out.optimizer.lr, 0.0, 10.0);
    read_real(o, "weight_decay", out.optimizer.weight_decay, 0.0, 1.0);
    read_real(o, "max_grad_norm", out.optimizer.max_grad_norm, 0.0, 1e9);
    read_int(o, "warmup_steps", out.optimizer.warmup_steps, 0, 1000000);
    read_real(o, "beta1", out.optimizer.beta1, 0.0, 0.999999);
    read_real(o, "beta2", out.optimizer.beta2, 0.0, 0.999999);
    read_real(o, "eps", out.optimizer.eps, 0.0, 1.0);
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
  read(n, "export", out.export_model);
  if (out.volunteers > 0 && !out.rebalance.enabled())
    n.child("volunteers")
      .fail("a volunteer's stage is the one with the least throughput in the rebalancing "
            "board's reports; set rebalance (e.g. rebalance: {every: 10s})");
}

// -- placement ----------------------------------------------------------------------------------

std::vector<std::pair<uint64_t, double>> peer_slots(const swarm_graph& g) {
  std::vector<std::pair<uint64_t, double>> out;
  for (size_t s = 0; s < g.stages.size(); ++s)
    for (auto v : g.stages[s].speeds)
      out.emplace_back(s, v);
  return out;
}

} // namespace starling::runtime::graph
