#pragma once
/// \file zerotk/zero/params/optimizer_out.hpp
/// Where the optimizer writes the new working-precision values of the owned elements.
///
/// Usually that is memory: the flat buffer (stages 0-2), or stage 3's shard in the compute space or
/// in pinned host memory. A shard on disk (OffloadParams<Nvme>, offload/nvme_shard.hpp) is not
/// addressable, and neither is a pinned host shard for a device's kernels (OffloadParams<Cpu> on
/// Device<Cuda>); their homes hand out a writer instead, which the stores that step on the host
/// (offload/sub_group_steps.hpp) feed piece by piece:
///
///   put_out(ops, out, at, host, n)   out[at, at + n) := host[0, n)   (memory: Ops::copy_from_host)
///   end_sub_group(out)               a sub-group's pieces are all given (a writer may flush)
///
/// `P* out` is either a pointer to the elements or a pointer to a writer (OutputWriter<P>);
/// out_element_t<P> is the element type in both cases.

#include <concepts>
#include <cstddef>

namespace zerotk::zero {

template <class T>
struct OptimizerOut {
  T* base = nullptr;          ///< the elements, or the writer (OutputWriter<T>)
  bool owned_shaped = true;   ///< indexed like the master (else: the flat buffer)
};

/// A writer of values that are not addressable: write(at, host, n) copies n values from host
/// memory to owned offset `at`; end_sub_group() says a sub-group's pieces are all written.
template <class W>
concept OutputWriter = requires(W& w, std::size_t at, const typename W::value_type* host) {
  w.write(at, host, at);
  w.end_sub_group();
};

/// A writer into memory (`static constexpr bool kInMemory = true`: offload/pinned_shard.hpp's on a
/// device, whose shard is host memory the device's kernels cannot address): its writes cannot fail,
/// so the stores feed it from their plain sub-group loop, as they fill memory.
template <class W>
concept MemoryWriter = OutputWriter<W> && requires {
  { W::kInMemory } -> std::convertible_to<bool>;
} && W::kInMemory;

/// A writer whose writes can fail (a shard file, offload/nvme_shard.hpp): a store whose state steps
/// in place writes through it in two passes (offload/writer_passes.hpp), so that a failed write
/// leaves the state as it was.
template <class W>
concept FileWriter = OutputWriter<W> && !MemoryWriter<W>;

namespace detail {
template <class P>
struct out_element {
  using type = P;
};
template <OutputWriter W>
struct out_element<W> {
  using type = typename W::value_type;
};
}  // namespace detail

/// The element type an output `P*` receives.
template <class P>
using out_element_t = typename detail::out_element<P>::type;

/// out[at, at + n) := host[0, n).
template <class Ops, class P>
void put_out(Ops& ops, P* out, std::size_t at, const out_element_t<P>* host, std::size_t n) {
  if constexpr (OutputWriter<P>) {
    out->write(at, host, n);
  } else {
    ops.copy_from_host(host, out + at, n);
  }
}

/// The pieces of one sub-group have all been put.
template <class P>
void end_sub_group(P* out) {
  if constexpr (OutputWriter<P>) out->end_sub_group();
}

}  // namespace zerotk::zero
