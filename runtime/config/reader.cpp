#include "runtime/config/reader.hpp"

#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>

#include "runtime/config/asked_keys.hpp"

namespace starling::runtime {

namespace {

std::string lower(std::string s) {
  for (auto& c : s)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos)
    return {};
  auto e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

/// Splits `12.5ms` into (12.5, "ms"); false if the number part does not parse.
bool split_number_unit(const std::string& text, double& value, std::string& unit) {
  auto s = trim(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.'
                          || s[i] == '-' || s[i] == '+' || s[i] == 'e' || s[i] == 'E')) {
    // Stop at an 'e' that starts a unit rather than an exponent.
    if ((s[i] == 'e' || s[i] == 'E')
        && (i + 1 >= s.size() || !(std::isdigit(static_cast<unsigned char>(s[i + 1]))
                                   || s[i + 1] == '-' || s[i + 1] == '+')))
      break;
    ++i;
  }
  if (i == 0)
    return false;
  auto num = s.substr(0, i);
  char* end = nullptr;
  value = std::strtod(num.c_str(), &end);
  if (end != num.c_str() + num.size() || !std::isfinite(value))
    return false;
  unit = lower(trim(s.substr(i)));
  return true;
}

/// The path of `key` inside the map at `parent` (`swarm` + `trainers` = `swarm.trainers`).
std::string key_path(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

} // namespace

config_node::config_node(YAML::Node node, std::string path, std::string file)
  : node_(std::move(node)),
    path_(std::move(path)),
    file_(std::move(file)),
    known_(std::make_shared<std::set<std::string>>()),
    overrides_(std::make_shared<override_map>()) {
  // nop
}

config_node config_node::sub(YAML::Node node, std::string path) const {
  config_node out{std::move(node), std::move(path), file_};
  out.overrides_ = overrides_;
  return out;
}

int config_node::line() const {
  if (!node_.IsDefined())
    return 0;
  auto m = node_.Mark();
  return m.line >= 0 ? m.line + 1 : 0;
}

void config_node::fail(const std::string& message) const {
  // A value from the command line has no line in the file: name the argument instead.
  if (auto o = overrides_->find(path_); o != overrides_->end())
    throw config_error(fmt::format("--set {}: {}", o->second, message));
  auto l = line();
  auto where = l > 0 ? fmt::format("{}:{}", file_, l) : file_;
  if (path_.empty())
    throw config_error(fmt::format("{}: {}", where, message));
  throw config_error(fmt::format("{}: {}: {}", where, path_, message));
}

std::string config_node::describe() const {
  if (!node_.IsDefined() || node_.IsNull())
    return "nothing";
  if (node_.IsMap())
    return "a map";
  if (node_.IsSequence())
    return "a list";
  return fmt::format("\"{}\"", node_.Scalar());
}

void config_node::expected(const std::string& what) const {
  fail(fmt::format("expected {}, got {}", what, describe()));
}

config_node config_node::child(const std::string& key) {
  if (!node_.IsMap())
    expected(fmt::format("a map with key '{}'", key));
  known_->insert(key);
  const YAML::Node& self = node_; // const access: a lookup must not insert the key
  auto out = sub(self[key], key_path(path_, key));
  if (asked_keys::recording())
    asked_keys::record(out.path_);
  return out;
}

bool config_node::has(const std::string& key) {
  if (!node_.IsMap())
    return false;
  known_->insert(key);
  if (asked_keys::recording())
    asked_keys::record(key_path(path_, key));
  const YAML::Node& self = node_;
  auto n = self[key];
  return n.IsDefined() && !n.IsNull();
}

std::vector<config_node> config_node::items() const {
  if (!node_.IsSequence())
    expected("a list");
  std::vector<config_node> out;
  size_t i = 0;
  for (auto it = node_.begin(); it != node_.end(); ++it, ++i)
    out.push_back(sub(*it, fmt::format("{}[{}]", path_, i)));
  return out;
}

std::vector<std::string> config_node::keys() {
  if (!node_.IsMap())
    expected("a map");
  if (asked_keys::recording())
    asked_keys::record_free_form(path_);
  std::vector<std::string> out;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    out.push_back(it->first.Scalar());
    known_->insert(out.back());
  }
  return out;
}

