#include "core/lower.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "core/fold.h"
#include "core/units.h"

namespace pipegrid {
namespace {

bool same_program(const TpProgram& a, const TpProgram& b) {
  if (a.compute != b.compute || a.kinds != b.kinds || a.bytes != b.bytes || a.groups != b.groups ||
      a.combines != b.combines || a.flags != b.flags || a.deduplicates.size() != b.deduplicates.size())
    return false;
  for (size_t x = 0; x < a.deduplicates.size(); ++x) {
    const RoutingDraw &p = a.deduplicates[x], &q = b.deduplicates[x];
    if (p.experts != q.experts || p.top_k != q.top_k || p.groups != q.groups || p.top_groups != q.top_groups)
      return false;
  }
  return true;
}

// Two devices' stage costs lower to the same tasks.
bool same_work(const StageCost& a, const StageCost& b) {
  return a.times.forward == b.times.forward && a.times.backward_input == b.times.backward_input &&
         a.times.backward_weight == b.times.backward_weight && a.stash_bytes == b.stash_bytes &&
         a.recompute_bytes == b.recompute_bytes && a.recompute_s == b.recompute_s &&
         a.workspace_bytes == b.workspace_bytes && a.parameters == b.parameters &&
         a.parameter_tensors == b.parameter_tensors && a.parameter_bytes == b.parameter_bytes &&
         a.expert_parameters == b.expert_parameters && a.expert_parameter_bytes == b.expert_parameter_bytes &&
         a.expert_load == b.expert_load && same_program(a.tp_forward, b.tp_forward) &&
         same_program(a.tp_backward, b.tp_backward) && same_program(a.tp_backward_input, b.tp_backward_input);
}

// The flows of a group collective: tensor-, context- or expert-parallel (expert tensor-parallel too).
TransferKind traffic_of(CommGroup g) {
  return g == CommGroup::Context  ? TransferKind::ContextParallel
         : g == CommGroup::Tensor ? TransferKind::TensorParallel
                                  : TransferKind::ExpertParallel;
}

TaskKind kind_of(Pass p) {
  switch (p) {
    case Pass::Forward:
      return TaskKind::Forward;
    case Pass::Backward:
      return TaskKind::Backward;
    case Pass::Weight:
      return TaskKind::Weight;
  }
  return TaskKind::Forward;
}

// Calls f(i, j, share) for every pair of devices (index i in stage s's devices, j in stage t's) that
// exchange activations and gradients, with the fraction of a micro-batch's edge bytes each sends.
// Replicas split each micro-batch into equal contiguous slices and a pair of replicas shares what
// both hold (replica_overlap). Under tensor parallelism, each device of a group sends its 1/t of the
// activation to the device of the same rank in the consuming group (the scatter of Narayanan et al.,
// arXiv 2104.04473, section 4.1; with sequence parallelism the activation is already split); groups
// of different sizes pair rank q mod t. Under context parallelism a replica's t x cp devices each hold
// 1/cp of the tokens: the same pairing over groups of t x cp.
// Round-robin replicas (Stage::round_robin) send a whole micro-batch from the replica whose turn it
// is to the consumer's: the pair carries micro-batch k only when Turn::takes(k).
struct Turn {
  bool round_robin = false;
  int i = 0, ra = 1, j = 0, rb = 1;  // the pair's replicas and the stages' replica counts
  bool takes(int k) const { return !round_robin || (k % ra == i && k % rb == j); }
};

template <class F>
void for_each_device_pair(const Partition& p, size_t s, int t, F&& f) {
  const Stage& a = p.stage(s);
  const Stage& b = p.stage(t);
  const int ta = a.tensor_parallel * a.context_parallel, tb = b.tensor_parallel * b.context_parallel,
            ra = a.replicas(), rb = b.replicas();
  const int ranks = std::max(ta, tb);
  const bool rr = a.round_robin || b.round_robin;
  for (int i = 0; i < ra; ++i)
    for (int j = 0; j < rb; ++j) {
      const double share = rr ? 1.0 : replica_overlap(i, ra, j, rb);
      if (share <= 0) continue;
      for (int q = 0; q < ranks; ++q)
        f(static_cast<size_t>(i * ta + q % ta), static_cast<size_t>(j * tb + q % tb), share / ranks,
          Turn{rr, i, ra, j, rb});
    }
}

// The micro-batches of m that round-robin replica j of r takes (k = j, j + r, ...).
size_t turns(int j, int r, int m) {
  return j < m ? static_cast<size_t>((m - j + r - 1) / r) : 0;
}

// The micro-batches of m that a pair of round-robin replicas carries (k = i mod ra and j mod rb).
size_t pair_turns(const Turn& turn, int m) {
  if (!turn.round_robin) return static_cast<size_t>(m);
  size_t n = 0;
  for (int k = turn.i; k < m; k += turn.ra) n += turn.takes(k);
  return n;
}

}  // namespace

TaskCount count_tasks(const Partition& p, int micro_batches, int passes) {
  TaskCount n;
  const size_t m = static_cast<size_t>(std::max(0, micro_batches));
  std::vector<char> busy;
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const size_t r = static_cast<size_t>(p.stage(s).gradient_replicas());
    if (p.stage(s).round_robin)
      for (size_t j = 0; j < p.stage(s).devices.size(); ++j)
        n.compute += turns(static_cast<int>(j), static_cast<int>(r), static_cast<int>(m)) *
                     static_cast<size_t>(passes);
    else
      n.compute += p.stage(s).devices.size() * m * static_cast<size_t>(passes);
    for (int d : p.stage(s).devices) {
      if (d >= static_cast<int>(busy.size())) busy.resize(d + 1, 0);
      busy[d] = 1;
    }
    if (r > 1) n.ring_steps += 2 * (r - 1) * r * static_cast<size_t>(p.stage(s).tensor_parallel);
    for (int t : p.successors(static_cast<int>(s))) {
      const auto& from = p.stage(s).devices;
      const auto& to = p.stage(t).devices;
      for_each_device_pair(p, s, t, [&](size_t i, size_t j, double, const Turn& turn) {
        const size_t k = pair_turns(turn, static_cast<int>(m));
        n.transfers += from[i] == to[j] ? 0 : 2 * k;
        n.dependencies += 4 * k;
      });
    }
  }
  n.compute += static_cast<size_t>(std::count(busy.begin(), busy.end(), 1));  // optimizer steps
  return n;
}

TaskCount count_tasks(const Partition& p, int micro_batches, int passes, AllReduceAlgorithm a) {
  TaskCount n = count_tasks(p, micro_batches, passes);
  if (n.ring_steps <= kAutoMergeRingFlows ||
      (a != AllReduceAlgorithm::MultiRing && a != AllReduceAlgorithm::Tree && a != AllReduceAlgorithm::Nccl))
    return n;
  n.ring_steps = 0;
  for (size_t s = 0; s < p.stage_count(); ++s)
    if (const size_t r = static_cast<size_t>(p.stage(s).gradient_replicas()); r > 1)
      n.ring_steps += r * static_cast<size_t>(p.stage(s).tensor_parallel);
  return n;
}

// Read once per process: check_task_count runs for every candidate a planner or the search lowers,
// and the memory a process may use does not need re-reading between them.
static double read_available_memory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page)
                               : std::numeric_limits<double>::infinity();
}

double available_memory_bytes() {
  static const double available = read_available_memory();
  return available;
}

Status check_task_count(const TaskCount& n, const Partition& p, int micro_batches, int passes,
                        double available) {
  const double bytes = static_cast<double>(n.total()) * kBytesPerTask;
  if (n.total() <= kMaxTasks && bytes <= available) return {};
  size_t replicas = 0;
  for (size_t s = 0; s < p.stage_count(); ++s) replicas += p.stage(s).devices.size();
  const std::string what = fmt::format(
      "{} micro-batch{} x {} stage replicas ({} stage{}) x {} passes, and one optimizer step per device: {} "
      "compute tasks, + {} transfers + {} all-reduce steps = {} tasks in one iteration",
      micro_batches, micro_batches == 1 ? "" : "es", replicas, p.stage_count(),
      p.stage_count() == 1 ? "" : "s", passes, n.compute, n.transfers, n.ring_steps, n.total());
  if (n.total() > kMaxTasks)
    return Error{
        fmt::format("the plan is too large to simulate: {}, above pipegrid's limit of {} (2^31 - 1, the "
                    "range of its task "
                    "ids); use fewer micro-batches, stages or replicas",
                    what, kMaxTasks)};
  return Error{fmt::format(
      "the plan is too large to simulate on this machine: {}, about {} at {} bytes a task (docs/scale.md), "
      "more than the {} available; use fewer micro-batches, stages or replicas, or a machine with more "
      "memory",
      what, format_bytes(bytes), kBytesPerTask, format_bytes(available))};
}

int dp_buckets(double parameters, int replicas) {
  const double bucket = std::max(40e6, 1e6 * replicas);
  return static_cast<int>(std::clamp(std::ceil(parameters / bucket), 1.0, 1e6));
}

DpBuckets first_stage_buckets(double dense, double expert, int replicas, bool mirrored) {
  DpBuckets b;
  if (replicas <= 1 || mirrored) return b;
  b.dense = dp_buckets(dense, replicas);
  if (b.dense > 1 && expert > 0) b.expert = dp_buckets(expert, replicas);
  return b;
}

namespace {

// One lowering, in named steps (lower() runs them in order): count the tasks and check the limit,
// number the stage replicas and their passes, add the compute tasks in device order, the pipeline
// transfers between stages, the tensor-parallel groups' collectives, the data-parallel gradient
// collectives with the static memory, and the optimizer steps.
class Lowering {
 public:
  Lowering(const Workload& w, const Cluster& c, const Partition& p, const Schedule& sched,
           const LoweringOptions& o, FoldedGraph* fold = nullptr)
      : w_(w),
        c_(c),
        p_(p),
        sched_(sched),
        o_(o),
        m_(o.micro_batches),
        S_(p.stage_count()),
        D_(c.devices.size()),
        fold_(fold) {}

