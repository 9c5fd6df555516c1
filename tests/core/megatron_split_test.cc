// The megatron partitioner's uneven splits (core/partitioners/megatron.h) against layouts computed by
// hand from Megatron-Core's rules (get_num_layers_to_build, get_transformer_layer_offset): the first
// and last ranks' counts, the embedding and the loss counted as blocks, with and without interleaving,
// and Llama 3 405B's published layout (arXiv 2407.21783, section 3.3.2).
#include <doctest/doctest.h>

#include <numeric>

#include "core/models/zoo.h"
#include "core/partitioners/megatron.h"
#include "core/topologies/generators.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using pipegrid::testing::test_device;

namespace {

MegatronSplit first_last(int first, int last) {
  MegatronSplit s;
  s.first_stage_blocks = first;
  s.last_stage_blocks = last;
  return s;
}

MegatronSplit accounted(bool embedding, bool loss) {
  MegatronSplit s;
  s.account_for_embedding = embedding;
  s.account_for_loss = loss;
  return s;
}

std::vector<int> layout(int n, int p, int v, const MegatronSplit& s, std::string_view schedule = "1f1b") {
  const MegatronLayout l = megatron_layout(n, p, v, schedule, s);
  REQUIRE_MESSAGE(l.ok(), l.key, ": ", l.problem);
  return l.blocks;
}

// The key a split that does not fit is refused at.
std::string refused_at(int n, int p, int v, const MegatronSplit& s, std::string_view schedule = "1f1b") {
  const MegatronLayout l = megatron_layout(n, p, v, schedule, s);
  CHECK(l.blocks.empty());
  return l.ok() ? "(fits)" : l.key;
}

// The transformer blocks of each stage, and each stage's pipeline rank.
std::vector<int> blocks_per_stage(const Workload& w, const Partition& part) {
  std::vector<int> out;
  for (size_t s = 0; s < part.stage_count(); ++s) {
    int n = 0;
    for (int l : part.stage(s).layers) n += is_block(w.layer(l).split.kind);
    out.push_back(n);
  }
  return out;
}

Workload zoo(const char* name, const ModelArgs& args = {}) {
  Result<Workload> w = build_model(**find_model(name), args, Precision::AMP_BF16);
  REQUIRE_MESSAGE(w.ok(), (w.ok() ? "" : w.error().message));
  return std::move(*w);
}

Workload small_gpt(int layers) {
  return zoo("gpt",
             {{"layers", layers}, {"hidden", 64}, {"heads", 4}, {"sequence", 16}, {"vocabulary", 128}});
}

Result<Partition> partition(const Workload& w, int p, int v, const MegatronSplit& s,
                            std::string_view schedule = "1f1b") {
  static const Cluster c = make_switch_cluster(16, "gpu", test_device(), 1e9, 0);
  PartitionRequest r{w, c, p, 1, v, 8, {}, schedule};
  r.options.megatron = s;
  return partition_megatron(r);
}

}  // namespace

TEST_CASE("megatron, first and last stage counts: the middle ranks share the rest evenly") {
  // Megatron-Core: middle = L - first - last over the ranks not given a count.
  CHECK(layout(10, 4, 1, first_last(1, 1)) == std::vector<int>{1, 4, 4, 1});
  CHECK(layout(10, 3, 1, first_last(2, 0)) == std::vector<int>{2, 4, 4});  // only the first: 8 over 2
  CHECK(layout(10, 3, 1, first_last(0, 4)) == std::vector<int>{3, 3, 4});  // only the last: 6 over 2
  CHECK(layout(10, 2, 1, first_last(3, 7)) == std::vector<int>{3, 7});     // no middle rank
  // Interleaved, v = 2: each rank's count halves over its chunks, chunk k of rank r is stage k p + r.
  // Chunk 1 of rank 0 starts after 1 + 2 + 2 + 1 = 6 blocks (Megatron-Core's offset, 1 x (2/2 + 8/2 + 2/2)).
  CHECK(layout(12, 4, 2, first_last(2, 2)) == std::vector<int>{1, 2, 2, 1, 1, 2, 2, 1});
}

