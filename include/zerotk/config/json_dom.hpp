#pragma once
/// \file zerotk/config/json_dom.hpp
/// Parses JSON text into an nlohmann::ordered_json document while reporting what nlohmann's own
/// parser accepts silently: duplicate keys (the last one would win) and absurd nesting. Parsing
/// never throws: every problem becomes a config_error with a JSON path or a line/column.

#include "zerotk/core/macros.hpp"

#if !ZEROTK_HAS_JSON
#error "zerotk/config's JSON reader and writer need nlohmann-json: link the CMake target zerotk::json (it defines ZEROTK_HAS_JSON=1), or, in a vendored copy, define ZEROTK_HAS_JSON=1 and put nlohmann/json.hpp (Debian: nlohmann-json3-dev) on the include path"
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

/// An object's members as ordered_json stores them (ordered_map is a vector of pairs).
using Members = std::vector<std::pair<const std::string, Json>>;

inline const Members& members_of(const Json& obj) { return obj.get_ref<const Json::object_t&>(); }

/// Longest key segment shown in a path; longer keys are cut like values.
inline constexpr std::size_t kMaxKeyChars = 60;

/// `key` as a JSON pointer segment (RFC 6901: "~" -> "~0", "/" -> "~1") fit for a one-line
/// message: control characters and other unsafe code points escaped, cut to kMaxKeyChars.
inline std::string pointer_segment(std::string_view key) {
  const std::string shown = printable(key, kMaxKeyChars, /*escape_backslash=*/true);
  std::string s;
  s.reserve(shown.size());
  for (char c : shown) {
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

/// Longest value shown in an error message.
inline constexpr std::size_t kMaxValueChars = 60;

}  // namespace detail

/// Longest string value a config may hold, in bytes (4096: DeepSpeed's longest strings are paths,
/// and PATH_MAX is 4096 on Linux). A longer one is an error naming its JSON path and the limit; the
/// document is still read to the end, so every such string is reported. (Keys need no limit of their
/// own: no DeepSpeed key is longer than 60 bytes, so a long key is an unknown key, an error shown
/// cut to kMaxKeyChars.)
inline constexpr std::size_t kMaxStringBytes = 4096;

namespace detail {

// Appends compact JSON for `v` to `out` until `out` holds more than `limit` characters: the work
// is bounded by `limit`, not by the size of `v` (a hostile value may be megabytes long).
inline void show_into(const Json& v, std::string& out, std::size_t limit) {
  const auto text = [&](std::string_view s) {
    // Strings are cut before dumping; a cut inside a UTF-8 sequence is replaced, not rejected.
    out += Json(std::string(s.substr(0, limit + 1))).dump(-1, ' ', false, Json::error_handler_t::replace);
  };
  if (v.is_object()) {
    out += '{';
    bool first = true;
    for (const auto& [k, x] : members_of(v)) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      text(k);
      out += ':';
      show_into(x, out, limit);
    }
    out += '}';
  } else if (v.is_array()) {
    out += '[';
    bool first = true;
    for (const auto& x : v) {
      if (out.size() > limit) return;
      if (!first) out += ',';
      first = false;
      show_into(x, out, limit);
    }
    out += ']';
  } else if (v.is_string()) {
    text(v.get_ref<const std::string&>());
  } else {
    out += v.dump(-1, ' ', false, Json::error_handler_t::replace);
  }
}

/// A value as it appears in an error message: compact JSON, cut to kMaxValueChars.
inline std::string show(const Json& v) {
  std::string s;
  show_into(v, s, kMaxValueChars);
  return printable(s, kMaxValueChars);
}

/// A string as show() shows it, copying only what is shown.
inline std::string show_string(std::string_view s) { return show(Json(std::string(s.substr(0, kMaxValueChars + 1)))); }

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

/// Where members of one object are, by key: open addressing over member positions, so finding a
/// key or a duplicate costs O(1) however many members a hostile document gives one object.
/// Holds positions only (8 bytes a slot, at most half full); the keys stay in the object.
class KeyIndex {
 public:
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  /// Indexes every member of `m` (whose keys are unique).
  void build(const Members& m) {
    slots_.assign(capacity_for(m.size()), 0);
    for (std::size_t i = 0; i < m.size(); ++i) place(m, i);
    count_ = m.size();
  }
  /// Position of `key` in `m`, or npos.
  std::size_t find(const Members& m, std::string_view key) const {
    if (slots_.empty()) return npos;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t s = hash(key) & mask;; s = (s + 1) & mask) {
      if (slots_[s] == 0) return npos;
      if (m[slots_[s] - 1].first == key) return slots_[s] - 1;
    }
  }
  /// Adds member `pos` of `m`, whose key is not indexed yet.
  void add(const Members& m, std::size_t pos) {
    if (2 * (count_ + 1) > slots_.size()) {
      slots_.assign(capacity_for(count_ + 1), 0);
      for (std::size_t i = 0; i < pos; ++i) place(m, i);
    }
    place(m, pos);
    ++count_;
  }

 private:
  static std::size_t hash(std::string_view key) noexcept { return std::hash<std::string_view>{}(key); }
  // Power of two, at least twice the member count: probe chains stay short.
  static std::size_t capacity_for(std::size_t n) {
    std::size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
  }
  void place(const Members& m, std::size_t pos) {
    const std::size_t mask = slots_.size() - 1;
    std::size_t s = hash(m[pos].first) & mask;
    while (slots_[s] != 0) s = (s + 1) & mask;
    slots_[s] = pos + 1;
  }

  std::vector<std::size_t> slots_;  // member position + 1; 0 = empty
  std::size_t count_ = 0;
};

