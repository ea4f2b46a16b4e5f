// io::SwapFile (io/swap_file.hpp) on the build tree's file system: aligned regions written and read
// back through io_uring and the pread/pwrite pool at several block sizes and queue depths; the back
// end is io_uring where the build has liburing (unless the kernel refuses rings); errors name the file.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "zerotk/io/swap_file.hpp"

namespace test_swap_file {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
namespace fs = std::filesystem;

namespace {
struct Aligned {
  std::byte* p;
  explicit Aligned(std::size_t n) : p(static_cast<std::byte*>(std::aligned_alloc(io::kDirectAlign, n))) {}
  ~Aligned() { std::free(p); }
};
}  // namespace

TEST_CASE("SwapFile: regions round-trip through both back ends, any block size and queue depth") {
  const fs::path dir = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / "swapfile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  constexpr std::size_t kBytes = std::size_t{3} << 20;
  Aligned out(kBytes), in(kBytes);
  std::mt19937 rng(5);
  for (std::size_t i = 0; i < kBytes; ++i) out.p[i] = static_cast<std::byte>(rng());
  for (bool uring : {true, false}) {
    for (std::size_t block : {std::size_t{4096}, std::size_t{65536}, std::size_t{1} << 20}) {
      for (int qd : {1, 4, 32}) {
        CAPTURE(uring);
        CAPTURE(block);
        CAPTURE(qd);
        io::AioOptions aio;
        aio.use_uring = uring;
        aio.block_size = block;
        aio.queue_depth = qd;
        aio.intra_op_parallelism = qd == 4 ? 2 : 1;
        aio.single_submit = qd == 1;
        aio.overlap_events = qd != 32;
        io::SwapFile f(dir, "t", 2 * kBytes, aio);
        CHECK(f.direct());  // a real disk
#if ZEROTK_HAS_URING
        if (uring && std::strcmp(f.backend(), "io_uring") != 0) MESSAGE("io_uring refused by the kernel here");
#endif
        if (!uring) CHECK(std::strcmp(f.backend(), "pread/pwrite thread pool") == 0);
        const auto w1 = f.write(kBytes, out.p, kBytes);
        const auto w2 = f.write(0, out.p + 4096, kBytes - 4096);
        f.wait(w2);
        f.wait(w1);
        std::memset(in.p, 0, kBytes);
        f.wait(f.read(kBytes, in.p, kBytes));
        CHECK(std::memcmp(in.p, out.p, kBytes) == 0);
        f.wait(f.read(0, in.p, kBytes - 4096));
        CHECK(std::memcmp(in.p, out.p + 4096, kBytes - 4096) == 0);
      }
    }
  }
  CHECK(fs::is_empty(dir));  // files removed with their SwapFile
  // A read past a truncated end names the file and offset.
  {
    io::SwapFile f(dir, "t", kBytes, io::AioOptions{});
    fs::resize_file(f.path(), 8192);
    std::string what;
    try {
      f.wait(f.read(0, in.p, kBytes));
    } catch (const io_error& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find(f.path().string() + ":") != std::string::npos);
    CHECK(what.find("end of file") != std::string::npos);
    CHECK_THROWS_AS(f.check_present(), io_error);
  }
  io::AioOptions bad;
  bad.block_size = 1000;
  CHECK_THROWS_AS(io::SwapFile(dir, "t", 4096, bad), config_error);
  fs::remove_all(dir);
}

namespace {
/// What the code run by `f` writes to stderr (file descriptor 2).
template <class F>
std::string stderr_of(F&& f) {
  std::fflush(stderr);
  std::FILE* capture = std::tmpfile();
  REQUIRE(capture != nullptr);
  const int saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  f();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) text += static_cast<char>(c);
  std::fclose(capture);
  return text;
}
}  // namespace

// Issue 49, item 6: a swap directory that turned read-only mid-run left the swap files behind with
// no word. Removal still cannot throw (it runs in destructors), but it names every file it leaves.
TEST_CASE("SwapFile: a swap file that cannot be removed at the end is named on stderr and in swap_files_left_behind()") {
  const fs::path dir = fs::path(ZEROTK_TEST_BINARY_DIR) / "scratch" / "swapfile_left";
  fs::remove_all(dir);
  fs::create_directories(dir);
  io::AioOptions aio;
  aio.use_direct = false;
  fs::path path;
  const std::string said = stderr_of([&] {
    io::SwapFile f(dir, "zerotk_optim.r0.main", 8192, aio);
    path = f.path();
    if (::geteuid() != 0) {
      fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);  // the directory turns read-only
    } else {
      // root ignores directory permissions: the name is taken by a non-empty directory instead,
      // which makes the removal fail the same way (the file's data stays reachable until closed).
      fs::remove(path);
      fs::create_directories(path / "x");
    }
  });
  fs::permissions(dir, fs::perms::owner_all);
  CHECK(fs::exists(path));
  CHECK(said.find("zerotk: warning: the swap file " + path.string() + " (8192 bytes) could not be removed (") != std::string::npos);
  CHECK(said.find("it is left behind: remove it by hand") != std::string::npos);
  const std::vector<fs::path> left = io::swap_files_left_behind();
  CHECK(std::find(left.begin(), left.end(), path) != left.end());
  fs::remove_all(dir);
  // A file removed normally is not reported.
  fs::create_directories(dir);
  const std::string quiet = stderr_of([&] { io::SwapFile f(dir, "zerotk_optim.r0.main", 8192, aio); });
  CHECK(quiet.find("could not be removed") == std::string::npos);
  CHECK(io::swap_files_left_behind().size() == left.size());
  fs::remove_all(dir);
}

}  // namespace test_swap_file
