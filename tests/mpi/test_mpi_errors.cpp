// MPI communicator: mismatches, dropped Works, deadlines and error handlers under mpiexec (np 2, 3,
// 4). Everything here leaves MPI clean (no request left behind), so the suite still finalizes; the
// faults that cannot (a collective timeout, a stopped or leaving rank) are in fault_suite.sh.
// Only CHECKs (no REQUIREs): a rank must never skip a collective the others will call.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "zerotk/comm/mpi.hpp"

namespace test_mpi_errors {  // the file's own names, apart from its suite's other files in a unity build

using namespace zerotk;
using comm::MpiCommunicator;
using comm::ReduceOp;

namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A fresh communicator over every rank, so a test may break it without touching the others.
MpiCommunicator fresh() {
  static MpiCommunicator w = MpiCommunicator::world();
  return w.split(0, w.rank());
}

// The comm_error `fn` throws on this rank ("" if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const comm_error& e) {
    return e.what();
  }
  return {};
}

bool mpi_left_clean() { return comm::detail::mpi::Process::get().unsafe.empty(); }

}  // namespace

TEST_CASE("mpi: mismatched collectives fail on every rank, naming two ranks and their calls; nothing reaches MPI") {
  struct Mismatch {
    const char* name;
    std::function<void(MpiCommunicator&, std::vector<float>&, bool odd)> call;
    const char* normal_text;
    const char* odd_text;
  };
  const Mismatch cases[] = {
      {"count",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         c.all_reduce(x.data(), x.data(), odd ? 7 : 8, DType::fp32, ReduceOp::sum).wait();
       },
       "all_reduce(count 8, fp32, sum)", "all_reduce(count 7, fp32, sum)"},
      {"dtype",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         c.all_reduce(x.data(), x.data(), 8, odd ? DType::int32 : DType::fp32, ReduceOp::sum).wait();
       },
       "all_reduce(count 8, fp32, sum)", "all_reduce(count 8, int32, sum)"},
      {"reduce op",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         c.all_reduce(x.data(), x.data(), 8, DType::fp32, odd ? ReduceOp::max : ReduceOp::sum).wait();
       },
       "all_reduce(count 8, fp32, sum)", "all_reduce(count 8, fp32, max)"},
      {"root",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         c.broadcast(x.data(), 8, DType::fp32, odd ? 1 : 0).wait();
       },
       "broadcast(count 8, fp32, root 0)", "broadcast(count 8, fp32, root 1)"},
      {"kind, same bytes on 2 ranks",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         std::vector<float> out(x.size() * static_cast<std::size_t>(c.size()));
         if (odd) {
           c.all_gather(x.data(), out.data(), 4, DType::fp32).wait();
         } else {
           c.all_reduce(x.data(), x.data(), 8, DType::fp32, ReduceOp::sum).wait();
         }
       },
       "all_reduce(count 8, fp32, sum)", "all_gather(count 4, fp32)"},
      {"order",
       [](MpiCommunicator& c, std::vector<float>& x, bool odd) {
         if (odd) c.broadcast(x.data(), 8, DType::fp32, 0).wait();
         c.all_reduce(x.data(), x.data(), 8, DType::fp32, ReduceOp::sum).wait();
         if (!odd) c.broadcast(x.data(), 8, DType::fp32, 0).wait();
       },
       "all_reduce(count 8, fp32, sum)", "broadcast(count 8, fp32, root 0)"},
  };
  for (const auto& m : cases) {
    MpiCommunicator c = fresh();
    const int odd_rank = c.size() - 1;
    const bool odd = c.rank() == odd_rank;
    std::vector<float> x(8, 1.f);
    const std::string e = error_of([&] { m.call(c, x, odd); });
    INFO("mismatch in ", m.name, " on rank ", c.rank(), ": ", e);
    CHECK(contains(e, "mismatched collective #0 on world/split(color 0): rank 0: " + std::string(m.normal_text)));
    CHECK(contains(e, "rank " + std::to_string(odd_rank) + ": " + m.odd_text));
    CHECK(x[0] == 1.f);  // no data call ran: the buffers are untouched
    // afterwards the communicator refuses further work instead of drifting
    const std::string after = error_of([&] { c.barrier().wait(); });
    CHECK(contains(after, "communicator unusable after an earlier error: mismatched collective #0"));
  }
  CHECK(mpi_left_clean());
}

