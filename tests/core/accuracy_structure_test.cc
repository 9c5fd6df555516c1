// The cost model's structure behind issue 29 (accuracy, second pass), against hand counts and
// rooflines: an LSTM's per-time-step launches, GNMT's additive-attention tensor, the vocabulary
// softmax and loss, the unfused attention's passes over the scores and the fused alternative.
#include <doctest/doctest.h>

#include "core/device.h"
#include "core/models/builder.h"
#include "core/models/zoo.h"
#include "tests/support/approx.h"

using namespace pipegrid;
using pipegrid::testing::approx;

namespace {

// Round figures: 100 TFLOP/s fp16, 10 fp32 (no TF32 rate), 1 TB/s, efficiency 1, no startup.
DeviceSpec gpu() {
  DeviceSpec d;
  d.kind = "round";
  d.memory_bytes = 80e9;
  d.memory_bandwidth = 1e12;
  d.efficiency = 1;
  d.peak_flops[static_cast<int>(Precision::FP32)] = 10e12;
  d.peak_flops[static_cast<int>(Precision::FP16)] = 100e12;
  return d;
}

// Compute and memory free: only the launches count.
DeviceSpec launches_only(double startup) {
  DeviceSpec d = gpu();
  d.peak_flops.fill(1e30);
  d.memory_bandwidth = 1e30;
  d.kernel_startup_s = startup;
  return d;
}

}  // namespace

TEST_CASE("an LSTM pays two dependent launches per time step and pass: 2 T + 1 startups") {
  // 50 steps, one direction: forward = the input projection's GEMM + per step the recurrent GEMM
  // and the gates' kernel = 101 launches; a bidirectional layer 1 + 2 x 2 x 50 = 201.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {50, 1024});
  int one = *b.lstm("one", {x}, 1024, false);
  int two = *b.lstm("two", {x}, 1024, true);
  Workload w = b.finish();
  const DeviceSpec d = launches_only(1e-6);
  CHECK(layer_times(w.layer(one), Precision::FP16, d, 128)->forward == approx(101e-6));
  CHECK(layer_times(w.layer(one), Precision::FP16, d, 128)->backward_input == approx(101e-6));
  CHECK(layer_times(w.layer(two), Precision::FP16, d, 128)->forward == approx(201e-6));
}

TEST_CASE("an LSTM step's recurrent GEMM runs at the GEMM efficiency (roofline)") {
  // Batch 128, h 1024, fp16 on 100 TFLOP/s at GEMM efficiency 0.5, memory free: per step
  // 2 x 128 x 1024 x 4096 FLOPs / 50 TFLOP/s = 21.47 us; 50 steps; the input projection of all steps
  // is one GEMM of 50 x the same FLOPs (input 1024 features): 1.07 ms.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {50, 1024});
  int l = *b.lstm("l", {x}, 1024, false);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.memory_bandwidth = 1e30;
  d.compute_efficiency[static_cast<int>(Precision::FP16)][static_cast<int>(KernelClass::Gemm)] = 0.5;
  d.compute_efficiency[static_cast<int>(Precision::FP16)][static_cast<int>(KernelClass::Recurrent)] = 0.01;
  const double step = 2.0 * 128 * 1024 * 4096 / 50e12;
  PassTimes t = *layer_times(w.layer(l), Precision::FP16, d, 128);
  CHECK(t.forward == approx(50 * step + 50 * step));
}

TEST_CASE("GNMT's additive attention: the tq x tk x h tensor's passes at the memory bandwidth") {
  // Query 50 x 1024 over a memory of 50 x 1024, fp16, batch 128: the tensor is
  // 128 x 50 x 50 x 1024 = 327.7 M elements. With compute free, the element-wise kernel's forward
  // moves 4 x 327.7 M + 2 x 128 x 2,500 elements of 2 bytes: 2.623 GB, 2.623 ms at 1 TB/s.
  ModelBuilder b("m", Precision::FP16);
  int q = b.input("q", {50, 1024});
  int m = b.input("m", {50, 1024});
  int a = *b.attention("att", {q, m}, 1);
  Workload w = b.finish();
  DeviceSpec d = gpu();
  d.peak_flops.fill(1e30);
  const double big = 128.0 * 50 * 50 * 1024, small = 128.0 * 50 * 50;
  CHECK(big == approx(327.68e6));
  // The projections' GEMMs (2 calls, each reading half the weights) and the context's batched GEMM.
  const double h = 1024, weights = (2 * h * h + 2 * h + 1) * 2;
  const double proj = 128.0 * 2 * (50 + 50) * h * 2 + weights;
  const double context = (small + 128.0 * 100 * h) * 2;
  PassTimes t = *layer_times(w.layer(a), Precision::FP16, d, 128);
  CHECK(t.forward == approx(((4 * big + 2 * small) * 2 + proj + context) / 1e12));
  // The stash keeps the tanh output for the backward.
  CHECK(w.layer(a).stash_bytes == approx((50.0 * h + 50 * h + 2500 + 2500 * h) * 2));
}

