// graph-1f1b: synchronous 1F1B generalised to stage DAGs (GraphPipe's schedule, our reading:
// docs/reference/papers.md, [inferred] part). A stage s runs min(m, 1 + L(s)) forwards before
// its first backward, where L(s) is the longest path, in stage edges, from s to a sink stage; then
// it alternates one backward and one forward (each backward as early as its stage's order allows),
// then drains. Stages nearer the sinks keep fewer micro-batches in flight, which is what makes a
// shallow stage graph cheaper in memory. On a chain L(i) = p - 1 - i, so this is exactly `1f1b`.
// Deadlock-free: along every stage edge s -> t, L(s) >= L(t) + 1, as in a chain.
#include <algorithm>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_graph_1f1b(const ScheduleRequest& r) {
  const Partition& p = r.partition;
  const int S = static_cast<int>(p.stage_count());
  const int m = r.micro_batches;
  // Stages are numbered topologically: longest path to a sink, from the last stage backwards.
  std::vector<int> longest(S, 0);
  for (int s = S - 1; s >= 0; --s)
    for (int t : p.successors(s)) longest[s] = std::max(longest[s], longest[t] + 1);
  std::vector<std::vector<Action>> stages(S);
  for (int s = 0; s < S; ++s) {
    auto& a = stages[s];
    const int before_first_b = std::min(m, 1 + longest[s]);
    int f = 0;
    for (; f < before_first_b; ++f) a.push_back({s, Pass::Forward, f});
    for (int b = 0; b < m; ++b) {
      a.push_back({s, Pass::Backward, b});
      if (f < m) a.push_back({s, Pass::Forward, f++});
    }
  }
  return place_stage_actions(r, stages, "graph-1f1b");
}

}  // namespace pipegrid
