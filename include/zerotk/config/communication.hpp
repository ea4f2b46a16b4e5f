#pragma once
/// \file zerotk/config/communication.hpp
/// The `communication` block (zerotk's own keys; no DeepSpeed release has them, docs/config.md):
/// the data group's topology and the slow-rank detector, read into Config::communication (the
/// engine's CommunicationOptions), checked against the world size, and written back by
/// config/writer.hpp.
///
///   "communication": {
///     "topology": 2,                                   // or {"levels": 2, "ranks_per_node": 8}, {"node_of_rank": [...]}
///     "slow_node_tolerance": 0.1, "slow_node_window": 20, "slow_node_count": 3, "slow_node_action": "report"
///   }
///
/// Reader::read_communication is declared in config/reader.hpp and defined here (reader.hpp
/// includes this file at its end), so the block's keys live in one file.

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/comm/topology.hpp"
#include "zerotk/config/json_dom.hpp"
#include "zerotk/config/options.hpp"
#include "zerotk/config/reader.hpp"
#include "zerotk/engine/communication.hpp"

namespace zerotk::config {

namespace detail {

inline constexpr std::array<std::string_view, 3> kSlowNodeActions{"report", "abort", "rebalance"};
inline constexpr std::array<std::string_view, 2> kInnerDomains{"socket", "numa"};

/// "communication.topology.node_of_rank[1]" (an engine-side where) as a JSON pointer.
inline std::string pointer_of(std::string_view where) {
  std::string p = "/";
  for (char ch : where) {
    if (ch == '.' || ch == '[') {
      p += '/';
    } else if (ch != ']') {
      p += ch;
    }
  }
  return p;
}

/// An array of one int >= 0 per rank at `key` of `b` (absent or null: unchanged).
inline void read_rank_map(Reader& r, Block& b, std::string_view key, std::vector<int>& out) {
  const Json* v = b.find(key);
  if (v == nullptr || v->is_null()) return;
  if (!v->is_array()) {
    r.error(b.path_of(key), "expected an array with one id per rank, e.g. [0, 0, 1, 1]", show(*v));
    return;
  }
  std::vector<int> ids;
  for (std::size_t i = 0; i < v->size(); ++i) {
    const Json& e = (*v)[i];
    if (!e.is_number_integer() || e.get<std::int64_t>() < 0 || e.get<std::int64_t>() > std::numeric_limits<int>::max()) {
      r.error(b.path_of(key) + "/" + std::to_string(i), "expected an id: an integer >= 0", show(e));
      return;
    }
    ids.push_back(static_cast<int>(e.get<std::int64_t>()));
  }
  out = std::move(ids);
}

}  // namespace detail

inline void detail::Reader::read_communication(Block& root, Config& c) {
  Block b(*this, root.get_object("communication"), root.path_of("communication"));
  comm::TopologyOptions& t = c.communication.topology;
  const std::string tpath = b.path_of("topology");
  if (const Json* tv = b.find("topology"); tv != nullptr && !tv->is_null()) {
    if (tv->is_object()) {
      Block tb(*this, tv, tpath);
      detail::read_rank_map(*this, tb, "node_of_rank", t.node_of_rank);
      detail::read_rank_map(*this, tb, "socket_of_rank", t.socket_of_rank);
      tb.get_int("ranks_per_node", t.ranks_per_node, 1, std::numeric_limits<int>::max());
      tb.get_int("ranks_per_socket", t.ranks_per_socket, 1, std::numeric_limits<int>::max());
      std::size_t inner = 0;
      const bool inner_given = tb.get_choice("inner", inner, detail::kInnerDomains) == Got::value;
      if (inner_given) t.inner = static_cast<comm::InnerDomain>(inner);
      // A map or a count without "levels" says how many levels there are.
      t.levels = t.ranks_per_socket > 0 || !t.socket_of_rank.empty() ? 3 : 2;
      tb.get_int("levels", t.levels, 1, comm::kMaxTopologyLevels);
      // "inner" names what the middle of three levels groups by: with fewer levels it has no level to
      // name, so it is ignored with a note (an error under strict), and the Config says what runs
      // (the default), so that to_json -> parse -> to_json is a fixed point (issue 57 item 7).
      if (inner_given && t.levels != 3) {
        unsupported(tb.path_of("inner"),
                    cat("names the middle of three link levels; this topology has ", std::to_string(t.levels),
                        " (add \"levels\": 3, \"ranks_per_socket\" or \"socket_of_rank\"); ignored"),
                    std::string(comm::to_string(static_cast<comm::InnerDomain>(inner))));
        t.inner = comm::TopologyOptions{}.inner;
      }
      tb.finish();
    } else {
      b.get_int("topology", t.levels, 1, comm::kMaxTopologyLevels);
    }
    // What can be checked without the ranks: the counts and maps against the world size, and the
    // groups' sizes when every level is declared (detected levels are checked when the engine starts).
    try {
      (void)comm::declared_topology(t, ctx.world_size);
    } catch (const config_error& e) {
      error(detail::pointer_of(e.where()), e.message(), e.value());
    }
  }
  SlowRankOptions& s = c.communication.slow_ranks;
  // Any of these keys turns the detector on.
  const bool any = b.get_number("slow_node_tolerance", s.tolerance, 0.0) != Got::absent;
  const bool window = b.get_int("slow_node_window", s.window, 1, 1'000'000) != Got::absent;
  const bool count = b.get_int("slow_node_count", s.count, 1, 1'000'000) != Got::absent;
  std::size_t action = 0;
  const Got a = b.get_choice("slow_node_action", action, detail::kSlowNodeActions);
  if (a == Got::value) s.action = static_cast<SlowRankAction>(action);
  s.enabled = any || window || count || a != Got::absent;
  // Rebalancing splits the data group's micro-batch: the batch triad's micro-batch per rank.
  s.micro_batch_size = c.train_micro_batch_size_per_gpu;
  b.finish();
}

/// ZeRO++ qwZ and qgZ (`zero_optimization.zero_quantized_weights`, `zero_quantized_gradients`):
/// stage 3 only, as DeepSpeed reads them; below stage 3 a note (an error under strict).
inline void detail::Reader::read_quantized(Block& b, ZeroOptions& z) {
  for (const char* key : {"zero_quantized_weights", "zero_quantized_gradients"}) {
    bool on = false;
    if (b.get_bool(key, on) != Got::value || !on) continue;
    if (z.stage != 3) {
      unsupported(b.path_of(key),
                  cat("has effect only at ZeRO stage 3 (stage is ", std::to_string(z.stage), "; DeepSpeed ignores it too); ignored"),
                  "true");
      continue;
    }
    (std::string_view(key) == "zero_quantized_weights" ? z.stage3.quantized_weights : z.stage3.quantized_gradients) = true;
  }
}

namespace detail {

/// The block as JSON, every value spelled out; null when it is all defaults (a config without the
/// block resolves to the same JSON as before the block existed).
inline Json communication_json(const CommunicationOptions& o) {
  const comm::TopologyOptions& t = o.topology;
  const SlowRankOptions& s = o.slow_ranks;
  const bool declared = t.ranks_per_node > 0 || t.ranks_per_socket > 0 || !t.node_of_rank.empty() || !t.socket_of_rank.empty() ||
                        t.inner != comm::InnerDomain::socket;
  if (t.levels == 1 && !declared && !s.enabled) return Json(nullptr);
  Json j;
  if (declared) {
    Json& tj = j["topology"];
    tj["levels"] = t.levels;
    if (t.ranks_per_node > 0) tj["ranks_per_node"] = t.ranks_per_node;
    if (t.ranks_per_socket > 0) tj["ranks_per_socket"] = t.ranks_per_socket;
    if (t.levels == 3) tj["inner"] = std::string(comm::to_string(t.inner));
    auto ids = [](const std::vector<int>& v) {
      Json a = Json::array();
      for (int x : v) a.push_back(Json(x));
      return a;
    };
    if (!t.node_of_rank.empty()) tj["node_of_rank"] = ids(t.node_of_rank);
    if (!t.socket_of_rank.empty()) tj["socket_of_rank"] = ids(t.socket_of_rank);
  } else {
    j["topology"] = t.levels;
  }
  if (s.enabled) {
    j["slow_node_tolerance"] = s.tolerance;
    j["slow_node_window"] = s.window;
    j["slow_node_count"] = s.count;
    j["slow_node_action"] = std::string(to_string(s.action));
  }
  return j;
}

}  // namespace detail
}  // namespace zerotk::config
