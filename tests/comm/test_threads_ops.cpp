// Every operation x dtype x size x world of the threads communicator against a serial reference,
// bit for bit (rank-order reduction is part of the contract).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "reference.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_threads_ops {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::ReduceOp;

namespace {

constexpr std::size_t kLarge = (std::size_t{1} << 20) + 3;

template <class T>
std::vector<ReduceOp> reduce_ops() {
  if constexpr (std::is_same_v<T, std::uint8_t>) {
    return {ReduceOp::sum, ReduceOp::max, ReduceOp::min};  // avg is not defined for uint8
  } else {
    return {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};
  }
}

/// Inputs of every rank and the expected outputs of every operation for one (W, n).
template <class T>
struct Case {
  int w = 1;
  std::size_t n = 0;
  std::vector<std::vector<T>> in;       // [w][w*n]: rank r's send data
  std::vector<std::vector<T>> reduced;  // [op][w*n]: in[0] op in[1] op ... (rank order)
  std::vector<T> gathered;              // [w*n]: in[s][0..n) for s = 0..w-1
  std::vector<std::size_t> vcounts;     // all_gatherv counts, some zero
  std::vector<T> gatheredv;
  int root_bcast = 0, root_reduce = 0;

  Case(int world, std::size_t count, std::uint64_t seed) : w(world), n(count) {
    const std::size_t len = static_cast<std::size_t>(w) * n;
    for (int r = 0; r < w; ++r) in.push_back(test::make_data<T>(seed, r, len, false));
    for (ReduceOp op : reduce_ops<T>()) reduced.push_back(test::reduce_ref(in, len, op));
    for (int s = 0; s < w; ++s) gathered.insert(gathered.end(), in[s].begin(), in[s].begin() + n);
    for (int s = 0; s < w; ++s) {
      vcounts.push_back(n >= static_cast<std::size_t>(s) ? n - static_cast<std::size_t>(s) : 0);
      gatheredv.insert(gatheredv.end(), in[s].begin(), in[s].begin() + vcounts.back());
    }
    root_bcast = static_cast<int>((n + 1) % static_cast<std::size_t>(w));
    root_reduce = w - 1;
  }
};

/// Runs every operation on rank `c` and returns descriptions of wrong results.
template <class T>
std::vector<std::string> run_all(comm::ThreadsCommunicator& c, const Case<T>& k) {
  const DType dt = dtype_of_v<T>;
  const int r = c.rank(), w = c.size();
  const std::size_t n = k.n, ur = static_cast<std::size_t>(r);
  const T* mine = k.in[ur].data();
  std::vector<std::string> errors;
  const auto expect = [&](const std::string& what, const T* got, const T* want, std::size_t len) {
    auto e = test::compare_bits(what, got, want, len);
    if (!e.empty()) errors.push_back(std::move(e));
  };
  const auto ops = reduce_ops<T>();
  for (std::size_t o = 0; o < ops.size(); ++o) {
    const std::string op(comm::to_string(ops[o]));
    std::vector<T> out(n);
    c.all_reduce(mine, out.data(), n, dt, ops[o]).wait();
    expect("all_reduce " + op, out.data(), k.reduced[o].data(), n);

    c.reduce_scatter(mine, out.data(), n, dt, ops[o]).wait();
    expect("reduce_scatter " + op, out.data(), k.reduced[o].data() + ur * n, n);

    std::vector<T> at_root(r == k.root_reduce ? n : 0);
    c.reduce(mine, at_root.data(), n, dt, ops[o], k.root_reduce).wait();
    if (r == k.root_reduce) expect("reduce " + op, at_root.data(), k.reduced[o].data(), n);
  }
  {  // in place: all_reduce and the ZeRO reduce-scatter (recv is this rank's block of send)
    std::vector<T> buf(mine, mine + n);
    c.all_reduce(buf.data(), buf.data(), n, dt, ReduceOp::sum).wait();
    expect("all_reduce in place", buf.data(), k.reduced[0].data(), n);
    std::vector<T> flat(mine, mine + static_cast<std::size_t>(w) * n);
    c.reduce_scatter(flat.data(), flat.data() + ur * n, n, dt, ReduceOp::sum).wait();
    expect("reduce_scatter in place", flat.data() + ur * n, k.reduced[0].data() + ur * n, n);
  }
  {
    std::vector<T> all(static_cast<std::size_t>(w) * n);
    c.all_gather(mine, all.data(), n, dt).wait();
    expect("all_gather", all.data(), k.gathered.data(), all.size());
    std::vector<T> in_place(static_cast<std::size_t>(w) * n);
    std::copy(mine, mine + n, in_place.begin() + static_cast<std::ptrdiff_t>(ur * n));
    c.all_gather(in_place.data() + ur * n, in_place.data(), n, dt).wait();
    expect("all_gather in place", in_place.data(), k.gathered.data(), in_place.size());
  }
  {
    std::vector<T> allv(k.gatheredv.size());
    c.all_gatherv(mine, k.vcounts[ur], allv.data(), k.vcounts, dt).wait();
    expect("all_gatherv", allv.data(), k.gatheredv.data(), allv.size());
  }
  {
    const T* root_data = k.in[static_cast<std::size_t>(k.root_bcast)].data();
    std::vector<T> buf = r == k.root_bcast ? std::vector<T>(root_data, root_data + n) : std::vector<T>(n);
    c.broadcast(buf.data(), n, dt, k.root_bcast).wait();
    expect("broadcast", buf.data(), root_data, n);
  }
  {
    std::vector<T> got(static_cast<std::size_t>(w) * n), want;
    for (int s = 0; s < w; ++s) {
      const auto& src = k.in[static_cast<std::size_t>(s)];
      want.insert(want.end(), src.begin() + static_cast<std::ptrdiff_t>(ur * n),
                  src.begin() + static_cast<std::ptrdiff_t>((ur + 1) * n));
    }
    c.all_to_all(mine, got.data(), n, dt).wait();
    expect("all_to_all", got.data(), want.data(), got.size());
  }
  {  // ring: send to the right, receive from the left
    const int right = (r + 1) % w, left = (r + w - 1) % w;
    std::vector<T> got(n);
    comm::Work s = c.send(mine, n, dt, right, 7);
    c.recv(got.data(), n, dt, left, 7).wait();
    s.wait();
    expect("send/recv", got.data(), k.in[static_cast<std::size_t>(left)].data(), n);
  }
  c.barrier().wait();
  return errors;
}

template <class T>
void sweep(int w, std::size_t n) {
  const Case<T> k(w, n, 1000 * static_cast<std::uint64_t>(w) + n);
  auto errors = comm::run_threads(w, [&](comm::ThreadsCommunicator& c) { return run_all(c, k); });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("world ", w, ", count ", n, ", ", dtype_of_v<T>, ", rank ", r);
    CHECK_MESSAGE(errors[r].empty(), (errors[r].empty() ? std::string() : errors[r].front()));
  }
}

}  // namespace

