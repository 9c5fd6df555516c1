#include "sim/replay.h"

#include <boost/heap/fibonacci_heap.hpp>
#include <chrono>
#include <cmath>
#include <deque>
#include <functional>
#include <limits>
#include <queue>
#include <set>
#include <simgrid/kernel/Timer.hpp>
#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/s4u.hpp>
#include <unordered_map>
#include <unordered_set>
#include <xbt/config.hpp>
#include <xbt/utility.hpp>

#include "core/executor.h"
#include "core/planner.h"
#include "core/validate.h"
#include "sim/platform.h"

namespace sg4 = simgrid::s4u;

namespace pipegrid::sim {
namespace {

// Starts the simulation's activities and collects their completions, all from maestro (SimGrid
// completion callbacks and the engine's on_time_advance signal).
//
// Transfers are SimGrid Comms, started when their dependencies are done (after their route's
// latency under max-min sharing) and reported by Activity::on_completion.
//
// Compute tasks are not SimGrid Execs by default ("device clocks"). A device runs one compute task
// at a time (core/executor.h) at its host's fixed speed, so SimGrid's CPU model has nothing to
// share: it would end each task at `start + flops / speed`. The replay computes that date itself,
// with the same arithmetic, and keeps the pending ends in a heap; one SimGrid timer at the earliest
// pending date bounds each step of the engine, and the ends are handled in on_time_advance, which
// SimGrid fires after every step. This removes per compute task an ExecImpl, a CPU action, an lmm
// variable, the completion signal and, above all, SimGrid 3.32's scan of maestro's activity list
// (each activity started from maestro is appended to a std::list that ExecImpl::post and
// CommImpl::finish search with std::list::remove: with every device's running task on it, 26-33% of
// the CPU at 1,024 devices, measured; docs/speed.md). Only transfers in flight remain on that list.
//
// Results are those of SimGrid's Execs, bit for bit (ReplayOptions::simgrid_execs keeps the Execs;
// tests/sim/device_clock_test.cc compares the two on many configurations): what SimGrid 3.32 does,
// read in its sources, and what is reproduced here:
//  - an Exec's end date is `now + remains / rate` (Model::next_occurring_event_lazy), where remains is
//    the flops, zeroed below maxmin/precision x surf/precision (double_update), and rate is
//    the host's speed (the lone lmm variable of the host's constraint gets all of it);
//  - each step of the engine advances the clock to the earliest event of its models and timers,
//    computed as `now + (date - now)`: a timer at the same date bounds the step identically;
//  - at each step the CPU model ends every action whose date is within surf/precision of the new
//    clock, in date order and, at equal dates, in start order (its heap is a stable pairing heap),
//    and reports them at that clock;
//  - within a step: models' updates, on_time_advance, timers due (clock >= date), then completion
//    callbacks, the CPU model's before the network model's. So here, in on_time_advance: the delayed
//    transfer starts that are due (they were SimGrid timers; they are kept in a Fibonacci heap of the
//    same type as SimGrid's timer heap, fed and drained in the same sequence, so equal dates come out
//    in the same order), then the compute ends of the step; the transfer ends follow in SimGrid's
//    callbacks.
//  - an activity started at the current date with nothing left to do ends at the next step, of
//    length zero: when a compute end or a transfer start falls due at the current date, a zero-flop
//    Exec (a "tick") makes the engine take that step (a timer there would fire in the current step).
// One connection per (sender, receiver, collective kind, stage, channel): NCCL sends a channel's chunks to
// the next rank in order, so a collective's flow waits for the one ahead of it on its connection to arrive (a
// ring step for the previous step's own send, not only for the chunk it forwards). Only the replay does this:
// the analytic evaluator's links already serve a device's sends in order (docs/model.md).
class Connections {
 public:
  // Every collective flow's connection, numbered once (a hash per flow here, none while replaying).
  // A graph without collective flows (a pipeline alone) keeps no per-task arrays: 8 bytes per task,
  // 134 MB of a 16.8 M-task chain's peak (docs/speed.md).
  explicit Connections(const TaskGraph& g) {
    const auto collective = [&](size_t t) {
      return !g.tasks[t].is_compute() && is_collective(g.tasks[t].transfer);
    };
    size_t first = 0;
    while (first < g.tasks.size() && !collective(first)) ++first;
    if (first == g.tasks.size()) return;
    std::unordered_map<Key, int32_t, KeyHash> ids;
    of_.assign(g.tasks.size(), -1);
    for (size_t t = first; t < g.tasks.size(); ++t)
      if (collective(t))
        of_[t] = ids.emplace(key(g.tasks[t]), static_cast<int32_t>(ids.size())).first->second;
    connections_.resize(ids.size());
    next_.assign(g.tasks.size(), -1);
  }
  // Whether collective flow t may go now; otherwise it is queued behind the flow in flight.
  bool admit(int32_t t) {
    Connection& c = connections_[static_cast<size_t>(of_[t])];
    if (c.busy) {
      (c.tail < 0 ? c.head : next_[c.tail]) = t;
      c.tail = t;
      return false;
    }
    c.busy = true;
    return true;
  }
  // Collective flow t has arrived: the next flow queued on its connection, or -1.
  int32_t release(int32_t t) {
    Connection& c = connections_[static_cast<size_t>(of_[t])];
    if (c.head < 0) {
      c.busy = false;
      return -1;
    }
    const int32_t next = c.head;
    c.head = next_[next];
    if (c.head < 0) c.tail = -1;
    return next;
  }

