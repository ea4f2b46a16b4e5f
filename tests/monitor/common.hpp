#pragma once
// Shared helpers for the monitor tests: a hand-driven clock and scratch directories.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>

#include <unistd.h>

namespace zerotk_test {

/// A clock the test advances by hand: no sleeps, exact times.
struct ManualClock {
  double now = 1000.0;  // seconds; an arbitrary origin, as a steady clock has
  auto fn() {
    return [this] { return now; };
  }
};

/// A fresh directory under the system temp dir, removed with its contents at scope exit.
class ScratchDir {
 public:
  explicit ScratchDir(std::string_view tag) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("zerotk_monitor_" + std::string(tag) + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline std::filesystem::path golden_dir() {
  return std::filesystem::path(ZEROTK_TEST_SOURCE_DIR) / "monitor" / "golden";
}

}  // namespace zerotk_test
