#include "messages/registry.hpp"

#include <caf/actor_system_config.hpp>

#include "messages/chunked.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/types.hpp"

namespace starling::messages {

void register_types(caf::actor_system_config& cfg) {
  // Keep one line per type; the string is the wire name and must never change.
  cfg.add_message_type<ping_msg>("starling.ping");
  cfg.add_message_type<blob_msg>("starling.blob");
  cfg.add_message_type<tensor_msg>("starling.tensor");
  cfg.add_message_type<chunk_msg>("starling.chunk");
  cfg.add_message_type<chunk_ack_msg>("starling.chunk_ack");
}

} // namespace starling::messages
