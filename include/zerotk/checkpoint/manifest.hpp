#pragma once
/// \file zerotk/checkpoint/manifest.hpp
/// The manifest of one checkpoint: a small text file of `key value` lines that a person can read,
/// ending with the XXH3-64 of every line before it. (Plain text rather than JSON keeps the
/// checkpoint layer free of nlohmann-json; nothing in it is nested.) Example:
///
///   zerotk_checkpoint 2
///   tag global_step3
///   world_size 2
///   stage 2
///   precision fp16
///   optimizer AdamW
///   optimizer_states exp_avg exp_avg_sq
///   rank_local_state yes                                 only with compressed communication (rank_file.hpp)
///   sparsity_masks 1 0                                   once Sparsity's N:M masks are chosen: per
///                                                        group, whether some rank holds its masks
///   model.heads 4                                        the model's declared structure, when saved with one
///                                                        (SaveOptions::model_structure; compared on load)
///   parameter_count 496
///   flat_numel 504
///   parameters 2
///   param0 0 0 384 fp16 [16,24] fc1.weight               flat group, optimizer group, numel, dtype, shape, name
///   param1 0 0 112 fp16 [112] fc1.bias
///   param1.tensor 1 2 rows 3                             version 3, a split parameter's shard: tensor
///                                                        index, tensor size, split dim, fused parts
///   groups 1
///   group0.optimizer_step 2
///   group0.owned_numel 252 252                           one count per rank, padding included
///   group0.rank0.fragments 0:0:252@0                     param:offset:numel@owned offset, ...
///   group0.rank1.fragments 0:252:132@0 1:0:112@132
///   micro_steps 6
///   global_steps 3
///   skipped_steps 1
///   scaler.scale 256                                     shortest text that reads back to the same double
///   scaler.iter 3
///   scaler.last_overflow_iter 1
///   scaler.hyst 1
///   scheduler.last_batch_iteration 1                     or "scheduler none"
///   file.client_state client_state.bin 82 1a8e34848717db1c   name, bytes, XXH3-64
///   file.rank0 rank0.bin 3163 fda6f88c762dd620
///   file.rank1 rank1.bin 3163 7e36074aca58227a
///   checksum 909bbe5696585509
///
/// The parameter and fragment tables (engine/shards.hpp) say which rank holds which range of every
/// parameter: what loading on another world size or stage, and exporting whole tensors, read.

#include <algorithm>
#include <charconv>
#include <limits>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "zerotk/checkpoint/checksum.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/utf8.hpp"
#include "zerotk/engine/shards.hpp"
#include "zerotk/optim/schedulers.hpp"
#include "zerotk/precision/loss_scaler.hpp"

