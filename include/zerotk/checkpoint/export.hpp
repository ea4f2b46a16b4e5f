#pragma once
/// \file zerotk/checkpoint/export.hpp
/// A checkpoint's fp32 master weights as one safetensors file: whole tensors, named and shaped as
/// the model declares them, in fp32, bf16 or fp16; what Hugging Face and PyTorch users load
/// directly (safetensors.torch.load_file). No engine, no communicator: it reads the directory.
///
///   zerotk::checkpoint::export_safetensors("ckpt", "model.safetensors", {.dtype = zerotk::DType::bf16});
///
/// Streamed: each tensor is assembled piece by piece from the saved ranks' files (the fragment
/// tables, whole.hpp; a parameter split across the tensor group is merged from its shards) and
/// written as it is read, through a buffer of kExportChunk values, so the
/// memory used does not grow with the model. Every rank file read is verified against its checksum
/// first (file_reader.hpp). The output appears atomically, complete, or not at all.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/checkpoint/file_reader.hpp"
#include "zerotk/checkpoint/layout.hpp"
#include "zerotk/checkpoint/manifest.hpp"
#include "zerotk/checkpoint/rank_file.hpp"
#include "zerotk/checkpoint/read.hpp"
#include "zerotk/checkpoint/whole.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/io/safetensors.hpp"

namespace zerotk::checkpoint {

/// fp32 values read and written per piece.
inline constexpr std::size_t kExportChunk = std::size_t{1} << 20;

struct ExportOptions {
  std::optional<std::string> tag{};  ///< default: the tag in <dir>/latest
  DType dtype = DType::fp32;         ///< fp32, bf16 or fp16 (round to nearest even)
  /// Called after each tensor with (tensors done, tensor count): progress for long exports.
  std::function<void(std::size_t, std::size_t)> on_tensor{};
};

struct ExportResult {
  std::string tag{};
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;  ///< of the safetensors file
};

namespace detail {

/// The saved ranks' files, opened and verified the first time a piece is read from them.
class RankFiles {
 public:
  RankFiles(std::filesystem::path tdir, const Manifest& m) : tdir_(std::move(tdir)), m_(&m) {}
  const DataFileReader& operator[](int rank) {
    auto it = open_.find(rank);
    if (it == open_.end()) {
      auto f = std::unique_ptr<DataFileReader>(new DataFileReader(open_rank_file(tdir_, *m_, rank)));
      check_rank_file(*f, *m_, rank);
      it = open_.emplace(rank, std::move(f)).first;
    }
    return *it->second;
  }

 private:
  std::filesystem::path tdir_;
  const Manifest* m_;
  std::map<int, std::unique_ptr<DataFileReader>> open_;
};

inline std::vector<io::TensorInfo> export_tensors(const std::vector<WholeParam>& params, DType dtype) {
  std::vector<io::TensorInfo> out;
  for (const WholeParam& p : params) out.push_back(io::TensorInfo{p.name, dtype, p.shape});
  return out;
}

}  // namespace detail

/// Writes the fp32 masters of checkpoint `<dir>/<tag>` to `out` as safetensors (see the file
/// comment). `__metadata__` carries "format": "pt" (what transformers expects) and the checkpoint's
/// tag, global step count, world size and stage.
inline ExportResult export_safetensors(const std::filesystem::path& dir, const std::filesystem::path& out,
                                       const ExportOptions& options = {}) {
  if (options.dtype != DType::fp32 && options.dtype != DType::bf16 && options.dtype != DType::fp16) {
    throw usage_error("export dtype must be fp32, bf16 or fp16", "checkpoint::export_safetensors",
                      std::string(to_string(options.dtype)));
  }
  const std::string tag = options.tag ? *options.tag : read_latest(dir);
  const Manifest m = read_manifest(dir, tag);
  const std::filesystem::path tdir = tag_path(dir, tag);
  const io::SafetensorsMetadata metadata = {{"format", "pt"},
                                            {"zerotk_tag", tag},
                                            {"zerotk_global_steps", std::to_string(m.global_steps)},
                                            {"zerotk_world_size", std::to_string(m.world_size)},
                                            {"zerotk_stage", std::to_string(m.stage)}};
  const WholeIndex index(m, (tdir / kManifestFile).string());
  const std::vector<WholeParam>& params = index.params();
  io::SafetensorsWriter writer(out, detail::export_tensors(params, options.dtype), metadata);
  detail::RankFiles files(tdir, m);
  std::vector<float> buf;
  for (std::size_t i = 0; i < params.size(); ++i) {
    std::map<int, std::vector<PieceCopy>> plan;
    index.cover_whole(i, 0, params[i].numel, 0, params[i].group, 0, plan);
    std::vector<std::pair<PieceCopy, int>> pieces;  // in tensor order
    for (const auto& [rank, copies] : plan) {
      for (const PieceCopy& c : copies) pieces.emplace_back(c, rank);
    }
    std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first.dst_offset < b.first.dst_offset; });
    const std::string section = section_name(params[i].group, "master");
    for (const auto& [c, rank] : pieces) {
      for (std::uint64_t done = 0; done < c.numel;) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(c.numel - done, kExportChunk));
        buf.resize(n);
        files[rank].read(section, ElementType::fp32, c.src_offset + done, std::span<float>(buf));
        writer.write_from_fp32(i, buf);
        done += n;
      }
    }
    if (options.on_tensor) options.on_tensor(i + 1, params.size());
  }
  writer.finish();
  return ExportResult{tag, params.size(), writer.layout().header.size() + writer.layout().data_bytes};
}

}  // namespace zerotk::checkpoint
