#include "core/models/zoo.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "core/models/builder.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

// Builder errors inside a model definition (bad parameters such as heads not dividing hidden)
// unwind to build_model, which returns them as values.
struct BuildError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int must(Result<int> r) {
  if (!r) throw BuildError(r.error().message);
  return *r;
}

int64_t arg(const ModelArgs& a, std::string_view key) {
  auto it = a.find(key);
  return static_cast<int64_t>(std::llround(it->second));
}

// VGG-16 (torchvision "D"): 13 3x3 convolutions (ReLU fused), 5 max-pools, 3 fully connected.
Result<Workload> build_vgg16(const ModelArgs& a, Precision p) {
  ModelBuilder b("vgg16", p);
  const int64_t img = arg(a, "image");
  int x = b.input("input", {3, img, img});
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  int64_t ch = 3;
  int conv = 0, pool = 0;
  for (int c : cfg) {
    if (c == 0) {
      x = must(b.pool(fmt::format("pool{}", ++pool), x, 2, 2));
    } else {
      x = must(b.conv2d(fmt::format("conv{}", ++conv), x, {ch, c, 3, 1, 1, 1, true, false, true}));
      ch = c;
    }
  }
  x = must(b.adaptive_pool("avgpool", x, 7, 7));
  x = must(b.flatten("flatten", x));
  x = must(b.linear("fc6", x, 512 * 7 * 7, 4096));
  x = must(b.linear("fc7", x, 4096, 4096));
  must(b.linear("fc8", x, 4096, arg(a, "classes")));
  return b.finish();
}

// ResNet-50 v1.5 (torchvision): bottlenecks [3, 4, 6, 3], stride on the 3x3 convolution,
// BatchNorm (and ReLU where applicable) in each convolution's layer; residuals are DAG edges.
// fused_bn_relu = 1: BatchNorm + ReLU and BatchNorm + add + ReLU run as one kernel each way, as
// MXNet's --fuse-bn-relu / --fuse-bn-add-relu and XLA's fusion of the expanded BatchNorm do;
// 0 (default): separate kernels, as PyTorch eager runs them.
Result<Workload> build_resnet50(const ModelArgs& a, Precision p) {
  ModelBuilder b("resnet50", p);
  const int64_t img = arg(a, "image");
  const bool fused = arg(a, "fused_bn_relu") != 0;
  int x = b.input("input", {3, img, img});
  x = must(b.conv2d("conv1", x, {3, 64, 7, 2, 3, 1, false, true, true, fused}));
  x = must(b.pool("maxpool", x, 3, 2, 1));
  int64_t in = 64;
  const int blocks[] = {3, 4, 6, 3};
  const int64_t widths[] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int i = 0; i < blocks[stage]; ++i) {
      const int64_t w = widths[stage];
      const int64_t stride = (stage > 0 && i == 0) ? 2 : 1;
      const std::string n = fmt::format("layer{}.{}", stage + 1, i);
      int c1 = must(b.conv2d(n + ".conv1", x, {in, w, 1, 1, 0, 1, false, true, true, fused}));
      int c2 = must(b.conv2d(n + ".conv2", c1, {w, w, 3, stride, 1, 1, false, true, true, fused}));
      int c3 = must(b.conv2d(n + ".conv3", c2, {w, 4 * w, 1, 1, 0, 1, false, !fused, false}));
      int skip = x;
      if (i == 0)
        skip = must(b.conv2d(n + ".downsample", x, {in, 4 * w, 1, stride, 0, 1, false, true, false}));
      if (fused) {
        x = must(b.batchnorm_add_relu(n + ".bn3_add_relu", c3, skip));
      } else {
        int sum = must(b.add(n + ".add", {c3, skip}));
        x = must(b.elementwise(n + ".relu", "relu", sum));
      }
      in = 4 * w;
    }
  }
  x = must(b.adaptive_pool("avgpool", x, 1, 1));
  x = must(b.flatten("flatten", x));
  must(b.linear("fc", x, 2048, arg(a, "classes")));
  return b.finish();
}

// GNMT (Wu et al. 2016, the MLPerf / PipeDream variant): `layers` LSTM layers per side; the
// first encoder layer is bidirectional; residual connections from the third layer on; the
// decoder's first layer feeds a normalised additive attention over the encoder's output, whose
// context joins the input of every later decoder layer. GNMT-8 = 4 + 4 layers, GNMT-16 = 8 + 8.
// `shared_embedding` 1: the decoder looks its tokens up in the encoder's table (NVIDIA's GNMT v2,
// DeepLearningExamples, `--share-embedding`, its default): the decoder's lookup keeps its traffic and
// has no parameters of its own, as a tied language-model head (build_gpt; a copy on devices without
// the encoder's table, Layer::tied_to). PipeDream's GNMT has two
// tables (its profile lists two 32320 x 1024 embeddings), the default 0.
Result<Workload> build_gnmt(const ModelArgs& a, Precision p) {
  const int64_t layers = arg(a, "layers"), h = arg(a, "hidden"), vocab = arg(a, "vocabulary");
  ModelBuilder b(fmt::format("gnmt{}", 2 * layers), p);
  if (layers < 2) throw BuildError("gnmt needs at least 2 layers per side");
  int src = b.input("source", {arg(a, "source_length")});
  const int table = must(b.embedding("encoder.embedding", src, vocab, h));
  int x = table;
  x = must(b.lstm("encoder.lstm1", {x}, h, true));
  x = must(b.lstm("encoder.lstm2", {x}, h, false));
  for (int64_t i = 3; i <= layers; ++i) {
    int l = must(b.lstm(fmt::format("encoder.lstm{}", i), {x}, h, false));
    x = must(b.add(fmt::format("encoder.residual{}", i), {l, x}));
  }
  const int memory = x;
  int tgt = b.input("target", {arg(a, "target_length")});
  int y = must(b.embedding("decoder.embedding", tgt, vocab, h, arg(a, "shared_embedding") != 0 ? table : -1));
  y = must(b.lstm("decoder.lstm1", {y}, h, false));
  const int context = must(b.attention("decoder.attention", {y, memory}, 1));
  y = must(b.lstm("decoder.lstm2", {y, context}, h, false));
  for (int64_t i = 3; i <= layers; ++i) {
    int l = must(b.lstm(fmt::format("decoder.lstm{}", i), {y, context}, h, false));
    y = must(b.add(fmt::format("decoder.residual{}", i), {l, y}));
  }
  y = must(b.linear("classifier", y, h, vocab));
  must(b.softmax_loss("loss", y));  // over the vocabulary at every target position
  return b.finish();
}