namespace zerotk::checkpoint {

/// Version 3 adds `param<i>.tensor` lines (parameters split across a tensor group); a checkpoint
/// without split parameters is still written as version 2, which every zerotk since reads.
inline constexpr std::uint32_t kManifestVersion = 3;
inline constexpr std::uint32_t kManifestVersionWhole = 2;

/// A data file of the checkpoint: its name in the tag directory, size and checksum.
struct FileRecord {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t checksum = 0;
};

/// An io_error naming `path` unless `actual_bytes` is the size `rec` records.
inline void check_recorded_size(const FileRecord& rec, std::uint64_t actual_bytes, const std::string& path) {
  if (actual_bytes != rec.bytes) {
    throw io_error(actual_bytes < rec.bytes ? "truncated: shorter than the manifest records" : "longer than the manifest records",
                   path, std::to_string(actual_bytes) + " bytes, manifest says " + std::to_string(rec.bytes));
  }
}

/// An io_error naming `path` unless `computed` (the checksum of the whole file) is the one `rec` records.
inline void check_recorded_checksum(const FileRecord& rec, std::uint64_t computed, const std::string& path) {
  if (computed != rec.checksum) {
    throw io_error("checksum differs from the manifest's (the file is corrupt, or from another checkpoint)", path,
                   "computed " + to_hex(computed) + ", manifest says " + to_hex(rec.checksum));
  }
}

struct Manifest {
  std::string tag;
  int world_size = 1;
  int stage = 0;
  std::string precision;                     ///< dtype of the working precision ("fp16", ...)
  std::string optimizer;                     ///< "Adam", "AdamW", "Lamb"
  std::vector<std::string> optimizer_states;  ///< per-element state names, in file order
  std::map<std::string, std::string> model;  ///< the model's declared structure (`model.<key> <value>`; SaveOptions)
  bool rank_local = false;                   ///< rank files hold each group's rank-local state (key
                                             ///< `rank_local_state yes`, absent otherwise)
  /// Per flat group, whether Sparsity's N:M masks were saved for it (key `sparsity_masks`, one 0/1
  /// per group); empty: none (the key absent). Rank files then hold a mask section for every group.
  std::vector<char> sparsity_groups;
  bool sparsity_masks() const noexcept { return !sparsity_groups.empty(); }
  std::uint64_t parameter_count = 0;         ///< Psi, padding excluded
  std::uint64_t flat_numel = 0;              ///< padded elements of the flat buffers
  engine::ShardTable shards;                 ///< parameters, and per flat group each rank's fragments
  std::vector<std::int64_t> optimizer_steps;  ///< [flat group] the optimizer's step count
  std::int64_t micro_steps = 0, global_steps = 0, skipped_steps = 0;
  LossScalerState scaler;
  std::optional<optim::SchedulerState> scheduler;
  FileRecord client_state;
  std::vector<FileRecord> rank_files;  ///< [rank]
};

namespace detail {

inline std::string double_text(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, r.ptr);
}

inline void put_file(std::ostringstream& os, const std::string& key, const FileRecord& f) {
  os << key << ' ' << f.name << ' ' << f.bytes << ' ' << to_hex(f.checksum) << '\n';
}

}  // namespace detail

/// The manifest's text, checksum line included.
inline std::string to_text(const Manifest& m) {
  std::ostringstream os;
  const bool split = std::any_of(m.shards.params.begin(), m.shards.params.end(), [](const auto& p) { return p.is_shard(); });
  os << "zerotk_checkpoint " << (split ? kManifestVersion : kManifestVersionWhole) << "\ntag " << m.tag << "\nworld_size " << m.world_size
     << "\nstage " << m.stage << "\nprecision " << m.precision << "\noptimizer " << m.optimizer << "\noptimizer_states";
  for (const std::string& s : m.optimizer_states) os << ' ' << s;
  if (m.rank_local) os << "\nrank_local_state yes";
  if (m.sparsity_masks()) {
    os << "\nsparsity_masks";
    for (char g : m.sparsity_groups) os << ' ' << (g ? 1 : 0);
  }
  for (const auto& [key, value] : m.model) os << "\nmodel." << key << ' ' << value;
  os << "\nparameter_count " << m.parameter_count << "\nflat_numel " << m.flat_numel << "\nparameters "
     << m.shards.params.size() << '\n';
  for (std::size_t i = 0; i < m.shards.params.size(); ++i) {
    const engine::ShardParam& p = m.shards.params[i];
    os << "param" << i << ' ' << p.group << ' ' << p.optimizer_group << ' ' << p.numel << ' ' << p.dtype << " [";
    for (std::size_t d = 0; d < p.shape.size(); ++d) os << (d ? "," : "") << p.shape[d];
    os << "] " << p.name << '\n';
    if (p.is_shard()) {
      os << "param" << i << ".tensor " << p.tensor_index << ' ' << p.tensor_size << ' '
         << (p.tensor_split.dim == parallel::SplitDim::rows ? "rows" : "cols") << ' ' << p.tensor_split.parts << '\n';
    }
  }
  os << "groups " << m.shards.owned_numel.size() << '\n';
  for (std::size_t g = 0; g < m.shards.owned_numel.size(); ++g) {
    const std::string group = "group" + std::to_string(g);
    os << group << ".optimizer_step " << m.optimizer_steps[g] << '\n' << group << ".owned_numel";
    for (std::uint64_t n : m.shards.owned_numel[g]) os << ' ' << n;
    os << '\n';
    for (std::size_t r = 0; r < m.shards.fragments[g].size(); ++r) {
      os << group << ".rank" << r << ".fragments";
      for (const zero::Fragment& f : m.shards.fragments[g][r]) {
        os << ' ' << f.param << ':' << f.param_offset << ':' << f.numel << '@' << f.owned_offset;
      }
      os << '\n';
    }
  }
  os << "micro_steps " << m.micro_steps << "\nglobal_steps " << m.global_steps << "\nskipped_steps " << m.skipped_steps
     << "\nscaler.scale " << detail::double_text(m.scaler.scale) << "\nscaler.iter " << m.scaler.iter
     << "\nscaler.last_overflow_iter " << m.scaler.last_overflow_iter << "\nscaler.hyst " << m.scaler.hyst << '\n';
  if (m.scheduler) {
    os << "scheduler.last_batch_iteration " << m.scheduler->last_batch_iteration << '\n';
  } else {
    os << "scheduler none\n";
  }
  detail::put_file(os, "file.client_state", m.client_state);
  for (std::size_t r = 0; r < m.rank_files.size(); ++r) detail::put_file(os, "file.rank" + std::to_string(r), m.rank_files[r]);
  std::string body = os.str();
  return body + "checksum " + to_hex(checksum(body)) + "\n";
}

