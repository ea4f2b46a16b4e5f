#pragma once
/// \file zerotk/io/durable_file.hpp
/// Files that survive a crash: whole-file writes that retry EINTR and short writes and end with
/// fsync, fsync of a directory (which makes a create, rename or unlink inside it durable), atomic
/// rename and exchange, atomic replacement of a small file, and whole-file reads. POSIX only.
/// Every failure is an io_error whose `where` is the path and whose `value` is strerror(errno).
///
///   io::write_file_durable(dir / "rank0.bin", bytes);   // data + metadata on disk when it returns
///   io::fsync_directory(dir);                           // the new name too
///   io::replace_file_atomically(root / "latest", tag);  // readers see the old or the new, never half

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
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
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const noexcept { return fd_; }
  void sync() const {
    if (::fsync(fd_) != 0) throw_errno("fsync failed", path_, errno);
  }
  void close() {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && errno != EINTR) throw_errno("close failed", path_, errno);
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

/// Replaces the small file `path` so that a reader (or a crash) sees either the old content or the
/// new, never a mixture: writes `path`.tmp, fsyncs it, renames it over `path`, fsyncs the directory.
inline void replace_file_atomically(const std::filesystem::path& path, std::string_view text) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  write_file_durable(tmp, text);
  rename_path(tmp, path);
  fsync_directory(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

/// The whole content of `path` (retrying interrupted and short reads).
inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  detail::Fd f(path, O_RDONLY);
  struct stat st {};
  if (::fstat(f.get(), &st) != 0) detail::throw_errno("fstat failed", path, errno);
  if (S_ISDIR(st.st_mode)) throw io_error("is a directory, not a file", path.string());
  std::vector<std::byte> out(static_cast<std::size_t>(st.st_size));
  std::size_t done = 0;
  while (done < out.size()) {
    const ::ssize_t n = ::read(f.get(), out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      detail::throw_errno("read failed", path, errno);
    }
    if (n == 0) break;  // shrank while we read: report what is there
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return out;
}

inline std::string read_text_file(const std::filesystem::path& path) {
  const std::vector<std::byte> b = read_file(path);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
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
