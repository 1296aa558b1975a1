#include "runtime/btard/audit.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "actors/auth/identity.hpp"
#include "actors/btard/protocol.hpp"
#include "runtime/btard/experiment.hpp"
#include "kernels/data/idx.hpp"
#include "kernels/data/idx_source.hpp"

namespace starling::test::btard_audit {

namespace bt = starling::actors::btard;
namespace rb = starling::runtime::btard;
using starling::actors::auth::key_pair;

namespace {

std::string temp_dir() {
  auto d = std::filesystem::temp_directory_path()
           / ("starling-audit-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  return d.string();
}

/// Writes the audit log of 8 steps of a 6-peer group with a sign-flip attacker (found by 3
/// validators) and a projection liar at step 2; from step `from` on when it is not 0 (the log of
/// a peer that came back into the group then, starting from that step's randomness).
void write_log(const std::string& path, int from = 0) {
  auto train = kernels::idx_source::make(
    std::make_shared<const kernels::image_set>(kernels::make_synthetic_images(256, 8, 10, 4, 0)));
  REQUIRE(train);
  bt::mlp_task_options mo;
  mo.hidden = 8;
  mo.batch = 8;
  auto t = bt::make_mlp_task(*train, nullptr, mo);
  REQUIRE(t);
  bt::group_options o;
  o.run_id = "audit-test";
  o.validators = 3;
  o.seed = 4;
  std::vector<bt::peer_spec> specs(6);
  specs[1].gradient.kind = bt::attack_kind::sign_flip;
  specs[4].protocol = bt::protocol_attack::lie_projection;
  specs[4].protocol_step = 2;
  std::vector<key_pair> keys;
  for (uint64_t i = 0; i < 6; ++i)
    keys.push_back(key_pair::from_test_seed(500 + i));
  rb::audit_header h;
  h.run_id = o.run_id;
  h.seed = o.seed;
  h.dim = (*t)->dim();
  for (auto& k : keys)
    h.peers.push_back(k.public_key());
  h.tau = o.tau;
  h.tolerance = o.tolerance;
  h.validators = o.validators;
  h.sigmas = o.sigmas;
  auto g = bt::simulated_group::make(o, *t, specs, keys);
  REQUIRE(g);
  std::optional<rb::audit_writer> w;
  for (int s = 0; s < 8; ++s) {
    auto rec = (*g)->step();
    REQUIRE(rec);
    if (s < from)
      continue;
    if (!w) {
      if (from > 0) {
        h.resumed_at = static_cast<uint64_t>(from);
        h.r_resumed = bt::digest_string(rec->r_prev);
      }
      auto opened = rb::audit_writer::open(path, h);
      REQUIRE(opened);
      w.emplace(std::move(*opened));
    }
    REQUIRE(w->write(*rec));
  }
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);)
    out.push_back(l);
  return out;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (auto& l : lines)
    out << l << '\n';
}

} // namespace

