// The experiment a run serves to joiners, without actors: the package's encoding and its
// refusals, the digest and the authority's signature, the files an experiment names, where a
// joiner stores them, and the hints a joiner prints for a refusal.
#include <doctest/doctest.h>

#include <fstream>
#include <string>

#include "actors/auth/identity.hpp"
#include "runtime/cli/join_cmd.hpp"
#include "runtime/experiment/package.hpp"
#include "runtime/experiment/serve.hpp"
#include "support/scratch.hpp"

namespace starling::test::runtime_package_test {

using namespace starling::runtime;
namespace auth = starling::actors::auth;

namespace {

experiment_package sample() {
  experiment_package p;
  p.yaml = "experiment: {name: t, kind: dedloc}\ndedloc: {model: {files: [a.pt]}}\n";
  p.sets = {"dedloc.lr=0.01"};
  p.nodes = 2;
  p.files.push_back({"dedloc.model.files[0]", "a.pt", blake2b_256("model bytes"), 11});
  p.digest = experiment_digest(p.yaml, p.sets, p.files);
  p.endpoint = "127.0.0.1:4000";
  p.reachable = true;
  return p;
}

} // namespace

TEST_CASE("a package decodes to what was encoded, and a changed byte of its content fails the "
          "digest check") {
  auto p = sample();
  auto bytes = encode_package(p);
  REQUIRE(bytes.ok());
  auto back = decode_package(*bytes);
  REQUIRE(back.ok());
  CHECK(back->yaml == p.yaml);
  CHECK(back->sets == p.sets);
  CHECK(back->nodes == 2);
  REQUIRE(back->files.size() == 1);
  CHECK(back->files[0].key == "dedloc.model.files[0]");
  CHECK(back->files[0].size == 11);
  CHECK(back->reachable);
  CHECK(back->endpoint == "127.0.0.1:4000");
  CHECK(check_package_digest(*back).ok());
  // The YAML, an override, or a named file's digest changed on the way: the digest says so.
  auto tampered = *back;
  tampered.yaml[0] = 'E';
  CHECK_FALSE(check_package_digest(tampered).ok());
  tampered = *back;
  tampered.sets[0] = "dedloc.lr=1";
  CHECK_FALSE(check_package_digest(tampered).ok());
  tampered = *back;
  tampered.files[0].digest = blake2b_256("another model");
  CHECK_FALSE(check_package_digest(tampered).ok());
  // The host's path of a file is not part of the digest (a joiner stores it elsewhere).
  tampered = *back;
  tampered.files[0].path = "/elsewhere/a.pt";
  CHECK(check_package_digest(tampered).ok());
}

TEST_CASE("a package cut short anywhere, with a byte after it, or with a bad field is refused") {
  auto bytes = encode_package(sample());
  REQUIRE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n)
    CHECK_FALSE(decode_package(std::string_view(*bytes).substr(0, n)).ok());
  CHECK_FALSE(decode_package(*bytes + "x").ok());
  auto bad_flag = *bytes;
  // The reachability flag sits before the endpoint and the verdict (two length-prefixed strings).
  auto flag_at = bad_flag.size() - 8 - 14 - 8 - 0 - 1;
  REQUIRE((bad_flag[flag_at] == 1));
  bad_flag[flag_at] = 2;
  CHECK_FALSE(decode_package(bad_flag).ok());
  auto p = sample();
  p.signature = "short";
  CHECK_FALSE(encode_package(p).ok());
  p = sample();
  p.nodes = 0;
  auto zero = encode_package(p);
  REQUIRE(zero.ok());
  CHECK_FALSE(decode_package(*zero).ok());
  auto other = decode_package("not a package at all");
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().what.find("format line") != std::string::npos);
}

