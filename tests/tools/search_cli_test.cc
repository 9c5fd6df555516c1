// `pipegrid search` as a user meets it (issue 55, items 3, 4 and 8): a base experiment without a
// batch, located errors for impossible counts, --top 0, the winner emitted as an experiment file that
// `pipegrid run` runs to the search's figure, one listing per run, and a table sized to its labels.
#include <doctest/doctest.h>

#include <cctype>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "tests/support/approx.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using nlohmann::json;
using pipegrid::testing::read_file;
using pipegrid::testing::run_command;
using pipegrid::testing::TempDir;

namespace {

// A small GPT on two DGX A100 nodes (16 GPUs, 8 blocks); its strategy gives no batch: the search's
// --global-batch is the batch.
constexpr const char* kGptNoBatch = R"(name: small GPT on two DGX A100
workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: 1024, vocabulary: 51200, precision: amp}
cluster: {preset: dgx-a100-2}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron}
)";

// A small Llama with a 16k sequence on two DGX H100, without its strategy line.
constexpr const char* kLongLlama = R"(name: small long-context Llama on two DGX H100
workload: {model: llama, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2816, sequence: 16384,
           vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
)";

// A small MoE of 16 experts, top-4, on two DGX H100 (the dispatcher and overlap axes' tests).
constexpr const char* kMoe16 = R"(name: small MoE on two DGX H100
workload: {model: mixtral-8x7b, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048, expert_ffn: 1024,
           experts: 16, top_k: 4, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron}
)";

// `pipegrid run` on a winner the search emitted: it exits 0 and gives the search's SimGrid time (to
// 1e-12); its JSON.
json run_emitted(const std::string& emitted, const json& winner) {
  auto run = run_command({PIPEGRID_BINARY, "run", emitted, "--json"});
  REQUIRE_MESSAGE(run.exit_code == 0, run.err);
  json rj = json::parse(run.out);
  CHECK(rj["iteration_time_s"].get<double>() ==
        pipegrid::testing::approx(winner["simulated_iteration_time_s"].get<double>()).epsilon(1e-12));
  return rj;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("search: a base without strategy.micro_batches, and the emitted winner runs to the search figure") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kGptNoBatch);
  std::filesystem::create_directories(tmp.path / "out");  // the emitted file goes into another folder
  const std::string emitted = (tmp.path / "out" / "winner.yaml").string();
  auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "2", "--micro-batch",
                        "2", "--pipeline", "2", "--json", "--emit", emitted});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["simgrid_ranking"].size() == 2);
  const json& w = j["simgrid_ranking"][0];
  CHECK(r.err.find("written to " + emitted) != std::string::npos);
  // The file speaks Megatron's batch vocabulary: b per replica, and the global batch.
  const std::string text = read_file(emitted);
  CHECK(text.find("micro_batch_size: 2\n") != std::string::npos);
  CHECK(text.find("global_batch: 16\n") != std::string::npos);
  CHECK(text.find("micro_batches") == std::string::npos);
  auto run = run_command({PIPEGRID_BINARY, "run", emitted, "--json"});
  REQUIRE_MESSAGE(run.exit_code == 0, run.err);
  const json rj = json::parse(run.out);
  CHECK(rj["iteration_time_s"].get<double>() ==
        pipegrid::testing::approx(w["simulated_iteration_time_s"].get<double>()).epsilon(1e-12));
  CHECK(rj["parallelism"]["tensor"] == w["t"]);
  CHECK(rj["parallelism"]["pipeline"] == w["p"]);
  CHECK(rj["parallelism"]["data"] == w["d"]);
  // A folder that does not exist: refused before the search runs.
  auto bad = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--emit",
                          (tmp.path / "missing" / "w.yaml").string()});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--emit") != std::string::npos);
  CHECK(bad.err.find(": no folder ") != std::string::npos);
}

TEST_CASE(
    "search: --global-batch 0 and a negative --top are located errors and --top 0 prints the analytic "
    "ranking") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kGptNoBatch);
  auto zero = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "0"});
  CHECK(zero.exit_code == 2);
  CHECK(zero.err.find("--global-batch: expected a positive whole number, got 0") != std::string::npos);
  CHECK(zero.err.size() < 200);  // it printed a range of two 309-digit numbers
  auto neg = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "-1"});
  CHECK(neg.exit_code == 2);
  CHECK(neg.err.find("--top: expected a whole number >= 0, got -1") != std::string::npos);
  auto top0 =
      run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "0", "--pipeline", "2"});
  REQUIRE_MESSAGE(top0.exit_code == 0, top0.err);
  CHECK(top0.out.find("nothing replayed in SimGrid (--top 0): the analytic ranking's best 5") !=
        std::string::npos);
  // The table: a header, then rows "1    t.. p2 ..", "2    ..", with "-" in the SimGrid column.
  size_t rows = 0;
  bool in_table = false;
  for (const std::string& l : lines_of(top0.out)) {
    if (l.rfind("rank ", 0) == 0)
      in_table = true;
    else if (in_table && !l.empty() && l[0] >= '1' && l[0] <= '9')
      ++rows;
    else if (in_table)
      in_table = false;
  }
  CHECK(rows == 5);
}

