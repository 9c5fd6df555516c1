// `pipegrid search ... --emit FILE`: a search candidate as a ready-to-run experiment file (issue 55,
// item 8). The base experiment's document (with its --set arguments) keeps its workload, cluster,
// backends and the strategy keys the search keeps; the candidate's strategy and memory keys replace
// the rest, in Megatron's batch vocabulary (strategy.micro_batch_size per replica, global_batch).
#include "tools/cli/search_emit.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <fstream>

#include "tools/input/experiment_yaml.h"
#include "tools/input/yaml_node.h"
#include "tools/output/safe_write.h"

namespace pipegrid::cli {
namespace {

namespace fs = std::filesystem;

// A path the base document names, as the emitted file must name it: relative to the emitted file's
// folder (absolute when no relative path exists, e.g. another drive).
std::string moved_path(const input::Document& base, const std::string& path, const fs::path& to_dir) {
  const fs::path resolved = fs::absolute(input::resolve_path(base, path));
  std::error_code ec;
  fs::path rel = fs::relative(resolved, fs::absolute(to_dir), ec);
  return ec || rel.empty() ? resolved.string() : rel.string();
}

// Rewrites the scalar at `n[key]`, when there is one, as moved_path does.
void move_key(const input::Document& base, YAML::Node n, const char* key, const fs::path& to_dir) {
  if (n && n.IsMap() && n[key] && n[key].IsScalar()) n[key] = moved_path(base, n[key].Scalar(), to_dir);
}

// The file keys of an experiment (workload.file and .profile, cluster.file, backends[.catalog],
// strategy.schedule_file) rewritten for a file in `to_dir`.
void move_paths(const input::Document& base, YAML::Node root, const fs::path& to_dir) {
  move_key(base, root["workload"], "file", to_dir);
  move_key(base, root["workload"], "profile", to_dir);
  move_key(base, root["cluster"], "file", to_dir);
  move_key(base, root["strategy"], "schedule_file", to_dir);
  if (root["backends"] && root["backends"].IsScalar())
    move_key(base, root, "backends", to_dir);
  else
    move_key(base, root["backends"], "catalog", to_dir);
}

// The strategy the search keeps from the base (docs/3d-search.md), then the candidate's keys.
YAML::Node candidate_strategy(const YAML::Node& base, const Search3dCandidate& c, int global_batch) {
  YAML::Node s(YAML::NodeType::Map);
  for (const char* key : {"tp_overlap", "tp_wgrad_overlap", "dp_overlap", "allreduce", "gradient_reduce",
                          "expert_parallel", "expert_tensor_parallel", "moe"})
    if (base && base.IsMap() && base[key]) s[key] = base[key];
  if (c.t == 1)  // nothing to overlap (the experiment loader refuses the keys' non-defaults at t = 1)
    for (const char* key : {"tp_overlap", "tp_wgrad_overlap"}) s.remove(key);
  s["partitioner"] = "megatron";
  s["schedule"] = c.schedule;
  if (c.v > 1) s["chunks"] = c.v;
  s["tensor_parallel"] = c.t;
  if (c.sequence_parallel) s["sequence_parallel"] = true;
  s["stages"] = c.p;
  s["replicas"] = c.d;
  s["micro_batch_size"] = c.b;  // per replica, as Megatron's --micro-batch-size
  s["global_batch"] = global_batch;
  if (c.uneven) {
    s["account_for_embedding"] = true;
    s["account_for_loss"] = true;
  }
  if (!c.layout.empty()) s["layout"] = c.layout;
  if (c.cp > 1) {
    s["context_parallel"] = c.cp;
    s["cp_algorithm"] = std::string(to_string(c.cp_algorithm));
    if (base && base.IsMap() && base["cp_load_balance"]) s["cp_load_balance"] = base["cp_load_balance"];
  }
  if (c.moe) {
    s["expert_parallel"] = c.ep;
    s["expert_tensor_parallel"] = c.etp;
    YAML::Node moe = s["moe"] && s["moe"].IsMap() ? YAML::Clone(s["moe"]) : YAML::Node(YAML::NodeType::Map);
    moe["dispatcher"] = std::string(to_string(c.dispatcher));
    moe["overlap"] = c.moe_overlap;
    s["moe"] = moe;
  }
  return s;
}

// Whether the emitted experiment is the one the search ran (search3d_experiment): the keys a
// candidate decides, read back by the parser.
bool same_run(const Experiment& a, const Experiment& b) {
  const StrategySpec &x = a.strategy, &y = b.strategy;
  return x.partitioner == y.partitioner && x.schedule == y.schedule && x.micro_batches == y.micro_batches &&
         x.stages == y.stages && x.chunks == y.chunks && x.replicas == y.replicas &&
         x.tensor_parallel == y.tensor_parallel && x.sequence_parallel == y.sequence_parallel &&
         a.memory.recompute == b.memory.recompute && a.memory.zero1 == b.memory.zero1 &&
         a.micro_batch_size == b.micro_batch_size && x.expert_parallel == y.expert_parallel &&
         x.expert_tensor_parallel == y.expert_tensor_parallel && x.moe.dispatcher == y.moe.dispatcher &&
         x.moe_overlap == y.moe_overlap && x.context_parallel == y.context_parallel &&
         x.partitioner_options.megatron.account_for_embedding ==
             y.partitioner_options.megatron.account_for_embedding &&
         x.partitioner_options.megatron.account_for_loss == y.partitioner_options.megatron.account_for_loss &&
         x.partitioner_options.megatron.layout == y.partitioner_options.megatron.layout &&
         (x.context_parallel == 1 || x.context.algorithm == y.context.algorithm);
}

}  // namespace

Status emit_candidate(const EmitRequest& r) {
  try {
    input::Document doc = input::load_document_file(r.base_file);
    input::apply_overrides(doc, r.overrides);
    YAML::Node root = YAML::Clone(doc.root);
    if (root["workload"] && root["workload"].IsMap()) root["workload"].remove("micro_batch_size");
    root["strategy"] = candidate_strategy(doc.root["strategy"], r.candidate, r.global_batch);
    YAML::Node memory =
        root["memory"] && root["memory"].IsMap() ? root["memory"] : YAML::Node(YAML::NodeType::Map);
    memory["recompute"] = std::string(to_string(r.candidate.recompute));
    // The base's recompute modules hold for the candidates that recompute selectively; the others
    // have none (the key is refused beside another mode).
    if (r.candidate.recompute != Recompute::Selective) memory.remove("recompute_modules");
    memory["zero"] = r.candidate.distributed_optimizer ? 1 : 0;
    root["memory"] = memory;
    move_paths(doc, root, fs::path(r.out_file).parent_path());
    YAML::Emitter e;
    e << root;
    const std::string text = fmt::format("# {}\n{}\n", r.comment, e.c_str());
    Result<Experiment> back = input::load_experiment_text(text, r.out_file);
    if (!back)
      return Error{
          fmt::format("--emit: the written experiment does not read back: {}", back.error().message)};
    if (!same_run(*back, search3d_experiment(r.base, r.candidate)))
      return Error{
          fmt::format("--emit: the written experiment is not the candidate {}", r.candidate.label())};
    return output::write_file_safely(r.out_file, text);
  } catch (const input::InputError& e) {
    return Error{e.what()};
  }
}

}  // namespace pipegrid::cli
