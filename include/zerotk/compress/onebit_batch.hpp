#pragma once
/// \file zerotk/compress/onebit_batch.hpp
/// Several 1-bit compressed all-reduces (compress/onebit_allreduce.hpp), one per tensor with its own
/// worker and server errors and its own scales, sharing four collectives per call instead of four
/// per tensor. For a model of T tensors that is 4 operations instead of 4 T, so the per-operation
/// latency (tens of microseconds on a network) is paid 4 times, not 4 T times; the bytes are the same.
///
/// Every tensor's results and errors are bitwise those of its own OneBitAllReduce::run: the batch
/// only moves the same bytes through shared buffers. Layout of one call, with cb_i tensor i's chunk
/// bytes, B = sum_i cb_i and o_i = cb_0 + ... + cb_{i-1}:
///
///   all_to_all   send [rank k][tensor i: cb_i]  (B bytes to each rank)  <- tensor i's chunk k
///   all_gather   the worker scales              ([rank][T'] fp32, T' tensors with values)
///   all_gather   the T servers' packed signs    ([rank][B])
///   all_gather   the server scales              ([rank][T'] fp32)
///
/// Wire bytes per call equal the sum of the T separate calls' (each block is a multiple of W bytes).
/// Tensors with no values take no part. Not thread-safe; one per rank.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "zerotk/compress/onebit_allreduce.hpp"

namespace zerotk::compress {

class OneBitBatch {
 public:
  /// One reducer per entry of `numels` on a world of `world` ranks.
  OneBitBatch(std::span<const std::size_t> numels, int world) : world_(world) {
    reducers_.reserve(numels.size());
    offsets_.reserve(numels.size());
    for (std::size_t n : numels) {
      reducers_.emplace_back(n, world);
      offsets_.push_back(block_);
      block_ += reducers_.back().layout().chunk_bytes();
      if (n != 0) active_.push_back(reducers_.size() - 1);
    }
    const std::size_t w = static_cast<std::size_t>(world), t = active_.size();
    send_.assign(w * block_, 0);
    recv_.assign(w * block_, 0);
    served_.assign(block_, 0);
    gathered_.assign(w * block_, 0);
    scales_.assign(t, 0.0f);
    all_scales_.assign(w * t, 0.0f);
    server_scales_.assign(t, 0.0f);
    all_server_scales_.assign(w * t, 0.0f);
  }

  std::size_t size() const noexcept { return reducers_.size(); }
  const OneBitAllReduce& operator[](std::size_t i) const noexcept { return reducers_[i]; }

  /// Bytes of every tensor's two error buffers (the state), and of every packed-sign and scale
  /// buffer, the reducers' own and the shared ones (scratch).
  std::size_t error_bytes() const noexcept {
    std::size_t b = 0;
    for (const OneBitAllReduce& r : reducers_) b += r.error_bytes();
    return b;
  }
  std::size_t scratch_bytes() const noexcept {
    std::size_t b = send_.size() + recv_.size() + served_.size() + gathered_.size() +
                    sizeof(float) * (scales_.size() + all_scales_.size() + server_scales_.size() + all_server_scales_.size());
    for (const OneBitAllReduce& r : reducers_) b += r.scratch_bytes();
    return b;
  }
  /// Zeroes every tensor's errors.
  void reset() {
    for (OneBitAllReduce& r : reducers_) r.reset();
  }
  /// Every tensor's errors, tensor by tensor (OneBitAllReduce::save_errors), and back.
  std::size_t error_values() const noexcept {
    std::size_t n = 0;
    for (const OneBitAllReduce& r : reducers_) n += r.error_values();
    return n;
  }
  void save_errors(std::vector<float>& out) const {
    for (const OneBitAllReduce& r : reducers_) r.save_errors(out);
  }
  void load_errors(std::span<const float> in) {
    if (in.size() != error_values()) {
      throw usage_error("error feedback of another size (another world size or model?)", "compress::OneBitBatch",
                        std::to_string(in.size()) + " values for " + std::to_string(error_values()));
    }
    for (OneBitAllReduce& r : reducers_) {
      r.load_errors(in.first(r.error_values()));
      in = in.subspan(r.error_values());
    }
  }

  /// In place: xs[i] (tensor i's n_i values) becomes its compressed average over the ranks of `c`.
  template <OneBitTransport C>
  void run(C& c, std::span<const std::span<float>> xs) {
    constexpr const char* kWhere = "compress::OneBitBatch::run";
    if (xs.size() != reducers_.size()) {
      throw usage_error("expected one input per tensor: " + std::to_string(reducers_.size()), kWhere,
                        std::to_string(xs.size()));
    }
    onebit::check_world(world_, c.size(), kWhere);
    for (std::size_t i = 0; i < xs.size(); ++i) {  // the empty ones too: their sizes must match
      if (reducers_[i].layout().numel == 0) (void)reducers_[i].encode(xs[i]);
    }
    if (active_.empty()) return;  // no tensor has values
    const std::size_t w = static_cast<std::size_t>(world_), t = active_.size();

    // Workers: encode each tensor, then chunk k of each into rank k's block. Slot a of the scale
    // arrays belongs to the a-th tensor with values.
    for (std::size_t a = 0; a < t; ++a) {
      const std::size_t i = active_[a];
      OneBitAllReduce& r = reducers_[i];
      scales_[a] = r.encode(xs[i]);
      const std::size_t cb = r.layout().chunk_bytes();
      for (std::size_t k = 0; k < w; ++k) std::memcpy(&send_[k * block_ + offsets_[i]], &r.send_bits()[k * cb], cb);
    }
    comm::Work a = c.all_to_all(send_.data(), recv_.data(), block_, DType::uint8);
    comm::Work b = c.all_gather(scales_.data(), all_scales_.data(), t, DType::fp32);
    a.wait();
    b.wait();

    // Servers: each tensor's chunk from every rank into its reducer, served, signs into the block.
    for (std::size_t a = 0; a < t; ++a) {
      const std::size_t i = active_[a];
      OneBitAllReduce& r = reducers_[i];
      const std::size_t cb = r.layout().chunk_bytes();
      std::span<std::uint8_t> in = r.recv_bits();
      std::span<float> s = r.scales();
      for (std::size_t k = 0; k < w; ++k) {
        std::memcpy(&in[k * cb], &recv_[k * block_ + offsets_[i]], cb);
        s[k] = all_scales_[k * t + a];
      }
      server_scales_[a] = r.serve();
      std::memcpy(&served_[offsets_[i]], r.server_bits().data(), cb);
    }
    comm::Work d = c.all_gather(served_.data(), gathered_.data(), block_, DType::uint8);
    comm::Work e = c.all_gather(server_scales_.data(), all_server_scales_.data(), t, DType::fp32);
    d.wait();
    e.wait();

    for (std::size_t a = 0; a < t; ++a) {
      const std::size_t i = active_[a];
      reducers_[i].decode(gathered_.data() + offsets_[i], block_, all_server_scales_.data() + a, t, xs[i]);
    }
  }

 private:
  int world_;
  std::vector<OneBitAllReduce> reducers_;
  std::vector<std::size_t> offsets_;  // o_i: tensor i's bytes within a rank's block
  std::vector<std::size_t> active_;   // the tensors with values, in order
  std::size_t block_ = 0;             // B
  std::vector<std::uint8_t> send_, recv_, gathered_;  // [W][B]
  std::vector<std::uint8_t> served_;                  // [B]
  std::vector<float> scales_, server_scales_;         // [T]
  std::vector<float> all_scales_, all_server_scales_;  // [W][T]
};

}  // namespace zerotk::compress
