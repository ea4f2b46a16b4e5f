#pragma once
/// \file zerotk/device/host_async_ops.hpp
/// Ops<HostAsync>: the engine's data operations for `Device<HostAsync>`, a GPU's execution model on
/// host memory (core/host_async.hpp), with the members and the ordering of Ops<Cuda>
/// (device/cuda_ops.cuh), so CI runs the orchestration the GPU runs:
/// - every operation is enqueued on the trainer's compute stream S (EngineOptions::stream, a
///   host_async::Stream*) and runs later on its worker, with the host kernels of Ops<Host>;
/// - before each collective the communicator's stream C waits for what S has queued so far (an
///   event placed by fence(), which device/ordered.hpp calls inside every collective);
/// - the host waits for a collective's Work before S touches its buffers: each operation checks the
///   bytes it reads and writes against the collectives in flight and throws a usage_error naming both
///   where a GPU would race (host_async::InFlight), and that they are the device's memory (a kernel
///   given host memory is refused, as a GPU would fault);
/// - results the host reads (the norm's two phases) and copies to and from the host synchronize S.
/// The communicator is a comm::StreamCommunicator over the same device. docs/device.md.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/detail/reduce.hpp"
#include "zerotk/comm/stream_communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/host_async.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/device/host_ops.hpp"
#include "zerotk/kernels/host/accumulate.hpp"
#include "zerotk/kernels/host/adam.hpp"
#include "zerotk/kernels/host/cast.hpp"
#include "zerotk/kernels/host/elementwise_step.hpp"
#include "zerotk/kernels/host/lamb.hpp"
#include "zerotk/kernels/host/reduce.hpp"
#include "zerotk/kernels/tensor_list.hpp"
#include "zerotk/optim/optimizer.hpp"
#include "zerotk/policies.hpp"

namespace zerotk::device {

template <>
class Ops<HostAsync> {
 public:
  using Space = HostAsyncSpace;
  template <class T>
  using Buffer = BasicTrackedBuffer<T, HostAsyncSpace>;

  /// `comm` must run on a stream of a host_async device (comm::StreamCommunicator), that device must
  /// be the calling thread's current one, and `stream` the trainer's compute stream on it.
  template <class C>
  static Ops create(C& comm, void* stream) {
    constexpr bool on_stream = requires {
      { comm.stream() } -> std::convertible_to<host_async::Stream&>;
      { comm.device() } -> std::convertible_to<const host_async::Device&>;
    };
    static_assert(on_stream, "Engine<Device<HostAsync>>: the communicator must run on a host_async stream (use "
                             "comm::StreamCommunicator)");
    if constexpr (on_stream) {
      const std::string where = "Engine<Device<HostAsync>> on rank " + std::to_string(comm.rank());
      if (stream == nullptr) {
        throw usage_error("Device<HostAsync> needs the trainer's compute stream (a host_async::Stream* in "
                          "EngineOptions::stream): the engine's work is ordered after the trainer's on it",
                          where, "EngineOptions::stream = nullptr");
      }
      if (!host_async::is_current(comm.device())) {
        throw usage_error("the communicator's host_async device is not the calling thread's current one (make it "
                          "current with host_async::CurrentDevice first)",
                          where, "StreamCommunicator's device");
      }
      return Ops(comm.device(), *static_cast<host_async::Stream*>(stream), comm.stream());
    } else {
      std::abort();  // refused above
    }
  }

  template <class T>
  Buffer<T> allocate(std::size_t n, MemoryCategory category, MemoryLedger* ledger) {
    return Buffer<T>(n, category, ledger);
  }

  template <class T>
  void zero(T* p, std::size_t n) {
    check("zero", {}, {range(p, n)});
    enqueue([p, n] { std::fill_n(p, n, T{}); });
  }

  /// acc[i] = A(float(acc[i]) + float(x[i])) (kernels/host/accumulate.hpp).
  template <class A, class X>
  void accumulate(A* acc, const X* x, std::size_t n) {
    check("accumulate", {range(x, n), range(acc, n)}, {range(acc, n)});
    enqueue([acc, x, n] { kernels::host::accumulate(acc, x, n); });
  }

  template <class Src, class Dst>
  void cast(const Src* in, Dst* out, std::size_t n) {
    check("cast", {range(in, n)}, {range(out, n)});
    enqueue([in, out, n] { kernels::host::cast(in, out, n); });
  }

  /// buf[i] = buf[i] / divisor (the host's arithmetic: comm::detail::divide_in_place), on S.
  void divide(void* buf, std::size_t n, DType dt, int divisor) {
    const host_async::Range r = range(static_cast<const std::byte*>(buf), n * size_of(dt));
    check("divide", {r}, {r});
    enqueue([buf, n, dt, divisor] { comm::detail::divide_in_place(buf, n, dt, divisor); });
  }

