// `starling dht`: a standalone DHT node, and get/store against a running one.
#pragma once

#include <chrono>
#include <string>

namespace starling::runtime {

/// Runs a DHT node listening on `listen`, joined through `join` (`HOST:PORT`, may be empty),
/// until SIGINT/SIGTERM. Returns the exit code.
int cmd_dht_serve(const std::string& listen, const std::string& join);

/// Reads `key` through the DHT node at `node` (`HOST:PORT`) and prints its records.
/// Exit code 0 when found, 1 when not found, 2 on errors.
int cmd_dht_get(const std::string& node, const std::string& key);

/// Stores `value` (as a sub-key when `subkey` is non-empty) for `ttl` (e.g. `60s`, `5m`,
/// `500ms`) through the DHT node at `node`. Exit code 0 when at least one replica accepted it.
int cmd_dht_store(const std::string& node, const std::string& key, const std::string& value,
                  const std::string& subkey, const std::string& ttl);

/// Parses a duration like `60s`, `5m`, `2h`, `500ms` or `30` (seconds); false if malformed.
bool parse_ttl(const std::string& text, std::chrono::nanoseconds& out);

} // namespace starling::runtime