// At p = 1 there is no pipeline: 1f1b, zb-h1 and zb-h2 run the same passes, and where their times are
// equal they are one run, listed once under the first name (1f1b). They differ only where TP collectives run
// beside the weight-gradient GEMMs (tp_wgrad_overlap, the default): the zero-bubble schedules' input-gradient
// pass then leaves them exposed (`run` at t = 8, p = 1: 42.95 against 43.87 ms for a 4-layer GPT), a
// different run, listed apart; with the overlap off the three are one run at every t. At p = 2 all
// three are listed.
TEST_CASE("search: one listing per run at p = 1") {
  TempDir tmp;
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    const std::string exp = tmp.write("gpt.yaml", kGptNoBatch);
    std::vector<std::string> args{PIPEGRID_BINARY, "search",      exp,           "--global-batch", "16",
                                  "--top",         "0",           "--schedules", "1f1b",           "zb-h1",
                                  "zb-h2",         "--recompute", "none",        "--json"};
    if (!overlap)
      args.insert(args.end(),
                  {"--set", "strategy.tensor_parallel=2", "--set", "strategy.tp_wgrad_overlap=false"});
    auto r = run_command(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const json j = json::parse(r.out);
    std::map<std::tuple<int, int, int, bool, bool>, std::vector<std::pair<std::string, double>>> p1;
    std::set<std::string> schedules_p2, schedules_p2_m1;
    for (const json& c : j["analytic_ranking"]) {
      if (c["p"] == 1) {
        const auto key =
            std::make_tuple(c["t"].get<int>(), c["d"].get<int>(), c["micro_batch_size"].get<int>(),
                            c["sequence_parallel"].get<bool>(), c["distributed_optimizer"].get<bool>());
        p1[key].emplace_back(c["schedule"].get<std::string>(), c["analytic_iteration_time_s"].get<double>());
      } else if (c["p"] == 2) {
        schedules_p2.insert(c["schedule"].get<std::string>());
        if (c["micro_batches"] == 1) schedules_p2_m1.insert(c["schedule"].get<std::string>());
      }
    }
    CHECK(!p1.empty());
    size_t listed = 0, apart = 0;
    for (const auto& [key, runs] : p1) {
      listed += runs.size();
      CHECK(runs.front().first == "1f1b");  // the fastest of a configuration's runs at p = 1 is 1F1B
      for (size_t i = 1; i < runs.size(); ++i) {
        ++apart;
        CHECK(std::get<0>(key) > 1);  // only TP collectives tell them apart
        CHECK(overlap);
        CHECK(runs[i].second > runs.front().second * (1 + 1e-9));
      }
    }
    CHECK(schedules_p2 == std::set<std::string>{"1f1b", "zb-h1", "zb-h2"});
    // With one micro-batch zb-h1 and zb-h2 are one schedule (`pipegrid schedule zb-h1|zb-h2 -p 2 -m 1
    // --csv` print the same CSV): listed once, as zb-h1 (twice until 2026-12-05).
    CHECK(schedules_p2_m1 == std::set<std::string>{"1f1b", "zb-h1"});
    CHECK(j["left_out"].value(
              "zb-h1 and zb-h2 with 1 micro-batch and the same time: one run, listed once as zb-h1", 0) > 0);
    // Each configuration at p = 1 was ranked three times: what is not listed is counted as left out.
    CHECK(j["left_out"].value("1f1b, zb-h1 and zb-h2 at p = 1 with the same time: one run (no pipeline), "
                              "listed once, under the first of these names",
                              0) == 3 * p1.size() - listed);
    if (overlap) CHECK(apart > 0);
  }
}

