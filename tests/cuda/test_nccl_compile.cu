// NCCL communicator: always compiled (cuda-compile preset, sm_80/sm_90), run where GPUs are usable.
// One thread per visible GPU; the NCCL unique id travels through the threads communicator. Inputs
// are small integers, so sums are exact in NCCL's (not rank-order) combining order and results
// must equal the serial reference bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../comm/reference.hpp"
#include "zerotk/core/cuda.hpp"
#include "zerotk/comm/nccl.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/typed.hpp"

using namespace zerotk;
using comm::NcclCommunicator;
using comm::ReduceOp;

static_assert(comm::Communicator<NcclCommunicator>);
static_assert(comm::uses_device_memory<NcclCommunicator>);

namespace {

/// Device copy of a host vector; `host()` copies back (synchronously).
template <class T>
class DeviceVector {
 public:
  explicit DeviceVector(std::size_t n) : n_(n) { ZEROTK_CUDA_CHECK(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T))); }
  explicit DeviceVector(const std::vector<T>& v) : DeviceVector(v.size()) {
    ZEROTK_CUDA_CHECK(cudaMemcpy(p_, v.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceVector(const DeviceVector&) = delete;
  DeviceVector& operator=(const DeviceVector&) = delete;
  ~DeviceVector() { cudaFree(p_); }
  T* data() { return p_; }
  std::vector<T> host() const {
    std::vector<T> v(n_);
    ZEROTK_CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_;
};

template <class T>
void run_all(NcclCommunicator& c, std::size_t n, std::vector<std::string>& errors) {
  const DType dt = dtype_of_v<T>;
  const int w = c.size(), r = c.rank();
  const std::size_t ur = static_cast<std::size_t>(r), uw = static_cast<std::size_t>(w);
  const std::uint64_t seed = 31 + n;
  const auto data = [&](int s, std::size_t begin, std::size_t end) {
    std::vector<T> v;
    for (std::size_t i = begin; i < end; ++i) v.push_back(test::value<T>(seed, s, i, true));
    return v;
  };
  std::vector<std::vector<T>> head, block;
  for (int s = 0; s < w; ++s) {
    head.push_back(data(s, 0, n));
    block.push_back(data(s, ur * n, ur * n + n));
  }
  const auto mine_host = data(r, 0, uw * n);
  DeviceVector<T> mine(mine_host);
  const auto expect = [&](const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    auto e = test::compare_bits(what + " (" + std::string(to_string(dt)) + ", n " + std::to_string(n) + ")",
                                got.data(), want.data(), want.size());
    if (!e.empty()) errors.push_back(std::move(e));
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
    if constexpr (std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::uint8_t>) {
      if (op == ReduceOp::avg) continue;  // uint8: not defined; int32: NCCL rounds its own way
    }
    if (op == ReduceOp::avg && w != 1 && w != 2 && w != 4 && w != 8) continue;  // exact only for powers of two
    DeviceVector<T> out(n);
    c.all_reduce(mine.data(), out.data(), n, dt, op).wait();
    expect("all_reduce " + std::string(comm::to_string(op)), out.host(), test::reduce_ref(head, n, op));
    c.reduce_scatter(mine.data(), out.data(), n, dt, op).wait();
    expect("reduce_scatter", out.host(), test::reduce_ref(block, n, op));
    c.reduce(mine.data(), out.data(), n, dt, op, w - 1).wait();
    if (r == w - 1) expect("reduce", out.host(), test::reduce_ref(head, n, op));
  }
  std::vector<T> gathered;
  for (const auto& h : head) gathered.insert(gathered.end(), h.begin(), h.end());
  {
    DeviceVector<T> all(uw * n);
    c.all_gather(mine.data(), all.data(), n, dt).wait();
    expect("all_gather", all.host(), gathered);
  }
  {
    std::vector<std::size_t> counts;
    std::vector<T> want;
    for (int s = 0; s < w; ++s) {
      counts.push_back(n >= static_cast<std::size_t>(s) ? n - static_cast<std::size_t>(s) : 0);
      want.insert(want.end(), head[static_cast<std::size_t>(s)].begin(),
                  head[static_cast<std::size_t>(s)].begin() + static_cast<std::ptrdiff_t>(counts.back()));
    }
    DeviceVector<T> allv(want.size());
    c.all_gatherv(mine.data(), counts[ur], allv.data(), counts, dt).wait();
    expect("all_gatherv", allv.host(), want);
  }
  {
    DeviceVector<T> buf(r == 0 ? head[0] : std::vector<T>(n));
    c.broadcast(buf.data(), n, dt, 0).wait();
    expect("broadcast", buf.host(), head[0]);
  }
  {
    std::vector<T> want;
    for (const auto& b : block) want.insert(want.end(), b.begin(), b.end());
    DeviceVector<T> got(uw * n);
    c.all_to_all(mine.data(), got.data(), n, dt).wait();
    expect("all_to_all", got.host(), want);
  }
  {
    auto v = test::v_case<T>(n + 77, r, w, n);
    DeviceVector<T> send(v.send), got(v.want.size());
    c.all_to_all_v(send.data(), v.send_counts, got.data(), v.recv_counts, dt).wait();
    expect("all_to_all_v", got.host(), v.want);
  }
  {
    const int right = (r + 1) % w, left = (r + w - 1) % w;
    DeviceVector<T> got(n);
    std::vector<comm::Work> pending;
    {
      auto g = c.group();  // peers exchanging send/recv must launch them in one group
      pending.push_back(c.send(mine.data(), n, dt, right, 0));
      pending.push_back(c.recv(got.data(), n, dt, left, 0));
    }
    for (auto& w : pending) w.wait();
    expect("send/recv", got.host(), head[static_cast<std::size_t>(left)]);
  }
  c.barrier().wait();
}

}  // namespace

TEST_CASE("nccl: every op x dtype x size on every visible GPU matches the serial reference") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  int ndev = 0;
  ZEROTK_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  const auto errors = comm::run_threads(ndev, [](comm::ThreadsCommunicator& boot) {
    NcclCommunicator c = NcclCommunicator::bootstrap(boot, boot.rank());
    std::vector<std::string> errs;
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}, (std::size_t{1} << 20) + 3}) {
      run_all<float>(c, n, errs);
      run_all<zerotk::half>(c, n, errs);
      run_all<zerotk::bfloat16>(c, n, errs);
      run_all<double>(c, n, errs);
      run_all<std::int32_t>(c, n, errs);
      run_all<std::uint8_t>(c, n, errs);
    }
    // counters: same conventions as every back end
    const auto& s = c.stats();
    if (s[comm::OpKind::all_reduce].payload_bytes == 0) errs.push_back("all_reduce bytes were not counted");
    return errs;
  });
  for (const auto& rank_errors : errors) {
    for (const auto& e : rank_errors) CHECK_MESSAGE(e.empty(), e);
    CHECK(rank_errors.empty());
  }
}

