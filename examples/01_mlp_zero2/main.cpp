// examples/01_mlp_zero2: a small MLP trained with ZeRO stage 2, fp16 with dynamic loss scaling, on 4
// in-process ranks (threads communicator). The task: regress the output of a fixed random "teacher"
// network; each rank draws its own micro-batches. The loss must fall below 5% of its first value.
//
//   build/default/examples/01_mlp_zero2/zerotk_example_01_mlp_zero2 [--ranks 4] [--steps 300]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <zerotk/comm/threads.hpp>
#include <zerotk/engine.hpp>

namespace {

/// The user's own layer: y = act(x W^T + b), fp16 parameters, float arithmetic.
struct Dense {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  int in, out;
  bool relu;
  zerotk::Param<zerotk::half> w, b;
  std::vector<float> x_, z_;

  Dense(const std::string& name, int in_, int out_, bool relu_)
      : in(in_), out(out_), relu(relu_),
        w(name + ".weight", {std::size_t(out_), std::size_t(in_)}), b(name + ".bias", {std::size_t(out_)}) {}

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  output_type forward(const input_type& x) {
    const int batch = int(x.size()) / in;
    x_ = x;
    z_.assign(std::size_t(batch * out), 0.0f);
    std::vector<float> y(z_.size());
    for (int n = 0; n < batch; ++n)
      for (int o = 0; o < out; ++o) {
        float s = float(b.data()[o]);
        for (int i = 0; i < in; ++i) s += x[n * in + i] * float(w.data()[o * in + i]);
        z_[n * out + o] = s;
        y[n * out + o] = relu && s < 0 ? 0.0f : s;
      }
    return y;
  }

  input_type backward(const output_type& dy) {
    const int batch = int(dy.size()) / out;
    std::vector<float> dz(dy.size()), dx(std::size_t(batch * in), 0.0f);
    for (std::size_t k = 0; k < dy.size(); ++k) dz[k] = relu && z_[k] < 0 ? 0.0f : dy[k];
    for (int o = 0; o < out; ++o) {
      float gb = 0;
      for (int n = 0; n < batch; ++n) gb += dz[n * out + o];
      b.grad()[o] = zerotk::half(float(b.grad()[o]) + gb);
      for (int i = 0; i < in; ++i) {
        float gw = 0;
        for (int n = 0; n < batch; ++n) gw += dz[n * out + o] * x_[n * in + i];
        w.grad()[o * in + i] = zerotk::half(float(w.grad()[o * in + i]) + gw);
        for (int n = 0; n < batch; ++n) dx[n * in + i] += dz[n * out + o] * float(w.data()[o * in + i]);
      }
    }
    return dx;
  }
};

struct Model {
  std::vector<Dense> layers;
  template <class Visit>
  void parameters(Visit&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
};

Model make_model() {
  Model m;
  m.layers.emplace_back("fc0", 16, 64, true);
  m.layers.emplace_back("fc1", 64, 64, true);
  m.layers.emplace_back("fc2", 64, 4, false);
  return m;
}

/// The teacher: a fixed random function of 16 inputs with 4 outputs.
std::vector<float> teacher(const std::vector<float>& x) {
  std::vector<float> y(x.size() / 16 * 4);
  for (std::size_t n = 0; n < x.size() / 16; ++n)
    for (int o = 0; o < 4; ++o) {
      float s = 0;
      for (int i = 0; i < 16; ++i) s += std::sin(0.37f * float((o + 1) * (i + 3))) * x[n * 16 + i];
      y[n * 4 + o] = std::tanh(s);
    }
  return y;
}

int arg_int(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int ranks = arg_int(argc, argv, "--ranks", 4);
  const int steps = arg_int(argc, argv, "--steps", 300);
  constexpr int kBatch = 32;
  using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                                zerotk::Precision<zerotk::fp16>, zerotk::Bucketer<zerotk::Bytes<8 << 10>>>;
  double first = 0, last = 0;
  zerotk::comm::run_threads(ranks, [&](auto& comm) {
    Model model = make_model();
    zerotk::EngineOptions opt;
    opt.optimizer.lr = 3e-3f;
    opt.optimizer.weight_decay = 0.01f;
    opt.gradient_clipping = 1.0;
    Engine engine(comm, model, opt);
    std::mt19937 init(1);
    for (auto& l : model.layers) {
      std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / float(l.in)));
      for (auto& v : l.w.values()) v = zerotk::half(nd(init));
    }
    engine.broadcast_parameters();

    std::mt19937 data(1234 + unsigned(comm.rank()));
    std::normal_distribution<float> nd;
    for (int s = 0; s < steps; ++s) {
      std::vector<float> x(kBatch * 16);
      for (auto& v : x) v = nd(data);
      const std::vector<float> t = teacher(x);
      for (auto& l : model.layers) {
        auto scope = engine.forward(l);
        x = l.forward(x);
      }
      double loss = 0;
      std::vector<float> dy(x.size());
      const float seed = float(engine.loss_scale());
      for (std::size_t k = 0; k < x.size(); ++k) {
        const float d = x[k] - t[k];
        loss += 0.5 * d * d / kBatch;
        dy[k] = d / kBatch * seed;
      }
      for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
        auto scope = engine.backward(*it);
        dy = it->backward(dy);
      }
      const zerotk::StepReport r = engine.step(loss);
      if (comm.rank() == 0) {
        if (s == 0) first = r.loss;
        last = r.loss;
        if (s % 50 == 0 || s + 1 == steps)
          std::printf("step %4d  loss %.5f  scale %8.0f  grad_norm %.4f  skipped %lld\n", s, r.loss, r.loss_scale,
                      r.grad_norm, static_cast<long long>(r.skipped_steps));
      }
    }
    if (comm.rank() == 0) {
      const auto& m = engine.memory();
      std::printf("rank 0 memory: params16 %zu B, grads %zu B, master32 %zu B, optimizer %zu B, buckets %zu B\n",
                  m.live(zerotk::MemoryCategory::params16), m.live(zerotk::MemoryCategory::grads),
                  m.live(zerotk::MemoryCategory::master32), m.live(zerotk::MemoryCategory::optimizer_state),
                  m.live(zerotk::MemoryCategory::comm_buffers));
    }
  });
  const bool ok = last < 0.05 * first;
  std::printf("loss %.5f -> %.5f (%.1f%% of the first): %s\n", first, last, 100.0 * last / first,
              ok ? "PASS (below 5%)" : "FAIL (not below 5%)");
  return ok ? 0 : 1;
}
