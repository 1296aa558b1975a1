#include "actors/trainer/progress_store.hpp"

#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <caf/all.hpp>
#include <fmt/format.h>

#include "actors/auth/authority.hpp"
#include "messages/atoms.hpp"

namespace starling::actors::trainer {

namespace {

/// Whether `name` can be a file name as it is (letters, digits, '_', '-', '.'; no leading '.').
bool plain_file_name(const std::string& name) {
  if (name.empty() || name[0] == '.')
    return false;
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
      return false;
  return true;
}

struct progress_store_state {
  static constexpr const char* name = "progress_store";
  progress_store_options opts;
  std::map<std::string, kernels::batch_progress> done;
  /// Whether the failed write was reported already.
  bool warned = false;
};

using store_actor = caf::stateful_actor<progress_store_state>;

void put(store_actor* self, const std::string& name, uint64_t total, uint64_t batch) {
  auto& st = self->state;
  auto i = st.done.find(name);
  if (i == st.done.end())
    i = st.done.emplace(name, kernels::batch_progress{total}).first;
  else if (i->second.total() != total)
    i->second = i->second.resized(total);
  auto fresh = i->second.mark_done(batch); // a batch beyond the total is not progress
  if (st.opts.dir.empty() || !fresh || !*fresh || !plain_file_name(name))
    return;
  auto written = auth::write_file_atomically(st.opts.dir + "/" + name + ".progress",
                                             i->second.serialize(), 0644);
  if (!written && !st.warned) {
    st.warned = true;
    if (st.opts.on_warning)
      st.opts.on_warning(
          fmt::format("progress not saved (a resumed run would redo batches): {}", written.what()));
  }
}

caf::behavior progress_store(store_actor* self, progress_store_options opts) {
  auto& st = self->state;
  st.opts = std::move(opts);
  if (!st.opts.dir.empty()) {
    auto saved = read_progress_dir(st.opts.dir);
    if (!saved) {
      if (st.opts.on_error)
        st.opts.on_error(saved.error().what);
      self->quit(caf::make_error(caf::sec::invalid_argument, saved.error().what));
      return {};
    }
    st.done = std::move(*saved);
    std::error_code ec;
    std::filesystem::create_directories(st.opts.dir, ec);
  }
  return {
      [=](get_atom, const std::string& name) -> std::string {
        auto& done = self->state.done;
        auto i = done.find(name);
        return i == done.end() ? std::string{} : i->second.serialize();
      },
      [=](put_atom, const std::string& name, uint64_t total, uint64_t batch) {
        put(self, name, total, batch);
      },
  };
}

} // namespace

caf::actor spawn_progress_store(caf::actor_system& sys, progress_store_options opts) {
  return sys.spawn(progress_store, std::move(opts));
}

result<std::map<std::string, kernels::batch_progress>> read_progress_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::map<std::string, kernels::batch_progress> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    return out;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".progress")
      continue;
    std::ifstream in{e.path(), std::ios::binary};
    std::string bytes{std::istreambuf_iterator<char>{in}, {}};
    auto p = kernels::batch_progress::parse(bytes);
    if (!p)
      return fail(fmt::format("progress file {}: {}", e.path().string(), p.error().what));
    out.emplace(e.path().stem().string(), std::move(*p));
  }
  return out;
}

} // namespace starling::actors::trainer