TEST_CASE("the vocabulary softmax and loss: memory-bound passes over the logits, fp32 under amp") {
  // 50 positions x 32,000 logits, amp (2-byte logits, fp32 log-probabilities), batch 128:
  // forward reads the logits twice and writes and reads fp32 (2 x 2 + 2 x 4 = 12 bytes per logit),
  // backward reads fp32 and writes 2 bytes (6 bytes): 204.8 M logits.
  ModelBuilder b("m", Precision::AMP);
  int x = b.input("logits", {50, 32000});
  int loss = *b.softmax_loss("loss", x);
  Workload w = b.finish();
  const double n = 128.0 * 50 * 32000;
  PassTimes t = *layer_times(w.layer(loss), Precision::AMP, gpu(), 128);
  CHECK(t.forward == approx(12 * n / 1e12));
  CHECK(t.backward_input == approx(6 * n / 1e12));
  CHECK(w.layer(loss).forward_flops == 0);
}

TEST_CASE("unfused attention: scale, mask, softmax and dropout each pass over the a x s x s scores") {
  // One block, s 512, h 1024, 16 heads, fp16, compute free: the score passes move
  // (8 x 2 + 1) x 16 x 512^2 bytes per sample forward (4 kernels reading and writing 2-byte scores,
  // the dropout mask 1 byte) and (7 x 2 + 1) x that backward; the core writes and reads them once
  // each way (2 x 2 bytes forward). Fused (FlashAttention) none of the score traffic remains.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {512, 1024});
  int blk = *b.transformer_block("blk", x, 16, 4096);
  Workload w = b.finish();
  const double scores = 16.0 * 512 * 512, sh = 512.0 * 1024;
  const Layer& unfused = w.layer(blk);
  Workload fused_w = w;
  REQUIRE(use_attention(fused_w, AttentionImpl::Fused).ok());
  const Layer& fused = fused_w.layer(blk);
  // Forward bytes per sample: the difference is the score traffic, counted by hand.
  CHECK(unfused.forward_bytes - fused.forward_bytes == approx((8 * 2 + 1) * scores + 2 * 2 * scores));
  CHECK(unfused.backward_bytes - fused.backward_bytes == approx((7 * 2 + 1) * scores + 4 * 2 * scores));
  // What remains fused: 4 GEMMs' io, Q K V in and the output out (4 s h), the other element-wise
  // kernels, the LayerNorms.
  const double f = 4096;
  CHECK(fused.forward_bytes ==
        approx(((8 * sh + 2 * 512 * f) + 4 * sh + (10 * sh + 2 * 512 * f) + 4 * sh) * 2));
  // The fused backward recomputes Q K^T: the attention FLOPs backward are 2.5 x the forward's 4 s^2 h.
  const double core = 4.0 * 512 * 512 * 1024;
  CHECK(fused.backward_input_flops - unfused.backward_input_flops == approx(core / 2));
  // Launches: fused, one attention kernel per pass instead of 2 + 4: 17 - 5 = 12 per forward.
  const DeviceSpec d = launches_only(1e-6);
  CHECK(layer_times(fused, Precision::FP16, d, 8)->forward == approx(12e-6));
  CHECK(layer_times(unfused, Precision::FP16, d, 8)->forward == approx(17e-6));
  // No score tensor stashed fused: Korthikanti's 34 s h bytes at 16 bits.
  CHECK(fused.stash_bytes == approx(34 * sh));
  // The roofline: at s = 512 on a 1 TB/s, 100 TFLOP/s device the unfused forward is slower than the
  // fused by at least the passes' traffic (17 bytes per score) and at most all the score traffic
  // (21 bytes per score): 4.19 M scores x batch 8 / 1 TB/s x 17..21 = 0.57..0.70 ms.
  DeviceSpec r = gpu();
  const double gap = layer_times(unfused, Precision::FP16, r, 8)->forward -
                     layer_times(fused, Precision::FP16, r, 8)->forward;
  CHECK(gap >= 17 * scores * 8 / 1e12);
  CHECK(gap <= 21 * scores * 8 / 1e12);
}

