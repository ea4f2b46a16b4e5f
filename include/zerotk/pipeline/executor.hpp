#pragma once
/// \file zerotk/pipeline/executor.hpp
/// Runs one rank's part of a schedule: the user's stage functions for the computes, non-blocking
/// point-to-point transfers over the pipeline group for the tensors between stages, the user's
/// (or an engine's, pipeline/engine_hooks.hpp) hooks for the engine-facing actions.
///
///   comm::ProcessGrid grid(world, {.pipeline = 4});
///   pipeline::Executor exec(grid, pipeline::make_schedule(ScheduleSpec::parse("1f1b"), 4, 8));
///   pipeline::StageFunctions f;
///   f.forward = [&](const MicroBatch& mb, const Activation* in, Activation& out) { ... };
///   f.loss = ...; f.backward = ...;                       // or backward_input + backward_weight
///   for (int step = 0; step < steps; ++step) exec.run(f);
///
/// - Every step starts with one small all-gather over the pipeline group: ranks holding another
///   schedule, or resetting their shapes at another step, all fail there with the same usage_error
///   naming the first difference (pipeline/agreement.hpp).
/// - Shapes are negotiated once: the first activation sent over each link carries a shape header;
///   afterwards a forward whose output has another shape is a usage_error naming the rank, the
///   action and both shapes. `reset_shapes()` (on every rank, between two steps) starts afresh. A
///   stage may declare the input it expects (`expected_input`): a different announcement is a
///   usage_error naming both ranks and both shapes.
/// - Transfers: a receive is posted one compute ahead where its shape is known, waited for at its
///   action; sends are posted at their action and completed as the step goes on (their buffers go
///   back to a pool), all by the step's end. Tags come from `message_tag`: the simulator has
///   checked that messages meet in posting order. Buffers live from the action that fills them to
///   the one that last reads them: an input until its micro-batch's backward (B, or BW) returns.
/// - Figures: on the wall clock, each rank's busy time is what its stage functions and hooks took
///   (ns), the makespan the longest rank's step. On a virtual clock (`ExecutorOptions::
///   virtual_clock`) every action costs what the CostModel says and each message carries its
///   sender's time, so the figures are the simulator's to the tick.
/// Host-memory communicators only (threads, MPI); NCCL's device buffers are not supported yet.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/comm/typed.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/activation.hpp"
#include "zerotk/pipeline/agreement.hpp"
#include "zerotk/pipeline/schedule.hpp"
#include "zerotk/pipeline/simulator.hpp"
#include "zerotk/pipeline/text.hpp"

