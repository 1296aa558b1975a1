#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/stage/board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "runtime/sim/world.hpp"

using namespace starling;
using namespace std::chrono_literals;

namespace {

/// Counts what trainers report: microbatches, samples, retries, stops.
struct tally {
  int microbatches = 0;
  int64_t samples = 0;
  int64_t retries = 0;
  int stops = 0;
  std::vector<double> losses;
};

caf::behavior counting_sink(caf::event_based_actor*, std::shared_ptr<tally> t) {
  return {
    [=](report_atom, const std::string&, double loss, int64_t samples, int64_t retries, double) {
      t->microbatches++;
      t->samples += samples;
      t->retries += retries;
      t->losses.push_back(loss);
    },
    [=](stop_atom, const std::string&) { t->stops++; },
  };
}

std::shared_ptr<const kernels::corpus> small_corpus() {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "In the beginning God created the heaven and the earth. ";
  return std::make_shared<const kernels::corpus>(text, 0.05, "test");
}

actors::stage::stage_options stage_opts(uint64_t stage, int64_t begin, int64_t end,
                                        const std::string& name) {
  actors::stage::stage_options o;
  o.stage = stage;
  o.name = name;
  o.model.layers = 2;
  o.model.width = 16;
  o.model.heads = 2;
  o.model.seq_len = 8;
  o.model.seed = 3;
  o.begin = begin;
  o.end = end;
  o.local_batch = 8;
  o.timeout = caf::timespan{2s};
  return o;
}

} // namespace

TEST_CASE("a pipeline with a stage peer killed mid-run completes every microbatch exactly once") {
  runtime::sim::world_options wo;
  wo.seed = 11;
  runtime::sim::world w{wo};
  auto& n = w.add_node("n");
  auto& sys = w.system();
  auto board = actors::stage::spawn_board(sys, 2);
  n.adopt("board", board);
  auto s0 = actors::stage::spawn_stage(sys, stage_opts(0, 0, 1, "s0a"), board);
  n.adopt("s0a", s0);
  w.run();
  auto s1a = actors::stage::spawn_stage(sys, stage_opts(1, 1, 2, "s1a"), board);
  n.adopt("s1a", s1a);
  w.run();
  auto s1b = actors::stage::spawn_stage(sys, stage_opts(1, 1, 2, "s1b"), board);
  n.adopt("s1b", s1b);
  w.run();
  auto t = std::make_shared<tally>();
  auto sink = sys.spawn(counting_sink, t);
  n.adopt("sink", sink);
  actors::trainer::trainer_options to;
  to.stages = 2;
  to.microbatch = 4;
  to.seq_len = 8;
  to.microbatches = 40;
  to.max_inflight = 2;
  to.hop_timeout = caf::timespan{1s};
  to.codec = kernels::codec_id::none;
  auto trainer = actors::trainer::spawn_trainer(sys, to, small_corpus(), board, sink);
  n.adopt("trainer", trainer);
  // Let some microbatches through, then preempt one of stage 1's two peers.
  REQUIRE(w.run_until([&] { return t->microbatches >= 10; }, 60s));
  caf::anon_send_exit(s1a, caf::exit_reason::kill);
  auto killed_at = t->microbatches;
  // A replacement joins later and downloads its state from the surviving peer.
  w.at(w.elapsed() + 3s, "respawn", [&] {
    n.adopt("s1c", actors::stage::spawn_stage(sys, stage_opts(1, 1, 2, "s1c"), board));
  });
  REQUIRE(w.run_until([&] { return t->stops == 1; }, 600s));
  CHECK(t->microbatches == 40);
  CHECK(t->samples == 40 * 4);
  CHECK(killed_at < 40);
  // The loss is finite throughout and training moved it.
  for (auto l : t->losses)
    CHECK(std::isfinite(l));
  CHECK(t->losses.back() < t->losses.front());
  // The kill caught a hop in flight (deterministic under the seed): the retry path ran.
  CHECK(t->retries >= 1);
  MESSAGE("retries after the kill: " << t->retries);
}
