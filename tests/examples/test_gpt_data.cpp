// The GPT example's data (synthetic digit task, character corpus) and its evaluation, plus a short
// training run proving the pieces learn together.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include <zerotk/core/error.hpp>

#include "data.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"
#include "gpt_test_util.hpp"

namespace test_gpt_data {  // the file's own names, apart from its suite's other files in a unity build

TEST_CASE("DigitTask examples: prompt, separator, sorted or reversed answer") {
  for (auto kind : {gpt::DigitTaskKind::sort, gpt::DigitTaskKind::reverse}) {
    const gpt::DigitTask task(kind, 8, 5);
    CHECK(task.seq_len() == 16);
    CHECK(task.vocab_size() == 11);
    std::vector<std::int32_t> e(17);
    std::set<std::vector<std::int32_t>> distinct;
    for (std::uint64_t i = 0; i < 50; ++i) {
      task.example(gpt::Split::train, i, e);
      std::vector<std::int32_t> prompt(e.begin(), e.begin() + 8), answer(e.begin() + 9, e.end());
      for (auto d : prompt) REQUIRE((d >= 0 && d <= 9));
      REQUIRE(e[8] == gpt::DigitTask::kSeparator);
      std::vector<std::int32_t> want = prompt;
      if (kind == gpt::DigitTaskKind::sort) std::sort(want.begin(), want.end());
      else std::reverse(want.begin(), want.end());
      REQUIRE(answer == want);
      distinct.insert(prompt);
    }
    CHECK(distinct.size() == 50);  // 10^8 prompts: a repeat in 50 would mean a broken generator
  }
}

TEST_CASE("DigitTask batches: inputs, answer-only targets, deterministic, split streams differ") {
  const gpt::DigitTask task(gpt::DigitTaskKind::sort, 4, 9);
  gpt::Batch b;
  task.fill_batch(3, 0, 1, 5, b);
  CHECK(b.batch == 5);
  CHECK(b.seq == 8);
  std::vector<std::int32_t> e(9);
  for (int s = 0; s < 5; ++s) {
    task.example(gpt::Split::train, 3 * 5 + static_cast<std::uint64_t>(s), e);
    for (int t = 0; t < 8; ++t) {
      const auto i = static_cast<std::size_t>(s * 8 + t);
      REQUIRE(b.tokens[i] == e[static_cast<std::size_t>(t)]);
      // position 3 holds the last prompt digit (its next token is the separator: no loss)
      REQUIRE(b.targets[i] == (t < 4 ? gpt::Batch::kIgnore : e[static_cast<std::size_t>(t) + 1]));
    }
  }
  gpt::Batch again;
  task.fill_batch(3, 0, 1, 5, again);
  CHECK(again.tokens == b.tokens);
  gpt::Batch eval;
  task.fill_examples(gpt::Split::eval, 15, 5, eval);
  CHECK(eval.tokens != b.tokens);
  gpt::Batch other_seed;
  gpt::DigitTask(gpt::DigitTaskKind::sort, 4, 10).fill_batch(3, 0, 1, 5, other_seed);
  CHECK(other_seed.tokens != b.tokens);
}

TEST_CASE("DigitTask shards: the ranks' micro-batches of a step are the one-rank global batch, split") {
  const gpt::DigitTask task(gpt::DigitTaskKind::reverse, 5, 2);
  for (int world : {1, 3, 4}) {  // odd world size included
    CAPTURE(world);
    gpt::Batch global;
    task.fill_batch(7, 0, 1, 2 * world, global);
    std::vector<std::int32_t> tokens, targets;
    for (int r = 0; r < world; ++r) {
      gpt::Batch part;
      task.fill_batch(7, r, world, 2, part);
      tokens.insert(tokens.end(), part.tokens.begin(), part.tokens.end());
      targets.insert(targets.end(), part.targets.begin(), part.targets.end());
    }
    CHECK(tokens == global.tokens);
    CHECK(targets == global.targets);
  }
  gpt::Batch b;
  CHECK_THROWS_AS(task.fill_batch(0, 4, 4, 2, b), zerotk::usage_error);
  CHECK_THROWS_AS(task.fill_batch(0, 0, 1, 0, b), zerotk::usage_error);
  CHECK_THROWS_AS(gpt::DigitTask(gpt::DigitTaskKind::sort, 0, 1), zerotk::config_error);
}

TEST_CASE("DigitTask with one digit: a two-token input, one answer position") {
  const gpt::DigitTask task(gpt::DigitTaskKind::sort, 1, 3);
  gpt::Batch b;
  task.fill_batch(0, 0, 1, 4, b);
  CHECK(b.seq == 2);
  for (int s = 0; s < 4; ++s) {
    CHECK(b.tokens[static_cast<std::size_t>(2 * s + 1)] == gpt::DigitTask::kSeparator);
    CHECK(b.targets[static_cast<std::size_t>(2 * s)] == gpt::Batch::kIgnore);
    CHECK(b.targets[static_cast<std::size_t>(2 * s + 1)] == b.tokens[static_cast<std::size_t>(2 * s)]);
  }
}

TEST_CASE("TextCorpus: byte vocabulary, shifted windows, shards, held-out split") {
  std::string text;
  for (int i = 0; i < 40; ++i) text += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  const gpt::TextCorpus corpus(text, 8, 4);
  const std::set<char> chars(text.begin(), text.end());
  CHECK(corpus.vocab_size() == static_cast<int>(chars.size()));
  for (char ch : chars) CHECK(corpus.decode(corpus.encode(ch)) == ch);
  CHECK(corpus.encode('Z') == -1);

  gpt::Batch global;
  corpus.fill_batch(2, 0, 1, 6, global);
  std::vector<std::int32_t> tokens;
  for (int r = 0; r < 3; ++r) {
    gpt::Batch part;
    corpus.fill_batch(2, r, 3, 2, part);
    tokens.insert(tokens.end(), part.tokens.begin(), part.tokens.end());
  }
  CHECK(tokens == global.tokens);
  const std::size_t train_chars = text.size() - text.size() / 10;
  for (int s = 0; s < 6; ++s) {
    std::string window;
    for (int t = 0; t < 8; ++t) {
      const auto i = static_cast<std::size_t>(s * 8 + t);
      window += corpus.decode(global.tokens[i]);
      if (t + 1 < 8) REQUIRE(global.targets[i] == global.tokens[i + 1]);  // targets are the next characters
    }
    window += corpus.decode(global.targets[static_cast<std::size_t>(s * 8 + 7)]);
    const auto at = text.find(window);
    REQUIRE(at != std::string::npos);  // a real window of the text
    CHECK(at + window.size() <= train_chars);
  }
  // held-out windows: consecutive, non-overlapping, all after the training split
  CHECK(corpus.eval_windows() == (text.size() - train_chars - 1) / 8);
  gpt::Batch eval;
  corpus.fill_eval(0, 2, eval);
  CHECK(eval.targets[7] == eval.tokens[8]);
  CHECK(corpus.decode(eval.tokens[0]) == text[train_chars]);
}

TEST_CASE("TextCorpus errors: unreadable file, text too short") {
  CHECK_THROWS_AS(gpt::TextCorpus::from_file("no/such/file.txt", 8, 1), zerotk::io_error);
  CHECK_THROWS_AS(gpt::TextCorpus("", 8, 1), zerotk::usage_error);
  CHECK_THROWS_AS(gpt::TextCorpus(std::string(89, 'a'), 8, 1), zerotk::usage_error);  // held-out 8 < 9 chars
  CHECK_NOTHROW(gpt::TextCorpus(std::string(90, 'a'), 8, 1));  // 81 train, 9 held-out
}

namespace {

// A plain Adam good enough to prove the example learns (the reference trainer has the full one).
struct Adam {
  std::vector<float> m, v;
  int t = 0;
  void step(std::vector<float>& p, const std::vector<float>& g, float lr) {
    m.resize(p.size());
    v.resize(p.size());
    ++t;
    const float bc1 = 1 - std::pow(0.9f, static_cast<float>(t)), bc2 = 1 - std::pow(0.99f, static_cast<float>(t));
    for (std::size_t i = 0; i < p.size(); ++i) {
      m[i] = 0.9f * m[i] + 0.1f * g[i];
      v[i] = 0.99f * v[i] + 0.01f * g[i] * g[i];
      p[i] -= lr * (m[i] / bc1) / (std::sqrt(v[i] / bc2) + 1e-8f);
    }
  }
};

}  // namespace

TEST_CASE("gpt learns to reverse 3 digits; greedy evaluation scores chance before and success after") {
  const gpt::DigitTask task(gpt::DigitTaskKind::reverse, 3, 1);
  gpt::Config c;
  c.vocab_size = task.vocab_size();
  c.context = task.seq_len();
  c.d_model = 32;
  c.n_heads = 2;
  c.n_layers = 1;
  c.tied_head = true;
  gpt::Gpt model(c);
  gpt_test::FlatStorage storage(model);
  gpt::init_parameters(model, 7);

  const gpt::DigitScore before = gpt::evaluate_digits(model, task, 0, 200);
  CHECK(before.sequences == 200);
  CHECK(before.digits == 600);
  CHECK(before.sequence_accuracy() < 0.05);  // chance is 1e-3

  Adam adam;
  gpt::Batch batch;
  float first = 0, last = 0;
  for (int step = 0; step < 150; ++step) {
    task.fill_batch(static_cast<std::uint64_t>(step), 0, 1, 32, batch);
    storage.zero_grad();
    last = model.train_step(batch);
    if (step == 0) first = last;
    adam.step(storage.values, storage.grads, 1e-2f);
  }
  CHECK(first == doctest::Approx(std::log(11.0)).epsilon(0.05));  // an initialised model is near uniform
  CHECK(last < 0.1f);
  const gpt::DigitScore after = gpt::evaluate_digits(model, task, 0, 200, gpt::NoScope{}, /*chunk=*/64);
  CHECK(after.sequence_accuracy() >= 0.95);
  CHECK(after.digit_accuracy() >= after.sequence_accuracy());
}

}  // namespace test_gpt_data