void config_node::allow(const std::vector<std::string>& keys) {
  if (!node_.IsMap())
    return;
  if (asked_keys::recording())
    for (auto& k : keys)
      asked_keys::record(key_path(path_, k));
  known_->insert(keys.begin(), keys.end());
  finish();
}

void config_node::finish() const {
  if (!node_.IsMap())
    return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    auto key = it->first.Scalar();
    if (known_->count(key) == 0) {
      std::string known;
      for (auto& x : *known_)
        known += (known.empty() ? "" : ", ") + x;
      sub(it->first, key_path(path_, key))
        .fail(fmt::format("unknown key (allowed here: {})", known.empty() ? "none" : known));
    }
  }
}

std::string config_node::as_string() const {
  if (!node_.IsScalar())
    expected("a string");
  return node_.Scalar();
}

bool config_node::as_bool() const {
  if (node_.IsScalar()) {
    auto s = lower(node_.Scalar());
    if (s == "true" || s == "yes" || s == "on")
      return true;
    if (s == "false" || s == "no" || s == "off")
      return false;
  }
  expected("true or false");
}

int64_t config_node::as_int() const {
  if (node_.IsScalar()) {
    const auto& s = node_.Scalar();
    int64_t v = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec == std::errc{} && p == s.data() + s.size())
      return v;
  }
  expected("an integer");
}

double config_node::as_double() const {
  if (node_.IsScalar()) {
    const auto& s = node_.Scalar();
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(v))
      return v;
  }
  expected("a number");
}

std::chrono::nanoseconds config_node::as_duration() const {
  double v = 0;
  std::string unit;
  if (node_.IsScalar() && split_number_unit(node_.Scalar(), v, unit)) {
    double scale = 0;
    if (unit.empty() || unit == "s" || unit == "sec")
      scale = 1e9;
    else if (unit == "ms")
      scale = 1e6;
    else if (unit == "us")
      scale = 1e3;
    else if (unit == "ns")
      scale = 1;
    else if (unit == "min" || unit == "m")
      scale = 60e9;
    else if (unit == "h")
      scale = 3600e9;
    if (scale > 0)
      return std::chrono::nanoseconds{static_cast<int64_t>(std::llround(v * scale))};
  }
  expected("a duration such as 250ms, 2s, 1.5min or 1h");
}

uint64_t config_node::as_bytes() const {
  double v = 0;
  std::string unit;
  if (node_.IsScalar() && split_number_unit(node_.Scalar(), v, unit) && v >= 0) {
    double scale = 0;
    if (unit.empty() || unit == "b")
      scale = 1;
    else if (unit == "kb")
      scale = 1e3;
    else if (unit == "mb")
      scale = 1e6;
    else if (unit == "gb")
      scale = 1e9;
    else if (unit == "kib")
      scale = 1024.0;
    else if (unit == "mib")
      scale = 1024.0 * 1024;
    else if (unit == "gib")
      scale = 1024.0 * 1024 * 1024;
    if (scale > 0)
      return static_cast<uint64_t>(std::llround(v * scale));
  }
  expected("a size such as 512, 64KiB, 10MB or 1GiB");
}

double config_node::as_bandwidth() const {
  double v = 0;
  std::string unit;
  if (node_.IsScalar() && split_number_unit(node_.Scalar(), v, unit) && v > 0) {
    if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "/s") == 0)
      unit.resize(unit.size() - 2);
    else if (unit.size() > 2 && unit.compare(unit.size() - 2, 2, "ps") == 0)
      unit.resize(unit.size() - 2);
    double scale = 0;
    if (unit.empty() || unit == "b")
      scale = 1;
    else if (unit == "kb")
      scale = 1e3;
    else if (unit == "mb")
      scale = 1e6;
    else if (unit == "gb")
      scale = 1e9;
    else if (unit == "kbit")
      scale = 1e3 / 8;
    else if (unit == "mbit")
      scale = 1e6 / 8;
    else if (unit == "gbit")
      scale = 1e9 / 8;
    if (scale > 0)
      return v * scale;
  }
  expected("a positive bandwidth such as 10MB/s, 200mbit or 1Gbit/s");
}

