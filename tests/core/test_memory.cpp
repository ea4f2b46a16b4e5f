#include <doctest/doctest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "zerotk/core/memory.hpp"

using namespace zerotk;

TEST_CASE("aligned allocations are 64-byte aligned, including zero bytes") {
  for (std::size_t n : {0u, 1u, 63u, 64u, 1000u}) {
    void* p = aligned_alloc_bytes(n);
    CHECK(reinterpret_cast<std::uintptr_t>(p) % kAlignment == 0);
    aligned_free_bytes(p);
  }
  std::vector<double, AlignedAllocator<double>> v(17, 1.0);
  CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % kAlignment == 0);
}

TEST_CASE("ledger tracks live bytes and peaks per category") {
  MemoryLedger ledger;
  {
    TrackedBuffer<float> a(1000, MemoryCategory::master32, &ledger);
    CHECK(ledger.live(MemoryCategory::master32) == 4000);
    {
      TrackedBuffer<std::uint16_t> b(500, MemoryCategory::params16, &ledger);
      CHECK(ledger.live_total() == 5000);
      CHECK(b[499] == 0);  // zero-initialised
    }
    CHECK(ledger.live(MemoryCategory::params16) == 0);
    CHECK(ledger.peak(MemoryCategory::params16) == 1000);
    CHECK(ledger.peak_total() == 5000);
    TrackedBuffer<float> moved = std::move(a);
    CHECK(ledger.live(MemoryCategory::master32) == 4000);  // a move does not double count
    CHECK(a.empty());
  }
  CHECK(ledger.live_total() == 0);
  CHECK(ledger.peak_total() == 5000);
  ledger.reset_peaks();
  CHECK(ledger.peak_total() == 0);
}

TEST_CASE("ledger is consistent under concurrent allocation") {
  MemoryLedger ledger;
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        TrackedBuffer<float> b(16, MemoryCategory::comm_buffers, &ledger);
      }
    });
  }
  for (auto& t : ts) t.join();
  CHECK(ledger.live_total() == 0);
  CHECK(ledger.peak(MemoryCategory::comm_buffers) >= 64);
  CHECK(ledger.peak(MemoryCategory::comm_buffers) <= 4 * 64);
}

TEST_CASE("pinned buffer: usable memory and an honest report of how it was pinned") {
  PinnedBuffer p(1 << 16);
  REQUIRE(p.data() != nullptr);
  CHECK(p.bytes() == (1u << 16));
  auto* bytes = static_cast<unsigned char*>(p.data());
  bytes[0] = 1;
  bytes[(1 << 16) - 1] = 2;
  if (p.kind() == PinKind::cuda_host) {
    CHECK(p.fallback_reason().empty());
  } else {
    CHECK_FALSE(p.fallback_reason().empty());
  }
  PinnedBuffer q = std::move(p);
  CHECK(q.data() != nullptr);
  CHECK(p.data() == nullptr);
}

TEST_CASE("the ledger keeps bytes by memory space and category; one-argument queries sum over spaces") {
  MemoryLedger l;
  l.add(MemorySpace::device, MemoryCategory::grads, 100);
  l.add(MemorySpace::host, MemoryCategory::grads, 30);
  l.add(MemorySpace::pinned_host, MemoryCategory::master32, 400);
  l.add(MemoryCategory::optimizer_state, 8);  // host
  CHECK(l.live(MemorySpace::device, MemoryCategory::grads) == 100);
  CHECK(l.live(MemorySpace::host, MemoryCategory::grads) == 30);
  CHECK(l.live(MemoryCategory::grads) == 130);
  CHECK(l.live(MemorySpace::host, MemoryCategory::optimizer_state) == 8);
  CHECK(l.live_total(MemorySpace::pinned_host) == 400);
  CHECK(l.live_total(MemorySpace::host) == 38);
  CHECK(l.live_total() == 538);
  l.sub(MemorySpace::device, MemoryCategory::grads, 100);
  CHECK(l.live(MemorySpace::device, MemoryCategory::grads) == 0);
  CHECK(l.peak(MemorySpace::device, MemoryCategory::grads) == 100);
  CHECK(l.peak_total(MemorySpace::device) == 100);
  CHECK(l.peak(MemoryCategory::grads) == 130);
  CHECK(l.live_total(MemorySpace::device) == 0);
  l.reset_peaks();
  CHECK(l.peak(MemorySpace::device, MemoryCategory::grads) == 0);
  CHECK(l.peak_total() == 438);
  CHECK(to_string(MemorySpace::disk) == "disk");
}

TEST_CASE("tracked host buffers are recorded under MemorySpace::host") {
  MemoryLedger l;
  {
    TrackedBuffer<float> b(10, MemoryCategory::params16, &l);
    CHECK(l.live(MemorySpace::host, MemoryCategory::params16) == 40);
    CHECK(l.live(MemorySpace::device, MemoryCategory::params16) == 0);
  }
  CHECK(l.live(MemoryCategory::params16) == 0);
}
