// The membership commands end to end through the `starling` binary: an authority, a node key,
// a token issued for it, shown, verified and revoked; mistakes give one line and exit code 2.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <sys/stat.h>

#include "runtime/cli/auth_cmd.hpp"
#include "support/subprocess.hpp"
#include "tests/support/node_fixtures.hpp"
#include "support/paths.hpp"

namespace starling::test::runtime_auth_cmd_test {

using starling::testing::subprocess;

namespace {

/// Scratch folders of these tests.
struct temp_dir : starling::testing::temp_dir {
  temp_dir() : starling::testing::temp_dir("starling-cli") {}
};

/// Runs `starling ARGS...`; returns (exit code, output).
std::pair<int, std::string> run_cli(std::vector<std::string> args) {
  args.insert(args.begin(), STARLING_BINARY);
  subprocess p{args};
  while (p.read_line(std::chrono::seconds(20)))
    ;
  auto rc = p.wait_exit(std::chrono::seconds(20));
  REQUIRE(rc);
  return {*rc, p.output()};
}

} // namespace

TEST_CASE("authority init, key init, token issue, show and deny work from the command line") {
  temp_dir dir;
  auto auth = dir.path + "/auth";
  auto [rc, out] = run_cli({"authority", "init", "--out", auth, "--experiment", "cli-run"});
  INFO(out);
  REQUIRE(rc == 0);
  CHECK(out.find("experiment cli-run") != std::string::npos);
  auto [rc2, out2] = run_cli({"key", "init", "--out", dir.path + "/node.key"});
  REQUIRE(rc2 == 0);
  CHECK(out2.find("created node key") != std::string::npos);
  struct stat st {};
  REQUIRE(::stat((dir.path + "/node.key").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  auto tok = dir.path + "/node.token";
  auto [rc3, out3] = run_cli({"token", "issue", "--authority", auth, "--peer-key",
                               dir.path + "/node.key.pub", "--role", "trainer,stage", "--expires",
                               "6h", "--out", tok});
  INFO(out3);
  REQUIRE(rc3 == 0);
  auto [rc4, out4] = run_cli({"token", "show", tok, "--authority", auth});
  CHECK(rc4 == 0);
  CHECK(out4.find("roles trainer,stage") != std::string::npos);
  CHECK(out4.find("valid for cli-run") != std::string::npos);

  auto id_line = out4.substr(out4.find("token id ") + 9, 32);
  auto [rc5, out5] = run_cli({"deny", "--authority", auth, "--token-id", id_line, "--reason",
                               "lost laptop"});
  INFO(out5);
  CHECK(rc5 == 0);
  auto [rc6, out6] = run_cli({"token", "show", tok, "--authority", auth});
  CHECK(rc6 == 1);
  CHECK(out6.find("refused (revoked)") != std::string::npos);
}

TEST_CASE("the membership commands refuse mistakes in one line with exit code 2") {
  temp_dir dir;
  auto auth = dir.path + "/auth";
  REQUIRE(run_cli({"authority", "init", "--out", auth}).first == 0);
  CHECK(run_cli({"authority", "init", "--out", auth}).first == 2); // never replaced
  REQUIRE(run_cli({"key", "init", "--out", dir.path + "/n.key"}).first == 0);
  auto issue = [&](const std::string& key, const std::string& role, const std::string& exp) {
    return run_cli({"token", "issue", "--authority", auth, "--peer-key", key, "--role", role,
                     "--expires", exp, "--out", dir.path + "/t"});
  };
  auto secret = issue(dir.path + "/n.key", "trainer", "6h");
  CHECK(secret.first == 2);
  CHECK(secret.second.find("secret key never leaves") != std::string::npos);
  auto typo = issue(dir.path + "/n.key.pub", "trainr", "6h");
  CHECK(typo.first == 2);
  CHECK(typo.second.find("unknown role 'trainr'") != std::string::npos);
  CHECK(issue(dir.path + "/n.key.pub", "trainer", "6y").first == 2);
  ::chmod((dir.path + "/n.key").c_str(), 0644);
  auto open = run_cli({"key", "init", "--out", dir.path + "/n.key"});
  CHECK(open.first == 2);
  CHECK(open.second.find("chmod 600") != std::string::npos);
}

TEST_CASE("durations take ms, s, m, h and d and refuse anything else") {
  int64_t ns = 0;
  CHECK(starling::runtime::parse_duration("6h", ns));
  CHECK(ns == int64_t{6} * 3600 * 1'000'000'000);
  CHECK(starling::runtime::parse_duration("7d", ns));
  CHECK(ns == int64_t{7} * 86400 * 1'000'000'000);
  CHECK(starling::runtime::parse_duration("90", ns));
  CHECK(ns == int64_t{90} * 1'000'000'000);
  CHECK_FALSE(starling::runtime::parse_duration("6y", ns));
  CHECK_FALSE(starling::runtime::parse_duration("h", ns));
  CHECK_FALSE(starling::runtime::parse_duration("0s", ns));
  CHECK_FALSE(starling::runtime::parse_duration("9999999999h", ns));
}

} // namespace starling::test::runtime_auth_cmd_test