// The parameters and traffic of a learned position table of `rows` positions (and LayerNorm) next to
// a token embedding, of which a sequence looks up `looked_up`.
Layer position_table(double rows, double looked_up, double h, Precision p, double extra_params) {
  Layer l;
  l.kind = "embedding";
  l.parameters = rows * h + extra_params;
  l.parameter_bytes = l.parameters * element_bytes(p);
  l.forward_bytes = 3 * looked_up * h * element_bytes(p);
  l.backward_bytes = l.forward_bytes;
  return l;
}

// BERT-Large style encoder: token, position and type embeddings with LayerNorm, `layers`
// Transformer blocks (FFN 4h), pooler. The position table has `positions` rows (BERT's
// max_position_embeddings, 512) whatever the sequence, which may not exceed it. `mlm_positions` > 0 adds the
// pre-training heads (Devlin et al., NAACL 2019; BertPreTrainingHeads in NVIDIA's DeepLearningExamples): the
// masked-LM head runs on that many positions per sequence (a dense h x h with GeLU, a LayerNorm, the
// vocabulary projection tied to the token embedding with its own bias, softmax cross-entropy over the
// vocabulary) and the next-sentence head (h x 2) on the pooled token. Fewer positions than the sequence are
// first gathered from it (TensorFlow's gather_indexes of max_predictions_per_seq positions, PyTorch's dense
// sequence output); all of them, as PyTorch's code ran it before the dense output. 0 (the default): no
// pre-training heads (fine-tuning heads such as SQuAD's h x 2 span head are left out).
Result<Workload> build_bert(const ModelArgs& a, Precision p) {
  const int64_t L = arg(a, "layers"), h = arg(a, "hidden"), heads = arg(a, "heads"), s = arg(a, "sequence"),
                vocab = arg(a, "vocabulary"), mlm = arg(a, "mlm_positions"), rows = arg(a, "positions");
  if (mlm > s) throw BuildError(fmt::format("mlm_positions ({}) must be at most the sequence ({})", mlm, s));
  if (s > rows)
    throw BuildError(
        fmt::format("sequence ({}) must be at most positions, the position table's rows ({})", s, rows));
  ModelBuilder b("bert", p);
  int x = b.input("tokens", {s});
  x = must(b.embedding("embedding.words", x, vocab, h));
  const int words = x;
  Layer pos = position_table(static_cast<double>(rows), static_cast<double>(s), static_cast<double>(h), p,
                             2.0 * h + 2.0 * h);
  x = must(b.custom("embedding.position_type_norm", {x}, pos, {s, h}));
  for (int64_t i = 0; i < L; ++i) x = must(b.transformer_block(fmt::format("layer{}", i), x, heads, 4 * h));
  const int encoded = x;
  Layer pooler;
  pooler.kind = "linear";
  pooler.forward_flops = 2.0 * h * h;
  pooler.backward_input_flops = pooler.forward_flops;
  pooler.backward_weight_flops = pooler.forward_flops;
  pooler.parameters = static_cast<double>(h) * h + h;
  pooler.parameter_bytes = pooler.parameters * element_bytes(p);
  pooler.stash_bytes = h * element_bytes(p);
  const int pooled = must(b.custom("pooler", {x}, pooler, {h}));
  if (mlm == 0) return b.finish();
  int m = encoded;
  if (mlm < s) {
    // index_select of the masked rows: reads and writes them; backward scatters their gradient
    // into a zeroed sequence-sized one.
    Layer gather;
    gather.kind = "index_select";
    gather.forward_bytes = 2.0 * mlm * h * element_bytes(p);
    gather.backward_bytes = (2.0 * mlm * h + static_cast<double>(s) * h) * element_bytes(p);
    m = must(b.custom("mlm.gather", {m}, gather, {mlm, h}));
  }
  m = must(b.linear("mlm.transform", m, h, h));
  m = must(b.elementwise("mlm.gelu", "gelu", m));
  m = must(b.norm("mlm.norm", m, true));
  m = must(b.linear("mlm.decoder", m, h, vocab, true, words));
  m = must(b.softmax_loss("mlm.loss", m));
  const int nsp = must(b.linear("nsp", pooled, h, 2));
  Layer sum;  // the two losses added: one scalar each
  sum.kind = "add";
  must(b.custom("loss", {m, nsp}, sum, {1}));
  return b.finish();
}

