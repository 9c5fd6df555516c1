#include "core/models/pipedream_profile.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "core/units.h"

namespace pipegrid {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A finite number from 0 to `max` ("inf", "nan" and 1e308 are not times or sizes).
bool number(std::string_view s, double* out, double max) {
  s = trim(s);
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *out);
  return ec == std::errc() && p == s.data() + s.size() && *out >= 0 && *out <= max;
}

// "123.0" or "[1.0; 2.0]" (summed; "[]" is no size).
bool size_value(std::string_view s, double* out, double max) {
  s = trim(s);
  if (s.empty() || s.front() != '[') return number(s, out, max);
  if (s.back() != ']') return false;
  s = trim(s.substr(1, s.size() - 2));
  if (s.empty()) return false;
  *out = 0;
  while (!s.empty()) {
    size_t semi = s.find(';');
    double v = 0;
    if (!number(s.substr(0, semi), &v, max)) return false;
    *out += v;
    if (*out > max) return false;
    if (semi == std::string_view::npos) break;
    s.remove_prefix(semi + 1);
  }
  return true;
}

// The message for a node line that does not have the expected shape.
std::string expected_node(std::string_view line) {
  return fmt::format(
      "expected \"nodeN -- description -- forward_compute_time=<ms>, backward_compute_time=<ms>, "
      "activation_size=<bytes>, parameter_size=<bytes>\", got \"{}\"",
      line.size() > 120 ? std::string(line.substr(0, 117)) + "..." : std::string(line));
}

using KeyValues = std::map<std::string, std::string, std::less<>>;

// The fields of a node line, in the profile's order.
constexpr std::array<std::string_view, 4> kFields = {"forward_compute_time", "backward_compute_time",
                                                     "activation_size", "parameter_size"};

// "key=value, key=[a; b], ..." split at the commas outside brackets; none when an item has no '='.
// A key given twice or not one of kFields is `bad`'s error.
std::optional<KeyValues> metrics_of(std::string_view metrics, std::string& bad) {
  KeyValues kv;
  while (!metrics.empty()) {
    size_t end = 0;
    int depth = 0;
    for (; end < metrics.size(); ++end) {
      if (metrics[end] == '[') ++depth;
      if (metrics[end] == ']') --depth;
      if (metrics[end] == ',' && depth == 0) break;
    }
    std::string_view item = trim(metrics.substr(0, end));
    size_t eq = item.find('=');
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string key(trim(item.substr(0, eq)));
    if (std::find(kFields.begin(), kFields.end(), key) == kFields.end())
      bad = fmt::format("unknown field \"{}\" (a node line has {})", key, fmt::join(kFields, ", "));
    else if (!kv.emplace(key, std::string(trim(item.substr(eq + 1)))).second)
      bad = fmt::format("{} appears twice: {}={}, then {}", key, key, kv[key], item);
    if (!bad.empty()) return kv;
    metrics = end < metrics.size() ? metrics.substr(end + 1) : std::string_view{};
  }
  return kv;
}

// A node line, "nodeN -- description -- forward_compute_time=..., ... [-- stage_id=k]", as a layer
// named nodeN. Errors without the location.
Result<Layer> parse_node(std::string_view line, const ProfileOptions& o) {
  const size_t first = line.find(" -- ");
  if (first == std::string_view::npos) return Error{expected_node(line)};
  std::string_view rest = line.substr(first + 4);
  size_t last = rest.rfind(" -- ");
  if (last != std::string_view::npos && trim(rest.substr(last + 4)).rfind("stage_id=", 0) == 0) {
    rest = rest.substr(0, last);  // partitioned graphs end with " -- stage_id=k"
    last = rest.rfind(" -- ");
  }
  if (last == std::string_view::npos) return Error{expected_node(line)};
  const std::string node(trim(line.substr(0, first)));
  const std::string description(trim(rest.substr(0, last)));
  std::string bad;
  std::optional<KeyValues> kv = metrics_of(rest.substr(last + 4), bad);
  if (!kv) return Error{expected_node(line)};
  if (!bad.empty()) return Error{fmt::format("node {}: {}", node, bad)};
  // The bounds of quantities in every other input (core/units.h), in the profile's units.
  const double kMaxMs = max_magnitude(Dimension::Time) * 1e3, kMaxBytes = max_magnitude(Dimension::Bytes);
  double fwd = 0, bwd = 0, act = 0, params = 0;
  for (auto [key, out, sized, max, unit] :
       {std::tuple{"forward_compute_time", &fwd, false, kMaxMs, "ms"},
        std::tuple{"backward_compute_time", &bwd, false, kMaxMs, "ms"},
        std::tuple{"activation_size", &act, true, kMaxBytes, "bytes"},
        std::tuple{"parameter_size", &params, false, kMaxBytes, "bytes"}}) {
    auto it = kv->find(key);
    if (it == kv->end()) return Error{fmt::format("node {} has no {}", node, key)};
    if (!(sized ? size_value(it->second, out, max) : number(it->second, out, max)))
      return Error{fmt::format("node {}: {} must be a number from 0 to {:.0e} ({}), got \"{}\"", node, key,
                               max, unit, it->second)};
  }
  if (params != std::floor(params))
    return Error{fmt::format("node {}: parameter_size must be a whole number of bytes, got \"{}\"", node,
                             kv->at("parameter_size"))};
  Layer l;
  l.name = node;
  l.description = description;
  l.kind = description.substr(0, description.find('('));
  const bool input = description.rfind("Input", 0) == 0;
  if (input) l.kind = "input";
  l.output_bytes = act / o.batch;
  l.stash_bytes = l.output_bytes;
  l.parameter_bytes = params;
  l.parameters = params / 4;
  l.measured = MeasuredCost{input ? 0.0 : fwd / 1e3, input ? 0.0 : bwd / 1e3, 0, o.batch, o.device_kind};
  return l;
}