namespace zerotk::pipeline {

/// What a stage function is called for: the rank's local chunk, its virtual stage, the micro-batch.
struct MicroBatch {
  int chunk = 0, stage = 0, micro = 0;
  bool first_stage = false, last_stage = false;
};

/// The user's side of a pipeline rank. Only `forward` is always needed; `loss` on the rank holding
/// the last virtual stage; `backward`, or `backward_input` and `backward_weight`, for the
/// schedule's backwards (B runs backward_input then backward_weight when `backward` is not given;
/// BI and BW need those two). The engine-facing hooks are optional.
struct StageFunctions {
  /// Runs the chunk's layers. `input` is the previous stage's output (null on the first virtual
  /// stage: read the micro-batch's data yourself); write the result into `output` (`reset` it to
  /// its shape first). Save what backward needs, per micro-batch.
  std::function<void(const MicroBatch&, const Activation* input, Activation& output)> forward;
  /// Last virtual stage, right after its forward: returns the micro-batch's loss and writes
  /// dL/d(output), times the loss scale, into `grad` (already shaped like `output`).
  std::function<double(const MicroBatch&, const Activation& output, Activation& grad)> loss;
  /// From dL/d(output) to dL/d(input) (`grad_input` shaped like the input; null on the first virtual
  /// stage), adding the weight gradients.
  std::function<void(const MicroBatch&, const Activation& grad_output, Activation* grad_input)> backward;
  /// The input gradient only (zero-bubble schedules); the weight gradient follows in backward_weight.
  std::function<void(const MicroBatch&, const Activation& grad_output, Activation* grad_input)> backward_input;
  std::function<void(const MicroBatch&)> backward_weight;
  /// Engine-facing: the chunk's parameters are needed from here on / no longer this step.
  std::function<void(int chunk)> gather, release;
  /// Engine-facing: the micro-batch's gradients of the chunk are complete. `loss` is the micro-
  /// batch's loss on the last virtual stage's chunk, 0 elsewhere.
  std::function<void(const MicroBatch&, double loss)> reduce;
  /// Engine-facing: the step's last action.
  std::function<void()> optimizer_step;
  /// Optional: the input shape the chunk expects, checked against what the previous stage announces.
  std::function<std::optional<Shape>(int chunk)> expected_input;
};

struct ExecutorOptions {
  /// Run on a virtual clock with these costs (figures in ticks) instead of the wall clock (ns).
  std::optional<CostModel> virtual_clock{};
  /// On the wall clock: read each action's busy time (its stage function or hook) from this clock
  /// (nanoseconds) instead of steady_clock, e.g. the calling thread's CPU time, so that a rank
  /// descheduled inside a stage function (more rank threads than free cores) is not counted busy
  /// for that time. The makespan stays wall time.
  std::function<std::int64_t()> busy_clock{};
};

struct StepResult {
  Figures figures;              ///< every rank's; ticks on a virtual clock, nanoseconds otherwise
  bool virtual_clock = false;
  std::vector<double> losses;   ///< [m] on the rank holding the last virtual stage; empty elsewhere
};

template <comm::Communicator C>
class Executor {
  static_assert(!comm::uses_device_memory<C>,
                "pipeline::Executor moves host buffers: give it a host-memory communicator (threads, MPI); "
                "NCCL's device buffers are not supported yet");

 public:
  /// `pipeline`: the ranks of one pipeline, ordered by stage (a ProcessGrid's pipeline()); it must
  /// outlive the executor. The schedule is checked and simulated here (pipeline/simulator.hpp): a
  /// schedule that cannot run is refused before any transfer.
  Executor(C& pipeline, Schedule schedule, ExecutorOptions options = {})
      : comm_(&pipeline), s_(std::move(schedule)), opt_(std::move(options)) {
    if (comm_->size() != s_.stages) {
      throw usage_error("the pipeline group's size must equal the schedule's stages (" + std::to_string(s_.stages) + ")",
                        "pipeline::Executor", std::to_string(comm_->size()) + " ranks");
    }
    prediction_ = simulate(s_, opt_.virtual_clock.value_or(CostModel{}));
    text_ = to_text(s_);
    rank_ = comm_->rank();
    in_shape_.resize(static_cast<std::size_t>(s_.chunks));
    out_shape_.resize(static_cast<std::size_t>(s_.chunks));
    header_wait_.assign(static_cast<std::size_t>(s_.chunks), -1);
  }

  /// The same over a grid's pipeline group.
  Executor(comm::ProcessGrid<C>& grid, Schedule schedule, ExecutorOptions options = {})
      : Executor(grid.pipeline(), std::move(schedule), std::move(options)) {}

  const Schedule& schedule() const noexcept { return s_; }
  /// The simulator's figures for this schedule (on the virtual clock's costs, or unit costs).
  const SimulationReport& prediction() const noexcept { return prediction_; }
  int rank() const noexcept { return rank_; }

  /// Forget the negotiated shapes; the next step announces them again. Every rank of the
  /// pipeline calls it between the same two steps (checked at the next step's start).
  void reset_shapes() {
    for (auto& s : in_shape_) s.reset();
    for (auto& s : out_shape_) s.reset();
    announced_.clear();
    ++epoch_;
  }