namespace detail {

/// The `key value` lines of a manifest; each accessor consumes a key and reports errors at "path: key".
class ManifestFields {
 public:
  ManifestFields(std::string_view body, std::string path) : path_(std::move(path)) {
    std::size_t line = 0;
    while (!body.empty()) {
      ++line;
      const std::size_t nl = body.find('\n');
      const std::string_view l = body.substr(0, nl);
      body = nl == std::string_view::npos ? std::string_view() : body.substr(nl + 1);
      const std::size_t sp = l.find(' ');
      const std::string key(l.substr(0, sp));
      if (key.empty()) throw io_error("malformed manifest line", path_ + ":" + std::to_string(line), std::string(l));
      if (!fields_.emplace(key, sp == std::string_view::npos ? "" : std::string(l.substr(sp + 1))).second) {
        throw io_error("duplicate manifest key", where(key));
      }
    }
  }

  bool has(const std::string& key) const { return fields_.count(key) != 0; }
  /// Every key that starts with `prefix`, read (the prefix cut off) -> its value.
  std::map<std::string, std::string> take_prefixed(const std::string& prefix) {
    std::map<std::string, std::string> out;
    for (auto it = fields_.lower_bound(prefix); it != fields_.end() && it->first.starts_with(prefix);) {
      out.emplace(it->first.substr(prefix.size()), it->second);
      it = fields_.erase(it);
    }
    return out;
  }
  std::string text(const std::string& key) {
    const auto it = fields_.find(key);
    if (it == fields_.end()) throw io_error("manifest key is missing", where(key));
    std::string v = it->second;
    fields_.erase(it);
    return v;
  }
  template <class T>
  T number(const std::string& key) {
    return parse<T>(text(key), key);
  }
  std::vector<std::string> words(const std::string& key) {
    std::vector<std::string> out;
    std::istringstream is(text(key));
    for (std::string w; is >> w;) out.push_back(w);
    return out;
  }
  template <class T>
  T parse(const std::string& v, const std::string& key) const {
    T out{};
    const auto r = std::from_chars(v.data(), v.data() + v.size(), out);
    if (r.ec != std::errc() || r.ptr != v.data() + v.size()) throw io_error("malformed number", where(key), "\"" + v + "\"");
    return out;
  }
  /// Every key must have been read: one left over was written by another format.
  void expect_all_read() const {
    if (!fields_.empty()) throw io_error("unknown manifest key", where(fields_.begin()->first));
  }
  std::string where(const std::string& key) const { return path_ + ": " + key; }

