#pragma once
// examples/02_gpt/pipeline_stage.hpp: the GPT split into pipeline stages (zerotk::pipeline).
//
// The model's layers in forward order (embedding, blocks, head: gpt::Gpt::with_layer) are cut into
// p x v parts, v chunks per rank (virtual stage c p + r holds part c p + r), by parameter count or by
// layer count (the config's pipeline.partition). Every rank builds the whole gpt::Gpt, but its engine
// binds only its chunks' parameters (GptStage, a Module over a range of layers); the other layers'
// Params never get storage.
//
// The layers keep one micro-batch's activations, and a schedule keeps several in flight, so each
// chunk saves only its input per micro-batch (the tokens on the first stage) and runs its forward again
// right before its backward: a stage-level recompute (one more forward per micro-batch, DeepSpeed's
// activation checkpointing at stage granularity). Forward and recompute are deterministic, so the
// gradients are those of a run without pipelining, bit for bit, for a data-parallel-only model.
// Zero-bubble schedules (ZB-H1) split the backward: its input-gradient half runs the layers' backward
// with their weight gradients set aside (gpt::DeferredWeights: copies of each product's operands),
// and the weight half adds them up later, inside each layer's backward scope.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <zerotk/config/options.hpp>
#include <zerotk/core/error.hpp>
#include <zerotk/pipeline.hpp>

#include "gpt.hpp"

namespace gpt_demo {

/// Layers [first, last) of a Gpt (its with_layer list), as a Module: what one chunk's engine binds.
struct GptStage {
  gpt::Gpt* model = nullptr;
  int first = 0, last = 0;

  template <class Visit>
  void parameters(Visit&& visit) {
    for (int i = first; i < last; ++i) model->with_layer(i, [&](auto& l) { l.parameters(visit); });
  }
  template <class Visit>
  void modules(Visit&& visit) {
    for (int i = first; i < last; ++i) model->with_layer(i, [&](auto& l) { visit(l); });
  }
  bool has_embedding() const noexcept { return first == 0; }
  bool has_head() const noexcept { return last == model->layer_count(); }
};

/// The p x v + 1 layer bounds of a pipeline's virtual stages (usage_error when there are fewer layers).
inline std::vector<std::size_t> stage_bounds(gpt::Gpt& model, int parts, zerotk::config::PipelinePartition how) {
  const int layers = model.layer_count();
  if (parts > layers) {
    throw zerotk::usage_error("the pipeline has more stages x chunks than the model has layers (embedding, each "
                              "block, head): every virtual stage needs one",
                              "pipeline", std::to_string(parts) + " virtual stages, " + std::to_string(layers) + " layers");
  }
  if (how == zerotk::config::PipelinePartition::uniform) return zerotk::pipeline::partition_uniform(static_cast<std::size_t>(layers), parts);
  std::vector<std::uint64_t> costs;
  for (int i = 0; i < layers; ++i) {
    std::uint64_t n = 0;
    model.with_layer(i, [&](auto& l) { l.parameters([&](std::string_view, gpt::Param& p) { n += p.numel(); }); });
    costs.push_back(n);
  }
  return zerotk::pipeline::partition_balanced(costs, parts);
}

/// Wall-clock time per compute action kind, for the measured-versus-simulated bubble.
struct ActionTimes {
  double forward_ms = 0, backward_ms = 0;  ///< backward: whole, or its two halves together
  double input_ms = 0, weight_ms = 0;      ///< the halves of split backwards (zero-bubble schedules)
  long long forwards = 0, backwards = 0;
};

/// One rank's stage functions over its chunks' layers and engines, for one step at a time.
/// `fill(index, batch)` writes data-parallel micro-batch `index` of this rank's data group.
template <class Engine>
class PipelineStages {
 public:
  using Fill = std::function<void(std::uint64_t index, gpt::Batch& out)>;

  PipelineStages(gpt::Gpt& model, std::vector<GptStage> chunks, std::vector<Engine*> engines, Fill fill, int seq)
      : model_(model), chunks_(std::move(chunks)), engines_(std::move(engines)), fill_(std::move(fill)), seq_(seq) {}

  /// Micro-batch m of this step is data micro-batch first + m.
  void set_first_index(std::uint64_t first) noexcept { first_ = first; }
  const ActionTimes& times() const noexcept { return times_; }

