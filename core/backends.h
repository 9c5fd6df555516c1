// Backends as data and a placement search in the manner of Collage (Jeon et al., PACT'22,
// arXiv 2111.00655): each backend of a device kind states which layer patterns it implements (a
// single layer kind, a kernel class, or a fused chain such as conv2d -> add -> relu) and what each
// costs; the search covers the layer graph with pattern instances, minimising the layers' times
// plus the conversions where a tensor crosses from one backend to another. docs/backends.md says
// what the paper publishes and what this interpretation assumes.
//
// Plain data: tools/input/backends_yaml parses catalogs (topologies/backends.yaml) into these.
#pragma once

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// What one pattern instance costs on its backend. Unset fields (0 / negative) keep the device's
// figure, so a backend that only states "attention kernels run at 70% of peak" changes only those.
struct PatternCost {
  // Fraction of peak per kernel class for compute kernels (all precisions); 0 = the device's.
  std::array<double, kKernelClassCount> compute_efficiency{};
  // Fraction of the memory bandwidth per kernel class; 0 = the device's.
  std::array<double, kKernelClassCount> memory_efficiency{};
  double launch_s = -1;    // kernel launch overhead per call (replaces kernel_startup_s); < 0: device's
  double overhead_s = -1;  // fixed cost per layer and pass (replaces layer_overhead_s); < 0: device's
  // Measured (or given) times for the whole instance and one micro-batch of `batch` samples,
  // scaled linearly with the batch; device_kind is ignored (the backend's kind applies). When set,
  // the model above is not used.
  std::optional<MeasuredCost> measured;
};

// One element of a pattern: a layer kind ("conv2d"), a kernel class ("class:gemm": a layer whose
// kernels are all of that class, or whose kind maps to it), or "*" (any layer).
struct PatternOp {
  std::string text;  // as written
  enum class Kind { LayerKind, Class, Any } kind = Kind::LayerKind;
  KernelClass cls = KernelClass::Gemm;  // for Kind::Class
};

// A pattern: one op, or a chain of ops that the backend runs fused. A chain matches layers
// l1 -> l2 -> ... -> lk where each li (i < k) has l(i+1) as its only consumer (the intermediate
// tensors are private to the fused kernel); l(i+1) may read other tensors too (the residual input
// of a fused convolution + add + ReLU).
// A fused chain's cost: l1 as the cost model times it on the backend, each later layer without
// its own launches, per-layer overhead and streamed memory traffic (the fused kernel keeps the
// intermediate in registers / on chip); their arithmetic and weight reads remain.
struct BackendPattern {
  std::vector<PatternOp> ops;
  PatternCost cost;
  std::string source;  // citation, or "hypothetical"
};

struct Backend {
  std::string name;         // unique in the catalog
  std::string device_kind;  // the device kind it runs on (catalog name, e.g. "a100-40gb")
  std::string description;
  std::vector<BackendPattern> patterns;
  // The device catalog's other names of the same device (aliases: `a100` of `a100-80gb`).
  std::vector<std::string> device_aliases;
};

// Whether the backend runs on devices of `kind`: its device kind or one of that device's aliases.
bool runs_on(const Backend& b, std::string_view kind);

// Handing a tensor from backend `from` to backend `to` (layout / format conversion, a copy between
// libraries' buffers): latency + bytes / bandwidth, paid once in the forward pass (the activation)
// and once in the backward pass (its gradient, same size). "*" matches any backend. The first
// matching entry applies; a pair with no entry, and a backend with itself, converts for free.
struct Conversion {
  std::string from = "*";
  std::string to = "*";
  double latency_s = 0;
  double bandwidth = 0;  // bytes/s; 0 = no per-byte cost
  std::string source;
};

struct BackendCatalog {
  std::vector<Backend> backends;
  std::vector<Conversion> conversions;
  // Seconds to convert `bytes` from backend index a to b (0 when a == b or no entry matches).
  double conversion_time(int from, int to, double bytes) const;
};

// A backend placement an experiment asks for (`backends:` in its file), as plain data: the catalog,
// the backends the search may use, and where it was asked, for messages. place_backends
// (core/experiment.h) runs it; prepare runs it when the experiment still carries it.
struct BackendRequest {
  BackendCatalog catalog;
  std::vector<int> allowed;  // indices into catalog.backends; empty: every backend
  std::string catalog_name;  // the catalog as the experiment names it
  std::string where;         // e.g. "exp.yaml:4:11: backends": begins every message about the request
};

