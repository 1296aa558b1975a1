// Averagers on several nodes average over the direct transport (actors/transfer/transport.hpp):
// exact and compressed, reusing their links across rounds, together with a peer that has no
// transport (served over BASP), and with a client-mode peer whose transport accepts no
// connections (its links carry both directions).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/dht/dht.hpp"
#include "actors/transfer/data_channel.hpp"
#include "actors/transfer/transport.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"
#include "tests/support/closed_run.hpp"

namespace starling::test::actors_averager_links_test {

using namespace starling;
using namespace starling::actors::averager;
using namespace std::chrono_literals;

namespace {

/// How an averager reaches its peers' chunks.
enum class link_kind {
  /// No transport: BASP only.
  none,
  /// Its node's transport (shared with the node's transfers).
  node,
  /// A client-mode transport of its own: no listener.
  client,
};

// Nodes on loopback, each with a DHT and an averager reaching its peers as `kinds[i]` says.
struct avg_nodes {
  std::vector<std::unique_ptr<runtime::node>> nodes;
  std::vector<caf::actor> avgs;
  std::vector<std::shared_ptr<actors::transfer::transport>> own;

  /// With `closed`, the nodes belong to that closed run and speak TLS.
  avg_nodes(std::vector<link_kind> kinds, kernels::codec_id codec,
            testing::closed_run* closed = nullptr, bool adaptive = false) {
    runtime::caf_options co;
    co.heartbeat_interval = 100ms;
    co.connection_timeout = 2s;
    runtime::node_options no;
    no.listen = "127.0.0.1:0";
    std::string boot;
    for (size_t i = 0; i < kinds.size(); ++i) {
      if (closed) {
        no = closed->options("avg" + std::to_string(i), true);
        no.listen = "127.0.0.1:0";
      }
      auto nd = runtime::node::start(co, no, "avg" + std::to_string(i));
      REQUIRE_MESSAGE(nd, (nd ? std::string{} : nd.error().what));
      auto& node = **nd;
      actors::dht::dht_options d;
      d.address = node.endpoint() + "/dht";
      d.id = actors::dht::identity::from_seed(500 + i);
      if (!boot.empty())
        d.bootstrap = {boot};
      else
        boot = d.address;
      auto dht = actors::dht::spawn_dht(node.system(), node.resolver(), d);
      node.register_actor("dht", dht);
      averager_options a;
      a.address = node.endpoint() + "/averager";
      a.target_group_size = static_cast<uint32_t>(kinds.size());
      a.matchmaking_window = 1500ms;
      a.poll_interval = 50ms;
      a.round_timeout = 20s;
      a.chunk_bytes = 64 << 10; // several chunks per part
      a.codec = codec;
      a.adaptive_codec = adaptive;
      if (kinds[i] == link_kind::node) {
        REQUIRE(node.data_endpoint());
        a.transport = node.data_endpoint()->link_layer();
      } else if (kinds[i] == link_kind::client) {
        actors::transfer::transport_options to;
        to.host.clear();
        auto t = actors::transfer::transport::open(to);
        REQUIRE(t);
        own.push_back(*t);
        a.transport = *t;
      }
      auto avg = spawn_averager(node.system(), dht, node.resolver(), a);
      node.register_actor("averager", avg);
      avgs.push_back(avg);
      nodes.push_back(std::move(*nd));
    }
  }

  ~avg_nodes() {
    for (auto& n : nodes)
      n->shutdown();
    for (auto& t : own)
      t->stop();
  }

  // One round with everyone's inputs; empty when not every peer completed with all members.
  std::vector<messages::average_result> round(const std::vector<torch::Tensor>& xs) {
    std::vector<std::unique_ptr<caf::scoped_actor>> selves;
    std::vector<caf::response_handle<caf::blocking_actor, caf::message, true>> hs;
    for (size_t i = 0; i < nodes.size(); ++i) {
      selves.push_back(std::make_unique<caf::scoped_actor>(nodes[i]->system()));
      messages::tensor_list tl;
      tl.tensors.push_back(messages::tensor_msg{xs[i], kernels::codec_id::none, {}, {}});
      hs.push_back((*selves.back())->request(avgs[i], 60s, average_atom::value,
                                             std::string("grads"), tl, 1.0));
    }
    std::vector<messages::average_result> out;
    bool ok = true;
    for (auto& h : hs)
      h.receive(
          [&](messages::average_result& r) {
            ok = ok && r.report.outcome == messages::round_outcome::complete
                 && r.report.members.size() == nodes.size();
            out.push_back(std::move(r));
          },
          [&](caf::error&) { ok = false; });
    if (!ok)
      out.clear();
    return out;
  }
};

// Runs up to three rounds until one completes with every member (matchmaking runs on the wall
// clock of a loaded machine); the rounds that complete must be exact either way.
std::vector<messages::average_result> complete_round(avg_nodes& w,
                                                     const std::vector<torch::Tensor>& xs) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto r = w.round(xs);
    if (!r.empty())
      return r;
  }
  return {};
}

} // namespace