// Long labels (interleaved v2, selective recomputation, SP, the distributed optimizer: 55 characters)
// widen the configuration column instead of pushing a row's figures out of their columns; TP-folded
// replays say where their TP time is instead of printing 0 s.
TEST_CASE("search: the table columns hold long labels and the TP column of --tp-folded says in compute") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kGptNoBatch);
  // t 4, p 2, d 2, b 1, interleaved with v 2 or 4, selective: 8 candidates (SP and the distributed
  // optimizer on or off), the longest label "t4 p2 d2 b1 m8 interleaved v2 selective sp dist-opt".
  auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "8",
                        "--tensor-parallel", "4", "--pipeline", "2", "--micro-batch", "1", "--schedules",
                        "interleaved-1f1b", "--recompute", "selective", "--tp-folded"});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const std::vector<std::string> lines = lines_of(r.out);
  size_t header = lines.size();
  for (size_t i = 0; i < lines.size(); ++i)
    if (lines[i].rfind("rank ", 0) == 0) header = i;
  REQUIRE(header + 8 < lines.size());
  const size_t end = lines[header].find("samples/s") + std::string("samples/s").size();  // right-aligned
  size_t longest = 0;
  for (size_t i = header + 1; i <= header + 8; ++i) {
    const std::string& l = lines[i];
    REQUIRE(l.size() > end);
    CHECK_MESSAGE(l[end - 1] != ' ', l);
    CHECK_MESSAGE(l[end] == ' ', l);
    longest = std::max(longest, l.find("  ", 5) - 5);
    CHECK(l.find("/ in compute /") != std::string::npos);
  }
  CHECK(longest > 44);  // the labels were longer than the old fixed column
}

// A mixture of experts (issue 50, item 7): ep, etp and the dispatcher are axes; the winner is written
// with them and `pipegrid run` runs it to the search's figure; --tp-folded and an unknown dispatcher are
// refused.
TEST_CASE(
    "search: MoE candidates with ep, etp and the dispatcher, and the emitted winner runs to its figure") {
  TempDir tmp;
  const std::string exp = tmp.write("moe.yaml", R"(name: small MoE on two DGX H100
workload: {model: mixtral-8x7b, layers: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048, expert_ffn: 1024,
           experts: 8, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron}
)");
  const std::string emitted = (tmp.path / "winner.yaml").string();
  auto r = run_command({PIPEGRID_BINARY,
                        "search",
                        exp,
                        "--global-batch",
                        "16",
                        "--top",
                        "2",
                        "--tensor-parallel",
                        "1",
                        "--pipeline",
                        "1",
                        "--micro-batch",
                        "1",
                        "--ep",
                        "4",
                        "8",
                        "--etp",
                        "1",
                        "--dispatcher",
                        "alltoall",
                        "--json",
                        "--emit",
                        emitted});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["simgrid_ranking"].size() == 2);
  std::set<int> eps;
  for (const json& c : j["analytic_ranking"]) {
    eps.insert(c["expert_parallel"].get<int>());
    CHECK(c["expert_tensor_parallel"] == 1);
    CHECK(c["dispatcher"] == "alltoall");
  }
  CHECK(eps == std::set<int>{4, 8});
  const json& w = j["simgrid_ranking"][0];
  const std::string text = read_file(emitted);
  CHECK(text.find("expert_parallel: " + std::to_string(w["expert_parallel"].get<int>()) + "\n") !=
        std::string::npos);
  CHECK(text.find("dispatcher: alltoall") != std::string::npos);
  const json rj = run_emitted(emitted, w);
  CHECK(rj["parallelism"]["experts"]["expert_parallel"] == w["expert_parallel"]);

  auto folded = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--tp-folded"});
  CHECK(folded.exit_code == 2);
  CHECK(folded.err.find("--tp-folded folds tensor-parallel groups only") != std::string::npos);
  auto bad =
      run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--dispatcher", "deepseek"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--dispatcher: \"deepseek\" is not alltoall, allgather or deepep") != std::string::npos);
}

