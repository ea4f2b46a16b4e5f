// A small mutation driver for LLVMFuzzerTestOneInput, in plain C++ so that any compiler builds it
// and CI runs it without clang's libFuzzer. It takes libFuzzer's command line:
//
//   zerotk_fuzz_config [-max_total_time=S] [-runs=N] [-seed=N] [-max_len=N] [-dict=FILE] FILE_OR_DIR...
//
// It runs every seed once, then mutates seeds (bytes, dictionary tokens, splices of two inputs)
// until the time or run budget is spent. An input whose zerotk_fuzz_feature value was not seen
// before joins the corpus, so mutations build on inputs that reached new rules. On a crash
// (abort, segfault, sanitizer report) the input is written to crash-<seed>-<run> in the current
// directory; pass that file alone to reproduce. Without -runs, -max_total_time defaults to 10 s.
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);
extern "C" std::uint64_t zerotk_fuzz_feature;

namespace {

// The input being run, for the crash handler (which may only use async-signal-safe calls).
const std::string* g_current = nullptr;
char g_crash_path[128] = "crash-input";

extern "C" void on_crash(int sig) {
  if (g_current != nullptr) {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      const char* p = g_current->data();
      std::size_t left = g_current->size();
      while (left > 0) {
        const ssize_t n = ::write(fd, p, left);
        if (n <= 0) break;
        p += n;
        left -= static_cast<std::size_t>(n);
      }
      ::close(fd);
    }
    static const char msg[] = "zerotk fuzz driver: crashing input written to ";
    (void)!::write(2, msg, sizeof msg - 1);
    (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
    (void)!::write(2, "\n", 1);
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

struct Options {
  double max_total_time = -1;  // seconds; < 0: not given
  long long runs = -1;         // mutated runs after the seeds; < 0: unbounded
  std::uint64_t seed = 1;
  std::size_t max_len = 1 << 16;
  std::vector<std::string> dicts, inputs;
};

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&](std::string_view flag) -> const char* {
      return a.starts_with(flag) ? argv[i] + flag.size() : nullptr;
    };
    if (const char* v = value("-max_total_time=")) {
      o.max_total_time = std::atof(v);
    } else if (const char* v = value("-runs=")) {
      o.runs = std::atoll(v);
    } else if (const char* v = value("-seed=")) {
      o.seed = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("-max_len=")) {
      o.max_len = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("-dict=")) {
      o.dicts.emplace_back(v);
    } else if (a.starts_with("-")) {
      std::cerr << "zerotk fuzz driver: ignoring " << a << " (a libFuzzer flag this driver does not have)\n";
    } else {
      o.inputs.emplace_back(a);
    }
  }
  if (o.max_total_time < 0 && o.runs < 0) o.max_total_time = 10;
  return o;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// libFuzzer dictionary lines: name="value" or "value", with \\, \" and \xNN escapes.
std::vector<std::string> read_dict(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto open = line.find('"');
    const auto close = line.rfind('"');
    if (line.empty() || line[0] == '#' || open == std::string::npos || close <= open) continue;
    std::string token;
    for (std::size_t i = open + 1; i < close; ++i) {
      if (line[i] == '\\' && i + 1 < close) {
        const char c = line[++i];
        if (c == 'x' && i + 2 < close) {
          token += static_cast<char>(std::stoi(line.substr(i + 1, 2), nullptr, 16));
          i += 2;
        } else {
          token += c;
        }
      } else {
        token += line[i];
      }
    }
    out.push_back(std::move(token));
  }
  return out;
}

class Mutator {
 public:
  Mutator(std::uint64_t seed, std::vector<std::string> dict, std::size_t max_len)
      : rng_(seed), dict_(std::move(dict)), max_len_(max_len) {
    // Tokens that reach the reader's branches even without a dictionary.
    for (const char* t : {"{", "}", "[", "]", ",", ":", "\"", "null", "true", "false", "\"auto\"", "0", "-1", "1e400",
                          "2.5", "18446744073709551616", "\\u0000", "\\ud800", "\xff"}) {
      dict_.emplace_back(t);
    }
    dict_.emplace_back(std::string(1, '\0'));
  }

  std::string mutate(std::string s, const std::vector<std::string>& corpus) {
    const int ops = 1 + static_cast<int>(below(5));
    for (int i = 0; i < ops; ++i) step(s, corpus);
    if (s.size() > max_len_) s.resize(max_len_);
    return s;
  }