 private:
  struct Connection {  // busy, and the flows waiting in order: a list threaded through next_
    bool busy = false;
    int32_t head = -1, tail = -1;
  };
  // Disjoint fields: devices and stages below 2^20 (kMaxClusterDevices is 2^17), kinds below 2^4;
  // the channel beside them.
  using Key = std::pair<uint64_t, uint16_t>;
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<uint64_t>{}(k.first ^ (uint64_t{k.second} << 61 | k.second));
    }
  };
  static Key key(const Task& t) {
    return {static_cast<uint64_t>(static_cast<uint32_t>(t.device)) << 44 |
                static_cast<uint64_t>(static_cast<uint32_t>(t.peer)) << 24 |
                static_cast<uint64_t>(t.transfer) << 20 |
                static_cast<uint64_t>(static_cast<uint32_t>(t.stage) & 0xfffff),
            t.channel};
  }
  std::vector<int32_t> of_;    // per task: its connection (-1: not a collective flow)
  std::vector<int32_t> next_;  // per task: the flow queued after it on its connection
  std::vector<Connection> connections_;
};

// Compute ends under device clocks: a heap of end dates, equal dates in start order.
class DeviceClocks {
 public:
  // `work_precision`: SimGrid's (maxmin/precision x surf/precision), below which an Exec's flops are 0.
  explicit DeviceClocks(double work_precision) : work_precision_(work_precision) {}
  // A task of `duration` s starts at `now` on a host of `speed` flop/s: it ends where SimGrid's Exec
  // would, now + flops / speed (docs above).
  void start(double now, double duration, double speed, int32_t task) {
    double remains = duration * speed;
    if (remains < work_precision_) remains = 0;
    ends_.push({remains > 0 ? now + remains / speed : now, seq_++, task});
  }
  bool empty() const { return ends_.empty(); }
  double next_date() const { return ends_.top().date; }
  int32_t next_task() const { return ends_.top().task; }
  // The tasks that end at `now` (within `precision`), collected first: ends pushed while they are
  // handled belong to later steps.
  const std::vector<int32_t>& take_due(double now, double precision) {
    batch_.clear();
    while (!ends_.empty() && std::abs(ends_.top().date - now) < precision) {
      batch_.push_back(ends_.top().task);
      ends_.pop();
    }
    return batch_;
  }

