#pragma once
/// \file zerotk/config/reader.hpp
/// DeepSpeed JSON -> zerotk::config::Config. Reads every key of SEMANTICS.md with DeepSpeed's
/// defaults, resolves "auto" from a ResolveContext, applies the batch rules, and checks what
/// DeepSpeed checks (SEMANTICS.md section 12) plus what it lets slip (unknown top-level keys,
/// duplicates, strings where numbers belong). All problems are collected, never just the first.
///
///   zerotk::config::ResolveContext ctx{.world_size = 8, .hidden_size = 4096};
///   auto r = zerotk::config::parse(text, ctx);          // never throws; r.errors lists everything
///   zerotk::config::Config c = zerotk::config::load_file("ds_config.json", ctx);  // throws one summary

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <new>
#include <system_error>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "zerotk/config/context.hpp"
#include "zerotk/config/diagnostics.hpp"
#include "zerotk/config/json_dom.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/config/structure.hpp"
#include "zerotk/io/durable_file.hpp"

namespace zerotk::config {

/// What parse()/read() produce. `config` is set exactly when `errors` is empty.
struct ParseResult {
  std::optional<Config> config;
  /// At most Diagnostics::kMaxErrors errors, then one "stopped after ..." record when more were found.
  std::vector<config_error> errors;
  /// How many errors were found beyond those in `errors` (0 when all are there).
  std::size_t errors_not_shown = 0;
  std::vector<Notice> notices;
  bool ok() const noexcept { return errors.empty(); }
};

namespace detail {

enum class Got : std::uint8_t { absent, value, automatic, invalid };

/// A DeepSpeed key zerotk accepts but does not act on. No notice is given when the value is
/// null, false, an object with "enabled": false, or equal to `inert` (JSON text).
struct Unsupported {
  std::string_view key;
  std::string_view inert = {};
  std::string_view why = "not supported by zerotk yet; ignored";
};
constexpr std::string_view kTorchOnly = "has no effect in zerotk (it configures PyTorch-side behaviour); ignored";

class Reader;

/// One JSON object being read: hands out its members by key and remembers which keys it knows.
class Block {
 public:
  Block(Reader& r, const Json* obj, std::string path);

  const std::string& path() const noexcept { return path_; }
  std::string path_of(std::string_view key) const { return join_path(path_, key); }
  bool present() const noexcept { return obj_ != nullptr; }

  /// The member `key`, or null when absent. Marks `key` as known.
  const Json* find(std::string_view key);
  /// Like find(), but `alias` is another accepted name (DeepSpeed's pydantic aliases); both given is an error.
  const Json* find(std::string_view key, std::string_view alias, std::string* used = nullptr);

  Got get_bool(std::string_view key, bool& out, bool auto_ok = false);
  Got get_int(std::string_view key, std::int64_t& out, std::int64_t lo, std::int64_t hi, bool auto_ok = false,
              std::string_view alias = {});
  Got get_int(std::string_view key, int& out, int lo, int hi) {
    std::int64_t v = out;
    Got g = get_int(key, v, lo, hi);
    if (g == Got::value) out = static_cast<int>(v);
    return g;
  }
  /// get_int into an element or byte count (a part's std::size_t member), the same range rules.
  Got get_count(std::string_view key, std::size_t& out, std::int64_t lo,
                std::int64_t hi = std::numeric_limits<std::int64_t>::max(), bool auto_ok = false,
                std::string_view alias = {}) {
    std::int64_t v = static_cast<std::int64_t>(std::min<std::size_t>(out, std::numeric_limits<std::int64_t>::max()));
    Got g = get_int(key, v, lo, hi, auto_ok, alias);
    if (g == Got::value) out = static_cast<std::size_t>(v);
    return g;
  }
  /// A finite number >= lo (> lo when `lo_open`) and <= hi.
  Got get_number(std::string_view key, double& out, double lo, bool lo_open = false,
                 double hi = std::numeric_limits<double>::infinity(), bool auto_ok = false);
  Got get_string(std::string_view key, std::string& out, bool nullable = false);
  Got get_betas(std::string_view key, std::array<double, 2>& out, bool auto_ok = false);
  /// A case-insensitive choice among `names`; `out` receives the index.
  Got get_choice(std::string_view key, std::size_t& out, std::span<const std::string_view> names,
                 bool nullable = false);
  /// A nested object, or null when absent or null. Anything else is an error.
  const Json* get_object(std::string_view key);

