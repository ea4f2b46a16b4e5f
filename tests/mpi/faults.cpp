// Fault injection for the MPI communicator: `mpiexec -np 2 zerotk_mpi_faults <case>` runs one
// faulty program; tests/mpi/fault_suite.sh runs every case and checks that each one ends, within
// the timeout, with a zerotk error naming the ranks and the operation (never a hang, never a silent
// abort or a wrong result). Rank 1 is the faulty one unless the case says otherwise.
//
// Each rank prints what it caught as "rank R caught: <what()>" and returns 1, as a trainer's main
// would; the MpiSession's destructor then finalizes, or aborts the job with its own message.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/mpi.hpp"

using zerotk::DType;
using zerotk::comm::MpiCommunicator;
using zerotk::comm::MpiSession;
using zerotk::comm::ReduceOp;

namespace {

constexpr std::size_t kCount = 1000;

// Every case: what rank 0 and rank 1 do (rank 0 is well-behaved unless stated).
int run_case(std::string_view name, MpiCommunicator& c) {
  const int r = c.rank();
  std::vector<float> x(2 * kCount, 1.f), y(2 * kCount, 0.f);
  std::vector<double> d(kCount, 1.0);
  const auto sum1000 = [&] { c.all_reduce(x.data(), y.data(), kCount, DType::fp32, ReduceOp::sum).wait(); };

  if (name == "count") {  // mismatched count: MPI would truncate or hang
    c.all_reduce(x.data(), y.data(), r == 1 ? kCount - 1 : kCount, DType::fp32, ReduceOp::sum).wait();
  } else if (name == "dtype") {  // mismatched dtype (fp64: twice the bytes)
    if (r == 1) {
      c.all_reduce(d.data(), d.data(), kCount, DType::fp64, ReduceOp::sum).wait();
    } else {
      sum1000();
    }
  } else if (name == "op") {  // sum on one rank, max on the other: MPI would return wrong results silently
    c.all_reduce(x.data(), y.data(), kCount, DType::fp32, r == 1 ? ReduceOp::max : ReduceOp::sum).wait();
  } else if (name == "root") {  // broadcast with different roots: silently wrong in MPI
    c.broadcast(x.data(), kCount, DType::fp32, r).wait();
  } else if (name == "kind") {  // all_reduce against an all_gather of the same bytes
    if (r == 1) {
      c.all_gather(x.data(), y.data(), kCount, DType::fp32).wait();
    } else {
      c.all_reduce(x.data(), y.data(), 2 * kCount, DType::fp32, ReduceOp::sum).wait();
    }
  } else if (name == "order") {  // the same two collectives, called in another order
    if (r == 1) {
      c.broadcast(x.data(), kCount, DType::fp32, 0).wait();
      sum1000();
    } else {
      sum1000();
      c.broadcast(x.data(), kCount, DType::fp32, 0).wait();
    }
  } else if (name == "caught") {  // rank 1 fails, main catches it and returns: MPI_Finalize
    if (r == 1) {
      try {
        throw std::runtime_error("injected failure on rank 1");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank 1 caught: %s\n", e.what());
        return 1;
      }
    }
    sum1000();
  } else if (name == "absent") {  // rank 1 never calls the collective and returns normally
    if (r != 1) sum1000();
  } else if (name == "stopped") {  // rank 1 is stopped (SIGSTOP) before the collective
    if (r == 1) std::raise(SIGSTOP);
    sum1000();
  } else if (name == "grid_stopped") {
    // np 4, a grid of tensor 2 x data 2: world rank 3 (tensor 1 of data 1) is stopped before its tensor
    // group's collective; world rank 2, its peer there, must name it by its world rank too.
    zerotk::comm::ProcessGrid grid(c, {.tensor = 2});
    if (r == 3) std::raise(SIGSTOP);
    grid.tensor().all_reduce(x.data(), y.data(), kCount, DType::fp32, ReduceOp::sum).wait();
  } else if (name == "dropped") {  // mismatched count, and the Works are dropped without wait()
    zerotk::comm::Work w = c.all_reduce(x.data(), x.data(), r == 1 ? kCount - 1 : kCount, DType::fp32, ReduceOp::sum);
    // w is destroyed here unfinished: its error must not be lost (the session aborts with it)
  } else if (name == "raw_truncate") {
    // The application's own nonblocking collective on native() with mismatched counts: Open MPI
    // reports MPI_ERR_TRUNCATE through MPI_COMM_WORLD's handler; zerotk set it to return.
    MPI_Request req;
    MPI_Iallreduce(MPI_IN_PLACE, x.data(), r == 1 ? 8 : 16, MPI_FLOAT, MPI_SUM, c.native(), &req);
    const double t0 = MPI_Wtime();
    for (int done = 0; !done && MPI_Wtime() - t0 < 5.0;) {
      const int rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        throw zerotk::comm_error("MPI_Iallreduce failed: " + zerotk::comm::detail::mpi::error_text(rc),
                                 "rank " + std::to_string(r) + " of world");
      }
    }
    MpiSession::abort("raw_truncate: no MPI error was returned within 5 s");
  } else {
    std::fprintf(stderr, "unknown case '%.*s'\n", static_cast<int>(name.size()), name.data());
    return 2;
  }
  std::fprintf(stderr, "rank %d: case %.*s finished without an error\n", r, static_cast<int>(name.size()),
               name.data());
  return 0;
}

// The GPT example's structure: the session lives inside a function, main catches outside it.
int session_in_function(std::string_view name, int argc, char** argv) {
  MpiSession mpi(argc, argv);
  auto c = MpiCommunicator::world();
  if (name == "escape") {  // rank 1 throws out of the session's scope while rank 0 waits
    std::vector<float> x(kCount, 1.f);
    if (c.rank() == 1) throw std::runtime_error("injected failure on rank 1");
    c.all_reduce(x.data(), x.data(), kCount, DType::fp32, ReduceOp::sum).wait();
    return 0;
  }
  try {
    return run_case(name, c);
  } catch (const zerotk::error& e) {
    std::fprintf(stderr, "rank %d caught: %s\n", c.rank(), e.what());
    if (name == "raw_truncate") MpiSession::abort(e.what());  // its raw request is still pending
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: mpiexec -np 2 %s <case>\n", argv[0]);
    return 2;
  }
  const std::string name = argv[1];
  try {
    return session_in_function(name, argc, argv);
  } catch (const std::exception& e) {  // after the session is gone (the GPT example's main)
    std::fprintf(stderr, "main caught: %s\n", e.what());
    return 1;
  }
}