// GPT-style decoder: token embedding and learned positions, `layers` Transformer blocks (FFN 4h),
// a final LayerNorm and a language-model head tied to the token embedding (`tied_embeddings` 1, GPT-2's
// and Megatron-LM's default) or with weights of its own (0: --untie-embeddings-and-output-weights).
Result<Workload> build_gpt(const ModelArgs& a, Precision p) {
  const int64_t L = arg(a, "layers"), h = arg(a, "hidden"), heads = arg(a, "heads"), s = arg(a, "sequence"),
                vocab = arg(a, "vocabulary");
  ModelBuilder b("gpt", p);
  int x = b.input("tokens", {s});
  x = must(b.embedding("embedding.words", x, vocab, h));
  const int words = x;
  Layer positions =
      position_table(static_cast<double>(s), static_cast<double>(s), static_cast<double>(h), p, 0);
  positions.split.kind = TensorSplitKind::Replicated;  // every device of a tensor-parallel group adds them
  x = must(b.custom("embedding.positions", {x}, positions, {s, h}));
  for (int64_t i = 0; i < L; ++i) {
    x = must(b.transformer_block(fmt::format("layer{}", i), x, heads, 4 * h));
    b.mark_causal(x);  // a decoder: its fused attention skips the masked half (use_attention)
  }
  x = must(b.norm("final_norm", x, true));
  Layer head;
  head.kind = "linear";
  head.forward_flops = 2.0 * s * h * vocab;  // tied: the token embedding's weights, no parameters of its own
  head.backward_input_flops = head.forward_flops;
  head.backward_weight_flops = head.forward_flops;
  if (arg(a, "tied_embeddings") == 0) {  // untied, as the Llama head below
    head.parameters = static_cast<double>(h) * vocab;
    head.parameter_bytes = head.parameters * element_bytes(p);
  } else {  // a copy where the embedding is on other devices (Layer::tied_to)
    head.tied_to = words;
    head.tied_parameters = static_cast<double>(h) * vocab;
  }
  head.weight_bytes = static_cast<double>(h) * vocab * element_bytes(p);  // read either way
  head.forward_bytes = (static_cast<double>(s) * h + static_cast<double>(s) * vocab) * element_bytes(p);
  head.backward_bytes = 2 * head.forward_bytes;
  head.stash_bytes = static_cast<double>(s) * vocab * element_bytes(p);
  head.split = {TensorSplitKind::VocabHead, static_cast<double>(s), static_cast<double>(h), 0, 0, 0,
                static_cast<double>(vocab)};
  head.kernels = vocab_head_kernels(head.split, 1, head.weight_bytes, p);  // as at t > 1
  must(b.custom("lm_head", {x}, head, {s, vocab}));
  return b.finish();
}

// An RMSNorm over [s, h] per sample (a final norm; a multi-token-prediction module's three).
Layer rmsnorm_layer(int64_t s, int64_t h, Precision p) {
  const double eb = element_bytes(p), sh = static_cast<double>(s) * h;
  Layer norm;
  norm.kind = "rmsnorm";
  norm.parameters = static_cast<double>(h);
  norm.parameter_bytes = norm.parameters * eb;
  norm.forward_bytes = 2 * sh * eb;
  norm.backward_bytes = 3 * sh * eb;
  norm.stash_bytes = sh * eb;
  norm.kernels = {Kernel{KernelClass::Norm, 0, 0, 0, 2 * sh * eb, 3 * sh * eb, 0, 1}};
  norm.split.kind = TensorSplitKind::Replicated;
  return norm;
}

// A final RMSNorm and an output head over [s, h] (the Llama family's and the MoE decoders'), the head
// untied, or tied to layer `tied_to`'s weight (a multi-token-prediction module's shared head, its two
// layers marked so); the layers' names start with `prefix`. Returns the head.
int final_norm_and_head(ModelBuilder& b, int x, int64_t s, int64_t h, int64_t vocab, Precision p,
                        const std::string& prefix = "", int tied_to = -1) {
  const double eb = element_bytes(p), sh = static_cast<double>(s) * h;
  const bool mtp = tied_to >= 0;
  Layer norm = rmsnorm_layer(s, h, p);
  norm.multi_token_prediction = mtp;
  x = must(b.custom(prefix + "final_norm", {x}, norm, {s, h}));
  Layer head;
  head.multi_token_prediction = mtp;
  head.kind = "linear";
  head.forward_flops = 2.0 * s * h * vocab;
  head.backward_input_flops = head.forward_flops;
  head.backward_weight_flops = head.forward_flops;
  const double matrix = static_cast<double>(h) * vocab;
  head.parameters = tied_to >= 0 ? 0 : matrix;
  head.tied_to = tied_to;
  head.tied_parameters = tied_to >= 0 ? matrix : 0;
  head.parameter_bytes = head.parameters * eb;
  head.weight_bytes = matrix * eb;  // read either way
  head.forward_bytes = (sh + static_cast<double>(s) * vocab) * eb;
  head.backward_bytes = 2 * head.forward_bytes;
  head.stash_bytes = static_cast<double>(s) * vocab * eb;
  head.split = {TensorSplitKind::VocabHead, static_cast<double>(s), static_cast<double>(h), 0, 0, 0,
                static_cast<double>(vocab)};
  head.kernels = vocab_head_kernels(head.split, 1, head.weight_bytes, p);  // as at t > 1
  return must(b.custom(prefix + "lm_head", {x}, head, {s, vocab}));
}

