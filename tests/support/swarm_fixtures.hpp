// Shared pieces of the SWARM actor tests: a sink that tallies trainer reports, a small corpus,
// tiny stage options, and a synchronous ask from a short-lived actor in a simulated world.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/dht/dht.hpp"
#include "actors/stage/board.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "kernels/data/text_source.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/sim/world.hpp"

namespace starling::testing {

/// One simulated node "n" with an in-process board of `stages` stages, the world seeded with
/// `seed`: the setup most stage tests start from.
struct board_world {
  runtime::sim::world w;
  runtime::sim::sim_node& n;
  caf::actor board;
  board_world(uint64_t seed, size_t stages)
    : w{[seed] {
        runtime::sim::world_options wo;
        wo.seed = seed;
        return wo;
      }()},
      n(w.add_node("n")),
      board(actors::stage::spawn_board(w.system(), stages)) {
    n.adopt("board", board);
  }
};

/// What trainers report: microbatches, samples, retries, stops, losses, and which batches of
/// each trainer's stream completed (a batch reported twice is counted in `repeats`).
struct tally {
  int microbatches = 0;
  int64_t samples = 0;
  int64_t retries = 0;
  int stops = 0;
  std::vector<double> losses;
  std::map<std::string, std::set<uint64_t>> batches;
  int repeats = 0;
};

inline caf::behavior counting_sink(caf::event_based_actor*, std::shared_ptr<tally> t) {
  return {
    [=](report_atom, const std::string& name, double loss, int64_t samples, int64_t retries,
        double, uint64_t batch) {
      if (!t->batches[name].insert(batch).second)
        t->repeats++;
      t->microbatches++;
      t->samples += samples;
      t->retries += retries;
      t->losses.push_back(loss);
    },
    [=](stop_atom, const std::string&) { t->stops++; },
  };
}

/// A short text cut into windows of the tiny model's 8 bytes.
inline std::shared_ptr<const kernels::data_source> small_corpus() {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "In the beginning God created the heaven and the earth. ";
  auto c = std::make_shared<const kernels::corpus>(text, 0.05, "test");
  kernels::text_source_options o;
  o.seq_len = 8;
  return *kernels::text_source::make(c, o);
}

/// A 2-layer, width-16 GPT stage peer serving blocks [begin, end).
inline actors::stage::stage_options stage_opts(uint64_t stage, int64_t begin, int64_t end,
                                               const std::string& name) {
  actors::stage::stage_options o;
  o.stage = stage;
  o.name = name;
  kernels::gpt_config m;
  m.layers = 2;
  m.width = 16;
  m.heads = 2;
  m.seq_len = 8;
  m.seed = 3;
  o.model = kernels::gpt_model(m);
  o.begin = begin;
  o.end = end;
  o.local_batch = 8;
  o.timeout = caf::timespan{std::chrono::seconds(2)};
  return o;
}

/// Sends `xs...` to `peer` from a short-lived actor on `n`; the typed answer, or nothing.
template <class T, class... Ts>
std::optional<T> ask(runtime::sim::world& w, runtime::sim::sim_node& n, caf::actor peer,
                     Ts... xs) {
  auto got = std::make_shared<std::optional<T>>();
  auto asked = std::make_shared<bool>(false);
  n.spawn("", [=](caf::event_based_actor* self) {
    self->request(peer, caf::timespan{std::chrono::seconds(60)}, xs...)
      .then([=](const T& x) { *got = x; *asked = true; }, [=](caf::error&) { *asked = true; });
    return caf::behavior{[](int) {}};
  });
  w.run_until([&] { return *asked; }, std::chrono::seconds(120));
  return *got;
}

/// A trainer of the tiny test model: `microbatches` of 4 samples of 8 bytes through `stages`
/// stages, uncompressed activations, peer lists refreshed every 500 ms.
inline actors::trainer::trainer_options tiny_trainer(uint64_t stages, int64_t microbatches,
                                                     int64_t max_inflight,
                                                     caf::timespan hop_timeout) {
  actors::trainer::trainer_options to;
  to.stages = stages;
  to.microbatch = 4;
  to.microbatches = microbatches;
  to.max_inflight = max_inflight;
  to.hop_timeout = hop_timeout;
  to.refresh_every = caf::timespan{std::chrono::milliseconds(500)};
  to.codec = kernels::codec_id::none;
  return to;
}

/// The options of simulated node `i`'s DHT node (seeded id; node 0, "n0", is the bootstrap)
/// and of its DHT-backed board under `prefix` (1 s announcements, 2 s timeouts).
struct dht_board_setup {
  actors::dht::dht_options dht;
  actors::stage::dht_board_options board;
};

inline dht_board_setup dht_board_node(runtime::sim::sim_node& nd, int i, uint64_t id_seed,
                                      const std::string& prefix, size_t stages) {
  dht_board_setup out;
  out.dht.address = nd.endpoint() + "/dht";
  out.dht.id = actors::dht::identity::from_seed(id_seed + static_cast<uint64_t>(i));
  if (i > 0)
    out.dht.bootstrap = {"n0:1/dht"};
  out.board.prefix = prefix;
  out.board.endpoint = nd.endpoint();
  out.board.stages = stages;
  out.board.announce_period = caf::timespan{std::chrono::seconds(1)};
  out.board.timeout = caf::timespan{std::chrono::seconds(2)};
  return out;
}

/// A board's answer to `(get_atom, load_atom, peer)`: per stage the summed throughput and peers,
/// and the peer's own reported throughput.
struct loads_reply {
  std::vector<double> throughput;
  std::vector<int64_t> peers;
  double mine = -2;
};

/// Asks `board` for the stages' loads from a short-lived actor on `n`; none if it did not answer.
inline std::optional<loads_reply> ask_loads(runtime::sim::world& w, runtime::sim::sim_node& n,
                                            caf::actor board, caf::actor peer) {
  auto got = std::make_shared<std::optional<loads_reply>>();
  auto asked = std::make_shared<bool>(false);
  n.spawn("", [=](caf::event_based_actor* self) {
    self->request(board, caf::timespan{std::chrono::seconds(10)}, get_atom::value,
                  load_atom::value, peer)
      .then(
        [=](std::vector<double> tp, std::vector<int64_t> peers, double mine) {
          *got = loads_reply{std::move(tp), std::move(peers), mine};
          *asked = true;
        },
        [=](caf::error&) { *asked = true; });
    return caf::behavior{[](int) {}};
  });
  w.run_until([&] { return *asked; }, std::chrono::seconds(20));
  return *got;
}

/// Adds `count` simulated nodes "n0".."n<count-1>", each running a DHT node and a DHT-backed board
/// (`dht_board_node` options; node 0 is the bootstrap), 500 ms of virtual time apart.
inline void add_dht_board_nodes(runtime::sim::world& w, int count, uint64_t id_seed,
                                const std::string& prefix, uint64_t stages) {
  for (int i = 0; i < count; ++i) {
    auto& nd = w.add_node("n" + std::to_string(i));
    auto setup = dht_board_node(nd, i, id_seed, prefix, stages);
    auto d = setup.dht;
    auto b = setup.board;
    nd.on_start([d, b](runtime::sim::sim_node& x) {
      x.spawn("dht", actors::dht::dht_actor, x.resolver(), d);
      x.spawn("board", actors::stage::dht_board_actor, x.lookup("dht"), x.resolver(), b);
    });
    w.run_for(std::chrono::milliseconds(500));
  }
}


} // namespace starling::testing
