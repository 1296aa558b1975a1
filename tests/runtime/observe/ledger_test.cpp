// The contribution ledger (runtime/observe/ledger.hpp): summaries from the DHT and the metric
// stream folded per peer, accepted samples only from partners, expired records kept, incarnations
// summed, rows bounded, one reply's records bounded, CSV that a spreadsheet cannot misread.
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

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
  CHECK(csv.find(",1,\"said \"\"no\"\", twice\",0,none,,,0\n") != std::string::npos);
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

TEST_CASE("a SWARM trainer is credited by the stage-0 peers that applied its microbatches, "
          "never by its own word") {
  ledger_book b;
  // Two trainers claim 640 and 320 samples; stage-0 peers credit them under their tags (and one
  // tag no row has); a stage-1 peer's summary carries its stage.
  auto t0 = summary("trainer.0", 10, 0, 640);
  auto t1 = summary("trainer.1", 10, 0, 320);
  auto s0 = summary("stage.0", 10, 0, 300,
                    {{collab::trainer_credit_name_of("trainer.0"), 256},
                     {collab::trainer_credit_name_of("trainer.1"), 32},
                     {"mb:000000", 999}});
  s0.stage = 0;
  auto s1 = summary("stage.1", 10, 0, 200, {{collab::trainer_credit_name_of("trainer.1"), 64}});
  s1.stage = 0;
  auto s2 = summary("stage.2", 10, 0, 900);
  s2.stage = 1;
  s2.dropped = 100;
  s2.loss = 3.5;
  s2.step = 7;
  auto read = b.add_records({entry(t0, 100), entry(t1, 100), entry(s0, 100), entry(s1, 100),
                             entry(s2, 100)},
                            10);
  CHECK(read.accepted == 5);
  auto rows = b.rows();
  // A tag is no row of its own.
  CHECK(rows.size() == 5);
  CHECK(row(rows, "trainer.0").accepted == 256);
  CHECK(row(rows, "trainer.1").accepted == 96);
  CHECK(row(rows, "trainer.0").computed == 640);
  CHECK(row(rows, "stage.0").accepted == 0);
  CHECK(row(rows, "stage.2").stage == 1);
  CHECK(row(rows, "stage.2").loss == 3.5);
  CHECK(row(rows, "stage.2").step == 7);
  CHECK(row(rows, "trainer.0").stage == -1);
  CHECK(render_ledger_csv(rows).find(",live,1,,0\n") != std::string::npos);

  // The snapshot sums each stage's applied samples (computed less dropped) into a counter and
  // its rate over the stage window.
  run_description run;
  run.experiment = "x";
  snapshot_builder sb{run};
  sb.add({0, 0, "trainer.0", "microbatch", {{"samples", 16}}, {}});
  sb.add_ledger_records({entry(s0, 100), entry(s1, 100), entry(s2, 100)}, 10);
  auto a = sb.make();
  CHECK(a.stage_samples_total.at("0") == 500);
  CHECK(a.stage_samples_total.at("1") == 800);
  auto s0b = s0;
  s0b.time = 20;
  s0b.computed = 800;
  sb.advance(20);
  sb.add_ledger_records({entry(s0b, 100)}, 20);
  auto c = sb.make();
  CHECK(c.stage_samples_total.at("0") == 1000);
  // 500 more samples applied by stage 0 over the 20 s since the first mark (at run time 0).
  CHECK(c.stage_samples_per_second.at("0") == doctest::Approx(25));
  CHECK(c.stage_samples_per_second.at("1") == 0);
}

