// DualPipe and DualPipeV (DeepSeek-V3, arXiv 2412.19437, section 3.2.1; deepseek-ai/DualPipe, whose
// step structure this follows; docs/schedules.md): each of N ranks holds two model chunks and runs
// micro-batches in two phases, with zero-bubble splits of the backward (B: input gradient; W: weight
// gradient, deferred to fill the pipeline's gaps) at the ends.
//
// DualPipeV ("cut-in-half", V-shape): the model in 2N stages, rank r holding stage r (phase 0) and
// stage 2N - 1 - r (phase 1); every micro-batch enters at rank 0, goes down to rank N - 1 and back up.
// DualPipe (bidirectional): the model in N stages, each rank r holding stage r of the "down" pipeline
// (micro-batches 0 .. M/2 - 1 enter at rank 0) and stage r of the "up" pipeline placed on rank
// N - 1 - r (micro-batches M/2 .. M - 1 enter at rank N - 1): two copies of the parameters, their
// gradients summed between mirror ranks. Per rank, with (for DualPipeV) H = N, h = r, C = M, or (for
// DualPipe) H = N/2, h = min(r, N - 1 - r), C = M/2, phase 0 being the direction that enters at the
// rank's own end:
//   1. 2 (H - h - 1) x F0
//   2. (h + 1) x [F0, F1]
//   3. (H - h - 1) x [B1 (W deferred), W, F1]
//   4. (C - 2H + h + 1) x [F0 & B1, F1 & B0]      (the overlapped forward-backward pairs)
//   5. (H - h - 1) x [B1, F1 & B0]
//   6. (h + 1) x [B1, B0], the second half with W deferred
//   7. (H - h - 1) x [W, B0 (W deferred)]
//   8. (h + 1) x W
// A B without a deferred W is followed by its W at once (pipegrid's split backward); W runs the
// oldest deferred weight gradient. Each phase runs C forwards and C backwards, in micro-batch order.
#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "core/strategy.h"

namespace pipegrid {
namespace {

// One rank's list being built.
class DualRank {
 public:
  DualRank(int stage0, int stage1, int first0, int first1)
      : stage_{stage0, stage1}, next_f_{first0, first1}, next_b_{first0, first1} {}
  void forward(int d) {
    out_.push_back({stage_[d], Pass::Forward, next_f_[d]++});
    paired_.push_back(0);
  }
  // A forward and a backward as one overlapped unit (F&B).
  void forward_backward(int f, int b) {
    forward(f);
    paired_.back() = 1;
    backward(b);
  }
  // A backward; `defer`: its weight gradient waits for a later W.
  void backward(int d, bool defer = false) {
    const int k = next_b_[d]++;
    out_.push_back({stage_[d], Pass::Backward, k});
    paired_.push_back(0);
    if (defer) {
      deferred_.push_back({stage_[d], Pass::Weight, k});
    } else {
      out_.push_back({stage_[d], Pass::Weight, k});
      paired_.push_back(0);
    }
  }
  void weight() {
    if (deferred_.empty()) return;
    out_.push_back(deferred_.front());
    paired_.push_back(0);
    deferred_.pop_front();
  }
  std::pair<std::vector<Action>, std::vector<char>> take() { return {std::move(out_), std::move(paired_)}; }

