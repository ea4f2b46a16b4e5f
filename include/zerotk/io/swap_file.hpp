#pragma once
/// \file zerotk/io/swap_file.hpp
/// SwapFile: one scratch file of a fixed size, read and written in aligned regions, asynchronously.
/// The offload store for Offload<Nvme> keeps each rank's optimizer state in one (offload/nvme.hpp).
///
///   io::SwapFile f(dir, "zerotk_optim.r0.main", bytes, aio);   // created, space reserved
///   auto t = f.write(offset, buffer, n);                        // returns at once
///   ...                                                          // compute meanwhile
///   f.wait(t);                                                   // io_error if it failed
///
/// Opening: the file is created (O_CREAT | O_EXCL, under a name unique to this process) in `dir`,
/// which must exist and be writable (a missing or unwritable directory is an io_error naming it:
/// a typo must not put the state on another disk). It is opened with O_DIRECT (past the page
/// cache, as DeepSpeed's aio does); where the file system refuses O_DIRECT (older tmpfs and some
/// network file systems: EINVAL) it is opened buffered instead and a line on stderr says so, once
/// per process. aio.use_direct = false opens it buffered without trying. direct() and backend()
/// (together: info()) report which path runs. Its whole size is reserved with fallocate, so a disk too small fails here, with
/// ENOSPC, instead of in the middle of a step; where fallocate is unsupported the file is sized
/// with ftruncate (sparse). The file is removed when the SwapFile is destroyed; one that cannot be
/// (the directory turned read-only) is named on stderr and in swap_files_left_behind().
///
/// Transfers: offsets, lengths and buffer addresses are multiples of kDirectAlign (4096); a
/// transfer is split into requests of aio.block_size bytes and handed to an io_uring queue
/// (io/uring_queue.hpp) or, where io_uring is unavailable, a pread/pwrite thread pool
/// (io/io_queue.hpp) of queue_depth x intra_op_parallelism threads.
///
/// check_present() tells whether the file is still there at its full size: a file truncated
/// under the run is an io_error naming it; a file unlinked under the run is still read and
/// written through the open descriptor (POSIX keeps an unlinked inode alive while it is open),
/// so that is reported only through `unlinked()`.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/io/aio_options.hpp"
#include "zerotk/io/io_queue.hpp"
#include "zerotk/io/uring_queue.hpp"

namespace zerotk::io {

/// How one swap file is read and written: its path, O_DIRECT or buffered, and the I/O back end
/// ("io_uring" or "pread/pwrite thread pool").
struct SwapFileInfo {
  std::filesystem::path path;
  bool direct = false;
  std::string backend;
};

namespace detail {
inline std::string errno_text(int err) { return std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")"; }
/// A unique suffix per SwapFile of this process (two engines on one rank share a directory).
inline std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  return std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}
/// The swap files this process could not remove, in order (see swap_files_left_behind()).
struct LeftBehind {
  std::mutex mutex;
  std::vector<std::filesystem::path> paths;
};
inline LeftBehind& left_behind() {
  static LeftBehind l;
  return l;
}
inline void say_buffered_once(const std::filesystem::path& dir) {
  static std::atomic<bool> said{false};
  if (!said.exchange(true)) {
    std::fprintf(stderr,
                 "zerotk: %s does not support O_DIRECT (tmpfs or a network file system?); swap files there use "
                 "buffered I/O (correct, slower, and the data passes through the page cache)\n",
                 dir.string().c_str());
  }
}
}  // namespace detail

/// The swap files this process created but could not remove when their SwapFile (the engine's NVMe
/// offload store) was destroyed: the swap directory turned read-only under the run, or the name was
/// taken by something else. Each is also named on stderr at that moment, with its size and the
/// system's reason, so that no file is left behind silently; remove them by hand.
inline std::vector<std::filesystem::path> swap_files_left_behind() {
  detail::LeftBehind& l = detail::left_behind();
  const std::lock_guard lock(l.mutex);
  return l.paths;
}

class SwapFile {
 public:
  using Ticket = IoQueue::Ticket;

  /// Creates `<dir>/<stem>.<pid>.<n>.swap` of `bytes` bytes (rounded up to kDirectAlign).
  SwapFile(const std::filesystem::path& dir, const std::string& stem, std::uint64_t bytes, const AioOptions& aio)
      : aio_(aio), bytes_(direct_round(bytes)) {
    aio_.check();
    std::error_code ec;
    const auto status = std::filesystem::status(dir, ec);
    if (!std::filesystem::exists(status)) {
      throw io_error("the swap directory (nvme_path) does not exist", dir.string(),
                     ec ? ec.message() : std::string("missing"));
    }
    if (!std::filesystem::is_directory(status)) {
      throw io_error("the swap directory (nvme_path) is not a directory", dir.string());
    }
    path_ = dir / (stem + "." + detail::unique_suffix() + ".swap");
    // Created buffered, then switched to O_DIRECT: an open(O_CREAT | O_DIRECT) that the file system
    // refuses with EINVAL has already created the file (ramfs does this), while F_SETFL fails with
    // nothing to undo.
    fd_ = open(0);
    if (fd_ < 0) {
      const int err = errno;
      throw io_error("cannot create the swap file", path_.string(), detail::errno_text(err));
    }
    try {
      if (aio_.use_direct) {  // (use_direct = false: buffered as asked, nothing to say)
        const int flags = ::fcntl(fd_, F_GETFL);
        direct_ = flags >= 0 && ::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0;
        if (!direct_) {
          const int err = errno;
          if (err != EINVAL) throw io_error("cannot open the swap file for O_DIRECT", path_.string(), detail::errno_text(err));
          detail::say_buffered_once(dir);
        }
      }
      reserve();
      if (aio_.use_uring) queue_ = make_uring_queue(fd_, path_.string(), aio_);
      if (!queue_) {
        const int threads = std::min(64, aio_.queue_depth * aio_.intra_op_parallelism);
        queue_ = std::make_unique<ThreadPoolQueue>(fd_, path_.string(), threads);
      }
    } catch (...) {
      discard();
      throw;
    }
  }
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;
  ~SwapFile() {
    queue_.reset();  // joins the workers: nothing touches the descriptor afterwards
    discard();
  }

