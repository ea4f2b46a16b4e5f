#pragma once
/// \file zerotk/checkpoint/format.hpp
/// The binary layout of one checkpoint data file (a rank's file, the client-state file). All
/// integers and floats little-endian; version 1:
///
///   offset 0   char[8]  magic "ZTKCKPT\0"
///          8   u32      format version (1)
///         12   u32      rank that wrote it
///         16   u32      world size it was written on
///         20   u32      section count S
///         24   S x section:
///                u16 name length L, char[L] name (e.g. "group0.exp_avg")
///                u8  element type (1 fp32, 2 int64, 3 byte)
///                u64 element count N
///                N elements
///   end - 8    u64      XXH3-64 of every byte before it
///
/// The manifest records each file's size and checksum too, so a file that is whole but belongs to
/// another checkpoint is caught as well as a flipped byte or a truncation.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/checkpoint/checksum.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/io/bytes.hpp"

namespace zerotk::checkpoint {

inline constexpr std::array<char, 8> kFileMagic = {'Z', 'T', 'K', 'C', 'K', 'P', 'T', '\0'};
inline constexpr std::uint32_t kFileVersion = 1;

/// fp64 holds 1-bit LAMB's per-tensor scalars (Python floats in DeepSpeed).
enum class ElementType : std::uint8_t { fp32 = 1, int64 = 2, byte = 3, fp64 = 4 };

constexpr std::size_t size_of(ElementType t) noexcept {
  return t == ElementType::fp32 ? 4 : t == ElementType::int64 || t == ElementType::fp64 ? 8 : 1;
}
constexpr std::string_view to_string(ElementType t) noexcept {
  return t == ElementType::fp32 ? "fp32" : t == ElementType::int64 ? "int64" : t == ElementType::fp64 ? "fp64" : "byte";
}

namespace detail {

/// The 24-byte header: magic, version, rank, world size, section count.
inline void put_file_header(io::ByteWriter& w, int rank, int world_size, std::uint32_t sections) {
  for (char c : kFileMagic) w.put(static_cast<std::uint8_t>(c));
  w.put(kFileVersion);
  w.put(static_cast<std::uint32_t>(rank));
  w.put(static_cast<std::uint32_t>(world_size));
  w.put(sections);
}

/// A section's header: name length, name, element type, element count (the elements follow).
inline void put_section_header(io::ByteWriter& w, std::string_view name, ElementType type, std::uint64_t numel) {
  if (name.size() > 0xffff) throw usage_error("section name too long", "checkpoint data file", std::string(name));
  w.put_u16(static_cast<std::uint16_t>(name.size()));
  w.put_text(name);
  w.put(static_cast<std::uint8_t>(type));
  w.put(numel);
}

}  // namespace detail

/// Builds a data file in memory section by section; finish() appends the checksum. For small files
/// (the client state) and tests; rank files are streamed to disk (file_writer.hpp).
class DataFileWriter {
 public:
  DataFileWriter(int rank, int world_size) { detail::put_file_header(w_, rank, world_size, 0); }  // count patched by finish()
  void add(std::string_view name, std::span<const float> v) { add_raw(name, ElementType::fp32, v); }
  void add(std::string_view name, std::span<const std::int64_t> v) { add_raw(name, ElementType::int64, v); }
  void add(std::string_view name, std::span<const std::byte> v) { add_raw(name, ElementType::byte, v); }
  void add(std::string_view name, std::span<const double> v) { add_raw(name, ElementType::fp64, v); }

  std::vector<std::byte> finish() && {
    std::vector<std::byte>& b = w_.bytes();
    for (std::size_t i = 0; i < 4; ++i) b[20 + i] = static_cast<std::byte>((sections_ >> (8 * i)) & 0xff);
    w_.put(checksum(std::span<const std::byte>(b)));
    return std::move(b);
  }

 private:
  template <class T>
  void add_raw(std::string_view name, ElementType type, std::span<const T> v) {
    detail::put_section_header(w_, name, type, v.size());
    w_.put_array(v);
    ++sections_;
  }

