// The workload: a DAG of layers (Boost.Graph) with per-layer costs.
//
// Costs are per sample (FLOPs, bytes moved, activation bytes) so that they scale with the
// micro-batch size; parameters are per model. A layer may instead (or also) carry measured times
// for one micro-batch on one device kind (trace-driven workloads, the synthetic chain); see cost.h
// for how a time is chosen.
#pragma once

#include <array>
#include <boost/graph/adjacency_list.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/result.h"

namespace pipegrid {

// Training precisions. FP32 .. INT8 and FP8 are arithmetic formats (a device has a peak rate and
// efficiencies for each); `amp` and `amp-bf16` are mixed precision: half-precision math and
// activations (fp16 or bf16) with fp32 master weights and optimizer state (Micikevicius et al., ICLR
// 2018). `tf32` stores fp32 and multiplies in TF32 on tensor cores (A100 and later; a device without a
// TF32 rate runs it at its fp32 rate). The fp8 trainings are amp-bf16 whose linear layers' GEMMs
// (Kernel::fp8) run in FP8, as Transformer Engine runs them, each GEMM's inputs quantized by one more
// memory-bound pass (core/device.cc): `fp8` with per-tensor current scaling (an amax pass, then the
// cast: 5 bytes per element), `fp8-blockwise` with DeepSeek-V3's 1x128 / 128x128 scales and `mxfp8`
// with Blackwell's 1x32 scales (the scale and the cast in one pass: 3 bytes per element).
enum class Precision {
  FP32,
  TF32,
  FP16,
  BF16,
  INT8,
  AMP,
  AMP_BF16,
  FP8,
  AMP_FP8,
  AMP_FP8_BLOCKWISE,
  AMP_MXFP8
};
inline constexpr int kPrecisionCount = 11;
// The precisions a workload trains in (`precision:`).
inline constexpr std::array<Precision, 10> kPrecisions = {
    Precision::FP32,     Precision::TF32,    Precision::FP16,
    Precision::BF16,     Precision::INT8,    Precision::AMP,
    Precision::AMP_BF16, Precision::AMP_FP8, Precision::AMP_FP8_BLOCKWISE,
    Precision::AMP_MXFP8};
// The formats a device has a peak rate and efficiencies for.
inline constexpr std::array<Precision, 6> kMathPrecisions = {
    Precision::FP32, Precision::TF32, Precision::FP16, Precision::BF16, Precision::INT8, Precision::FP8};
// An fp8 training (amp-bf16 with the GEMMs of Kernel::fp8 in FP8).
bool fp8_training(Precision p);
// Bytes per element an fp8 training's quantization of a GEMM input moves (read, amax, write).
double fp8_cast_bytes(Precision p);
// Kernels one such quantization launches (Transformer Engine v2.9 to v2.16, csrc/quantizer.cpp):
// per-tensor current scaling 3 (the amax, the scale from it, the cast), the block-scaled formats 1.
double fp8_quantize_kernels(Precision p);
// An fp8 training's GEMM rate relative to the device's fp8 figure: MXFP8's block-scaled GEMMs run at
// 6.812 / 7.161 = 0.951 of per-tensor fp8's (Transformer Engine's GEMM benchmark on a Blackwell B300,
// inputs pre-quantized, the 12 GEMMs of a 5B model's layer: docs/examples/gemm_profiling/
// gemm_profiling.rst at TransformerEngine 1609c890e); per-tensor and blockwise scales 1 (blockwise's
// kernel-only rate is not published there).
double fp8_gemm_rate(Precision p);

// Bytes per element of a GEMM input an fp8 training keeps for the backward: Transformer Engine saves
// only its column-wise quantized data (module/linear.py, grouped_linear.py, layernorm_linear.py at
// d0067d0): 1 byte, plus the scales (per-tensor current scaling: none to speak of; 1 x 128 blocks:
// 4 bytes per 128; MXFP8: 1 byte per 32).
double fp8_saved_bytes(Precision p);

// Bytes of an activation or a working weight (amp and the fp8 trainings: 2; tf32: 4).
double element_bytes(Precision p);
// The arithmetic format the math runs in: amp -> fp16, amp-bf16 and the fp8 trainings -> bf16 (their
// fp8 GEMMs are Kernel::fp8), the others themselves.
Precision math_precision(Precision p);
// True for amp, amp-bf16 and the fp8 trainings: fp32 master weights (4 bytes per parameter) besides the
// working copy.
bool mixed_precision(Precision p);
std::string_view to_string(Precision p);
// A training precision by its name (to_string of one of kPrecisions).
std::optional<Precision> parse_precision(std::string_view s);
// The names of kPrecisions, in order ("fp32", "tf32", ..., "mxfp8"), for parsers' choices.
std::vector<std::string_view> precision_names();
// "fp32, tf32, fp16, bf16, int8, amp, amp-bf16, fp8, fp8-blockwise or mxfp8", for messages.
std::string precision_choices();

// Times measured (or given) for one micro-batch of `batch` samples.
struct MeasuredCost {
  double forward_s = 0;
  double backward_s = 0;         // whole backward: input gradient + weight gradient
  double backward_weight_s = 0;  // the weight-gradient part of backward_s (0: not known / not split)
  double batch = 1;              // samples the times belong to
  std::string device_kind;       // device kind they were measured on; empty = valid on every device
};

// What kind of GPU/FPGA kernel a piece of work is: the cost model's efficiency table is indexed by
// it (with the device and the precision). Those of kComputeClasses are compute kernels (a fraction
// of the peak rate), the others memory-bound ones (a fraction of the memory bandwidth).
// GroupedGemm: the experts' GEMMs of a mixture-of-experts layer, one grouped kernel over the device's
// experts (TransformerEngine's GroupedLinear, Megatron's --moe-grouped-gemm); without an efficiency
// of its own it runs at the device's GEMM efficiency (DeepGEMM's published H800 figures: grouped
// GEMMs at 0.95-1.04x the dense GEMM's rate for the same per-group shape).
// Strided: PyTorch eager's element-wise kernels off its vectorised path (an operand that is a
// strided view or a broadcast, or mixed dtypes: ATen's unrolled and strided loops), such as the eager
// clamp and bias that Megatron-Core runs around GPT-OSS's experts. Compiled: an element-wise kernel
// that torch.compile generates for shapes that vary, with a reduction along the rows in its backward:
// the experts' weighted activation (Megatron-Core's jit_fuser). Both memory-bound; without a figure of
// their own they run at the device's element-wise one (docs/cost-model.md).
enum class KernelClass {
  Gemm,
  Conv,
  Attention,
  Recurrent,
  Gather,
  Elementwise,
  Norm,
  GroupedGemm,
  Strided,
  Compiled
};
inline constexpr int kKernelClassCount = 10;
inline constexpr std::array<KernelClass, kKernelClassCount> kKernelClasses = {
    KernelClass::Gemm,    KernelClass::Conv,        KernelClass::Attention, KernelClass::Recurrent,
    KernelClass::Gather,  KernelClass::Elementwise, KernelClass::Norm,      KernelClass::GroupedGemm,
    KernelClass::Strided, KernelClass::Compiled};
inline constexpr std::array<KernelClass, 5> kComputeClasses = {KernelClass::Gemm, KernelClass::Conv,
                                                               KernelClass::Attention, KernelClass::Recurrent,
                                                               KernelClass::GroupedGemm};
std::string_view to_string(KernelClass k);
std::optional<KernelClass> parse_kernel_class(std::string_view s);  // gemm, conv, attention, ...
// The class of a layer kind ("linear" -> gemm, "conv2d" -> conv, "lstm" -> recurrent, ...), for
// layers that carry no kernel list; unknown kinds with FLOPs are gemm, without FLOPs element-wise.
KernelClass kernel_class_of_kind(std::string_view kind, bool has_flops);

// One kernel (or group of similar kernels) that a layer's pass runs, in sequence with the layer's
// other kernels. FLOPs and streamed bytes are per sample, for all `calls` together; `calls` is the
// number of launches per pass (each pays the device's kernel startup), among which the FLOPs and
// streamed bytes are split evenly; `weight_bytes` are read by EACH call whatever the batch (a
// recurrent layer re-reads its recurrent weights every time step; four GEMMs of a Transformer
// block each read a quarter of its weights).
struct Kernel {
  KernelClass cls = KernelClass::Gemm;
  double forward_flops = 0;
  double backward_input_flops = 0;
  double backward_weight_flops = 0;
  double forward_bytes = 0;
  double backward_bytes = 0;
  double weight_bytes = 0;
  double calls = 1;
  // Host launches per pass when they differ from `calls` (0: one per call): a call that is several
  // launches on parallel streams (Transformer Engine's grouped GEMM, one cuBLAS call per expert over 4
  // streams) pays kernel_dispatch per launch on the host, kernel_startup per call on the device.
  double launches = 0;
  // A 3x3, stride-1, ungrouped convolution: a device whose convolution library runs such layers as
  // Winograd F(2x2, 3x3) in the math precision (DeviceSpec::winograd) does 16 multiplies per 2x2
  // output tile where direct convolution does 36 (Lavin and Gray, CVPR 2016): 2.25x fewer FLOPs in
  // each pass. The FLOP counts above stay the direct ones (the model's FLOPs).
  bool winograd = false;
  // Each call is one time step of a recurrent layer (one direction, one pass): the call also pays the
  // device's recurrent_step for its math precision (DeviceSpec::recurrent_step_s).
  bool recurrent_step = false;
  // A linear layer's GEMM that an fp8 training runs in FP8 (fp8_training): at the device's FP8 rate,
  // after quantizing its `fp8_in` input elements per sample (forward) and its `fp8_out` output
  // gradient elements (backward).
  bool fp8 = false;
  double fp8_in = 0, fp8_out = 0;
  // A grouped GEMM (launches > calls) whose fp8 input is quantized by one grouped kernel for all its
  // experts (Transformer Engine's group_quantize in the op fuser's fused grouped MLP) instead of one
  // quantization per expert (split_quantize).
  bool grouped_quantize = false;
};

// How a layer splits under Megatron-LM's tensor parallelism (Shoeybi et al., arXiv 1909.08053;
// Korthikanti et al., arXiv 2205.05198), over a group of t devices; see core/tensor_parallel.h.
enum class TensorSplitKind : unsigned char {
  Undefined,       // no defined split (convolution, recurrent, custom): an error under t > 1
  Input,           // the model's input: nothing to compute
  Replicated,      // every device of the group runs it whole (norms, element-wise, positions), or its
                   // 1/t of the sequence with sequence parallelism
  Transformer,     // attention (QKV column-parallel, heads split; output projection row-parallel) and
                   // MLP (column- then row-parallel)
  VocabEmbedding,  // rows split by vocabulary; the output all-reduced (reduce-scattered with SP)
  VocabHead,       // output head column-parallel over the vocabulary; cross-entropy over the split
  MoeBlock,        // a Transformer block whose MLP is a mixture of experts (TensorSplit::moe): attention
                   // as Transformer; the router, the experts split over an expert-parallel group
                   // (core/moe.h), optional shared experts as a tensor-parallel MLP
  ColumnGathered,  // a column-parallel linear whose output is all-gathered back to its whole width
                   // (Megatron's ColumnParallelLinear and gather_from_tensor_model_parallel_region: the
                   // MTP module's eh_proj); `sequence` tokens, `hidden` output columns, its input the
                   // layer's stash_bytes
};
std::string_view to_string(TensorSplitKind k);
// Transformer and MoE blocks: what the megatron partitioner spreads over the stages.
inline bool is_block(TensorSplitKind k) {
  return k == TensorSplitKind::Transformer || k == TensorSplitKind::MoeBlock;
}

// A mixture-of-experts MLP (Shazeer et al., arXiv 1701.06538; Megatron-Core's MoELayer): a router
// scores each token against `experts` experts and sends it to its `top_k` best; each routed expert is
// an MLP of width `expert_ffn` (gated like the block's MLP); `shared_ffn` > 0 adds shared experts that
// every token runs (DeepSeek-V2/V3: their total width).
struct MoeShape {
  double experts = 0;     // routed experts E (0: not an MoE block)
  double top_k = 0;       // experts per token k (<= E)
  double expert_ffn = 0;  // one routed expert's FFN width
  double shared_ffn = 0;  // the shared experts' FFN width, all together (0: none)
  bool sigmoid = false;   // router scores by sigmoid (DeepSeek-V3) instead of softmax
  // Group-limited routing (DeepSeek-V2/V3's n_group and topk_group; Megatron-Core's
  // --moe-router-num-groups, --moe-router-group-topk): each token's experts come from its top
  // `top_groups` of `groups` equal groups of consecutive experts (0: no limit).
  double groups = 0, top_groups = 0;
  // GPT-OSS's clamped GLU (Megatron-Core's activation_func_clamp_value): the experts' two GLU halves
  // clamped and concatenated in eager PyTorch before the fused activation (blocks::moe costs it).
  bool clamp = false;
};

// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434; DeepSeek-V3, arXiv 2412.19437): queries
// through a rank-`q_rank` down/up projection (0: a plain h x heads (nope + rope) projection), keys and
// values through a shared rank-`kv_rank` latent, plus a `rope_dim` decoupled rotary key per token
// (shared by the heads); per head: TensorSplit::head_dim (the non-rotary query/key part) + rope_dim for
// queries and keys, `v_dim` for values.
struct MlaShape {
  double q_rank = 0, kv_rank = 0, rope_dim = 0, v_dim = 0;
  bool enabled() const { return kv_rank > 0; }
};

// The shapes the split needs (per sample: `sequence` tokens). Zero where the kind does not use it.
struct TensorSplit {
  TensorSplitKind kind = TensorSplitKind::Undefined;
  double sequence = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocabulary = 0;
  bool gated = false;            // gated MLP (SwiGLU: gate and up matrices, then down)
  bool biases = true;            // GEMM biases (GPT, BERT); none in Llama
  bool rotary = false;           // rotary position embedding applied to queries and keys
  bool fused_attention = false;  // FlashAttention (workload `attention: fused`, core/models/builder.h)
  // Megatron-LM's fused element-wise kernels (workload `kernel_fusion: megatron`): scale, mask and
  // softmax as one kernel, bias, dropout and residual addition as one.
  bool megatron_fusion = false;
  double head_dim = 0;  // width of one attention head (Megatron's kv_channels); 0: hidden / heads
  MoeShape moe;         // MoeBlock: the experts
  MlaShape mla;         // multi-head latent attention instead of (grouped-query) attention
  // Causal self-attention whose kernels skip the masked half of the scores (FlashAttention with a
  // causal mask): the core's FLOPs are halved. Set by fused attention on decoder blocks (use_attention:
  // GPT, Llama; unfused attention computes every score, then masks) and by the MoE zoo models.
  bool causal = false;
  // Sliding-window attention: each query attends to the last `window` keys (0: all); GPT-OSS
  // alternates such blocks with full ones.
  double window = 0;
  // (Last, after the fields that positional initialisations set.) The norms' bias beside their scale
  // where `biases`: LayerNorm's (GPT, BERT); RMSNorm has none (the MoE zoo's models, GPT-OSS's biased
  // GEMMs included).
  bool norm_biases = true;
  bool attention_sinks = false;  // GPT-OSS: one learned logit per head (its parameters; no work)
  // Qwen3's per-head RMSNorm of the queries and the keys after QKV, before the rotary embedding
  // (q_norm, k_norm of head_dim each; Megatron-Core's qk_layernorm): two norm kernels each way.
  bool qk_norm = false;
};

struct Layer {
  std::string name;
  std::string kind;         // "linear", "conv2d", "chain", "input", or a profiled module's class
  std::string description;  // free text (a profiled module's description)
  // Per sample.
  double forward_flops = 0;
  double backward_input_flops = 0;
  double backward_weight_flops = 0;
  double forward_bytes = 0;   // memory traffic of the forward pass (memory-bound layers)
  double backward_bytes = 0;  // memory traffic of the whole backward pass
  double output_bytes = 0;    // activation output: what a consumer in another stage receives
  double stash_bytes = 0;     // kept from the forward until the backward (freed after it)
  // Selective recomputation (Korthikanti et al.): what the layer stashes instead (< 0: the same as
  // stash_bytes, i.e. nothing to recompute) and the fraction of its forward the backward re-runs.
  double selective_stash_bytes = -1;
  double selective_recompute_fraction = 0;
  // Per model.
  double parameters = 0;       // count
  double parameter_bytes = 0;  // bytes of the weights in the training precision
  // Memory traffic of each pass that does not grow with the batch: the weights read once per
  // micro-batch by the forward and the input-gradient pass, the weight gradient written once by
  // the weight-gradient pass (dense layers: parameter_bytes; gathers such as embeddings: 0, their
  // rows are in the per-sample bytes). It is what makes small micro-batches memory-bound.
  double weight_bytes = 0;
  // The kernels the layer runs, when the builder knows them (zoo models, model files): the cost
  // model times each and adds them up. The per-layer totals above are then their sums (the
  // weight bytes of the first kernel that has weights). Empty: one kernel of the layer's kind's
  // class with the totals above.
  std::vector<Kernel> kernels;
  std::optional<MeasuredCost> measured;
  TensorSplit split;  // how it splits under tensor parallelism
  // A layer that computes with another layer's weight (a language-model head tied to the token
  // embedding): that layer's vertex, and the shared weight's parameters as this layer would hold them
  // (split as its own under tensor parallelism). `parameters` leaves them out: they count once, at
  // `tied_to`. A device holding this layer but not `tied_to` keeps a copy, with its gradient, optimizer
  // state and step, and all-reduces the copy's gradient with the devices holding `tied_to`
  // (Megatron-Core's output-layer copy on the last pipeline stage; core/stage_costs.h). -1: none.
  int tied_to = -1;
  double tied_parameters = 0;
  // A layer of a multi-token-prediction module (DeepSeek-V3, arXiv 2412.19437 section 2.2; Megatron-Core's
  // --mtp-num-layers): after the model's last block, on the last pipeline stage, outside the blocks
  // Megatron's --num-layers counts (is_layout_block).
  bool multi_token_prediction = false;
};

// The blocks Megatron's --num-layers counts and its partitioner spreads over the stages: transformer
// and MoE blocks, except a multi-token-prediction module's (which is_block still calls a block for its
// costs, splits and recomputation).
inline bool is_layout_block(const Layer& l) {
  return is_block(l.split.kind) && !l.multi_token_prediction;
}

// The layer's kernels, or one kernel of its kind's class carrying its totals when it has none.
std::vector<Kernel> layer_kernels(const Layer& l);

using LayerGraph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Layer>;

struct Workload {
  std::string name;
  LayerGraph graph;
  Precision precision = Precision::FP32;
  double micro_batch_size = 1;  // default samples per micro-batch
  // One optimizer step on any device. Negative: modelled from the parameters each device holds,
  // the optimizer and the device's memory bandwidth (see optimizer_step_time in device.h).
  double optimizer_step_s = 0;
  double input_bytes_per_sample = 0;  // the model's input (what stage 0 receives)