  /// Reports the present keys of `list` (notice, or error under ResolveContext::strict), then
  /// hands unknown keys to the Reader, which reports them with suggestions at the end.
  void finish(std::initializer_list<Unsupported> list = {});

 private:
  friend class Reader;
  const Json* typed(std::string_view key, const Json* v, bool ok, std::string_view expected);
  Got integral(const std::string& path, const Json& v, std::int64_t& out);

  Reader& r_;
  const Json* obj_;
  std::string path_;
  std::vector<std::string_view> known_;
  KeyIndex index_;       // built on the first find() in a large object
  bool indexed_ = false;
};

/// Walks a document once. Holds the diagnostics and the known keys of every block, so unknown
/// keys can be matched against the right block ("did you mean /zero_optimization/...?").
struct BatchTriad;  // config/batch.hpp

class Reader {
 public:
  Reader(const ResolveContext& ctx, Diagnostics& diag) : ctx(ctx), diag(diag) {}

  const ResolveContext& ctx;
  Diagnostics& diag;

  void error(std::string path, std::string rule, std::string value = {}) {
    diag.error(std::move(path), std::move(rule), std::move(value));
  }
  void note(Notice::Kind kind, std::string path, std::string message) {
    diag.notice(kind, std::move(path), std::move(message));
  }
  /// A key accepted without effect: a note saying why, or an error under ResolveContext::strict.
  void unsupported(std::string path, std::string_view why, std::string value) {
    if (ctx.strict) {
      error(std::move(path), cat(why, " (strict mode)"), std::move(value));
    } else {
      note(Notice::Kind::unsupported, std::move(path), std::string(why));
    }
  }

  /// Records how "auto" at `path` was resolved, or the error saying how to set it.
  template <class T>
  bool resolve_auto(const std::string& path, T& out, std::optional<T> value, std::string_view source,
                    std::string_view how_to_set = {}) {
    if (!value) {
      error(path, detail::cat("\"auto\" cannot be resolved here: ", how_to_set), "\"auto\"");
      return false;
    }
    out = *value;
    note(Notice::Kind::auto_resolved, path, detail::cat("\"auto\" resolved to ", text(*value), " (", source, ")"));
    return true;
  }

  void report_unknown_keys();

  Config read(const Json& root);

 private:
  friend class Block;
  // An unknown key kept for the report. Only as many are kept as can be shown; the rest are counted.
  struct Unknown {
    std::string block_path, key, value;
    std::size_t known_begin, known_end;  // its block's known keys in all_known_
  };
  static constexpr std::size_t kMaxKeptKeyChars = 256;  // enough for any suggestion
  void unknown_key(const std::string& block_path, std::string_view key, const Json& value, std::size_t known_begin,
                   std::size_t known_end) {
    if (unknown_.size() < Diagnostics::kMaxErrors) {
      unknown_.push_back(Unknown{block_path, std::string(key.substr(0, kMaxKeptKeyChars)), show(value), known_begin,
                                 known_end});
    } else {
      ++unknown_not_kept_;
    }
  }
  static std::string text(double v) { return num_text(v); }
  static std::string text(std::int64_t v) { return std::to_string(v); }
  static std::string text(std::size_t v) { return std::to_string(v); }
  static std::string text(bool v) { return v ? "true" : "false"; }
  static std::string text(const std::array<double, 2>& v) { return cat("[", num_text(v[0]), ", ", num_text(v[1]), "]"); }

