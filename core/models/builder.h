// Building layer DAGs from shapes: every layer kind derives its per-sample costs (FLOPs, bytes
// moved, output, stash) and its parameters from its shape parameters and its inputs' shapes.
// The model zoo and user model files (YAML) both build through this class, so a layer costs the
// same wherever it is described.
//
// Conventions (per sample; FLOP = 2 x MAC):
//  - shapes exclude the batch dimension: {C, H, W} for images, {T, F} for sequences, {F} vectors;
//  - a layer stashes its output for the backward (the next layer's backward needs it as input),
//    except where a kind says otherwise (LSTM: its gates and states; transformer blocks:
//    Korthikanti et al.'s s h (34 + 5 a s / h) bytes at 16 bits, scaled by element size / 2);
//  - the backward's FLOPs split into the input-gradient and weight-gradient parts: for a layer
//    with weights both equal the forward's weighted FLOPs; weight-free work (attention scores,
//    element-wise) is all input gradient, twice the forward;
//  - element-wise, pooling, normalisation, concatenation and embedding lookups are memory-bound:
//    no FLOPs counted (published FLOP counts count multiply-adds only), bytes read and written.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

using Shape = std::vector<int64_t>;

// How a Transformer's attention core runs: unfused (the default, as every published row of
// experiments/validation ran: the scores go to memory, then scale, mask, softmax and dropout each
// pass over them, forward and backward) or fused (FlashAttention: one kernel per pass, the scores
// stay on chip and the backward recomputes Q K^T).
enum class AttentionImpl { Unfused, Fused };
// Rewrites the attention core of every transformer_block and self-attention layer of `w` for `impl`
// (Unfused: no change; Fused: one kernel per pass, no score traffic, the backward recomputes Q K^T;
// a decoder block's causal mask skips half the core's FLOPs, as FlashAttention skips the masked blocks).
// An error for `fused` when `w` has no attention core to fuse.
Status use_attention(Workload& w, AttentionImpl impl);
// Megatron-LM's fused element-wise kernels (its defaults: --masked-softmax-fusion,
// --bias-dropout-fusion; bias-GeLU is one kernel here either way) in every Transformer block of
// `w` (transformer_block, decoder_block): scale, mask and softmax one kernel, bias, dropout and
// residual addition one kernel. The blocks' kernels are rebuilt from their split as tensor
// parallelism builds them (core/tensor_parallel.h: the same totals, unfused), keeping
// FlashAttention (apply after use_attention). An error when `w` has no Transformer block (the
// kernels of other layer kinds are not rewritten).
Status use_megatron_fusion(Workload& w);
// The reverse, for blocks built fused (the MoE zoo's, as Megatron-Core runs them): every element-wise
// kernel its own (workload `kernel_fusion: none`). Blocks built unfused are left as they are.
void use_unfused_elementwise(Workload& w);
// Rebuilds the MoE blocks' kernels with these MoE options (MoeOptions: router_fusion, permute_fusion,
// fused_grouped_mlp), as a stage without tensor, context or expert parallelism costs them (grouped
// stages build theirs from the options).
void use_moe_kernels(Workload& w, bool router_fusion, bool permute_fusion, bool fused_grouped_mlp);
// The most elements a tensor may have per sample (8 PB in fp64): larger shapes are input errors,
// so every derived count stays exact in double and fits int64.
inline constexpr double kMaxElements = 1e15;
std::string shape_text(const Shape& s);  // "[3, 224, 224]"

class ModelBuilder {
 public:
  ModelBuilder(std::string name, Precision precision);

  Precision precision() const { return w_.precision; }
  const Shape& shape(int layer) const { return shapes_.at(layer); }
  const std::string& name(int layer) const { return w_.layer(layer).name; }
  double parameters(int layer) const { return w_.layer(layer).parameters; }
  size_t size() const { return w_.layer_count(); }

  // A zero-cost layer standing for the model's input (its output is the input tensor).
  int input(const std::string& name, Shape shape);

