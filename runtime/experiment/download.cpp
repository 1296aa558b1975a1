#include "runtime/experiment/download.hpp"

#include <memory>
#include <optional>
#include <string>

#include <caf/all.hpp>

namespace starling::runtime {

result<actors::collab::downloaded_state> download_state(finish_context& ctx,
                                                        actors::collab::donor_source donors,
                                                        actors::collab::download_options opts,
                                                        std::chrono::nanoseconds wait) {
  // Shared with the download's actor, which may outlive the wait.
  auto got = std::make_shared<std::optional<actors::collab::downloaded_state>>();
  auto why = std::make_shared<std::string>("no answer in time");
  ctx.run(
    [=](caf::event_based_actor* self) {
      actors::collab::fetch_state(
        self, donors, opts,
        [=](actors::collab::downloaded_state d) {
          *got = std::move(d);
          self->quit();
        },
        [=](const std::string& w) {
          *why = w;
          self->quit();
        });
    },
    wait);
  if (!got->has_value())
    return fail(*why);
  return std::move(**got);
}

} // namespace starling::runtime
