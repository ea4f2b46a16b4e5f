// The pieces under save/load: durable files, the data file format, the manifest text.
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "checkpoint_fixture.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/io/durable_file.hpp"

namespace test_format {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
namespace fs = std::filesystem;

TEST_CASE("io: a durable write reads back; a missing file is an io_error naming the path and errno text") {
  ScratchDir d("io");
  const std::string text = "hello\nworld";
  io::write_file_durable(d / "a.txt", text);
  io::fsync_directory(d.path());
  CHECK(io::read_text_file(d / "a.txt") == text);
  io::replace_file_atomically(d / "latest", "tag1");
  io::replace_file_atomically(d / "latest", "tag2");
  CHECK(io::read_text_file(d / "latest") == "tag2");
  CHECK(!io::exists(d / "latest.tmp"));
  const std::string missing = (d / "missing.bin").string();
  CHECK_THROWS_WITH_AS(io::read_file(d / "missing.bin"),
                       doctest::Contains((missing + ": cannot open (got No such file or directory (errno 2))").c_str()), io_error);
}

// Issue 49, items 3 and 4: a FIFO blocked the reader, /dev/zero read as an empty file (st_size 0)
// or, through a size-less read, grew until killed.
TEST_CASE("io: only regular files are read, without blocking; the bounded read names its limit") {
  ScratchDir d("io_regular");
  REQUIRE(::mkfifo((d / "fifo").c_str(), 0644) == 0);
  CHECK_THROWS_WITH_AS(io::read_file(d / "fifo"), doctest::Contains("not a regular file but a FIFO"), io_error);
  CHECK_THROWS_WITH_AS(io::read_text_file(d / "fifo", 100, "test file"),
                       doctest::Contains(((d / "fifo").string() + ": cannot read test file: not a regular file but a FIFO").c_str()), io_error);
  if (fs::exists("/dev/zero")) {
    CHECK_THROWS_WITH_AS(io::read_file("/dev/zero"), doctest::Contains("not a regular file but a character device"), io_error);
    CHECK_THROWS_WITH_AS(io::read_text_file("/dev/zero", 100, "test file"),
                         doctest::Contains("not a regular file but a character device"), io_error);
  }
  CHECK_THROWS_WITH_AS(io::read_text_file(d.path(), 100, "test file"),
                       doctest::Contains(("cannot read test file: " + std::string(std::strerror(EISDIR))).c_str()), io_error);
  CHECK_THROWS_WITH_AS(io::read_text_file(d / "missing", 100, "test file"),
                       doctest::Contains(("cannot open test file: " + std::string(std::strerror(ENOENT))).c_str()), io_error);
  io::write_file_durable(d / "ten", std::string("0123456789"));
  CHECK(io::read_text_file(d / "ten", 10, "test file") == "0123456789");
  CHECK(io::read_text_file(d / "ten", 11, "test file") == "0123456789");
  try {
    (void)io::read_text_file(d / "ten", 9, "test file");
    FAIL("a file over the limit must be refused");
  } catch (const io_error& e) {
    CHECK(e.message() == "cannot read test file: larger than the limit of 9 bytes");
    CHECK(e.value() == "10 bytes");
    CHECK(e.where() == (d / "ten").string());
  }
  io::write_file_durable(d / "empty", std::string());
  CHECK(io::read_text_file(d / "empty", 0, "test file").empty());
}

TEST_CASE("io: exchange_paths swaps two directories atomically") {
  ScratchDir d("exchange");
  io::create_directories(d / "a");
  io::create_directories(d / "b");
  io::write_file_durable(d / "a" / "x", std::string("from a"));
  io::write_file_durable(d / "b" / "x", std::string("from b"));
  io::exchange_paths(d / "a", d / "b");
  CHECK(io::read_text_file(d / "a" / "x") == "from b");
  CHECK(io::read_text_file(d / "b" / "x") == "from a");
}

TEST_CASE("format: sections round-trip bit-exactly; every flipped byte and every truncation is caught") {
  const std::vector<float> f = {1.5f, -0.0f, 3.0e-39f /* subnormal */, 7.25f};
  const std::vector<std::int64_t> step = {-5};
  checkpoint::DataFileWriter w(3, 4);
  w.add("f", std::span<const float>(f));
  w.add("s", std::span<const std::int64_t>(step));
  w.add("empty", std::span<const float>());
  const std::vector<std::byte> bytes = std::move(w).finish();

  const checkpoint::DataFileView v = checkpoint::parse_data_file(bytes, "x.bin");
  CHECK(v.rank == 3);
  CHECK(v.world_size == 4);
  CHECK(same_bits(v.read<float>("f", checkpoint::ElementType::fp32, 4), f));
  CHECK(v.read<std::int64_t>("s", checkpoint::ElementType::int64, 1) == step);
  CHECK(v.read<float>("empty", checkpoint::ElementType::fp32, 0).empty());
  CHECK_THROWS_WITH_AS(v.read<float>("f", checkpoint::ElementType::fp32, 5),
                       doctest::Contains("x.bin: section \"f\" has another element count (got 4, expected 5)"), io_error);
  CHECK_THROWS_WITH_AS(v.get("nope", checkpoint::ElementType::fp32, 1), doctest::Contains("section \"nope\" is missing"),
                       io_error);

  for (std::size_t i = 0; i < bytes.size(); ++i) {
    std::vector<std::byte> bad = bytes;
    bad[i] ^= std::byte{0x10};
    CHECK_THROWS_AS(checkpoint::parse_data_file(bad, "x.bin"), io_error);
  }
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    CHECK_THROWS_AS(checkpoint::parse_data_file(std::span<const std::byte>(bytes).first(n), "x.bin"), io_error);
  }
}

