#pragma once
// examples/02_gpt/evaluate.hpp: how the example measures success.
//
// Digit task: greedy decoding. The model sees the n prompt digits and the separator, predicts the first
// answer digit, appends its own prediction, and so on for n digits. A sequence counts as correct only
// if all n digits are right ("sequence accuracy", the number the example reports); digit accuracy is
// the fraction of answer positions right under the same decoding. Scores are counts so that
// data-parallel ranks can each score a slice and sum.
// Text: mean next-character cross-entropy and argmax accuracy on held-out windows; greedy or sampled
// generation from a prompt.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "data.hpp"
#include "gpt.hpp"

namespace gpt {

/// Counts from a digit-task evaluation.
struct DigitScore {
  std::size_t sequences = 0;
  std::size_t sequences_correct = 0;
  std::size_t digits = 0;
  std::size_t digits_correct = 0;

  double sequence_accuracy() const noexcept {
    return sequences == 0 ? 0.0 : static_cast<double>(sequences_correct) / static_cast<double>(sequences);
  }
  double digit_accuracy() const noexcept {
    return digits == 0 ? 0.0 : static_cast<double>(digits_correct) / static_cast<double>(digits);
  }
  DigitScore& operator+=(const DigitScore& o) noexcept {
    sequences += o.sequences;
    sequences_correct += o.sequences_correct;
    digits += o.digits;
    digits_correct += o.digits_correct;
    return *this;
  }
};

/// The logits [batch x seq][vocab] of a batch's tokens: a whole model's (Gpt::logits), or what a
/// pipeline's last stage computed (examples/02_gpt/pipeline_stage.hpp), on every rank that asks.
using LogitsOf = std::function<const Matrix&(const TokenView&)>;

/// Greedy-decodes held-out examples first .. first + count - 1 in chunks of `chunk` sequences.
/// Costs n forward passes per chunk (no KV cache: the model is tiny and this keeps the layers simple).
inline DigitScore evaluate_digits(const LogitsOf& logits_of, const DigitTask& task, std::uint64_t first, int count,
                           int chunk = 256);

template <class Scope = NoScope>
DigitScore evaluate_digits(Gpt& model, const DigitTask& task, std::uint64_t first, int count, Scope&& scope = {},
                           int chunk = 256) {
  return evaluate_digits([&](const TokenView& t) -> const Matrix& { return model.logits(t, scope); }, task, first, count,
                         chunk);
}

inline DigitScore evaluate_digits(const LogitsOf& logits_of, const DigitTask& task, std::uint64_t first, int count,
                                  int chunk) {
  DigitScore score;
  const int n = task.digits(), T = task.seq_len();
  Batch batch;
  std::vector<std::int32_t> answers;  // [chunk][n] expected answer digits
  for (int done = 0; done < count; done += chunk) {
    const int rows = std::min(chunk, count - done);
    task.fill_examples(Split::eval, first + static_cast<std::uint64_t>(done), rows, batch);
    answers.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(n));
    for (int b = 0; b < rows; ++b) {
      for (int k = 0; k < n; ++k) {
        const auto at = static_cast<std::size_t>(b) * static_cast<std::size_t>(T) + static_cast<std::size_t>(n + k);
        answers[static_cast<std::size_t>(b * n + k)] = batch.targets[at];
        // Hide the true answer: the inputs after the separator will be the model's own guesses.
        if (k + 1 < n) batch.tokens[at + 1] = 0;
      }
    }
    for (int k = 0; k < n; ++k) {  // position n + k predicts answer digit k
      const Matrix& logits = logits_of(batch.inputs());
      for (int b = 0; b < rows; ++b) {
        const auto at = static_cast<std::size_t>(b) * static_cast<std::size_t>(T) + static_cast<std::size_t>(n + k);
        Eigen::Index best = 0;
        logits.row(static_cast<Eigen::Index>(at)).maxCoeff(&best);
        batch.targets[at] = static_cast<std::int32_t>(best);  // reuse targets as the decoded answer
        if (k + 1 < n) batch.tokens[at + 1] = static_cast<std::int32_t>(best);
      }
    }
    for (int b = 0; b < rows; ++b) {
      bool all = true;
      for (int k = 0; k < n; ++k) {
        const auto at = static_cast<std::size_t>(b) * static_cast<std::size_t>(T) + static_cast<std::size_t>(n + k);
        const bool right = batch.targets[at] == answers[static_cast<std::size_t>(b * n + k)];
        score.digits_correct += right ? 1 : 0;
        all = all && right;
      }
      score.sequences_correct += all ? 1 : 0;
    }
    score.sequences += static_cast<std::size_t>(rows);
    score.digits += static_cast<std::size_t>(rows) * static_cast<std::size_t>(n);
  }
  return score;
}

