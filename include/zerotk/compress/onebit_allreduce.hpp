#pragma once
/// \file zerotk/compress/onebit_allreduce.hpp
/// The compressed all-reduce of 1-bit Adam, 0/1 Adam and 1-bit LAMB (DeepSpeed's
/// NcclBackend::compressed_allreduce) over any zerotk Communicator, with worker and server error
/// feedback. Every rank ends with the same n values: an estimate of the average of the ranks'
/// inputs, whose compression errors are carried into the next call.
///
/// Layout. n values are padded with zeros to N = n rounded up to a multiple of W * lcm(W, 8)
/// (DeepSpeed's corrected_tensor_size with divider = lcm(W, 8)), so N / W is a whole number of bytes
/// of bits on every rank. Rank r is the server of chunk r: elements [r c, (r + 1) c), c = N / W.
/// Buffers: worker_error [N], server_error [c], fp32, zero at construction (and after reset()).
///
///   worker  y = pad(x) + worker_error;  s = ||y|| / sqrt(N);  worker_error = y - s sign(y)
///           all_to_all: chunk k of the packed signs of y goes to rank k  (c / 8 bytes each way)
///           all_gather: s                                                (one fp32 per rank)
///   server  z_j = sum_{k = 0..W-1, in rank order} sign_k(j) * fl(s_k * fl(1 / W))  + server_error_j
///           s' = ||z|| / sqrt(c);  server_error = z - s' sign(z)
///           all_gather: packed signs of z (c / 8 bytes) and s'
///   all     x_i = s'_{i / c} * sign(z)_i  for i < n
///
/// sign(v) = +1 for v >= 0 (so sign(0) = +1), scales as in compress/sign.hpp (reproducible sum of
/// squares, sqrt in fp64, one rounding). n = 0: no communication, the call returns (DeepSpeed
/// zeroes the error buffers; here there are none to zero). An input whose x + worker_error is inf
/// or NaN is a numerics_error on that rank before anything is sent or changed; its peers then fail
/// in the next collective as the communicator reports a failed rank (threads: comm_error).
///
/// Wire bytes per call and rank (the Communicator's ring convention, W > 1):
///   all_to_all (W-1)/W * N/8  +  2 all_gather of one fp32: 2 (W-1)/W * 4 W  +  all_gather (W-1)/W * N/8
/// against 2 (W-1)/W * 4 n for an fp32 all-reduce: about 32x less for large n.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/compress/codec.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/macros.hpp"

namespace zerotk::compress {

/// Sizes of one compressed all-reduce.
struct OneBitLayout {
  std::size_t numel = 0;   ///< n: the caller's values
  std::size_t padded = 0;  ///< N: n rounded up to a multiple of W * lcm(W, 8); 0 for n = 0
  std::size_t chunk = 0;   ///< c = N / W: each rank's server chunk
  int world = 1;