// DeepEP (`--dispatcher deepep`): ep 16 spans the two nodes, so its dispatch is de-duplicated; the
// winner is written with it and `run` replays it to the search's figure.
TEST_CASE("search: the deepep dispatcher as an axis, and the emitted winner runs to its figure") {
  TempDir tmp;
  const std::string exp = tmp.write("moe.yaml", kMoe16);
  const std::string emitted = (tmp.path / "winner.yaml").string();
  auto r = run_command({PIPEGRID_BINARY,
                        "search",
                        exp,
                        "--global-batch",
                        "16",
                        "--top",
                        "1",
                        "--tensor-parallel",
                        "1",
                        "--pipeline",
                        "1",
                        "--micro-batch",
                        "1",
                        "--ep",
                        "16",
                        "--etp",
                        "1",
                        "--dispatcher",
                        "deepep",
                        "alltoall",
                        "--json",
                        "--emit",
                        emitted});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  std::map<std::string, double> by_dispatcher;  // the best estimate of each
  for (const json& c : j["analytic_ranking"]) {
    const double t = c["analytic_iteration_time_s"].get<double>();
    auto [it, fresh] = by_dispatcher.emplace(c["dispatcher"].get<std::string>(), t);
    if (!fresh) it->second = std::min(it->second, t);
  }
  REQUIRE(by_dispatcher.size() == 2);
  // Top-4 of 16 experts over two nodes of 8: each token crosses to the other node once (p 1 - C(8,4) /
  // C(16,4) = 0.962) instead of 2 copies on average, so the estimate puts deepep first.
  CHECK(by_dispatcher["deepep"] < by_dispatcher["alltoall"]);
  const json& w = j["simgrid_ranking"][0];
  CHECK(w["dispatcher"] == "deepep");
  CHECK(read_file(emitted).find("dispatcher: deepep") != std::string::npos);
  run_emitted(emitted, w);
}

// Megatron-Core's all-to-all overlap as an axis (--moe-overlap): both values ranked, the overlap's pairs in
// Megatron's interleaved order (one more warm-up forward, the steady state paired), where at m = p the
// plain order paired the warm-up's last forward with the cool-down's first backward and deadlocked.
TEST_CASE(
    "search: the all-to-all overlap as an axis, at m = p under interleaving, the winner emitted with it") {
  TempDir tmp;
  const std::string exp = tmp.write("moe.yaml", kMoe16);
  const std::string emitted = (tmp.path / "winner.yaml").string();
  std::vector<std::string> argv = {PIPEGRID_BINARY, "search", exp,    "--global-batch", "16",
                                   "--json",        "--emit", emitted};
  std::istringstream axes(
      "--top 1 --tensor-parallel 1 --pipeline 2 --micro-batch 1 --ep 8 --etp 1 --dispatcher alltoall "
      "--schedules interleaved-1f1b --chunks 2 --moe-overlap false true");
  for (std::string word; axes >> word;) argv.push_back(word);
  auto r = run_command(argv);
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  for (const auto& [reason, n] : j["left_out"].items()) CHECK(reason.find("deadlock") == std::string::npos);
  std::map<bool, double> exposed;  // the exposed all-to-all of each value (one candidate each here)
  for (const json& c : j["analytic_ranking"]) {
    CHECK(c["micro_batches"] == 2);
    exposed[c["moe_overlap"].get<bool>()] = c["analytic_breakdown"]["expert_parallel_s"].get<double>();
  }
  REQUIRE(exposed.size() == 2);
  CHECK(exposed[true] < exposed[false]);
  CHECK(j["moe_from_experiment"].get<std::string>().find(
            "overlapped with another micro-batch's compute and not "
            "(searched)") != std::string::npos);
  const json& w = j["simgrid_ranking"][0];
  CHECK(read_file(emitted).find(w["moe_overlap"].get<bool>() ? "overlap: true" : "overlap: false") !=
        std::string::npos);
  run_emitted(emitted, w);
  // Nothing to overlap in a dense workload, and only false and true are values.
  const std::string dense = tmp.write("dense.yaml", R"(workload: {model: gpt, layers: 2}
cluster: {preset: dgx-h100-8}
strategy: {partitioner: megatron}
)");
  auto refused =
      run_command({PIPEGRID_BINARY, "search", dense, "--global-batch", "8", "--moe-overlap", "true"});
  CHECK(refused.exit_code == 2);
  CHECK(refused.err.find("--moe-overlap: workload") != std::string::npos);
  auto bad = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--moe-overlap", "yes"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--moe-overlap: \"yes\" is not false or true") != std::string::npos);
}

// Context parallelism (issue 51, item 5): cp and its algorithm are axes; the winner is written with
// them and runs to the search's figure; an unknown algorithm is refused.
TEST_CASE("search: context-parallel candidates, and the emitted winner runs to its figure") {
  TempDir tmp;
  const std::string exp =
      tmp.write("long.yaml", std::string(kLongLlama) + "strategy: {partitioner: megatron}\n");
  const std::string emitted = (tmp.path / "winner.yaml").string();
  auto r = run_command({PIPEGRID_BINARY,
                        "search",
                        exp,
                        "--global-batch",
                        "8",
                        "--top",
                        "2",
                        "--tensor-parallel",
                        "1",
                        "--pipeline",
                        "1",
                        "--micro-batch",
                        "1",
                        "--cp",
                        "2",
                        "4",
                        "--cp-algorithm",
                        "p2p",
                        "a2a",
                        "--json",
                        "--emit",
                        emitted});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  std::set<std::pair<int, std::string>> seen;
  for (const json& c : j["analytic_ranking"])
    seen.emplace(c["context_parallel"].get<int>(), c["cp_algorithm"].get<std::string>());
  CHECK(seen == std::set<std::pair<int, std::string>>{{2, "p2p"}, {2, "a2a"}, {4, "p2p"}, {4, "a2a"}});
  const json& w = j["simgrid_ranking"][0];
  const std::string text = read_file(emitted);
  CHECK(text.find("context_parallel: " + std::to_string(w["context_parallel"].get<int>()) + "\n") !=
        std::string::npos);
  run_emitted(emitted, w);
  auto bad = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "8", "--cp-algorithm", "ring"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--cp-algorithm: \"ring\" is not p2p, all_gather or a2a") != std::string::npos);
}

