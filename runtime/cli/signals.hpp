// SIGINT/SIGTERM for long-running commands (`starling node`, `starling dht --listen`).
//
// Why not block the signals and `sigwait`: libraries start threads before `main` (OpenBLAS's
// thread pool does, from a shared-library constructor), and a process-directed signal goes to any
// thread that does not block it, where the default action kills the process. A handler is
// process-wide instead: whichever thread takes the signal writes its number into a self-pipe, and
// a waiter reads it.
#pragma once

namespace starling::runtime {

/// Installs the handlers (idempotent). Call before starting anything long-running.
void install_shutdown_signals();

/// Blocks until SIGINT or SIGTERM arrives (returns its number) or `wake_shutdown_waiter` was
/// called (returns 0).
int wait_for_shutdown_signal();

/// Waits at most `timeout_ms` for SIGINT or SIGTERM: its number, or -1 when none came.
int poll_shutdown_signal(int timeout_ms);

/// Wakes a thread blocked in `wait_for_shutdown_signal` without a signal.
void wake_shutdown_waiter();

} // namespace starling::runtime