// `depth` multi-token-prediction modules after a decoder's last block `x` (DeepSeek-V3, arXiv
// 2412.19437 section 2.2, figure 3; Megatron-Core's MultiTokenPredictionBlock, --mtp-num-layers): module
// k looks up the tokens k ahead in the main embedding's table (`table`, shared: a copy where the last
// stage lacks it), normalises them and the previous depth's hidden state (RMSNorm each), projects
// their concatenation from 2h to h (eh_proj, no bias), runs one more `block`, and predicts with its own
// final norm and the main output head (`head`, shared). The lookup's input edge stands for the last
// stage's own tokens (its data loader's, as for the labels): it carries nothing a replay moves, the
// lookup and its stage being the same. eh_proj is column-parallel with its output gathered back, as
// Megatron-Core builds it (TensorSplitKind::ColumnGathered; until 2026-12-06 it ran whole on every
// tensor-parallel rank). Every layer is marked
// Layer::multi_token_prediction, so no partitioner counts the block among the model's.
void multi_token_prediction(ModelBuilder& b, int x, int table, int head, const TensorSplit& block,
                            int64_t depth, int64_t s, int64_t h, int64_t vocab, Precision p) {
  const double eb = element_bytes(p), sh = static_cast<double>(s) * h;
  // Seven layers a module: refused here, so that the error names mtp_layers, not the model's layers.
  if (static_cast<double>(b.size()) + 7.0 * static_cast<double>(depth) > kMaxLayers)
    throw BuildError(
        fmt::format("mtp_layers {} adds {} layers to the model's {}, above pipegrid's limit of {} "
                    "(docs/limits.md)",
                    depth, 7 * depth, b.size(), kMaxLayers));
  for (int64_t k = 1; k <= depth; ++k) {
    const std::string m = fmt::format("mtp{}.", k);
    Layer hnorm = rmsnorm_layer(s, h, p);
    hnorm.multi_token_prediction = true;
    const int hn = must(b.custom(m + "hnorm", {x}, hnorm, {s, h}));
    Layer lookup;
    lookup.kind = "embedding";
    lookup.split = {TensorSplitKind::VocabEmbedding, static_cast<double>(s), static_cast<double>(h), 0, 0, 0,
                    static_cast<double>(vocab)};
    lookup.tied_to = table;
    lookup.tied_parameters = static_cast<double>(vocab) * h;
    lookup.kernels = {Kernel{KernelClass::Gather, 0, 0, 0, 2 * sh * eb, 2 * sh * eb, 0, 1}};
    lookup.multi_token_prediction = true;
    const int e = must(b.custom(m + "embedding", {hn}, lookup, {s, h}));
    Layer enorm = rmsnorm_layer(s, h, p);
    enorm.multi_token_prediction = true;
    const int en = must(b.custom(m + "enorm", {e}, enorm, {s, h}));
    Layer proj;
    proj.kind = "linear";
    proj.forward_flops = 2.0 * s * (2.0 * h) * h;
    proj.backward_input_flops = proj.forward_flops;
    proj.backward_weight_flops = proj.forward_flops;
    proj.parameters = 2.0 * h * h;
    proj.parameter_bytes = proj.parameters * eb;
    proj.weight_bytes = proj.parameter_bytes;
    proj.stash_bytes = 2 * sh * eb;  // its input, for the weight gradient
    Kernel gemm{KernelClass::Gemm, proj.forward_flops, proj.forward_flops, proj.forward_flops,
                3 * sh * eb,       6 * sh * eb,        proj.weight_bytes,  1};
    gemm.fp8 = true;  // a Transformer Engine Linear in an fp8 training
    gemm.fp8_in = 2 * sh;
    gemm.fp8_out = sh;
    proj.kernels = {gemm};
    proj.split = {TensorSplitKind::ColumnGathered, static_cast<double>(s), static_cast<double>(h)};
    proj.multi_token_prediction = true;
    const int pr = must(b.custom(m + "eh_proj", {en, hn}, proj, {s, h}));
    x = must(b.decoder_block(m + "layer", pr, block));
    b.mark_multi_token_prediction(x);
    final_norm_and_head(b, x, s, h, vocab, p, m, head);
  }
}

// Llama family (Touvron et al., arXiv 2302.13971 and 2307.09288; Llama 3: arXiv 2407.21783): token
// embedding, `layers` decoder blocks (RMSNorm, grouped-query attention with `kv_heads`, rotary
// embeddings, SwiGLU MLP of width `ffn`, no biases), a final RMSNorm and an untied output head.
Result<Workload> build_llama(const ModelArgs& a, Precision p) {
  const int64_t L = arg(a, "layers"), h = arg(a, "hidden"), s = arg(a, "sequence"),
                vocab = arg(a, "vocabulary");
  ModelBuilder b("llama", p);
  int x = b.input("tokens", {s});
  x = must(b.embedding("embedding.words", x, vocab, h));
  TensorSplit shape;
  shape.heads = static_cast<double>(arg(a, "heads"));
  shape.kv_heads = static_cast<double>(arg(a, "kv_heads"));
  shape.ffn = static_cast<double>(arg(a, "ffn"));
  shape.gated = true;
  shape.biases = false;
  shape.rotary = true;
  for (int64_t i = 0; i < L; ++i) x = must(b.decoder_block(fmt::format("layer{}", i), x, shape));
  final_norm_and_head(b, x, s, h, vocab, p);
  return b.finish();
}

