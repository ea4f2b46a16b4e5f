// The pieces under save/load: durable files, the data file format, the manifest text.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/io/durable_file.hpp"

using namespace zerotk;
using namespace zt_test;

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
  m.owned_numel = {{217, 217}};
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

TEST_CASE("manifest: round-trips exactly; a flipped byte, a truncation or a missing key is an error naming the key") {
  const checkpoint::Manifest m = sample_manifest();
  const std::string text = checkpoint::to_text(m);
  const checkpoint::Manifest r = checkpoint::parse_manifest(text, "m.txt");
  CHECK(checkpoint::to_text(r) == text);
  CHECK(r.scaler == m.scaler);  // the double bit for bit
  CHECK(r.owned_numel == m.owned_numel);
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
