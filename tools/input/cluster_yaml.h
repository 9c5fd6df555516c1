// Clusters in input files: the `cluster` section of an experiment file, cluster files (YAML), the
// presets compiled in from topologies/clusters/, and SimGrid platform files (.xml).
//
// A cluster is one of
//   {kind: switch|ring|torus|fat-tree|dragonfly|dgx|summit|fpga-ring|fpga-torus, <generator keys>}
//   {preset: NAME}                       a file of topologies/clusters/ (`pipegrid cluster list`)
//   {file: PATH, device: SPEC}           a cluster file (YAML) or a SimGrid platform (.xml), relative to
//                                        the file that names it; `device` is for SimGrid hosts without
//                                        pipegrid properties
//   {name, devices, switches, links, routes}   a cluster written out (the form of cluster files)
// Every error names file:line:column, the key path, what was expected and what was found; the
// cluster is validated (connected devices, no duplicate or self link, walks for routes) before any
// simulation.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/cluster.h"
#include "core/result.h"
#include "tools/input/yaml_node.h"

namespace pipegrid::input {

// Throws InputError (like the other section parsers).
Cluster parse_cluster(const Node& n);

struct ClusterPreset {
  std::string_view name;
  std::string_view text;  // YAML, as in topologies/clusters/<name>.yaml
};
std::span<const ClusterPreset> cluster_presets();
// Older preset names, still accepted: a preset's number counts its devices since issue 55 (some
// counted nodes or servers before). `name` is the preset an old name reads.
struct PresetAlias {
  std::string_view old_name, name;
};
std::span<const PresetAlias> preset_aliases();

// A cluster file (YAML, or SimGrid XML when the name ends in .xml) if `file_or_preset` names an
// existing file, else a preset. `device`: for SimGrid hosts without pipegrid properties.
Result<Cluster> load_cluster(const std::string& file_or_preset, const std::optional<DeviceSpec>& device);

// A device given on the command line: a catalog name.
// A cluster file's text (YAML; no presets or file references inside); `name` names it in messages.
Result<Cluster> load_cluster_text(const std::string& text, const std::string& name);

Result<DeviceSpec> catalog_device(const std::string& name);

}  // namespace pipegrid::input
