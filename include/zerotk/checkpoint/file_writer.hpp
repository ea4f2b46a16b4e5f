#pragma once
/// \file zerotk/checkpoint/file_writer.hpp
/// DataFileStreamWriter: a checkpoint data file (format.hpp) streamed to disk, never whole in
/// memory. Section headers and elements go through io::DirectFileWriter (O_DIRECT, aligned
/// staging) and one streaming XXH3-64, which yields both the trailing checksum (of the bytes before
/// it) and the manifest's checksum (of the whole file) in the same pass. The counterpart of
/// file_reader.hpp; rank files are written this way (rank_file.hpp).
///
///   checkpoint::DataFileStreamWriter w(temp / "rank0.bin", rank, world, 4);
///   w.add("group0.master", std::span<const float>(master));   // ... 4 sections
///   const FileRecord rec = w.finish("rank0.bin");             // size + checksum, data on disk

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "zerotk/checkpoint/checksum.hpp"
#include "zerotk/checkpoint/file_reader.hpp"
#include "zerotk/checkpoint/format.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/io/bytes.hpp"
#include "zerotk/io/direct_writer.hpp"

namespace zerotk::checkpoint {

class DataFileStreamWriter {
 public:
  /// Creates `path` for `sections` sections written by rank `rank` of `world_size`; `size_hint`, the
  /// file's size if known (file_size()), lets the file system allocate it at once.
  DataFileStreamWriter(const std::filesystem::path& path, int rank, int world_size, std::uint32_t sections,
                       std::uint64_t size_hint = 0)
      : out_(path, io::DirectFileWriter::kDefaultBuffer, size_hint), sections_(sections) {
    io::ByteWriter h;
    detail::put_file_header(h, rank, world_size, sections);
    put(h.bytes());
  }

  /// The size of a data file whose sections have these names and byte counts.
  template <class Sections>
  static std::uint64_t file_size(const Sections& name_and_bytes) {
    std::uint64_t n = kFileHeaderBytes + kFileTrailerBytes;
    for (const auto& [name, bytes] : name_and_bytes) n += 2 + name.size() + 1 + 8 + bytes;
    return n;
  }

  template <SectionElement T>
  void add(std::string_view name, std::span<const T> v) {
    if (added_ == sections_) throw usage_error("more sections than announced", out_.path().string(), std::string(name));
    io::ByteWriter h;
    detail::put_section_header(h, name, element_type_of<T>, v.size());
    put(h.bytes());
    if constexpr (std::endian::native == std::endian::little || sizeof(T) == 1) {
      put(std::as_bytes(v));
    } else {  // big-endian hosts: little-endian copies, a piece at a time
      constexpr std::size_t kPiece = 1 << 16;
      for (std::size_t at = 0; at < v.size(); at += kPiece) {
        io::ByteWriter w;
        w.put_array(v.subspan(at, std::min(kPiece, v.size() - at)));
        put(w.bytes());
      }
    }
    ++added_;
  }

  /// Appends the trailing checksum, fsyncs and closes; returns the file's manifest record (as
  /// `name`).
  FileRecord finish(std::string name) {
    if (added_ != sections_) {
      throw usage_error("fewer sections than announced", out_.path().string(), std::to_string(added_) + " of " + std::to_string(sections_));
    }
    io::ByteWriter t;
    t.put(sum_.value());
    put(t.bytes());
    out_.finish();
    return FileRecord{std::move(name), out_.bytes_written(), sum_.value()};
  }

 private:
  void put(std::span<const std::byte> b) {
    sum_.update(b);
    out_.append(b);
  }

  io::DirectFileWriter out_;
  StreamingChecksum sum_;
  std::uint32_t sections_, added_ = 0;
};

}  // namespace zerotk::checkpoint