TEST_CASE(
    "a causal decoder's fused attention skips the masked half of the scores, unfused and BERT's do not") {
  // One block, s 512, h 1024, 16 heads: the attention core's forward is 4 s^2 h FLOPs (Q K^T and the
  // scores times V); FlashAttention under a causal mask computes about half of them (FlashAttention-2,
  // arXiv 2307.08691, section 3.1.1), its backward 2.5 x that. A block marked causal (GPT's and
  // Llama's) loses 4 s^2 h / 2 forward and 2.5 x 4 s^2 h / 2 backward when fused; unfused (every
  // score computed, then masked) and unmarked (BERT's bidirectional) blocks keep the full count.
  const double core = 4.0 * 512 * 512 * 1024;
  auto build = [](bool causal) {
    ModelBuilder b("m", Precision::FP16);
    int x = b.input("x", {512, 1024});
    int blk = *b.transformer_block("blk", x, 16, 4096);
    if (causal) b.mark_causal(blk);
    return std::make_pair(b.finish(), blk);
  };
  auto [plain, blk] = build(false);
  auto [causal, blk2] = build(true);
  CHECK(causal.layer(blk2).forward_flops == plain.layer(blk).forward_flops);  // unfused: the same
  REQUIRE(use_attention(plain, AttentionImpl::Fused).ok());
  REQUIRE(use_attention(causal, AttentionImpl::Fused).ok());
  CHECK(plain.layer(blk).forward_flops - causal.layer(blk2).forward_flops == approx(core / 2));
  CHECK(plain.layer(blk).backward_input_flops - causal.layer(blk2).backward_input_flops ==
        approx(2.5 * core / 2));
  CHECK(causal.layer(blk2).split.causal);
  CHECK(!plain.layer(blk).split.causal);
  // The zoo's GPT is causal: its blocks lose the same half when fused.
  Result<Workload> gpt =
      build_model(**find_model("gpt"),
                  {{"layers", 1}, {"hidden", 1024}, {"heads", 16}, {"sequence", 512}, {"vocabulary", 1024}},
                  Precision::FP16);
  REQUIRE(gpt.ok());
  const Layer* g = nullptr;
  for (size_t i = 0; i < gpt->layer_count(); ++i)
    if (gpt->layer(static_cast<int>(i)).kind == "transformer_block") g = &gpt->layer(static_cast<int>(i));
  REQUIRE(g != nullptr);
  CHECK(g->split.causal);
}

TEST_CASE("Megatron-LM's fused kernels: scale-mask-softmax one kernel, bias-dropout-add one kernel") {
  // One GPT decoder block, s 512, h 1024, 16 heads, MLP 4096, fp16, hand-counted per sample.
  // Score passes forward: unfused 4 kernels, (8 x 2 + 1) bytes per score; fused softmax then
  // dropout, 2 kernels, (4 x 2 + 1); backward (7 x 2 + 1) -> (5 x 2 + 1). Dropout and residual add:
  // unfused 2 kernels, 5 s h elements (dropout reads and writes, the add reads 2 and writes), twice
  // per block; fused 1 kernel, 3 s h (reads the input and the residual, writes); backward 1.5 x.
  ModelBuilder b("m", Precision::FP16);
  int x = b.input("x", {512, 1024});
  TensorSplit sp;
  sp.heads = sp.kv_heads = 16;
  sp.ffn = 4096;
  int blk = *b.decoder_block("blk", x, sp);
  Workload w = b.finish();
  Workload fw = w;
  REQUIRE(use_megatron_fusion(fw).ok());
  const Layer& unfused = w.layer(blk);
  const Layer& fused = fw.layer(blk);
  const double scores = 16.0 * 512 * 512, sh = 512.0 * 1024;
  CHECK(unfused.forward_bytes - fused.forward_bytes == approx(4 * 2 * scores + 2 * (5 - 3) * sh * 2));
  CHECK(unfused.backward_bytes - fused.backward_bytes == approx(2 * 2 * scores + 2 * 1.5 * (5 - 3) * sh * 2));
  CHECK(fused.forward_flops == unfused.forward_flops);
  // Launches per pass: unfused 2 norms, 4 GEMMs, 2 core, 4 score passes, GeLU, 2 x 2 dropout-add =
  // 17; fused 13.
  const DeviceSpec d = launches_only(1e-6);
  CHECK(layer_times(unfused, Precision::FP16, d, 8)->forward == approx(17e-6));
  CHECK(layer_times(fused, Precision::FP16, d, 8)->forward == approx(13e-6));
  // With FlashAttention first, the fusion keeps it (no score passes at all): 2 + 4 + 1 + 1 + 2 = 10.
  Workload ff = w;
  REQUIRE(use_attention(ff, AttentionImpl::Fused).ok());
  REQUIRE(use_megatron_fusion(ff).ok());
  CHECK(ff.layer(blk).split.fused_attention);
  CHECK(layer_times(ff.layer(blk), Precision::FP16, d, 8)->forward == approx(10e-6));
  // BERT's and GPT's transformer_block: the same counts, 17 -> 13 launches.
  ModelBuilder b2("bert-like", Precision::FP16);
  int y = b2.input("x", {512, 1024});
  int tb = *b2.transformer_block("blk", y, 16, 4096);
  Workload bert = b2.finish();
  Workload bf = bert;
  REQUIRE(use_megatron_fusion(bf).ok());
  CHECK(bert.layer(tb).forward_bytes - bf.layer(tb).forward_bytes ==
        approx(4 * 2 * scores + 2 * (5 - 3) * sh * 2));
  CHECK(bf.layer(tb).forward_flops == approx(bert.layer(tb).forward_flops));
  CHECK(layer_times(bert.layer(tb), Precision::FP16, d, 8)->forward == approx(17e-6));
  CHECK(layer_times(bf.layer(tb), Precision::FP16, d, 8)->forward == approx(13e-6));
  // A model without Transformer blocks is refused, not silently left unfused.
  ModelBuilder b3("mlp", Precision::FP16);
  int z = b3.input("x", {1024});
  (void)*b3.linear("fc", z, 1024, 1024);
  Workload mlp = b3.finish();
  Status st = use_megatron_fusion(mlp);
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message.find("Transformer blocks") != std::string::npos);
}

