// Exactly-once gradients at a stage: a backward's gradient is held until its trainer confirms
// that attempt (`commit_atom`), so a backward retried elsewhere after a timeout enters the stage's
// optimizer once; the unconfirmed attempt is dropped and counted as lost work.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/stage/board.hpp"
#include "actors/stage/stage.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "messages/swarm.hpp"
#include "runtime/sim/world.hpp"
#include "support/swarm_fixtures.hpp"

namespace starling::test::actors_stage_commit_test {

using namespace starling;
using namespace std::chrono_literals;

namespace {

using messages::commit_atom;
using testing::ask;

/// A last-stage peer of the tiny model (block 1 and the head) whose every call takes 80 ms of
/// device time at full speed on a device of speed `speed`; it steps after every microbatch of 4
/// samples.
caf::actor last_stage(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor board,
                      const std::string& name, double speed) {
  auto o = testing::stage_opts(1, 1, 2, name);
  o.timer = [](const std::function<void()>& work) {
    work();
    return 0.08;
  };
  o.speed = speed;
  o.local_batch = 4;
  o.commit_timeout = caf::timespan{2s};
  auto a = actors::stage::spawn_stage(w.system(), o, board);
  n.adopt(name, a);
  return a;
}

/// Microbatch id -> times its gradient was applied at `peer`.
std::map<uint64_t, uint64_t> applied_at(runtime::sim::world& w, runtime::sim::sim_node& n,
                                        caf::actor peer) {
  auto flat = ask<std::vector<uint64_t>>(w, n, peer, get_atom::value, commit_atom::value);
  REQUIRE(flat);
  REQUIRE(flat->size() % 2 == 0);
  std::map<uint64_t, uint64_t> out;
  for (size_t i = 0; i < flat->size(); i += 2)
    out[(*flat)[i]] = (*flat)[i + 1];
  return out;
}

} // namespace

TEST_CASE("a retried backward whose first attempt reached a slow peer is applied exactly once "
          "across the stage; the unconfirmed attempt is dropped as lost work") {
  testing::board_world bw{3, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto& board = bw.board;
  auto slow = last_stage(w, n, board, "s1slow", 0.01); // answers 8 s after a request arrives
  auto fast = last_stage(w, n, board, "s1fast", 1.0);
  w.run();
  auto data = testing::small_corpus();
  auto batch = data->batch({1, 2, 3, 4});
  REQUIRE(batch.ok());
  // The stage's input: block 0's activations of the batch (any [4, 8, 16] tensor would do).
  auto input = torch::randn({4, 8, 16});
  const uint64_t id = 77;
  auto backward = [&](uint32_t attempt) {
    return messages::stage_backward{{input, kernels::codec_id::none, {}, {}},
                                    {},
                                    {batch->targets, kernels::codec_id::none, {}, {}},
                                    5,
                                    {},
                                    id,
                                    attempt};
  };
  // Attempt 0 reaches the slow peer, which computes its gradient at once but answers only after
  // the trainer's 1 s hop timeout: the trainer retries on the fast peer and confirms attempt 1.
  auto timed_out = std::make_shared<bool>(false);
  auto done = std::make_shared<bool>(false);
  n.spawn("trainer", [=](caf::event_based_actor* self) {
    self->request(slow, caf::timespan{1s}, backward(0))
        .then([](messages::stage_backward_reply&) {},
              [=](caf::error&) {
                *timed_out = true;
                self->request(fast, caf::timespan{1s}, backward(1))
                    .then(
                        [=](messages::stage_backward_reply& r) {
                          if (r.grad_input.ok())
                            self->send(fast, commit_atom::value, id, uint32_t{1});
                          *done = true;
                        },
                        [=](caf::error&) { *done = true; });
              });
    return caf::behavior{[](int) {}};
  });
  REQUIRE(w.run_until([&] { return *done; }, 30s));
  CHECK(*timed_out);
  // Past the slow peer's reply and its commit timeout.
  w.run_for(15s);
  auto at_slow = applied_at(w, n, slow);
  auto at_fast = applied_at(w, n, fast);
  CHECK(at_slow.count(id) == 0);
  REQUIRE(at_fast.count(id) == 1);
  CHECK(at_fast[id] == 1);
  auto slow_counts = ask<std::vector<uint64_t>>(w, n, slow, status_atom::value, commit_atom::value);
  auto fast_counts = ask<std::vector<uint64_t>>(w, n, fast, status_atom::value, commit_atom::value);
  REQUIRE((slow_counts && fast_counts));
  CHECK(*slow_counts == std::vector<uint64_t>{0, 1, 0, 0}); // applied, lost, duplicate, held
  CHECK(*fast_counts == std::vector<uint64_t>{1, 0, 0, 0});
  // The optimizer saw the microbatch once: the fast peer stepped, the slow one did not.
  auto slow_status = ask<std::vector<uint64_t>>(w, n, slow, status_atom::value);
  auto fast_status = ask<std::vector<uint64_t>>(w, n, fast, status_atom::value);
  REQUIRE((slow_status && fast_status));
  CHECK((*slow_status)[0] == 0);
  CHECK((*fast_status)[0] == 1);
  // A late or repeated confirmation changes nothing.
  caf::anon_send(slow, commit_atom::value, id, uint32_t{0});
  caf::anon_send(fast, commit_atom::value, id, uint32_t{1});
  w.run();
  slow_counts = ask<std::vector<uint64_t>>(w, n, slow, status_atom::value, commit_atom::value);
  fast_counts = ask<std::vector<uint64_t>>(w, n, fast, status_atom::value, commit_atom::value);
  CHECK(*slow_counts == std::vector<uint64_t>{0, 1, 1, 0});
  CHECK(*fast_counts == std::vector<uint64_t>{1, 0, 1, 0});
  CHECK(applied_at(w, n, fast)[id] == 1);
}

TEST_CASE("a stage peer leaving its stage serves its queue, refuses new work, and quits once "
          "its gradients are confirmed") {
  testing::board_world bw{5, 2};
  auto& w = bw.w;
  auto& n = bw.n;
  auto peer = last_stage(w, n, bw.board, "s1leaving", 0.1); // 0.8 s of device time per call
  w.run();
  auto data = testing::small_corpus();
  auto batch = data->batch({1, 2, 3, 4});
  REQUIRE(batch.ok());
  auto input = torch::randn({4, 8, 16});
  auto backward = [&](uint64_t id) {
    return messages::stage_backward{{input, kernels::codec_id::none, {}, {}},
                                    {},
                                    {batch->targets, kernels::codec_id::none, {}, {}},
                                    5,
                                    {},
                                    id,
                                    0};
  };
  // Three backwards queue up (2.4 s of device time); the peer is told to leave at once.
  auto replies = std::make_shared<int>(0);
  auto refused = std::make_shared<std::string>();
  auto down = std::make_shared<std::optional<caf::error>>();
  n.spawn("trainer", [=](caf::event_based_actor* self) {
    self->monitor(peer);
    self->set_down_handler([=](const caf::down_msg& dm) { *down = dm.reason; });
    for (uint64_t id = 1; id <= 3; ++id)
      self->request(peer, caf::timespan{30s}, backward(id))
        .then(
          [=](messages::stage_backward_reply& r) {
            if (r.grad_input.ok())
              ++*replies;
            // Confirmed a little later: the peer waits for it.
            self->delayed_send(self, caf::timespan{500ms}, id);
          },
          [](caf::error&) {});
    self->send(peer, migrate_atom::value);
    // Arrives after the leave: refused at once, with the reason.
    self->request(peer, caf::timespan{30s}, backward(4))
      .then([](messages::stage_backward_reply&) {},
            [=](caf::error& e) { *refused = caf::to_string(e); });
    return caf::behavior{
      [=](uint64_t id) { self->send(peer, commit_atom::value, id, uint32_t{0}); },
    };
  });
  w.run_for(100ms);
  CHECK(refused->find("leaving its stage") != std::string::npos);
  CHECK_FALSE(down->has_value()); // still serving its queue
  REQUIRE(w.run_until([&] { return down->has_value(); }, 30s));
  CHECK(*replies == 3);
  CHECK(**down == caf::make_error(caf::exit_reason::user_shutdown));
}

} // namespace starling::test::actors_stage_commit_test
