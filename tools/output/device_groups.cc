#include "tools/output/device_groups.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace pipegrid::output {
namespace {

// A name split into a prefix and its trailing number ("gpu12" -> "gpu", 12); no digits: number -1.
std::pair<std::string_view, long long> split_name(std::string_view name) {
  size_t i = name.size();
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') --i;
  // A leading zero ("gpu07") or more digits than a long long holds: not a number to range over.
  if (i == name.size() || name.size() - i > 15 || (name[i] == '0' && name.size() - i > 1)) return {name, -1};
  long long n = 0;
  for (size_t k = i; k < name.size(); ++k) n = 10 * n + (name[k] - '0');
  return {name.substr(0, i), n};
}

std::string range_text(std::string_view first_name, std::string_view prefix, long long lo, long long hi) {
  if (lo == hi) return std::string(first_name);
  const bool dots = !prefix.empty() && (prefix.back() == '-' || prefix.back() == '.');
  return fmt::format("{}{}{}{}", prefix, lo, dots ? ".." : "-", hi);
}

}  // namespace

std::string name_ranges(const std::vector<std::string>& names, size_t max_parts) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < names.size();) {
    const auto [prefix, lo] = split_name(names[i]);
    size_t j = i;  // names[i..j] form one range
    while (lo >= 0 && j + 1 < names.size()) {
      const auto [next_prefix, n] = split_name(names[j + 1]);
      if (next_prefix != prefix || n != lo + static_cast<long long>(j + 1 - i)) break;
      ++j;
    }
    parts.push_back(range_text(names[i], prefix, lo, lo + static_cast<long long>(j - i)));
    i = j + 1;
  }
  std::string out;
  // "..." stands for two parts or more: in place of one it would hide a range and save nothing.
  const bool elide = max_parts > 0 && parts.size() > max_parts + 1;
  for (size_t k = 0; k < parts.size(); ++k) {
    if (elide && k + 1 >= max_parts && k + 1 < parts.size()) {
      if (k + 1 == max_parts) out += ", ...";
      continue;
    }
    out += (out.empty() ? "" : ", ") + parts[k];
  }
  if (elide) out += fmt::format(" ({} ranges)", parts.size());
  return out;
}

std::string device_ranges(const Cluster& c, const std::vector<int>& devices, size_t max_parts) {
  std::vector<std::string> names;
  names.reserve(devices.size());
  for (int d : devices) names.push_back(c.devices[static_cast<size_t>(d)].name);
  return name_ranges(names, max_parts);
}

std::vector<DeviceGroup> group_devices(const Cluster& c, const Partition& p, const Metrics& m) {
  std::vector<std::vector<int>> hosted(c.devices.size());
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int d : p.stage(s).devices) {
      std::vector<int>& h = hosted[static_cast<size_t>(d)];
      if (h.empty() || h.back() != static_cast<int>(s)) h.push_back(static_cast<int>(s));
    }
  using Key = std::tuple<std::vector<int>, std::string, double>;
  std::map<Key, size_t> index;  // key -> position in `groups`
  std::vector<DeviceGroup> groups;
  for (size_t d = 0; d < c.devices.size(); ++d) {
    Key key{hosted[d], c.devices[d].spec.kind, m.devices[d].capacity_bytes};
    auto [it, added] = index.emplace(std::move(key), groups.size());
    if (added) groups.push_back({{}, hosted[d], static_cast<int>(d), static_cast<int>(d)});
    DeviceGroup& g = groups[it->second];
    g.devices.push_back(static_cast<int>(d));
    if (m.devices[d].busy_s > m.devices[static_cast<size_t>(g.busiest)].busy_s)
      g.busiest = static_cast<int>(d);
    if (m.devices[d].peak_memory_bytes > m.devices[static_cast<size_t>(g.most_memory)].peak_memory_bytes)
      g.most_memory = static_cast<int>(d);
  }
  // In stage order (a pipeline reads top to bottom), the unused last.
  std::stable_sort(groups.begin(), groups.end(), [](const DeviceGroup& a, const DeviceGroup& b) {
    if (a.stages.empty() != b.stages.empty()) return b.stages.empty();
    return !a.stages.empty() && a.stages.front() < b.stages.front();
  });
  return groups;
}

std::string group_role(const DeviceGroup& g) {
  if (g.stages.empty()) return "unused";
  std::string out = g.stages.size() == 1 ? "stage " : "stages ";
  for (size_t i = 0; i < g.stages.size(); ++i) out += fmt::format("{}{}", i ? ", " : "", g.stages[i]);
  return out;
}

bool any_grouped(const std::vector<DeviceGroup>& groups) {
  return std::any_of(groups.begin(), groups.end(), [](const DeviceGroup& g) { return g.devices.size() > 1; });
}

}  // namespace pipegrid::output
