#pragma once
// Reader of the optimizer golden fixtures written by tests/golden/make_golden.py (format described
// there): a text header of hyper-parameters, then float32 arrays p0, grads[T], params[T], m, v.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace zerotk::test {

struct GoldenGroup {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0, min_coeff = 0, max_coeff = 0;
  bool bias_correction = true;
};

struct GoldenCase {
  std::string name, optimizer;  // optimizer: adam | adamw | lamb
  int steps = 0;
  std::vector<std::size_t> numels;  // per tensor
  std::vector<GoldenGroup> groups;
  std::vector<std::uint32_t> tensor_group;
  std::size_t n = 0;  // total parameters
  std::vector<float> p0;
  std::vector<std::vector<float>> grads, params;  // [steps][n]
  std::vector<float> m, v;                        // after the last step

  std::size_t offset(std::size_t tensor) const {
    std::size_t o = 0;
    for (std::size_t i = 0; i < tensor; ++i) o += numels[i];
    return o;
  }
};

/// The fixtures live in the source tree named at configure time; the environment variable of the same
/// name overrides it for binaries carried to another machine (scripts/gpu-run.sh sets it).
inline std::string golden_path(const std::string& name) {
  const char* dir = std::getenv("ZEROTK_TEST_SOURCE_DIR");
  return std::string(dir && *dir ? dir : ZEROTK_TEST_SOURCE_DIR) + "/golden/optim_" + name + ".golden";
}

inline GoldenCase load_golden(const std::string& name) {
  const std::string path = golden_path(name);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open golden fixture " + path);
  GoldenCase c;
  std::string line;
  std::getline(in, line);
  if (line != "zerotk-golden 1") throw std::runtime_error("not a zerotk golden fixture: " + path);
  while (std::getline(in, line) && line != "end") {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "case") {
      ls >> c.name;
    } else if (key == "optimizer") {
      ls >> c.optimizer;
    } else if (key == "steps") {
      ls >> c.steps;
    } else if (key == "tensors") {
      std::size_t k = 0;
      ls >> k;
      c.numels.resize(k);
      for (auto& n : c.numels) ls >> n;
    } else if (key == "groups") {
      std::size_t g = 0;
      ls >> g;
      c.groups.resize(g);
    } else if (key == "group") {
      std::size_t g = 0;
      ls >> g;
      GoldenGroup& h = c.groups.at(g);
      std::string k;
      double x = 0;
      while (ls >> k >> x) {
        // Values are float32 numbers printed exactly as float64: the conversion is exact.
        const float f = static_cast<float>(x);
        if (k == "lr") h.lr = f;
        else if (k == "beta1") h.beta1 = f;
        else if (k == "beta2") h.beta2 = f;
        else if (k == "eps") h.eps = f;
        else if (k == "weight_decay") h.weight_decay = f;
        else if (k == "min_coeff") h.min_coeff = f;
        else if (k == "max_coeff") h.max_coeff = f;
        else if (k == "bias_correction") h.bias_correction = x != 0.0;
        else throw std::runtime_error("unknown group key " + k + " in " + path);
      }
    } else if (key == "tensor_group") {
      c.tensor_group.resize(c.numels.size());
      for (auto& g : c.tensor_group) ls >> g;
    } else {
      throw std::runtime_error("unknown header key " + key + " in " + path);
    }
  }
  for (std::size_t x : c.numels) c.n += x;
  auto read = [&](std::vector<float>& v) {
    v.resize(c.n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(c.n * sizeof(float)));
    if (!in) throw std::runtime_error("golden fixture truncated: " + path);
  };
  read(c.p0);
  c.grads.resize(static_cast<std::size_t>(c.steps));
  c.params.resize(static_cast<std::size_t>(c.steps));
  for (auto& g : c.grads) read(g);
  for (auto& p : c.params) read(p);
  read(c.m);
  read(c.v);
  return c;
}

}  // namespace zerotk::test
