// Strict, path- and line-aware reading of YAML into typed option structs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "kernels/result.hpp"

namespace starling::runtime {

/// A configuration error; `what()` reads `file:line: key.path: expected ..., got "..."`.
class config_error : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A view of one YAML node with its key path and source file, for precise error messages.
/// Map readers record which keys were read; `finish()` rejects any key nobody asked for. A map
/// whose reader can fail before `finish()` for reasons a misspelt key causes (a required key
/// missing, a cross-field check on defaults) declares its keys up front with `allow()`, so the
/// misspelt key is what gets reported.
class config_node {
public:
  /// Wraps `node`, found at `path` (e.g. `stages[1]`) in `file`.
  config_node(YAML::Node node, std::string path, std::string file);

  /// True when the node exists (the key was present).
  bool present() const { return node_.IsDefined() && !node_.IsNull(); }
  bool is_map() const { return node_.IsMap(); }
  bool is_sequence() const { return node_.IsSequence(); }
  bool is_scalar() const { return node_.IsScalar(); }
  /// The key path, e.g. `swarm.stages[1].peers`.
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }
  /// 1-based source line, 0 when unknown.
  int line() const;
  /// The raw node, for code that needs yaml-cpp directly.
  const YAML::Node& raw() const { return node_; }

  /// The child under `key` (marks `key` as known). Fails if this node is not a map.
  config_node child(const std::string& key);
  /// True when this map has `key` (marks it as known).
  bool has(const std::string& key);
  /// All children of a sequence node, with `path[i]` paths.
  std::vector<config_node> items() const;
  /// All keys of a map node, marking them known (for free-form maps such as overrides).
  std::vector<std::string> keys();
  /// Declares every key this map may hold: the first other key fails now as unknown, naming
  /// the allowed ones, and `finish()` accepts all of `keys`. Does nothing on a non-map.
  void allow(const std::vector<std::string>& keys);
  /// Throws if a map node holds a key that was never asked for (nor allowed).
  void finish() const;

  /// Throws a config_error at this node: `file:line: path: message`.
  [[noreturn]] void fail(const std::string& message) const;
  /// Throws "expected <what>, got <scalar or kind>".
  [[noreturn]] void expected(const std::string& what) const;

  // -- scalar conversions (strict; throw config_error naming this node) ------------------------
  std::string as_string() const;
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;
  /// Accepts `250ms`, `2s`, `1.5min`, `1h`, `10us` or a bare number of seconds.
  std::chrono::nanoseconds as_duration() const;
  /// Accepts `512`, `64KiB`, `10MB`, `1GiB` (bytes).
  uint64_t as_bytes() const;
  /// Accepts bytes per second: `10MB/s`, `200mbit`, `1Gbit/s`, or a bare number (bytes/s).
  double as_bandwidth() const;

private:
  friend status apply_override(config_node& root, const std::string& assignment);

  /// `--set` arguments by the key path they set, shared by a root and every node under it.
  using override_map = std::map<std::string, std::string>;

  /// A node under this one: same file and overrides, fresh set of known keys.
  config_node sub(YAML::Node node, std::string path) const;
  std::string describe() const;

  YAML::Node node_;
  std::string path_;
  std::string file_;
  std::shared_ptr<std::set<std::string>> known_;
  std::shared_ptr<override_map> overrides_;
};

// -- field helpers: read an optional key into `out`, validating it -------------------------------

/// Reads a string, if present.
void read(config_node& parent, const std::string& key, std::string& out);
/// Reads a string that must be one of `choices`.
void read_choice(config_node& parent, const std::string& key, std::string& out,
                 const std::vector<std::string>& choices);
/// Reads a boolean.
void read(config_node& parent, const std::string& key, bool& out);
/// Reads an integer within [lo, hi].
void read_int(config_node& parent, const std::string& key, int64_t& out, int64_t lo,
              int64_t hi);
/// Reads a positive integer (≥ 1) into any integral type.
template <class Int>
void read_positive(config_node& parent, const std::string& key, Int& out) {
  int64_t v = static_cast<int64_t>(out);
  read_int(parent, key, v, 1, INT64_MAX);
  out = static_cast<Int>(v);
}
/// Reads a non-negative integer (≥ 0) into any integral type.
template <class Int>
void read_non_negative(config_node& parent, const std::string& key, Int& out) {
  int64_t v = static_cast<int64_t>(out);
  read_int(parent, key, v, 0, INT64_MAX);
  out = static_cast<Int>(v);
}
/// Reads a real number within [lo, hi].
void read_real(config_node& parent, const std::string& key, double& out, double lo, double hi);
/// Reads a non-negative duration.
template <class Rep, class Period>
void read_duration(config_node& parent, const std::string& key,
                   std::chrono::duration<Rep, Period>& out) {
  if (!parent.has(key))
    return;
  auto c = parent.child(key);
  auto d = c.as_duration();
  if (d.count() < 0)
    c.expected("a non-negative duration");
  out = std::chrono::duration_cast<std::chrono::duration<Rep, Period>>(d);
}
/// Reads a bandwidth (bytes/s, > 0).
void read_bandwidth(config_node& parent, const std::string& key, double& out);

/// Loads and parses a YAML file; syntax errors and a key given twice in one map become
/// config_errors with the line (yaml-cpp itself keeps both and reads the first).
config_node load_yaml_file(const std::string& path);
/// Parses YAML text (for tests and inline configs); `name` stands in for the file name.
config_node load_yaml_string(const std::string& text, const std::string& name);

/// Applies one `--set` argument `key.path=value` (e.g. `swarm.trainers=3`,
/// `swarm.stages[1].peers[0]=0.5`) to the tree under `root`: the value replaces one scalar, or
/// becomes a new key of a map that exists (read and validated later like any key). Errors the
/// reader later finds at that key name the argument instead of a file line. Fails, naming the
/// argument, on bad syntax, a path through something that is not there, or a target that is a
/// map or a list.
status apply_override(config_node& root, const std::string& assignment);

} // namespace starling::runtime
