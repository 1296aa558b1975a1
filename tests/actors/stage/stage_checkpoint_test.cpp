// A stage's learned state outlives its peers: every peer of a stage is killed mid-run, and the
// respawned peers, finding no live donor, resume from their nodes' newest checkpoints (simulated
// time, LibTorch backend, the tiny test model).
#include <doctest/doctest.h>

#include <cmath>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/stage/board.hpp"
#include "actors/stage/checkpoint.hpp"
#include "actors/stage/stage.hpp"
#include "actors/stage/state_parts.hpp"
#include "actors/trainer/trainer.hpp"
#include "messages/atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/node_fixtures.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_stage_checkpoint_test {

using namespace starling;
using namespace std::chrono_literals;

namespace {

using actors::stage::checkpoint_atom;
using testing::ask;
using testing::counting_sink;
using testing::small_corpus;
using testing::tally;

/// A stage peer of the tiny model whose every call costs 20 ms of device time at full speed
/// (deterministic virtual time) on a device at a quarter of it, checkpointing into `dir` every
/// 500 ms.
actors::stage::stage_options peer_opts(uint64_t stage, const std::string& name,
                                       const std::string& dir, const std::string& optimizer = "") {
  auto o = testing::stage_opts(stage, static_cast<int64_t>(stage), static_cast<int64_t>(stage) + 1,
                               name);
  if (!optimizer.empty()) {
    o.optimizer.kind = optimizer;
    o.optimizer.lr = 5e-2; // LAMB steps each tensor by lr * ||w||: it wants a larger lr than Adam
  }
  o.timer = [](const std::function<void()>& work) {
    work();
    return 0.02;
  };
  o.speed = 0.25; // 80 ms of virtual time per call
  o.codec = kernels::codec_id::none;
  o.checkpoint.dir = dir;
  o.checkpoint.every = caf::timespan{500ms};
  return o;
}

/// The peer's checkpoint counters and the digest it resumed from.
struct ckpt_status {
  // written, bytes, restored, restored steps, rejected, failed, pending samples taken up
  std::vector<uint64_t> counters;
  std::string restored_digest;
};

ckpt_status checkpoint_status(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor peer) {
  auto got = std::make_shared<std::optional<ckpt_status>>();
  auto asked = std::make_shared<bool>(false);
  n.spawn("", [=](caf::event_based_actor* self) {
    self->request(peer, caf::timespan{10s}, status_atom::value, checkpoint_atom::value)
        .then(
            [=](std::vector<uint64_t> c, std::string d) {
              *got = ckpt_status{std::move(c), std::move(d)};
              *asked = true;
            },
            [=](caf::error&) { *asked = true; });
    return caf::behavior{[](int) {}};
  });
  w.run_until([&] { return *asked; }, 20s);
  REQUIRE(got->has_value());
  REQUIRE((*got)->counters.size() == 7);
  return **got;
}

/// Mean loss of a few fixed batches through `first` and `last` (forward passes only).
double eval_loss(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor first,
                 caf::actor last) {
  auto data = small_corpus();
  double total = 0;
  const int batches = 4;
  for (int b = 0; b < batches; ++b) {
    std::vector<uint64_t> ids;
    for (uint64_t i = 0; i < 8; ++i)
      ids.push_back(1000 + 37 * (static_cast<uint64_t>(b) * 8 + i));
    auto batch = data->batch(ids);
    REQUIRE(batch.ok());
    messages::tensor_msg in{batch->inputs, kernels::codec_id::none, {}, {}};
    messages::tensor_msg targets{batch->targets, kernels::codec_id::none, {}, {}};
    auto act = ask<messages::tensor_msg>(w, n, first, messages::stage_forward{in, targets, 1, {}});
    REQUIRE(act);
    auto loss =
        ask<messages::tensor_msg>(w, n, last, messages::stage_forward{*act, targets, 1, {}});
    REQUIRE(loss);
    total += loss->tensor.item<double>();
  }
  return total / batches;
}

/// The digest of the newest checkpoint of stage 1 in `dir` (it must exist and verify).
std::string newest_digest(const std::string& dir) {
  auto found = actors::stage::newest_checkpoint({dir}, actors::stage::checkpoint_key{1, 1, 2});
  REQUIRE(found.found);
  CHECK(found.rejected.empty());
  return found.found->digest;
}

} // namespace

