#pragma once
/// \file zerotk/pipeline/agreement.hpp
/// Before every step the pipeline ranks check that they hold the same schedule and the same
/// shape epoch (how often each called reset_shapes): one all-gather of 16 bytes per rank. Where they
/// differ, the ranks exchange their schedules' text forms and every rank throws the same
/// usage_error, naming the ranks, the rank list and action where the schedules first differ, and
/// both sides. A rank with another schedule therefore fails at the step's start, never in a
/// transfer that would wait for the deadline.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "zerotk/comm/communicator.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/pipeline/schedule.hpp"
#include "zerotk/pipeline/text.hpp"

namespace zerotk::pipeline {

/// FNV-1a over the bytes of `text`.
inline std::uint64_t text_hash(std::string_view text) noexcept {
  std::uint64_t h = 1469598103934665603ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

/// "the list of rank 1, action 4: rank 0's has `F m1`, rank 2's has `B m0`", or empty when equal.
inline std::string first_difference(const Schedule& a, int rank_a, const Schedule& b, int rank_b) {
  const std::string ra = "rank " + std::to_string(rank_a) + "'s", rb = "rank " + std::to_string(rank_b) + "'s";
  const auto field = [&](const char* name, const std::string& x, const std::string& y) {
    return std::string(name) + ": " + ra + " is " + x + ", " + rb + " is " + y;
  };
  if (a.generator != b.generator) return field("the generator", a.generator, b.generator);
  if (a.stages != b.stages) return field("the stages", std::to_string(a.stages), std::to_string(b.stages));
  if (a.micro_batches != b.micro_batches) {
    return field("the micro-batches", std::to_string(a.micro_batches), std::to_string(b.micro_batches));
  }
  if (a.chunks != b.chunks) return field("the chunks", std::to_string(a.chunks), std::to_string(b.chunks));
  for (std::size_t r = 0; r < a.ranks.size() && r < b.ranks.size(); ++r) {
    const auto& x = a.ranks[r];
    const auto& y = b.ranks[r];
    for (std::size_t i = 0; i < x.size() || i < y.size(); ++i) {
      if (i < x.size() && i < y.size() && x[i] == y[i]) continue;
      const auto show = [&](const std::vector<Action>& l) {
        return i < l.size() ? "`" + describe(l[i], a.chunks > 1) + "`" : std::string("nothing (its list ends)");
      };
      return "the list of rank " + std::to_string(r) + ", action " + std::to_string(i) + ": " + ra + " has " + show(x) +
             ", " + rb + " has " + show(y);
    }
  }
  return {};
}

/// Collective over `pipe`: every rank holds the schedule whose text form is `text`, at shape epoch
/// `epoch`, or every rank throws the same usage_error.
template <comm::Communicator C>
void check_agreement(C& pipe, const std::string& text, std::uint64_t epoch) {
  const auto p = static_cast<std::size_t>(pipe.size());
  std::uint64_t mine[2] = {text_hash(text), epoch};
  std::vector<std::uint64_t> all(2 * p);
  pipe.all_gather(mine, all.data(), sizeof(mine), DType::uint8).wait();
  std::size_t other = p;
  bool schedules_differ = false;
  for (std::size_t r = 1; r < p && other == p; ++r) {
    if (all[2 * r] != all[0]) {
      other = r;
      schedules_differ = true;
    } else if (all[2 * r + 1] != all[1]) {
      other = r;
    }
  }
  if (other == p) return;
  const std::string where = "pipeline::Executor::run (ranks 0 and " + std::to_string(other) + " of the pipeline group)";
  if (!schedules_differ) {
    throw usage_error("rank " + std::to_string(other) + " called reset_shapes() " + std::to_string(all[2 * other + 1]) +
                          " times, rank 0 " + std::to_string(all[1]) +
                          " times: every rank of the pipeline resets its shapes between the same two steps",
                      where);
  }
  // Exchange the texts (sizes first) so that every rank can name the difference.
  double len = static_cast<double>(text.size());
  std::vector<double> lens(p);
  pipe.all_gather(&len, lens.data(), 1, DType::fp64).wait();
  std::vector<std::size_t> counts(p);
  std::size_t total = 0;
  for (std::size_t r = 0; r < p; ++r) total += counts[r] = static_cast<std::size_t>(lens[r]);
  std::string texts(total, '\0');
  pipe.all_gatherv(text.data(), text.size(), texts.data(), counts, DType::uint8).wait();
  std::size_t off0 = 0, off = 0;
  for (std::size_t r = 0; r < other; ++r) off += counts[r];
  std::string why;
  try {
    why = first_difference(parse_schedule(std::string_view(texts).substr(off0, counts[0])), 0,
                           parse_schedule(std::string_view(texts).substr(off, counts[other])), static_cast<int>(other));
  } catch (const error& e) {
    why = std::string("one of them does not parse: ") + e.what();
  }
  throw usage_error("pipeline ranks hold different schedules (every rank must run the same one); they differ at " + why,
                    where);
}

}  // namespace zerotk::pipeline
