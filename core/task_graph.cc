#include "core/task_graph.h"

namespace pipegrid {

// Counting sort of the added dependencies by source task, stable: each task's successors keep the
// order they were added in (the executor launches them in that order), packed rows first.
void TaskGraph::pack() const {
  const size_t n = tasks.size();
  std::vector<uint32_t> row;
  assign_huge(row, n + 1, uint32_t{0});
  for (size_t t = 0; t + 1 < row_.size() && t < n; ++t) row[t + 1] = row_[t + 1] - row_[t];
  for (auto [before, after] : added_) ++row[static_cast<size_t>(before) + 1];
  for (size_t t = 0; t < n; ++t) row[t + 1] += row[t];
  std::vector<int32_t> next;
  assign_huge(next, row[n], int32_t{0});
  std::vector<uint32_t> fill(row.begin(), row.end() - 1);
  for (size_t t = 0; t + 1 < row_.size() && t < n; ++t)
    for (uint32_t i = row_[t]; i < row_[t + 1]; ++i) next[fill[t]++] = next_[i];
  for (auto [before, after] : added_) next[fill[before]++] = after;
  row_ = std::move(row);
  next_ = std::move(next);
  std::vector<std::pair<int32_t, int32_t>>().swap(added_);
}

void TaskGraph::renumber(const std::vector<int32_t>& order) {
  const size_t n = tasks.size();
  if (!added_.empty() || row_.size() != n + 1) pack();
  std::vector<int32_t> id(n);
  for (size_t i = 0; i < n; ++i) id[order[i]] = static_cast<int32_t>(i);
  // Successor rows rebuilt in the new order (they change length), into new arrays.
  std::vector<int32_t> next;
  assign_huge(next, next_.size(), int32_t{0});
  std::vector<uint32_t> row;
  assign_huge(row, n + 1, uint32_t{0});
  for (size_t i = 0; i < n; ++i) {
    const int32_t old = order[i];
    row[i + 1] = row[i];
    for (uint32_t k = row_[old]; k < row_[old + 1]; ++k) next[row[i + 1]++] = id[next_[k]];
  }
  row_ = std::move(row);
  next_ = std::move(next);
  // Tasks and predecessor counts permuted in place, one cycle of the permutation at a time (no copy of
  // the largest array: fewer pages to fault in).
  std::vector<bool> placed(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (placed[i]) continue;
    const Task task = tasks[i];
    const int32_t count = predecessor_count[i];
    size_t j = i;
    for (;;) {
      placed[j] = true;
      const auto k = static_cast<size_t>(order[j]);
      if (k == i) {
        tasks[j] = task;
        predecessor_count[j] = count;
        break;
      }
      tasks[j] = tasks[k];
      predecessor_count[j] = predecessor_count[k];
      j = k;
    }
  }
  for (auto& d : device_order)
    for (int32_t& x : d) x = id[x];
  for (MemoryChange& c : memory_changes) c.task = id[c.task];
}

}  // namespace pipegrid
