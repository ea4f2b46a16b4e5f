#pragma once
/// \file zerotk/compress/gradient_options.hpp
/// The run-time knobs of gradient compression (GradientCompression<TopK|TwoBit|Sign>; the DeepSpeed
/// config block `gradient_compression`). The codec itself is the policy's tag.

#include <string>
#include <vector>

#include "zerotk/core/error.hpp"

namespace zerotk::compress {

struct GradientCompressionOptions {
  /// GradientCompression<TopK>: the share of each bucket's values sent, in (0, 1] (`topk_ratio`).
  double topk_ratio = 0.01;
  /// Every payload is Huffman-coded before it is sent (`huffman_coding`; top-k's indices as gaps).
  bool huffman_coding = false;

  void check(std::vector<config_error>& out) const {
    if (!(topk_ratio > 0.0 && topk_ratio <= 1.0)) {  // NaN fails both comparisons
      out.emplace_back("must be a finite number in (0, 1]", "gradient_compression.topk_ratio", to_text(topk_ratio));
    }
  }
};

}  // namespace zerotk::compress
