#include "tools/output/trace_graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <set>
#include <tuple>

#include "core/collectives.h"
#include "core/units.h"
#include "core/validate.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::output {
namespace {

using nlohmann::json;

// --- the mapping (the one place that knows the task and transfer kinds) -----------------------

// A compute task's node name: "F s2 m3", "B ...", "W ...", "step s2 m-1".
std::string compute_name(const Task& t) {
  const char* k = t.kind == TaskKind::Forward    ? "F"
                  : t.kind == TaskKind::Backward ? "B"
                  : t.kind == TaskKind::Weight   ? "W"
                                                 : "step";
  return fmt::format("{} s{} m{}", k, t.stage, t.micro_batch);
}

// A transfer's send / receive name: "activation s1 s2 m3" (producing and consuming stages).
std::string transfer_name(const Task& t) {
  const char* k = t.transfer == TransferKind::Activation        ? "activation"
                  : t.transfer == TransferKind::Gradient        ? "gradient"
                  : t.transfer == TransferKind::DataParallel    ? "allreduce"
                  : t.transfer == TransferKind::TensorParallel  ? "tp"  // one flow of a TP collective
                  : t.transfer == TransferKind::ExpertParallel  ? "ep"  // one flow of an EP collective
                  : t.transfer == TransferKind::ContextParallel ? "cp"  // one flow of a CP K/V exchange
                                                                : "transfer";
  return fmt::format("{} s{} s{} m{}", k, t.stage, t.peer_stage, t.micro_batch);
}

// The inverse of both names; anything else: a forward of stage 0 (compute) or an activation.
void parse_name(const std::string& name, Task& t) {
  char kind[16] = {0};
  int a = 0, b = 0, m = -1;
  if (t.kind == TaskKind::Transfer) {
    t.transfer = TransferKind::Activation;
    if (std::sscanf(name.c_str(), "%15s s%d s%d m%d", kind, &a, &b, &m) == 4) {
      const std::string k = kind;
      t.transfer = k == "gradient"    ? TransferKind::Gradient
                   : k == "allreduce" ? TransferKind::DataParallel
                   : k == "tp"        ? TransferKind::TensorParallel
                   : k == "ep"        ? TransferKind::ExpertParallel
                   : k == "cp"        ? TransferKind::ContextParallel
                                      : TransferKind::Activation;
      t.stage = a;
      t.peer_stage = b;
      t.micro_batch = m;
    }
    return;
  }
  t.kind = TaskKind::Forward;
  t.stage = 0;
  if (std::sscanf(name.c_str(), "%15s s%d m%d", kind, &a, &m) == 3) {
    const std::string k = kind;
    t.kind = k == "B"      ? TaskKind::Backward
             : k == "W"    ? TaskKind::Weight
             : k == "step" ? TaskKind::Optimizer
                           : TaskKind::Forward;
    t.stage = a;
    t.micro_batch = m;
  }
}

// Whether transfer t is one step of a collective (exported as one node per rank when it is a ring).
bool collective_step(const Task& t) {
  return t.kind == TaskKind::Transfer && t.transfer == TransferKind::DataParallel;
}

// --- export -----------------------------------------------------------------------------------

// The all-reduce steps of one stage, when they form core/collectives.h's ring.
struct Ring {
  std::vector<int32_t> steps;
  std::vector<int> members;  // ring order
  double bytes = 0;          // the whole buffer
  bool valid = false;
};

// Whether the ring's flows are one stepped ring all-reduce (core/collectives.h's stepped_ring of
// 2 (n - 1) steps): each flow waits, among the ring's flows, for nothing (step 0) or for exactly
// one flow into its sender (the previous step), and each step has one flow per member. Two
// bucketed reduce-scatters (ZeRO-1 with dp_overlap) have the same flows per device but two first
// steps: they are not one all-reduce.
bool stepped_as_allreduce(const Ring& r, const TaskGraph& g, const std::vector<std::vector<int32_t>>& pred,
                          size_t n) {
  std::map<int32_t, size_t> step;
  for (int32_t t : r.steps) step[t] = 0;
  std::vector<size_t> per_step(2 * (n - 1), 0);
  for (int32_t t : r.steps) {  // in task order: a flow after the flow it waits for
    size_t inside = 0;
    for (int32_t p : pred[t]) {
      auto it = step.find(p);
      if (it == step.end()) continue;
      if (++inside > 1 || g.tasks[p].peer != g.tasks[t].device || p > t) return false;
      step[t] = it->second + 1;
    }
    if (step[t] >= per_step.size()) return false;
    ++per_step[step[t]];
  }
  return std::all_of(per_step.begin(), per_step.end(), [n](size_t c) { return c == n; });
}

void check_ring(Ring& r, const TaskGraph& g, const std::vector<std::vector<int32_t>>& pred) {
  std::map<int, int> next;
  std::map<int, size_t> sends;
  for (int32_t t : r.steps) {
    const Task& k = g.tasks[t];
    auto [it, fresh] = next.emplace(k.device, k.peer);
    if (!fresh && it->second != k.peer) return;
    ++sends[k.device];
    if (k.bytes != g.tasks[r.steps.front()].bytes) return;
  }
  const size_t n = next.size();
  if (n < 2 || r.steps.size() != 2 * (n - 1) * n) return;
  for (auto& [d, c] : sends)
    if (c != 2 * (n - 1)) return;
  int d = next.begin()->first;
  for (size_t i = 0; i < n; ++i, d = next[d]) {
    r.members.push_back(d);
    if (!next.count(d)) return;
  }
  if (d != r.members.front() || !stepped_as_allreduce(r, g, pred, n)) return;
  r.bytes = g.tasks[r.steps.front()].bytes * static_cast<double>(n);
  r.valid = true;
}

// "F s0 m0" on device 0, "tp s0 s0 m0" from device 1 to 0: a task as messages name it.
std::string describe(const Task& k) {
  return k.is_compute() ? fmt::format("\"{}\" on device {}", compute_name(k), k.device)
                        : fmt::format("\"{}\" from device {} to {}", transfer_name(k), k.device, k.peer);
}

// Transfer t's send (on its sender) or receive (on its receiver) node, after `deps` of that rank.
json transfer_node(const Task& k, int32_t t, bool send, const std::set<int64_t>& deps) {
  json node = {{"rank", send ? k.device : k.peer},
               {"type", send ? "send" : "recv"},
               {"name", transfer_name(k)},
               {"peer", send ? k.peer : k.device},
               {"bytes", k.bytes},
               {"tag", t},
               {"deps", std::vector<int64_t>(deps.begin(), deps.end())}};
  // A fixed time the flow pays besides its bytes (a collective engine's step and call).
  if (send && k.duration > 0) node["duration_s"] = k.duration;
  // A collective's channel (NCCL's double binary trees), its own connection in the replay.
  if (k.channel != 0) node["channel"] = k.channel;
  return node;
}

// The data-parallel all-reduces that form core/collectives.h's ring, by stage (exported as one
// collective node per rank); per task, the stage of its ring or -1. The stages whose gradient flows
// are not one ring all-reduce are noted (they are written as send / receive pairs).
std::vector<int32_t> find_rings(const TaskGraph& g, const std::vector<std::vector<int32_t>>& pred,
                                std::map<int32_t, Ring>& rings, std::vector<std::string>* notes) {
  std::vector<int32_t> ring_of(g.tasks.size(), -1);
  for (size_t t = 0; t < g.tasks.size(); ++t)
    if (collective_step(g.tasks[t])) rings[g.tasks[t].stage].steps.push_back(static_cast<int32_t>(t));
  for (auto& [stage, r] : rings) {
    check_ring(r, g, pred);
    if (r.valid)
      for (int32_t t : r.steps) ring_of[t] = stage;
    else if (notes != nullptr)
      notes->push_back(fmt::format(
          "stage {}'s gradient reduction ({} flows) is not one ring all-reduce (a tree, hierarchical or "
          "multi-ring all-reduce, a reduction per group, or the distributed optimizer's reduce-scatters): "
          "written as its send/receive pairs",
          stage, r.steps.size()));
  }
  return ring_of;
}

// Calls visit(t) for every task in a topological order of the data and device-order edges (each
// task after its predecessors `pred` and the previous task on its device), the lowest task first
// among the ready ones; stops at visit's first error. A cycle is an error.
Status in_topological_order(const TaskGraph& g, const std::vector<std::vector<int32_t>>& pred,
                            const std::vector<int32_t>& previous,
                            const std::function<Status(int32_t)>& visit) {
  const size_t n = g.tasks.size();
  std::vector<int32_t> missing(n, 0);
  std::vector<std::vector<int32_t>> after_on_device(n);
  std::priority_queue<int32_t, std::vector<int32_t>, std::greater<>> ready;
  for (size_t t = 0; t < n; ++t) {
    missing[t] = static_cast<int32_t>(pred[t].size()) + (previous[t] >= 0 ? 1 : 0);
    if (previous[t] >= 0) after_on_device[previous[t]].push_back(static_cast<int32_t>(t));
    if (missing[t] == 0) ready.push(static_cast<int32_t>(t));
  }
  size_t done = 0;
  while (!ready.empty()) {
    const int32_t t = ready.top();
    ready.pop();
    ++done;
    if (Status st = visit(t); !st) return st;
    for (int32_t s : g.successors(t))
      if (--missing[s] == 0) ready.push(s);
    for (int32_t s : after_on_device[t])
      if (--missing[s] == 0) ready.push(s);
  }
  if (done != n) return Error{"the task graph has a cycle; it cannot be exported"};
  return {};
}

}  // namespace

