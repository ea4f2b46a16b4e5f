// Hostile and broken input (issue "Hostile input and faults", config items): every case ends as a
// bounded list of one-line errors, each naming its JSON path and the offending value, never as an
// exception, a silent success, or time and memory out of proportion to the input.
#include "common.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

namespace test_hostile {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;
using zerotk_test::error_lines;

namespace {

std::string regression(std::string_view name) {
  return read_text_file(std::string(ZEROTK_TEST_SOURCE_DIR) + "/config/regressions/" + std::string(name));
}

bool printable_line(std::string_view s) {
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) return false;
  }
  return true;
}

// The one-line form of every error: no control byte may split it or reach the terminal.
void check_printable(const ParseResult& r) {
  for (const auto& e : r.errors) CHECK_MESSAGE(printable_line(format_line(e)), format_line(e));
  for (const auto& n : r.notices) CHECK(printable_line(n.path + n.message));
}

}  // namespace

// ---- 1. unknown keys: linear time, bounded report ---------------------------------------------------

TEST_CASE("many unknown keys: the report is capped and counts the rest") {
  // The issue's reproduction, scaled: each key is one edit from nothing DeepSpeed knows, so every one
  // used to cost a copy of its block's known keys and a "did you mean" search.
  constexpr int kRoot = 100'000, kZero = 2'000;
  std::string json = R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_com": true)";
  for (int i = 0; i < kZero; ++i) json += ", \"zkeyX" + std::to_string(i) + "\": " + std::to_string(i);
  json += "}";
  for (int i = 0; i < kRoot; ++i) json += ", \"stage3_max_live_parametersX" + std::to_string(i) + "\": 0";
  json += "}";
  const ParseResult r = parse(json, ResolveContext{});
  REQUIRE(r.errors.size() == Diagnostics::kMaxErrors + 1);
  CHECK_FALSE(r.config);
  // Blocks report in reading order; the first unknown key still gets its suggestion.
  CHECK(format_line(r.errors[0]) ==
        "/zero_optimization/overlap_com: unknown key; did you mean \"overlap_comm\"? (got true)");
  CHECK(r.errors[1].where() == "/zero_optimization/zkeyX0");
  CHECK(r.errors[1].value() == "0");
  const std::size_t total = 1 + kZero + kRoot;
  CHECK(r.errors.back().message() ==
        "stopped after 100 errors; " + std::to_string(total - Diagnostics::kMaxErrors) + " more not shown");
  CHECK(r.errors_not_shown == total - Diagnostics::kMaxErrors);
}

