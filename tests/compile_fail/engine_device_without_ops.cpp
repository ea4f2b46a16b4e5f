// A Device tag of the user's with no Ops specialisation is refused where the tag selects its Ops,
// with a first error that says what to specialise (not a missing member deep in the engine). The
// control builds the same engine on Device<Host>.
#include "zerotk/engine.hpp"

struct MyAccelerator {
  static constexpr std::string_view name = "MyAccelerator";
};
template <>
struct zerotk::Device<MyAccelerator> {
  using policy_kind = zerotk::policy::device;
  using tag = MyAccelerator;
  static constexpr bool is_cuda = false;
};

#ifdef ZEROTK_FAILTEST_CONTROL
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::Device<zerotk::Host>>;
#else
using E = zerotk::Engine<zerotk::Partitioner<zerotk::Stage<2>>, zerotk::Optimizer<zerotk::AdamW>,
                         zerotk::Device<MyAccelerator>>;
#endif
#include "engine_use.hpp"