  // `tied_to` >= 0: the weight matrix is that layer's (a language-model head tied to the token
  // embedding, counted there; Layer::tied_to): the GEMM reads it, only the bias is this layer's
  // parameters.
  Result<int> linear(const std::string& name, int in, int64_t in_features, int64_t out_features,
                     bool bias = true, int tied_to = -1);
  struct Conv {
    int64_t in_channels = 0, out_channels = 0, kernel = 3, stride = 1, padding = 0, groups = 1;
    bool bias = true;
    bool batchnorm = false;  // fused BatchNorm: 2 parameters per output channel
    bool relu = false;       // fused ReLU
    // BatchNorm and ReLU as one kernel each way (cuDNN's BN-activation, MXNet's --fuse-bn-relu,
    // XLA's fusion of the expanded BatchNorm): the ReLU's own kernel and memory passes go.
    bool fused_bn_relu = false;
  };
  Result<int> conv2d(const std::string& name, int in, const Conv& c);
  // BatchNorm of `in` (2 parameters per channel), plus `residual`, then ReLU, as one kernel each
  // way (cuDNN's BN-add-activation, MXNet's --fuse-bn-add-relu, XLA's fusion).
  Result<int> batchnorm_add_relu(const std::string& name, int in, int residual);
  Result<int> pool(const std::string& name, int in, int64_t kernel, int64_t stride, int64_t padding = 0);
  Result<int> adaptive_pool(const std::string& name, int in, int64_t out_h, int64_t out_w);
  Result<int> norm(const std::string& name, int in,
                   bool layernorm);  // batchnorm: per channel; layernorm: per feature
  Result<int> elementwise(const std::string& name, const std::string& kind,
                          int in);  // relu, gelu, dropout, ...
  Result<int> add(const std::string& name, const std::vector<int>& in);
  Result<int> concat(const std::string& name, const std::vector<int>& in);  // along the last dimension
  Result<int> flatten(const std::string& name, int in);
  Result<int> lstm(const std::string& name, const std::vector<int>& in, int64_t hidden, bool bidirectional);
  Result<int> attention(const std::string& name, const std::vector<int>& in, int64_t heads);
  Result<int> transformer_block(const std::string& name, int in, int64_t heads, int64_t ffn);
  // Marks layer `id`'s attention causal (a decoder's mask): fused attention then skips the masked half.
  void mark_causal(int id) { w_.graph[static_cast<size_t>(id)].split.causal = true; }
  // Marks layer `id` as part of a multi-token-prediction module (Layer::multi_token_prediction).
  void mark_multi_token_prediction(int id) {
    w_.graph[static_cast<size_t>(id)].multi_token_prediction = true;
  }
  // A decoder block of the Llama family (or any shape `s` describes: grouped-query attention with
  // s.kv_heads and s.head_dim, or multi-head latent attention (s.mla), a gated MLP, rotary
  // embeddings, biases or not, RMSNorm when without biases), costed by the same per-kernel formulas
  // as its tensor-parallel split (core/tensor_parallel.h). With s.kind MoeBlock, its MLP is s.moe's
  // mixture of experts (kind "moe_block"; costed on one device holding every expert, balanced).
  Result<int> decoder_block(const std::string& name, int in, const TensorSplit& s);
  // A token embedding: gathers `dim` values per token from a vocabulary x dim table. `tied_to` >= 0:
  // the table is that layer's (counted there; Layer::tied_to): the lookup's traffic, no parameters.
  Result<int> embedding(const std::string& name, int in, int64_t vocabulary, int64_t dim, int tied_to = -1);
  // Softmax cross-entropy over the last dimension (a vocabulary's logits): memory-bound passes over
  // the logits, in fp32 under mixed precision (PyTorch autocast runs log_softmax and the loss in
  // float32); output: one loss value per sample.
  Result<int> softmax_loss(const std::string& name, int in);
  // Looks up `bag` rows of a rows x dim table per sample; pooled (sum) to dim or kept (bag x dim).
  Result<int> embedding_bag(const std::string& name, int in, int64_t rows, int64_t dim, int64_t bag,
                            bool pooled);
  // A layer with explicit costs (per sample) and an explicit output shape.
  Result<int> custom(const std::string& name, const std::vector<int>& in, const Layer& costs, Shape output);

  // The workload; precondition: at least one layer. The builder is left empty.
  Workload finish(double default_micro_batch_size = 1);

 private:
  // Fails when the model already has kMaxLayers layers (input layers count, but are added regardless).
  Result<int> add_layer(Layer l, Shape out, const std::vector<int>& in);
  int push_layer(Layer l, Shape out, const std::vector<int>& in);
  double elems(const Shape& s) const;
  double bytes(const Shape& s) const { return elems(s) * element_bytes(w_.precision); }
  Error mismatch(const std::string& name, const std::string& expected, int in) const;

  Workload w_;
  std::vector<Shape> shapes_;
};

}  // namespace pipegrid
