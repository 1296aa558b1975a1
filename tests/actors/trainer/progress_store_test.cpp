// The progress store: a trainer's done batches kept by name, written to its folder as they
// change and read back by a store started later in the same folder (a resumed run); a file that
// does not parse stops the store with the reason (its batches would be trained twice).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include <caf/all.hpp>

#include "actors/trainer/progress_store.hpp"
#include "kernels/data/batch_progress.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"
#include "tests/support/node_fixtures.hpp"

namespace starling::test::actors_progress_store_test {

using namespace std::chrono_literals;
using starling::actors::trainer::progress_store_options;
using starling::actors::trainer::read_progress_dir;
using starling::actors::trainer::spawn_progress_store;

namespace {

/// A store's answer to `(get_atom, name)`, parsed; nothing when it has none for `name`.
std::optional<kernels::batch_progress> progress_of(caf::actor_system& sys, const caf::actor& store,
                                                   const std::string& name) {
  caf::scoped_actor self{sys};
  std::optional<kernels::batch_progress> out;
  self->request(store, 5s, get_atom::value, name)
      .receive(
          [&](const std::string& bytes) {
            if (bytes.empty())
              return;
            auto p = kernels::batch_progress::parse(bytes);
            REQUIRE(p);
            out = std::move(*p);
          },
          [&](caf::error& e) { FAIL("get failed: " << sys.render(e)); });
  return out;
}

void done(const caf::actor& store, const std::string& name, uint64_t total, uint64_t batch) {
  caf::anon_send(store, put_atom::value, name, total, batch);
}

} // namespace

TEST_CASE("the progress store keeps done batches, writes them and a later store reads them") {
  testing::temp_dir dir{"starling-progress"};
  auto folder = dir.path + "/progress";
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  std::vector<std::string> warnings;
  progress_store_options o;
  o.dir = folder;
  o.on_warning = [&](const std::string& w) { warnings.push_back(w); };
  auto store = spawn_progress_store(sys, o);
  CHECK(!progress_of(sys, store, "trainer.0"));
  done(store, "trainer.0", 10, 0);
  done(store, "trainer.0", 10, 1);
  done(store, "trainer.0", 10, 4);
  done(store, "trainer.0", 10, 12); // beyond the total: not progress
  done(store, "../evil", 10, 3);    // kept, but never a file outside the folder
  auto p = progress_of(sys, store, "trainer.0");
  REQUIRE(p);
  CHECK(p->total() == 10);
  CHECK(p->done_count() == 3);
  CHECK(p->done(4));
  CHECK(!p->done(2));
  CHECK(progress_of(sys, store, "../evil")->done(3));
  // Another total (a run continued with more microbatches): the done batches below it stay.
  done(store, "trainer.0", 20, 15);
  CHECK(progress_of(sys, store, "trainer.0")->done_count() == 4);
  caf::anon_send_exit(store, caf::exit_reason::user_shutdown);
  auto files = read_progress_dir(folder);
  REQUIRE(files);
  REQUIRE(files->size() == 1);
  CHECK(files->at("trainer.0").total() == 20);
  CHECK(files->at("trainer.0").done_count() == 4);
  // A store started later in the same folder takes the progress up.
  auto later = spawn_progress_store(sys, o);
  auto again = progress_of(sys, later, "trainer.0");
  REQUIRE(again);
  CHECK(*again == files->at("trainer.0"));
  CHECK(warnings.empty());
  caf::anon_send_exit(later, caf::exit_reason::user_shutdown);
}

TEST_CASE("a progress file that does not parse stops the store with the reason") {
  testing::temp_dir dir{"starling-progress"};
  std::ofstream{dir.path + "/trainer.1.progress"} << "not a progress file";
  CHECK(!read_progress_dir(dir.path));
  caf::actor_system_config cfg;
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  std::string why;
  progress_store_options o;
  o.dir = dir.path;
  o.on_error = [&](const std::string& w) { why = w; };
  auto store = spawn_progress_store(sys, o);
  caf::scoped_actor self{sys};
  self->monitor(store);
  caf::error reason;
  self->receive([&](caf::down_msg& d) { reason = d.reason; });
  CHECK(why.find("trainer.1.progress") != std::string::npos);
  CHECK(sys.render(reason).find("trainer.1.progress") != std::string::npos);
  CHECK(read_progress_dir(dir.path + "/absent").value().empty()); // no folder: no progress
}

} // namespace starling::test::actors_progress_store_test
