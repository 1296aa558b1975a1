// The averager data plane: its framing (pure), links between planes (chunks delivered with their
// meta, hostile input refused with nothing delivered, lost links reported), and averagers on
// three nodes that average over it, also together with a peer that has no plane.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <netinet/in.h>
#include <optional>
#include <string>
#include <sys/socket.h>
#include <unistd.h>
#include <vector>

#include <caf/all.hpp>
#include <torch/torch.h>

#include "actors/averager/averager.hpp"
#include "actors/averager/data_plane.hpp"
#include "actors/averager/plane_frame.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/averager.hpp"
#include "messages/registry.hpp"
#include "runtime/node/node.hpp"
#include "support/raw_socket.hpp"

using namespace starling;
using namespace starling::actors::averager;
using messages::avg_chunk;
using namespace std::chrono_literals;

namespace {

plane_meta sample_meta() {
  plane_meta m;
  m.group_id = 0x1234567890abcdefULL;
  m.kind = 1;
  m.part = 3;
  m.from = 2;
  m.weight = 0.25;
  m.offset = 1 << 20;
  m.contributors = {0, 2, 5};
  m.error = "";
  return m;
}

// One actor system (no network layer: the planes talk TCP themselves) with a sink per plane.
struct planes {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::vector<std::unique_ptr<caf::scoped_actor>> sinks;
  std::vector<std::shared_ptr<data_plane>> p;

  explicit planes(size_t n, data_plane_options o = {}) {
    messages::register_types(cfg);
    cfg.set("scheduler.max-threads", 2);
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
    for (size_t i = 0; i < n; ++i) {
      sinks.push_back(std::make_unique<caf::scoped_actor>(*sys));
      auto x = data_plane::open(caf::actor_cast<caf::actor>(*sinks.back()), o);
      REQUIRE_MESSAGE(x, (x ? std::string{} : x.error().what));
      p.push_back(*x);
    }
  }

  ~planes() {
    for (auto& x : p)
      x->stop();
    sinks.clear();
  }

  // Links plane `from` to plane `to` (token issued by `to` for `name`).
  void link(size_t from, size_t to, const std::string& name) {
    auto token = p[to]->issue(name);
    REQUIRE(p[from]->connect("peer" + std::to_string(to), p[to]->host(), p[to]->port(), token));
  }

  // The next chunk at sink `i` within `wait`: (peer, chunk).
  std::optional<std::pair<std::string, avg_chunk>> next(size_t i, caf::timespan wait = 10s) {
    std::optional<std::pair<std::string, avg_chunk>> got;
    (*sinks[i])->receive(
        [&](avg_plane_atom, uint64_t tag, std::string& peer, avg_chunk& c) {
          CHECK(tag == p[i]->tag());
          got.emplace(std::move(peer), std::move(c));
        },
        [&](avg_plane_atom, uint64_t, std::string&, std::string& why) {
          FAIL("unexpected lost link: " << why);
        },
        caf::after(wait) >> [] {});
    return got;
  }

  // The next lost-link report at sink `i`: (peer, error).
  std::optional<std::pair<std::string, std::string>> lost(size_t i, caf::timespan wait = 10s) {
    std::optional<std::pair<std::string, std::string>> got;
    (*sinks[i])->receive(
        [&](avg_plane_atom, uint64_t, std::string& peer, std::string& why) {
          got.emplace(std::move(peer), std::move(why));
        },
        caf::after(wait) >> [] {});
    return got;
  }
};

// A hand-written client for hostile input.
using raw_link = starling::testing::raw_socket;

} // namespace

