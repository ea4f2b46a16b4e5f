// host_async (core/host_async.hpp): streams run in order, later; a held operation is not run before
// something waits for it, so a read that skips its wait sees the old bits; events order one stream
// after another; failures reach the host; memory is freed only after the device drained; and
// comm::StreamCommunicator runs a host communicator's collectives on a stream with the inner
// communicator's results, its byte ranges in flight until the host waited.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "zerotk/comm/stream_communicator.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/core/host_async.hpp"

using namespace zerotk;

namespace {

/// Device memory of the calling thread's current host_async device.
template <class T>
struct DeviceBuffer : BasicTrackedBuffer<T, HostAsyncSpace> {
  explicit DeviceBuffer(std::size_t n) : BasicTrackedBuffer<T, HostAsyncSpace>(n, MemoryCategory::other) {}
};

/// Every operation held until waited for; nothing runs on a timer during a test.
host_async::Options held() {
  host_async::Options o;
  o.hold = 1.0;
  o.release_after = std::chrono::milliseconds(60'000);
  return o;
}

}  // namespace

TEST_CASE("a host_async stream runs its operations in order, whatever each one's draw") {
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    host_async::Options o;
    o.seed = seed;
    host_async::Device dev(o);
    host_async::Stream s = dev.make_stream();
    std::vector<int> order;
    for (int i = 0; i < 500; ++i) s.enqueue([&order, i] { order.push_back(i); });
    s.synchronize();
    std::vector<int> want(500);
    std::iota(want.begin(), want.end(), 0);
    CHECK(order == want);
    const host_async::StreamStats st = s.stats();
    CHECK(st.operations == 500);
    CHECK(st.held > 0);    // seed-drawn: about half are held
    CHECK(st.held < 500);
    CHECK(st.released_unwaited == 0);
  }
}

TEST_CASE("a held operation runs only once something waits for it: a read that skips the wait sees the old bits") {
  host_async::Device dev(held());
  host_async::Stream s = dev.make_stream();
  int x = 0;
  s.enqueue([&x] { x = 1; });
  const host_async::Event e = s.record();
  CHECK_FALSE(e.reached());
  CHECK(x == 0);  // the host did not wait: the old value
  e.synchronize();
  CHECK(e.reached());
  CHECK(x == 1);
}

TEST_CASE("Stream::wait orders a stream after another's event; without it the reader runs ahead") {
  host_async::Device dev(held());
  host_async::Stream producer = dev.make_stream(), consumer = dev.make_stream();
  int x = 0, seen_after_wait = -1, seen_without = -1;
  producer.enqueue([&x] { x = 1; });
  consumer.enqueue([&] { seen_without = x; });  // no wait: the producer is still held
  consumer.synchronize();
  CHECK(seen_without == 0);
  consumer.wait(producer.record());
  consumer.enqueue([&] { seen_after_wait = x; });
  consumer.synchronize();  // asks the producer to run through the event
  CHECK(seen_after_wait == 1);
}

TEST_CASE("an operation's failure reaches the host at the next synchronize, once") {
  host_async::Device dev;
  host_async::Stream s = dev.make_stream();
  int after = 0;
  s.enqueue([] { throw std::runtime_error("kernel failed"); });
  s.enqueue([&after] { after = 1; });
  CHECK_THROWS_WITH_AS(s.synchronize(), "kernel failed", std::runtime_error);
  CHECK(after == 1);
  CHECK_NOTHROW(s.synchronize());
}

TEST_CASE("HostAsyncSpace: allocation needs a current device; freeing waits for the device's streams") {
  using AsyncBuffer = BasicTrackedBuffer<float, HostAsyncSpace>;
  CHECK_THROWS_WITH_AS((void)AsyncBuffer(4, MemoryCategory::other),
                       doctest::Contains("no host_async device is current"), usage_error);
  host_async::Device dev(held());
  host_async::CurrentDevice current(dev);
  host_async::Stream s = dev.make_stream();
  MemoryLedger ledger;
  std::atomic<bool> ran{false};
  {
    AsyncBuffer b(16, MemoryCategory::grads, &ledger);
    CHECK(ledger.live(MemorySpace::device, MemoryCategory::grads) == 16 * sizeof(float));
    float* p = b.data();
    s.enqueue([p, &ran] {
      p[3] = 2.0f;
      ran = true;
    });
    CHECK_FALSE(ran.load());
  }  // freed here: first the held write runs
  CHECK(ran.load());
  CHECK(ledger.live(MemorySpace::device, MemoryCategory::grads) == 0);
}

