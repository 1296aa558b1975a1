#include "runtime/config/asked_keys.hpp"

#include <cctype>
#include <mutex>

namespace starling::runtime::asked_keys {

namespace {

/// What was recorded: paths with indices already as `[]`, free-form maps' normalized paths.
struct recorder_state {
  std::mutex mtx;
  std::set<std::string> paths;
  std::set<std::string> free_form;
};

recorder_state& state() {
  static recorder_state s;
  return s;
}

/// `a[3].b[12]` -> `a[].b[]`.
std::string drop_indices(const std::string& path) {
  std::string out;
  out.reserve(path.size());
  for (size_t i = 0; i < path.size(); ++i) {
    out += path[i];
    if (path[i] == '[') {
      while (i + 1 < path.size() && std::isdigit(static_cast<unsigned char>(path[i + 1])))
        ++i;
    }
  }
  return out;
}

/// Replaces each key that follows a free-form map's path with `*` (`free` holds normalized
/// paths, so the walk compares the normalized prefix built so far).
std::string star_free_form(const std::string& path, const std::set<std::string>& free) {
  if (free.empty())
    return path;
  std::string out;
  size_t i = 0;
  while (i <= path.size()) {
    auto dot = path.find('.', i);
    if (dot == std::string::npos)
      dot = path.size();
    auto segment = path.substr(i, dot - i);
    if (!out.empty() && free.count(out) > 0) {
      // Keep a trailing `[]` (a list under a named key), replace the name.
      auto bracket = segment.find('[');
      segment = "*" + (bracket == std::string::npos ? std::string{} : segment.substr(bracket));
    }
    out += (out.empty() ? "" : ".") + segment;
    i = dot + 1;
  }
  return out;
}

} // namespace

void start() {
  auto& s = state();
  std::lock_guard<std::mutex> guard{s.mtx};
  s.paths.clear();
  s.free_form.clear();
  detail::on.store(true);
}

void stop() {
  detail::on.store(false);
}

void record(const std::string& path) {
  if (!recording())
    return;
  auto p = drop_indices(path);
  auto& s = state();
  std::lock_guard<std::mutex> guard{s.mtx};
  s.paths.insert(std::move(p));
}

void record_free_form(const std::string& path) {
  if (!recording())
    return;
  auto& s = state();
  std::lock_guard<std::mutex> guard{s.mtx};
  s.free_form.insert(star_free_form(drop_indices(path), s.free_form));
}

std::set<std::string> recorded() {
  auto& s = state();
  std::lock_guard<std::mutex> guard{s.mtx};
  std::set<std::string> out;
  for (auto& p : s.paths)
    out.insert(star_free_form(p, s.free_form));
  return out;
}

std::string normalize(const std::string& path) {
  auto& s = state();
  std::lock_guard<std::mutex> guard{s.mtx};
  return star_free_form(drop_indices(path), s.free_form);
}

} // namespace starling::runtime::asked_keys