// Uneven stages (issue 51): a 126-block Llama at t 8, p 16, interleaved, with one block fewer on the
// first and last ranks (the embedding and the loss counted as blocks: 128 slots, 8 per rank, 4 per
// chunk at v 2), through the search, written out, and run to the search's figure.
TEST_CASE(
    "search: a 126-block Llama at t 8 p 16 interleaved, uneven, and the emitted winner runs to its figure") {
  TempDir tmp;
  const std::string exp = tmp.write("l126.yaml", R"(name: a 126-block Llama on 128 H100
workload: {model: llama, layers: 126, hidden: 512, heads: 8, kv_heads: 8, ffn: 1024, sequence: 512,
           vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-16, nodes: 16}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron}
)");
  const std::string emitted = (tmp.path / "winner.yaml").string();
  auto r = run_command({PIPEGRID_BINARY,
                        "search",
                        exp,
                        "--global-batch",
                        "16",
                        "--top",
                        "1",
                        "--tensor-parallel",
                        "8",
                        "--pipeline",
                        "16",
                        "--micro-batch",
                        "1",
                        "--schedules",
                        "interleaved-1f1b",
                        "--chunks",
                        "2",
                        "--recompute",
                        "none",
                        "--json",
                        "--emit",
                        emitted});
  REQUIRE_MESSAGE(r.exit_code == 0, r.err);
  const json j = json::parse(r.out);
  REQUIRE(j["simgrid_ranking"].size() == 1);
  const json& w = j["simgrid_ranking"][0];
  CHECK(w["uneven"] == true);
  CHECK(w["chunks"] == 2);
  const std::string text = read_file(emitted);
  CHECK(text.find("account_for_embedding: true") != std::string::npos);
  CHECK(text.find("account_for_loss: true") != std::string::npos);
  const json rj = run_emitted(emitted, w);
  // 7 blocks on the first and the last rank, 8 on the others (stage s on rank s mod 16): the stages'
  // layers ("layer<i>" for the blocks) say so.
  std::vector<int> per_rank(16, 0);
  REQUIRE(rj["stages"].size() == 32);
  for (const json& s : rj["stages"])
    for (const json& l : s["layers"]) {
      const std::string name = l.get<std::string>();
      per_rank[s["index"].get<size_t>() % 16] +=
          name.rfind("layer", 0) == 0 && name.size() > 5 && std::isdigit(static_cast<unsigned char>(name[5]));
    }
  std::vector<int> expected(16, 8);
  expected.front() = expected.back() = 7;
  CHECK(per_rank == expected);
}

TEST_CASE("search: a base's recompute_modules go with the candidates that recompute selectively") {
  TempDir tmp;
  std::string base = kGptNoBatch;
  base.replace(base.find("memory: {optimizer: mixed-adam}"), 31,
               "memory: {optimizer: mixed-adam, recompute: selective, recompute_modules: [core_attn]}");
  const std::string exp = tmp.write("gpt.yaml", base);
  for (const char* mode : {"none", "selective"}) {
    const std::string emitted = (tmp.path / (std::string(mode) + ".yaml")).string();
    auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "1",
                          "--micro-batch", "2", "--pipeline", "2", "--recompute", mode, "--emit", emitted});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::string text = read_file(emitted);
    CHECK((text.find("recompute_modules: [core_attn]") != std::string::npos) ==
          (std::string(mode) == "selective"));
    auto run = run_command({PIPEGRID_BINARY, "run", emitted});
    CHECK_MESSAGE(run.exit_code == 0, run.err);
  }
}