TEST_CASE("every peer of a stage killed mid-run: the respawned peers resume from their "
          "checkpoints, every microbatch completes once, and the held-out loss is the "
          "checkpoint's") {
  std::string optimizer;
  SUBCASE("the fixtures' optimizer") {}
  SUBCASE("lamb8: checkpoints hold 8-bit codes and scales") {
    optimizer = "lamb8";
  }
  CAPTURE(optimizer);
  testing::temp_dir tmp{"starling-stage-ckpt"};
  const std::string dir_a = tmp.path + "/node-a/checkpoints";
  const std::string dir_b = tmp.path + "/node-b/checkpoints";
  testing::board_world bw{21, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& sys = w.system();
  auto& board = bw.board;
  auto s0 =
    actors::stage::spawn_stage(sys, peer_opts(0, "s0", tmp.path + "/node-0", optimizer), board);
  n.adopt("s0", s0);
  // Stage 1: two peers, each checkpointing into its own node's folder.
  auto spawn_s1 = [&](const std::string& name, const std::string& dir, bool rejoin) {
    auto o = peer_opts(1, name, dir, optimizer);
    o.download_state = rejoin;
    auto a = actors::stage::spawn_stage(sys, o, board);
    n.adopt(name, a);
    return a;
  };
  spawn_s1("s1a", dir_a, false);
  spawn_s1("s1b", dir_b, false);
  w.run();
  auto t = std::make_shared<tally>();
  auto sink = n.spawn("sink", counting_sink, t);
  auto to = testing::tiny_trainer(2, 120, 2, caf::timespan{2s});
  n.adopt("trainer", actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink));
  // Mid-run, once both have checkpointed: the whole stage is gone.
  REQUIRE(w.run_until(
      [&] {
        return t->microbatches >= 40 &&
               !actors::stage::list_checkpoints(dir_a, {1, 1, 2}).empty() &&
               !actors::stage::list_checkpoints(dir_b, {1, 1, 2}).empty();
      },
      300s));
  w.kill_actor("n", "s1a");
  w.kill_actor("n", "s1b");
  auto killed_at = t->microbatches;
  CHECK(killed_at < 120);
  auto digest_a = newest_digest(dir_a);
  auto digest_b = newest_digest(dir_b);
  w.run_for(3s);
  CHECK(t->microbatches < 120); // nothing passes stage 1 while it has no peer
  auto a1 = spawn_s1("s1ag1", dir_a, true);
  auto b1 = spawn_s1("s1bg1", dir_b, true);
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  // Every microbatch completed, none twice, the ones in flight at the kill retried.
  CHECK(t->microbatches == 120);
  CHECK(t->repeats == 0);
  CHECK(t->batches["trainer"].size() == 120);
  for (auto l : t->losses)
    CHECK(std::isfinite(l));
  // Each respawned peer resumed from its node's newest checkpoint, not its initialization.
  auto st_a = checkpoint_status(w, n, a1);
  auto st_b = checkpoint_status(w, n, b1);
  CHECK(st_a.counters[2] == 1);
  CHECK(st_b.counters[2] == 1);
  CHECK(st_a.counters[3] > 0);
  CHECK(st_a.restored_digest == digest_a);
  CHECK(st_b.restored_digest == digest_b);
  CHECK(st_a.counters[4] == 0); // nothing rejected
  // Quiet now: the last checkpoints catch up with the final states.
  w.run_for(2s);
  auto last_a = newest_digest(dir_a);
  auto live = ask<messages::stage_state>(w, n, a1, get_atom::value, state_atom::value);
  REQUIRE(live);
  CHECK(actors::stage::state_digest(*live) == last_a);
  // lamb8's state (served and checkpointed) is its codes and scales.
  CHECK(live->packed_moments.empty() == optimizer.empty());
  CHECK(live->moments.tensor.defined() == optimizer.empty());
  auto loss_before = eval_loss(w, n, s0, a1);
  // The whole stage again, between runs this time; then one peer comes back.
  w.kill_actor("n", "s1ag1");
  w.kill_actor("n", "s1bg1");
  w.run_for(1s);
  auto a2 = spawn_s1("s1ag2", dir_a, true);
  w.run_for(100ms); // it finds its stage empty at its first try and resumes at once
  auto first = ask<messages::stage_state>(w, n, a2, get_atom::value, state_atom::value);
  REQUIRE(first);             // not "still starting"
  CHECK(first->samples == 0); // nobody trained on it yet: the first state it serves
  CHECK(actors::stage::state_digest(*first) == last_a);
  auto loss_after = eval_loss(w, n, s0, a2);
  CHECK(std::abs(loss_after - loss_before) < 0.1);
  // Without its checkpoints the stage would have started over: a peer of the seeded
  // initialization is far off (the check above can fail).
  w.kill_actor("n", "s1ag2");
  w.run_for(1s);
  auto fresh = spawn_s1("s1fresh", tmp.path + "/empty", false);
  w.run();
  auto loss_fresh = eval_loss(w, n, s0, fresh);
  CHECK(std::abs(loss_fresh - loss_before) > 0.1);
  MESSAGE("held-out loss: checkpoint " << loss_before << ", after recovery " << loss_after
                                       << ", seeded initialization " << loss_fresh);
}