TEST_CASE("a node without the metric stream draws its tiles and loss curve from the "
          "summaries") {
  run_description run;
  run.experiment = "x";
  run.start_unix_s = 1000;
  snapshot_builder b{run};
  auto a = summary("dedloc.0", 1010, 1000, 64);
  a.loss = 2.0;
  a.step = 3;
  auto c = summary("dedloc.1", 1010, 1000, 32);
  c.loss = 3.0;
  c.step = 4;
  b.add_ledger_records({entry(a, 2000), entry(c, 2000)}, 1010);
  auto s1 = b.make();
  CHECK(s1.run_time_s == 10);
  CHECK(s1.samples_total == 96);
  CHECK(s1.loss == 2.5);
  CHECK(s1.global_step == 4);
  CHECK(s1.loss_curve.size() == 1);
  CHECK(s1.peer_samples_total.at("dedloc.0") == 64);
  a.time = 1020;
  a.computed = 128;
  a.loss = 1.0;
  b.add_ledger_records({entry(a, 2000)}, 1020);
  auto s2 = b.make();
  CHECK(s2.run_time_s == 20);
  CHECK(s2.samples_total == 160);
  CHECK(s2.loss == 2.0);
  CHECK(s2.loss_curve.size() == 2);
  CHECK(s2.samples_per_second == doctest::Approx(6.4));
  // A node with the metric stream keeps its own numbers.
  snapshot_builder zero{run};
  zero.add({1, 0, "dedloc.0", "dp_step", {{"samples", 8}, {"loss", 5}}, {}});
  zero.add_ledger_records({entry(a, 2000), entry(c, 2000)}, 1020);
  auto z = zero.make();
  CHECK(z.samples_total == 8);
  CHECK(z.loss == 5);
}

TEST_CASE("a banned node's instances are banned in the ledger, and refusals from a node count "
          "on its instances") {
  run_description run;
  run.experiment = "x";
  run.members.push_back({"peer.0", "peer", 1, 0, -1, "dedloc.peer"});
  run.members.push_back({"peer.1", "peer", 2, 0, -1, "dedloc.peer"});
  snapshot_builder b{run};
  b.add({3, 0, "node2/faults", "fault", {}, {{"action", "ban"}, {"node", "node2"}}});
  b.add({4, 0, "node0/gate", "refused", {}, {{"reason", "revoked"}, {"from_node", "node2"}}});
  b.add({5, 0, "node0/gate", "refused", {}, {{"reason", "revoked"}, {"from_node", "node2"}}});
  auto s = b.make();
  auto& banned = row(s.ledger, "peer.1");
  CHECK(banned.banned);
  CHECK(banned.ban_reason.find("node2") != std::string::npos);
  CHECK(banned.refusals == 2);
  CHECK(s.refusals_by_reason.at("revoked") == 2);
  for (auto& r : s.ledger)
    if (r.peer == "peer.0")
      CHECK_FALSE(r.banned);
  for (auto& m : s.members)
    if (m.name == "peer.1")
      CHECK_FALSE(m.live);
  // The authority's reason, when the world tells it (a simulated run's page), replaces the
  // generic line.
  b.add({6, 0, "node2/faults", "node_banned", {}, {{"node", "node2"}, {"reason", "cheated"}}});
  auto t = b.make();
  CHECK(row(t.ledger, "peer.1").ban_reason
        == "its node (node2) was banned by the run's authority: cheated");
  for (auto& r : t.ledger)
    if (r.peer == "peer.0")
      CHECK_FALSE(r.banned);
}

