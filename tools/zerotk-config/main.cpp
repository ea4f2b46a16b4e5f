// zerotk-config: check a DeepSpeed JSON config for a world size before launching a job.
//
//   zerotk-config ds_config.json --world 8 --hidden 4096
//
// Exit 0: the config is usable; the fully resolved options are printed to stdout as DeepSpeed
// JSON (every "auto" and default spelled out), notes and a one-line summary to stderr.
// Exit 1: the config has problems; each is printed to stderr as "<path>: <rule> (got <value>)".
// Exit 2: the command line itself is wrong.

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerotk/config.hpp"

namespace {

namespace cfg = zerotk::config;

constexpr std::string_view kUsage = R"usage(usage: zerotk-config FILE --world N [options]

Validates a DeepSpeed JSON config for a world size, resolves "auto" values and
the batch triad, and prints the resolved options as DeepSpeed JSON. FILE "-" reads stdin.
FILE must be a regular file (a FIFO or a device such as /dev/zero is refused at once) of at most
16 MiB (16777216 bytes; stdin too); a string value may hold at most 4096 bytes.

required:
  --world N            every rank of the job; the batch triad counts world / (tensor x pipeline)
                       (tensor_model_parallel_size or tensor_parallel.autotp_size; pipeline_parallelism.
                       num_stages or pipeline.stages; 1 when absent)
what the engine knows (fills "auto" values; an "auto" nothing can decide is an error):
  --hidden H           model hidden size: reduce_bucket_size = H*H,
                       stage3_prefetch_bucket_size = 0.9*H*H, stage3_param_persistence_threshold = 10*H
  --precision P        fp32, fp16 or bf16: decides fp16.enabled / bf16.enabled = "auto"
  --micro-batch N      train_micro_batch_size_per_gpu = "auto"
  --grad-accum N       gradient_accumulation_steps = "auto"
  --lr X               optimizer lr = "auto" (default: the optimizer's default)
  --total-steps N      scheduler total_num_steps = "auto"
  --warmup-steps N     scheduler warmup_num_steps = "auto" (default 1000)
  --max-grad-norm X    gradient_clipping = "auto" (default 1.0)
checks:
  --strict             keys zerotk accepts without acting on them are errors, not notes
  --resolve-only       check the config as DeepSpeed would read it, without asking that this
                       zerotk can build it (stage 3, offload, 1-bit optimizers, ...)
output:
  --quiet              no notes or summary on stderr
  --help               this text

exit status: 0 usable (resolved JSON on stdout), 1 config problems or an unreadable FILE (one
per line on stderr, "<path>: <rule> (got <value>)"), 2 bad command line (a flag or its value).
)usage";

// ResolveContext field -> the flag that sets it.
constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
    {"world_size", "--world"},        {"hidden_size", "--hidden"},        {"precision", "--precision"},
    {"micro_batch_size", "--micro-batch"}, {"gradient_accumulation_steps", "--grad-accum"}, {"lr", "--lr"},
    {"total_num_steps", "--total-steps"}, {"warmup_num_steps", "--warmup-steps"},
    {"max_grad_norm", "--max-grad-norm"}};

struct Args {
  std::string file;
  cfg::ResolveContext ctx;
  bool have_world = false;
  bool resolve_only = false;
  bool quiet = false;
  bool help = false;
};

struct UsageError {
  std::string message;
};