Result<json> to_trace_graph(const TaskGraph& g, size_t devices, const TraceExportOptions& o) {
  const size_t n = g.tasks.size();
  std::vector<std::vector<int32_t>> pred(n);
  for (size_t t = 0; t < n; ++t)
    for (int32_t s : g.successors(static_cast<int32_t>(t))) pred[s].push_back(static_cast<int32_t>(t));
  std::vector<int32_t> previous(n, -1);  // the previous compute task on the device
  for (const auto& order : g.device_order)
    for (size_t i = 1; i < order.size(); ++i) previous[order[i]] = order[i - 1];

  std::map<int32_t, Ring> rings;  // by stage
  const std::vector<int32_t> ring_of =
      o.collectives ? find_rings(g, pred, rings, o.notes) : std::vector<int32_t>(n, -1);

  json nodes = json::array();
  std::vector<int64_t> node_of(n, -1);                   // compute: its node; transfer: its receive
  std::vector<int64_t> send_of(n, -1);                   // transfer: its send
  std::map<std::pair<int32_t, int>, int64_t> ring_node;  // (stage, rank) -> collective node
  auto add = [&](json node) {
    node["id"] = static_cast<int64_t>(nodes.size());
    nodes.push_back(std::move(node));
    return static_cast<int64_t>(nodes.size() - 1);
  };
  auto name_of = [&](int32_t t) { return describe(g.tasks[t]); };
  // The node on `rank` that stands for task p's completion there (-1: none): a compute task's own
  // node, a transfer's receive on the receiver and its send on the sender, a ring step's collective.
  auto node_on = [&](int32_t p, int rank) -> int64_t {
    const Task& k = g.tasks[p];
    if (ring_of[p] >= 0) {
      auto it = ring_node.find({ring_of[p], rank});
      return it != ring_node.end() && k.peer == rank ? it->second : -1;
    }
    if (k.is_compute()) return k.device == rank ? node_of[p] : -1;
    return k.peer == rank ? node_of[p] : k.device == rank ? send_of[p] : -1;
  };
  auto dep = [&](int32_t p, int rank, int32_t user) -> Result<int64_t> {
    if (const int64_t id = node_on(p, rank); id >= 0) return id;
    return Error{
        fmt::format("task {} on device {} waits for task {}, of which that device sees no part; "
                    "a Chakra trace cannot say that",
                    name_of(user), rank, name_of(p))};
  };
  auto deps_of = [&](int32_t t, int rank) -> Result<json> {
    std::set<int64_t> ids;
    for (int32_t p : pred[t]) {
      Result<int64_t> id = dep(p, rank, t);
      if (!id) return id.error();
      ids.insert(*id);
    }
    return json(std::vector<int64_t>(ids.begin(), ids.end()));
  };
  Status visited = in_topological_order(g, pred, previous, [&](int32_t t) -> Status {
    const Task& k = g.tasks[t];
    if (k.is_compute()) {
      Result<json> d = deps_of(t, k.device);
      if (!d) return d.error();
      if (previous[t] >= 0) d->push_back(node_of[previous[t]]);
      std::sort(d->begin(), d->end());
      d->erase(std::unique(d->begin(), d->end()), d->end());
      node_of[t] = add({{"rank", k.device},
                        {"type", "comp"},
                        {"name", compute_name(k)},
                        {"duration_s", k.duration},
                        {"deps", *d}});
    } else if (ring_of[t] >= 0) {
      const Ring& r = rings[ring_of[t]];
      if (!ring_node.count({ring_of[t], k.device})) {
        // The rank's collective node: after everything its ring steps wait for outside the ring.
        std::set<int64_t> ids;
        for (int32_t s : r.steps)
          if (g.tasks[s].device == k.device)
            for (int32_t p : pred[s]) {
              if (ring_of[p] == ring_of[t]) continue;
              Result<int64_t> id = dep(p, k.device, s);
              if (!id) return id.error();
              ids.insert(*id);
            }
        ring_node[{ring_of[t], k.device}] = add({{"rank", k.device},
                                                 {"type", "allreduce"},
                                                 {"name", transfer_name(k)},
                                                 {"group", r.members},
                                                 {"bytes", r.bytes},
                                                 {"tag", ring_of[t]},
                                                 {"deps", std::vector<int64_t>(ids.begin(), ids.end())}});
      }
    } else {
      // What the flow waits for, on the sender (the send's dependencies) or on the receiver (the
      // receive's: a collective's flow starts once both ends reached it, a rendezvous).
      std::set<int64_t> on_sender, on_receiver;
      for (int32_t p : pred[t]) {
        if (const int64_t id = node_on(p, k.device); id >= 0) {
          on_sender.insert(id);
        } else if (const int64_t at = node_on(p, k.peer); at >= 0) {
          on_receiver.insert(at);
        } else {
          return Error{
              fmt::format("task {} waits for task {}, of which neither end sees a part; a Chakra "
                          "trace cannot say that",
                          name_of(t), name_of(p))};
        }
      }
      send_of[t] = add(transfer_node(k, t, true, on_sender));
      node_of[t] = add(transfer_node(k, t, false, on_receiver));
    }
    return {};
  });
  if (!visited) return visited.error();
  return json{{"format", "pipegrid-trace-graph"},
              {"version", 1},
              {"ranks", devices},
              {"samples_per_iteration", g.samples_per_iteration},
              {"nodes", std::move(nodes)}};
}