void read(config_node& parent, const std::string& key, std::string& out) {
  if (parent.has(key))
    out = parent.child(key).as_string();
}

void read_choice(config_node& parent, const std::string& key, std::string& out,
                 const std::vector<std::string>& choices) {
  if (!parent.has(key))
    return;
  auto c = parent.child(key);
  auto v = c.is_scalar() ? c.as_string() : std::string{};
  for (auto& x : choices)
    if (x == v) {
      out = v;
      return;
    }
  std::string list;
  for (auto& x : choices)
    list += (list.empty() ? "" : " | ") + x;
  c.expected("one of " + list);
}

void read(config_node& parent, const std::string& key, bool& out) {
  if (parent.has(key))
    out = parent.child(key).as_bool();
}

void read_int(config_node& parent, const std::string& key, int64_t& out, int64_t lo,
              int64_t hi) {
  if (!parent.has(key))
    return;
  auto c = parent.child(key);
  std::string what;
  if (lo == 1 && hi == INT64_MAX)
    what = "a positive integer";
  else if (lo == 0 && hi == INT64_MAX)
    what = "a non-negative integer";
  else
    what = fmt::format("an integer in [{}, {}]", lo, hi);
  int64_t v = 0;
  try {
    v = c.as_int();
  } catch (const config_error&) {
    c.expected(what);
  }
  if (v < lo || v > hi)
    c.expected(what);
  out = v;
}

void read_real(config_node& parent, const std::string& key, double& out, double lo, double hi) {
  if (!parent.has(key))
    return;
  auto c = parent.child(key);
  auto what = fmt::format("a number in [{}, {}]", lo, hi);
  double v = 0;
  try {
    v = c.as_double();
  } catch (const config_error&) {
    c.expected(what);
  }
  if (v < lo || v > hi)
    c.expected(what);
  out = v;
}

void read_bandwidth(config_node& parent, const std::string& key, double& out) {
  if (parent.has(key))
    out = parent.child(key).as_bandwidth();
}

namespace {

/// Deeper than any experiment file; only a recursive alias (`&a [*a]`) gets there.
constexpr int max_depth = 128;

/// Rejects a key given twice in one map anywhere under `n` (found at `path`), in document order.
void check_duplicate_keys(const YAML::Node& n, const std::string& path, const std::string& file,
                          int depth) {
  if (depth > max_depth)
    throw config_error(fmt::format("{}: {}: nested more than {} levels deep (a recursive alias?)",
                                   file, path, max_depth));
  if (n.IsMap()) {
    std::map<std::string, int> first_line;
    for (auto it = n.begin(); it != n.end(); ++it) {
      const auto& key = it->first;
      auto sub = key_path(path, key.Scalar());
      if (key.IsScalar()) {
        auto line = key.Mark().line + 1;
        auto [first, fresh] = first_line.emplace(key.Scalar(), line);
        if (!fresh)
          throw config_error(fmt::format("{}:{}: {}: given twice (first at line {})", file, line,
                                         sub, first->second));
      }
      check_duplicate_keys(it->second, sub, file, depth + 1);
    }
  } else if (n.IsSequence()) {
    size_t i = 0;
    for (auto it = n.begin(); it != n.end(); ++it, ++i)
      check_duplicate_keys(*it, fmt::format("{}[{}]", path, i), file, depth + 1);
  }
}

config_node parse(const std::string& text, const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    auto l = e.mark.line >= 0 ? e.mark.line + 1 : 0;
    throw config_error(fmt::format("{}:{}: invalid YAML: {}", name, l, e.msg));
  }
  check_duplicate_keys(root, "", name, 0);
  return config_node{root, "", name};
}

