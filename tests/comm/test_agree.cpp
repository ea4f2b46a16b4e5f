// comm/agree.hpp: agreeing on a failure that happened on some ranks only (threads back end).
#include <doctest/doctest.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "zerotk/comm/agree.hpp"
#include "zerotk/comm/threads.hpp"

namespace test_agree {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;

namespace {
/// Each rank's agree_on_failure result when `fail(rank)` says what that rank throws.
template <class Fail>
std::vector<std::optional<comm::Failure>> agree(int world, Fail&& fail) {
  std::vector<std::optional<comm::Failure>> out(static_cast<std::size_t>(world));
  comm::run_threads(world, [&](comm::ThreadsCommunicator& c) {
    std::exception_ptr mine;
    try {
      fail(c.rank());
    } catch (...) {
      mine = std::current_exception();
    }
    out[static_cast<std::size_t>(c.rank())] = comm::agree_on_failure(c, mine);
  });
  return out;
}
}  // namespace

TEST_CASE("agree_on_failure: every rank learns the lowest failed rank, its error's kind and its reason") {
  SUBCASE("nobody failed") {
    for (const auto& f : agree(3, [](int) {})) CHECK(!f);
  }
  SUBCASE("one zerotk error: its kind, and where/message/value without the what() prefix") {
    for (const auto& f : agree(3, [](int r) {
           if (r == 2) throw config_error("must be > 0", "/train_batch_size", "-4");
         })) {
      REQUIRE(f);
      CHECK(f->rank == 2);
      CHECK(f->kind == ErrorKind::config);
      CHECK(f->reason == "/train_batch_size: must be > 0 (got -4)");
    }
  }
  SUBCASE("two ranks failed: the lowest one's; another exception type has no kind") {
    for (const auto& f : agree(4, [](int r) {
           if (r == 1) throw std::runtime_error("torch said no");
           if (r == 3) throw io_error("short read");
         })) {
      REQUIRE(f);
      CHECK(f->rank == 1);
      CHECK(!f->kind);
      CHECK(f->reason == "torch said no");
    }
  }
  SUBCASE("a long reason is cut at kMaxFailureReasonBytes") {
    const std::string big(comm::kMaxFailureReasonBytes + 100, 'x');
    for (const auto& f : agree(2, [&](int r) {
           if (r == 0) throw std::runtime_error(big);
         })) {
      REQUIRE(f);
      CHECK(f->reason == std::string(comm::kMaxFailureReasonBytes, 'x') + "...");
    }
  }
}

}  // namespace test_agree