TEST_CASE("plane framing: preamble, frame header and meta round trip, malformed bytes refused") {
  plane_token t{};
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<uint8_t>(i * 17 + 3);
  uint8_t pre[plane_preamble_bytes];
  write_plane_preamble(t, pre);
  auto back = parse_plane_preamble(pre, sizeof pre);
  REQUIRE(back);
  CHECK(*back == t);
  CHECK_FALSE(parse_plane_preamble(pre, sizeof pre - 1));
  pre[0] ^= 1;
  CHECK_FALSE(parse_plane_preamble(pre, sizeof pre));
  pre[0] ^= 1;
  pre[6] = 1; // flags
  CHECK_FALSE(parse_plane_preamble(pre, sizeof pre));

  uint8_t fh[plane_frame_header_bytes];
  write_plane_frame_header({100, 12345}, fh);
  auto h = parse_plane_frame_header(fh, sizeof fh);
  REQUIRE(h);
  CHECK(h->meta_bytes == 100);
  CHECK(h->payload_bytes == 12345);
  write_plane_frame_header({10, 1}, fh); // meta shorter than its fixed part
  CHECK_FALSE(parse_plane_frame_header(fh, sizeof fh));
  write_plane_frame_header({plane_max_meta_bytes + 1, 1}, fh);
  CHECK_FALSE(parse_plane_frame_header(fh, sizeof fh));
  write_plane_frame_header({64, plane_max_payload_bytes + 1}, fh);
  CHECK_FALSE(parse_plane_frame_header(fh, sizeof fh));

  auto m = sample_meta();
  m.error = "reducer failed";
  auto bytes = encode_plane_meta(m);
  REQUIRE(bytes);
  auto d = decode_plane_meta(bytes->data(), bytes->size());
  REQUIRE(d);
  CHECK(d->group_id == m.group_id);
  CHECK(d->kind == 1);
  CHECK(d->part == 3);
  CHECK(d->from == 2);
  CHECK(d->weight == 0.25);
  CHECK(d->offset == m.offset);
  CHECK(d->contributors == m.contributors);
  CHECK(d->error == "reducer failed");
  // Every truncation and one byte too many are refused.
  for (size_t n = 0; n < bytes->size(); ++n)
    CHECK_FALSE(decode_plane_meta(bytes->data(), n));
  auto longer = *bytes;
  longer.push_back(0);
  CHECK_FALSE(decode_plane_meta(longer.data(), longer.size()));
  // Field checks: kind, weight, offset, contributor count.
  auto bad = [&](auto edit) {
    auto x = sample_meta();
    edit(x);
    auto b = encode_plane_meta(x);
    REQUIRE(b);
    return !decode_plane_meta(b->data(), b->size());
  };
  CHECK(bad([](plane_meta& x) { x.kind = 2; }));
  CHECK(bad([](plane_meta& x) { x.weight = -1; }));
  CHECK(bad([](plane_meta& x) { x.weight = std::nan(""); }));
  CHECK(bad([](plane_meta& x) { x.weight = INFINITY; }));
  CHECK(bad([](plane_meta& x) { x.offset = -5; }));
  auto huge = *encode_plane_meta(sample_meta());
  huge[33] = 0xff; // contributor count far beyond the bytes
  CHECK_FALSE(decode_plane_meta(huge.data(), huge.size()));
  plane_meta many;
  many.contributors.assign(plane_max_contributors + 1, 0);
  CHECK_FALSE(encode_plane_meta(many));

  auto hex = token_to_hex(t);
  CHECK(hex.size() == 32);
  auto tb = token_from_hex(hex);
  REQUIRE(tb);
  CHECK(*tb == t);
  CHECK_FALSE(token_from_hex(hex.substr(1)));
  CHECK_FALSE(token_from_hex(std::string(32, 'g')));
  CHECK_FALSE(token_from_hex(std::string(32, 'A')));
}

