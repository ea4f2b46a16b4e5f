#pragma once
// Two tiny communicators for tests of code that only all-reduces one scalar (overflow flags,
// sums of squares). Both satisfy zerotk::comm::Communicator; every other collective throws.
//
// - FakeGroup: one rank of a pretend group. The other ranks' contributions are preset; its
//   all_reduce combines them with this rank's value in rank order and records the call.
// - BoardComm: W real threads meeting at a std::barrier; all_reduce posts each rank's scalar on a
//   shared board and reduces the board in rank order (so sums are identical on every rank).

#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "zerotk/comm/communicator.hpp"

namespace zerotk_test {

using zerotk::DType;
using zerotk::comm::ReduceOp;
using zerotk::comm::Work;

inline double read_scalar(const void* p, DType t) {
  switch (t) {
    case DType::uint8: return *static_cast<const std::uint8_t*>(p);
    case DType::int32: return *static_cast<const std::int32_t*>(p);
    case DType::fp64: return *static_cast<const double*>(p);
    case DType::fp32: return *static_cast<const float*>(p);
    default: throw zerotk::usage_error("test communicator: dtype not supported", "read_scalar");
  }
}

inline void write_scalar(void* p, DType t, double v) {
  switch (t) {
    case DType::uint8: *static_cast<std::uint8_t*>(p) = static_cast<std::uint8_t>(v); return;
    case DType::int32: *static_cast<std::int32_t*>(p) = static_cast<std::int32_t>(v); return;
    case DType::fp64: *static_cast<double*>(p) = v; return;
    case DType::fp32: *static_cast<float*>(p) = static_cast<float>(v); return;
    default: throw zerotk::usage_error("test communicator: dtype not supported", "write_scalar");
  }
}

/// Reduces in rank order: the same operation sequence on every rank.
inline double reduce_in_rank_order(const std::vector<double>& v, ReduceOp op) {
  double acc = v.at(0);
  for (std::size_t i = 1; i < v.size(); ++i) {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: acc += v[i]; break;
      case ReduceOp::max: acc = v[i] > acc ? v[i] : acc; break;
      case ReduceOp::min: acc = v[i] < acc ? v[i] : acc; break;
    }
  }
  return op == ReduceOp::avg ? acc / static_cast<double>(v.size()) : acc;
}

/// The collectives these tests never use.
template <class Self>
struct ScalarOnlyComm {
  static Work unused(const char* what) {
    throw zerotk::usage_error(std::string(what) + " is not implemented by this test communicator", "fake_comm.hpp");
  }
  Work reduce_scatter(const void*, void*, std::size_t, DType, ReduceOp) { return unused("reduce_scatter"); }
  Work all_gather(const void*, void*, std::size_t, DType) { return unused("all_gather"); }
  Work all_gatherv(const void*, std::size_t, void*, std::span<const std::size_t>, DType) {
    return unused("all_gatherv");
  }
  Work broadcast(void*, std::size_t, DType, int) { return unused("broadcast"); }
  Work reduce(const void*, void*, std::size_t, DType, ReduceOp, int) { return unused("reduce"); }
  Work all_to_all(const void*, void*, std::size_t, DType) { return unused("all_to_all"); }
  Work all_to_all_v(const void*, std::span<const std::size_t>, void*, std::span<const std::size_t>, DType) {
    return unused("all_to_all_v");
  }
  Work send(const void*, std::size_t, DType, int, int) { return unused("send"); }
  Work recv(void*, std::size_t, DType, int, int) { return unused("recv"); }
  Work barrier() { return unused("barrier"); }
  Self split(int, int) {
    static_cast<void>(unused("split"));  // throws; the Work it would return is never made
    return static_cast<Self&>(*this);
  }
  const zerotk::comm::CommStats& stats() const { return stats_; }

 protected:
  zerotk::comm::CommStats stats_{};
};

struct RecordedCall {
  std::size_t count;
  DType dtype;
  ReduceOp op;
  bool in_place;
};

class FakeGroup : public ScalarOnlyComm<FakeGroup> {
 public:
  /// `others`: what the other ranks contribute, in rank order without this rank.
  FakeGroup(int rank, std::vector<double> others) : rank_(rank), others_(std::move(others)) {}
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(others_.size()) + 1; }

  Work all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
    calls.push_back({count, t, op, send == recv});
    if (count != 1) return unused("all_reduce of more than one element");
    std::vector<double> v = others_;
    v.insert(v.begin() + rank_, read_scalar(send, t));
    write_scalar(recv, t, reduce_in_rank_order(v, op));
    ++stats_[zerotk::comm::OpKind::all_reduce].calls;
    return Work{};
  }

  std::vector<RecordedCall> calls;

 private:
  int rank_;
  std::vector<double> others_;
};

class BoardComm : public ScalarOnlyComm<BoardComm> {
 public:
  struct Board {
    explicit Board(int world) : bar(world), slots(static_cast<std::size_t>(world)) {}
    std::barrier<> bar;
    std::vector<double> slots;
  };
  BoardComm(std::shared_ptr<Board> board, int rank) : board_(std::move(board)), rank_(rank) {}
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(board_->slots.size()); }

  Work all_reduce(const void* send, void* recv, std::size_t count, DType t, ReduceOp op) {
    if (count != 1) return unused("all_reduce of more than one element");
    board_->slots[static_cast<std::size_t>(rank_)] = read_scalar(send, t);
    board_->bar.arrive_and_wait();  // every rank has posted
    const double r = reduce_in_rank_order(board_->slots, op);
    board_->bar.arrive_and_wait();  // every rank has read before anyone posts again
    write_scalar(recv, t, r);
    return Work{};
  }

 private:
  std::shared_ptr<Board> board_;
  int rank_;
};

/// Runs fn(comm) on `world` threads and joins; the first exception is rethrown.
inline void run_board(int world, const std::function<void(BoardComm&)>& fn) {
  auto board = std::make_shared<BoardComm::Board>(world);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      BoardComm c(board, r);
      try {
        fn(c);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

static_assert(zerotk::comm::Communicator<FakeGroup>);
static_assert(zerotk::comm::Communicator<BoardComm>);

}  // namespace zerotk_test
