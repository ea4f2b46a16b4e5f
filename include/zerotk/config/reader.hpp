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
  /// After the batch: the pipeline schedule must run its micro-batches (config/parallel.hpp).
  void check_pipeline_schedule(Config& c);
  /// "world 8 / tensor 2" (or "world 8 / (tensor 2 x pipeline 2)"): where the data size came from.
  std::string data_size_origin(const Config& c) const;
  void read_precision(Block& root, Config& c);
  void read_zero(Block& root, Config& c);
  /// An array of distinct non-empty module type names at `path` (absent or null: none).
  void read_module_types(const Json* m, const std::string& path, std::vector<std::string>& names);
  void read_aio(Block& root, Config& c);
  void read_optimizer(Block& root, Config& c);
  void read_scheduler(Block& root, Config& c);
  void read_batch(Block& root, Config& c);
  void read_scalars(Block& root, Config& c);
  void read_monitor_and_checkpointing(Block& root, Config& c);
  void read_checkpoint(Block& root, Config& c);
  void read_gradient_compression(Block& root, Config& c);
  void read_communication(Block& root, Config& c);  // config/communication.hpp
  void read_quantized(Block& zero, ZeroOptions& z);  // config/communication.hpp
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

inline void Reader::read_precision(Block& root, Config& c) {
  // fp16
  {
    Block b(*this, root.get_object("fp16"), root.path_of("fp16"));
    if (b.get_bool("enabled", c.fp16.enabled, true) == Got::automatic) {
      std::optional<bool> v;
      if (ctx.precision) v = *ctx.precision == DType::fp16;
      resolve_auto(b.path_of("enabled"), c.fp16.enabled, v, "the engine's precision",
                   "write true or false, or give the engine's precision (zerotk-config --precision fp16|bf16|fp32)");
    }
    b.get_number("loss_scale", c.fp16.static_scale, 0);
    int power = 0;
    if (b.get_int("initial_scale_power", power, 0, 127) == Got::value) c.fp16.initial_scale_power = power;
    b.get_int("loss_scale_window", c.fp16.loss_scale_window, 1, std::numeric_limits<std::int64_t>::max());
    b.get_int("hysteresis", c.fp16.hysteresis, 1, std::numeric_limits<int>::max());
    b.get_bool("consecutive_hysteresis", c.fp16.consecutive_hysteresis);
    b.get_number("min_loss_scale", c.fp16.min_loss_scale, 0, /*lo_open=*/true);
    b.finish({{"auto_cast", "false"}, {"fp16_master_weights_and_grads", "false"}});
  }
  // bf16, or its old name bfloat16
  {
    const Json* bf = root.get_object("bf16");
    const Json* old = root.get_object("bfloat16");
    std::string path = root.path_of("bf16");
    if (bf && old) {
      error(root.path_of("bfloat16"), "given twice, as \"bf16\" and as its old name \"bfloat16\"; keep \"bf16\"",
            show(*old));
    } else if (old) {
      bf = old;
      path = root.path_of("bfloat16");
      note(Notice::Kind::deprecated, path, "old name of \"bf16\"");
    }
    Block b(*this, bf, path);
    if (b.get_bool("enabled", c.bf16.enabled, true) == Got::automatic) {
      std::optional<bool> v;
      if (ctx.precision) v = *ctx.precision == DType::bf16;
      resolve_auto(b.path_of("enabled"), c.bf16.enabled, v, "the engine's precision",
                   "write true or false, or give the engine's precision (zerotk-config --precision fp16|bf16|fp32)");
    }
    b.finish({{"immediate_grad_update", "false"},
              {"check_grad_overflow", "true", "zerotk always checks bf16 gradients for inf/NaN and skips such steps"},
              {"bf16_master_weights_and_grads", "false"},
              {"bf16_optimizer_states", "false"}});
  }
  // zerotk's own key (DeepSpeed 0.19 has none like it): module types whose parameters stay fp32.
  read_module_types(root.find("fp16_override_modules"), root.path_of("fp16_override_modules"),
                    c.fp16_override_modules);
  // zerotk's own keys (no DeepSpeed release reads them): which modules' parameters stage 3 partitions.
  // Top level, not in zero_optimization: DeepSpeed ignores unknown top-level keys but refuses unknown
  // zero_optimization ones, so a config with them still loads there.
  // They fill stage 3's own options (Stage3Options::partitioned_module_types, replicated_module_types).
  zero::Stage3Options& s3 = c.zero_optimization.stage3;
  read_module_types(root.find("zero_allowed_param_types"), root.path_of("zero_allowed_param_types"),
                    s3.partitioned_module_types);
  read_module_types(root.find("zero_force_param_types"), root.path_of("zero_force_param_types"),
                    s3.replicated_module_types);
  for (const std::string& t : s3.replicated_module_types) {
    if (std::find(s3.partitioned_module_types.begin(), s3.partitioned_module_types.end(), t) !=
        s3.partitioned_module_types.end()) {
      error(root.path_of("zero_force_param_types"),
            cat("module type \"", t, "\" is also in zero_allowed_param_types; a type is either partitioned or not"),
            cat("\"", t, "\""));
    }
  }
}

inline void Reader::read_module_types(const Json* m, const std::string& path, std::vector<std::string>& names) {
  if (m == nullptr || m->is_null()) return;
  if (!m->is_array()) {
    error(path, "expected an array of module type names, e.g. [\"LayerNorm\"]", show(*m));
    return;
  }
  for (std::size_t i = 0; i < m->size(); ++i) {
    const Json& e = (*m)[i];
    const std::string at = path + "/" + std::to_string(i);
    if (!e.is_string() || e.get_ref<const std::string&>().empty()) {
      error(at, "expected a module type name (a non-empty string)", show(e));
    } else if (std::find(names.begin(), names.end(), e.get_ref<const std::string&>()) != names.end()) {
      error(at, "listed twice", show(e));
    } else {
      names.push_back(e.get<std::string>());
    }
  }
}