  Result<TaskGraph> run();
  size_t min_whole_tasks = 0;  // folded: below this many whole-graph tasks, stop after counting
  bool fold_ranks = false;     // folded: fold tensor-parallel ranks too, where rank_fold() allows it

 private:
  const Workload& w_;
  const Cluster& c_;
  const Partition& p_;
  const Schedule& sched_;
  const LoweringOptions& o_;
  const int m_;
  const size_t S_, D_;
  // The folded lowering (lower_folded): replica j >= 1's compute tasks (and, with groups_folded, its
  // group flows) are not built; its places in slot_, head_, pair_head_, last_backward_ and dp_piece_
  // hold its image's tasks, and the dependencies into them become fold_->layout.crossings.
  FoldedGraph* fold_ = nullptr;
  TaskGraph g_;
  TaskCount count_;
  std::vector<std::vector<StageCost>> owned_costs_;
  const std::vector<std::vector<StageCost>>* costs_ = nullptr;
  bool any_grouped_ = false, bucketed_ = false;
  bool merge_dp_rings_ = false;     // the data-parallel multi-rings lowered merged (decided in count())
  std::unique_ptr<Router> router_;  // NCCL's pick of ring or tree (AllReduceAlgorithm::Nccl)
  bool round_robin_ = false;        // some stage's replicas take micro-batches in turn (Stage::round_robin)
  size_t piece_tasks_ = 0, group_flows_ = 0;  // grouped stages' extra compute pieces and their flows
  int buckets_ = 1;
  // (stage, replica) pairs are numbered rep_base_[s] + j. A device's replicas, (stage, j) by stage,
  // give the replica index of a (stage, device) (a stages x devices table would be quadratic).
  std::vector<std::vector<std::pair<int, int>>> hosted_;
  std::vector<size_t> rep_base_;
  // The last compute task of every (stage, replica, pass, micro-batch); under tensor parallelism or
  // bucketed overlap, head_ holds the first (a pass is then several tasks).
  std::vector<int32_t> slot_, head_;
  std::vector<int32_t> pair_head_;      // per backward slot: the first task of the forward it is paired with
  std::vector<int32_t> last_backward_;  // last B or W of each (stage, replica)
  std::vector<Deps> reduced_;           // per device: its last gradient reduction's ends (lowered so far)
  // Bucketed overlap: where the first stage's last backward (B, or W when split) sits on each of its
  // devices (device, action index), and the tasks after which its buckets are ready there.
  std::vector<std::pair<size_t, size_t>> dp_last_;
  std::vector<std::vector<int32_t>> dp_piece_;
  // Transfers each (stage, replica) sends after a forward (activations) and a backward (gradients).
  std::vector<int32_t> out_forward_, out_backward_;
  size_t reserved_ = 0;
  // Per device: the transfers its optimizer step waits for, and the parameters it updates.
  std::vector<std::vector<int32_t>> step_inputs_;
  std::vector<double> step_parameters_;

  int passes() const { return sched_.split_backward ? 3 : 2; }
  // Device d's tasks are copies of its image's (folded lowering: replica >= 1, or rank >= 1 with ranks
  // folded).
  bool copied(size_t d) const { return fold_ && fold_->layout.copied(d); }
  // from -> to, where `to` runs on device `to_device`: a crossing when that device's tasks are copies.
  void into(int32_t from, int32_t to, size_t to_device);
  Status prepare_fold();
  // The tensor-parallel size whose ranks fold onto rank 0 (FoldOptions::ranks), or 1 where they do not.
  int rank_fold() const;
  // Stage position pos's image position: the same rank of replica 0, or rank 0 with ranks folded.
  size_t image_position(const Stage& st, size_t pos) const;
  // Ranks folded: a tensor-parallel group of replica 0 whose ranks >= 1 are copies.
  bool rank_ring(const std::vector<int>& devices) const;
  // Folded with groups_folded: the stage positions `members` are all one replica's copies, and their
  // group's flows are folded (FoldLayout::folds).
  bool copied_group(const Stage& stage, const std::vector<int>& members, CommGroup group) const;
  void copy_places();
  void reduce_after_device_backward();
  // The task count checked against the limits: the whole graph's, or the folded graph's estimate.
  Status check_count(TaskCount n, size_t group_flows) const;
  const StageCost& cost(size_t s, size_t j) const { return (*costs_)[s][j]; }
  size_t rep_index(int s, int j) const { return rep_base_[s] + j; }
  int replica_of(int s, size_t d) const;
  size_t slot_index(int s, int replica, Pass pass, int k) const {
    return (rep_index(s, replica) * m_ + k) * 3 + static_cast<int>(pass);
  }
  int32_t& slot_of(int s, int replica, Pass pass, int k) { return slot_[slot_index(s, replica, pass, k)]; }
  bool multi_task_passes() const { return any_grouped_ || bucketed_; }
  // A grouped stage's pass (tensor or expert parallelism) as compute pieces and collectives; null
  // otherwise.
  const TpProgram* program(int stage, size_t j, Pass pass) const;
  template <class F>
  void for_each_transfer_pair(F&& f) const;

