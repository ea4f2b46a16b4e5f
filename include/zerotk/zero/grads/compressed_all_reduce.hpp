#pragma once
/// \file zerotk/zero/grads/compressed_all_reduce.hpp
/// Stage 0's gradient path with GradientCompression<TopK|TwoBit|Sign>: instead of all-reducing the
/// dense gradient, every rank sends a compressed payload of it with error feedback, gathers every
/// other rank's payload, and sums the decoded payloads in rank order (sparse and quantised payloads
/// cannot be summed on the wire). At the optimizer boundary (the only schedule: engine/compat.hpp):
///
///   1. x = this rank's accumulated gradient (fp32; 16-bit gradients are widened exactly).
///      Every rank checks that x + err is finite everywhere; one all-reduce (max) of that flag makes
///      the answer every rank's. If any rank has inf or NaN, every rank's gradient becomes NaN (as a
///      dense all-reduce would make it), the engine's overflow check skips the step, and the error
///      buffers stay as they were: a skipped step changes nothing here.
///   2. For each bucket k, last to first (the order the dense path reduces them):
///        payload_r = Codec.encode(x_k, err_k)                 err_k = x_k + err_k - decode(payload_r)
///        frame_r   = payload_r, or with huffman_coding a mode byte (0 raw, 1 Huffman) followed by
///                    the smaller of payload_r and its Huffman code, raw on a tie (top-k's indices
///                    as gaps in both modes)
///        gather every rank's frame (all_gather; with Huffman all_gather of the frame sizes, then
///        all_gatherv), then  g_k = (decode(frame_0) + decode(frame_1) + ... + decode(frame_{W-1})) / W
///      in fp32, ranks in order (rank 0's decoded, then Codec.decode_add of each later rank), rounded
///      once to the working precision. Every rank computes the same bits.
///   Bucket k's exchange is in flight while bucket k-1 is encoded (two frame slots).
///
/// With GradientCompression<TopK> and topk_ratio = 1 the payload is lossless and the result equals the
/// threads communicator's dense average bit for bit (tests/engine/test_gradient_compression.cpp).
///
/// Wire bytes (what this rank sends, ring convention, counted by the communicator and mirrored by
/// `wire_bytes()`): the flag all-reduce (16 (W-1)/W bytes), then per bucket (W-1)/W x W x frame bytes
/// (an all_gather of equal frames), or with Huffman 8 (W-1) for the sizes plus all_gatherv's ring
/// count of the frames. `dense_bytes()` is what the dense all-reduce would have sent.
/// Memory (ledger): the fp32 error buffer [flat numel] under `grads`; with 16-bit gradients an fp32
/// staging copy [flat numel] and two frame slots (a send frame and W receive frames each) under
/// `comm_buffers`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "zerotk/comm/accounting.hpp"
#include "zerotk/compress/gradient_options.hpp"
#include "zerotk/compress/huffman.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/compress/topk.hpp"
#include "zerotk/compress/two_bit.hpp"
#include "zerotk/core/dtype.hpp"
#include "zerotk/policies.hpp"
#include "zerotk/zero/grads/context.hpp"

namespace zerotk::zero {

/// The codec a GradientCompression tag selects, made from the run-time options.
template <class Tag>
struct CodecOf;
template <>
struct CodecOf<TopK> {
  using type = compress::TopKCodec;
  static type make(const compress::GradientCompressionOptions& o) { return type(compress::TopKOptions{o.topk_ratio}); }
};
template <>
struct CodecOf<TwoBit> {
  using type = compress::TwoBitCodec;
  static type make(const compress::GradientCompressionOptions&) { return {}; }
};
template <>
struct CodecOf<Sign> {
  using type = compress::SignCodec;
  static type make(const compress::GradientCompressionOptions&) { return {}; }
};

/// An error-feedback codec whose payloads can be added into a running sum.
template <class C>
concept SummableCodec = compress::ErrorFeedbackCodec<C> &&
    requires(const C& c, std::span<const std::uint8_t> in, std::span<float> sum) { c.decode_add(in, sum); };

namespace detail {
/// Frames with huffman_coding: the mode byte in front of the payload.
inline constexpr std::uint8_t kFrameRaw = 0, kFrameHuffman = 1;
}  // namespace detail

template <class T, class Ops, class Tag>
class CompressedAllReduce {
  using Codec = typename CodecOf<Tag>::type;
  static_assert(SummableCodec<Codec>);
  static constexpr bool kWide = std::is_same_v<T, float>;  // fp32 gradients: encode and sum in place
  static constexpr bool kTopK = std::is_same_v<Tag, TopK>;