// Mixture-of-experts decoders (Mixtral, Qwen3-MoE, DeepSeek-V2/V3, GPT-OSS): token embedding,
// `dense_layers` dense decoder blocks (FFN `ffn`), then MoE blocks (`experts` routed experts of width
// `expert_ffn`, `top_k` per token, shared experts of total width `shared_ffn`), a final RMSNorm and an
// untied head. Attention: grouped-query (`kv_heads`, `head_dim`; 0: hidden / heads), or multi-head
// latent attention when `kv_rank` > 0 (`q_rank`, `rope_dim`, `v_dim`; head_dim is the non-rotary
// query/key width); `sliding_window` > 0 restricts every other block's attention (the first, third,
// ...) to that many keys (GPT-OSS); `activation_clamp` 1 clamps the experts' GLU halves in eager
// PyTorch before the fused activation, as Megatron-Core runs GPT-OSS's. The 2026 training stack as these
// models are trained: causal FlashAttention and Megatron's fused element-wise kernels, SwiGLU experts,
// RMSNorm; `biases` 1 adds the attention, expert and router biases (GPT-OSS: its norms stay RMSNorm,
// without bias); `attention_sinks` 1 a learned logit per head (GPT-OSS; its parameters, not its work);
// `mtp_layers` D > 0 adds D multi-token-prediction modules after the head (DeepSeek-V3 trains with 1;
// multi_token_prediction above); `qk_norm` 1 normalises each head's queries and keys (Qwen3).
Result<Workload> build_moe(const ModelArgs& a, Precision p) {
  const int64_t L = arg(a, "layers"), h = arg(a, "hidden"), s = arg(a, "sequence"),
                vocab = arg(a, "vocabulary"), dense = arg(a, "dense_layers"),
                window = arg(a, "sliding_window");
  ModelBuilder b("moe", p);
  int x = b.input("tokens", {s});
  x = must(b.embedding("embedding.words", x, vocab, h));
  const int table = x;
  TensorSplit shape;
  shape.heads = static_cast<double>(arg(a, "heads"));
  shape.kv_heads = static_cast<double>(arg(a, "kv_heads"));
  shape.head_dim = static_cast<double>(arg(a, "head_dim"));
  shape.ffn = static_cast<double>(arg(a, "ffn"));
  shape.gated = true;
  shape.biases = arg(a, "biases") != 0;
  shape.norm_biases = false;  // RMSNorm
  shape.attention_sinks = arg(a, "attention_sinks") != 0;
  shape.qk_norm = arg(a, "qk_norm") != 0;
  shape.rotary = true;
  shape.causal = true;
  shape.fused_attention = true;
  shape.megatron_fusion = true;
  shape.mla = {static_cast<double>(arg(a, "q_rank")), static_cast<double>(arg(a, "kv_rank")),
               static_cast<double>(arg(a, "rope_dim")), static_cast<double>(arg(a, "v_dim"))};
  if (shape.mla.enabled()) shape.kv_heads = shape.heads;
  shape.moe = {static_cast<double>(arg(a, "experts")),
               static_cast<double>(arg(a, "top_k")),
               static_cast<double>(arg(a, "expert_ffn")),
               static_cast<double>(arg(a, "shared_ffn")),
               arg(a, "sigmoid") != 0,
               static_cast<double>(arg(a, "router_groups")),
               static_cast<double>(arg(a, "router_group_topk")),
               arg(a, "activation_clamp") != 0};
  if (dense > L) throw BuildError(fmt::format("dense_layers {} is more than the {} layers", dense, L));
  // All blocks dense: the experts, top-k and the rest would change nothing, without a word.
  if (dense == L)
    throw BuildError(fmt::format(
        "dense_layers {} makes all {} layers dense, so no block has experts and the MoE parameters would "
        "change nothing; expected fewer dense layers than layers (a dense model: a dense zoo model)",
        dense, L));
  if (shape.moe.top_groups > 0 && shape.moe.groups == 0)
    throw BuildError(fmt::format(
        "router_group_topk {:g} limits a token to its top groups, and router_groups is 0 (no groups): it "
        "would be ignored; expected router_groups beside it, or router_group_topk 0",
        shape.moe.top_groups));
  if (shape.moe.groups > 0 && shape.moe.top_groups == 0)
    throw BuildError(
        fmt::format("router_groups {:g} needs router_group_topk (the groups a token's experts "
                    "come from) from 1 to {:g}, got 0",
                    shape.moe.groups, shape.moe.groups));
  for (int64_t i = 0; i < L; ++i) {
    TensorSplit block = shape;
    block.kind = i < dense ? TensorSplitKind::Transformer : TensorSplitKind::MoeBlock;
    if (window > 0 && window < s && i % 2 == 0) block.window = static_cast<double>(window);
    x = must(b.decoder_block(fmt::format("layer{}", i), x, block));
  }
  const int head = final_norm_and_head(b, x, s, h, vocab, p);
  TensorSplit mtp = shape;
  mtp.kind = TensorSplitKind::MoeBlock;  // as the main model's later blocks (DeepSeek-V3's layer 61)
  multi_token_prediction(b, x, table, head, mtp, arg(a, "mtp_layers"), s, h, vocab, p);
  return b.finish();
}

// An MoE entry's parameters, in build_moe's order.
struct MoeDefaults {
  double layers, hidden, heads, kv_heads, head_dim, ffn, dense_layers, experts, top_k, expert_ffn, shared_ffn,
      sequence, vocabulary, q_rank = 0, kv_rank = 0, rope_dim = 0, v_dim = 0, biases = 0, sigmoid = 0,
                            sliding_window = 0, router_groups = 0, router_group_topk = 0,
                            activation_clamp = 0, attention_sinks = 0, mtp_layers = 0, qk_norm = 0;
};
std::vector<std::pair<std::string_view, double>> moe_defaults(const MoeDefaults& d) {
  return {{"layers", d.layers},
          {"hidden", d.hidden},
          {"heads", d.heads},
          {"kv_heads", d.kv_heads},
          {"head_dim", d.head_dim},
          {"ffn", d.ffn},
          {"dense_layers", d.dense_layers},
          {"experts", d.experts},
          {"top_k", d.top_k},
          {"expert_ffn", d.expert_ffn},
          {"shared_ffn", d.shared_ffn},
          {"sequence", d.sequence},
          {"vocabulary", d.vocabulary},
          {"q_rank", d.q_rank},
          {"kv_rank", d.kv_rank},
          {"rope_dim", d.rope_dim},
          {"v_dim", d.v_dim},
          {"biases", d.biases},
          {"sigmoid", d.sigmoid},
          {"sliding_window", d.sliding_window},
          {"router_groups", d.router_groups},
          {"router_group_topk", d.router_group_topk},
          {"activation_clamp", d.activation_clamp},
          {"attention_sinks", d.attention_sinks},
          {"mtp_layers", d.mtp_layers},
          {"qk_norm", d.qk_norm}};
}