  static OneBitLayout make(std::size_t n, int world) {
    if (world < 1) throw usage_error("world size must be >= 1", "compress::OneBitLayout::make", std::to_string(world));
    OneBitLayout l;
    l.numel = n;
    l.world = world;
    const std::size_t w = static_cast<std::size_t>(world);
    const std::size_t unit = w * std::lcm(w, std::size_t{8});
    l.padded = (n + unit - 1) / unit * unit;
    l.chunk = l.padded / w;
    return l;
  }
  std::size_t chunk_bytes() const noexcept { return chunk / 8; }  ///< packed signs of one chunk
};

namespace onebit {

/// A usage_error unless the communicator's size `world` is the `expected` one the buffers were made for.
inline void check_world(int expected, int world, const char* where) {
  if (world != expected) {
    throw usage_error("communicator size must be the world size " + std::to_string(expected) + " the buffers were made for",
                      where, std::to_string(world));
  }
}

/// Per element of the server's chunk (host and device): the average of the W ranks' +-s_k / W for
/// element j of the received packed chunks ([W][chunk_bytes]), in rank order, plus the server error.
ZEROTK_HD ZEROTK_FORCEINLINE float server_value(const std::uint8_t* received, std::size_t chunk_bytes, const float* term,
                                                int world, std::size_t j, float server_error) {
  float acc = sign::value(received, j, term[0]);
  for (int k = 1; k < world; ++k) acc = acc + sign::value(received + static_cast<std::size_t>(k) * chunk_bytes, j, term[k]);
  return acc + server_error;
}

/// server_error[j] := server_value(..., j, server_error[j]) for every j < chunk: the host driver.
/// Eight elements (one byte of each rank's signs) at a time through a table of every byte's eight
/// +-term[k] per rank, built from sign::value, and added in the same order (rank 0, 1, ..., then the
/// error) as server_value: the same bits, and the eight sums vectorize. The bytes are shared out over
/// kernels/host/parallel.hpp's threads (each element's sum is one thread's, so any thread count gives
/// the same bits). `table` is scratch.
inline void server_chunk(const std::uint8_t* received, std::size_t chunk_bytes, const float* term, int world,
                         std::size_t chunk, float* server_error, std::vector<float>& table) {
  const std::size_t w = static_cast<std::size_t>(world);
  table.resize(w * 256 * 8);
  for (std::size_t k = 0; k < w; ++k) {
    for (unsigned b = 0; b < 256; ++b) {
      const std::uint8_t byte = static_cast<std::uint8_t>(b);
      for (std::size_t i = 0; i < 8; ++i) table[(k * 256 + b) * 8 + i] = sign::value(&byte, i, term[k]);
    }
  }
  const std::size_t full = chunk / 8;
  const float* tab = table.data();
  // Shares of whole bytes: boundaries are multiples of kShareGrain (64) elements, or 8 * full.
  kernels::host::for_each_share(8 * full, [&](std::size_t b, std::size_t e) {
    for (std::size_t q = b / 8; q < e / 8; ++q) {
      float acc[8];
      const float* t0 = tab + static_cast<std::size_t>(received[q]) * 8;
      for (std::size_t i = 0; i < 8; ++i) acc[i] = t0[i];
      for (std::size_t k = 1; k < w; ++k) {
        const float* tk = tab + (k * 256 + received[k * chunk_bytes + q]) * 8;
        for (std::size_t i = 0; i < 8; ++i) acc[i] = acc[i] + tk[i];
      }
      float* err = server_error + 8 * q;
      for (std::size_t i = 0; i < 8; ++i) err[i] = acc[i] + err[i];
    }
  });
  for (std::size_t j = 8 * full; j < chunk; ++j) {
    server_error[j] = server_value(received, chunk_bytes, term, world, j, server_error[j]);
  }
}

}  // namespace onebit

/// What the compressed all-reduce needs of a communicator: a comm::Communicator has it, and so has
/// the engine's device::OrderedCommunicator.
template <class C>
concept OneBitTransport = requires(C& c, const void* s, void* r, std::size_t n, DType dt) {
  { c.size() } -> std::convertible_to<int>;
  { c.all_to_all(s, r, n, dt) } -> std::same_as<comm::Work>;
  { c.all_gather(s, r, n, dt) } -> std::same_as<comm::Work>;
};

/// One compressed all-reduce with its two error buffers (one per tensor or flat buffer: the errors
/// belong to the values they compress). Not thread-safe; one per rank.
class OneBitAllReduce {
 public:
  /// Buffers for n values on a world of `world` ranks.
  OneBitAllReduce(std::size_t n, int world) : layout_(OneBitLayout::make(n, world)) {
    const std::size_t w = static_cast<std::size_t>(world);
    worker_error_.assign(layout_.padded, 0.0f);
    server_error_.assign(layout_.chunk, 0.0f);
    send_bits_.assign(layout_.padded / 8, 0);
    recv_bits_.assign(layout_.padded / 8, 0);
    server_bits_.assign(layout_.chunk_bytes(), 0);
    gathered_bits_.assign(layout_.padded / 8, 0);
    scales_.assign(w, 0.0f);
    server_scales_.assign(w, 0.0f);
    terms_.assign(w, 0.0f);
    table_.assign(w * 256 * 8, 0.0f);  // server_chunk's scratch, sized here so scratch_bytes() is final
  }

  const OneBitLayout& layout() const noexcept { return layout_; }
  std::span<const float> worker_error() const noexcept { return worker_error_; }  ///< [padded]
  std::span<const float> server_error() const noexcept { return server_error_; }  ///< [chunk]
  /// Bytes of the two error buffers (the state), and of the packed signs and scales (scratch).
  std::size_t error_bytes() const noexcept { return sizeof(float) * (worker_error_.size() + server_error_.size()); }
  std::size_t scratch_bytes() const noexcept {
    return send_bits_.size() + recv_bits_.size() + server_bits_.size() + gathered_bits_.size() +
           sizeof(float) * (scales_.size() + server_scales_.size() + terms_.size() + table_.size());
  }
  /// Zeroes both error buffers (DeepSpeed resets them when a checkpoint is loaded).
  void reset() {
    std::fill(worker_error_.begin(), worker_error_.end(), 0.0f);
    std::fill(server_error_.begin(), server_error_.end(), 0.0f);
  }
  /// Values in the two error buffers together (what save_errors appends and load_errors reads).
  std::size_t error_values() const noexcept { return worker_error_.size() + server_error_.size(); }
  /// Appends the worker error, then the server error, to `out` (a checkpoint of this rank's state).
  void save_errors(std::vector<float>& out) const {
    out.insert(out.end(), worker_error_.begin(), worker_error_.end());
    out.insert(out.end(), server_error_.begin(), server_error_.end());
  }
  /// Restores what save_errors appended: `in` holds exactly error_values() values.
  void load_errors(std::span<const float> in) {
    if (in.size() != error_values()) {
      throw usage_error("error feedback of another size (another world size or tensor?)", "compress::OneBitAllReduce",
                        std::to_string(in.size()) + " values for " + std::to_string(error_values()));
    }
    std::copy_n(in.begin(), worker_error_.size(), worker_error_.begin());
    std::copy(in.begin() + static_cast<std::ptrdiff_t>(worker_error_.size()), in.end(), server_error_.begin());
  }