template <class T>
T number(std::string_view flag, std::string_view text) {
  T v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size()) {
    throw UsageError{std::string(flag) + " expects a number, got \"" + std::string(text) + "\""};
  }
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  std::vector<std::string_view> rest(argv + 1, argv + argc);
  for (std::size_t i = 0; i < rest.size(); ++i) {
    std::string_view arg = rest[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= rest.size()) throw UsageError{std::string(arg) + " expects a value"};
      return rest[++i];
    };
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg == "--world") {
      a.ctx.world_size = number<int>(arg, value());
      a.have_world = true;
    } else if (arg == "--hidden") {
      a.ctx.hidden_size = number<std::int64_t>(arg, value());
    } else if (arg == "--precision") {
      std::string_view p = value();
      if (p == "fp32") a.ctx.precision = zerotk::DType::fp32;
      else if (p == "fp16") a.ctx.precision = zerotk::DType::fp16;
      else if (p == "bf16") a.ctx.precision = zerotk::DType::bf16;
      else throw UsageError{"--precision expects fp32, fp16 or bf16, got \"" + std::string(p) + "\""};
    } else if (arg == "--micro-batch") {
      a.ctx.micro_batch_size = number<std::int64_t>(arg, value());
    } else if (arg == "--grad-accum") {
      a.ctx.gradient_accumulation_steps = number<std::int64_t>(arg, value());
    } else if (arg == "--lr") {
      a.ctx.lr = number<double>(arg, value());
    } else if (arg == "--total-steps") {
      a.ctx.total_num_steps = number<std::int64_t>(arg, value());
    } else if (arg == "--warmup-steps") {
      a.ctx.warmup_num_steps = number<std::int64_t>(arg, value());
    } else if (arg == "--max-grad-norm") {
      a.ctx.max_grad_norm = number<double>(arg, value());
    } else if (arg == "--strict") {
      a.ctx.strict = true;
    } else if (arg == "--resolve-only") {
      a.resolve_only = true;
    } else if (arg == "--quiet" || arg == "-q") {
      a.quiet = true;
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError{"unknown option " + std::string(arg)};
    } else if (a.file.empty()) {
      a.file = std::string(arg);
    } else {
      throw UsageError{"more than one FILE given: " + a.file + " and " + std::string(arg)};
    }
  }
  if (a.help) return a;
  if (a.file.empty()) throw UsageError{"no config FILE given"};
  if (!a.have_world) throw UsageError{"--world N is required (the batch triad depends on it)"};
  // The hints are checked by the rules of the config values they fill; name the flag that set each.
  std::string bad_hints;
  for (const auto& e : cfg::validate_context(a.ctx)) {
    std::string_view flag = e.where();
    for (const auto& [field, name] : kFlags) {
      if (e.where() == "ResolveContext::" + std::string(field)) flag = name;
    }
    bad_hints += (bad_hints.empty() ? "" : "; ") + std::string(flag) + " " + e.message() + ", got " + e.value();
  }
  if (!bad_hints.empty()) throw UsageError{bad_hints};
  return a;
}

int run(int argc, char** argv) {
  Args args;
  try {
    args = parse_args(argc, argv);
  } catch (const UsageError& e) {
    std::cerr << "zerotk-config: " << e.message << "\n\n" << kUsage;
    return 2;
  }
  if (args.help) {
    std::cout << kUsage;
    return 0;
  }

  std::string text;
  try {
    text = args.file == "-" ? cfg::read_text(stdin, "-") : cfg::read_text_file(args.file);
  } catch (const zerotk::io_error& e) {
    std::cerr << zerotk::config::detail::printable(args.file) << ": " << e.message() << "\n";
    return 1;
  }

  cfg::ParseResult r = cfg::parse(text, args.ctx);
  // A config this zerotk cannot build is not usable, however valid it is for DeepSpeed.
  if (r.ok() && !args.resolve_only) {
    r.errors = cfg::check_buildable(*r.config);
    if (!r.errors.empty()) r.config.reset();
  }
  if (!args.quiet) {
    for (const auto& n : r.notices) std::cerr << "note: " << n.path << ": " << n.message << "\n";
  }
  if (!r.ok()) {
    for (const auto& e : r.errors) std::cerr << cfg::format_line(e) << "\n";
    // The "stopped after" line is a summary, not a problem of its own.
    const std::size_t found = r.errors.size() - (r.errors_not_shown > 0 ? 1 : 0) + r.errors_not_shown;
    std::cerr << "zerotk-config: " << found << (found == 1 ? " problem" : " problems") << " in "
              << zerotk::config::detail::printable(args.file);
    if (r.errors_not_shown > 0) std::cerr << " (" << found - r.errors_not_shown << " shown)";
    std::cerr << "\n";
    return 1;
  }
  const cfg::Config& c = *r.config;
  std::cout << cfg::to_json(c).dump(2) << "\n";
  if (!args.quiet) {
    std::cerr << "zerotk-config: " << zerotk::config::detail::printable(args.file) << " is usable on "
              << c.world_size << " rank" << (c.world_size == 1 ? "" : "s") << ": " << cfg::describe(c.structure())
              << "; train_batch_size " << c.train_batch_size << " = micro batch " << c.train_micro_batch_size_per_gpu
              << " x accumulation " << c.gradient_accumulation_steps;
    if (c.tensor_parallel_size > 1 || c.pipeline.stages > 1) {
      std::cerr << " x data " << c.data_parallel_size << " (world " << c.world_size << " / ";
      if (c.pipeline.stages == 1) {
        std::cerr << "tensor " << c.tensor_parallel_size << ")\n";
      } else if (c.tensor_parallel_size == 1) {
        std::cerr << "pipeline " << c.pipeline.stages << ", schedule " << c.pipeline.schedule << ")\n";
      } else {
        std::cerr << "(tensor " << c.tensor_parallel_size << " x pipeline " << c.pipeline.stages << "), schedule "
                  << c.pipeline.schedule << ")\n";
      }
    } else {
      std::cerr << " x world " << c.world_size << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    // Only a bug gets here: the reader reports every config problem as data.
    std::cerr << "zerotk-config: internal error: " << e.what() << "\n";
    return 3;
  }
}
