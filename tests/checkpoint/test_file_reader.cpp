// DataFileReader: the streamed reader of one data file agrees with the whole-file parser, reads any
// range of a section, and reports every defect with the file's name.
#include <doctest/doctest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/checkpoint/file_reader.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/io/durable_file.hpp"

namespace test_file_reader {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;
using checkpoint::DataFileReader;
using checkpoint::ElementType;

namespace {

/// Sections larger than DataFileReader's 1 MiB hash chunk, so the checksum spans several reads.
struct SampleFile {
  std::vector<float> master = std::vector<float>(300'000);  // 1.2 MB
  std::vector<std::int64_t> step = {-5, 7};
  std::vector<std::byte> blob = {std::byte{1}, std::byte{2}, std::byte{3}};
  std::vector<std::byte> bytes;

  SampleFile() {
    for (std::size_t i = 0; i < master.size(); ++i) master[i] = static_cast<float>(i) * 0.25f - 1000.0f;
    checkpoint::DataFileWriter w(1, 2);
    w.add("group0.master", std::span<const float>(master));
    w.add("step", std::span<const std::int64_t>(step));
    w.add("empty", std::span<const float>());
    w.add("blob", std::span<const std::byte>(blob));
    bytes = std::move(w).finish();
  }
};

template <class T>
std::vector<T> read_range(const DataFileReader& f, std::string_view name, ElementType type, std::uint64_t first, std::size_t count) {
  std::vector<T> out(count);
  f.read(name, type, first, std::span<T>(out));
  return out;
}

}  // namespace

TEST_CASE("checksum: StreamingChecksum over uneven pieces equals checksum() of the whole, also after reading it midway") {
  std::vector<std::byte> bytes(5000);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  const std::span<const std::byte> all(bytes);
  checkpoint::StreamingChecksum sum;
  CHECK(sum.value() == checkpoint::checksum(all.first(0)));
  std::size_t at = 0;
  for (const std::size_t n : {std::size_t{1}, std::size_t{0}, std::size_t{63}, std::size_t{240}, std::size_t{1000}}) {
    sum.update(all.subspan(at, n));
    at += n;
    CHECK(sum.value() == checkpoint::checksum(all.first(at)));
  }
  sum.update(all.subspan(at));
  CHECK(sum.value() == checkpoint::checksum(all));
  CHECK(sum.value() != checkpoint::checksum(all.first(all.size() - 1)));
}

TEST_CASE("file_reader: sections and ranges (start, middle, end, empty) match what DataFileWriter wrote") {
  ScratchDir d("file_reader");
  const SampleFile s;
  const auto path = d / "rank1.bin";
  io::write_file_durable(path, s.bytes);
  const checkpoint::FileRecord rec{"rank1.bin", s.bytes.size(), checkpoint::checksum(std::span<const std::byte>(s.bytes))};

  const DataFileReader f(path, rec);
  CHECK(f.rank() == 1);
  CHECK(f.world_size() == 2);
  const checkpoint::DataFileView v = checkpoint::parse_data_file(s.bytes, path.string());
  REQUIRE(f.sections().size() == v.sections.size());
  for (std::size_t i = 0; i < v.sections.size(); ++i) {
    CHECK(f.sections()[i].name == v.sections[i].name);
    CHECK(f.sections()[i].type == v.sections[i].type);
    CHECK(f.sections()[i].numel == v.sections[i].numel);
    CHECK(f.sections()[i].offset == v.sections[i].offset);
  }

  const std::vector<float>& m = s.master;
  const auto slice = [&](std::size_t b, std::size_t n) { return std::vector<float>(m.begin() + b, m.begin() + b + n); };
  CHECK(same_bits(read_range<float>(f, "group0.master", ElementType::fp32, 0, m.size()), m));
  CHECK(same_bits(read_range<float>(f, "group0.master", ElementType::fp32, 0, 3), slice(0, 3)));
  CHECK(same_bits(read_range<float>(f, "group0.master", ElementType::fp32, 150'001, 1000), slice(150'001, 1000)));
  CHECK(same_bits(read_range<float>(f, "group0.master", ElementType::fp32, m.size() - 7, 7), slice(m.size() - 7, 7)));
  CHECK(read_range<float>(f, "group0.master", ElementType::fp32, m.size(), 0).empty());
  CHECK(read_range<float>(f, "empty", ElementType::fp32, 0, 0).empty());
  CHECK(read_range<std::int64_t>(f, "step", ElementType::int64, 1, 1) == std::vector<std::int64_t>{7});
  CHECK(read_range<std::byte>(f, "blob", ElementType::byte, 0, 3) == s.blob);
  // Without a record: the trailing checksum alone.
  CHECK(DataFileReader(path).sections().size() == 4);
}

TEST_CASE("file_reader: a read past a section, a missing section or another type is an error naming file and section") {
  ScratchDir d("file_reader_range");
  const SampleFile s;
  const auto path = d / "r.bin";
  io::write_file_durable(path, s.bytes);
  const DataFileReader f(path);
  const std::string p = path.string();
  CHECK_THROWS_WITH_AS(read_range<float>(f, "group0.master", ElementType::fp32, 299'999, 2),
                       doctest::Contains((p + ": read past the end of section \"group0.master\" (got elements [299999, 299999 + 2) of 300000)").c_str()),
                       io_error);
  CHECK_THROWS_WITH_AS(read_range<float>(f, "empty", ElementType::fp32, 1, 0),
                       doctest::Contains((p + ": read past the end of section \"empty\"").c_str()), io_error);
  CHECK_THROWS_WITH_AS(read_range<float>(f, "nope", ElementType::fp32, 0, 1),
                       doctest::Contains((p + ": section \"nope\" is missing").c_str()), io_error);
  CHECK_THROWS_WITH_AS(read_range<std::int64_t>(f, "group0.master", ElementType::int64, 0, 1),
                       doctest::Contains((p + ": section \"group0.master\" has another element type (got fp32, expected int64)").c_str()),
                       io_error);
  CHECK_THROWS_AS(read_range<float>(f, "step", ElementType::int64, 0, 1), usage_error);
}

TEST_CASE("file_reader: a flipped byte, a truncation, another file's record: io_error naming the file") {
  ScratchDir d("file_reader_bad");
  const SampleFile s;
  const auto path = d / "r.bin";
  const std::string p = path.string();
  const checkpoint::FileRecord rec{"r.bin", s.bytes.size(), checkpoint::checksum(std::span<const std::byte>(s.bytes))};

  SUBCASE("flipped byte: in a section header, in the data, in the checksum") {
    for (const std::size_t at : {std::size_t{26}, std::size_t{1'000'000}, s.bytes.size() - 1}) {
      std::vector<std::byte> bad = s.bytes;
      bad[at] ^= std::byte{0x04};
      io::write_file_durable(path, bad);
      CHECK_THROWS_WITH_AS(DataFileReader{path}, doctest::Contains((p + ":" + std::to_string(s.bytes.size() - 8) +
                                                                    ": checksum mismatch (the file is corrupt or truncated)").c_str()),
                           io_error);
      CHECK_THROWS_WITH_AS(DataFileReader(path, rec),
                           doctest::Contains((p + ": checksum differs from the manifest's").c_str()), io_error);
    }
  }
  SUBCASE("truncated: at every length up to a section header's worth, and in the data") {
    for (std::size_t n = 0; n < 64; ++n) {
      io::write_file_durable(path, std::span<const std::byte>(s.bytes).first(n));
      CHECK_THROWS_WITH_AS(DataFileReader{path}, doctest::Contains(p.c_str()), io_error);
    }
    io::write_file_durable(path, std::span<const std::byte>(s.bytes).first(s.bytes.size() / 2));
    CHECK_THROWS_WITH_AS(DataFileReader{path}, doctest::Contains((p + ":").c_str()), io_error);
    CHECK_THROWS_WITH_AS(DataFileReader(path, rec),
                         doctest::Contains((p + ": truncated: shorter than the manifest records").c_str()), io_error);
  }
  SUBCASE("whole, but not the file the manifest recorded") {
    io::write_file_durable(path, s.bytes);
    checkpoint::FileRecord other = rec;
    other.checksum ^= 1;
    CHECK_THROWS_WITH_AS(DataFileReader(path, other),
                         doctest::Contains((p + ": checksum differs from the manifest's (the file is corrupt, or from another checkpoint) (got computed " +
                                            checkpoint::to_hex(rec.checksum) + ", manifest says " + checkpoint::to_hex(other.checksum) + ")")
                                               .c_str()),
                         io_error);
    other = rec;
    other.bytes -= 1;
    CHECK_THROWS_WITH_AS(DataFileReader(path, other), doctest::Contains((p + ": longer than the manifest records").c_str()), io_error);
  }
  SUBCASE("a section header that claims more data than the file holds, with a valid checksum") {
    // The checksum is recomputed, so only the structure check can catch it.
    std::vector<std::byte> bad(s.bytes.begin(), s.bytes.end() - 8);
    bad[24 + 2 + 13 + 1 + 3] = std::byte{0x7f};  // a high byte of the first section's u64 element count
    io::ByteWriter tail;
    tail.put(checkpoint::checksum(std::span<const std::byte>(bad)));
    bad.insert(bad.end(), tail.bytes().begin(), tail.bytes().end());
    io::write_file_durable(path, bad);
    CHECK_THROWS_WITH_AS(DataFileReader{path}, doctest::Contains((p + ":48: truncated: section \"group0.master\" claims").c_str()),
                         io_error);
    CHECK_THROWS_WITH_AS(checkpoint::parse_data_file(bad, p), doctest::Contains((p + ":48: truncated: section \"group0.master\" claims").c_str()),
                         io_error);
  }
  SUBCASE("unknown element type, and bytes after the last section, with a valid checksum") {
    for (const bool extra : {false, true}) {
      std::vector<std::byte> bad(s.bytes.begin(), s.bytes.end() - 8);
      if (extra) {
        bad.push_back(std::byte{0});
      } else {
        bad[24 + 2 + 13] = std::byte{9};
      }
      io::ByteWriter tail;
      tail.put(checkpoint::checksum(std::span<const std::byte>(bad)));
      bad.insert(bad.end(), tail.bytes().begin(), tail.bytes().end());
      io::write_file_durable(path, bad);
      const std::string want = extra ? p + ":" + std::to_string(bad.size() - 9) + ": unexpected bytes after the last section"
                                     : p + ":40: unknown element type in section \"group0.master\" (got 9)";
      CHECK_THROWS_WITH_AS(DataFileReader{path}, doctest::Contains(want.c_str()), io_error);
      CHECK_THROWS_WITH_AS(checkpoint::parse_data_file(bad, p), doctest::Contains(want.c_str()), io_error);
    }
  }
}

}  // namespace test_file_reader