  /// The tensor and pipeline sizes and from them the data-parallel size the batch rules and hpZ
  /// use (config/parallel.hpp). Runs first.
  void read_parallel(Block& root, Config& c);
  int read_tensor_size(Block& root, std::string& from);  // read_parallel's parts, config/parallel.hpp
  void read_expert_size(Block& root, Config& c);
  int read_pipeline_stages(Block& root, Config& c, std::string& pp_from);
  /// After the batch: the pipeline schedule must run its micro-batches (config/parallel.hpp).
  void check_pipeline_schedule(Config& c);
  /// "world 8 / tensor 2" (or "world 8 / (tensor 2 x pipeline 2)"): where the data size came from.
  std::string data_size_origin(const Config& c) const;
  void read_precision(Block& root, Config& c);
  void read_zero(Block& root, Config& c);
  void read_gather_16bit(Block& b, ZeroOptions& z);  // read_zero's parts, config/zero.hpp
  void read_hpz(Block& b, Config& c);
  void read_zero_sizes(Block& b, ZeroOptions& z);
  void read_offload(Block& b, ZeroOptions& z);
  /// An array of distinct non-empty module type names at `path` (absent or null: none).
  void read_module_types(const Json* m, const std::string& path, std::vector<std::string>& names);
  void read_aio(Block& root, Config& c);
  void read_optimizer(Block& root, Config& c);
  std::optional<OptimizerKind> read_optimizer_type(Block& b);  // read_optimizer's parts, config/optimizer.hpp
  void read_optimizer_hyper(Block& p, OptimizerBlock& o);
  void read_optimizer_family(Block& p, OptimizerBlock& o);
  void check_optimizer_rules(Block& p, const OptimizerBlock& o);
  void read_scheduler(Block& root, Config& c);
  void read_warmup_type(Block& p, WarmupType& out);  // read_scheduler's parts, config/optimizer.hpp
  void read_warmup_steps(Block& p, std::int64_t& out);
  void read_total_steps(Block& p, std::optional<std::int64_t>& out, SchedulerKind kind);
  void read_one_cycle(Block& p, SchedulerOptions& s);
  void read_lr_range_test(Block& p, SchedulerOptions& s);
  void check_scheduler_lrs(Block& p, const SchedulerOptions& s);
  void read_batch(Block& root, Config& c);
  bool read_batch_keys(Block& root, BatchTriad& t);  // read_batch's part, config/batch.hpp
  void read_scalars(Block& root, Config& c);
  void read_monitor_and_checkpointing(Block& root, Config& c);
  void read_checkpoint(Block& root, Config& c);
  void read_gradient_compression(Block& root, Config& c);
  void read_communication(Block& root, Config& c);  // config/communication.hpp
  void read_quantized(Block& zero, ZeroOptions& z);  // config/communication.hpp
  void read_sparse_attention(Block& root, Config& c);  // config/sparse_attention.hpp
  void cross_check(Config& c);

  int data_size_ = 1;  // ranks of one data-parallel group: world / (tensor x pipeline) (read_parallel)
  std::vector<Unknown> unknown_;
  std::size_t unknown_not_kept_ = 0;
  std::vector<std::pair<std::string, std::string_view>> all_known_;  // (block path, key)
};

// ---- Block -------------------------------------------------------------------------------------

inline Block::Block(Reader& r, const Json* obj, std::string path) : r_(r), obj_(obj), path_(std::move(path)) {}

inline const Json* Block::find(std::string_view key) {
  known_.push_back(key);
  if (obj_ == nullptr || !obj_->is_object()) return nullptr;
  const Members& m = members_of(*obj_);
  // A block is read with a few dozen find()s: scanning is cheapest for real configs, an index keeps
  // a hostile object with millions of members linear.
  if (m.size() <= 16) {
    for (const auto& [k, v] : m) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  if (!indexed_) {
    index_.build(m);
    indexed_ = true;
  }
  const std::size_t at = index_.find(m, key);
  return at == KeyIndex::npos ? nullptr : &m[at].second;
}

inline const Json* Block::find(std::string_view key, std::string_view alias, std::string* used) {
  const Json* a = find(key);
  if (alias.empty()) {
    if (used) *used = std::string(key);
    return a;
  }
  const Json* b = find(alias);
  if (a && b) {
    r_.error(path_of(alias), cat("given twice, as \"", key, "\" and as its alias \"", alias, "\"; keep one"), show(*b));
  }
  if (used) *used = std::string(a || !b ? key : alias);
  return a ? a : b;
}

inline const Json* Block::typed(std::string_view key, const Json* v, bool ok, std::string_view expected) {
  if (v == nullptr || ok) return v;
  std::string rule = cat("expected ", expected);
  if (v->is_string()) {
    // "1e-4" or "true" in quotes: say how to write it, DeepSpeed's optimizers would choke on it later.
    const auto& s = v->get_ref<const std::string&>();
    double d = 0;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), d);
    if ((ec == std::errc() && p == s.data() + s.size() && !s.empty()) || s == "true" || s == "false") {
      rule += "; write it without quotes";
    }
  }
  r_.error(path_of(key), std::move(rule), show(*v));
  return nullptr;
}

inline bool is_auto(const Json& v) { return v.is_string() && v.get_ref<const std::string&>() == "auto"; }

inline Got Block::get_bool(std::string_view key, bool& out, bool auto_ok) {
  const Json* v = find(key);
  if (v == nullptr) return Got::absent;
  if (auto_ok && is_auto(*v)) return Got::automatic;
  if (!typed(key, v, v->is_boolean(), "true or false")) return Got::invalid;
  out = v->get<bool>();
  return Got::value;
}

inline Got Block::integral(const std::string& path, const Json& v, std::int64_t& out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    out = v.get<std::int64_t>();
    return Got::value;
  }
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      r_.error(path, "integer out of range", show(v));
      return Got::invalid;
    }
    out = static_cast<std::int64_t>(u);
    return Got::value;
  }
  // DeepSpeed configs write sizes as 2e8 or 5e8: accept floats with an integral value.
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::floor(d) != d) {
    r_.error(path, "must be an integer", show(v));
    return Got::invalid;
  }
  if (d < -9.2e18 || d > 9.2e18) {
    r_.error(path, "integer out of range", show(v));
    return Got::invalid;
  }
  out = static_cast<std::int64_t>(d);
  return Got::value;
}