  zerotk::pipeline::StageFunctions functions() {
    zerotk::pipeline::StageFunctions f;
    f.forward = [this](const auto& mb, const auto* in, auto& out) { forward(mb, in, out); };
    f.loss = [this](const auto& mb, const auto& out, auto& grad) { return loss(mb, out, grad); };
    f.backward = [this](const auto& mb, const auto& grad_out, auto* grad_in) { backward(mb, grad_out, grad_in); };
    // Zero-bubble schedules split it: the input gradient now (the weights read in forward scopes,
    // gathered at stage 3), the weight gradients later, each layer's inside its backward scope.
    f.backward_input = [this](const auto& mb, const auto& grad_out, auto* grad_in) { backward_input(mb, grad_out, grad_in); };
    f.backward_weight = [this](const auto& mb) { backward_weight(mb); };
    return f;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Saved {
    gpt::Batch batch;  // the first stage's tokens
    gpt::Matrix x;     // another stage's input
  };

  static gpt::Matrix matrix_of(const zerotk::pipeline::Activation& a) {
    const auto v = a.as<float>();
    gpt::Matrix m(static_cast<Eigen::Index>(a.shape().dims.at(0)), static_cast<Eigen::Index>(a.shape().dims.at(1)));
    std::memcpy(m.data(), v.data(), v.size_bytes());
    return m;
  }
  static void put(const gpt::Matrix& m, zerotk::pipeline::Activation& a) {
    a.reset(zerotk::pipeline::Shape{{m.rows(), m.cols()}, zerotk::DType::fp32});
    std::memcpy(a.as<float>().data(), m.data(), static_cast<std::size_t>(m.size()) * sizeof(float));
  }

  /// The chunk's layers on its saved input, inside the engine's forward scopes (stage 3 gathers there).
  const gpt::Matrix& run_forward(int chunk, const Saved& s) {
    const GptStage& st = chunks_[static_cast<std::size_t>(chunk)];
    const gpt::TokenView tokens = s.batch.inputs();
    return model_.forward_layers(st.first, st.last, st.has_embedding() ? &tokens : nullptr, st.has_embedding() ? nullptr : &s.x,
                                 seq_, *engines_[static_cast<std::size_t>(chunk)]);
  }

  void forward(const zerotk::pipeline::MicroBatch& mb, const zerotk::pipeline::Activation* in,
               zerotk::pipeline::Activation& out) {
    const auto t0 = Clock::now();
    Saved& s = saved_[{mb.chunk, mb.micro}];
    if (in == nullptr) {
      fill_(first_ + static_cast<std::uint64_t>(mb.micro), s.batch);
    } else {
      s.x = matrix_of(*in);
    }
    put(run_forward(mb.chunk, s), out);
    times_.forward_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ++times_.forwards;
  }

  /// The last stage, right after its forward: the head's logits are still its output.
  double loss(const zerotk::pipeline::MicroBatch& mb, const zerotk::pipeline::Activation&, zerotk::pipeline::Activation& grad) {
    gpt::Batch b;
    fill_(first_ + static_cast<std::uint64_t>(mb.micro), b);
    // A context rank's share counts its part of the whole sequences' mean (Batch::loss_factor).
    const float l = xent_.forward(model_.head.output(), b.targets) * b.loss_factor;
    put(xent_.backward(static_cast<float>(engines_[static_cast<std::size_t>(mb.chunk)]->loss_scale()) * b.loss_factor), grad);
    return static_cast<double>(l);
  }

  void backward(const zerotk::pipeline::MicroBatch& mb, const zerotk::pipeline::Activation& grad_out,
                zerotk::pipeline::Activation* grad_in) {
    const auto t0 = Clock::now();
    const Saved s = take_saved(mb);
    run_forward(mb.chunk, s);  // the stage's activations again, for this micro-batch
    const GptStage& st = chunks_[static_cast<std::size_t>(mb.chunk)];
    const gpt::Matrix dy = matrix_of(grad_out);
    const gpt::Matrix* dx = model_.backward_layers(st.first, st.last, dy, *engines_[static_cast<std::size_t>(mb.chunk)]);
    if (grad_in != nullptr && dx != nullptr) put(*dx, *grad_in);
    times_.backward_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    ++times_.backwards;
  }

  /// An engine's forward scopes where a backward would open its backward scopes: the input-gradient
  /// half of a split backward reads the weights (gathered at stage 3) and writes no weight gradient.
  struct ForwardScopes {
    Engine* engine;
    template <class L>
    auto forward(L& l) {
      return engine->forward(l);
    }
    template <class L>
    auto backward(L& l) {
      return engine->forward(l);
    }
  };

  Saved take_saved(const zerotk::pipeline::MicroBatch& mb) {
    const auto it = saved_.find({mb.chunk, mb.micro});
    if (it == saved_.end()) {
      throw zerotk::usage_error("a backward without its forward", "gpt_demo::PipelineStages",
                                "chunk " + std::to_string(mb.chunk) + ", micro-batch " + std::to_string(mb.micro));
    }
    Saved s = std::move(it->second);
    saved_.erase(it);
    return s;
  }

  void backward_input(const zerotk::pipeline::MicroBatch& mb, const zerotk::pipeline::Activation& grad_out,
                      zerotk::pipeline::Activation* grad_in) {
    const auto t0 = Clock::now();
    const Saved s = take_saved(mb);
    run_forward(mb.chunk, s);
    const GptStage& st = chunks_[static_cast<std::size_t>(mb.chunk)];
    gpt::DeferredWeights& later = deferred_[{mb.chunk, mb.micro}];
    model_.set_deferred(&later);
    const gpt::Matrix dy = matrix_of(grad_out);
    const gpt::Matrix* dx = model_.backward_layers(st.first, st.last, dy, ForwardScopes{engines_[static_cast<std::size_t>(mb.chunk)]});
    model_.set_deferred(nullptr);
    if (grad_in != nullptr && dx != nullptr) put(*dx, *grad_in);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    times_.backward_ms += ms;
    times_.input_ms += ms;
  }

  void backward_weight(const zerotk::pipeline::MicroBatch& mb) {
    const auto t0 = Clock::now();
    const auto it = deferred_.find({mb.chunk, mb.micro});
    if (it == deferred_.end()) {
      throw zerotk::usage_error("a weight gradient without its input gradient", "gpt_demo::PipelineStages",
                                "chunk " + std::to_string(mb.chunk) + ", micro-batch " + std::to_string(mb.micro));
    }
    const GptStage& st = chunks_[static_cast<std::size_t>(mb.chunk)];
    Engine& e = *engines_[static_cast<std::size_t>(mb.chunk)];
    for (int i = st.last; i-- > st.first;) {  // the backward's layer order
      model_.with_layer(i, [&](auto& layer) {
        auto scope = e.backward(layer);
        it->second.run(i);
      });
    }
    deferred_.erase(it);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    times_.backward_ms += ms;
    times_.weight_ms += ms;
    ++times_.backwards;
  }

  gpt::Gpt& model_;
  std::vector<GptStage> chunks_;
  std::vector<Engine*> engines_;
  Fill fill_;
  int seq_;
  std::uint64_t first_ = 0;
  std::map<std::pair<int, int>, Saved> saved_;  // (chunk, micro-batch) -> the chunk's input
  std::map<std::pair<int, int>, gpt::DeferredWeights> deferred_;  // -> its weight gradients, between BI and BW
  gpt::CrossEntropy xent_;
  ActionTimes times_;
};

/// Logits through the pipeline, for evaluation: every rank of the pipeline group calls it with the
/// same tokens; each virtual stage runs its layers and sends on (blocking), and the last stage's rank
/// broadcasts the logits to the others, so every rank decodes alike.
template <zerotk::comm::Communicator C>
class PipelinedLogits {
 public:
  PipelinedLogits(gpt::Gpt& model, C& pipe, std::vector<std::size_t> bounds) : model_(model), pipe_(pipe), bounds_(std::move(bounds)) {}

