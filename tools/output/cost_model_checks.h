// What the validation suite (experiments/validation) says of the cost figures a run uses: the
// check rows' errors per catalog GPU and precision, compiled in from
// experiments/validation/accuracy.yaml. `run`, `plan` and `search` print them as `cost model`
// lines, `device show` as `checked` lines.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/experiment.h"

namespace pipegrid::output {

// What the validation suite says of the cost model behind a run, per catalog device kind in use
// (experiments/validation/accuracy.yaml, compiled in): the check rows' errors for that GPU and the
// workload's precision (published training runs, never fitted on), or that the kind or precision
// was never checked, or that the run overrides the catalog's cost figures. Custom devices, and
// workloads whose every layer carries measured times, get none. A GPU and precision with
// Megatron-LM's published 3D runs among the check rows gets a second entry for them; a workload with
// MoE blocks, an entry for the published MoE runs of experiments/moe (its accuracy.yaml, compiled in);
// a transformer workload without them, on a B200 or GB200, one for experiments/blackwell-dense's.
struct CostModelCheck {
  // "validation" (experiments/validation), "megatron-lm" (its 3D runs), "moe" (experiments/moe: published
  // MoE runs, printed for workloads with MoE blocks) or "blackwell-dense" (experiments/blackwell-dense:
  // published dense Llama runs on B200 and GB200, printed for transformer workloads without MoE blocks)
  std::string source;
  std::string device;     // catalog kind, e.g. "v100"
  std::string precision;  // the workload's
  std::string status;     // "checked", "not checked" or "overridden"
  int check_rows = 0;     // for "checked" and "overridden": the rows' figures
  double median_error = 0, max_error = 0;
  std::string worst;       // the row with the largest |error| (its id in experiments/validation)
  std::string worst_name;  // that row as a reader names it (model, GPUs, precision, source)
  // The data's own floor: same-configuration groups on that GPU and precision published by two or
  // more sources, and their spread (max / min of the published values).
  int spread_groups = 0;
  double median_spread = 0, max_spread = 0;
  int faster = -1;   // "moe": the check rows pipegrid predicts faster than published (-1: not counted)
  std::string note;  // one readable line
};
std::vector<CostModelCheck> cost_model_checks(const Experiment& e, const Partition& p);
// The same over the given devices (indices into e.cluster.devices): `search` asks it of them all.
std::vector<CostModelCheck> cost_model_checks(const Experiment& e, const std::vector<int>& devices);
// As JSON: the `cost_model_checks` array of run, plan and search --json.
nlohmann::json cost_model_checks_json(const std::vector<CostModelCheck>& checks);
// Every entry the validation suite has for a catalog device kind, all precisions (status
// "checked"; empty when it has none): what `pipegrid device show` lists.
std::vector<CostModelCheck> catalog_checks(std::string_view kind);

}  // namespace pipegrid::output
