// What admission and encryption cost between two nodes on loopback, side by side in one run:
// an open run (hello, no tokens), a closed run without TLS with unsigned envelopes (tokens checked
// at the hello, every envelope's sender checked), the same with signed envelopes (the default:
// each signed by its sender's node key and verified on arrival) and a closed run with TLS
// (caf_openssl, the run's CA) and signed envelopes. Per mode: the
// join (TCP, TLS, the hello both ways), the ping round trip, a 16 MB blob over BASP, and, while an
// outsider floods the gate with bad hellos, the refusals per second and the honest pings' round
// trip. Usage: bench_gate [PINGS] [BLOB_MB] [FLOOD_SECONDS]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "messages/atoms.hpp"
#include "messages/types.hpp"
#include "runtime/cli/cli.hpp"
#include "runtime/node/gate.hpp"
#include "runtime/node/node.hpp"

using namespace starling;
using namespace starling::runtime;
using namespace std::chrono_literals;
namespace auth = starling::actors::auth;
using clk = std::chrono::steady_clock;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

[[noreturn]] void die(const std::string& what) {
  fmt::print(stderr, "bench_gate: {}\n", what);
  std::exit(1);
}

/// A scratch folder with an authority; node settings per mode.
struct setup {
  std::string dir;
  std::optional<auth::authority> authority;
  int next = 0;

