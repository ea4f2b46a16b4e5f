#pragma once
// A toy pipeline model for the executor tests (threads: tests/pipeline/test_pipeline.cpp; MPI:
// tests/mpi/test_pipeline_mpi.cpp): virtual stage k multiplies its input elementwise by w_k and
// adds 0.5; the loss is 0.5 * sum(y^2). Each rank keeps, per chunk, its weights, the gradients it
// accumulates and, per micro-batch, what the backward needs. `serial_reference` runs the same
// arithmetic on one thread, micro-batch after micro-batch.
#include <map>
#include <string>
#include <vector>

#include "zerotk/pipeline.hpp"

namespace zt_test {

using namespace zerotk::pipeline;
using zerotk::DType;

constexpr int kElems = 6;

inline Shape toy_shape() { return Shape{{2, 3}, DType::fp32}; }

inline std::vector<float> input_of(int micro) {
  std::vector<float> x(kElems);
  for (int i = 0; i < kElems; ++i) x[static_cast<std::size_t>(i)] = 0.25f * static_cast<float>(micro + 1) - 0.1f * static_cast<float>(i);
  return x;
}

inline std::vector<float> weights_of(int stage) {
  std::vector<float> w(kElems);
  for (int i = 0; i < kElems; ++i) w[static_cast<std::size_t>(i)] = 0.9f + 0.03f * static_cast<float>(stage) - 0.02f * static_cast<float>(i);
  return w;
}

struct ToyStage {
  std::vector<float> w, grad;
  std::map<int, std::vector<float>> x, dy;  // per micro-batch: saved input, output gradient
};

struct ToyRank {
  std::vector<ToyStage> chunks;
  std::vector<std::string> events;  // "F k m", "R k m" (reduce), ...

  ToyRank(const Schedule& s, int rank) {
    for (int c = 0; c < s.chunks; ++c) chunks.push_back({weights_of(s.virtual_stage(rank, c)), std::vector<float>(kElems, 0.0f), {}, {}});
  }

  StageFunctions functions() {
    StageFunctions f;
    f.forward = [this](const MicroBatch& mb, const Activation* in, Activation& out) {
      ToyStage& st = chunks[static_cast<std::size_t>(mb.chunk)];
      std::vector<float> x = in ? std::vector<float>(in->as<float>().begin(), in->as<float>().end()) : input_of(mb.micro);
      out.reset(toy_shape());
      auto y = out.as<float>();
      for (int i = 0; i < kElems; ++i) y[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] * st.w[static_cast<std::size_t>(i)] + 0.5f;
      st.x[mb.micro] = std::move(x);
    };
    f.loss = [](const MicroBatch&, const Activation& out, Activation& grad) {
      double l = 0;
      auto g = grad.as<float>();
      for (std::size_t i = 0; i < g.size(); ++i) {
        const float y = out.as<float>()[i];
        l += 0.5 * y * y;
        g[i] = y;
      }
      return l;
    };
    f.backward_input = [this](const MicroBatch& mb, const Activation& gy, Activation* gx) {
      ToyStage& st = chunks[static_cast<std::size_t>(mb.chunk)];
      st.dy[mb.micro].assign(gy.as<float>().begin(), gy.as<float>().end());
      if (gx) {
        for (int i = 0; i < kElems; ++i) gx->as<float>()[static_cast<std::size_t>(i)] = gy.as<float>()[static_cast<std::size_t>(i)] * st.w[static_cast<std::size_t>(i)];
      }
    };
    f.backward_weight = [this](const MicroBatch& mb) {
      ToyStage& st = chunks[static_cast<std::size_t>(mb.chunk)];
      for (int i = 0; i < kElems; ++i) {
        st.grad[static_cast<std::size_t>(i)] += st.dy[mb.micro][static_cast<std::size_t>(i)] * st.x[mb.micro][static_cast<std::size_t>(i)];
      }
      st.x.erase(mb.micro);
      st.dy.erase(mb.micro);
    };
    f.reduce = [this](const MicroBatch& mb, double) { events.push_back("R" + std::to_string(mb.stage) + "." + std::to_string(mb.micro)); };
    f.optimizer_step = [this] { events.push_back("step"); };
    return f;
  }
};

// Per virtual stage, the accumulated gradient after one step; and the losses: one thread, micro-batch
// after micro-batch.
struct Serial {
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
};
inline Serial serial_reference(int stages, int m) {
  Serial out;
  std::vector<ToyStage> st;
  for (int k = 0; k < stages; ++k) st.push_back({weights_of(k), std::vector<float>(kElems, 0.0f), {}, {}});
  for (int mb = 0; mb < m; ++mb) {
    std::vector<std::vector<float>> xs;
    std::vector<float> x = input_of(mb);
    for (int k = 0; k < stages; ++k) {
      xs.push_back(x);
      for (int i = 0; i < kElems; ++i) x[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)] * st[static_cast<std::size_t>(k)].w[static_cast<std::size_t>(i)] + 0.5f;
    }
    double l = 0;
    for (float y : x) l += 0.5 * y * y;
    out.losses.push_back(l);
    std::vector<float> g = x;
    for (int k = stages - 1; k >= 0; --k) {
      auto& s = st[static_cast<std::size_t>(k)];
      std::vector<float> gx(kElems);
      for (int i = 0; i < kElems; ++i) {
        gx[static_cast<std::size_t>(i)] = g[static_cast<std::size_t>(i)] * s.w[static_cast<std::size_t>(i)];
        s.grad[static_cast<std::size_t>(i)] += g[static_cast<std::size_t>(i)] * xs[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
      }
      g = gx;
    }
  }
  for (auto& s : st) out.grads.push_back(s.grad);
  return out;
}

}  // namespace zt_test