// --- import -----------------------------------------------------------------------------------

namespace {

// What a JSON value is, for messages: `"x"` (a string), `true`, `[...] (a list)`, ...
std::string found(const json& v) {
  std::string text = v.dump();
  if (text.size() > 40) text = text.substr(0, 37) + "...";
  const char* kind = v.is_string()    ? "a string"
                     : v.is_array()   ? "a list"
                     : v.is_object()  ? "an object"
                     : v.is_boolean() ? "true/false"
                     : v.is_null()    ? "null"
                                      : "a number";
  return fmt::format("{} ({})", text, kind);
}

// The keys each node type takes.
const std::map<std::string, std::vector<std::string_view>>& node_keys() {
  static const std::map<std::string, std::vector<std::string_view>> keys = {
      {"comp", {"id", "rank", "type", "name", "duration_s", "deps"}},
      {"send", {"id", "rank", "type", "name", "peer", "bytes", "tag", "channel", "duration_s", "deps"}},
      {"recv", {"id", "rank", "type", "name", "peer", "bytes", "tag", "channel", "deps"}},
      {"allreduce", {"id", "rank", "type", "name", "group", "bytes", "tag", "deps"}}};
  return keys;
}

// A key node n (of `type`, a valid one) does not take, else "".
std::string unknown_key(const json& n, const std::string& type) {
  const std::vector<std::string_view>& keys = node_keys().at(type);
  for (const auto& [key, value] : n.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      const std::vector<std::string> close = input::close_matches(key, keys);
      return fmt::format("\"{}\": not a key of a \"{}\" node ({}expected {})", key, type,
                         close.empty() ? "" : fmt::format("did you mean \"{}\"? ", close.front()),
                         fmt::join(keys, ", "));
    }
  return "";
}

// One node's shape (node i of `nodes`): its keys, their types and ranges.
Status check_node(const json& n, size_t i) {
  const std::string at = n.is_object() && n.contains("id") && n["id"].is_number_integer()
                             ? fmt::format("node {} (id {})", i, n["id"].get<int64_t>())
                             : fmt::format("node {}", i);
  if (!n.is_object()) return Error{fmt::format("{}: expected an object, found {}", at, found(n))};
  auto need = [&](const char* key, bool ok, const char* what, bool optional = false) -> Status {
    if (!n.contains(key))
      return optional ? Status{}
                      : Error{fmt::format("{}: \"{}\": expected {}, found nothing", at, key, what)};
    if (!ok) return Error{fmt::format("{}: \"{}\": expected {}, found {}", at, key, what, found(n[key]))};
    return {};
  };
  auto integer = [&](const char* key) { return n.contains(key) && n[key].is_number_integer(); };
  // A number from 0 to the bound of its dimension in every other input (core/units.h).
  auto in_range = [&](const char* key, Dimension d) {
    return n.contains(key) && n[key].is_number() && n[key].get<double>() >= 0 &&
           n[key].get<double>() <= max_magnitude(d);
  };
  const bool deps_ok =
      n.contains("deps") && n["deps"].is_array() &&
      std::all_of(n["deps"].begin(), n["deps"].end(), [](const json& d) { return d.is_number_integer(); });
  const std::string type = n.contains("type") && n["type"].is_string() ? n["type"].get<std::string>() : "";
  for (const Status& st :
       {need("id", integer("id"), "an integer id"), need("rank", integer("rank"), "a rank (an integer)"),
        need("type", node_keys().count(type) > 0, "one of \"comp\", \"send\", \"recv\", \"allreduce\""),
        need("deps", deps_ok, "a list of node ids"),
        need("name", n.contains("name") && n["name"].is_string(), "a name (text)", true)})
    if (!st) return st;
  if (const std::string unknown = unknown_key(n, type); !unknown.empty())
    return Error{fmt::format("{}: {}", at, unknown)};
  if (std::find(n["deps"].begin(), n["deps"].end(), n["id"]) != n["deps"].end())
    return Error{fmt::format("{}: \"deps\": the node depends on itself", at)};
  const bool comm = type == "send" || type == "recv";
  const bool group_ok =
      n.contains("group") && n["group"].is_array() &&
      std::all_of(n["group"].begin(), n["group"].end(), [](const json& r) { return r.is_number_integer(); });
  const bool channel_ok = integer("channel") && n["channel"].get<int64_t>() >= 0 &&
                          n["channel"].get<int64_t>() <= std::numeric_limits<uint16_t>::max();
  for (const Status& st :
       {need("duration_s", in_range("duration_s", Dimension::Time), "a time in seconds, from 0 to 1e9",
             type != "comp"),
        need("peer", integer("peer"), "a rank (an integer)", !comm),
        need("group", group_ok, "a list of ranks", type != "allreduce"),
        need("bytes", in_range("bytes", Dimension::Bytes), "a size in bytes, from 0 to 1e18", type == "comp"),
        need("tag", integer("tag"), "an integer tag", !comm),
        need("channel", channel_ok, "a channel (an integer from 0 to 65535)", true)})
    if (!st) return st;
  return {};
}

// The trace graph's shape (docs/import-export.md), checked before it is read: each error names the
// node (its position in `nodes` and its id), the key, what was expected and what was found.
Status check_shape(const json& j) {
  if (!j.is_object()) return Error{fmt::format("expected an object with \"nodes\", found {}", found(j))};
  const std::vector<std::string_view> top = {"format", "version", "ranks", "samples_per_iteration", "nodes"};
  for (const auto& [key, value] : j.items())
    if (std::find(top.begin(), top.end(), key) == top.end())
      return Error{
          fmt::format("\"{}\": not a key of a trace graph (expected {})", key, fmt::join(top, ", "))};
  if (j.contains("format") && j["format"] != "pipegrid-trace-graph")
    return Error{fmt::format("\"format\": expected \"pipegrid-trace-graph\", found {}", found(j["format"]))};
  if (j.contains("version") && j["version"] != 1)
    return Error{fmt::format("\"version\": expected 1 (this pipegrid reads version 1), found {}",
                             found(j["version"]))};
  if (j.contains("ranks") && !(j["ranks"].is_number_integer() && j["ranks"].get<int64_t>() >= 0))
    return Error{fmt::format("\"ranks\": expected a count of ranks, found {}", found(j["ranks"]))};
  if (j.contains("samples_per_iteration") &&
      !(j["samples_per_iteration"].is_number() && j["samples_per_iteration"].get<double>() >= 0))
    return Error{fmt::format("\"samples_per_iteration\": expected a number at least 0, found {}",
                             found(j["samples_per_iteration"]))};
  if (!j.contains("nodes") || !j["nodes"].is_array())
    return Error{fmt::format("\"nodes\": expected a list of nodes, found {}",
                             j.contains("nodes") ? found(j["nodes"]) : std::string("nothing"))};
  const json& nodes = j["nodes"];
  for (size_t i = 0; i < nodes.size(); ++i)
    if (Status st = check_node(nodes[i], i); !st) return st;
  return {};
}

// The all-reduce nodes of one group and tag (one per member rank).
struct Collective {
  std::vector<int> group;
  double bytes = 0;
  std::map<int, size_t> node;  // rank -> node
  std::string first;           // the first member's node read, as messages name it
};
using Collectives = std::map<std::pair<std::vector<int>, int64_t>, Collective>;

// An all-reduce node (node i on `rank`) into its group's Collective; errors begin with `where`.
Status read_collective(const json& n, size_t i, int rank, size_t devices, const std::string& where,
                       Collectives& collectives) {
  std::vector<int> group = n.at("group").get<std::vector<int>>();
  for (int r : group)
    if (r < 0 || static_cast<size_t>(r) >= devices)
      return Error{fmt::format("{}: group member {} is not a device of the cluster", where, r)};
  if (std::set<int>(group.begin(), group.end()).size() != group.size())
    return Error{fmt::format("{}: a rank appears twice in the group [{}]", where, fmt::join(group, ", "))};
  const double bytes = n.at("bytes").get<double>();
  if (!(bytes >= 0) || !std::isfinite(bytes))
    return Error{fmt::format("{}: a size of {} bytes", where, bytes)};
  if (std::find(group.begin(), group.end(), rank) == group.end())
    return Error{fmt::format("{}: rank {} is not in its own group", where, rank)};
  Collective& col = collectives[{group, n.value("tag", int64_t{0})}];
  if (!col.node.empty() && col.bytes != bytes)
    return Error{fmt::format("{}: an all-reduce of {} bytes, but its member {} has {} bytes", where, bytes,
                             col.first, col.bytes)};
  col.group = group;
  col.bytes = bytes;
  if (col.node.empty()) col.first = where;
  if (!col.node.emplace(rank, i).second)
    return Error{fmt::format("{}: a second collective with the same group and tag on this rank", where)};
  return {};
}

// Each collective as a ring all-reduce once every member's dependencies are done (compute,
// transfers or earlier collectives), taken in an order in which each one's dependencies come
// first; done[node] becomes the tasks after which the member holds the result.
Status add_collectives(TaskGraph& g, const Cluster& c, const Collectives& collectives,
                       const std::function<Result<std::vector<size_t>>(size_t)>& predecessors,
                       std::vector<Deps>& done, std::vector<std::array<size_t, 2>>& node_of_task) {
  // Each pending collective with its members' predecessor nodes (read once, not once per pass).
  std::vector<std::pair<Collectives::const_iterator, std::vector<std::vector<size_t>>>> pending;
  for (auto it = collectives.begin(); it != collectives.end(); ++it) {
    std::vector<std::vector<size_t>> member_preds;
    for (int r : it->second.group) {
      if (!it->second.node.count(r))
        return Error{fmt::format("an all-reduce among ranks [{}] (tag {}) has no node on rank {}",
                                 fmt::join(it->second.group, ", "), it->first.second, r)};
      Result<std::vector<size_t>> p = predecessors(it->second.node.at(r));
      if (!p) return p.error();
      member_preds.push_back(std::move(*p));
    }
    pending.emplace_back(it, std::move(member_preds));
  }
  while (!pending.empty()) {
    const size_t before = pending.size();
    for (auto it = pending.begin(); it != pending.end();) {
      const Collective& col = it->first->second;
      std::vector<Deps> ready;
      bool known = true;
      for (const std::vector<size_t>& p : it->second) {
        Deps after;
        for (size_t q : p) {
          known = known && !done[q].empty();
          after.insert(after.end(), done[q].begin(), done[q].end());
        }
        ready.push_back(std::move(after));
      }
      if (!known) {
        ++it;
        continue;
      }
      const size_t first = g.tasks.size();
      std::vector<Deps> out =
          append_data_parallel(g, CollectiveKind::AllReduce, AllReduceAlgorithm::Ring, c, col.group, ready,
                               col.bytes, static_cast<int32_t>(it->first->first.second));
      for (size_t t = first; t < g.tasks.size(); ++t)
        node_of_task.push_back({col.node.at(g.tasks[t].device), col.node.at(g.tasks[t].peer)});
      for (size_t m = 0; m < col.group.size(); ++m) {
        const size_t i = col.node.at(col.group[m]);
        done[i] = out[m].empty() ? ready[m] : out[m];
        if (done[i].empty()) done[i] = {-1};  // complete from the start
      }
      it = pending.erase(it);
    }
    if (pending.size() == before)
      return Error{fmt::format(
          "an all-reduce among ranks [{}] (tag {}) waits, through its dependencies, for "
          "itself or for a collective that does",
          fmt::join(pending.front().first->second.group, ", "), pending.front().first->first.second)};
  }
  return {};
}

// The send / receive nodes of one transfer (sender, receiver, tag): its task and each end's node.
struct Ends {
  int32_t task = -1;
  int64_t send = -1, recv = -1;  // node positions
};
using Where = std::function<std::string(size_t)>;

// Send or receive node i (on `rank`, to or from `peer`) into its transfer: the first end read adds the
// task, the second must agree with it on the bytes and the channel.
Status read_transfer(const json& nodes, size_t i, int rank, int peer, const Where& where, TaskGraph& g,
                     std::map<std::tuple<int, int, int64_t>, Ends>& transfers) {
  const json& n = nodes[i];
  const bool send = n.at("type") == "send";
  if (peer == rank) return Error{fmt::format("{}: a {} to its own rank", where(i), send ? "send" : "recv")};
  const int64_t tag = n.at("tag").get<int64_t>();
  Ends& e = transfers[send ? std::tuple{rank, peer, tag} : std::tuple{peer, rank, tag}];
  int64_t& mine = send ? e.send : e.recv;
  if (mine >= 0)
    return Error{
        fmt::format("{}: a second {} from rank {} to rank {} with tag {} (the first: {}); each "
                    "(sender, receiver, tag) names one transfer",
                    where(i), send ? "send" : "receive", send ? rank : peer, send ? peer : rank, tag,
                    where(static_cast<size_t>(mine)))};
  mine = static_cast<int64_t>(i);
  const double bytes = n.at("bytes").get<double>();
  const auto channel = static_cast<uint16_t>(n.value("channel", 0));
  if (e.task < 0) {
    Task t;
    t.kind = TaskKind::Transfer;
    parse_name(n.value("name", ""), t);
    t.device = send ? rank : peer;
    t.peer = send ? peer : rank;
    t.bytes = bytes;
    t.channel = channel;
    e.task = g.add(t);
  } else {
    const Task& t = g.tasks[static_cast<size_t>(e.task)];
    const size_t other = static_cast<size_t>(send ? e.recv : e.send);
    if (t.bytes != bytes)
      return Error{fmt::format("{}: {} bytes, but its {} {} has {} bytes", where(i), bytes,
                               send ? "receive" : "send", where(other), t.bytes)};
    if (t.channel != channel)
      return Error{fmt::format("{}: channel {}, but its {} {} has channel {}", where(i), channel,
                               send ? "receive" : "send", where(other), t.channel)};
  }
  if (send && n.contains("duration_s"))  // the flow's fixed time (an engine's step)
    g.tasks[static_cast<size_t>(e.task)].duration = n.at("duration_s").get<double>();
  return {};
}

// Whether g can run to its end (core/validate.h's execution_order); if not, the error names the trace
// nodes each stuck rank waits at and for (node_of_task: the node each task comes from).
Status check_runs(const TaskGraph& g, const std::vector<std::array<size_t, 2>>& node_of_task,
                  const Where& where, const std::function<int(size_t)>& rank_of_node) {
  // Task t as the node on `rank` that stands for it (a transfer's end there), else its first node.
  auto node = [&](int32_t t, int rank) {
    const std::array<size_t, 2>& ends = node_of_task[static_cast<size_t>(t)];
    return where(ends[1] != SIZE_MAX && rank_of_node(ends[1]) == rank ? ends[1] : ends[0]);
  };
  const std::vector<int32_t> order = execution_order(g);
  if (order.size() == g.tasks.size()) return {};
  std::vector<char> ran(g.tasks.size(), 0);
  for (int32_t t : order) ran[static_cast<size_t>(t)] = 1;
  std::vector<std::vector<int32_t>> waits(g.tasks.size());  // what each task waits for that never ran
  for (size_t t = 0; t < g.tasks.size(); ++t)
    for (int32_t s : g.successors(static_cast<int32_t>(t)))
      if (!ran[t] && !ran[static_cast<size_t>(s)])
        waits[static_cast<size_t>(s)].push_back(static_cast<int32_t>(t));
  // Each stuck rank's first compute node that never ran; without one, the first transfers that never ran.
  std::vector<int32_t> stuck;
  for (const std::vector<int32_t>& order : g.device_order)
    if (auto it =
            std::find_if(order.begin(), order.end(), [&](int32_t t) { return !ran[static_cast<size_t>(t)]; });
        it != order.end())
      stuck.push_back(*it);
  const bool transfers_only = stuck.empty();
  for (size_t t = 0; transfers_only && t < g.tasks.size() && stuck.size() < 4; ++t)
    if (!ran[t]) stuck.push_back(static_cast<int32_t>(t));
  std::string msg = "the traces deadlock (each rank runs its compute nodes in its node order):";
  for (int32_t t : stuck) {
    const size_t at = node_of_task[static_cast<size_t>(t)][0];
    msg += fmt::format("\n  {} waits for", where(at));
    const std::vector<int32_t>& w = waits[static_cast<size_t>(t)];
    for (size_t k = 0; k < w.size(); ++k) {
      const Task& p = g.tasks[static_cast<size_t>(w[k])];
      const bool later = p.is_compute() && p.device == g.tasks[static_cast<size_t>(t)].device &&
                         g.tasks[static_cast<size_t>(t)].is_compute();
      msg += fmt::format("{} {}{}", k ? "," : "", node(w[k], rank_of_node(at)),
                         later ? ", which comes after it on its rank" : "");
    }
    if (w.empty()) msg += " transfers that wait on each other";
  }
  return Error{msg};
}

}  // namespace

