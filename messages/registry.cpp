#include "messages/registry.hpp"

#include <cstdint>
#include <vector>

#include <caf/actor_system_config.hpp>

#include "messages/averager.hpp"
#include "messages/swarm.hpp"
#include "messages/dht.hpp"
#include "messages/chunked.hpp"
#include "messages/direct.hpp"
#include "messages/metrics.hpp"
#include "messages/tensor_msg.hpp"
#include "messages/types.hpp"
#include "messages/vi.hpp"

namespace starling::messages {

void register_types(caf::actor_system_config& cfg) {
  // Keep one line per type; the string is the wire name and must never change.
  cfg.add_message_type<ping_msg>("starling.ping");
  cfg.add_message_type<blob_msg>("starling.blob");
  cfg.add_message_type<tensor_msg>("starling.tensor");
  cfg.add_message_type<stage_forward>("starling.stage_forward");
  cfg.add_message_type<stage_backward>("starling.stage_backward");
  cfg.add_message_type<stage_backward_reply>("starling.stage_backward_reply");
  cfg.add_message_type<stage_state>("starling.stage_state");
  cfg.add_message_type<stage_state_part>("starling.stage_state_part");
  cfg.add_message_type<vi_vector>("starling.vi_vector");
  cfg.add_message_type<vi_uplink>("starling.vi_uplink");
  cfg.add_message_type<vi_downlink>("starling.vi_downlink");
  cfg.add_message_type<vi_report>("starling.vi_report");
  cfg.add_message_type<dht_peer>("starling.dht_peer");
  cfg.add_message_type<dht_record>("starling.dht_record");
  cfg.add_message_type<std::vector<dht_peer>>("starling.dht_peer_list");
  cfg.add_message_type<std::vector<dht_record>>("starling.dht_record_list");
  cfg.add_message_type<dht_request>("starling.dht_request");
  cfg.add_message_type<dht_response>("starling.dht_response");
  cfg.add_message_type<dht_put>("starling.dht_put");
  cfg.add_message_type<dht_put_result>("starling.dht_put_result");
  cfg.add_message_type<dht_get_result>("starling.dht_get_result");
  cfg.add_message_type<dht_stats>("starling.dht_stats");
  cfg.add_message_type<chunk_msg>("starling.chunk");
  cfg.add_message_type<chunk_ack_msg>("starling.chunk_ack");
  cfg.add_message_type<direct_announce>("starling.direct_announce");
  cfg.add_message_type<direct_endpoint>("starling.direct_endpoint");
  cfg.add_message_type<transfer_report>("starling.transfer_report");
  cfg.add_message_type<tensor_list>("starling.tensor_list");
  cfg.add_message_type<average_result>("starling.average_result");
  cfg.add_message_type<avg_join>("starling.avg_join");
  cfg.add_message_type<avg_join_reply>("starling.avg_join_reply");
  cfg.add_message_type<avg_leave>("starling.avg_leave");
  cfg.add_message_type<avg_group>("starling.avg_group");
  cfg.add_message_type<avg_chunk>("starling.avg_chunk");
  cfg.add_message_type<avg_ack>("starling.avg_ack");
  cfg.add_message_type<metric_event>("starling.metric_event");
  // Counter lists: a stage peer's `(status_atom)` reply, a board's peers per stage.
  cfg.add_message_type<std::vector<uint64_t>>("starling.u64_list");
}

} // namespace starling::messages
