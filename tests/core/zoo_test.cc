// The model zoo against published figures (docs/reference/models.md): exact parameter counts
// where the architecture is exact, FLOPs within 2%.
#include "core/models/zoo.h"

#include <doctest/doctest.h>

#include <algorithm>

#include "tests/support/approx.h"

using namespace pipegrid;

namespace {

Workload model(const char* name, const ModelArgs& args = {}, Precision p = Precision::FP32) {
  Result<const ModelInfo*> info = find_model(name);
  REQUIRE(info.ok());
  Result<Workload> w = build_model(**info, args, p);
  if (!w) FAIL(w.error().message);
  REQUIRE(check_acyclic(*w).ok());
  return std::move(*w);
}

double sum_if(const Workload& w, bool (*pred)(const Layer&), double Layer::*field) {
  double s = 0;
  for (size_t i = 0; i < w.layer_count(); ++i)
    if (pred(w.layer(i))) s += w.layer(i).*field;
  return s;
}

bool within(double got, double want, double rel) {
  return std::fabs(got - want) <= rel * want;
}

}  // namespace

TEST_CASE("VGG-16 and ResNet-50: exact parameter counts, FLOPs within 2% of 30.9 G and 8.18 G") {
  Workload vgg = model("vgg16");
  CHECK(total_parameters(vgg) == 138357544);
  CHECK(within(total_forward_flops(vgg), 30.9e9, 0.02));
  // models.md: "74% of parameters in fc6-fc8, under 1% of FLOPs". 74% is fc6 alone
  // (25088 x 4096 + 4096 of 138.4 M); fc6-fc8 hold 89% (123.6 M). Under 1% of the FLOPs either way.
  double fc = 0, fc_flops = 0, fc6 = 0;
  for (size_t i = 0; i < vgg.layer_count(); ++i)
    if (vgg.layer(i).kind == "linear") {
      fc += vgg.layer(i).parameters;
      fc_flops += vgg.layer(i).forward_flops;
      if (vgg.layer(i).name == "fc6") fc6 = vgg.layer(i).parameters;
    }
  CHECK(within(fc6 / total_parameters(vgg), 0.74, 0.02));
  CHECK(fc == 25088.0 * 4096 + 4096 + 4096.0 * 4096 + 4096 + 4096.0 * 1000 + 1000);
  CHECK(fc_flops / total_forward_flops(vgg) < 0.01);
  CHECK(vgg.layer(1).output_bytes == 64.0 * 224 * 224 * 4);

  Workload resnet = model("resnet50");
  CHECK(total_parameters(resnet) == 25557032);
  CHECK(within(total_forward_flops(resnet), 8.18e9, 0.02));
  // Boundary activations after layer1..layer4 (fp32, per image): 3.2, 1.6, 0.8, 0.4 MB.
  for (auto [name, mb] : {std::pair{"layer1.2.relu", 3.2e6},
                          {"layer2.3.relu", 1.6e6},
                          {"layer3.5.relu", 0.8e6},
                          {"layer4.2.relu", 0.4e6}}) {
    bool found = false;
    for (size_t i = 0; i < resnet.layer_count(); ++i)
      if (resnet.layer(i).name == name) {
        CHECK(within(resnet.layer(i).output_bytes, mb, 0.02));
        found = true;
      }
    CHECK(found);
  }
  // Residual branches are DAG edges: every block's add has two inputs.
  int adds = 0;
  for (size_t i = 0; i < resnet.layer_count(); ++i)
    if (resnet.layer(i).kind == "add") {
      ++adds;
      CHECK(boost::in_degree(i, resnet.graph) == 2);
    }
  CHECK(adds == 16);
  // Fused BatchNorm-ReLU (MXNet's, XLA's): the same parameters (torchvision's 25,557,032) and
  // FLOPs; each block ends in one BN-add-ReLU layer with the residual edge, no ReLU layers left.
  Workload fused = model("resnet50", {{"fused_bn_relu", 1}});
  CHECK(total_parameters(fused) == 25557032);
  CHECK(total_forward_flops(fused) == total_forward_flops(resnet));
  int ends = 0, relus = 0;
  for (size_t i = 0; i < fused.layer_count(); ++i) {
    if (fused.layer(i).kind == "relu") ++relus;
    if (fused.layer(i).kind == "batchnorm_add_relu") {
      ++ends;
      CHECK(boost::in_degree(i, fused.graph) == 2);
    }
  }
  CHECK(ends == 16);
  CHECK(relus == 0);
  CHECK(fused.layer_count() == resnet.layer_count() - 16);
  Result<Workload> two = build_model(**find_model("resnet50"), {{"fused_bn_relu", 2}}, Precision::FP32);
  REQUIRE_FALSE(two.ok());
  CHECK(two.error().message.find("fused_bn_relu must be 0 or 1") != std::string::npos);
}

