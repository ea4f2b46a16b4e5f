#pragma once
// examples/02_gpt/data.hpp: training data for the GPT example.
//
// - DigitTask: a built-in synthetic task with a measurable answer. An example is n random digits, a
//   separator, then the same digits sorted (or reversed):  3 1 4 1 5 9 2 6 | 1 1 2 3 4 5 6 9
//   The model reads the first 2n tokens and is scored on predicting the n answer digits.
// - TextCorpus: character-level language modelling on any text file.
//
// Both are deterministic functions of (seed, example index): global batch `step` holds examples
// step * G .. step * G + G - 1 (G = world * micro_batch) and rank r takes the r-th contiguous slice of
// micro_batch of them. So the data seen per step is the same for every world size, and a run with 4
// ranks of 8 sees exactly what one rank with 32 sees.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <zerotk/core/error.hpp>

#include "gpt.hpp"

namespace gpt {

namespace detail {

// Index of the first example of rank `rank` in global batch `step`; validates the sharding.
inline std::uint64_t first_example(std::uint64_t step, int rank, int world, int micro_batch, const char* where) {
  if (world <= 0 || rank < 0 || rank >= world) {
    throw zerotk::usage_error("rank must be in [0, world)", where,
                              "rank " + std::to_string(rank) + " of " + std::to_string(world));
  }
  if (micro_batch <= 0) throw zerotk::usage_error("micro_batch must be > 0", where, std::to_string(micro_batch));
  const auto global = static_cast<std::uint64_t>(world) * static_cast<std::uint64_t>(micro_batch);
  return step * global + static_cast<std::uint64_t>(rank) * static_cast<std::uint64_t>(micro_batch);
}

}  // namespace detail

/// Which answer the digit task asks for.
enum class DigitTaskKind { sort, reverse };

/// Training examples and held-out examples come from two independent streams of the same seed.
enum class Split : std::uint64_t { train = 0x7261696eull, eval = 0x6576616cull };

/// Sort (or reverse) n random decimal digits. Vocabulary: digits 0-9 and the separator 10.
class DigitTask {
 public:
  static constexpr std::int32_t kSeparator = 10;
  static constexpr int kVocab = 11;

  DigitTask(DigitTaskKind kind, int digits, std::uint64_t seed) : kind_(kind), digits_(digits), seed_(seed) {
    if (digits < 1) throw zerotk::config_error("must be >= 1", "task.digits", std::to_string(digits));
  }

  DigitTaskKind kind() const noexcept { return kind_; }
  int digits() const noexcept { return digits_; }
  int vocab_size() const noexcept { return kVocab; }
  /// Tokens the model reads per example (the last answer digit is only ever a target): 2n.
  int seq_len() const noexcept { return 2 * digits_; }

  /// The full example `index` of a split: n digits, separator, n answer digits (2n + 1 tokens).
  void example(Split split, std::uint64_t index, std::span<std::int32_t> out) const {
    const auto n = static_cast<std::size_t>(digits_);
    std::uint64_t state = detail::splitmix64(seed_ ^ static_cast<std::uint64_t>(split)) ^ detail::splitmix64(index);
    for (std::size_t j = 0; j < n; ++j) {
      state = detail::splitmix64(state);
      out[j] = static_cast<std::int32_t>(state % 10);  // modulo bias 2^64 mod 10 / 2^64: negligible
    }
    out[n] = kSeparator;
    std::copy_n(out.begin(), n, out.begin() + static_cast<std::ptrdiff_t>(n) + 1);
    auto answer = out.subspan(n + 1, n);
    if (kind_ == DigitTaskKind::sort) {
      std::sort(answer.begin(), answer.end());
    } else {
      std::reverse(answer.begin(), answer.end());
    }
  }

  /// Rank `rank`'s micro-batch of global batch `step` (see the file comment). Inputs are tokens 0..2n-1,
  /// targets are the next tokens, taken only on the n answer positions (positions n .. 2n-1).
  void fill_batch(std::uint64_t step, int rank, int world, int micro_batch, Batch& out) const {
    const std::uint64_t first = detail::first_example(step, rank, world, micro_batch, "gpt::DigitTask::fill_batch");
    fill_examples(Split::train, first, micro_batch, out);
  }

  /// `count` consecutive examples of `split` starting at `first`, as a batch.
  void fill_examples(Split split, std::uint64_t first, int count, Batch& out) const {
    const int T = seq_len();
    out.resize(count, T);
    std::vector<std::int32_t> full(static_cast<std::size_t>(T) + 1);
    for (int b = 0; b < count; ++b) {
      example(split, first + static_cast<std::uint64_t>(b), full);
      const auto row = static_cast<std::size_t>(b) * static_cast<std::size_t>(T);
      std::copy_n(full.begin(), T, out.tokens.begin() + static_cast<std::ptrdiff_t>(row));
      for (int t = digits_; t < T; ++t) out.targets[row + static_cast<std::size_t>(t)] = full[static_cast<std::size_t>(t) + 1];
    }
  }