 private:
  struct End {
    double date;
    uint32_t seq;  // start order, for equal dates (at most one per task: a 16-byte entry)
    int32_t task;
    bool operator>(const End& o) const { return date != o.date ? date > o.date : seq > o.seq; }
  };
  const double work_precision_;
  std::priority_queue<End, std::vector<End>, std::greater<>> ends_;
  std::vector<int32_t> batch_;
  uint32_t seq_ = 0;
};

// Keeps SimGrid stepping to the earliest pending date: one kernel timer at that date, or, when the
// date is now, a zero-flop Exec (a "tick": a timer there would fire in the current step), whose
// completion callback is the step. `fired` runs when the timer fires.
class Waker {
 public:
  static constexpr uintptr_t kTick = ~uintptr_t{0};  // a tick's activity data

  Waker(sg4::Host* host, std::function<void()> fired) : host_(host), fired_(std::move(fired)) {}

  // Engine::on_time_advance: a tick ends in the first step after its start, this one.
  void stepped() { tick_pending_ = false; }

  // Wakes the engine at `date` (infinity: nothing pending).
  void arm(double date) {
    if (wake_ != nullptr && wake_date_ == date) return;
    if (wake_ != nullptr) wake_->remove();
    wake_ = nullptr;
    if (date == std::numeric_limits<double>::infinity()) return;
    if (date <= sg4::Engine::get_clock()) {
      if (!tick_pending_) {
        tick_pending_ = true;
        sg4::ExecPtr tick = sg4::Exec::init();
        tick->set_host(host_);
        tick->set_flops_amount(0);
        tick->set_data(reinterpret_cast<void*>(kTick));
        tick->start();
        ticks_.push_back(std::move(tick));  // until its completion callback
      }
      return;
    }
    wake_date_ = date;
    // The launcher handles what falls due in on_time_advance and moves the timer before it could
    // fire; if it fires, it only hands over to that work of the step.
    wake_ = simgrid::kernel::timer::Timer::set(date, [this] {
      wake_ = nullptr;
      fired_();
    });
  }

  // A tick's completion: its activity, to be released later.
  sg4::ActivityPtr take_tick() {
    sg4::ActivityPtr t = std::move(ticks_.front());
    ticks_.pop_front();
    return t;
  }

  void clear() {
    if (wake_ != nullptr) wake_->remove();
    wake_ = nullptr;
    ticks_.clear();
  }

 private:
  sg4::Host* host_;
  std::function<void()> fired_;
  simgrid::kernel::timer::Timer* wake_ = nullptr;
  double wake_date_ = 0;
  std::deque<sg4::ExecPtr> ticks_;  // started, completion not yet reported
  bool tick_pending_ = false;       // a tick will end at the next step
};

// Transfers in the network, in slots reused through a free list; a Comm's data holds its task and
// its slot.
class CommSlots {
 public:
  uint32_t take() {
    if (free_.empty()) {
      comms_.emplace_back();
      return static_cast<uint32_t>(comms_.size() - 1);
    }
    const uint32_t slot = free_.back();
    free_.pop_back();
    return slot;
  }
  void hold(uint32_t slot, sg4::CommPtr c) { comms_[slot] = std::move(c); }
  static void* tag(uint32_t slot, int32_t task) {
    return reinterpret_cast<void*>((uintptr_t{slot} << 32) | static_cast<uint32_t>(task));
  }
  sg4::ActivityPtr release(uintptr_t tag) {
    const auto slot = static_cast<uint32_t>(tag >> 32);
    free_.push_back(slot);
    return std::move(comms_[slot]);
  }
  void clear() { comms_.clear(); }

 private:
  std::vector<sg4::ActivityPtr> comms_;
  std::vector<uint32_t> free_;
};

