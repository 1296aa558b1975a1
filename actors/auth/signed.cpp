#include "actors/auth/signed.hpp"

#include <ctime>

#include <capnp/message.h>

#include "messages/auth.capnp.h"
#include "messages/wire.hpp"

namespace starling::actors::auth {

std::string pack_sealed(const sealed& s) {
  capnp::MallocMessageBuilder b;
  auto root = b.initRoot<wire::Signed>();
  root.setBody(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.body.data()), s.body.size()));
  root.setSignature(
    capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.signature.data()), s.signature.size()));
  std::vector<char> out;
  messages::write_flat(b, out);
  return std::string(out.begin(), out.end());
}

std::string seal(std::string_view domain, std::string_view body, const key_pair& key) {
  std::string msg{domain};
  msg.append(body);
  return pack_sealed(sealed{std::string{body}, key.sign(msg)});
}

checked<sealed> unseal(std::string_view bytes, size_t max_bytes, std::string_view what) {
  if (bytes.size() > max_bytes)
    return refuse(reason::malformed, std::string{what} + " of " + std::to_string(bytes.size())
                                       + " bytes exceeds " + std::to_string(max_bytes));
  sealed out;
  auto st = messages::read_flat(bytes.data(), bytes.size(), [&](capnp::MessageReader& r) -> status {
    auto root = r.getRoot<wire::Signed>();
    auto body = root.getBody();
    auto sig = root.getSignature();
    if (sig.size() != signature_bytes)
      return fail("a signature of " + std::to_string(sig.size()) + " bytes, expected 64");
    if (body.size() == 0)
      return fail("an empty body");
    out.body.assign(reinterpret_cast<const char*>(body.begin()), body.size());
    out.signature.assign(reinterpret_cast<const char*>(sig.begin()), sig.size());
    return {};
  });
  if (!st)
    return refuse(reason::malformed, std::string{what} + ": " + st.what());
  return out;
}

bool verify_sealed(std::string_view domain, const sealed& s, std::string_view public_key) {
  std::string msg{domain};
  msg.append(s.body);
  return verify_signature(public_key, msg, s.signature);
}

status check_experiment_id(std::string_view id) {
  if (id.empty() || id.size() > max_experiment_bytes)
    return fail("an experiment id has 1.." + std::to_string(max_experiment_bytes) + " bytes, got "
                + std::to_string(id.size()));
  for (unsigned char c : id)
    if (c <= ' ' || c > '~')
      return fail("an experiment id is printable ASCII without spaces");
  return {};
}

std::string format_time(int64_t unix_ns) {
  std::time_t t = static_cast<std::time_t>(unix_ns / 1'000'000'000);
  std::tm tm{};
  if (!::gmtime_r(&t, &tm))
    return std::to_string(unix_ns) + "ns";
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

} // namespace starling::actors::auth
