// A node's view of the shared stage board: announcements reach the board, and the board's peer
// lists come back with every handle through the view (as it is without one).
#include <doctest/doctest.h>

#include <caf/all.hpp>

#include "actors/stage/board.hpp"
#include "actors/stage/board_view.hpp"
#include "messages/atoms.hpp"
#include "messages/registry.hpp"

namespace starling::test::actors_board_view_test {

TEST_CASE("a board view forwards announcements and lists peers as its node sees them") {
  caf::actor_system_config cfg;
  cfg.set("scheduler.policy", caf::atom("testing"));
  cfg.set("logger.inline-output", true);
  messages::register_types(cfg);
  caf::actor_system sys{cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto run = [&] {
    while (sched.run() > 0) {
    }
  };
  auto idle = [](caf::event_based_actor*) -> caf::behavior { return {[](stop_atom) {}}; };
  auto board = actors::stage::spawn_board(sys, 2);
  auto peer = sys.spawn(idle);
  auto proxy = sys.spawn(idle); // what the viewing node reaches `peer` through
  actors::stage::board_view_options o;
  o.board = board;
  o.view = [&](const caf::actor& a) { return a == peer ? proxy : caf::actor{}; };
  auto view = actors::stage::spawn_board_view(sys, o);
  auto raw = actors::stage::spawn_board_view(sys, {board, {}});
  caf::anon_send(view, put_atom::value, uint64_t{1}, std::string{"s1p0"}, peer);
  run();
  std::map<std::string, std::vector<caf::actor>> seen;
  auto client = sys.spawn([&, view, raw](caf::event_based_actor* self) {
    for (auto [name, whom] : {std::pair{"view", view}, std::pair{"raw", raw}})
      self->request(whom, caf::infinite, get_atom::value, uint64_t{1})
          .then(
              [&, name = std::string{name}](std::vector<std::string>& names,
                                            std::vector<caf::actor>& handles) {
                CHECK(names == std::vector<std::string>{"s1p0"});
                seen[name] = handles;
              },
              [](caf::error&) { FAIL("the board view failed"); });
  });
  run();
  CHECK(seen["view"] == std::vector<caf::actor>{proxy});
  CHECK(seen["raw"] == std::vector<caf::actor>{peer});
  for (auto& a : {board, peer, proxy, view, raw, client})
    caf::anon_send_exit(a, caf::exit_reason::kill);
  run();
}

} // namespace starling::test::actors_board_view_test
