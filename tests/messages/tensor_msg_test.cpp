// The tensor message: by reference inside a process, encoded by CAF serialization, delivered
// between two actor systems over loopback, and rejected (as an error value) when malformed.
#include <doctest/doctest.h>

#include <cstring>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <capnp/message.h>
#include <torch/torch.h>

#include "messages/registry.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/envelope.hpp"
#include "messages/swarm.hpp"
#include "messages/wire.hpp"

namespace starling::test::messages_tensor_msg_test {

using namespace starling;
using namespace starling::messages;
using kernels::codec_id;

namespace {

const codec_id all_codecs[] = {codec_id::none,       codec_id::fp16,      codec_id::bf16,
                               codec_id::uniform8,   codec_id::blockwise8, codec_id::quantile8,
                               codec_id::topk,       codec_id::randk};

// The largest squared error per element each codec may add on randn input (see codec tests);
// for the sparse codecs the decoded tensor is compared with a local decode instead.
double mse_bound(codec_id c) {
  switch (c) {
    case codec_id::none:
      return 0.0;
    case codec_id::fp16:
      return 5e-8;
    case codec_id::bf16:
      return 2e-5;
    default:
      return 8e-4;
  }
}

double mse(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).pow(2).mean().item<double>();
}

// Expected decode for the sparse codecs: the local encode/decode of the same tensor.
at::Tensor local_round_trip(const at::Tensor& t, codec_id c, const kernels::codec_params& p) {
  auto e = kernels::encode(t, c, p);
  REQUIRE(e.ok());
  auto d = kernels::decode(*e);
  REQUIRE(d.ok());
  return *d;
}

void check_arrived(const tensor_msg& sent, const tensor_msg& got) {
  REQUIRE_MESSAGE(got.ok(), got.error);
  REQUIRE(got.tensor.defined());
  CHECK((got.tensor.scalar_type() == sent.tensor.scalar_type()));
  CHECK(got.tensor.sizes() == sent.tensor.sizes());
  if (sent.codec == codec_id::topk || sent.codec == codec_id::randk)
    CHECK(torch::equal(got.tensor, local_round_trip(sent.tensor, sent.codec, sent.params)));
  else
    CHECK(mse(got.tensor, sent.tensor) <= mse_bound(sent.codec));
}

std::vector<char> serialize(tensor_msg& x) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  auto err = inspect(sink, x);
  REQUIRE_MESSAGE(!err, caf::to_string(err));
  return buf;
}

tensor_msg deserialize(const std::vector<char>& buf) {
  tensor_msg out;
  caf::binary_deserializer source{nullptr, buf};
  auto err = inspect(source, out);
  REQUIRE_MESSAGE(!err, caf::to_string(err));
  return out;
}

// A Tensor flat array built by hand, to be corrupted by the tests.
std::vector<char> tensor_bytes(const kernels::tensor_header& h, uint64_t payload_size) {
  capnp::MallocMessageBuilder msg;
  auto b = msg.initRoot<wire::Tensor>();
  auto hh = h;
  write_tensor(b, hh);
  if (payload_size != kernels::payload_bytes(*kernels::checked_numel(h.shape), h.codec, h.params))
    b.initChunks(1).init(0, static_cast<unsigned>(payload_size));
  std::vector<char> out;
  write_flat(msg, out);
  return out;
}

kernels::tensor_header header_of(std::vector<int64_t> shape, codec_id c) {
  kernels::tensor_header h;
  h.shape = std::move(shape);
  h.codec = c;
  h.params = *kernels::resolve_params(*kernels::checked_numel(h.shape), c, {});
  return h;
}

struct two_nodes {
  caf::actor_system_config cfg_a;
  caf::actor_system_config cfg_b;
  std::unique_ptr<caf::actor_system> a;
  std::unique_ptr<caf::actor_system> b;

  two_nodes() {
    for (auto* cfg : {&cfg_a, &cfg_b}) {
      cfg->load<caf::io::middleman>();
      register_types(*cfg);
      cfg->set("scheduler.max-threads", 2);
      cfg->set("logger.verbosity", caf::atom("quiet"));
    }
    a = std::make_unique<caf::actor_system>(cfg_a);
    b = std::make_unique<caf::actor_system>(cfg_b);
  }
};

} // namespace

