// examples/00_hello: the smallest zerotk program. A user's module with two parameters; zerotk-owned
// storage bound into it; the memory ledger reporting what it holds; fp16/bf16 rounding of a value.
//
//   cmake --workflow --preset default && build/default/examples/00_hello/zerotk_example_00_hello
#include <cstdio>
#include <string_view>

#include <zerotk/zerotk.hpp>

struct Linear {  // the user's own type: zerotk only asks for parameters(visit)
  zerotk::Param<float> weight{"weight", {4, 8}};
  zerotk::Param<float> bias{"bias", {4}};
  template <class Visit>
  void parameters(Visit&& visit) {
    visit("weight", weight);
    visit("bias", bias);
  }
};

int main() {
  static_assert(zerotk::Module<Linear>);
  Linear model;
  zerotk::MemoryLedger ledger;

  std::size_t numel = 0;
  zerotk::for_each_parameter(model, [&](std::string_view, auto& p) { numel += p.numel(); });
  zerotk::TrackedBuffer<float> values(numel, zerotk::MemoryCategory::master32, &ledger);
  zerotk::TrackedBuffer<float> grads(numel, zerotk::MemoryCategory::grads, &ledger);

  std::size_t offset = 0;  // one flat buffer, parameters are views into it
  zerotk::for_each_parameter(model, [&](std::string_view name, auto& p) {
    p.bind(values.data() + offset, grads.data() + offset);
    std::printf("%-7s numel %3zu at offset %3zu\n", std::string(name).c_str(), p.numel(), offset);
    offset += p.numel();
  });
  std::printf("ledger: master32 %zu B, grads %zu B, total %zu B\n",
              ledger.live(zerotk::MemoryCategory::master32), ledger.live(zerotk::MemoryCategory::grads),
              ledger.live_total());

  const float x = 0.1f;
  std::printf("0.1f as fp16 = %.8f, as bf16 = %.8f\n", static_cast<float>(zerotk::half(x)),
              static_cast<float>(zerotk::bfloat16(x)));
  std::printf("zerotk %s\n", zerotk::kVersionString);
  return 0;
}
