#pragma once
// The reference dump read_safetensors.py compares a safetensors file with (format: the top of that
// script): text lines plus the tensors' bytes concatenated. Shared by the safetensors and export
// sample programs.
#include <cstddef>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/io/bytes.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zt_test {

/// The reference dump: text lines plus the concatenated bytes.
struct ReferenceDump {
  std::string text = "# reference dump for read_safetensors.py\n";
  std::vector<std::byte> bin;

  static std::string hex(std::string_view s) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out = "x";
    for (const char c : s) {
      const auto u = static_cast<unsigned char>(c);
      out += kDigits[u >> 4];
      out += kDigits[u & 0xf];
    }
    return out;
  }
  void metadata(std::string_view key, std::string_view value) { text += "metadata " + hex(key) + " " + hex(value) + "\n"; }
  void tensor(std::string_view name, std::string_view dtype, const std::vector<std::uint64_t>& shape, std::span<const std::byte> bytes) {
    text += "tensor " + hex(name) + " " + std::string(dtype);
    for (const std::uint64_t d : shape) text += " " + std::to_string(d);
    text += "\n";
    bin.insert(bin.end(), bytes.begin(), bytes.end());
  }
  void write(const std::filesystem::path& dir, const std::string& stem) const {
    zerotk::io::write_file_durable(dir / (stem + ".ref.txt"), text);
    zerotk::io::write_file_durable(dir / (stem + ".ref.bin"), bin);
  }
};

inline std::vector<std::byte> le_bytes(std::span<const float> v) {
  zerotk::io::ByteWriter w;
  w.put_array(v);
  return w.bytes();
}

/// main() of a sample program: `prog OUT_DIR` runs `run(OUT_DIR)`; 2 on a wrong command line, 1 on an
/// error (printed).
inline int sample_main(int argc, char** argv, int (*run)(const std::filesystem::path&)) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

}  // namespace zt_test
