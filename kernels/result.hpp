// A value or a reason it could not be produced; the error type of CAF-free code (kernels).
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace starling {

/// Why an operation failed, in words that say what was expected and what came.
struct failure {
  std::string what;
};

/// Either a `T` or a `failure`. Actors convert a failure into a `caf::error` at their boundary.
template <class T>
class result {
public:
  result(T value) : v_(std::move(value)) {}
  result(failure f) : v_(std::move(f)) {}

  /// True when a value is held.
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  /// The failure; only valid when `!ok()`.
  const failure& error() const { return std::get<1>(v_); }

private:
  std::variant<T, failure> v_;
};

/// `result` for operations that produce nothing but may fail.
class status {
public:
  status() = default;
  status(failure f) : err_(std::move(f.what)), failed_(true) {}
  bool ok() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return ok(); }
  const std::string& what() const noexcept { return err_; }

private:
  std::string err_;
  bool failed_ = false;
};

/// Shorthand to build a failure from a formatted message.
inline failure fail(std::string what) {
  return failure{std::move(what)};
}

} // namespace starling