TEST_CASE("the serving node's gate's refusals of a known key land on that peer's rows, with the "
          "authority's reason for a ban, and never go back") {
  run_description run;
  run.experiment = "x";
  snapshot_builder b{run};
  // Two peers on two node keys; a third key the gate refused never published a record.
  auto on_key = [](const std::string& name, char key) {
    auto s = summary(name, 10, 0, 64);
    s.id = "@0/" + name + "|[owner:" + std::string(64, key) + "]";
    return s;
  };
  b.add_ledger_records({entry(on_key("dedloc.0", 'a'), 100), entry(on_key("dedloc.1", 'b'), 100)},
                       20);
  gate_refusals g;
  g.by_reason = {{"revoked", 3}, {"role_denied", 1}, {"no_hello", 5}};
  g.peers = {{"bbbbbbbbbbbbbbbb", 3, "this node's token 636363636363 was revoked: left the run"},
             {"cccccccccccccccc", 1, ""}};
  b.set_gate_refusals(g);
  auto s = b.make();
  CHECK(s.refusals_by_reason.at("revoked") == 3);
  CHECK(s.refusals_by_reason.at("no_hello") == 5);
  CHECK(row(s.ledger, "dedloc.0").refusals == 0);
  CHECK_FALSE(row(s.ledger, "dedloc.0").banned);
  auto& revoked = row(s.ledger, "dedloc.1");
  CHECK(revoked.peer_id == "bbbbbbbbbbbbbbbb");
  CHECK(revoked.refusals == 3);
  CHECK(revoked.banned);
  CHECK(revoked.ban_reason == "this node's token 636363636363 was revoked: left the run");
  auto& stranger = row(s.ledger, "peer:cccccccccccccccc");
  CHECK(stranger.refusals == 1);
  CHECK(stranger.peer_id == "cccccccccccccccc");
  CHECK_FALSE(stranger.banned);
  // The gate moved the revoked peer to its `other` and counts less by reason than before (it
  // cannot, but a snapshot must not go back even then): what was shown stays.
  gate_refusals later;
  later.by_reason = {{"revoked", 2}, {"no_hello", 6}};
  later.peers = {{"cccccccccccccccc", 4, ""}};
  b.set_gate_refusals(later);
  auto t = b.make();
  CHECK(t.refusals_by_reason.at("revoked") == 3);
  CHECK(t.refusals_by_reason.at("no_hello") == 6);
  CHECK(row(t.ledger, "dedloc.1").refusals == 3);
  CHECK(row(t.ledger, "dedloc.1").banned);
  CHECK(row(t.ledger, "peer:cccccccccccccccc").refusals == 4);
  // The stream's refusals (a simulation's, refused metrics) add to the gate's.
  b.add({30, 0, "node1/wire", "refused", {}, {{"reason", "no_hello"}}});
  CHECK(b.make().refusals_by_reason.at("no_hello") == 7);
  // CSV: the ban reason is quoted (it holds no comma here) and the row is there.
  auto csv = render_ledger_csv(t.ledger);
  CHECK(csv.find("peer:cccccccccccccccc,cccccccccccccccc,") != std::string::npos);
  CHECK(csv.find("was revoked: left the run") != std::string::npos);
}

TEST_CASE("other nodes' gate records put their refusals on every node's ledger: summed over the "
          "gates, the serving node's own record read back counted once") {
  run_description run;
  run.experiment = "x";
  snapshot_builder b{run};
  auto s0 = summary("dedloc.1", 10, 0, 64);
  s0.id = "@0/dedloc.1|[owner:" + std::string(64, 'b') + "]";
  auto gate_of = [](char node, double time, std::vector<collab::gate_party> parties) {
    collab::gate_summary g;
    g.id = "gate|[owner:" + std::string(64, node) + "]";
    g.time = time;
    g.by_reason = {{"banned", 1}};
    g.parties = std::move(parties);
    return g;
  };
  auto gate_entry = [](const collab::gate_summary& g) {
    return ledger_entry{g.id, collab::encode_gate_summary(g), 100, true};
  };
  b.set_own_gate_id("gate|[owner:" + std::string(64, 'e') + "]");
  // The serving node's gate refused dedloc.1's key twice; node f refused it three times and
  // banned it; node 9 refused a key nobody else knows.
  gate_refusals own;
  own.by_reason = {{"no_hello", 2}};
  own.peers = {{"bbbbbbbbbbbbbbbb", 2, ""}};
  b.set_gate_refusals(own);
  auto r = b.add_ledger_records(
      {entry(s0, 100),
       gate_entry(gate_of('f', 11, {{"bbbbbbbbbbbbbbbb", 3, "banned by verdict 4f: NaN part"}})),
       gate_entry(gate_of('9', 12, {{"dddddddddddddddd", 5, ""}})),
       // the serving node's own record, one read behind its live gate
       gate_entry(gate_of('e', 12, {{"bbbbbbbbbbbbbbbb", 1, ""}}))},
      20);
  CHECK(r.accepted == 4);
  CHECK(r.rejected == 0);
  auto snap = b.make();
  auto& banned = row(snap.ledger, "dedloc.1");
  CHECK(banned.refusals == 5); // 2 here (the own record's 1 is the same gate) + 3 at node f
  CHECK(banned.refused_by == 2);
  CHECK(banned.banned);
  CHECK(banned.ban_reason == "banned by verdict 4f: NaN part");
  CHECK(row(snap.ledger, "peer:dddddddddddddddd").refusals == 5);
  CHECK(row(snap.ledger, "peer:dddddddddddddddd").refused_by == 1);
  // The node's own counts by reason stay its own: /metrics is this node's.
  CHECK(snap.refusals_by_reason.count("banned") == 0);
  // A later record of node f counts more; an older copy from another replica changes nothing.
  b.add_ledger_records({gate_entry(gate_of('f', 15, {{"bbbbbbbbbbbbbbbb", 4, ""}})),
                        gate_entry(gate_of('f', 9, {{"bbbbbbbbbbbbbbbb", 1, ""}}))},
                       21);
  auto later = b.make();
  CHECK(row(later.ledger, "dedloc.1").refusals == 6);
  CHECK(row(later.ledger, "dedloc.1").banned);
  // A gate record under another sub-key than its id, or a summary read as a gate, is refused.
  auto forged = gate_of('f', 16, {{"bbbbbbbbbbbbbbbb", 100, ""}});
  auto bad = gate_entry(forged);
  bad.subkey = "gate|[owner:" + std::string(64, '7') + "]";
  auto as_gate = entry(s0, 100);
  as_gate.gate = true;
  auto r2 = b.add_ledger_records({bad, as_gate}, 22);
  CHECK(r2.rejected == 2);
  CHECK(row(b.make().ledger, "dedloc.1").refusals == 6);
}