TEST_CASE("data plane: chunks cross links with their meta, a shared chunk reaches two peers") {
  planes w(3);
  w.link(0, 1, "alice"); // plane 0 sends to plane 1 as "alice"
  w.link(0, 2, "alice");
  CHECK(w.p[0]->linked("peer1"));
  CHECK(w.p[0]->linked("peer2"));
  CHECK_FALSE(w.p[0]->linked("nobody"));
  torch::manual_seed(3);
  auto x = torch::randn({100000});
  // A contribution, fp32 uncompressed, to plane 1.
  plane_meta m;
  m.group_id = 77;
  m.kind = avg_chunk::contribution;
  m.part = 1;
  m.from = 0;
  m.weight = 2.5;
  m.offset = 4096;
  REQUIRE(w.p[0]->send("peer1", std::make_shared<plane_chunk>(m, x.narrow(0, 10, 5000),
                                                              kernels::codec_id::none,
                                                              kernels::codec_params{})));
  auto got = w.next(1);
  REQUIRE(got);
  CHECK(got->first == "alice");
  CHECK(got->second.group_id == 77);
  CHECK(got->second.kind == avg_chunk::contribution);
  CHECK(got->second.weight == 2.5);
  CHECK(got->second.offset == 4096);
  REQUIRE(got->second.values.ok());
  CHECK(torch::equal(got->second.values.tensor, x.narrow(0, 10, 5000)));
  // One fp16 result chunk shared by both links: encoded once, both get the same values.
  plane_meta r;
  r.group_id = 77;
  r.kind = avg_chunk::result;
  r.part = 0;
  r.from = 0;
  r.contributors = {0, 1, 2};
  auto shared = std::make_shared<plane_chunk>(r, x, kernels::codec_id::fp16, kernels::codec_params{});
  REQUIRE(w.p[0]->send("peer1", shared));
  REQUIRE(w.p[0]->send("peer2", shared));
  for (size_t i : {1, 2}) {
    auto g = w.next(i);
    REQUIRE(g);
    CHECK(g->second.kind == avg_chunk::result);
    CHECK(g->second.contributors == std::vector<uint32_t>{0, 1, 2});
    REQUIRE(g->second.values.ok());
    CHECK(g->second.values.codec == kernels::codec_id::fp16);
    auto err = (g->second.values.tensor.to(torch::kFloat32) - x).abs().max().item<double>();
    CHECK(err < 1e-2);
    CHECK(err > 0); // really compressed
  }
  // An error result travels without values.
  plane_meta e = r;
  e.error = "no complete contribution";
  REQUIRE(w.p[0]->send("peer2", std::make_shared<plane_chunk>(e, at::Tensor{},
                                                              kernels::codec_id::none,
                                                              kernels::codec_params{})));
  auto ge = w.next(2);
  REQUIRE(ge);
  CHECK(ge->second.error == "no complete contribution");
  CHECK_FALSE(ge->second.values.tensor.defined());
  CHECK(w.p[1]->delivered() == 2);
  CHECK(w.p[2]->delivered() == 2);
  CHECK(w.p[1]->failed() == 0);
}

TEST_CASE("data plane: unknown tokens, garbage and oversize frames close the link, deliver nothing") {
  data_plane_options o;
  o.max_payload_bytes = 1 << 20;
  o.io_timeout = 2s;
  planes w(1, o);
  auto port = w.p[0]->port();
  {
    raw_link c(port); // a token nobody issued
    plane_token t{};
    uint8_t pre[plane_preamble_bytes];
    write_plane_preamble(t, pre);
    c.write(pre, sizeof pre);
    CHECK(c.closed_by_peer());
  }
  auto token = token_from_hex(w.p[0]->issue("mallory"));
  REQUIRE(token);
  {
    raw_link c(port); // valid token, then garbage instead of a frame header
    uint8_t pre[plane_preamble_bytes];
    write_plane_preamble(*token, pre);
    c.write(pre, sizeof pre);
    std::vector<uint8_t> junk(64, 0xab);
    c.write(junk.data(), junk.size());
    CHECK(c.closed_by_peer());
  }
  {
    raw_link c(port); // the token was one-time: a second link with it is refused
    uint8_t pre[plane_preamble_bytes];
    write_plane_preamble(*token, pre);
    c.write(pre, sizeof pre);
    CHECK(c.closed_by_peer());
  }
  auto t2 = token_from_hex(w.p[0]->issue("mallory"));
  REQUIRE(t2);
  {
    raw_link c(port); // a payload above the plane's limit
    uint8_t pre[plane_preamble_bytes];
    write_plane_preamble(*t2, pre);
    c.write(pre, sizeof pre);
    auto meta = encode_plane_meta(sample_meta());
    REQUIRE(meta);
    uint8_t fh[plane_frame_header_bytes];
    write_plane_frame_header({static_cast<uint32_t>(meta->size()), (1 << 20) + 1}, fh);
    c.write(fh, sizeof fh);
    c.write(meta->data(), meta->size());
    CHECK(c.closed_by_peer());
  }
  auto t3 = token_from_hex(w.p[0]->issue("mallory"));
  REQUIRE(t3);
  {
    raw_link c(port); // a well-framed payload that is not a tensor
    uint8_t pre[plane_preamble_bytes];
    write_plane_preamble(*t3, pre);
    c.write(pre, sizeof pre);
    auto meta = encode_plane_meta(sample_meta());
    REQUIRE(meta);
    std::vector<uint8_t> payload(256, 0x5a);
    uint8_t fh[plane_frame_header_bytes];
    write_plane_frame_header({static_cast<uint32_t>(meta->size()), payload.size()}, fh);
    c.write(fh, sizeof fh);
    c.write(meta->data(), meta->size());
    c.write(payload.data(), payload.size());
    CHECK(c.closed_by_peer());
  }
  CHECK(w.p[0]->delivered() == 0);
  CHECK(w.p[0]->failed() >= 5);
  CHECK_FALSE(w.next(0, caf::timespan{0}));
}