TEST_CASE("only the authority's signature of the digest and the node count verifies, and a "
          "signature file round trips") {
  auto authority = auth::key_pair::from_test_seed(7);
  auto other = auth::key_pair::from_test_seed(8);
  auto p = sample();
  auto sig = authority.sign(experiment_signing_message(p.digest, 2));
  CHECK(verify_experiment_signature(authority.public_key(), p.digest, 2, sig));
  CHECK_FALSE(verify_experiment_signature(other.public_key(), p.digest, 2, sig));
  CHECK_FALSE(verify_experiment_signature(authority.public_key(), blake2b_256("x"), 2, sig));
  // The node count is signed: a package served with another count does not verify.
  CHECK_FALSE(verify_experiment_signature(authority.public_key(), p.digest, 3, sig));
  CHECK_FALSE(verify_experiment_signature(authority.public_key(), p.digest, 1, sig));
  CHECK_FALSE(verify_experiment_signature(authority.public_key(), p.digest, 0, sig));
  // A token's signature by the same key is not an experiment's (the message is tagged).
  CHECK_FALSE(
      verify_experiment_signature(authority.public_key(), p.digest, 2, authority.sign(p.digest)));
  auto text = format_experiment_signature({p.digest, 2, sig});
  auto back = parse_experiment_signature(text);
  REQUIRE_MESSAGE(back.ok(), (back.ok() ? "" : back.error().what));
  CHECK(back->digest == p.digest);
  CHECK(back->nodes == 2);
  CHECK(back->signature == sig);
  auto many = parse_experiment_signature(format_experiment_signature({p.digest, 100000, sig}));
  REQUIRE(many.ok());
  CHECK(many->nodes == 100000);
  CHECK_FALSE(parse_experiment_signature(text.substr(1)).ok());
  CHECK_FALSE(parse_experiment_signature(text + "\n").ok());
  auto bad_hex = text;
  bad_hex[bad_hex.size() - 3] = 'z';
  CHECK_FALSE(parse_experiment_signature(bad_hex).ok());
  // Counts that are not a decimal in [1, 100000].
  for (auto n : {"0", "02", "100001", "x", "", "2 2", "-1"}) {
    auto t = text;
    auto at = t.find(" 2 ");
    REQUIRE(at != std::string::npos);
    t.replace(at + 1, 1, n);
    CHECK_MESSAGE(!parse_experiment_signature(t).ok(), n);
  }
  // The first format signed the digest alone: refused with the fix.
  auto v1 =
      "starling-experiment-signature-v1 " + auth::to_hex(p.digest) + " " + auth::to_hex(sig) + "\n";
  auto old = parse_experiment_signature(v1);
  REQUIRE_FALSE(old.ok());
  CHECK(old.error().what.find("--nodes N") != std::string::npos);
}

TEST_CASE("a node's experiment compared with the run's: each difference is named") {
  auto run = sample();
  auto mine = run;
  CHECK(describe_package_difference(mine, run).empty());
  mine.yaml += "# changed\n";
  mine.digest = experiment_digest(mine.yaml, mine.sets, mine.files);
  CHECK(describe_package_difference(mine, run).find("the file's bytes differ") !=
        std::string::npos);
  mine = run;
  mine.sets = {"dedloc.lr=0.5"};
  mine.digest = experiment_digest(mine.yaml, mine.sets, mine.files);
  auto d = describe_package_difference(mine, run);
  CHECK(d.find("here: dedloc.lr=0.5; the run: dedloc.lr=0.01") != std::string::npos);
  mine = run;
  mine.files[0].digest = blake2b_256("other");
  mine.digest = experiment_digest(mine.yaml, mine.sets, mine.files);
  CHECK(describe_package_difference(mine, run).find("named file dedloc.model.files[0] (a.pt "
                                                    "holds other bytes)") != std::string::npos);
  mine = run;
  mine.nodes = 3;
  CHECK(describe_package_difference(mine, run) ==
        "the node count differs (--nodes 3 here, 2 in the run)");
}

TEST_CASE("an experiment's named files are found with their key paths, and stored under safe "
          "names") {
  auto files = scan_named_files("experiment: {name: t}\n"
                                "swarm:\n"
                                "  model: {kind: torchscript, files: [b0.pt, dir/b1.pt], "
                                "loss_file: loss.pt}\n"
                                "  data: {kind: tokens, path: /data/tokens.bin, eval_path: \"\"}\n"
                                "dedloc: {peers: 2}\n");
  REQUIRE(files.ok());
  REQUIRE(files->size() == 4);
  CHECK((*files)[0].key == "swarm.model.files[0]");
  CHECK((*files)[1].key == "swarm.model.files[1]");
  CHECK((*files)[1].path == "dir/b1.pt");
  CHECK((*files)[2].key == "swarm.model.loss_file");
  CHECK((*files)[3].key == "swarm.data.path");
  CHECK_FALSE(scan_named_files("a: [unclosed").ok());
  named_file f{"k", "../../etc/passwd", blake2b_256("x"), 1};
  auto name = stored_file_name(f);
  CHECK(name.find('/') == std::string::npos);
  CHECK(name.substr(16) == "-passwd");
  f.path = "..";
  CHECK(stored_file_name(f).substr(16) == "-file");
  f.path = "a b$c.pt";
  CHECK(stored_file_name(f).substr(16) == "-a_b_c.pt");
}