TEST_CASE("megatron, embedding and loss counted as blocks: the first and last model chunks build one fewer") {
  // 7 blocks + embedding = 8 slots over 4 ranks: 2 each, the first chunk 1 block and the embedding.
  CHECK(layout(7, 4, 1, accounted(true, false)) == std::vector<int>{1, 2, 2, 2});
  CHECK(layout(6, 4, 1, accounted(true, true)) == std::vector<int>{1, 2, 2, 1});
  // v = 2: 14 + 2 = 16 slots over 4 ranks, 4 per rank, 2 per chunk; only the very first and the very
  // last chunk (stages 0 and 7) lose one.
  CHECK(layout(14, 4, 2, accounted(true, true)) == std::vector<int>{1, 2, 2, 2, 2, 2, 2, 1});
  // One slot per chunk: the first chunk holds the embedding alone (Llama 3's "the first model chunk on
  // the first stage has only the embedding").
  CHECK(layout(6, 2, 4, accounted(true, true)) == std::vector<int>{0, 1, 1, 1, 1, 1, 1, 0});
  // One rank: the embedding and the loss add and take back a slot on the same chunk.
  CHECK(layout(5, 1, 1, accounted(true, true)) == std::vector<int>{5});
}

TEST_CASE("megatron: an even split is unchanged, and refused with the message it always had") {
  CHECK(layout(12, 4, 3, {}) == std::vector<int>(12, 1));
  const MegatronLayout l = megatron_layout(10, 4, 1, "1f1b", {});
  CHECK(l.key.empty());
  CHECK(l.problem ==
        "the megatron partitioner needs the 10 transformer blocks to be a multiple of the 4 stages (4 ranks "
        "x 1 chunk), as Megatron-LM does");
  CHECK(megatron_layout(10, 2, 2, "1f1b", {}).problem ==
        "the megatron partitioner needs the 10 transformer blocks to be a multiple of the 4 stages (2 ranks "
        "x 2 chunks), as Megatron-LM does");
}

TEST_CASE("megatron, uneven splits that do not fit are refused at the key at fault") {
  // Megatron-Core's rules: the first/last counts and the accounting exclude each other.
  MegatronSplit both = first_last(1, 1);
  both.account_for_loss = true;
  CHECK(refused_at(10, 4, 1, both) == "account_for_loss");
  CHECK(refused_at(10, 1, 1, first_last(2, 0)) == "first_stage_blocks");    // one rank: first is last
  CHECK(refused_at(10, 4, 1, first_last(6, 5)) == "last_stage_blocks");     // more than the blocks
  CHECK(refused_at(10, 2, 1, first_last(3, 6)) == "last_stage_blocks");     // 1 left, no middle rank
  CHECK(refused_at(10, 4, 1, first_last(5, 5)) == "last_stage_blocks");     // 0 left, 2 middle ranks
  CHECK(refused_at(10, 4, 1, first_last(1, 2)) == "last_stage_blocks");     // 7 over 2 middle ranks
  CHECK(refused_at(126, 16, 2, first_last(7, 7)) == "first_stage_blocks");  // 7 on 2 chunks
  CHECK(refused_at(13, 4, 2, first_last(2, 3)) == "last_stage_blocks");     // 3 on 2 chunks
  CHECK(refused_at(12, 4, 4, first_last(4, 4)) == "chunks");                // 2 per middle rank on 4 chunks
  CHECK(refused_at(8, 4, 1, accounted(true, true)) == "account_for_loss");  // 10 slots over 4 ranks
  CHECK(refused_at(9, 4, 1, accounted(true, false)) == "account_for_embedding");  // 10 over 4
  CHECK(refused_at(14, 4, 3, accounted(true, true)) == "chunks");                 // 4 per rank over 3
  // DualPipeV's V puts the first and the last stage on rank 0: a count per first or last rank names
  // no one stage there.
  CHECK(refused_at(12, 4, 2, first_last(2, 2), "dualpipev") == "first_stage_blocks");
  CHECK(refused_at(12, 4, 2, first_last(0, 2), "dualpipev") == "last_stage_blocks");
  const MegatronLayout l = megatron_layout(126, 16, 2, "interleaved-1f1b", first_last(7, 7));
  CHECK(l.problem ==
        "expected a multiple of the 2 chunks per rank (Megatron-Core splits a rank's blocks equally over its "
        "chunks), got 7");
}