TEST_CASE("data plane: a link reads no further while its sink holds link_buffers chunks") {
  data_plane_options o;
  o.link_buffers = 2;
  planes w(2, o);
  w.link(0, 1, "a");
  auto x = torch::randn({1000});
  for (int i = 0; i < 5; ++i) {
    plane_meta m = sample_meta();
    m.kind = avg_chunk::contribution;
    m.contributors.clear();
    m.offset = i;
    REQUIRE(w.p[0]->send("peer1", std::make_shared<plane_chunk>(m, x, kernels::codec_id::none,
                                                                kernels::codec_params{})));
  }
  auto first = w.next(1);
  auto second = w.next(1);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->second.offset == 0);
  CHECK(second->second.offset == 1);
  // Both slots are held: the third chunk stays in the socket.
  CHECK_FALSE(w.next(1, caf::timespan{std::chrono::milliseconds(300)}));
  CHECK(w.p[1]->delivered() == 2);
  // A copy of the tensor still holds the slot; dropping the last one frees it.
  auto copy = first->second.values.tensor;
  first.reset();
  CHECK_FALSE(w.next(1, caf::timespan{std::chrono::milliseconds(100)}));
  copy.reset();
  auto third = w.next(1);
  REQUIRE(third);
  CHECK(third->second.offset == 2);
  CHECK(torch::equal(third->second.values.tensor, x));
  // Two slots held again (second, third) while the fourth waits: stopping wakes the reader.
  w.p[1]->stop();
}

TEST_CASE("data plane: 300 chunks through one link reuse their buffers (resident memory flat)") {
  auto rss = [] {
    std::ifstream f("/proc/self/statm");
    uint64_t size = 0, resident = 0;
    f >> size >> resident;
    return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  };
  planes w(2);
  w.link(0, 1, "a");
  auto x = torch::randn({1 << 18}); // 1 MiB
  uint64_t early_peak = 0, last = 0;
  for (int i = 0; i < 300; ++i) {
    plane_meta m = sample_meta();
    m.kind = avg_chunk::contribution;
    m.contributors.clear();
    m.offset = i;
    // Uncompressed chunks alias their receive buffer, fp16 ones decode into a pooled one.
    auto codec = i % 2 == 0 ? kernels::codec_id::none : kernels::codec_id::fp16;
    REQUIRE(w.p[0]->send("peer1",
                         std::make_shared<plane_chunk>(m, x, codec, kernels::codec_params{})));
    auto got = w.next(1);
    REQUIRE(got);
    REQUIRE(got->second.offset == i);
    CHECK(got->second.values.tensor.numel() == x.numel());
    got.reset(); // the buffer goes back to the pool
    last = rss();
    if (i < 50)
      early_peak = std::max(early_peak, last);
  }
  MESSAGE("rss over the first 50 chunks (peak): " << early_peak / 1024 << " KiB; after 300: "
                                                   << last / 1024 << " KiB");
  // 300 MiB went through: keeping even one chunk in ten would add 25 MiB.
  CHECK(last <= early_peak + (uint64_t{4} << 20));
}