// Qwen3's MoE decoders: an MoE entry with the per-head q/k RMSNorms on (Qwen3Attention's q_norm and
// k_norm of head_dim, transformers' modeling_qwen3.py; Megatron-Bridge's Qwen3 providers set
// qk_layernorm).
std::vector<std::pair<std::string_view, double>> qwen3_defaults(MoeDefaults d) {
  d.qk_norm = 1;
  return moe_defaults(d);
}

// GraphPipe's MMT: `branches` independent stacks of `layers` Transformer layers over their own
// input, concatenated at the end.
Result<Workload> build_mmt(const ModelArgs& a, Precision p) {
  const int64_t B = arg(a, "branches"), L = arg(a, "layers"), s = arg(a, "sequence"), h = arg(a, "hidden"),
                heads = arg(a, "heads"), ffn = arg(a, "ffn");
  ModelBuilder b("mmt", p);
  std::vector<int> ends;
  for (int64_t br = 0; br < B; ++br) {
    int x = b.input(fmt::format("branch{}.input", br), {s, h});
    for (int64_t i = 0; i < L; ++i)
      x = must(b.transformer_block(fmt::format("branch{}.layer{}", br, i), x, heads, ffn));
    ends.push_back(x);
  }
  if (ends.size() > 1) must(b.concat("concat", ends));
  return b.finish();
}

// Fully connected layers of `width` (`layers` of them) on an input of `width` features.
int fc_branch(ModelBuilder& b, const std::string& name, int64_t layers, int64_t width) {
  int x = b.input(name + ".input", {width});
  for (int64_t i = 0; i < layers; ++i) x = must(b.linear(fmt::format("{}.fc{}", name, i), x, width, width));
  return x;
}

// GraphPipe's DLRM shape: dense branches of fully connected layers, embedding-bag branches, their
// outputs concatenated (the interaction) and fully connected layers after it. With the bags kept
// unpooled (bag x dim per table, `pooled: 0`, the default) the totals are those of models.md
// (1.27 B parameters, 1.64 GFLOP per sample with 4 layers after the interaction); pooling (sum)
// gives a 29,120-wide interaction instead.
Result<Workload> build_dlrm(const ModelArgs& a, Precision p) {
  const int64_t dense = arg(a, "dense_branches"), dl = arg(a, "dense_layers"), width = arg(a, "width"),
                sparse = arg(a, "embedding_branches"), rows = arg(a, "rows"), dim = arg(a, "dim"),
                bag = arg(a, "bag"), top = arg(a, "top_layers");
  const bool pooled = arg(a, "pooled") != 0;
  ModelBuilder b("dlrm", p);
  std::vector<int> parts;
  for (int64_t i = 0; i < dense; ++i) parts.push_back(fc_branch(b, fmt::format("dense{}", i), dl, width));
  for (int64_t i = 0; i < sparse; ++i) {
    int ids = b.input(fmt::format("sparse{}.input", i), {bag});
    parts.push_back(
        must(b.embedding_bag(fmt::format("sparse{}.embedding_bag", i), ids, rows, dim, bag, pooled)));
  }
  int x = parts.size() > 1 ? must(b.concat("interaction", parts)) : parts.front();
  for (int64_t i = 0; i < top; ++i)
    x = must(b.linear(fmt::format("top.fc{}", i), x, b.shape(x).back(), width));
  return b.finish();
}

// GraphPipe's CANDLE-Uno shape: `branches` feature encoders of `layers` fully connected layers of
// `width` (input width assumed equal, models.md), concatenated, then a trunk of `trunk_layers` of
// `trunk_width` and a one-unit regression output.
Result<Workload> build_candle(const ModelArgs& a, Precision p) {
  const int64_t B = arg(a, "branches"), L = arg(a, "layers"), width = arg(a, "width"),
                tl = arg(a, "trunk_layers"), tw = arg(a, "trunk_width");
  ModelBuilder b("candle-uno", p);
  std::vector<int> ends;
  for (int64_t i = 0; i < B; ++i) ends.push_back(fc_branch(b, fmt::format("branch{}", i), L, width));
  int x = ends.size() > 1 ? must(b.concat("concat", ends)) : ends.front();
  for (int64_t i = 0; i < tl; ++i) x = must(b.linear(fmt::format("trunk.fc{}", i), x, b.shape(x).back(), tw));
  must(b.linear("output", x, b.shape(x).back(), 1));
  return b.finish();
}

// GraphPipe's case study: `branches` branches of `blocks` x [attention + 2 linear], joined by concat.
Result<Workload> build_branched_transformer(const ModelArgs& a, Precision p) {
  const int64_t B = arg(a, "branches"), L = arg(a, "blocks"), s = arg(a, "sequence"), h = arg(a, "hidden"),
                heads = arg(a, "heads"), ffn = arg(a, "ffn");
  ModelBuilder b("branched-transformer", p);
  std::vector<int> ends;
  for (int64_t br = 0; br < B; ++br) {
    int x = b.input(fmt::format("branch{}.input", br), {s, h});
    for (int64_t i = 0; i < L; ++i) {
      const std::string n = fmt::format("branch{}.block{}", br, i);
      x = must(b.attention(n + ".attention", {x}, heads));
      x = must(b.linear(n + ".fc1", x, h, ffn));
      x = must(b.linear(n + ".fc2", x, ffn, h));
    }
    ends.push_back(x);
  }
  if (ends.size() > 1) must(b.concat("concat", ends));
  return b.finish();
}

