#include "tools/process/isolated_replay.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/huge_pages.h"
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
  for (std::vector<double>* v : {&r.timeline.start, &r.timeline.end}) {
    reserve_huge(*v, n);
    v->resize(n);
  }
  std::memcpy(r.timeline.start.data(), data.data() + at, n * sizeof(double));
  std::memcpy(r.timeline.end.data(), data.data() + at + n * sizeof(double), n * sizeof(double));
  return r;
}

// A shared anonymous mapping the child writes the timeline into (the starts, then the ends), so that
// a replay of millions of tasks does not cross a pipe and two copies: the answer then holds only
// the task count and the wall time. Unmapped when it goes.
class SharedTimeline {
 public:
  explicit SharedTimeline(size_t n) : n_(n), bytes_(std::max<size_t>(1, 2 * n * sizeof(double))) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<double*>(p);
  }
  ~SharedTimeline() {
    if (data_) munmap(data_, bytes_);
  }
  SharedTimeline(const SharedTimeline&) = delete;
  SharedTimeline& operator=(const SharedTimeline&) = delete;
  bool ok() const { return data_ != nullptr; }
  void put(const Timeline& t) const {  // in the child
    std::memcpy(data_, t.start.data(), n_ * sizeof(double));
    std::memcpy(data_ + n_, t.end.data(), n_ * sizeof(double));
  }
  void get(Timeline& t) const {  // in this process, once the child has ended
    for (auto [v, from] : {std::pair{&t.start, data_}, std::pair{&t.end, data_ + n_}}) {
      reserve_huge(*v, n_);
      v->assign(from, from + n_);
    }
  }

 private:
  size_t n_, bytes_;
  double* data_ = nullptr;
};

}  // namespace

Result<sim::Replay> replay_isolated(const Cluster& c, const TaskGraph& g, const sim::ReplayOptions& o) {
  const SharedTimeline shared(g.tasks.size());
  const ChildResult child = run_child([&](int fd) {
    Result<sim::Replay> r = sim::replay(c, g, o);
    if (!r) return send_answer(fd, r.error());
    if (!shared.ok() || r->timeline.start.size() != g.tasks.size()) return send_answer(fd, encode(*r));
    shared.put(r->timeline);
    sim::Replay header{{}, r->wall_seconds};
    return send_answer(fd, encode(header));
  });
  Result<std::string> answer = answer_of(child, kWhat);
  if (!answer) return answer.error();
  Result<sim::Replay> r = decode(*answer);
  if (r && r->timeline.start.empty() && !g.tasks.empty()) shared.get(r->timeline);
  return r;
}

Result<double> SimGridJudge::iteration_time(const Cluster& c, const TaskGraph& g) const {
  Result<sim::Replay> r = replay_isolated(c, g);
  if (!r) return r.error();
  return r->timeline.makespan();
}

}  // namespace pipegrid::process
