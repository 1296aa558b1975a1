// `starling key`, `starling authority`, `starling token` and `starling deny`: node keys, the run's
// authority, tokens and the deny list (actors/auth does the work; this is the command line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
} // namespace CLI

namespace starling::runtime {

/// The membership subcommands, added to the CLI app; `run` executes whichever was parsed.
class auth_commands {
public:
  /// Adds `key init`, `authority init`, `authority sign-experiment`, `token issue`, `token show`
  /// and `deny` to `app`.
  explicit auth_commands(CLI::App& app);

  /// The exit code of the subcommand that was parsed, or nothing when none of these was.
  std::optional<int> run() const;

private:
  int key_init() const;
  int authority_init() const;
  int token_issue() const;
  int token_show() const;
  int deny_add() const;
  int sign_experiment() const;

  CLI::App* key_init_ = nullptr;
  CLI::App* authority_init_ = nullptr;
  CLI::App* token_issue_ = nullptr;
  CLI::App* token_show_ = nullptr;
  CLI::App* deny_ = nullptr;
  CLI::App* sign_experiment_ = nullptr;
  std::string out_;
  std::string experiment_;
  std::string authority_dir_;
  std::string peer_key_file_;
  std::string roles_;
  std::string expires_ = "6h";
  std::string token_file_;
  std::string token_id_hex_;
  std::string reason_;
  std::string for_;
  std::vector<std::string> push_;
  bool push_plain_ = false;
  std::string experiment_file_;
  std::vector<std::string> sets_;
  uint64_t nodes_ = 0;
};

/// Parses a duration: a whole number and a unit (`ms`, `s`, `m`, `h`, `d`; none = seconds).
bool parse_duration(const std::string& text, int64_t& out_ns);

} // namespace starling::runtime