// DualPipe and DualPipeV are opt-in: a MoE workload's search says which of them it did not try, and
// where it ranked DualPipe candidates, that the estimate times their pairs in closed form.
TEST_CASE("search: DualPipe's schedules, opt-in, said when left out and when estimated") {
  TempDir tmp;
  const std::string exp =
      tmp.write("moe.yaml",
                R"(workload: {model: mixtral-8x7b, layers: 2, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048,
           expert_ffn: 1024, experts: 8, top_k: 2, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-8}
memory: {optimizer: mixed-adam}
strategy: {partitioner: megatron}
)");
  auto search = [&](std::vector<std::string> extra) {
    std::vector<std::string> args{
        PIPEGRID_BINARY, "search", exp,     "--global-batch", "16", "--top", "0", "--tensor-parallel", "1",
        "--ep",          "4",      "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_command(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return json::parse(r.out);
  };
  const json plain = search({});
  CHECK(plain["schedules_not_searched"] == json({"dualpipe", "dualpipev"}));
  CHECK(!plain.contains("estimate_leaves_out"));
  const json dual = search({"--schedules", "dualpipe"});
  CHECK(dual["schedules_not_searched"] == json({"dualpipev"}));
  bool ranked = false;
  for (const json& c : dual["analytic_ranking"]) ranked |= c["schedule"] == "dualpipe";
  REQUIRE(ranked);  // p 2, d 4 (ep 4 divides t d), 4 micro-batches of 1: even and at least 2p
  CHECK(dual["estimate_leaves_out"].get<std::string>().find("overlapped pairs, DualPipe's, in closed form") !=
        std::string::npos);
  CHECK(!search({"--schedules", "dualpipe", "dualpipev"}).contains("schedules_not_searched"));
}

// The estimate times the MoE all-to-all overlap's pairs in closed form; with a base that asks for it the
// search says so (the replays of the best run them whole), and says nothing of it otherwise.
TEST_CASE("search: a base with the MoE all-to-all overlap is told the estimate approximates it") {
  TempDir tmp;
  const std::string base =
      R"(workload: {model: mixtral-8x7b, layers: 2, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2048,
           expert_ffn: 1024, experts: 8, top_k: 2, sequence: 1024, vocabulary: 32000, precision: amp-bf16}
cluster: {preset: dgx-h100-8}
memory: {optimizer: mixed-adam}
)";
  // Two micro-batches (global batch 16 over d 8): one alone has nothing to pair, and the overlap's
  // candidates were all left out (until 2026-12-06 the line was printed for a base asking for it even
  // then; it is now said where a ranked candidate overlaps).
  auto search = [&](const std::string& name, const std::string& strategy) {
    const std::string exp = tmp.write(name, base + strategy);
    auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "1",
                          "--tensor-parallel", "1", "--pipeline", "1", "--micro-batch", "1", "--ep", "8",
                          "--etp", "1", "--json"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return json::parse(r.out);
  };
  const json with = search("with.yaml", "strategy: {partitioner: megatron, moe: {overlap: true}}\n");
  REQUIRE(!with["analytic_ranking"].empty());
  for (const json& c : with["analytic_ranking"]) CHECK(c["moe_overlap"] == true);
  REQUIRE(with.contains("estimate_leaves_out"));
  CHECK(with["estimate_leaves_out"].get<std::string>().find("the all-to-all overlap's (moe.overlap)") !=
        std::string::npos);
  CHECK(!search("without.yaml", "strategy: {partitioner: megatron}\n").contains("estimate_leaves_out"));
  // The MoE options every candidate keeps from the base are stated (the search varies ep, etp and the
  // dispatcher alone).
  CHECK(with["moe_from_experiment"] ==
        "router fused, permutation fused (alltoall's launches); all-to-alls overlapped with another "
        "micro-batch's compute; dropless; balanced routing");
  const json unfused =
      search("unfused.yaml",
             "strategy: {partitioner: megatron, moe: {router_fusion: false, capacity_factor: "
             "1.25}}\n");
  CHECK(
      unfused["moe_from_experiment"] ==
      "router unfused, permutation fused (alltoall's launches); all-to-alls not overlapped; capacity factor "
      "1.25; balanced routing");
}

TEST_CASE(
    "search: an --ep that does not divide the routed experts is a usage error, not 'no candidate fits'") {
  TempDir tmp;
  const std::string exp =
      tmp.write("moe.yaml",
                "workload: {model: mixtral-8x7b, layers: 2, sequence: 1024, precision: "
                "amp-bf16}\ncluster: {preset: dgx-h100-8}\nstrategy: {partitioner: megatron}\n");
  auto r = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "8", "--ep", "3"});
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--ep 3 does not divide the 8 routed experts") != std::string::npos);
}

