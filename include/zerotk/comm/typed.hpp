#pragma once
/// \file zerotk/comm/typed.hpp
/// Typed conveniences over any Communicator: the dtype comes from the element type and sizes are
/// checked against the communicator's size before anything starts.
///
///   std::vector<float> grad(n);
///   zerotk::comm::all_reduce(comm, grad, zerotk::comm::ReduceOp::avg).wait();   // in place
///   bool overflow = zerotk::comm::all_reduce_value(comm, local_overflow ? 1 : 0, ReduceOp::max) != 0;
///
/// Buffers are any contiguous sized range (std::vector, std::span, std::array) of float, half,
/// bfloat16, double, std::int32_t or std::uint8_t. For a device-memory communicator (NCCL) pass
/// spans over device memory; all_reduce_value needs host memory.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"

namespace zerotk::comm {

/// Element types the communicators move.
template <class T>
concept CommElement = std::same_as<T, float> || std::same_as<T, half> || std::same_as<T, bfloat16> ||
                      std::same_as<T, double> || std::same_as<T, std::int32_t> || std::same_as<T, std::uint8_t>;

/// A contiguous, sized range of CommElement (read).
template <class R>
concept InputBuffer =
    std::ranges::contiguous_range<R> && std::ranges::sized_range<R> && CommElement<std::ranges::range_value_t<R>>;

/// An InputBuffer whose elements can be written.
template <class R>
concept OutputBuffer =
    InputBuffer<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

/// True for communicators whose buffers live in device memory (specialized by NcclCommunicator).
template <class C>
inline constexpr bool uses_device_memory = false;

namespace detail {

template <class R>
using element_t = std::ranges::range_value_t<R>;

template <class S, class R>
concept SameElement = std::same_as<element_t<S>, element_t<R>>;

inline void check_size(bool ok, const char* fn, std::size_t got, std::size_t want, const char* what) {
  if (!ok) {
    throw usage_error(std::string(what) + " has the wrong number of elements",
                      std::string("zerotk::comm::") + fn, std::to_string(got) + ", expected " + std::to_string(want));
  }
}

inline std::size_t block_of(std::size_t total, int world, const char* fn) {
  const auto w = static_cast<std::size_t>(world);
  check_size(total % w == 0, fn, total, (total / w + 1) * w, "the flat buffer (a multiple of the world size)");
  return total / w;
}

}  // namespace detail

/// In-place all-reduce of `buf`.
template <Communicator C, OutputBuffer R>
Work all_reduce(C& c, R&& buf, ReduceOp op = ReduceOp::sum) {
  using T = detail::element_t<R>;
  return c.all_reduce(std::ranges::data(buf), std::ranges::data(buf), std::ranges::size(buf), dtype_of_v<T>, op);
}

template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work all_reduce(C& c, const S& send, R&& recv, ReduceOp op = ReduceOp::sum) {
  const std::size_t n = std::ranges::size(send);
  detail::check_size(std::ranges::size(recv) == n, "all_reduce", std::ranges::size(recv), n, "recv");
  return c.all_reduce(std::ranges::data(send), std::ranges::data(recv), n, dtype_of_v<detail::element_t<R>>, op);
}

/// `send` holds size() blocks of recv.size() elements; rank r receives the reduction of block r.
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work reduce_scatter(C& c, const S& send, R&& recv, ReduceOp op = ReduceOp::sum) {
  const std::size_t n = std::ranges::size(recv), want = n * static_cast<std::size_t>(c.size());
  detail::check_size(std::ranges::size(send) == want, "reduce_scatter", std::ranges::size(send), want, "send");
  return c.reduce_scatter(std::ranges::data(send), std::ranges::data(recv), n, dtype_of_v<detail::element_t<R>>, op);
}

/// ZeRO layout: `flat` is size() equal partitions; this rank's partition receives the reduction of
/// everyone's copy of it (the other partitions are unspecified afterwards).
template <Communicator C, OutputBuffer R>
Work reduce_scatter_in_place(C& c, R&& flat, ReduceOp op = ReduceOp::sum) {
  const std::size_t n = detail::block_of(std::ranges::size(flat), c.size(), "reduce_scatter_in_place");
  auto* p = std::ranges::data(flat);
  return c.reduce_scatter(p, p + static_cast<std::size_t>(c.rank()) * n, n, dtype_of_v<detail::element_t<R>>, op);
}

/// recv = the ranks' `send` blocks concatenated in rank order.
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work all_gather(C& c, const S& send, R&& recv) {
  const std::size_t n = std::ranges::size(send), want = n * static_cast<std::size_t>(c.size());
  detail::check_size(std::ranges::size(recv) == want, "all_gather", std::ranges::size(recv), want, "recv");
  return c.all_gather(std::ranges::data(send), std::ranges::data(recv), n, dtype_of_v<detail::element_t<R>>);
}

/// ZeRO layout: every rank's partition of `flat` (already in place) is gathered into everyone's `flat`.
template <Communicator C, OutputBuffer R>
Work all_gather_in_place(C& c, R&& flat) {
  const std::size_t n = detail::block_of(std::ranges::size(flat), c.size(), "all_gather_in_place");
  auto* p = std::ranges::data(flat);
  return c.all_gather(p + static_cast<std::size_t>(c.rank()) * n, p, n, dtype_of_v<detail::element_t<R>>);
}

/// Variable blocks: rank r contributes recv_counts[r] elements (its `send`).
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work all_gatherv(C& c, const S& send, R&& recv, std::span<const std::size_t> recv_counts) {
  std::size_t total = 0;
  for (std::size_t k : recv_counts) total += k;
  detail::check_size(std::ranges::size(recv) == total, "all_gatherv", std::ranges::size(recv), total, "recv");
  return c.all_gatherv(std::ranges::data(send), std::ranges::size(send), std::ranges::data(recv), recv_counts,
                       dtype_of_v<detail::element_t<R>>);
}

template <Communicator C, OutputBuffer R>
Work broadcast(C& c, R&& buf, int root) {
  return c.broadcast(std::ranges::data(buf), std::ranges::size(buf), dtype_of_v<detail::element_t<R>>, root);
}

/// `recv` is written on `root` only (pass an empty range elsewhere).
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work reduce(C& c, const S& send, R&& recv, ReduceOp op, int root) {
  const std::size_t n = std::ranges::size(send);
  if (c.rank() == root) detail::check_size(std::ranges::size(recv) == n, "reduce", std::ranges::size(recv), n, "recv");
  return c.reduce(std::ranges::data(send), std::ranges::data(recv), n, dtype_of_v<detail::element_t<R>>, op, root);
}

/// `send` and `recv` hold size() blocks of equal length; block d of `send` goes to rank d.
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work all_to_all(C& c, const S& send, R&& recv) {
  const std::size_t total = std::ranges::size(send);
  detail::check_size(std::ranges::size(recv) == total, "all_to_all", std::ranges::size(recv), total, "recv");
  const std::size_t n = detail::block_of(total, c.size(), "all_to_all");
  return c.all_to_all(std::ranges::data(send), std::ranges::data(recv), n, dtype_of_v<detail::element_t<R>>);
}

/// Variable blocks: block d of `send` (send_counts[d] elements) goes to rank d; `recv` holds what
/// every rank sends here, rank after rank (recv_counts[s] from rank s).
template <Communicator C, InputBuffer S, OutputBuffer R>
  requires detail::SameElement<S, R>
Work all_to_all_v(C& c, const S& send, std::span<const std::size_t> send_counts, R&& recv,
                  std::span<const std::size_t> recv_counts) {
  std::size_t sent = 0, received = 0;
  for (std::size_t k : send_counts) sent += k;
  for (std::size_t k : recv_counts) received += k;
  detail::check_size(std::ranges::size(send) == sent, "all_to_all_v", std::ranges::size(send), sent, "send");
  detail::check_size(std::ranges::size(recv) == received, "all_to_all_v", std::ranges::size(recv), received, "recv");
  return c.all_to_all_v(std::ranges::data(send), send_counts, std::ranges::data(recv), recv_counts,
                        dtype_of_v<detail::element_t<R>>);
}

template <Communicator C, InputBuffer S>
Work send(C& c, const S& buf, int peer, int tag = 0) {
  return c.send(std::ranges::data(buf), std::ranges::size(buf), dtype_of_v<detail::element_t<S>>, peer, tag);
}

template <Communicator C, OutputBuffer R>
Work recv(C& c, R&& buf, int peer, int tag = 0) {
  return c.recv(std::ranges::data(buf), std::ranges::size(buf), dtype_of_v<detail::element_t<R>>, peer, tag);
}

/// Blocking all-reduce of one host value: overflow flags, norms, counters.
template <Communicator C, CommElement T>
T all_reduce_value(C& c, T value, ReduceOp op) {
  static_assert(!uses_device_memory<C>, "all_reduce_value: this communicator needs device buffers; use all_reduce");
  T out = value;
  c.all_reduce(&out, &out, 1, dtype_of_v<T>, op).wait();
  return out;
}

}  // namespace zerotk::comm