  const gpt::Matrix& operator()(const gpt::TokenView& tokens) {
    const int p = pipe_.size(), me = pipe_.rank(), parts = static_cast<int>(bounds_.size()) - 1;
    const auto rows = static_cast<Eigen::Index>(tokens.batch) * tokens.seq;
    gpt::Matrix x;
    for (int k = 0; k < parts; ++k) {
      if (k % p != me) continue;
      if (k > 0) {
        x.resize(rows, model_.config.d_model);
        pipe_.recv(x.data(), static_cast<std::size_t>(x.size()), zerotk::DType::fp32, (k - 1) % p, kTag + k).wait();
      }
      const gpt::Matrix& y = model_.forward_layers(static_cast<int>(bounds_[static_cast<std::size_t>(k)]),
                                                   static_cast<int>(bounds_[static_cast<std::size_t>(k) + 1]), k == 0 ? &tokens : nullptr,
                                                   k == 0 ? nullptr : &x, tokens.seq);
      if (k == parts - 1) {
        logits_ = y;
      } else {
        x = y;
        pipe_.send(x.data(), static_cast<std::size_t>(x.size()), zerotk::DType::fp32, (k + 1) % p, kTag + k + 1).wait();
      }
    }
    logits_.resize(rows, model_.config.vocab_size);
    pipe_.broadcast(logits_.data(), static_cast<std::size_t>(logits_.size()), zerotk::DType::fp32, (parts - 1) % p).wait();
    return logits_;
  }

 private:
  static constexpr int kTag = 1 << 20;  // above the executor's tags (2 x virtual stage + 1)
  gpt::Gpt& model_;
  C& pipe_;
  std::vector<std::size_t> bounds_;
  gpt::Matrix logits_;
};

}  // namespace gpt_demo
