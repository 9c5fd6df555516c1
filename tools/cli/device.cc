// pipegrid device list | pipegrid device show NAME [--json]: the device catalog.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/input/device_yaml.h"
#include "tools/output/report.h"

namespace pipegrid::cli {
namespace {

nlohmann::json to_json(const input::CatalogDevice& d) {
  nlohmann::json j = output::device_spec_json(d.spec);  // the figures, as in run and plan --json
  j["schema_version"] = output::kJsonSchemaVersion;
  j["name"] = d.name;
  j["family"] = d.family;
  j["description"] = d.description;
  j["source"] = d.source;
  // What the validation suite says of these figures, as run's cost_model_checks without the run.
  j["checks"] = output::cost_model_checks_json(output::catalog_checks(d.name));
  return j;
}

// The peak per math precision and the compute efficiency per kernel class, with how the
// trainings' precisions map onto them.
void print_compute_table(const DeviceSpec& spec) {
  fmt::print("  {:<17}{:>14}  ", "precision", "peak");
  for (KernelClass k : kComputeClasses) fmt::print(" {:>12}", to_string(k));
  fmt::print("\n");
  for (Precision p : kMathPrecisions) {
    // A rate the device lacks is said as such, not shown as the rate it falls back to (an A100
    // printed 312 TFLOP/s of fp8, its bf16 rate; fp8 trainings refuse such a device).
    const bool own = spec.peak_flops[static_cast<int>(p)] > 0;
    fmt::print("  {:<17}{:>14}  ", to_string(p),
               own                   ? format_flop_rate(spec.peak(p))
               : p == Precision::FP8 ? std::string("none")
                                     : fmt::format("as {}", to_string(spec.runs_as(p))));
    for (KernelClass k : kComputeClasses) fmt::print(" {:>12.3f}", spec.compute_eff(p, k));
    fmt::print("\n");
  }
  fmt::print(
      "  (compute efficiency: sustained fraction of peak by kernel class; amp runs at fp16's,\n"
      "  amp-bf16 at bf16's; the fp8 trainings run their linear GEMMs at fp8's (mxfp8's block-scaled\n"
      "  GEMMs at {:.3f} of fp8's rate, Transformer Engine's measured kernel ratio) and the rest at\n"
      "  bf16's, and are refused on a device without an fp8 rate; a device without a tf32 rate runs\n"
      "  tf32 as fp32)\n",
      fp8_gemm_rate(Precision::AMP_MXFP8));
}

}  // namespace

Command add_device_command(CLI::App& parent) {
  struct Options {
    std::string name;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* app = parent.add_subcommand(
      "device", "The device catalog: `pipegrid device list`, `pipegrid device show NAME`");
  app->require_subcommand(1);
  CLI::App* list = app->add_subcommand("list", "List the catalog's devices");
  CLI::App* show = app->add_subcommand("show", "A catalog device's figures");
  show->add_option("name", o->name, "Catalog name")->required();
  show->add_flag("--json", o->json, "Print one JSON object");
  list->add_flag("--json", o->json,
                 "Print one JSON object: schema_version, devices (each as device show --json)");
  return {app, [o, list]() -> int {
            if (*list) {
              if (o->json) {
                nlohmann::json all = nlohmann::json::array();
                for (const auto& d : input::device_catalog()) all.push_back(to_json(d));
                std::cout << nlohmann::json{{"schema_version", output::kJsonSchemaVersion}, {"devices", all}}
                                 .dump(2)
                          << "\n";
                return kOk;
              }
              fmt::print("{:<14} {:<6} {:>14} {:>14} {:>10} {:>12}  {}\n", "name", "family", "fp32 peak",
                         "fp16 peak", "memory", "bandwidth", "description");
              for (const auto& d : input::device_catalog())
                fmt::print("{:<14} {:<6} {:>14} {:>14} {:>10} {:>12}  {}\n", d.name, d.family,
                           format_flop_rate(d.spec.peak(Precision::FP32)),
                           format_flop_rate(d.spec.peak(Precision::FP16)), format_bytes(d.spec.memory_bytes),
                           format_bandwidth(d.spec.memory_bandwidth), d.description);
              return kOk;
            }
            const input::CatalogDevice* d = input::find_catalog_device(o->name);
            if (!d)
              return bad_input(
                  fmt::format("unknown device \"{}\" (`pipegrid device list` shows the catalog)", o->name));
            if (o->json) {
              std::cout << to_json(*d).dump(2) << "\n";
              return kOk;
            }
            fmt::print("{} ({}): {}\n", d->name, d->family, d->description);
            print_compute_table(d->spec);
            fmt::print("  memory           {}\n  memory bandwidth {}\n  memory efficiency",
                       format_bytes(d->spec.memory_bytes), format_bandwidth(d->spec.memory_bandwidth));
            for (KernelClass k : kKernelClasses)
              fmt::print(" {} {:.3f}", to_string(k), d->spec.memory_eff(k));
            std::vector<std::string> startups;  // the classes with a start-up of their own
            for (KernelClass k : kKernelClasses)
              if (d->spec.startup(k) != d->spec.kernel_startup_s)
                startups.push_back(fmt::format("{} {}", to_string(k), format_time(d->spec.startup(k))));
            fmt::print(
                "\n  kernel startup   {}{}\n  kernel dispatch  {}\n  layer overhead   {}\n",
                format_time(d->spec.kernel_startup_s),
                startups.empty() ? std::string() : fmt::format(" (by class: {})", fmt::join(startups, ", ")),
                format_time(d->spec.kernel_dispatch_s), format_time(d->spec.layer_overhead_s));
            std::vector<std::string> steps;
            for (Precision p : kMathPrecisions)
              if (double r = d->spec.recurrent_step_s[static_cast<int>(p)]; r > 0)
                steps.push_back(fmt::format("{} {}", to_string(p), format_time(r)));
            fmt::print("  recurrent step   {}\n",
                       steps.empty() ? std::string("none (a recurrent step costs its kernels only)")
                                     : fmt::format("{} (per step, direction and pass, beyond its kernels)",
                                                   fmt::join(steps, ", ")));
            std::vector<std::string_view> winograd;
            for (Precision p : kMathPrecisions)
              if (d->spec.winograd[static_cast<int>(p)]) winograd.push_back(to_string(p));
            fmt::print("  winograd         {}\n",
                       winograd.empty() ? std::string("none (3x3 convolutions costed at their direct FLOPs)")
                                        : fmt::format("{} (3x3 stride-1 convolutions as F(2x2, 3x3): 2.25x "
                                                      "fewer FLOPs)",
                                                      fmt::join(winograd, ", ")));
            if (d->spec.fpga) {
              const FpgaSpec& f = *d->spec.fpga;
              fmt::print("  DSPs             {}\n  clock            {}\n  MACs per DSP    ", f.dsps,
                         format_frequency(f.clock_hz));
              for (Precision p : kMathPrecisions)
                fmt::print(" {} {}", to_string(p), f.macs_per_dsp[static_cast<int>(p)]);
              fmt::print("\n");
              fmt::print("  on-chip memory   {}\n  network ports    {} x {}\n", format_bytes(f.onchip_bytes),
                         f.ports, format_bandwidth(f.port_bandwidth));
            }
            fmt::print("  source           {}\n", d->source);
            const std::vector<output::CostModelCheck> checks = output::catalog_checks(d->name);
            if (checks.empty()) fmt::print("  checked          not against published training runs\n");
            for (size_t i = 0; i < checks.size(); ++i)
              fmt::print("  {:<17}{}\n", i == 0 ? "checked" : "", checks[i].note);
            // Where each check set's rows are tabulated, once per set, in the order printed.
            std::vector<std::string> where;
            for (const output::CostModelCheck& c : checks) {
              const std::string w = c.source == "megatron-lm"       ? "Megatron-LM's: docs/3d-parallelism.md"
                                    : c.source == "moe"             ? "experiments/moe/results.md"
                                    : c.source == "blackwell-dense" ? "experiments/blackwell-dense/results.md"
                                                                    : "experiments/validation/results.md";
              if (std::find(where.begin(), where.end(), w) == where.end()) where.push_back(w);
            }
            if (!where.empty()) fmt::print("  {:<17}({})\n", "", fmt::join(where, "; "));
            return kOk;
          }};
}

}  // namespace pipegrid::cli