TEST_CASE("nccl: group launches, stream ordering, split and split_node_local") {
  REQUIRE_MESSAGE(zerotk::cuda::device_usable(), "this test binary needs a usable CUDA device");
  int ndev = 0;
  ZEROTK_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  const auto sums = comm::run_threads(ndev, [](comm::ThreadsCommunicator& boot) {
    NcclCommunicator c = NcclCommunicator::bootstrap(boot, boot.rank());
    const std::vector<float> one(1000, float(c.rank() + 1));
    DeviceVector<float> a(one), b(one);
    std::vector<comm::Work> pending;  // [sum, max]
    {
      auto g = c.group();
      pending.push_back(c.all_reduce(a.data(), a.data(), 1000, DType::fp32, ReduceOp::sum));
      pending.push_back(c.all_reduce(b.data(), b.data(), 1000, DType::fp32, ReduceOp::max));
    }
    pending[1].wait();
    pending[0].wait();
    cudaStream_t user = nullptr;
    ZEROTK_CUDA_CHECK(cudaStreamCreate(&user));
    c.wait_for(user);
    c.stream_wait(user);
    ZEROTK_CUDA_CHECK(cudaStreamSynchronize(user));
    ZEROTK_CUDA_CHECK(cudaStreamDestroy(user));
    NcclCommunicator node = c.split_node_local();
    NcclCommunicator self = c.split(c.rank(), 0);
    return std::vector<float>{a.host()[999], b.host()[0], float(node.size()), float(self.size())};
  });
  const int w = ndev;
  for (const auto& v : sums) {
    CHECK(v[0] == float(w * (w + 1) / 2));
    CHECK(v[1] == float(w));
    CHECK(v[2] == float(w));  // one process: one host
    CHECK(v[3] == 1.f);
  }
}
