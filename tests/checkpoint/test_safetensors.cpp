// SafetensorsWriter: the exact header bytes, 8-byte alignment, tensor bytes streamed in pieces and
// converted with round-to-nearest-even, and every misuse refused without touching the target.
// (read_safetensors.py checks the same writer's output independently: the checkpoint_safetensors_* tests.)
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "checkpoint_fixture.hpp"
#include "zerotk/io/bytes.hpp"
#include "zerotk/io/durable_file.hpp"
#include "zerotk/io/safetensors.hpp"

namespace test_safetensors {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zt_test;

namespace {

std::vector<std::byte> le_bytes_f32(const std::vector<float>& v) {
  io::ByteWriter w;
  w.put_array(std::span<const float>(v));
  return w.bytes();
}

std::vector<std::byte> le_bytes_u16(const std::vector<std::uint16_t>& v) {
  std::vector<std::byte> out;
  for (const std::uint16_t x : v) {
    out.push_back(static_cast<std::byte>(x & 0xff));
    out.push_back(static_cast<std::byte>(x >> 8));
  }
  return out;
}

std::uint64_t u64_le(const std::vector<std::byte>& b) {
  io::ByteReader r(std::span<const std::byte>(b).first(8), "file");
  return r.get<std::uint64_t>("header length");
}

}  // namespace

TEST_CASE("safetensors: exact header, 8-byte aligned data, tensors streamed in pieces, fp32 -> bf16/fp16 rounded to nearest even") {
  ScratchDir d("safetensors");
  const auto path = d / "model.safetensors";
  const std::string odd_name = std::string("q\"uo\\te\n\x01") + "\xc3\xa9";  // quote, backslash, controls, U+00E9
  const std::vector<io::TensorInfo> tensors = {
      {"w", DType::fp32, {2, 3}},
      {odd_name, DType::bf16, {4}},
      {"h", DType::fp16, {2, 2}},
      {"scalar", DType::fp32, {}},
      {"empty", DType::fp32, {0}},
      {"last", DType::uint8, {3}},
  };
  const std::vector<float> w = {1.0f, -2.0f, 0.5f, 3.0e-39f /* subnormal */, -0.0f, 7.25f};
  // bf16 ties: 1 + 2^-8 rounds down to even 0x3f80, 1 + 3 * 2^-8 up to 0x3f82; NaN stays NaN.
  const std::vector<float> b = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f, std::numeric_limits<float>::quiet_NaN()};
  // fp16 ties: 1 + 2^-11 -> 0x3c00, 1 + 3 * 2^-11 -> 0x3c02; 65520 overflows to inf; 2^-24 is the least subnormal.
  const std::vector<float> h = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65520.0f, 0x1p-24f};
  const std::vector<std::byte> u8 = {std::byte{0}, std::byte{0x80}, std::byte{0xff}};

  {
    io::SafetensorsWriter st(path, tensors, {{"format", "pt"}, {"note", "tab\there"}});
    const std::vector<std::byte> wb = le_bytes_f32(w);
    st.write(0, std::span<const std::byte>(wb).first(5));  // pieces that split a float
    st.write(0, std::span<const std::byte>(wb).subspan(5, 0));
    st.write(0, std::span<const std::byte>(wb).subspan(5));
    st.write_from_fp32(1, std::span<const float>(b).first(1));
    st.write_from_fp32(1, std::span<const float>(b).subspan(1));
    st.write_from_fp32(2, h);
    const float scalar = 42.0f;
    st.write_from_fp32(3, std::span<const float>(&scalar, 1));
    st.write(5, u8);  // "empty" needs no call
    CHECK(!io::exists(path));  // only the temporary so far
    st.finish();
  }
  CHECK(!io::exists(d / "model.safetensors.tmp"));

  const std::vector<std::byte> file = io::read_file(path);
  const std::uint64_t n = u64_le(file);
  CHECK((8 + n) % 8 == 0);
  REQUIRE(file.size() >= 8 + n);
  std::string json(reinterpret_cast<const char*>(file.data()) + 8, n);
  const std::string expect =
      "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"tab\\u0009here\"},"
      "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
      "\"q\\\"uo\\\\te\\u000a\\u0001\xc3\xa9\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]},"
      "\"h\":{\"dtype\":\"F16\",\"shape\":[2,2],\"data_offsets\":[32,40]},"
      "\"scalar\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[40,44]},"
      "\"empty\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[44,44]},"
      "\"last\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[44,47]}}";
  REQUIRE(json.size() >= expect.size());
  CHECK(json.substr(0, expect.size()) == expect);
  CHECK(json.find_first_not_of(' ', expect.size()) == std::string::npos);  // padding: spaces only
  CHECK(json.size() - expect.size() < 8);

  std::vector<std::byte> data = le_bytes_f32(w);
  for (const auto& piece : {le_bytes_u16({0x3f80, 0x3f82, 0xbf80, 0x7fc0}), le_bytes_u16({0x3c00, 0x3c02, 0x7c00, 0x0001}),
                            le_bytes_f32({42.0f}), u8}) {
    data.insert(data.end(), piece.begin(), piece.end());
  }
  CHECK(std::vector<std::byte>(file.begin() + static_cast<std::ptrdiff_t>(8 + n), file.end()) == data);
}