 public:
  using value_type = T;

  explicit CompressedAllReduce(const PathContext<Ops>& c)
      : c_(c), grads_(c), codec_(CodecOf<Tag>::make(options_of(c))), huffman_(options_of(c).huffman_coding),
        err_(c.ops->template allocate<float>(c.layout->flat_numel(), MemoryCategory::grads, c.ledger)) {
    if constexpr (!kWide) {
      x32_ = c.ops->template allocate<float>(c.layout->flat_numel(), MemoryCategory::comm_buffers, c.ledger);
    }
    std::size_t max_numel = 0;
    for (const Bucket& b : c.layout->buckets()) max_numel = std::max(max_numel, b.numel);
    const std::size_t payload = codec_.payload_bytes(max_numel);
    frame_capacity_ = huffman_ ? 1 + std::max(payload, compress::huffman::max_encoded_bytes(payload)) : payload;
    const auto w = static_cast<std::size_t>(c.world());
    for (Slot& s : slots_) {
      s.send = c.ops->template allocate<std::uint8_t>(frame_capacity_, MemoryCategory::comm_buffers, c.ledger);
      s.recv = c.ops->template allocate<std::uint8_t>(w * frame_capacity_, MemoryCategory::comm_buffers, c.ledger);
      s.sizes.assign(w, 0);
    }
    if (huffman_) payload_scratch_ = c.ops->template allocate<std::uint8_t>(payload, MemoryCategory::comm_buffers, c.ledger);
  }

  void open(std::size_t k, bool first_micro_step) { grads_.open(k, first_micro_step); }
  T* bucket_grads(std::size_t k) { return grads_.bucket(k); }
  void ready(std::size_t) {}  // everything happens at the boundary

  void end_micro_step(bool boundary) {
    if (!boundary || c_.layout->buckets().empty()) return;  // the same on every rank: no flag exchanged
    if (!all_finite()) {
      poison();
      return;
    }
    const auto& buckets = c_.layout->buckets();
    std::size_t next = 0;
    for (std::size_t k = buckets.size(); k-- > 0;) {
      Slot& s = slots_[next];
      if (s.busy) finish(s);
      start(s, k);
      next ^= 1u;
    }
    for (std::size_t i = 0; i < slots_.size(); ++i) {  // the older slot first
      Slot& s = slots_[next];
      if (s.busy) finish(s);
      next ^= 1u;
    }
  }

  OwnedGrads<T> owned() const { return {grads_.data(), nullptr, true}; }
  void clear_accumulated() {}
  void drain_quietly() noexcept {
    for (Slot& s : slots_) {
      try {
        if (s.busy) s.work.wait();
      } catch (...) {
      }
      s.busy = false;
    }
  }

  /// Bytes this rank sent for the gradients since construction, and what the dense all-reduce of
  /// the same buckets would have sent (both in the communicator's ring convention).
  std::uint64_t wire_bytes() const noexcept { return wire_bytes_; }
  std::uint64_t dense_bytes() const noexcept { return dense_bytes_; }
  /// Raw payload bytes and frame bytes this rank produced since construction (equal without Huffman).
  std::uint64_t payload_bytes_sent() const noexcept { return payload_bytes_; }
  std::uint64_t frame_bytes_sent() const noexcept { return frame_bytes_; }

  /// Zeroes the error feedback (after the state was replaced by one without this rank's residual:
  /// a resharded checkpoint; nothing of the old run's residual belongs to the restored parameters).
  void reset() { std::fill(err_.data(), err_.data() + err_.size(), 0.0f); }
  std::span<const float> error_feedback() const noexcept { return {err_.data(), err_.size()}; }
  /// Restores what error_feedback() showed (a checkpoint of this rank, same layout).
  void load_error_feedback(std::span<const float> e) {
    if (e.size() != err_.size()) {
      throw usage_error("error feedback of another size (another model or bucket layout?)", "zero::CompressedAllReduce",
                        std::to_string(e.size()) + " values for " + std::to_string(err_.size()));
    }
    std::copy(e.begin(), e.end(), err_.data());
  }