 private:
  std::map<std::string, std::string> fields_;
  std::string path_;
};

inline FileRecord read_file_record(ManifestFields& f, const std::string& key) {
  const std::vector<std::string> w = f.words(key);
  if (w.size() != 3 || w[2].size() != 16) throw io_error("expected: name bytes checksum", f.where(key));
  FileRecord r;
  r.name = w[0];
  r.bytes = f.parse<std::uint64_t>(w[1], key);
  std::uint64_t c = 0;
  const auto res = std::from_chars(w[2].data(), w[2].data() + w[2].size(), c, 16);
  if (res.ec != std::errc() || res.ptr != w[2].data() + w[2].size()) throw io_error("malformed checksum", f.where(key), w[2]);
  r.checksum = c;
  return r;
}

/// Splits off the last line ("checksum <hex>") and verifies it against the lines before it.
inline std::string_view verified_body(std::string_view text, const std::string& path) {
  if (text.empty() || text.back() != '\n') throw io_error("truncated: no final newline", path);
  const std::size_t start = text.rfind('\n', text.size() - 2);
  const std::size_t body_end = start == std::string_view::npos ? 0 : start + 1;
  const std::string_view last = text.substr(body_end, text.size() - 1 - body_end);
  const std::string_view body = text.substr(0, body_end);
  const std::string expected = "checksum " + to_hex(checksum(body));
  if (last.substr(0, 9) != "checksum ") throw io_error("truncated: the checksum line is missing", path, std::string(last));
  if (last != expected) {
    throw io_error("manifest checksum mismatch (the file is corrupt)", path + ": checksum",
                   "stored " + std::string(last.substr(9)) + ", computed " + expected.substr(9));
  }
  return body;
}

/// "index size rows|cols parts": which tensor rank's shard entry `p` is, of a split its shape allows.
inline void read_tensor_placement(ManifestFields& f, const std::string& key, engine::ShardParam& p) {
  const std::vector<std::string> w = f.words(key);
  if (w.size() != 4 || (w[2] != "rows" && w[2] != "cols")) {
    throw io_error("expected: tensor_index tensor_size rows|cols parts", f.where(key));
  }
  p.tensor_index = f.parse<int>(w[0], key);
  p.tensor_size = f.parse<int>(w[1], key);
  p.tensor_split = w[2] == "rows" ? parallel::TensorSplit::rows(f.parse<int>(w[3], key))
                                  : parallel::TensorSplit::cols(f.parse<int>(w[3], key));
  const std::string text = w[0] + " " + w[1] + " " + w[2] + " " + w[3];
  if (p.tensor_size < 2 || p.tensor_index < 0 || p.tensor_index >= p.tensor_size || p.tensor_split.parts < 1) {
    throw io_error("needs a tensor size >= 2, an index below it and >= 1 fused part", f.where(key), text);
  }
  const bool cols = p.tensor_split.dim == parallel::SplitDim::cols;
  if (cols && p.shape.size() != 2) throw io_error("a column split needs a 2-dimensional shape", f.where(key), text);
  const std::uint64_t extent = cols ? p.shape[1] : p.shape.at(0);
  if (extent % static_cast<std::uint64_t>(p.tensor_split.parts) != 0) {
    throw io_error("the shard's split dimension does not divide into the fused parts", f.where(key), text);
  }
}

/// "g og numel dtype [d0,d1,...] name": one parameter of the table (the name is the rest of the line).
inline engine::ShardParam read_param(ManifestFields& f, const std::string& key) {
  const std::string v = f.text(key);
  std::size_t pos = 0;
  auto word = [&] {
    const std::size_t sp = v.find(' ', pos);
    if (sp == std::string::npos) throw io_error("expected: group optimizer_group numel dtype [shape] name", f.where(key), v);
    std::string w = v.substr(pos, sp - pos);
    pos = sp + 1;
    return w;
  };
  engine::ShardParam p;
  p.group = f.parse<std::uint32_t>(word(), key);
  p.optimizer_group = f.parse<std::uint32_t>(word(), key);
  p.numel = f.parse<std::uint64_t>(word(), key);
  p.dtype = word();
  if (p.dtype != "fp32" && p.dtype != "fp16" && p.dtype != "bf16") throw io_error("unknown dtype", f.where(key), p.dtype);
  const std::string shape = word();
  if (shape.size() < 2 || shape.front() != '[' || shape.back() != ']') throw io_error("malformed shape", f.where(key), shape);
  std::uint64_t product = 1;
  for (std::size_t a = 1; a + 1 < shape.size();) {
    const std::size_t b = std::min(shape.find(',', a), shape.size() - 1);
    p.shape.push_back(f.parse<std::uint64_t>(shape.substr(a, b - a), key));
    product = p.shape.back() != 0 && product > std::numeric_limits<std::uint64_t>::max() / p.shape.back() ? std::numeric_limits<std::uint64_t>::max() : product * p.shape.back();
    a = b + 1;
  }
  if (product != p.numel) throw io_error("the shape's product differs from numel", f.where(key), shape + " vs " + std::to_string(p.numel));
  p.name = v.substr(pos);
  if (f.has(key + ".tensor")) read_tensor_placement(f, key + ".tensor", p);
  return p;
}

/// "p:offset:numel@owned ..." of rank r in group g, each checked against the tables.
inline std::vector<zero::Fragment> read_fragments(ManifestFields& f, const std::string& key, const Manifest& m, std::size_t g,
                                                  std::uint64_t owned) {
  std::vector<zero::Fragment> out;
  for (const std::string& w : f.words(key)) {
    const std::size_t c1 = w.find(':'), c2 = w.find(':', c1 == std::string::npos ? c1 : c1 + 1), at = w.find('@');
    if (c1 == std::string::npos || c2 == std::string::npos || at == std::string::npos || !(c1 < c2 && c2 < at)) {
      throw io_error("malformed fragment (expected param:offset:numel@owned_offset)", f.where(key), w);
    }
    zero::Fragment fr;
    fr.param = f.parse<std::uint32_t>(w.substr(0, c1), key);
    fr.param_offset = f.parse<std::uint64_t>(w.substr(c1 + 1, c2 - c1 - 1), key);
    fr.numel = f.parse<std::uint64_t>(w.substr(c2 + 1, at - c2 - 1), key);
    fr.owned_offset = f.parse<std::uint64_t>(w.substr(at + 1), key);
    if (fr.param >= m.shards.params.size() || m.shards.params[fr.param].group != g) {
      throw io_error("fragment of a parameter that is not in this group", f.where(key), w);
    }
    const std::uint64_t numel = m.shards.params[fr.param].numel;
    if (fr.param_offset > numel || fr.numel > numel - fr.param_offset || fr.owned_offset > owned ||
        fr.numel > owned - fr.owned_offset) {
      throw io_error("fragment outside its parameter or the rank's owned elements", f.where(key), w);
    }
    out.push_back(fr);
  }
  return out;
}

/// Every element of every parameter must be held by some rank, or nothing could be restored.
inline void check_coverage(const Manifest& m, const std::string& path) {
  std::vector<std::vector<std::pair<std::uint64_t, std::uint64_t>>> pieces(m.shards.params.size());
  for (const auto& ranks : m.shards.fragments) {
    for (const auto& frags : ranks) {
      for (const zero::Fragment& fr : frags) pieces[fr.param].emplace_back(fr.param_offset, fr.param_offset + fr.numel);
    }
  }
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    std::sort(pieces[i].begin(), pieces[i].end());
    std::uint64_t covered = 0;
    for (const auto& [a, b] : pieces[i]) {
      if (a > covered) break;
      covered = std::max(covered, b);
    }
    if (covered < m.shards.params[i].numel) {
      throw io_error("no rank holds elements " + std::to_string(covered) + ".. of parameter " + std::to_string(i), path,
                     "\"" + m.shards.params[i].name + "\"");
    }
  }
}