// Transfers waiting for their start date (a route's latency, an engine's costs), in the order of
// SimGrid 3.32's own timer heap (the same type: simgrid/kernel/Timer.hpp), so that equal dates come
// out as SimGrid's timers would.
class DelayedStarts {
 public:
  void push(double date, int32_t task) { heap_.emplace(date, task); }
  bool empty() const { return heap_.empty(); }
  double next_date() const { return heap_.top().first; }
  // The next transfer due at `now`, removed; -1 when none is.
  int32_t pop_due(double now) {
    if (heap_.empty() || now < heap_.top().first) return -1;
    const int32_t t = heap_.top().second;
    heap_.pop();
    return t;
  }

 private:
  using Start = std::pair<double, int32_t>;
  boost::heap::fibonacci_heap<Start, boost::heap::compare<simgrid::xbt::HeapComparator<Start>>> heap_;
};

// An Exec for compute task t (ReplayOptions::simgrid_execs), its data the task.
sg4::ExecPtr start_exec(const TaskGraph& g, const Platform& p, int32_t t) {
  const int d = g.tasks[t].device;
  sg4::ExecPtr e = sg4::Exec::init();
  e->set_host(p.hosts[d]);
  e->set_flops_amount(g.tasks[t].duration * p.speeds[d]);
  e->set_data(reinterpret_cast<void*>(static_cast<uintptr_t>(t)));
  e->start();
  return e;
}

class SimLauncher : public TaskLauncher {
 public:
  SimLauncher(const TaskGraph& g, const Platform& p, bool simgrid_execs)
      : g_(g),
        p_(p),
        execs_mode_(simgrid_execs),
        execs_(simgrid_execs ? g.device_order.size() : 0),
        timing_precision_(simgrid::config::get_value<double>("surf/precision")),
        clocks_(simgrid::config::get_value<double>("maxmin/precision") * timing_precision_),
        connections_(g),
        waker_(p.hosts.empty() ? nullptr : p.hosts.front(), [this] {
          start_due(sg4::Engine::get_clock());
          arm();
        }) {}

  void set_executor(Executor* e) { executor_ = e; }

  // Called from maestro only (Executor::start before the run, completions, on_time_advance).
  void launch(int32_t t, double) override {
    const Task& task = g_.tasks[t];
    const double now = sg4::Engine::get_clock();
    if (task.is_compute()) {
      if (execs_mode_) {
        execs_[task.device] = start_exec(g_, p_, t);
        return;
      }
      clocks_.start(now, task.duration, p_.speeds[task.device], t);
      arm();
    } else if (!is_collective(task.transfer) || connections_.admit(t)) {
      send(t, now);
    }
  }

  // A flow enters the network: after a collective engine's costs (its duration) and, under max-min
  // sharing, its route's latency.
  void send(int32_t t, double now) {
    const Task& task = g_.tasks[t];
    if (double delay = task.duration + p_.start_delay(task.device, task.peer); delay > 0) {
      starts_.push(now + delay, t);
      arm();
    } else {
      start_comm(t);
    }
  }

  // Activity::on_completion (maestro): transfers, Execs in simgrid_execs mode, ticks.
  void completed(const sg4::Activity& a) {
    const auto tag = reinterpret_cast<uintptr_t>(a.get_data<void>());
    // SimGrid still uses the activity while this callback runs: release it one callback later.
    graveyard_.clear();
    if (tag == Waker::kTick) {
      graveyard_.push_back(waker_.take_tick());
      return;
    }
    const auto t = static_cast<int32_t>(tag & 0xffffffffu);
    const bool compute = g_.tasks[t].is_compute();
    graveyard_.push_back(compute ? std::move(execs_[g_.tasks[t].device]) : comms_.release(tag));
    if (!compute && is_collective(g_.tasks[t].transfer))
      if (const int32_t next = connections_.release(t); next >= 0) send(next, a.get_finish_time());
    executor_->finished(t, a.get_finish_time());
  }