  setup() {
    char tmpl[] = "/tmp/starling-bench-gate-XXXXXX";
    if (!::mkdtemp(tmpl))
      die("no temporary folder");
    dir = tmpl;
    auth::authority_init_options o;
    o.dir = dir + "/authority";
    o.experiment = "bench-gate";
    o.now_ns = now_ns() - 60'000'000'000;
    auto a = auth::init_authority(o);
    if (!a)
      die(a.error().what);
    authority = std::move(*a);
  }
  ~setup() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  /// Closed runs' nodes sign their envelopes.
  bool sign = true;
  /// Settings of a fresh node: `closed` with a token, `tls` encrypted.
  node_options options(bool closed, bool tls) {
    auto name = fmt::format("n{}", next++);
    node_options no;
    no.experiment = "bench-gate";
    no.key_file = dir + "/" + name + "/node.key";
    if (!closed)
      return no;
    auto key = auth::load_or_create_key(no.key_file, auth::key_role::node);
    if (!key)
      die(key.error().what);
    auto t = auth::issue_token(*authority, {key->key.public_key(), {"any"}, now_ns() - 1'000'000'000,
                                            int64_t{3600} * 1'000'000'000, {}});
    if (!t)
      die(t.error().what);
    no.token = dir + "/" + name + ".token";
    if (auto st = auth::write_file_atomically(no.token, t->file_text, 0600); !st)
      die(st.what());
    no.authority = authority->dir + "/authority.pub";
    no.tls = tls;
    no.sign_envelopes = sign;
    return no;
  }
};

std::unique_ptr<node> start(setup& s, bool closed, bool tls, const std::string& name) {
  caf_options c;
  auto n = node::start(c, s.options(closed, tls), name);
  if (!n)
    die(n.error().what);
  return std::move(*n);
}

/// Mean ping round trip (ms) of `count` pings from `from` to `peer`.
double ping_ms(node& from, const caf::actor& peer, int count) {
  caf::scoped_actor self{from.system()};
  auto t = clk::now();
  for (int i = 0; i < count; ++i)
    self->request(peer, 5s, messages::ping_msg{static_cast<uint64_t>(i), "b"})
      .receive([](const messages::ping_msg& m) {
        if (!m.wire_error.empty())
          die("ping refused: " + m.wire_error);
      },
               [&](caf::error& e) { die("ping failed: " + from.system().render(e)); });
  return seconds_since(t) * 1000.0 / count;
}

/// An actor that answers a blob with an empty blob.
caf::behavior blob_sink(caf::event_based_actor*) {
  return {[](const messages::blob_msg& m) {
    if (!m.wire_error.empty())
      die("blob refused: " + m.wire_error);
    return messages::blob_msg{"ok", {}, {}};
  }};
}

struct row {
  std::string mode;
  double join_ms = 0;
  double ping_ms = 0;
  double blob_mb_s = 0;
  double refusals_per_s = 0;
  double flood_ping_ms = 0;
};

row measure(setup& s, const std::string& mode, bool closed, bool tls, int pings, int blob_mb,
            double flood_s) {
  row r;
  r.mode = mode;
  auto a = start(s, closed, tls, "a");
  a->register_actor("ping", a->system().spawn(ping_responder, std::string{"a"}));
  a->register_actor("blob", a->system().spawn(blob_sink));
  // The join of a fresh node: connection, TLS handshake, the hello both ways.
  const int joins = 5;
  std::vector<std::unique_ptr<node>> others;
  for (int i = 0; i < joins; ++i) {
    others.push_back(start(s, closed, tls, "j"));
    auto t = clk::now();
    if (auto d = others.back()->join(fmt::format("127.0.0.1:{}", a->port()), {}); !d)
      die(d.error().what);
    r.join_ms += seconds_since(t) * 1000.0 / joins;
  }
  auto& b = *others.front();
  caf::actor ping, blob;
  {
    caf::scoped_actor self{b.system()};
    self->request(b.resolver(), 10s, resolve_atom::value,
                  fmt::format("127.0.0.1:{}/ping", a->port()))
      .receive([&](const caf::actor& h) { ping = h; },
               [&](caf::error& e) { die(b.system().render(e)); });
    self->request(b.resolver(), 10s, resolve_atom::value,
                  fmt::format("127.0.0.1:{}/blob", a->port()))
      .receive([&](const caf::actor& h) { blob = h; },
               [&](caf::error& e) { die(b.system().render(e)); });
  }
  ping_ms(b, ping, 50); // warm-up
  r.ping_ms = ping_ms(b, ping, pings);
  {
    caf::scoped_actor self{b.system()};
    messages::blob_msg m{"x", std::vector<char>(static_cast<size_t>(blob_mb) << 20, 'x'), {}};
    const int reps = 5;
    auto t = clk::now();
    for (int i = 0; i < reps; ++i)
      self->request(blob, 60s, m).receive([](const messages::blob_msg&) {},
                                          [&](caf::error& e) { die(b.system().render(e)); });
    r.blob_mb_s = blob_mb * reps / seconds_since(t);
  }
  // The flood: an outsider opens sessions at the gate and presents garbage as fast as it can.
  if (!tls) {
    std::atomic<bool> stop{false};
    auto before = a->gate()->admission().refusals().total();
    std::thread flood([&] {
      caf::actor_system_config cfg;
      configure_system(cfg, caf_options{}, true);
      caf::actor_system sys{cfg};
      auto d = sys.middleman().remote_actor("127.0.0.1", a->port());
      if (!d)
        die("the outsider cannot connect");
      caf::scoped_actor self{sys};
      caf::actor gate;
      self->request(caf::actor_cast<caf::actor>(*d), 5s, get_atom::value, std::string{gate_name})
        .receive([&](const caf::actor& g) { gate = g; }, [&](caf::error&) { die("no gate"); });
      std::string id(20, 'o'), challenge(32, 'c'), garbage(200, '\x17');
      while (!stop) {
        uint64_t session = 0;
        self->request(gate, 5s, hello_atom::value, id, challenge)
          .receive([&](uint64_t s, const std::string&, const std::string&) { session = s; },
                   [&](caf::error&) {});
        self->request(gate, 5s, hello_atom::value, session, garbage, caf::actor{})
          .receive([](const std::string&) {}, [&](caf::error&) {});
      }
    });
    auto t = clk::now();
    int n = 0;
    double total = 0;
    while (seconds_since(t) < flood_s) {
      total += ping_ms(b, ping, 10);
      ++n;
    }
    auto elapsed = seconds_since(t);
    stop = true;
    flood.join();
    r.flood_ping_ms = total / n;
    r.refusals_per_s = (a->gate()->admission().refusals().total() - before) / elapsed;
  }
  others.clear();
  a->shutdown();
  return r;
}

} // namespace

int main(int argc, char** argv) {
  int pings = argc > 1 ? std::atoi(argv[1]) : 2000;
  int blob_mb = argc > 2 ? std::atoi(argv[2]) : 16;
  double flood_s = argc > 3 ? std::atof(argv[3]) : 3.0;
  if (pings < 1 || blob_mb < 1 || flood_s <= 0)
    die("usage: bench_gate [PINGS >= 1] [BLOB_MB >= 1] [FLOOD_SECONDS > 0]");
  setup s;
  std::vector<row> rows;
  rows.push_back(measure(s, "open run (hello)", false, false, pings, blob_mb, flood_s));
  s.sign = false;
  rows.push_back(
    measure(s, "closed, tokens, no TLS, unsigned", true, false, pings, blob_mb, flood_s));
  s.sign = true;
  rows.push_back(measure(s, "closed, tokens, no TLS, signed", true, false, pings, blob_mb, flood_s));
  rows.push_back(measure(s, "closed, tokens, TLS, signed", true, true, pings, blob_mb, flood_s));
  fmt::print("| mode | join ms | ping ms | {} MB blob MB/s | bad hellos refused/s | ping ms under "
             "the flood |\n|---|---|---|---|---|---|\n",
             blob_mb);
  for (auto& r : rows)
    fmt::print("| {} | {:.2f} | {:.3f} | {:.0f} | {} | {} |\n", r.mode, r.join_ms, r.ping_ms,
               r.blob_mb_s,
               r.refusals_per_s > 0 ? fmt::format("{:.0f}", r.refusals_per_s) : "n/a (TLS)",
               r.flood_ping_ms > 0 ? fmt::format("{:.3f}", r.flood_ping_ms) : "n/a");
  return 0;
}
