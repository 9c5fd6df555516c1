#include "tools/output/trace_graph.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <queue>
#include <set>

#include "core/collectives.h"

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

void check_ring(Ring& r, const TaskGraph& g) {
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
  if (d != r.members.front()) return;
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
  return node;
}

// The data-parallel all-reduces that form core/collectives.h's ring, by stage (exported as one
// collective node per rank); per task, the stage of its ring or -1.
std::vector<int32_t> find_rings(const TaskGraph& g, std::map<int32_t, Ring>& rings) {
  std::vector<int32_t> ring_of(g.tasks.size(), -1);
  for (size_t t = 0; t < g.tasks.size(); ++t)
    if (collective_step(g.tasks[t])) rings[g.tasks[t].stage].steps.push_back(static_cast<int32_t>(t));
  for (auto& [stage, r] : rings) {
    check_ring(r, g);
    if (r.valid)
      for (int32_t t : r.steps) ring_of[t] = stage;
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
  const std::vector<int32_t> ring_of = o.collectives ? find_rings(g, rings) : std::vector<int32_t>(n, -1);

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

// The trace graph's shape (docs/import-export.md), checked before it is read: each error names the
// node (its position in `nodes` and its id), the key, what was expected and what was found.
Status check_shape(const json& j) {
  if (!j.is_object()) return Error{fmt::format("expected an object with \"nodes\", found {}", found(j))};
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
  for (size_t i = 0; i < nodes.size(); ++i) {
    const json& n = nodes[i];
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
    auto number = [&](const char* key) { return n.contains(key) && n[key].is_number(); };
    const bool deps_ok =
        n.contains("deps") && n["deps"].is_array() &&
        std::all_of(n["deps"].begin(), n["deps"].end(), [](const json& d) { return d.is_number_integer(); });
    const std::string type = n.contains("type") && n["type"].is_string() ? n["type"].get<std::string>() : "";
    for (const Status& st :
         {need("id", integer("id"), "an integer id"), need("rank", integer("rank"), "a rank (an integer)"),
          need("type", type == "comp" || type == "send" || type == "recv" || type == "allreduce",
               "one of \"comp\", \"send\", \"recv\", \"allreduce\""),
          need("deps", deps_ok, "a list of node ids"),
          need("name", n.contains("name") && n["name"].is_string(), "a name (text)", true)})
      if (!st) return st;
    if (std::find(n["deps"].begin(), n["deps"].end(), n["id"]) != n["deps"].end())
      return Error{fmt::format("{}: \"deps\": the node depends on itself", at)};
    Status st;
    if (type == "comp") {
      st = need("duration_s", number("duration_s"), "a time in seconds");
    } else if (type == "send" || type == "recv") {
      for (const Status& x :
           {need("peer", integer("peer"), "a rank (an integer)"),
            need("bytes", number("bytes"), "a size in bytes"), need("tag", integer("tag"), "an integer tag"),
            need("duration_s", number("duration_s"), "a time in seconds", true)})
        if (!x) return x;
    } else {
      const bool group_ok = n.contains("group") && n["group"].is_array() &&
                            std::all_of(n["group"].begin(), n["group"].end(),
                                        [](const json& r) { return r.is_number_integer(); });
      for (const Status& x :
           {need("group", group_ok, "a list of ranks"), need("bytes", number("bytes"), "a size in bytes"),
            need("tag", integer("tag"), "an integer tag", true)})
        if (!x) return x;
    }
    if (!st) return st;
  }
  return {};
}

// The all-reduce nodes of one group and tag (one per member rank).
struct Collective {
  std::vector<int> group;
  double bytes = 0;
  std::map<int, size_t> node;  // rank -> node
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
  col.group = group;
  col.bytes = bytes;
  if (!col.node.emplace(rank, i).second)
    return Error{fmt::format("{}: a second collective with the same group and tag on this rank", where)};
  return {};
}

// Each collective as a ring all-reduce once every member's dependencies are done (compute,
// transfers or earlier collectives), taken in an order in which each one's dependencies come
// first; done[node] becomes the tasks after which the member holds the result.
Status add_collectives(TaskGraph& g, const Cluster& c, const Collectives& collectives,
                       const std::function<Result<std::vector<size_t>>(size_t)>& predecessors,
                       std::vector<Deps>& done) {
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
      std::vector<Deps> out =
          append_data_parallel(g, CollectiveKind::AllReduce, AllReduceAlgorithm::Ring, c, col.group, ready,
                               col.bytes, static_cast<int32_t>(it->first->first.second));
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
    auto where = [&](size_t i) {
      return fmt::format("rank {} node \"{}\" (id {})", nodes[i].value("rank", -1),
                         nodes[i].value("name", ""), nodes[i].at("id").get<int64_t>());
    };
    auto rank_of = [&](size_t i, const char* key) -> Result<int> {
      const int r = nodes[i].at(key).get<int>();
      if (r < 0 || static_cast<size_t>(r) >= devices)
        return Error{
            fmt::format("{}: {} {} is not a device of the cluster (0 to {})", where(i), key, r, devices - 1)};
      return r;
    };
    // Compute nodes and point-to-point pairs.
    std::map<std::tuple<int, int, int64_t>, int32_t> transfer;  // (sender, receiver, tag) -> task
    std::map<std::tuple<int, int, int64_t>, int> ends;          // how many of send / receive were seen
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
        if (!(t.duration >= 0) || !std::isfinite(t.duration))
          return Error{fmt::format("{}: a duration of {} s", where(i), t.duration)};
        const int32_t id = g.add(t);
        g.device_order[*rank].push_back(id);
        done[i] = {id};
      } else if (type == "send" || type == "recv") {
        Result<int> peer = rank_of(i, "peer");
        if (!peer) return peer.error();
        if (*peer == *rank) return Error{fmt::format("{}: a {} to its own rank", where(i), type)};
        const auto key = type == "send" ? std::tuple{*rank, *peer, n.at("tag").get<int64_t>()}
                                        : std::tuple{*peer, *rank, n.at("tag").get<int64_t>()};
        auto it = transfer.find(key);
        if (it == transfer.end()) {
          Task t;
          t.kind = TaskKind::Transfer;
          parse_name(n.value("name", ""), t);
          t.device = std::get<0>(key);
          t.peer = std::get<1>(key);
          t.bytes = n.at("bytes").get<double>();
          if (!(t.bytes >= 0) || !std::isfinite(t.bytes))
            return Error{fmt::format("{}: a size of {} bytes", where(i), t.bytes)};
          it = transfer.emplace(key, g.add(t)).first;
        }
        if (type == "send" && n.contains("duration_s")) {  // the flow's fixed time (an engine's step)
          const double d = n.at("duration_s").get<double>();
          if (!(d >= 0) || !std::isfinite(d))
            return Error{fmt::format("{}: a duration of {} s", where(i), d)};
          g.tasks[static_cast<size_t>(it->second)].duration = d;
        }
        ends[key] += type == "send" ? 1 : 2;
        done[i] = {it->second};
      } else if (type == "allreduce") {
        if (Status st = read_collective(n, i, *rank, devices, where(i), collectives); !st) return st.error();
      } else {
        return Error{fmt::format("{}: unknown node type \"{}\"", where(i), type)};
      }
    }
    for (const auto& [key, seen] : ends)
      if (seen != 3)
        return Error{fmt::format("a {} from rank {} to rank {} (tag {}) has no matching {}",
                                 seen == 1 ? "send" : "receive", std::get<0>(key), std::get<1>(key),
                                 std::get<2>(key), seen == 1 ? "receive" : "send")};
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
    if (Status st = add_collectives(g, c, collectives, predecessors, done); !st) return st.error();
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
    return g;
  } catch (const nlohmann::json::exception& e) {
    return Error{fmt::format("malformed trace graph: {}", e.what())};
  }
}

}  // namespace pipegrid::output
