#pragma once
/// \file zerotk/io/safetensors.hpp
/// Writes the safetensors format (github.com/huggingface/safetensors), which PyTorch, JAX and
/// inference servers load without running code from the file:
///
///   u64 (little-endian) N | N bytes of UTF-8 JSON, padded with spaces so the data starts at a
///   multiple of 8 | the tensors' bytes, little-endian, one after the other
///
///   {"__metadata__":{"format":"pt"},"wte":{"dtype":"BF16","shape":[50304,768],"data_offsets":[0,77266944]},...}
///
/// data_offsets count from the start of the data area; tensors lie in the order they were given.
/// The writer streams: write(i, bytes) takes tensor i in pieces, in order, so an export needs no
/// more memory than one piece. The file appears under its name only when finish() succeeds
/// (io::AtomicFileWriter); until then it is `<path>.tmp`, removed if the writer is destroyed first.
///
///   io::SafetensorsWriter w(out, {{"wte", DType::bf16, {50304, 768}}}, {{"format", "pt"}});
///   for (auto piece : pieces) w.write_from_fp32(0, piece);  // fp32 -> bf16, round to nearest even
///   w.finish();

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/dtype.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/core/utf8.hpp"
#include "zerotk/io/bytes.hpp"
#include "zerotk/io/durable_file.hpp"
#include "zerotk/kernels/host/cast.hpp"

