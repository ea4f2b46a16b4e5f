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
///
/// export_tensor_parallel writes one file per tensor rank of any valid size K instead, each holding
/// the rank's shard of every split parameter (Megatron's layout) and the others whole:
///
///   zerotk::checkpoint::export_tensor_parallel("ckpt", "model.safetensors", 4);   // model-tp<k>-of-4.safetensors

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
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
#include "zerotk/core/glob.hpp"
#include "zerotk/io/safetensors.hpp"
#include "zerotk/parallel/split.hpp"

namespace zerotk::checkpoint {

/// fp32 values read and written per piece.
inline constexpr std::size_t kExportChunk = std::size_t{1} << 20;

/// A tensor split given by name for export_tensor_parallel, for a checkpoint saved at tensor 1 (which
/// records none): parameters whose name matches `pattern` (`*` matches any run of characters) are
/// cut as `split` says (Megatron's layout: parallel::TensorSplit).
struct SplitRule {
  std::string pattern;
  parallel::TensorSplit split;
};

struct ExportOptions {
  std::optional<std::string> tag{};  ///< default: the tag in <dir>/latest
  DType dtype = DType::fp32;         ///< fp32, bf16 or fp16 (round to nearest even)
  /// Called after each tensor with (tensors done, tensor count): progress for long exports.
  std::function<void(std::size_t, std::size_t)> on_tensor{};
  /// export_tensor_parallel: the splits of a checkpoint that records none (saved at tensor 1); the
  /// first matching rule wins, a parameter no rule matches is replicated. Refused for a checkpoint
  /// that records its own.
  std::vector<SplitRule> splits{};
};

struct ExportResult {
  std::string tag{};
  std::size_t tensors = 0;
  std::uint64_t bytes = 0;  ///< of the safetensors file (export_tensor_parallel: of all of them)
  std::vector<std::filesystem::path> files{};  ///< export_tensor_parallel: one per tensor rank
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

inline void check_dtype(DType t, const char* where) {
  if (t != DType::fp32 && t != DType::bf16 && t != DType::fp16) {
    throw usage_error("export dtype must be fp32, bf16 or fp16", where, std::string(to_string(t)));
  }
}

inline io::SafetensorsMetadata export_metadata(const std::string& tag, const Manifest& m) {
  return {{"format", "pt"},
          {"zerotk_tag", tag},
          {"zerotk_global_steps", std::to_string(m.global_steps)},
          {"zerotk_world_size", std::to_string(m.world_size)},
          {"zerotk_stage", std::to_string(m.stage)}};
}

/// Calls `piece(rank, section, src_offset, dst_offset, numel)` for the saved pieces of whole parameter
/// `i`, in tensor order.
template <class Piece>
void for_each_piece(const WholeIndex& index, std::size_t i, Piece&& piece) {
  const WholeParam& w = index.params()[i];
  std::map<int, std::vector<PieceCopy>> plan;
  index.cover_whole(i, 0, w.numel, 0, w.group, 0, plan);
  std::vector<std::pair<PieceCopy, int>> pieces;  // in tensor order
  for (const auto& [rank, copies] : plan) {
    for (const PieceCopy& c : copies) pieces.emplace_back(c, rank);
  }
  std::sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first.dst_offset < b.first.dst_offset; });
  const std::string section = section_name(w.group, "master");
  for (const auto& [c, rank] : pieces) piece(rank, section, c.src_offset, c.dst_offset, c.numel);
}

/// `path` with "-tp<k>-of-<K>" before its extension: model.safetensors -> model-tp0-of-2.safetensors.
inline std::filesystem::path tensor_rank_file(const std::filesystem::path& path, int k, int K) {
  std::filesystem::path out = path;
  out.replace_filename(path.stem().string() + "-tp" + std::to_string(k) + "-of-" + std::to_string(K) +
                       path.extension().string());
  return out;
}

}  // namespace detail