TEST_CASE("safetensors: bad names and sizes are usage errors before any file exists") {
  ScratchDir d("safetensors_names");
  const auto path = d / "x.safetensors";
  const auto make = [&](std::vector<io::TensorInfo> t, io::SafetensorsMetadata m = {}) { io::SafetensorsWriter(path, std::move(t), m); };
  CHECK_THROWS_WITH_AS(make({{"", DType::fp32, {1}}}), doctest::Contains("a tensor name is empty"), usage_error);
  CHECK_THROWS_WITH_AS(make({{"a", DType::fp32, {1}}, {"b", DType::fp32, {}}, {"a", DType::fp16, {2}}}),
                       doctest::Contains((path.string() + ": safetensors: tensor name used twice (got \"a\")").c_str()), usage_error);
  CHECK_THROWS_WITH_AS(make({{"__metadata__", DType::fp32, {1}}}), doctest::Contains("reserved"), usage_error);
  CHECK_THROWS_WITH_AS(make({{"bad\xff", DType::fp32, {1}}}), doctest::Contains("a tensor name is not UTF-8"), usage_error);
  CHECK_THROWS_WITH_AS(make({}, {{"k", "\xc0\xaf"}}), doctest::Contains("a metadata value is not UTF-8"), usage_error);
  CHECK_THROWS_WITH_AS(make({{"big", DType::fp32, {std::uint64_t{1} << 32, std::uint64_t{1} << 30}}}),
                       doctest::Contains("the tensor's byte count overflows 64 bits (got \"big\")"), usage_error);
  CHECK_THROWS_WITH_AS(make({{"a", DType::uint8, {std::uint64_t{1} << 63}}, {"b", DType::uint8, {std::uint64_t{1} << 63}}}),
                       doctest::Contains("the file's size overflows 64 bits (got \"b\")"), usage_error);
  CHECK(!io::exists(path));
  CHECK(!io::exists(d / "x.safetensors.tmp"));
  // No tensors at all is a valid file: "{}" padded to 8 bytes.
  io::SafetensorsWriter empty(path, {});
  empty.finish();
  CHECK(io::read_text_file(path) == std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
}

TEST_CASE("safetensors: bytes out of order, too many or too few are usage errors; an unfinished file leaves the target as it was") {
  ScratchDir d("safetensors_misuse");
  const auto path = d / "x.safetensors";
  io::write_file_durable(path, std::string("old content"));
  const std::string p = path.string();
  const std::vector<std::byte> four(4), eight(8);
  {
    io::SafetensorsWriter st(path, {{"a", DType::fp32, {2}}, {"b", DType::fp32, {1}}, {"c", DType::int32, {1}}});
    CHECK(io::exists(d / "x.safetensors.tmp"));
    st.write(0, four);
    CHECK_THROWS_WITH_AS(st.write(1, four), doctest::Contains((p + ": safetensors: a tensor is incomplete (got \"a\": 4 of 8 bytes, then \"b\")").c_str()),
                         usage_error);
    CHECK_THROWS_WITH_AS(st.write(0, eight), doctest::Contains("more bytes than the tensor's shape holds (got \"a\": 4 + 8 of 8 bytes)"),
                         usage_error);
    st.write(0, four);
    st.write(1, four);
    CHECK_THROWS_WITH_AS(st.write(0, four), doctest::Contains("tensors must be written in order (got \"a\" after \"b\")"), usage_error);
    CHECK_THROWS_WITH_AS(st.write(3, four), doctest::Contains("no tensor with this index (got 3 of 3)"), usage_error);
    CHECK_THROWS_WITH_AS(st.write_from_fp32(2, std::vector<float>{1.0f}), doctest::Contains("needs an F32, F16 or BF16 tensor (got \"c\": I32)"),
                         usage_error);
    CHECK_THROWS_WITH_AS(st.finish(), doctest::Contains("a tensor is incomplete (got \"c\": 0 of 4 bytes, then finish())"), usage_error);
  }  // destroyed unfinished
  CHECK(io::read_text_file(path) == "old content");
  CHECK(!io::exists(d / "x.safetensors.tmp"));

  io::SafetensorsWriter st(path, {{"a", DType::fp32, {1}}});
  st.write(0, four);
  st.finish();
  CHECK(io::read_file(path).size() == 8 + 56 + 4);  // 54 bytes of JSON, padded to 56
  CHECK_THROWS_WITH_AS(st.write(0, four), doctest::Contains("the file is finished"), usage_error);
}

}  // namespace test_safetensors