TEST_CASE("GNMT-8 and GNMT-16: parameters and FLOP per source and target token") {
  struct Case {
    const char* name;
    double params, source, target;
  };
  for (Case c : {Case{"gnmt8", 193.8e6, 92e6, 163e6}, Case{"gnmt16", 277.7e6, 159e6, 263e6}}) {
    Workload w = model(c.name, {{"source_length", 25}, {"target_length", 40}});
    INFO(c.name);
    CHECK(within(total_parameters(w), c.params, 0.02));
    double enc = 0, dec = 0;
    for (size_t i = 0; i < w.layer_count(); ++i)
      (w.layer(i).name.rfind("encoder", 0) == 0 ? enc : dec) += w.layer(i).forward_flops;
    CHECK(within(enc / 25, c.source, 0.02));
    CHECK(within(dec / 40, c.target, 0.02));
  }
}

TEST_CASE("GNMT's shared embedding: one 32320 x 1024 table fewer, the same lookups") {
  // NVIDIA's GNMT v2 (DeepLearningExamples README: "encoder and decoder are using shared
  // embeddings") against PipeDream's, whose profile lists two Embedding(32320, 1024) of
  // parameter_size 132,382,720 bytes each (32320 x 1024 x 4, fp32).
  for (const char* name : {"gnmt8", "gnmt16"}) {
    INFO(name);
    Workload two = model(name);
    Workload one = model(name, {{"shared_embedding", 1}});
    CHECK(total_parameters(two) - total_parameters(one) == 32320.0 * 1024);
    int tables = 0;
    for (size_t i = 0; i < two.layer_count(); ++i) {
      const Layer &a = two.layer(i), &b = one.layer(i);
      CHECK(a.name == b.name);
      CHECK(a.forward_bytes == b.forward_bytes);
      CHECK(a.backward_bytes == b.backward_bytes);
      CHECK(a.forward_flops == b.forward_flops);
      if (a.kind == "embedding") {
        ++tables;
        CHECK(a.parameter_bytes == 132382720.0);
        CHECK(b.parameter_bytes == (a.name == "decoder.embedding" ? 0 : 132382720.0));
      }
    }
    CHECK(tables == 2);
  }
  Result<Workload> bad = build_model(**find_model("gnmt8"), {{"shared_embedding", 2}}, Precision::FP32);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message.find("shared_embedding must be 0 or 1") != std::string::npos);
}

TEST_CASE("Transformers: BERT-Large, GPT-3 175B, per-layer FLOPs and Korthikanti's activations") {
  Workload bert = model("bert-large");
  CHECK(within(total_parameters(bert), 334e6 + 1.6e6, 0.02));
  for (size_t i = 0; i < bert.layer_count(); ++i)
    if (bert.layer(i).kind == "transformer_block") {
      CHECK(within(bert.layer(i).forward_flops, 14.0e9, 0.02));
      CHECK(bert.layer(i).parameters == 12.0 * 1024 * 1024 + 13 * 1024);
    }
  Workload gpt3 = model("gpt3-175b");
  CHECK(within(total_parameters(gpt3), 175e9, 0.02));
  const Layer* block = nullptr;
  for (size_t i = 0; i < gpt3.layer_count(); ++i)
    if (gpt3.layer(i).kind == "transformer_block") block = &gpt3.layer(i);
  REQUIRE(block);
  CHECK(within(block->forward_flops, 7.63e12, 0.02));
  CHECK(block->backward_input_flops + block->backward_weight_flops ==
        pipegrid::testing::approx(2 * block->forward_flops));
  // fp16: s h (34 + 5 a s / h) bytes stashed, 34 s h with selective recomputation, 2 s h sent.
  Workload gpt16 =
      model("gpt", {{"layers", 2}, {"hidden", 1024}, {"heads", 16}, {"sequence", 512}}, Precision::FP16);
  for (size_t i = 0; i < gpt16.layer_count(); ++i)
    if (gpt16.layer(i).kind == "transformer_block") {
      const double s = 512, h = 1024, a = 16;
      CHECK(gpt16.layer(i).stash_bytes == pipegrid::testing::approx(s * h * (34 + 5 * a * s / h)));
      CHECK(gpt16.layer(i).selective_stash_bytes == pipegrid::testing::approx(34 * s * h));
      CHECK(gpt16.layer(i).output_bytes == pipegrid::testing::approx(2 * s * h));
    }
}

