#pragma once
/// \file zerotk/compress/quantized_collectives.hpp
/// ZeRO++'s quantized exchanges over host memory (compress/quantize.hpp's records):
///
/// - qwZ, `quantized_all_gather`: each rank quantizes its block (int8 symmetric, groups of
///   kWeightGroup), one all-gather of the records, every block dequantized, this rank's own too, so
///   every rank computes with the same values. Over a HierarchicalCommunicator the gather runs
///   through the levels like any other.
/// - qgZ, `QuantizedReduceScatter`: an average reduce-scatter through the topology's levels by
///   all-to-all (DeepSpeed's all_to_all_quant_reduce, generalised to 1-3 levels): at each level
///   every rank quantizes the s_l chunks it holds (int4 symmetric, groups of kGradientGroup), sends
///   chunk j to the group's member j, dequantizes and adds the s_l chunks it received in fp32, and
///   carries that sum to the next level; the top level's sum divided by W is the rank's block (the
///   flat reduce-scatter's block, to quantization error). Inside a node the full gradient moves as
///   int4, across nodes 1/s_0 of it. DeepSpeed's fallback: when the buffer (W n elements) is not a
///   multiple of 2 W, a plain reduce-scatter instead (counted in `fallbacks`).
/// Both run to completion in the call and return a completed Work. Bytes: the records' bytes on
/// the wire (ring convention: (s-1) records per all-to-all of s ranks), per level in `links`.

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/compress/quantize.hpp"
#include "zerotk/core/dtype.hpp"

namespace zerotk::compress {

/// qwZ's format: int8 symmetric, groups of 4096 (DeepSpeed adapts its group count to each tensor,
/// aiming below 8000 elements per group: "the optimal size is 4k").
inline constexpr quant::Format kWeightFormat{8, quant::Scheme::symmetric, 4096};
/// qgZ's format: int4 symmetric, groups of 512 (DeepSpeed groups each tensor by its longer
/// dimension, max(rows, cols, W) groups; zerotk's buckets have no shape, so a fixed size).
inline constexpr quant::Format kGradientFormat{4, quant::Scheme::symmetric, 512};

/// What a quantized exchange sent, by link level, and how often it fell back to a plain one.
struct QuantizedStats {
  std::uint64_t calls = 0, fallbacks = 0;
  comm::LinkStats links;  ///< by level of the topology (level 0 only without one)
  std::uint64_t wire_bytes() const noexcept {
    std::uint64_t t = 0;
    for (const auto& l : links.by_level) t += l.wire_bytes;
    return t;
  }
};

/// qwZ over `comm` (any communicator with rank(), size(), all_gather): recv = every rank's n values,
/// quantized. `scratch` holds W records. Counts the bytes into `stats` at `level` (the link level
/// the caller attributes the gather to; a hierarchical communicator splits it further itself).
template <class C, class T>
comm::Work quantized_all_gather(C& comm, const T* send, T* recv, std::size_t n, std::vector<std::uint8_t>& scratch,
                                QuantizedStats* stats = nullptr, const quant::Format& f = kWeightFormat) {
  const auto w = static_cast<std::size_t>(comm.size()), me = static_cast<std::size_t>(comm.rank());
  if (n == 0) return comm::Work{};
  const std::size_t rb = f.record_bytes(n);
  if (scratch.size() < w * rb) scratch.resize(w * rb);
  quant::quantize(send, n, f, scratch.data() + me * rb);
  comm.all_gather(scratch.data() + me * rb, scratch.data(), rb, DType::uint8).wait();  // in place
  for (std::size_t q = 0; q < w; ++q) quant::dequantize(scratch.data() + q * rb, n, f, recv + q * n);
  if (stats) {
    stats->calls += 1;
    stats->links[0].calls += 1;
    stats->links[0].steps += comm::ring_steps(comm::OpKind::all_gather, static_cast<int>(w));
    stats->links[0].wire_bytes += comm::ring_wire_bytes(comm::OpKind::all_gather, w * rb, static_cast<int>(w));
  }
  return comm::Work{};
}

/// qgZ over the levels of `topology` (see the file comment). `C` needs rank(), size(), split(),
/// all_to_all and reduce_scatter (the engine's data communicator, or any Communicator).
template <class C>
class QuantizedReduceScatter {
 public:
  /// Collective over `data` (which must outlive this): one communicator per level with fanout > 1,
  /// split from it (a flat topology uses `data` itself).
  QuantizedReduceScatter(C& data, comm::Topology topology, quant::Format f = kGradientFormat)
      : data_(&data), topo_(std::move(topology)), f_(f) {
    f_.check("zerotk::compress::QuantizedReduceScatter");
    if (topo_.size() != data.size()) {
      throw usage_error("the topology must describe the communicator's ranks", "zerotk::compress::QuantizedReduceScatter",
                        std::to_string(topo_.size()) + " ranks vs " + std::to_string(data.size()));
    }
    if (topo_.levels() == 1) return;
    for (int l = 0; l < topo_.levels(); ++l) {
      if (topo_.fanout(l) > 1) level_[static_cast<std::size_t>(l)].emplace(data.split(topo_.level_color(data.rank(), l), coordinate(l)));
    }
  }

