// A closed run's page shows each peer's token id and never a secret: a node of a closed run
// hands its roles its token's id (runtime/node/node.hpp, `token_id`), the peers' summaries carry
// it, and the page, /status, /metrics and /ledger.csv rendered from a snapshot with that row hold
// the id but not the signed token, the token file, the node's secret key nor the authority's.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actors/auth/identity.hpp"
#include "actors/collab/ledger_record.hpp"
#include "runtime/observe/exposition.hpp"
#include "runtime/observe/ledger.hpp"
#include "runtime/observe/page.hpp"
#include "runtime/observe/snapshot.hpp"
#include "runtime/observe/status.hpp"
#include "tests/support/closed_run.hpp"

namespace starling::test::runtime_observe_no_secret_test {

using namespace starling::runtime::observe;
namespace auth = starling::actors::auth;
namespace collab = starling::actors::collab;

namespace {

/// Every form a secret could take in a text answer: its bytes, hex, and base64url.
std::vector<std::string> forms(const std::string& secret) {
  std::vector<std::string> out{secret, auth::to_hex(secret)};
  static const char* b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string enc;
  size_t i = 0;
  for (; i + 2 < secret.size(); i += 3) {
    auto v = (static_cast<unsigned char>(secret[i]) << 16) |
             (static_cast<unsigned char>(secret[i + 1]) << 8) |
             static_cast<unsigned char>(secret[i + 2]);
    for (int k = 18; k >= 0; k -= 6)
      enc.push_back(b64[(v >> k) & 63]);
  }
  // A prefix long enough to be the secret and nothing else.
  out.push_back(enc.substr(0, 24));
  return out;
}

} // namespace

TEST_CASE("a closed run's ledger names a peer's token by its id, and no answer holds a secret") {
  testing::closed_run run;
  auto nd = run.start("alice", false);
  auto file = auth::read_small_file(run.dir.path + "/alice.token", 64 * 1024);
  REQUIRE(file.ok());
  auto signed_token = auth::parse_token_file(*file, "alice");
  REQUIRE(signed_token.ok());
  auto id = auth::to_hex(testing::token_id_of(run, "alice"));
  // The node hands out the id, not the token.
  REQUIRE(nd->token_id() == id);
  CHECK(nd->token_id().size() == 2 * auth::token_id_bytes);

  collab::contribution_summary s;
  s.id = "@1/dedloc.1";
  s.name = "dedloc.1";
  s.time = 10;
  s.computed = 64;
  s.token_id = nd->token_id();
  run_description desc;
  desc.experiment = "gate-run";
  desc.mode = "cluster";
  snapshot_builder b{desc};
  b.add({1, 0, "dedloc.1", "dp_step", {{"samples", 64}}, {}});
  auto read = b.add_ledger_records({{s.id, collab::encode_summary(s), 100}}, 10);
  REQUIRE(read.accepted == 1);
  auto snap = b.make();
  std::vector<std::pair<std::string, std::string>> answers{
      {"/", status_page()},
      {"/status", render_status(snap)},
      {"/metrics", render_metrics(snap)},
      {"/ledger.csv", render_ledger_csv(snap.ledger)}};
  CHECK(answers[1].second.find(id) != std::string::npos);
  CHECK(answers[3].second.find(id) != std::string::npos);
  std::vector<std::string> secrets{*signed_token, *file, run.key("alice").secret_key(),
                                   run.authority.key.secret_key()};
  for (auto& [path, body] : answers)
    for (auto& secret : secrets)
      for (auto& form : forms(secret)) {
        CAPTURE(path);
        CHECK(body.find(form) == std::string::npos);
      }
}

} // namespace starling::test::runtime_observe_no_secret_test