// A Llama-family entry's parameters, in build_llama's order.
std::vector<std::pair<std::string_view, double>> llama_defaults(double layers, double hidden, double heads,
                                                                double kv_heads, double ffn, double sequence,
                                                                double vocabulary) {
  return {{"layers", layers}, {"hidden", hidden},     {"heads", heads},          {"kv_heads", kv_heads},
          {"ffn", ffn},       {"sequence", sequence}, {"vocabulary", vocabulary}};
}

const ModelInfo kModels[] = {
    {"vgg16", "VGG-16 (torchvision D), 224x224 images", {{"image", 224}, {"classes", 1000}}, &build_vgg16},
    {"resnet50",
     "ResNet-50 v1.5 (torchvision), residuals as DAG edges",
     {{"image", 224}, {"classes", 1000}, {"fused_bn_relu", 0}},
     &build_resnet50},
    {"gnmt8",
     "GNMT with 4 + 4 LSTM layers (h 1024), attention, per sentence of source_length/target_length tokens",
     {{"layers", 4},
      {"hidden", 1024},
      {"vocabulary", 32320},
      {"source_length", 25},
      {"target_length", 25},
      {"shared_embedding", 0}},
     &build_gnmt},
    {"gnmt16",
     "GNMT with 8 + 8 LSTM layers (h 1024), attention",
     {{"layers", 8},
      {"hidden", 1024},
      {"vocabulary", 32320},
      {"source_length", 25},
      {"target_length", 25},
      {"shared_embedding", 0}},
     &build_gnmt},
    {"bert-large",
     "BERT-Large: 24 Transformer layers, h 1024, 16 heads, sequence 512",
     {{"layers", 24},
      {"hidden", 1024},
      {"heads", 16},
      {"sequence", 512},
      {"vocabulary", 30522},
      {"positions", 512},
      {"mlm_positions", 0}},
     &build_bert},
    {"gpt",
     "GPT-style decoder, configurable (defaults: GPT-2 small)",
     {{"layers", 12},
      {"hidden", 768},
      {"heads", 12},
      {"sequence", 1024},
      {"vocabulary", 50257},
      {"tied_embeddings", 1}},
     &build_gpt},
    {"gpt3-175b",
     "GPT-3 175B: 96 layers, h 12288, 96 heads, sequence 2048",
     {{"layers", 96},
      {"hidden", 12288},
      {"heads", 96},
      {"sequence", 2048},
      {"vocabulary", 50257},
      {"tied_embeddings", 1}},
     &build_gpt},
    {"llama", "Llama-family decoder, configurable (defaults: Llama 2 7B)",
     llama_defaults(32, 4096, 32, 32, 11008, 4096, 32000), &build_llama},
    {"llama2-7b", "Llama 2 7B: 32 layers, h 4096, 32 heads, FFN 11008, sequence 4096",
     llama_defaults(32, 4096, 32, 32, 11008, 4096, 32000), &build_llama},
    {"llama2-13b", "Llama 2 13B: 40 layers, h 5120, 40 heads, FFN 13824, sequence 4096",
     llama_defaults(40, 5120, 40, 40, 13824, 4096, 32000), &build_llama},
    {"llama2-70b", "Llama 2 70B: 80 layers, h 8192, 64 heads (8 KV), FFN 28672, sequence 4096",
     llama_defaults(80, 8192, 64, 8, 28672, 4096, 32000), &build_llama},
    {"llama3-8b", "Llama 3 8B: 32 layers, h 4096, 32 heads (8 KV), FFN 14336, sequence 8192",
     llama_defaults(32, 4096, 32, 8, 14336, 8192, 128256), &build_llama},
    {"llama3-70b", "Llama 3 70B: 80 layers, h 8192, 64 heads (8 KV), FFN 28672, sequence 8192",
     llama_defaults(80, 8192, 64, 8, 28672, 8192, 128256), &build_llama},
    {"llama3-405b", "Llama 3.1 405B: 126 layers, h 16384, 128 heads (8 KV), FFN 53248, sequence 8192",
     llama_defaults(126, 16384, 128, 8, 53248, 8192, 128256), &build_llama},
    // Shapes from each model's published configuration (docs/reference/models.md cites them).
    {"mixtral-8x7b", "Mixtral 8x7B: 32 MoE layers, h 4096, 32 heads (8 KV), 8 experts of FFN 14336, top-2",
     moe_defaults({32, 4096, 32, 8, 0, 14336, 0, 8, 2, 14336, 0, 4096, 32000}), &build_moe},
    {"mixtral-8x22b", "Mixtral 8x22B: 56 MoE layers, h 6144, 48 heads (8 KV), 8 experts of FFN 16384, top-2",
     moe_defaults({56, 6144, 48, 8, 0, 16384, 0, 8, 2, 16384, 0, 4096, 32000}), &build_moe},
    {"qwen3-30b-a3b",
     "Qwen3-30B-A3B: 48 MoE layers, h 2048, 32 heads (4 KV) of 128, 128 experts of FFN 768, top-8",
     qwen3_defaults({48, 2048, 32, 4, 128, 6144, 0, 128, 8, 768, 0, 4096, 151936}), &build_moe},
    {"qwen3-235b-a22b",
     "Qwen3-235B-A22B: 94 MoE layers, h 4096, 64 heads (4 KV) of 128, 128 experts of FFN 1536, top-8",
     qwen3_defaults({94, 4096, 64, 4, 128, 12288, 0, 128, 8, 1536, 0, 4096, 151936}), &build_moe},
    {"deepseek-v2-lite",
     "DeepSeek-V2-Lite: 27 layers (1 dense), h 2048, MLA, 64 experts of FFN 1408 + 2 shared, top-6",
     moe_defaults({27, 2048, 16, 16, 128, 10944, 1, 64, 6, 1408, 2816, 4096, 102400, 0, 512, 64, 128}),
     &build_moe},
    {"deepseek-v3",
     "DeepSeek-V3: 61 layers (3 dense), h 7168, MLA, 256 experts of FFN 2048 + 1 shared, top-8 of 4 of 8 "
     "groups",
     moe_defaults({61,   7168,   128,  128, 128, 18432, 3, 256, 8, 2048, 2048,
                   4096, 129280, 1536, 512, 64,  128,   0, 1,   0, 8,    4}),
     &build_moe},
    {"gpt-oss-120b",
     "GPT-OSS-120B: 36 MoE layers, h 2880, 64 heads (8 KV) of 64, 128 experts of FFN 2880, top-4",
     moe_defaults(
         {36, 2880, 64, 8, 64, 2880, 0, 128, 4, 2880, 0, 4096, 201088, 0, 0, 0, 0, 1, 0, 128, 0, 0, 1, 1}),
     &build_moe},
    {"mmt",
     "GraphPipe's multi-modal Transformer: 4 branches x 8 layers (s 256, h 1024, 16 heads, FFN 4096)",
     {{"branches", 4}, {"layers", 8}, {"sequence", 256}, {"hidden", 1024}, {"heads", 16}, {"ffn", 4096}},
     &build_mmt},
    {"dlrm",
     "GraphPipe's DLRM: 7 dense branches (4 x FC 4096), 7 embedding bags (1M x 64, bag 100), 4 FC on top",
     {{"dense_branches", 7},
      {"dense_layers", 4},
      {"width", 4096},
      {"embedding_branches", 7},
      {"rows", 1000000},
      {"dim", 64},
      {"bag", 100},
      {"pooled", 0},
      {"top_layers", 4}},
     &build_dlrm},
    {"candle-uno",
     "GraphPipe's CANDLE-Uno: 7 branches x 4 FC 4096, then a trunk",
     {{"branches", 7}, {"layers", 4}, {"width", 4096}, {"trunk_layers", 3}, {"trunk_width", 1000}},
     &build_candle},
    {"branched-transformer",
     "GraphPipe's case study: 2 branches x 4 [attention + 2 linear], joined by concat",
     {{"branches", 2}, {"blocks", 4}, {"sequence", 512}, {"hidden", 1024}, {"heads", 16}, {"ffn", 4096}},
     &build_branched_transformer},
};

}  // namespace

