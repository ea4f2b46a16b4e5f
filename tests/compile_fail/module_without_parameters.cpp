// A type without parameters(visit) is not a Module; for_each_parameter says so at the call site.
#include "zerotk/core/concepts.hpp"
#include "zerotk/core/param.hpp"
struct Model {
#ifdef ZEROTK_FAILTEST_CONTROL
  zerotk::Param<float> w{"w", {4}};
  template <class V>
  void parameters(V&& v) { v("w", w); }
#endif
};
int main() {
  Model m;
  zerotk::for_each_parameter(m, [](auto, auto&) {});
}
