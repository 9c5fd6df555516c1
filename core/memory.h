// Memory accounting: static state per parameter, by optimizer.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace pipegrid {

enum class MemoryCategory : unsigned char { Weights, Gradients, OptimizerState, Activations, Workspace };
inline constexpr int kMemoryCategoryCount = 5;
std::string_view to_string(MemoryCategory c);

using MemoryBytes = std::array<double, kMemoryCategoryCount>;
inline double total(const MemoryBytes& m) {
  double s = 0;
  for (double x : m) s += x;
  return s;
}

enum class Optimizer {
  SGD,        // weights + gradients
  Momentum,   // + one momentum buffer
  Adam,       // + two moments, all in the weights' precision (16 B/parameter in fp32)
  MixedAdam,  // mixed precision: fp16 weights and gradients + fp32 master weights, m and v = 16 B/parameter
};
std::string_view to_string(Optimizer o);
std::optional<Optimizer> parse_optimizer(std::string_view s);  // sgd, momentum, adam, mixed-adam
// State tensors the optimizer keeps per parameter besides weights and gradients: SGD 0, momentum 1,
// Adam and mixed-precision Adam 2 (m and v).
int optimizer_state_tensors(Optimizer o);

// How the optimizer step runs: fused (one element-wise kernel over every tensor, as apex's
// FusedAdam or FusedLAMB) or unfused (PyTorch's torch.optim loop before 2.0: one kernel per
// arithmetic operation and tensor, each reading and writing whole tensors).
enum class OptimizerKernels { Fused, Unfused };

// How a micro-batch's weight gradients join those of the step's earlier micro-batches:
//  - fused (the default): the weight-gradient GEMM accumulates into the gradient buffer itself
//    (Megatron-Core's gradient_accumulation_fusion, on by default; Megatron-LM from 2022-02-13 where
//    gradients accumulate in fp32): no pass of its own;
//  - unfused: PyTorch's AccumulateGrad, `grad += new_grad`, one element-wise kernel per parameter
//    tensor for every micro-batch after the step's first (PyTorch DDP under no_sync; Megatron-LM
//    in fp16 without contiguous buffers, as in 2021);
//  - main-grad: Megatron-LM's local DDP with contiguous buffers (the default from 2021-2022 until
//    Megatron-Core): a hook adds each parameter's gradient into its main_grad buffer, one kernel per
//    tensor for every micro-batch, the first included.
// Each kernel reads the accumulator and the new gradient and writes the accumulator
// (core/device.h, grad_accumulation_time).
enum class GradAccumulation { Fused, Unfused, MainGrad };
std::string_view to_string(GradAccumulation g);
std::optional<GradAccumulation> parse_grad_accumulation(std::string_view s);  // fused, unfused, main-grad

enum class Recompute {
  None,       // every layer stashes its activations from F to B
  Full,       // a stage stashes only its input; its backward re-runs the forward first
  Selective,  // layers stash selective_stash_bytes and re-run selective_recompute_fraction of F
};
std::string_view to_string(Recompute r);
std::optional<Recompute> parse_recompute(std::string_view s);  // none, full, selective

// What selective recomputation re-runs in a transformer block: Megatron-Core's recompute_modules
// (--recompute-modules; megatron/core/transformer/transformer_config.py), default {core_attn}.
// core_attn: the attention core (its score tensor not stashed; Korthikanti et al.'s selective);
// layernorm: the norms Megatron-Core keeps apart from a GEMM (MLA's input norm, a MoE block's
// pre-MLP norm; Transformer Engine fuses the others into their GEMM), their outputs discarded;
// moe_act: the experts' activation, its output (the second GEMM's input) discarded; mla_up_proj:
// MLA's up projections and rotary embedding, Q, K and V discarded; mlp: a dense block's MLP from
// its input; shared_experts: a MoE block's shared experts from their input. The last two re-run the
// MLP's tensor-parallel all-gather too, which is not modelled: at t > 1 they are refused. Megatron's
// `moe` (the whole MoE layer with its dispatch) is not modelled.
struct RecomputeModules {
  bool core_attn = true, layernorm = false, moe_act = false, mla_up_proj = false, mlp = false,
       shared_experts = false;
  bool operator==(const RecomputeModules&) const = default;
};
// The module names as Megatron-Core spells them, in its documented order.
inline constexpr std::array<std::string_view, 6> kRecomputeModuleNames = {
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "shared_experts"};
bool* module_flag(RecomputeModules& m, std::string_view name);  // null: not a module name
std::string to_string(const RecomputeModules& m);               // "core_attn, moe_act", or "none"

