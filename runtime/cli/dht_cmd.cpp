#include "runtime/cli/dht_cmd.hpp"

#include "runtime/log/log.hpp"

#include <csignal>

#include "runtime/cli/signals.hpp"
#include <cstdio>
#include <pthread.h>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/dht/client.hpp"
#include "actors/dht/dht.hpp"
#include "messages/atoms.hpp"
#include "messages/dht.hpp"
#include "runtime/config/config.hpp"
#include "runtime/node/node.hpp"

namespace starling::runtime {

namespace {

int dht_die(const std::string& what) {
  return print_error(what);
}

/// Starts a client-only node and resolves the DHT actor of the node at `endpoint`.
result<std::pair<std::unique_ptr<node>, caf::actor>> connect_dht(const std::string& endpoint) {
  if (auto ep = parse_endpoint(endpoint); !ep || ep->second == 0)
    return fail(
        fmt::format("--node: expected HOST:PORT with a port in [1, 65535], got \"{}\"", endpoint));
  caf_options caf_opts;
  node_options node_opts;
  auto n = node::start(caf_opts, node_opts, "dht-client");
  if (!n)
    return n.error();
  caf::actor target;
  std::string why;
  {
    caf::scoped_actor self{(*n)->system()};
    self->request((*n)->resolver(), caf::timespan{caf_opts.connection_timeout}, resolve_atom::value,
                  endpoint + "/dht")
        .receive([&](const caf::actor& h) { target = h; },
                 [&](caf::error& e) { why = (*n)->system().render(e); });
  }
  if (!target)
    return fail(fmt::format("cannot reach the DHT node at {}: {}", endpoint, why));
  return std::make_pair(std::move(*n), target);
}

} // namespace

bool parse_ttl(const std::string& text, std::chrono::nanoseconds& out) {
  size_t pos = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9')
    ++pos;
  if (pos == 0 || pos > 12)
    return false;
  auto n = std::stoll(text.substr(0, pos));
  auto unit = text.substr(pos);
  using std::chrono::hours, std::chrono::milliseconds, std::chrono::minutes, std::chrono::seconds;
  if (unit.empty() || unit == "s")
    out = seconds(n);
  else if (unit == "ms")
    out = milliseconds(n);
  else if (unit == "m")
    out = minutes(n);
  else if (unit == "h")
    out = hours(n);
  else
    return false;
  return out.count() > 0;
}

int cmd_dht_serve(const std::string& listen, const std::string& join) {
  caf_options caf_opts;
  node_options node_opts;
  if (auto ep = parse_endpoint(listen); !ep)
    return dht_die(fmt::format("--listen: {}", ep.error().what));
  node_opts.listen = listen;
  if (!join.empty()) {
    auto ep = parse_endpoint(join);
    if (!ep || ep->second == 0)
      return dht_die(
          fmt::format("--join: expected HOST:PORT with a port in [1, 65535], got \"{}\"", join));
  }
  install_shutdown_signals();
  auto n = node::start(caf_opts, node_opts, "dht");
  if (!n)
    return dht_die(n.error().what);
  auto& nd = **n;
  actors::dht::dht_options opts;
  opts.address = nd.endpoint() + "/dht";
  opts.id = actors::dht::identity::generate();
  auto dht = actors::dht::spawn_dht(nd.system(), nd.resolver(), opts);
  nd.register_actor("dht", dht);
  fmt::print("dht listening on {} id {}\n", nd.endpoint(), actors::dht::id_of(opts.id).to_hex());
  std::fflush(stdout);
  if (!join.empty()) {
    caf::scoped_actor self{nd.system()};
    self->request(dht, std::chrono::seconds(30), join_atom::value, join + "/dht")
        .receive(
            [&](uint32_t peers) { fmt::print("dht joined {}: {} peers known\n", join, peers); },
            [&](caf::error& e) {
              fmt::print("dht join {} failed: {}\n", join, nd.system().render(e));
            });
    std::fflush(stdout);
  }
  int sig = wait_for_shutdown_signal();
  fmt::print("dht shutting down ({})\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  nd.shutdown();
  return 0;
}

int cmd_dht_get(const std::string& endpoint, const std::string& key) {
  auto c = connect_dht(endpoint);
  if (!c)
    return dht_die(c.error().what);
  auto& [nd, dht] = *c;
  int code = 2;
  {
    caf::scoped_actor self{nd->system()};
    self->request(dht, std::chrono::seconds(30), get_atom::value, key)
        .receive(
            [&](const messages::dht_get_result& r) {
              if (!r.wire_error.empty()) {
                fmt::print(stderr, "starling: error: get: the answer was refused: {}\n",
                           r.wire_error);
                return;
              }
              if (!r.found) {
                fmt::print("not found ({} hops)\n", r.hops);
                code = 1;
                return;
              }
              for (auto& rec : r.records) {
                std::string v(rec.value.begin(), rec.value.end());
                if (rec.has_subkey)
                  fmt::print("{}[{}] = {}\n", key, rec.subkey, v);
                else
                  fmt::print("{} = {}\n", key, v);
              }
              fmt::print("found ({} hops)\n", r.hops);
              code = 0;
            },
            [&](caf::error& e) {
              fmt::print(stderr, "starling: error: get: {}\n", nd->system().render(e));
            });
  }
  std::fflush(stdout);
  nd->shutdown();
  return code;
}

int cmd_dht_store(const std::string& endpoint, const std::string& key, const std::string& value,
                  const std::string& subkey, const std::string& ttl) {
  std::chrono::nanoseconds d{};
  if (!parse_ttl(ttl, d))
    return dht_die(
        fmt::format("--ttl: expected a duration like 60s, 5m or 500ms, got \"{}\"", ttl));
  auto c = connect_dht(endpoint);
  if (!c)
    return dht_die(c.error().what);
  auto& [nd, dht] = *c;
  int code = 2;
  {
    caf::scoped_actor self{nd->system()};
    // DHT time is the actor clock (steady clock): comparable between processes of one machine.
    auto exp = actors::dht::expires_in(self.ptr(), d);
    auto put = subkey.empty()
                   ? actors::dht::make_put(key, {value.begin(), value.end()}, exp)
                   : actors::dht::make_subkey_put(key, subkey, {value.begin(), value.end()}, exp);
    self->request(dht, std::chrono::seconds(30), put)
        .receive(
            [&](const messages::dht_put_result& r) {
              if (!r.wire_error.empty()) {
                fmt::print(stderr, "starling: error: store: the answer was refused: {}\n",
                           r.wire_error);
                return;
              }
              fmt::print("stored on {} of {} replicas ({} hops)\n", r.accepted, r.replicas, r.hops);
              code = r.accepted > 0 ? 0 : 1;
            },
            [&](caf::error& e) {
              fmt::print(stderr, "starling: error: store: {}\n", nd->system().render(e));
            });
  }
  std::fflush(stdout);
  nd->shutdown();
  return code;
}

} // namespace starling::runtime
