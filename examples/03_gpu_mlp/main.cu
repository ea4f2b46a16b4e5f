// examples/03_gpu_mlp: example 01's MLP on GPUs. `Engine<..., Device<Cuda>>` keeps fp16 parameters,
// gradients, the fp32 master and Adam's moments in GPU memory and reduces over NCCL; the model is the
// user's own CUDA kernels. One thread per GPU, NCCL bootstrapped through the threads communicator
// (with MPI it would be MpiCommunicator::world() instead). The loss must fall below 5% of its first value.
//
//   build/cuda-compile/examples/03_gpu_mlp/zerotk_example_03_gpu_mlp [--ranks <GPUs>] [--steps 300]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <zerotk/comm/nccl.hpp>
#include <zerotk/comm/threads.hpp>
#include <zerotk/core/cuda.hpp>
#include <zerotk/core/cuda_memory.hpp>
#include <zerotk/engine.hpp>

// A named namespace: nvcc warns (#177) about concept-checked member templates of types with internal
// linkage.
namespace gpu_mlp {

using f16 = zerotk::half;  // (CUDA has its own ::half)

// ---- the user's kernels: y = act(x W^T + b) over a batch, fp16 parameters, float arithmetic ----------

__global__ void dense_forward(const float* x, const f16* w, const f16* b, float* z, float* y, int batch, int in,
                              int out, bool relu) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= batch * out) return;
  const int n = k / out, o = k % out;
  float s = zerotk::to_float(b[o]);
  for (int i = 0; i < in; ++i) s += x[n * in + i] * zerotk::to_float(w[o * in + i]);
  z[k] = s;
  y[k] = relu && s < 0 ? 0.0f : s;
}

/// dz = act'(z) * dy, in place in dy.
__global__ void dense_dz(const float* z, float* dy, int count, bool relu) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < count && relu && z[k] < 0) dy[k] = 0.0f;
}

/// Parameter gradients, accumulated (+=) into the engine's fp16 storage: one thread per weight, the
/// threads of column i == 0 also do the bias.
__global__ void dense_grads(const float* x, const float* dz, f16* gw, f16* gb, int batch, int in, int out) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= out * in) return;
  const int o = k / in, i = k % in;
  float s = 0;
  for (int n = 0; n < batch; ++n) s += dz[n * out + o] * x[n * in + i];
  gw[k] = zerotk::from_float<f16>(zerotk::to_float(gw[k]) + s);
  if (i == 0) {
    float sb = 0;
    for (int n = 0; n < batch; ++n) sb += dz[n * out + o];
    gb[o] = zerotk::from_float<f16>(zerotk::to_float(gb[o]) + sb);
  }
}

__global__ void dense_dx(const float* dz, const f16* w, float* dx, int batch, int in, int out) {
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= batch * in) return;
  const int n = k / in, i = k % in;
  float s = 0;
  for (int o = 0; o < out; ++o) s += dz[n * out + o] * zerotk::to_float(w[o * in + i]);
  dx[k] = s;
}

unsigned blocks(int threads) { return static_cast<unsigned>((threads + 255) / 256); }

/// A device-resident activation: a float array of batch x features on the GPU.
using Act = zerotk::TrackedDeviceBuffer<float>;

struct Dense {
  int in, out, batch;
  bool relu;
  cudaStream_t stream;
  zerotk::Param<f16> w, b;
  const Act* x_ = nullptr;
  Act z_, y_, dx_;

  Dense(const std::string& name, int in_, int out_, bool relu_, int batch_, cudaStream_t s)
      : in(in_), out(out_), batch(batch_), relu(relu_), stream(s),
        w(name + ".weight", {std::size_t(out_), std::size_t(in_)}), b(name + ".bias", {std::size_t(out_)}),
        z_(std::size_t(batch_ * out_), zerotk::MemoryCategory::activations),
        y_(std::size_t(batch_ * out_), zerotk::MemoryCategory::activations),
        dx_(std::size_t(batch_ * in_), zerotk::MemoryCategory::activations) {}

  template <class Visit>
  void parameters(Visit&& visit) {
    visit(w.name(), w);
    visit(b.name(), b);
  }

  const Act* forward(const Act* x) {
    x_ = x;
    dense_forward<<<blocks(batch * out), 256, 0, stream>>>(x->data(), w.data(), b.data(), z_.data(), y_.data(), batch,
                                                           in, out, relu);
    ZEROTK_CUDA_CHECK_LAUNCH();
    return &y_;
  }

  /// dy is consumed (turned into dz in place); returns dx.
  Act* backward(Act* dy) {
    dense_dz<<<blocks(batch * out), 256, 0, stream>>>(z_.data(), dy->data(), batch * out, relu);
    dense_grads<<<blocks(out * in), 256, 0, stream>>>(x_->data(), dy->data(), w.grad(), b.grad(), batch, in, out);
    dense_dx<<<blocks(batch * in), 256, 0, stream>>>(dy->data(), w.data(), dx_.data(), batch, in, out);
    ZEROTK_CUDA_CHECK_LAUNCH();
    return &dx_;
  }
};

struct Model {
  std::vector<Dense> layers;
  template <class Visit>
  void parameters(Visit&& visit) {
    for (auto& l : layers) l.parameters(visit);
  }
};

