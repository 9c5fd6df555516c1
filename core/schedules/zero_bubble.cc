// Zero-bubble schedules (Qi et al., ICLR'24): the backward is split into B (input gradient, on the
// critical path) and W (weight gradient, deferrable). Activations are freed after W.
//
// zb-h1 (the rule of docs/reference/closed-forms.md, checked there by an independent list
// simulation): 1F1B's warm-up (p - i - 1 forwards) and F/B alternation, and worker i runs W(k)
// once B(k + i) is done, keeping i weight-gradient passes pending; the rest at the end. Same peak
// memory as 1F1B (p micro-batches on worker 0); iteration m (T_F + T_BW) + (p - 1)(T_F + T_B - T_W)
// for m >= p.
//
// zb-h2: the order a unit-time list schedule produces (T_F = T_B = T_W) when every worker, when
// free, runs a B if one is ready, else an F if it holds fewer than 2p - 1 micro-batches in
// flight, else a W. With equal times the iteration takes m (T_F + T_BW) + (p - 1) T_F for m >= p,
// with at most 2p - 1 micro-batches in flight, and when there is a steady state (m >= 2p - 1) it is
// the paper's parallelogram: worker i is busy without a gap from i T_F on. (The paper's post-validation that
// also hides the (p - 1) T_F skew behind the optimizer step is not modelled: the iteration is synchronous.)
#include <fmt/format.h>

#include <algorithm>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_zb_h1(const ScheduleRequest& r) {
  const int p = static_cast<int>(r.partition.stage_count());
  const int m = r.micro_batches;
  std::vector<std::vector<Action>> stages(p);
  for (int i = 0; i < p; ++i) {
    auto& a = stages[i];
    const int warmup = std::min(p - i - 1, m);
    int next_f = 0;
    for (; next_f < warmup; ++next_f) a.push_back({i, Pass::Forward, next_f});
    for (int k = 0; k < m; ++k) {
      if (next_f < m) a.push_back({i, Pass::Forward, next_f++});
      a.push_back({i, Pass::Backward, k});
      if (k - i >= 0) a.push_back({i, Pass::Weight, k - i});
    }
    for (int k = std::max(0, m - i); k < m; ++k) a.push_back({i, Pass::Weight, k});
  }
  Result<Schedule> s = place_stage_actions(r, stages, "zb-h1");
  if (s) s->split_backward = true;
  return s;
}

Result<Schedule> schedule_zb_h2(const ScheduleRequest& r) {
  const int p = static_cast<int>(r.partition.stage_count());
  const int m = r.micro_batches;
  const int cap = 2 * p - 1;
  constexpr int kNever = 1 << 30;
  // Completion step of F and B of (worker, micro-batch); kNever until scheduled.
  std::vector<std::vector<int>> f_done(p, std::vector<int>(m, kNever)),
      b_done(p, std::vector<int>(m, kNever));
  std::vector<int> nf(p, 0), nb(p, 0), nw(p, 0);
  std::vector<std::vector<Action>> stages(p);
  int remaining = 3 * m * p;
  for (int t = 0; remaining > 0; ++t) {
    if (t > 6 * m * p + 4 * p) return Error{"zb-h2: the list schedule did not finish (internal error)"};
    for (int i = 0; i < p; ++i) {
      // Every pass takes one step, so a worker is free whenever it is visited.
      if (nb[i] < m && f_done[i][nb[i]] <= t && (i == p - 1 || b_done[i + 1][nb[i]] <= t)) {
        stages[i].push_back({i, Pass::Backward, nb[i]});
        b_done[i][nb[i]++] = t + 1;
      } else if (nf[i] < m && nf[i] - nw[i] < cap && (i == 0 || f_done[i - 1][nf[i]] <= t)) {
        stages[i].push_back({i, Pass::Forward, nf[i]});
        f_done[i][nf[i]++] = t + 1;
      } else if (nw[i] < nb[i] && b_done[i][nw[i]] <= t) {
        stages[i].push_back({i, Pass::Weight, nw[i]++});
      } else {
        continue;
      }
      --remaining;
    }
  }
  Result<Schedule> s = place_stage_actions(r, stages, "zb-h2");
  if (s) s->split_backward = true;
  return s;
}

}  // namespace pipegrid