inline Got Block::get_int(std::string_view key, std::int64_t& out, std::int64_t lo, std::int64_t hi, bool auto_ok,
                          std::string_view alias) {
  std::string used;
  const Json* v = find(key, alias, &used);
  if (v == nullptr) return Got::absent;
  if (auto_ok && is_auto(*v)) return Got::automatic;
  if (!typed(used, v, v->is_number(), "an integer")) return Got::invalid;
  std::int64_t x = 0;
  if (integral(path_of(used), *v, x) != Got::value) return Got::invalid;
  if (x < lo || x > hi) {
    std::string rule = "must be an integer ";
    if (hi == std::numeric_limits<std::int64_t>::max()) {
      rule += cat(">= ", std::to_string(lo));
    } else {
      rule += cat("in [", std::to_string(lo), ", ", std::to_string(hi), "]");
    }
    r_.error(path_of(used), std::move(rule), show(*v));
    return Got::invalid;
  }
  out = x;
  return Got::value;
}

inline Got Block::get_number(std::string_view key, double& out, double lo, bool lo_open, double hi, bool auto_ok) {
  const Json* v = find(key);
  if (v == nullptr) return Got::absent;
  if (auto_ok && is_auto(*v)) return Got::automatic;
  if (!typed(key, v, v->is_number(), "a number")) return Got::invalid;
  const double x = v->get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (!std::isfinite(x) || below || x > hi) {
    std::string rule = "must be a finite number ";
    if (std::isinf(hi)) {
      rule += (lo_open ? "> " : ">= ") + num_text(lo);
    } else {
      rule += cat("in ", lo_open ? "(" : "[", num_text(lo), ", ", num_text(hi), "]");
    }
    r_.error(path_of(key), std::move(rule), show(*v));
    return Got::invalid;
  }
  out = x;
  return Got::value;
}

inline Got Block::get_string(std::string_view key, std::string& out, bool nullable) {
  const Json* v = find(key);
  if (v == nullptr || (nullable && v->is_null())) return Got::absent;
  if (!typed(key, v, v->is_string(), "a string")) return Got::invalid;
  out = v->get<std::string>();
  return Got::value;
}

inline Got Block::get_betas(std::string_view key, std::array<double, 2>& out, bool auto_ok) {
  const Json* v = find(key);
  if (v == nullptr) return Got::absent;
  if (auto_ok && is_auto(*v)) return Got::automatic;
  const bool shape = v->is_array() && v->size() == 2 && (*v)[0].is_number() && (*v)[1].is_number();
  if (!typed(key, v, shape, "[beta1, beta2], two numbers")) return Got::invalid;
  std::array<double, 2> b{(*v)[0].get<double>(), (*v)[1].get<double>()};
  for (double x : b) {
    if (!(x >= 0 && x < 1)) {
      r_.error(path_of(key), "each beta must be in [0, 1)", show(*v));
      return Got::invalid;
    }
  }
  out = b;
  return Got::value;
}