 private:
  struct Slot {
    typename Ops::template Buffer<std::uint8_t> send, recv;
    std::vector<std::size_t> sizes;  // frame bytes of every rank (all equal without Huffman)
    std::array<std::uint64_t, 1> my_size{};
    std::vector<std::uint64_t> all_sizes;
    comm::Work work;
    std::size_t bucket = 0;
    bool busy = false;
  };

  static const compress::GradientCompressionOptions& options_of(const PathContext<Ops>& c) {
    static const compress::GradientCompressionOptions kDefaults{};
    return c.compression != nullptr ? *c.compression : kDefaults;
  }

  float* x32(std::size_t flat_offset) {
    if constexpr (kWide) {
      return grads_.at(flat_offset);
    } else {
      return x32_.data() + flat_offset;
    }
  }

  /// Stage x (16-bit: widened), then whether x + err is finite on every rank.
  bool all_finite() {
    const std::size_t n = c_.layout->flat_numel();
    if constexpr (!kWide) {
      const T* g = grads_.data();
      for (std::size_t i = 0; i < n; ++i) x32_[i] = static_cast<float>(g[i]);
    }
    const float* x = x32(0);
    const float* e = err_.data();
    std::uint32_t max_key = 0;
    for (std::size_t i = 0; i < n; ++i) max_key = std::max(max_key, compress::detail::abs_key(x[i] + e[i]));
    double bad = max_key >= compress::detail::kNonfiniteKey ? 1.0 : 0.0;
    c_.comm->all_reduce_host(&bad, &bad, 1, comm::ReduceOp::max);
    count(comm::ring_wire_bytes(comm::OpKind::all_reduce, sizeof(double), c_.world()));
    return bad == 0.0;
  }

  /// Some rank's gradient is not finite: every rank's becomes NaN, the errors are kept.
  void poison() {
    T* g = grads_.at(0);
    std::fill(g, g + c_.layout->flat_numel(), static_cast<T>(std::numeric_limits<float>::quiet_NaN()));
    for (const Bucket& b : c_.layout->buckets()) dense(b.numel);
  }

  void dense(std::size_t numel) {
    dense_bytes_ += comm::ring_wire_bytes(comm::OpKind::all_reduce, numel * sizeof(T), c_.world());
  }
  void count(std::uint64_t wire) { wire_bytes_ += wire; }

  /// Encodes bucket k into s.send and starts its exchange.
  void start(Slot& s, std::size_t k) {
    const Bucket& b = c_.layout->buckets()[k];
    const std::size_t n = b.numel;
    const std::size_t payload = codec_.payload_bytes(n);
    std::span<float> err(err_.data() + b.flat_offset, n);
    std::span<const float> x(x32(b.flat_offset), n);
    std::size_t frame = payload;
    if (!huffman_) {
      codec_.encode(x, err, std::span<std::uint8_t>(s.send.data(), payload));
    } else {
      std::span<std::uint8_t> raw(payload_scratch_.data(), payload);
      codec_.encode(x, err, raw);
      if constexpr (kTopK) compress::topk::indices_to_gaps(raw);
      const std::size_t coded = compress::huffman::encoded_bytes(compress::huffman::histogram(raw));
      if (coded < payload) {
        s.send[0] = detail::kFrameHuffman;
        frame = 1 + compress::huffman::encode(raw, std::span<std::uint8_t>(s.send.data() + 1, coded));
      } else {
        s.send[0] = detail::kFrameRaw;
        std::memcpy(s.send.data() + 1, raw.data(), payload);
        frame = 1 + payload;
      }
    }
    payload_bytes_ += payload;
    frame_bytes_ += frame;
    dense(n);
    const int w = c_.world();
    if (!huffman_) {
      std::fill(s.sizes.begin(), s.sizes.end(), frame);
      s.work = c_.comm->all_gather(s.send.data(), s.recv.data(), frame, DType::uint8);
      count(comm::ring_wire_bytes(comm::OpKind::all_gather, static_cast<std::uint64_t>(frame) * w, w));
    } else {
      s.my_size[0] = frame;
      s.all_sizes.assign(static_cast<std::size_t>(w), 0);
      c_.comm->all_gather(s.my_size.data(), s.all_sizes.data(), sizeof(std::uint64_t), DType::uint8).wait();
      count(comm::ring_wire_bytes(comm::OpKind::all_gather, sizeof(std::uint64_t) * static_cast<std::uint64_t>(w), w));
      for (int r = 0; r < w; ++r) {
        if (s.all_sizes[r] == 0 || s.all_sizes[r] > frame_capacity_) {
          throw comm_error("rank " + std::to_string(r) + " announced a gradient frame of " +
                               std::to_string(s.all_sizes[r]) + " bytes for bucket " + std::to_string(k) +
                               " (at most " + std::to_string(frame_capacity_) + " fit)",
                           "zero::CompressedAllReduce");
        }
        s.sizes[r] = static_cast<std::size_t>(s.all_sizes[r]);
      }
      s.work = c_.comm->all_gatherv(s.send.data(), frame, s.recv.data(), s.sizes, DType::uint8);
      count(comm::all_gatherv_wire_bytes(s.sizes, c_.rank(), 1));
    }
    s.bucket = k;
    s.busy = true;
  }