  /// One optimizer step: this rank's actions, in order.
  StepResult run(StageFunctions& f) {
    check_agreement(*comm_, text_, epoch_);
    check_functions(f);
    expected_ = &f.expected_input;
    begin_step();
    const PendingGuard guard{this};  // a failing step gives its transfers up, releasing the peers
    const auto& list = s_.ranks[static_cast<std::size_t>(rank_)];
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (is_compute(a.op)) post_ahead(i);
      run_action(f, i, a);
      finish_sends(false);
    }
    finish_sends(true);
    const auto wall = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    return end_step(opt_.virtual_clock ? vt_ : static_cast<std::int64_t>(wall));
  }

 private:
  // One (chunk, micro-batch)'s tensors on this rank.
  struct Slot {
    Activation input, output, grad_output, grad_input;
    bool has_input = false;
    double loss = 0.0;
  };
  struct Recv {
    bool posted = false, header = false;
    ShapeHeader hdr{};
    std::int64_t stamp = 0;
    comm::Work header_work, data_work, stamp_work;
  };
  struct Send {
    Activation buffer;
    ShapeHeader hdr{};
    std::int64_t stamp = 0;
    comm::Work header_work, data_work, stamp_work;
  };

  // While an exception leaves run(): destroys the step's pending transfers during the unwinding, so
  // that each Work gives its operation up (WorkState::abandon) instead of waiting for it later.
  struct PendingGuard {
    Executor* e;
    ~PendingGuard() {
      if (std::uncaught_exceptions() == 0) return;
      e->recvs_.clear();
      e->sends_.clear();
    }
  };

  // ---- the step -------------------------------------------------------------------------------

  void check_functions(const StageFunctions& f) const {
    const std::string where = "pipeline::Executor::run on pipeline rank " + std::to_string(rank_);
    bool full = false, split = false;
    for (const Action& a : s_.ranks[static_cast<std::size_t>(rank_)]) {
      full = full || a.op == Op::backward;
      split = split || a.op == Op::backward_input || a.op == Op::backward_weight;
    }
    if (!f.forward) throw usage_error("StageFunctions::forward is required", where);
    bool last = false;
    for (int c = 0; c < s_.chunks; ++c) last = last || s_.last_stage(rank_, c);
    if (last && !f.loss) throw usage_error("this rank holds the last virtual stage: StageFunctions::loss is required", where);
    const bool halves = f.backward_input && f.backward_weight;
    if (split && !halves) {
      throw usage_error("the schedule (" + s_.generator + ") splits the backward into BI and BW: give "
                        "StageFunctions::backward_input and backward_weight", where);
    }
    if (full && !f.backward && !halves) {
      throw usage_error("the schedule's backwards need StageFunctions::backward (or backward_input and backward_weight)",
                        where);
    }
  }

  void begin_step() {
    const auto n = static_cast<std::size_t>(s_.chunks * s_.micro_batches);
    if (slots_.size() != n) slots_.resize(n);
    for (Slot& sl : slots_) sl.has_input = false;  // a failed step may have left inputs behind
    std::fill(header_wait_.begin(), header_wait_.end(), -1);
    recvs_.clear();
    recvs_.resize(s_.ranks[static_cast<std::size_t>(rank_)].size());
    losses_.assign(static_cast<std::size_t>(s_.micro_batches), 0.0);
    vt_ = busy_ = messages_ = 0;
    live_ = peak_ = 0;
  }

  StepResult end_step(std::int64_t finish) {
    double mine[4] = {static_cast<double>(busy_), static_cast<double>(peak_), static_cast<double>(messages_),
                      static_cast<double>(finish)};
    const auto p = static_cast<std::size_t>(s_.stages);
    std::vector<double> all(4 * p);
    comm_->all_gather(mine, all.data(), 4, DType::fp64).wait();
    StepResult r;
    r.virtual_clock = opt_.virtual_clock.has_value();
    for (std::size_t q = 0; q < p; ++q) {
      r.figures.busy.push_back(static_cast<std::int64_t>(all[4 * q]));
      r.figures.peak_live.push_back(static_cast<int>(all[4 * q + 1]));
      r.figures.messages.push_back(static_cast<std::int64_t>(all[4 * q + 2]));
      r.figures.makespan = std::max(r.figures.makespan, static_cast<std::int64_t>(all[4 * q + 3]));
    }
    for (int c = 0; c < s_.chunks; ++c) {
      if (s_.last_stage(rank_, c)) r.losses = losses_;
    }
    return r;
  }

