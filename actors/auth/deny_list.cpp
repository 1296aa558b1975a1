#include "actors/auth/deny_list.hpp"

#include <capnp/message.h>

#include "messages/auth.capnp.h"
#include "messages/wire.hpp"

namespace starling::actors::auth {

namespace {

inline constexpr uint16_t deny_format_version = 1;

status check_entry(const deny_entry& e) {
  auto expected = e.kind == deny_entry::kind_t::token ? size_t{16} : public_key_bytes;
  if (e.id.size() != expected)
    return fail("a deny entry names a " + std::string{e.kind == deny_entry::kind_t::token
                                                        ? "token by its 16-byte id"
                                                        : "peer by its 32-byte key"}
                + ", got " + std::to_string(e.id.size()) + " bytes");
  if (e.reason.size() > max_deny_reason_bytes)
    return fail("a deny reason has at most 256 bytes, got " + std::to_string(e.reason.size()));
  for (char c : e.reason)
    if (c == '\n' || c == '\r' || c == '\0')
      return fail("a deny reason is one line");
  if (e.until_ns < 0 || e.added_at_ns < 0)
    return fail("deny entry times are Unix nanoseconds >= 0");
  return {};
}

} // namespace

const deny_entry* deny_list::revoked(std::string_view token_id, int64_t now_ns) const {
  for (auto& e : entries)
    if (e.kind == deny_entry::kind_t::token && e.id == token_id && e.active(now_ns))
      return &e;
  return nullptr;
}

const deny_entry* deny_list::banned(std::string_view peer_key, int64_t now_ns) const {
  for (auto& e : entries)
    if (e.kind == deny_entry::kind_t::peer && e.id == peer_key && e.active(now_ns))
      return &e;
  return nullptr;
}

result<std::string> encode_deny_list(const deny_list& list, const key_pair& authority) {
  if (auto st = check_experiment_id(list.experiment); !st)
    return fail(st.what());
  if (list.entries.size() > max_deny_entries)
    return fail("a deny list holds at most 65536 entries");
  for (auto& e : list.entries)
    if (auto st = check_entry(e); !st)
      return fail(st.what());
  capnp::MallocMessageBuilder b;
  auto body = b.initRoot<wire::DenyListBody>();
  body.setFormatVersion(deny_format_version);
  body.setExperimentId(list.experiment);
  body.setSerial(list.serial);
  body.setIssuedAtNs(list.issued_at_ns);
  auto es = body.initEntries(static_cast<unsigned>(list.entries.size()));
  for (unsigned i = 0; i < list.entries.size(); ++i) {
    auto& e = list.entries[i];
    auto w = es[i];
    w.setKind(static_cast<uint8_t>(e.kind));
    w.setId(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(e.id.data()), e.id.size()));
    w.setReason(e.reason);
    w.setAddedAtNs(e.added_at_ns);
    w.setUntilNs(e.until_ns);
  }
  auto& pk = authority.public_key();
  body.setAuthorityKey(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(pk.data()), pk.size()));
  std::vector<char> flat;
  messages::write_flat(b, flat);
  return seal(deny_domain, std::string_view(flat.data(), flat.size()), authority);
}

namespace {

checked<deny_list> decode_deny_list_body(const sealed& s) {
  deny_list out;
  auto st = messages::read_flat(s.body.data(), s.body.size(), [&](capnp::MessageReader& r) -> status {
    auto b = r.getRoot<wire::DenyListBody>();
    if (b.getFormatVersion() != deny_format_version)
      return fail("deny list format " + std::to_string(b.getFormatVersion()) + ", expected 1");
    auto exp = b.getExperimentId();
    out.experiment.assign(exp.begin(), exp.size());
    if (auto st = check_experiment_id(out.experiment); !st)
      return st;
    out.serial = b.getSerial();
    out.issued_at_ns = b.getIssuedAtNs();
    if (out.issued_at_ns < 0)
      return fail("a negative issue time");
    auto ak = b.getAuthorityKey();
    if (ak.size() != public_key_bytes)
      return fail("an authority key of " + std::to_string(ak.size()) + " bytes, expected 32");
    out.authority_key.assign(reinterpret_cast<const char*>(ak.begin()), ak.size());
    auto es = b.getEntries();
    if (es.size() > max_deny_entries)
      return fail("more than 65536 entries");
    out.entries.reserve(es.size());
    for (auto e : es) {
      deny_entry d;
      if (e.getKind() > 1)
        return fail("deny entry kind " + std::to_string(e.getKind()) + " (expected 0 or 1)");
      d.kind = static_cast<deny_entry::kind_t>(e.getKind());
      auto id = e.getId();
      d.id.assign(reinterpret_cast<const char*>(id.begin()), id.size());
      auto why = e.getReason();
      d.reason.assign(why.begin(), why.size());
      d.added_at_ns = e.getAddedAtNs();
      d.until_ns = e.getUntilNs();
      if (auto st = check_entry(d); !st)
        return st;
      out.entries.push_back(std::move(d));
    }
    return {};
  });
  if (!st)
    return refuse(reason::malformed, "deny list: " + st.what());
  return out;
}

} // namespace

checked<deny_list> decode_deny_list(std::string_view bytes) {
  auto s = unseal(bytes, max_deny_list_bytes, "deny list");
  if (!s)
    return s.error();
  return decode_deny_list_body(*s);
}

checked<deny_list> verify_deny_list(std::string_view bytes, const trust_anchor& trust) {
  auto s = unseal(bytes, max_deny_list_bytes, "deny list");
  if (!s)
    return s.error();
  auto list = decode_deny_list_body(*s);
  if (!list)
    return list;
  if (trust.open())
    return refuse(reason::wrong_authority, "an open run has no authority to sign deny lists");
  if (list->authority_key != trust.authority_key)
    return refuse(reason::wrong_authority, "deny list signed by authority "
                                             + to_hex(list->authority_key).substr(0, 16)
                                             + ", this run's is "
                                             + to_hex(trust.authority_key).substr(0, 16));
  if (!verify_sealed(deny_domain, *s, trust.authority_key))
    return refuse(reason::forged, "the deny list's signature does not verify");
  if (list->experiment != trust.experiment)
    return refuse(reason::foreign_experiment, "deny list of experiment '" + list->experiment
                                                + "', this run is '" + trust.experiment + "'");
  return list;
}

} // namespace starling::actors::auth
