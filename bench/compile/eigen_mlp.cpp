// bench/compile/eigen_mlp.cpp: a user's everyday reference, an Eigen MLP trainer TU (two dense
// layers, MSE, plain SGD): what compiling a small trainer costs without zerotk.
#include <Eigen/Dense>
#include <cstdio>
#include <random>

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  Eigen::MatrixXf w0 = Eigen::MatrixXf::NullaryExpr(64, 16, [&] { return 0.3f * nd(rng); });
  Eigen::MatrixXf w1 = Eigen::MatrixXf::NullaryExpr(4, 64, [&] { return 0.1f * nd(rng); });
  Eigen::VectorXf b0 = Eigen::VectorXf::Zero(64), b1 = Eigen::VectorXf::Zero(4);
  float loss = 0;
  for (int step = 0; step < 200; ++step) {
    Eigen::MatrixXf x = Eigen::MatrixXf::NullaryExpr(16, 32, [&] { return nd(rng); });
    Eigen::MatrixXf t = (x.topRows(4).array() * 0.5f).tanh().matrix();
    Eigen::MatrixXf z = (w0 * x).colwise() + b0;
    Eigen::MatrixXf h = z.cwiseMax(0.0f);
    Eigen::MatrixXf y = (w1 * h).colwise() + b1;
    Eigen::MatrixXf dy = (y - t) / 32.0f;
    loss = 0.5f * (y - t).squaredNorm() / 32.0f;
    Eigen::MatrixXf dh = (w1.transpose() * dy).array() * (z.array() > 0).cast<float>();
    w1 -= 0.01f * dy * h.transpose();
    b1 -= 0.01f * dy.rowwise().sum();
    w0 -= 0.01f * dh * x.transpose();
    b0 -= 0.01f * dh.rowwise().sum();
  }
  std::printf("%f\n", loss);
}
