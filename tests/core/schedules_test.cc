#include <doctest/doctest.h>

#include "core/experiment.h"
#include "core/strategy.h"
#include "core/validate.h"
#include "tests/support/experiments.h"

using namespace pipegrid;
using namespace pipegrid::testing;

namespace {

std::string schedule_text(const std::string& name, int p, int m) {
  Experiment e =
      chain_experiment(p, m, 1e-3, 2e-3, name, make_switch_cluster(p, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  return to_text(run->schedule, device_names(e.cluster));
}

}  // namespace

TEST_CASE("golden: 1f1b action lists for p = 4, m = 8") {
  // Stage i: min(p - i - 1, m) warm-up forwards, then F/B alternating, then the remaining B.
  CHECK(schedule_text("1f1b", 4, 8) ==
        "gpu0: 0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0F6 0B3 0F7 0B4 0B5 0B6 0B7\n"
        "gpu1: 1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1F6 1B4 1F7 1B5 1B6 1B7\n"
        "gpu2: 2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2F6 2B5 2F7 2B6 2B7\n"
        "gpu3: 3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5 3F6 3B6 3F7 3B7\n");
}

TEST_CASE("the MoE overlap's combined order applies without a pipeline only") {
  // Megatron-Core's order under --overlap-moe-expert-parallel-comm without pipelining (combined_1f1b.py):
  // F0, then F(k) with B(k-1), then B(m-1); pairs (F1, B0), (F2, B1).
  Schedule one;
  one.device_actions = {{{0, Pass::Forward, 0},
                         {0, Pass::Backward, 0},
                         {0, Pass::Forward, 1},
                         {0, Pass::Backward, 1},
                         {0, Pass::Forward, 2},
                         {0, Pass::Backward, 2}}};
  pair_forward_backward(one);
  CHECK(to_text(one, {"gpu0"}) == "gpu0: 0F0 (0F1;0B0) (0F2;0B1) 0B2\n");
  CHECK(one.paired[0] == std::vector<char>{0, 1, 0, 1, 0, 0});
  // A 1F1B pipeline's last stage runs F0 B0 F1 B1 ... too and keeps it (its backwards feed the stage
  // before); the other stages pair their steady state's F with the B after it as before.
  Experiment e =
      chain_experiment(2, 4, 1e-3, 2e-3, "1f1b", make_switch_cluster(2, "gpu", test_device(), 1e9, 0));
  Result<PreparedRun> run = prepare(e);
  REQUIRE(run.ok());
  Schedule s = run->schedule;
  pair_forward_backward(s);
  CHECK(s.device_actions == run->schedule.device_actions);
  CHECK(to_text(s, device_names(e.cluster)) ==
        "gpu0: 0F0 (0F1;0B0) (0F2;0B1) (0F3;0B2) 0B3\n"
        "gpu1: 1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3\n");
  CHECK(s.paired[0] == std::vector<char>{0, 1, 0, 1, 0, 1, 0, 0});
  CHECK(s.paired[1] == std::vector<char>(8, 0));
}

TEST_CASE("golden: gpipe action lists for p = 4, m = 8") {
  CHECK(schedule_text("gpipe", 4, 8) ==
        "gpu0: 0F0 0F1 0F2 0F3 0F4 0F5 0F6 0F7 0B0 0B1 0B2 0B3 0B4 0B5 0B6 0B7\n"
        "gpu1: 1F0 1F1 1F2 1F3 1F4 1F5 1F6 1F7 1B0 1B1 1B2 1B3 1B4 1B5 1B6 1B7\n"
        "gpu2: 2F0 2F1 2F2 2F3 2F4 2F5 2F6 2F7 2B0 2B1 2B2 2B3 2B4 2B5 2B6 2B7\n"
        "gpu3: 3F0 3F1 3F2 3F3 3F4 3F5 3F6 3F7 3B0 3B1 3B2 3B3 3B4 3B5 3B6 3B7\n");
}

TEST_CASE("1f1b with fewer micro-batches than stages warms up with every micro-batch") {
  CHECK(schedule_text("1f1b", 4, 2) ==
        "gpu0: 0F0 0F1 0B0 0B1\n"
        "gpu1: 1F0 1F1 1B0 1B1\n"
        "gpu2: 2F0 2F1 2B0 2B1\n"
        "gpu3: 3F0 3B0 3F1 3B1\n");
}

TEST_CASE("every registered schedule validates and is deadlock-free for p in 1..8, m in 1..3p") {
  for (const ScheduleStrategy& s : schedule_strategies()) {
    for (int chunks : {2, 3, 4}) {
      if (chunks > 2 && s.name != "interleaved-1f1b") continue;
      for (int p = 1; p <= 8; ++p) {
        for (int m = 1; m <= 3 * p; ++m) {
          if (!schedule_takes(std::string(s.name), p, m)) continue;
          Experiment e = schedule_experiment(std::string(s.name), p, m,
                                             make_switch_cluster(p, "gpu", test_device(), 1e9, 0), chunks);
          Result<PreparedRun> run = prepare(e);  // validates and checks for deadlock
          INFO(s.name << " chunks=" << chunks << " p=" << p << " m=" << m << ": "
                      << (run ? "" : run.error().message));
          REQUIRE(run.ok());
          // Every (stage, micro-batch) runs F and B (and W when split) on each of its devices.
          size_t compute = 0;
          for (const Task& t : run->graph.tasks) compute += t.is_compute() && t.kind != TaskKind::Optimizer;
          const size_t per = run->schedule.split_backward ? 3 : 2;
          size_t runs = 0;  // (stage, micro-batch) pairs: DualPipe's stages run half the micro-batches each
          for (size_t st = 0; st < run->partition.stage_count(); ++st)
            for (int k = 0; k < m; ++k) runs += run->partition.stage(st).runs(k, m);
          CHECK(compute == per * runs);
        }
      }
    }
  }
}

TEST_CASE("actions parse in torch's text form") {
  CHECK(*parse_action("2F0") == Action{2, Pass::Forward, 0});
  CHECK(*parse_action("11B13") == Action{11, Pass::Backward, 13});
  CHECK(*parse_action("1W3") == Action{1, Pass::Weight, 3});
  CHECK(*parse_action("1I3") == Action{1, Pass::Backward, 3});
  CHECK(parse_action("F0").error().message ==
        "expected an action like \"2F0\" (stage, F/B/W, micro-batch), got \"F0\"");
  CHECK(!parse_action("1X0").ok());
  CHECK(!parse_action("1F").ok());
  CHECK(!parse_action("1F0x").ok());
}

TEST_CASE("the validator rejects a backward before its forward, marking it in the device's list") {
  Experiment e =
      chain_experiment(2, 2, 1e-3, 2e-3, "1f1b", make_switch_cluster(2, "gpu", test_device(), 1e9, 0));
  PreparedRun run = *prepare(e);
  Schedule bad = run.schedule;
  bad.device_actions[1] = {
      {1, Pass::Forward, 1}, {1, Pass::Backward, 0}, {1, Pass::Forward, 0}, {1, Pass::Backward, 1}};
  Status s = validate_schedule(bad, run.partition, 2, device_names(e.cluster));
  CHECK(s.error().message ==
        "invalid schedule: on gpu1, 1B0 comes before its forward 1F0\n"
        "  gpu1: 1F1 [1B0] 1F0 1B1");
  Schedule missing = run.schedule;
  missing.device_actions[0].pop_back();
  CHECK(validate_schedule(missing, run.partition, 2, device_names(e.cluster)).error().message ==
        "invalid schedule: gpu0 hosts stage 0 but never runs 0B1");
  Schedule wrong = run.schedule;
  wrong.device_actions[0][0].stage = 1;
  CHECK(validate_schedule(wrong, run.partition, 2, device_names(e.cluster)).error().message ==
        "invalid schedule: on gpu0, 1F0: stage 1 runs on gpu1\n"
        "  gpu0: [1F0] 0F1 0B0 0B1");
}

TEST_CASE("the validator names every other kind of bad action at its place") {
  Experiment e =
      chain_experiment(2, 2, 1e-3, 2e-3, "1f1b", make_switch_cluster(2, "gpu", test_device(), 1e9, 0));
  PreparedRun run = *prepare(e);
  const std::vector<std::string> names = device_names(e.cluster);
  auto message = [&](std::vector<Action> gpu1, bool split = false) {
    Schedule s = run.schedule;
    s.device_actions[1] = std::move(gpu1);
    s.split_backward = split;
    if (split)  // gpu0 complete with its weight passes, so that gpu1 is the first wrong device
      s.device_actions[0] = {{0, Pass::Forward, 0}, {0, Pass::Backward, 0}, {0, Pass::Weight, 0},
                             {0, Pass::Forward, 1}, {0, Pass::Backward, 1}, {0, Pass::Weight, 1}};
    return validate_schedule(s, run.partition, 2, names).error().message;
  };
  const Action f0{1, Pass::Forward, 0}, f1{1, Pass::Forward, 1}, b0{1, Pass::Backward, 0},
      b1{1, Pass::Backward, 1};
  CHECK(message({f0, f0, b0, f1, b1}) ==
        "invalid schedule: on gpu1, 1F0 appears twice\n  gpu1: 1F0 [1F0] 1B0 1F1 1B1");
  CHECK(message({f0, {2, Pass::Forward, 1}, b0, f1, b1}) ==
        "invalid schedule: on gpu1, 2F1 names stage 2, but there are 2 stages\n"
        "  gpu1: 1F0 [2F1] 1B0 1F1 1B1");
  CHECK(message({f0, b0, {1, Pass::Forward, 2}, b1}) ==
        "invalid schedule: on gpu1, 1F2 names micro-batch 2, but there are 2 micro-batches\n"
        "  gpu1: 1F0 1B0 [1F2] 1B1");
  CHECK(message({f0, b0, {1, Pass::Forward, -1}, b1}) ==
        "invalid schedule: on gpu1, 1F-1 names micro-batch -1, but there are 2 micro-batches\n"
        "  gpu1: 1F0 1B0 [1F-1] 1B1");
  CHECK(message({f0, b0, {1, Pass::Weight, 0}, f1, b1}) ==
        "invalid schedule: on gpu1, 1W0 is a weight-gradient pass, but the backward is not split\n"
        "  gpu1: 1F0 1B0 [1W0] 1F1 1B1");
  CHECK(message({f0, {1, Pass::Weight, 0}, b0}, true) ==
        "invalid schedule: on gpu1, 1W0 comes before its backward 1B0\n  gpu1: 1F0 [1W0] 1B0");
  // Split backward, every pass present but 1W1: the first hole is named.
  CHECK(message({f0, b0, {1, Pass::Weight, 0}, f1, b1}, true) ==
        "invalid schedule: gpu1 hosts stage 1 but never runs 1W1");
}

TEST_CASE("a schedule CSV saved with a UTF-8 byte-order mark reads as without it") {
  // Spreadsheets save CSV with a BOM; its first cell was read as "\xEF\xBB\xBF0F0" and refused.
  const std::string csv = "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n";
  Result<Schedule> plain = parse_schedule_csv(csv, "s.csv");
  Result<Schedule> marked = parse_schedule_csv("\xEF\xBB\xBF" + csv, "s.csv");
  REQUIRE(plain.ok());
  REQUIRE(marked.ok());
  REQUIRE(marked->device_actions.size() == 2);
  for (size_t d = 0; d < 2; ++d) {
    REQUIRE(marked->device_actions[d].size() == plain->device_actions[d].size());
    for (size_t i = 0; i < plain->device_actions[d].size(); ++i) {
      CHECK(marked->device_actions[d][i].stage == plain->device_actions[d][i].stage);
      CHECK(marked->device_actions[d][i].pass == plain->device_actions[d][i].pass);
      CHECK(marked->device_actions[d][i].micro_batch == plain->device_actions[d][i].micro_batch);
    }
  }
}

TEST_CASE("torch's OVERLAP_F_B cells read as overlapped pairs, forward first, and are written back alike") {
  Result<Schedule> s =
      parse_schedule_csv("0F0,(0F1;3B0)OVERLAP_F_B,3W0\n1F0,\"(2I0; 1F1)OVERLAP_F_B\"\n", "v.csv");
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
  REQUIRE(s->device_actions.size() == 2);
  CHECK(s->device_actions[0] ==
        std::vector<Action>{
            {0, Pass::Forward, 0}, {0, Pass::Forward, 1}, {3, Pass::Backward, 0}, {3, Pass::Weight, 0}});
  CHECK(s->device_actions[1] ==
        std::vector<Action>{{1, Pass::Forward, 0}, {1, Pass::Forward, 1}, {2, Pass::Backward, 0}});
  CHECK(!s->is_paired(0, 0));
  CHECK(s->is_paired(0, 1));
  CHECK(!s->is_paired(0, 2));
  CHECK(s->is_paired(1, 1));
  CHECK(s->split_backward);
  CHECK(s->location(0, 2) == "v.csv:1:5: ");  // both halves of a pair point at its cell
  // A split backward's input gradient is torch's BACKWARD_INPUT, "I", in the CSV pipegrid writes.
  CHECK(to_csv(*s) == "0F0,(0F1;3I0)OVERLAP_F_B,3W0\n1F0,(1F1;2I0)OVERLAP_F_B\n");
  CHECK(to_text(*s, {"gpu0", "gpu1"}) == "gpu0: 0F0 (0F1;3B0) 3W0\ngpu1: 1F0 (1F1;2B0)\n");
}

TEST_CASE("an OVERLAP_F_B cell that is not one forward and one backward is refused where it is") {
  const std::string expected =
      "expected an overlapped pair like \"(3F1;0B0)OVERLAP_F_B\" (a forward and a "
      "backward of another stage or micro-batch), got ";
  for (const char* cell :
       {"(0F1;0F2)OVERLAP_F_B", "(0F1;1W0)OVERLAP_F_B", "(0F1;1B0)OVERLAP", "(0F1)OVERLAP_F_B",
        "(0F1;1B0;1B1)OVERLAP_F_B", "(0F1;0B1)OVERLAP_F_B(", "(0F1;0B1", "(0F1;x)OVERLAP_F_B"}) {
    INFO(cell);
    Result<Schedule> s = parse_schedule_csv(std::string("0F0,") + cell + "\n", "v.csv");
    REQUIRE(!s.ok());
    CHECK(s.error().message == "v.csv:1:5: " + expected + "\"" + cell + "\"");
  }
  // The same forward and backward pass of one stage and micro-batch cannot overlap (B needs F).
  Result<Schedule> same = parse_schedule_csv("(0F1;0B1)OVERLAP_F_B\n", "v.csv");
  REQUIRE(!same.ok());
  CHECK(same.error().message.starts_with("v.csv:1:1: expected an overlapped pair"));
}

TEST_CASE("a schedule file's placement: the rank whose rows run each stage, V or interleaved") {
  // torch's V (ScheduleDualPipeV, ScheduleZBVZeroBubble): stages 0 and 3 on rank 0, 1 and 2 on rank 1.
  Result<Schedule> v = parse_schedule_csv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", "v.csv");
  REQUIRE(v.ok());
  CHECK(file_stage_ranks(*v, 2, 2, 1) == std::vector<int>{0, 1, 1, 0});
  // Two devices per rank (t or d = 2): rows 0 and 1 are rank 0.
  Result<Schedule> wide = parse_schedule_csv("0F0,3F0\n0F0,3F0\n1F0,2F0\n1F0,2F0\n", "w.csv");
  REQUIRE(wide.ok());
  CHECK(file_stage_ranks(*wide, 2, 2, 2) == std::vector<int>{0, 1, 1, 0});
  Result<Schedule> interleaved = parse_schedule_csv("0F0,2F0\n1F0,3F0\n", "i.csv");
  REQUIRE(interleaved.ok());
  CHECK(file_stage_ranks(*interleaved, 2, 2, 1) == std::vector<int>{0, 1, 0, 1});
  // No placement: a stage on two ranks, a rank with three stages, a stage missing, a stage past the count.
  for (const char* csv :
       {"0F0,3F0\n1F0,2F0,0F1\n", "0F0,3F0,1F0\n2F0\n", "0F0,3F0\n1F0\n", "0F0,4F0\n1F0,2F0\n"}) {
    INFO(csv);
    Result<Schedule> s = parse_schedule_csv(csv, "x.csv");
    REQUIRE(s.ok());
    CHECK(file_stage_ranks(*s, 2, 2, 1).empty());
  }
}

TEST_CASE(
    "torch's FULL_BACKWARD (B) in a schedule that splits the backward: the input gradient, then its W") {
  // torch's ScheduleDualPipeV mixes I + W with B, the whole backward, in and out of OVERLAP_F_B cells.
  Result<Schedule> s =
      parse_schedule_csv("0F0,0I0,0W0,0F1,0B1,(0F2;1B0)OVERLAP_F_B,0I2\n1F0,1B1,1W1\n", "t.csv");
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
  CHECK(s->split_backward);
  const Action f0{0, Pass::Forward, 0}, b0{0, Pass::Backward, 0}, w0{0, Pass::Weight, 0},
      f1{0, Pass::Forward, 1}, b1{0, Pass::Backward, 1}, w1{0, Pass::Weight, 1}, f2{0, Pass::Forward, 2},
      sb0{1, Pass::Backward, 0}, sw0{1, Pass::Weight, 0}, b2{0, Pass::Backward, 2};
  CHECK(s->device_actions[0] == std::vector<Action>{f0, b0, w0, f1, b1, w1, f2, sb0, sw0, b2});
  CHECK(s->is_paired(0, 6));
  CHECK(!s->is_paired(0, 7));
  CHECK(!s->is_paired(0, 8));
  CHECK(s->location(0, 5) == "t.csv:1:17: ");  // the inserted W points at its B
  CHECK(s->location(0, 8) == "t.csv:1:21: ");
  // A B with its own W in the row is an input gradient (pipegrid's CSVs wrote it so before "I"): kept.
  CHECK(s->device_actions[1] ==
        std::vector<Action>{{1, Pass::Forward, 0}, {1, Pass::Backward, 1}, {1, Pass::Weight, 1}});
  // Without any W the backward is not split and B is the whole backward, as before.
  Result<Schedule> plain = parse_schedule_csv("0F0,0B0\n", "p.csv");
  REQUIRE(plain.ok());
  CHECK(!plain->split_backward);
  CHECK(plain->device_actions[0].size() == 2);
}

TEST_CASE(
    "interleaved-1f1b under Megatron-Core's A2A overlap: one more warm-up forward, the steady state paired") {
  // p 2, v 2 (stages 0 and 2 on rank 0, 1 and 3 on rank 1), m 4. Megatron's table: (micro-batch,
  // chunk) (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1); the warm-up 2 (p - r - 1) + (v - 1) p, plus
  // one under the overlap (schedules.py): 5 forwards on rank 0, 3 on rank 1; then each forward with the
  // next backward as one pair; the cool-down's backwards alone. Counted by hand from the table.
  Experiment e = chain_experiment(4, 4, 1e-3, 2e-3, "interleaved-1f1b",
                                  make_switch_cluster(2, "gpu", test_device(), 1e9, 0));
  e.strategy.chunks = 2;
  Result<PreparedRun> run = prepare(e);
  REQUIRE_MESSAGE(run.ok(), (run.ok() ? "" : run.error().message));
  Result<Schedule> s = schedule_interleaved_1f1b({run->partition, 2, 4, 2, {}, {}, true});
  REQUIRE_MESSAGE(s.ok(), (s.ok() ? "" : s.error().message));
  CHECK(to_text(*s, {"gpu0", "gpu1"}) ==
        "gpu0: 0F0 0F1 2F0 2F1 0F2 (0F3;2B0) (2F2;2B1) (2F3;0B0) 0B1 2B2 2B3 0B2 0B3\n"
        "gpu1: 1F0 1F1 3F0 (3F1;3B0) (1F2;3B1) (1F3;1B0) (3F2;1B1) (3F3;3B2) 3B3 1B2 1B3\n");
  // pair_forward_backward keeps a schedule's own pairs: the warm-up's last forward before the
  // cool-down's first backward (2F1 2B0 at m = p = 2 on rank 0) is not a pair, which had deadlocked.
  Schedule kept = *s;
  pair_forward_backward(kept);
  CHECK(kept.paired == s->paired);
  Result<Schedule> two = schedule_interleaved_1f1b({run->partition, 2, 2, 2, {}, {}, true});
  REQUIRE(two.ok());
  CHECK(to_text(*two, {"gpu0", "gpu1"}) ==
        "gpu0: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1\ngpu1: 1F0 1F1 3F0 (3F1;3B0) 3B1 1B0 1B1\n");
}

TEST_CASE("round-robin turns keep an overlapped pair only where both of its passes stay") {
  // One stage on 2 round-robin replicas (gpu0 takes the even micro-batches, gpu1 the odd), 4
  // micro-batches; each device's list F0 (F1;B0) (F2;B1) (F3;B2) B3. On gpu0 the pair (F2;B1) loses B1 and
  // (F1;B0) loses F1: no pair is left whole; gpu0 keeps F0 B0 F2 B2 unpaired. On gpu1: F1 B1 F3 B3.
  ChainSpec spec;
  spec.layers = 1;
  spec.forward_s = 1e-3;
  spec.backward_s = 1e-3;
  const Workload w = make_chain(spec);
  Result<Partition> part = make_partition(w, {0}, {{0, 1}}, 2);
  REQUIRE(part.ok());
  part->graph[0].round_robin = true;
  Schedule s;
  const auto f = [](int k) { return Action{0, Pass::Forward, k}; };
  const auto b = [](int k) { return Action{0, Pass::Backward, k}; };
  const std::vector<Action> order = {f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)};
  s.device_actions = {order, order};
  s.paired = {{0, 1, 0, 1, 0, 1, 0, 0}, {0, 1, 0, 1, 0, 1, 0, 0}};
  keep_round_robin_turns(s, *part);
  CHECK(s.device_actions[0] == std::vector<Action>{f(0), b(0), f(2), b(2)});
  CHECK(s.device_actions[1] == std::vector<Action>{f(1), b(1), f(3), b(3)});
  CHECK(s.paired[0] == std::vector<char>(4, 0));
  CHECK(s.paired[1] == std::vector<char>(4, 0));
  // A pair of two kept passes stays one: on 2 replicas with the order F0 F2 (F4;B0) ..., gpu0 keeps it.
  Schedule t;
  t.device_actions = {{f(0), f(2), f(4), b(0), b(2), b(4)}, {}};
  t.paired = {{0, 0, 1, 0, 0, 0}, {}};
  keep_round_robin_turns(t, *part);
  CHECK(t.device_actions[0].size() == 6);
  CHECK(t.paired[0] == std::vector<char>{0, 0, 1, 0, 0, 0});
}