namespace {

/// The inputs of microbatch `i` of stage 1 (block 1 and the head of the tiny model): fixed
/// activations and targets of 4 samples.
messages::stage_backward microbatch(uint64_t i) {
  torch::manual_seed(1000 + i);
  auto input = torch::randn({4, 8, 16});
  auto targets = torch::randint(0, 256, {4, 8}, torch::kLong);
  return messages::stage_backward{{input, kernels::codec_id::none, {}, {}},
                                  {},
                                  {targets, kernels::codec_id::none, {}, {}},
                                  i,
                                  {},
                                  i,
                                  0};
}

/// Microbatches [from, to) through `peer`'s backward, each confirmed (its gradient applied).
void train(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor peer, uint64_t from,
           uint64_t to) {
  for (auto i = from; i < to; ++i) {
    auto r = ask<messages::stage_backward_reply>(w, n, peer, microbatch(i));
    REQUIRE(r);
    caf::anon_send(peer, messages::commit_atom::value, i, uint32_t{0});
    w.run();
  }
}

/// A stage-1 peer stepping every 4 microbatches (16 samples), checkpointing into `dir` as slot
/// `s1p0`.
caf::actor accumulating_peer(testing::board_world& bw, const std::string& name,
                             const std::string& dir, bool rejoin) {
  auto o = peer_opts(1, name, dir);
  o.local_batch = 16;
  o.download_state = rejoin;
  o.checkpoint.slot = "s1p0";
  auto a = actors::stage::spawn_stage(bw.w.system(), o, bw.board);
  bw.n.adopt(name, a);
  bw.w.run_for(200ms);
  return a;
}

} // namespace

TEST_CASE("a stage peer stopped on purpose saves the gradient it had accumulated, and its slot's next "
          "peer takes it up once and ends where a peer never stopped does") {
  testing::temp_dir tmp{"starling-stage-pending"};
  auto dir = tmp.path + "/checkpoints";
  // Never stopped: 8 microbatches, 2 optimizer steps.
  testing::board_world ref_world{31, 2};
  auto ref = accumulating_peer(ref_world, "ref", tmp.path + "/ref", false);
  train(ref_world.w, ref_world.n, ref, 0, 8);
  // Stopped after 7: a step at 4 (checkpointed), 3 microbatches accumulated towards the next.
  testing::board_world bw{31, 2};
  auto a = accumulating_peer(bw, "s1p0g0", dir, false);
  train(bw.w, bw.n, a, 0, 4);
  bw.w.run_for(1s); // the checkpoint of step 1
  train(bw.w, bw.n, a, 4, 7);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  bw.w.run_for(100ms);
  auto key = actors::stage::checkpoint_key{1, 1, 2};
  REQUIRE(actors::stage::list_checkpoints(actors::stage::pending_dir(dir), key).size() == 1);
  // The slot's next peer finds no live donor, resumes from the checkpoint of step 1 and takes
  // up the 12 samples' gradient; the 8th microbatch completes the step.
  auto b = accumulating_peer(bw, "s1p0g1", dir, true);
  auto st = checkpoint_status(bw.w, bw.n, b);
  CHECK(st.counters[2] == 1);
  CHECK(st.counters[3] == 1);
  CHECK(st.counters[6] == 12);
  CHECK(actors::stage::list_checkpoints(actors::stage::pending_dir(dir), key).empty());
  train(bw.w, bw.n, b, 7, 8);
  auto status = ask<std::vector<uint64_t>>(bw.w, bw.n, b, status_atom::value);
  auto ref_status = ask<std::vector<uint64_t>>(ref_world.w, ref_world.n, ref, status_atom::value);
  REQUIRE((status && ref_status));
  CHECK((*status)[0] == 2);
  CHECK((*ref_status)[0] == 2);
  auto mine = ask<messages::stage_state>(bw.w, bw.n, b, get_atom::value, state_atom::value);
  auto theirs =
      ask<messages::stage_state>(ref_world.w, ref_world.n, ref, get_atom::value, state_atom::value);
  REQUIRE((mine && theirs));
  auto diff = (mine->params.tensor - theirs->params.tensor).abs().max().item<double>();
  CHECK(diff < 1e-6);
  // Taken up once: a later peer of the slot (the whole stage gone again) finds nothing to add.
  caf::anon_send_exit(b, caf::exit_reason::kill);
  bw.w.run_for(100ms);
  auto c = accumulating_peer(bw, "s1p0g2", dir, true);
  CHECK(checkpoint_status(bw.w, bw.n, c).counters[6] == 0);
}

} // namespace starling::test::actors_stage_checkpoint_test
