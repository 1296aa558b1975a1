// Every message type that may cross a node boundary is registered here, in one place.
#pragma once

namespace caf {
class actor_system_config;
} // namespace caf

namespace starling::messages {

/// Registers all starling message types (with their wire names) in a CAF system config.
/// Every node must call this: an unregistered type is silently dropped by a remote receiver.
void register_types(caf::actor_system_config& cfg);

} // namespace starling::messages
