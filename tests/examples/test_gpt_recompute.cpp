// Activation checkpointing on the GPT example (zerotk::Recompute<Block>): gradients and whole
// training runs are bitwise those without it, at ZeRO stages 0-3 and with every way of keeping the
// saved inputs (in objects, in the contiguous arena, in pinned host memory); and the activation
// memory the ledger records falls as the layer count says it must.
#include <doctest/doctest.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpt.hpp"
#include "gpt_engine_train.hpp"
#include "gpt_test_util.hpp"
#include "zerotk/activation.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/engines.hpp"  // the compiled engine set, when the suite links zerotk::engines

namespace test_gpt_recompute {  // the file's own names, apart from its suite's other files in a unity build

namespace {

namespace act = zerotk::activation;

gpt::Config small_config(int layers) {
  gpt::Config c;
  c.vocab_size = 11;
  c.context = 8;
  c.d_model = 16;
  c.n_heads = 2;
  c.n_layers = layers;
  return c;
}

act::Options options_named(const std::string& how) {
  act::Options o;
  if (how == "contiguous" || how == "cpu+contiguous") {
    o.contiguous_memory = true;
    o.number_checkpoints = 8;
  }
  if (how == "cpu" || how == "cpu+contiguous") o.cpu_checkpointing = true;
  return o;
}

struct Grads {
  std::vector<float> grads;
  std::vector<float> loss;
  std::size_t checkpointed = 0;    // blocks run through Recompute
  std::size_t released_bytes = 0;  // what those blocks held after the last backward (0: released)
};

// Two micro-steps of forward/backward on flat storage (gradients accumulate), no engine.
Grads grads_of(const std::optional<act::Select>& select, const act::Options& options, int layers) {
  gpt::Gpt model(small_config(layers));
  gpt_test::FlatStorage storage(model, /*odd_offsets=*/true);
  gpt_test::fill_test_values(model, 5);
  act::Checkpointing ckpt(options);
  if (select) model.checkpoint_blocks(ckpt, *select);
  Grads out;
  for (std::uint32_t s = 0; s < 2; ++s) {
    const gpt::Batch b = gpt_test::random_batch(3, 7, 11, 40 + s, 4);
    out.loss.push_back(model.train_step(b));
  }
  out.grads = storage.grads;
  out.checkpointed = model.checkpointed_blocks();
  for (std::size_t i = 0; i < model.blocks.size(); ++i) {
    if (select && (*select)(i)) out.released_bytes += model.blocks[i].activation_bytes();
  }
  return out;
}

using gpt_test::Trace;

// Each rank's blocks share one Checkpointing (made per rank, kept alive for the whole run).
template <int Stage, class Prec = zerotk::fp32>
Trace train(const std::optional<act::Select>& select, const act::Options& options, int world, int steps) {
  std::mutex mu;
  std::vector<std::unique_ptr<act::Checkpointing>> per_rank;
  auto attach = [&](gpt::Gpt& model) {
    if (!select) return;
    std::lock_guard lock(mu);
    per_rank.push_back(std::make_unique<act::Checkpointing>(options));
    model.checkpoint_blocks(*per_rank.back(), *select);
  };
  auto detach = [&](gpt::Gpt& model) {
    if (!select) return;
    std::lock_guard lock(mu);
    model.checkpoint_blocks(*per_rank.front(), act::Select::none());  // any one: none makes nothing
  };
  return gpt_test::train_engine<Stage, Prec>(small_config(3), world, steps, attach, detach);
}

}  // namespace

TEST_CASE("GPT gradients with Recompute<Block> are bitwise those without, however the inputs are kept") {
  const Grads plain = grads_of(std::nullopt, {}, 4);
  for (const char* how : {"object", "contiguous", "cpu", "cpu+contiguous"}) {
    for (const char* which : {"all", "every:2", "every:3"}) {
      CAPTURE(how);
      CAPTURE(which);
      const Grads g = grads_of(act::Select::parse(which, "test"), options_named(how), 4);
      CHECK(g.checkpointed == (std::string(which) == "all" ? 4u : 2u));  // every:2 -> 0, 2; every:3 -> 0, 3
      CHECK(g.released_bytes == 0);  // the checkpointed blocks really dropped their buffers
      CHECK(g.loss == plain.loss);
      CHECK(g.grads == plain.grads);
    }
  }
}

TEST_CASE_TEMPLATE("GPT training with Recompute<Block> equals training without, stages 0-3 (threads)", Prec,
                   zerotk::fp32, zerotk::bf16) {
  const Trace plain = train<0, Prec>(std::nullopt, {}, 2, 5);
  CHECK(plain.losses.back() < plain.losses.front());
  const auto all = act::Select::all();
  const Trace s0 = train<0, Prec>(all, {}, 2, 5);
  const Trace s1 = train<1, Prec>(act::Select::every(2), options_named("contiguous"), 2, 5);
  const Trace s2 = train<2, Prec>(all, options_named("cpu"), 2, 5);
  const Trace s3 = train<3, Prec>(all, {}, 2, 5);
  const Trace s3cpu = train<3, Prec>(act::Select::every(2), options_named("cpu+contiguous"), 3, 5);
  const Trace plain3 = train<0, Prec>(std::nullopt, {}, 3, 5);
  for (const Trace* t : {&s0, &s1, &s2, &s3}) {
    CHECK(t->losses == plain.losses);
    CHECK(t->params == plain.params);
  }
  CHECK(s3cpu.losses == plain3.losses);
  CHECK(s3cpu.params == plain3.params);
}

TEST_CASE("GPT activation bytes in the ledger: checkpointing every block keeps one input per block") {
  // Peak activation bytes over a step, measured through the Meter, against the closed form from the
  // layers' buffers: without checkpointing every block keeps its forward buffers and backward scratch;
  // with it, each block keeps its input (the output of the block below, taken over, not copied) and one
  // block at a time holds its buffers again inside its backward.
  const int layers = 8, B = 4, T = 8;
  auto peak_with = [&](const std::optional<act::Select>& select, std::size_t* block_bytes) {
    zerotk::MemoryLedger ledger;
    act::Meter meter(&ledger);
    act::Checkpointing ckpt({}, &meter);
    gpt::Gpt model(small_config(layers));
    gpt_test::FlatStorage storage(model);
    gpt_test::fill_test_values(model, 3);
    model.set_meter(&meter);
    if (select) model.checkpoint_blocks(ckpt, *select);
    for (std::uint32_t s = 0; s < 2; ++s) model.train_step(gpt_test::random_batch(B, T, 11, s));
    if (block_bytes != nullptr) *block_bytes = model.blocks[0].activation_bytes();
    return ledger.peak(zerotk::MemoryCategory::activations);
  };
  std::size_t full_block = 0;
  const std::size_t without = peak_with(std::nullopt, &full_block);
  const std::size_t with = peak_with(act::Select::all(), nullptr);
  const std::size_t input = static_cast<std::size_t>(B * T * 16) * sizeof(float);
  CHECK(full_block > 0);
  // without: all blocks hold their buffers at the end of the first backward
  CHECK(without >= static_cast<std::size_t>(layers) * full_block);
  // with: inputs of every block + one block's buffers + its output and gradient copies + the rest
  const std::size_t rest = without - static_cast<std::size_t>(layers) * full_block;  // embedding, head, loss
  CHECK(with <= static_cast<std::size_t>(layers) * input + full_block + 3 * input + rest);
  CHECK(with * 5 <= without);
  MESSAGE("activation peak without checkpointing " << without << " B, with " << with << " B ("
                                                    << static_cast<double>(with) / static_cast<double>(without) << ")");
}

}  // namespace test_gpt_recompute
