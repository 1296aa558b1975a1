// Shared pieces of the SWARM actor tests: a sink that tallies trainer reports, a small corpus,
// tiny stage options, and a synchronous ask from a short-lived actor in a simulated world.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/dht/dht.hpp"
#include "actors/stage/dht_board.hpp"
#include "actors/stage/stage.hpp"
#include "actors/trainer/trainer.hpp"
#include "kernels/data/corpus.hpp"
#include "messages/atoms.hpp"
#include "messages/rebalance_atoms.hpp"
#include "runtime/sim/world.hpp"

namespace starling::testing {

/// What trainers report: microbatches, samples, retries, stops, losses.
struct tally {
  int microbatches = 0;
  int64_t samples = 0;
  int64_t retries = 0;
  int stops = 0;
  std::vector<double> losses;
};

inline caf::behavior counting_sink(caf::event_based_actor*, std::shared_ptr<tally> t) {
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

inline std::shared_ptr<const kernels::corpus> small_corpus() {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "In the beginning God created the heaven and the earth. ";
  return std::make_shared<const kernels::corpus>(text, 0.05, "test");
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
  to.seq_len = 8;
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

} // namespace starling::testing
