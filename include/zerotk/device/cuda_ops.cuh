#pragma once
/// \file zerotk/device/cuda_ops.cuh
/// Ops<Cuda>: the engine's data operations for `Device<Cuda>` (nvcc only; zerotk/engine.hpp includes
/// this file when nvcc compiles it), with the members of Ops<Host> (device/host_ops.hpp): buffers in
/// device memory (TrackedDeviceBuffer, recorded in the ledger under MemorySpace::device), the CUDA
/// kernels on the trainer's compute stream, collectives through a device-memory communicator
/// (NcclCommunicator) on its own stream.
///
/// Ordering, with S the compute stream (EngineOptions::stream) and C the communicator's stream:
/// - every engine kernel is queued on S, after the trainer's forward/backward work;
/// - before each collective, C waits on the GPU for everything queued on S so far (an event, placed
///   by `fence()`, which device/ordered.hpp calls inside every collective), so a bucket is reduced
///   only once backward wrote it and the host never blocks for that;
/// - the Engine waits for a collective's Work (host) before S touches its output (folding a reduced
///   bucket, reusing a pool buffer, the norm, the next forward after the all-gather), so S never
///   needs to wait on C.
/// Results the host needs (sums of squares, the 2-double norm/loss all-reduce) are copied back with
/// one synchronization of S per boundary.

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/core/cuda_memory.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/kernels/cuda/accumulate.cuh"
#include "zerotk/kernels/cuda/cast.cuh"
#include "zerotk/kernels/cuda/multi_tensor.cuh"
#include "zerotk/kernels/cuda/reduce.cuh"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/run_cuda.cuh"

namespace zerotk::device {

template <>
class Ops<Cuda> {
 public:
  using Space = CudaSpace;
  template <class T>
  using Buffer = TrackedDeviceBuffer<T>;
  /// `comm` must expose its stream and device (NcclCommunicator does); the calling thread's current
  /// device must be the communicator's.
  template <class C>
  static Ops create(C& comm, void* stream) {
    static_assert(requires {
      { comm.stream() } -> std::convertible_to<cudaStream_t>;
      { comm.device() } -> std::convertible_to<int>;
    }, "Engine<Device<Cuda>>: the communicator must expose stream() and device() (use NcclCommunicator)");
    int current = -1;
    ZEROTK_CUDA_CHECK(cudaGetDevice(&current));
    if (current != comm.device()) {
      throw usage_error("the calling thread's current CUDA device is not the communicator's (call cudaSetDevice("
                        + std::to_string(comm.device()) + ") first)",
                        "Engine<Device<Cuda>> on rank " + std::to_string(comm.rank()), std::to_string(current));
    }
    return Ops(static_cast<cudaStream_t>(stream), comm.stream());
  }

  template <class T>
  Buffer<T> allocate(std::size_t n, MemoryCategory category, MemoryLedger* ledger) {
    return Buffer<T>(n, category, ledger);
  }

