// io::DirectFileWriter: the bytes on disk are exactly the bytes appended, in any piece sizes, whole
// blocks and odd tails alike, with O_DIRECT (the build tree's file system) and without it (tmpfs
// refuses O_DIRECT: the writer falls back to buffered writes).
#include <doctest/doctest.h>

#include <sys/vfs.h>

#include <cstddef>
#include <filesystem>
#include <random>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/io/direct_writer.hpp"
#include "zerotk/io/durable_file.hpp"

namespace test_direct_writer {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
namespace fs = std::filesystem;

namespace {

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

/// Writes `data` through a writer with a `buffer`-byte staging buffer in pieces of up to `piece`.
bool write_and_compare(const fs::path& path, const std::vector<std::byte>& data, std::size_t buffer, std::size_t piece,
                       bool* direct) {
  io::DirectFileWriter w(path, buffer);
  for (std::size_t at = 0; at < data.size(); at += piece) {
    w.append(std::span<const std::byte>(data).subspan(at, std::min(piece, data.size() - at)));
  }
  CHECK(w.bytes_written() == data.size());
  w.finish();
  if (direct) *direct = w.direct();
  return io::read_file(path) == data;
}

}  // namespace

TEST_CASE("DirectFileWriter: exact bytes for whole blocks, odd tails and piece sizes; O_DIRECT on the build tree") {
  zt_test::ScratchDir d("direct");
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4095}, std::size_t{4096}, std::size_t{3 * 4096 + 17},
                        std::size_t{(1 << 20) + 12345}}) {
    const std::vector<std::byte> data = pattern(n, static_cast<unsigned>(n));
    for (std::size_t piece : {std::size_t{1000}, std::size_t{65536}, std::size_t{1} << 22}) {
      CHECK(write_and_compare(d / "f.bin", data, 64 * 1024, piece, nullptr));
    }
  }
  bool direct = false;
  CHECK(write_and_compare(d / "big.bin", pattern(5 << 20, 7), 1 << 20, 3 << 20, &direct));
  struct statfs s {};
  REQUIRE(::statfs(d.path().c_str(), &s) == 0);
  if (s.f_type != 0x01021994 /* TMPFS_MAGIC */) CHECK(direct);  // the tail is buffered; the file was direct until then
}

TEST_CASE("DirectFileWriter on tmpfs (no O_DIRECT): buffered, same bytes") {
  const fs::path shm = "/dev/shm";
  struct statfs s {};
  REQUIRE_MESSAGE(::statfs(shm.c_str(), &s) == 0, "/dev/shm is needed for this test (a tmpfs on Linux)");
  REQUIRE(s.f_type == 0x01021994);
  const fs::path p = shm / ("zerotk_direct_test." + std::to_string(::getpid()));
  bool direct = true;
  CHECK(write_and_compare(p, pattern((1 << 20) + 3, 11), 1 << 16, 50000, &direct));
  CHECK(!direct);
  fs::remove(p);
}

TEST_CASE("DirectFileWriter: a size hint allocates ahead; a hint too large is trimmed to the bytes written") {
  zt_test::ScratchDir d("direct_hint");
  const std::vector<std::byte> data = pattern(3 * 4096 + 5, 3);
  for (std::uint64_t hint : {std::uint64_t{data.size()}, std::uint64_t{1} << 20}) {
    io::DirectFileWriter w(d / "h.bin", 4096, hint);
    w.append(data);
    w.finish();
    CHECK(fs::file_size(d / "h.bin") == data.size());
    CHECK(io::read_file(d / "h.bin") == data);
  }
}

TEST_CASE("DirectFileWriter: a directory that does not exist is an io_error naming the path") {
  zt_test::ScratchDir d("direct_err");
  CHECK_THROWS_WITH_AS(io::DirectFileWriter(d / "missing" / "f.bin"), doctest::Contains("missing/f.bin"), io_error);
}

}  // namespace test_direct_writer