  Status count();
  void count_multi_rings();
  size_t group_rings(size_t st, const TpProgram& prog, size_t x, size_t j);
  Status check_round_robin();
  void number_replicas();
  void find_bucketed_backwards();
  void count_pipeline_transfers();
  void reserve();
  void add_compute_tasks();
  void spread_pair_memory(size_t forward_changes, size_t backward_changes, const std::vector<int32_t>& f,
                          const std::vector<int32_t>& b);
  int32_t add_pass(size_t d, size_t action, std::vector<int32_t>& order);
  double accumulation_s(const Action& a, const StageCost& sc, size_t d) const;
  void feed_backward(int32_t from, int32_t into, int s, int j, int k, size_t device);
  Status add_pipeline_transfers();
  void add_group_collectives();
  std::vector<Deps> add_collective(int s, Pass pass, int k, size_t x, const std::vector<int>& members,
                                   const std::vector<Deps>& previous);
  // The node layout (core/collectives.h node_layout) of all-to-all x of stage s's pass among the stage
  // positions `members` when it may be lowered node-aggregated: every pair exchanges alike (every
  // sender sends as much, every receiver's expert load is the same) and the group's nodes hold
  // equally many of its devices.
  std::optional<std::pair<std::vector<std::pair<int, int>>, int>> aggregated_layout(
      int s, Pass pass, size_t x, const std::vector<int>& members) const;
  // Flows device j of the all-to-all sends: {one per peer, node-aggregated where it may be}.
  std::pair<size_t, size_t> all_to_all_flows(int s, Pass pass, size_t x, size_t j) const;
  bool aggregate_ = false;  // the all-to-alls that may be are node-aggregated (decided in count())
  // A group's ring collectives as NCCL runs them: one ring per NIC where the group spans machines
  // with several of its devices each (multi_ring_orders), kept per (stage, group kind, first member).
  std::map<std::tuple<int, int, int>, std::vector<std::vector<size_t>>> ring_orders_;
  const std::vector<std::vector<size_t>>& ring_orders(int s, CommGroup group, const std::vector<int>& members,
                                                      const std::vector<int>& devices);
  std::vector<Deps> pairwise_all_to_all(int s, Pass pass, size_t x, const std::vector<int>& members,
                                        const std::vector<int>& devices, const std::vector<Deps>& ready,
                                        const FlowTag& tag);
  // DeepEP (TpProgram::deduplicates): the flows device position j of stage s sends in one of its
  // all-to-alls (an error where its expert-parallel group is not spread evenly over its nodes), and the
  // flows.
  Result<size_t> deduplicated_flows(int s, size_t j, const RoutingDraw& draw) const;
  std::vector<Deps> deduplicated_all_to_all(int s, const TpProgram& prog, size_t x,
                                            const std::vector<int>& devices, const std::vector<Deps>& ready,
                                            const FlowTag& tag);
  void add_data_parallel_collectives();
  void add_static_memory(size_t s);
  void reduce_expert_gradients(size_t s, const Stage* mirror);
  // `tied`: an all-reduce after every gradient reduction of the members' devices (a tied weight's).
  // `buckets`: how many the reduction's buffer has when bucketed (the first stage's dense ones by default).
  void reduce_gradients(const std::vector<std::pair<int, int>>& members, double bytes, bool bucketed,
                        bool tied = false, int buckets = 0);
  std::vector<TiedCopy> ties_;  // the copies of tied weights (decided in count())
  // The (stage, position) pairs whose tied weights' gradients are all-reduced together: a copy's
  // position with the source stage's position of the same index (each stage's positions taken
  // cyclically where their counts differ), and the tied layer.
  struct TiedPair {
    std::pair<int, int> copy, source;
    int layer = 0;
  };
  std::vector<TiedPair> tied_pairs() const;
  void add_optimizer_steps();
};

Result<TaskGraph> Lowering::run() {
  if (Status s = count(); !s) return s.error();
  if (fold_ && fold_->layout.whole_tasks < min_whole_tasks) return TaskGraph{};
  number_replicas();
  if (fold_)
    if (Status s = prepare_fold(); !s) return s.error();
  find_bucketed_backwards();
  count_pipeline_transfers();
  reserve();
  add_compute_tasks();
  if (!o_.dp_overlap) reduce_after_device_backward();
  if (fold_) copy_places();
  if (Status s = add_pipeline_transfers(); !s) return s.error();
  if (any_grouped_) add_group_collectives();
  add_data_parallel_collectives();
  add_optimizer_steps();
  // The dependency list (8 bytes per dependency) is freed here, not by the replay's first
  // successors() call after the executor's arrays exist: at p = 1,024, m = 4,096 that moved the
  // peak RSS from 1,846 MB to 1,675 MB when the tasks are not renumbered.
  g_.pack_dependencies();
  return std::move(g_);
}

// The folded lowering's preconditions: a replica map (core/fold.h), no round-robin replicas, and every
// copied device running its image's passes on a device alike it at the same costs.
Status Lowering::prepare_fold() {
  if (round_robin_) return Error{"round-robin replicas take different micro-batches"};
  Result<ReplicaMap> m = map_replicas(p_, D_);
  if (!m) return m.error();
  fold_->layout.replicas = m->replicas;
  fold_->layout.replica.assign(m->replica.begin(), m->replica.end());
  fold_->layout.image.assign(m->image.begin(), m->image.end());
  if (const int t = fold_ranks ? rank_fold() : 1; t > 1) {
    fold_->layout.ranks_folded = t;
    for (size_t s = 0; s < S_; ++s)
      for (int d : p_.stage(s).devices) fold_->layout.image[static_cast<size_t>(d)] = p_.stage(s).devices[0];
  }
  static const std::vector<Action> none;
  auto actions = [&](size_t d) -> const std::vector<Action>& {
    return d < sched_.device_actions.size() ? sched_.device_actions[d] : none;
  };
  for (size_t d = 0; d < D_; ++d) {
    if (!copied(d)) continue;
    const auto i = static_cast<size_t>(fold_->layout.image[d]);
    const Device &a = c_.devices[d], &b = c_.devices[i];
    bool alike = actions(d) == actions(i) && a.slowdown == b.slowdown && a.spec.kind == b.spec.kind &&
                 a.spec.memory_bandwidth == b.spec.memory_bandwidth && a.spec.peak_flops == b.spec.peak_flops;
    for (size_t x = 0; alike && x < actions(d).size(); ++x)
      alike = sched_.is_paired(d, x) == sched_.is_paired(i, x);
    if (!alike) return Error{fmt::format("{} does not run its image {}'s passes alike", a.name, b.name)};
  }
  for (size_t s = 0; s < S_; ++s) {
    const Stage& st = p_.stage(s);
    for (size_t pos = 0; pos < st.devices.size(); ++pos)
      if (copied(static_cast<size_t>(st.devices[pos])) &&
          !same_work(cost(s, pos), cost(s, image_position(st, pos))))
        return Error{fmt::format("stage {}: {}'s costs differ from its image's (routing skew?)", s,
                                 c_.devices[static_cast<size_t>(st.devices[pos])].name)};
  }
  return {};
}

// The rank fold's preconditions on the plan (fold_routes checks the routes): every stage of the same
// t >= 2 tensor-parallel ranks without context or expert parallelism, each rank at the same position
// of every stage it holds, every group's ring collectives one ring in the group's order (inside a
// machine), replica j's group flows folded, and no collective engine (it charges a call per device).
int Lowering::rank_fold() const {
  if (S_ == 0 || !fold_->layout.groups_folded || c_.engine) return 1;
  const int t = p_.stage(0).tensor_parallel;
  std::vector<int> position(D_, -1);
  for (size_t s = 0; s < S_; ++s) {
    const Stage& st = p_.stage(s);
    if (t < 2 || st.tensor_parallel != t || st.context_parallel != 1 || st.expert_parallel != 1 ||
        st.expert_tensor_parallel != 1 || st.devices.size() % static_cast<size_t>(t) != 0)
      return 1;
    for (size_t pos = 0; pos < st.devices.size(); ++pos) {
      int& at = position[static_cast<size_t>(st.devices[pos])];
      if (at >= 0 && at != static_cast<int>(pos)) return 1;
      at = static_cast<int>(pos);
    }
    for (size_t first = 0; first < st.devices.size(); first += static_cast<size_t>(t)) {
      const std::vector<int> group(st.devices.begin() + static_cast<std::ptrdiff_t>(first),
                                   st.devices.begin() + static_cast<std::ptrdiff_t>(first) + t);
      const std::vector<std::vector<size_t>> orders = group_ring_orders(c_, group);
      if (orders.size() != 1) return 1;
      for (size_t q = 0; q < orders[0].size(); ++q)
        if (orders[0][q] != q) return 1;
    }
  }
  return t;
}

void Lowering::into(int32_t from, int32_t to, size_t to_device) {
  if (copied(to_device))
    fold_->layout.crossings.push_back({from, to, static_cast<int32_t>(to_device)});
  else
    g_.depend(from, to);
}

size_t Lowering::image_position(const Stage& st, size_t pos) const {
  if (fold_->layout.ranks_folded > 1) return 0;
  return pos % static_cast<size_t>(st.tensor_parallel * st.context_parallel);
}

bool Lowering::rank_ring(const std::vector<int>& devices) const {
  return fold_ && fold_->layout.ranks_folded > 1 && devices.size() > 1 && !copied(devices[0]) &&
         copied(devices[1]);
}

bool Lowering::copied_group(const Stage& stage, const std::vector<int>& members, CommGroup group) const {
  if (!fold_ || !fold_->layout.folds(traffic_of(group))) return false;
  const int j = fold_->layout.replica[static_cast<size_t>(stage.devices[static_cast<size_t>(members[0])])];
  return j >= 1 && std::all_of(members.begin(), members.end(), [&](int q) {
           return fold_->layout.replica[static_cast<size_t>(stage.devices[static_cast<size_t>(q)])] == j;
         });
}

// A copy's places hold its image's tasks (positions pos and image_position(pos) of each stage).
void Lowering::copy_places() {
  for (size_t s = 0; s < S_; ++s) {
    const Stage& st = p_.stage(s);
    const int si = static_cast<int>(s);
    for (size_t pos = 0; pos < st.devices.size(); ++pos) {
      if (!copied(static_cast<size_t>(st.devices[pos]))) continue;
      const int mine = static_cast<int>(pos), theirs = static_cast<int>(image_position(st, pos));
      for (std::vector<int32_t>* v : {&slot_, &head_, &pair_head_})
        if (!v->empty())
          std::copy_n(v->begin() + static_cast<std::ptrdiff_t>(slot_index(si, theirs, Pass::Forward, 0)),
                      m_ * 3,
                      v->begin() + static_cast<std::ptrdiff_t>(slot_index(si, mine, Pass::Forward, 0)));
      last_backward_[rep_index(si, mine)] = last_backward_[rep_index(si, theirs)];
      if (s == 0 && pos < dp_piece_.size()) dp_piece_[pos] = dp_piece_[static_cast<size_t>(theirs)];
    }
  }
}

// Without dp_overlap, a device reduces the gradients of every stage it holds (an interleaved schedule's
// model chunks, DualPipe's two stages) after its last backward of any of them: Megatron-LM calls the
// reductions after the schedule (finalize_model_grads, each chunk's finish_grad_sync making the
// synchronous call when overlap_grad_reduce is off: megatron/core/distributed/param_and_grad_buffer.py,
// core_r0.8.0; in 2021, allreduce_gradients per chunk after forward_backward_func with --DDP-impl local).
// With dp_overlap a chunk's reduction starts once its own last backward has run, as Megatron's
// grad_sync_func does. A device's tasks are added in its order, so its last backward has the largest id.
void Lowering::reduce_after_device_backward() {
  for (size_t d = 0; d < D_; ++d) {
    if (hosted_[d].size() < 2 || copied(d)) continue;  // a copy takes its image's, in copy_places
    int32_t last = -1;
    for (const auto& [s, j] : hosted_[d]) last = std::max(last, last_backward_[rep_index(s, j)]);
    for (const auto& [s, j] : hosted_[d]) last_backward_[rep_index(s, j)] = last;
  }
}

int Lowering::replica_of(int s, size_t d) const {
  const auto& h = hosted_[d];
  auto it = std::lower_bound(h.begin(), h.end(), std::pair<int, int>{s, -1});
  return it != h.end() && it->first == s ? it->second : -1;
}

const TpProgram* Lowering::program(int stage, size_t j, Pass pass) const {
  if (!p_.stage(stage).grouped() || pass == Pass::Weight) return nullptr;
  const StageCost& sc = cost(stage, j);
  return pass == Pass::Forward   ? &sc.tp_forward
         : sched_.split_backward ? &sc.tp_backward_input
                                 : &sc.tp_backward;
}

template <class F>
void Lowering::for_each_transfer_pair(F&& f) const {
  for (size_t s = 0; s < S_; ++s)
    for (int t : p_.successors(static_cast<int>(s)))
      for_each_device_pair(
          p_, s, t, [&](size_t i, size_t j, double share, const Turn& turn) { f(s, t, i, j, share, turn); });
}

const std::vector<std::vector<size_t>>& Lowering::ring_orders(int s, CommGroup group,
                                                              const std::vector<int>& members,
                                                              const std::vector<int>& devices) {
  auto key = std::make_tuple(s, static_cast<int>(group), members.front());
  auto it = ring_orders_.find(key);
  if (it == ring_orders_.end()) it = ring_orders_.emplace(key, group_ring_orders(c_, devices)).first;
  return it->second;
}

// count_tasks counts one stepped ring per data-parallel group; NCCL's ring per NIC (multi-ring)
// runs one per device of a machine, each with as many steps. Above kAutoMergeRingFlows such flows in
// the iteration the rings are lowered merged (one flow per device and ring: merge_dp_rings_).
// NCCL's trees (AllReduceAlgorithm::Tree, and Nccl where it picks them) are counted as the larger of
// the tree's flows and the rings', per group.
void Lowering::count_multi_rings() {
  const AllReduceAlgorithm a = o_.allreduce;
  if (a != AllReduceAlgorithm::MultiRing && a != AllReduceAlgorithm::Tree && a != AllReduceAlgorithm::Nccl)
    return;
  size_t stepped = 0, merged = 0;
  for (size_t s = 0; s < S_; ++s) {
    const Stage& stage = p_.stage(s);
    const size_t r = static_cast<size_t>(stage.gradient_replicas()),
                 T = static_cast<size_t>(stage.tensor_parallel);
    if (r < 2) continue;
    std::vector<int> group;
    for (size_t j = 0; j < r; ++j) group.push_back(stage.devices[j * T]);
    const size_t rings = multi_ring_orders(c_, group).size();
    size_t flows = rings * 2 * (r - 1) * r;
    if (a != AllReduceAlgorithm::MultiRing) {
      const StageCost& sc = cost(s, 0);
      const double bytes = o_.gradient_reduce_bytes > 0
                               ? (sc.parameters - sc.expert_parameters) * o_.gradient_reduce_bytes
                               : sc.parameter_bytes - sc.expert_parameter_bytes;
      // An upper bound for every stage: a bucketed one reduces in two pieces, each with at most the
      // whole's chunks (this only sizes the reservation and the memory check).
      flows = std::max(flows, 2 * double_tree_flows(c_, group, bytes));
    }
    stepped += flows * T;
    merged += rings * r * T;
  }
  merge_dp_rings_ = stepped > kAutoMergeRingFlows;
  count_.ring_steps = merge_dp_rings_ ? merged : std::max(count_.ring_steps, stepped);
}

// Room for every task and dependency, counted up front: compute tasks and optimizer steps, two
// transfers (or two direct dependencies) per replica pair and micro-batch, ring all-reduce steps,
// the tensor-parallel pieces and flows; an error above kMaxTasks before anything is allocated.
Status Lowering::count() {
  count_ = count_tasks(p_, m_, passes());
  count_.compute = 0;
  for (size_t d = 0; d < D_ && d < sched_.device_actions.size(); ++d)
    count_.compute += sched_.device_actions[d].size() + (sched_.device_actions[d].empty() ? 0 : 1);
  // Before the stage costs, the rings as a lower bound (count_multi_rings counts them, checked below).
  TaskCount early = count_tasks(p_, m_, passes(), o_.allreduce);
  early.compute = count_.compute;
  if (Status s = check_count(early, 0); !s) return s;
  if (o_.costs) {
    costs_ = o_.costs;
  } else {
    auto r = stage_costs(w_, c_, p_, o_.micro_batch_size, o_.memory.recompute, o_.tensor_parallel);
    if (!r) return r.error();
    owned_costs_ = std::move(*r);
    costs_ = &owned_costs_;
  }
  if (costs_->size() != S_) return Error{"internal error: the stage costs given do not match the partition"};
  if (Status rr = check_round_robin(); !rr) return rr;
  for (size_t s = 0; s < S_; ++s)
    if ((*costs_)[s].size() != p_.stage(s).devices.size())
      return Error{"internal error: the stage costs given do not match the partition"};
  count_multi_rings();  // needs the stages' gradient bytes (trees' chunks)
  ties_ = tied_copies(w_, p_);
  count_.ring_steps += 4 * tied_pairs().size();  // a ring all-reduce of two: 2 steps of 2 flows
  if (Status s = check_count(count_, 0); !s) return s;
  size_t a2a_pairwise = 0, a2a_aggregated = 0;  // all-to-all flows, one per pair or node-aggregated
  // Grouped stages: a pass is several compute tasks and each device sends one flow per ring
  // collective, one per peer of an all-to-all (or two, node-aggregated). Counted here, exactly, now that the
  // programs are known.
  for (size_t st = 0; st < S_; ++st)
    if (p_.stage(st).grouped()) {
      any_grouped_ = true;
      const int cp = p_.stage(st).context_parallel;
      for (size_t j = 0; j < p_.stage(st).devices.size(); ++j)
        for (Pass pass : {Pass::Forward, Pass::Backward}) {
          const TpProgram& prog = *program(static_cast<int>(st), j, pass);
          piece_tasks_ += prog.collectives() * static_cast<size_t>(m_);
          for (size_t x = 0; x < prog.collectives(); ++x) {
            if (prog.flags[x] & kNoFlows) continue;
            if (prog.kinds[x] == CollectiveKind::SendRecv) {
              group_flows_ += static_cast<size_t>(m_);
            } else if (prog.kinds[x] != CollectiveKind::AllToAll) {  // one flow per ring (NIC)
              group_flows_ += group_rings(st, prog, x, j) * static_cast<size_t>(m_);
            } else if (prog.groups[x] == CommGroup::Context) {
              group_flows_ += static_cast<size_t>(cp - 1) * static_cast<size_t>(m_);
            } else if (prog.deduplicates[x].experts > 0) {
              Result<size_t> flows = deduplicated_flows(static_cast<int>(st), j, prog.deduplicates[x]);
              if (!flows) return flows.error();
              group_flows_ += *flows * static_cast<size_t>(m_);
            } else {
              const auto [pairwise, aggregated] = all_to_all_flows(static_cast<int>(st), pass, x, j);
              a2a_pairwise += pairwise * static_cast<size_t>(m_);
              a2a_aggregated += aggregated * static_cast<size_t>(m_);
            }
          }
        }
    }
  using Flows = MoeOptions::AllToAllFlows;
  const Flows mode = o_.tensor_parallel.moe.all_to_all;
  aggregate_ = mode == Flows::ByNode || (mode == Flows::Auto && a2a_pairwise > kAutoAggregateAllToAllFlows);
  aggregate_ = aggregate_ && a2a_aggregated < a2a_pairwise;
  g_.node_aggregated_all_to_all = aggregate_;
  group_flows_ += aggregate_ ? a2a_aggregated : a2a_pairwise;
  // Data-parallel overlap (o.dp_overlap): the first stage's gradients in K buckets, bucket k ready
  // once (k + 1) / K of its last backward (length L) has run, reduced one after another (NCCL
  // runs them in turn on one stream; on a ring of links they go in turn anyway). Bucket k then ends at
  // max_j<=k (r_j + (k + 1 - j) A / K), A the whole reduction's time, and the last at
  // max(r_0 + A, r_K-1 + A / K): r_j is linear in j, so the maximum is at an end. Lowered as two
  // reductions with the same ends: buckets 0 .. K - 2 together from r_0 (the backward's first K-th
  // done), then the last after the backward; without tensor parallelism the backward becomes those
  // two compute tasks (under it, its pieces are shared out).
  bucketed_ = o_.dp_overlap && S_ > 0 && p_.stage(0).gradient_replicas() > 1;
  buckets_ = bucketed_ ? dp_buckets(cost(0, 0).parameters - cost(0, 0).expert_parameters,
                                    p_.stage(0).gradient_replicas())
                       : 1;
  TaskCount with_tp = count_;
  if (any_grouped_ || bucketed_) {
    with_tp.compute += piece_tasks_;
    with_tp.transfers += group_flows_;
    if (bucketed_ && buckets_ > 1) {
      const size_t r0 = static_cast<size_t>(p_.stage(0).gradient_replicas()),
                   t0 = p_.stage(0).tensor_parallel;
      if (t0 == 1) with_tp.compute += p_.stage(0).devices.size();
      with_tp.ring_steps += 2 * (r0 - 1) * r0 * t0;
    }
    if (Status st = check_count(with_tp, group_flows_); !st) return st;
  }
  if (fold_) fold_->layout.whole_tasks = with_tp.total();
  return {};
}

Status Lowering::check_count(TaskCount n, size_t group_flows) const {
  if (fold_ && S_ > 0) {  // replica 0's passes, every device's optimizer step, the flows of every replica
    const size_t r = static_cast<size_t>(std::max(1, p_.stage(0).replicas()));
    n.compute = n.compute / r + D_;
    if (fold_->layout.groups_folded && !fold_->layout.tensor_only)
      n.transfers -= group_flows - group_flows / r;
  }
  return check_task_count(n, p_, m_, passes());
}

// The rings of collective x of device j's group in stage st (group_ring_orders, kept per group).
size_t Lowering::group_rings(size_t st, const TpProgram& prog, size_t x, size_t j) {
  const Stage& stage = p_.stage(st);
  const std::vector<int> members =
      group_members(prog.groups[x], static_cast<int>(j), stage.tensor_parallel,
                    {stage.expert_parallel, stage.expert_tensor_parallel}, stage.context_parallel);
  auto known = ring_orders_.find({static_cast<int>(st), static_cast<int>(prog.groups[x]), members[0]});
  if (known != ring_orders_.end()) return known->second.size();
  std::vector<int> devices;
  for (int q : members) devices.push_back(stage.devices[static_cast<size_t>(q)]);
  return ring_orders(static_cast<int>(st), prog.groups[x], members, devices).size();
}

// Round-robin replicas: stages without tensor, context or expert parallelism, sharing no device with
// the stages they exchange data with (a replica's transfers are then the same for each of its
// micro-batches).
Status Lowering::check_round_robin() {
  for (size_t s = 0; s < S_; ++s) {
    const Stage& a = p_.stage(s);
    if (!a.round_robin) continue;
    round_robin_ = true;
    if (a.grouped())
      return Error{fmt::format(
          "stage {}: round-robin replicas are for data-parallel replicas without tensor, context or expert "
          "parallelism",
          s)};
    for (int t : p_.successors(static_cast<int>(s)))
      for (int d : p_.stage(t).devices)
        if (std::find(a.devices.begin(), a.devices.end(), d) != a.devices.end())
          return Error{fmt::format(
              "stages {} and {} share {}: round-robin replicas need the stages they exchange data with on "
              "other devices",
              s, t, c_.devices[d].name)};
  }
  return {};
}

void Lowering::number_replicas() {
  g_.samples_per_iteration = m_ * o_.micro_batch_size;
  g_.device_order.resize(D_);
  g_.static_memory.assign(D_, MemoryBytes{});
  hosted_.resize(D_);
  rep_base_.assign(S_ + 1, 0);
  for (size_t s = 0; s < S_; ++s) {
    const auto& devs = p_.stage(s).devices;
    for (size_t j = 0; j < devs.size(); ++j)
      hosted_[devs[j]].emplace_back(static_cast<int>(s), static_cast<int>(j));
    rep_base_[s + 1] = rep_base_[s] + devs.size();
  }
  slot_.assign(rep_base_[S_] * m_ * 3, -1);
  last_backward_.assign(rep_base_[S_], -1);
}

void Lowering::find_bucketed_backwards() {
  dp_last_.assign(bucketed_ ? p_.stage(0).devices.size() : 0, {SIZE_MAX, 0});
  dp_piece_.assign(dp_last_.size(), {});
  for (size_t d = 0; bucketed_ && d < D_ && d < sched_.device_actions.size(); ++d)
    for (size_t i = 0; i < sched_.device_actions[d].size(); ++i) {
      const Action& a = sched_.device_actions[d][i];
      if (a.stage == 0 && a.pass != Pass::Forward) dp_last_[replica_of(0, d)] = {d, i};
    }
}

// Task numbering: each compute task is followed by the transfers it produces (activations after an
// F, gradients after a B), so that the replay's loop finds a task, its transfers, their times and
// successor rows in neighbouring memory (on a 1F1B chain of 1,024 devices the executor's loop went
// from 18.5% to 12.4% of the samples; docs/speed.md). Count them per (stage, replica) first.
void Lowering::count_pipeline_transfers() {
  out_forward_.assign(rep_base_[S_], 0);
  out_backward_.assign(rep_base_[S_], 0);
  // A round-robin F sends to the consumer replica whose turn its micro-batch is: counted on the
  // producer's first micro-batch (and a B's on the consumer's), the same for each (the stages of a
  // round-robin pair share no device: count()).
  for_each_transfer_pair([&](size_t s, int t, size_t i, size_t j, double, const Turn& turn) {
    if (p_.stage(s).devices[i] == p_.stage(t).devices[j]) return;
    if (turn.round_robin) {
      out_forward_[rep_index(static_cast<int>(s), static_cast<int>(i))] += turn.takes(turn.i);
      out_backward_[rep_index(t, static_cast<int>(j))] += turn.takes(turn.j);
      return;
    }
    ++out_forward_[rep_index(static_cast<int>(s), static_cast<int>(i))];
    ++out_backward_[rep_index(t, static_cast<int>(j))];
  });
}

void Lowering::reserve() {
  // Folded: replica 0's passes and pieces (1 / r of them) and every device's optimizer step, every
  // replica's transfers and rings, replica 0's group flows or every replica's.
  // With ranks folded, rank 0's passes and two flows per ring collective.
  const size_t t = fold_ ? static_cast<size_t>(fold_->layout.ranks_folded) : 1;
  const size_t r = fold_ ? static_cast<size_t>(fold_->layout.replicas) * t : 1;
  const size_t compute = fold_ ? count_.compute / r + D_ : count_.compute, pieces = piece_tasks_ / r,
               flows = fold_ && fold_->layout.groups_folded && !fold_->layout.tensor_only
                           ? group_flows_ / r * std::min<size_t>(t, 2)
                           : group_flows_;
  g_.reserve(compute + count_.transfers + count_.ring_steps + pieces + flows,
             count_.dependencies + 2 * count_.ring_steps + compute + 4 * flows);
  reserve_huge(g_.memory_changes, compute * 2);
  for (size_t d = 0; d < D_ && d < sched_.device_actions.size(); ++d)
    g_.device_order[d].reserve(copied(d) ? 1 : sched_.device_actions[d].size() + 1);
  if (multi_task_passes()) head_.assign(slot_.size(), -1);
}

// Compute tasks in device order, with their memory effects. An overlapped pair (Schedule::paired)
// interleaves its forward's and backward's tasks, and its backward's inputs gate the forward too. Passes
// in pieces separated by collectives interleave the backward's first (B1 F1 B2 F2 ...): Megatron-Core's
// order for the layers of a pair (megatron/core/models/common/model_chunk_schedule_plan.py,
// TransformerLayerSchedulePlan.run, at d98e8a64dd): the backward's combine sent before the forward's
// attention runs, the forward's dispatch beside the backward's MLP, the backward's dispatch beside the
// forward's MLP, the forward's combine beside the backward's attention; over a stage of several layers
// the pieces fall in exactly that order. Passes of one task each (no collective inside, DualPipe's
// chunks on a plain chain) run the forward first, so that the pair's output to the next stage is
// ready first, as it is, to within the last layer's backward, in the per-layer interleave.
void Lowering::add_compute_tasks() {
  std::vector<int32_t> f, b;
  for (size_t d = 0; d < D_ && d < sched_.device_actions.size(); ++d) {
    if (copied(d)) continue;  // copy_places
    auto& order = g_.device_order[d];
    const auto& acts = sched_.device_actions[d];
    for (size_t action = 0; action < acts.size(); ++action) {
      if (!sched_.is_paired(d, action) || action + 1 >= acts.size()) {
        add_pass(d, action, order);
        continue;
      }
      f.clear();
      b.clear();
      const size_t forward_changes = g_.memory_changes.size();
      const int32_t f_first = add_pass(d, action, f);
      const size_t backward_changes = g_.memory_changes.size();
      add_pass(d, action + 1, b);
      const bool backward_first = f.size() > 1 || b.size() > 1;
      if (backward_first) spread_pair_memory(forward_changes, backward_changes, f, b);
      for (size_t x = 0; x < std::max(f.size(), b.size()); ++x) {
        if (backward_first && x < b.size()) order.push_back(b[x]);
        if (x < f.size()) order.push_back(f[x]);
        if (!backward_first && x < b.size()) order.push_back(b[x]);
      }
      const Action& back = acts[action + 1];
      if (pair_head_.empty()) pair_head_.assign(slot_.size(), -1);
      pair_head_[slot_index(back.stage, replica_of(back.stage, d), back.pass, back.micro_batch)] = f_first;
      ++action;
    }
  }
}

// In a pair whose passes are pieces, the forward stashes its activations piece by piece (an equal
// share when each piece starts) and the backward frees them piece by piece (an equal share when each
// ends), as the per-layer interleave does: Megatron-Core runs layer i's forward beside layer L - i + 1's
// backward, so the forward's stash grows while the backward's shrinks and the pair holds about one
// micro-batch's activations, not two. The even share per piece is an assumption (a piece's share of a
// layer's activations is not known here). A split backward frees at W, which is not paired: unchanged.
void Lowering::spread_pair_memory(size_t forward_changes, size_t backward_changes,
                                  const std::vector<int32_t>& f, const std::vector<int32_t>& b) {
  auto spread = [&](size_t from, size_t to, const std::vector<int32_t>& pieces, bool at_end) {
    if (pieces.size() < 2) return;
    for (size_t i = from; i < to; ++i) {
      MemoryChange& c = g_.memory_changes[i];
      const bool stash =
          c.category == MemoryCategory::Activations && c.at_end == at_end &&
          (at_end ? c.bytes < 0 && c.task == pieces.back() : c.bytes > 0 && c.task == pieces.front());
      if (!stash) continue;
      const double share = c.bytes / static_cast<double>(pieces.size());
      const MemoryCategory category = c.category;
      c.bytes = share;
      c.task = pieces.front();
      for (size_t x = 1; x < pieces.size(); ++x)
        g_.memory_changes.push_back({pieces[x], category, at_end, share});
      return;
    }
  };
  spread(forward_changes, backward_changes, f, false);
  if (!sched_.split_backward) spread(backward_changes, g_.memory_changes.size(), b, true);
}

// What feeds the backward of (stage s, replica j, micro-batch k, on `device`) after `from`: the
// backward's first task, and the forward it is paired with.
void Lowering::feed_backward(int32_t from, int32_t to, int s, int j, int k, size_t device) {
  into(from, to, device);
  if (pair_head_.empty()) return;
  const int32_t f = pair_head_[slot_index(s, j, Pass::Backward, k)];
  if (f >= 0) into(from, f, device);
}

// The weight gradients' accumulation into the step's (GradAccumulation) that action `a` pays: after
// the whole backward, or after W when it is split. Round-robin replicas take every r-th micro-batch:
// the replica's own count.
double Lowering::accumulation_s(const Action& a, const StageCost& sc, size_t d) const {
  const GradAccumulation acc = o_.memory.grad_accumulation;
  const Stage& st = p_.stage(a.stage);
  const int own = st.round_robin ? a.micro_batch / std::max(1, st.replicas()) : a.micro_batch;
  if (a.pass != (sched_.split_backward ? Pass::Weight : Pass::Backward) || !pays_grad_accumulation(acc, own))
    return 0;
  return grad_accumulation_time(sc.parameters, sc.parameter_tensors, acc, w_.precision,
                                acc == GradAccumulation::MainGrad ? o_.gradient_reduce_bytes : 0,
                                c_.devices[d].spec);
}

// One action of device d: its compute task (under tensor parallelism its pieces; under bucketed
// overlap the first stage's last backward in two), room for the transfers it sends, and its memory.
// The tasks go to `order` in the device's order; returns the first.
int32_t Lowering::add_pass(size_t d, size_t action, std::vector<int32_t>& order) {
  const Action& a = sched_.device_actions[d][action];
  const int j = replica_of(a.stage, d);
  const StageCost& sc = cost(a.stage, j);
  Task t;
  t.kind = kind_of(a.pass);
  t.stage = a.stage;
  t.micro_batch = a.micro_batch;
  t.device = static_cast<int32_t>(d);
  int32_t first = -1;  // the pass's first compute task when it has several
  const TpProgram* tp_prog = program(a.stage, static_cast<size_t>(j), a.pass);
  if (tp_prog) {
    for (size_t piece = 0; piece + 1 < tp_prog->compute.size(); ++piece) {
      t.duration = tp_prog->compute[piece] * c_.devices[d].slowdown;
      const int32_t id = g_.add(t);
      if (first < 0) first = id;
      order.push_back(id);
    }
  }
  switch (a.pass) {
    case Pass::Forward:
      t.duration = sc.times.forward;
      break;
    case Pass::Backward:
      t.duration = sc.recompute_s + (sched_.split_backward ? sc.times.backward_input : sc.times.backward());
      break;
    case Pass::Weight:
      t.duration = sc.times.backward_weight;
      break;
  }
  if (tp_prog) t.duration = tp_prog->compute.back();
  t.duration += accumulation_s(a, sc, d);
  t.duration *= c_.devices[d].slowdown;
  const bool split = bucketed_ && a.stage == 0 && dp_last_[j] == std::pair<size_t, size_t>{d, action};
  if (split && !tp_prog && buckets_ > 1) {  // its first K-th, then the rest
    Task head_piece = t;
    head_piece.duration = t.duration / buckets_;
    t.duration -= head_piece.duration;
    const int32_t piece = g_.add(head_piece);
    if (first < 0) first = piece;
    order.push_back(piece);
    dp_piece_[j].push_back(piece);
  }
  const int32_t id = g_.add(t);
  // Under tensor parallelism the pass's P pieces (first .. id): the first K-th is taken as done
  // after piece ceil(P / K) - 1.
  if (split && tp_prog && buckets_ > 1)
    dp_piece_[j].push_back(first + (static_cast<int64_t>(tp_prog->compute.size()) + buckets_ - 1) / buckets_ -
                           1);
  if (split) dp_piece_[j].push_back(id);
  slot_of(a.stage, j, a.pass, a.micro_batch) = id;
  if (first < 0) first = id;
  if (multi_task_passes()) head_[slot_index(a.stage, j, a.pass, a.micro_batch)] = first;
  const int32_t out = a.pass == Pass::Forward    ? out_forward_[rep_index(a.stage, j)]
                      : a.pass == Pass::Backward ? out_backward_[rep_index(a.stage, j)]
                                                 : 0;
  for (int32_t x = 0; x < out; ++x) g_.add(Task{});  // its transfers, filled in later
  reserved_ += out;
  order.push_back(id);
  // Memory: F stashes; B re-materialises what was recomputed and holds its workspace; the
  // activations go when the last backward pass of the micro-batch (B, or W when split) ends.
  // Allocations when the pass starts (its first task), frees when it ends (its last).
  auto change = [&](MemoryCategory cat, bool at_end, double bytes) {
    if (bytes != 0) g_.memory_changes.push_back({at_end ? id : first, cat, at_end, bytes});
  };
  if (a.pass == Pass::Forward) change(MemoryCategory::Activations, false, sc.stash_bytes);
  if (a.pass == Pass::Backward) {
    change(MemoryCategory::Activations, false, sc.recompute_bytes);
    change(MemoryCategory::Workspace, false, sc.workspace_bytes);
    change(MemoryCategory::Workspace, true, -sc.workspace_bytes);
  }
  const bool frees = sched_.split_backward ? a.pass == Pass::Weight : a.pass == Pass::Backward;
  if (frees) change(MemoryCategory::Activations, true, -(sc.stash_bytes + sc.recompute_bytes));
  if (a.pass != Pass::Forward) last_backward_[rep_index(a.stage, j)] = id;
  return first;
}

// Activations forward, gradients backward, between stages, each in the place its producer left.
// The pairs come in the same order as when the places were counted, and every pair sends one
// transfer per micro-batch: a pair's place in the block after its producer's F (or B) is the
// same for every micro-batch, counted per (stage, replica) (no counter per compute task).
Status Lowering::add_pipeline_transfers() {
  std::vector<int32_t> forward_offset(rep_base_[S_], 0), backward_offset(rep_base_[S_], 0);
  size_t placed = 0, missing = 0;
  auto place = [&](int s, int replica, Pass pass, int k, int32_t offset, const Task& task) {
    if (copied(static_cast<size_t>(task.device))) return g_.add(task);  // its producer is a copy
    const int32_t id = slot_of(s, replica, pass, k) + offset;
    g_.tasks[id] = task;
    ++placed;
    return id;
  };
  // Round-robin pairs change with the micro-batch: their places are counted per pass instead.
  std::vector<int32_t> filled(round_robin_ ? slot_.size() : 0, 0);
  for_each_transfer_pair([&](size_t s, int t, size_t i, size_t j, double share, const Turn& turn) {
    auto e = boost::edge(s, t, p_.graph).first;
    const double bytes = p_.graph[e].bytes_per_sample * o_.micro_batch_size;
    const auto& from = p_.stage(s).devices;
    const auto& to = p_.stage(t).devices;
    const int si = static_cast<int>(s), ii = static_cast<int>(i), ji = static_cast<int>(j);
    int32_t fo = 0, bo = 0;  // this pair's places after the F and the B (from 1; 0: no transfer)
    if (from[i] != to[j] && !round_robin_) {
      fo = ++forward_offset[rep_index(si, ii)];
      bo = ++backward_offset[rep_index(t, ji)];
    }
    for (int k = 0; k < m_; ++k) {
      if (!p_.stage(s).runs(k, m_)) continue;  // DualPipe: the other pipeline's micro-batch
      if (!turn.takes(k)) continue;            // round-robin: another replica's micro-batch
      if (round_robin_ && from[i] != to[j]) {
        fo = ++filled[slot_index(si, ii, Pass::Forward, k)];
        bo = ++filled[slot_index(t, ji, Pass::Backward, k)];
      }
      const int32_t f_src = slot_of(si, ii, Pass::Forward, k);
      int32_t f_dst = slot_of(t, ji, Pass::Forward, k);
      const int32_t b_src = slot_of(t, ji, Pass::Backward, k);
      int32_t b_dst = slot_of(si, ii, Pass::Backward, k);
      if (f_src < 0 || f_dst < 0 || b_src < 0 || b_dst < 0) {  // validate_schedule rules it out
        ++missing;
        continue;
      }
      if (multi_task_passes()) {  // a pass receives into its first compute task
        f_dst = head_[slot_index(t, ji, Pass::Forward, k)];
        b_dst = head_[slot_index(si, ii, Pass::Backward, k)];
      }
      if (from[i] == to[j]) {
        if (copied(static_cast<size_t>(from[i]))) continue;  // between copies: as between their images
        g_.depend(f_src, f_dst);
        feed_backward(b_src, b_dst, si, ii, k, static_cast<size_t>(from[i]));
        continue;
      }
      Task act{TaskKind::Transfer, TransferKind::Activation, 0, si, t, k, from[i], to[j], 0, bytes * share};
      const int32_t a = place(si, ii, Pass::Forward, k, fo, act);
      g_.depend(f_src, a);
      into(a, f_dst, static_cast<size_t>(to[j]));
      Task grad{TaskKind::Transfer, TransferKind::Gradient, 0, t, si, k, to[j], from[i], 0, bytes * share};
      const int32_t b = place(t, ji, Pass::Backward, k, bo, grad);
      g_.depend(b_src, b);
      feed_backward(b, b_dst, si, ii, k, static_cast<size_t>(from[i]));
    }
  });
  if (missing > 0 || placed != reserved_)
    return Error{"internal error: the schedule's passes and the transfers between them do not match"};
  return {};
}

// The grouped stages' collectives (core/collectives.h): a tensor-parallel or expert tensor-parallel
// all-reduce, all-gather or reduce-scatter as a merged ring over its group, an expert-parallel
// all-to-all as one flow per pair (node-aggregated, two per device, where every pair exchanges alike:
// aggregated_layout), a context-parallel ring step as a ring shift; each once the group's members
// reached it (a ring step marked kAfterPrevious also once the previous step arrived). A device goes
// on once its flows in and out are done (with overlap, or a collective marked kBesideNext, one
// compute piece later).
void Lowering::add_group_collectives() {
  for (size_t st = 0; st < S_; ++st) {
    const Stage& stage = p_.stage(st);
    if (!stage.grouped()) continue;
    const int s = static_cast<int>(st), n = static_cast<int>(stage.devices.size());
    const ExpertSizes es{stage.expert_parallel, stage.expert_tensor_parallel};
    // Per pass and collective, the groups by their first position (the collectives' kinds and groups
    // are alike on every device of the stage). A group is lowered when its first position comes up:
    // tensor-parallel groups replica by replica, as before expert parallelism.
    std::vector<std::vector<std::vector<std::vector<int>>>> groups(2);
    for (Pass pass : {Pass::Forward, Pass::Backward}) {
      const TpProgram& prog = *program(s, 0, pass);
      auto& by_x = groups[pass == Pass::Forward ? 0 : 1];
      by_x.assign(prog.collectives(), std::vector<std::vector<int>>(static_cast<size_t>(n)));
      for (size_t x = 0; x < prog.collectives(); ++x)
        for (int r = 0; r < n; ++r) {
          std::vector<int> members =
              group_members(prog.groups[x], r, stage.tensor_parallel, es, stage.context_parallel);
          if (members.front() == r) by_x[x][static_cast<size_t>(r)] = std::move(members);
        }
    }
    std::vector<Deps> previous;  // the last context-parallel exchange of the group, per member
    for (int r = 0; r < n; ++r)
      for (Pass pass : {Pass::Forward, Pass::Backward}) {
        const auto& by_x = groups[pass == Pass::Forward ? 0 : 1];
        for (int k = 0; k < m_; ++k) {
          previous.clear();
          for (size_t x = 0; x < by_x.size(); ++x) {
            const auto& members = by_x[x][static_cast<size_t>(r)];
            if (members.empty() || copied_group(stage, members, program(s, 0, pass)->groups[x])) continue;
            std::vector<Deps> done = add_collective(s, pass, k, x, members, previous);
            if (!done.empty() && program(s, 0, pass)->groups[x] == CommGroup::Context)
              previous = std::move(done);
          }
        }
      }
  }
}

// Collective x of stage s's pass of micro-batch k among the stage positions `members` (after
// `previous` when marked kAfterPrevious); what each member holds its result after (empty: no flows).
std::vector<Deps> Lowering::add_collective(int s, Pass pass, int k, size_t x, const std::vector<int>& members,
                                           const std::vector<Deps>& previous) {
  const Stage& stage = p_.stage(s);
  const size_t n = members.size();
  const TpProgram& prog = *program(s, static_cast<size_t>(members[0]), pass);
  if (prog.flags[x] & kNoFlows) return {};
  std::vector<int32_t> heads(n);
  for (size_t q = 0; q < n; ++q) heads[q] = head_[slot_index(s, members[q], pass, k)];
  if (std::count(heads.begin(), heads.end(), -1) > 0) return {};
  const bool chained = (prog.flags[x] & kAfterPrevious) && previous.size() == n;
  std::vector<int> devices(n);
  std::vector<Deps> ready(n);
  for (size_t q = 0; q < n; ++q) {
    devices[q] = stage.devices[static_cast<size_t>(members[q])];
    ready[q] = {heads[q] + static_cast<int32_t>(x)};
    if (chained) ready[q].insert(ready[q].end(), previous[q].begin(), previous[q].end());
  }
  const bool context = prog.groups[x] == CommGroup::Context;
  const FlowTag tag{traffic_of(prog.groups[x]), s, k};
  const size_t first = g_.tasks.size();
  std::vector<Deps> done;
  if (prog.kinds[x] == CollectiveKind::AllToAll && prog.deduplicates[x].experts > 0) {
    done = deduplicated_all_to_all(s, prog, x, devices, ready, tag);
  } else if (prog.kinds[x] == CollectiveKind::AllToAll) {
    if (auto layout = aggregate_ && !context ? aggregated_layout(s, pass, x, members) : std::nullopt) {
      const double sent = program(s, static_cast<size_t>(members[0]), pass)->bytes[x];
      done = append_node_aggregated_all_to_all(
          g_, devices, layout->first, layout->second, ready,
          sent * cost(s, static_cast<size_t>(members[0])).expert_load / stage.expert_parallel, tag);
    } else {
      done = pairwise_all_to_all(s, pass, x, members, devices, ready, tag);
    }
  } else if (prog.kinds[x] == CollectiveKind::SendRecv) {
    done = append_ring_shift(g_, devices, ready, prog.bytes[x], tag);
  } else if (rank_ring(devices)) {  // ranks folded: the flows into and out of rank 0
    done = append_merged_ring_at(g_, prog.kinds[x], devices, ready, prog.bytes[x], tag, 0);
  } else {
    done = append_merged_rings(g_, prog.kinds[x], devices, ring_orders(s, prog.groups[x], members, devices),
                               ready, prog.bytes[x], tag);
  }
  charge_engine(g_, first, c_, devices);
  const bool beside = (prog.flags[x] & kBesideNext) != 0 || (!context && o_.tensor_parallel.overlap);
  const size_t next = beside ? std::min(x + 2, prog.collectives()) : x + 1;
  for (size_t q = 0; q < n; ++q)
    for (int32_t f : done[q]) into(f, heads[q] + static_cast<int32_t>(next), static_cast<size_t>(devices[q]));
  return done;
}

std::optional<std::pair<std::vector<std::pair<int, int>>, int>> Lowering::aggregated_layout(
    int s, Pass pass, size_t x, const std::vector<int>& members) const {
  const auto first = static_cast<size_t>(members[0]);
  const double sent = program(s, first, pass)->bytes[x], load = cost(s, first).expert_load;
  std::vector<int> devices;
  for (int q : members) {
    if (program(s, static_cast<size_t>(q), pass)->bytes[x] != sent ||
        cost(s, static_cast<size_t>(q)).expert_load != load)
      return std::nullopt;
    devices.push_back(p_.stage(s).devices[static_cast<size_t>(q)]);
  }
  return node_layout(c_, devices);
}

std::pair<size_t, size_t> Lowering::all_to_all_flows(int s, Pass pass, size_t x, size_t j) const {
  const Stage& stage = p_.stage(s);
  const std::vector<int> members =
      group_members(program(s, j, pass)->groups[x], static_cast<int>(j), stage.tensor_parallel,
                    ExpertSizes{stage.expert_parallel, stage.expert_tensor_parallel}, stage.context_parallel);
  const size_t pairwise = members.size() - 1;
  if (auto layout = aggregated_layout(s, pass, x, members))
    return {pairwise,
            static_cast<size_t>(node_aggregated_flows(static_cast<int>(members.size()), layout->second))};
  return {pairwise, pairwise};
}

Result<size_t> Lowering::deduplicated_flows(int s, size_t j, const RoutingDraw& draw) const {
  const Stage& stage = p_.stage(s);
  std::vector<int> devices;
  for (int q : group_members(CommGroup::Expert, static_cast<int>(j), stage.tensor_parallel,
                             ExpertSizes{stage.expert_parallel, stage.expert_tensor_parallel},
                             stage.context_parallel))
    devices.push_back(stage.devices[static_cast<size_t>(q)]);
  const auto layout = node_layout(c_, devices);
  if (!layout)
    return Error{fmt::format(
        "stage {}: the deepep dispatcher forwards tokens inside each node, and the expert-parallel group of "
        "{} "
        "does not hold equally many devices on every node it spans (use alltoall, or place the group evenly)",
        s, c_.devices[static_cast<size_t>(devices.front())].name)};
  const size_t m = static_cast<size_t>(layout->second), nodes = devices.size() / m;
  const int held = draw.experts / stage.expert_parallel;
  if (!aligned_with_groups(draw, held) || !aligned_with_groups(draw, held * static_cast<int>(m)))
    return Error{fmt::format(
        "stage {}: the deepep dispatcher's de-duplication under group-limited routing ({} groups of {} "
        "experts) "
        "needs each device's {} experts and each node's {} to lie inside one group or cover whole groups",
        s, draw.groups, draw.experts / draw.groups, held, held * static_cast<int>(m))};
  return (nodes - 1) + (m - 1);
}

// DeepEP's dispatch (or combine) among the expert-parallel group `devices`: collectives.h's
// de-duplicated byte matrix for the group's node layout (checked in count()), at balanced routing.
std::vector<Deps> Lowering::deduplicated_all_to_all(int s, const TpProgram& prog, size_t x,
                                                    const std::vector<int>& devices,
                                                    const std::vector<Deps>& ready, const FlowTag& tag) {
  const Stage& stage = p_.stage(s);
  const RoutingDraw& draw = prog.deduplicates[x];
  const auto layout = node_layout(c_, devices);
  const int held = draw.experts / stage.expert_parallel, m = layout->second;
  return append_all_to_all(
      g_, devices, ready,
      deduplicated_dispatch_bytes(layout->first, m, prog.bytes[x] / draw.top_k,
                                  routed_hit_probability(draw, held), routed_hit_probability(draw, held * m)),
      tag);
}

// Sender i's bytes go to each peer in proportion to the peer's expert load (the combine returns
// them), or evenly over a context-parallel group (each peer's heads); its own share stays.
std::vector<Deps> Lowering::pairwise_all_to_all(int s, Pass pass, size_t x, const std::vector<int>& members,
                                                const std::vector<int>& devices,
                                                const std::vector<Deps>& ready, const FlowTag& tag) {
  const Stage& stage = p_.stage(s);
  const TpProgram& prog = *program(s, static_cast<size_t>(members[0]), pass);
  const size_t n = members.size();
  std::vector<std::vector<double>> bytes(n, std::vector<double>(n, 0.0));
  for (size_t i = 0; i < n; ++i) {
    const double sent = program(s, static_cast<size_t>(members[i]), pass)->bytes[x];
    for (size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      const double load = prog.groups[x] == CommGroup::Context
                              ? 1.0 / static_cast<double>(n)
                              : cost(s, static_cast<size_t>(members[j])).expert_load / stage.expert_parallel;
      (prog.combines[x] ? bytes[j][i] : bytes[i][j]) = sent * load;
    }
  }
  return append_all_to_all(g_, devices, ready, bytes, tag);
}

// Static memory, then each replicated stage's gradients: each rank of the tensor-parallel groups
// reduces its shard with the same rank of the other replicas (every device of the stage when there
// is no tensor parallelism), after its last backward (bucketed: see count()). With dp_overlap under
// ZeRO-1 the reduction is the distributed optimizer's reduce-scatter (the parameter all-gather taken
// as hidden behind the next forward); otherwise an all-reduce.
void Lowering::add_data_parallel_collectives() {
  step_inputs_.assign(D_, {});
  reduced_.assign(D_, {});
  step_parameters_.assign(D_, 0.0);
  for (size_t s = 0; s < S_; ++s) {
    add_static_memory(s);
    const Stage& stage = p_.stage(s);
    // DualPipe's second pipeline reduces with its mirror (below, from the mirror's side).
    if (stage.mirror >= 0 && stage.mirror < static_cast<int>(s)) continue;
    const Stage* mirror = stage.mirror >= 0 ? &p_.stage(static_cast<size_t>(stage.mirror)) : nullptr;
    // Dense gradients: each rank of the tensor-parallel groups with the same rank of the other
    // replicas (every device of the stage when there is no tensor parallelism), and of the mirror.
    const int r = stage.gradient_replicas(), T = stage.tensor_parallel;
    for (int q = 0; q < T; ++q) {
      std::vector<std::pair<int, int>> members;
      for (int j = 0; j < r; ++j) members.emplace_back(static_cast<int>(s), j * T + q);
      if (mirror)
        for (int j = 0; j < mirror->gradient_replicas(); ++j) members.emplace_back(stage.mirror, j * T + q);
      const StageCost& sq = cost(s, q);
      const double params = sq.parameters - sq.expert_parameters;
      const double bytes = o_.gradient_reduce_bytes > 0 ? params * o_.gradient_reduce_bytes
                                                        : sq.parameter_bytes - sq.expert_parameter_bytes;
      reduce_gradients(members, bytes, bucketed_ && s == 0 && buckets_ > 1 && !mirror);
    }
    reduce_expert_gradients(s, mirror);
  }
  // Tied weights: each copy's gradient all-reduced with its source's, after both devices' reductions
  // (Megatron-Core's finalize_model_grads: the data-parallel reductions, then
  // _allreduce_word_embedding_grads over the first and last pipeline stages' ranks).
  for (const TiedPair& x : tied_pairs()) {
    const double n =
        cost(static_cast<size_t>(x.copy.first), static_cast<size_t>(x.copy.second)).tied_parameters;
    reduce_gradients(
        {x.copy, x.source},
        tied_gradient_bytes(w_, w_.layer(static_cast<size_t>(x.layer)), n, o_.gradient_reduce_bytes), false,
        true);
  }
}

// Stage s's static memory on each of its devices, and the parameters each one's optimizer step updates:
// under ZeRO-1 the optimizer state (and the step) sharded over the data x context-parallel group for the
// dense parameters, over the expert data-parallel group for the experts'.
void Lowering::add_static_memory(size_t s) {
  const Stage& stage = p_.stage(s);
  const auto& all = stage.devices;
  const int r = stage.gradient_replicas();
  // The expert data-parallel size: the devices holding the same experts (core/moe.h).
  const int edp = static_cast<int>(all.size()) / (stage.expert_parallel * stage.expert_tensor_parallel);
  for (size_t j = 0; j < all.size(); ++j) {
    const StageCost& sc = cost(s, j);
    const double dense = sc.parameters - sc.expert_parameters;
    MemoryBytes st = static_memory(dense, sc.parameter_bytes - sc.expert_parameter_bytes, o_.memory);
    MemoryBytes ex = static_memory(sc.expert_parameters, sc.expert_parameter_bytes, o_.memory);
    if (o_.memory.zero1) {
      st[static_cast<int>(MemoryCategory::OptimizerState)] /= r;
      ex[static_cast<int>(MemoryCategory::OptimizerState)] /= edp;
    }
    for (int k = 0; k < kMemoryCategoryCount; ++k) g_.static_memory[all[j]][k] += st[k] + ex[k];
    step_parameters_[all[j]] +=
        o_.memory.zero1 ? dense / r + sc.expert_parameters / edp : dense + sc.expert_parameters;
  }
}

// Stage s's expert gradients: over the expert data-parallel group (same expert tensor- and
// expert-parallel rank) and the mirror's, after the last backward in one piece; under dp_overlap the
// first stage's in buckets of their own, as the dense ones (Megatron-Core's expert_parallel_buffers and
// bucket groups: the same bucket size, max(40 M, 1 M x d), reduced on the expert data-parallel group's
// communicator).
void Lowering::reduce_expert_gradients(size_t s, const Stage* mirror) {
  const Stage& stage = p_.stage(s);
  const int inner = stage.expert_parallel * stage.expert_tensor_parallel;
  const int edp = static_cast<int>(stage.devices.size()) / inner;
  for (int c = 0; c < inner && cost(s, 0).expert_parameters > 0; ++c) {
    std::vector<std::pair<int, int>> members;
    for (int j = 0; j < edp; ++j) members.emplace_back(static_cast<int>(s), j * inner + c);
    if (mirror)
      for (int j = 0; j < edp; ++j) members.emplace_back(stage.mirror, j * inner + c);
    const StageCost& sq = cost(s, static_cast<size_t>(c));
    const double bytes = o_.gradient_reduce_bytes > 0 ? sq.expert_parameters * o_.gradient_reduce_bytes
                                                      : sq.expert_parameter_bytes;
    const DpBuckets b = first_stage_buckets(sq.parameters - sq.expert_parameters, sq.expert_parameters,
                                            stage.gradient_replicas(), mirror != nullptr);
    reduce_gradients(members, bytes, bucketed_ && s == 0 && b.expert > 1, false, b.expert);
  }
}

std::vector<Lowering::TiedPair> Lowering::tied_pairs() const {
  std::vector<TiedPair> out;
  for (const TiedCopy& c : ties_) {
    const Stage& st = p_.stage(static_cast<size_t>(c.stage));
    const size_t n = c.copies.size(), n0 = p_.stage(static_cast<size_t>(c.source_stage)).devices.size();
    for (size_t j = 0; j < std::max(n, n0); ++j)
      if (c.copies[j % n])
        out.push_back({{c.stage, static_cast<int>(j % n)},
                       {c.source_stage, static_cast<int>(j % n0)},
                       st.layers[static_cast<size_t>(c.index)]});
  }
  return out;
}

// The gradient reduction of `bytes` among `members` (stage, position), after their last backward (bucketed:
// buckets 0 .. K - 2 together from the backward's first K-th, then the last; see count(); K = `buckets`
// for the shares, the first stage's dense K for the ready points: an expert buffer's first K_e-th is
// taken as ready where the dense buffer's first K-th is). With
// dp_overlap under ZeRO-1 it is the distributed optimizer's reduce-scatter (the parameter all-gather
// taken as hidden behind the next forward), else an all-reduce. A device's optimizer step waits for it.
void Lowering::reduce_gradients(const std::vector<std::pair<int, int>>& members, double bytes, bool bucketed,
                                bool tied, int buckets) {
  if (buckets < 1) buckets = buckets_;
  const CollectiveKind kind =
      o_.dp_overlap && o_.memory.zero1 && !tied ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce;
  const size_t r = members.size();
  const int32_t stage = members.front().first;
  std::vector<int> devs(r);
  std::vector<int32_t> ready(r);
  for (size_t j = 0; j < r; ++j) {
    const auto [s, position] = members[j];
    devs[j] = p_.stage(static_cast<size_t>(s)).devices[static_cast<size_t>(position)];
    ready[j] = last_backward_[rep_index(s, position)];
  }
  if (r == 1) {
    if (ready[0] >= 0) step_inputs_[devs[0]].push_back(ready[0]);
    return;
  }
  const int k_count = bucketed ? 2 : 1;
  for (int k = 0; k < k_count; ++k) {
    if (k_count > 1)
      for (size_t j = 0; j < r; ++j)
        ready[j] = dp_piece_[static_cast<size_t>(members[j].second)][static_cast<size_t>(k)];
    const double share = k_count == 1 ? 1.0 : k == 0 ? (buckets - 1.0) / buckets : 1.0 / buckets;
    // Without dp_overlap a device's reductions run one after another (Megatron's finalize_model_grads:
    // each chunk's dense, then expert, buffers synchronously; reduce_after_device_backward).
    // A tied weight's all-reduce waits for every reduction (and last backward) of its devices
    // (finalize_model_grads: every chunk's grad sync finished first).
    std::vector<Deps> ready_sets(r);
    for (size_t j = 0; j < r; ++j)
      if (tied && !step_inputs_[devs[j]].empty())
        ready_sets[j] = Deps(step_inputs_[devs[j]].begin(), step_inputs_[devs[j]].end());
      else if (!o_.dp_overlap && !reduced_[devs[j]].empty())
        ready_sets[j] = reduced_[devs[j]];
      else if (ready[j] >= 0)
        ready_sets[j] = {ready[j]};
    std::vector<Deps> done;
    if (merge_dp_rings_) {
      const size_t first = g_.tasks.size();
      done = append_merged_rings(g_, kind, devs, multi_ring_orders(c_, devs), ready_sets, bytes * share,
                                 FlowTag{TransferKind::DataParallel, stage, -1});
      charge_engine(g_, first, c_, devs);
      if (o_.allreduce == AllReduceAlgorithm::Nccl && kind == CollectiveKind::AllReduce) ++g_.nccl_picks[2];
    } else {
      AllReduceAlgorithm a = o_.allreduce;
      if (a == AllReduceAlgorithm::Nccl) {  // NCCL's pick for this call, counted for the output
        if (!router_) router_ = std::make_unique<Router>(c_);
        a = resolve_allreduce(a, kind, c_, *router_, devs, bytes * share);
        if (kind == CollectiveKind::AllReduce) ++g_.nccl_picks[a == AllReduceAlgorithm::Tree ? 0 : 1];
      }
      done = append_data_parallel(g_, kind, a, c_, devs, ready_sets, bytes * share, stage);
    }
    for (size_t j = 0; j < r; ++j) {
      step_inputs_[devs[j]].insert(step_inputs_[devs[j]].end(), done[j].begin(), done[j].end());
      if (!done[j].empty()) reduced_[devs[j]] = done[j];
    }
  }
}

void Lowering::add_optimizer_steps() {
  // Folded: a copied device's step follows its image's last pass (the image's own step is added here).
  std::vector<int32_t> last(fold_ ? D_ : 0, -1);
  for (size_t d = 0; d < last.size(); ++d)
    if (!g_.device_order[d].empty()) last[d] = g_.device_order[d].back();
  for (size_t d = 0; d < D_; ++d) {
    if (copied(d)) {
      if (d >= sched_.device_actions.size() || sched_.device_actions[d].empty()) continue;
    } else if (g_.device_order[d].empty()) {
      continue;
    }
    Task t;
    t.kind = TaskKind::Optimizer;
    t.device = static_cast<int32_t>(d);
    t.duration = device_step_time(w_, step_parameters_[d], o_.memory, c_.devices[d]);
    const int32_t id = g_.add(t);
    for (int32_t in : step_inputs_[d])
      if (g_.tasks[in].kind == TaskKind::Transfer)
        g_.depend(in, id);  // compute inputs on d precede it in order
    if (copied(d)) g_.depend(last[static_cast<size_t>(fold_->layout.image[d])], id);
    g_.device_order[d].push_back(id);
  }
}

}  // namespace