  size_t layer_count() const { return boost::num_vertices(graph); }
  const Layer& layer(size_t i) const { return graph[i]; }
  int add_layer(Layer layer) { return static_cast<int>(boost::add_vertex(std::move(layer), graph)); }
  void add_edge(int from, int to) { boost::add_edge(from, to, graph); }
};

// The most layers a workload may have (a chain's `layers`, a zoo model's graph, a model file, a
// profile): 2^17 = 131,072, 100x the largest built-in model's graph; checked as layers are added, so a
// model above it is an error before it takes memory (a layer and its edges cost about 1 KB).
inline constexpr int kMaxLayers = 131072;

// Fails if the layer graph has a cycle; the message names one ("a -> b -> c -> a").
// On a cycle, `closing_edge` (if given) receives the edge (from, to) whose traversal found it.
Status check_acyclic(const Workload& w, std::pair<int, int>* closing_edge = nullptr);

// A topological order; ties are broken by layer index (so builders that add layers in
// topological order get them back unchanged). Precondition: acyclic.
std::vector<int> topological_order(const Workload& w);

// Adds `from`'s FLOPs, memory traffic and stash (per sample) and its parameters, parameter bytes and
// weight bytes (per model) to `into`, as merging layers into one does (graphpipe's chains, a fused
// backend group); the output, kernels, selective recomputation and measured times are each merge's.
void add_layer_totals(Layer& into, const Layer& from);

// Totals over all layers (per sample / per model).
double total_parameters(const Workload& w);
double total_parameter_bytes(const Workload& w);
// The bytes of `parameters` of a tied layer's shared weight (Layer::tied_to), at its source's bytes per
// parameter (the workload's element size where the source holds none).
double tied_bytes(const Workload& w, const Layer& tied, double parameters);
double total_forward_flops(const Workload& w);

}  // namespace pipegrid