  template <class T>
  void zero(T* p, std::size_t n) {
    if (n) ZEROTK_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(T), s_->stream));  // +0 in every float format
  }

  /// acc[i] = A(float(acc[i]) + float(x[i])) (kernels/cuda/accumulate.cuh).
  template <class A, class X>
  void accumulate(A* acc, const X* x, std::size_t n) {
    kernels::cuda::accumulate(acc, x, n, s_->stream);
  }

  template <class Src, class Dst>
  void cast(const Src* in, Dst* out, std::size_t n) {
    kernels::cuda::cast(in, out, n, s_->stream);
  }

  /// buf[i] = buf[i] / divisor on the compute stream, rounded as on the host (an average after a
  /// sum: OrderedCommunicator::mean_over). fp32, fp16 and bf16 elements.
  void divide(void* buf, std::size_t n, DType dt, int divisor) {
    switch (dt) {
      case DType::fp32: return kernels::cuda::divide(static_cast<float*>(buf), n, divisor, s_->stream);
      case DType::fp16: return kernels::cuda::divide(static_cast<half*>(buf), n, divisor, s_->stream);
      case DType::bf16: return kernels::cuda::divide(static_cast<bfloat16*>(buf), n, divisor, s_->stream);
      default:
        throw usage_error("divides fp32, fp16 or bf16 elements", "Ops<Cuda>::divide", std::string(to_string(dt)));
    }
  }

  /// Phase 1 of the norm over device blocks: one launch, one copy back, one synchronization.
  template <class T>
  kernels::SquareBound square_bound(std::span<const kernels::TensorRef<const T>> blocks) {
    kernels::SquareBound* d = s_->template room_for<kernels::SquareBound>();
    const kernels::SquareBound init{};
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(d, &init, sizeof init, cudaMemcpyHostToDevice, s_->stream));
    kernels::cuda::square_bound<T>(blocks, d, s_->ws, s_->stream);
    kernels::SquareBound out;
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(&out, d, sizeof out, cudaMemcpyDeviceToHost, s_->stream));
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(s_->stream));
    return out;
  }

  /// Phase 2: the blocks' fold sums added into `sums` (exact: any split or order gives the same bits).
  template <class T>
  void add_squares(std::span<const kernels::TensorRef<const T>> blocks, const kernels::NormGrid& grid,
                   kernels::FoldSums& sums) {
    kernels::FoldSums* d = s_->template room_for<kernels::FoldSums>();
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(d, &sums, sizeof sums, cudaMemcpyHostToDevice, s_->stream));
    kernels::cuda::add_squares<T>(blocks, grid, d, s_->ws, s_->stream);
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(&sums, d, sizeof sums, cudaMemcpyDeviceToHost, s_->stream));
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(s_->stream));
  }

  /// The communicator's stream waits (on the GPU) for everything queued on the compute stream.
  void fence() {
    ZEROTK_CUDA_CHECK(cudaEventRecord(s_->event, s_->stream));
    ZEROTK_CUDA_CHECK(cudaStreamWaitEvent(s_->comm_stream, s_->event, 0));
  }

  /// Page-locked host memory that copies go to and from (the offload stagings): registered with
  /// the driver, so cudaMemcpy moves it by DMA without a bounce buffer. Throws on refusal.
  void register_host(void* p, std::size_t bytes) const {
    if (bytes) ZEROTK_CUDA_CHECK(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
  }
  void unregister_host(void* p) const noexcept {
    if (p && cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
  }

  /// Copies between device memory and the host (state snapshots); synchronous.
  template <class T>
  void copy_to_host(const T* src, T* dst, std::size_t n) const {
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(s_->stream));
    if (n) ZEROTK_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost));
  }
  template <class T>
  void copy_from_host(const T* src, T* dst, std::size_t n) const {
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(s_->stream));
    if (n) ZEROTK_CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// Within device memory, ordered on the compute stream.
  template <class T>
  void copy(const T* src, T* dst, std::size_t n) {
    if (n) ZEROTK_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToDevice, s_->stream));
  }

  /// out = op over ranks of in (n host doubles), through device memory.
  template <class C>
  void all_reduce(C& c, const double* in, double* out, std::size_t n, comm::ReduceOp op) {
    double* d = s_->doubles(n);
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(d, in, n * sizeof(double), cudaMemcpyHostToDevice, s_->stream));
    fence();
    c.all_reduce(d, d, n, DType::fp64, op).wait();
    ZEROTK_CUDA_CHECK(cudaMemcpyAsync(out, d, n * sizeof(double), cudaMemcpyDeviceToHost, s_->stream));
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(s_->stream));
  }

  /// One fused optimizer step over this rank's partition (optim/run_cuda.cuh), on the compute stream;
  /// `reduce(double* device_sums, n)` is called between LAMB's phases.
  template <class Opt, class G, class P, class Reduce>
  void step(Opt& opt, std::span<const kernels::Segment> segments, float* master, const optim::Moments& moments,
            const G* grads, P* out, float grad_scale, Reduce&& reduce) {
    optim::Run<Opt, Space>::template step<G, P>(opt, segments, master, moments, grads, out, grad_scale, reduce,
                                                s_->stream, s_->ws);
  }

  cudaStream_t stream() const noexcept { return s_->stream; }

 private:
  struct State {
    cudaStream_t stream = nullptr;       // the trainer's compute stream (not owned)
    cudaStream_t comm_stream = nullptr;  // the communicator's (not owned)
    cudaEvent_t event = nullptr;
    kernels::cuda::Workspace ws;         // launch tables of the kernels on `stream`
    double* scratch = nullptr;           // device doubles for sums and the small all-reduce
    std::size_t scratch_count = 0;

    ~State() {
      if (scratch) cudaFree(scratch);
      if (event) cudaEventDestroy(event);
    }
    /// Device room for one T (norm results), from the same scratch.
    template <class T>
    T* room_for() {
      return reinterpret_cast<T*>(doubles((sizeof(T) + sizeof(double) - 1) / sizeof(double)));
    }
    double* doubles(std::size_t n) {
      if (n > scratch_count) {
        ZEROTK_CUDA_CHECK(cudaStreamSynchronize(stream));  // an earlier copy may still read it
        if (scratch) ZEROTK_CUDA_CHECK(cudaFree(scratch));
        scratch = nullptr;
        scratch_count = 0;
        ZEROTK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&scratch), n * sizeof(double)));
        scratch_count = n;
      }
      return scratch;
    }
  };

  Ops(cudaStream_t stream, cudaStream_t comm_stream) : s_(std::make_unique<State>()) {
    s_->stream = stream;
    s_->comm_stream = comm_stream;
    ZEROTK_CUDA_CHECK(cudaEventCreateWithFlags(&s_->event, cudaEventDisableTiming));
  }

  std::unique_ptr<State> s_;
};

}  // namespace zerotk::device
