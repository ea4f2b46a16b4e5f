// zerotk-ckpt: look at, check and export zerotk checkpoints without a training job.
//
//   zerotk-ckpt inspect ckpt                      tags, then the latest one's manifest and parameters
//   zerotk-ckpt verify ckpt --tag global_step100  every file: size, checksum, structure
//   zerotk-ckpt export ckpt --out model.safetensors --dtype bf16
//   zerotk-ckpt export ckpt --out model.safetensors --tp 4          model-tp0-of-4.safetensors ...
//
// Exit 0: done. Exit 1: the checkpoint is missing, corrupt or cannot be exported (the error names
// the file or manifest key). Exit 2: the command line itself is wrong.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <unistd.h>

#include "zerotk/checkpoint.hpp"
#include "zerotk/checkpoint/export.hpp"

namespace {

namespace fs = std::filesystem;
namespace ckpt = zerotk::checkpoint;

constexpr std::string_view kUsage = R"usage(usage: zerotk-ckpt COMMAND DIR [options]

Reads a checkpoint directory written by zerotk::checkpoint::save (DIR holds `latest` and one
directory per tag). No training job, no communicator.

commands:
  inspect DIR [--tag T]     list the tags in DIR, then the manifest of T (default: latest):
                            world size, stage, precision, optimizer, counters, loss scaler,
                            scheduler, files, and every parameter (name, shape, groups)
  verify DIR [--tag T]      check T completely: manifest, every rank's file and the client state
                            (sizes, XXH3-64 checksums, structure, fragment tables)
  export DIR [--tag T] --out FILE [--dtype fp32|bf16|fp16]
                            write the fp32 master weights of T as one safetensors file (whole
                            tensors, streamed; 16-bit dtypes round to nearest even); FILE appears
                            complete or not at all
         [--tp K [--split PATTERN=rows[:PARTS]|cols[:PARTS]]...]
                            one file per tensor rank instead (FILE's stem + -tp<k>-of-<K>): each
                            split parameter cut for rank k as a tensor-parallel server loads it
                            (Megatron's layout; a fused part's rows, e.g. QKV, cut part by part),
                            the others whole. The splits are the checkpoint's own when it was saved
                            at tensor >= 2; one saved at tensor 1 needs --split rules (PATTERN
                            matches parameter names, * any run of characters; first match wins),
                            e.g. for the GPT example: --split 'blocks.*.attn.qkv.*=rows:3'
                            --split 'blocks.*.mlp.fc.*=rows' --split 'blocks.*.attn.proj.weight=cols'
                            --split 'blocks.*.mlp.proj.weight=cols'
options:
  --tag T                   the checkpoint tag (default: the one DIR/latest names); a tag is one
                            directory name in DIR: not empty, at most 200 bytes of printable ASCII,
                            no '/' or spaces, not starting with '.' (so not . or ..), not "latest"
  --help                    this text

Only regular files are read (a link to one is followed): DIR/latest or a checkpoint file that is a
FIFO, a device or a socket is refused without blocking, and DIR/latest may hold at most 4096 bytes.
Names, tags and errors are printed with control characters escaped (\u001b, \n, \xNN).

exit status: 0 done, 1 the checkpoint is missing, corrupt or for something else (the error names the
file or manifest key), 2 bad command line.
)usage";

/// Text from a checkpoint or the file system, safe to print (control characters escaped).
std::string shown(std::string_view text) { return zerotk::printable(text); }

[[noreturn]] void bad_usage(const std::string& why) {
  std::fprintf(stderr, "zerotk-ckpt: %s\n(run zerotk-ckpt --help)\n", shown(why).c_str());
  std::exit(2);
}

struct Args {
  std::string command;
  fs::path dir, out;
  std::optional<std::string> tag;
  zerotk::DType dtype = zerotk::DType::fp32;
  int tp = 0;  ///< --tp K: one file per tensor rank (0: one whole file)
  std::vector<ckpt::SplitRule> splits;
};

/// --split PATTERN=rows[:PARTS]|cols[:PARTS].
ckpt::SplitRule parse_split(const std::string& v) {
  const std::size_t eq = v.rfind('=');
  if (eq == std::string::npos || eq == 0) bad_usage("--split must be PATTERN=rows[:PARTS] or PATTERN=cols[:PARTS] (got \"" + v + "\")");
  const std::string how = v.substr(eq + 1), dim = how.substr(0, how.find(':'));
  int parts = 1;
  if (const std::size_t colon = how.find(':'); colon != std::string::npos) {
    const std::string n = how.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || end != n.c_str() + n.size() || p < 1 || p > 1 << 20) bad_usage("--split: PARTS must be an integer >= 1 (got \"" + v + "\")");
    parts = static_cast<int>(p);
  }
  if (dim != "rows" && dim != "cols") bad_usage("--split: the dimension must be rows or cols (got \"" + v + "\")");
  return {v.substr(0, eq), dim == "rows" ? zerotk::parallel::TensorSplit::rows(parts) : zerotk::parallel::TensorSplit::cols(parts)};
}