TEST_CASE("StreamCommunicator: the inner communicator's results, its Work done once the stream ran it") {
  comm::run_threads(3, [](comm::ThreadsCommunicator& c) {
    host_async::Options o = held();
    o.seed = 11 + static_cast<std::uint64_t>(c.rank());
    host_async::Device dev(o);
    host_async::CurrentDevice current(dev);
    comm::StreamCommunicator<comm::ThreadsCommunicator> sc(c.split(0, c.rank()), dev);
    CHECK(sc.rank() == c.rank());
    CHECK(sc.size() == 3);
    DeviceBuffer<float> x(4), sum(4);
    std::fill_n(x.data(), 4, static_cast<float>(c.rank() + 1));  // the test's host view of device memory
    comm::Work w = sc.all_reduce(x.data(), sum.data(), 4, DType::fp32, comm::ReduceOp::sum);
    CHECK(sum.data()[0] == 0.0f);  // held: not run before the wait
    w.wait();
    CHECK(std::vector<float>(sum.data(), sum.data() + 4) == std::vector<float>(4, 6.0f));
    DeviceBuffer<int> mine(1), all(3);
    mine.data()[0] = c.rank();
    sc.all_gather(mine.data(), all.data(), 1, DType::int32).wait();
    CHECK(std::vector<int>(all.data(), all.data() + 3) == std::vector<int>{0, 1, 2});
    // A split runs on the same stream, over the ranks of one color.
    auto half = sc.split(c.rank() % 2, c.rank());
    CHECK(half.size() == (c.rank() % 2 == 0 ? 2 : 1));
    DeviceBuffer<int> one(1), count(1);
    one.data()[0] = 1;
    half.all_reduce(one.data(), count.data(), 1, DType::int32, comm::ReduceOp::sum).wait();
    CHECK(count.data()[0] == half.size());
    CHECK(sc.stats()[comm::OpKind::all_reduce].calls == 1);
    // Host memory is refused, naming the call, as NCCL would fail on it.
    std::vector<float> host(4);
    CHECK_THROWS_WITH_AS((void)sc.all_reduce(host.data(), host.data(), 4, DType::fp32, comm::ReduceOp::sum),
                         doctest::Contains("not the device's"), usage_error);
  });
}

TEST_CASE("StreamCommunicator: a collective's buffers are in flight until the host waited for its Work") {
  comm::run_threads(2, [](comm::ThreadsCommunicator& c) {
    host_async::Device dev(held());
    host_async::CurrentDevice current(dev);
    comm::StreamCommunicator<comm::ThreadsCommunicator> sc(c.split(0, c.rank()), dev);
    DeviceBuffer<double> buf(8), other(1);
    std::fill_n(buf.data(), 8, 1.0);
    comm::Work w = sc.all_reduce(buf.data(), buf.data(), 8, DType::fp64, comm::ReduceOp::sum);
    const host_async::Range third{buf.data() + 2, sizeof(double)};
    const host_async::Range elsewhere{other.data(), sizeof(double)};
    CHECK(dev.in_flight().size() == 1);
    // Reading what it writes, or writing what it reads, is refused naming the collective.
    const std::string named = "all_reduce on rank " + std::to_string(c.rank()) + " of 2";
    CHECK_THROWS_WITH_AS(dev.in_flight().check("cast", {third}, {}), doctest::Contains(named.c_str()), usage_error);
    CHECK_THROWS_AS(dev.in_flight().check("zero", {}, {third}), usage_error);
    CHECK_NOTHROW(dev.in_flight().check("zero", {elsewhere}, {elsewhere}));
    w.wait();
    CHECK(dev.in_flight().size() == 0);
    CHECK_NOTHROW(dev.in_flight().check("cast", {third}, {third}));
    CHECK(buf.data()[2] == 2.0);
    // What the device owns: inside one of its allocations, not across or outside.
    CHECK(dev.owns(third));
    CHECK_FALSE(dev.owns(host_async::Range{buf.data() + 7, 2 * sizeof(double)}));
    CHECK_FALSE(dev.owns(host_async::Range{&c, 1}));
  });
}