 private:
  DigitTaskKind kind_;
  int digits_;
  std::uint64_t seed_;
};

/// Character-level corpus: the vocabulary is the set of bytes in the text (sorted). The first 90% is
/// the training split, the rest the held-out split.
class TextCorpus {
 public:
  /// Throws zerotk::usage_error when either split is shorter than seq_len + 1 characters.
  TextCorpus(std::string text, int seq_len, std::uint64_t seed) : text_(std::move(text)), seq_len_(seq_len), seed_(seed) {
    if (seq_len < 1) throw zerotk::config_error("must be >= 1", "text.seq_len", std::to_string(seq_len));
    std::array<bool, 256> seen{};
    for (unsigned char ch : text_) seen[ch] = true;
    for (int c = 0; c < 256; ++c) {
      if (seen[static_cast<std::size_t>(c)]) {
        id_of_[static_cast<std::size_t>(c)] = static_cast<std::int32_t>(chars_.size());
        chars_.push_back(static_cast<char>(c));
      }
    }
    ids_.reserve(text_.size());
    for (unsigned char ch : text_) ids_.push_back(id_of_[ch]);
    const std::size_t window = static_cast<std::size_t>(seq_len) + 1;
    train_size_ = ids_.size() - ids_.size() / 10;
    if (train_size_ < window || ids_.size() - train_size_ < window) {
      throw zerotk::usage_error("text too short: each of the 90%/10% splits needs seq_len + 1 characters", "text",
                                std::to_string(ids_.size()) + " characters for seq_len " + std::to_string(seq_len));
    }
  }

  /// Reads a file; throws zerotk::io_error when it cannot be read.
  static TextCorpus from_file(const std::string& path, int seq_len, std::uint64_t seed) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw zerotk::io_error("cannot open text file", path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw zerotk::io_error("error while reading text file", path);
    return TextCorpus(std::move(text), seq_len, seed);
  }

  int vocab_size() const noexcept { return static_cast<int>(chars_.size()); }
  int seq_len() const noexcept { return seq_len_; }
  std::size_t size() const noexcept { return ids_.size(); }
  char decode(std::int32_t id) const { return chars_.at(static_cast<std::size_t>(id)); }
  /// Id of a character, or -1 if the text never contains it.
  std::int32_t encode(char ch) const noexcept { return id_of_[static_cast<unsigned char>(ch)]; }

  /// Rank `rank`'s micro-batch of global batch `step`: windows of seq_len + 1 characters at
  /// pseudo-random offsets of the training split; every position is a target.
  void fill_batch(std::uint64_t step, int rank, int world, int micro_batch, Batch& out) const {
    const std::uint64_t first = detail::first_example(step, rank, world, micro_batch, "gpt::TextCorpus::fill_batch");
    out.resize(micro_batch, seq_len_);
    const std::uint64_t starts = train_size_ - static_cast<std::uint64_t>(seq_len_);  // windows that fit
    for (int b = 0; b < micro_batch; ++b) {
      const std::uint64_t key = detail::splitmix64(seed_ ^ static_cast<std::uint64_t>(Split::train));
      const std::uint64_t start = detail::splitmix64(key ^ detail::splitmix64(first + static_cast<std::uint64_t>(b))) % starts;
      put_window(static_cast<std::size_t>(start), b, out);
    }
  }

  /// Number of non-overlapping held-out windows.
  std::size_t eval_windows() const noexcept {
    return (ids_.size() - train_size_ - 1) / static_cast<std::size_t>(seq_len_);
  }

  /// Held-out windows first .. first + count - 1 (consecutive, non-overlapping).
  void fill_eval(std::size_t first, int count, Batch& out) const {
    out.resize(count, seq_len_);
    for (int b = 0; b < count; ++b) {
      put_window(train_size_ + (first + static_cast<std::size_t>(b)) * static_cast<std::size_t>(seq_len_), b, out);
    }
  }

 private:
  void put_window(std::size_t start, int b, Batch& out) const {
    const auto T = static_cast<std::size_t>(seq_len_);
    const std::size_t row = static_cast<std::size_t>(b) * T;
    for (std::size_t t = 0; t < T; ++t) {
      out.tokens[row + t] = ids_[start + t];
      out.targets[row + t] = ids_[start + t + 1];
    }
  }

  std::string text_;
  int seq_len_;
  std::uint64_t seed_;
  std::vector<char> chars_;
  std::array<std::int32_t, 256> id_of_ = make_unknown();
  std::vector<std::int32_t> ids_;
  std::size_t train_size_ = 0;

  static std::array<std::int32_t, 256> make_unknown() {
    std::array<std::int32_t, 256> a{};
    a.fill(-1);
    return a;
  }
};

}  // namespace gpt