Args parse(int argc, char** argv) {
  std::vector<std::string_view> a(argv + 1, argv + argc);
  for (std::string_view s : a) {
    if (s == "--help" || s == "-h") {
      std::fwrite(kUsage.data(), 1, kUsage.size(), stdout);
      std::exit(0);
    }
  }
  if (a.size() < 2) bad_usage("expected a command and a directory");
  Args r;
  r.command = a[0];
  if (r.command != "inspect" && r.command != "verify" && r.command != "export") bad_usage("unknown command \"" + r.command + "\"");
  r.dir = a[1];
  for (std::size_t i = 2; i < a.size(); ++i) {
    const std::string_view flag = a[i];
    if (i + 1 >= a.size()) bad_usage(std::string(flag) + " needs a value");
    const std::string value(a[++i]);
    if (flag == "--tag") {
      try {
        ckpt::check_tag(value, "--tag");
      } catch (const zerotk::usage_error& e) {
        bad_usage("--tag: " + e.message() + " (got " + e.value() + ")");
      }
      r.tag = value;
    } else if (flag == "--out" && r.command == "export") {
      r.out = value;
    } else if (flag == "--tp" && r.command == "export") {
      char* end = nullptr;
      const long k = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || end != value.c_str() + value.size() || k < 1 || k > 1024) {  // one open file per rank
        bad_usage("--tp must be an integer in [1, 1024] (got \"" + value + "\")");
      }
      r.tp = static_cast<int>(k);
    } else if (flag == "--split" && r.command == "export") {
      r.splits.push_back(parse_split(value));
    } else if (flag == "--dtype" && r.command == "export") {
      if (value == "fp32") {
        r.dtype = zerotk::DType::fp32;
      } else if (value == "bf16") {
        r.dtype = zerotk::DType::bf16;
      } else if (value == "fp16") {
        r.dtype = zerotk::DType::fp16;
      } else {
        bad_usage("--dtype must be fp32, bf16 or fp16 (got \"" + value + "\")");
      }
    } else {
      bad_usage("unknown option " + std::string(flag) + " for " + r.command);
    }
  }
  if (r.command == "export" && r.out.empty()) bad_usage("export needs --out FILE");
  if (!r.splits.empty() && r.tp == 0) bad_usage("--split cuts parameters for --tp K files; add --tp");
  return r;
}

/// MiB of a /proc/self/status field ("VmRSS", "VmHWM": the peak resident memory of this process).
double status_mib(const char* key) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return 0;
  char line[256];
  double kb = 0;
  const std::size_t n = std::strlen(key);
  while (std::fgets(line, sizeof line, f)) {
    if (std::strncmp(line, key, n) == 0 && line[n] == ':') kb = std::strtod(line + n + 1, nullptr);
  }
  std::fclose(f);
  return kb / 1024;
}

