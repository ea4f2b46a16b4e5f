#pragma once
/// \file zerotk/checkpoint/file_reader.hpp
/// One checkpoint data file (format.hpp) read in bounded memory, for tools that walk a checkpoint
/// larger than the host's memory (an export to another format, an inspector). Opening it checks
/// what parse_data_file() and read_verified() check, with the same words: the manifest's size and
/// checksum, the trailing checksum (hashed in 1 MiB pieces), the header and every section header
/// (the data between them is skipped). Afterwards read() copies any range of a section's elements.
///
///   checkpoint::DataFileReader f(tdir / rec.name, rec);
///   std::vector<float> piece(4096);
///   f.read("group0.master", checkpoint::ElementType::fp32, 8192, std::span<float>(piece));

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "zerotk/checkpoint/checksum.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/io/bytes.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zerotk::checkpoint {

/// A section of a data file: where its elements lie.
struct SectionInfo {
  std::string name;
  ElementType type = ElementType::byte;
  std::uint64_t numel = 0;
  std::uint64_t offset = 0;  ///< of the section's first element in the file
};

/// The element type a C++ type reads as: float fp32, double fp64, std::int64_t int64, std::byte byte.
template <class T>
concept SectionElement = std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int64_t> ||
                         std::is_same_v<T, std::byte>;

template <SectionElement T>
inline constexpr ElementType element_type_of = std::is_same_v<T, float>          ? ElementType::fp32
                                               : std::is_same_v<T, double>       ? ElementType::fp64
                                               : std::is_same_v<T, std::int64_t> ? ElementType::int64
                                                                                 : ElementType::byte;

/// A data file opened, verified and indexed; memory use does not depend on the file's size.
class DataFileReader {
 public:
  /// Bytes hashed per read while verifying the checksum.
  static constexpr std::size_t kChunkBytes = std::size_t{1} << 20;

  /// Opens `path` and checks it completely (against `expected`, the manifest's record, if given).
  /// Every defect is an io_error naming the file and, where it helps, the offset.
  explicit DataFileReader(const std::filesystem::path& path, const std::optional<FileRecord>& expected = std::nullopt)
      : file_(path), path_(path.string()) {
    if (expected) check_recorded_size(*expected, file_.size(), path_);
    const std::uint64_t body_bytes = file_.size() < kFileTrailerBytes ? 0 : file_.size() - kFileTrailerBytes;
    std::uint64_t trailing = 0;
    const std::uint64_t body_sum = hash_body(body_bytes, expected, trailing);
    detail::check_file_size(file_.size(), path_);
    detail::check_trailing_checksum(trailing, body_sum, body_bytes, path_);
    index(body_bytes);
  }

  const std::string& path() const noexcept { return path_; }
  std::uint32_t rank() const noexcept { return header_.rank; }
  std::uint32_t world_size() const noexcept { return header_.world_size; }
  const std::vector<SectionInfo>& sections() const noexcept { return sections_; }

  /// The section `name` of type `type`, or an io_error naming the file and the section.
  const SectionInfo& section(std::string_view name, ElementType type) const {
    for (const SectionInfo& s : sections_) {
      if (s.name != name) continue;
      detail::check_section_type(s.name, s.type, type, path_);
      return s;
    }
    detail::throw_missing_section(name, path_);
  }
  /// The same, which must also hold `numel` elements.
  const SectionInfo& section(std::string_view name, ElementType type, std::uint64_t numel) const {
    const SectionInfo& s = section(name, type);
    detail::check_section_numel(s.name, s.numel, numel, path_);
    return s;
  }

  /// Copies elements [first, first + out.size()) of section `name` into `out`, converted from
  /// little-endian. A range past the section's end is an io_error naming the file, the section and
  /// the range; `type` must be T's element type (a usage_error otherwise).
  template <SectionElement T>
  void read(std::string_view name, ElementType type, std::uint64_t first, std::span<T> out) const {
    if (type != element_type_of<T>) {
      throw usage_error("DataFileReader::read: the span's element type is " + std::string(to_string(element_type_of<T>)),
                        path_, "section \"" + std::string(name) + "\" read as " + std::string(to_string(type)));
    }
    const SectionInfo& s = section(name, type);
    if (first > s.numel || out.size() > s.numel - first) {
      throw io_error("read past the end of section \"" + s.name + "\"", path_,
                     "elements [" + std::to_string(first) + ", " + std::to_string(first) + " + " + std::to_string(out.size()) +
                         ") of " + std::to_string(s.numel));
    }
    file_.read_exact(s.offset + first * sizeof(T), std::as_writable_bytes(out), s.name);
    io::from_little_endian(out);
  }

 private:
  /// Hashes the first `body_bytes` bytes, then the rest; checks the whole file's checksum against
  /// `expected`, returns the body's and puts the stored trailing checksum into `trailing`.
  std::uint64_t hash_body(std::uint64_t body_bytes, const std::optional<FileRecord>& expected, std::uint64_t& trailing) const {
    StreamingChecksum sum;
    std::vector<std::byte> chunk(static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, file_.size())));
    for (std::uint64_t at = 0; at < body_bytes;) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(chunk.size(), body_bytes - at));
      file_.read_exact(at, std::span<std::byte>(chunk).first(n), "file content");
      sum.update(std::span<const std::byte>(chunk).first(n));
      at += n;
    }
    const std::uint64_t body_sum = sum.value();
    const std::size_t tail = static_cast<std::size_t>(file_.size() - body_bytes);
    file_.read_exact(body_bytes, std::span<std::byte>(chunk).first(tail), "checksum");
    sum.update(std::span<const std::byte>(chunk).first(tail));
    if (expected) check_recorded_checksum(*expected, sum.value(), path_);
    if (tail == kFileTrailerBytes) trailing = io::ByteReader(std::span<const std::byte>(chunk).first(tail), path_).get<std::uint64_t>("checksum");
    return body_sum;
  }

  /// Reads the header and every section header, seeking past the data.
  void index(std::uint64_t body_bytes) {
    std::vector<std::byte> buf(kFileHeaderBytes);
    file_.read_exact(0, buf, "header");
    io::ByteReader hr(buf, path_);
    header_ = detail::read_file_header(hr, path_);
    std::uint64_t at = kFileHeaderBytes;
    for (std::uint32_t i = 0; i < header_.section_count; ++i) {
      // A window of at most one section header's length: the data after it stays on disk.
      buf.resize(static_cast<std::size_t>(std::min<std::uint64_t>(kMaxSectionHeaderBytes, body_bytes - at)));
      file_.read_exact(at, buf, "section header");
      io::ByteReader r(buf, path_, at);
      SectionHeader h = detail::read_section_header(r, body_bytes - at - buf.size());
      const std::uint64_t data_offset = at + r.offset();
      sections_.push_back({std::move(h.name), h.type, h.numel, data_offset});
      at = data_offset + h.numel * size_of(h.type);
    }
    detail::check_no_bytes_after_sections(body_bytes - at, path_ + ":" + std::to_string(at));
  }

  io::RandomAccessFile file_;
  std::string path_;
  FileHeader header_;
  std::vector<SectionInfo> sections_;
};

}  // namespace zerotk::checkpoint
