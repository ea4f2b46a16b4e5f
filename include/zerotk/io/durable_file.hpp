#pragma once
/// \file zerotk/io/durable_file.hpp
/// Files that survive a crash: whole-file writes that retry EINTR and short writes and end with
/// fsync, fsync of a directory (which makes a create, rename or unlink inside it durable), atomic
/// rename and exchange, atomic replacement of a file (whole, or streamed through AtomicFileWriter),
/// whole-file reads and reads at an offset (RandomAccessFile), of regular files only (a FIFO or a
/// device is refused without blocking), with a size limit where the file comes from outside.
/// POSIX only.
/// Every failure is an io_error whose `where` is the path and whose `value` is strerror(errno).
///
///   io::write_file_durable(dir / "rank0.bin", bytes);   // data + metadata on disk when it returns
///   io::fsync_directory(dir);                           // the new name too
///   io::replace_file_atomically(root / "latest", tag);  // readers see the old or the new, never half

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::io {

namespace detail {

[[noreturn]] inline void throw_errno(const char* what, const std::filesystem::path& path, int err) {
  throw io_error(what, path.string(), std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")");
}

/// Owns a file descriptor; close() reports its error (a failed close can lose written data).
class Fd {
 public:
  Fd(const std::filesystem::path& path, int flags, mode_t mode = 0644) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) throw_errno("cannot open", path, errno);
  }
  /// Takes ownership of the open descriptor `fd`.
  Fd(int fd, const std::filesystem::path& path) noexcept : path_(path), fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  const std::filesystem::path& path() const noexcept { return path_; }
  void sync() const {
    if (::fsync(fd_) != 0) throw_errno("fsync failed", path_, errno);
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) throw_errno("close failed", path_, errno);
  }
  /// For clean-up paths, where the file is being thrown away anyway.
  void close_quietly() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
};

}  // namespace detail

/// Writes all of `bytes` to `fd`, retrying interrupted and short writes.
inline void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_errno("write failed", path, errno);
    }
    if (n == 0) throw io_error("write made no progress", path.string(), std::to_string(done) + " bytes written");
    done += static_cast<std::size_t>(n);
  }
}

/// Creates (or truncates) `path`, writes `bytes`, fsyncs and closes it: its data is on disk when
/// this returns. Its name is durable only after fsync_directory(path.parent_path()).
inline void write_file_durable(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  detail::Fd f(path, O_WRONLY | O_CREAT | O_TRUNC);
  write_all(f.get(), bytes, path);
  f.sync();
  f.close();
}

inline void write_file_durable(const std::filesystem::path& path, std::string_view text) {
  write_file_durable(path, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

/// Makes the entries of directory `dir` (files created, renamed or removed in it) durable.
inline void fsync_directory(const std::filesystem::path& dir) {
  detail::Fd d(dir, O_RDONLY | O_DIRECTORY);
  d.sync();
  d.close();
}

/// rename(2): atomic on one file system; replaces a file or an empty directory at `to`.
inline void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw io_error("cannot rename to " + to.string(), from.string(),
                   std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")");
  }
}

/// Atomically swaps two existing paths (Linux renameat2 RENAME_EXCHANGE): at every instant each
/// name refers to a complete entry, which a rename over a non-empty directory cannot offer.
inline void exchange_paths(const std::filesystem::path& a, const std::filesystem::path& b) {
#if defined(__linux__) && defined(RENAME_EXCHANGE)
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return;
  const int err = errno;
  throw io_error("cannot exchange with " + b.string(), a.string(),
                 std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")");
#else
  throw io_error("replacing an existing directory atomically needs renameat2(RENAME_EXCHANGE) (Linux)", b.string());
#endif
}

/// Writes a file that appears complete or not at all: the bytes go to `path`.tmp; commit() fsyncs
/// it, renames it over `path` and fsyncs the directory, so a reader (or a crash) sees the old `path`
/// or the new, never a mixture. Destroyed without commit() (an exception on the way), it removes the
/// temporary and leaves `path` as it was. Memory use does not depend on the file's size.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::filesystem::path path)
      : path_(std::move(path)), tmp_(path_.string() + ".tmp"), fd_(tmp_, O_WRONLY | O_CREAT | O_TRUNC) {}
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter() {
    if (committed_) return;
    fd_.close_quietly();
    ::unlink(tmp_.c_str());
  }

  void append(std::span<const std::byte> bytes) {
    if (committed_) throw usage_error("append after commit", path_.string());
    write_all(fd_.get(), bytes, tmp_);
    bytes_ += bytes.size();
  }
  void append(std::string_view text) { append(std::as_bytes(std::span<const char>(text.data(), text.size()))); }

  void commit() {
    if (committed_) throw usage_error("commit called twice", path_.string());
    fd_.sync();
    fd_.close();
    rename_path(tmp_, path_);
    committed_ = true;
    fsync_directory(path_.parent_path().empty() ? std::filesystem::path(".") : path_.parent_path());
  }

  std::uint64_t bytes_written() const noexcept { return bytes_; }
  const std::filesystem::path& path() const noexcept { return path_; }
  const std::filesystem::path& temporary_path() const noexcept { return tmp_; }

 private:
  std::filesystem::path path_, tmp_;
  detail::Fd fd_;
  std::uint64_t bytes_ = 0;
  bool committed_ = false;
};

/// Replaces the small file `path` so that a reader (or a crash) sees either the old content or the
/// new, never a mixture (AtomicFileWriter).
inline void replace_file_atomically(const std::filesystem::path& path, std::string_view text) {
  AtomicFileWriter w(path);
  w.append(text);
  w.commit();
}

