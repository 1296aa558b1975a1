#include "actors/transfer/chunked.hpp"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "messages/atoms.hpp"
#include "messages/chunked.hpp"
#include "messages/tensor_msg.hpp"

namespace starling::actors::transfer {

using messages::chunk_ack_msg;
using messages::chunk_msg;
using messages::tensor_msg;

namespace {

struct outgoing {
  /// The encoded payload, left in its Cap'n Proto builder: chunks are ranges of it, copied
  /// only by CAF's serializer (messages::chunk_source).
  std::shared_ptr<const messages::chunk_source> payload;
  uint64_t total = 0;
  caf::actor receiver;
  uint32_t count = 0;
  uint32_t next = 0; // next chunk to send
  caf::response_promise promise;
};

struct sender_state {
  uint64_t next_id = 1;
  std::map<uint64_t, outgoing> transfers;
  static inline const char* name = "chunk_sender";
};

caf::error transfer_error(std::string what) {
  return caf::make_error(caf::sec::runtime_error, "chunked transfer: " + std::move(what));
}

void send_chunk(caf::stateful_actor<sender_state>* self, uint64_t id, outgoing& t,
                uint64_t chunk_bytes) {
  auto begin = static_cast<uint64_t>(t.next) * chunk_bytes;
  auto end = std::min<uint64_t>(t.total, begin + chunk_bytes);
  chunk_msg m;
  m.transfer_id = id;
  m.index = t.next++;
  m.count = t.count;
  m.total_bytes = t.total;
  m.source = t.payload;
  m.offset = begin;
  m.length = end - begin;
  self->send(t.receiver, std::move(m));
}

caf::behavior sender(caf::stateful_actor<sender_state>* self, chunked_options opts) {
  opts.chunk_bytes = std::max<uint64_t>(1, opts.chunk_bytes);
  opts.window = std::max<uint32_t>(1, opts.window);
  self->set_down_handler([self](caf::down_msg& dm) {
    for (auto i = self->state.transfers.begin(); i != self->state.transfers.end();) {
      if (i->second.receiver.address() == dm.source) {
        i->second.promise.deliver(transfer_error("the receiver is down"));
        i = self->state.transfers.erase(i);
      } else {
        ++i;
      }
    }
  });
  return {
      [self, opts](transfer_atom, tensor_msg& x, caf::actor receiver) -> caf::result<uint64_t> {
        if (!receiver)
          return transfer_error("no receiver");
        auto payload = messages::encode_tensor_source(x);
        if (!payload)
          return transfer_error(payload.error().what);
        auto total = (*payload)->size();
        auto count = (total + opts.chunk_bytes - 1) / opts.chunk_bytes;
        if (count == 0 || count > UINT32_MAX)
          return transfer_error("a payload of " + std::to_string(total) +
                                " bytes does not fit 1 .. 2^32-1 chunks");
        auto id = self->state.next_id++;
        auto& t = self->state.transfers[id];
        t.payload = std::move(*payload);
        t.total = total;
        t.receiver = receiver;
        t.count = static_cast<uint32_t>(count);
        t.promise = self->make_response_promise();
        self->monitor(receiver);
        while (t.next < t.count && t.next < opts.window)
          send_chunk(self, id, t, opts.chunk_bytes);
        return t.promise;
      },
      [self, opts](chunk_ack_msg& a) {
        // An ack whose envelope was refused names no transfer (ids start at 1; the refusal is
        // counted by the wire context): the transfer it was for ends at its timeout.
        if (!a.wire_error.empty())
          return;
        auto i = self->state.transfers.find(a.transfer_id);
        if (i == self->state.transfers.end())
          return; // already finished or failed
        auto& t = i->second;
        if (!a.error.empty()) {
          t.promise.deliver(transfer_error("the receiver reports: " + a.error));
        } else if (a.done) {
          if (a.index + 1 == t.count && t.next == t.count)
            t.promise.deliver(t.total);
          else
            t.promise.deliver(transfer_error("the receiver finished at chunk " +
                                             std::to_string(a.index) + " of " +
                                             std::to_string(t.count)));
        } else {
          if (t.next < t.count)
            send_chunk(self, a.transfer_id, t, opts.chunk_bytes);
          return;
        }
        self->demonitor(t.receiver);
        self->state.transfers.erase(i);
      },
  };
}

struct incoming {
  std::vector<char> bytes;
  uint64_t total = 0; // announced by the first chunk
  uint32_t count = 0;
  uint32_t next = 0; // index expected next
};

} // namespace

caf::behavior chunk_receiver_behavior(caf::event_based_actor* self, caf::actor sink,
                                      receiver_options opts) {
  using key_type = std::pair<caf::actor_addr, uint64_t>;
  auto transfers = std::make_shared<std::map<key_type, incoming>>();
  return {
      [self, sink, opts, transfers](chunk_msg& m) {
        auto from = caf::actor_cast<caf::actor>(self->current_sender());
        if (!from)
          return; // nobody to ack
        auto key = std::make_pair(from.address(), m.transfer_id);
        auto reply = [&](bool done, std::string error) {
          self->send(from, chunk_ack_msg{m.transfer_id, m.index, done, std::move(error)});
        };
        // A chunk whose envelope was refused is answered with the reason, never stored.
        if (!m.wire_error.empty())
          return reply(true, m.wire_error);
        auto i = transfers->find(key);
        if (i == transfers->end()) {
          if (m.index != 0)
            return reply(true, "chunk " + std::to_string(m.index) + " of an unknown transfer");
          if (m.count == 0 || m.total_bytes > opts.max_bytes)
            return reply(true, "refused a transfer of " + std::to_string(m.total_bytes) +
                                   " bytes in " + std::to_string(m.count) + " chunks (limit " +
                                   std::to_string(opts.max_bytes) + " bytes)");
          i = transfers->emplace(key, incoming{}).first;
          i->second.bytes.reserve(m.total_bytes);
          i->second.total = m.total_bytes;
          i->second.count = m.count;
        }
        auto& t = i->second;
        std::string error;
        if (m.index != t.next || m.count != t.count || m.total_bytes != t.total)
          error = "expected chunk " + std::to_string(t.next) + " of " + std::to_string(t.count) +
                  ", got " + std::to_string(m.index) + " of " + std::to_string(m.count);
        else if (m.size() > t.total - t.bytes.size())
          error = "chunks exceed the announced " + std::to_string(t.total) + " bytes";
        else if (m.index + 1 == t.count && t.bytes.size() + m.size() != t.total)
          error =
              "the last chunk leaves the payload short of " + std::to_string(t.total) + " bytes";
        if (!error.empty()) {
          transfers->erase(i);
          return reply(true, std::move(error));
        }
        // From another node the bytes arrive in `m.bytes`; from this one, as the sender's range.
        m.view([&](const char* p, size_t n) {
          t.bytes.insert(t.bytes.end(), p, p + n);
          return caf::error{};
        });
        ++t.next;
        if (t.next < t.count)
          return reply(false, {});
        tensor_msg x;
        auto bytes = std::move(t.bytes);
        transfers->erase(i);
        // An fp32 payload becomes the tensor's storage: no decode copy.
        auto st = messages::load_tensor(std::move(bytes), x);
        if (!st)
          return reply(true, st.what());
        self->send(sink, std::move(x));
        reply(true, {});
      },
  };
}

caf::actor spawn_chunk_sender(caf::actor_system& sys, chunked_options opts) {
  return sys.spawn(sender, opts);
}

caf::actor spawn_chunk_receiver(caf::actor_system& sys, caf::actor sink, receiver_options opts) {
  return sys.spawn(chunk_receiver_behavior, std::move(sink), opts);
}

} // namespace starling::actors::transfer