  /// Reads `n` bytes at `offset` into `buffer` (all multiples of kDirectAlign).
  Ticket read(std::uint64_t offset, std::byte* buffer, std::size_t n) { return transfer(false, offset, buffer, n); }
  /// Writes `n` bytes from `buffer` at `offset`.
  Ticket write(std::uint64_t offset, const std::byte* buffer, std::size_t n) {
    return transfer(true, offset, const_cast<std::byte*>(buffer), n);  // never written through
  }
  /// Blocks until `t` is done; io_error naming file:offset and errno text if it failed.
  void wait(Ticket t) { queue_->wait(t); }
  void wait_quietly(Ticket t) noexcept { queue_->wait_quietly(t); }

  /// io_error if the file is shorter than its reserved size (truncated under the run).
  void check_present() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw io_error("fstat failed", path_.string(), detail::errno_text(errno));
    if (static_cast<std::uint64_t>(st.st_size) < bytes_) {
      throw io_error("the swap file was truncated under the run: the optimizer state it held is lost (load a "
                     "checkpoint or a state to go on)",
                     path_.string() + ":" + std::to_string(st.st_size), std::to_string(st.st_size) + " of " +
                                                                              std::to_string(bytes_) + " bytes");
    }
  }
  /// Restores the reserved size after a truncation (the lost bytes read as zeros until rewritten).
  void ensure_size() {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw io_error("fstat failed", path_.string(), detail::errno_text(errno));
    if (static_cast<std::uint64_t>(st.st_size) < bytes_) restore_size();
  }
  void restore_size() {
    if (::ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      throw io_error("ftruncate failed", path_.string(), detail::errno_text(errno));
    }
  }
  /// Whether the file's name was removed under the run (the data stays reachable through the
  /// open descriptor until the SwapFile is destroyed).
  bool unlinked() const noexcept {
    struct stat st {};
    return ::fstat(fd_, &st) == 0 && st.st_nlink == 0;
  }

  const std::filesystem::path& path() const noexcept { return path_; }
  std::uint64_t bytes() const noexcept { return bytes_; }
  bool direct() const noexcept { return direct_; }
  const char* backend() const noexcept { return queue_->backend(); }
  SwapFileInfo info() const { return {path_, direct_, backend()}; }
  const AioOptions& aio() const noexcept { return aio_; }

 private:
  int open(int extra) const {
    int fd;
    do {
      fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | extra, 0600);
    } while (fd < 0 && errno == EINTR);
    return fd;
  }

  void reserve() {
    int r;
    do {
      r = ::fallocate(fd_, 0, 0, static_cast<off_t>(bytes_));
    } while (r != 0 && errno == EINTR);
    if (r == 0) return;
    const int err = errno;
    if (err != EOPNOTSUPP && err != ENOSYS) {
      throw io_error("cannot reserve the swap file's space (fallocate of " + std::to_string(bytes_) + " bytes)",
                     path_.string() + ":0", detail::errno_text(err));
    }
    restore_size();
  }

  // Closes and removes the file. A removal that fails cannot throw from a destructor, and must not
  // pass silently either (a full disk of stale swap files is found much later): it is named on
  // stderr and kept for swap_files_left_behind(). A file already gone (removed under the run) is fine.
  void discard() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    std::filesystem::remove(path_, ec);
    if (!ec) return;
    try {
      detail::LeftBehind& l = detail::left_behind();
      const std::lock_guard lock(l.mutex);
      l.paths.push_back(path_);
    } catch (...) {  // out of memory: the line below still names it
    }
    std::fprintf(stderr, "zerotk: warning: the swap file %s (%llu bytes) could not be removed (%s, errno %d); it is left behind: remove it by hand\n",
                 path_.c_str(), static_cast<unsigned long long>(bytes_), std::strerror(ec.value()), ec.value());
  }

  Ticket transfer(bool write, std::uint64_t offset, std::byte* buffer, std::size_t n) {
    requests_.clear();
    for (std::size_t done = 0; done < n;) {
      const std::size_t len = std::min(aio_.block_size, n - done);
      IoRequest r;
      r.write = write;
      r.buffer = buffer + done;
      r.bytes = len;
      r.offset = offset + done;
      requests_.push_back(r);
      done += len;
    }
    return queue_->submit(requests_);
  }

  AioOptions aio_;
  std::uint64_t bytes_;
  std::filesystem::path path_;
  int fd_ = -1;
  bool direct_ = false;
  std::unique_ptr<IoQueue> queue_;
  std::vector<IoRequest> requests_;  // reused: transfers are submitted from one thread
};

}  // namespace zerotk::io