/// Reads into `out` from `offset` of `fd`, retrying interrupted and short reads; returns how many
/// bytes it read (fewer than out.size() only where the file ends).
inline std::size_t read_at(int fd, std::uint64_t offset, std::span<std::byte> out, const std::filesystem::path& path) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<::off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_errno("read failed", path, errno);
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
  }
  return done;
}

namespace detail {

/// What `mode` (stat's st_mode) is, in words, for an error saying why a file is refused.
inline const char* file_kind(mode_t mode) noexcept {
  if (S_ISFIFO(mode)) return "FIFO";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISDIR(mode)) return "directory";
  return "special file";
}

/// Opens `path` for reading without blocking (O_NONBLOCK: opening a FIFO with no writer would wait
/// forever) and returns its fstat size; `refuse(kind)` is called, and must throw, unless it is a
/// regular file. Only regular files have a size to trust: /dev/zero reports 0 and never ends, a
/// FIFO blocks. (O_NONBLOCK changes nothing for reads of a regular file.)
template <class Refuse>
std::uint64_t open_regular(Fd& fd, Refuse&& refuse) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("fstat failed", fd.path(), errno);
  if (!S_ISREG(st.st_mode)) refuse(st.st_mode);
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace detail

/// A regular file opened for reading at offsets (pread), so that memory use does not depend on its
/// size. A directory, FIFO, device or socket is refused with an io_error naming it.
class RandomAccessFile {
 public:
  explicit RandomAccessFile(const std::filesystem::path& path) : fd_(path, O_RDONLY | O_NONBLOCK) {
    size_ = detail::open_regular(fd_, [&](mode_t mode) {
      if (S_ISDIR(mode)) throw io_error("is a directory, not a file", path.string());
      throw io_error(std::string("not a regular file but a ") + detail::file_kind(mode) +
                         "; only regular files are read (a FIFO or device could block or never end)",
                     path.string());
    });
  }

  /// Size in bytes when it was opened.
  std::uint64_t size() const noexcept { return size_; }
  const std::filesystem::path& path() const noexcept { return fd_.path(); }

  /// Reads up to out.size() bytes from `offset`; returns how many (fewer only where the file ends).
  std::size_t read_some(std::uint64_t offset, std::span<std::byte> out) const { return read_at(fd_.get(), offset, out, path()); }

  /// Fills `out` from `offset`; an io_error at "path:offset" naming `what` if the file ends first.
  void read_exact(std::uint64_t offset, std::span<std::byte> out, std::string_view what) const {
    if (const std::size_t n = read_some(offset, out); n != out.size()) {
      throw io_error("truncated: " + std::string(what) + " needs " + std::to_string(out.size()) + " bytes",
                     path().string() + ":" + std::to_string(offset), std::to_string(n) + " bytes left");
    }
  }

 private:
  detail::Fd fd_;
  std::uint64_t size_ = 0;
};

/// The whole content of `path` (retrying interrupted and short reads).
inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  const RandomAccessFile f(path);
  std::vector<std::byte> out(static_cast<std::size_t>(f.size()));
  out.resize(f.read_some(0, out));  // shrank while we read: report what is there
  return out;
}

inline std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<std::byte> b = read_file(path);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

/// The whole content of the regular file `path`, at most `max_bytes` of it: for files a user or
/// another program hands over (a config, a checkpoint's `latest`), which must not block, exhaust
/// memory or stand for something else. Every refusal is an io_error whose `where` is the path and
/// whose message starts "cannot open <what>: " or "cannot read <what>: " and says why: the system's
/// reason (errno text), a directory, not a regular file (a FIFO, a device such as /dev/zero, a
/// socket; reading would block or never end), or larger than `max_bytes` (also when it grows
/// while being read; the value is its size).
inline std::string read_text_file(const std::filesystem::path& path, std::uint64_t max_bytes, std::string_view what) {
  const auto reason = [](int err) { return std::strerror(err) + std::string(" (errno ") + std::to_string(err) + ")"; };
  int fd = -1;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw io_error("cannot open " + std::string(what) + ": " + reason(errno), path.string());
  detail::Fd f(fd, path);
  const std::string cannot_read = "cannot read " + std::string(what) + ": ";
  const std::uint64_t size = detail::open_regular(f, [&](mode_t mode) {
    if (S_ISDIR(mode)) throw io_error(cannot_read + reason(EISDIR), path.string());
    throw io_error(cannot_read + "not a regular file but a " + detail::file_kind(mode) +
                       "; only regular files are read (a FIFO or device could block or never end)",
                   path.string());
  });
  const auto too_large = [&](const std::string& bytes) {
    return io_error(cannot_read + "larger than the limit of " + std::to_string(max_bytes) + " bytes", path.string(), bytes);
  };
  if (size > max_bytes) throw too_large(std::to_string(size) + " bytes");
  // Room for one byte past the fstat size, to notice a file that grew since; it grows up to the
  // limit plus one byte, never further.
  std::string text(static_cast<std::size_t>(size + 1), '\0');
  std::size_t done = 0;
  for (;;) {
    const ::ssize_t n = ::read(f.get(), text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw io_error(cannot_read + reason(errno), path.string());
    }
    if (n == 0) break;
    done += static_cast<std::size_t>(n);
    if (done > max_bytes) throw too_large("more than " + std::to_string(max_bytes) + " bytes (it grew while being read)");
    if (done == text.size()) text.resize(static_cast<std::size_t>(std::min<std::uint64_t>(2 * done, max_bytes + 1)));
  }
  text.resize(done);
  return text;
}

/// Creates `dir` and its missing parents.
inline void create_directories(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw io_error("cannot create directory", dir.string(), ec.message());
}

/// Removes `path` and everything under it; a missing path is not an error.
inline void remove_all(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) throw io_error("cannot remove", path.string(), ec.message());
}

inline bool exists(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

}  // namespace zerotk::io
