#include "tools/output/cost_model_checks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <map>

#include "tools/builtin_accuracy.h"
#include "tools/builtin_dense_accuracy.h"
#include "tools/builtin_moe_accuracy.h"
#include "tools/input/device_yaml.h"

namespace pipegrid::output {

namespace {

struct GpuChecks {
  std::vector<std::string> catalog;  // the catalog kinds the rows ran on
  std::map<std::string, CostModelCheck, std::less<>> by_precision;
  std::map<std::string, CostModelCheck, std::less<>> megatron;  // Megatron-LM's 3D runs
};

CostModelCheck read_check(const YAML::Node& n) {
  CostModelCheck c;
  c.check_rows = n["check_rows"].as<int>();
  c.median_error = n["median_error"].as<double>();
  c.max_error = n["max_error"].as<double>();
  c.worst = n["worst"].as<std::string>();
  if (n["worst_name"]) c.worst_name = n["worst_name"].as<std::string>();
  if (n["faster"]) c.faster = n["faster"].as<int>();
  c.spread_groups = n["spread_groups"].as<int>();
  if (c.spread_groups > 0) {
    c.median_spread = n["median_spread"].as<double>();
    c.max_spread = n["max_spread"].as<double>();
  }
  return c;
}

// experiments/validation/accuracy.yaml, parsed once (a generated file: its test is
// tests/tools/validation_runs.py; report_test checks this reader against the file).
const std::vector<GpuChecks>& validation_checks() {
  static const std::vector<GpuChecks> table = [] {
    std::vector<GpuChecks> t;
    for (const auto& gpu : YAML::Load(kBuiltinAccuracy)) {
      GpuChecks g;
      for (const auto& n : gpu.second["catalog"]) g.catalog.push_back(n.as<std::string>());
      for (const auto& p : gpu.second) {
        const std::string key = p.first.as<std::string>();
        if (key == "catalog") continue;
        if (key == "megatron-lm") {
          for (const auto& m : p.second) g.megatron[m.first.as<std::string>()] = read_check(m.second);
          continue;
        }
        g.by_precision[key] = read_check(p.second);
      }
      t.push_back(std::move(g));
    }
    return t;
  }();
  return table;
}

// Catalog kind -> precision -> a check set's figures.
using ChecksByGpu = std::map<std::string, std::map<std::string, CostModelCheck, std::less<>>, std::less<>>;

ChecksByGpu read_checks_by_gpu(const char* yaml) {
  ChecksByGpu t;
  for (const auto& gpu : YAML::Load(yaml))
    for (const auto& p : gpu.second)
      t[gpu.first.as<std::string>()][p.first.as<std::string>()] = read_check(p.second);
  return t;
}

// experiments/moe/accuracy.yaml, parsed once: the MoE check rows' figures.
const ChecksByGpu& moe_checks() {
  static const ChecksByGpu table = read_checks_by_gpu(kBuiltinMoeAccuracy);
  return table;
}

// experiments/blackwell-dense/accuracy.yaml, parsed once: the dense Llama check rows (Blackwell, H100).
const ChecksByGpu& dense_checks() {
  static const ChecksByGpu table = read_checks_by_gpu(kBuiltinDenseAccuracy);
  return table;
}

// The suite's entry whose rows ran on catalog kind `kind`, or none.
const GpuChecks* find_gpu(std::string_view kind) {
  for (const GpuChecks& g : validation_checks())
    if (std::find(g.catalog.begin(), g.catalog.end(), kind) != g.catalog.end()) return &g;
  return nullptr;
}

// The cost figures of `a` that differ from the catalog entry `b` (memory capacity changes no time).
std::vector<std::string> overridden_figures(const DeviceSpec& a, const DeviceSpec& b) {
  std::vector<std::string> out;
  auto differ = [&](bool d, const char* key) {
    if (d) out.emplace_back(key);
  };
  differ(a.peak_flops != b.peak_flops, "peak");
  differ(a.efficiency != b.efficiency, "efficiency");
  differ(a.compute_efficiency != b.compute_efficiency, "compute_efficiency");
  differ(a.memory_bandwidth != b.memory_bandwidth, "memory_bandwidth");
  differ(a.memory_efficiency != b.memory_efficiency ||
             a.memory_efficiency_default != b.memory_efficiency_default,
         "memory_efficiency");
  differ(a.kernel_startup_s != b.kernel_startup_s || a.kernel_startup_class != b.kernel_startup_class,
         "kernel_startup");
  differ(a.kernel_dispatch_s != b.kernel_dispatch_s || a.kernel_dispatch_class != b.kernel_dispatch_class,
         "kernel_dispatch");
  differ(a.layer_overhead_s != b.layer_overhead_s, "layer_overhead");
  differ(a.recurrent_step_s != b.recurrent_step_s, "recurrent_step");
  differ(a.winograd != b.winograd, "winograd");
  differ(a.microscaling != b.microscaling, "microscaling");
  return out;
}

std::string figures_text(const CostModelCheck& c, std::string_view apart = "sources") {
  std::string text = fmt::format(
      "against {} published run{} never fitted on, median |error| of the rate {:.1f}%, max {:.1f}% ({})",
      c.check_rows, c.check_rows == 1 ? "" : "s", 100 * c.median_error, 100 * c.max_error,
      c.worst_name.empty() ? c.worst : fmt::format("{}; row {}", c.worst_name, c.worst));
  if (c.faster >= 0) text += fmt::format("; pipegrid faster on {} of {}", c.faster, c.check_rows);
  if (c.spread_groups > 0)
    text += fmt::format("; {} of one configuration differ by {:.2f}x (median of {}, max {:.2f}x)", apart,
                        c.median_spread, c.spread_groups, c.max_spread);
  return text;
}

}  // namespace

std::vector<CostModelCheck> catalog_checks(std::string_view kind) {
  std::vector<CostModelCheck> out;
  const GpuChecks* g = find_gpu(kind);
  auto add_set = [&](const ChecksByGpu& set, const char* source, const char* what) {
    const auto m = set.find(kind);
    if (m == set.end()) return;
    for (const auto& [precision, f] : m->second) {
      CostModelCheck c = f;
      c.source = source;
      c.device = std::string(kind);
      c.precision = precision;
      c.status = "checked";
      c.note = fmt::format("{}, {}: {}", precision, what, figures_text(f, "releases"));
      out.push_back(std::move(c));
    }
  };
  auto add_moe = [&] {
    add_set(dense_checks(), "blackwell-dense", "published dense runs");
    add_set(moe_checks(), "moe", "published MoE runs");
  };
  if (!g) {
    add_moe();
    return out;
  }
  for (const auto* table : {&g->by_precision, &g->megatron})
    for (const auto& [precision, f] : *table) {
      CostModelCheck c = f;
      c.source = table == &g->megatron ? "megatron-lm" : "validation";
      c.device = std::string(kind);
      c.precision = precision;
      c.status = "checked";
      c.note = fmt::format("{}{}: {}", precision, table == &g->megatron ? ", Megatron-LM's 3D runs" : "",
                           figures_text(f));
      out.push_back(std::move(c));
    }
  add_moe();
  return out;
}

std::vector<CostModelCheck> cost_model_checks(const Experiment& e, const Partition& p) {
  std::vector<int> devices;
  for (size_t s = 0; s < p.stage_count(); ++s)
    for (int d : p.stage(s).devices) devices.push_back(d);
  return cost_model_checks(e, devices);
}

std::vector<CostModelCheck> cost_model_checks(const Experiment& e, const std::vector<int>& devices) {
  std::vector<CostModelCheck> out;
  const Workload& w = e.workload;
  bool costed = false;  // some layer is costed by the cost model, not by measured times
  for (size_t l = 0; l < w.layer_count() && !costed; ++l) costed = !w.layer(l).measured;
  if (!costed) return out;
  const std::string precision(to_string(w.precision));
  // amp keys the rows of mixed precision; plain fp16 runs the same fp16 math without fp32 state.
  const std::string key = precision == "fp16" ? "amp" : precision;
  // Megatron-LM's rows are GPT and T5 transformer runs: they say nothing of a CNN's or an LSTM's costs.
  bool transformer = false;
  for (size_t l = 0; l < w.layer_count() && !transformer; ++l)
    transformer = w.layer(l).split.kind == TensorSplitKind::Transformer;
  bool moe = false;
  for (size_t l = 0; l < w.layer_count() && !moe; ++l)
    moe = w.layer(l).split.kind == TensorSplitKind::MoeBlock;
  std::vector<std::string> seen;
  for (int d : devices) {
    const DeviceSpec& spec = e.cluster.devices[static_cast<size_t>(d)].spec;
    const input::CatalogDevice* entry = input::find_catalog_device(spec.kind);
    if (!entry || std::find(seen.begin(), seen.end(), spec.kind) != seen.end()) continue;
    seen.push_back(spec.kind);
    CostModelCheck c;
    c.source = "validation";
    c.device = spec.kind;
    c.precision = precision;
    const GpuChecks* gpu = find_gpu(spec.kind);
    // Rows of the validation suite, or (a GPU the suite has no row for, the H100) Megatron's 3D runs.
    const bool has_rows = gpu && gpu->by_precision.count(key) > 0;
    const bool has_megatron = transformer && gpu && gpu->megatron.count(key) > 0;
    const std::vector<std::string> changed = overridden_figures(spec, entry->spec);
    // Published MoE runs on this GPU (experiments/moe), for a workload with MoE blocks.
    const auto moe_gpu = moe ? moe_checks().find(spec.kind) : moe_checks().end();
    const bool has_moe = moe_gpu != moe_checks().end() && moe_gpu->second.count(key) > 0;
    // Published dense transformer runs on this GPU (experiments/blackwell-dense), for a workload
    // with transformer blocks and no MoE block.
    const auto dense_gpu = transformer && !moe ? dense_checks().find(spec.kind) : dense_checks().end();
    const bool has_dense = dense_gpu != dense_checks().end() && dense_gpu->second.count(key) > 0;
    // An entry for the check rows `f` of `source` ("validation", "megatron-lm" or "moe").
    auto add = [&](const CostModelCheck& f, const std::string& source) {
      CostModelCheck x = f;
      x.source = source;
      x.device = c.device;
      x.precision = precision;
      const std::string what =
          source == "megatron-lm"       ? fmt::format("{} {}, Megatron-LM's 3D runs", x.device, precision)
          : source == "moe"             ? fmt::format("{} {}, published MoE runs", x.device, precision)
          : source == "blackwell-dense" ? fmt::format("{} {}, published dense runs", x.device, precision)
                                        : fmt::format("{} {}", x.device, precision);
      if (!changed.empty()) {
        x.status = "overridden";
        x.note = fmt::format(
            "{}: {} overridden; the catalog's check rows ({}: median |error| {:.1f}%, max "
            "{:.1f}%) do not apply",
            what, fmt::join(changed, ", "), f.check_rows, 100 * f.median_error, 100 * f.max_error);
      } else {
        x.status = "checked";
        x.note = fmt::format(
            "{}: {}{} ({})", what, key != precision ? "the rows ran amp (fp16 math): " : "",
            figures_text(f, source == "moe" || source == "blackwell-dense" ? "releases" : "sources"),
            source == "megatron-lm"       ? "docs/3d-parallelism.md"
            : source == "moe"             ? "experiments/moe/results.md"
            : source == "blackwell-dense" ? "experiments/blackwell-dense/results.md"
                                          : "experiments/validation/results.md");
      }
      out.push_back(std::move(x));
    };
    if (has_moe) {
      add(moe_gpu->second.find(key)->second, "moe");
    } else if (moe && moe_gpu != moe_checks().end()) {
      std::vector<std::string> checked;
      for (const auto& kv : moe_gpu->second) checked.push_back(kv.first);
      CostModelCheck x = c;
      x.source = "moe";
      x.status = "not checked";
      x.note =
          fmt::format("{} {}: not checked against published MoE runs in {} (checked: {}; experiments/moe)",
                      c.device, precision, precision, fmt::join(checked, ", "));
      out.push_back(std::move(x));
    }
    if (has_dense) add(dense_gpu->second.find(key)->second, "blackwell-dense");
    if (!has_rows && !has_megatron && (has_moe || has_dense)) continue;
    if (!has_rows && !has_megatron) {
      std::vector<std::string> checked;
      if (gpu) {
        for (const auto& kv : gpu->by_precision) checked.push_back(kv.first);
        for (const auto& kv : gpu->megatron)
          if (transformer && std::find(checked.begin(), checked.end(), kv.first) == checked.end())
            checked.push_back(kv.first);
      }
      c.status = "not checked";
      c.note = !checked.empty()
                   ? fmt::format(
                         "{} {}: not checked against published training runs in {} (checked: {}; the "
                         "figures and their sources: pipegrid device show {})",
                         c.device, precision, precision, fmt::join(checked, ", "), c.device)
                   : fmt::format(
                         "{} {}: not checked against published training runs{} (the figures and "
                         "their sources: pipegrid device show {})",
                         c.device, precision,
                         gpu && !gpu->megatron.empty() ? " of this kind of model (only transformer runs were)"
                                                       : "",
                         c.device);
      out.push_back(std::move(c));
      continue;
    }
    if (has_rows) add(gpu->by_precision.find(key)->second, "validation");
    if (has_megatron) add(gpu->megatron.find(key)->second, "megatron-lm");
  }
  return out;
}

nlohmann::json cost_model_checks_json(const std::vector<CostModelCheck>& checks) {
  nlohmann::json out = nlohmann::json::array();
  for (const CostModelCheck& c : checks) {
    nlohmann::json x = {
        {"source", c.source}, {"device", c.device}, {"precision", c.precision}, {"status", c.status}};
    if (c.status != "not checked") {
      x["check_rows"] = c.check_rows;
      x["median_error"] = c.median_error;
      x["max_error"] = c.max_error;
      x["worst"] = c.worst;
      if (!c.worst_name.empty()) x["worst_name"] = c.worst_name;
      if (c.faster >= 0) x["faster"] = c.faster;
      x["spread_groups"] = c.spread_groups;
      if (c.spread_groups > 0) {
        x["median_spread"] = c.median_spread;
        x["max_spread"] = c.max_spread;
      }
    }
    out.push_back(std::move(x));
  }
  return out;
}

}  // namespace pipegrid::output