constexpr std::array<std::string_view, 3> kDevices{"none", "cpu", "nvme"};

/// A nullable string key into a path (absent or null: unchanged).
inline void read_path(Block& b, std::string_view key, std::filesystem::path& out) {
  std::string s;
  if (b.get_string(key, s, true) == Got::value) out = s;
}

inline void Reader::read_zero(Block& root, Config& c) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const Json* zj = root.find("zero_optimization");
  if (zj && zj->is_boolean()) {
    // DeepSpeed's oldest form: "zero_optimization": true means stage 1.
    c.zero_optimization.stage = zj->get<bool>() ? 1 : 0;
    note(Notice::Kind::deprecated, root.path_of("zero_optimization"),
         cat("boolean form is deprecated; read as stage ", std::to_string(c.zero_optimization.stage)));
    zj = nullptr;
  } else {
    zj = root.get_object("zero_optimization");
  }
  Block b(*this, zj, root.path_of("zero_optimization"));
  ZeroOptions& z = c.zero_optimization;
  b.get_int("stage", z.stage, 0, 3);
  b.get_bool("contiguous_gradients", z.contiguous_gradients);
  b.get_bool("reduce_scatter", z.reduce_scatter);
  b.get_bool("allgather_partitions", z.allgather_partitions);
  b.get_int("allgather_bucket_size", z.allgather_bucket_size, 1, kMax);
  z.overlap_comm = z.stage == 3;  // DeepSpeed's default depends on the stage
  b.get_bool("overlap_comm", z.overlap_comm);
  b.get_bool("load_from_fp32_weights", z.load_from_fp32_weights);
  b.get_count("sub_group_size", z.sub_group_size, 1);
  zero::Stage3Options& s3 = z.stage3;  // stage 3's own options, filled in place
  b.get_count("stage3_max_live_parameters", s3.max_live_parameters, 0, kMax, false, "max_live_parameters");
  b.get_count("stage3_max_reuse_distance", s3.max_reuse_distance, 0, kMax, false, "max_reuse_distance");
  b.get_count("stage3_model_persistence_threshold", s3.model_persistence_threshold, 0, kMax, false,
              "model_persistence_threshold");
  {
    std::string used;
    const Json* g16 = b.find("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save", &used);
    const Json* gfp16 = b.find("stage3_gather_fp16_weights_on_model_save");
    if (g16 && gfp16) {
      error(b.path_of("stage3_gather_fp16_weights_on_model_save"),
            "given together with its replacement \"stage3_gather_16bit_weights_on_model_save\"; keep that one",
            show(*gfp16));
    } else if (gfp16) {
      used = "stage3_gather_fp16_weights_on_model_save";
      note(Notice::Kind::deprecated, b.path_of(used), "old name of \"stage3_gather_16bit_weights_on_model_save\"");
      g16 = gfp16;
    }
    if (g16 && b.typed(used, g16, g16->is_boolean(), "true or false")) {
      z.stage3_gather_16bit_weights_on_model_save = g16->get<bool>();
    }
  }
  // ZeRO++ hpZ: a secondary shard of the parameters within groups of g consecutive ranks. Only stage 3
  // partitions parameters (DeepSpeed reads the key there alone); g must divide the world size.
  int hpz = 1;
  if (b.get_int("zero_hpz_partition_size", hpz, 1, std::numeric_limits<int>::max()) == Got::value && hpz > 1) {
    const std::string g = std::to_string(hpz);
    if (z.stage != 3) {
      unsupported(b.path_of("zero_hpz_partition_size"),
                  cat("has effect only at ZeRO stage 3 (stage is ", std::to_string(z.stage),
                      "; DeepSpeed ignores it too); ignored"),
                  g);
    } else if (data_size_ % hpz != 0) {
      error(b.path_of("zero_hpz_partition_size"),
            data_size_ == ctx.world_size
                ? cat("must divide the world size (", std::to_string(ctx.world_size),
                      "): hpZ keeps a secondary shard within groups of that many consecutive ranks")
                : cat("must divide the data-parallel size (", std::to_string(data_size_), " = ", data_size_origin(c),
                      "): hpZ keeps a secondary shard within groups of that many consecutive ranks"),
            g);
    } else {
      s3.reshard_after_forward = zero::ReshardAfterForward::group(hpz);
    }
  }
  read_quantized(b, z);  // ZeRO++ qwZ / qgZ, config/communication.hpp
  b.get_bool("ignore_unused_parameters", z.ignore_unused_parameters);
  b.get_bool("round_robin_gradients", z.round_robin_gradients);

  // Sizes HF's integration fills from the model's hidden size H.
  const auto h = ctx.hidden_size;
  const std::string hidden_hint = "write a number of elements, or give the model's hidden size (zerotk-config --hidden H)";
  // Elements, as DeepSpeed counts them, in both groups (and as the engine takes them).
  if (b.get_count("reduce_bucket_size", z.reduce_bucket_size, 1, kMax, true) == Got::automatic) {
    resolve_auto(b.path_of("reduce_bucket_size"), z.reduce_bucket_size,
                 h ? std::optional(static_cast<std::size_t>(*h * *h)) : std::nullopt, "hidden size squared", hidden_hint);
  }
  // stage3_* sizes mean nothing below stage 3: an unresolvable "auto" there keeps the default.
  auto stage3_auto = [&](std::string_view key, std::size_t& out, std::optional<std::size_t> from_h,
                         std::string_view how) {
    if (from_h) {
      resolve_auto(b.path_of(key), out, from_h, how);
    } else if (z.stage < 3) {
      resolve_auto(b.path_of(key), out, std::optional(out), "default; unused below stage 3");
    } else {
      resolve_auto(b.path_of(key), out, std::optional<std::size_t>(), how, hidden_hint);
    }
  };
  if (b.get_count("stage3_prefetch_bucket_size", s3.prefetch_bucket_size, 0, kMax, true, "prefetch_bucket_size") ==
      Got::automatic) {
    std::optional<std::size_t> v;
    if (h) v = static_cast<std::size_t>(0.9 * static_cast<double>(*h) * static_cast<double>(*h));
    stage3_auto("stage3_prefetch_bucket_size", s3.prefetch_bucket_size, v, "0.9 x hidden size squared");
  }
  if (b.get_count("stage3_param_persistence_threshold", s3.param_persistence_threshold, 0, kMax, true,
                  "param_persistence_threshold") == Got::automatic) {
    stage3_auto("stage3_param_persistence_threshold", s3.param_persistence_threshold,
                h ? std::optional(static_cast<std::size_t>(10 * *h)) : std::nullopt, "10 x hidden size");
  }

  // Offload blocks. The deprecated booleans map onto them as DeepSpeed does.
  const Json* oo = b.get_object("offload_optimizer");
  const Json* op = b.get_object("offload_param");
  {
    bool cpu_offload = false;
    if (b.get_bool("cpu_offload", cpu_offload) == Got::value) {
      note(Notice::Kind::deprecated, b.path_of("cpu_offload"), "deprecated; use \"offload_optimizer\": {\"device\": \"cpu\"}");
      if (cpu_offload && oo) {
        error(b.path_of("cpu_offload"), "given together with \"offload_optimizer\"; keep offload_optimizer", "true");
      } else if (cpu_offload) {
        z.offload_optimizer.device = OffloadDevice::cpu;
      }
    }
    bool cpu_offload_param = false;
    if (b.get_bool("cpu_offload_param", cpu_offload_param) == Got::value) {
      note(Notice::Kind::deprecated, b.path_of("cpu_offload_param"), "deprecated; use \"offload_param\": {\"device\": \"cpu\"}");
      if (cpu_offload_param && op) {
        error(b.path_of("cpu_offload_param"), "given together with \"offload_param\"; keep offload_param", "true");
      } else if (cpu_offload_param) {
        z.offload_param.device = OffloadDevice::cpu;
      }
    }
  }
  if (oo) {
    Block o(*this, oo, b.path_of("offload_optimizer"));
    auto& x = z.offload_optimizer;
    offload::NvmeOptions& n = z.nvme;  // the swap keys: offload's own options
    std::size_t dev = 0;
    if (o.get_choice("device", dev, kDevices) == Got::value) x.device = static_cast<OffloadDevice>(dev);
    read_path(o, "nvme_path", n.path);
    o.get_count("buffer_count", n.buffer_count, 1);
    o.get_bool("pin_memory", x.pin_memory);
    o.get_bool("pipeline_read", n.pipeline_read);
    o.get_bool("pipeline_write", n.pipeline_write);
    // Partial offload: DeepSpeed asserts stage 3 for any ratio < 1 (zero/config.py), device or not.
    double ratio = 1.0;
    if (o.get_number("ratio", ratio, 0, false, 1) == Got::value && ratio < 1.0) {
      if (z.stage != 3) {
        error(o.path_of("ratio"),
              cat("partial optimizer offload (ratio < 1) needs ZeRO stage 3 (stage is ", std::to_string(z.stage), ")"),
              num_text(ratio));
      } else {
        unsupported(o.path_of("ratio"), "not supported by zerotk yet; ignored", num_text(ratio));
      }
    }
    o.finish({{"fast_init", "false"},
              {"super_offload", "false"},
              {"cpuadam_cores_perc", "0.8"}});
  }
  if (op) {
    Block o(*this, op, b.path_of("offload_param"));
    auto& x = z.offload_param;
    offload::ParamNvmeOptions& n = z.param_nvme;  // the swap keys: offload's own options
    std::size_t dev = 0;
    if (o.get_choice("device", dev, kDevices) == Got::value) x.device = static_cast<OffloadDevice>(dev);
    read_path(o, "nvme_path", n.path);
    o.get_count("buffer_count", n.buffer_count, 1);
    o.get_count("buffer_size", n.buffer_size, 1);
    o.get_count("max_in_cpu", n.max_in_cpu, 0);
    o.get_bool("pin_memory", x.pin_memory);
    o.finish();
  }
  b.finish({{"cpu_offload_use_pin_memory", "", "deprecated; use pin_memory in offload_param or offload_optimizer"},
            {"elastic_checkpoint", "false"},
            {"legacy_stage1", "false"},
            {"use_multi_rank_bucket_allreduce", "true"},
            {"zero_quantized_nontrainable_weights", "false"},
            {"zeropp_loco_param"},
            {"mics_shard_size", "-1"},
            {"mics_hierarchical_params_gather", "false"},
            {"memory_efficient_linear", "true", kTorchOnly},
            {"override_module_apply", "true", kTorchOnly},
            {"pipeline_loading_checkpoint", "false"},
            {"log_trace_cache_warnings", "false"},
            {"enable_sanity_checks", "false"},
            {"save_muon_momentum_buffer_in_memory", "false"},
            {"leaf_module", "{}", kTorchOnly},
            {"zenflow"},
            {"stage3_module_granularity_threshold", "0"},
            {"stage3_use_all_reduce_for_fetch_params", "false"},
            {"stage3_allgather_sequential", "false"}});
}