TEST_CASE("fused BatchNorm + ReLU and BatchNorm + add + ReLU: one kernel each way, hand-counted passes") {
  // A 1x1 convolution 64 -> 256 on 56 x 56, fp16: the output Y is 256 x 56 x 56 x 2 bytes.
  // Unfused: BatchNorm 3 Y forward (statistics read; normalise read + write), 5 Y backward; ReLU
  // 2 Y and 3 Y (read the gradient and the output, write) in a convolution's layer, 2 Y and 2 Y as a
  // layer of its own (ModelBuilder::elementwise); add 3 Y each way. Fused BN + ReLU: 3 Y
  // and 7 Y (the mask read in both backward passes); fused BN + add + ReLU: 4 Y (+ the residual's
  // read) and 8 Y (+ the mask's reads and the residual's gradient write).
  const double Y = 256.0 * 56 * 56 * 2;
  auto build = [](bool fused) {
    ModelBuilder b("m", Precision::FP16);
    int x = b.input("x", {64, 56, 56});
    ModelBuilder::Conv relu_conv{64, 256, 1, 1, 0, 1, false, true, true, fused};
    int c = *b.conv2d("c", x, relu_conv);
    ModelBuilder::Conv plain{256, 256, 1, 1, 0, 1, false, !fused, false};
    int d = *b.conv2d("d", c, plain);
    if (fused) {
      (void)*b.batchnorm_add_relu("bn_add_relu", d, c);
    } else {
      int s = *b.add("add", {d, c});
      (void)*b.elementwise("relu", "relu", s);
    }
    return b.finish();
  };
  Workload u = build(false), f = build(true);
  auto total = [](const Workload& w, double Layer::*field) {
    double s = 0;
    for (size_t i = 0; i < w.layer_count(); ++i) s += w.layer(i).*field;
    return s;
  };
  // Convolution c: BN + ReLU 5 Y -> 3 Y forward, 8 Y -> 7 Y backward; the block's end: BN + add +
  // ReLU 8 Y -> 4 Y, 10 Y -> 8 Y.
  CHECK(total(u, &Layer::forward_bytes) - total(f, &Layer::forward_bytes) == approx((5 - 3 + 8 - 4) * Y));
  CHECK(total(u, &Layer::backward_bytes) - total(f, &Layer::backward_bytes) == approx((8 - 7 + 10 - 8) * Y));
  CHECK(total(u, &Layer::parameters) == total(f, &Layer::parameters));
  CHECK(total(u, &Layer::forward_flops) == total(f, &Layer::forward_flops));
  // Launches per pass: unfused conv, BN, ReLU, conv, BN, add, ReLU = 7; fused conv, BN-ReLU, conv,
  // BN-add-ReLU = 4.
  const DeviceSpec dev = launches_only(1e-6);
  auto launches = [&](const Workload& w) {
    double t = 0;
    for (size_t i = 0; i < w.layer_count(); ++i)
      t += layer_times(w.layer(i), Precision::FP16, dev, 1)->forward;
    return t;
  };
  CHECK(launches(u) == approx(7e-6));
  CHECK(launches(f) == approx(4e-6));
}
