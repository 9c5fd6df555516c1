#include "sim/replay.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <set>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/s4u.hpp>

#include "core/executor.h"
#include "sim/platform.h"

namespace sg4 = simgrid::s4u;

namespace pipegrid::sim {
namespace {

class SimLauncher : public TaskLauncher {
 public:
  SimLauncher(const TaskGraph& g, const Platform& p) : g_(g), p_(p), alive_(g.tasks.size()) {}

  void launch(int32_t t, double) override {
    const Task& task = g_.tasks[t];
    void* tag = reinterpret_cast<void*>(static_cast<intptr_t>(t));
    if (task.is_compute()) {
      sg4::ExecPtr e = sg4::Exec::init();
      e->set_host(p_.hosts[task.device]);
      e->set_flops_amount(task.duration * p_.speeds[task.device]);
      e->set_data(tag);
      e->start();
      alive_[t] = e;
    } else if (double delay = p_.start_delay(task.device, task.peer); delay > 0) {
      // Max-min sharing: the route's latency passes before the flow enters the network. Timers run
      // in maestro, like completion callbacks, and Engine::run() does not return while one is pending.
      simgrid::kernel::timer::Timer::set(sg4::Engine::get_clock() + delay, [this, t] { start_comm(t); });
    } else {
      start_comm(t);
    }
  }

  void start_comm(int32_t t) {
    const Task& task = g_.tasks[t];
    sg4::CommPtr c = sg4::Comm::sendto_init(p_.hosts[task.device], p_.hosts[task.peer]);
    c->set_payload_size(static_cast<uint64_t>(std::llround(task.bytes)));
    c->set_data(reinterpret_cast<void*>(static_cast<intptr_t>(t)));
    c->start();
    alive_[t] = c;
  }

  // SimGrid still uses an activity while its completion callback runs: release it one callback later.
  void retire(int32_t t) {
    graveyard_.clear();
    graveyard_.push_back(std::move(alive_[t]));
  }
  void clear() {
    graveyard_.clear();
    alive_.clear();
  }

 private:
  const TaskGraph& g_;
  const Platform& p_;
  std::vector<sg4::ActivityPtr> alive_;
  std::vector<sg4::ActivityPtr> graveyard_;
};

std::vector<std::pair<int, int>> communicating_pairs(const TaskGraph& g) {
  std::set<std::pair<int, int>> pairs;
  for (const Task& t : g.tasks)
    if (!t.is_compute() && t.device != t.peer) pairs.insert({t.device, t.peer});
  return {pairs.begin(), pairs.end()};
}

}  // namespace

Result<Replay> replay(const Cluster& c, const TaskGraph& g, const ReplayOptions& o) {
  std::vector<std::string> args = {"pipegrid", "--cfg=network/model:CM02", "--cfg=network/TCP-gamma:0",
                                   "--cfg=network/crosstraffic:0", "--cfg=network/optim:Lazy"};
  if (!o.log) args.insert(args.begin() + 1, "--log=root.thres:critical");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  sg4::Engine engine(&argc, argv.data());

  Result<Platform> platform = build_platform(c, communicating_pairs(g));
  if (!platform) return platform.error();

  SimLauncher launcher(g, *platform);
  Executor executor(g, launcher);
  sg4::Activity::on_completion_cb([&](sg4::Activity const& a) {
    const auto t = static_cast<int32_t>(reinterpret_cast<intptr_t>(a.get_data<void>()));
    launcher.retire(t);
    executor.finished(t, a.get_finish_time());
  });
  const auto t0 = std::chrono::steady_clock::now();
  executor.start();
  engine.run();
  Replay r;
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  launcher.clear();
  if (!executor.complete()) {
    std::vector<std::string> names;
    for (const Device& d : c.devices) names.push_back(d.name);
    return executor.stuck_error(names);
  }
  r.timeline = executor.take_timeline();
  return r;
}

namespace {

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

Result<Replay> replay_isolated(const Cluster& c, const TaskGraph& g, const ReplayOptions& o) {
  int fds[2];
  if (::pipe(fds) != 0) return Error{fmt::format("cannot create a pipe: {}", std::strerror(errno))};
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) return Error{fmt::format("cannot fork: {}", std::strerror(errno))};
  if (pid == 0) {
    ::close(fds[0]);
    Result<Replay> r = replay(c, g, o);
    // Message: status byte, then either (n, wall, start[n], end[n]) or (length, text).
    char ok = r.ok() ? 1 : 0;
    bool good = write_all(fds[1], &ok, 1);
    if (r.ok()) {
      uint64_t n = r->timeline.start.size();
      good = good && write_all(fds[1], &n, sizeof n) && write_all(fds[1], &r->wall_seconds, sizeof(double)) &&
             write_all(fds[1], r->timeline.start.data(), n * sizeof(double)) &&
             write_all(fds[1], r->timeline.end.data(), n * sizeof(double));
    } else {
      uint64_t n = r.error().message.size();
      good = good && write_all(fds[1], &n, sizeof n) && write_all(fds[1], r.error().message.data(), n);
    }
    ::close(fds[1]);
    ::_exit(good ? 0 : 1);
  }
  ::close(fds[1]);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status))
    return Error{fmt::format("the simulation process died ({})", strsignal(WTERMSIG(status)))};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || data.size() < 1 + sizeof(uint64_t))
    return Error{"the simulation process failed without an answer"};
  uint64_t n = 0;
  std::memcpy(&n, data.data() + 1, sizeof n);
  size_t at = 1 + sizeof n;
  if (data[0] == 0) return Error{data.substr(at, n)};
  if (data.size() != at + sizeof(double) * (1 + 2 * n))
    return Error{"the simulation process sent a truncated answer"};
  Replay r;
  std::memcpy(&r.wall_seconds, data.data() + at, sizeof(double));
  at += sizeof(double);
  r.timeline.start.resize(n);
  r.timeline.end.resize(n);
  std::memcpy(r.timeline.start.data(), data.data() + at, n * sizeof(double));
  std::memcpy(r.timeline.end.data(), data.data() + at + n * sizeof(double), n * sizeof(double));
  return r;
}

}  // namespace pipegrid::sim