inline void Reader::read_aio(Block& root, Config& c) {
  Block b(*this, root.get_object("aio"), root.path_of("aio"));
  io::AioOptions& a = c.zero_optimization.nvme.aio;  // the I/O layer's own options, shared by both swap files
  b.get_count("block_size", a.block_size, 1, std::int64_t{1} << 30);
  std::int64_t v = a.queue_depth;
  if (b.get_int("queue_depth", v, 1, 4096) == Got::value) a.queue_depth = static_cast<int>(v);
  v = a.intra_op_parallelism;
  if (b.get_int("intra_op_parallelism", v, 1, 64, false, "thread_count") == Got::value) {
    a.intra_op_parallelism = static_cast<int>(v);
    if (b.find("thread_count") && !b.find("intra_op_parallelism")) {
      note(Notice::Kind::deprecated, b.path_of("thread_count"), "old name of \"intra_op_parallelism\"");
    }
  }
  b.get_bool("single_submit", a.single_submit);
  b.get_bool("overlap_events", a.overlap_events);
  b.finish({{"use_gds", "false"}});
}

inline void Reader::read_optimizer(Block& root, Config& c) {
  const Json* oj = root.get_object("optimizer");
  if (!oj) return;
  Block b(*this, oj, root.path_of("optimizer"));
  // DeepSpeed's names (matched case-insensitively): the optimizer tags' (policies.hpp).
  std::array<std::string_view, OptimizerKind::count()> types{};
  std::string supported;
  for (std::size_t i = 0; i < types.size(); ++i) {
    types[i] = OptimizerKind::at(i).name();
    supported += cat(i == 0 ? "" : i + 1 == types.size() ? " or " : ", ", types[i]);
  }
  // DeepSpeed's other optimizers (none of them is a tag).
  constexpr std::array<std::string_view, 10> kNotYet{"Adagrad", "MuAdam", "MuAdamW", "MuSGD", "Muon",
                                                     "SGD", "RMSprop", "Adamax", "CPUAdam", "FusedAdam"};
  std::string type;
  const Json* params_json = b.get_object("params");
  Got got_type = b.get_string("type", type);
  b.finish({{"legacy_fusion", "false"}});
  if (got_type == Got::absent) {
    error(b.path_of("type"), cat("required: the optimizer type (", supported, ")"));
    return;
  }
  if (got_type != Got::value) return;
  std::optional<OptimizerKind> kind;
  for (std::size_t i = 0; i < types.size(); ++i) {
    if (iequals(type, types[i])) kind = OptimizerKind::at(i);
  }
  if (!kind) {
    for (auto n : kNotYet) {
      if (iequals(type, n)) {
        error(b.path_of("type"), cat("optimizer not supported by zerotk yet (supported: ", supported, ")"),
              show_string(type));
        return;
      }
    }
    std::string rule = cat("unknown optimizer type (supported: ", supported, ")");
    if (auto m = closest_match(type, types)) rule += "; did you mean \"" + *m + "\"?";
    error(b.path_of("type"), std::move(rule), show_string(type));
    return;
  }

  OptimizerBlock o;
  o.kind = *kind;
  OptimizerOptions& h = o.params;  // the optimizer layer's own struct, filled in place
  Block p(*this, params_json, b.path_of("params"));
  if (const Json* m = p.find("max_grad_norm")) {
    error(p.path_of("max_grad_norm"),
          "max_grad_norm is not an optimizer parameter in DeepSpeed configs; use the top-level \"gradient_clipping\"",
          show(*m));
  }
  // Each key only where the optimizer's tag says it reads it (policies.hpp, optimizer_params).
  namespace keys = ::zerotk::optimizer_params;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (o.kind.reads(keys::lr) && p.get_number("lr", h.lr, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("lr"), h.lr, std::optional(ctx.lr.value_or(h.lr)), ctx.lr ? "engine" : "optimizer default");
  }
  std::array<double, 2> betas{h.beta1, h.beta2};
  if (o.kind.reads(keys::betas) && p.get_betas("betas", betas, true) == Got::automatic) {
    resolve_auto(p.path_of("betas"), betas, std::optional(ctx.betas.value_or(betas)),
                 ctx.betas ? "engine" : "optimizer default");
  }
  h.beta1 = betas[0];
  h.beta2 = betas[1];
  if (o.kind.reads(keys::eps) && p.get_number("eps", h.eps, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("eps"), h.eps, std::optional(ctx.eps.value_or(h.eps)), ctx.eps ? "engine" : "optimizer default");
  }
  if (o.kind.reads(keys::weight_decay) &&
      p.get_number("weight_decay", h.weight_decay, 0, false, kInf, true) == Got::automatic) {
    resolve_auto(p.path_of("weight_decay"), h.weight_decay, std::optional(ctx.weight_decay.value_or(h.weight_decay)),
                 ctx.weight_decay ? "engine" : "optimizer default");
  }
  if (o.kind.reads(keys::bias_correction)) p.get_bool("bias_correction", h.bias_correction);
  const bool adam_like = o.kind.reads(keys::adam_w_mode);
  const bool lamb_like = o.kind.reads(keys::trust_clamp);
  const bool zero_one = o.kind.reads(keys::zero_one);
  const bool onebit = o.kind.reads(keys::onebit_comm);
  if (adam_like) {
    bool w = true;
    if (p.get_bool("adam_w_mode", w) == Got::value && o.kind == OptimizerKind::adamw && !w) {
      error(p.path_of("adam_w_mode"), "AdamW always decouples weight decay; use \"type\": \"Adam\" for L2 mode", "false");
    }
    // "Adam" means AdamW unless adam_w_mode is false (DeepSpeed's FusedAdam default).
    if (o.kind == OptimizerKind::adam && w) o.kind = OptimizerKind::adamw;
    o.adam_w_mode = o.kind == OptimizerKind::adamw;
  }
  if (lamb_like) {
    p.get_number("max_coeff", h.lamb_max_coeff, 0);
    p.get_number("min_coeff", h.lamb_min_coeff, 0);
    if (h.lamb_min_coeff > h.lamb_max_coeff) {
      error(p.path_of("min_coeff"), cat("must be <= max_coeff (", num_text(h.lamb_max_coeff), ")"),
            num_text(h.lamb_min_coeff));
    }
  }
  constexpr std::int64_t kMaxInt = std::numeric_limits<std::int64_t>::max();
  if (o.kind.reads(keys::freeze_step)) p.get_int("freeze_step", o.freeze_step, 0, kMaxInt);
  if (zero_one) {  // 0/1 Adam has no freeze_step: its variance phase ends at var_freeze_step
    optim::ZeroOneOptions& z = o.zero_one;
    p.get_int("var_freeze_step", z.var_freeze_step, 0, kMaxInt);
    p.get_int("var_update_scaler", z.var_update_scaler, 1, kMaxInt);
    p.get_int("local_step_scaler", z.local_step_scaler, 1, kMaxInt);
    p.get_int("local_step_clipper", z.local_step_clipper, 1, kMaxInt);
  }
  if (onebit) {
    p.get_bool("cuda_aware", o.cuda_aware);
    p.get_string("comm_backend_name", o.comm_backend_name);
  }
  if (o.kind.reads(keys::onebit_lamb)) {
    p.get_number("coeff_beta", o.lamb.coeff_beta, 0, false, 1);
    p.get_number("factor_max", o.lamb.factor_max, 0);
    p.get_number("factor_min", o.lamb.factor_min, 0);
    p.get_number("factor_threshold", o.lamb.factor_threshold, 0);
  }
  // The optimizer layer's own rules, at JSON paths. They repeat the range checks above (a value
  // those rejected is not assigned, so it is not reported twice) and add what only they know: the
  // kernels round each value to float (lr 1e300 -> inf, eps 1e-50 -> 0, a beta -> 1), and an
  // "auto" resolved from an engine hint was not range-checked at all.
  for (const optim::OptionProblem& e : optim::problems(h)) {
    const std::string_view key = optimizer_param_key(e.field);
    const bool beta = key == "betas";
    const unsigned flag = key == "lr" ? keys::lr : key == "betas" ? keys::betas : key == "eps" ? keys::eps
                          : key == "weight_decay" ? keys::weight_decay : keys::trust_clamp;
    if (!o.kind.reads(flag)) continue;  // not read, not used
    if (key == "max_coeff" && h.lamb_min_coeff > h.lamb_max_coeff) continue;  // reported at min_coeff above
    error(p.path_of(key), beta ? cat(e.field, " ", e.rule) : e.rule, beta ? text(betas) : num_text(e.value));
  }
  p.finish({{"amsgrad", "false"},
            {"torch_adam", "false", kTorchOnly},
            {"fused", "", kTorchOnly},
            {"eps_inside_sqrt", "false"}});
  c.optimizer = o;
}