  /// recv[0 .. n) = the average over ranks of block `rank` of send[0 .. W n), quantized per level.
  template <class T>
  comm::Work reduce_scatter_avg(const T* send, T* recv, std::size_t n) {
    const auto w = static_cast<std::size_t>(data_->size());
    stats_.calls += 1;
    if (n == 0) return comm::Work{};
    if ((w * n) % (2 * w) != 0) {  // DeepSpeed's rule: int4 pairs must not straddle two ranks' blocks
      stats_.fallbacks += 1;
      return data_->reduce_scatter(send, recv, n, dtype_of_v<T>, comm::ReduceOp::avg);
    }
    packed_.resize(w * n * sizeof(T));  // operator new's alignment holds any T
    const T* packed = reinterpret_cast<const T*>(packed_.data());
    comm::pack_blocks(topo_, send, n * sizeof(T), packed_.data());
    std::size_t span = w * n;
    bool first = true;
    for (int l = 0; l < topo_.levels(); ++l) {
      const int s = topo_.fanout(l);
      if (s == 1) continue;
      const std::size_t m = span / static_cast<std::size_t>(s), rb = f_.record_bytes(m);
      out_.resize(static_cast<std::size_t>(s) * rb);
      in_.resize(static_cast<std::size_t>(s) * rb);
      for (std::size_t j = 0; j < static_cast<std::size_t>(s); ++j) {
        if (first) {
          quant::quantize(packed + j * m, m, f_, out_.data() + j * rb);
        } else {
          quant::quantize(acc_.data() + j * m, m, f_, out_.data() + j * rb);
        }
      }
      level(l).all_to_all(out_.data(), in_.data(), rb, DType::uint8).wait();
      next_.assign(m, 0.0f);
      for (std::size_t j = 0; j < static_cast<std::size_t>(s); ++j) quant::dequantize_add(in_.data() + j * rb, m, f_, next_.data());
      acc_.swap(next_);
      count(l, s, rb);
      span = m;
      first = false;
    }
    const auto fw = static_cast<float>(w);  // avg: the sum divided once, as the flat reduce-scatter does
    for (std::size_t i = 0; i < n; ++i) recv[i] = first ? packed[i] : from_float<T>(acc_[i] / fw);
    return comm::Work{};
  }

  const QuantizedStats& stats() const noexcept { return stats_; }
  const comm::Topology& topology() const noexcept { return topo_; }

 private:
  int coordinate(int l) const noexcept { return topo_.coordinate(data_->rank(), l); }
  C& level(int l) { return topo_.levels() == 1 ? *data_ : *level_[static_cast<std::size_t>(l)]; }

  void count(int l, int s, std::size_t record_bytes) {
    comm::LinkCounters& c = stats_.links[l];
    c.calls += 1;
    c.steps += comm::ring_steps(comm::OpKind::all_to_all, s);
    c.wire_bytes += comm::ring_wire_bytes(comm::OpKind::all_to_all, static_cast<std::uint64_t>(s) * record_bytes, s);
  }

  C* data_;
  comm::Topology topo_;
  quant::Format f_;
  std::array<std::optional<C>, comm::kMaxTopologyLevels> level_;  // groups differing in one coordinate
  std::vector<std::byte> packed_;       // [W][n] T: the send blocks in packed order
  std::vector<std::uint8_t> out_, in_;  // [s][record] sent / received at one level
  std::vector<float> acc_, next_;       // fp32 partial sums
  QuantizedStats stats_;
};

}  // namespace zerotk::compress
