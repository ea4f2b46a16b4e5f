// examples/02_gpt/reference_main.cpp: trains the GPT example in one process with a deliberately plain
// local trainer (one flat fp32 buffer, global-norm clipping, AdamW). It calibrates what the zerotk
// Engine demo must reach and shows the training-loop shape the Engine plugs into.
//
//   build/default/examples/02_gpt/zerotk_example_02_gpt_reference                 # sort 8 digits
//   build/default/examples/02_gpt/zerotk_example_02_gpt_reference --text FILE     # characters of FILE
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <zerotk/core/error.hpp>

#include "data.hpp"
#include "evaluate.hpp"
#include "gpt.hpp"

namespace {

struct Options {
  std::string task = "sort";
  int digits = 8;
  std::string text_file;
  int context = 64;  // text mode only; the digit task's sequence length is 2 * digits
  int layers = 2, d_model = 64, heads = 4;
  bool tied = false;
  int steps = 300, batch = 64, warmup = 100;
  float lr = 3e-3f, min_lr_ratio = 0.1f, weight_decay = 0.01f, clip = 1.0f;
  std::uint64_t seed = 1234;
  int log_every = 50, eval_every = 0, eval_size = 1000;
  double target_accuracy = 0.0;  // > 0: stop at the first evaluation that reaches it
  int generate = 200;
};

// The stand-in for zerotk's Engine: owns one flat buffer for values, one for gradients (parameters are
// views into them, as with ZeRO), and applies AdamW with decoupled decay (SEMANTICS.md section 3,
// fused form) to the matrices; biases, LayerNorm gains and embeddings are not decayed.
class LocalTrainer {
 public:
  explicit LocalTrainer(gpt::Gpt& model) {
    std::size_t numel = 0;
    model.parameters([&](std::string_view name, gpt::Param& p) {
      const bool decay = p.rank() == 2 && !name.starts_with("wte") && !name.starts_with("wpe");
      segments_.push_back({numel, p.numel(), decay});
      numel += p.numel();
    });
    values_.assign(numel, 0.0f);
    grads_.assign(numel, 0.0f);
    m_.assign(numel, 0.0f);
    v_.assign(numel, 0.0f);
    std::size_t offset = 0;
    model.parameters([&](std::string_view, gpt::Param& p) {
      p.bind(values_.data() + offset, grads_.data() + offset);
      offset += p.numel();
    });
  }

  void zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

  /// Clips to `clip` (global L2 norm), then one AdamW step. Returns the norm before clipping.
  float step(float lr, float weight_decay, float clip) {
    double sq = 0.0;
    for (float g : grads_) sq += static_cast<double>(g) * static_cast<double>(g);
    const float norm = static_cast<float>(std::sqrt(sq));
    const float g_scale = (clip > 0.0f && norm > clip) ? clip / norm : 1.0f;
    ++t_;
    constexpr float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    const float bc1 = 1.0f - std::pow(b1, static_cast<float>(t_));
    const float bc2 = 1.0f - std::pow(b2, static_cast<float>(t_));
    for (const Segment& s : segments_) {
      const float wd = s.decay ? weight_decay : 0.0f;
      for (std::size_t i = s.offset; i < s.offset + s.numel; ++i) {
        const float g = grads_[i] * g_scale;
        m_[i] = b1 * m_[i] + (1.0f - b1) * g;
        v_[i] = b2 * v_[i] + (1.0f - b2) * g * g;
        values_[i] -= lr * ((m_[i] / bc1) / (std::sqrt(v_[i] / bc2) + eps) + wd * values_[i]);
      }
    }
    return norm;
  }

