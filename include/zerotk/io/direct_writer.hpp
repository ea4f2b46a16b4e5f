#pragma once
/// \file zerotk/io/direct_writer.hpp
/// DirectFileWriter: a large file streamed to disk past the page cache. Bytes appended are copied
/// into one of two aligned staging buffers; a full one goes to the file with an O_DIRECT write on a
/// background thread while the other fills; finish() writes the tail, fsyncs and closes. Why: a buffered write of a multi-GB checkpoint first fills
/// fresh page-cache pages (on the machines measured here that costs more than the disk itself, see
/// bench/RESULTS.md "Checkpoints"), and the data is not needed in memory afterwards.
///
/// Where O_DIRECT is refused (tmpfs, some network file systems: EINVAL at open or on a write) the
/// writer goes on with ordinary buffered writes: slower, never wrong. The last, partial block is
/// always written buffered (O_DIRECT needs whole blocks), before the fsync.
///
///   io::DirectFileWriter w(dir / "rank0.bin");
///   w.append(header); w.append(std::as_bytes(std::span(values)));
///   w.finish();                                  // on disk when it returns
///
/// A writer destroyed without finish() closes the file, leaving what was written (callers write
/// into temporary directories; checkpoint/commit.hpp).

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <new>
#include <span>
#include <string>

#include "zerotk/core/error.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zerotk::io {

class DirectFileWriter {
 public:
  static constexpr std::size_t kAlign = 4096;
  static constexpr std::size_t kDefaultBuffer = std::size_t{8} << 20;

  /// `buffer_bytes` per staging buffer (two of them: one fills while the other is written).
  /// `size_hint`, the file's final size if known, lets the file system allocate it in one piece
  /// (fallocate; ignored where unsupported) instead of extent by extent as writes extend the file.
  explicit DirectFileWriter(std::filesystem::path path, std::size_t buffer_bytes = kDefaultBuffer, std::uint64_t size_hint = 0)
      : path_(std::move(path)), capacity_(std::max(kAlign, buffer_bytes / kAlign * kAlign)) {
    for (auto& b : buffers_) {
      void* p = nullptr;
      if (::posix_memalign(&p, kAlign, capacity_) != 0) throw std::bad_alloc();
      b.reset(static_cast<std::byte*>(p));
    }
    fd_ = open(O_DIRECT);
    direct_ = fd_ >= 0;
    if (!direct_ && errno == EINVAL) fd_ = open(0);  // no O_DIRECT on this file system
    if (fd_ < 0) detail::throw_errno("cannot open", path_, errno);
    if (size_hint > 0) {  // Linux fallocate: EOPNOTSUPP where unsupported (never glibc's emulation by writing)
      int r;
      do {
        r = ::fallocate(fd_, 0, 0, static_cast<off_t>(size_hint));
      } while (r != 0 && errno == EINTR);
      if (r != 0 && errno == ENOSPC) {
        const int err = errno;
        ::close(fd_);
        fd_ = -1;
        detail::throw_errno("no space for the file (fallocate)", path_, err);
      }
      if (r == 0) allocated_ = size_hint;
    }
  }
  DirectFileWriter(const DirectFileWriter&) = delete;
  DirectFileWriter& operator=(const DirectFileWriter&) = delete;
  ~DirectFileWriter() {
    if (in_flight_.valid()) in_flight_.wait();
    if (fd_ >= 0) ::close(fd_);
  }

  /// Appends `bytes`. Each time a staging buffer fills it is handed to a background write, and the
  /// other buffer fills meanwhile (a write error surfaces at the next hand-over or at finish()).
  void append(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const std::size_t n = std::min(bytes.size(), capacity_ - used_);
      std::memcpy(buffers_[current_].get() + used_, bytes.data(), n);
      used_ += n;
      bytes = bytes.subspan(n);
      if (used_ == capacity_) hand_over();
    }
  }

  /// Writes what is staged, fsyncs and closes: the data is on disk when this returns (the file's
  /// name once its directory is fsynced too).
  void finish() {
    wait_in_flight();
    std::byte* b = buffers_[current_].get();
    const std::size_t whole = used_ / kAlign * kAlign;  // whole blocks, still direct
    write_at(b, whole, offset_);
    if (whole < used_) {
      drop_direct();
      write_at(b + whole, used_ - whole, offset_ + whole);
    }
    offset_ += used_;
    used_ = 0;
    if (allocated_ > offset_ && ::ftruncate(fd_, static_cast<off_t>(offset_)) != 0) {  // the size hint was too large
      detail::throw_errno("ftruncate failed", path_, errno);
    }
    if (::fsync(fd_) != 0) detail::throw_errno("fsync failed", path_, errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) detail::throw_errno("close failed", path_, errno);
  }

  std::uint64_t bytes_written() const noexcept { return offset_ + used_; }
  /// Whether the file is (still) written with O_DIRECT.
  bool direct() const noexcept { return direct_; }
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  struct Free {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };

  int open(int extra) const {
    int fd;
    do {
      fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | extra, 0644);
    } while (fd < 0 && errno == EINTR);
    return fd;
  }

  void drop_direct() {
    if (!direct_) return;
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) detail::throw_errno("fcntl(O_DIRECT off) failed", path_, errno);
    direct_ = false;
  }

  void wait_in_flight() {
    if (in_flight_.valid()) in_flight_.get();  // rethrows the background write's error
  }

  /// The full current buffer goes to a background write; the other one becomes current.
  void hand_over() {
    wait_in_flight();
    in_flight_ = std::async(std::launch::async, [this, b = buffers_[current_].get(), at = offset_] { write_at(b, capacity_, at); });
    offset_ += capacity_;
    used_ = 0;
    current_ ^= 1;
  }

  /// Writes `n` bytes from `b` at file offset `at` (one write in flight at a time).
  void write_at(const std::byte* b, std::size_t n, std::uint64_t at) {
    std::size_t done = 0;
    while (done < n) {
      const ::ssize_t w = ::pwrite(fd_, b + done, n - done, static_cast<off_t>(at + done));
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EINVAL && direct_) {  // refused mid-file (or a short write left it unaligned)
          drop_direct();
          continue;
        }
        detail::throw_errno("write failed", path_, errno);
      }
      if (w == 0) throw io_error("write made no progress", path_.string(), std::to_string(at + done) + " bytes written");
      done += static_cast<std::size_t>(w);
    }
  }

  std::filesystem::path path_;
  std::size_t capacity_;
  std::unique_ptr<std::byte, Free> buffers_[2];
  int current_ = 0;
  std::future<void> in_flight_;
  int fd_ = -1;
  bool direct_ = false;
  std::uint64_t allocated_ = 0;  // bytes fallocate reserved
  std::uint64_t offset_ = 0;  // file bytes handed to writes
  std::size_t used_ = 0;      // bytes staged in the current buffer
};

}  // namespace zerotk::io