TEST_CASE("an object with many members is read by key, not by scanning") {
  // Known keys among 50,000 unknown ones: found wherever they are, reported once each.
  std::string json = "{";
  for (int i = 0; i < 50'000; ++i) json += "\"u" + std::to_string(i) + "\": null, ";
  json += R"("train_batch_size": 8, "zero_optimization": {"stage": 1}, "steps_per_print": 0})";
  const ParseResult r = parse(json, ResolveContext{});
  REQUIRE(r.errors.size() == Diagnostics::kMaxErrors + 1);
  CHECK(r.errors[0].where() == "/steps_per_print");  // values are read before unknown keys are reported
  CHECK(r.errors[1].where() == "/u0");
}

// ---- 2. read failures ---------------------------------------------------------------------------------

TEST_CASE("a file that cannot be read says why, with its path") {
  const std::string dir = std::string(ZEROTK_TEST_SOURCE_DIR) + "/config/regressions";
  try {
    (void)read_text_file(dir);
    FAIL("reading a directory must fail");
  } catch (const io_error& e) {
    CHECK(e.where() == dir);
    CHECK(e.message() == "cannot read config file: " + std::generic_category().message(EISDIR) + " (errno " +
                             std::to_string(EISDIR) + ")");
  }
  CHECK_THROWS_AS(load_file(dir, ResolveContext{}), io_error);
  try {
    (void)read_text_file(dir + "/no_such_file.json");
    FAIL("a missing file must fail");
  } catch (const io_error& e) {
    CHECK(e.message().find("cannot open config file: " + std::generic_category().message(ENOENT)) == 0);
  }
  // /proc/self/mem opens (where /proc allows it) but fails on the first read, address 0 being
  // unmapped: an io_error, never an empty config.
  if (std::filesystem::exists("/proc/self/mem")) {
    try {
      (void)read_text_file("/proc/self/mem");
      FAIL("reading /proc/self/mem from offset 0 must fail");
    } catch (const io_error& e) {
      CHECK(e.where() == "/proc/self/mem");
      CHECK((e.message().starts_with("cannot read config file: ") || e.message().starts_with("cannot open config file: ")));
    }
  }
}

// Issue 49, item 4: `zerotk-config /dev/zero` and `zerotk-plan --config /dev/zero` grew until
// killed, and a FIFO blocked. Only regular files of at most kMaxConfigBytes are read.
TEST_CASE("a config that is not a regular file, or larger than kMaxConfigBytes, is refused without blocking") {
  const std::filesystem::path dir = std::filesystem::path(ZEROTK_TEST_BINARY_DIR) / ("hostile_read." + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  CHECK(kMaxConfigBytes == std::size_t{16} << 20);
  SUBCASE("a FIFO with no writer") {
    const std::string fifo = (dir / "fifo.json").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
    try {
      (void)read_text_file(fifo);
      FAIL("a FIFO must be refused");
    } catch (const io_error& e) {
      CHECK(e.where() == fifo);
      CHECK(e.message().starts_with("cannot read config file: not a regular file but a FIFO"));
    }
    CHECK_THROWS_AS(load_file(fifo, ResolveContext{}), io_error);
  }
  SUBCASE("/dev/zero") {
    if (std::filesystem::exists("/dev/zero")) {
      CHECK_THROWS_WITH_AS(read_text_file("/dev/zero"),
                           "zerotk io error at /dev/zero: cannot read config file: not a regular file but a character device; only "
                           "regular files are read (a FIFO or device could block or never end)",
                           io_error);
    }
  }
  SUBCASE("one byte over the limit; the limit itself is read") {
    const std::string big = (dir / "big.json").string();
    {
      std::ofstream f(big, std::ios::binary);
      f << "{\"train_batch_size\": 8}" << std::string(kMaxConfigBytes - 23, ' ');
    }
    REQUIRE(std::filesystem::file_size(big) == kMaxConfigBytes);
    CHECK(read_text_file(big).size() == kMaxConfigBytes);
    std::ofstream(big, std::ios::binary | std::ios::app) << ' ';
    try {
      (void)read_text_file(big);
      FAIL("a file over the limit must be refused");
    } catch (const io_error& e) {
      CHECK(e.where() == big);
      CHECK(e.message() == "cannot read config file: larger than the limit of 16777216 bytes");
      CHECK(e.value() == "16777217 bytes");
    }
  }
  SUBCASE("a stream (stdin) stops at the limit") {
    std::FILE* f = std::tmpfile();
    REQUIRE(f != nullptr);
    std::fputs("0123456789", f);
    std::rewind(f);
    CHECK(read_text(f, "-", 10) == "0123456789");
    std::rewind(f);
    CHECK_THROWS_WITH_AS(read_text(f, "-", 9), "zerotk io error at -: cannot read config file: larger than the limit of 9 bytes (got more than 9 bytes)",
                         io_error);
    std::fclose(f);
  }
  std::filesystem::remove_all(dir);
}

// ---- 3. the engine's hints are checked like config values ----------------------------------------

TEST_CASE("hints are checked by the rules of the values they fill") {
  struct Case {
    const char* field;
    ResolveContext ctx;
    const char* rule;
    const char* value;
  };
  const auto with = [](auto set) {
    ResolveContext c;
    set(c);
    return c;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const Case cases[] = {
      {"lr", with([&](auto& c) { c.lr = nan; }), "must be a finite number >= 0", "nan"},
      {"lr", with([](auto& c) { c.lr = -1; }), "must be a finite number >= 0", "-1"},
      {"max_grad_norm", with([](auto& c) { c.max_grad_norm = -3; }), "must be a finite number >= 0", "-3"},
      {"betas", with([](auto& c) { c.betas = std::array<double, 2>{1.5, -2}; }), "each beta must be in [0, 1)",
       "[1.5, -2]"},
      {"eps", with([](auto& c) { c.eps = -1e-8; }), "must be a finite number >= 0", "-1e-08"},
      {"weight_decay", with([&](auto& c) { c.weight_decay = inf; }), "must be a finite number >= 0", "inf"},
      {"world_size", with([](auto& c) { c.world_size = 0; }), "must be an integer in [1, 2147483647]", "0"},
      {"hidden_size", with([](auto& c) { c.hidden_size = std::int64_t{1} << 32; }), "must be an integer in [1, ",
       "4294967296"},
      {"micro_batch_size", with([](auto& c) { c.micro_batch_size = 0; }), "must be an integer in [1, ", "0"},
      {"gradient_accumulation_steps", with([](auto& c) { c.gradient_accumulation_steps = -2; }),
       "must be an integer in [1, ", "-2"},
      {"total_num_steps", with([](auto& c) { c.total_num_steps = 0; }), "must be an integer >= 1", "0"},
      {"warmup_num_steps", with([](auto& c) { c.warmup_num_steps = -1; }), "must be an integer >= 1", "-1"},
      {"warmup_num_steps", with([](auto& c) { c.warmup_num_steps = 0; }), "must be an integer >= 1", "0"},
      {"precision", with([](auto& c) { c.precision = DType::int32; }), "must be fp32, fp16 or bf16", "int32"},
  };
  for (const Case& k : cases) {
    CAPTURE(std::string(k.field));
    const auto errors = validate_context(k.ctx);
    REQUIRE(errors.size() == 1);
    CHECK(errors[0].where() == std::string("ResolveContext::") + k.field);
    CHECK(errors[0].message().find(k.rule) == 0);
    CHECK(errors[0].value() == k.value);
    // parse() reports the same error and reads nothing else.
    const ParseResult r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": "auto"}}})",
                                k.ctx);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].where() == errors[0].where());
  }
  ResolveContext good;
  good.lr = 0;
  good.betas = std::array<double, 2>{0, 0.999};
  good.eps = 0;
  good.weight_decay = 0.1;
  good.max_grad_norm = 0;
  CHECK(validate_context(good).empty());
}