// The profile's edges added to w; a cycle is named by the line of the edge that closes it.
Status add_edges(Workload& w, std::string_view name, const std::vector<std::pair<int, int>>& edges,
                 const std::vector<size_t>& edge_lines) {
  for (auto [a, b] : edges) w.add_edge(a, b);
  std::pair<int, int> closing{-1, -1};
  if (Status s = check_acyclic(w, &closing); !s) {
    const auto it = std::find(edges.begin(), edges.end(), closing);
    if (it == edges.end()) return Error{fmt::format("{}: {}", name, s.error().message)};
    return Error{fmt::format("{}:{}: {} (this edge closes it)", name, edge_lines[it - edges.begin()],
                             s.error().message)};
  }
  return {};
}

}  // namespace

Result<Workload> parse_pipedream_profile(std::string_view text, std::string_view name,
                                         const ProfileOptions& o) {
  Workload w;
  w.name = std::string(name);
  w.precision = Precision::FP32;
  w.micro_batch_size = o.batch;
  std::map<std::string, int, std::less<>> ids;
  std::vector<std::pair<int, int>> edges;
  std::vector<size_t> edge_lines;  // the line of each edge, for errors
  size_t line_no = 0, pos = 0;
  auto fail = [&](const std::string& what) { return Error{fmt::format("{}:{}: {}", name, line_no, what)}; };
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    const std::string_view raw = text.substr(pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    std::string_view line = trim(raw);
    if (line.empty()) continue;
    if (raw.front() == '\t' || raw.front() == ' ') {
      // Edge: "nodeA -- nodeB".
      size_t sep = line.find(" -- ");
      if (sep == std::string_view::npos)
        return fail(fmt::format("expected an edge like \"\\tnode1 -- node2\", got \"{}\"", line));
      std::string_view a = trim(line.substr(0, sep)), b = trim(line.substr(sep + 4));
      auto ia = ids.find(a), ib = ids.find(b);
      if (ia == ids.end()) return fail(fmt::format("edge from unknown node \"{}\"", a));
      if (ib == ids.end()) return fail(fmt::format("edge to unknown node \"{}\"", b));
      edges.emplace_back(ia->second, ib->second);
      edge_lines.push_back(line_no);
      continue;
    }
    Result<Layer> l = parse_node(line, o);
    if (!l) return fail(l.error().message);
    if (ids.count(l->name)) return fail(fmt::format("node {} appears twice", l->name));
    if (w.layer_count() >= static_cast<size_t>(kMaxLayers))
      return fail(fmt::format(
          "more than {} nodes, pipegrid's limit of layers in a model (see docs/limits.md)", kMaxLayers));
    std::string node = l->name;
    ids.emplace(std::move(node), w.add_layer(std::move(*l)));
  }
  if (w.layer_count() == 0) return Error{fmt::format("{}: the profile has no node", name)};
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (w.layer(i).kind == "input") w.input_bytes_per_sample += w.layer(i).output_bytes;
  if (Status s = add_edges(w, name, edges, edge_lines); !s) return s.error();
  return w;
}

}  // namespace pipegrid