  /// In place: x (n values) becomes the compressed average over the ranks of `c`.
  template <OneBitTransport C>
  void run(C& c, std::span<float> x) {
    onebit::check_world(layout_.world, c.size(), "compress::OneBitAllReduce::run");
    const float s = encode(x);
    if (layout_.numel == 0) return;
    const std::size_t cb = layout_.chunk_bytes();
    // Phase 1: chunk k of the signs to rank k; every rank's scale to all.
    comm::Work a = c.all_to_all(send_bits_.data(), recv_bits_.data(), cb, DType::uint8);
    comm::Work b = c.all_gather(&s, scales_.data(), 1, DType::fp32);
    a.wait();
    b.wait();
    const float s2 = serve();
    // Phase 2: every server's signs and scale to all.
    comm::Work d = c.all_gather(server_bits_.data(), gathered_bits_.data(), cb, DType::uint8);
    comm::Work e = c.all_gather(&s2, server_scales_.data(), 1, DType::fp32);
    d.wait();
    e.wait();
    decode(gathered_bits_.data(), cb, server_scales_.data(), 1, x);
  }

  // The three local parts of `run`, for running several reducers' collectives together
  // (compress/onebit_batch.hpp). Each rank calls encode, moves send_bits() chunk k to rank k's
  // recv_bits() and every scale into scales(), calls serve, gathers every rank's server_bits() and
  // server scale, and calls decode.

  /// Worker: y = pad(x) + worker_error (the padding's x is 0), checked before anything changes; its
  /// packed signs into send_bits() ([W][chunk_bytes]), worker_error = y - s sign(y). Returns s.
  float encode(std::span<const float> x) {
    constexpr const char* kWhere = "compress::OneBitAllReduce::encode";
    if (x.size() != layout_.numel) {
      throw usage_error("input must have the n = " + std::to_string(layout_.numel) + " values the buffers were made for",
                        kWhere, std::to_string(x.size()));
    }
    if (layout_.numel == 0) return 0.0f;
    (void)detail::add_feedback_checked(kWhere, x, worker_error_.data());
    const float s = sign::scale_of(worker_error_.data(), layout_.padded);
    sign::pack_with_feedback(worker_error_.data(), layout_.padded, s, send_bits_.data());
    return s;
  }
  /// Server of chunk `rank`, from recv_bits() ([W][chunk_bytes], rank order) and scales() ([W]):
  /// server_error = z - s' sign(z), z's packed signs into server_bits(). Returns s'.
  float serve() {
    const std::size_t w = static_cast<std::size_t>(layout_.world);
    const float inv_w = static_cast<float>(1.0 / static_cast<double>(w));
    for (std::size_t k = 0; k < w; ++k) terms_[k] = scales_[k] * inv_w;
    onebit::server_chunk(recv_bits_.data(), layout_.chunk_bytes(), terms_.data(), layout_.world, layout_.chunk,
                         server_error_.data(), table_);
    const float s2 = sign::scale_of(server_error_.data(), layout_.chunk);
    sign::pack_with_feedback(server_error_.data(), layout_.chunk, s2, server_bits_.data());
    return s2;
  }
  /// x_i = s'_r sign(z)_i for i < n, from rank r's server signs at gathered + r * stride and its
  /// scale at server_scales[r * scale_stride].
  void decode(const std::uint8_t* gathered, std::size_t stride, const float* server_scales, std::size_t scale_stride,
              std::span<float> x) const {
    const std::size_t n = layout_.numel, w = static_cast<std::size_t>(layout_.world);
    for (std::size_t r = 0; r < w && r * layout_.chunk < n; ++r) {
      const std::size_t begin = r * layout_.chunk, count = std::min(layout_.chunk, n - begin);
      sign::unpack(gathered + r * stride, count, server_scales[r * scale_stride], x.data() + begin);
    }
  }
  std::span<const std::uint8_t> send_bits() const noexcept { return send_bits_; }
  std::span<std::uint8_t> recv_bits() noexcept { return recv_bits_; }
  std::span<float> scales() noexcept { return scales_; }
  std::span<const std::uint8_t> server_bits() const noexcept { return server_bits_; }

 private:
  OneBitLayout layout_;
  std::vector<float> worker_error_, server_error_;
  std::vector<std::uint8_t> send_bits_, recv_bits_, server_bits_, gathered_bits_;  // packed signs
  std::vector<float> scales_, server_scales_, terms_;  // [W]
  std::vector<float> table_;                           // [W][256][8], onebit::server_chunk's
};

}  // namespace zerotk::compress