/// One step of a `--set` path: a map key, or a list index.
struct path_step {
  std::string key;
  size_t index = 0;
  bool is_index = false;
};

/// Splits `a.b[1].c` into steps; false on bad syntax (empty keys, `a..b`, `a[x]`, `[0]` first).
bool parse_path(const std::string& text, std::vector<path_step>& out) {
  bool want_key = true; // at the start and after a '.'
  size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == '[') {
      auto close = text.find(']', i);
      if (want_key || close == std::string::npos || close == i + 1)
        return false;
      path_step st;
      st.is_index = true;
      auto [p, ec] = std::from_chars(text.data() + i + 1, text.data() + close, st.index);
      if (ec != std::errc{} || p != text.data() + close)
        return false;
      out.push_back(st);
      i = close + 1;
    } else if (c == '.') {
      if (want_key)
        return false;
      want_key = true;
      ++i;
    } else {
      if (!want_key)
        return false;
      auto end = text.find_first_of(".[]", i);
      if (end == std::string::npos)
        end = text.size();
      path_step st;
      st.key = text.substr(i, end - i);
      for (char k : st.key)
        if (std::isspace(static_cast<unsigned char>(k)))
          return false;
      if (st.key.empty())
        return false;
      out.push_back(st);
      want_key = false;
      i = end;
    }
  }
  return !out.empty() && !want_key;
}

} // namespace

config_node load_yaml_file(const std::string& path) {
  std::ifstream in{path};
  if (!in)
    throw config_error(fmt::format("{}: cannot open the file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

config_node load_yaml_string(const std::string& text, const std::string& name) {
  return parse(text, name);
}

status apply_override(config_node& root, const std::string& assignment) {
  auto eq = assignment.find('=');
  std::vector<path_step> steps;
  if (eq == std::string::npos || !parse_path(trim(assignment.substr(0, eq)), steps))
    return fail(fmt::format("--set: expected KEY.PATH=VALUE (e.g. swarm.trainers=3 or "
                            "swarm.stages[1].peers[0]=0.5), got \"{}\"",
                            assignment));
  auto value = trim(assignment.substr(eq + 1));
  auto bad = [&](const std::string& why) {
    return fail(fmt::format("--set {}: {}", assignment, why));
  };
  YAML::Node cur = root.node_; // a handle: rebinding it with reset() leaves the tree alone
  std::string at = root.path_;
  for (size_t k = 0; k < steps.size(); ++k) {
    const auto& st = steps[k];
    bool last = k + 1 == steps.size();
    const YAML::Node& here = cur; // const access: a lookup must not insert the key
    auto next_at = st.is_index ? fmt::format("{}[{}]", at, st.index) : key_path(at, st.key);
    if (st.is_index) {
      if (!cur.IsSequence())
        return bad(fmt::format("{} is not a list", at));
      if (st.index >= cur.size())
        return bad(fmt::format("{} has {} item{}, so no [{}]", at, cur.size(),
                               cur.size() == 1 ? "" : "s", st.index));
    } else {
      if (!cur.IsMap())
        return bad(at.empty() ? std::string{"the file is not a map"}
                              : fmt::format("{} is not a map", at));
      if (!here[st.key].IsDefined()) {
        if (!last)
          return bad(fmt::format("{} is not in the file (--set adds only the last key of a "
                                 "path, to a map that is)",
                                 next_at));
        cur[st.key] = value; // a new key: the readers validate it like any other
        (*root.overrides_)[next_at] = assignment;
        return {};
      }
    }
    YAML::Node next = st.is_index ? here[st.index] : here[st.key];
    if (last) {
      if (next.IsMap() || next.IsSequence())
        return bad(fmt::format("{} is a {}; --set replaces one value", next_at,
                               next.IsMap() ? "map" : "list"));
      next = value; // assigns the scalar in place (same node, so the tree sees it)
      (*root.overrides_)[next_at] = assignment;
      return {};
    }
    cur.reset(next);
    at = next_at;
  }
  return {};
}

} // namespace starling::runtime