  // Engine::on_time_advance: after the models' updates of each step, before timers and callbacks.
  void advance() {
    const double now = sg4::Engine::get_clock();
    waker_.stepped();
    start_due(now);
    for (int32_t t : clocks_.take_due(now, timing_precision_)) executor_->finished(t, now);
    if (!clocks_.empty()) executor_->expect(clocks_.next_task());
    arm();
  }

  void clear() {
    waker_.clear();
    graveyard_.clear();
    execs_.clear();
    comms_.clear();
  }

 private:
  void start_due(double now) {
    for (int32_t t = starts_.pop_due(now); t >= 0; t = starts_.pop_due(now)) start_comm(t);
  }

  // The earliest pending date (a compute end or a delayed start) is when the engine must step next.
  void arm() {
    double date = std::numeric_limits<double>::infinity();
    if (!clocks_.empty()) date = clocks_.next_date();
    if (!starts_.empty()) date = std::min(date, starts_.next_date());
    waker_.arm(date);
  }

  void start_comm(int32_t t) {
    const Task& task = g_.tasks[t];
    const uint32_t slot = comms_.take();
    const auto [from, to] = p_.endpoints(task.device, task.peer, is_collective(task.transfer));
    sg4::CommPtr c = sg4::Comm::sendto_init(from, to);
    c->set_payload_size(static_cast<uint64_t>(std::llround(task.bytes)));
    c->set_data(CommSlots::tag(slot, t));
    c->start();
    comms_.hold(slot, std::move(c));
  }

  const TaskGraph& g_;
  const Platform& p_;
  const bool execs_mode_;
  std::vector<sg4::ActivityPtr> execs_;  // per device: its running Exec (simgrid_execs mode)
  const double timing_precision_;
  Executor* executor_ = nullptr;
  CommSlots comms_;
  std::vector<sg4::ActivityPtr> graveyard_;
  DeviceClocks clocks_;  // compute ends (device clocks)
  DelayedStarts starts_;
  Connections connections_;  // collective flows, in order per connection
  Waker waker_;
};

std::vector<std::pair<int, int>> communicating_pairs(const TaskGraph& g) {
  std::set<std::pair<int, int>> pairs;
  for (const Task& t : g.tasks)
    if (!t.is_compute() && t.device != t.peer) pairs.insert({t.device, t.peer});
  return {pairs.begin(), pairs.end()};
}

}  // namespace

Result<Replay> replay(const Cluster& c, const TaskGraph& g, const ReplayOptions& o) {
  std::vector<std::string> args = {"pipegrid",
                                   "--cfg=network/model:CM02",
                                   "--cfg=network/TCP-gamma:0",
                                   "--cfg=network/crosstraffic:0",
                                   "--cfg=network/optim:Lazy",
                                   "--cfg=cpu/optim:Lazy"};
  if (!o.log) args.insert(args.begin() + 1, "--log=root.thres:critical");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  sg4::Engine engine(&argc, argv.data());

  Result<Platform> platform = build_platform(c, communicating_pairs(g));
  if (!platform) return platform.error();

  SimLauncher launcher(g, *platform, o.simgrid_execs);
  Executor ex(g, launcher);
  launcher.set_executor(&ex);
  sg4::Activity::on_completion_cb([&](sg4::Activity const& a) { launcher.completed(a); });
  sg4::Engine::on_time_advance_cb([&](double) { launcher.advance(); });
  const auto t0 = std::chrono::steady_clock::now();
  ex.start();
  engine.run();
  Replay r;
  r.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  launcher.clear();
  if (!ex.complete()) {
    const std::vector<std::string> names = device_names(c);
    if (o.schedule != nullptr)
      if (Status s = check_deadlock_free(g, *o.schedule, names); !s) return s.error();
    return ex.stuck_error(names);
  }
  r.timeline = ex.take_timeline();
  return r;
}

}  // namespace pipegrid::sim