// Found by a hunt on 2026-12-05: --sweep or --emit onto the experiment replaced it (with a sweep that
// named itself as its base), --memory-margin was not written into --emit's file (its `run` had the
// default reserve), and axis values no candidate can take, or options of an axis the workload does
// not have, ran a search of nothing ("no candidate fits", exit 0) or were ignored.
TEST_CASE("search: outputs never replace the experiment, and options that would change nothing are refused") {
  TempDir tmp;
  const std::string exp = tmp.write("gpt.yaml", kGptNoBatch);
  auto search = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = {PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "1"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv);
  };
  auto sweep = search({"--sweep", exp});
  CHECK(sweep.exit_code == 2);
  CHECK(sweep.err ==
        "pipegrid: --sweep \"" + exp + "\" is the experiment file: an output must not overwrite an input\n");
  auto emit = search({"--emit", exp});
  CHECK(emit.exit_code == 2);
  CHECK(read_file(exp) == kGptNoBatch);
  const std::string both = (tmp.path / "w.yaml").string();
  auto same = search({"--emit", both, "--sweep", both});
  CHECK(same.exit_code == 2);
  CHECK(same.err.find("are the same file") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(both));
  const std::map<std::vector<std::string>, std::string> refused = {
      {{"--tensor-parallel", "3"}, "--tensor-parallel 3: expected a divisor of the cluster's 16 devices"},
      {{"--pipeline", "32"}, "--pipeline 32: expected a divisor of the cluster's 16 devices"},
      {{"--cp", "3"}, "--cp 3: expected a divisor of the cluster's 16 devices"},
      {{"--micro-batch", "3"}, "--micro-batch 3: expected a divisor of the global batch 16"},
      {{"--chunks", "1"},
       "--chunks 1: expected at least 2 (model chunks per rank of interleaved-1f1b; 1 is 1f1b)"},
      {{"--dispatcher", "deepep"},
       "--dispatcher: workload \"gpt\" has no mixture-of-experts blocks to dispatch to"},
      {{"--cp-algorithm", "a2a"},
       "--cp-algorithm: the search tries no cp > 1 (by default only where each rank keeps 4096 tokens, and "
       "the "
       "sequence is 1024: give --cp), so the algorithm would change nothing"}};
  for (const auto& [args, message] : refused) {
    auto r = search(args);
    INFO(args.front());
    CHECK(r.exit_code == 2);
    CHECK(r.err == "pipegrid: " + message + "\n");
  }
  // The reserve the search judged memory against is the emitted file's.
  const std::string emitted = (tmp.path / "m.yaml").string();
  auto m = search({"--memory-margin", "40GiB", "--emit", emitted});
  REQUIRE_MESSAGE(m.exit_code == 0, m.err);
  CHECK(read_file(emitted).find("reserve: 40GiB") != std::string::npos);
  // A base's strategy and memory settings the axes replace are named, not silently dropped.
  const std::string set =
      tmp.write("set.yaml", std::string(kGptNoBatch) + "memory: {recompute: full, zero: 1}\n");
  std::string text = read_file(set);
  text.replace(
      text.find("strategy: {partitioner: megatron}"), 33,
      "strategy: {partitioner: megatron, tensor_parallel: 4, schedule: gpipe, micro_batches: 8, stages: 2}");
  text.replace(text.find("memory: {optimizer: mixed-adam}\n"), 32, "");
  tmp.write("set.yaml", text);
  auto replaced = run_command({PIPEGRID_BINARY, "search", set, "--global-batch", "16", "--top", "0"});
  REQUIRE_MESSAGE(replaced.exit_code == 0, replaced.err);
  CHECK(
      replaced.out.find("base        strategy.stages 2, strategy.tensor_parallel 4, strategy.schedule gpipe, "
                        "strategy.micro_batches 8, memory.recompute full, memory.zero 1 replaced by the "
                        "search's axes\n") != std::string::npos);
  // So is a base's uneven split: the search picks even or accounted splits of its own.
  std::string laid = read_file(exp);
  laid.replace(laid.find("strategy: {partitioner: megatron}"), 33,
               "strategy: {partitioner: megatron, stages: 2, layout: \"Ettt|tttttL\"}");
  const std::string laid_file = tmp.write("laid.yaml", laid);
  auto laid_out = run_command({PIPEGRID_BINARY, "search", laid_file, "--global-batch", "16", "--top", "0"});
  REQUIRE_MESSAGE(laid_out.exit_code == 0, laid_out.err);
  CHECK(laid_out.out.find(
            "base        strategy.stages 2, strategy.layout \"Ettt|tttttL\" replaced by the search's "
            "axes\n") != std::string::npos);
  auto plain = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--top", "0", "--json"});
  REQUIRE(plain.exit_code == 0);
  CHECK(json::parse(plain.out)["replaced_base_settings"] == json::array());
  // A base of workload and cluster alone: the search sets the strategy (it was refused for the
  // missing mapping), and the emitted winner runs.
  const std::string bare = tmp.write("bare.yaml",
                                     "workload: {model: gpt, layers: 8, hidden: 1024, heads: 16, sequence: "
                                     "1024, vocabulary: 51200, precision: "
                                     "amp}\ncluster: {preset: dgx-a100-2}\n");
  const std::string bare_winner = (tmp.path / "bare-winner.yaml").string();
  auto b = run_command({PIPEGRID_BINARY, "search", bare, "--global-batch", "16", "--top", "1", "--json",
                        "--emit", bare_winner});
  REQUIRE_MESSAGE(b.exit_code == 0, b.err);
  run_emitted(bare_winner, json::parse(b.out)["simgrid_ranking"][0]);
}

