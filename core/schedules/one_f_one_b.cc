// Synchronous 1F1B (PipeDream-Flush, DAPPLE, Megatron): stage i (0-based) of p runs
// min(p - i - 1, m) warm-up forwards, then alternates one forward and one backward, then drains the
// remaining backwards. The stage index is its position in the (topologically numbered) stage
// graph, so linearised DAGs with skip edges are scheduled as chains (stage numbering is
// topological, so every dependency points to a higher stage for F and a lower one for B, as in a
// chain: no deadlock). The backward is not split.
//
// Round-robin replicas (Stage::round_robin, PipeDream's 1F1B-RR): each replica of stage i admits
// a_i = ceil(W_i / r_i) forwards before its first backward, W_i the workers of stages i .. p - 1 and
// r_i stage i's replicas (PipeDream's NUM_OPT_ACTIVE_MINIBATCHES, section 3.2 of the SOSP'19 paper,
// applied at every stage; p - i for r replicas everywhere). The stage's order then warms up
// (a_i - 1) r_i forwards, so that keep_round_robin_turns leaves each replica 1F1B with its own warm-up.
#include <algorithm>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_1f1b(const ScheduleRequest& r) {
  const int m = r.micro_batches;
  const int p = static_cast<int>(r.partition.stage_count());
  std::vector<std::vector<Action>> stages(p);
  int workers = 0;  // of stages i .. p - 1
  for (int i = p - 1; i >= 0; --i) {
    const Stage& st = r.partition.stage(static_cast<size_t>(i));
    workers += st.replicas();
    const int admitted = (workers + st.replicas() - 1) / st.replicas();
    auto& a = stages[i];
    const int warmup = std::min(st.round_robin ? (admitted - 1) * st.replicas() : p - i - 1, m);
    for (int k = 0; k < warmup; ++k) a.push_back({i, Pass::Forward, k});
    for (int k = 0; k < m - warmup; ++k) {
      a.push_back({i, Pass::Forward, warmup + k});
      a.push_back({i, Pass::Backward, k});
    }
    for (int k = m - warmup; k < m; ++k) a.push_back({i, Pass::Backward, k});
  }
  return place_stage_actions(r, stages, "1f1b");
}

}  // namespace pipegrid