 private:
  struct Segment {
    std::size_t offset, numel;
    bool decay;
  };
  std::vector<Segment> segments_;
  std::vector<float> values_, grads_, m_, v_;  // [numel] each, parameters in visiting order
  long t_ = 0;
};

// Linear warm-up, then cosine decay to min_lr_ratio * lr at the last step.
float learning_rate(const Options& o, int step) {
  if (step < o.warmup) return o.lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup);
  const float progress = static_cast<float>(step - o.warmup) / static_cast<float>(std::max(1, o.steps - o.warmup));
  const float cosine = 0.5f * (1.0f + std::cos(3.14159265f * std::min(1.0f, progress)));
  return o.lr * (o.min_lr_ratio + (1.0f - o.min_lr_ratio) * cosine);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// Process CPU time: on a shared machine it says what the training cost when wall time is inflated.
double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// The training loop, in the shape the zerotk Engine expects (NoScope stands where the Engine's scope
// goes: it brackets each layer's forward and backward).
template <class Data, class Evaluate>
void train(const Options& o, const gpt::Config& config, const Data& data, Evaluate&& evaluate) {
  gpt::Gpt model(config);
  LocalTrainer trainer(model);
  gpt::init_parameters(model, o.seed);
  std::printf("gpt: %d layers, d_model %d, %d heads, vocab %d, context %d, %zu parameters (%s head)\n",
              config.n_layers, config.d_model, config.n_heads, config.vocab_size, config.context,
              model.num_parameters(), config.tied_head ? "tied" : "untied");
  std::printf("train: %d steps of batch %d, AdamW lr %.2g (warm-up %d, cosine to %.0f%%), wd %.2g, clip %.2g\n",
              o.steps, o.batch, static_cast<double>(o.lr), o.warmup, 100.0 * static_cast<double>(o.min_lr_ratio),
              static_cast<double>(o.weight_decay), static_cast<double>(o.clip));

  // Times exclude evaluation: they measure what the Engine demo has to match.
  gpt::Batch batch;
  double wall = 0.0, cpu = 0.0, loss_sum = 0.0;
  int loss_count = 0, step = 0;
  for (; step < o.steps; ++step) {
    const auto t0 = Clock::now();
    const double cpu0 = cpu_seconds();
    data.fill_batch(static_cast<std::uint64_t>(step), /*rank=*/0, /*world=*/1, o.batch, batch);
    trainer.zero_grad();
    const float loss = model.train_step(batch, gpt::NoScope{}, /*loss_scale=*/1.0f);
    const float lr = learning_rate(o, step);
    const float norm = trainer.step(lr, o.weight_decay, o.clip);
    wall += seconds_since(t0);
    cpu += cpu_seconds() - cpu0;
    loss_sum += static_cast<double>(loss);
    ++loss_count;
    if ((step + 1) % o.log_every == 0) {
      std::printf("step %5d  loss %.4f  lr %.2e  |g| %.3f  %6.1f s\n", step + 1, loss_sum / loss_count,
                  static_cast<double>(lr), static_cast<double>(norm), wall);
      std::fflush(stdout);
      loss_sum = 0.0;
      loss_count = 0;
    }
    if (o.eval_every > 0 && (step + 1) % o.eval_every == 0 && step + 1 < o.steps) {
      const double acc = evaluate(model, step + 1, wall);
      if (o.target_accuracy > 0.0 && acc >= o.target_accuracy) {
        ++step;
        break;
      }
    }
  }
  std::printf("final after %d steps, %.1f s of training (%.1f s CPU, %.1f ms per step):\n", step, wall, cpu,
              1e3 * wall / std::max(1, step));
  evaluate(model, step, wall);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"GPT example, single-process reference trainer"};
  app.add_option("--task", o.task, "synthetic task: sort or reverse")->check(CLI::IsMember({"sort", "reverse"}));
  app.add_option("--digits", o.digits, "digits per synthetic example")->check(CLI::Range(1, 64));
  app.add_option("--text", o.text_file, "train character-level on this text file instead")->check(CLI::ExistingFile);
  app.add_option("--context", o.context, "sequence length in --text mode")->check(CLI::Range(2, 1024));
  app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::Range(1, 64));
  app.add_option("--d-model", o.d_model, "model width")->check(CLI::Range(1, 4096));
  app.add_option("--heads", o.heads, "attention heads (divide d-model)")->check(CLI::Range(1, 64));
  app.add_flag("--tied", o.tied, "share the embedding matrix with the output head");
  app.add_option("--steps", o.steps, "optimizer steps")->check(CLI::Range(1, 10000000));
  app.add_option("--batch", o.batch, "sequences per step")->check(CLI::Range(1, 65536));
  app.add_option("--lr", o.lr, "peak learning rate")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "linear warm-up steps")->check(CLI::Range(1, 10000000));
  app.add_option("--weight-decay", o.weight_decay, "AdamW decoupled decay of weight matrices")->check(CLI::NonNegativeNumber);
  app.add_option("--clip", o.clip, "global gradient-norm clip (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "initialisation and data seed");
  app.add_option("--log-every", o.log_every, "print the mean loss every N steps")->check(CLI::Range(1, 10000000));
  app.add_option("--eval-every", o.eval_every, "evaluate every N steps (0: only at the end)")->check(CLI::NonNegativeNumber);
  app.add_option("--eval-size", o.eval_size, "held-out sequences (digits) or windows (text)")->check(CLI::Range(1, 1000000));
  app.add_option("--target-accuracy", o.target_accuracy, "stop at the first evaluation reaching this sequence accuracy")
      ->check(CLI::Range(0.0, 1.0));
  app.add_option("--generate", o.generate, "text mode: characters to sample at the end")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    gpt::Config config;
    config.n_layers = o.layers;
    config.d_model = o.d_model;
    config.n_heads = o.heads;
    config.tied_head = o.tied;
    if (o.text_file.empty()) {
      const gpt::DigitTask task(o.task == "sort" ? gpt::DigitTaskKind::sort : gpt::DigitTaskKind::reverse, o.digits,
                                o.seed);
      config.vocab_size = task.vocab_size();
      config.context = task.seq_len();
      std::printf("task: %s %d digits; accuracy = held-out sequences whose %d answer digits are all right "
                  "under greedy decoding\n",
                  o.task.c_str(), o.digits, o.digits);
      train(o, config, task, [&](gpt::Gpt& model, int step, double seconds) {
        const gpt::DigitScore s = gpt::evaluate_digits(model, task, 0, o.eval_size);
        std::printf("eval step %5d  sequence accuracy %.4f  digit accuracy %.4f  (%zu held-out)  %6.1f s\n", step,
                    s.sequence_accuracy(), s.digit_accuracy(), s.sequences, seconds);
        std::fflush(stdout);
        return s.sequence_accuracy();
      });
    } else {
      const gpt::TextCorpus corpus = gpt::TextCorpus::from_file(o.text_file, o.context, o.seed);
      config.vocab_size = corpus.vocab_size();
      config.context = o.context;
      std::printf("text: %s, %zu characters, vocabulary %d\n", o.text_file.c_str(), corpus.size(),
                  corpus.vocab_size());
      train(o, config, corpus, [&](gpt::Gpt& model, int step, double seconds) {
        const gpt::TextScore s = gpt::evaluate_text(model, corpus, static_cast<std::size_t>(o.eval_size));
        std::printf("eval step %5d  held-out loss %.4f nats/char  accuracy %.4f  (%zu chars)  %6.1f s\n", step, s.loss,
                    s.accuracy, s.positions, seconds);
        if (o.generate > 0 && step >= o.steps) {
          std::printf("sample: %s\n", gpt::generate_text(model, corpus, "\n", o.generate, 0.8f, o.seed).c_str());
        }
        std::fflush(stdout);
        return 0.0;
      });
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