struct MemoryOptions {
  Optimizer optimizer = Optimizer::Adam;
  // Overrides the optimizer: total static bytes per parameter (weights + gradients + state).
  std::optional<double> bytes_per_parameter;
  Recompute recompute = Recompute::None;
  RecomputeModules modules;  // what selective recomputation re-runs
  // ZeRO stage 1: the optimizer state of a replicated stage is sharded across its replicas.
  bool zero1 = false;
  // Mixed precision (amp, amp-bf16): the optimizer keeps fp32 master weights and fp32 state
  // (4 bytes per parameter each) beside the half-precision working weights and gradients.
  bool mixed_precision = false;
  OptimizerKernels optimizer_kernels = OptimizerKernels::Fused;  // the step's time only
  // Unfused only: element-wise passes over a parameter-sized tensor per step, counted from the
  // training script's own loop (0: torch.optim's count for the optimizer, core/device.h).
  int optimizer_passes = 0;
  GradAccumulation grad_accumulation = GradAccumulation::Fused;  // the backward's time only
  // Bytes of each optimizer state tensor (Adam's m and v, momentum's buffer); 0: 4 under mixed
  // precision, the weights' element size otherwise. `optimizer_moments: bf16` gives 2: DeepSeek-V3's
  // AdamW moments (arXiv 2412.19437, section 3.3.3), Megatron-Core's exp_avg_dtype and
  // exp_avg_sq_dtype under --use-precision-aware-optimizer (optimizer_config.py, core_v0.15.0).
  double moment_bytes = 0;
  // Bytes per parameter of a mixed-precision optimizer's master weights; 0: 4 (fp32). 2 with
  // `master_weights: remainders`: Transformer Engine's FusedAdam with store_param_remainders keeps
  // only the 16 low bits of each fp32 master weight and rebuilds it from the bf16 working weight
  // (optimizers/fused_adam.py, v2.9: "Works only when param type is BF16 and master weight type is
  // FP32"); Megatron-Core passes store_param_remainders (default true) under
  // --use-precision-aware-optimizer, which Megatron-Bridge's performance scripts set for bf16 runs.
  double master_bytes = 0;
  // Bytes per parameter of the gradient buffer when the gradients are reduced in another precision
  // than the working weights' (strategy.gradient_reduce); 0: the weights'. Megatron-Core's DDP keeps
  // its buffer in the precision it reduces in (distributed_data_parallel.py, core_v0.15.0: torch.float
  // under grad_reduce_in_fp32, else the parameter's dtype); the buffer is never narrower than the
  // weights (a bf16 reduction of fp32 gradients compresses the communication only). Set from the
  // strategy's gradient_reduce_bytes by the experiment parser, as mixed_precision from the workload.
  double gradient_bytes = 0;
  // Megatron-Core's activation_func_fp8_input_store (transformer_config.py, core_v0.15.0): a gated
  // MLP's activation (the fused SwiGLU, GPT-OSS's quick-GEGLU; dense, shared and routed experts) saves
  // its input for the backward cast to fp8 e4m3, 1 byte an element, not 2 (fused_bias_swiglu.py:
  // `input.to(torch.float8_e4m3fn)`). Not where selective recomputation re-runs the activation: the
  // checkpoint keeps the bf16 input (CheckpointWithoutOutput in experts.py); not non-gated GELU.
  bool activation_fp8_input_store = false;
};

// Static bytes for `parameters` parameters whose weights take `parameter_bytes` bytes.
MemoryBytes static_memory(double parameters, double parameter_bytes, const MemoryOptions& o);

}  // namespace pipegrid
