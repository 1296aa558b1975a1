// The contribution ledger (runtime/observe/ledger.hpp): summaries from the DHT and the metric
// stream folded per peer, accepted samples only from partners, expired records kept, incarnations
// summed, rows bounded, one reply's records bounded, CSV that a spreadsheet cannot misread.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "actors/collab/ledger_record.hpp"
#include "runtime/observe/ledger.hpp"
#include "runtime/observe/snapshot.hpp"

namespace starling::test::runtime_observe_ledger_test {

using namespace starling::runtime::observe;
namespace collab = starling::actors::collab;

namespace {

collab::contribution_summary summary(const std::string& name, double time, double started,
                                     double computed,
                                     std::vector<collab::ledger_credit> credits = {}) {
  collab::contribution_summary s;
  s.id = "@0/" + name + "|[owner:" + std::string(64, 'a') + "]";
  s.name = name;
  s.time = time;
  s.started = started;
  s.computed = computed;
  s.rounds = 3;
  s.rounds_averaged = 2;
  s.bytes_sent = 100;
  s.credits = std::move(credits);
  return s;
}

ledger_entry entry(const collab::contribution_summary& s, double expires_at) {
  return {s.id, collab::encode_summary(s), expires_at};
}

void feed(ledger_book& b, double t, const std::string& source, const std::string& kind,
          std::map<std::string, double> values, std::map<std::string, std::string> labels = {}) {
  b.add({t, 0, source, kind, values, labels});
}

const ledger_row& row(const std::vector<ledger_row>& rows, const std::string& peer) {
  for (auto& r : rows)
    if (r.peer == peer)
      return r;
  FAIL("no row for " << peer);
  static ledger_row none;
  return none;
}

} // namespace

TEST_CASE("accepted samples are what partners credit, never the peer's own claim") {
  ledger_book b;
  // a credits b with 40 and itself with 1000 (ignored); b credits a with 25.
  auto read = b.add_records({entry(summary("a", 10, 0, 64, {{"a", 1000}, {"b", 40}}), 100),
                             entry(summary("b", 10, 0, 48, {{"a", 25}}), 100),
                             entry(summary("c", 10, 0, 500), 100)},
                            10);
  CHECK(read.accepted == 3);
  CHECK(read.rejected == 0);
  auto rows = b.rows();
  CHECK(row(rows, "a").accepted == 25);
  CHECK(row(rows, "b").accepted == 40);
  // c claims 500 samples computed; nobody received any of them.
  CHECK(row(rows, "c").computed == 500);
  CHECK(row(rows, "c").accepted == 0);
  CHECK(row(rows, "a").record == "live");
  CHECK(row(rows, "a").peer_id == std::string(16, 'a'));
  CHECK(row(rows, "a").uptime_s == 10);
}

TEST_CASE("a peer whose record expired stays in the ledger with its last numbers") {
  ledger_book b;
  b.add_records({entry(summary("gone", 20, 5, 300, {{"stay", 7}}), 30),
                 entry(summary("stay", 20, 0, 100), 60)},
                20);
  // The next reads no longer return `gone`'s record (it expired at 30).
  b.add_records({entry(summary("stay", 40, 0, 200), 80)}, 40);
  auto rows = b.rows();
  REQUIRE(rows.size() == 2);
  CHECK(row(rows, "gone").record == "expired");
  CHECK(row(rows, "gone").computed == 300);
  CHECK(row(rows, "stay").accepted == 7);
  CHECK(row(rows, "stay").computed == 200);
  CHECK(row(rows, "stay").record == "live");
  b.advance(100);
  CHECK(row(b.rows(), "stay").record == "expired");
}

TEST_CASE("an older copy of a record changes nothing, a restarted peer's incarnations add up") {
  ledger_book b;
  b.add_records({entry(summary("p", 50, 0, 400), 100)}, 50);
  auto read = b.add_records({entry(summary("p", 30, 0, 100), 100)}, 50);
  CHECK(read.accepted == 0);
  CHECK(row(b.rows(), "p").computed == 400);
  // Restarted at 60: counts from 0 again under the same id.
  b.add_records({entry(summary("p", 70, 60, 50), 120)}, 70);
  CHECK(row(b.rows(), "p").computed == 450);
  CHECK(row(b.rows(), "p").uptime_s == 60);
}

TEST_CASE("the metric stream and the records each give a lower bound: the larger one counts") {
  ledger_book b;
  feed(b, 1, "a", "dp_join", {});
  feed(b, 2, "a", "dp_step", {{"samples", 64}, {"averaged", 1}, {"bytes_sent", 900}});
  feed(b, 3, "a", "dp_dropped", {{"samples", 16}});
  feed(b, 3, "b", "dp_credit", {{"a", 60}, {"b", 999}});
  feed(b, 4, "a", "dp_leave", {});
  auto rows = b.rows();
  CHECK(row(rows, "a").computed == 80);
  CHECK(row(rows, "a").dropped == 16);
  CHECK(row(rows, "a").rounds_averaged == 1);
  CHECK(row(rows, "a").bytes_sent == 900);
  CHECK(row(rows, "a").accepted == 60);
  CHECK(row(rows, "a").left);
  CHECK(row(rows, "a").record == "none");
  CHECK(row(rows, "a").uptime_s == 3);
  CHECK(row(rows, "b").accepted == 0);
  // b's record says it credited a with 64 by now (the stream missed a round): 64 counts. Its
  // record also claims more computed than the stream saw.
  b.add_records({entry(summary("b", 5, 0, 128, {{"a", 64}}), 50)}, 5);
  rows = b.rows();
  CHECK(row(rows, "a").accepted == 64);
  CHECK(row(rows, "b").computed == 128);
  // Refusals and bans name the peer in a label.
  feed(b, 6, "node0/wire", "refused", {}, {{"peer", "a"}, {"reason", "bad signature"}});
  feed(b, 7, "node0/btard", "ban", {}, {{"peer", "a"}, {"reason", "wrong aggregate"}});
  rows = b.rows();
  CHECK(row(rows, "a").refusals == 1);
  CHECK(row(rows, "a").banned);
  CHECK(row(rows, "a").ban_reason == "wrong aggregate");
}

TEST_CASE("rows are bounded, one reply decodes a bounded number of records, bad ones are "
          "refused") {
  ledger_book b{ledger_options{4}};
  std::vector<ledger_entry> entries;
  for (int i = 0; i < 10; ++i)
    entries.push_back(entry(summary("p" + std::to_string(i), 1, 0, 10), 100));
  auto forged = entry(summary("x", 1, 0, 10), 100);
  forged.subkey = "@0/someone-else";
  entries.push_back(forged);
  entries.push_back({"k", {'\x01', '\x00'}, 100});
  auto read = b.add_records(entries, 1);
  CHECK(read.accepted == 10);
  CHECK(read.rejected == 2);
  auto rows = b.rows();
  REQUIRE(rows.size() == 4);
  CHECK(rows.back().peer == "other");
  CHECK(rows.back().computed == 70);
  // At most max_ledger_reply_records per reply.
  ledger_book big;
  std::vector<ledger_entry> flood;
  for (size_t i = 0; i < collab::max_ledger_reply_records + 3; ++i)
    flood.push_back(entry(summary("f" + std::to_string(i), 1, 0, 1), 100));
  auto r = big.add_records(flood, 1);
  CHECK(r.accepted == collab::max_ledger_reply_records);
  CHECK(r.rejected == 3);
}

TEST_CASE("the ledger's CSV quotes what needs quoting and defuses formulas") {
  ledger_row r;
  r.peer = "=HYPERLINK(\"x\")";
  r.computed = 12;
  r.accepted = 2.5;
  r.ban_reason = "said \"no\", twice";
  r.banned = true;
  auto csv = render_ledger_csv({r});
  CHECK(csv.rfind("peer,peer_id,samples_computed,samples_accepted,", 0) == 0);
  CHECK(csv.find("\"'=HYPERLINK(\"\"x\"\")\",,12,2.500,") != std::string::npos);
  CHECK(csv.find(",1,\"said \"\"no\"\", twice\",0,none\n") != std::string::npos);
}

TEST_CASE("a snapshot carries the ledger of its builder") {
  run_description run;
  run.experiment = "x";
  snapshot_builder b{run};
  b.add({1, 0, "a", "dp_step", {{"samples", 8}}, {}});
  b.add_ledger_records({entry(summary("b", 1, 0, 10, {{"a", 8}}), 100)}, 1);
  auto s = b.make();
  REQUIRE(s.ledger.size() == 2);
  CHECK(s.ledger[0].peer == "a");
  CHECK(s.ledger[0].accepted == 8);
}

} // namespace starling::test::runtime_observe_ledger_test