TEST_CASE("megatron partitioner, uneven: the embedding with the first stage, the head with the last") {
  const Workload w = small_gpt(6);
  // p = 2, v = 4, embedding and loss accounted: 8 slots per rank, one per chunk; stage 0 holds the
  // layers before the first block only, stage 7 those after the last.
  Result<Partition> part = partition(w, 2, 4, accounted(true, true), "interleaved-1f1b");
  REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
  CHECK(blocks_per_stage(w, *part) == std::vector<int>{0, 1, 1, 1, 1, 1, 1, 0});
  const std::vector<int> order = topological_order(w);
  CHECK(part->stage(0).layers.front() == order.front());
  CHECK(part->stage(7).layers.back() == order.back());
  for (size_t s = 0; s < part->stage_count(); ++s)
    CHECK(part->stage(s).devices == std::vector<int>{int(s % 2)});
  // Errors carry the key.
  Result<Partition> bad = partition(w, 2, 3, accounted(true, true), "interleaved-1f1b");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message ==
        "strategy.chunks: expected a divisor of the 4 blocks per rank (6 blocks + the "
        "embedding + the loss = 8 over 2 ranks), got 3");
}

TEST_CASE("Llama 3 405B at p 16, v 2: 126 blocks, the first and last ranks one block fewer") {
  // arXiv 2407.21783, section 3.3.2: "we reduce one Transformer layer each from the first and the last
  // stages". In Megatron-Core: the embedding and the loss counted as blocks, 128 slots over 16 ranks, 4
  // per chunk; stage k 16 + r is chunk k of rank r.
  const Workload w = zoo("llama3-405b");
  Result<Partition> part = partition(w, 16, 2, accounted(true, true), "interleaved-1f1b");
  REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
  std::vector<int> want(32, 4);
  want.front() = want.back() = 3;
  const std::vector<int> got = blocks_per_stage(w, *part);
  CHECK(got == want);
  CHECK(std::accumulate(got.begin(), got.end(), 0) == 126);
  std::vector<int> per_rank(16, 0);
  for (size_t s = 0; s < part->stage_count(); ++s) per_rank[part->stage(s).devices.front()] += got[s];
  std::vector<int> ranks(16, 8);
  ranks.front() = ranks.back() = 7;
  CHECK(per_rank == ranks);
  // The same ranks without interleaving, as the first/last counts write it.
  Result<Partition> flat = partition(w, 16, 1, first_last(7, 7));
  REQUIRE(flat.ok());
  std::vector<int> flat_want(16, 8);
  flat_want.front() = flat_want.back() = 7;
  CHECK(blocks_per_stage(w, *flat) == flat_want);
}

namespace {

MegatronSplit laid_out(std::string text) {
  MegatronSplit s;
  s.layout = std::move(text);
  return s;
}

}  // namespace

TEST_CASE("megatron layout strings expand as Megatron-Core's parse_str_to_list does") {
  // Megatron-Core's own example (pipeline_parallel_layer_layout.py): "Ettt|(tt|)*29,m|L" is
  // [E t t t] + [t t] x 29 + [m] + [L], 32 stages; commas are cosmetic.
  ParsedLayout p = parse_megatron_layout("Ettt|(tt|)*29,m|L");
  REQUIRE(p.problem.empty());
  REQUIRE(p.stages.size() == 32u);
  CHECK(p.stages.front() == "Ettt");
  CHECK(p.stages[1] == "tt");
  CHECK(p.stages[29] == "tt");
  CHECK(p.stages[30] == "m");
  CHECK(p.stages[31] == "L");
  // Megatron-Bridge's DeepSeek-V3 layout on GB300 (PP 2, VP 8): 1 + 14 + 1 stages, 4 + 56 + 1 = 61 blocks.
  p = parse_megatron_layout("Et*4|(t*4|)*14tmL");
  REQUIRE(p.stages.size() == 16u);
  CHECK(p.stages.front() == "Etttt");
  CHECK(p.stages[14] == "tttt");
  CHECK(p.stages.back() == "tmL");
  // Counts of more than one digit, and a repeated '|'.
  p = parse_megatron_layout("Et*12|*2tL");
  REQUIRE(p.stages.size() == 3u);
  CHECK(p.stages[0] == "E" + std::string(12, 't'));
  CHECK(p.stages[1].empty());
  CHECK(p.stages[2] == "tL");
  // What Megatron-Core's parser refuses, with the character at fault.
  CHECK(parse_megatron_layout("Etx|tL").problem ==
        "at character 3: expected E (the embedding), t (a transformer block), m (a multi-token-prediction "
        "module), L (the loss), '|' between stages, '(', '*' or ',', got 'x'");
  CHECK(parse_megatron_layout("E(tt|)L").problem ==
        "at character 6: expected *n after a group (Megatron-Core repeats a group n times)");
  CHECK(parse_megatron_layout("E((t|)*2)*2L").problem ==
        "at character 3: expected no '(' inside a group (Megatron-Core's groups do not nest)");
  CHECK(parse_megatron_layout("Et*|tL").problem ==
        "at character 3: expected a count after '*' (x*n repeats x n times)");
  CHECK(parse_megatron_layout("E(t|L").problem == "at character 2: expected a ')' closing this group");
}

