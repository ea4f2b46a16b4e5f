// zerotk_safetensors_sample OUT_DIR: writes a safetensors file with SafetensorsWriter and, beside it,
// the reference dump that read_safetensors.py compares it with (format: the top of that script).
// The CTests checkpoint_safetensors_* run it, then the script:
//
//   OUT_DIR/sample.safetensors       F32, BF16 and F16 tensors (16-bit ones converted from fp32, with
//                                    rounding ties), a scalar, an empty tensor, a name needing escapes
//   OUT_DIR/sample.ref.{txt,bin}     what it must contain; BF16/F16 tensors given as their fp32 source,
//                                    so the script's own rounding checks zerotk's
//   OUT_DIR/bad.ref.{txt,bin}        the same with one byte changed: the script must report it
//   OUT_DIR/truncated.safetensors    the sample without its last byte: the script must reject it
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/io/bytes.hpp"
#include "zerotk/io/durable_file.hpp"
#include "zerotk/io/safetensors.hpp"
#include "reference_dump.hpp"

namespace {

using namespace zerotk;
using zt_test::ReferenceDump;
using zt_test::le_bytes;

int run(const std::filesystem::path& dir) {
  io::create_directories(dir);
  std::mt19937 rng(20261122);
  std::uniform_real_distribution<float> uni(-3.0f, 3.0f);
  std::vector<float> wte(15);
  for (float& x : wte) x = uni(rng);
  // Rounding ties and edges for the 16-bit conversions: the script rounds these itself.
  const std::vector<float> bias = {1.0f + 0x1p-8f, 1.0f + 0x3p-8f, -1.0f - 0x1p-8f, 0x1p-133f, std::numeric_limits<float>::max(), -0.0f, uni(rng)};
  const std::vector<float> h = {1.0f + 0x1p-11f, 1.0f + 0x3p-11f, 65519.0f, 65520.0f, 0x1p-25f, 0x3p-25f};
  const std::vector<float> odd = {uni(rng), uni(rng)};
  const float scalar = 0.1f;
  const std::vector<std::int32_t> ids = {0, -1, 2147483647, 42};
  const std::string odd_name = "odd \"name\" \\ with\nnewline, tab\t and \xc3\xa9";

  const std::vector<io::TensorInfo> tensors = {
      {"wte", DType::fp32, {3, 5}},    {"ln.bias", DType::bf16, {7}}, {"h", DType::fp16, {2, 3}},
      {"scalar", DType::fp32, {}},     {"empty", DType::bf16, {0}},   {odd_name, DType::fp32, {2}},
      {"ids", DType::int32, {2, 2}},
  };
  const io::SafetensorsMetadata meta = {{"format", "pt"}, {"source", "zerotk \"sample\"\n"}};
  io::SafetensorsWriter w(dir / "sample.safetensors", tensors, meta);
  w.write_from_fp32(0, std::span<const float>(wte).first(4));  // in pieces
  w.write_from_fp32(0, std::span<const float>(wte).subspan(4));
  w.write_from_fp32(1, bias);
  w.write_from_fp32(2, h);
  w.write_from_fp32(3, std::span<const float>(&scalar, 1));
  w.write_from_fp32(5, odd);
  io::ByteWriter idb;
  idb.put_array(std::span<const std::int32_t>(ids));
  w.write(6, idb.bytes());
  w.finish();

  ReferenceDump ref;
  for (const auto& [k, v] : meta) ref.metadata(k, v);
  ref.tensor("wte", "F32", {3, 5}, le_bytes(wte));
  ref.tensor("ln.bias", "F32", {7}, le_bytes(bias));
  ref.tensor("h", "F32", {2, 3}, le_bytes(h));
  ref.tensor("scalar", "F32", {}, le_bytes(std::span<const float>(&scalar, 1)));
  ref.tensor("empty", "BF16", {0}, {});
  ref.tensor(odd_name, "F32", {2}, le_bytes(odd));
  ref.tensor("ids", "I32", {2, 2}, idb.bytes());
  ref.write(dir, "sample");

  ReferenceDump bad = ref;
  bad.bin[5] ^= std::byte{0x01};  // in "wte"
  bad.write(dir, "bad");

  std::vector<std::byte> file = io::read_file(dir / "sample.safetensors");
  file.pop_back();
  io::write_file_durable(dir / "truncated.safetensors", file);
  std::printf("wrote %s\n", (dir / "sample.safetensors").string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return zt_test::sample_main(argc, argv, run); }