TEST_CASE("an audit log checks, the same seed writes the same log, and tampering is found") {
  auto dir = temp_dir();
  auto a = dir + "/a.jsonl", b = dir + "/b.jsonl";
  write_log(a);
  write_log(b);
  auto la = lines_of(a);
  CHECK(la == lines_of(b));
  REQUIRE(la.size() == 9);
  auto report = rb::check_audit(a);
  REQUIRE(report);
  for (auto& p : report->problems)
    MESSAGE(p);
  CHECK(report->problems.empty());
  CHECK(report->steps == 8);
  CHECK(report->verdicts >= 2); // the projection liar and the sign flipper
  CHECK(report->bans >= 2);
  CHECK(report->draws >= 8);

  // One verdict's action changed: its rule gives another, and the chain breaks at the next line.
  size_t with_verdict = 0;
  for (size_t i = 1; i < la.size() && !with_verdict; ++i) {
    auto j = nlohmann::json::parse(la[i]);
    for (auto& at : j["attempts"])
      if (!at["verdicts"].empty()) {
        auto& v = at["verdicts"][0];
        v["action"] = v["action"] == "ban_accused" ? "ban_accuser" : "ban_accused";
        la[i] = j.dump();
        with_verdict = i;
        break;
      }
  }
  REQUIRE(with_verdict > 0);
  auto c = dir + "/c.jsonl";
  write_lines(c, la);
  auto bad = rb::check_audit(c);
  REQUIRE(bad);
  REQUIRE(bad->problems.size() >= 1);
  CHECK(bad->problems[0].find("line " + std::to_string(with_verdict + 1) + ": a ")
        != std::string::npos);
  CHECK(bad->problems[0].find("verdict") != std::string::npos);
  if (with_verdict + 1 < la.size()) {
    REQUIRE(bad->problems.size() >= 2);
    CHECK(bad->problems[1].find("chain breaks") != std::string::npos);
  }

  // A seed changed: the seed chain says so; a line dropped: the chain says where.
  auto ls = lines_of(a);
  auto j = nlohmann::json::parse(ls[3]);
  auto& seeds = j["seeds"];
  seeds[seeds.begin().key()] = seeds.begin()->get<uint64_t>() + 1;
  ls[3] = j.dump();
  write_lines(c, ls);
  auto bad_seed = rb::check_audit(c);
  REQUIRE(bad_seed);
  REQUIRE_FALSE(bad_seed->problems.empty());
  CHECK(bad_seed->problems[0].find("batch seed") != std::string::npos);
  ls = lines_of(a);
  ls.erase(ls.begin() + 5);
  write_lines(c, ls);
  auto dropped = rb::check_audit(c);
  REQUIRE(dropped);
  REQUIRE_FALSE(dropped->problems.empty());
  CHECK(dropped->problems[0].find("line 6: the chain breaks") != std::string::npos);

  // Not a log at all.
  write_lines(c, {"{}"});
  auto empty = rb::check_audit(c);
  REQUIRE(empty);
  CHECK_FALSE(empty->problems.empty());
  CHECK_FALSE(rb::check_audit(dir + "/missing.jsonl"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the log of a peer that came back starts where it did, from the state's randomness") {
  auto dir = temp_dir() + "-resumed";
  std::filesystem::create_directories(dir);
  auto a = dir + "/from-3.jsonl";
  write_log(a, 3);
  auto report = rb::check_audit(a);
  REQUIRE(report);
  for (auto& p : report->problems)
    MESSAGE(p);
  CHECK(report->problems.empty());
  CHECK(report->steps == 5);
  REQUIRE(report->resumed_at);
  CHECK(*report->resumed_at == 3);
  // Another randomness in the header: the first step's seeds no longer follow from it.
  auto ls = lines_of(a);
  auto j = nlohmann::json::parse(ls[0]);
  auto r = j["r_resumed"].get<std::string>();
  r[0] = r[0] == '0' ? '1' : '0';
  j["r_resumed"] = r;
  ls[0] = j.dump();
  auto c = dir + "/tampered.jsonl";
  write_lines(c, ls);
  auto bad = rb::check_audit(c);
  REQUIRE(bad);
  REQUIRE_FALSE(bad->problems.empty());
  auto says = [](const rb::audit_report& rep, const std::string& what) {
    for (auto& p : rep.problems)
      if (p.find(what) != std::string::npos)
        return true;
    return false;
  };
  CHECK(says(*bad, "r_prev is not the randomness"));
  // A resumed step that is not the first step logged.
  j = nlohmann::json::parse(lines_of(a)[0]);
  j["resumed_at"] = 2;
  ls = lines_of(a);
  ls[0] = j.dump();
  write_lines(c, ls);
  auto early = rb::check_audit(c);
  REQUIRE(early);
  REQUIRE_FALSE(early->problems.empty());
  CHECK(says(*early, "step 3 where step 2 was expected"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("--recompute re-checks gradient verdicts from the kept parameters") {
  auto dir = temp_dir() + "-recompute";
  std::filesystem::create_directories(dir);
  rb::experiment_options o;
  o.name = "audit-recompute";
  o.seed = 3;
  o.peers = 6;
  o.byzantine = 2;
  o.steps = 12;
  o.rules = {bt::aggregation_rule::btard};
  o.attack.kind = bt::attack_kind::sign_flip;
  o.group.validators = 3;
  o.model.hidden = 8;
  o.model.batch = 8;
  o.data_dir = dir + "/no-data-here";
  o.synthetic_when_absent = true;
  o.train_samples = 256;
  o.eval_samples = 64;
  o.eval_every = 12;
  auto out = rb::run_experiment(o, dir);
  REQUIRE_MESSAGE(out, (out ? "" : out.error().what));
  auto log = dir + "/btard-audit.jsonl";
  auto report = rb::check_audit(log, true);
  REQUIRE(report);
  for (auto& p : report->problems)
    MESSAGE(p);
  CHECK(report->problems.empty());
  REQUIRE(report->recomputed >= 1);

  // A verdict rewritten consistently (outcome, action and ban) passes the rule check; only the
  // recomputation finds it.
  auto ls = lines_of(log);
  size_t changed = 0;
  for (size_t i = 1; i < ls.size() && !changed; ++i) {
    auto j = nlohmann::json::parse(ls[i]);
    for (auto& at : j["attempts"])
      for (auto& v : at["verdicts"])
        if (v["outcome"] == "confirmed" && !changed) {
          auto acc = bt::decode(*starling::actors::auth::from_hex(v["accusation"].get<std::string>()));
          REQUIRE(acc);
          auto parsed = bt::parse_accusation(acc->body.payload);
          REQUIRE(parsed);
          if (parsed->kind != bt::accusation_kind::wrong_gradient)
            continue;
          v["outcome"] = "refuted";
          v["action"] = "ban_accuser";
          v["banned"] = nlohmann::json::array({starling::actors::auth::to_hex(acc->body.signer)});
          changed = i;
        }
    if (changed)
      ls[i] = j.dump();
  }
  REQUIRE(changed > 0);
  auto c = dir + "/btard-audit-changed.jsonl";
  write_lines(c, ls);
  auto plain = rb::check_audit(c, false);
  REQUIRE(plain);
  // Without recomputation only the chain notices (the line after the changed one).
  for (auto& p : plain->problems)
    CHECK(p.find("chain breaks") != std::string::npos);
  auto deep = rb::check_audit(c, true);
  REQUIRE(deep);
  bool found = false;
  for (auto& p : deep->problems)
    found = found || p.find("recomputed from the checkpoint it is 'confirmed'") != std::string::npos;
  CHECK(found);

  // A checkpoint that is not the logged parameters is refused.
  for (auto& e : std::filesystem::directory_iterator(rb::checkpoint_dir(log))) {
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(0);
    float x = 12345.0f;
    f.write(reinterpret_cast<const char*>(&x), sizeof x);
  }
  auto bad = rb::check_audit(log, true);
  REQUIRE(bad);
  REQUIRE_FALSE(bad->problems.empty());
  CHECK(bad->problems[0].find("is not the parameters the log gives") != std::string::npos);
  std::filesystem::remove_all(dir);
}

} // namespace starling::test::btard_audit
