#pragma once
/// \file zerotk/config/json_dom.hpp
/// Parses JSON text into an nlohmann::ordered_json document while reporting what nlohmann's own
/// parser accepts silently: duplicate keys (the last one would win) and absurd nesting. Parsing
/// never throws: every problem becomes a config_error with a JSON path or a line/column.

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_JSON
#error "zerotk/config needs nlohmann-json: link the zerotk::json CMake target (it sets ZEROTK_HAS_JSON=1)"
#endif

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include "zerotk/config/diagnostics.hpp"

namespace zerotk::config {

/// The document type the reader walks: keys keep their order, so errors come in document order.
using Json = nlohmann::ordered_json;

namespace detail {

/// `key` escaped for a JSON pointer segment (RFC 6901: "~" -> "~0", "/" -> "~1").
inline std::string pointer_segment(std::string_view key) {
  std::string s;
  s.reserve(key.size());
  for (char c : key) {
    if (c == '~') {
      s += "~0";
    } else if (c == '/') {
      s += "~1";
    } else {
      s += c;
    }
  }
  return s;
}

inline std::string join_path(std::string_view parent, std::string_view key) {
  std::string s(parent);
  s += '/';
  s += pointer_segment(key);
  return s;
}

/// A value as it appears in an error message: compact JSON, cut to 60 characters.
inline std::string show(const Json& v) {
  std::string s = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 60) {
    s.resize(57);
    s += "...";
  }
  return s;
}

/// "line L, column C" of byte `offset` in `text` (both 1-based).
inline std::string line_column(std::string_view text, std::size_t offset) {
  offset = std::min(offset, text.size());
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return cat("line ", std::to_string(line), ", column ", std::to_string(col));
}

/// nlohmann SAX consumer building an ordered_json document. Keeps the first of duplicate keys
/// (the document is rejected anyway) so that duplicate checks stay O(1) per key. Each open
/// container is held by pointer; only the innermost one grows, so no held pointer is invalidated.
class DomBuilder {
 public:
  static constexpr std::size_t kMaxDepth = 64;  // DeepSpeed configs nest 4 deep; bounds the walkers' recursion

  DomBuilder(std::string_view text, Diagnostics& diag) : text_(text), diag_(diag) {}

  Json take() { return std::move(root_); }

  bool null() { return put(Json(nullptr)); }
  bool boolean(bool v) { return put(Json(v)); }
  bool number_integer(std::int64_t v) { return put(Json(v)); }
  bool number_unsigned(std::uint64_t v) { return put(Json(v)); }
  bool number_float(double v, const std::string&) { return put(Json(v)); }
  bool string(std::string& v) { return put(Json(std::move(v))); }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    Frame& f = frames_.back();
    f.key = k;
    f.duplicate = !f.keys.insert(k).second;
    if (f.duplicate) {
      diag_.error(join_path(f.path, k), "duplicate key (JSON parsers silently keep only one of them)");
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& ex) {
    // nlohmann's text is "[json.exception.<id>] [parse error at line L, column C: ]<what>"; keep <what>,
    // the location is reported in our own form.
    std::string rule = ex.what();
    if (rule.rfind("[json.exception", 0) == 0) rule.erase(0, rule.find("] ") + 2);
    if (rule.rfind("parse error", 0) == 0 && rule.find(": ") != std::string::npos) rule.erase(0, rule.find(": ") + 2);
    // `position` counts the characters read; the last one read is the offending one.
    diag_.error(line_column(text_, position > 0 ? position - 1 : 0), "invalid JSON: " + rule);
    return false;
  }

 private:
  struct Frame {
    Json* node;
    std::string path;
    std::string key;                      // objects: the key whose value comes next
    bool duplicate = false;               // that key was seen before in this object
    std::unordered_set<std::string> keys; // objects: keys seen so far
  };

  // Where the next value goes: its path, and whether it should be dropped (duplicate key).
  std::string child_path() const {
    const Frame& f = frames_.back();
    if (f.node->is_object()) return join_path(f.path, f.key);
    return f.path + "/" + std::to_string(f.node->size());
  }

  Json* insert(Json v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    Frame& f = frames_.back();
    if (f.node->is_array()) {
      f.node->push_back(std::move(v));
      return &f.node->back();
    }
    if (f.duplicate) return nullptr;
    // Append without ordered_map's linear key search: key uniqueness is tracked in f.keys.
    auto& members = static_cast<std::vector<std::pair<const std::string, Json>>&>(f.node->get_ref<Json::object_t&>());
    members.emplace_back(f.key, std::move(v));
    return &members.back().second;
  }

  bool put(Json v) {
    insert(std::move(v));
    return true;
  }

  bool open(Json container) {
    if (frames_.size() >= kMaxDepth) {
      diag_.error(frames_.empty() ? std::string() : child_path(),
                  cat("JSON nested deeper than ", std::to_string(kMaxDepth), " levels"));
      return false;
    }
    std::string path = frames_.empty() ? std::string() : child_path();
    const bool is_array = container.is_array();
    Json* slot = insert(std::move(container));
    if (slot == nullptr) {  // value of a duplicate key: build it aside, it is dropped with the builder
      scratch_.push_back(std::make_unique<Json>(is_array ? Json::array() : Json::object()));
      slot = scratch_.back().get();
    }
    frames_.push_back(Frame{slot, std::move(path), {}, false, {}});
    return true;
  }

  bool close() {
    frames_.pop_back();
    return true;
  }

  std::string_view text_;
  Diagnostics& diag_;
  Json root_;
  std::vector<Frame> frames_;
  std::vector<std::unique_ptr<Json>> scratch_;
};

}  // namespace detail

/// Parses `text`. On success returns the document; on failure records errors in `diag` and
/// returns null.
inline Json parse_json(std::string_view text, Diagnostics& diag) {
  detail::DomBuilder builder(text, diag);
  const bool ok = Json::sax_parse(text, &builder, Json::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (!ok || !diag.ok()) return Json();
  return builder.take();
}

}  // namespace zerotk::config