inline Got Block::get_choice(std::string_view key, std::size_t& out, std::span<const std::string_view> names,
                             bool nullable) {
  const Json* v = find(key);
  if (v == nullptr || (nullable && v->is_null())) return Got::absent;
  std::string expected = "one of";
  for (auto n : names) expected += cat(n == names.front() ? " \"" : ", \"", n, "\"");
  if (!typed(key, v, v->is_string(), expected)) return Got::invalid;
  const auto& s = v->get_ref<const std::string&>();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (iequals(s, names[i])) {
      out = i;
      return Got::value;
    }
  }
  std::string rule = "must be " + expected;
  if (auto m = closest_match(s, names)) rule += "; did you mean \"" + *m + "\"?";
  r_.error(path_of(key), std::move(rule), show(*v));
  return Got::invalid;
}

inline const Json* Block::get_object(std::string_view key) {
  const Json* v = find(key);
  if (v == nullptr || v->is_null()) return nullptr;
  return typed(key, v, v->is_object(), "an object");
}

inline bool inert_value(const Json& v, std::string_view inert) {
  if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return true;
  if (v.is_object()) {
    auto it = v.find("enabled");
    if (it != v.end() && it->is_boolean() && !it->get<bool>()) return true;
  }
  if (inert.empty()) return false;
  return v == Json::parse(inert);
}

inline void Block::finish(std::initializer_list<Unsupported> list) {
  for (const auto& u : list) {
    const Json* v = find(u.key);
    if (v == nullptr || inert_value(*v, u.inert)) continue;
    r_.unsupported(path_of(u.key), u.why, show(*v));
  }
  const std::size_t first_known = r_.all_known_.size();
  for (auto k : known_) r_.all_known_.emplace_back(path_, k);
  if (obj_ == nullptr || !obj_->is_object()) return;
  std::vector<std::string_view> known = known_;
  std::sort(known.begin(), known.end());
  for (const auto& [k, v] : members_of(*obj_)) {
    if (!std::binary_search(known.begin(), known.end(), std::string_view(k))) {
      r_.unknown_key(path_, k, v, first_known, r_.all_known_.size());
    }
  }
}

// ---- the engine's hints ---------------------------------------------------------------------------

/// Checks each ResolveContext field by the rule of the config value it stands for (an "auto" it
/// fills must be a value the file could have held). `where` is "ResolveContext::<field>".
inline void check_context(const ResolveContext& ctx, Diagnostics& diag) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const auto where = [](std::string_view field) { return cat("ResolveContext::", field); };
  const auto integer = [&](std::string_view field, std::optional<std::int64_t> v, std::int64_t lo, std::int64_t hi) {
    if (!v || (*v >= lo && *v <= hi)) return;
    diag.error(where(field),
               hi == kMax ? cat("must be an integer >= ", std::to_string(lo))
                          : cat("must be an integer in [", std::to_string(lo), ", ", std::to_string(hi), "]"),
               std::to_string(*v));
  };
  const auto number = [&](std::string_view field, std::optional<double> v) {
    if (v && !(std::isfinite(*v) && *v >= 0)) diag.error(where(field), "must be a finite number >= 0", num_text(*v));
  };
  integer("world_size", ctx.world_size, 1, std::numeric_limits<int>::max());
  integer("hidden_size", ctx.hidden_size, 1, std::int64_t{1} << 31);  // H^2 must fit bucket sizes
  integer("micro_batch_size", ctx.micro_batch_size, 1, std::int64_t{1} << 40);
  integer("gradient_accumulation_steps", ctx.gradient_accumulation_steps, 1, std::int64_t{1} << 40);
  integer("total_num_steps", ctx.total_num_steps, 1, kMax);
  integer("warmup_num_steps", ctx.warmup_num_steps, 1, kMax);  // DeepSpeed >= 0.19.3: N <= 0 is an error
  if (ctx.precision && *ctx.precision != DType::fp32 && *ctx.precision != DType::fp16 &&
      *ctx.precision != DType::bf16) {
    diag.error(where("precision"), "must be fp32, fp16 or bf16 (the engine's compute precision)",
               std::string(to_string(*ctx.precision)));
  }
  number("lr", ctx.lr);
  if (ctx.betas && !((*ctx.betas)[0] >= 0 && (*ctx.betas)[0] < 1 && (*ctx.betas)[1] >= 0 && (*ctx.betas)[1] < 1)) {
    diag.error(where("betas"), "each beta must be in [0, 1)",
               cat("[", num_text((*ctx.betas)[0]), ", ", num_text((*ctx.betas)[1]), "]"));
  }
  number("eps", ctx.eps);
  number("weight_decay", ctx.weight_decay);
  number("max_grad_norm", ctx.max_grad_norm);
}