inline void Reader::read_scheduler(Block& root, Config& c) {
  const Json* sj = root.get_object("scheduler");
  if (!sj) return;
  Block b(*this, sj, root.path_of("scheduler"));
  constexpr std::array<std::string_view, 5> kTypes{"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                   "LRRangeTest"};
  std::size_t t = 0;
  const Json* params_json = b.get_object("params");
  Got got = b.get_choice("type", t, kTypes);
  b.finish();
  if (got == Got::absent) error(b.path_of("type"), "required: the scheduler type (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest)");
  if (got != Got::value) return;
  const auto kind = static_cast<SchedulerKind>(t);
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  constexpr auto kInf = std::numeric_limits<double>::infinity();
  Block p(*this, params_json, b.path_of("params"));
  const double opt_lr = c.optimizer ? c.optimizer->params.lr : ctx.lr.value_or(optim::kDefaultOptimizerLr);

  auto warmup_type = [&](WarmupType& out) {
    constexpr std::array<std::string_view, 2> kWarm{"log", "linear"};
    std::size_t w = 0;
    if (p.get_choice("warmup_type", w, kWarm) == Got::value) out = static_cast<WarmupType>(w);
  };
  auto warmup_steps = [&](std::int64_t& out) {
    if (p.get_int("warmup_num_steps", out, 1, kMax, true) == Got::automatic) {  // as WarmupLR: N >= 1
      resolve_auto(p.path_of("warmup_num_steps"), out, std::optional(ctx.warmup_num_steps.value_or(out)),
                   ctx.warmup_num_steps ? "engine" : "scheduler default");
    }
  };
  auto total_steps = [&](std::optional<std::int64_t>& out) {
    std::int64_t v = 0;
    Got g = p.get_int("total_num_steps", v, 1, kMax, true);
    if (g == Got::value) {
      out = v;
    } else if (g == Got::automatic) {
      if (resolve_auto(p.path_of("total_num_steps"), v, ctx.total_num_steps, "engine",
                       "write the number of optimizer steps, or give it (zerotk-config --total-steps N)")) {
        out = v;
      }
    } else if (g == Got::absent) {
      error(p.path_of("total_num_steps"), cat("required by ", to_string(kind)));
    }
  };
  SchedulerOptions s;
  auto last_iter = [&] { p.get_int("last_batch_iteration", s.last_batch_iteration, -1, kMax); };
  // WarmupLR and WarmupDecayLR: warmup_max_lr is resolved here, so it is set in either.
  auto warmup_lr = [&](auto& w, double max_default) {
    if (p.get_number("warmup_min_lr", w.warmup_min_lr, 0, false, kInf, true) == Got::automatic) {
      resolve_auto(p.path_of("warmup_min_lr"), w.warmup_min_lr, std::optional(0.0), "scheduler default");
    }
    double max_lr = max_default;
    if (p.get_number("warmup_max_lr", max_lr, 0, false, kInf, true) == Got::automatic) {
      resolve_auto(p.path_of("warmup_max_lr"), max_lr, std::optional(opt_lr), "optimizer lr");
    }
    w.warmup_max_lr = max_lr;
    warmup_steps(w.warmup_num_steps);
    warmup_type(w.warmup_type);
    last_iter();
  };

  switch (kind) {
    case SchedulerKind::warmup_lr: {
      WarmupLROptions w;
      warmup_lr(w, opt_lr);  // DeepSpeed: warmup_max_lr defaults to the optimizer's lr
      s.params = w;
      break;
    }
    case SchedulerKind::warmup_decay_lr: {
      WarmupDecayLROptions w;
      total_steps(w.total_num_steps);
      warmup_lr(w, 1e-3);  // DeepSpeed's WarmupDecayLR signature defaults warmup_max_lr to 0.001
      s.params = w;
      break;
    }
    case SchedulerKind::warmup_cosine_lr: {
      WarmupCosineLROptions w;
      total_steps(w.total_num_steps);
      p.get_number("warmup_min_ratio", w.warmup_min_ratio, 0, false, 1);
      p.get_number("cos_min_ratio", w.cos_min_ratio, 0, false, 1);
      warmup_steps(w.warmup_num_steps);
      warmup_type(w.warmup_type);
      last_iter();
      s.params = w;
      break;
    }
    case SchedulerKind::one_cycle: {
      OneCycleOptions o;
      auto required_lr = [&](std::string_view key, std::optional<double>& out) {
        double v = 0;
        const Got g = p.get_number(key, v, 0);
        if (g == Got::value) out = v;
        if (g == Got::absent) error(p.path_of(key), "required by OneCycle");
      };
      required_lr("cycle_min_lr", o.cycle_min_lr);
      required_lr("cycle_max_lr", o.cycle_max_lr);
      p.get_number("decay_lr_rate", o.decay_lr_rate, 0);
      p.get_int("cycle_first_step_size", o.cycle_first_step_size, 1, kMax);
      std::int64_t second = o.cycle_first_step_size;  // resolved: defaults to the first
      p.get_int("cycle_second_step_size", second, 1, kMax);
      o.cycle_second_step_size = second;
      p.get_int("cycle_first_stair_count", o.cycle_first_stair_count, 0, kMax);
      std::int64_t second_stairs = o.cycle_first_stair_count;
      p.get_int("cycle_second_stair_count", second_stairs, 0, kMax);
      o.cycle_second_stair_count = second_stairs;
      p.get_int("decay_step_size", o.decay_step_size, 0, kMax);
      p.get_bool("cycle_momentum", o.cycle_momentum);
      p.get_number("cycle_min_mom", o.cycle_min_mom, 0, false, 1);
      p.get_number("cycle_max_mom", o.cycle_max_mom, 0, false, 1);
      p.get_number("decay_mom_rate", o.decay_mom_rate, 0);
      last_iter();
      s.params = o;
      break;
    }
    case SchedulerKind::lr_range_test: {
      LRRangeTestOptions l;
      p.get_number("lr_range_test_min_lr", l.lr_range_test_min_lr, 0);
      p.get_int("lr_range_test_step_size", l.lr_range_test_step_size, 1, kMax);
      p.get_number("lr_range_test_step_rate", l.lr_range_test_step_rate, 0);
      p.get_bool("lr_range_test_staircase", l.lr_range_test_staircase);
      last_iter();
      s.params = l;
      break;
    }
  }
  // The engine writes the schedule's lr into the optimizer, whose kernels round it to float.
  auto lr_fits_float = [&](std::string_view key, std::optional<double> v) {
    if (!v) return;
    if (std::string why = optim::float_range_problem(*v); !why.empty()) error(p.path_of(key), why, num_text(*v));
  };
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, WarmupLROptions> || std::is_same_v<T, WarmupDecayLROptions>) {
          lr_fits_float("warmup_min_lr", x.warmup_min_lr);
          lr_fits_float("warmup_max_lr", x.warmup_max_lr);
        } else if constexpr (std::is_same_v<T, OneCycleOptions>) {
          lr_fits_float("cycle_min_lr", x.cycle_min_lr);
          lr_fits_float("cycle_max_lr", x.cycle_max_lr);
        } else if constexpr (std::is_same_v<T, LRRangeTestOptions>) {
          lr_fits_float("lr_range_test_min_lr", x.lr_range_test_min_lr);
        }
      },
      s.params);
  p.finish();
  c.scheduler = s;
}

