// Seeded mutation fuzzing of the reader: thousands of damaged variants of the fixture configs,
// mangled as bytes and as JSON trees. Every variant must come back as either a valid Config
// (whose invariants hold and which round-trips) or a list of config errors: no other exception,
// no crash (ASan/UBSan builds run this too), no hang.
#include "common.hpp"

#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace test_fuzz {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;

namespace {

const char* kFixtures[] = {"hf_zero2_auto.json", "hf_zero3_auto.json",    "ds_zero3_nvme.json",
                           "ds_onecycle_lamb.json", "ds_onebit_rangetest.json", "ds_minimal.json",
                           "ds_unsupported_keys.json", "invalid_many.json"};

// Tokens that exercise the reader's branches: every type, "auto", boundaries, known key names.
const char* kTokens[] = {"\"auto\"", "null", "true", "false", "-1", "0", "1", "2.5", "1e9", "2e8", "1e400", "-0.0",
                         "1e-400", "18446744073709551615", "9223372036854775808", "\"\"", "[]", "{}", "[0.9]",
                         "[0.9, 0.999]", "{\"enabled\": true}", "{\"device\": \"nvme\"}", "\"cpu\"", "\"nvme\"",
                         "\"Adam\"", "\"OneCycle\"", "\"stage\": 3,", "\"offload_param\": {\"device\": \"cpu\"},",
                         "\"train_batch_size\": \"auto\",", "\"fp16\": {\"enabled\": \"auto\"},", ",", ":", "\"",
                         "\\u0000", "\\ud800", "\xff", "[[[[[[[[", "}}}}", "\"bfloat16\": {},"};

const char* kKeys[] = {"stage", "enabled", "type", "params", "device", "nvme_path", "lr", "betas", "loss_scale",
                       "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                       "reduce_bucket_size", "stage3_prefetch_bucket_size", "offload_param", "offload_optimizer",
                       "total_num_steps", "warmup_num_steps", "cycle_min_lr", "csv_monitor", "job_name",
                       "max_grad_norm", "adam_w_mode", "bf16", "fp16", "zero_optimization", "bfloat16", "thread_count"};

Json random_value(std::mt19937_64& rng) {
  switch (rng() % 14) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return false;
    case 3: return -1;
    case 4: return 0;
    case 5: return static_cast<std::int64_t>(rng() % 5000);
    case 6: return 2.5;
    case 7: return 1e30;
    case 8: return "auto";
    case 9: return kKeys[rng() % std::size(kKeys)];
    case 10: return Json::array({0.9, 0.95});
    case 11: return Json::object({{"enabled", true}});
    case 12: return Json::object({{"device", "nvme"}, {"nvme_path", "/x"}});
    default: return 1e9;
  }
}

// Picks a random node of the tree (objects and arrays included).
Json* random_node(Json& root, std::mt19937_64& rng) {
  Json* node = &root;
  for (int depth = 0; depth < 6 && (node->is_object() || node->is_array()) && !node->empty(); ++depth) {
    if (rng() % 3 == 0) break;
    auto it = node->begin();
    std::advance(it, static_cast<long>(rng() % node->size()));
    node = &*it;
  }
  return node;
}

std::string mutate_tree(const std::string& text, std::mt19937_64& rng) {
  Json doc = Json::parse(text);
  const int ops = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < ops; ++i) {
    Json* n = random_node(doc, rng);
    switch (rng() % 4) {
      case 0: *n = random_value(rng); break;
      case 1:
        if (n->is_object() && !n->empty()) {
          auto it = n->begin();
          std::advance(it, static_cast<long>(rng() % n->size()));
          n->erase(it.key());
        }
        break;
      case 2:
        if (n->is_object()) (*n)[kKeys[rng() % std::size(kKeys)]] = random_value(rng);
        break;
      default:
        if (n->is_object() && !n->empty()) {  // a typo in a key
          auto it = n->begin();
          std::advance(it, static_cast<long>(rng() % n->size()));
          std::string k = it.key();
          Json v = *it;
          n->erase(k);
          if (!k.empty()) k[rng() % k.size()] = static_cast<char>('a' + rng() % 26);
          (*n)[k] = v;
        }
        break;
    }
  }
  return doc.dump(static_cast<int>(rng() % 2) - 1);
}

