#pragma once
/// \file zerotk/device/concepts.hpp
/// EngineOps: the contract of what a Device tag selects, Ops<Device> (device/host_ops.hpp documents
/// each member; device/cuda_ops.cuh is the CUDA one). The engine and its parts touch parameter,
/// gradient and optimizer memory only through these members. `check_ops_v<O>` asserts them one by
/// one where the Engine picks its Ops (zerotk/engine.hpp), so an Ops that lacks one fails with a
/// first error line naming the concept and the member (tests/compile_fail/concept_ops.cpp).

#include <concepts>
#include <cstddef>
#include <span>

#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/memory.hpp"
#include "zerotk/kernels/elementwise.hpp"
#include "zerotk/kernels/tensor_list.hpp"

namespace zerotk::device {

template <class O>
concept EngineOps = requires(O& ops, const O& cops, float* f, const float* cf, std::size_t n, MemoryLedger* ledger,
                             comm::AnyCommunicator& c, const double* in, double* out,
                             std::span<const kernels::TensorRef<const float>> blocks, const kernels::NormGrid& grid,
                             kernels::FoldSums& sums) {
  typename O::Space;
  typename O::template Buffer<float>;
  { ops.template allocate<float>(n, MemoryCategory::other, ledger) } -> std::same_as<typename O::template Buffer<float>>;
  ops.zero(f, n);
  ops.accumulate(f, cf, n);
  ops.cast(cf, f, n);
  ops.divide(f, n, DType::fp32, 2);
  { ops.square_bound(blocks) } -> std::same_as<kernels::SquareBound>;
  ops.add_squares(blocks, grid, sums);
  ops.fence();
  cops.copy_to_host(cf, f, n);
  cops.copy_from_host(cf, f, n);
  ops.copy(cf, f, n);
  ops.all_reduce(c, in, out, n, comm::ReduceOp::sum);
};

template <class O>
consteval bool check_ops() {
  static_assert(requires { typename O::Space; }, "EngineOps: missing the member type Space (where its memory lives)");
  static_assert(requires { typename O::template Buffer<float>; }, "EngineOps: missing the member template Buffer<T>");
  static_assert(requires(O& o, std::size_t n, MemoryLedger* l) { o.template allocate<float>(n, MemoryCategory::other, l); },
                "EngineOps: missing allocate<T>(std::size_t n, MemoryCategory, MemoryLedger*)");
  static_assert(requires(O& o, float* f, const float* c, std::size_t n) {
                  o.zero(f, n);
                  o.accumulate(f, c, n);
                  o.cast(c, f, n);
                  o.divide(f, n, DType::fp32, 2);
                },
                "EngineOps: missing zero(p, n), accumulate(acc, x, n), cast(in, out, n) or "
                "divide(buf, n, dtype, divisor)");
  static_assert(requires(O& o, std::span<const kernels::TensorRef<const float>> b) { o.square_bound(b); },
                "EngineOps: missing square_bound(blocks) (phase 1 of the norm)");
  static_assert(requires(O& o, std::span<const kernels::TensorRef<const float>> b, const kernels::NormGrid& g,
                         kernels::FoldSums& s) { o.add_squares(b, g, s); },
                "EngineOps: missing add_squares(blocks, grid, sums) (phase 2 of the norm)");
  static_assert(requires(O& o) { o.fence(); }, "EngineOps: missing fence()");
  static_assert(requires(const O& o, O& m, const float* c, float* f, std::size_t n) {
                  o.copy_to_host(c, f, n);
                  o.copy_from_host(c, f, n);
                  m.copy(c, f, n);
                },
                "EngineOps: missing copy_to_host, copy_from_host or copy");
  static_assert(requires(O& o, comm::AnyCommunicator& c, const double* in, double* out, std::size_t n) {
                  o.all_reduce(c, in, out, n, comm::ReduceOp::sum);
                },
                "EngineOps: missing all_reduce(comm, const double* in, double* out, n, op)");
  static_assert(EngineOps<O>, "EngineOps: a member has the wrong signature (see device/concepts.hpp)");
  return true;
}
template <class O>
inline constexpr bool check_ops_v = check_ops<O>();

namespace detail {
template <class O>
struct checked_ops {
  static_assert(check_ops_v<O>);
  using type = O;
};
}  // namespace detail

/// The Ops `Device<Tag>` selects, checked against EngineOps here, where the tag picks it.
template <class O>
using checked_ops_t = typename detail::checked_ops<O>::type;

}  // namespace zerotk::device