TEST_CASE("data plane: a link that cannot be opened is reported lost to the sender") {
  planes w(2);
  auto token = w.p[1]->issue("a");
  auto port = w.p[1]->port();
  w.p[1]->stop(); // nothing listens there any more
  REQUIRE(w.p[0]->connect("peer1", "127.0.0.1", port, token));
  auto lost = w.lost(0);
  REQUIRE(lost);
  CHECK(lost->first == "peer1");
  CHECK(lost->second.find("connect") != std::string::npos);
  CHECK_FALSE(w.p[0]->linked("peer1"));
  CHECK_FALSE(w.p[0]->send("peer1", std::make_shared<plane_chunk>(sample_meta(), torch::ones({4}),
                                                                  kernels::codec_id::none,
                                                                  kernels::codec_params{})));
  CHECK_FALSE(w.p[0]->connect("peer1", "127.0.0.1", port, "not-a-token"));
}

namespace {

// Three nodes on loopback, each with a DHT and an averager; `with_plane[i]` gives node i a plane.
struct avg_nodes {
  std::vector<std::unique_ptr<runtime::node>> nodes;
  std::vector<caf::actor> avgs;

  avg_nodes(std::vector<bool> with_plane, kernels::codec_id codec) {
    runtime::caf_options co;
    co.heartbeat_interval = 100ms;
    co.connection_timeout = 2s;
    runtime::node_options no;
    no.listen = "127.0.0.1:0";
    std::string boot;
    for (size_t i = 0; i < with_plane.size(); ++i) {
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
      a.target_group_size = static_cast<uint32_t>(with_plane.size());
      a.matchmaking_window = 1500ms;
      a.poll_interval = 50ms;
      a.round_timeout = 20s;
      a.chunk_bytes = 64 << 10; // several chunks per part
      a.codec = codec;
      if (with_plane[i])
        a.data_host = "127.0.0.1";
      auto avg = spawn_averager(node.system(), dht, node.resolver(), a);
      node.register_actor("averager", avg);
      avgs.push_back(avg);
      nodes.push_back(std::move(*nd));
    }
  }

  ~avg_nodes() {
    for (auto& n : nodes)
      n->shutdown();
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

TEST_CASE("averagers on three nodes average over the data plane: exact, fp16 within bounds") {
  torch::manual_seed(11);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({300001}));
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  {
    avg_nodes w({true, true, true}, kernels::codec_id::none);
    for (int rep = 0; rep < 2; ++rep) { // the second round reuses the links
      auto r = complete_round(w, xs);
      REQUIRE(r.size() == 3);
      for (auto& res : r) {
        CHECK(res.report.plane_links == 2);
        REQUIRE(res.tensors.size() == 1);
        CHECK((res.tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
      }
    }
  }
  {
    avg_nodes w({true, true, true}, kernels::codec_id::fp16);
    auto r = complete_round(w, xs);
    REQUIRE(r.size() == 3);
    for (auto& res : r) {
      CHECK(res.report.plane_links == 2);
      auto mse = (res.tensors[0].tensor - mean).pow(2).mean().item<double>();
      CHECK(mse <= 1e-5);
    }
  }
}

TEST_CASE("an averager without a data plane is served over BASP in a group with planes") {
  torch::manual_seed(12);
  std::vector<torch::Tensor> xs;
  for (int i = 0; i < 3; ++i)
    xs.push_back(torch::randn({50000}) * (i + 1));
  auto mean = (xs[0] + xs[1] + xs[2]) / 3;
  avg_nodes w({true, false, true}, kernels::codec_id::none);
  auto r = complete_round(w, xs);
  REQUIRE(r.size() == 3);
  for (size_t i = 0; i < r.size(); ++i) {
    // Who is who: members are sorted by address, so find the plane-less node's own report.
    CHECK((r[i].tensors[0].tensor - mean).abs().max().item<double>() < 1e-6);
    CHECK(r[i].report.plane_links == (i == 1 ? 0u : 1u));
  }
}