TEST_CASE("GPT's output layer: tied to the token embedding by default, V h parameters of its own untied") {
  // Megatron-Core's H100 table (experiments/megatron/h100_rows.yaml) prints sizes that fit untied
  // embeddings: 1.7B = 12 l h^2 + 13 l h + 2 V h at l 24, h 2048, V 131072, and tied would be 1.48 B.
  const ModelArgs shape = {
      {"layers", 24}, {"hidden", 2048}, {"heads", 16}, {"sequence", 4096}, {"vocabulary", 131072}};
  ModelArgs untied_args = shape;
  untied_args["tied_embeddings"] = 0;
  Workload tied = model("gpt", shape), untied = model("gpt", untied_args);
  CHECK(total_parameters(untied) - total_parameters(tied) == 131072.0 * 2048);
  CHECK(within(total_parameters(untied), 1.745e9, 0.01));
  CHECK(within(total_parameters(tied), 1.477e9, 0.01));
  CHECK(total_forward_flops(untied) == total_forward_flops(tied));  // the same GEMM either way
}

TEST_CASE("BERT's pre-training heads: hand-counted parameters and FLOPs, gathered or on every position") {
  // Devlin et al.'s heads, counted by hand from the architecture (BertPreTrainingHeads): the masked-LM
  // transform (dense h x h + h, LayerNorm 2 h), the vocabulary projection tied to the token embedding
  // with a bias of its own (V), the next-sentence classifier (h x 2 + 2).
  const double h = 1024, V = 30522;
  Workload bare = model("bert-large", {{"sequence", 128}});
  for (double n : {20.0, 128.0}) {
    INFO("mlm_positions " << n);
    Workload heads = model("bert-large", {{"sequence", 128}, {"mlm_positions", n}});
    CHECK(total_parameters(heads) - total_parameters(bare) == 1084220.0);
    CHECK(total_parameters(heads) - total_parameters(bare) == (h * h + h) + 2 * h + V + (2 * h + 2));
    // Forward FLOPs: the transform's and the projection's GEMMs on n positions, the classifier's.
    CHECK(total_forward_flops(heads) - total_forward_flops(bare) ==
          pipegrid::testing::approx(2 * n * h * h + 2 * n * h * V + 2 * h * 2));
    bool gathered = false, decoder = false, loss = false;
    for (size_t i = 0; i < heads.layer_count(); ++i) {
      const Layer& l = heads.layer(i);
      if (l.name == "mlm.gather") {
        gathered = true;
        CHECK(l.forward_bytes == 2 * n * h * 4);  // reads and writes the n rows, fp32
      }
      if (l.name == "mlm.decoder") {
        decoder = true;
        CHECK(l.parameters == V);                         // the bias only: the matrix is the embedding's
        CHECK(l.weight_bytes == (h * V + V) * 4);         // but every pass reads it
        CHECK(l.backward_weight_flops == 2 * n * h * V);  // and its gradient is computed
      }
      if (l.name == "mlm.loss") {
        loss = true;
        CHECK(l.forward_bytes == n * V * (2 * 4 + 2 * 4));  // fp32 logits: read twice, write, read
      }
    }
    CHECK(gathered == (n < 128));  // on every position (PyTorch before its dense output): no gather
    CHECK(decoder);
    CHECK(loss);
  }
  // The position table keeps BERT's 512 rows (max_position_embeddings) at any sequence; a sequence
  // looks up only its own rows. BertModel: 335,141,888 parameters (24 x 12,596,224 + 31,782,912 of
  // embeddings, the pooler's 1,049,600), counted by hand.
  const double bert_model = 24 * (12.0 * h * h + 13 * h) + (V + 512 + 2) * h + 2 * h + (h * h + h);
  CHECK(bert_model == 335141888.0);
  for (double s : {128.0, 384.0, 512.0}) {
    INFO("sequence " << s);
    Workload w = model("bert-large", {{"sequence", s}});
    CHECK(total_parameters(w) == bert_model);
    for (size_t i = 0; i < w.layer_count(); ++i)
      if (w.layer(i).name == "embedding.position_type_norm") CHECK(w.layer(i).forward_bytes == 3 * s * h * 4);
  }
  Result<Workload> longer = build_model(**find_model("bert-large"), {{"sequence", 1024}}, Precision::FP32);
  REQUIRE_FALSE(longer.ok());
  CHECK(longer.error().message.find("sequence (1024) must be at most positions") != std::string::npos);
  Result<Workload> more =
      build_model(**find_model("bert-large"), {{"sequence", 128}, {"mlm_positions", 129}}, Precision::FP32);
  REQUIRE_FALSE(more.ok());
  CHECK(more.error().message.find("mlm_positions (129) must be at most the sequence (128)") !=
        std::string::npos);
  Result<Workload> negative =
      build_model(**find_model("bert-large"), {{"mlm_positions", -1}}, Precision::FP32);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.error().message.find("mlm_positions must be an integer from 0") != std::string::npos);
}