TEST_CASE("a package made from files on disk carries their digests and a matching signature; a "
          "signature of another content or node count is refused with the fix") {
  starling::testing::scratch dir{"starling-package"};
  auto d = dir.path.string();
  {
    std::ofstream{d + "/m.pt"} << "model bytes";
    std::ofstream{d + "/e.yaml"} << "experiment: {name: t}\nx: {files: [" << d << "/m.pt]}\n";
  }
  auto p = make_package(d + "/e.yaml", {}, 3);
  REQUIRE_MESSAGE(p.ok(), (p.ok() ? "" : p.error().what));
  REQUIRE(p->files.size() == 1);
  CHECK(p->files[0].digest == blake2b_256("model bytes"));
  CHECK(p->files[0].size == 11);
  CHECK(p->signature.empty());
  auto authority = auth::key_pair::from_test_seed(3);
  {
    std::ofstream{d + "/e.yaml.sig"} << format_experiment_signature(
        {p->digest, 3, authority.sign(experiment_signing_message(p->digest, 3))});
  }
  auto signed_ = make_package(d + "/e.yaml", {}, 3);
  REQUIRE(signed_.ok());
  CHECK(
      verify_experiment_signature(authority.public_key(), signed_->digest, 3, signed_->signature));
  // The same file run with another node count: the signature does not cover it.
  auto other_count = make_package(d + "/e.yaml", {}, 2);
  REQUIRE_FALSE(other_count.ok());
  CHECK(other_count.error().what.find("for 3 nodes, and this node runs it with --nodes 2") !=
        std::string::npos);
  // The named file changed after signing.
  { std::ofstream{d + "/m.pt"} << "other bytes"; }
  auto stale = make_package(d + "/e.yaml", {}, 3);
  REQUIRE_FALSE(stale.ok());
  CHECK(stale.error().what.find("sign it again") != std::string::npos);
  auto missing = make_package(d + "/nothing.yaml", {}, 3);
  CHECK_FALSE(missing.ok());
}

TEST_CASE("a joiner is warned a minute before its token expires and leaves 30 s before; both "
          "scale down for a short token") {
  using namespace std::chrono_literals;
  auto hours = plan_token_expiry(6h);
  CHECK(hours.warn_before == 60s);
  CHECK(hours.leave_before == 30s);
  auto two_min = plan_token_expiry(120s);
  CHECK(two_min.warn_before == 60s);
  CHECK(two_min.leave_before == 30s);
  auto short_token = plan_token_expiry(30s);
  CHECK(short_token.warn_before == 15s);
  CHECK(short_token.leave_before == 7500ms);
  auto minute = plan_token_expiry(90s);
  CHECK(minute.warn_before == 45s);
  CHECK(minute.leave_before == 22500ms);
  auto gone = plan_token_expiry(-5s);
  CHECK(gone.warn_before == 0s);
  CHECK(gone.leave_before == 0s);
  CHECK(duration_text(42s) == "42 s");
  CHECK(duration_text(185s) == "3 min 05 s");
  CHECK(duration_text(6h - 60s) == "5 h 59 min");
  CHECK(duration_text(-3s) == "0 s");
}

TEST_CASE("a joiner's refusal lines name the fix") {
  CHECK(join_refusal_hint("refused (revoked): leaked").find("revoked") != std::string::npos);
  CHECK(join_refusal_hint("system_error(disconnect_during_handshake)").find("get a token") !=
        std::string::npos);
  CHECK(join_refusal_hint("refused (expired): at ...").find("expired") != std::string::npos);
  CHECK(join_refusal_hint("something else").empty());
  // Joined without a token: a closed run's refusals (TLS handshake, no token at the gate, a
  // hello that shows a token) say to get one, and how.
  for (auto line : {"system_error(disconnect_during_handshake)",
                    "node 127.0.0.1:5: refused (no_token): this run admits token holders only",
                    "a node of the closed run 'x' (its hello shows a token): it admits token "
                    "holders only"}) {
    auto hint = join_refusal_hint(line, false);
    CHECK_MESSAGE(hint.find("the run is closed: get a token from its owner") == 0, line);
    CHECK(hint.find("starling token issue --peer-key YOUR_KEY.pub") != std::string::npos);
  }
  CHECK(join_refusal_hint("cannot_connect_to_node", false).find("nothing answers") == 0);
}

} // namespace starling::test::runtime_package_test