const std::vector<std::string_view>& zoo_layer_kinds() {
  static const std::vector<std::string_view> kinds = {"input",
                                                      "linear",
                                                      "embedding",
                                                      "embedding_bag",
                                                      "rmsnorm",
                                                      "layernorm",
                                                      "decoder_block",
                                                      "moe_block",
                                                      "transformer_block",
                                                      "attention",
                                                      "concat",
                                                      "add",
                                                      "softmax_loss",
                                                      "pool",
                                                      "lstm",
                                                      "flatten",
                                                      "conv2d",
                                                      "relu",
                                                      "batchnorm_add_relu",
                                                      "chain",
                                                      "index_select"};
  return kinds;
}

std::span<const ModelInfo> model_zoo() {
  return kModels;
}

Result<const ModelInfo*> find_model(std::string_view name) {
  std::string names;
  for (const ModelInfo& m : kModels) {
    if (m.name == name) return &m;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", m.name);
  }
  return Error{fmt::format("unknown model \"{}\" (valid: {})", name, names)};
}

ParameterRange parameter_range(std::string_view parameter) {
  if (parameter == "pooled" || parameter == "fused_bn_relu" || parameter == "shared_embedding" ||
      parameter == "tied_embeddings" || parameter == "biases" || parameter == "sigmoid" ||
      parameter == "activation_clamp" || parameter == "attention_sinks" || parameter == "qk_norm")
    return {0, 1};
  if (parameter == "head_dim" || parameter == "dense_layers" || parameter == "shared_ffn" ||
      parameter == "q_rank" || parameter == "kv_rank" || parameter == "rope_dim" || parameter == "v_dim" ||
      parameter == "sliding_window" || parameter == "router_groups" || parameter == "router_group_topk" ||
      parameter == "mtp_layers")
    return {0, 1'000'000'000};
  if (parameter == "mlm_positions") return {0, 1'000'000'000};
  return {};
}

std::string ParameterRange::text() const {
  if (lo == 0 && hi == 1) return "0 or 1";
  return fmt::format("an integer from {} to {}", lo, hi);
}

Result<Workload> build_model(const ModelInfo& info, const ModelArgs& args, Precision precision) {
  ModelArgs full;
  for (const auto& [k, v] : info.defaults) full[std::string(k)] = v;
  for (const auto& [k, v] : args) {
    if (!full.count(k)) {
      std::string keys;
      for (const auto& d : info.defaults) keys += fmt::format("{}{}", keys.empty() ? "" : ", ", d.first);
      return Error{fmt::format("model {} has no parameter \"{}\" (its parameters: {})", info.name, k, keys)};
    }
    const ParameterRange range = parameter_range(k);
    if (!(v >= static_cast<double>(range.lo) && v <= static_cast<double>(range.hi)) || v != std::floor(v))
      return Error{fmt::format("model {}: parameter {} must be {}, got {}", info.name, k, range.text(), v)};
    full[k] = v;
  }
  try {
    Result<Workload> w = info.build(full, precision);
    if (w) w->name = std::string(info.name);
    return w;
  } catch (const BuildError& e) {
    return Error{fmt::format("model {}: {}", info.name, e.what())};
  }
}

}  // namespace pipegrid
