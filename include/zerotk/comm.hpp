#pragma once
/// \file zerotk/comm.hpp
/// The communication layer: the Communicator concept and Work handles, byte counters, the threads
/// back end, typed wrappers, the process grid, topologies and hierarchical collectives, type erasure
/// (AnyCommunicator); plus the MPI and NCCL back ends when this build has them (zerotk::mpi,
/// zerotk::nccl).
#include "zerotk/comm/accounting.hpp"
#include "zerotk/comm/any.hpp"
#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/hierarchical.hpp"
#include "zerotk/comm/threads.hpp"
#include "zerotk/comm/timeout.hpp"
#include "zerotk/comm/topology.hpp"
#include "zerotk/comm/typed.hpp"
#if ZEROTK_HAS_MPI
#include "zerotk/comm/mpi.hpp"
#endif
#if ZEROTK_HAS_NCCL
#include "zerotk/comm/nccl.hpp"
#endif
