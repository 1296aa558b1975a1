#include "actors/collab/shell.hpp"

#include "actors/dht/signing.hpp"

namespace starling::actors::collab {

std::string record_id(const std::string& address, const std::string& node_key) {
  if (node_key.empty())
    return address;
  return address + "|" + dht::owner_marker(node_key);
}

std::string address_of_id(const std::string& id) {
  return id.substr(0, id.find('|'));
}

std::pair<std::vector<progress_entry>, bool> progress_entries(const messages::dht_get_result& r,
                                                              const std::string& own_id) {
  std::vector<progress_entry> entries;
  bool others = false;
  for (auto& rec : r.records)
    if (rec.has_subkey) {
      others = others || rec.subkey != own_id;
      entries.push_back({rec.subkey, rec.value, static_cast<double>(rec.expiration_ns) / 1e9});
    }
  return {std::move(entries), others};
}

} // namespace starling::actors::collab
