// The parts Recompute<L> is built from: the meter's arithmetic against the ledger, the layer
// selection and its parse errors, the copy thread's order and error hand-back, the traits' round trip
// for matrices and vectors, and the boundary synchronisation and profile of Checkpointing.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "zerotk/activation.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/param.hpp"

namespace {
namespace act = zerotk::activation;

// A dense matrix shaped like Eigen's (rows, cols, data, resize) without Eigen.
struct TinyMatrix {
  using Scalar = double;
  std::int64_t r = 0, c = 0;
  std::vector<double> v;
  std::int64_t rows() const { return r; }
  std::int64_t cols() const { return c; }
  const double* data() const { return v.data(); }
  double* data() { return v.data(); }
  void resize(std::int64_t rr, std::int64_t cc) {
    r = rr;
    c = cc;
    v.resize(static_cast<std::size_t>(rr * cc));
  }
};
static_assert(act::Savable<TinyMatrix>);
static_assert(act::Savable<std::vector<float>>);
static_assert(!act::Savable<std::string_view>);

// y = x (copies), for the boundary and profile checks.
struct Copy {
  using input_type = std::vector<float>;
  using output_type = std::vector<float>;
  zerotk::Param<float> p{"p", {1}};
  std::vector<float> y_;
  template <class Visit>
  void parameters(Visit&& visit) {
    visit(p.name(), p);
  }
  const std::vector<float>& forward(const std::vector<float>& x) { return y_ = x; }
  const std::vector<float>& backward(const std::vector<float>& dy) { return y_ = dy; }
  void release_activations() { y_ = {}; }
};

}  // namespace

TEST_CASE("Meter: the ledger's activations follow the latest size reported per key and space") {
  zerotk::MemoryLedger ledger;
  {
    act::Meter m(&ledger);
    int a = 0, b = 0;
    m.set(&a, 100);
    m.set(&b, 50, zerotk::MemorySpace::pinned_host);
    m.set(&a, 100);  // the same again changes nothing
    CHECK(ledger.live(zerotk::MemoryCategory::activations) == 150);
    m.set(&a, 30);
    CHECK(ledger.live(zerotk::MemorySpace::host, zerotk::MemoryCategory::activations) == 30);
    CHECK(ledger.live(zerotk::MemorySpace::pinned_host, zerotk::MemoryCategory::activations) == 50);
    CHECK(ledger.peak(zerotk::MemoryCategory::activations) == 150);
    CHECK(m.held(&a) == 30);
    CHECK(m.total() == 80);
  }
  CHECK(ledger.live(zerotk::MemoryCategory::activations) == 0);  // the meter gave everything back
}

TEST_CASE("Select: all, none, every k-th and parse errors naming the flag") {
  CHECK(act::Select::all()(7));
  CHECK_FALSE(act::Select::none()(0));
  const auto e3 = act::Select::every(3);
  std::vector<std::size_t> picked;
  for (std::size_t i = 0; i < 8; ++i) {
    if (e3(i)) picked.push_back(i);
  }
  CHECK(picked == std::vector<std::size_t>{0, 3, 6});
  CHECK(act::Select::parse("every:2", "--x").text() == "every:2");
  CHECK(act::Select::parse("every:1", "--x").text() == "all");
  for (const char* bad : {"every:0", "every:", "every:2x", "some", "every:-1"}) {
    CAPTURE(bad);
    try {
      (void)act::Select::parse(bad, "--checkpoint-activations");
      FAIL("expected an error");
    } catch (const zerotk::usage_error& e) {
      CHECK(e.where() == "--checkpoint-activations");
      CHECK(e.value() == "\"" + std::string(bad) + "\"");
    }
  }
}

TEST_CASE("CopyWorker: copies run in order; a copy's exception comes back from wait, once") {
  act::CopyWorker w;
  std::vector<int> order;
  const auto t1 = w.submit([&] { order.push_back(1); });
  const auto t2 = w.submit([&] { order.push_back(2); });
  const auto t3 = w.submit([] { throw std::runtime_error("disk gone"); });
  w.wait(t2);
  CHECK(order.size() >= 2);
  CHECK_THROWS_WITH(w.wait(t3), "disk gone");
  CHECK_NOTHROW(w.wait(t1));  // reported once
  CHECK(order == std::vector<int>{1, 2});
}

TEST_CASE("ActivationTraits: save and restore round trip a matrix and a vector, shapes compared") {
  TinyMatrix m;
  m.resize(3, 2);
  for (std::size_t i = 0; i < m.v.size(); ++i) m.v[i] = 0.5 * static_cast<double>(i) - 1.0;
  using MT = act::ActivationTraits<TinyMatrix>;
  std::vector<std::byte> bytes(MT::bytes(m));
  CHECK(bytes.size() == 6 * sizeof(double));
  MT::save(m, bytes.data());
  TinyMatrix back;
  MT::restore(back, MT::shape(m), bytes.data());
  CHECK(back.v == m.v);
  CHECK(MT::shape(back) == MT::shape(m));
  CHECK(act::to_string(MT::shape(m)) == "[3, 2]");
  using VT = act::ActivationTraits<std::vector<std::int16_t>>;
  const std::vector<std::int16_t> v = {1, -2, 300};
  std::vector<std::byte> vb(VT::bytes(v));
  VT::save(v, vb.data());
  std::vector<std::int16_t> w;
  VT::restore(w, VT::shape(v), vb.data());
  CHECK(w == v);
}

TEST_CASE("Checkpointing: synchronize_checkpoint_boundary calls the hook around each forward and backward; profile counts recomputes") {
  act::Options o;
  o.synchronize_boundary = true;
  o.profile = true;
  act::Checkpointing ckpt(o);
  int syncs = 0;
  ckpt.set_synchronize([&] { ++syncs; });
  float pv = 0, pg = 0;
  Copy a, b;
  a.p.bind(&pv, &pg);
  b.p.bind(&pv, &pg);
  zerotk::Recompute<Copy> ra(a, ckpt, "first"), rb(b, ckpt, "second");
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> x = {1, 2, 3};
    const auto& y = rb.forward(ra.forward(x));
    CHECK(y == x);
    const auto& dx = ra.backward(rb.backward(x));
    CHECK(dx == x);
  }
  CHECK(syncs == 3 * 2 * 4);  // 3 steps x 2 layers x (forward in, out; backward in, out)
  CHECK(ckpt.synchronized() == syncs);
  REQUIRE(ckpt.profile().size() == 2);
  CHECK(ckpt.profile()[0].name == "first");
  CHECK(ckpt.profile()[0].recomputes == 3);
  CHECK(ckpt.profile()[1].recomputes == 3);
  const std::string report = ckpt.profile_report();
  CHECK(report.find("first") != std::string::npos);
  CHECK(report.find("(6 recomputes)") != std::string::npos);
  ckpt.clear_profile();
  CHECK(ckpt.profile()[0].recomputes == 0);
}
