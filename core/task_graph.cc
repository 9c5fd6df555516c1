#include "core/task_graph.h"

namespace pipegrid {

std::string_view to_string(TransferKind k) {
  switch (k) {
    case TransferKind::None:
      return "none";
    case TransferKind::Activation:
      return "activation";
    case TransferKind::Gradient:
      return "gradient";
    case TransferKind::DataParallel:
      return "allreduce";
    case TransferKind::TensorParallel:
      return "tensor-parallel";
    case TransferKind::ExpertParallel:
      return "expert-parallel";
    case TransferKind::ContextParallel:
      return "context-parallel";
  }
  return "transfer";
}

bool is_group_flow(TransferKind k) {
  return k == TransferKind::TensorParallel || k == TransferKind::ExpertParallel ||
         k == TransferKind::ContextParallel;
}

bool is_collective(TransferKind k) {
  return k == TransferKind::DataParallel || is_group_flow(k);
}

// Counting sort of the added dependencies by source task, stable: each task's successors keep the
// order they were added in (the executor launches them in that order), packed rows first.
std::vector<char> TaskGraph::waits_within(size_t first) const {
  std::vector<char> waits(tasks.size() > first ? tasks.size() - first : 0, 0);
  // Packed rows of the range's tasks (a pack after task `first` was added), then the unpacked list
  // from its newest entry back to the first one into a task before the range: every entry after it
  // points into the range, since the range's tasks did not exist before.
  for (size_t u = first; u + 1 < row_.size() && u < tasks.size(); ++u)
    for (uint32_t i = row_[u]; i < row_[u + 1]; ++i)
      if (static_cast<size_t>(next_[i]) >= first) waits[static_cast<size_t>(next_[i]) - first] = 1;
  for (auto it = added_.rbegin(); it != added_.rend() && static_cast<size_t>(it->second) >= first; ++it)
    if (static_cast<size_t>(it->first) >= first) waits[static_cast<size_t>(it->second) - first] = 1;
  return waits;
}

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

}  // namespace pipegrid