// ---- Reader: blocks -------------------------------------------------------------------------------

inline void Reader::report_unknown_keys() {
  // At most Diagnostics::kMaxErrors keys get here, each compared with a few hundred known keys:
  // the suggestions cost the same for a 100 MB file as for a 1 KB one.
  std::vector<std::string_view> local;
  for (auto& u : unknown_) {
    std::string rule = "unknown key";
    local.clear();
    for (std::size_t i = u.known_begin; i < u.known_end; ++i) local.push_back(all_known_[i].second);
    if (auto m = closest_match(u.key, local)) {
      rule += "; did you mean \"" + *m + "\"?";
    } else {
      // The right key in the wrong block: suggest where it lives.
      for (const auto& [block, key] : all_known_) {
        if (block != u.block_path && key == u.key) {
          rule += cat("; did you mean ", join_path(block, key), "?");
          break;
        }
      }
    }
    error(join_path(u.block_path, u.key), std::move(rule), u.value);
  }
  diag.count_dropped(unknown_not_kept_);
  unknown_.clear();
  unknown_not_kept_ = 0;
}

// The blocks' readers, one file each, are included at the end of this file: config/precision.hpp,
// zero.hpp, optimizer.hpp, batch.hpp, checkpointing.hpp (and communication.hpp, parallel.hpp).

inline void Reader::cross_check(Config& c) {
  auto& z = c.zero_optimization;
  if (c.fp16.enabled && c.bf16.enabled) {
    error("/bf16/enabled", "fp16 and bf16 cannot both be enabled", "true");
  }
  if (z.offload_param.device != OffloadDevice::none && z.stage != 3) {
    // DeepSpeed builds stages 0-2 without looking at offload_param: the parameters stay where they are.
    unsupported("/zero_optimization/offload_param",
                cat("has effect only at ZeRO stage 3 (stage is ", std::to_string(z.stage),
                    "; DeepSpeed ignores it too); ignored"),
                cat("{\"device\": \"", to_string(z.offload_param.device), "\"}"));
    z.offload_param.device = OffloadDevice::none;
  }
  if (z.offload_optimizer.device != OffloadDevice::none && z.stage == 0) {
    error("/zero_optimization/offload_optimizer", "offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is 0)",
          cat("{\"device\": \"", to_string(z.offload_optimizer.device), "\"}"));
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme && z.stage != 3 && z.stage != 0) {
    error("/zero_optimization/offload_optimizer/device",
          cat("nvme offload swaps optimizer state only with ZeRO stage 3 (stage is ", std::to_string(z.stage),
              "); use \"cpu\" for stages 1 and 2"),
          "\"nvme\"");
  }
  if (z.offload_optimizer.device == OffloadDevice::nvme && z.nvme.path.empty()) {
    error("/zero_optimization/offload_optimizer/nvme_path", "required when device is \"nvme\"");
  }
  if (z.offload_param.device == OffloadDevice::nvme && z.param_nvme.path.empty()) {
    error("/zero_optimization/offload_param/nvme_path", "required when device is \"nvme\"");
  }
  // The aio block matters where a swap file is used: O_DIRECT needs aligned requests.
  const bool swaps = z.offload_optimizer.device == OffloadDevice::nvme || z.offload_param.device == OffloadDevice::nvme;
  if (swaps && z.nvme.aio.block_size % io::kDirectAlign != 0) {
    error("/aio/block_size", "must be a multiple of 4096 bytes (O_DIRECT alignment)", std::to_string(z.nvme.aio.block_size));
  }
}