  /// Waits for the slot's exchange and writes the average of the decoded payloads into its bucket.
  void finish(Slot& s) {
    s.work.wait();
    s.busy = false;
    const Bucket& b = c_.layout->buckets()[s.bucket];
    const std::size_t n = b.numel;
    std::span<float> sum(x32(b.flat_offset), n);  // x is no longer needed: encoded before the exchange
    const std::uint8_t* frame = s.recv.data();
    for (std::size_t r = 0; r < s.sizes.size(); ++r) {
      const std::span<const std::uint8_t> payload = unframe(frame, s.sizes[r], n);
      if (r == 0) {
        codec_.decode(payload, sum);
      } else {
        codec_.decode_add(payload, sum);
      }
      frame += s.sizes[r];
    }
    const float w = static_cast<float>(c_.world());
    T* out = grads_.at(b.flat_offset);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<T>(sum[i] / w);
  }

  /// The payload of a received frame, in the scratch buffer (top-k's gaps turned back into indices).
  std::span<const std::uint8_t> unframe(const std::uint8_t* frame, std::size_t bytes, std::size_t n) {
    if (!huffman_) return {frame, bytes};
    const std::size_t payload = codec_.payload_bytes(n);
    std::span<std::uint8_t> raw(payload_scratch_.data(), payload);
    const std::span<const std::uint8_t> body(frame + 1, bytes - 1);
    if (frame[0] == detail::kFrameRaw && body.size() == payload) {
      std::memcpy(raw.data(), body.data(), payload);
    } else if (frame[0] == detail::kFrameHuffman && compress::huffman::decoded_size(body) == payload) {
      compress::huffman::decode(body, raw);
    } else {
      throw comm_error("a gradient frame of " + std::to_string(bytes) + " bytes with mode byte " +
                           std::to_string(frame[0]) + " does not hold the bucket's " + std::to_string(payload) +
                           "-byte payload",
                       "zero::CompressedAllReduce");
    }
    if constexpr (kTopK) compress::topk::gaps_to_indices(raw);
    return raw;
  }

  PathContext<Ops> c_;
  FlatGradBuffer<T, Ops, false> grads_;
  Codec codec_;
  bool huffman_;
  typename Ops::template Buffer<float> err_;
  typename Ops::template Buffer<float> x32_;  // 16-bit gradients only: x widened, then the fp32 sums
  typename Ops::template Buffer<std::uint8_t> payload_scratch_;
  std::size_t frame_capacity_ = 0;
  std::array<Slot, 2> slots_;
  std::uint64_t wire_bytes_ = 0, dense_bytes_ = 0, payload_bytes_ = 0, frame_bytes_ = 0;
};

}  // namespace zerotk::zero
