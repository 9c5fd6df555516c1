// pipegrid workload show MODEL|FILE [--micro-batch-size N] [--device NAME] [--precision P] [--json]
// A per-layer table and totals of a zoo model, a model file (YAML) or a PipeDream profile (.txt).
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/file_io.h"
#include "core/models/pipedream_profile.h"
#include "core/models/zoo.h"
#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/input/device_yaml.h"
#include "tools/input/model_yaml.h"
#include "tools/output/report.h"

namespace pipegrid::cli {
namespace {

struct WorkloadOptions {
  std::string what;
  double micro_batch_size = 0;  // 0: the workload's own (a model file's micro_batch_size, ...)
  std::string device;
  std::string precision;
  std::string profile_device;  // empty: v100 (profiles only)
  double profile_batch = 0;    // 0: 128 (profiles only)
  bool json = false;
  std::vector<std::string> model_args;  // --arg KEY=VALUE (zoo models)
};

Result<Workload> load(const WorkloadOptions& o) {
  std::optional<Precision> precision;
  if (!o.precision.empty()) {
    precision = parse_precision(o.precision);
    if (!precision)
      return Error{fmt::format("--precision: expected {}, got \"{}\"", precision_choices(), o.precision)};
  }
  const bool profile = o.what.size() > 4 && o.what.substr(o.what.size() - 4) == ".txt";
  // Options of another kind of workload would change nothing: refused, as --arg is.
  if (!profile && (!o.profile_device.empty() || o.profile_batch > 0))
    return Error{fmt::format("{}: only PipeDream profiles (.txt) take it",
                             !o.profile_device.empty() ? "--profile-device" : "--profile-batch")};
  if (profile && precision)
    return Error{
        "--precision: a PipeDream profile holds measured times at its own precision; only zoo models "
        "and model files take it"};
  if (Result<const ModelInfo*> m = find_model(o.what); m) {
    ModelArgs args;
    for (const std::string& a : o.model_args) {
      const size_t eq = a.find('=');
      double v = 0;
      if (eq == std::string::npos || !CLI::detail::lexical_cast(a.substr(eq + 1), v))
        return Error{fmt::format("--arg: expected KEY=NUMBER, like layers=2, got \"{}\"", a)};
      args[a.substr(0, eq)] = v;
    }
    return build_model(**m, args, precision.value_or(Precision::FP32));
  }
  if (!o.model_args.empty()) return Error{"--arg: only zoo models take parameters"};
  if (profile) {
    Result<std::string> text = read_input_file(o.what);
    if (!text) return text.error();
    ProfileOptions po;
    po.batch = o.profile_batch > 0 ? o.profile_batch : 128;
    const std::string kind = o.profile_device.empty() ? "v100" : o.profile_device;
    if (std::string problem = input::profile_device_kind_problem(kind); !problem.empty())
      return Error{"--profile-device: " + problem};
    po.device_kind = kind == "any" ? "" : kind;
    return parse_pipedream_profile(*text, o.what, po);
  }
  if (o.what.find('.') == std::string::npos && o.what.find('/') == std::string::npos)
    return find_model(o.what).error();  // looks like a model name: say which exist
  return input::load_model_file(o.what, precision);
}

int run(const WorkloadOptions& o) {
  Result<Workload> w = load(o);
  if (!w) return bad_input(w.error().message);
  if (std::string warning = output::fractional_parameters_warning(*w); !warning.empty())
    fmt::print(std::cerr, "pipegrid: warning: {}\n", warning);
  const DeviceSpec* device = nullptr;
  if (!o.device.empty()) {
    const input::CatalogDevice* d = input::find_catalog_device(o.device);
    if (!d)
      return bad_input(
          fmt::format("unknown device \"{}\" (`pipegrid device list` shows the catalog)", o.device));
    device = &d->spec;
  }
  const double b = o.micro_batch_size > 0 ? o.micro_batch_size : w->micro_batch_size;
  nlohmann::json layers = nlohmann::json::array();
  double fwd_total = 0, bwd_total = 0;
  for (size_t i = 0; i < w->layer_count(); ++i) {
    const Layer& l = w->layer(i);
    nlohmann::json j = {
        {"name", l.name},
        {"kind", l.kind},
        {"forward_flops", output::json_number(l.forward_flops * b)},
        {"backward_flops", output::json_number((l.backward_input_flops + l.backward_weight_flops) * b)},
        {"parameters", output::json_number(l.parameters)},
        {"parameter_bytes", output::json_number(l.parameter_bytes)},
        {"activation_bytes", output::json_number(l.output_bytes * b)},
        {"stash_bytes", output::json_number(l.stash_bytes * b)}};
    if (device) {
      Result<PassTimes> t = layer_times(l, w->precision, *device, b);
      if (!t) return bad_input(t.error().message);
      j["forward_s"] = t->forward;
      j["backward_s"] = t->backward();
      fwd_total += t->forward;
      bwd_total += t->backward();
    }
    layers.push_back(j);
  }
  if (o.json) {
    nlohmann::json j = {{"schema_version", output::kJsonSchemaVersion},
                        {"name", w->name},
                        {"precision", to_string(w->precision)},
                        {"micro_batch_size", output::json_number(b)},
                        {"parameters", output::json_number(total_parameters(*w))},
                        {"parameter_bytes", output::json_number(total_parameter_bytes(*w))},
                        {"forward_flops_per_sample", output::json_number(total_forward_flops(*w))},
                        {"layers", layers}};
    if (device) {
      j["device"] = o.device;
      j["forward_s"] = fwd_total;
      j["backward_s"] = bwd_total;
    }
    std::cout << j.dump(2) << "\n";
    return kOk;
  }
  size_t wn = 5, wk = 4;
  for (const auto& l : layers) {
    wn = std::max(wn, l["name"].get<std::string>().size());
    wk = std::max(wk, l["kind"].get<std::string>().size());
  }
  fmt::print("{} ({}, micro-batch of {}{})\n\n", w->name, to_string(w->precision),
             output::plural(b, "sample", "samples"), device ? ", times on " + o.device : "");
  fmt::print("{:<{}} {:<{}} {:>14} {:>12} {:>12}", "layer", wn, "kind", wk, "forward FLOP", "parameters",
             "activation");
  if (device) fmt::print(" {:>11} {:>11}", "forward", "backward");
  fmt::print("\n");
  for (const auto& l : layers) {
    fmt::print("{:<{}} {:<{}} {:>14} {:>12} {:>12}", l["name"].get<std::string>(), wn,
               l["kind"].get<std::string>(), wk, format_flops(l["forward_flops"].get<double>()),
               fmt::format("{:.0f}", l["parameters"].get<double>()),
               format_bytes(l["activation_bytes"].get<double>()));
    if (device)
      fmt::print(" {:>11} {:>11}", format_time(l["forward_s"].get<double>()),
                 format_time(l["backward_s"].get<double>()));
    fmt::print("\n");
  }
  fmt::print("\nlayers           {}\n", w->layer_count());
  fmt::print("parameters       {:.0f} ({})\n", total_parameters(*w), format_bytes(total_parameter_bytes(*w)));
  fmt::print("forward FLOP     {} per sample\n", format_flops(total_forward_flops(*w)));
  if (device)
    fmt::print("time on {}  forward {}, backward {} per micro-batch of {}\n", o.device,
               format_time(fwd_total), format_time(bwd_total), b);
  return kOk;
}

}  // namespace

Command add_workload_command(CLI::App& parent) {
  auto o = std::make_shared<WorkloadOptions>();
  CLI::App* app = parent.add_subcommand("workload", "Inspect workloads: `pipegrid workload show MODEL|FILE`");
  app->require_subcommand(1);
  CLI::App* show =
      app->add_subcommand("show", "Per-layer table and totals of a zoo model, model file or profile");
  show->add_option("model", o->what, "Zoo model name, model file (.yaml) or PipeDream profile (.txt)")
      ->required();
  show->add_option("--micro-batch-size,-b", o->micro_batch_size,
                   "Samples per micro-batch; default: a model file's micro_batch_size, a profile's "
                   "--profile-batch, 1 for zoo models")
      ->default_str("")
      ->check(kSampleCount);
  show->add_option("--device", o->device, "Catalog device to time the layers on");
  show->add_option("--precision", o->precision,
                   "fp32, tf32, fp16, bf16, int8, amp (fp16 math, fp32 master weights), amp-bf16, fp8 "
                   "(amp-bf16 with the linear layers' GEMMs in FP8, per-tensor scales), fp8-blockwise or "
                   "mxfp8 (zoo models and model files)");
  show->add_option("--profile-device", o->profile_device,
                   "Device kind a profile was measured on (or any; profiles only)")
      ->default_str("v100");
  show->add_option("--profile-batch", o->profile_batch, "Samples a profile was measured with (profiles only)")
      ->default_str("128")
      ->check(kFinitePositive);
  show->add_flag("--json", o->json, "Print one JSON object");
  show->add_option("--arg", o->model_args,
                   "A zoo model's parameter, KEY=VALUE (repeatable): --arg layers=2 --arg hidden=64")
      ->type_name("KEY=VALUE");
  return {show, [o] { return run(*o); }};
}

}  // namespace pipegrid::cli
