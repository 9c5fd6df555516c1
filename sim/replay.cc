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

// Starts the simulation's activities and collects their completions.
//
// By default everything starts from maestro, in SimGrid completion callbacks: each Exec when its
// device may run it, each Comm when its dependencies are done (after its route's latency under
// max-min sharing). SimGrid 3.32 keeps every activity in its starting actor's std::list and removes
// it with std::list::remove when it ends (ExecImpl::post, CommImpl::finish): with everything started
// from maestro, that list holds every activity in flight and each completion scans it (about 9% of
// the CPU at 128 devices, 12% at 1,024, measured; README.md "Speed").
//
// ReplayOptions::device_actors removes that scan for compute tasks: each device runs its compute
// tasks from an actor of its own, whose list holds its one running Exec. Transfers stay in maestro:
// SimGrid puts every host-to-host Comm on maestro's list whoever starts it, and reports its end
// through Activity::on_completion only when maestro started it, so their scan covers the transfers in
// flight. Results are the same as from maestro: at each simulated date, compute completions (reported
// by the device actors as they wake) and transfer completions (reported in maestro) are collected and
// handled in maestro in one batch at that date, compute tasks first, then transfers, each in
// SimGrid's order (its CPU model reports before its network model), as the maestro callbacks see
// them. The batch runs from a SimGrid timer at the current date set during the round of actors that
// follows the completions (by the first device actor that reports, or by the flusher actor, which
// maestro wakes when a transfer ends), so it fires after all of them reported. Measured here, the
// actors' context switches and simcalls (three per compute task) cost more than the scan they save
// up to 1,024 devices, so it is off by default.
class SimLauncher : public TaskLauncher {
 public:
  SimLauncher(const TaskGraph& g, const Platform& p, bool device_actors)
      : g_(g),
        p_(p),
        actors_mode_(device_actors),
        execs_(g.device_order.size()),
        request_(g.device_order.size(), -1) {}

  void set_executor(Executor* e) { executor_ = e; }

  // Called from maestro only (Executor::start before the run, and completions).
  void launch(int32_t t, double) override {
    const Task& task = g_.tasks[t];
    ++in_flight_;
    if (task.is_compute()) {
      if (actors_mode_) {
        request_[task.device] = t;
        actors_[task.device]->resume();
      } else {
        execs_[task.device] = start_exec(t);  // a device runs one compute task at a time
      }
    } else if (double delay = p_.start_delay(task.device, task.peer); delay > 0) {
      // Max-min sharing: the route's latency passes before the flow enters the network. Timers run
      // in maestro, like completion callbacks, and Engine::run() does not return while one is pending.
      simgrid::kernel::timer::Timer::set(sg4::Engine::get_clock() + delay, [this, t] { start_comm(t); });
    } else {
      start_comm(t);
    }
  }

  void create_actors() {
    if (!actors_mode_) return;
    actors_.resize(g_.device_order.size());
    for (size_t d = 0; d < g_.device_order.size(); ++d)
      if (!g_.device_order[d].empty())
        actors_[d] =
            sg4::Actor::create("device", p_.hosts[d], [this, d] { device_loop(static_cast<int>(d)); });
    flusher_ = sg4::Actor::create("flusher", p_.hosts.front(), [this] { flusher_loop(); });
  }

  // Activity::on_completion: from maestro, or from the device's actor for compute tasks (actors mode).
  void completed(const sg4::Activity& a) {
    const auto tag = reinterpret_cast<uintptr_t>(a.get_data<void>());
    const auto t = static_cast<int32_t>(tag & 0xffffffffu);
    const bool compute = g_.tasks[t].is_compute();
    if (!actors_mode_) {
      // SimGrid still uses the activity while this callback runs: release it one callback later.
      graveyard_.clear();
      graveyard_.push_back(compute ? std::move(execs_[g_.tasks[t].device]) : release_comm(tag));
      --in_flight_;
      executor_->finished(t, a.get_finish_time());
      return;
    }
    if (compute) {
      computes_.emplace_back(t, a.get_finish_time());
      schedule_batch();
    } else {
      transfers_.emplace_back(tag, a.get_finish_time());
      if (!flusher_woken_) {
        flusher_woken_ = true;
        flusher_->resume();  // runs after the device actors woken at this date
      }
    }
  }

  size_t in_flight() const { return in_flight_; }

  // Ends the actors (after the last task, or when nothing in flight can finish: stuck).
  void stop() {
    if (!actors_mode_) return;
    quit_ = true;
    for (const sg4::ActorPtr& a : actors_)
      if (a) a->resume();
    flusher_->resume();
  }

  void clear() {
    graveyard_.clear();
    execs_.clear();
    comms_.clear();
    actors_.clear();
    flusher_ = nullptr;
  }