/// Writes the fp32 masters of checkpoint `<dir>/<tag>` to `out` as safetensors (see the file
/// comment). `__metadata__` carries "format": "pt" (what transformers expects) and the checkpoint's
/// tag, global step count, world size and stage.
inline ExportResult export_safetensors(const std::filesystem::path& dir, const std::filesystem::path& out,
                                       const ExportOptions& options = {}) {
  detail::check_dtype(options.dtype, "checkpoint::export_safetensors");
  const std::string tag = options.tag ? *options.tag : read_latest(dir);
  const Manifest m = read_manifest(dir, tag);
  const std::filesystem::path tdir = tag_path(dir, tag);
  const WholeIndex index(m, (tdir / kManifestFile).string());
  const std::vector<WholeParam>& params = index.params();
  io::SafetensorsWriter writer(out, detail::export_tensors(params, options.dtype), detail::export_metadata(tag, m));
  detail::RankFiles files(tdir, m);
  std::vector<float> buf;
  for (std::size_t i = 0; i < params.size(); ++i) {
    detail::for_each_piece(index, i, [&](int rank, const std::string& section, std::uint64_t src, std::uint64_t, std::uint64_t numel) {
      for (std::uint64_t done = 0; done < numel;) {
        const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(numel - done, kExportChunk));
        buf.resize(n);
        files[rank].read(section, ElementType::fp32, src + done, std::span<float>(buf));
        writer.write_from_fp32(i, buf);
        done += n;
      }
    });
    if (options.on_tensor) options.on_tensor(i + 1, params.size());
  }
  writer.finish();
  return ExportResult{tag, params.size(), writer.layout().header.size() + writer.layout().data_bytes, {out}};
}