namespace zerotk::io {

/// The safetensors name of a dtype.
constexpr std::string_view safetensors_dtype(DType t) noexcept {
  switch (t) {
    case DType::fp32: return "F32";
    case DType::fp16: return "F16";
    case DType::bf16: return "BF16";
    case DType::int32: return "I32";
    case DType::uint8: return "U8";
    case DType::fp64: return "F64";
  }
  return "?";
}

/// One tensor of a safetensors file. `shape` is {} for a scalar (one element).
struct TensorInfo {
  std::string name;
  DType dtype = DType::fp32;
  std::vector<std::uint64_t> shape;
};

/// `__metadata__`: string keys to string values (the format allows nothing else).
using SafetensorsMetadata = std::map<std::string, std::string>;

/// Readers refuse larger headers (the reference implementation's limit), so writing one is an error.
inline constexpr std::uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

/// `text` as a JSON string with its quotes: `"` and `\` escaped, control characters as \u00XX,
/// everything else as it is (so `text` must be UTF-8 for the result to be JSON).
inline std::string json_quote(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += kHex[u >> 4];
      out += kHex[u & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

/// Converts fp32 `in` to `dtype` (fp32, fp16 or bf16, rounding to nearest even like
/// kernels::host::cast) and stores the little-endian bytes in `out`, which must hold
/// in.size() * size_of(dtype) bytes and be aligned for the dtype.
inline void encode_from_fp32(std::span<const float> in, DType dtype, std::span<std::byte> out) {
  const auto as = [&]<class T>(T*) {
    if (out.size() != in.size() * sizeof(T) || reinterpret_cast<std::uintptr_t>(out.data()) % alignof(T) != 0) {
      throw usage_error("encode_from_fp32: the output must be in.size() * " + std::to_string(sizeof(T)) + " bytes, aligned",
                        "", std::to_string(out.size()) + " bytes for " + std::to_string(in.size()) + " values");
    }
    T* dst = reinterpret_cast<T*>(out.data());  // implicit-lifetime type in a byte buffer
    kernels::host::cast(in.data(), dst, in.size());
    to_little_endian(std::span<T>(dst, in.size()));
  };
  switch (dtype) {
    case DType::fp32: return as(static_cast<float*>(nullptr));
    case DType::fp16: return as(static_cast<half*>(nullptr));
    case DType::bf16: return as(static_cast<bfloat16*>(nullptr));
    default: throw usage_error("encode_from_fp32: fp32 converts to fp32, fp16 or bf16 only", "", std::string(to_string(dtype)));
  }
}

/// The start of a safetensors file for a list of tensors: what the writer checks and lays out
/// before it writes a byte.
struct SafetensorsLayout {
  std::string header;                     ///< u64 length + padded JSON; the data starts at header.size()
  std::vector<std::uint64_t> tensor_bytes;  ///< [tensor]
  std::uint64_t data_bytes = 0;           ///< all tensors together
};

/// Lays out `tensors` (in this order) and `metadata`; a usage_error naming `where` and the tensor
/// for a name that is empty, repeated, "__metadata__" or not UTF-8, for metadata that is not UTF-8,
/// and for sizes that overflow 64 bits.
inline SafetensorsLayout safetensors_layout(const std::vector<TensorInfo>& tensors, const SafetensorsMetadata& metadata,
                                            const std::string& where) {
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  const auto check_utf8 = [&](const std::string& text, const char* what) {
    if (!is_utf8(text)) throw usage_error(std::string("safetensors: ") + what + " is not UTF-8", where, json_quote(text));
  };
  SafetensorsLayout l;
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      check_utf8(key, "a metadata key");
      check_utf8(value, "a metadata value");
      json += (json.back() == '{' ? "" : ",") + json_quote(key) + ":" + json_quote(value);
    }
    json += "}";
  }
  std::set<std::string_view> names;
  for (const TensorInfo& t : tensors) {
    if (t.name.empty()) throw usage_error("safetensors: a tensor name is empty", where);
    if (t.name == "__metadata__") throw usage_error("safetensors: \"__metadata__\" is reserved, not a tensor name", where);
    check_utf8(t.name, "a tensor name");
    if (!names.insert(t.name).second) throw usage_error("safetensors: tensor name used twice", where, json_quote(t.name));
    std::uint64_t bytes = size_of(t.dtype);
    std::string shape;
    for (const std::uint64_t d : t.shape) {
      bytes = d != 0 && bytes > kMax / d ? kMax : bytes * d;
      if (bytes == kMax) throw usage_error("safetensors: the tensor's byte count overflows 64 bits", where, json_quote(t.name));
      if (!shape.empty()) shape += ',';
      shape += std::to_string(d);
    }
    if (bytes > kMax - l.data_bytes) throw usage_error("safetensors: the file's size overflows 64 bits", where, json_quote(t.name));
    if (json.size() != 1) json += ',';
    json += json_quote(t.name) + ":{\"dtype\":\"" + std::string(safetensors_dtype(t.dtype)) +
            "\",\"shape\":[" + shape + "],\"data_offsets\":[" + std::to_string(l.data_bytes) + "," +
            std::to_string(l.data_bytes + bytes) + "]}";
    l.tensor_bytes.push_back(bytes);
    l.data_bytes += bytes;
  }
  json += "}";
  json.resize((json.size() + 7) / 8 * 8, ' ');  // 8 + N bytes before the data: a multiple of 8
  if (json.size() > kSafetensorsMaxHeaderBytes) {
    throw usage_error("safetensors: the header is larger than readers accept", where,
                      std::to_string(json.size()) + " bytes, limit " + std::to_string(kSafetensorsMaxHeaderBytes));
  }
  ByteWriter w;
  w.put(static_cast<std::uint64_t>(json.size()));
  w.put_text(json);
  l.header.assign(reinterpret_cast<const char*>(w.bytes().data()), w.size());
  return l;
}

/// Streams tensors into a safetensors file at `path` (see the file comment). Misuse (a tensor's
/// bytes out of order, too many or too few) is a usage_error naming the file and the tensor; a
/// failed write is an io_error. Either way `path` is left as it was.
class SafetensorsWriter {
 public:
  /// fp32 values converted per write_from_fp32() call, at most (bounds the staging buffer).
  static constexpr std::size_t kConvertChunk = std::size_t{1} << 16;