  MicroBatch micro(const Action& a) const {
    const int k = s_.virtual_stage(rank_, a.chunk);
    return {a.chunk, k, a.micro, k == 0, k == s_.virtual_stages() - 1};
  }
  Slot& slot(const Action& a) {
    return slots_[static_cast<std::size_t>(a.chunk * s_.micro_batches + (a.micro < 0 ? 0 : a.micro))];
  }
  std::string site(std::size_t i) const { return "pipeline " + action_site(s_, rank_, i); }

  // Runs a stage function or hook, counting its time (wall clock) or its cost (virtual clock).
  template <class F>
  void timed(const Action& a, F&& fn) {
    if (opt_.busy_clock && !opt_.virtual_clock) {
      const std::int64_t t = opt_.busy_clock();
      fn();
      busy_ += opt_.busy_clock() - t;
      return;
    }
    const auto t = std::chrono::steady_clock::now();
    fn();
    if (opt_.virtual_clock) {
      const std::int64_t c = opt_.virtual_clock->cost(rank_, a);
      vt_ += c;
      busy_ += c;
    } else {
      busy_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t).count();
    }
  }

  void run_action(StageFunctions& f, std::size_t i, const Action& a) {
    switch (a.op) {
      case Op::forward: forward(f, i, a); break;
      case Op::backward:
      case Op::backward_input: backward(f, i, a); break;
      case Op::backward_weight:
        timed(a, [&] { f.backward_weight(micro(a)); });
        end_micro(a);
        break;
      case Op::recv_activation:
      case Op::recv_gradient: wait_recv(i, a); break;
      case Op::send_activation:
      case Op::send_gradient: send(i, a); break;
      case Op::gather: timed(a, [&] { if (f.gather) f.gather(a.chunk); }); break;
      case Op::release: timed(a, [&] { if (f.release) f.release(a.chunk); }); break;
      case Op::reduce: timed(a, [&] { if (f.reduce) f.reduce(micro(a), slot(a).loss); }); break;
      case Op::optimizer_step: timed(a, [&] { if (f.optimizer_step) f.optimizer_step(); }); break;
    }
  }

  void forward(StageFunctions& f, std::size_t i, const Action& a) {
    Slot& sl = slot(a);
    const MicroBatch mb = micro(a);
    sl.output = take();
    sl.loss = 0.0;
    timed(a, [&] {
      f.forward(mb, mb.first_stage ? nullptr : &sl.input, sl.output);
      if (mb.last_stage) {
        sl.grad_output = take();
        sl.grad_output.reset(sl.output.shape());
        sl.loss = f.loss(mb, sl.output, sl.grad_output);
        losses_[static_cast<std::size_t>(a.micro)] = sl.loss;
      }
    });
    auto& known = out_shape_[static_cast<std::size_t>(a.chunk)];
    if (!known) {
      known = sl.output.shape();
    } else if (*known != sl.output.shape()) {
      throw usage_error("the forward's output has another shape than the one negotiated (" + known->to_string() +
                            "): shapes are negotiated once; call reset_shapes() on every rank when they change",
                        site(i), sl.output.shape().to_string());
    }
    if (mb.last_stage) {
      if (sl.grad_output.shape() != sl.output.shape()) {
        throw usage_error("StageFunctions::loss changed the gradient's shape (it must stay the output's, " +
                              sl.output.shape().to_string() + ")",
                          site(i), sl.grad_output.shape().to_string());
      }
      give(std::move(sl.output));  // the last stage sends nothing forward
    }
    if (++live_ > peak_) peak_ = live_;
  }

  void backward(StageFunctions& f, std::size_t i, const Action& a) {
    Slot& sl = slot(a);
    const MicroBatch mb = micro(a);
    Activation grad_in;
    if (!mb.first_stage) {
      grad_in = take();
      grad_in.reset(sl.input.shape());
    }
    timed(a, [&] {
      Activation* gi = mb.first_stage ? nullptr : &grad_in;
      if (a.op == Op::backward && f.backward) {
        f.backward(mb, sl.grad_output, gi);
      } else {
        f.backward_input(mb, sl.grad_output, gi);
        if (a.op == Op::backward) f.backward_weight(mb);
      }
    });
    if (!mb.first_stage && grad_in.shape() != sl.input.shape()) {
      throw usage_error("the backward returned an input gradient of another shape than its input's (" +
                            sl.input.shape().to_string() + ")",
                        site(i), grad_in.shape().to_string());
    }
    give(std::move(sl.grad_output));
    sl.grad_input = std::move(grad_in);  // waits for its send
    if (a.op == Op::backward) end_micro(a);
  }

  // The micro-batch's backward is complete on this chunk: its input is no longer needed.
  void end_micro(const Action& a) {
    Slot& sl = slot(a);
    if (sl.has_input) give(std::move(sl.input));
    sl.has_input = false;
    --live_;
  }

  // ---- transfers --------------------------------------------------------------------------------

  int tag(const Action& a) const { return message_tag(s_, rank_, a); }
  int header_tag(const Action& a) const { return 2 * s_.virtual_stages() + tag(a); }
  int stamp_tag(const Action& a) const { return 4 * s_.virtual_stages() + tag(a); }

  void send(std::size_t, const Action& a) {
    Slot& sl = slot(a);
    auto post = std::make_unique<Send>();
    post->buffer = std::move(a.op == Op::send_activation ? sl.output : sl.grad_input);
    const Shape& shape = post->buffer.shape();
    if (a.op == Op::send_activation && !announced_.count(tag(a))) {
      announced_.insert(tag(a));
      post->hdr = encode(shape);
      post->header_work = comm_->send(post->hdr.data(), sizeof(ShapeHeader), DType::uint8, a.peer, header_tag(a));
    }
    post->data_work = comm_->send(post->buffer.bytes().data(), shape.bytes(), DType::uint8, a.peer, tag(a));
    if (opt_.virtual_clock) {
      post->stamp = vt_;
      post->stamp_work = comm_->send(&post->stamp, sizeof(std::int64_t), DType::uint8, a.peer, stamp_tag(a));
    }
    ++messages_;
    sends_.push_back(std::move(post));
  }

  // The recv's shape, if this rank knows it yet: gradients come back in the shape of the chunk's
  // output; activations in the announced one.
  const std::optional<Shape>& known_shape(const Action& a) const {
    const auto c = static_cast<std::size_t>(a.chunk);
    return a.op == Op::recv_gradient ? out_shape_[c] : in_shape_[c];
  }

  // Posts receive `i` if it can be: with a known shape its data, else (activations) its header if
  // no earlier header of the link is outstanding.
  void try_post(std::size_t i, const Action& a) {
    Recv& r = recvs_[i];
    if (r.posted) return;
    const auto c = static_cast<std::size_t>(a.chunk);
    if (known_shape(a)) {
      post_data(i, a);
    } else if (a.op == Op::recv_activation && header_wait_[c] < 0) {
      header_wait_[c] = static_cast<int>(i);
      r.header = r.posted = true;
      r.header_work = comm_->recv(r.hdr.data(), sizeof(ShapeHeader), DType::uint8, a.peer, header_tag(a));
    }
  }

  void post_data(std::size_t i, const Action& a) {
    Recv& r = recvs_[i];
    Slot& sl = slot(a);
    Activation& dst = a.op == Op::recv_gradient ? sl.grad_output : sl.input;
    dst = take();
    dst.reset(*known_shape(a));
    if (a.op == Op::recv_activation) sl.has_input = true;
    r.posted = true;
    r.data_work = comm_->recv(dst.bytes().data(), dst.shape().bytes(), DType::uint8, a.peer, tag(a));
    if (opt_.virtual_clock) r.stamp_work = comm_->recv(&r.stamp, sizeof(std::int64_t), DType::uint8, a.peer, stamp_tag(a));
  }

  // Before compute `i`: post the receives the next compute will wait for.
  void post_ahead(std::size_t i) {
    const auto& list = s_.ranks[static_cast<std::size_t>(rank_)];
    for (std::size_t k = i + 1; k < list.size() && !is_compute(list[k].op); ++k) {
      if (is_recv(list[k].op)) try_post(k, list[k]);
    }
  }

  void wait_recv(std::size_t i, const Action& a) {
    try {
      try_post(i, a);
      Recv& r = recvs_[i];
      if (r.header) {
        r.header_work.wait();
        accept_header(i, a, decode(r.hdr, site(i)));
        post_data(i, a);
      } else if (!r.posted) {
        throw usage_error("receives a gradient before this chunk's first forward gave its output a shape", site(i));
      }
      r.data_work.wait();
      if (opt_.virtual_clock) {
        r.stamp_work.wait();
        vt_ = std::max(vt_, r.stamp + opt_.virtual_clock->transfer);
      }
    } catch (const comm_error& e) {
      throw comm_error(e.message() + " (while pipeline rank " + std::to_string(rank_) + " waited at " +
                           action_at(s_, rank_, i) + ")",
                       e.where(), e.value());
    }
  }

  void accept_header(std::size_t i, const Action& a, Shape got) {
    const auto c = static_cast<std::size_t>(a.chunk);
    header_wait_[c] = -1;
    if (expected_ && *expected_) {
      const std::optional<Shape> want = (*expected_)(a.chunk);
      if (want && *want != got) {
        const int k = s_.virtual_stage(rank_, a.chunk);
        throw usage_error("rank " + std::to_string(rank_) + " (virtual stage " + std::to_string(k) + ") expects its input as " +
                              want->to_string() + "; rank " + std::to_string(a.peer) + " (virtual stage " +
                              std::to_string(k - 1) + ") sends " + got.to_string(),
                          site(i));
      }
    }
    in_shape_[c] = std::move(got);
  }

  // Completes the sends that are done (all of them at the step's end); their buffers go back.
  void finish_sends(bool all) {
    for (auto it = sends_.begin(); it != sends_.end();) {
      Send& s = **it;
      const bool done = all ? (s.header_work.wait(), s.data_work.wait(), s.stamp_work.wait(), true)
                            : s.header_work.test() && s.data_work.test() && s.stamp_work.test();
      if (!done) {
        ++it;
        continue;
      }
      give(std::move(s.buffer));
      it = sends_.erase(it);
    }
  }

  // ---- buffers ------------------------------------------------------------------------------------

  Activation take() {
    if (pool_.empty()) return Activation();
    Activation a = std::move(pool_.back());
    pool_.pop_back();
    return a;
  }
  void give(Activation&& a) { pool_.push_back(std::move(a)); }

  C* comm_;
  Schedule s_;
  ExecutorOptions opt_;
  SimulationReport prediction_;
  std::string text_;
  int rank_ = 0;
  std::uint64_t epoch_ = 0;
  std::vector<std::optional<Shape>> in_shape_, out_shape_;  // [chunk] negotiated input / output shapes
  std::vector<int> header_wait_;                            // [chunk] the receive awaiting a header, or -1
  std::set<int> announced_;                                 // tags whose first message carried its header
  const std::function<std::optional<Shape>(int)>* expected_ = nullptr;
  std::vector<Slot> slots_;            // [chunk * m + micro]
  std::vector<Recv> recvs_;            // [action]
  std::list<std::unique_ptr<Send>> sends_;
  std::vector<Activation> pool_;
  std::vector<double> losses_;
  std::int64_t vt_ = 0, busy_ = 0, messages_ = 0;
  int live_ = 0, peak_ = 0;
};

}  // namespace zerotk::pipeline