/// Held-out loss and next-character accuracy of a text corpus.
struct TextScore {
  double loss = 0.0;      // mean cross-entropy, nats per character
  double accuracy = 0.0;  // argmax == next character
  std::size_t positions = 0;
};

/// Scores at most `max_windows` held-out windows, `chunk` windows per forward.
inline TextScore evaluate_text(const LogitsOf& logits_of, const TextCorpus& corpus, std::size_t max_windows, int chunk = 64);

template <class Scope = NoScope>
TextScore evaluate_text(Gpt& model, const TextCorpus& corpus, std::size_t max_windows, Scope&& scope = {},
                        int chunk = 64) {
  return evaluate_text([&](const TokenView& t) -> const Matrix& { return model.logits(t, scope); }, corpus, max_windows,
                       chunk);
}

inline TextScore evaluate_text(const LogitsOf& logits_of, const TextCorpus& corpus, std::size_t max_windows, int chunk) {
  TextScore score;
  const std::size_t windows = std::min(max_windows, corpus.eval_windows());
  Batch batch;
  CrossEntropy xent;
  double loss_sum = 0.0;
  std::size_t right = 0;
  for (std::size_t done = 0; done < windows; done += static_cast<std::size_t>(chunk)) {
    const int rows = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(chunk), windows - done));
    corpus.fill_eval(done, rows, batch);
    const Matrix& logits = logits_of(batch.inputs());
    const float loss = xent.forward(logits, batch.targets);
    loss_sum += static_cast<double>(loss) * static_cast<double>(batch.tokens.size());
    for (std::size_t i = 0; i < batch.targets.size(); ++i) {
      Eigen::Index best = 0;
      logits.row(static_cast<Eigen::Index>(i)).maxCoeff(&best);
      right += best == batch.targets[i] ? 1 : 0;
    }
    score.positions += batch.tokens.size();
  }
  if (score.positions > 0) {
    score.loss = loss_sum / static_cast<double>(score.positions);
    score.accuracy = static_cast<double>(right) / static_cast<double>(score.positions);
  }
  return score;
}

/// Continues `prompt` by `length` characters. temperature 0: greedy; otherwise samples from
/// softmax(logits / temperature) with a generator seeded by `seed`. The window slides once the text is
/// longer than the model's context. Characters of the prompt unknown to the corpus are dropped.
template <class Scope = NoScope>
std::string generate_text(Gpt& model, const TextCorpus& corpus, const std::string& prompt, int length,
                          float temperature, std::uint64_t seed, Scope&& scope = {}) {
  std::vector<std::int32_t> ids;
  for (char ch : prompt) {
    if (corpus.encode(ch) >= 0) ids.push_back(corpus.encode(ch));
  }
  if (ids.empty()) ids.push_back(0);
  std::string out;
  std::uint64_t state = detail::splitmix64(seed);
  const auto context = static_cast<std::size_t>(model.config.context);
  for (int i = 0; i < length; ++i) {
    const std::size_t len = std::min(ids.size(), context);
    const std::span<const std::int32_t> window(ids.data() + ids.size() - len, len);
    const Matrix& logits = model.logits(TokenView{window, 1, static_cast<int>(len)}, scope);
    const auto last = logits.row(static_cast<Eigen::Index>(len) - 1);
    Eigen::Index next = 0;
    if (temperature <= 0.0f) {
      last.maxCoeff(&next);
    } else {
      const float m = last.maxCoeff();
      const Eigen::RowVectorXf w = ((last.array() - m) / temperature).exp().matrix();
      state = detail::splitmix64(state);
      double u = detail::unit_open(state) * static_cast<double>(w.sum());
      for (next = 0; next + 1 < w.size(); ++next) {
        u -= static_cast<double>(w[next]);
        if (u <= 0.0) break;
      }
    }
    ids.push_back(static_cast<std::int32_t>(next));
    out.push_back(corpus.decode(static_cast<std::int32_t>(next)));
  }
  return out;
}

}  // namespace gpt