inline void read_structure(ManifestFields& f, Manifest& m) {
  m.tag = f.text("tag");
  m.world_size = f.number<int>("world_size");
  if (m.world_size < 1) throw io_error("must be >= 1", f.where("world_size"), std::to_string(m.world_size));
  m.stage = f.number<int>("stage");
  m.precision = f.text("precision");
  m.optimizer = f.text("optimizer");
  m.optimizer_states = f.words("optimizer_states");
  if (f.has("rank_local_state")) {
    if (const std::string v = f.text("rank_local_state"); v != "yes") throw io_error("expected \"yes\"", f.where("rank_local_state"), v);
    m.rank_local = true;
  }
  if (f.has("sparsity_masks")) {
    for (const std::string& w : f.words("sparsity_masks")) {
      if (w != "0" && w != "1") throw io_error("expected 0 or 1 per group", f.where("sparsity_masks"), w);
      m.sparsity_groups.push_back(w == "1" ? 1 : 0);
    }
  }
  m.model = f.take_prefixed("model.");
  m.parameter_count = f.number<std::uint64_t>("parameter_count");
  m.flat_numel = f.number<std::uint64_t>("flat_numel");
  const auto params = f.number<std::size_t>("parameters");
  const auto groups = f.number<std::size_t>("groups");
  if (groups > 2) throw io_error("at most 2 groups", f.where("groups"), std::to_string(groups));
  std::uint64_t psi = 0;
  for (std::size_t i = 0; i < params; ++i) {
    const std::string key = "param" + std::to_string(i);
    m.shards.params.push_back(read_param(f, key));
    if (m.shards.params.back().group >= groups) throw io_error("no such group", f.where(key), std::to_string(m.shards.params.back().group));
    psi += m.shards.params.back().numel;
  }
  if (psi != m.parameter_count) {
    throw io_error("the parameters' element counts do not add up to parameter_count", f.where("parameters"), std::to_string(psi));
  }
  for (std::size_t g = 0; g < groups; ++g) {
    const std::string group = "group" + std::to_string(g);
    m.optimizer_steps.push_back(f.number<std::int64_t>(group + ".optimizer_step"));
    const std::string key = group + ".owned_numel";
    std::vector<std::uint64_t> counts;
    for (const std::string& w : f.words(key)) counts.push_back(f.parse<std::uint64_t>(w, key));
    if (counts.size() != static_cast<std::size_t>(m.world_size)) {
      throw io_error("one count per rank expected", f.where(key), std::to_string(counts.size()) + " counts");
    }
    auto& ranks = m.shards.fragments.emplace_back();
    for (int r = 0; r < m.world_size; ++r) {
      ranks.push_back(read_fragments(f, group + ".rank" + std::to_string(r) + ".fragments", m, g, counts[static_cast<std::size_t>(r)]));
    }
    m.shards.owned_numel.push_back(std::move(counts));
  }
}