  std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

 private:
  void step(std::string& s, const std::vector<std::string>& corpus) {
    const std::size_t at = below(s.size() + 1);
    switch (below(9)) {
      case 0:  // one byte, anything
        if (!s.empty()) s[std::min(at, s.size() - 1)] = static_cast<char>(below(256));
        break;
      case 1: {  // one byte, JSON-ish
        static constexpr std::string_view kChars = "{}[]\",:0123456789.eE-+ \n\tafnlrstu\\";
        if (!s.empty()) s[std::min(at, s.size() - 1)] = kChars[below(kChars.size())];
        break;
      }
      case 2:  // insert a token
        s.insert(at, dict_[below(dict_.size())]);
        break;
      case 3: {  // replace a short span with a token
        const std::string& t = dict_[below(dict_.size())];
        s.replace(std::min(at, s.size()), below(12), t);
        break;
      }
      case 4:  // erase a span
        s.erase(std::min(at, s.size()), below(32));
        break;
      case 5:  // repeat a span (many keys, deep nesting, long strings)
        if (!s.empty()) {
          const std::size_t from = below(s.size()), len = 1 + below(std::min<std::size_t>(64, s.size() - from));
          const std::string piece = s.substr(from, len);
          for (std::uint64_t k = 1 + below(8); k > 0 && s.size() < max_len_; --k) s.insert(at, piece);
        }
        break;
      case 6: {  // splice with another corpus input
        const std::string& other = corpus[below(corpus.size())];
        s = s.substr(0, at) + other.substr(below(other.size() + 1));
        break;
      }
      case 7: {  // a number of an awkward size
        static const char* kNumbers[] = {"0", "-0", "1", "-1", "2147483648", "4294967297", "9223372036854775807",
                                         "9223372036854775808", "-9223372036854775809", "1e308", "1e-320", "0.1",
                                         "1e9", "2e8", "1.0000000000000002", "NaN", "Infinity"};
        s.insert(at, kNumbers[below(std::size(kNumbers))]);
        break;
      }
      default:  // cut the end
        s.resize(at);
        break;
    }
  }

  std::mt19937_64 rng_;
  std::vector<std::string> dict_;
  std::size_t max_len_;
};

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse_options(argc, argv);
  std::vector<std::string> dict;
  for (const auto& d : opt.dicts) {
    auto t = read_dict(d);
    dict.insert(dict.end(), t.begin(), t.end());
  }
  std::vector<std::string> corpus;
  for (const auto& in : opt.inputs) {
    const std::filesystem::path p(in);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());  // the same seed gives the same run everywhere
      for (const auto& f : files) corpus.push_back(read_file(f));
    } else {
      corpus.push_back(read_file(p));
    }
  }
  if (corpus.empty()) corpus.emplace_back("{}");

  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL}) std::signal(sig, on_crash);
  std::snprintf(g_crash_path, sizeof g_crash_path, "crash-seed-input");

  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::unordered_set<std::uint64_t> features;
  const auto run = [&](const std::string& input) {
    g_current = &input;
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(input.data()), input.size());
    g_current = nullptr;
    return features.insert(zerotk_fuzz_feature).second;
  };
  for (const auto& s : corpus) run(s);
  std::cerr << "zerotk fuzz driver: " << corpus.size() << " seeds run, " << features.size() << " features, seed "
            << opt.seed << "\n";

  Mutator m(opt.seed, std::move(dict), opt.max_len);
  long long runs = 0;
  const std::size_t kMaxCorpus = 20'000;
  while ((opt.runs < 0 || runs < opt.runs) && (opt.max_total_time < 0 || elapsed() < opt.max_total_time)) {
    std::snprintf(g_crash_path, sizeof g_crash_path, "crash-%llu-%lld", static_cast<unsigned long long>(opt.seed),
                  runs);
    std::string input = m.mutate(corpus[m.below(corpus.size())], corpus);
    ++runs;
    if (run(input) && corpus.size() < kMaxCorpus) corpus.push_back(std::move(input));
  }
  const double secs = elapsed();
  std::cerr << "zerotk fuzz driver: done: " << runs << " runs in " << secs << " s ("
            << static_cast<long long>(static_cast<double>(runs) / std::max(secs, 1e-9)) << "/s), corpus "
            << corpus.size() << ", features " << features.size() << "\n";
  return 0;
}