double g_start_rss_mib = 0;

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string s = "[";
  for (std::size_t d = 0; d < shape.size(); ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

void inspect(const Args& a) {
  std::optional<std::string> latest;
  if (fs::exists(a.dir / ckpt::kLatestFile)) latest = ckpt::read_latest(a.dir);
  std::vector<std::string> tags;
  std::error_code ec;
  for (fs::directory_iterator it(a.dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_directory() && fs::exists(it->path() / ckpt::kManifestFile)) tags.push_back(it->path().filename().string());
  }
  if (ec) throw zerotk::io_error("cannot list directory", a.dir.string(), ec.message());
  std::sort(tags.begin(), tags.end());
  std::printf("%s: %zu tag(s)\n", shown(a.dir.string()).c_str(), tags.size());
  for (const std::string& t : tags) std::printf("  %s%s\n", shown(t).c_str(), latest && *latest == t ? "   <- latest" : "");
  const std::string tag = a.tag ? *a.tag : latest ? *latest : ckpt::read_latest(a.dir);
  const ckpt::Manifest m = ckpt::read_manifest(a.dir, tag);
  std::printf("\n%s (manifest checked; data files not read: use verify)\n", shown((a.dir / tag).string()).c_str());
  std::printf("  world size %d, ZeRO stage %d, precision %s, optimizer %s (%zu state(s) per element)\n", m.world_size, m.stage,
              shown(m.precision).c_str(), shown(m.optimizer).c_str(), m.optimizer_states.size());
  if (m.rank_local) std::printf("  rank files also hold each rank's compression error feedback (restored on this world size only)\n");
  std::printf("  global steps %lld, skipped %lld, micro-steps %lld\n", static_cast<long long>(m.global_steps),
              static_cast<long long>(m.skipped_steps), static_cast<long long>(m.micro_steps));
  std::printf("  loss scale %.17g (iteration %lld, last overflow %lld, hysteresis left %d)\n", m.scaler.scale,
              static_cast<long long>(m.scaler.iter), static_cast<long long>(m.scaler.last_overflow_iter), m.scaler.hyst);
  if (m.scheduler) {
    std::printf("  LR scheduler: last batch iteration %lld\n", static_cast<long long>(m.scheduler->last_batch_iteration));
  } else {
    std::printf("  LR scheduler: none\n");
  }
  std::uint64_t bytes = m.client_state.bytes;
  for (const auto& f : m.rank_files) bytes += f.bytes;
  std::printf("  %zu rank file(s) + client state: %llu bytes\n", m.rank_files.size(), static_cast<unsigned long long>(bytes));
  for (std::size_t g = 0; g < m.shards.owned_numel.size(); ++g) {
    std::printf("  flat group %zu: optimizer step %lld, elements per rank:", g, static_cast<long long>(m.optimizer_steps[g]));
    for (std::uint64_t n : m.shards.owned_numel[g]) std::printf(" %llu", static_cast<unsigned long long>(n));
    std::printf("\n");
  }
  if (!m.model.empty()) {  // the model's declared structure (checkpoint::SaveOptions::model_structure)
    std::printf("  model:");
    for (const auto& [key, value] : m.model) std::printf(" %s %s;", key.c_str(), value.c_str());
    std::printf("\n");
  }
  std::printf("  %zu parameters, %llu elements:\n", m.shards.params.size(), static_cast<unsigned long long>(m.parameter_count));
  for (const zerotk::engine::ShardParam& p : m.shards.params) {
    std::string split;  // a tensor rank's shard of a split parameter: which, of what
    if (p.is_shard()) {
      split = ", tensor shard " + std::to_string(p.tensor_index) + " of " + std::to_string(p.tensor_size) + " of " +
              shape_text(p.full_shape()) + " split by " + (p.tensor_split.dim == zerotk::parallel::SplitDim::rows ? "rows" : "cols") +
              (p.tensor_split.parts > 1 ? " in " + std::to_string(p.tensor_split.parts) + " fused parts" : "");
    }
    std::printf("    %-40s %-16s %s, group %u, optimizer group %u%s\n", shown(p.name).c_str(), shape_text(p.shape).c_str(),
                p.dtype.c_str(), p.group, p.optimizer_group, split.c_str());
  }
}

void verify(const Args& a) {
  const std::string tag = a.tag ? *a.tag : ckpt::read_latest(a.dir);
  const ckpt::Manifest m = ckpt::verify(a.dir, tag);
  std::uint64_t bytes = m.client_state.bytes;
  for (const auto& f : m.rank_files) bytes += f.bytes;
  std::printf("OK %s: manifest, %zu rank file(s) and the client state verified (%llu bytes)\n", shown((a.dir / tag).string()).c_str(),
              m.rank_files.size(), static_cast<unsigned long long>(bytes));
}

void export_file(const Args& a) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last = t0;
  const bool progress = ::isatty(2) != 0;  // a progress line on a terminal only, never in logs
  ckpt::ExportOptions o;
  o.tag = a.tag;
  o.dtype = a.dtype;
  if (progress) {
    o.on_tensor = [&](std::size_t done, std::size_t total) {
      const auto now = Clock::now();
      if (now - last > std::chrono::milliseconds(500) || done == total) {
        std::fprintf(stderr, "\rexported %zu/%zu tensors", done, total);
        last = now;
      }
    };
  }
  o.splits = a.splits;
  const ckpt::ExportResult r = a.tp > 0 ? ckpt::export_tensor_parallel(a.dir, a.out, a.tp, o) : ckpt::export_safetensors(a.dir, a.out, o);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (progress) std::fprintf(stderr, "\n");
  std::string files = shown(r.files.front().string());
  if (r.files.size() > 1) files += " .. " + shown(r.files.back().filename().string()) + " (" + std::to_string(r.files.size()) + " files, one per tensor rank)";
  std::printf("wrote %s: %zu tensors of %s (tag %s), %llu bytes in %.2f s; peak resident memory %.1f MiB (%.1f at start)\n",
              files.c_str(), r.tensors, std::string(zerotk::to_string(a.dtype)).c_str(), shown(r.tag).c_str(),
              static_cast<unsigned long long>(r.bytes), s, status_mib("VmHWM"), g_start_rss_mib);
}

}  // namespace

int main(int argc, char** argv) {
  g_start_rss_mib = status_mib("VmRSS");
  const Args a = parse(argc, argv);
  try {
    if (a.command == "inspect") {
      inspect(a);
    } else if (a.command == "verify") {
      verify(a);
    } else {
      export_file(a);
    }
    return 0;
  } catch (const std::exception& e) {
    // Errors quote values read from the checkpoint (a tag, a manifest line): escaped like them.
    std::fprintf(stderr, "zerotk-ckpt %s: %s\n", a.command.c_str(), shown(e.what()).c_str());
    return 1;
  }
}