TEST_CASE("averagers on three nodes average over their nodes' transport: exact, fp16 within "
          "bounds, links reused") {
  torch::manual_seed(11);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({300001}));
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  {
    avg_nodes w({link_kind::node, link_kind::node, link_kind::node}, kernels::codec_id::none);
    for (int rep = 0; rep < 2; ++rep) { // the second round reuses the links
      auto r = complete_round(w, xs);
      REQUIRE(r.size() == 3);
      for (auto& res : r) {
        CHECK(res.report.plane_links == 2);
        REQUIRE(res.tensors.size() == 1);
        CHECK((res.tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
      }
    }
    // One link per pair of nodes (either side may have opened it), none opened again.
    uint64_t opened = 0;
    for (auto& n : w.nodes)
      opened += n->data_endpoint()->link_layer()->connections_opened();
    CHECK(opened <= 6);
    CHECK(opened >= 3);
  }
  {
    avg_nodes w({link_kind::node, link_kind::node, link_kind::node}, kernels::codec_id::fp16);
    auto r = complete_round(w, xs);
    REQUIRE(r.size() == 3);
    for (auto& res : r) {
      CHECK(res.report.plane_links == 2);
      auto mse = (res.tensors[0].tensor - mean).pow(2).mean().item<double>();
      CHECK(mse <= 1e-5);
    }
  }
}

TEST_CASE("codec auto over same-host links: uncompressed from the first round") {
  torch::manual_seed(12);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({300001}));
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  avg_nodes w({link_kind::node, link_kind::node, link_kind::node}, kernels::codec_id::none,
              nullptr, true);
  // The first round has no links yet, but every member's address names this host: exact. The
  // links it opens are same-host links, so every later round is exact too.
  for (int rep = 0; rep < 3; ++rep) {
    auto r = complete_round(w, xs);
    REQUIRE(r.size() == 3);
    for (auto& res : r) {
      INFO(res.report.detail);
      CHECK(res.report.detail.find("codec auto: none") != std::string::npos);
      CHECK(res.report.detail.find("same-host") != std::string::npos);
      CHECK((res.tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
    }
  }
  for (auto& n : w.nodes)
    CHECK(n->data_endpoint()->link_layer()->local_links_opened()
          == n->data_endpoint()->link_layer()->connections_opened());
}

TEST_CASE("an averager without a transport is served over BASP in a group with transports") {
  torch::manual_seed(12);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({50000}) * (i + 1));
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  avg_nodes w({link_kind::node, link_kind::none, link_kind::node}, kernels::codec_id::none);
  auto r = complete_round(w, xs);
  REQUIRE(r.size() == 3);
  for (size_t i = 0; i < r.size(); ++i) {
    CHECK((r[i].tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
    CHECK(r[i].report.plane_links == (i == 1 ? 0u : 1u));
  }
}

TEST_CASE("a client-mode averager (a transport without listener) sends and receives over the "
          "links it opened") {
  torch::manual_seed(13);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({120000}) - i);
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  avg_nodes w({link_kind::node, link_kind::client, link_kind::node}, kernels::codec_id::none);
  for (int rep = 0; rep < 2; ++rep) {
    CAPTURE(rep);
    auto r = complete_round(w, xs);
    REQUIRE(r.size() == 3);
    for (auto& res : r)
      CHECK((res.tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
    // The client sends over its own links; its peers answer over those links (at the latest
    // from the second round on, when the links exist before the round starts).
    CHECK(r[1].report.plane_links == 2);
    if (rep == 1) {
      CHECK(r[0].report.plane_links == 2);
      CHECK(r[2].report.plane_links == 2);
    }
  }
  CHECK(w.own[0]->connections_opened() == 2);
  CHECK(w.own[0]->port() == 0);
}

TEST_CASE("averagers on three nodes of a closed run with TLS average over sealed links") {
  torch::manual_seed(14);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({100000}) + i);
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  testing::closed_run run;
  avg_nodes w({link_kind::node, link_kind::node, link_kind::node}, kernels::codec_id::none, &run);
  for (auto& n : w.nodes) {
    REQUIRE(n->tls());
    REQUIRE(n->data_endpoint()->link_layer()->sealed());
  }
  for (int rep = 0; rep < 2; ++rep) {
    CAPTURE(rep);
    auto r = complete_round(w, xs);
    REQUIRE(r.size() == 3);
    for (auto& res : r)
      CHECK((res.tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
  }
}

} // namespace starling::test::actors_averager_links_test
