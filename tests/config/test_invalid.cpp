// A table of invalid configs: each must fail with an error at the expected JSON path whose rule
// says what is wrong. Every entry is a mistake seen in real DeepSpeed configs or a rule of
// SEMANTICS.md section 12.
#include "common.hpp"

#include <string>

namespace test_invalid {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using namespace zerotk::config;
using zerotk_test::error_lines;

namespace {

struct Invalid {
  const char* name;
  std::string json;
  std::string path;  // where() of the expected error
  const char* rule;  // substring of its rule (message)
  int world = 1;
  bool strict = false;
  const char* value = nullptr;  // value() of the expected error, when given
};

std::string deep_array(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string repeat(const std::string& s, int n) {
  std::string r;
  for (int i = 0; i < n; ++i) r += s;
  return r;
}

const Invalid kCases[] = {
    {"fp16 and bf16 both enabled", R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
     "/bf16/enabled", "cannot both be enabled"},
    {"partial optimizer offload below stage 3 (DeepSpeed asserts)",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})",
     "/zero_optimization/offload_optimizer/ratio", "partial optimizer offload (ratio < 1) needs ZeRO stage 3 (stage is 2)",
     1, false, "0.3"},
    {"hpZ group size that does not divide the world size",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 3}})",
     "/zero_optimization/zero_hpz_partition_size", "must divide the world size (4)", 4, false, "3"},
    {"hpZ group size 0", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})",
     "/zero_optimization/zero_hpz_partition_size", "must be an integer in [1, 2147483647]", 1, false, "0"},
    {"partial offload ratio above 1",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
     "/zero_optimization/offload_optimizer/ratio", "must be a finite number in [0, 1]", 1, false, "1.5"},
    {"fp16 key DeepSpeed does not have", R"({"train_batch_size": 8, "fp16": {"enabled": true, "fused_mode": true}})",
     "/fp16/fused_mode", "unknown key", 1, false, "true"},
    {"batch triad mismatch",
     R"({"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 3})",
     "/train_batch_size", "10 != 3 * 3 * 1 (= 9)"},
    {"batch triad mismatch with world size",
     R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
     "/train_batch_size", "32 != 4 * 2 * 3 (= 24)", 3},
    {"derived accumulation steps of 0 say how they were derived",
     R"({"train_batch_size": 3, "train_micro_batch_size_per_gpu": 2})",
     "/train_batch_size", "gradient_accumulation_steps was not given: derived as 3 / 2 / 2 = 0 with integer division", 2},
    {"neither batch size", R"({"gradient_accumulation_steps": 2})", "/train_batch_size",
     "train_batch_size or train_micro_batch_size_per_gpu must be given"},
    {"misspelled top-level block", R"({"train_batch_size": 8, "zero_optimisation": {"stage": 2}})",
     "/zero_optimisation", "did you mean \"zero_optimization\"?"},
    {"misspelled stage-3 key",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_max_live_params": 1e9}})",
     "/zero_optimization/stage3_max_live_params", "did you mean \"stage3_max_live_parameters\"?"},
    {"key in the wrong block", R"({"train_batch_size": 8, "overlap_comm": true})", "/overlap_comm",
     "did you mean /zero_optimization/overlap_comm?"},
    {"misspelled offload key",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "buffer_sise": 5}}})",
     "/zero_optimization/offload_param/buffer_sise", "did you mean \"buffer_size\"?"},
    {"duplicate top-level key", R"({"train_batch_size": 8, "train_batch_size": 16})", "/train_batch_size",
     "duplicate key (JSON parsers silently keep only one of them); the first has the value 8", 1, false, "16"},
    {"duplicate nested key", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "stage": 3}})",
     "/zero_optimization/stage", "duplicate key", 1, false, "3"},
    {"duplicate key whose value is an object",
     R"({"train_batch_size": 8, "fp16": {"enabled": true}, "fp16": {"enabled": false, "loss_scale": [1, 2]}})", "/fp16",
     "the first has the value {\"enabled\":true}", 1, false, R"({"enabled":false,"loss_scale":[1,2]})"},
    {"stage out of range", R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})", "/zero_optimization/stage",
     "must be an integer in [0, 3]"},
    {"stage in quotes", R"({"train_batch_size": 8, "zero_optimization": {"stage": "2"}})", "/zero_optimization/stage",
     "write it without quotes"},
    {"stage \"auto\"", R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto"}})", "/zero_optimization/stage",
     "expected an integer"},
    {"fractional bucket size", R"({"train_batch_size": 8, "zero_optimization": {"reduce_bucket_size": 2.5e-1}})",
     "/zero_optimization/reduce_bucket_size", "must be an integer"},
    {"fractional batch size", R"({"train_batch_size": 1.5})", "/train_batch_size", "must be an integer"},
    {"negative loss scale", R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": -1}})",
     "/fp16/loss_scale", "must be a finite number >= 0"},
    {"hysteresis 0", R"({"train_batch_size": 8, "fp16": {"enabled": true, "hysteresis": 0}})", "/fp16/hysteresis",
     "must be an integer in [1,"},
    {"max_grad_norm in optimizer params",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
     "/optimizer/params/max_grad_norm", "use the top-level \"gradient_clipping\""},
    {"misspelled optimizer type", R"({"train_batch_size": 8, "optimizer": {"type": "AdamWW"}})", "/optimizer/type",
     "did you mean \"AdamW\"?"},
    {"optimizer zerotk does not have", R"({"train_batch_size": 8, "optimizer": {"type": "Adagrad"}})", "/optimizer/type",
     "not supported by zerotk yet"},
    {"1-bit Adam's freeze_step given to 0/1 Adam",
     R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam", "params": {"freeze_step": 10}}})",
     "/optimizer/params/freeze_step", "unknown key"},
    {"0/1 Adam's var_freeze_step given to 1-bit Adam",
     R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam", "params": {"var_freeze_step": 10}}})",
     "/optimizer/params/var_freeze_step", "unknown key"},
    {"0/1 Adam local_step_clipper 0",
     R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam", "params": {"local_step_clipper": 0}}})",
     "/optimizer/params/local_step_clipper", "must be an integer >= 1"},
    {"0/1 Adam negative var_freeze_step",
     R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam", "params": {"var_freeze_step": -5}}})",
     "/optimizer/params/var_freeze_step", "must be an integer >= 0"},
    {"0/1 Adam fractional var_update_scaler",
     R"({"train_batch_size": 8, "optimizer": {"type": "ZeroOneAdam", "params": {"var_update_scaler": 2.5}}})",
     "/optimizer/params/var_update_scaler", "must be an integer"},
    {"optimizer without type", R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 0.1}}})", "/optimizer/type",
     "required"},
    {"AdamW with adam_w_mode false",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
     "/optimizer/params/adam_w_mode", "AdamW always decouples"},
    {"lr written as a string", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"lr": "1e-4"}}})",
     "/optimizer/params/lr", "write it without quotes"},
    {"betas with one value", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
     "/optimizer/params/betas", "two numbers"},
    {"beta out of range",
     R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.5]}}})",
     "/optimizer/params/betas", "each beta must be in [0, 1)"},
    {"Adam param given to LAMB",
     R"({"train_batch_size": 8, "optimizer": {"type": "Lamb", "params": {"adam_w_mode": true}}})",
     "/optimizer/params/adam_w_mode", "unknown key"},
    {"unknown scheduler type", R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecay"}})",
     "/scheduler/type", "did you mean \"WarmupDecayLR\"?"},
    {"WarmupDecayLR without total_num_steps",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
     "/scheduler/params/total_num_steps", "required by WarmupDecayLR"},
    {"OneCycle without cycle_min_lr",
     R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": 0.1}}})",
     "/scheduler/params/cycle_min_lr", "required by OneCycle"},
    {"OneCycle with a zero first step size",
     R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 0.1,
         "cycle_first_step_size": 0}}})",
     "/scheduler/params/cycle_first_step_size", "must be an integer >= 1"},
    {"LRRangeTest with a zero step size",
     R"({"train_batch_size": 8, "scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_step_size": 0}}})",
     "/scheduler/params/lr_range_test_step_size", "must be an integer >= 1"},
    {"zero warmup steps (DeepSpeed 0.19.3+ refuses them; the scheduler would too)",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
     "/scheduler/params/warmup_num_steps", "must be an integer >= 1"},
    {"unknown warmup type",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
     "/scheduler/params/warmup_type", "must be one of \"log\", \"linear\""},
    {"total_num_steps \"auto\" with nothing to decide it",
     R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto"}}})",
     "/scheduler/params/total_num_steps", "--total-steps"},
    {"unknown offload device",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}})",
     "/zero_optimization/offload_optimizer/device", "must be one of \"none\", \"cpu\", \"nvme\""},
    {"nvme without a path",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
     "/zero_optimization/offload_optimizer/nvme_path", "required when device is \"nvme\""},
    {"nvme optimizer offload at stage 2",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme",
         "nvme_path": "/nvme"}}})",
     "/zero_optimization/offload_optimizer/device", "only with ZeRO stage 3"},
    {"optimizer offload at stage 0",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}})",
     "/zero_optimization/offload_optimizer", "needs ZeRO stage 1, 2 or 3"},
    {"reduce_bucket_size \"auto\" without the hidden size",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}})",
     "/zero_optimization/reduce_bucket_size", "--hidden"},
    {"fp16.enabled \"auto\" without the engine's precision", R"({"train_batch_size": 8, "fp16": {"enabled": "auto"}})",
     "/fp16/enabled", "--precision"},
    {"micro batch \"auto\" with nothing to decide it",
     R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})", "/train_micro_batch_size_per_gpu",
     "--micro-batch"},
    {"gradient_clipping negative", R"({"train_batch_size": 8, "gradient_clipping": -1.0})", "/gradient_clipping",
     "must be a finite number >= 0"},
    {"steps_per_print 0", R"({"train_batch_size": 8, "steps_per_print": 0})", "/steps_per_print",
     "must be an integer >= 1"},
    {"communication_data_type fp8", R"({"train_batch_size": 8, "communication_data_type": "fp8"})",
     "/communication_data_type", "must be one of \"fp32\", \"fp16\", \"bf16\""},
    {"csv_monitor enabled as a string", R"({"train_batch_size": 8, "csv_monitor": {"enabled": "yes"}})",
     "/csv_monitor/enabled", "expected true or false"},
    {"csv_monitor with an empty job name", R"({"train_batch_size": 8, "csv_monitor": {"job_name": ""}})",
     "/csv_monitor/job_name", "must not be empty"},
    {"contiguous checkpointing without partitioning",
     R"({"train_batch_size": 8, "activation_checkpointing": {"contiguous_memory_optimization": true,
         "number_checkpoints": 4}})",
     "/activation_checkpointing/contiguous_memory_optimization", "needs \"partition_activations\": true"},
    {"contiguous checkpointing without a layer count",
     R"({"train_batch_size": 8, "activation_checkpointing": {"partition_activations": true,
         "contiguous_memory_optimization": true}})",
     "/activation_checkpointing/number_checkpoints", "required by contiguous_memory_optimization"},
    {"bf16 and bfloat16 both given", R"({"train_batch_size": 8, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}})",
     "/bfloat16", "given twice", 1, false, R"({"enabled":true})"},
    {"a key and its alias both given",
     R"({"train_batch_size": 8, "zero_optimization": {"stage3_prefetch_bucket_size": 10, "prefetch_bucket_size": 20}})",
     "/zero_optimization/prefetch_bucket_size", "given twice", 1, false, "20"},
    {"block that is not an object", R"({"train_batch_size": 8, "fp16": true})", "/fp16", "expected an object"},
    {"not supported yet, strict mode", R"({"train_batch_size": 8, "tensorboard": {"enabled": true}})", "/tensorboard",
     "strict mode", 1, true},
    {"root is not an object", R"([{"train_batch_size": 8}])", "", "must be a JSON object"},
    // Syntax errors: the path being read, line, column and byte offset, and the offending text.
    {"trailing comma", "{\"train_batch_size\": 8,\n}", "",
     "invalid JSON at line 2, column 1 (byte offset 24): syntax error while parsing object key - unexpected '}'; "
     "expected string literal",
     1, false, "}"},
    {"number overflow", R"({"train_batch_size": 1e400})", "/train_batch_size",
     "invalid JSON at line 1, column 26 (byte offset 25): number overflow parsing '1e400'", 1, false, "1e400"},
    {"invalid literal", R"({"train_batch_size": 8, "zero_optimization": {"overlap_comm": tru}})",
     "/zero_optimization/overlap_comm", "invalid JSON at line 1, column 66 (byte offset 65): syntax error while parsing "
     "value - invalid literal", 1, false, "tru}"},
    {"missing comma", R"({"train_batch_size": 8 "fp16": {}})", "", "unexpected string literal; expected '}'", 1, false,
     "\"fp16\""},
    {"bad array element", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, x]}}})",
     "/optimizer/params/betas/1", "invalid literal", 1, false, "x"},
    {"unterminated string", "{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Ad", "/optimizer/type",
     "missing closing quote", 1, false, "\"Ad"},
    {"NUL byte after the document", std::string("{\"train_batch_size\": 8}\0garbage", 31), "",
     "invalid JSON at line 1, column 24 (byte offset 23): NUL byte after the document (7 more bytes follow it)", 1,
     false, "\\u0000garbage"},
    {"NUL byte between members", std::string("{\"train_batch_size\": 8,\0 \"fp16\": {}}", 36), "",
     "invalid JSON at line 1, column 24 (byte offset 23): NUL byte", 1, false, "\\u0000"},
    {"NUL byte inside a string", std::string("{\"train_batch_size\": 8, \"optimizer\": {\"type\": \"Ad\0am\"}}", 53),
     "/optimizer/type", "(byte offset 49): NUL byte", 1, false, "\"Ad\\u0000"},
    // The root object and "x" are 2 levels; the 65th container is the 63rd array inside "x".
    {"absurd nesting", R"({"train_batch_size": 8, "x": )" + deep_array(100) + "}", "/x" + repeat("/0", 63),
     "nested deeper than 64 levels", 1, false, "["},
    {"gradient_compression algorithm that is not one of the three",
     R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "3bit"}})", "/gradient_compression/algorithm",
     "must be one of \"topk\", \"2bit\", \"1bit\"", 1, false, "\"3bit\""},
    {"gradient_compression algorithm that is not a string",
     R"({"train_batch_size": 8, "gradient_compression": {"algorithm": 2}})", "/gradient_compression/algorithm",
     "expected one of \"topk\", \"2bit\", \"1bit\"", 1, false, "2"},
    {"topk_ratio 0 keeps nothing", R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "topk", "topk_ratio": 0}})",
     "/gradient_compression/topk_ratio", "must be a finite number in (0, 1]", 1, false, "0"},
    {"topk_ratio above 1", R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "topk", "topk_ratio": 1.5}})",
     "/gradient_compression/topk_ratio", "must be a finite number in (0, 1]", 1, false, "1.5"},
    {"negative topk_ratio", R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "topk", "topk_ratio": -0.01}})",
     "/gradient_compression/topk_ratio", "must be a finite number in (0, 1]", 1, false, "-0.01"},
    {"huffman_coding as a string", R"({"train_batch_size": 8, "gradient_compression": {"huffman_coding": "yes"}})",
     "/gradient_compression/huffman_coding", "expected true or false", 1, false, "\"yes\""},
    {"gradient_compression key with a typo",
     R"({"train_batch_size": 8, "gradient_compression": {"algorithm": "topk", "top_k_ratio": 0.1}})",
     "/gradient_compression/top_k_ratio", "did you mean \"topk_ratio\"", 1, false, "0.1"},
    {"world size 0", R"({"train_batch_size": 8})", "ResolveContext::world_size", "must be an integer in [1, ", 0, false,
     "0"},
    // The communication block (zerotk's keys, config/communication.hpp).
    {"topology 0", R"({"train_batch_size": 8, "communication": {"topology": 0}})", "/communication/topology",
     "must be an integer in [1, 3]", 1, false, "0"},
    {"topology as a string", R"({"train_batch_size": 8, "communication": {"topology": "2"}})", "/communication/topology",
     "expected an integer; write it without quotes", 1, false, "\"2\""},
    {"a node map that does not cover the ranks",
     R"({"train_batch_size": 8, "communication": {"topology": {"node_of_rank": [0, 0, 1]}}})",
     "/communication/topology/node_of_rank", "must give one entry for each of the 4 ranks", 4, false, "3 entries"},
    {"a node map with uneven nodes",
     R"({"train_batch_size": 8, "communication": {"topology": {"node_of_rank": [0, 0, 0, 1]}}})",
     "/communication/topology", "the same number of ranks in every node", 4, false, "node 0: 3, node 1: 1"},
    {"a negative node id", R"({"train_batch_size": 8, "communication": {"topology": {"node_of_rank": [0, -1]}}})",
     "/communication/topology/node_of_rank/1", "expected an id: an integer >= 0", 2, false, "-1"},
    {"ranks_per_node that does not divide the world",
     R"({"train_batch_size": 8, "communication": {"topology": {"levels": 2, "ranks_per_node": 3}}})",
     "/communication/topology/ranks_per_node", "must divide the world size (4)", 4, false, "3"},
    {"a socket count with two levels",
     R"({"train_batch_size": 8, "communication": {"topology": {"levels": 2, "ranks_per_socket": 2}}})",
     "/communication/topology/levels", "a socket level needs levels 3", 4, false, "2"},
    {"topology key with a typo", R"({"train_batch_size": 8, "communication": {"topology": {"ranks_per_nodes": 2}}})",
     "/communication/topology/ranks_per_nodes", "did you mean \"ranks_per_node\"", 4, false, "2"},
    {"negative slow_node_tolerance", R"({"train_batch_size": 8, "communication": {"slow_node_tolerance": -0.1}})",
     "/communication/slow_node_tolerance", "must be a finite number >= 0", 1, false, "-0.1"},
    {"slow_node_window 0", R"({"train_batch_size": 8, "communication": {"slow_node_window": 0}})",
     "/communication/slow_node_window", "must be an integer in [1, 1000000]", 1, false, "0"},
    {"slow_node_count 0", R"({"train_batch_size": 8, "communication": {"slow_node_count": 0}})",
     "/communication/slow_node_count", "must be an integer in [1, 1000000]", 1, false, "0"},
    {"an unknown slow_node_action", R"({"train_batch_size": 8, "communication": {"slow_node_action": "rebalanced"}})",
     "/communication/slow_node_action", "did you mean \"rebalance\"", 1, false, "\"rebalanced\""},
    {"communication key with a typo", R"({"train_batch_size": 8, "communication": {"slow_rank_tolerance": 0.1}})",
     "/communication/slow_rank_tolerance", "did you mean \"slow_node_tolerance\"", 1, false, "0.1"},
};

}  // namespace

