// doctest main for MPI tests: every rank runs every test case (so collectives match); rank 0 prints
// the full report, the others only their failures; every rank exits nonzero if any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "zerotk/comm/mpi.hpp"

int main(int argc, char** argv) {
  zerotk::comm::MpiSession mpi(argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  doctest::Context context(argc, argv);
  if (rank != 0) context.setOption("minimal", true);
  const int failed = context.run();
  int any = failed != 0 ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  return any;
}
