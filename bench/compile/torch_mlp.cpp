// bench/compile/torch_mlp.cpp: a libtorch trainer TU (torch::nn model + torch::optim::AdamW), the
// reference most C++ trainer authors know.
#include <torch/torch.h>

int main() {
  torch::nn::Sequential model(torch::nn::Linear(16, 64), torch::nn::ReLU(), torch::nn::Linear(64, 4));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3));
  for (int step = 0; step < 10; ++step) {
    torch::Tensor x = torch::randn({32, 16});
    torch::Tensor loss = torch::mse_loss(model->forward(x), torch::tanh(x.narrow(1, 0, 4)));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
}