/// nlohmann SAX consumer building an ordered_json document. Keeps the first of duplicate keys
/// (the document is rejected anyway); each object's KeyIndex keeps duplicate checks O(1) per key.
/// Each open container is held by pointer; only the innermost one grows, so no held pointer is
/// invalidated. Every problem names the JSON path where it was found and the offending text.
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
  bool string(std::string& v) {
    if (v.size() > kMaxStringBytes) {
      diag_.error(here(), too_long("string value", v.size()), show_string(v));
      v.resize(kMaxStringBytes);  // the document is refused; only the limit's worth is kept meanwhile
    }
    return put(Json(std::move(v)));
  }
  bool binary(Json::binary_t& v) { return put(Json::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(Json::object()); }
  bool start_array(std::size_t) { return open(Json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    Frame& f = frames_.back();
    f.key = std::move(k);
    f.awaiting_value = true;
    f.first_of_duplicate = f.index.find(members(f), f.key);
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& ex) {
    // nlohmann's text is "[json.exception.<id>] [parse error at line L, column C: ]<what>[; last read: '<token>']...";
    // keep <what>: the location is reported in our own form and the token becomes the error's value.
    std::string rule = ex.what();
    if (rule.rfind("[json.exception", 0) == 0) rule.erase(0, rule.find("] ") + 2);
    if (rule.rfind("parse error", 0) == 0 && rule.find(": ") != std::string::npos) rule.erase(0, rule.find(": ") + 2);
    const std::string last_read = cat("; last read: '", last_token, "'");
    if (const auto at = rule.find(last_read); at != std::string::npos) rule.erase(at, last_read.size());
    // `position` counts the characters read; the last one read is the offending one.
    const std::size_t offset = position > 0 ? position - 1 : 0;
    std::string value = token_at(offset, rule.find("invalid string") != std::string::npos ||
                                             rule.find("unexpected string literal") != std::string::npos);
    if (offset < text_.size() && text_[offset] == '\0') {
      // nlohmann takes a NUL byte for the end of the input; say what it really is.
      rule = "NUL byte (JSON text cannot contain one; inside a string write \\u0000)";
    }
    diag_.error(here(), cat("invalid JSON at ", where(offset), ": ", rule), std::move(value));
    return false;
  }

  /// The text of the token that ends at byte `offset` (where the parser gave up), for an error's
  /// value: the string it is in, the word or number it ends, or the one character. (nlohmann's own
  /// "last read" text also holds what came before the token.)
  std::string token_at(std::size_t offset, bool in_string) const {
    const auto separates = [](char c) {
      return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',' || c == ':' || c == '[' || c == ']' ||
             c == '{' || c == '}' || c == '"' || c == '\0';
    };
    if (offset >= text_.size()) {
      // The input ended inside a token (an unterminated string, "tr", "1e"): show the token.
      if (text_.empty() || (!in_string && separates(text_.back()))) return {};
      offset = text_.size() - 1;
    }
    std::size_t start = offset;
    if (in_string) {
      // Back to the opening quote (one not escaped by a backslash); at a closing quote, past it first.
      if (text_[offset] == '"' && start > 0) --start;
      while (start > 0 && !(text_[start - 1] == '"' && (start < 2 || text_[start - 2] != '\\'))) --start;
      if (start > 0) --start;
    } else if (!separates(text_[offset])) {
      while (start > 0 && !separates(text_[start - 1])) --start;
    } else if (offset > 0 && !separates(text_[offset - 1])) {
      // A word cut short by a separator ("tru}"): show the word with it.
      while (start > 0 && !separates(text_[start - 1])) --start;
    }
    return printable(text_.substr(start, std::min(offset + 1 - start, 4 * kMaxValueChars)), kMaxValueChars);
  }

  /// "line L, column C (byte offset N)" of byte `offset`.
  std::string where(std::size_t offset) const {
    return cat(line_column(text_, offset), " (byte offset ", std::to_string(offset), ")");
  }

 private:
  static std::string too_long(std::string_view what, std::size_t bytes) {
    return cat(what, " of ", std::to_string(bytes), " bytes is longer than the limit of ", std::to_string(kMaxStringBytes),
               " bytes (zerotk::config::kMaxStringBytes)");
  }

  struct Frame {
    Json* node;
    std::string path;
    std::string key;                      // objects: the key whose value comes next
    bool awaiting_value = false;          // objects: `key` was read, its value was not
    std::size_t first_of_duplicate = KeyIndex::npos;  // objects: `key` was seen before, at this member
    KeyIndex index;                       // objects: keys seen so far
    std::unique_ptr<Json> aside;          // the value of a duplicate key, owned here instead of by the document
  };

  static Members& members(Frame& f) {
    return static_cast<Members&>(f.node->get_ref<Json::object_t&>());
  }

  // The path of the value being read: the pending key's, the next array element's, or the container's.
  std::string here() const {
    if (frames_.empty()) return {};
    const Frame& f = frames_.back();
    if (f.node->is_array()) return cat(f.path, "/", std::to_string(f.node->size()));
    return f.awaiting_value ? join_path(f.path, f.key) : f.path;
  }

  std::string child_path() const {
    const Frame& f = frames_.back();
    if (f.node->is_object()) return join_path(f.path, f.key);
    return f.path + "/" + std::to_string(f.node->size());
  }

  void duplicate(const Frame& f, std::string path, const Json& value) {
    const Json& first = members_of(*f.node)[f.first_of_duplicate].second;
    diag_.error(std::move(path),
                cat("duplicate key (JSON parsers silently keep only one of them); the first has the value ", show(first)),
                show(value));
  }

  // Adds `v` to the open container; null when it is the value of a duplicate key (dropped).
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
    f.awaiting_value = false;
    if (f.first_of_duplicate != KeyIndex::npos) return nullptr;
    // Append without ordered_map's linear key search: key uniqueness is tracked by f.index.
    Members& m = members(f);
    m.emplace_back(std::move(f.key), std::move(v));  // f.key is not read again before the next key()
    f.index.add(m, m.size() - 1);
    return &m.back().second;
  }

  bool put(Json v) {
    if (!frames_.empty() && frames_.back().node->is_object() && frames_.back().first_of_duplicate != KeyIndex::npos) {
      duplicate(frames_.back(), child_path(), v);
    }
    insert(std::move(v));
    return true;
  }

  bool open(Json container) {
    if (frames_.size() >= kMaxDepth) {
      diag_.error(frames_.empty() ? std::string() : child_path(),
                  cat("JSON nested deeper than ", std::to_string(kMaxDepth), " levels"),
                  container.is_array() ? "[" : "{");
      return false;
    }
    std::string path = frames_.empty() ? std::string() : child_path();
    std::unique_ptr<Json> aside;
    if (!frames_.empty() && frames_.back().node->is_object() && frames_.back().first_of_duplicate != KeyIndex::npos) {
      // Value of a duplicate key: built aside so the error can show it, dropped at close().
      frames_.back().awaiting_value = false;
      aside = std::make_unique<Json>(std::move(container));
    }
    Json* slot = aside ? aside.get() : insert(std::move(container));
    frames_.push_back(Frame{slot, std::move(path), {}, false, KeyIndex::npos, {}, std::move(aside)});
    return true;
  }

  bool close() {
    Frame f = std::move(frames_.back());
    frames_.pop_back();
    if (f.aside) duplicate(frames_.back(), std::move(f.path), *f.aside);
    return true;
  }

  std::string_view text_;
  Diagnostics& diag_;
  Json root_;
  std::vector<Frame> frames_;
};

}  // namespace detail

/// Parses `text`. On success returns the document; on failure records errors in `diag` and
/// returns null.
inline Json parse_json(std::string_view text, Diagnostics& diag) {
  detail::DomBuilder builder(text, diag);
  const bool ok = Json::sax_parse(text, &builder, Json::input_format_t::json, /*strict=*/true,
                                  /*ignore_comments=*/false);
  if (ok) {
    // nlohmann reads a NUL byte as the end of the input, so a document followed by "\0garbage"
    // parses; a NUL anywhere else has already failed the parse above.
    if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
      diag.error("", detail::cat("invalid JSON at ", builder.where(nul), ": NUL byte after the document (",
                                 std::to_string(text.size() - nul - 1), " more bytes follow it)"),
                 detail::printable(text.substr(nul, detail::kMaxValueChars), detail::kMaxValueChars));
    }
  }
  if (!ok || !diag.ok()) return Json();
  return builder.take();
}

}  // namespace zerotk::config
