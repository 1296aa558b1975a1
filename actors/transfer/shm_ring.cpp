#include "actors/transfer/shm_ring.hpp"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <linux/futex.h>
#include <string>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace starling::actors::transfer {

namespace {

std::string sys_error(const char* what) {
  return std::string{"shared-memory ring: "} + what + ": " + std::strerror(errno);
}

bool valid_capacity(uint64_t c) {
  return c >= ring_min_bytes && c <= ring_max_bytes && c % ring_control_bytes == 0;
}

/// Where the control words sit in the control page.
constexpr size_t tail_offset = 0;
constexpr size_t claimed_offset = 8;
constexpr size_t seq_offset = 64; // its own cache line

} // namespace

uint64_t ring_place(uint64_t next, uint64_t size, uint64_t capacity) {
  auto pos = (next + ring_align - 1) / ring_align * ring_align;
  if (pos % capacity + size > capacity)
    pos += capacity - pos % capacity;
  return pos;
}

ring_map::ring_map(int fd, uint8_t* base, uint64_t capacity)
  : fd_(fd), base_(base), data_(base + ring_control_bytes), capacity_(capacity) {}

ring_map::~ring_map() {
  ::munmap(base_, ring_control_bytes + capacity_);
  ::close(fd_);
}

std::atomic<uint64_t>& ring_map::tail() const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + tail_offset);
}

std::atomic<uint64_t>& ring_map::claimed() const {
  return *reinterpret_cast<std::atomic<uint64_t>*>(base_ + claimed_offset);
}

std::atomic<uint32_t>& ring_map::seq() const {
  return *reinterpret_cast<std::atomic<uint32_t>*>(base_ + seq_offset);
}

result<std::shared_ptr<ring_map>> ring_map::create(uint64_t capacity) {
  if (!valid_capacity(capacity))
    return fail("shared-memory ring: a capacity of " + std::to_string(capacity) + " bytes");
  int fd = ::memfd_create("starling-link-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return fail(sys_error("memfd_create"));
  auto bytes = ring_control_bytes + capacity;
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
      ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    auto why = sys_error("sizing and sealing");
    ::close(fd);
    return fail(why);
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    auto why = sys_error("mmap");
    ::close(fd);
    return fail(why);
  }
  return std::shared_ptr<ring_map>{new ring_map(fd, static_cast<uint8_t*>(p), capacity)};
}

result<std::shared_ptr<ring_map>> ring_map::adopt(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return fail("shared-memory ring: the peer's ring is not a memory file");
  }
  // Without the shrink seal the peer could cut the file under the mapping: every access past the
  // new end would then raise SIGBUS here.
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    ::close(fd);
    return fail("shared-memory ring: the peer's ring is not sealed against shrinking");
  }
  auto bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < ring_control_bytes || !valid_capacity(bytes - ring_control_bytes)) {
    ::close(fd);
    return fail("shared-memory ring: the peer's ring has " + std::to_string(bytes) + " bytes");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    auto why = sys_error("mmap of the peer's ring");
    ::close(fd);
    return fail(why);
  }
  return std::shared_ptr<ring_map>{
    new ring_map(fd, static_cast<uint8_t*>(p), bytes - ring_control_bytes)};
}

result<std::optional<uint64_t>> ring_writer::reserve(uint64_t size,
                                                     std::chrono::milliseconds timeout,
                                                     std::chrono::milliseconds grace) {
  auto cap = ring_->capacity();
  if (size == 0 || size > cap)
    return fail("shared-memory ring: a payload of " + std::to_string(size) + " bytes");
  auto pos = ring_place(next_, size, cap);
  auto start = std::chrono::steady_clock::now();
  auto deadline = start + timeout;
  auto& seq = ring_->seq();
  for (;;) {
    if (aborted_)
      return fail("stopped");
    auto s = seq.load(std::memory_order_acquire);
    // The tail first: a release follows the claim of its region, so `claimed` read after it
    // is at least as far.
    auto tail = ring_->tail().load(std::memory_order_acquire);
    auto claimed = ring_->claimed().load(std::memory_order_acquire);
    // The reader reads and releases only what this side placed: anything else is a broken peer.
    if (tail > claimed || claimed > next_ || next_ - tail > cap)
      return fail("shared-memory ring: the peer claimed up to " + std::to_string(claimed)
                  + " and released up to " + std::to_string(tail) + ", outside the payloads "
                  + "written (" + std::to_string(next_) + ")");
    if (pos + size - tail <= cap)
      break;
    auto until = deadline;
    if (claimed == next_) { // all read: the handlers hold the ring
      if (held_at_ == tail)
        return std::optional<uint64_t>{};
      until = std::min(deadline, start + grace);
      if (std::chrono::steady_clock::now() >= until) {
        held_at_ = tail;
        return std::optional<uint64_t>{};
      }
    }
    auto left = until - std::chrono::steady_clock::now();
    if (left <= std::chrono::steady_clock::duration::zero())
      return fail("timed out waiting for room in the shared-memory ring");
    auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    // Sleeps unless the reader released meanwhile (the word moved); wakes on its next release.
    ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAIT, s, &ts, nullptr, 0);
  }
  next_ = pos + size;
  held_at_.reset();
  return std::optional<uint64_t>{pos};
}

void ring_writer::abort() {
  aborted_ = true;
  auto& seq = ring_->seq();
  seq.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

ring_reader::ring_reader(std::shared_ptr<ring_map> ring) : ring_(std::move(ring)) {
  void* z = ::mmap(nullptr, ring_->capacity(), PROT_READ,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  zeros_ = z == MAP_FAILED ? nullptr : static_cast<uint8_t*>(z);
}

ring_reader::~ring_reader() {
  if (zeros_ != nullptr)
    ::munmap(zeros_, ring_->capacity());
}

status ring_reader::claim(uint64_t pos, uint64_t size) {
  auto cap = ring_->capacity();
  std::lock_guard<std::mutex> guard{mu_};
  if (size == 0 || size > cap)
    return fail("shared-memory ring: a payload of " + std::to_string(size)
                + " bytes in a ring of " + std::to_string(cap));
  auto expected = ring_place(next_, size, cap);
  if (pos != expected)
    return fail("shared-memory ring: a payload claimed at " + std::to_string(pos)
                + ", where only " + std::to_string(expected) + " can be");
  held_.push_back({pos, pos + size, false});
  next_ = pos + size;
  ring_->claimed().store(next_, std::memory_order_release);
  auto& seq = ring_->seq();
  seq.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
  return {};
}

void ring_reader::release(uint64_t pos) {
  {
    std::lock_guard<std::mutex> guard{mu_};
    bool moved = false;
    uint64_t tail = 0;
    for (auto& r : held_)
      if (r.start == pos && !r.released) {
        r.released = true;
        break;
      }
    while (!held_.empty() && held_.front().released) {
      tail = held_.front().end;
      held_.pop_front();
      moved = true;
    }
    if (!moved)
      return;
    // Under the lock: two releases on two threads store their positions in order.
    ring_->tail().store(tail, std::memory_order_release);
  }
  auto& seq = ring_->seq();
  seq.fetch_add(1, std::memory_order_acq_rel);
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&seq), FUTEX_WAKE, INT_MAX, nullptr, nullptr,
            0);
}

} // namespace starling::actors::transfer