TEST_CASE("megatron layout: each stage's blocks as written, and what Megatron-Core or pipegrid refuses") {
  // DeepSeek-V3's 61 blocks and one MTP module on GB300s, PP 2 x VP 8 (Megatron-Bridge's layout).
  std::vector<int> want(16, 4);
  want.back() = 1;
  const MegatronLayout l = megatron_layout(61, 2, 8, "interleaved-1f1b", laid_out("Et*4|(t*4|)*14tmL"), 1);
  REQUIRE_MESSAGE(l.ok(), l.problem);
  CHECK(l.blocks == want);
  // Uneven without interleaving: 2 + 3 + 3 + 2 blocks.
  CHECK(megatron_layout(10, 4, 1, "1f1b", laid_out("Ett|ttt|ttt|ttL")).blocks ==
        std::vector<int>{2, 3, 3, 2});
  const auto problem = [](int n, int p, int v, std::string text, int mtp = 0) {
    const MegatronLayout r = megatron_layout(n, p, v, "interleaved-1f1b", laid_out(std::move(text)), mtp);
    CHECK(r.key == "layout");
    CHECK(r.blocks.empty());
    return r.problem;
  };
  CHECK(problem(61, 2, 1, "Et*4|(t*4|)*14tmL", 1) ==
        "expected 2 stages (2 ranks x 1 chunk, '|' between them), got 16 (strategy.chunks: 8 would fit)");
  CHECK(problem(60, 2, 8, "Et*4|(t*4|)*14tmL", 1) ==
        "expected the workload's 60 transformer blocks (t), got 61");
  CHECK(problem(61, 2, 8, "Et*4|(t*4|)*14tmL", 0) ==
        "expected the workload's 0 multi-token-prediction modules (m; workload.mtp_layers), got 1");
  CHECK(problem(4, 2, 1, "tEt|ttL") ==
        "expected the embedding (E) once, first in stage 0, as Megatron-Core requires, got 1 E and \"t\" "
        "first");
  CHECK(problem(4, 2, 1, "Ett|tLt") ==
        "expected the loss (L) once, last in the last stage, as Megatron-Core requires, got 1 L and \"t\" "
        "last");
  CHECK(problem(4, 3, 1, "Ett||ttL") ==
        "expected a layer in every stage, got none in stage 1 (pipegrid runs no empty stage)");
  // Megatron-Core's standalone MTP stage: pipegrid keeps the module with the head.
  CHECK(problem(4, 3, 1, "Ett|ttm|L", 1) ==
        "expected the multi-token-prediction modules (m) in the loss's stage: pipegrid keeps them with the "
        "head "
        "(docs/moe.md) and does not model a stage of them alone");
  CHECK(problem(4, 3, 1, "Ett|tm|tmL", 2) ==  // two modules, one of them before the loss's stage
        "expected the multi-token-prediction modules (m) in the loss's stage: pipegrid keeps them with the "
        "head "
        "(docs/moe.md) and does not model a stage of them alone");
  CHECK(problem(4, 2, 1, "Ett|tmtL", 1) ==
        "expected every transformer block (t) before the first multi-token-prediction module (m), as "
        "Megatron-Core requires");
  MegatronSplit both = laid_out("Ett|ttL");
  both.account_for_loss = true;
  CHECK(megatron_layout(4, 2, 1, "1f1b", both).key == "layout");
}