Result<TaskGraph> from_trace_graph(const json& j, const Cluster& c) {
  if (Status shape = check_shape(j); !shape) return shape.error();
  try {
    const size_t devices = c.devices.size();
    const json& nodes = j.at("nodes");
    const size_t ranks = j.value("ranks", size_t{0});
    if (ranks > devices)
      return Error{fmt::format("the traces have {} ranks and the cluster {} devices", ranks, devices)};
    TaskGraph g;
    g.samples_per_iteration = j.value("samples_per_iteration", 0.0);
    g.device_order.resize(devices);
    g.static_memory.resize(devices);
    std::map<int64_t, size_t> index;  // node id -> position
    for (size_t i = 0; i < nodes.size(); ++i)
      if (!index.emplace(nodes[i].at("id").get<int64_t>(), i).second)
        return Error{
            fmt::format("node {}: a node with this id comes earlier", nodes[i].at("id").get<int64_t>())};
    std::vector<std::vector<int32_t>> done(nodes.size());  // the tasks after which node i is complete
    std::vector<std::array<size_t, 2>> node_of_task;       // each task's nodes (a transfer's ends)
    const Where where = [&](size_t i) {
      return fmt::format("rank {} node \"{}\" (id {})", nodes[i].value("rank", -1),
                         nodes[i].value("name", ""), nodes[i].at("id").get<int64_t>());
    };
    auto rank_of = [&](size_t i, const char* key) -> Result<int> {
      const int64_t r = nodes[i].at(key).get<int64_t>();
      if (r < 0 || static_cast<size_t>(r) >= devices)
        return Error{
            fmt::format("{}: {} {} is not a device of the cluster (0 to {})", where(i), key, r, devices - 1)};
      return static_cast<int>(r);
    };
    // Compute nodes and point-to-point pairs.
    std::map<std::tuple<int, int, int64_t>, Ends> transfers;  // (sender, receiver, tag)
    Collectives collectives;
    for (size_t i = 0; i < nodes.size(); ++i) {
      const json& n = nodes[i];
      const std::string type = n.at("type").get<std::string>();
      Result<int> rank = rank_of(i, "rank");
      if (!rank) return rank.error();
      if (type == "comp") {
        Task t;
        parse_name(n.value("name", ""), t);
        t.device = *rank;
        t.duration = n.at("duration_s").get<double>();
        const int32_t id = g.add(t);
        node_of_task.push_back({i, SIZE_MAX});
        g.device_order[*rank].push_back(id);
        done[i] = {id};
      } else if (type == "send" || type == "recv") {
        Result<int> peer = rank_of(i, "peer");
        if (!peer) return peer.error();
        const size_t before = g.tasks.size();
        if (Status st = read_transfer(nodes, i, *rank, *peer, where, g, transfers); !st) return st.error();
        if (g.tasks.size() > before) node_of_task.push_back({i, SIZE_MAX});
        done[i] = {g.tasks.size() > before ? static_cast<int32_t>(before) : -1};
      } else {
        if (Status st = read_collective(n, i, *rank, devices, where(i), collectives); !st) return st.error();
      }
    }
    for (const auto& [key, e] : transfers)
      if (e.send < 0 || e.recv < 0)
        return Error{fmt::format("{}: a {} from rank {} to rank {} (tag {}) has no matching {}",
                                 where(static_cast<size_t>(e.send < 0 ? e.recv : e.send)),
                                 e.send < 0 ? "receive" : "send", std::get<0>(key), std::get<1>(key),
                                 std::get<2>(key), e.send < 0 ? "send" : "receive")};
    for (size_t i = 0; i < nodes.size(); ++i)  // a pair's second end: the task of its first
      if (!done[i].empty() && done[i].front() < 0) {
        const json& n = nodes[i];
        const int r = n.at("rank").get<int>(), p = n.at("peer").get<int>();
        const bool send = n.at("type") == "send";
        done[i] = {transfers.at({send ? r : p, send ? p : r, n.at("tag").get<int64_t>()}).task};
        node_of_task[static_cast<size_t>(done[i].front())][1] = i;
      }
    // Dependencies between compute and point-to-point nodes.
    auto predecessors = [&](size_t i) -> Result<std::vector<size_t>> {
      std::vector<size_t> out;
      for (const json& d : nodes[i].at("deps")) {
        auto it = index.find(d.get<int64_t>());
        if (it == index.end())
          return Error{fmt::format("{}: depends on node {}, which is not there", where(i), d.get<int64_t>())};
        if (nodes[it->second].at("rank") != nodes[i].at("rank"))
          return Error{fmt::format("{}: depends on node {} of another rank", where(i), d.get<int64_t>())};
        out.push_back(it->second);
      }
      return out;
    };
    if (Status st = add_collectives(g, c, collectives, predecessors, done, node_of_task); !st)
      return st.error();
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (nodes[i].at("type") == "allreduce") continue;
      Result<std::vector<size_t>> p = predecessors(i);
      if (!p) return p.error();
      const int32_t task = done[i].front();
      for (size_t q : *p)
        for (int32_t before : done[q])
          if (before >= 0 && before != task) g.depend(before, task);
    }
    g.pack_dependencies();
    if (Status st =
            check_runs(g, node_of_task, where, [&](size_t i) { return nodes[i].at("rank").get<int>(); });
        !st)
      return st.error();
    return g;
  } catch (const nlohmann::json::exception& e) {
    return Error{fmt::format("malformed trace graph: {}", e.what())};
  }
}

}  // namespace pipegrid::output