TEST_CASE("GraphPipe's models: MMT, DLRM, CANDLE-Uno (models.md) and their branches") {
  Workload mmt = model("mmt");
  CHECK(within(total_parameters(mmt), 403e6, 0.02));
  CHECK(within(total_forward_flops(mmt), 215e9, 0.02));
  Workload dlrm = model("dlrm");
  CHECK(within(total_parameters(dlrm), 1.27e9, 0.02));
  CHECK(within(total_forward_flops(dlrm), 1.64e9, 0.02));
  CHECK(within(sum_if(
                   dlrm, [](const Layer& l) { return l.kind == "embedding_bag"; }, &Layer::parameters),
               0.45e9, 0.02));
  // Embedding bags are memory-bound: bytes moved (bag x dim x 4 per table), no FLOPs.
  for (size_t i = 0; i < dlrm.layer_count(); ++i)
    if (dlrm.layer(i).kind == "embedding_bag") {
      CHECK(dlrm.layer(i).forward_flops == 0);
      CHECK(dlrm.layer(i).forward_bytes >= 100.0 * 64 * 4);
    }
  Workload candle = model("candle-uno");
  auto branch = [](const Layer& l) { return l.name.rfind("branch", 0) == 0; };
  CHECK(within(sum_if(candle, branch, &Layer::parameters), 470e6, 0.02));
  CHECK(within(sum_if(candle, branch, &Layer::forward_flops), 0.94e9, 0.02));
  // Branch counts and widths are parameters.
  Workload wide = model("candle-uno", {{"branches", 16}, {"width", 2048}});
  CHECK(within(sum_if(wide, branch, &Layer::parameters), 16 * 4 * (2048.0 * 2048 + 2048), 1e-12));
  CHECK(model("mmt", {{"branches", 2}}).layer_count() == 2 * 9 + 1);
}

TEST_CASE("precision changes bytes, not FLOPs - unknown models and parameters are errors") {
  Workload a = model("resnet50", {}, Precision::FP32), b = model("resnet50", {}, Precision::FP16);
  CHECK(total_forward_flops(a) == total_forward_flops(b));
  CHECK(total_parameter_bytes(a) == pipegrid::testing::approx(2 * total_parameter_bytes(b)));
  CHECK(find_model("resnet5").error().message.rfind("unknown model \"resnet5\" (valid: vgg16, resnet50,",
                                                    0) == 0);
  CHECK(build_model(**find_model("mmt"), {{"branchez", 2}}, Precision::FP32).error().message ==
        "model mmt has no parameter \"branchez\" (its parameters: branches, layers, sequence, hidden, heads, "
        "ffn)");
  CHECK(build_model(**find_model("mmt"), {{"heads", 3}}, Precision::FP32).error().message ==
        "model mmt: layer \"branch0.layer0\": 3 heads do not divide the hidden size 1024");
}

TEST_CASE(
    "every zoo model's layer kinds are in zoo_layer_kinds, which backend catalogs' patterns check against") {
  const std::vector<std::string_view>& kinds = zoo_layer_kinds();
  for (const ModelInfo& m : model_zoo()) {
    Result<Workload> w = build_model(m, {}, Precision::FP16);
    REQUIRE_MESSAGE(w, m.name);
    for (size_t l = 0; l < w->layer_count(); ++l)
      CHECK_MESSAGE(std::find(kinds.begin(), kinds.end(), w->layer(l).kind) != kinds.end(),
                    m.name << ": " << w->layer(l).kind);
  }
}