TEST_CASE("mpi: a Work dropped without wait() keeps its error: the communicator's next call throws it") {
  MpiCommunicator c = fresh();
  std::vector<float> x(8, 1.f);
  {
    comm::Work w = c.all_reduce(x.data(), x.data(), c.rank() == 0 ? 8 : 7, DType::fp32, ReduceOp::sum);
    (void)w;  // destroyed unfinished: before this fix its error vanished and the data stayed unreduced
  }
  const std::string e = error_of([&] { c.barrier().wait(); });
  CHECK(contains(e, "of an operation whose Work was destroyed without wait()"));
  CHECK(contains(e, "mismatched collective #0"));
  // Met once, the error no longer counts as unobserved: MpiSession will finalize normally.
  CHECK(comm::detail::mpi::Process::get().unobserved.empty());
  CHECK(mpi_left_clean());
}

TEST_CASE("mpi: a receive whose message never comes times out naming the peer and what it is doing") {
  MpiCommunicator c = fresh();
  float x = 0;
  if (c.rank() == 1) {
    c.set_timeout_ms(300);
    const std::string e = error_of([&] { c.recv(&x, 1, DType::fp32, 0, 3).wait(); });
    CHECK(contains(e, "timed out after 300 ms in recv(count 1, fp32) from rank 0, tag 3 on world/split(color 0): "
                      "rank 0 has not sent it"));
    // rank 0 answered from inside its wait
    CHECK(contains(e, "rank 0: last call on this communicator: #0 barrier(); now waiting in barrier() #0 on "
                      "world/split(color 0)"));
    // test() polls against the same deadline, counted from the first test()
    comm::Work w = c.recv(&x, 1, DType::fp32, 0, 4);
    const std::string polled = error_of([&] {
      while (!w.test()) {
      }
    });
    CHECK(contains(polled, "timed out after 300 ms in recv(count 1, fp32) from rank 0, tag 4"));
    c.set_timeout_ms(30000);
  }
  c.barrier().wait();  // the receives were cancelled: the communicator and MPI stay usable
  CHECK(mpi_left_clean());
}

TEST_CASE("mpi: MPI errors return everywhere, including MPI_COMM_WORLD (Open MPI reports nonblocking collectives' errors there)") {
  MpiCommunicator c = fresh();
  for (MPI_Comm comm : {MPI_COMM_WORLD, MPI_COMM_SELF, c.native()}) {
    MPI_Errhandler h = MPI_ERRHANDLER_NULL;
    MPI_Comm_get_errhandler(comm, &h);
    CHECK(h == MPI_ERRORS_RETURN);
    MPI_Errhandler_free(&h);
  }
}

TEST_CASE("mpi: ZEROTK_COMM_TIMEOUT_MS=9223372036854775807 means never, not at once") {
  const char* old = std::getenv("ZEROTK_COMM_TIMEOUT_MS");
  const std::string saved = old ? old : "";
  ::setenv("ZEROTK_COMM_TIMEOUT_MS", "9223372036854775807", 1);
  MpiCommunicator c = MpiCommunicator::world();
  CHECK(c.timeout_ms() == INT64_MAX);
  std::vector<std::int32_t> x(100, 1);
  c.all_reduce(x.data(), x.data(), x.size(), DType::int32, ReduceOp::sum).wait();  // the deadline saturates
  comm::Work w = c.barrier();
  while (!w.test()) {
  }
  CHECK(x[99] == c.size());
  MpiCommunicator sub = c.split(0, c.rank());
  CHECK(sub.timeout_ms() == INT64_MAX);  // splits inherit the timeout
  sub.set_timeout_ms(INT64_MAX);
  sub.all_reduce(x.data(), x.data(), x.size(), DType::int32, ReduceOp::max).wait();
  CHECK(x[0] == c.size());
  if (old) {
    ::setenv("ZEROTK_COMM_TIMEOUT_MS", saved.c_str(), 1);
  } else {
    ::unsetenv("ZEROTK_COMM_TIMEOUT_MS");
  }
}

TEST_CASE("mpi: names, timeouts, and a one-rank communicator (no signature exchange needed)") {
  MpiCommunicator c = fresh();
  CHECK(c.name() == "world/split(color 0)");
  CHECK(c.split_node_local().name() == "world/split(color 0)/node");
  CHECK_THROWS_AS(c.set_timeout_ms(0), usage_error);
  CHECK_THROWS_AS(MpiCommunicator::duplicate(MPI_COMM_WORLD, comm::MpiOptions{0}), usage_error);
  MpiCommunicator self = c.split(c.rank(), 0);
  CHECK(self.size() == 1);
  std::vector<float> x(5, 2.f), y(5, 0.f);
  self.all_reduce(x.data(), y.data(), 5, DType::fp32, ReduceOp::avg).wait();
  CHECK(y[4] == 2.f);
  self.barrier().wait();
  CHECK(mpi_left_clean());
}

}  // namespace test_mpi_errors