// ---- 4. keys and values print on one line --------------------------------------------------------

TEST_CASE("keys holding control characters are escaped in paths") {
  const ParseResult r = parse(regression("key_with_control_chars.json"), ResolveContext{});
  REQUIRE(r.errors.size() == 2);
  CHECK(r.errors[0].where() == "/zero_optimization/stage\\n2\\u001b[31m");
  CHECK(r.errors[0].message() == "unknown key; did you mean \"stage\"?");
  CHECK(r.errors[1].where() == "/zero_optimization/\\u009b\\u202eevil");
  check_printable(r);
}

TEST_CASE("very long keys are cut like values") {
  const ParseResult r = parse(regression("long_key.json"), ResolveContext{});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/" + std::string(57, 'k') + "...");
  CHECK(r.errors[0].message() == "unknown key");  // no suggestion from a cut key
}

// Issue 49, item 7: a 100 MB string value was accepted. Strings longer than kMaxStringBytes are an
// error naming the JSON path, the length and the limit, wherever they are (object member, array
// element), and however the text was obtained (parse() has no file-size limit in front of it).
TEST_CASE("string values longer than kMaxStringBytes are errors naming the path and the limit") {
  CHECK(kMaxStringBytes == 4096);
  const auto doc = [](const std::string& nvme_path, const std::string& module) {
    return R"({"train_batch_size": 8, "fp16_override_modules": ["LayerNorm", ")" + module +
           R"("], "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": ")" + nvme_path + R"("}}})";
  };
  SUBCASE("at the limit: accepted") {
    const ParseResult r = parse(doc("/" + std::string(kMaxStringBytes - 1, 'p'), std::string(kMaxStringBytes, 'm')), ResolveContext{});
    CHECK_MESSAGE(r.ok(), error_lines(r));
  }
  SUBCASE("one byte over, in an object and in an array: both reported") {
    const ParseResult r = parse(doc("/" + std::string(kMaxStringBytes, 'p'), std::string(kMaxStringBytes + 1, 'm')), ResolveContext{});
    REQUIRE(r.errors.size() == 2);
    CHECK(r.errors[0].where() == "/fp16_override_modules/1");
    CHECK(r.errors[0].message() ==
          "string value of 4097 bytes is longer than the limit of 4096 bytes (zerotk::config::kMaxStringBytes)");
    CHECK(r.errors[0].value().starts_with("\"mmmm"));
    CHECK(r.errors[0].value().ends_with("..."));
    CHECK(r.errors[1].where() == "/zero_optimization/offload_param/nvme_path");
    CHECK(r.errors[1].message().starts_with("string value of 4097 bytes is longer than the limit of 4096 bytes"));
    check_printable(r);
  }
  SUBCASE("a 32 MiB string (over the file limit too): one short error") {
    const ParseResult r = parse(doc("/nvme", std::string(std::size_t{32} << 20, 'm')), ResolveContext{});
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].message().starts_with("string value of 33554432 bytes is longer than the limit of 4096 bytes"));
    CHECK(format_line(r.errors[0]).size() < 300);
  }
}

