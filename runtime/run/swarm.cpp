#include "runtime/run/swarm.hpp"

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>

#include <ATen/Parallel.h>
#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/averager/averager.hpp"
#include "actors/collab/ledger_publisher.hpp"
#include "actors/collab/ledger_record.hpp"
#include "actors/stage/board.hpp"
#include "actors/stage/board_view.hpp"
#include "actors/stage/checkpoint.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/replica_keeper.hpp"
#include "actors/stage/stage.hpp"
#include "actors/supervisor/supervisor.hpp"
#include "actors/trainer/metrics_relay.hpp"
#include "actors/trainer/progress_store.hpp"
#include "actors/trainer/trainer.hpp"
#include "actors/trainer/wiring.hpp"
#include "kernels/data/batch_progress.hpp"
#include "kernels/data/corpus.hpp"
#include "kernels/data/text_source.hpp"
#include "runtime/log/log.hpp"
#include "messages/atoms.hpp"
#include "messages/metrics.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/experiment/plan.hpp"
#include "runtime/experiment/runner.hpp"
#include "runtime/run/kinds.hpp"

namespace starling::runtime {

namespace {

using std::chrono::nanoseconds;

caf::timespan span(nanoseconds d) {
  return std::chrono::duration_cast<caf::timespan>(d);
}

/// The trainers' data source, made once per process on first use (trainers share it).
struct swarm_data_cache {
  std::mutex mtx;
  std::shared_ptr<const kernels::data_source> source;
  /// Why it could not be made (reported once per trainer that needed it).
  std::string error;
};

/// The graph's data source through the registry, its windows the model's context; in simulation
/// (modeled compute reads no text) a small synthetic text keeps the trainers' batches cheap.
std::shared_ptr<const kernels::data_source> data_for(swarm_data_cache& cache,
                                                     const graph::swarm_graph& g, bool modeled) {
  std::lock_guard<std::mutex> guard{cache.mtx};
  if (cache.source || !cache.error.empty())
    return cache.source;
  auto opts = g.data;
  kernels::fit_to_model(opts, g.model.seq_len, g.model.vocab);
  result<std::shared_ptr<const kernels::data_source>> made = fail("unset");
  if (modeled) {
    std::string text;
    for (int i = 0; i < 200; ++i)
      text += "In the beginning God created the heaven and the earth. And the earth was without "
              "form, and void; and darkness was upon the face of the deep. ";
    auto c = std::make_shared<const kernels::corpus>(text, 0.05, "synthetic (modeled)");
    if (auto t = kernels::text_source::make(c, opts.text))
      made = std::shared_ptr<const kernels::data_source>(*t);
    else
      made = t.error();
  } else {
    made = kernels::make_data_source(opts);
  }
  if (made)
    cache.source = *made;
  else
    cache.error = made.error().what;
  return cache.source;
}

/// The simulation's one board, shared by every node.
caf::actor shared_board(host& h, const swarm_setup& s) {
  auto stages = s.graph.stages.size();
  return h.shared_service("swarm.board",
                          [&h, stages] { return actors::stage::spawn_board(h.system(), stages); });
}

caf::actor raw_board_view(host& h, const swarm_setup& s) {
  auto shared = shared_board(h, s);
  return h.service("swarm.board_raw_view", [shared](host& x) {
    return actors::stage::spawn_board_view(x.system(), {shared, {}});
  });
}

/// Whether this node keeps and uses checkpoint replicas: cluster runs with an output folder and
/// checkpoints (in local mode every node's folder is on the same disk already).
bool replicating(host& h, const swarm_setup& s) {
  auto& c = s.graph.checkpoint;
  return !s.modeled && h.mode() == run_mode::cluster && !h.run_dir().empty()
         && c.every > nanoseconds{0} && c.replicas > 0;
}

/// The replica board: slot k lists the holders of stage k's replicas, slot `stages` the keepers.
caf::actor replica_board(host& h, const swarm_setup& s) {
  auto stages = s.graph.stages.size();
  auto prefix = s.prefix + "/replicas";
  return h.service("swarm.replica_board", [prefix, stages](host& x) {
    actors::stage::dht_board_options b;
    b.prefix = prefix;
    b.endpoint = x.endpoint();
    b.stages = stages + 1;
    return actors::stage::spawn_dht_board(x.system(), x.dht(), x.resolver(), b);
  });
}

/// Starts the node's replica keeper once (every node of a cluster run keeps replicas of the
/// stages it serves no peer of).
void keep_replicas(host& h, const swarm_setup& s) {
  if (!replicating(h, s))
    return;
  auto board = swarm_board(h, s);
  auto replicas = replica_board(h, s);
  auto ranges = s.ranges;
  auto copies = static_cast<size_t>(s.graph.checkpoint.replicas);
  auto period = std::max(caf::timespan{std::chrono::seconds(1)}, 2 * span(s.graph.checkpoint.every));
  h.service("swarm.replica_keeper", [=](host& x) {
    actors::stage::replica_keeper_options o;
    o.board = board;
    o.replica_board = replicas;
    o.endpoint = x.endpoint();
    o.ranges = ranges;
    o.dir = x.run_dir() + "/replicas";
    o.copies = copies;
    o.period = period;
    o.metrics = x.metrics();
    o.register_actor = [hp = &x](const std::string& name, const caf::actor& a) {
      hp->register_actor(name, a);
    };
    return actors::stage::spawn_replica_keeper(x.system(), o);
  });
}

/// The ledger publisher of a trainer or stage peer (actors/collab/ledger_publisher.hpp), or
/// none: a simulation publishes no SWARM summaries, so that its trace (and digest) stays what it
/// is unwatched; its one process sees every event anyway. It leaves with `left` when `peer`
/// stops on purpose (a migration, a finished trainer), else it dies with it.
caf::actor swarm_ledger(role_context& ctx, int stage) {
  auto& h = ctx.node;
  auto& node = h.graph().node;
  if (h.mode() == run_mode::sim || node.ledger_every.count() <= 0)
    return {};
  actors::collab::ledger_publisher_options lo;
  lo.dht = h.dht();
  lo.experiment = ctx.key_prefix();
  lo.address = fmt::format("@{}/{}", h.index(), ctx.name);
  lo.name = ctx.name;
  lo.stage = stage;
  lo.token_id = h.token_id();
  lo.every = node.ledger_every;
  return actors::collab::spawn_ledger_publisher(h.system(), std::move(lo));
}

/// Ties `ledger` (may be unset) to `peer`'s life.
void tie_ledger(const caf::actor& peer, caf::actor ledger) {
  if (!ledger)
    return;
  peer->attach_functor([ledger](const caf::error& reason) {
    if (reason == caf::exit_reason::user_shutdown || reason == caf::exit_reason::normal || !reason)
      caf::anon_send(ledger, actors::collab::ledger_left_atom::value);
    else
      caf::anon_send_exit(ledger, caf::exit_reason::user_shutdown);
  });
}

caf::actor spawn_stage_peer(role_context& ctx, const swarm_role_options& o) {
  auto& s = *o.setup;
  auto& g = s.graph;
  auto stage = ctx.variant;
  auto slot = ctx.index;
  if (stage >= s.ranges.size() || (!o.volunteer && slot >= s.slots.size()))
    return {};
  // LibTorch's threads per process (`swarm.torch_threads`): every stage peer of the process
  // computes on the actor threads already; more intra-op threads only oversubscribe the cores,
  // and in simulation one thread keeps the arithmetic the same in every run.
  if (at::get_num_threads() != static_cast<int>(g.torch_threads))
    at::set_num_threads(static_cast<int>(g.torch_threads));
  actors::stage::stage_options so;
  so.stage = stage;
  so.name = fmt::format("s{}{}{}g{}", stage, o.volunteer ? "v" : "p", slot, ctx.generation);
  so.model = g.model_spec();
  so.begin = s.ranges[stage].first;
  so.end = s.ranges[stage].second;
  so.optimizer = g.optimizer;
  so.local_batch = g.local_batch;
  so.speed = o.volunteer ? 1.0 : s.slots[slot].second;
  so.backward_first = g.backward_first;
  // A volunteer joins a running pipeline: it starts from its stage's state, like a respawn.
  so.download_state = ctx.download_state() || o.volunteer;
  so.seed = ctx.seed;
  auto cost_model = s.modeled && !s.sim.real_compute;
  so.codec = cost_model ? kernels::codec_id::none : g.compression;
  if (s.modeled) {
    auto work = s.sim.stage_work.empty() ? 1.0 : s.sim.stage_work[stage];
    if (s.sim.real_compute) {
      // The model itself, its device time modeled (virtual time, deterministic).
      so.modeled_forward_s = s.sim.forward_s * work;
      so.modeled_backward_factor = s.sim.backward_factor;
    } else {
      so.backend = actors::stage::compute_backend::cost_model;
      so.cost_model.forward_s = s.sim.forward_s * work;
      so.cost_model.backward_factor = s.sim.backward_factor;
      so.cost_model.noise = s.sim.noise;
      so.cost_model.payload = s.sim.payload;
      // A state transfer weighs what `state_transfer` moves over a default link.
      so.cost_model.state_bytes = static_cast<uint64_t>(
        std::chrono::duration<double>(s.sim.state_transfer).count() * s.bandwidth);
    }
    so.timeout = caf::timespan{std::chrono::seconds(30)};
    so.retry_every = caf::timespan{std::chrono::seconds(2)};
    so.download_patience = caf::timespan{std::chrono::seconds(30)};
    so.report_every = span(s.sim.report_every);
  } else if (g.rebalance.enabled()) {
    so.report_every = span(g.rebalance.report_every);
  }
  auto& h = ctx.node;
  so.metrics = h.metrics();
  // Checkpoints go to the node's run directory, where a peer respawned on this node finds them
  // when its whole stage is gone; a cost-model peer holds no learned state and writes none.
  if (!cost_model && !h.run_dir().empty()) {
    so.checkpoint.dir = h.run_dir() + "/checkpoints";
    so.checkpoint.every = span(g.checkpoint.every);
    so.checkpoint.keep = static_cast<uint32_t>(g.checkpoint.keep);
    // The slot's accumulated gradient outlives a stop on purpose (`--resume` takes it up).
    so.checkpoint.slot = fmt::format("s{}p{}", stage, slot);
    so.checkpoint.background = h.mode() != run_mode::sim;
    so.checkpoint.wall_times = h.mode() != run_mode::sim;
    if (replicating(h, s)) {
      keep_replicas(h, s);
      so.checkpoint.replicas = replica_board(h, s);
    }
    // The other node folders of the run on this disk too (local mode: every node's; a cluster
    // node's output holds its own only): the peers of a resumed stage all start from the
    // stage's newest checkpoint, not each from its own node's (they began 2 steps apart).
    namespace fs = std::filesystem;
    std::error_code ec;
    auto own = fs::path{h.run_dir()};
    for (auto& e : fs::directory_iterator(own.parent_path(), ec))
      if (e.path() != own && fs::is_directory(e.path() / "checkpoints", ec))
        so.checkpoint.search.push_back((e.path() / "checkpoints").string());
    std::sort(so.checkpoint.search.begin(), so.checkpoint.search.end());
  }
  caf::actor averager;
  if (g.averaging.enabled()) {
    // One averager per stage peer (a node may host peers of several stages, each averaging on
    // its own schedule); it lives and dies with its peer.
    auto& avg = g.averaging;
    actors::averager::averager_options ao;
    ao.target_group_size = static_cast<uint32_t>(g.stages[stage].speeds.size());
    ao.key_prefix = s.prefix + "/avg/";
    ao.matchmaking_window = caf::timespan{avg.matchmaking_window};
    ao.poll_interval =
      std::min(caf::timespan{avg.progress_period}, caf::timespan{avg.matchmaking_window / 4});
    ao.round_timeout = caf::timespan{avg.round_timeout};
    ao.codec = avg.codec;
    ao.family_groups = avg.persistent_rounds;
    // The peer hands over fresh vectors (its step's mean gradient, its state flattened) that
    // nothing else reads while the round runs: the result is written into them, one vector
    // less resident. (After a failed round it steps on its gradient as it then stands: its own
    // values, averaged where some of a part's result had arrived.)
    ao.in_place = true;
    averager = h.spawn_averager("avg-" + so.name, ao);
    so.averaging.averager = averager;
    so.averaging.dht = h.dht();
    so.averaging.prefix = s.prefix;
    so.averaging.target_batch = avg.target_batch;
    so.averaging.progress_period = caf::timespan{avg.progress_period};
    so.averaging.average_state_every = static_cast<uint64_t>(avg.average_state_every);
    so.averaging.resync_after_lone_step = avg.resync_after_lone_step;
    so.averaging.average_timeout = caf::timespan{avg.matchmaking_window + ao.join_grace
                                                 + avg.round_timeout + std::chrono::seconds(5)};
  }
  if (h.mode() == run_mode::sim) {
    // Gossip lists raw handles and views the one partner it draws (stage_options::view).
    so.gossip_board = raw_board_view(h, s);
    so.view = [hp = &h](const caf::actor& a) { return hp->view(a); };
  }
  so.ledger = swarm_ledger(ctx, static_cast<int>(stage));
  auto peer = actors::stage::spawn_stage(h.system(), so, swarm_board(h, s));
  tie_ledger(peer, so.ledger);
  // The DHT board announces the peer as `<endpoint>/<its name>`: trainers resolve that name.
  h.register_actor(so.name, peer);
  if (averager)
    peer->attach_functor([averager](const caf::error&) {
      caf::anon_send_exit(averager, caf::exit_reason::user_shutdown);
    });
  return peer;
}

caf::actor spawn_trainer(role_context& ctx, const swarm_role_options& o,
                         const std::shared_ptr<swarm_data_cache>& cache) {
  auto& s = *o.setup;
  auto& g = s.graph;
  auto data = data_for(*cache, g, s.modeled && !s.sim.real_compute);
  if (!data) {
    log(log_level::error, "swarm", "{}: no training data: {}", ctx.name, cache->error);
    return {};
  }
  // The trainers' node keeps checkpoint replicas too (it serves no stage).
  keep_replicas(ctx.node, s);
  auto i = static_cast<int64_t>(ctx.index);
  actors::trainer::trainer_options to;
  to.name = ctx.name; // also its progress file's name and its metrics' source
  // Its microbatch ids' tag, distinct among the run's trainers (the ledger derives the same
  // tags from the plan's trainers).
  if (auto tag = s.trainer_tags.find(ctx.name); tag != s.trainer_tags.end()) {
    to.tag = static_cast<int64_t>(tag->second);
  } else {
    std::vector<std::string> names;
    auto& pl = ctx.node.plan();
    auto& roles = ctx.node.graph().roles;
    for (auto& x : pl.instances)
      if (x.role < roles.size() && roles[x.role].type == "swarm.trainer")
        names.push_back(x.name);
    auto tags = actors::collab::trainer_tags(names);
    if (auto t = tags.find(ctx.name); t != tags.end())
      to.tag = static_cast<int64_t>(t->second);
  }
  to.stages = g.stages.size();
  to.microbatch = g.microbatch;
  to.data.seed = g.seed;
  to.data.shard = static_cast<uint64_t>(i);
  to.data.shards = static_cast<uint64_t>(s.trainers);
  to.data.layout = g.layout;
  to.microbatches = g.microbatches_per_trainer;
  to.max_inflight = g.max_inflight;
  to.hop_timeout = caf::timespan{g.hop_timeout};
  to.codec = g.compression;
  to.seed = g.seed * 7919 + static_cast<uint64_t>(i);
  if (s.modeled) {
    auto& sim = s.sim;
    if (!sim.real_compute)
      to.codec = kernels::codec_id::none;
    to.refresh_every = span(sim.refresh_every);
    to.exclude_for = span(sim.refresh_every);
    to.probe = sim.probe && sim.routing == swarm_routing::stochastic;
    to.entry_backlog_s = std::chrono::duration<double>(sim.entry_backlog).count();
    to.forward_backlog_s = std::chrono::duration<double>(sim.forward_backlog).count();
    using actors::trainer::routing_kind;
    to.routing = sim.routing == swarm_routing::uniform ? routing_kind::uniform
                 : sim.routing == swarm_routing::fixed ? routing_kind::fixed
                                                       : routing_kind::stochastic;
    if (sim.routing == swarm_routing::fixed) {
      // A fixed pipeline per trainer (peer i of every stage), sharing the graph's window.
      auto total = g.trainers * g.max_inflight;
      to.max_inflight = (total + s.trainers - 1) / s.trainers;
      to.microbatches = (g.microbatches_per_trainer * g.trainers + s.trainers - 1) / s.trainers;
      size_t first = 0;
      for (size_t k = 0; k < g.stages.size(); ++k) {
        to.fixed_route.push_back(fmt::format("s{}p{}g", k, first + ctx.index));
        first += g.stages[k].speeds.size();
      }
    } else if (sim.inflight_per_peer > 0) {
      to.inflight_per_peer = sim.inflight_per_peer;
      to.inflight_cap = sim.inflight_cap;
      to.trainers = s.trainers;
    }
  }
  auto& h = ctx.node;
  auto ledger = swarm_ledger(ctx, -1);
  auto reports = actors::trainer::spawn_metrics_relay(h.system(), {ctx.name, h.metrics(), ledger});
  auto progress_dir = s.modeled || h.run_dir().empty() ? std::string{} : h.run_dir() + "/progress";
  to.progress = h.service("swarm.progress", [progress_dir](host& x) {
    actors::trainer::progress_store_options po;
    po.dir = progress_dir;
    po.on_error = [](const std::string& why) { log(log_level::error, "swarm", "{}", why); };
    po.on_warning = [](const std::string& why) { log(log_level::warning, "swarm", "{}", why); };
    return actors::trainer::spawn_progress_store(x.system(), std::move(po));
  });
  auto t = actors::trainer::spawn_trainer(h.system(), to, data, swarm_board(h, s), reports);
  t->attach_functor([reports](const caf::error&) {
    caf::anon_send_exit(reports, caf::exit_reason::user_shutdown);
  });
  tie_ledger(t, ledger);
  return t;
}

/// What a stopped run left in `dir` for `--resume`: every trainer progress file (parsed) and each
/// stage's newest checkpoint that verifies, over all the run's node folders.
result<std::string> inspect_swarm_run(const swarm_setup& s, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::string> checkpoint_dirs;
  std::vector<fs::path> nodes;
  for (auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec) && fs::is_directory(e.path() / "checkpoints", ec))
      nodes.push_back(e.path() / "checkpoints");
  std::sort(nodes.begin(), nodes.end());
  for (auto& n : nodes)
    checkpoint_dirs.push_back(n.string());
  auto progress = read_run_progress(dir);
  if (!progress)
    return progress.error();
  uint64_t files = progress->size(), batches = 0;
  for (auto& [name, p] : *progress)
    batches += p.done_count();
  auto total = static_cast<uint64_t>(s.trainers * s.graph.microbatches_per_trainer);
  std::string out = fmt::format("trainers' progress: {} of {} batches done ({} files)",
                                std::min(batches, total), total, files);
  for (size_t k = 0; k < s.ranges.size(); ++k) {
    actors::stage::checkpoint_key key{k, s.ranges[k].first, s.ranges[k].second};
    auto found = actors::stage::newest_checkpoint(checkpoint_dirs, key);
    out += fmt::format("\n  stage {}: {}", k,
                       found.found ? fmt::format("checkpoint of step {}", found.found->state.steps)
                                   : std::string{"no checkpoint: starts from its initialization"});
    for (auto& why : found.rejected)
      out += fmt::format(" (rejected {})", why);
  }
  return out;
}

/// Reads the optional `sim` section.
void read_sim_options(config_node& n, swarm_sim_options& s) {
  std::string compute = s.real_compute ? "torch" : "model";
  read_choice(n, "compute", compute, {"model", "torch"});
  s.real_compute = compute == "torch";
  nanoseconds fwd{static_cast<int64_t>(s.forward_s * 1e9)};
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
  std::string routing = "stochastic";
  read_choice(n, "routing", routing, {"stochastic", "uniform", "fixed"});
  s.routing = routing == "uniform" ? swarm_routing::uniform
              : routing == "fixed" ? swarm_routing::fixed
                                   : swarm_routing::stochastic;
  bool rebalance = s.rebalance_period.count() > 0;
  read(n, "rebalance", rebalance);
  read_duration(n, "rebalance_period", s.rebalance_period);
  if (!rebalance)
    s.rebalance_period = nanoseconds{0};
  read_real(n, "rebalance_threshold", s.rebalance_threshold, 0.0, 10.0);
  read(n, "place_new_peers", s.place_new_peers);
  // With the model itself the window is the graph's `max_inflight`, as in a local run, unless
  // the file asks otherwise: the adaptive window (6 per peer) keeps a thousand modeled peers
  // busy, but with a real model it puts tens of microbatches in flight per trainer, each
  // gradient seconds (steps) older than the parameters it is applied to, and the run diverges.
  if (s.real_compute && !n.has("inflight_per_peer"))
    s.inflight_per_peer = 0;
  read_real(n, "inflight_per_peer", s.inflight_per_peer, 0.0, 1000.0);
  read_int(n, "inflight_cap", s.inflight_cap, 1, 1 << 20);
  read(n, "probe", s.probe);
  read_duration(n, "entry_backlog", s.entry_backlog);
  read_duration(n, "forward_backlog", s.forward_backlog);
  read_duration(n, "report_every", s.report_every);
  read_duration(n, "refresh_every", s.refresh_every);
  read_duration(n, "warmup", s.warmup);
  if (s.report_every.count() <= 0 || s.refresh_every.count() <= 0)
    n.fail("report_every and refresh_every must be positive durations");
  read_int(n, "peers_per_stage", s.peers_per_stage, 0, 100000);
  read_real(n, "speed_sigma", s.speed_sigma, 0.0, 3.0);
  read(n, "study", s.study);
  if (n.has("study_periods")) {
    s.study_periods.clear();
    for (auto& item : n.child("study_periods").items()) {
      auto d = item.as_duration();
      if (d.count() <= 0)
        item.expected("a positive duration");
      s.study_periods.push_back(d);
    }
  }
  read(n, "trace_messages", s.trace_messages);
  n.finish();
}

/// Builds the run's setup from the graph read from YAML or C++; fails naming the field.
result<std::shared_ptr<swarm_setup>> make_setup(graph::swarm_graph g, const swarm_sim_options& sim,
                                                const experiment_graph& eg, bool modeled) {
  auto s = std::make_shared<swarm_setup>();
  if (sim.peers_per_stage > 0) {
    auto speeds = lognormal_speeds(static_cast<size_t>(sim.peers_per_stage) * g.stages.size(),
                                   sim.speed_sigma, g.seed ^ 0x5bee5ULL);
    for (size_t k = 0; k < g.stages.size(); ++k)
      g.stages[k].speeds.assign(speeds.begin() + static_cast<long>(k * sim.peers_per_stage),
                                speeds.begin() + static_cast<long>((k + 1) * sim.peers_per_stage));
  }
  auto ranges = graph::stage_ranges(g);
  if (!ranges)
    return ranges.error();
  if (!sim.stage_work.empty() && sim.stage_work.size() != g.stages.size())
    return fail(fmt::format("sim.stage_work: {} values for {} stages", sim.stage_work.size(),
                            g.stages.size()));
  s->ranges = *ranges;
  s->slots = graph::peer_slots(g);
  s->prefix = "swarm/" + eg.name;
  s->modeled = modeled;
  s->sim = sim;
  s->bandwidth = eg.network.defaults.bandwidth;
  s->latency = eg.network.defaults.latency;
  s->trainers = g.trainers;
  if (modeled && sim.routing == swarm_routing::fixed) {
    // One trainer per fixed pipeline: as many as the thinnest stage has peers.
    size_t pipelines = s->slots.size();
    for (auto& st : g.stages)
      pipelines = std::min(pipelines, st.speeds.size());
    s->trainers = static_cast<int64_t>(pipelines);
  }
  {
    std::vector<std::string> names;
    for (int64_t i = 0; i < s->trainers; ++i)
      names.push_back(fmt::format("trainer.{}", i));
    s->trainer_tags = actors::collab::trainer_tags(names);
  }
  s->graph = std::move(g);
  return s;
}

/// Puts the swarm's roles, faults and reporter into `eg` for `setup`.
void add_swarm_roles(experiment_graph& eg, const std::shared_ptr<const swarm_setup>& setup,
                     std::shared_ptr<swarm_sim_outcome> outcome = {}) {
  auto& g = setup->graph;
  eg.roles.erase(std::remove_if(eg.roles.begin(), eg.roles.end(),
                                [](const role_spec& r) {
                                  return r.name == "peers" || r.name == "trainer"
                                         || r.name == "volunteers";
                                }),
                 eg.roles.end());
  role_spec peers;
  peers.name = "peers";
  peers.type = "swarm.stage";
  peers.replicas = setup->slots.size();
  peers.options = swarm_role_options{setup};
  peers.restart.delay = g.restart_delay;
  peers.placement.avoid = {"trainer"};
  role_spec trainer;
  trainer.name = "trainer";
  trainer.type = "swarm.trainer";
  trainer.replicas = static_cast<size_t>(setup->trainers);
  trainer.options = swarm_role_options{setup};
  trainer.restart.supervised = false; // a restarted trainer would train its shard again
  trainer.placement.spread = false;
  trainer.placement.nodes = {0};
  eg.roles.insert(eg.roles.begin(), peers);
  eg.roles.insert(eg.roles.begin(), trainer);
  if (g.volunteers > 0) {
    role_spec v = peers;
    v.name = "volunteers";
    v.replicas = static_cast<size_t>(g.volunteers);
    v.options = swarm_role_options{setup, true};
    v.placement = {};
    v.placement.open = true;
    eg.roles.push_back(v);
  }
  eg.reporters.clear();
  // With real compute a simulated run reports as a real one (loss, bursts, held-out loss).
  if (setup->modeled && !setup->sim.real_compute)
    eg.reporters.push_back([setup, outcome] { return make_swarm_sim_reporter(setup, outcome); });
  else
    eg.reporters.push_back([setup] { return make_swarm_reporter(setup); });
}

std::string seconds_text(nanoseconds d) {
  return fmt::format("{:.0f}s", std::chrono::duration<double>(d).count());
}

/// The strategy comparison: the same workload, seed and fault plan for every strategy.
int run_study(const experiment_graph& base, const run_function& run, const std::string&) {
  auto& setup0 = std::any_cast<const swarm_role_options&>(base.find("peers")->options).setup;
  auto s = setup0->sim;
  auto main_t = s.rebalance_period.count() > 0 ? s.rebalance_period : std::chrono::seconds(60);
  auto periods = s.study_periods.empty()
                   ? std::vector<nanoseconds>{std::chrono::seconds(30), std::chrono::seconds(120),
                                              std::chrono::seconds(300)}
                   : s.study_periods;
  std::vector<std::tuple<std::string, swarm_routing, nanoseconds>> runs{
    {"stochastic + rebalancing (T=" + seconds_text(main_t) + ")", swarm_routing::stochastic,
     main_t},
    {"stochastic, no rebalancing", swarm_routing::stochastic, nanoseconds{0}},
    {"uniform random routing", swarm_routing::uniform, nanoseconds{0}},
    {"fixed pipelines (GPipe-style)", swarm_routing::fixed, nanoseconds{0}},
  };
  for (auto p : periods)
    if (p != main_t)
      runs.emplace_back("  sweep: stochastic + rebal. T=" + seconds_text(p),
                        swarm_routing::stochastic, p);
  fmt::print("\nstudy: same workload, seed and fault plan for every strategy; bound = integral of "
             "min(fluid, Little) after the {:.0f} s warm-up; 'of assign' = vs. the bound of the "
             "stage assignment in effect\n",
             std::chrono::duration<double>(s.warmup).count());
  fmt::print("  {:<38} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>7} {:>8}\n", "strategy", "samples",
             "samples/s", "of bound", "of assign", "moves", "preem", "retries", "wall s");
  std::fflush(stdout);
  for (auto& [name, routing, period] : runs) {
    auto sim = s;
    sim.routing = routing;
    sim.rebalance_period = period;
    sim.study = false;
    auto setup = make_setup(setup0->graph, swarm_sim_options{sim}, base, true);
    if (!setup) {
      fmt::print(stderr, "starling: error: {}\n", setup.error().what);
      return 2;
    }
    // Lognormal speeds were drawn already: keep the same peers.
    (*setup)->sim.peers_per_stage = 0;
    auto variant = base;
    variant.study = nullptr;
    auto outcome = std::make_shared<swarm_sim_outcome>();
    add_swarm_roles(variant, *setup, outcome);
    variant.reporters.clear();
    variant.reporters.push_back([st = std::shared_ptr<const swarm_setup>(*setup), outcome] {
      return make_swarm_sim_reporter(st, outcome);
    });
    auto r = run(variant);
    if (r.exit_code == 2)
      return 2;
    auto& o = *outcome;
    auto sec = o.measured_s > 0 ? o.measured_s : 1.0;
    fmt::print("  {:<38} {:>9} {:>9.2f} {:>8.1f}% {:>8.1f}% {:>6} {:>6} {:>7} {:>8.1f}\n", name,
               o.samples, o.measured_samples / sec,
               o.bound_samples > 0 ? 100.0 * o.measured_samples / o.bound_samples : 0.0,
               o.assigned_bound_samples > 0 ? 100.0 * o.measured_samples / o.assigned_bound_samples
                                            : 0.0,
               o.migrations, o.preemptions, o.retries, r.wall_s);
    std::fflush(stdout);
  }
  return 0;
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

caf::actor swarm_board(host& h, const swarm_setup& s) {
  auto stages = s.graph.stages.size();
  if (h.mode() == run_mode::sim) {
    auto shared = shared_board(h, s);
    return h.service("swarm.board_view", [shared](host& x) {
      actors::stage::board_view_options o;
      o.board = shared;
      o.view = [hp = &x](const caf::actor& a) { return hp->view(a); };
      return actors::stage::spawn_board_view(x.system(), std::move(o));
    });
  }
  auto prefix = s.prefix;
  return h.service("swarm.board", [prefix, stages](host& x) {
    actors::stage::dht_board_options b;
    b.prefix = prefix;
    b.endpoint = x.endpoint();
    b.stages = stages;
    return actors::stage::spawn_dht_board(x.system(), x.dht(), x.resolver(), b);
  });
}

void add_swarm(role_registry& reg) {
  auto cache = std::make_shared<swarm_data_cache>();
  auto describe = [](const swarm_role_options& o) {
    auto& g = o.setup->graph;
    return fmt::format("{}, {} stages, {} backend", g.describe_model(), g.stages.size(),
                       !o.setup->modeled          ? "LibTorch"
                       : o.setup->sim.real_compute ? "LibTorch (modeled device time)"
                                                   : "cost-model");
  };
  auto check = [](const swarm_role_options& o) -> status {
    if (!o.setup)
      return fail("swarm roles need the swarm setup (use the `swarm:` section)");
    return {};
  };
  auto& stage = reg.add<swarm_role_options>(
    "swarm.stage", "a SWARM stage peer (instance i = peer slot i; rebalancing may move it)",
    spawn_stage_peer, {}, check, describe,
    [](const swarm_role_options& o, size_t i) {
      return !o.volunteer && i < o.setup->slots.size() ? o.setup->slots[i].first : 0;
    });
  stage.rebalancing = [](host& h, const std::any& a,
                         actors::supervisor::rebalancing_options& ro) {
    auto& s = *std::any_cast<const swarm_role_options&>(a).setup;
    ro.seed = s.graph.seed * 7777 + h.index();
    if (!s.modeled) {
      // Real peers: the node's DHT board, which keeps throughput reports, joiners and migration
      // claims in DHT records that every node of the run reads.
      auto& r = s.graph.rebalance;
      if (!r.enabled())
        return false;
      ro.board = swarm_board(h, s);
      ro.period = span(r.every);
      ro.policy.threshold = r.threshold;
      ro.place_new_peers = r.place_new_peers;
      // A moved peer downloads its new stage's state before it announces itself: it counts
      // there for a few report periods at most (a longer hold would count it twice meanwhile).
      ro.join_hold = span(std::max(nanoseconds{std::chrono::seconds(10)}, 3 * r.report_every));
      return true;
    }
    bool on = s.sim.routing == swarm_routing::stochastic && s.sim.rebalance_period > nanoseconds{0};
    if (!on)
      return false;
    // The simulation's board is the shared one (rebalancing claims are not modeled traffic).
    ro.board = h.shared_service("swarm.board", [&h, &s] {
      return actors::stage::spawn_board(h.system(), s.graph.stages.size());
    });
    ro.period = span(s.sim.rebalance_period);
    ro.policy.threshold = s.sim.rebalance_threshold;
    ro.place_new_peers = s.sim.place_new_peers;
    return true;
  };
  reg.add<swarm_role_options>(
    "swarm.trainer", "a SWARM trainer (its shard of the data, stochastic wiring)",
    [cache](role_context& ctx, const swarm_role_options& o) { return spawn_trainer(ctx, o, cache); },
    {}, check, describe);
  kind_type k;
  k.name = "swarm";
  k.summary = "SWARM pipeline training of a byte-level GPT or a TorchScript model with preemptions";
  k.expand = [cache](config_node& n, experiment_graph& eg, const expand_context& ctx) {
    graph::swarm_graph g;
    graph::read_swarm_graph(n, g);
    swarm_sim_options sim;
    if (g.rebalance.enabled()) {
      // The same experiment simulated rebalances as it would run (`sim:` may still retune it).
      sim.rebalance_period = g.rebalance.every;
      sim.rebalance_threshold = g.rebalance.threshold;
      sim.place_new_peers = g.rebalance.place_new_peers;
    }
    if (n.has("sim")) {
      auto c = n.child("sim");
      if (!c.is_map())
        c.expected("a map of simulation settings");
      read_sim_options(c, sim);
    }
    g.seed = eg.seed;
    auto modeled = ctx.mode == run_mode::sim;
    // A token file is checked here (size, dtype, every id against the vocabulary), so that a bad
    // one is a config error rather than trainers that cannot start.
    if (!modeled && g.data.kind == "tokens" && !data_for(*cache, g, false))
      n.child("data").fail(cache->error);
    auto setup = make_setup(g, sim, eg, modeled);
    if (!setup)
      n.fail(setup.error().what);
    eg.trace_messages = !modeled || sim.trace_messages;
    // A stopped run continues from its stage checkpoints and its trainers' progress files.
    eg.not_resumable = modeled ? "simulated stage peers hold no learned state"
                       : g.checkpoint.every <= nanoseconds{0}
                         ? "its stage peers write no checkpoints (swarm.checkpoint.every: 0)"
                         : "";
    eg.inspect_resume = [setup = *setup](const std::string& dir) {
      return inspect_swarm_run(*setup, dir);
    };
    add_swarm_roles(eg, *setup);
    if (g.preempt_every > nanoseconds{0}) {
      fault_spec f;
      f.kind = fault_kind::preempt;
      f.role = "peers";
      f.every = g.preempt_every;
      f.restart.delay = g.restart_delay;
      eg.faults.push_back(f);
    }
    if (modeled && sim.study)
      eg.study = run_study;
  };
  reg.add_kind(std::move(k));
}

result<std::map<std::string, kernels::batch_progress>>
read_run_progress(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::map<std::string, kernels::batch_progress> out;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec))
    return out;
  for (auto& n : fs::directory_iterator(run_dir, ec)) {
    auto node = actors::trainer::read_progress_dir((n.path() / "progress").string());
    if (!node)
      return node.error();
    for (auto& [name, p] : *node)
      out.emplace(name, std::move(p));
  }
  return out;
}

} // namespace starling::runtime
