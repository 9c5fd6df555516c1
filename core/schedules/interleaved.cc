// Interleaved 1F1B (Megatron-LM, Narayanan et al. SC'21): each of p ranks holds v model chunks;
// stage s = chunk (s div p) of rank (s mod p). Rank r runs forward chunk-steps in the order of a
// schedule table and backward chunk-steps in the same table order with chunks reversed:
//   table = for each group of micro-batches: for chunk c in 0..v-1: for micro-batch in the group,
// warm-up = min(2 (p - r - 1) + (v - 1) g, m v) forward chunk-steps, then one forward / one
// backward, then the remaining backwards. With m a multiple of p the groups hold p micro-batches
// and this is exactly Megatron's order (closed form m (T_F + T_BW) + (p - 1)(T_F + T_BW) / v).
// With v = 1 the warm-up is 1F1B's p - r - 1. Under Megatron-Core's A2A overlap
// (ScheduleRequest::a2a_overlap) the warm-up has one forward chunk-step more and each steady-state
// step's forward and backward run as one overlapped pair; the warm-up's and cool-down's passes alone.
// For other m, Megatron requires divisibility; pipegrid splits the m micro-batches into
// floor(m / p) groups as equal as possible (one group of m when m < p) and uses the largest group
// size g in the warm-up, which keeps every p <= 8, m <= 3p, v <= 4 deadlock-free (tested).
#include <fmt/format.h>

#include <algorithm>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_interleaved_1f1b(const ScheduleRequest& r) {
  const int v = r.chunks;
  Result<int> ranks = interleaved_ranks(r.partition, v, "interleaved-1f1b");
  if (!ranks) return ranks.error();
  const int p = *ranks;
  const int m = r.micro_batches;

  // Groups of micro-batches, then the (micro-batch, chunk) table.
  const int groups = std::max(1, m / p);
  std::vector<std::pair<int, int>> table;  // (micro-batch, chunk)
  int largest = 0;
  for (int gi = 0, first = 0; gi < groups; ++gi) {
    const int size = m / groups + (gi < m % groups ? 1 : 0);
    largest = std::max(largest, size);
    for (int c = 0; c < v; ++c)
      for (int k = first; k < first + size; ++k) table.emplace_back(k, c);
    first += size;
  }
  const int total = m * v;

  Schedule s;
  s.device_actions.resize(r.device_count);
  for (int rank = 0; rank < p; ++rank) {
    auto forward = [&](int step) {
      return Action{table[step].second * p + rank, Pass::Forward, table[step].first};
    };
    auto backward = [&](int step) {
      return Action{(v - 1 - table[step].second) * p + rank, Pass::Backward, table[step].first};
    };
    std::vector<Action> a;
    // With one chunk this is plain 1F1B (Megatron then uses its non-interleaved schedule).
    const int warmup =
        v == 1 ? std::min(p - rank - 1, total)
               : std::min(2 * (p - rank - 1) + (v - 1) * largest + (r.a2a_overlap ? 1 : 0), total);
    int f = 0, b = 0;
    std::vector<char> paired;
    for (; f < warmup; ++f) a.push_back(forward(f));
    while (f < total) {
      if (r.a2a_overlap) {
        paired.resize(a.size() + 2, 0);
        paired[a.size()] = 1;
      }
      a.push_back(forward(f++));
      a.push_back(backward(b++));
    }
    while (b < total) a.push_back(backward(b++));
    if (!paired.empty()) paired.resize(a.size(), 0);
    for (int d : r.partition.stage(rank).devices) {
      if (!s.device_actions[d].empty())
        return Error{fmt::format("interleaved-1f1b: device {} serves two ranks", d)};
      s.device_actions[d] = a;
      if (!paired.empty()) {
        s.paired.resize(r.device_count);
        s.paired[d] = paired;
      }
    }
  }
  return s;
}

}  // namespace pipegrid