TEST_CASE("values with terminal escapes are escaped") {
  const ParseResult r = parse(regression("control_char_value.json"), ResolveContext{});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/optimizer/type");
  CHECK(r.errors[0].value() == R"("Adam\u001b]0;pwned\u0007")");
  check_printable(r);
}

TEST_CASE("printable(): escapes, invalid UTF-8, and cuts at character boundaries") {
  using zerotk::config::detail::printable;
  CHECK(printable("plain ascii") == "plain ascii");
  CHECK(printable("tab\there\r\n") == "tab\\there\\r\\n");
  CHECK(printable("esc\x1b[2J del\x7f") == "esc\\u001b[2J del\\u007f");
  CHECK(printable("\xc2\x9b csi, \xe2\x80\xae rlo, \xef\xbb\xbf bom") == "\\u009b csi, \\u202e rlo, \\ufeff bom");
  CHECK(printable("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac") == "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac");  // kept
  CHECK(printable("bad \xff \xc0\xaf \xed\xa0\x80") == "bad \\xFF \\xC0\\xAF \\xED\\xA0\\x80");
  CHECK(printable("a\\b") == "a\\b");
  CHECK(printable("a\\b", 60, true) == "a\\\\b");
  CHECK(printable(std::string(100, 'x'), 10) == "xxxxxxx...");
  CHECK(printable(std::string(10, 'x'), 10) == std::string(10, 'x'));
  // 3-byte characters are never split by the cut.
  std::string wide;
  for (int i = 0; i < 30; ++i) wide += "\xe6\x97\xa5";
  const std::string cut = printable(wide, 20);
  CHECK(cut == "\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5\xe6\x97\xa5...");
}

// ---- 5. a NUL byte is an error at its offset ------------------------------------------------------

TEST_CASE("a NUL byte is an error naming its byte offset, wherever it is") {
  ParseResult r = parse(regression("nul_after_document.json"), ResolveContext{});
  REQUIRE(r.errors.size() == 1);
  CHECK(format_line(r.errors[0]) ==
        "(config): invalid JSON at line 1, column 24 (byte offset 23): NUL byte after the document (7 more bytes "
        "follow it) (got \\u0000garbage)");
  r = parse(regression("nul_in_string.json"), ResolveContext{});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].where() == "/optimizer/type");
  CHECK(r.errors[0].message().find("(byte offset 49): NUL byte") != std::string::npos);
  r = parse(std::string(1, '\0'), ResolveContext{});
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message().find("(byte offset 0): NUL byte") != std::string::npos);
  r = parse(regression("trailing_garbage.json"), ResolveContext{});  // other trailing text was always an error
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].message().find("expected end of input") != std::string::npos);
}

// ---- 8. every problem names its path and, where there is one, the value -----------------------------

TEST_CASE("regression inputs: each problem with its path and offending value") {
  struct Case {
    const char* file;
    const char* path;
    const char* rule;
    const char* value;
  };
  const Case cases[] = {
      {"duplicate_object.json", "/fp16", "duplicate key", R"({"enabled":false,"loss_scale":[1,2]})"},
      {"deep_nesting.json", "/x/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0",
       "nested deeper than 64 levels", "["},
      {"unknown_keys_many.json", "/stage3_max_live_parametersX00000", "unknown key", "0"},
      {"trailing_garbage.json", "", "(byte offset 24): syntax error while parsing value - unexpected '{'", "{"},
      {"long_string_value.json", "/zero_optimization/offload_param/nvme_path",
       "string value of 5001 bytes is longer than the limit of 4096 bytes", "\"/xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx..."},
      // Found by the fuzz target: the input ends inside a literal.
      {"truncated_literal.json", "/fp16/enabled", "(byte offset 46): syntax error while parsing value - invalid literal",
       "tr"},
  };
  for (const Case& k : cases) {
    CAPTURE(std::string(k.file));
    const ParseResult r = parse(regression(k.file), ResolveContext{});
    REQUIRE_FALSE(r.errors.empty());
    CHECK_MESSAGE(r.errors[0].where() == k.path, error_lines(r));
    CHECK_MESSAGE(r.errors[0].message().find(k.rule) != std::string::npos, error_lines(r));
    CHECK(r.errors[0].value() == k.value);
    check_printable(r);
  }
}

}  // namespace test_hostile
