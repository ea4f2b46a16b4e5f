#pragma once
/// \file zerotk/monitor/csv_monitor.hpp
/// DeepSpeed's csv_monitor, file for file and byte for byte (SEMANTICS.md section 11): rank 0
/// writes one CSV per event name into `output_path/job_name`, named after the event with '/' and
/// ' ' turned into '_' (`Train/Samples/lr` -> `Train_Samples_lr.csv`). Files are opened in append
/// mode for every write; the header row `step,<last name component>` is written the first time
/// this monitor writes a file (so a restarted job appends a second header, as DeepSpeed does);
/// rows are `step,value` ended by "\r\n" (Python's csv module), values in Python's str().

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "zerotk/config/options.hpp"
#include "zerotk/core/error.hpp"
#include "zerotk/monitor/format.hpp"

namespace zerotk::monitor {

/// One logged scalar: `name` like "Train/Samples/lr", `step` the x value (DeepSpeed uses global samples).
struct Event {
  std::string name;
  MetricValue value;
  std::int64_t step;
};

namespace detail {
/// A field as Python's csv.writer (QUOTE_MINIMAL) writes it.
inline std::string csv_field(std::string_view s) {
  if (s.find_first_of(",\"\r\n") == std::string_view::npos) return std::string(s);
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  q += '"';
  return q;
}
}  // namespace detail

class CsvMonitor {
 public:
  /// Only rank 0 writes; on other ranks (or when disabled) every call is a no-op. Rank 0 creates
  /// the directory now, so a bad output_path fails at startup rather than at the first step.
  CsvMonitor(config::CsvMonitorOptions options, int rank)
      : options_(std::move(options)), active_(options_.enabled && rank == 0) {
    if (!active_) return;
    // os.path.join semantics: an absolute job_name replaces output_path; "" output_path is the cwd.
    dir_ = std::filesystem::path(options_.output_path) / options_.job_name;
    std::error_code ec;
    std::filesystem::create_directories(dir_, ec);
    if (ec) throw io_error(std::string("cannot create csv_monitor directory: ").append(ec.message()), dir_.string());
  }

  bool enabled() const noexcept { return active_; }
  /// The directory files go to (empty when not writing).
  const std::filesystem::path& log_dir() const noexcept { return dir_; }
  /// The file an event name maps to.
  std::filesystem::path file_for(std::string_view name) const { return dir_ / (file_stem(name) + ".csv"); }

  void write_events(std::span<const Event> events) {
    if (!active_) return;
    for (const Event& e : events) write(e.name, e.value, e.step);
  }
  void write_events(std::initializer_list<Event> events) { write_events(std::span<const Event>(events.begin(), events.size())); }

  void write(std::string_view name, const MetricValue& value, std::int64_t step) {
    if (!active_) return;
    const std::string stem = file_stem(name);
    const std::filesystem::path path = dir_ / (stem + ".csv");
    std::ofstream f(path, std::ios::binary | std::ios::app);
    if (!f) throw io_error("cannot open csv_monitor file for appending", path.string());
    if (started_.insert(stem).second) {
      const std::size_t slash = name.rfind('/');
      const std::string_view header = slash == std::string_view::npos ? name : name.substr(slash + 1);
      f << "step," << detail::csv_field(header) << "\r\n";
    }
    f << std::to_string(step) << ',' << value.str() << "\r\n";
    f.flush();
    if (!f) throw io_error("cannot write csv_monitor file", path.string());
  }

 private:
  static std::string file_stem(std::string_view name) {
    std::string s(name);
    for (char& c : s) {
      if (c == '/' || c == ' ') c = '_';
    }
    return s;
  }

  config::CsvMonitorOptions options_;
  bool active_;
  std::filesystem::path dir_;
  std::set<std::string> started_;  // file stems that got their header from this monitor
};

}  // namespace zerotk::monitor