TEST_CASE_TEMPLATE("threads: every op matches the serial reference bit for bit (sizes 0, 1, 7, 1000; worlds 1-8)",
                   T, float, half, bfloat16, double, std::int32_t, std::uint8_t) {
  for (int w : {1, 2, 3, 4, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) sweep<T>(w, n);
  }
}

// 2^20+3 elements (many chunks, several threads computing one operation): every op and dtype on
// 2 ranks, fp32 and fp16 also on 3 (an odd world, blocks not a power of two apart).
TEST_CASE_TEMPLATE("threads: every op at 2^20+3 elements", T, float, half, bfloat16, double, std::int32_t,
                   std::uint8_t) {
  sweep<T>(2, kLarge);
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, half>) sweep<T>(3, kLarge);
}

// 2^20+3 elements on 8 ranks for the ZeRO hot path (16-bit reduce-scatter and all-gather, fp32
// all-reduce): many chunks, several threads computing them at once.
TEST_CASE("threads: 8 ranks at 2^20+3 elements: reduce_scatter, all_gather, all_reduce") {
  constexpr int w = 8;
  const std::size_t n = kLarge;
  std::vector<std::vector<half>> in16;
  std::vector<std::vector<float>> in32;
  for (int r = 0; r < w; ++r) {
    in16.push_back(test::make_data<half>(77, r, w * n, false));
    in32.push_back(test::make_data<float>(78, r, n, false));
  }
  const auto rs_ref = test::reduce_ref(in16, w * n, ReduceOp::avg);
  const auto ar_ref = test::reduce_ref(in32, n, ReduceOp::sum);
  auto errors = comm::run_threads(w, [&](comm::ThreadsCommunicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<std::string> errs;
    std::vector<half> flat = in16[r];  // the ZeRO flat buffer: reduce-scatter in place, gather back
    c.reduce_scatter(flat.data(), flat.data() + r * n, n, DType::fp16, ReduceOp::avg).wait();
    errs.push_back(test::compare_bits("reduce_scatter", flat.data() + r * n, rs_ref.data() + r * n, n));
    c.all_gather(flat.data() + r * n, flat.data(), n, DType::fp16).wait();
    errs.push_back(test::compare_bits("all_gather", flat.data(), rs_ref.data(), w * n));
    std::vector<float> sum(n);
    c.all_reduce(in32[r].data(), sum.data(), n, DType::fp32, ReduceOp::sum).wait();
    errs.push_back(test::compare_bits("all_reduce", sum.data(), ar_ref.data(), n));
    return errs;
  });
  for (const auto& rank_errors : errors) {
    for (const auto& e : rank_errors) CHECK_MESSAGE(e.empty(), e);
  }
}

// ---- streaming stores ------------------------------------------------------------------------------
// Operations whose footprint exceeds the last-level cache write their outputs with streaming stores
// (comm/detail/stream_store.hpp) and all_gather reads each input once. The bits must not change.