/// The checkpoint's fp32 masters cut for `tensor` ranks, one safetensors file per rank
/// (detail::tensor_rank_file: model.safetensors -> model-tp0-of-4.safetensors, ...): Megatron's
/// layout, what a tensor-parallel inference server loads per rank. A parameter the checkpoint
/// records as split (saved at tensor >= 2; or, saved at tensor 1, one that `options.splits` names)
/// holds in file k the elements tensor rank k of `tensor` holds (parallel::full_index: a fused
/// part's rows cut part by part); any other is whole in every file. Each file's metadata adds
/// "zerotk_tensor_rank", "zerotk_tensor_size" and, per split tensor, "zerotk_split.<name>" ("rows 3":
/// the dimension and fused parts). Each tensor is read whole once (memory: the largest tensor in
/// fp32); each file appears atomically, and the set only whole (a failing file removes the finished
/// ones; all K are open at once, so K is bounded by the open-file limit). A split `tensor` does not
/// divide, or a tensor 1 checkpoint without `options.splits` at tensor > 1, is a usage_error naming
/// the parameter.
inline ExportResult export_tensor_parallel(const std::filesystem::path& dir, const std::filesystem::path& out, int tensor,
                                           const ExportOptions& options = {}) {
  constexpr const char* kWhere = "checkpoint::export_tensor_parallel";
  detail::check_dtype(options.dtype, kWhere);
  if (tensor < 1) throw usage_error("the tensor size must be >= 1", kWhere, std::to_string(tensor));
  const std::string tag = options.tag ? *options.tag : read_latest(dir);
  const Manifest m = read_manifest(dir, tag);
  const std::filesystem::path tdir = tag_path(dir, tag);
  const WholeIndex index(m, (tdir / kManifestFile).string());
  const std::vector<WholeParam>& params = index.params();
  bool recorded = false;
  for (const engine::ShardParam& p : m.shards.params) recorded = recorded || p.is_shard();
  if (recorded && !options.splits.empty()) {
    throw usage_error("the checkpoint records its parameters' tensor splits (saved at tensor >= 2): give no split rules",
                      kWhere, options.splits.front().pattern);
  }
  if (!recorded && options.splits.empty() && tensor > 1) {
    throw usage_error("the checkpoint was saved at tensor 1 and records no tensor splits: say which parameters split how "
                      "(ExportOptions::splits; zerotk-ckpt export --split NAME=rows[:PARTS]|cols[:PARTS])",
                      kWhere, (dir / tag).string());
  }
  // Each parameter's split and matrix shape, checked against `tensor`.
  std::vector<parallel::TensorSplit> split(params.size());
  std::vector<parallel::MatrixShape> shape(params.size());
  std::vector<std::vector<io::TensorInfo>> infos(static_cast<std::size_t>(tensor));
  for (std::size_t i = 0; i < params.size(); ++i) {
    const WholeParam& w = params[i];
    const engine::ShardParam& first = m.shards.params[w.entries.front()];
    if (recorded) {
      split[i] = first.is_shard() ? first.tensor_split : parallel::TensorSplit::replicated();
    } else {
      for (const SplitRule& r : options.splits) {
        if (glob_match(r.pattern, w.name)) {
          split[i] = r.split;
          break;
        }
      }
    }
    const std::uint64_t rows = w.shape.empty() ? 1 : w.shape[0];
    shape[i] = parallel::MatrixShape{static_cast<std::size_t>(rows), static_cast<std::size_t>(rows ? w.numel / rows : 0)};
    std::vector<std::uint64_t> shard = w.shape;
    if (split[i].is_split()) {
      if (w.shape.empty()) throw usage_error("a scalar cannot be split", kWhere, w.name);
      const bool cols = split[i].dim == parallel::SplitDim::cols;
      if (cols && w.shape.size() != 2) {
        throw usage_error("a column split needs a 2-D tensor", kWhere, w.name + " of " + std::to_string(w.shape.size()) + " dimensions");
      }
      if (const std::string problem = parallel::split_problem(shape[i], split[i], tensor); !problem.empty()) {
        throw usage_error(problem, kWhere, w.name + " " + parallel::to_text(shape[i]) + ", " + parallel::to_text(split[i]) +
                                               ", tensor " + std::to_string(tensor));
      }
      shard[cols ? 1 : 0] /= static_cast<std::uint64_t>(tensor);
    }
    for (auto& list : infos) list.push_back(io::TensorInfo{w.name, options.dtype, shard});
  }
  std::vector<std::unique_ptr<io::SafetensorsWriter>> writers;
  ExportResult result{tag, params.size(), 0, {}};
  for (int k = 0; k < tensor; ++k) {
    io::SafetensorsMetadata meta = detail::export_metadata(tag, m);
    meta.emplace("zerotk_tensor_rank", std::to_string(k));
    meta.emplace("zerotk_tensor_size", std::to_string(tensor));
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (!split[i].is_split()) continue;
      meta.emplace("zerotk_split." + params[i].name, std::string(split[i].dim == parallel::SplitDim::rows ? "rows " : "cols ") +
                                                          std::to_string(split[i].parts));
    }
    result.files.push_back(detail::tensor_rank_file(out, k, tensor));
    writers.push_back(std::make_unique<io::SafetensorsWriter>(result.files.back(), infos[static_cast<std::size_t>(k)], meta));
  }
  detail::RankFiles files(tdir, m);
  std::vector<float> whole, part;
  for (std::size_t i = 0; i < params.size(); ++i) {
    whole.resize(static_cast<std::size_t>(params[i].numel));
    detail::for_each_piece(index, i, [&](int rank, const std::string& section, std::uint64_t src, std::uint64_t dst, std::uint64_t numel) {
      files[rank].read(section, ElementType::fp32, src, std::span<float>(whole.data() + dst, static_cast<std::size_t>(numel)));
    });
    for (int k = 0; k < tensor; ++k) {
      if (!split[i].is_split()) {
        writers[static_cast<std::size_t>(k)]->write_from_fp32(i, whole);
        continue;
      }
      part.resize(whole.size() / static_cast<std::size_t>(tensor));
      parallel::for_each_run(shape[i], split[i], k, tensor, 0, part.size(), [&](std::size_t at, std::size_t full_at, std::size_t n) {
        std::copy_n(whole.data() + full_at, n, part.data() + at);
      });
      writers[static_cast<std::size_t>(k)]->write_from_fp32(i, part);
    }
    if (options.on_tensor) options.on_tensor(i + 1, params.size());
  }
  // Each file appears atomically; the set is kept only whole: a later file that fails takes the
  // finished ones away again.
  std::size_t finished = 0;
  try {
    for (auto& w : writers) {
      w->finish();
      ++finished;
      result.bytes += w->layout().header.size() + w->layout().data_bytes;
    }
  } catch (...) {
    std::error_code ec;
    for (std::size_t k = 0; k < finished; ++k) std::filesystem::remove(result.files[k], ec);
    throw;
  }
  return result;
}

}  // namespace zerotk::checkpoint
