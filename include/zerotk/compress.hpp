#pragma once
/// \file zerotk/compress.hpp
/// Compressed communication (docs/compress.md): the ErrorFeedbackCodec concept, the sign (1-bit),
/// 2-bit and top-k codecs with error feedback, canonical Huffman coding of byte payloads, and the
/// 1-bit compressed all-reduce with worker and server error feedback over any Communicator.
#include "zerotk/compress/codec.hpp"
#include "zerotk/compress/huffman.hpp"
#include "zerotk/compress/onebit_allreduce.hpp"
#include "zerotk/compress/sign.hpp"
#include "zerotk/compress/topk.hpp"
#include "zerotk/compress/two_bit.hpp"
