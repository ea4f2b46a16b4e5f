// Built when the consumer asks for the torch component: proves find_package(zerotk COMPONENTS
// torch) gives zerotk::torch with libtorch's headers and libraries and ZEROTK_HAS_TORCH=1, by
// wrapping a torch::nn::Linear (no engine: libtorch's headers alone take ~17 s to compile).
#include <cstdio>

#include <zerotk/interop/torch.hpp>

int main() {
  torch::nn::Linear fc(3, 2);
  zerotk::interop::TorchModel model(*fc);
  std::printf("zerotk torch: %zu parameters, %s first, has_torch=%d\n", model.size(), model[0].name().c_str(),
              ZEROTK_HAS_TORCH);
  return model.size() == 2 && model[0].numel() == 6 ? 0 : 1;
}
