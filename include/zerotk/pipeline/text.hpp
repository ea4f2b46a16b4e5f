#pragma once
/// \file zerotk/pipeline/text.hpp
/// The text form of a schedule, for golden files and for reading a schedule by eye:
///
///   zerotk-pipeline-schedule 1
///   generator 1f1b
///   stages 2
///   micro-batches 2
///   chunks 1
///   rank 0
///     gather
///     F m0
///     send-act m0 to 1
///     ...
///     step
///   rank 1
///     ...
///
/// One action per line, indented under its rank: the action's word (F, B, BI, BW, send-act,
/// recv-act, send-grad, recv-grad, gather, release, reduce, step), then `m<micro-batch>`, then
/// `c<chunk>` (written only when the schedule has more than one chunk; read as c0 when absent), then
/// `to <rank>` / `from <rank>` for transfers. `#` starts a comment. `to_text` writes exactly this
/// form, and `parse_schedule(to_text(s)) == s`; parse errors are config_errors naming the line.

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/schedule.hpp"

namespace zerotk::pipeline {

inline constexpr std::string_view kTextMagic = "zerotk-pipeline-schedule 1";

inline std::string to_text(const Schedule& s) {
  std::string out;
  out += kTextMagic;
  out += "\ngenerator " + s.generator + "\nstages " + std::to_string(s.stages) + "\nmicro-batches " +
         std::to_string(s.micro_batches) + "\nchunks " + std::to_string(s.chunks) + "\n";
  for (std::size_t r = 0; r < s.ranks.size(); ++r) {
    out += "rank " + std::to_string(r) + "\n";
    for (const Action& a : s.ranks[r]) out += "  " + describe(a, s.chunks > 1) + "\n";
  }
  return out;
}

namespace detail {

inline std::vector<std::string_view> words(std::string_view line) {
  std::vector<std::string_view> w;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const std::size_t start = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > start) w.push_back(line.substr(start, i - start));
  }
  return w;
}

inline std::optional<int> to_int(std::string_view t) {
  int v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  if (ec != std::errc() || end != t.data() + t.size() || t.empty() || v < 0) return std::nullopt;
  return v;
}

struct TextParser {
  std::size_t line_no = 0;
  std::string line;

  [[noreturn]] void fail(const std::string& why) const {
    throw config_error(why, "pipeline schedule text, line " + std::to_string(line_no), line);
  }

  int number(std::string_view t, std::string_view what) const {
    const auto v = to_int(t);
    if (!v) fail(std::string(what) + " must be a number >= 0");
    return *v;
  }

  // "stages 4": the value of a header line with the given key.
  int header(const std::vector<std::string_view>& w, std::string_view key) const {
    if (w.size() != 2 || w[0] != key) fail("expected `" + std::string(key) + " <number>`");
    return number(w[1], key);
  }

  Action action(const std::vector<std::string_view>& w) const {
    Action a;
    bool known = false;
    for (int i = 0; i < kOpCount; ++i) {
      if (w[0] == to_string(static_cast<Op>(i))) {
        a.op = static_cast<Op>(i);
        known = true;
      }
    }
    if (!known) fail("unknown action (F, B, BI, BW, send-act, recv-act, send-grad, recv-grad, gather, release, reduce, step)");
    std::size_t i = 1;
    if (has_micro(a.op)) {
      if (i >= w.size() || !w[i].starts_with('m')) fail("`" + std::string(w[0]) + "` needs a micro-batch `m<number>`");
      a.micro = number(w[i++].substr(1), "micro-batch");
    }
    if (has_chunk(a.op) && i < w.size() && w[i].starts_with('c')) a.chunk = number(w[i++].substr(1), "chunk");
    if (is_transfer(a.op)) {
      const std::string_view dir = is_send(a.op) ? "to" : "from";
      if (i + 1 >= w.size() || w[i] != dir) fail("`" + std::string(w[0]) + "` needs `" + std::string(dir) + " <rank>`");
      a.peer = number(w[i + 1], "rank");
      i += 2;
    }
    if (i != w.size()) fail("unexpected `" + std::string(w[i]) + "`");
    return a;
  }
};

}  // namespace detail

/// Reads the text form; config_error naming the line on anything else, usage_error (from
/// check_well_formed) naming the rank and action when the schedule itself is inconsistent.
inline Schedule parse_schedule(std::string_view text) {
  detail::TextParser p;
  Schedule s;
  int header = 0;  // lines of the header read so far
  bool sized = false;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t end = std::min(text.find('\n', at), text.size());
    p.line.assign(text.substr(at, end - at));
    ++p.line_no;
    at = end + 1;
    std::string_view content = p.line;
    content = content.substr(0, std::min(content.find('#'), content.size()));
    const auto w = detail::words(content);
    if (w.empty()) continue;
    switch (header) {
      case 0:
        if (content.find(kTextMagic) != 0 || w.size() != 2) p.fail("the first line must be `" + std::string(kTextMagic) + "`");
        ++header;
        continue;
      case 1:
        if (w.size() != 2 || w[0] != "generator") p.fail("expected `generator <name>`");
        s.generator = std::string(w[1]);
        ++header;
        continue;
      case 2: s.stages = p.header(w, "stages"); ++header; continue;
      case 3: s.micro_batches = p.header(w, "micro-batches"); ++header; continue;
      case 4: s.chunks = p.header(w, "chunks"); ++header; continue;
      default: break;
    }
    if (!sized) {
      if (s.stages < 1 || s.stages > 1 << 16) p.fail("stages must be in [1, 65536]");
      s.ranks.resize(static_cast<std::size_t>(s.stages));
      sized = true;
    }
    if (w[0] == "rank") {
      if (w.size() != 2) p.fail("expected `rank <number>`");
      const int r = p.number(w[1], "rank");
      if (static_cast<std::size_t>(r) != static_cast<std::size_t>(header - 5)) {
        p.fail("ranks must come in order 0, 1, ...: expected rank " + std::to_string(header - 5));
      }
      if (r >= s.stages) p.fail("rank must be < stages (" + std::to_string(s.stages) + ")");
      ++header;
      continue;
    }
    if (header == 5) p.fail("an action before the first `rank <number>` line");
    s.ranks[static_cast<std::size_t>(header - 6)].push_back(p.action(w));
  }
  if (header < 5) p.fail("the header ends early: it needs generator, stages, micro-batches and chunks");
  if (header - 5 != s.stages) {
    throw config_error("every rank needs its `rank <number>` block", "pipeline schedule text",
                       std::to_string(header - 5) + " of " + std::to_string(s.stages) + " ranks");
  }
  check_well_formed(s);
  return s;
}

}  // namespace zerotk::pipeline
