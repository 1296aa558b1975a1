// check_payload: every payload kind checked without torch (what the fuzzer runs).
#include "messages/chunked.hpp"
#include "messages/dht.hpp"
#include "messages/direct.hpp"
#include "messages/envelope.hpp"
#include "messages/metrics.hpp"
#include "messages/types.hpp"
#include "messages/vi.hpp"
#include "messages/wire.hpp"

namespace starling::messages {

namespace {

template <class T>
status decode_as(const payload_reader& p) {
  T x;
  return wire_codec<T>::read(p, x);
}

} // namespace

status check_payload(const payload_reader& p) {
  using P = wire::Envelope::Payload;
  auto r = p.get();
  switch (r.which()) {
    case P::TENSOR: {
      if (!r.hasTensor())
        return {};
      tensor_view v;
      return read_tensor(r.getTensor(), v);
    }
    case P::PING:
      return decode_as<ping_msg>(p);
    case P::BLOB:
      return decode_as<blob_msg>(p);
    case P::METRIC:
      return decode_as<metric_event>(p);
    case P::DHT:
      switch (r.getDht().which()) {
        case wire::DhtMessage::REQUEST:
          return decode_as<dht_request>(p);
        case wire::DhtMessage::RESPONSE:
          return decode_as<dht_response>(p);
        case wire::DhtMessage::PUT:
          return decode_as<dht_put>(p);
        case wire::DhtMessage::PUT_RESULT:
          return decode_as<dht_put_result>(p);
        case wire::DhtMessage::GET_RESULT:
          return decode_as<dht_get_result>(p);
        case wire::DhtMessage::STATS:
          return decode_as<dht_stats>(p);
        case wire::DhtMessage::PEER:
          return decode_as<dht_peer>(p);
        case wire::DhtMessage::RECORD:
          return decode_as<dht_record>(p);
      }
      return fail("unknown DHT payload");
    case P::VI:
      switch (r.getVi().which()) {
        case wire::ViMessage::VECTOR:
          return decode_as<vi_vector>(p);
        case wire::ViMessage::UPLINK:
          return decode_as<vi_uplink>(p);
        case wire::ViMessage::DOWNLINK:
          return decode_as<vi_downlink>(p);
        case wire::ViMessage::REPORT:
          return decode_as<vi_report>(p);
      }
      return fail("unknown MASHA payload");
    case P::TRANSFER:
      switch (r.getTransfer().which()) {
        case wire::TransferMessage::ANNOUNCE:
          return decode_as<direct_announce>(p);
        case wire::TransferMessage::ENDPOINT:
          return decode_as<direct_endpoint>(p);
        case wire::TransferMessage::REPORT:
          return decode_as<transfer_report>(p);
        case wire::TransferMessage::CHUNK:
          return decode_as<chunk_msg>(p);
        case wire::TransferMessage::CHUNK_ACK:
          return decode_as<chunk_ack_msg>(p);
      }
      return fail("unknown transfer payload");
    case P::AVERAGER:
      return check_averager(r.getAverager(), true);
    case P::STAGE:
      return check_stage(r.getStage(), true);
  }
  return fail("unknown payload " + std::to_string(static_cast<int>(r.which())));
}

} // namespace starling::messages