namespace {

/// Streams every operation of at least `bytes` footprint (1: all) while alive.
struct StreamThreshold {
  explicit StreamThreshold(std::size_t bytes) : saved_(comm::detail::stream_threshold_override().exchange(bytes)) {}
  StreamThreshold(const StreamThreshold&) = delete;
  StreamThreshold& operator=(const StreamThreshold&) = delete;
  ~StreamThreshold() { comm::detail::stream_threshold_override().store(saved_); }

 private:
  std::size_t saved_;
};

/// reduce_scatter and all_gather of `len` = W * n elements per rank, on buffers one element past an
/// aligned allocation (neither 16-byte aligned), against the serial reference, bit for bit; in place
/// too; and an all_reduce of `len` elements.
template <class T>
void large_unaligned(int w, std::size_t n, std::uint64_t seed) {
  const std::size_t len = static_cast<std::size_t>(w) * n;
  std::vector<std::vector<T>> in;
  for (int r = 0; r < w; ++r) in.push_back(test::make_data<T>(seed, r, len, false));
  const auto sum = test::reduce_ref(in, len, ReduceOp::sum);
  std::vector<T> gathered;
  for (int s = 0; s < w; ++s) gathered.insert(gathered.end(), in[s].begin(), in[s].begin() + static_cast<std::ptrdiff_t>(n));
  const DType dt = dtype_of_v<T>;
  auto errors = comm::run_threads(w, [&](comm::ThreadsCommunicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<std::string> errs;
    std::vector<T> send(len + 1), recv(len + 1);
    std::copy(in[r].begin(), in[r].end(), send.begin() + 1);
    c.reduce_scatter(send.data() + 1, recv.data() + 1, n, dt, ReduceOp::sum).wait();
    errs.push_back(test::compare_bits("reduce_scatter", recv.data() + 1, sum.data() + r * n, n));
    c.all_gather(send.data() + 1, recv.data() + 1, n, dt).wait();
    errs.push_back(test::compare_bits("all_gather", recv.data() + 1, gathered.data(), len));
    // The ZeRO flat buffer: reduce-scatter in place, gather back in place.
    c.reduce_scatter(send.data() + 1, send.data() + 1 + r * n, n, dt, ReduceOp::sum).wait();
    c.all_gather(send.data() + 1 + r * n, send.data() + 1, n, dt).wait();
    errs.push_back(test::compare_bits("reduce_scatter + all_gather in place", send.data() + 1, sum.data(), len));
    // Outputs at different offsets from a 16-byte boundary on each rank (the all_reduce path that
    // cannot stream one group to every output).
    std::vector<T> out(len + static_cast<std::size_t>(w));
    c.all_reduce(in[r].data(), out.data() + r, len, dt, ReduceOp::sum).wait();
    errs.push_back(test::compare_bits("all_reduce", out.data() + r, sum.data(), len));
    return errs;
  });
  for (std::size_t r = 0; r < errors.size(); ++r) {
    for (const auto& e : errors[r]) {
      INFO("world ", w, ", count ", n, ", ", dtype_of_v<T>, ", rank ", r);
      CHECK_MESSAGE(e.empty(), e);
    }
  }
}

}  // namespace

TEST_CASE("threads: the last-level cache size is read and parsed") {
  CHECK(comm::detail::parse_cache_size("32768K") == std::size_t{32} << 20);
  CHECK(comm::detail::parse_cache_size("1M") == std::size_t{1} << 20);
  CHECK(comm::detail::parse_cache_size("512") == 512);
  CHECK(comm::detail::parse_cache_size("") == 0);
  CHECK(comm::detail::parse_cache_size("x") == 0);
  CHECK(comm::detail::last_level_cache_bytes() >= std::size_t{64} << 10);
}

TEST_CASE_TEMPLATE("threads: streaming stores forced for every size give the same bits (sizes 0-1000, worlds 1-8)", T,
                   float, half, bfloat16, double, std::int32_t, std::uint8_t) {
  const StreamThreshold all(1);
  for (int w : {1, 2, 3, 4, 8}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) sweep<T>(w, n);
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, half>) sweep<T>(3, kLarge);  // many chunks
}

// 64 MiB per rank (W x n elements, n odd); each operation touches at least 192 MiB, past the
// last-level caches seen here (32-105 MiB), so it streams with the detected cache size. Where the
// cache holds 64 MiB or more, the float case runs again with streaming forced.
TEST_CASE("threads: 64 MiB reduce_scatter, all_gather and all_reduce, unaligned, odd count, odd world: bit for bit") {
  constexpr std::size_t kBytes = std::size_t{64} << 20;
  large_unaligned<float>(3, kBytes / 3 / sizeof(float) | 1, 91);
  large_unaligned<half>(2, kBytes / 2 / sizeof(half) - 3, 92);
  if (comm::detail::last_level_cache_bytes() >= kBytes) {
    const StreamThreshold all(1);
    large_unaligned<float>(3, kBytes / 3 / sizeof(float) | 1, 93);
  }
}

}  // namespace test_threads_ops