inline void Reader::read_batch(Block& root, Config& c) {
  constexpr auto kMax = std::numeric_limits<std::int64_t>::max();
  const std::int64_t w = data_size_;  // SEMANTICS.md section 5's W: the data-parallel ranks
  std::optional<std::int64_t> tbs, mbs, gas;
  std::int64_t v = 0;
  const std::string p_tbs = root.path_of("train_batch_size");
  const std::string p_mbs = root.path_of("train_micro_batch_size_per_gpu");
  const std::string p_gas = root.path_of("gradient_accumulation_steps");
  bool bad = false;
  bool tbs_auto = false, mbs_auto = false;
  switch (root.get_int("train_batch_size", v, 1, kMax, true)) {
    case Got::value: tbs = v; break;
    case Got::automatic: tbs_auto = true; break;  // derived from the other two below
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  switch (root.get_int("train_micro_batch_size_per_gpu", v, 1, kMax, true)) {
    case Got::value: mbs = v; break;
    case Got::automatic:
      mbs_auto = true;
      if (ctx.micro_batch_size) {
        mbs = *ctx.micro_batch_size;
        note(Notice::Kind::auto_resolved, p_mbs, cat("\"auto\" resolved to ", std::to_string(*mbs), " (engine)"));
      }
      break;
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  // EngineOptions counts micro-steps in an int: a larger value must not wrap (4294967297 -> 1).
  constexpr std::int64_t kMaxGas = std::numeric_limits<int>::max();
  switch (root.get_int("gradient_accumulation_steps", v, 1, kMaxGas, true)) {
    case Got::value: gas = v; break;
    case Got::automatic:
      if (ctx.gradient_accumulation_steps) {
        gas = *ctx.gradient_accumulation_steps;
        note(Notice::Kind::auto_resolved, p_gas, cat("\"auto\" resolved to ", std::to_string(*gas), " (engine)"));
      }
      break;
    case Got::invalid: bad = true; break;
    case Got::absent: break;
  }
  if (bad || w < 1) return;
  if (!tbs && !mbs) {
    if (mbs_auto || tbs_auto) {
      error(mbs_auto ? p_mbs : p_tbs,
            "\"auto\" cannot be resolved here: write train_micro_batch_size_per_gpu, or give the per-rank micro "
            "batch (zerotk-config --micro-batch N)",
            "\"auto\"");
    } else {
      error(p_tbs, "train_batch_size or train_micro_batch_size_per_gpu must be given");
    }
    return;
  }
  // SEMANTICS.md section 5, with DeepSpeed's integer division where a value is derived.
  std::string derived;  // how a value that was not given was computed, for the error below
  const auto division = [&](const char* key, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t r) {
    derived = cat("; ", key, " was not given: derived as ", std::to_string(a), " / ", std::to_string(b), " / ",
                  std::to_string(c), " = ", std::to_string(r), " with integer division, as DeepSpeed does");
  };
  if (tbs && mbs && gas) {
  } else if (tbs && mbs) {
    gas = *tbs / *mbs / w;
    division("gradient_accumulation_steps", *tbs, *mbs, w, *gas);
  } else if (tbs && gas) {
    mbs = *tbs / w / *gas;
    division("train_micro_batch_size_per_gpu", *tbs, w, *gas, *mbs);
  } else if (mbs && gas) {
    tbs = 0;
    if (__builtin_mul_overflow(*mbs, *gas, &*tbs) || __builtin_mul_overflow(*tbs, w, &*tbs)) tbs = -1;
  } else if (tbs) {
    gas = 1;
    mbs = *tbs / w;
    division("train_micro_batch_size_per_gpu", *tbs, w, 1, *mbs);
  } else {
    gas = 1;
    tbs = 0;
    if (__builtin_mul_overflow(*mbs, w, &*tbs)) tbs = -1;
  }
  if (tbs_auto) {
    note(Notice::Kind::auto_resolved, p_tbs,
         cat("\"auto\" resolved to ", std::to_string(*tbs), " (micro batch x accumulation steps x ",
             w == ctx.world_size ? "world size)" : "data-parallel size)"));
  }
  std::int64_t product = 0;
  if (__builtin_mul_overflow(*mbs, *gas, &product) || __builtin_mul_overflow(product, w, &product)) {
    error(p_tbs, "train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size overflows",
          std::to_string(*mbs) + " * " + std::to_string(*gas) + " * " + std::to_string(w));
    return;
  }
  if (*tbs != product || *mbs < 1 || *gas < 1) {
    // With a tensor size the product's last factor is the data-parallel size: say where it came from.
    const std::string w_is = w == ctx.world_size ? std::string() : cat(" (the data-parallel size: ", data_size_origin(c), ")");
    error(p_tbs,
          cat("train_batch_size must equal train_micro_batch_size_per_gpu * gradient_accumulation_steps * ",
              w == ctx.world_size ? "world_size" : "data_parallel_size", ": ", std::to_string(*tbs), " != ",
              std::to_string(*mbs), " * ", std::to_string(*gas), " * ", std::to_string(w), w_is, " (= ",
              std::to_string(product), ")", derived),
          std::to_string(*tbs));
    return;
  }
  if (*gas > kMaxGas) {  // derived from the batch sizes, or an engine hint
    error(p_gas, cat("resolves to ", std::to_string(*gas), ", above ", std::to_string(kMaxGas),
                     " (micro-steps are counted in an int)"),
          std::to_string(*gas));
    return;
  }
  c.train_batch_size = *tbs;
  c.train_micro_batch_size_per_gpu = *mbs;
  c.gradient_accumulation_steps = static_cast<int>(*gas);  // <= kMaxGas, an int
}

inline void Reader::read_scalars(Block& root, Config& c) {
  if (root.get_number("gradient_clipping", c.gradient_clipping, 0, false, std::numeric_limits<double>::infinity(),
                      true) == Got::automatic) {
    resolve_auto(root.path_of("gradient_clipping"), c.gradient_clipping, std::optional(ctx.max_grad_norm.value_or(1.0)),
                 ctx.max_grad_norm ? "engine" : "default");
  }
  root.get_int("steps_per_print", c.steps_per_print, 1, std::numeric_limits<std::int64_t>::max());
  root.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  root.get_bool("prescale_gradients", c.prescale_gradients);
  root.get_number("gradient_predivide_factor", c.gradient_predivide_factor, 0, /*lo_open=*/true);
  constexpr std::array<std::string_view, 3> kTypes{"fp32", "fp16", "bf16"};
  std::size_t t = 0;
  if (root.get_choice("communication_data_type", t, kTypes, /*nullable=*/true) == Got::value) {
    constexpr std::array<DType, 3> kDTypes{DType::fp32, DType::fp16, DType::bf16};
    c.communication_data_type = kDTypes[t];
  }
  {
    Block d(*this, root.get_object("data_types"), root.path_of("data_types"));
    // The spellings DeepSpeed's DtypeEnum accepts for the three dtypes (its int8 fails later, in its engine).
    constexpr std::array<std::string_view, 11> kNames{"fp32",    "fp16",          "bf16",     "float32",
                                                      "float",   "torch.float32", "float16",  "half",
                                                      "torch.float16", "bfloat16", "torch.bfloat16"};
    constexpr std::array<DType, 11> kAccum{DType::fp32, DType::fp16, DType::bf16, DType::fp32, DType::fp32, DType::fp32,
                                           DType::fp16, DType::fp16, DType::fp16, DType::bf16, DType::bf16};
    std::size_t i = 0;
    if (d.get_choice("grad_accum_dtype", i, kNames, /*nullable=*/true) == Got::value) {
      c.grad_accum_dtype = kAccum[i];
    }
    d.finish({{"param_dtype"}, {"buffer_dtype"}});
  }
}

inline void Reader::read_monitor_and_checkpointing(Block& root, Config& c) {
  {
    Block b(*this, root.get_object("csv_monitor"), root.path_of("csv_monitor"));
    b.get_bool("enabled", c.csv_monitor.enabled);
    b.get_string("output_path", c.csv_monitor.output_path);
    if (b.get_string("job_name", c.csv_monitor.job_name) == Got::value && c.csv_monitor.job_name.empty()) {
      error(b.path_of("job_name"), "must not be empty (it names the output directory)", "\"\"");
    }
    b.finish();
  }
  {
    Block b(*this, root.get_object("activation_checkpointing"), root.path_of("activation_checkpointing"));
    auto& a = c.activation_checkpointing;
    b.get_bool("partition_activations", a.partition_activations);
    b.get_bool("contiguous_memory_optimization", a.contiguous_memory_optimization);
    b.get_bool("cpu_checkpointing", a.cpu_checkpointing);
    std::int64_t n = 0;
    const Json* nj = b.find("number_checkpoints");
    if (nj && !nj->is_null() && b.get_int("number_checkpoints", n, 1, std::numeric_limits<std::int64_t>::max()) == Got::value) {
      a.number_checkpoints = n;
    }
    b.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
    b.get_bool("profile", a.profile);
    b.finish();
    if (a.partition_activations) {
      unsupported(b.path_of("partition_activations"),
                  "has no effect in zerotk: it would split the saved block inputs across the tensor-parallel group, "
                  "and zerotk's Recompute keeps each rank's whole (under sequence parallel they are split already); "
                  "ignored",
                  "true");
    }
    // DeepSpeed's checkpointing.configure() asserts these two (cpu_checkpointing alone is allowed).
    if (a.contiguous_memory_optimization && !a.partition_activations) {
      error(b.path_of("contiguous_memory_optimization"), "needs \"partition_activations\": true", "true");
    }
    if (a.contiguous_memory_optimization && !a.number_checkpoints) {
      error(b.path_of("number_checkpoints"), "required by contiguous_memory_optimization (the number of checkpointed layers)");
    }
  }
  read_checkpoint(root, c);
}

inline void Reader::read_checkpoint(Block& root, Config& c) {
  // DeepSpeed upper-cases tag_validation before checking it; get_choice is case-insensitive too.
  Block b(*this, root.get_object("checkpoint"), root.path_of("checkpoint"));
  auto& k = c.checkpoint;
  constexpr std::array<std::string_view, 3> kModes{"Ignore", "Warn", "Fail"};  // TagValidation's order
  std::size_t mode = 0;
  if (b.get_choice("tag_validation", mode, kModes) == Got::value) k.tag_validation = static_cast<TagValidation>(mode);
  b.get_bool("load_universal", k.load_universal);
  b.get_bool("use_node_local_storage", k.use_node_local_storage);
  {
    Block p(*this, b.get_object("parallel_write"), b.path_of("parallel_write"));
    p.get_bool("pipeline_stage", k.parallel_write_pipeline_stage);
    p.finish();
  }
  b.finish({{"checkpoint_serialization",
             {},
             "has no effect in zerotk: it chooses torch.save's serialization, and zerotk writes its own "
             "format (docs/checkpoint.md); ignored"},
            {"writer",
             {},
             "has no effect in zerotk: checkpoints are written by zerotk's own writer (fsync, then atomic "
             "rename); to write beside training use checkpoint::save_async (docs/checkpoint.md); ignored"}});
  if (k.load_universal) {
    unsupported(b.path_of("load_universal"),
                "has no effect in zerotk: every zerotk checkpoint loads on any data-parallel size and ZeRO stage, "
                "resharded online (docs/checkpoint.md), so there is no universal format to ask for; ignored",
                "true");
  }
  if (k.use_node_local_storage) {
    unsupported(b.path_of("use_node_local_storage"),
                "not supported by zerotk: every rank reads the manifest rank 0 writes, so all ranks must see one "
                "shared checkpoint directory; ignored",
                "true");
  }
  if (k.parallel_write_pipeline_stage) {
    unsupported(join_path(b.path_of("parallel_write"), "pipeline_stage"),
                "has no effect in zerotk: every rank (of every pipeline stage) already writes its own file at once; "
                "ignored",
                "true");
  }
}

inline void Reader::read_gradient_compression(Block& root, Config& c) {
  // SEMANTICS.md section 9b. topk_ratio and huffman_coding are accepted without an algorithm (published
  // configs carry them): no algorithm means no compression, and they do nothing.
  Block b(*this, root.get_object("gradient_compression"), root.path_of("gradient_compression"));
  auto& g = c.gradient_compression;
  constexpr std::array<std::string_view, 3> kAlgorithms{"topk", "2bit", "1bit"};  // CompressionAlgorithm's order
  std::size_t a = 0;
  if (b.get_choice("algorithm", a, kAlgorithms, /*nullable=*/true) == Got::value) {
    g.algorithm = static_cast<CompressionAlgorithm>(a);
  }
  b.get_number("topk_ratio", g.topk_ratio, 0.0, /*lo_open=*/true, 1.0);
  b.get_bool("huffman_coding", g.huffman_coding);
  b.finish();
}

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
               {"sparse_attention"},
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
               {"sequence_parallel_size", "1"},
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

// Reader::read_communication, the `communication` block in a file of its own.
#include "zerotk/config/communication.hpp"
// Reader::read_parallel: the tensor and pipeline sizes, in a file of their own.
#include "zerotk/config/parallel.hpp"
