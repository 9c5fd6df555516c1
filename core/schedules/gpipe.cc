// GPipe: every stage runs all forwards (micro-batches in order), then all backwards (in order, as
// torch.distributed.pipelining's ScheduleGPipe does). The backward is not split.
#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_gpipe(const ScheduleRequest& r) {
  const int m = r.micro_batches;
  std::vector<std::vector<Action>> stages(r.partition.stage_count());
  for (size_t s = 0; s < stages.size(); ++s) {
    const int st = static_cast<int>(s);
    for (int k = 0; k < m; ++k) stages[s].push_back({st, Pass::Forward, k});
    for (int k = 0; k < m; ++k) stages[s].push_back({st, Pass::Backward, k});
  }
  return place_stage_actions(r, stages, "gpipe");
}

}  // namespace pipegrid