std::string mutate_bytes(std::string s, std::mt19937_64& rng) {
  const int ops = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < ops && !s.empty(); ++i) {
    const std::size_t at = rng() % s.size();
    switch (rng() % 5) {
      case 0: {
        static constexpr std::string_view kChars = "{}[]\",:0123456789.eE-+ \nafnut\\";
        s[at] = kChars[rng() % kChars.size()];
        break;
      }
      case 1: s.erase(at, rng() % 16); break;
      case 2: s.insert(at, s.substr(rng() % s.size(), rng() % 32)); break;
      case 3: s.insert(at, kTokens[rng() % std::size(kTokens)]); break;
      default: s[at] = static_cast<char>(rng() % 256); break;
    }
  }
  return s;
}

ResolveContext random_context(std::mt19937_64& rng) {
  ResolveContext ctx;
  ctx.world_size = static_cast<int>(rng() % 10);  // 0 is invalid on purpose
  if (rng() % 2) ctx.hidden_size = static_cast<std::int64_t>(rng() % 8192) + 1;
  if (rng() % 2) ctx.precision = static_cast<DType>(rng() % 3);
  if (rng() % 2) ctx.micro_batch_size = static_cast<std::int64_t>(rng() % 16) + 1;
  if (rng() % 3 == 0) ctx.gradient_accumulation_steps = static_cast<std::int64_t>(rng() % 8) + 1;
  if (rng() % 2) ctx.total_num_steps = static_cast<std::int64_t>(rng() % 100000) + 1;
  ctx.strict = rng() % 4 == 0;
  return ctx;
}

// Either a usable config whose invariants hold, or only config errors. Returns true if usable.
bool check_one(const std::string& text, const ResolveContext& ctx) {
  ParseResult r;
  try {
    r = parse(text, ctx);
  } catch (const std::exception& e) {
    FAIL("parse threw " << e.what() << " for input:\n" << text);
    return false;
  }
  if (!r.ok()) {
    CHECK_FALSE(r.config.has_value());
    for (const auto& e : r.errors) {
      if (e.kind() != ErrorKind::config || e.message().empty()) FAIL("bad error record for input:\n" << text);
    }
    return false;
  }
  REQUIRE(r.config);
  const Config& c = *r.config;
  const bool triad = c.train_batch_size ==
                     c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * ctx.world_size;
  const bool precision = !(c.fp16.enabled && c.bf16.enabled);
  const bool offload = c.zero_optimization.offload_param.device == OffloadDevice::none || c.zero_optimization.stage == 3;
  if (!triad || !precision || !offload) FAIL("accepted an inconsistent config:\n" << text);
  ResolveContext plain;
  plain.world_size = ctx.world_size;
  const ParseResult back = parse(to_json(c).dump(), plain);
  if (!back.ok() || to_json(*back.config) != to_json(c)) FAIL("resolved config does not round-trip:\n" << text);
  return true;
}

}  // namespace

TEST_CASE("seeded mutation fuzzing: always a Config or config errors") {
  std::vector<std::string> seeds;
  for (const char* f : kFixtures) seeds.push_back(zerotk_test::fixture(f));
  std::mt19937_64 rng(0x5eed2024);
  int usable = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string& seed = seeds[rng() % seeds.size()];
    const std::string text = (i % 2 == 0) ? mutate_tree(seed, rng) : mutate_bytes(seed, rng);
    (check_one(text, random_context(rng)) ? usable : rejected)++;
  }
  // Both outcomes must be exercised, or the mutations are not reaching the reader's logic.
  CHECK(usable > 100);
  CHECK(rejected > 100);
  MESSAGE("fuzz: " << usable << " usable, " << rejected << " rejected");
}

TEST_CASE("fuzzing edge inputs") {
  ResolveContext ctx;
  for (const std::string& text :
       {std::string(), std::string("   "), std::string("null"), std::string("\"auto\""), std::string("{"),
        std::string(1, '\0'), std::string("{\"a\":") + std::string(100000, '['), std::string(200000, '{'),
        std::string("{\"train_batch_size\": 8}") + "garbage", std::string("\xef\xbb\xbf{\"train_batch_size\": 8}")}) {
    check_one(text, ctx);
  }
}

}  // namespace test_fuzz