  SafetensorsWriter(std::filesystem::path path, std::vector<TensorInfo> tensors, const SafetensorsMetadata& metadata = {})
      : tensors_(std::move(tensors)), layout_(safetensors_layout(tensors_, metadata, path.string())), file_(std::move(path)) {
    file_.append(layout_.header);
  }

  /// Appends the next `bytes` (little-endian) of tensor `i`. Tensors come in order, each with exactly
  /// its byte count in total, in any number of pieces; tensors of 0 bytes need no call.
  void write(std::size_t i, std::span<const std::byte> bytes) {
    check_index(i);
    advance_to(i);
    const std::uint64_t left = layout_.tensor_bytes[current_] - written_;
    if (bytes.size() > left) {
      throw usage_error("safetensors: more bytes than the tensor's shape holds", where(),
                        name(i) + ": " + std::to_string(written_) + " + " + std::to_string(bytes.size()) + " of " +
                            std::to_string(layout_.tensor_bytes[current_]) + " bytes");
    }
    file_.append(bytes);
    written_ += bytes.size();
  }

  /// Appends fp32 `values` to tensor `i`, converted to its dtype (fp32, fp16 or bf16; round to
  /// nearest even) through a buffer of at most kConvertChunk values.
  void write_from_fp32(std::size_t i, std::span<const float> values) {
    check_index(i);
    const DType t = tensors_[i].dtype;
    if (t != DType::fp32 && t != DType::fp16 && t != DType::bf16) {
      throw usage_error("safetensors: write_from_fp32 needs an F32, F16 or BF16 tensor", where(),
                        name(i) + ": " + std::string(safetensors_dtype(t)));
    }
    staging_.resize(std::min(values.size(), kConvertChunk));  // u32: aligned for every target
    for (std::size_t at = 0; at < values.size(); at += kConvertChunk) {
      const std::span<const float> piece = values.subspan(at, std::min(kConvertChunk, values.size() - at));
      const std::span<std::byte> out = std::as_writable_bytes(std::span<std::uint32_t>(staging_)).first(piece.size() * size_of(t));
      encode_from_fp32(piece, t, out);
      write(i, out);
    }
  }

  /// Checks that every tensor is complete, then makes the file durable under its name.
  void finish() {
    advance_to(tensors_.size());
    file_.commit();
  }

  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const SafetensorsLayout& layout() const noexcept { return layout_; }

 private:
  std::string where() const { return file_.path().string(); }
  std::string name(std::size_t i) const { return i < tensors_.size() ? json_quote(tensors_[i].name) : "finish()"; }

  void check_index(std::size_t i) const {
    if (i >= tensors_.size()) {
      throw usage_error("safetensors: no tensor with this index", where(), std::to_string(i) + " of " + std::to_string(tensors_.size()));
    }
  }

  /// Moves past complete tensors up to `i` (tensors_.size(): the end); tensor `i` may not lie behind.
  void advance_to(std::size_t i) {
    if (done_) throw usage_error("safetensors: the file is finished", where(), name(i));
    while (current_ < i && written_ == layout_.tensor_bytes[current_]) {
      ++current_;
      written_ = 0;
    }
    if (i < current_) {
      throw usage_error("safetensors: tensors must be written in order", where(), name(i) + " after " + name(current_));
    }
    if (i > current_) {
      throw usage_error("safetensors: a tensor is incomplete", where(),
                        name(current_) + ": " + std::to_string(written_) + " of " + std::to_string(layout_.tensor_bytes[current_]) +
                            " bytes, then " + name(i));
    }
    done_ = i == tensors_.size();
  }

  std::vector<TensorInfo> tensors_;
  SafetensorsLayout layout_;
  AtomicFileWriter file_;
  std::vector<std::uint32_t> staging_;
  std::size_t current_ = 0;     // tensor being written
  std::uint64_t written_ = 0;   // bytes of it so far
  bool done_ = false;
};

}  // namespace zerotk::io