TEST_CASE("every invalid config fails at its JSON path with its rule") {
  CHECK(std::size(kCases) >= 30);
  for (const Invalid& k : kCases) {
    const std::string name = k.name;
    CAPTURE(name);
    ResolveContext ctx;
    ctx.world_size = k.world;
    ctx.strict = k.strict;
    const ParseResult r = parse(k.json, ctx);
    CHECK_FALSE(r.config.has_value());
    bool found = false;
    for (const auto& e : r.errors) {
      if (e.where() == k.path && e.message().find(k.rule) != std::string::npos && (!k.value || e.value() == k.value)) {
        found = true;
      }
      CHECK(e.kind() == ErrorKind::config);
    }
    CHECK_MESSAGE(found, "expected " << k.path << ": ..." << k.rule << "... (got " << (k.value ? k.value : "...")
                                     << ")\ngot:\n"
                                     << error_lines(r));
  }
}

TEST_CASE("errors carry the offending value") {
  ResolveContext ctx;
  const auto errors = validate(R"({"train_batch_size": 8, "zero_optimization": {"stage": 7, "overlap_comm": "yes"}})", ctx);
  REQUIRE(errors.size() == 2);
  CHECK(format_line(errors[0]) == "/zero_optimization/stage: must be an integer in [0, 3] (got 7)");
  CHECK(format_line(errors[1]) == "/zero_optimization/overlap_comm: expected true or false (got \"yes\")");
}

TEST_CASE("the error list is bounded for hostile input") {
  std::string json = "{";
  for (int i = 0; i < 500; ++i) json += zerotk::config::detail::cat("\"k", std::to_string(i), "\": 1, ");
  json += "\"train_batch_size\": 8}";
  const ParseResult r = parse(json, ResolveContext{});
  REQUIRE(r.errors.size() == Diagnostics::kMaxErrors + 1);
  CHECK(r.errors.back().message().find("400 more not shown") != std::string::npos);
}

}  // namespace test_invalid