inline Config Reader::read(const Json& doc) {
  Config c;
  c.world_size = ctx.world_size;
  // The engine's facts are checked like the file: bad hints would otherwise resolve to nonsense.
  check_context(ctx, diag);
  if (!diag.ok()) return c;
  if (!doc.is_object()) {
    error("", "a DeepSpeed config must be a JSON object", show(doc));
    return c;
  }
  Block root(*this, &doc, "");
  data_size_ = ctx.world_size;
  read_parallel(root, c);
  read_precision(root, c);
  read_zero(root, c);
  read_aio(root, c);
  read_optimizer(root, c);
  read_scheduler(root, c);
  read_batch(root, c);
  read_scalars(root, c);
  read_monitor_and_checkpointing(root, c);
  read_gradient_compression(root, c);
  check_pipeline_schedule(c);
  read_communication(root, c);  // after the batch: rebalancing splits its micro-batch
  read_sparse_attention(root, c);
  root.finish({{"amp"},
               {"tensorboard"},
               {"wandb"},
               {"comet"},
               {"trackio"},
               {"flops_profiler"},
               {"comms_logger"},
               {"eigenvalue"},
               {"progressive_layer_drop"},
               {"curriculum_learning"},
               {"data_efficiency"},
               {"compression_training"},
               {"autotuning"},
               {"elasticity"},
               {"nebula"},
               {"hybrid_engine"},
               {"weight_quantization"},
               {"quantize_training"},
               {"compile"},
               {"timers"},
               {"torch_autocast"},
               {"memory_breakdown", "false"},
               {"dump_state", "false"},
               {"disable_allgather", "false"},
               {"sparse_gradients", "false"},
               {"graph_harvesting", "false"},
               {"use_data_before_expert_parallelism", "false"},
               {"seq_parallel_communication_data_type", "\"fp32\""},
               {"zero_allow_untested_optimizer", "", kTorchOnly},
               {"zero_force_ds_cpu_optimizer", "", kTorchOnly},
               {"dataloader_drop_last", "", kTorchOnly},
               {"vocabulary_size", "", kTorchOnly}});
  cross_check(c);
  // Settings DeepSpeed would act on that zerotk's engine does not (config/structure.hpp's table).
  for (const IgnoredSetting& s : kIgnoredSettings) {
    if (auto v = s.set(c)) unsupported(std::string(s.path), s.why, std::move(*v));
  }
  report_unknown_keys();
  return c;
}

}  // namespace detail

// ---- public API -----------------------------------------------------------------------------------

/// Every way the engine's hints in `ctx` are unusable, each checked by the rule of the config value
/// it fills (`where` = "ResolveContext::<field>", `value` = the hint). Empty when all are usable.
/// parse() reports these too; a front end can call this first to blame its own flags.
inline std::vector<config_error> validate_context(const ResolveContext& ctx) {
  Diagnostics diag;
  detail::check_context(ctx, diag);
  return diag.errors();
}

namespace detail {
// A document big enough to exhaust memory is a problem of the input, reported like the others,
// so that parse() and from_json() keep their promise never to throw.
inline ParseResult out_of_memory() {
  ParseResult r;
  r.errors.emplace_back("out of memory while reading the config (is it really a DeepSpeed config?)");
  return r;
}
}  // namespace detail

/// Reads a parsed document. Never throws for any document: problems are in the result's errors.
inline ParseResult from_json(const Json& doc, const ResolveContext& ctx) {
  try {
    Diagnostics diag;
    detail::Reader reader(ctx, diag);
    Config c = reader.read(doc);
    ParseResult r;
    r.errors = diag.errors();
    r.errors_not_shown = diag.dropped();
    r.notices = diag.notices();
    if (r.errors.empty()) r.config = std::move(c);
    return r;
  } catch (const std::bad_alloc&) {
    return detail::out_of_memory();
  }
}

/// Parses and reads DeepSpeed JSON text. Never throws for any input text. Time and memory are
/// linear in the size of `text`; at most Diagnostics::kMaxErrors errors are kept (and the rest
/// counted), however many a hostile text holds.
inline ParseResult parse(std::string_view text, const ResolveContext& ctx) {
  try {
    Diagnostics diag;
    Json doc = parse_json(text, diag);
    if (!diag.ok()) {
      ParseResult r;
      r.errors = diag.errors();
      r.errors_not_shown = diag.dropped();
      return r;
    }
    return from_json(doc, ctx);
  } catch (const std::bad_alloc&) {
    return detail::out_of_memory();
  }
}

/// Every problem of `text` for `ctx` (empty when the config is usable).
inline std::vector<config_error> validate(std::string_view text, const ResolveContext& ctx) {
  return parse(text, ctx).errors;
}

namespace detail {
inline std::string_view notice_kind(Notice::Kind k) {
  switch (k) {
    case Notice::Kind::unsupported: return "ignored";
    case Notice::Kind::auto_resolved: return "auto";
    case Notice::Kind::deprecated: return "deprecated";
  }
  return "note";
}
}  // namespace detail