  /// Phase 1 of the norm: computed on S, read by the host after S reached it.
  template <class T>
  kernels::SquareBound square_bound(std::span<const kernels::TensorRef<const T>> blocks) {
    std::vector<kernels::TensorRef<const T>> copy(blocks.begin(), blocks.end());
    check_blocks("square_bound", copy);
    auto result = std::make_shared<kernels::SquareBound>();
    enqueue([copy = std::move(copy), result] {
      *result = kernels::host::square_bound<T>(std::span<const kernels::TensorRef<const T>>(copy));
    });
    sync_unless(host_async::Drop::result_sync);
    return *result;
  }

  /// Phase 2: the blocks' squares added into `sums` on S; the host reads them after S reached it.
  template <class T>
  void add_squares(std::span<const kernels::TensorRef<const T>> blocks, const kernels::NormGrid& grid,
                   kernels::FoldSums& sums) {
    std::vector<kernels::TensorRef<const T>> copy(blocks.begin(), blocks.end());
    check_blocks("add_squares", copy);
    auto result = std::make_shared<kernels::FoldSums>(sums);
    enqueue([copy = std::move(copy), grid, result] {
      kernels::host::add_squares<T>(std::span<const kernels::TensorRef<const T>>(copy), grid, *result);
    });
    sync_unless(host_async::Drop::result_sync);
    sums = *result;
  }

  /// The communicator's stream waits for everything queued on S so far (cudaStreamWaitEvent).
  void fence() {
    if (s_->device.options().drop == host_async::Drop::fence) return;
    s_->comm_stream.wait(s_->stream.record());
  }

  /// Host memory copies go to and from directly: nothing to register.
  void register_host(void*, std::size_t) const noexcept {}
  void unregister_host(void*) const noexcept {}

