#pragma once
/// \file zerotk/engine/erased_inputs.hpp
/// engine::erase_inputs (declared in zerotk/any_engine.hpp): make_engine's inputs from the trainer's
/// communicator or process grid and model, their types forgotten (engine/placement.hpp,
/// engine/model_view.hpp). The one part of make_engine compiled in the trainer's translation unit.

#include <type_traits>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/comm/grid.hpp"
#include "zerotk/core/concepts.hpp"
#include "zerotk/engine/model_view.hpp"
#include "zerotk/engine/placement.hpp"

namespace zerotk::engine {

template <class T>
inline constexpr bool is_process_grid_v = false;
template <class C>
inline constexpr bool is_process_grid_v<comm::ProcessGrid<C>> = true;

template <class CommOrGrid, Module M>
ErasedInputs erase_inputs(CommOrGrid& comm_or_grid, M& model) {
  if constexpr (is_process_grid_v<CommOrGrid>) {
    static_assert(!comm::uses_device_memory<std::remove_cvref_t<decltype(comm_or_grid.data())>>,
                  "make_engine: the compiled engine set runs on Device<Host> (a host-memory communicator: threads, MPI)");
    return {&comm_or_grid,
            [](void* g, const comm::TopologyOptions& t) { return place_on(*static_cast<CommOrGrid*>(g), t); },
            view_model(model), comm_or_grid.world().size(), comm_or_grid.world().rank()};
  } else {
    static_assert(comm::Communicator<CommOrGrid>,
                  "make_engine: pass a communicator (comm::Communicator) or a comm::ProcessGrid of one");
    static_assert(!comm::uses_device_memory<CommOrGrid>,
                  "make_engine: the compiled engine set runs on Device<Host> (a host-memory communicator: threads, "
                  "MPI); a Device<Cuda> engine is typed: zerotk::Engine<..., zerotk::Device<zerotk::Cuda>>");
    return {&comm_or_grid,
            [](void* c, const comm::TopologyOptions& t) { return place_on(*static_cast<CommOrGrid*>(c), t); },
            view_model(model), comm_or_grid.size(), comm_or_grid.rank()};
  }
}

}  // namespace zerotk::engine
