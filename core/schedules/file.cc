// file: a schedule read from torch.distributed.pipelining-style CSV text (row r = device r).
// The partition (partitioner, stages, chunks) decides which stage runs where; the file decides the
// order, and the validator checks that the two agree.
#include <fmt/format.h>

#include "core/strategy.h"

namespace pipegrid {

Result<Schedule> schedule_file(const ScheduleRequest& r) {
  Result<Schedule> s = parse_schedule_csv(r.file_text, r.file_name);
  if (!s) return s.error();
  if (s->device_actions.size() > r.device_count) {
    // Point at the first row without a device.
    const auto& row = s->positions[r.device_count];
    const std::string where =
        row.empty() ? r.file_name
                    : fmt::format("{}:{}:{}", r.file_name, row.front().line, row.front().column);
    return Error{fmt::format("{}: the schedule has {} rows, one per device, and there {} {} device{}", where,
                             s->device_actions.size(), r.device_count == 1 ? "is" : "are", r.device_count,
                             r.device_count == 1 ? "" : "s")};
  }
  s->device_actions.resize(r.device_count);
  s->positions.resize(r.device_count);
  if (!s->paired.empty()) s->paired.resize(r.device_count);
  return s;
}

}  // namespace pipegrid