// A long sequence (16,384 tokens) on two DGX H100: the search's sweep file replays every row, those at
// cp 1 included (their cp_algorithm and cp_load_balance are `~`, left out: the loader refuses both keys
// at cp 1, and every cp 1 row failed); --tp-folded, which folds tensor-parallel groups only, is
// refused before a search whose default cp axis tries cp > 1 (it failed at the first replay after
// the search); an axis value given twice is searched once.
TEST_CASE("search: the sweep's cp 1 rows run, --tp-folded beside cp > 1 is refused, axes searched once") {
  TempDir tmp;
  const std::string exp = tmp.write(
      "long.yaml", std::string(kLongLlama) +
                       "strategy: {partitioner: megatron, context_parallel: 2, cp_load_balance: false}\n");
  const std::string sweep = (tmp.path / "rows.yaml").string();
  const std::vector<std::string> axes = {
      "--top",          "0",    "--tensor-parallel", "2",    "--pipeline", "1", "--micro-batch", "1",
      "--schedules",    "1f1b", "--recompute",       "none", "--cp",       "1", "--cp",          "2",
      "--cp-algorithm", "p2p"};
  std::vector<std::string> argv = {PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--sweep", sweep};
  argv.insert(argv.end(), axes.begin(), axes.end());
  auto s = run_command(argv);
  REQUIRE_MESSAGE(s.exit_code == 0, s.err);
  // The base's algorithm is named among the settings the axes replace (it was not).
  CHECK(s.out.find("strategy.context_parallel 2, strategy.cp_algorithm p2p replaced by the search's axes") !=
        std::string::npos);
  const std::string text = read_file(sweep);
  CHECK(text.find("  strategy.context_parallel: [") != std::string::npos);
  CHECK(text.find("~") != std::string::npos);
  CHECK(text.find("  strategy.cp_load_balance: [") != std::string::npos);
  auto run =
      run_command({PIPEGRID_BINARY, "sweep", sweep, "-j", "2", "-q", "--db", (tmp.path / "r.db").string()});
  CHECK_MESSAGE(run.exit_code == 0, run.err);
  // The base's cp_load_balance false goes with the cp 2 rows, `~` with the cp 1 rows.
  const size_t axis = text.find("  strategy.cp_load_balance: [");
  REQUIRE(axis != std::string::npos);
  const std::string balance = text.substr(axis, text.find('\n', axis) - axis);
  CHECK(balance.find("false") != std::string::npos);
  CHECK(balance.find("~") != std::string::npos);
  CHECK(balance.find("true") == std::string::npos);

  auto folded = run_command({PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--tp-folded"});
  CHECK(folded.exit_code == 2);
  CHECK(
      folded.err ==
      "pipegrid: --tp-folded folds tensor-parallel groups only, and the search would try cp > 1 (by default "
      "where each rank keeps 4096 tokens of the sequence of 16384): give --cp 1, or leave --tp-folded out\n");

  auto once = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {PIPEGRID_BINARY, "search", exp, "--global-batch", "16", "--json"};
    a.insert(a.end(), axes.begin(), axes.end());
    a.insert(a.end(), extra.begin(), extra.end());
    auto r = run_command(a);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return json::parse(r.out);
  };
  const json plain = once({});
  const json twice = once({"--schedules", "1f1b", "--recompute", "none", "--cp-algorithm", "p2p"});
  CHECK(twice["combinations"] == plain["combinations"]);
  CHECK(twice["analytic_ranking"].size() == plain["analytic_ranking"].size());
}