// True if the op matches the layer.
bool op_matches(const PatternOp& op, const Layer& layer);

// One placed pattern instance: which backend, which of its patterns, the layers it covers
// (the chain in order) and their times on the backend, conversions into them included.
struct PlacedGroup {
  int backend = -1;
  int pattern = -1;
  std::vector<int> layers;
};

struct Placement {
  std::vector<int> backend_of;         // per layer: index into the catalog's backends
  std::vector<PlacedGroup> groups;     // the cover, in topological order of their first layers
  std::vector<PassTimes> layer_times;  // per layer, on its backend, conversions into it included
  double compute_s = 0;                // sum of the layers' forward + backward times without conversions
  double conversion_s = 0;             // sum of conversions, forward and backward
  double total_s() const { return compute_s + conversion_s; }
  bool exact = true;     // false if the search had to drop states (PlacementOptions::max_states)
  long long states = 0;  // states the search expanded (for reports)
};

struct PlacementOptions {
  double batch = 1;  // samples per micro-batch the costs are for
  // Backends the search may use (indices into the catalog); empty = every backend whose
  // device_kind is the device's kind.
  std::vector<int> allowed;
  // The most states kept per step of the dynamic programme; above it the cheapest are kept
  // (a beam) and the result is marked inexact.
  long long max_states = 1 << 16;
};

// The instances that may cover layers: for each layer, every (backend, pattern) whose chain
// matches starting at it, with its cost. Exposed for tests and reports.
struct BackendCandidate {
  int backend = -1;
  int pattern = -1;
  std::vector<int> layers;
  std::vector<PassTimes> times;  // per layer of `layers`, without conversions
  double total_s = 0;            // forward + backward of all its layers
};
Result<std::vector<std::vector<BackendCandidate>>> placement_candidates(const Workload& w,
                                                                        const BackendCatalog& c,
                                                                        const DeviceSpec& device,
                                                                        const PlacementOptions& o);

// The operator-level search: a dynamic programme over the layers in topological order whose state
// is the backend of every placed layer that still has an unplaced consumer (and the layers a chain
// placed ahead of their turn). It minimises the sum over layers of forward + backward time plus
// conversions, exactly when no step exceeds max_states. Fails (naming the layer) if some layer has
// no allowed backend pattern, or the cost model fails.
Result<Placement> place(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                        const PlacementOptions& o = {});

// The graph-level refinement: Collage follows its operator-level result with a search whose
// fitness is the whole program's measured time, which captures effects a sum of per-pattern costs
// misses. Here: a deterministic local search from `start` that tries, for each group, every other
// candidate covering exactly the same layers (another backend or pattern), keeping a change when
// `evaluate` (seconds, lower is better) says the whole placement got better; at most `rounds`
// passes. With the additive objective of place() (evaluate = total_s) it returns `start`.
using PlacementEvaluator = std::function<double(const Placement&)>;
Result<Placement> refine_placement(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                                   const PlacementOptions& o, Placement start,
                                   const PlacementEvaluator& evaluate, int rounds = 8);

// The placement's sum of times and conversions (what place() minimises), recomputed from its
// groups; also fills layer_times, compute_s, conversion_s and backend_of.
Status evaluate_placement(const Workload& w, const BackendCatalog& c, const DeviceSpec& device,
                          const PlacementOptions& o, Placement& p);

// The workload with the placement applied for one device kind: each layer gets measured times
// (device_kind = `device.kind`, batch = o.batch) equal to its placed times, conversions into it
// included, and its description names its backend ("backend: cudnn-like"). Layers keep their FLOPs
// and bytes, so other device kinds still cost them with the cost model. A fused group of two or
// more layers becomes one layer (names joined by '+', kind "fused" unless all are alike, sums of
// its layers' times, FLOPs, bytes, stash and parameters, the last layer's output): its
// intermediates are private to one kernel, so no stage boundary may fall inside it. Fails if a
// layer already carries measured times (a trace-driven workload is already placed).
Result<Workload> apply_placement(const Workload& w, const Placement& p, const BackendCatalog& c,
                                 const DeviceSpec& device, const PlacementOptions& o);

// The backend apply_placement() named in the layer's description, or "" if none.
std::string placed_backend(const Layer& layer);

}  // namespace pipegrid