 private:
  int stage_[2], next_f_[2], next_b_[2];
  std::deque<Action> deferred_;
  std::vector<Action> out_;
  std::vector<char> paired_;
};

using RankList = std::pair<std::vector<Action>, std::vector<char>>;

RankList dual_order(int H, int h, int C, int stage0, int stage1, int first0, int first1) {
  DualRank r(stage0, stage1, first0, first1);
  for (int i = 0; i < 2 * (H - h - 1); ++i) r.forward(0);
  for (int i = 0; i < h + 1; ++i) r.forward(0), r.forward(1);
  for (int i = 0; i < H - h - 1; ++i) r.backward(1, true), r.weight(), r.forward(1);
  for (int i = 0; i < C - 2 * H + h + 1; ++i) r.forward_backward(0, 1), r.forward_backward(1, 0);
  for (int i = 0; i < H - h - 1; ++i) r.backward(1), r.forward_backward(1, 0);
  for (int i = 0, done = 0; i < h + 1; ++i) {  // the second half of these 2 (h + 1) backwards defer W
    r.backward(1, done++ >= h + 1);
    r.backward(0, done++ >= h + 1);
  }
  for (int i = 0; i < H - h - 1; ++i) r.weight(), r.backward(0, true);
  for (int i = 0; i < h + 1; ++i) r.weight();
  return r.take();
}

Result<Schedule> place(const ScheduleRequest& r, const std::vector<RankList>& rank_actions,
                       const std::vector<int>& rank_stage) {
  Schedule s;
  s.split_backward = true;
  s.device_actions.resize(r.device_count);
  s.paired.resize(r.device_count);
  for (size_t q = 0; q < rank_actions.size(); ++q)
    for (int d : r.partition.stage(rank_stage[q]).devices) {
      s.device_actions[d] = rank_actions[q].first;
      s.paired[d] = rank_actions[q].second;
    }
  return s;
}

}  // namespace

Result<int> v_ranks(const Partition& p, std::string_view name) {
  const int S = static_cast<int>(p.stage_count());
  if (S < 2 || S % 2 != 0)
    return Error{
        fmt::format("{} needs the model in 2 chunks per rank (chunks: 2), an even stage count; the "
                    "partition has {} stages",
                    name, S)};
  const int N = S / 2;
  for (int s = N; s < S; ++s)
    if (p.stage(s).devices != p.stage(S - 1 - s).devices)
      return Error{
          fmt::format("{}: stage {} must run on the devices of stage {} (a V: stage s and stage "
                      "2N - 1 - s on rank s)",
                      name, s, S - 1 - s)};
  return N;
}

Result<int> dualpipe_ranks(const Partition& p, int micro_batches, std::string_view name) {
  Result<int> ranks = v_ranks(p, name);
  if (!ranks) return ranks;
  const int N = *ranks;
  for (int s = 0; s < 2 * N; ++s) {
    const Stage& st = p.stage(s);
    const int mirror = s < N ? s + N : s - N;
    if (st.route != (s < N ? 1 : 2) || st.mirror != mirror || st.layers != p.stage(mirror).layers)
      return Error{
          fmt::format("{} runs two pipelines (stages 0 .. N - 1 and their copies N .. 2N - 1, each on "
                      "half the micro-batches): partition with schedule: dualpipe so that the "
                      "partitioner builds them; stage {} is not one",
                      name, s)};
  }
  (void)micro_batches;
  return N;
}

std::optional<std::string> dual_pipeline_refusal(std::string_view schedule, int N, int M) {
  if (schedule == "dualpipe" && (N % 2 != 0 || M % 2 != 0 || M < 2 * N))
    return fmt::format(
        "dualpipe needs an even rank count and an even number of micro-batches of at least 2N (DeepSeek's "
        "reference asserts it); got {} ranks and {} micro-batches",
        N, M);
  if (schedule == "dualpipev" && M < 2 * N)
    return fmt::format("dualpipev needs at least 2N = {} micro-batches on {} ranks, got {}", 2 * N, N, M);
  return std::nullopt;
}

Result<Schedule> schedule_dualpipev(const ScheduleRequest& r) {
  if (r.chunks != 2)
    return Error{fmt::format("dualpipev runs 2 model chunks per rank (chunks: 2), got chunks {}", r.chunks)};
  Result<int> ranks = v_ranks(r.partition, "dualpipev");
  if (!ranks) return ranks.error();
  const int N = *ranks, M = r.micro_batches;
  if (auto why = dual_pipeline_refusal("dualpipev", N, M)) return Error{*why};
  std::vector<RankList> lists;
  std::vector<int> rank_stage;
  for (int q = 0; q < N; ++q) {
    lists.push_back(dual_order(N, q, M, q, 2 * N - 1 - q, 0, 0));
    rank_stage.push_back(q);
  }
  return place(r, lists, rank_stage);
}

Result<Schedule> schedule_dualpipe(const ScheduleRequest& r) {
  Result<int> ranks = dualpipe_ranks(r.partition, r.micro_batches, "dualpipe");
  if (!ranks) return ranks.error();
  const int N = *ranks, M = r.micro_batches, C = M / 2, H = N / 2;
  if (auto why = dual_pipeline_refusal("dualpipe", N, M)) return Error{*why};
  std::vector<RankList> lists;
  std::vector<int> rank_stage;
  for (int q = 0; q < N; ++q) {
    // Stage q of the down pipeline (stage index q) and of the up pipeline (index N + N - 1 - q) run here.
    const int down = q, up = 2 * N - 1 - q;
    const int h = std::min(q, N - 1 - q);
    if (q < H)
      lists.push_back(dual_order(H, h, C, down, up, 0, C));
    else
      lists.push_back(dual_order(H, h, C, up, down, C, 0));
    rank_stage.push_back(q);
  }
  return place(r, lists, rank_stage);
}

}  // namespace pipegrid