TEST_CASE("tensor_msg round-trips through binary_serializer for every codec") {
  torch::manual_seed(11);
  for (auto c : all_codecs) {
    CAPTURE(kernels::to_string(c));
    tensor_msg x;
    x.tensor = torch::randn({32, 48});
    x.codec = c;
    x.params.ratio = 0.25;
    x.params.seed = 5;
    auto y = deserialize(serialize(x));
    check_arrived(x, y);
    CHECK(y.codec == c);
  }
  // Other dtypes come back as themselves.
  tensor_msg h;
  h.tensor = torch::randn({5, 5}).to(torch::kFloat16);
  h.codec = codec_id::fp16;
  CHECK(torch::equal(deserialize(serialize(h)).tensor, h.tensor));
}

TEST_CASE("a tensor larger than one chunk travels in several chunks") {
  torch::manual_seed(12);
  tensor_msg x;
  x.tensor = torch::randn({3000});
  x.params.chunk_bytes = 1000;
  auto buf = serialize(x);
  auto y = deserialize(buf);
  REQUIRE(y.ok());
  CHECK(torch::equal(y.tensor, x.tensor));
}

TEST_CASE("a local send moves the tensor by reference and never encodes it") {
  caf::actor_system_config cfg;
  register_types(cfg);
  caf::actor_system sys{cfg};
  auto receiver = sys.spawn([]() -> caf::behavior {
    return {[](const tensor_msg& m) {
      return std::make_tuple(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(m.tensor.data_ptr())),
                             m.tensor.sum().item<double>());
    }};
  });
  tensor_msg x;
  x.tensor = torch::randn({64, 64});
  // A lossy codec: an encode/decode would change both the storage and the values.
  x.codec = codec_id::uniform8;
  auto expected_ptr = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(x.tensor.data_ptr()));
  auto expected_sum = x.tensor.sum().item<double>();
  caf::scoped_actor self{sys};
  bool replied = false;
  self->request(receiver, caf::infinite, x)
    .receive(
      [&](uint64_t ptr, double sum) {
        replied = true;
        CHECK(ptr == expected_ptr);
        CHECK(sum == expected_sum);
      },
      [&](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(replied);
  self->send_exit(receiver, caf::exit_reason::user_shutdown);
}

TEST_CASE("a tensor of each codec arrives between two actor systems over loopback") {
  two_nodes nodes;
  // Node b echoes what it decoded, losslessly, so node a sees exactly what arrived at b.
  auto echo = nodes.b->spawn([]() -> caf::behavior {
    return {[](tensor_msg m) {
      m.codec = codec_id::none;
      return m;
    }};
  });
  auto port = nodes.b->middleman().publish(echo, 0, "127.0.0.1");
  REQUIRE_MESSAGE(port, nodes.b->render(port.error()));
  auto remote = nodes.a->middleman().remote_actor("127.0.0.1", *port);
  REQUIRE_MESSAGE(remote, nodes.a->render(remote.error()));
  torch::manual_seed(13);
  caf::scoped_actor self{*nodes.a};
  for (auto c : all_codecs) {
    CAPTURE(kernels::to_string(c));
    tensor_msg x;
    x.tensor = torch::randn({128, 128, 4});
    x.codec = c;
    x.params.ratio = 0.1;
    x.params.seed = 99;
    bool replied = false;
    self->request(*remote, std::chrono::seconds(30), x)
      .receive(
        [&](tensor_msg& y) {
          replied = true;
          check_arrived(x, y);
        },
        [&](caf::error& e) { FAIL(nodes.a->render(e)); });
    CHECK(replied);
  }
  anon_send_exit(echo, caf::exit_reason::user_shutdown);
  nodes.b->middleman().unpublish(echo, *port);
}

TEST_CASE("a malformed tensor arrives as an error value, not a crash") {
  tensor_msg x;
  x.tensor = torch::randn({100});
  x.codec = codec_id::blockwise8;
  auto buf = serialize(x);
  // The CAF framing (a length-prefixed byte vector) stays valid; the Cap'n Proto inside is cut.
  tensor_msg inner;
  auto bytes = std::vector<char>{};
  caf::binary_deserializer src{nullptr, buf};
  REQUIRE(!src(bytes));
  bytes.resize(bytes.size() - 64);
  std::vector<char> rebuilt;
  caf::binary_serializer sink{nullptr, rebuilt};
  REQUIRE(!sink(bytes));
  auto y = deserialize(rebuilt);
  CHECK_FALSE(y.ok());
  CHECK_FALSE(y.tensor.defined());
}

TEST_CASE("hardened decoding: every malformed class is an error") {
  tensor_msg out;
  auto good_h = header_of({10, 10}, codec_id::none);
  auto good = tensor_bytes(good_h, 400);
  REQUIRE(load_tensor(good, out).ok());

  SUBCASE("truncated") {
    for (size_t cut : {size_t{8}, size_t{64}, good.size() - 8}) {
      std::vector<char> t(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(cut));
      CHECK_FALSE(load_tensor(t, out).ok());
    }
    std::vector<char> odd(good.begin(), good.end() - 3);
    CHECK_FALSE(load_tensor(odd, out).ok());
    CHECK_FALSE(load_tensor({}, out).ok());
  }
  SUBCASE("oversized payload") {
    CHECK_FALSE(load_tensor(tensor_bytes(good_h, 408), out).ok());
    auto e = tensor_bytes(good_h, 400);
    e.resize(e.size() + 64, 0); // trailing words after the message
    CHECK_FALSE(load_tensor(e, out).ok());
  }
  SUBCASE("wrong shape: shape x dtype != bytes") {
    CHECK_FALSE(load_tensor(tensor_bytes(good_h, 396), out).ok());
    auto h = header_of({10, 10}, codec_id::none);
    capnp::MallocMessageBuilder msg;
    auto b = msg.initRoot<wire::Tensor>();
    write_tensor(b, h);
    b.initShape(2).set(0, 11);
    std::vector<char> bytes;
    write_flat(msg, bytes);
    CHECK_FALSE(load_tensor(bytes, out).ok());
  }
  SUBCASE("negative or huge shape") {
    for (auto shape : {std::vector<int64_t>{-1, 4}, std::vector<int64_t>{1 << 30, 1 << 30, 4}}) {
      capnp::MallocMessageBuilder msg;
      auto b = msg.initRoot<wire::Tensor>();
      write_tensor(b, good_h);
      auto s = b.initShape(static_cast<unsigned>(shape.size()));
      for (unsigned i = 0; i < shape.size(); ++i)
        s.set(i, shape[i]);
      std::vector<char> bytes;
      write_flat(msg, bytes);
      CHECK_FALSE(load_tensor(bytes, out).ok());
    }
  }
  SUBCASE("unknown codec and unknown dtype") {
    for (int field : {0, 1}) {
      capnp::MallocMessageBuilder msg;
      auto b = msg.initRoot<wire::Tensor>();
      write_tensor(b, good_h);
      if (field == 0)
        b.setCodec(42);
      else
        b.setDtype(200);
      std::vector<char> bytes;
      write_flat(msg, bytes);
      auto st = load_tensor(bytes, out);
      CHECK_FALSE(st.ok());
      CHECK(st.what().find(field == 0 ? "codec" : "dtype") != std::string::npos);
    }
  }
  SUBCASE("mis-typed: another struct where a Tensor is expected") {
    capnp::MallocMessageBuilder msg;
    auto env = msg.initRoot<wire::Envelope>();
    env.setExperimentId("a text where the shape list should be");
    env.setSenderPeerId(kj::heapArray<kj::byte>(24).asPtr());
    std::vector<char> bytes;
    write_flat(msg, bytes);
    CHECK_FALSE(load_tensor(bytes, out).ok());
  }
  SUBCASE("bad codec invariants") {
    auto h = header_of({1000}, codec_id::topk); // k = 10, 32-bit indices
    capnp::MallocMessageBuilder msg;
    auto chunks = write_tensor(msg.initRoot<wire::Tensor>(), h);
    REQUIRE(chunks.size() == 1);
    std::memset(chunks[0].begin(), 0, chunks[0].size()); // indices 0,0,...: not increasing
    std::vector<char> bytes;
    write_flat(msg, bytes);
    CHECK_FALSE(load_tensor(bytes, out).ok());

    auto q = header_of({10}, codec_id::quantile8);
    capnp::MallocMessageBuilder msg2;
    auto c2 = write_tensor(msg2.initRoot<wire::Tensor>(), q);
    float nan = std::numeric_limits<float>::quiet_NaN();
    std::memcpy(c2[0].begin() + 40, &nan, 4);
    write_flat(msg2, bytes);
    CHECK_FALSE(load_tensor(bytes, out).ok());
  }
  SUBCASE("garbage bytes") {
    std::mt19937_64 rng{1234};
    for (int i = 0; i < 200; ++i) {
      std::vector<char> g(8 * (1 + rng() % 64));
      for (auto& ch : g)
        ch = static_cast<char>(rng());
      auto st = load_tensor(g, out);
      CHECK((st.ok() ? out.tensor.defined() : !st.what().empty()));
    }
  }
  SUBCASE("non-aligned input is copied and decodes") {
    std::vector<char> shifted(good.size() + 1);
    std::memcpy(shifted.data() + 1, good.data(), good.size());
    tensor_msg o2;
    REQUIRE(read_flat(shifted.data() + 1, good.size(), [&](capnp::MessageReader& r) -> status {
              tensor_view v;
              return read_tensor(r.getRoot<wire::Tensor>(), v);
            }).ok());
  }
}

TEST_CASE("an envelope carries a tensor or a ping and checks its version") {
  capnp::MallocMessageBuilder msg;
  auto env = msg.initRoot<wire::Envelope>();
  env.setProtocolVersion(protocol_version);
  env.setExperimentId("exp-1");
  auto h = header_of({4, 4}, codec_id::fp16);
  auto chunks = write_tensor(env.getPayload().initTensor(), h);
  std::memset(chunks[0].begin(), 0, chunks[0].size());
  std::vector<char> bytes;
  write_flat(msg, bytes);
  tensor_view v;
  auto is_tensor = [](const payload_reader& p) { return p.get().isTensor(); };
  auto read = [&](const payload_reader& p) { return read_tensor(p.get().getTensor(), v); };
  CHECK_FALSE(decode_envelope(bytes.data(), bytes.size(), nullptr, "tensor", is_tensor, read));
  CHECK(v.size == 32);
  CHECK(v.header.shape == std::vector<int64_t>{4, 4});

  env.getPayload().initPing().setSeq(77);
  write_flat(msg, bytes);
  auto wrong = decode_envelope(bytes.data(), bytes.size(), nullptr, "tensor", is_tensor, read);
  REQUIRE(wrong);
  CHECK(wrong->why == wire_reason::wrong_payload);

  env.setProtocolVersion(protocol_version + 1);
  write_flat(msg, bytes);
  auto old = decode_envelope(bytes.data(), bytes.size(), nullptr, "ping",
                             [](const payload_reader& p) { return p.get().isPing(); },
                             [](const payload_reader&) { return status{}; });
  REQUIRE(old);
  CHECK(old->why == wire_reason::version);
}

TEST_CASE("a state from a peer of the previous build (protocol 4, no lamb8 codes) is refused in "
          "one line naming both versions") {
  static_assert(protocol_version == 5, "version 5: a state may carry lamb8's codes and scales");
  capnp::MallocMessageBuilder msg;
  auto env = msg.initRoot<wire::Envelope>();
  env.setProtocolVersion(4);
  env.setExperimentId("exp-1");
  env.getPayload().initStage().initState().setSteps(5);
  std::vector<char> bytes;
  write_flat(msg, bytes);
  stage_state got;
  auto refused = decode_envelope(
    bytes.data(), bytes.size(), nullptr, "stage.state",
    [](const payload_reader& p) { return wire_codec<stage_state>::matches(p); },
    [&](const payload_reader& p) { return wire_codec<stage_state>::read(p, got); });
  REQUIRE(refused);
  CHECK(refused->why == wire_reason::version);
  CHECK(refused->line()
        == "envelope refused (version): protocol version 4 (another starling build), this node "
           "speaks 5");
}

} // namespace starling::test::messages_tensor_msg_test