 private:
  sg4::ExecPtr start_exec(int32_t t) {
    const int d = g_.tasks[t].device;
    sg4::ExecPtr e = sg4::Exec::init();
    e->set_host(p_.hosts[d]);
    e->set_flops_amount(g_.tasks[t].duration * p_.speeds[d]);
    e->set_data(reinterpret_cast<void*>(static_cast<uintptr_t>(t)));
    e->start();
    return e;
  }

  // Transfers in the network are kept in slots reused through a free list; a Comm's data holds its
  // task and its slot.
  void start_comm(int32_t t) {
    const Task& task = g_.tasks[t];
    uint32_t slot;
    if (free_.empty()) {
      slot = static_cast<uint32_t>(comms_.size());
      comms_.emplace_back();
    } else {
      slot = free_.back();
      free_.pop_back();
    }
    sg4::CommPtr c = sg4::Comm::sendto_init(p_.hosts[task.device], p_.hosts[task.peer]);
    c->set_payload_size(static_cast<uint64_t>(std::llround(task.bytes)));
    c->set_data(reinterpret_cast<void*>((uintptr_t{slot} << 32) | static_cast<uint32_t>(t)));
    c->start();
    comms_[slot] = std::move(c);
  }
  sg4::ActivityPtr release_comm(uintptr_t tag) {
    const auto slot = static_cast<uint32_t>(tag >> 32);
    free_.push_back(slot);
    return std::move(comms_[slot]);
  }

  void device_loop(int d) {
    for (;;) {
      while (request_[d] < 0 && !quit_) sg4::this_actor::suspend();
      if (quit_) return;
      const int32_t t = request_[d];
      request_[d] = -1;
      start_exec(t)->wait();  // fires Activity::on_completion here
    }
  }

  void flusher_loop() {
    for (;;) {
      sg4::this_actor::suspend();
      if (quit_) return;
      flusher_woken_ = false;
      schedule_batch();
    }
  }

  void schedule_batch() {
    if (batch_set_) return;
    batch_set_ = true;
    simgrid::kernel::timer::Timer::set(sg4::Engine::get_clock(), [this] { run_batch(); });
  }

  void run_batch() {
    batch_set_ = false;
    graveyard_.clear();
    // Move out first: handling a completion starts activities whose completions come in later batches.
    std::swap(batch_, computes_);
    batch_.insert(batch_.end(), transfers_.begin(), transfers_.end());
    transfers_.clear();
    for (auto [tag, end] : batch_) {
      const auto t = static_cast<int32_t>(tag & 0xffffffffu);
      --in_flight_;
      if (!g_.tasks[t].is_compute()) graveyard_.push_back(release_comm(tag));
      executor_->finished(t, end);
    }
    batch_.clear();
    if (in_flight_ == 0) stop();  // complete, or stuck
  }

  const TaskGraph& g_;
  const Platform& p_;
  const bool actors_mode_;
  Executor* executor_ = nullptr;
  std::vector<sg4::ActivityPtr> execs_;  // per device: its running compute task (maestro mode)
  std::vector<sg4::ActivityPtr> comms_;  // slots of transfers in the network
  std::vector<uint32_t> free_;           // free slots of comms_
  std::vector<sg4::ActivityPtr> graveyard_;
  size_t in_flight_ = 0;
  // Actors mode.
  std::vector<int32_t> request_;  // per device: the compute task its actor is to run next, or -1
  std::vector<sg4::ActorPtr> actors_;
  sg4::ActorPtr flusher_;
  std::vector<std::pair<uintptr_t, double>> computes_, transfers_, batch_;  // (data tag, end)
  bool batch_set_ = false, flusher_woken_ = false, quit_ = false;
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
  // One actor per device: small stacks (SimGrid's default is 8 MiB each).
  if (o.device_actors) args.push_back("--cfg=contexts/stack-size:256");
  if (!o.log) args.insert(args.begin() + 1, "--log=root.thres:critical");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  sg4::Engine engine(&argc, argv.data());

  Result<Platform> platform = build_platform(c, communicating_pairs(g));
  if (!platform) return platform.error();

  SimLauncher launcher(g, *platform, o.device_actors);
  Executor ex(g, launcher);
  launcher.set_executor(&ex);
  launcher.create_actors();
  sg4::Activity::on_completion_cb([&](sg4::Activity const& a) { launcher.completed(a); });
  const auto t0 = std::chrono::steady_clock::now();
  ex.start();
  if (launcher.in_flight() == 0) launcher.stop();  // nothing to simulate, or stuck from the start
  engine.run();
  Replay r;
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  launcher.clear();
  if (!ex.complete()) {
    std::vector<std::string> names;
    for (const Device& d : c.devices) names.push_back(d.name);
    return ex.stuck_error(names);
  }
  r.timeline = ex.take_timeline();
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
