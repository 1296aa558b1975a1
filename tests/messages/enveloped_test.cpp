// Every cross-process message type round-trips through its envelope under CAF's serializers
// (between two systems with their own wire contexts); a refused envelope still arrives, marked,
// so the receiver answers with the reason instead of the requester waiting for its timeout.
#include <doctest/doctest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <sodium.h>
#include <torch/torch.h>

#include "messages/averager.hpp"
#include "messages/chunked.hpp"
#include "messages/dht.hpp"
#include "messages/metrics.hpp"
#include "messages/direct.hpp"
#include "messages/registry.hpp"
#include "messages/swarm.hpp"
#include "messages/types.hpp"
#include "messages/vi.hpp"
#include "messages/wire_context.hpp"

namespace starling::test::messages_enveloped_test {

using namespace starling;
using namespace starling::messages;

namespace {

/// A node's config: starling's types and a wire context of experiment `exp` for peer `id`.
struct wire_config : caf::actor_system_config, wire_context_holder {
  wire_config(const std::string& exp, char id, bool middleman = false) {
    register_types(*this);
    if (middleman) {
      load<caf::io::middleman>();
      set("scheduler.max-threads", 2);
    } else {
      set("scheduler.policy", caf::atom("testing"));
    }
    set("logger.verbosity", caf::atom("quiet"));
    wire_options o;
    o.experiment = exp;
    o.peer_id = std::string(20, id);
    wire = std::make_shared<wire_context>(o);
  }
};

struct two_systems {
  wire_config cfg_a{"exp", 'a'};
  wire_config cfg_b{"exp", 'b'};
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};

  /// Serializes `x` on a and deserializes it on b.
  template <class T>
  T carry(T& x) {
    std::vector<char> buf;
    caf::binary_serializer sink{a, buf};
    auto err = inspect(sink, x);
    REQUIRE_MESSAGE(!err, caf::to_string(err));
    T y;
    caf::binary_deserializer source{b, buf};
    err = inspect(source, y);
    REQUIRE_MESSAGE(!err, caf::to_string(err));
    return y;
  }

  /// Carries `x` and checks that every field arrived (tensors compared by value).
  template <class T>
  void round_trip(T x) {
    auto y = carry(x);
    INFO(caf::deep_to_string(x));
    CHECK(y.wire_error == "");
    CHECK(caf::deep_to_string(y) == caf::deep_to_string(x));
  }
};

tensor_msg tensor(std::vector<int64_t> shape, kernels::codec_id c = kernels::codec_id::none) {
  tensor_msg t;
  t.tensor = torch::randn(shape);
  t.codec = c;
  return t;
}

void same(const tensor_msg& a, const tensor_msg& b) {
  REQUIRE_MESSAGE(b.ok(), b.error);
  REQUIRE(a.tensor.defined() == b.tensor.defined());
  if (a.tensor.defined())
    CHECK(torch::equal(a.tensor, b.tensor));
}

dht_record record(const std::string& key) {
  return dht_record{key, true, "sub", {'v', 'a', 'l'}, 123456789, std::string(64, 's')};
}

member_info member(const std::string& addr) {
  return member_info{addr, 2.5, true};
}

} // namespace

TEST_CASE("every DHT, MASHA, transfer and runtime message type round-trips through its envelope") {
  torch::manual_seed(3);
  two_systems s;
  dht_peer peer{std::string(20, 'p'), "127.0.0.1:4000/dht"};
  s.round_trip(peer);
  s.round_trip(record("k"));
  s.round_trip(dht_request{3, peer, std::string(20, 't'), "key", {record("a"), record("b")}});
  s.round_trip(dht_response{peer, {peer, peer}, {record("c")}, {1, 0}, "rate limit"});
  s.round_trip(dht_put{"key", true, "sub", {'x'}, 99, true});
  s.round_trip(dht_put_result{2, 3, 4});
  s.round_trip(dht_get_result{true, {record("d")}, 5});
  s.round_trip(dht_stats{1, 2, 3, 4, 5, 6, 7, 8, 9});
  vi_vector v{2, 10, 77, {1, 5, 9}, {0.5f, -1.0f, 2.0f}};
  s.round_trip(v);
  s.round_trip(vi_uplink{3, 11, 1, v});
  s.round_trip(vi_downlink{12, 1, true, v});
  s.round_trip(vi_report{40, {1.0, -2.5}, 100, 200, 3});
  s.round_trip(ping_msg{9, "node-a"});
  s.round_trip(metric_event{"trainer.0", "microbatch", {{"loss", 2.5}, {"samples", 16}},
                            {{"peer", "stage.1"}}, 12.25});
  s.round_trip(blob_msg{"schema", {'a', 'b', '\0', 'c'}});
  s.round_trip(direct_announce{std::vector<char>(16, 't'), 4096, 0, {16, 64}, 4});
  s.round_trip(direct_endpoint{"127.0.0.1", 4242});
  s.round_trip(transfer_report{1 << 20, "chunked", "no endpoint"});
  chunk_msg c;
  c.transfer_id = 5;
  c.index = 1;
  c.count = 3;
  c.total_bytes = 12;
  c.bytes = {'0', '1', '2', '3'};
  s.round_trip(c);
  s.round_trip(chunk_ack_msg{5, 2, true, "bad order"});
}