TEST_CASE("two SWARM trainers whose names' tags collide are each credited under the distinct "
          "tags the plan gives them") {
  std::map<uint64_t, std::string> seen;
  std::string first, second;
  for (int i = 0; i < 200000 && second.empty(); ++i) {
    auto name = "trainer." + std::to_string(i);
    auto [it, fresh] = seen.emplace(collab::trainer_tag(name), name);
    if (!fresh) {
      first = it->second;
      second = name;
    }
  }
  REQUIRE_FALSE(second.empty());
  auto tags = collab::trainer_tags({first, second});
  REQUIRE(tags.at(first) != tags.at(second));
  auto stage = summary("stage.0", 10, 0, 300,
                       {{collab::trainer_credit_name_of_tag(tags.at(first)), 64},
                        {collab::trainer_credit_name_of_tag(tags.at(second)), 32}});
  stage.stage = 0;
  auto records = std::vector<ledger_entry>{entry(summary(first, 10, 0, 64), 100),
                                           entry(summary(second, 10, 0, 32), 100),
                                           entry(stage, 100)};
  run_description run;
  run.experiment = "x";
  run.members.push_back({first, "trainer", 0, 0, -1, "swarm.trainer"});
  run.members.push_back({second, "trainer", 0, 0, -1, "swarm.trainer"});
  run.members.push_back({"stage.0", "peers", 1, 0, -1, "swarm.stage"});
  snapshot_builder b{run};
  b.add_ledger_records(records, 10);
  auto s = b.make();
  CHECK(row(s.ledger, first).accepted == 64);
  CHECK(row(s.ledger, second).accepted == 32);
  // A ledger that does not know the trainers credits neither of two names with one tag.
  ledger_book blind;
  auto shared = summary("stage.0", 10, 0, 300,
                        {{collab::trainer_credit_name_of(first), 64}});
  shared.stage = 0;
  blind.add_records({entry(summary(first, 10, 0, 64), 100), entry(summary(second, 10, 0, 32), 100),
                     entry(shared, 100)},
                    10);
  auto rows = blind.rows();
  CHECK(row(rows, first).accepted == 0);
  CHECK(row(rows, second).accepted == 0);
}

} // namespace starling::test::runtime_observe_ledger_test