/// The teacher of example 01: a fixed random function of 16 inputs with 4 outputs.
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

void copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
  ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
}

}  // namespace gpu_mlp

using namespace gpu_mlp;

int main(int argc, char** argv) {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::fprintf(stderr, "03_gpu_mlp: no usable CUDA device (cudaGetDeviceCount found %d)\n", gpus);
    return 2;
  }
  const int ranks = arg_int(argc, argv, "--ranks", gpus);
  const int steps = arg_int(argc, argv, "--steps", 300);
  if (ranks < 1 || ranks > gpus) {
    std::fprintf(stderr, "03_gpu_mlp: --ranks %d: must be between 1 and the %d visible GPUs\n", ranks, gpus);
    return 2;
  }
  constexpr int kBatch = 32;
  using Engine = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                                zerotk::Precision<zerotk::fp16>, zerotk::Bucketer<zerotk::Bytes<8 << 10>>,
                                zerotk::Device<zerotk::Cuda>>;
  double first = 0, last = 0;
  zerotk::comm::run_threads(ranks, [&](zerotk::comm::ThreadsCommunicator& boot) {
    ZEROTK_CUDA_CHECK(cudaSetDevice(boot.rank()));
    cudaStream_t stream = nullptr;
    ZEROTK_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    {
      auto gpu = zerotk::comm::NcclCommunicator::bootstrap(boot, boot.rank());
      Model model;
      model.layers.reserve(3);
      model.layers.emplace_back("fc0", 16, 64, true, kBatch, stream);
      model.layers.emplace_back("fc1", 64, 64, true, kBatch, stream);
      model.layers.emplace_back("fc2", 64, 4, false, kBatch, stream);
      zerotk::EngineOptions opt;
      opt.optimizer.lr = 3e-3f;
      opt.optimizer.weight_decay = 0.01f;
      opt.gradient_clipping = 1.0;
      opt.stream = stream;
      Engine engine(gpu, model, opt);  // every Param now points into GPU memory owned by the engine

      std::mt19937 init(1);
      for (auto& l : model.layers) {
        std::normal_distribution<float> nd(0.0f, std::sqrt(2.0f / float(l.in)));
        std::vector<f16> w(l.w.numel());
        for (auto& v : w) v = f16(nd(init));
        copy(l.w.data(), w.data(), w.size() * sizeof(f16), cudaMemcpyHostToDevice, stream);
      }
      ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
      engine.broadcast_parameters();

      Act x(kBatch * 16, zerotk::MemoryCategory::activations), dy(kBatch * 4, zerotk::MemoryCategory::activations);
      std::vector<float> hx(kBatch * 16), hy(kBatch * 4), hdy(kBatch * 4);
      std::mt19937 data(1234 + unsigned(boot.rank()));
      std::normal_distribution<float> nd;
      for (int s = 0; s < steps; ++s) {
        for (auto& v : hx) v = nd(data);
        const std::vector<float> t = teacher(hx);
        copy(x.data(), hx.data(), hx.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
        const Act* a = &x;
        for (auto& l : model.layers) {
          auto scope = engine.forward(l);
          a = l.forward(a);
        }
        copy(hy.data(), a->data(), hy.size() * sizeof(float), cudaMemcpyDeviceToHost, stream);
        ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));
        double loss = 0;
        const float seed = float(engine.loss_scale());
        for (std::size_t k = 0; k < hy.size(); ++k) {
          const float d = hy[k] - t[k];
          loss += 0.5 * d * d / kBatch;
          hdy[k] = d / kBatch * seed;
        }
        copy(dy.data(), hdy.data(), hdy.size() * sizeof(float), cudaMemcpyHostToDevice, stream);
        Act* g = &dy;
        for (auto it = model.layers.rbegin(); it != model.layers.rend(); ++it) {
          auto scope = engine.backward(*it);
          g = it->backward(g);
        }
        const zerotk::StepReport r = engine.step(loss);
        if (boot.rank() == 0) {
          if (s == 0) first = r.loss;
          last = r.loss;
          if (s % 50 == 0 || s + 1 == steps)
            std::printf("step %4d  loss %.5f  scale %8.0f  grad_norm %.4f  skipped %lld\n", s, r.loss, r.loss_scale,
                        r.grad_norm, static_cast<long long>(r.skipped_steps));
        }
      }
      if (boot.rank() == 0) {
        const auto& m = engine.memory();
        std::printf("GPU 0 memory: params16 %zu B, grads %zu B, master32 %zu B, optimizer %zu B, buckets %zu B\n",
                    m.live(zerotk::MemoryCategory::params16), m.live(zerotk::MemoryCategory::grads),
                    m.live(zerotk::MemoryCategory::master32), m.live(zerotk::MemoryCategory::optimizer_state),
                    m.live(zerotk::MemoryCategory::comm_buffers));
      }
    }
    ZEROTK_CUDA_CHECK(cudaStreamDestroy(stream));
  });
  const bool ok = last < 0.05 * first;
  std::printf("loss %.5f -> %.5f (%.1f%% of the first): %s\n", first, last, 100.0 * last / first,
              ok ? "PASS (below 5%)" : "FAIL (not below 5%)");
  return ok ? 0 : 1;
}