/// Prints `notices` to `to` (nothing when null), one line each: "zerotk config: <source>: <kind>:
/// <JSON path>: <message>".
inline void print_notices(const std::vector<Notice>& notices, std::FILE* to, std::string_view source = {}) {
  if (to == nullptr) return;
  const std::string from = source.empty() ? std::string() : std::string(source) + ": ";
  for (const Notice& n : notices) {
    const std::string line = "zerotk config: " + from + std::string(detail::notice_kind(n.kind)) + ": " +
                             (n.path.empty() ? std::string("/") : n.path) + ": " + n.message + "\n";
    std::fputs(line.c_str(), to);
  }
  std::fflush(to);
}

/// The resolved options of `text`, or one config_error listing every problem (`source` names
/// the file in that error). The notices go to ctx.print_notices_to (stderr unless set otherwise:
/// issue 57 item 16, an ignored key was silent on this path).
inline Config load(std::string_view text, const ResolveContext& ctx, std::string_view source = {}) {
  ParseResult r = parse(text, ctx);
  if (!r.ok()) throw summarize(r.errors, source);
  print_notices(r.notices, ctx.print_notices_to, source);
  return std::move(*r.config);
}

/// Largest config text read_text_file() and read_text() accept, in bytes (16 MiB). DeepSpeed
/// configs are a few KiB; the limit keeps /dev/zero, a runaway generator or a wrong file from
/// exhausting memory before parsing starts.
inline constexpr std::size_t kMaxConfigBytes = std::size_t{16} << 20;

/// Everything `file` holds from its current position on, at most `max_bytes`. io_error (where =
/// `source`) with the system's reason when a read fails (a directory, /proc/self/mem, an I/O
/// error), or naming the limit when there is more (it stops reading there: stdin from /dev/zero ends).
inline std::string read_text(std::FILE* file, std::string_view source, std::size_t max_bytes = kMaxConfigBytes) {
  std::string text;
  char buf[1 << 16];
  for (;;) {
    errno = 0;
    const std::size_t want = std::min(sizeof buf, max_bytes + 1 - text.size());
    const std::size_t n = std::fread(buf, 1, want, file);
    text.append(buf, n);
    if (text.size() > max_bytes) {
      throw io_error(detail::cat("cannot read config file: larger than the limit of ", std::to_string(max_bytes), " bytes"),
                     std::string(source), detail::cat("more than ", std::to_string(max_bytes), " bytes"));
    }
    if (n == want) continue;
    if (std::ferror(file)) {
      const int e = errno;
      throw io_error(detail::cat("cannot read config file: ", std::generic_category().message(e), " (errno ",
                                 std::to_string(e), ")"),
                     std::string(source));
    }
    return text;
  }
}

/// The bytes of the regular file `path`, at most kMaxConfigBytes (io::read_text_file). io_error
/// naming the path and why, worded "cannot open config file: <errno text>" or "cannot read config
/// file: ...": the system's reason, a directory, not a regular file (a FIFO or /dev/zero is refused
/// at once, never read until memory runs out), or larger than the limit. Reading never mistakes a
/// failure for an empty file.
inline std::string read_text_file(const std::filesystem::path& path) {
  return io::read_text_file(path, kMaxConfigBytes, "config file");
}

/// load() of the file at `path` (io_error when it cannot be read); its notices printed as load's.
inline Config load_file(const std::filesystem::path& path, const ResolveContext& ctx) {
  return load(read_text_file(path), ctx, path.string());
}

}  // namespace zerotk::config

// The blocks' readers (Reader::read_<block>), each in a file of its own.
#include "zerotk/config/batch.hpp"
#include "zerotk/config/checkpointing.hpp"
#include "zerotk/config/optimizer.hpp"
#include "zerotk/config/precision.hpp"
#include "zerotk/config/zero.hpp"
// Reader::read_communication, the `communication` block in a file of its own.
#include "zerotk/config/communication.hpp"
// Reader::read_parallel: the tensor and pipeline sizes, in a file of their own.
#include "zerotk/config/parallel.hpp"
// Reader::read_sparse_attention: DeepSpeed's block-sparse attention layouts.
#include "zerotk/config/sparse_attention.hpp"