inline void read_counters(ManifestFields& f, Manifest& m) {
  m.micro_steps = f.number<std::int64_t>("micro_steps");
  m.global_steps = f.number<std::int64_t>("global_steps");
  m.skipped_steps = f.number<std::int64_t>("skipped_steps");
  m.scaler.scale = f.number<double>("scaler.scale");
  m.scaler.iter = f.number<std::int64_t>("scaler.iter");
  m.scaler.last_overflow_iter = f.number<std::int64_t>("scaler.last_overflow_iter");
  m.scaler.hyst = f.number<int>("scaler.hyst");
  if (f.has("scheduler")) {
    if (const std::string v = f.text("scheduler"); v != "none") throw io_error("expected \"none\"", f.where("scheduler"), v);
  } else {
    m.scheduler = optim::SchedulerState{f.number<std::int64_t>("scheduler.last_batch_iteration")};
  }
}

}  // namespace detail

/// Highest ZeRO stage a checkpoint can hold.
inline constexpr int kMaxStage = 3;

/// Checks that every value of `m` is in its range, whoever wrote it: a manifest edited by hand (its
/// checksum recomputed) must not reach an engine with a negative step count or a NaN loss scale.
/// parse_manifest() calls it, so verify(), load(), export and zerotk-ckpt check the same rules. Each
/// failure is an io_error at "`path`: key" (the manifest key) with the offending value. The rules:
///   world_size >= 1; stage in [0, kMaxStage]; precision fp32, fp16 or bf16;
///   group<g>.optimizer_step >= 0; micro_steps >= 0; global_steps >= 0 (skipped steps included);
///   skipped_steps in [0, global_steps];
///   scaler.*: what every loss scaler's load_state() requires (precision::loss_scaler_state_problem:
///   scale positive and finite, iter >= 0, last_overflow_iter in [-1, iter), hyst >= 0);
///   scheduler.last_batch_iteration >= -1 (what LrScheduler::load_state requires: optim::detail::check_iteration).
inline void check_manifest_values(const Manifest& m, const std::string& path) {
  const auto bad = [&](const std::string& key, const std::string& rule, const std::string& value) {
    throw io_error(rule, path + ": " + key, value);
  };
  if (m.world_size < 1) bad("world_size", "must be >= 1", std::to_string(m.world_size));
  if (m.stage < 0 || m.stage > kMaxStage) bad("stage", "ZeRO stage must be 0, 1, 2 or 3", std::to_string(m.stage));
  if (m.precision != "fp32" && m.precision != "fp16" && m.precision != "bf16") {
    bad("precision", "must be fp32, fp16 or bf16", "\"" + printable(m.precision, 80) + "\"");
  }
  for (std::size_t g = 0; g < m.optimizer_steps.size(); ++g) {
    if (m.optimizer_steps[g] < 0) {
      bad("group" + std::to_string(g) + ".optimizer_step", "must be >= 0", std::to_string(m.optimizer_steps[g]));
    }
  }
  if (m.micro_steps < 0) bad("micro_steps", "must be >= 0", std::to_string(m.micro_steps));
  if (m.global_steps < 0) bad("global_steps", "must be >= 0", std::to_string(m.global_steps));
  if (m.skipped_steps < 0 || m.skipped_steps > m.global_steps) {
    bad("skipped_steps", "must be in [0, global_steps] (global_steps counts skipped steps too)", std::to_string(m.skipped_steps));
  }
  if (const std::optional<precision::LossScalerStateProblem> p = precision::loss_scaler_state_problem(m.scaler)) {
    bad("scaler." + std::string(p->field), p->rule, p->value);
  }
  if (m.scheduler) {
    try {
      optim::detail::check_iteration(m.scheduler->last_batch_iteration, "");
    } catch (const usage_error& e) {
      bad("scheduler.last_batch_iteration", e.message(), e.value());
    }
  }
}

/// Parses and verifies a manifest (`path` is for errors): checksum first, then every key, then
/// every value's range (check_manifest_values).
inline Manifest parse_manifest(std::string_view text, const std::string& path) {
  detail::ManifestFields f(detail::verified_body(text, path), path);
  const auto version = f.number<std::uint32_t>("zerotk_checkpoint");
  if (version != kManifestVersion && version != kManifestVersionWhole) {
    throw io_error("unsupported manifest version", f.where("zerotk_checkpoint"),
                   std::to_string(version) + ", this zerotk reads " + std::to_string(kManifestVersionWhole) + " and " +
                       std::to_string(kManifestVersion));
  }
  Manifest m;
  detail::read_structure(f, m);
  detail::read_counters(f, m);
  detail::check_coverage(m, path);
  m.client_state = detail::read_file_record(f, "file.client_state");
  for (int r = 0; r < m.world_size; ++r) m.rank_files.push_back(detail::read_file_record(f, "file.rank" + std::to_string(r)));
  f.expect_all_read();
  check_manifest_values(m, path);
  return m;
}

}  // namespace zerotk::checkpoint