Result<TaskGraph> lower(const Workload& w, const Cluster& c, const Partition& p, const Schedule& s,
                        const LoweringOptions& o) {
  return Lowering(w, c, p, s, o).run();
}

Result<FoldedGraph> lower_folded(const Workload& w, const Cluster& c, const Partition& p, const Schedule& s,
                                 const LoweringOptions& o, FoldOptions fold, size_t min_whole_tasks) {
  FoldedGraph f;
  f.layout.groups_folded = fold.groups;
  f.layout.tensor_only = fold.groups && fold.tensor_only;
  Lowering lowering(w, c, p, s, o, &f);
  lowering.min_whole_tasks = min_whole_tasks;
  lowering.fold_ranks = fold.ranks;
  Result<TaskGraph> g = lowering.run();
  if (!g) return g.error();
  f.graph = std::move(*g);
  if (f.graph.tasks.empty()) return f;
  // The whole graph: these tasks, each copy's image's passes, and (folded) replica 0's group flows in
  // every replica, each ring collective of t flows where ranks are folded (two lowered, or t = 2).
  FoldLayout& l = f.layout;
  size_t passes = 0, flows = 0;
  for (size_t d = 0; d < l.image.size() && d < f.graph.device_order.size(); ++d)
    if (const auto& theirs = f.graph.device_order[static_cast<size_t>(std::max(l.image[d], 0))];
        l.copied(d) && !theirs.empty())
      passes += theirs.size() - 1;
  for (const Task& t : f.graph.tasks)
    flows += t.kind == TaskKind::Transfer && l.folds(t.transfer) &&
             l.replica[static_cast<size_t>(t.device)] == 0 && l.replica[static_cast<size_t>(t.peer)] == 0;
  const size_t rt = static_cast<size_t>(l.ranks_folded), kept = std::min<size_t>(rt, 2);
  l.copied_flows = flows / kept * rt * static_cast<size_t>(l.replicas) - flows;
  l.whole_tasks = f.graph.tasks.size() + passes + l.copied_flows;
  return f;
}
}  // namespace pipegrid