  io::ByteWriter w_;
  std::uint32_t sections_ = 0;
};

/// Fixed parts of a data file: header (magic .. section count) and trailing checksum.
inline constexpr std::size_t kFileHeaderBytes = 24;
inline constexpr std::size_t kFileTrailerBytes = 8;
/// The longest section header: u16 name length, the name, u8 element type, u64 element count.
inline constexpr std::size_t kMaxSectionHeaderBytes = 2 + 0xffff + 1 + 8;

/// The header of a data file after the magic and version.
struct FileHeader {
  std::uint32_t rank = 0, world_size = 0, section_count = 0;
};

/// A section's header; its `numel` elements follow it.
struct SectionHeader {
  std::string name;
  ElementType type = ElementType::byte;
  std::uint64_t numel = 0;
};

/// One section of a parsed file: a view into the file's bytes.
struct SectionView {
  std::string name;
  ElementType type = ElementType::byte;
  std::uint64_t numel = 0;
  std::span<const std::byte> data;
  std::size_t offset = 0;  ///< of the section's data in the file
};

namespace detail {

/// Both ways of reading a data file (whole, or streamed by DataFileReader) check with these, so a
/// defect reads the same whichever found it.
inline void check_file_size(std::uint64_t bytes, const std::string& path) {
  if (bytes < kFileHeaderBytes + kFileTrailerBytes) {
    throw io_error("truncated: shorter than a data file's header and checksum", path, std::to_string(bytes) + " bytes");
  }
}

/// `computed`: checksum of the file's first `body_bytes` bytes; `stored`: the u64 after them.
inline void check_trailing_checksum(std::uint64_t stored, std::uint64_t computed, std::uint64_t body_bytes,
                                    const std::string& path) {
  if (stored != computed) {
    throw io_error("checksum mismatch (the file is corrupt or truncated)", path + ":" + std::to_string(body_bytes),
                   "stored " + to_hex(stored) + ", computed " + to_hex(computed));
  }
}

inline FileHeader read_file_header(io::ByteReader& r, const std::string& path) {
  const std::string magic = r.get_text(kFileMagic.size(), "magic");
  if (magic != std::string_view(kFileMagic.data(), kFileMagic.size())) {
    throw io_error("not a zerotk checkpoint data file (bad magic)", path + ":0");
  }
  const auto version = r.get<std::uint32_t>("format version");
  if (version != kFileVersion) {
    throw io_error("unsupported data file format version", path + ":8",
                   std::to_string(version) + ", this zerotk reads " + std::to_string(kFileVersion));
  }
  FileHeader h;
  h.rank = r.get<std::uint32_t>("rank");
  h.world_size = r.get<std::uint32_t>("world size");
  h.section_count = r.get<std::uint32_t>("section count");
  return h;
}

/// Reads a section header from `r`. `bytes_beyond` counts the file's bytes after the end of `r`'s
/// span and before the checksum (0 when `r` holds the whole body): the section's data must fit.
inline SectionHeader read_section_header(io::ByteReader& r, std::uint64_t bytes_beyond = 0) {
  SectionHeader s;
  const std::uint16_t len = r.get_u16("section name length");
  s.name = r.get_text(len, "section name");
  const auto type = r.get<std::uint8_t>("element type");
  if (type < 1 || type > 4) throw io_error("unknown element type in section \"" + s.name + "\"", r.where(), std::to_string(type));
  s.type = static_cast<ElementType>(type);
  s.numel = r.get<std::uint64_t>("element count");
  const std::uint64_t left = r.remaining() + bytes_beyond;
  if (s.numel > left / size_of(s.type)) {
    throw io_error("truncated: section \"" + s.name + "\" claims " + std::to_string(s.numel) + " elements", r.where(),
                   std::to_string(left) + " bytes left");
  }
  return s;
}

inline void check_section_type(const std::string& name, ElementType actual, ElementType expected, const std::string& path) {
  if (actual != expected) {
    throw io_error("section \"" + name + "\" has another element type", path,
                   std::string(to_string(actual)) + ", expected " + std::string(to_string(expected)));
  }
}

inline void check_no_bytes_after_sections(std::uint64_t left, const std::string& where) {
  if (left != 0) throw io_error("unexpected bytes after the last section", where, std::to_string(left) + " bytes");
}

inline void check_section_numel(const std::string& name, std::uint64_t actual, std::uint64_t expected, const std::string& path) {
  if (actual != expected) {
    throw io_error("section \"" + name + "\" has another element count", path,
                   std::to_string(actual) + ", expected " + std::to_string(expected));
  }
}

[[noreturn]] inline void throw_missing_section(std::string_view name, const std::string& path) {
  throw io_error("section \"" + std::string(name) + "\" is missing", path);
}

inline SectionView read_section(io::ByteReader& r) {
  SectionHeader h = read_section_header(r);
  SectionView s;
  s.offset = r.offset();
  s.data = r.take(static_cast<std::size_t>(h.numel) * size_of(h.type), h.name);
  s.name = std::move(h.name);
  s.type = h.type;
  s.numel = h.numel;
  return s;
}

}  // namespace detail

/// A data file, checked and parsed; views into the caller's bytes.
struct DataFileView {
  std::string path;
  std::uint32_t rank = 0, world_size = 0;
  std::vector<SectionView> sections;

  /// The section `name` of type `type` with `numel` elements, or an io_error naming the file, the
  /// section and both values.
  const SectionView& get(std::string_view name, ElementType type, std::uint64_t numel) const {
    for (const SectionView& s : sections) {
      if (s.name != name) continue;
      detail::check_section_type(s.name, s.type, type, path);
      detail::check_section_numel(s.name, s.numel, numel, path);
      return s;
    }
    detail::throw_missing_section(name, path);
  }

  template <class T>
  std::vector<T> read(std::string_view name, ElementType type, std::uint64_t numel) const {
    const SectionView& s = get(name, type, numel);
    std::vector<T> out(static_cast<std::size_t>(numel));
    io::ByteReader(s.data, path).get_array(std::span<T>(out), s.name);
    return out;
  }
};

/// Verifies the trailing checksum, then parses the header and the sections of `bytes` (the whole
/// content of `path`). Every defect is an io_error naming the file and, where it helps, the offset.
inline DataFileView parse_data_file(std::span<const std::byte> bytes, const std::string& path) {
  detail::check_file_size(bytes.size(), path);
  const std::span<const std::byte> body = bytes.first(bytes.size() - kFileTrailerBytes);
  io::ByteReader tail(bytes.last(kFileTrailerBytes), path);
  detail::check_trailing_checksum(tail.get<std::uint64_t>("checksum"), checksum(body), body.size(), path);
  io::ByteReader r(body, path);
  const FileHeader h = detail::read_file_header(r, path);
  DataFileView v;
  v.path = path;
  v.rank = h.rank;
  v.world_size = h.world_size;
  for (std::uint32_t i = 0; i < h.section_count; ++i) v.sections.push_back(detail::read_section(r));
  detail::check_no_bytes_after_sections(r.remaining(), r.where());
  return v;
}

}  // namespace zerotk::checkpoint
