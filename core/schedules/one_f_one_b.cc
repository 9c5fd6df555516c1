// Synchronous 1F1B (PipeDream-Flush, DAPPLE, Megatron): stage i (0-based) of p runs
// min(p - i - 1, m) warm-up forwards, then alternates one forward and one backward, then drains the
// remaining backwards. The stage index is its position in the (topologically numbered) stage
// graph, so linearised DAGs with skip edges are scheduled as chains (stage numbering is
// topological, so every dependency points to a higher stage for F and a lower one for B, as in a
// chain: no deadlock). The backward is not split.
#include <algorithm>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_1f1b(const ScheduleRequest& r) {
  const int m = r.micro_batches;
  const int p = static_cast<int>(r.partition.stage_count());
  std::vector<std::vector<Action>> stages(p);
  for (int i = 0; i < p; ++i) {
    auto& a = stages[i];
    const int warmup = std::min(p - i - 1, m);
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
