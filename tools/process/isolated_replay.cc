#include "tools/process/isolated_replay.h"

#include <cstdint>
#include <cstring>

#include "tools/process/process.h"

namespace pipegrid::process {
namespace {

constexpr std::string_view kWhat = "the simulation process";

// A replay as bytes: the task count n, the wall time, then the n starts and the n ends.
std::string encode(const sim::Replay& r) {
  const uint64_t n = r.timeline.start.size();
  std::string out;
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(&r.wall_seconds), sizeof(double));
  out.append(reinterpret_cast<const char*>(r.timeline.start.data()), n * sizeof(double));
  out.append(reinterpret_cast<const char*>(r.timeline.end.data()), n * sizeof(double));
  return out;
}

Result<sim::Replay> decode(const std::string& data) {
  uint64_t n = 0;
  if (data.size() < sizeof n) return Error{std::string(kWhat) + " failed without an answer"};
  std::memcpy(&n, data.data(), sizeof n);
  size_t at = sizeof n;
  if (data.size() != at + sizeof(double) * (1 + 2 * n))
    return Error{std::string(kWhat) + " sent a truncated answer"};
  sim::Replay r;
  std::memcpy(&r.wall_seconds, data.data() + at, sizeof(double));
  at += sizeof(double);
  r.timeline.start.resize(n);
  r.timeline.end.resize(n);
  std::memcpy(r.timeline.start.data(), data.data() + at, n * sizeof(double));
  std::memcpy(r.timeline.end.data(), data.data() + at + n * sizeof(double), n * sizeof(double));
  return r;
}

}  // namespace

Result<sim::Replay> replay_isolated(const Cluster& c, const TaskGraph& g, const sim::ReplayOptions& o) {
  const ChildResult child = run_child([&](int fd) {
    Result<sim::Replay> r = sim::replay(c, g, o);
    return send_answer(fd, r ? Result<std::string>(encode(*r)) : Result<std::string>(r.error()));
  });
  Result<std::string> answer = answer_of(child, kWhat);
  if (!answer) return answer.error();
  return decode(*answer);
}

Result<double> SimGridJudge::iteration_time(const Cluster& c, const TaskGraph& g) const {
  Result<sim::Replay> r = replay_isolated(c, g);
  if (!r) return r.error();
  return r->timeline.makespan();
}

}  // namespace pipegrid::process
