// Fuzz target for the DeepSpeed config reader: any bytes must come back as either a usable Config
// whose invariants hold (and which round-trips through to_json), or a bounded list of well-formed
// errors. Anything else (an exception, a crash, a sanitizer report, a broken promise below) aborts
// with the input, so the fuzzer keeps it.
//
// Built two ways from this one file (tests/config/CMakeLists.txt):
//   zerotk_fuzz_config      + driver.cpp, a small mutation driver in plain C++ (any compiler); CTest
//                           runs it for ZEROTK_FUZZ_SECONDS on every build
//   zerotk_libfuzzer_config clang -fsanitize=fuzzer,address,undefined (-DZEROTK_LIBFUZZER=ON)
// Both take libFuzzer's command line: zerotk_fuzz_config -max_total_time=60 -dict=config.dict DIR...
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>
#include <string_view>

#include "zerotk/config.hpp"

namespace {

namespace cfg = zerotk::config;

[[noreturn]] void broken(std::string_view promise, std::string_view input, std::string_view detail = {}) {
  std::fprintf(stderr, "zerotk config fuzz: broken promise: %.*s\n", static_cast<int>(promise.size()), promise.data());
  if (!detail.empty()) std::fprintf(stderr, "  %.*s\n", static_cast<int>(detail.size()), detail.data());
  const std::string shown = cfg::detail::printable(input, 2000);
  std::fprintf(stderr, "  input (%zu bytes): %s\n", input.size(), shown.c_str());
  std::abort();
}

bool one_line(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) return false;
  }
  return true;
}

// Rules about something absent have no offending value to show; every other error has one.
bool value_may_be_empty(std::string_view rule) {
  return rule.starts_with("required") || rule.find("must be given") != std::string_view::npos ||
         rule.starts_with("stopped after") || rule.starts_with("out of memory") ||
         rule.find("end of input") != std::string_view::npos;
}

// A rule without its numbers and syntax-error location: "invalid JSON: syntax error ... - unexpected end of input".
std::string rule_kind(std::string_view rule) {
  if (rule.starts_with("invalid JSON at ") && rule.find("): ") != std::string_view::npos) {
    rule = rule.substr(rule.find("): ") + 3);
  }
  std::string k;
  for (char c : rule.substr(0, 70)) {
    if (c >= '0' && c <= '9') {
      if (k.empty() || k.back() != '#') k += '#';
    } else {
      k += c;
    }
  }
  return k;
}

// Counts of error lines by rule, for the item-8 statistic (ZEROTK_FUZZ_STATS=1 prints them at exit).
struct Stats {
  std::size_t lines = 0, without_value = 0;
  std::map<std::string, std::size_t> without_value_by_rule;
  ~Stats() {
    if (std::getenv("ZEROTK_FUZZ_STATS") == nullptr) return;
    std::fprintf(stderr, "zerotk config fuzz: %zu error lines, %zu without a value\n", lines, without_value);
    for (const auto& [rule, n] : without_value_by_rule) std::fprintf(stderr, "  %6zu  %s\n", n, rule.c_str());
  }
} stats;

std::uint64_t mix(std::uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    if (c >= '0' && c <= '9') continue;  // the same rule with other numbers is the same behaviour
    h = (h ^ c) * 0x100000001b3ULL;
  }
  return h;
}

void check(std::string_view text, const cfg::ResolveContext& ctx, std::uint64_t& feature) {
  cfg::ParseResult r;
  try {
    r = cfg::parse(text, ctx);
  } catch (const std::exception& e) {
    broken("parse() never throws", text, e.what());
  } catch (...) {
    broken("parse() never throws", text, "unknown exception");
  }
  feature = mix(feature, r.ok() ? "ok" : "errors");
  if (r.ok() != r.config.has_value()) broken("config is set exactly when there are no errors", text);
  if (r.errors.size() > cfg::Diagnostics::kMaxErrors + 1) broken("at most kMaxErrors errors and a summary", text);
  for (const auto& e : r.errors) {
    const std::string line = cfg::format_line(e);
    if (e.kind() != zerotk::ErrorKind::config || e.message().empty()) broken("errors are config_errors with a rule", text, line);
    if (!one_line(line)) broken("every problem prints on one line", text, line);
    if (!e.where().empty() && e.where()[0] != '/' && !e.where().starts_with("ResolveContext::")) {
      broken("where() is a JSON path or a ResolveContext field", text, line);
    }
    ++stats.lines;
    if (e.value().empty()) {
      ++stats.without_value;
      ++stats.without_value_by_rule[rule_kind(e.message())];
      if (!value_may_be_empty(e.message())) broken("every problem names the offending value", text, line);
    }
    feature = mix(feature, e.message().substr(0, 48));
  }
  for (const auto& n : r.notices) {
    if (!one_line(n.path) || !one_line(n.message)) broken("notices print on one line", text, n.path + ": " + n.message);
    feature = mix(feature, n.path);
  }
  if (!r.config) return;

  const cfg::Config& c = *r.config;
  std::int64_t product = 0;
  if (__builtin_mul_overflow(c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps, &product) ||
      __builtin_mul_overflow(product, static_cast<std::int64_t>(ctx.world_size), &product) ||
      product != c.train_batch_size) {
    broken("train_batch_size = micro batch x accumulation x world", text);
  }
  if (c.fp16.enabled && c.bf16.enabled) broken("fp16 and bf16 are not both enabled", text);
  if (c.zero_optimization.offload_param.device != cfg::OffloadDevice::none && c.zero_optimization.stage != 3) {
    broken("offload_param only at stage 3", text);
  }
  for (const auto& e : cfg::check_buildable(c)) feature = mix(feature, e.where());
  // The resolved config, written out, reads back to the same options (no "auto" left to resolve).
  cfg::ResolveContext plain;
  plain.world_size = ctx.world_size;
  const std::string written = cfg::to_json(c).dump();
  const cfg::ParseResult back = cfg::parse(written, plain);
  if (!back.ok()) broken("to_json() output reads back", text, cfg::format_line(back.errors.front()));
  if (cfg::to_json(*back.config) != cfg::to_json(c)) broken("to_json() output reads back to the same options", text);
}

}  // namespace

/// What the last input did, in one number (which rules fired, which keys were noted): the built-in
/// driver keeps an input that shows a new value, a cheap stand-in for coverage feedback.
extern "C" {
std::uint64_t zerotk_fuzz_feature = 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::uint64_t feature = 0xcbf29ce484222325ULL;
  // A bare run (nothing known), and one where the engine knows everything "auto" can ask for.
  cfg::ResolveContext bare;
  bare.strict = true;
  check(text, bare, feature);
  cfg::ResolveContext known;
  known.world_size = 8;
  known.hidden_size = 1024;
  known.precision = zerotk::DType::bf16;
  known.micro_batch_size = 2;
  known.total_num_steps = 1000;
  check(text, known, feature);
  zerotk_fuzz_feature = feature;
  return 0;
}