  /// Copies between this space and host memory (state snapshots, offload stagings): synchronous,
  /// after S ran everything queued (cudaMemcpy after a stream synchronize).
  template <class T>
  void copy_to_host(const T* src, T* dst, std::size_t n) const {
    check_copy("copy_to_host", range(src, n), false);
    sync_unless(host_async::Drop::copy_sync);
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
  template <class T>
  void copy_from_host(const T* src, T* dst, std::size_t n) const {
    check_copy("copy_from_host", range(dst, n), true);
    sync_unless(host_async::Drop::copy_sync);
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
  /// Within device memory, ordered on S.
  template <class T>
  void copy(const T* src, T* dst, std::size_t n) {
    check("copy", {range(src, n)}, {range(dst, n)});
    enqueue([src, dst, n] { std::copy_n(src, n, dst); });
  }

  /// out = op over ranks of in (n host doubles), through device memory: copied in on S, reduced
  /// on the communicator's stream after S, copied back, S synchronized (as Ops<Cuda>).
  template <class C>
  void all_reduce(C& c, const double* in, double* out, std::size_t n, comm::ReduceOp op) {
    double* d = doubles(n);
    std::vector<double> staged(in, in + n);
    enqueue([d, staged = std::move(staged)] { std::copy(staged.begin(), staged.end(), d); });
    fence();
    c.all_reduce(d, d, n, DType::fp64, op).wait();
    auto back = std::make_shared<std::vector<double>>(n);
    enqueue([d, back] { std::copy_n(d, back->size(), back->data()); });
    s_->stream.synchronize();
    std::copy(back->begin(), back->end(), out);
  }

  /// One fused optimizer step over this rank's partition, on S: the step's constants and count on
  /// the host (as on the GPU), the kernels of Ops<Host> on the stream. LAMB: phase 1, the reducer
  /// (`reduce(double* sums, n)`: a collective ordered after phase 1 by its fence), phase 2.
  template <class Opt, class G, class P, class Reduce>
  void step(Opt& opt, std::span<const kernels::Segment> segments, float* master, const optim::Moments& moments,
            const G* grads, P* out, float grad_scale, Reduce&& reduce) {
    std::vector<kernels::Segment> segs(segments.begin(), segments.end());
    check_step(segs, master, moments, grads, out);
    if constexpr (std::is_same_v<Opt, Optimizer<Lamb>>) {
      const std::size_t tensors = opt.check_step(segments, master, moments, grads);
      auto consts = std::make_shared<const std::vector<kernels::LambStepConsts>>(opt.step_consts());
      opt.advance();
      const std::span<double> sums(doubles(2 * tensors), 2 * tensors);  // device memory, as on the GPU
      auto shared = std::make_shared<const std::vector<kernels::Segment>>(std::move(segs));
      enqueue([shared, consts, master, moments, grads, grad_scale, sums] {
        std::fill(sums.begin(), sums.end(), 0.0);
        kernels::host::lamb_phase1<G>(*shared, *consts, master, moments.m, moments.v, grads, grad_scale, sums);
      });
      reduce(sums.data(), sums.size());
      enqueue([shared, consts, master, moments, out, sums] {
        kernels::host::lamb_phase2<P>(*shared, *consts, master, moments.m, moments.v, out, sums);
      });
    } else if constexpr (std::is_same_v<Opt, Optimizer<Adam>> || std::is_same_v<Opt, Optimizer<AdamW>>) {
      opt.check_step(segments, master, moments, grads);
      std::vector<kernels::AdamStepConsts> consts = opt.step_consts();
      opt.advance();
      enqueue([segs = std::move(segs), consts = std::move(consts), master, moments, grads, out, grad_scale] {
        kernels::host::fused_adam<G, P>(segs, consts, master, moments.m, moments.v, grads, out, grad_scale);
      });
    } else {
      static_assert(optim::ElementwiseOptimizer<Opt>,
                    "Device<HostAsync>: this optimizer has no kernels on a device (Adam, AdamW, Lamb and the "
                    "elementwise optimizers such as Lion have)");
      using Rule = typename Opt::rule;
      opt.check_step(segments, master, moments, grads);
      std::vector<typename Rule::Consts> consts = opt.step_consts();
      opt.advance();
      enqueue([segs = std::move(segs), consts = std::move(consts), master, moments, grads, out, grad_scale] {
        kernels::host::elementwise_step<Rule, G, P>(segs, consts, master, moments.m, moments.v, grads, out, grad_scale);
      });
    }
  }

  /// The compute stream (EngineOptions::stream).
  host_async::Stream& stream() const noexcept { return s_->stream; }

 private:
  struct State {
    host_async::Device device;
    host_async::Stream stream;       // the trainer's compute stream (shared)
    host_async::Stream comm_stream;  // the communicator's
    Buffer<double> scratch;          // device doubles: LAMB's sums, the small all-reduce
  };

  /// `n` device doubles (grown on demand; freeing the old one waits for the device).
  double* doubles(std::size_t n) {
    if (n > s_->scratch.size()) s_->scratch = Buffer<double>(n, MemoryCategory::other, nullptr);
    return s_->scratch.data();
  }

  Ops(host_async::Device device, host_async::Stream stream, host_async::Stream comm_stream)
      : s_(std::make_shared<State>(State{std::move(device), std::move(stream), std::move(comm_stream), {}})) {}

  template <class F>
  void enqueue(F&& f) {
    s_->stream.enqueue(std::forward<F>(f));
  }
  void sync_unless(host_async::Drop drop) const {
    if (s_->device.options().drop != drop) s_->stream.synchronize();
  }

  template <class T>
  static host_async::Range range(const T* p, std::size_t n) noexcept {
    if constexpr (std::is_void_v<T>) {
      return {};
    } else {
      return {p, p ? n * sizeof(T) : 0};
    }
  }
  /// A kernel's ranges: the device's memory, and no collective in flight on them.
  void check(const char* op, std::initializer_list<host_async::Range> reads,
             std::initializer_list<host_async::Range> writes) const {
    s_->device.require_device_memory(op, reads);
    s_->device.require_device_memory(op, writes);
    s_->device.in_flight().check(op, reads, writes);
  }
  /// A copy's device side.
  void check_copy(const char* op, host_async::Range device_side, bool writes) const {
    s_->device.require_device_memory(op, {device_side});
    if (writes) {
      s_->device.in_flight().check(op, {}, {device_side});
    } else {
      s_->device.in_flight().check(op, {device_side}, {});
    }
  }
  template <class T>
  void check_blocks(const char* op, const std::vector<kernels::TensorRef<const T>>& blocks) const {
    for (const auto& b : blocks) check(op, {range(b.data, b.numel)}, {});
  }
  template <class G, class P>
  void check_step(const std::vector<kernels::Segment>& segs, const float* master, const optim::Moments& mv,
                  const G* grads, const P* out) const {
    for (const kernels::Segment& s : segs) {
      const host_async::Range state[] = {range(master + s.offset, s.numel),
                                         range(mv.m ? mv.m + s.offset : nullptr, s.numel),
                                         range(mv.v ? mv.v + s.offset : nullptr, s.numel)};
      check("step", {range(grads + s.grad_at(), s.numel), state[0], state[1], state[2]},
            {state[0], state[1], state[2], out_range(out, s)});
    }
  }
  template <class P>
  static host_async::Range out_range(const P* out, const kernels::Segment& s) noexcept {
    if constexpr (std::is_void_v<P>) {
      return {};
    } else {
      return out ? range(out + s.out_at(), s.numel) : host_async::Range{};
    }
  }

  std::shared_ptr<State> s_;
};

}  // namespace zerotk::device
