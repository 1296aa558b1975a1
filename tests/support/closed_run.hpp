// A closed run for tests: an authority in a scratch folder, node keys, tokens and node settings
// (runtime/node/gate.hpp admits only token holders of such a run).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <doctest/doctest.h>

#include "actors/auth/authority.hpp"
#include "actors/auth/identity.hpp"
#include "actors/auth/token.hpp"
#include "runtime/node/node.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::testing {

namespace auth = starling::actors::auth;
using runtime::node;
using runtime::node_options;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
           std::chrono::system_clock::now().time_since_epoch())
    .count();
}

/// A closed run in a scratch folder: its authority, and node settings with keys and tokens.
struct closed_run {
  temp_dir dir{"starling-gate"};
  auth::authority authority = make_authority();

  auth::authority make_authority() {
    auth::authority_init_options o;
    o.dir = dir.path + "/authority";
    o.experiment = "gate-run";
    o.now_ns = now_ns() - 3600LL * 1'000'000'000;
    auto a = auth::init_authority(o);
    REQUIRE(a.ok());
    return std::move(*a);
  }

  /// The node key of `name` (created on first use).
  auth::key_pair key(const std::string& name) {
    auto k = auth::load_or_create_key(dir.path + "/" + name + "/node.key", auth::key_role::node);
    REQUIRE(k.ok());
    return std::move(k->key);
  }

  /// A token for `name`'s key, issued `age_s` ago and valid for `valid_s`: the signed token.
  std::string issue(const std::string& name, int64_t age_s = 1, int64_t valid_s = 3600,
                    const std::string& roles = "any") {
    auto k = key(name);
    auto r = auth::parse_roles(roles);
    REQUIRE(r.ok());
    auto t = auth::issue_token(authority, {k.public_key(), *r, now_ns() - age_s * 1'000'000'000,
                                           valid_s * 1'000'000'000, {}});
    REQUIRE(t.ok());
    auto path = dir.path + "/" + name + ".token";
    REQUIRE(auth::write_file_atomically(path, t->file_text, 0600).ok());
    return t->signed_token;
  }

  /// Settings of node `name` of this run (token issued here).
  node_options options(const std::string& name, bool tls) {
    issue(name);
    node_options no;
    no.key_file = dir.path + "/" + name + "/node.key";
    no.authority = authority.dir + "/authority.pub";
    no.token = dir.path + "/" + name + ".token";
    no.tls = tls;
    return no;
  }

  std::unique_ptr<node> start(const std::string& name, bool tls) {
    auto n = node::start(fast_caf(), options(name, tls), name);
    REQUIRE_MESSAGE(n.ok(), (n.ok() ? "" : n.error().what));
    return std::move(*n);
  }
};


/// The token id of `name`'s token file in `run`.
inline std::string token_id_of(closed_run& run, const std::string& name) {
  auto text = auth::read_small_file(run.dir.path + "/" + name + ".token", 64 * 1024);
  REQUIRE(text.ok());
  auto t = auth::decode_token(*auth::parse_token_file(*text, name));
  REQUIRE(t.ok());
  return t->id;
}

/// The authority of `run` revokes token `token_id`: the signed deny list.
inline std::string revoke(closed_run& run, const std::string& token_id) {
  auth::deny_entry e;
  e.kind = auth::deny_entry::kind_t::token;
  e.id = token_id;
  e.reason = "left the run";
  auto list = auth::deny(run.authority, e, now_ns());
  REQUIRE(list.ok());
  return *list;
}

} // namespace starling::testing