TEST_CASE("a chunk cut from a shared source arrives as its bytes") {
  two_systems s;
  struct source : chunk_source {
    std::string a = "hello ", b = "world";
    source() {
      pieces_.emplace_back(a.data(), a.size());
      pieces_.emplace_back(b.data(), b.size());
    }
    uint64_t size() const override { return 11; }
  };
  chunk_msg c;
  c.source = std::make_shared<source>();
  c.offset = 3;
  c.length = 6;
  c.count = 1;
  c.total_bytes = 11;
  auto y = s.carry(c);
  CHECK(std::string(y.bytes.begin(), y.bytes.end()) == "lo wor");
}

TEST_CASE("every stage and averager message type round-trips with its tensors") {
  torch::manual_seed(4);
  two_systems s;
  stage_forward f{tensor({4, 8}), tensor({4}), 17};
  auto f2 = s.carry(f);
  CHECK(f2.seed == 17);
  same(f.input, f2.input);
  same(f.targets, f2.targets);

  stage_backward b{tensor({4, 8}), tensor({4, 8}, kernels::codec_id::blockwise8), {}, 18};
  b.microbatch_id = 123456;
  b.attempt = 2;
  auto b2 = s.carry(b);
  CHECK(b2.microbatch_id == 123456);
  CHECK(b2.attempt == 2);
  CHECK(b2.seed == 18);
  same(b.input, b2.input);
  CHECK_FALSE(b2.targets.tensor.defined()); // undefined stays undefined
  CHECK(b2.grad_output.codec == kernels::codec_id::blockwise8);
  CHECK((b2.grad_output.tensor - b.grad_output.tensor).abs().max().item<double>() < 0.1);

  stage_backward_reply r{tensor({2, 3}), 1.25};
  auto r2 = s.carry(r);
  CHECK(r2.loss == 1.25);
  same(r.grad_input, r2.grad_input);

  stage_state st{tensor({10}), tensor({20}), {1, 2}, 3, 4};
  st.modeled.size = 5000;
  auto st2 = s.carry(st);
  CHECK(st2.modeled.size == 5000);
  same(st.params, st2.params);
  same(st.moments, st2.moments);
  CHECK(st2.optimizer_steps == std::vector<uint64_t>{1, 2});
  CHECK(st2.steps == 3);
  CHECK(st2.samples == 4);
  CHECK_FALSE(st2.buffers.tensor.defined()); // a model without buffers sends none
  // A model's buffers: float running statistics and integer counters.
  st.buffers.tensor = torch::tensor({0.25f, 4.0f});
  st.int_buffers.tensor = torch::tensor({int64_t{9}, int64_t{11}});
  auto bn = s.carry(st);
  same(st.buffers, bn.buffers);
  CHECK(bn.int_buffers.tensor.equal(st.int_buffers.tensor));

  stage_state_part p;
  p.steps = 1;
  p.samples = 2;
  p.part = 1;
  p.parts = 3;
  p.params_numel = 30;
  p.params_dtype = 6;
  p.moments_numel = 60;
  p.optimizer_steps = {5};
  p.digest = std::string(32, 'd');
  p.params = tensor({10});
  p.moments = tensor({20});
  p.modeled.size = 777;
  p.buffers.tensor = torch::tensor({1.0f, 2.0f, 3.0f});
  p.int_buffers.tensor = torch::tensor({int64_t{4}});
  auto p2 = s.carry(p);
  same(p.buffers, p2.buffers);
  CHECK(p2.int_buffers.tensor.equal(p.int_buffers.tensor));
  CHECK(p2.modeled.size == 777);
  CHECK(caf::deep_to_string(p2) == caf::deep_to_string(p));
  same(p.params, p2.params);

  s.round_trip(avg_join{"grads/0", member("a:1/avg"), 1000});
  s.round_trip(avg_join_reply{avg_join_reply::redirected, "b:1/avg", "busy"});
  s.round_trip(avg_leave{"grads/0", "a:1/avg", "c:1/avg"});
  s.round_trip(avg_group{"grads/0", 77, {member("a"), member("b")}, 1000});
  s.round_trip(avg_ack{77, 1, 2, 3});

  avg_chunk ch;
  ch.group_id = 77;
  ch.kind = avg_chunk::result;
  ch.part = 1;
  ch.from = 2;
  ch.weight = 3.5;
  ch.offset = 100;
  ch.values = tensor({50});
  ch.encoded = {'e', 'n'};
  ch.contributors = {0, 2};
  auto ch2 = s.carry(ch);
  CHECK(caf::deep_to_string(ch2) == caf::deep_to_string(ch));
  same(ch.values, ch2.values);

  tensor_list tl{{tensor({3}), tensor_msg{}, tensor({2, 2})}};
  auto tl2 = s.carry(tl);
  REQUIRE(tl2.tensors.size() == 3);
  same(tl.tensors[0], tl2.tensors[0]);
  CHECK_FALSE(tl2.tensors[1].tensor.defined());
  same(tl.tensors[2], tl2.tensors[2]);

  average_result ar;
  ar.tensors = {tensor({4})};
  ar.report.group_key = "grads/0";
  ar.report.group_id = 9;
  ar.report.members = {member("a"), member("b")};
  ar.report.self = 1;
  part_report pr;
  pr.reducer = 1;
  pr.offset = 2;
  pr.size = 2;
  pr.contributors = {0, 1};
  pr.status = part_status::averaged;
  pr.segments = {part_segment{0, 1, {0}}, part_segment{1, 1, {0, 1}}};
  ar.report.parts = {pr};
  ar.report.outcome = round_outcome::partial;
  ar.report.averaged = 1;
  ar.report.detail = "one part kept";
  ar.report.elapsed_ns = 5;
  ar.report.round_ns = 4;
  ar.report.plane_links = 1;
  ar.report.received = {-1, 2.5};
  auto ar2 = s.carry(ar);
  CHECK(caf::deep_to_string(ar2.report) == caf::deep_to_string(ar.report));
  CHECK(ar2.report.received == (std::vector<double>{-1, 2.5}));
  same(ar.tensors[0], ar2.tensors[0]);

  auto t = tensor({5, 5}, kernels::codec_id::fp16);
  auto t2 = s.carry(t);
  REQUIRE(t2.ok());
  CHECK(t2.codec == kernels::codec_id::fp16);
  tensor_msg undefined;
  CHECK_FALSE(s.carry(undefined).tensor.defined());
}

