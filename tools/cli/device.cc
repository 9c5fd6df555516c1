// pipegrid device list | pipegrid device show NAME [--json]: the device catalog.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/units.h"
#include "tools/cli/cli.h"
#include "tools/input/device_yaml.h"

namespace pipegrid::cli {
namespace {

nlohmann::json to_json(const input::CatalogDevice& d) {
  nlohmann::json peak;
  for (int p = 0; p < kPrecisionCount; ++p)
    peak[std::string(to_string(static_cast<Precision>(p)))] = d.spec.peak_flops[p];
  nlohmann::json j = {{"name", d.name},
                      {"family", d.family},
                      {"description", d.description},
                      {"peak_flops", peak},
                      {"efficiency", d.spec.efficiency},
                      {"memory_bytes", d.spec.memory_bytes},
                      {"memory_bandwidth_Bps", d.spec.memory_bandwidth},
                      {"layer_overhead_s", d.spec.layer_overhead_s},
                      {"source", d.source}};
  if (d.spec.fpga) {
    const FpgaSpec& f = *d.spec.fpga;
    nlohmann::json macs;
    for (int p = 0; p < kPrecisionCount; ++p)
      macs[std::string(to_string(static_cast<Precision>(p)))] = f.macs_per_dsp[p];
    j["fpga"] = {{"dsps", f.dsps},       {"clock_hz", f.clock_hz},
                 {"macs_per_dsp", macs}, {"onchip_bytes", f.onchip_bytes},
                 {"ports", f.ports},     {"port_bandwidth_Bps", f.port_bandwidth}};
  }
  return j;
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
  list->add_flag("--json", o->json, "Print a JSON list");
  return {
      app, [o, list, show]() -> int {
        if (*list) {
          if (o->json) {
            nlohmann::json all = nlohmann::json::array();
            for (const auto& d : input::device_catalog()) all.push_back(to_json(d));
            std::cout << all.dump(2) << "\n";
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
        for (int p = 0; p < kPrecisionCount; ++p)
          fmt::print("  peak {:<5}       {}\n", to_string(static_cast<Precision>(p)),
                     format_flop_rate(d->spec.peak_flops[p]));
        fmt::print(
            "  efficiency       {}\n  memory           {}\n  memory bandwidth {}\n  layer overhead   {}\n",
            d->spec.efficiency, format_bytes(d->spec.memory_bytes),
            format_bandwidth(d->spec.memory_bandwidth), format_time(d->spec.layer_overhead_s));
        if (d->spec.fpga) {
          const FpgaSpec& f = *d->spec.fpga;
          fmt::print(
              "  DSPs             {}\n  clock            {}\n  MACs per DSP     fp32 {}, fp16 {}, bf16 {}, "
              "int8 {}\n",
              f.dsps, format_frequency(f.clock_hz), f.macs_per_dsp[0], f.macs_per_dsp[1], f.macs_per_dsp[2],
              f.macs_per_dsp[3]);
          fmt::print("  on-chip memory   {}\n  network ports    {} x {}\n", format_bytes(f.onchip_bytes),
                     f.ports, format_bandwidth(f.port_bandwidth));
        }
        fmt::print("  source           {}\n", d->source);
        return kOk;
      }};
}

}  // namespace pipegrid::cli