TEST_CASE("megatron partitioner, uneven splits under DualPipe and DualPipeV: stages of the chain") {
  // DualPipe (arXiv 2412.19437, section 3.2.1): the chain's stage s on rank s in one direction and on
  // rank p - 1 - s in the other. 6 blocks, first 1 and last 1 over 4 ranks: 1, 2, 2, 1 by hand
  // (Megatron-Core's middle = 6 - 1 - 1 over 2 ranks), so ranks 0 and 3 each hold the embedding's stage
  // and the head's, one block each.
  const Workload w = small_gpt(6);
  for (const MegatronSplit& s : {first_last(1, 1), laid_out("Et|tt|tt|tL"), accounted(true, true)}) {
    Result<Partition> part = partition(w, 4, 1, s, "dualpipe");
    REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
    REQUIRE(part->stage_count() == 8);
    CHECK(blocks_per_stage(w, *part) == std::vector<int>{1, 2, 2, 1, 1, 2, 2, 1});
    for (int k = 0; k < 4; ++k) {
      CHECK(part->stage(k).devices == std::vector<int>{k});
      CHECK(part->stage(4 + k).devices == std::vector<int>{3 - k});
      CHECK(part->stage(4 + k).layers == part->stage(k).layers);
    }
  }
  // DualPipeV: 2 ranks x 2 chunks in a V (stage s on rank s, stage 3 - s on rank s). "Et|tt|tt|tL": rank 0
  // holds stages 0 and 3 (the embedding, the head, 2 blocks), rank 1 stages 1 and 2 (4 blocks). The
  // accounting (6 + 2 = 8 slots, 2 per stage, the first and last stage one fewer) gives the same.
  for (const MegatronSplit& s : {laid_out("Et|tt|tt|tL"), accounted(true, true)}) {
    Result<Partition> part = partition(w, 2, 2, s, "dualpipev");
    REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
    CHECK(blocks_per_stage(w, *part) == std::vector<int>{1, 2, 2, 1});
    const std::vector<std::vector<int>> ranks{{0}, {1}, {1}, {0}};
    for (int k = 0; k < 4; ++k) CHECK(part->stage(k).devices == ranks[k]);
  }
}

TEST_CASE("megatron partitioner with a layout: the stages hold the blocks it names") {
  const Workload w = small_gpt(10);
  Result<Partition> part = partition(w, 2, 2, laid_out("Et|ttt|ttt|ttt,L"), "interleaved-1f1b");
  REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
  CHECK(blocks_per_stage(w, *part) == std::vector<int>{1, 3, 3, 3});
  const std::vector<int> order = topological_order(w);
  CHECK(part->stage(0).layers.front() == order.front());
  CHECK(part->stage(3).layers.back() == order.back());
  for (size_t s = 0; s < part->stage_count(); ++s)
    CHECK(part->stage(s).devices == std::vector<int>{int(s % 2)});
  Result<Partition> bad = partition(w, 2, 2, laid_out("Et|ttt|ttt|ttL"), "interleaved-1f1b");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message == "strategy.layout: expected the workload's 10 transformer blocks (t), got 9");
}

TEST_CASE("megatron partitioner with a layout: DeepSeek's MTP module stays on the head's stage") {
  // DeepSeek-V2-Lite cut to 4 blocks (1 dense) with one MTP module, p 2: "Ett|ttmL".
  const Workload w = zoo("deepseek-v2-lite", {{"layers", 4}, {"mtp_layers", 1}});
  Result<Partition> part = partition(w, 2, 1, laid_out("Ett|ttmL"));
  REQUIRE_MESSAGE(part.ok(), (part.ok() ? "" : part.error().message));
  int main_blocks_last = 0, mtp_last = 0;
  for (int l : part->stage(1).layers) {
    main_blocks_last += is_layout_block(w.layer(l));
    mtp_last += w.layer(l).multi_token_prediction;
  }
  CHECK(main_blocks_last == 2);
  CHECK(mtp_last > 0);
  for (int l : part->stage(0).layers) CHECK_FALSE(w.layer(l).multi_token_prediction);
  Result<Partition> none = partition(w, 2, 1, laid_out("Ett|ttL"));
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message ==
        "strategy.layout: expected the workload's 1 multi-token-prediction module (m; workload.mtp_layers), "
        "got 0");
}