TEST_CASE("a refused envelope arrives marked: tensors carry the reason, counts go up") {
  wire_config cfg_a{"exp-a", 'a'};
  wire_config cfg_b{"exp-b", 'b'};
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  stage_forward f{tensor({2, 2}), {}, 1};
  std::vector<char> buf;
  caf::binary_serializer sink{a, buf};
  REQUIRE_FALSE(inspect(sink, f));
  stage_forward y;
  caf::binary_deserializer source{b, buf};
  REQUIRE_FALSE(inspect(source, y)); // never a CAF error: CAF would drop the message
  CHECK(y.wire_error.find("envelope refused (experiment)") == 0);
  CHECK_FALSE(y.input.ok());
  CHECK_FALSE(y.input.tensor.defined());
  CHECK(cfg_b.wire->refused(wire_reason::experiment) == 1);
}

TEST_CASE("a state's modeled bytes follow its envelope: counted on the wire, read past when refused") {
  wire_config cfg_a{"exp-a", 'a'};
  wire_config cfg_b{"exp-b", 'b'};
  caf::actor_system a{cfg_a};
  caf::actor_system b{cfg_b};
  auto encode = [&](stage_state st, uint64_t after) {
    std::vector<char> buf;
    caf::binary_serializer sink{a, buf};
    REQUIRE_FALSE(inspect(sink, st));
    REQUIRE_FALSE(sink(after));
    return buf;
  };
  stage_state st{tensor({4}), tensor({8}), {1}, 2, 3};
  auto base = encode(st, 42).size();
  st.modeled.size = 100'000;
  auto buf = encode(st, 42);
  CHECK(buf.size() == base + 100'000); // exactly the modeled bytes on top of the envelope
  // Refused on arrival (another run): marked, its size 0, and what follows still decodes.
  stage_state y;
  uint64_t after = 0;
  caf::binary_deserializer source{b, buf};
  REQUIRE_FALSE(inspect(source, y));
  REQUIRE_FALSE(source(after));
  CHECK(y.wire_error.rfind("envelope refused (experiment)", 0) == 0);
  CHECK(y.modeled.size == 0);
  CHECK(after == 42);
  CHECK(cfg_b.wire->refused(wire_reason::experiment) == 1);
}

TEST_CASE("over BASP, a refused request is answered with its reason instead of timing out") {
  for (auto other_run : {false, true}) {
    CAPTURE(other_run);
    wire_config cfg_a{"exp", 'a', true};
    wire_config cfg_b{other_run ? "exp-b" : "exp", 'b', true};
    caf::actor_system a{cfg_a};
    caf::actor_system b{cfg_b};
    // The receiving side does what the DHT actor does with a refused request.
    auto server = b.spawn([]() -> caf::behavior {
      return {[](dht_request& req) {
        dht_response resp;
        resp.refused = req.wire_error;
        return resp;
      }};
    });
    auto port = b.middleman().publish(server, 0, "127.0.0.1");
    REQUIRE(port);
    auto remote = a.middleman().remote_actor("127.0.0.1", *port);
    REQUIRE(remote);
    caf::scoped_actor self{a};
    dht_request bad;
    bad.kind = 9; // no such RPC
    bool answered = false;
    self->request(*remote, std::chrono::seconds(10), bad)
      .receive(
        [&](const dht_response& resp) {
          answered = true;
          if (other_run) {
            // The answer crossed back from the other run: refused on arrival here too.
            CHECK(resp.wire_error.rfind("envelope refused (experiment)", 0) == 0);
          } else {
            CHECK(resp.wire_error == "");
            CHECK(resp.refused.rfind("envelope refused (out_of_range): dht.request", 0) == 0);
          }
        },
        [&](caf::error& e) { FAIL(a.render(e)); });
    CHECK(answered);
    auto reason = other_run ? wire_reason::experiment : wire_reason::out_of_range;
    CHECK(cfg_b.wire->refused(reason) == 1);
    anon_send_exit(server, caf::exit_reason::user_shutdown);
    b.middleman().unpublish(server, *port);
  }
}

TEST_CASE("signed envelopes under CAF's serializers: the sender's key verifies, a claimed id fails") {
  REQUIRE(sodium_init() >= 0);
  unsigned char pk_a[crypto_sign_PUBLICKEYBYTES], sk_a[crypto_sign_SECRETKEYBYTES];
  unsigned char pk_m[crypto_sign_PUBLICKEYBYTES], sk_m[crypto_sign_SECRETKEYBYTES];
  crypto_sign_keypair(pk_a, sk_a);
  crypto_sign_keypair(pk_m, sk_m);
  auto signing = [](const unsigned char* sk) {
    return [sk](std::string_view digest) {
      std::string sig(crypto_sign_BYTES, '\0');
      crypto_sign_detached(reinterpret_cast<unsigned char*>(sig.data()), nullptr,
                           reinterpret_cast<const unsigned char*>(digest.data()), digest.size(),
                           sk);
      return sig;
    };
  };
  // a signs as itself; m claims a's peer id with its own key; b knows a's key.
  wire_config cfg_a{"exp", 'a'}, cfg_m{"exp", 'a'}, cfg_b{"exp", 'b'};
  auto with = [](wire_config& cfg, auto&& change) {
    auto o = cfg.wire->options();
    change(o);
    cfg.wire = std::make_shared<wire_context>(o);
  };
  with(cfg_a, [&](wire_options& o) { o.sign = signing(sk_a); });
  with(cfg_m, [&](wire_options& o) { o.sign = signing(sk_m); });
  with(cfg_b, [&](wire_options& o) {
    o.require_signature = true;
    o.verify = [&](const std::string& sender, std::string_view digest, std::string_view sig) {
      bool ok = sender == std::string(20, 'a')
                && crypto_sign_verify_detached(
                     reinterpret_cast<const unsigned char*>(sig.data()),
                     reinterpret_cast<const unsigned char*>(digest.data()), digest.size(), pk_a)
                     == 0;
      return ok ? std::string{} : std::string{"not a's signature"};
    };
  });
  caf::actor_system a{cfg_a}, m{cfg_m}, b{cfg_b};
  auto carry = [&](caf::actor_system& from, stage_forward x) {
    std::vector<char> buf;
    caf::binary_serializer sink{from, buf};
    auto err = inspect(sink, x);
    REQUIRE_MESSAGE(!err, caf::to_string(err));
    stage_forward y;
    caf::binary_deserializer source{b, buf};
    err = inspect(source, y);
    REQUIRE_MESSAGE(!err, caf::to_string(err));
    return y;
  };
  torch::manual_seed(5);
  stage_forward f;
  f.seed = 7;
  f.input = tensor({4, 8});
  // The pieces (segment table, segments, the tensor's memory) and the signature after them.
  auto y = carry(a, f);
  CHECK(y.wire_error == "");
  same(f.input, y.input);
  auto forged = carry(m, f);
  CHECK(forged.wire_error.rfind("envelope refused (signature): not a's signature", 0) == 0);
  CHECK_FALSE(forged.input.ok());
  CHECK(cfg_b.wire->refused(wire_reason::signature) == 1);
  CHECK(cfg_b.wire->admitted() == 1);
}

} // namespace starling::test::messages_enveloped_test
