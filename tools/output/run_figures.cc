#include "tools/output/run_figures.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/collectives.h"
#include "core/moe.h"
#include "core/tensor_parallel.h"
#include "core/units.h"
#include "tools/output/report.h"

namespace pipegrid::output {
namespace {

std::string count_text(double x) {
  if (x >= 1e12) return fmt::format("{:.4g} T", x / 1e12);
  if (x >= 1e9) return fmt::format("{:.4g} B", x / 1e9);
  if (x >= 1e6) return fmt::format("{:.4g} M", x / 1e6);
  return fmt::format("{:.6g}", x);
}

std::string duration_text(double s) {
  if (s >= 2 * 86400) return fmt::format("{:.4g} days", s / 86400);
  if (s >= 2 * 3600) return fmt::format("{:.4g} hours", s / 3600);
  return format_time(s);
}

}  // namespace

std::optional<TokenFigures> token_figures(const Experiment& e, const Metrics& m, double tokens) {
  std::optional<ModelFlops> model = model_flops(e.workload);
  if (!model || !(m.throughput_samples_per_s > 0)) return std::nullopt;
  TokenFigures f;
  f.model = *model;
  double peak = 0;
  for (size_t d = 0; d < m.devices.size() && d < e.cluster.devices.size(); ++d)
    if (m.devices[d].used) {
      f.devices += 1;
      peak += e.cluster.devices[d].spec.peak(e.workload.precision);
      f.peak_precision = e.cluster.devices[d].spec.runs_as(e.workload.precision);
    }
  if (f.devices == 0) return std::nullopt;
  f.tokens_per_s = m.throughput_samples_per_s * model->sequence;
  f.tokens_per_s_per_device = f.tokens_per_s / f.devices;
  f.model_flops_per_s_per_device = model->flops_per_token() * f.tokens_per_s / f.devices;
  f.peak_flops_per_device = peak / f.devices;
  f.mfu = peak > 0 ? model->flops_per_token() * f.tokens_per_s / peak : 0;
  if (const double experts = routed_experts(e.workload); experts > 0 && e.strategy.moe.capacity_factor > 0)
    f.dropped = 1 - kept_copy_share(e.strategy.moe, static_cast<int>(experts));
  f.tokens = tokens > 0 ? tokens : 0;
  f.time_to_train_s = f.tokens > 0 ? f.tokens / f.tokens_per_s : 0;
  return f;
}

std::vector<std::string> token_lines(const TokenFigures& f) {
  const ModelFlops& m = f.model;
  std::vector<std::string> out;
  out.push_back(fmt::format("tokens           {:.6g} tokens/s, {:.6g} per device ({:g} tokens per sample)",
                            f.tokens_per_s, f.tokens_per_s_per_device, m.sequence));
  out.push_back(fmt::format("model FLOP/s     {} per device, MFU {:.2f}% of the {} peak ({} per device)",
                            format_flop_rate(f.model_flops_per_s_per_device), 100 * f.mfu,
                            to_string(f.peak_precision), format_flop_rate(f.peak_flops_per_device)));
  out.push_back(fmt::format(
      "                 6 N + 12 L h s = {} per token: N = {} {}parameters, 12 L h s = {} (L = {}, s = "
      "{:g}); "
      "Megatron-LM's model FLOPs (arXiv 2104.04473, eq. 3), PaLM's MFU (arXiv 2204.02311, app. B), "
      "recomputation not counted",
      format_flops(m.flops_per_token()), count_text(m.active_parameters), m.moe ? "active " : "",
      format_flops(m.attention_flops_per_token), m.blocks, m.sequence));
  if (f.dropped > 1e-12)
    out.push_back(fmt::format(
        "                 N counts every routed copy, the {} a capacity factor drops included (as "
        "Megatron-LM's count does): the model FLOP/s and MFU exceed the work done",
        fmt::format("{:.2f}%", 100 * f.dropped)));
  if (f.tokens > 0)
    out.push_back(fmt::format("time to train    {:.4g} tokens in {} at {:.6g} tokens/s", f.tokens,
                              duration_text(f.time_to_train_s), f.tokens_per_s));
  return out;
}

nlohmann::json token_json(const std::optional<TokenFigures>& f) {
  if (!f) return nullptr;
  nlohmann::json j = {{"formula",
                       "6 N + 12 L h s per token (Megatron-LM arXiv 2104.04473 eq. 3; PaLM arXiv "
                       "2204.02311 appendix B); N: active parameters"},
                      {"flops_per_token", f->model.flops_per_token()},
                      {"active_parameters", f->model.active_parameters},
                      {"total_parameters", f->model.total_parameters},
                      {"attention_flops_per_token", f->model.attention_flops_per_token},
                      {"blocks", f->model.blocks},
                      {"sequence", f->model.sequence},
                      {"moe", f->model.moe},
                      {"devices", f->devices},
                      {"tokens_per_s", f->tokens_per_s},
                      {"tokens_per_s_per_device", f->tokens_per_s_per_device},
                      {"model_flops_per_s_per_device", f->model_flops_per_s_per_device},
                      {"peak_flops_per_device", f->peak_flops_per_device},
                      {"peak_precision", std::string(to_string(f->peak_precision))},
                      {"mfu", f->mfu},
                      {"dropped_copies", f->dropped}};
  if (f->tokens > 0) {
    j["tokens"] = f->tokens;
    j["time_to_train_s"] = f->time_to_train_s;
  }
  return j;
}

double six_n_mfu(const ModelFlops& f, double tokens_per_s, double devices, double peak) {
  return peak > 0 && devices > 0 ? 6 * f.total_parameters * tokens_per_s / (devices * peak) : 0;
}

namespace {

// What the workload's transformer blocks assume: how many blocks, with fused attention, with Megatron's
// fused element-wise kernels.
struct BlockAssumptions {
  int blocks = 0, fused_attention = 0, megatron_fusion = 0, fused_gated = 0;
};
BlockAssumptions block_assumptions(const Workload& w) {
  BlockAssumptions b;
  for (size_t l = 0; l < w.layer_count(); ++l) {
    const TensorSplit& s = w.layer(static_cast<int>(l)).split;
    if (!is_block(s.kind)) continue;
    ++b.blocks;
    b.fused_attention += s.fused_attention;
    b.megatron_fusion += s.megatron_fusion;
    b.fused_gated += s.gated && s.megatron_fusion;
  }
  return b;
}

// "all", "none" or "mixed" of `blocks`.
std::string_view share(int n, int blocks) {
  return n == blocks ? "all" : n == 0 ? "none" : "mixed";
}

// The reserve over the devices: the largest, and whether every device has its default.
std::pair<double, bool> reserve_of(const Cluster& c) {
  double most = 0;
  bool by_default = true;
  for (const Device& d : c.devices) {
    most = std::max(most, d.spec.memory_reserve_bytes);
    by_default = by_default && d.spec.memory_reserve_bytes == default_memory_reserve(d.spec);
  }
  return {most, by_default};
}

std::string_view fp8_recipe(Precision p) {
  switch (p) {
    case Precision::AMP_FP8:
      return "per-tensor current scaling (Transformer Engine)";
    case Precision::AMP_FP8_BLOCKWISE:
      return "1x128 / 128x128 blockwise scaling (DeepSeek-V3)";
    case Precision::AMP_MXFP8:
      return "MXFP8, 32-element blocks";
    default:
      return "";
  }
}

// The vocabulary Megatron pads to under tensor parallelism (core/tensor_parallel.h), when the
// workload has a vocabulary-parallel layer and t > 1: {the model's, the padded}; {0, 0} otherwise.
std::pair<double, double> padded_vocabulary(const Experiment& e) {
  if (e.strategy.tensor_parallel <= 1) return {0, 0};
  for (size_t l = 0; l < e.workload.layer_count(); ++l) {
    const TensorSplit& sp = e.workload.layer(static_cast<int>(l)).split;
    if ((sp.kind == TensorSplitKind::VocabHead || sp.kind == TensorSplitKind::VocabEmbedding) &&
        sp.vocabulary > 0)
      return {sp.vocabulary, megatron_padded_vocabulary(sp.vocabulary, e.strategy.tensor_parallel)};
  }
  return {0, 0};
}

double gradient_bytes(const Experiment& e) {
  return e.strategy.gradient_reduce_bytes > 0 ? e.strategy.gradient_reduce_bytes
                                              : element_bytes(e.workload.precision);
}

// The devices' host time per kernel launch (kernel_dispatch), distinct values in order; empty when
// no device sets one (a host never the limit).
std::vector<double> host_dispatch(const Cluster& c) {
  std::vector<double> out;
  for (const Device& d : c.devices)
    if (d.spec.kernel_dispatch_s > 0 &&
        std::find(out.begin(), out.end(), d.spec.kernel_dispatch_s) == out.end())
      out.push_back(d.spec.kernel_dispatch_s);
  return out;
}

// The kernel classes whose host time per launch differs from their device's kernel_dispatch, as
// "grouped-gemm 60 us", distinct entries in order.
std::vector<std::string> host_dispatch_classes(const Cluster& c) {
  std::vector<std::string> out;
  for (const Device& d : c.devices)
    for (KernelClass k : kKernelClasses)
      if (const double t = d.spec.kernel_dispatch_class[static_cast<int>(k)];
          t >= 0 && t != d.spec.kernel_dispatch_s) {
        std::string entry = fmt::format("{} {}", to_string(k), format_time(t));
        if (std::find(out.begin(), out.end(), entry) == out.end()) out.push_back(std::move(entry));
      }
  return out;
}

// mixed-adam (fp16/bf16 working weights, fp32 master weights) on a workload whose weights are 4-byte
// (fp32, tf32): its memory is a 16-bit training's, not the precision's the compute runs in.
bool mixed_adam_on_fp32(const Experiment& e) {
  return e.memory.optimizer == Optimizer::MixedAdam && !e.memory.bytes_per_parameter &&
         element_bytes(e.workload.precision) == 4;
}

// The kinds of the devices that run a tf32 workload as fp32, having no tf32 rate (a V100, an FPGA),
// as PyTorch's allow_tf32 does below Ampere; empty for other precisions.
std::vector<std::string> tf32_as_fp32(const Experiment& e) {
  std::vector<std::string> kinds;
  if (math_precision(e.workload.precision) != Precision::TF32) return kinds;
  for (const Device& d : e.cluster.devices)
    if (d.spec.runs_as(Precision::TF32) != Precision::TF32 &&
        std::find(kinds.begin(), kinds.end(), d.spec.kind) == kinds.end())
      kinds.push_back(d.spec.kind);
  return kinds;
}

// The memory settings that change nothing on this experiment, with why, where the run would
// otherwise be read as having them: recompute: selective without blocks or a layer's selective
// stash (docs/model.md: such layers behave as with none), optimizer_kernels: unfused where the
// workload fixes the optimizer step.
std::vector<std::pair<std::string, std::string>> settings_without_effect(const Experiment& e) {
  std::vector<std::pair<std::string, std::string>> out;
  if (e.memory.recompute == Recompute::Selective && block_assumptions(e.workload).blocks == 0) {
    bool any = false;
    for (size_t l = 0; l < e.workload.layer_count() && !any; ++l)
      any = e.workload.layer(static_cast<int>(l)).selective_stash_bytes >= 0;
    if (!any)
      out.emplace_back("recompute: selective",
                       "no transformer blocks, and no layer defines selective_stash_bytes; recompute: full "
                       "re-runs any layer");
  }
  if (e.memory.optimizer_kernels == OptimizerKernels::Unfused && e.workload.optimizer_step_s >= 0)
    out.emplace_back("optimizer_kernels: unfused", fmt::format("the workload fixes the optimizer step at {}",
                                                               format_time(e.workload.optimizer_step_s)));
  return out;
}

// How the micro-batches' weight gradients are accumulated. Unfused, its kernels move bytes at the
// device's memory bandwidth: a device without one (a chain's hand-described device) pays nothing,
// which the note would otherwise claim it does.
std::string grad_accumulation_part(const Experiment& e) {
  std::string note = grad_accumulation_note(e.memory.grad_accumulation);
  if (e.memory.grad_accumulation == GradAccumulation::Fused) return note;
  std::vector<std::string> free;
  for (const Device& d : e.cluster.devices)
    if (d.spec.memory_bandwidth <= 0) free.push_back(d.name);
  if (!free.empty())
    note += fmt::format(", not costed on the {} device{} without a memory_bandwidth ({}{})", free.size(),
                        free.size() == 1 ? "" : "s", free.front(), free.size() > 1 ? ", ..." : "");
  return note;
}

// A layer's memory traffic is costed at its device's memory bandwidth: on a device described without
// one (a hand-described `{name, memory, flops}`), memory-bound work takes no time. Empty: none such.
std::string unbounded_memory_note(const Experiment& e) {
  bool traffic = false;
  for (size_t l = 0; l < e.workload.layer_count() && !traffic; ++l) {
    const Layer& x = e.workload.layer(static_cast<int>(l));
    traffic = x.forward_bytes > 0 || x.backward_bytes > 0 || !x.kernels.empty();
  }
  std::vector<std::string> unbounded;
  for (const Device& d : e.cluster.devices)
    if (d.spec.memory_bandwidth <= 0) unbounded.push_back(d.name);
  if (!traffic || unbounded.empty()) return "";
  return fmt::format(
      "memory-bound work (element-wise kernels, norms, a layer's memory traffic) in no time on the {} "
      "device{} without a memory_bandwidth ({}{}; give one, or a catalog model)",
      unbounded.size(), unbounded.size() == 1 ? "" : "s", unbounded.front(),
      unbounded.size() > 1 ? ", ..." : "");
}

}  // namespace

std::string grad_accumulation_note(GradAccumulation g) {
  switch (g) {
    case GradAccumulation::Fused:
      break;
    case GradAccumulation::Unfused:
      return "micro-batches' weight gradients added by one kernel per parameter tensor from a step's second "
             "(grad_accumulation: unfused)";
    case GradAccumulation::MainGrad:
      return "micro-batches' weight gradients added into main_grad by one kernel per parameter tensor "
             "(grad_accumulation: main-grad)";
  }
  return "micro-batches' weight gradients accumulated inside the weight-gradient GEMMs (grad_accumulation: "
         "fused)";
}

std::string assumptions_note(const Experiment& e) {
  std::vector<std::string> parts;
  const BlockAssumptions b = block_assumptions(e.workload);
  if (b.blocks > 0) {
    const std::string_view fused = share(b.fused_attention, b.blocks),
                           fusion = share(b.megatron_fusion, b.blocks);
    parts.push_back(fused == "all" ? "FlashAttention"
                    : fused == "none"
                        ? "unfused attention (workload attention: fused for FlashAttention)"
                        : fmt::format("FlashAttention in {} of {} blocks", b.fused_attention, b.blocks));
    parts.push_back(fusion == "all"    ? "Megatron's fused element-wise kernels"
                    : fusion == "none" ? "no kernel fusion (kernel_fusion: megatron for Megatron's)"
                                       : fmt::format("Megatron's kernel fusion in {} of {} blocks",
                                                     b.megatron_fusion, b.blocks));
  }
  parts.push_back(
      e.strategy.allreduce == AllReduceAlgorithm::Nccl
          ? std::string("data-parallel all-reduce as NCCL 2.21.5's model picks it (tree or ring per NIC, "
                        "per call; reduce-scatter: ring per NIC)")
          : fmt::format("{} data-parallel all-reduce", to_string(e.strategy.allreduce)));
  if (e.strategy.partitioner_options.round_robin)
    parts.push_back(
        "replicas take whole micro-batches in turn (round-robin, as PipeDream; replica_mode: split)");
  const auto [reserve, by_default] = reserve_of(e.cluster);
  // Devices that differ (GPUs of other memory sizes, FPGAs, which get none by default) have
  // different reserves: the range, not the largest as every device's.
  double least = reserve;
  for (const Device& d : e.cluster.devices) least = std::min(least, d.spec.memory_reserve_bytes);
  parts.push_back(reserve == 0 ? "no memory reserve"
                               : fmt::format("memory reserve {} per device ({}; --memory-margin)",
                                             least == reserve ? format_bytes(reserve)
                                                              : fmt::format("{} to {}", format_bytes(least),
                                                                            format_bytes(reserve)),
                                             by_default ? "default: 1 GiB + 5% per GPU" : "given"));
  parts.push_back(
      fmt::format("gradients reduced at {:g} bytes per parameter", gradient_bytes(e)) +
      (e.memory.gradient_bytes > element_bytes(e.workload.precision) && !e.memory.bytes_per_parameter
           ? " and kept at that size (Megatron-Core's gradient buffer in the reduce's precision)"
           : ""));
  if (e.memory.activation_fp8_input_store)
    parts.push_back(
        b.fused_gated > 0
            ? "gated MLPs' activation inputs saved in fp8 (activation_fp8_input_store; not where "
              "recomputed)"
            : "activation_fp8_input_store changes nothing: no gated MLP with Megatron's fused "
              "activation (Megatron-Core stores only SwiGLU's and quick-GEGLU's fused inputs in fp8)");
  if (e.memory.master_bytes == 2)
    parts.push_back("master weights as 16-bit remainders of the bf16 weights (master_weights: remainders)");
  if (mixed_adam_on_fp32(e))
    parts.push_back(fmt::format(
        "mixed-adam on {} weights: memory counts 2-byte working weights beside the fp32 master weights, "
        "as a 16-bit training keeps them (memory.optimizer: adam for {} weights kept as they compute)",
        to_string(e.workload.precision), to_string(e.workload.precision)));
  if (e.memory.moment_bytes > 0)
    parts.push_back(
        fmt::format("optimizer moments at {:g} bytes each (optimizer_moments)", e.memory.moment_bytes));
  parts.push_back(grad_accumulation_part(e));
  if (std::string free = unbounded_memory_note(e); !free.empty()) parts.push_back(std::move(free));
  if (e.strategy.tensor_parallel > 1)
    parts.push_back(
        e.strategy.tp_wgrad_overlap
            ? "TP input gradients' collectives beside the weight-gradient GEMMs (Megatron's "
              "asynchronous TP communication; tp_wgrad_overlap)"
            : "TP input gradients' collectives after the weight-gradient GEMMs (tp_wgrad_overlap: false)");
  if (e.memory.recompute == Recompute::Selective && b.blocks > 0)
    parts.push_back(fmt::format("selective recomputation of {} (Megatron-Core's recompute_modules)",
                                to_string(e.memory.modules)));
  for (const auto& [key, why] : settings_without_effect(e))
    parts.push_back(fmt::format("{} changes nothing ({})", key, why));
  if (e.memory.bytes_per_parameter && e.workload.optimizer_step_s < 0)
    parts.push_back(fmt::format("memory.bytes_per_parameter sets the memory only: the optimizer step is {}'s",
                                to_string(e.memory.optimizer)));
  if (const auto [v, padded] = padded_vocabulary(e); padded > v)
    parts.push_back(
        fmt::format("vocabulary {:g} padded to {:g} (a multiple of 128 t, Megatron's)", v, padded));
  if (fp8_training(e.workload.precision))
    parts.push_back(fmt::format("fp8 recipe: {}{}", fp8_recipe(e.workload.precision),
                                fp8_gemm_rate(e.workload.precision) != 1
                                    ? fmt::format(", its GEMMs at {:.3f} of the fp8 figure (Transformer "
                                                  "Engine's measured kernel ratio)",
                                                  fp8_gemm_rate(e.workload.precision))
                                    : ""));
  if (const std::vector<std::string> kinds = tf32_as_fp32(e); !kinds.empty())
    parts.push_back(fmt::format("tf32 run as fp32 on {} (no tf32 rate)", fmt::join(kinds, ", ")));
  const std::vector<std::string> classes = host_dispatch_classes(e.cluster);
  if (const std::vector<double> host = host_dispatch(e.cluster); !host.empty() || !classes.empty()) {
    std::string times;
    for (double h : host) times += (times.empty() ? "" : " / ") + format_time(h);
    std::string own;
    for (const std::string& c : classes) own += (own.empty() ? "" : ", ") + c;
    parts.push_back(fmt::format(
        "host {} per kernel launch{}, issued ahead of the GPU (kernel_dispatch; 0 for a run under a CUDA "
        "graph)",
        times.empty() ? format_time(0) : times, own.empty() ? "" : " (" + own + ")"));
  }
  if (const std::string engine = engine_note(e.cluster); !engine.empty()) parts.push_back(engine);
  for (const std::string& f : e.faults) parts.push_back("fault: " + f);
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

std::string engine_note(const Cluster& c) {
  if (!c.engine) return "";
  const CollectiveEngine& x = *c.engine;
  auto rate = [](double b) { return std::isfinite(b) ? format_bandwidth(b) : std::string("unbounded"); };
  return fmt::format("FPGA collective engine {} ({} per call, {} per message, {}; sends {})", x.name,
                     format_time(x.call), format_time(x.step), rate(x.bandwidth), rate(x.send_bandwidth));
}

nlohmann::json engine_json(const Cluster& c) {
  if (!c.engine) return nullptr;
  const CollectiveEngine& x = *c.engine;
  return {{"name", x.name},
          {"call_s", x.call},
          {"step_s", x.step},
          {"bandwidth_Bps", json_number(x.bandwidth)},
          {"send_bandwidth_Bps", json_number(x.send_bandwidth)}};
}

std::string nccl_note(const std::array<int32_t, 3>& picks) {
  const auto [tree, ring, merged] = picks;
  if (merged > 0)
    return fmt::format(
        "{} data-parallel all-reduces lowered as merged rings per NIC without NCCL's pick (above 2^22 "
        "stepped "
        "flows; docs/clusters.md)",
        merged);
  if (tree + ring > 0)
    return fmt::format(
        "the tree for {} of {} data-parallel all-reduces, the ring per NIC for {} (NCCL 2.21.5's model)",
        tree, tree + ring, ring);
  return "";
}

nlohmann::json nccl_json(const std::array<int32_t, 3>& picks) {
  const auto [tree, ring, merged] = picks;
  if (tree + ring + merged == 0) return nullptr;
  return {{"tree", tree}, {"ring_per_nic", ring}, {"merged_rings", merged}};
}

nlohmann::json assumptions_json(const Experiment& e) {
  const BlockAssumptions b = block_assumptions(e.workload);
  const auto [reserve, by_default] = reserve_of(e.cluster);
  const std::string_view recipe = fp8_recipe(e.workload.precision);
  auto of_blocks = [&](int n) {
    return b.blocks > 0 ? nlohmann::json(std::string(share(n, b.blocks))) : nlohmann::json();
  };
  return {
      {"fused_attention", of_blocks(b.fused_attention)},
      {"megatron_fusion", of_blocks(b.megatron_fusion)},
      {"allreduce", std::string(to_string(e.strategy.allreduce))},
      {"replica_mode", e.strategy.partitioner_options.round_robin ? "round-robin" : "split"},
      {"memory_reserve_bytes", json_number(reserve)},
      {"memory_reserve_default", by_default},
      {"gradient_reduce_bytes", json_number(gradient_bytes(e))},
      {"grad_accumulation", std::string(to_string(e.memory.grad_accumulation))},
      {"master_weight_bytes", e.memory.master_bytes > 0 ? json_number(e.memory.master_bytes) : nullptr},
      {"optimizer_moment_bytes", e.memory.moment_bytes > 0 ? json_number(e.memory.moment_bytes) : nullptr},
      {"activation_fp8_input_store", e.memory.activation_fp8_input_store && b.fused_gated > 0},
      {"padded_vocabulary",
       padded_vocabulary(e).second > 0 ? json_number(padded_vocabulary(e).second) : nlohmann::json()},
      {"fp8_recipe", recipe.empty() ? nlohmann::json() : nlohmann::json(std::string(recipe))},
      {"tf32_as_fp32", tf32_as_fp32(e)},
      {"mixed_adam_on_fp32", mixed_adam_on_fp32(e)},
      {"settings_without_effect",
       [&] {
         nlohmann::json keys = nlohmann::json::array();
         for (const auto& kv : settings_without_effect(e)) keys.push_back(kv.first);
         return keys;
       }()},
      {"collective_engine", engine_json(e.cluster)},
      {"kernel_dispatch_s", host_dispatch(e.cluster)},
      {"kernel_dispatch_classes", host_dispatch_classes(e.cluster)},
      {"recompute_modules", e.memory.recompute == Recompute::Selective
                                ? nlohmann::json(to_string(e.memory.modules))
                                : nlohmann::json()},
      {"tp_wgrad_overlap",
       e.strategy.tensor_parallel > 1 ? nlohmann::json(e.strategy.tp_wgrad_overlap) : nlohmann::json()},
      {"faults", e.faults}};
}

}  // namespace pipegrid::output
