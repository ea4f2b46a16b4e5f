// io::SwapFile (io/swap_file.hpp) on the build tree's file system: aligned regions written and read
// back through io_uring and the pread/pwrite pool at several block sizes and queue depths; the back
// end is io_uring where the build has liburing (unless the kernel refuses rings); errors name the file.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "zerotk/io/swap_file.hpp"

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