namespace {
checkpoint::Manifest sample_manifest() {
  checkpoint::Manifest m;
  m.tag = "global_step3";
  m.world_size = 2;
  m.stage = 2;
  m.precision = "fp16";
  m.optimizer = "AdamW";
  m.optimizer_states = {"exp_avg", "exp_avg_sq"};
  m.parameter_count = 433;
  m.flat_numel = 434;
  m.shards.params = {{"fc0.weight", {16, 24}, 384, "fp16", 0, 0}, {"fc0 bias with spaces", {49}, 49, "fp32", 0, 1}};
  m.shards.owned_numel = {{217, 217}};
  m.shards.fragments = {{{{0, 0, 217, 0}}, {{0, 217, 167, 0}, {1, 0, 49, 167}}}};
  m.optimizer_steps = {2};
  m.micro_steps = 6;
  m.global_steps = 3;
  m.skipped_steps = 1;
  m.scaler = LossScalerState{0.1 + 0.2, 3, 1, 1};  // a double with no short decimal form
  m.scheduler = optim::SchedulerState{1};
  m.client_state = {"client_state.bin", 40, 0x0123456789abcdefULL};
  m.rank_files = {{"rank0.bin", 100, 1}, {"rank1.bin", 101, 0xffffffffffffffffULL}};
  return m;
}
}  // namespace

TEST_CASE("manifest: a parameter table or fragment table that does not add up is an error naming the key") {
  const auto fails = [](checkpoint::Manifest m, const char* key) {
    std::string body = checkpoint::to_text(m);
    body = body.substr(0, body.find("checksum "));
    const std::string text = body + "checksum " + checkpoint::to_hex(checkpoint::checksum(body)) + "\n";
    CHECK_THROWS_WITH_AS(checkpoint::parse_manifest(text, "m.txt"), doctest::Contains(key), io_error);
  };
  checkpoint::Manifest m = sample_manifest();
  m.shards.fragments[0][1].pop_back();  // nobody holds the bias
  fails(m, "no rank holds elements 0.. of parameter 1");
  m = sample_manifest();
  m.shards.fragments[0][0][0].numel = 218;  // past the rank's owned elements
  fails(m, "m.txt: group0.rank0.fragments: fragment outside");
  m = sample_manifest();
  m.shards.params[0].shape = {16, 25};
  fails(m, "m.txt: param0: the shape's product differs from numel");
  m = sample_manifest();
  m.shards.params[1].numel = 48;
  m.shards.params[1].shape = {48};
  fails(m, "m.txt: parameters: the parameters' element counts do not add up");
  m = sample_manifest();
  m.shards.fragments[0][0][0].param = 7;
  fails(m, "m.txt: group0.rank0.fragments: fragment of a parameter that is not in this group");
}

TEST_CASE("manifest: round-trips exactly; a flipped byte, a truncation or a missing key is an error naming the key") {
  const checkpoint::Manifest m = sample_manifest();
  const std::string text = checkpoint::to_text(m);
  const checkpoint::Manifest r = checkpoint::parse_manifest(text, "m.txt");
  CHECK(checkpoint::to_text(r) == text);
  CHECK(r.scaler == m.scaler);  // the double bit for bit
  CHECK(r.shards == m.shards);
  CHECK(r.optimizer_steps == m.optimizer_steps);
  CHECK(r.rank_files[1].checksum == 0xffffffffffffffffULL);

  checkpoint::Manifest none = m;
  none.scheduler.reset();
  CHECK(!checkpoint::parse_manifest(checkpoint::to_text(none), "m.txt").scheduler.has_value());

  for (std::size_t i = 0; i < text.size(); ++i) {
    std::string bad = text;
    bad[i] = static_cast<char>(bad[i] ^ 0x01);
    CHECK_THROWS_AS(checkpoint::parse_manifest(bad, "m.txt"), io_error);
  }
  CHECK_THROWS_WITH_AS(checkpoint::parse_manifest(text.substr(0, text.size() / 2), "m.txt"), doctest::Contains("m.txt"),
                       io_error);
  // A manifest whose checksum line was recomputed after removing a key: the key is named.
  std::string body = text.substr(0, text.find("checksum "));
  body.erase(body.find("stage 2\n"), 8);
  CHECK_THROWS_WITH_AS(checkpoint::parse_manifest(body + "checksum " + checkpoint::to_hex(checkpoint::checksum(body)) + "\n", "m.txt"),
                       doctest::Contains("m.txt: stage: manifest key is missing"), io_error);
}

}  // namespace test_format
