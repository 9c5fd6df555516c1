// The 3D search's one-replica estimate (search3d.h, docs/3d-search.md "How a candidate is costed"):
// one pipeline of one device per stage, the tensor-parallel collectives as delays inside each pass,
// the data-parallel all-reduce in closed form.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/collectives.h"
#include "core/device.h"
#include "core/evaluate.h"
#include "core/lower.h"
#include "core/moe.h"
#include "core/planners/search3d.h"
#include "core/strategy.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

// What a collective of a group costs on its routes (rank 0's groups of pipeline rank 0 stand for
// all: the cluster is homogeneous): the slowest hop of the group's ring, and for an all-to-all the
// machines it spans and a member's slowest routes inside its machine and out of it.
struct GroupLinks {
  int n = 1;
  LinkCost ring;
  // Where the group's ring collectives run as several rings (NCCL's ring per NIC across machines,
  // multi_ring_orders, as the lowering runs them): seconds per byte of one device's flow on the
  // busiest link direction, each ring carrying 1 / rings of it. 0: one ring, 1 / ring.bandwidth.
  double seconds_per_byte = 0;
  int machines = 1, per_machine = 1;
  LinkCost intra, inter;
};

Result<GroupLinks> group_links(const Router& router, const Cluster& cl, const std::vector<int>& devices) {
  GroupLinks gl;
  gl.n = static_cast<int>(devices.size());
  Result<LinkCost> ring = ring_link_cost(router, devices);
  if (!ring) return ring.error();
  gl.ring = *ring;
  const std::vector<std::vector<size_t>> orders = group_ring_orders(cl, devices);
  if (orders.size() > 1) {
    std::map<size_t, std::pair<double, double>> load;  // channel: (share of a flow, bandwidth)
    for (const std::vector<size_t>& order : orders)
      for (size_t j = 0; j < order.size(); ++j) {
        Result<Route> r = router.route(devices[order[j]], devices[order[(j + 1) % order.size()]]);
        if (!r) return r.error();
        gl.ring.add_hop(r->latency, r->bandwidth);
        for (const Hop& h : r->hops) {
          auto& l = load[link_channel(cl, h)];
          l.first += 1.0 / static_cast<double>(orders.size());
          l.second = cl.links[h.link].bandwidth;
        }
      }
    for (const auto& [channel, l] : load)
      gl.seconds_per_byte = std::max(gl.seconds_per_byte, l.first / l.second);
  }
  std::map<std::string, int> per_machine;
  for (int d : devices) ++per_machine[cl.machine_of(d)];
  gl.machines = static_cast<int>(per_machine.size());
  for (const auto& [machine, count] : per_machine) gl.per_machine = std::max(gl.per_machine, count);
  for (size_t j = 1; j < devices.size(); ++j) {
    Result<Route> r = router.route(devices[0], devices[j]);
    if (!r) return r.error();
    (cl.machine_of(devices[j]) == cl.machine_of(devices[0]) ? gl.intra : gl.inter)
        .add_hop(r->latency, r->bandwidth);
  }
  return gl;
}

using GroupLinkMap = std::map<CommGroup, GroupLinks>;

// A pass of a grouped stage on its representative, as the lowering's chain of compute pieces and
// collectives runs it when every member of each group is alike (Lowering::add_collective): collective
// x starts once piece x has run (on every member: the same time by symmetry), queued behind the
// previous collective of its group (FIFO on the group's links, as the evaluator), and a context-parallel
// step marked kAfterPrevious also after the previous step arrived; the piece after it waits for it
// (with `overlap`, or a context-parallel step marked kBesideNext, the piece after that does). A ring
// collective (tensor, expert tensor-parallel, the all-gather dispatcher's, a context-parallel
// all-gather) takes the ring's latency + ring_flow_bytes / bandwidth on the group's slowest hop; a ring
// shift (p2p ring attention) latency + its bytes / bandwidth; an all-to-all the closed form over the
// machines its group spans (core/collectives.h), each pair carrying the representative's bytes x
// `share` (the busiest expert-parallel rank's share of the token copies: its port sets the pace) or,
// over a context-parallel group, 1 / cp of them. kNoFlows collectives and those of the groups in
// `skip` take no time (to split the exposure between groups). Returns the pass's time.
// The device's compute pieces in a given order and the collectives between them (pass_time's rules),
// for one pass or for an overlapped pair's two, each pass with its own chain and all of them sharing the
// device and the groups' links.
class PieceRunner {
 public:
  PieceRunner(const GroupLinkMap& links, bool overlap, const std::vector<CommGroup>& skip)
      : links_(links), overlap_(overlap), skip_(skip) {}

  struct Pass {
    Pass(const TpProgram& p, double s)
        : prog(p), share(s), done(p.collectives(), 0.0), wait(p.collectives() + 1, 0.0) {}
    const TpProgram& prog;
    double share;
    std::vector<double> done, wait;  // wait[k]: what piece k waits for
    double previous_step = 0;        // the last context-parallel exchange's arrival
  };

  // Runs piece k of pass x on the device, then starts the collective after it.
  void step(Pass& x, size_t k) {
    const TpProgram& prog = x.prog;
    const size_t n = prog.collectives();
    end_ = std::max(end_, x.wait[k]) + prog.compute[k];
    if (k == n) return;
    const CommGroup g = prog.groups[k];
    const bool context = g == CommGroup::Context;
    const bool beside = (prog.flags[k] & kBesideNext) != 0 || (!context && overlap_);
    const auto it = links_.find(g);
    if ((prog.flags[k] & kNoFlows) || it == links_.end() ||
        std::find(skip_.begin(), skip_.end(), g) != skip_.end()) {
      x.done[k] = end_;
    } else {
      const GroupLinks& gl = it->second;
      double& free = link_free_[g];
      double begin = std::max(end_, free);
      if (context && (prog.flags[k] & kAfterPrevious)) begin = std::max(begin, x.previous_step);
      if (prog.kinds[k] == CollectiveKind::AllToAll && prog.deduplicates[k].experts > 0) {
        const RoutingDraw& draw = prog.deduplicates[k];
        const int held = draw.experts / gl.n;
        x.done[k] = free =
            begin + closed_form::deduplicated_all_to_all(
                        gl.machines, gl.per_machine, prog.bytes[k] / draw.top_k,
                        routed_hit_probability(draw, held),
                        routed_hit_probability(draw, held * gl.per_machine), gl.intra, gl.inter);
      } else if (prog.kinds[k] == CollectiveKind::AllToAll) {
        const double c = prog.bytes[k] * (context ? 1.0 / gl.n : x.share);
        x.done[k] = free =
            begin + closed_form::all_to_all(gl.machines, gl.per_machine, c, gl.intra, gl.inter);
      } else {
        const double bytes = prog.kinds[k] == CollectiveKind::SendRecv
                                 ? prog.bytes[k]
                                 : ring_flow_bytes(prog.kinds[k], prog.bytes[k], gl.n);
        const double hold = prog.kinds[k] != CollectiveKind::SendRecv && gl.seconds_per_byte > 0
                                ? bytes * gl.seconds_per_byte
                                : bytes / gl.ring.bandwidth;
        free = begin + hold;
        x.done[k] = begin + gl.ring.latency + hold;
      }
      if (context) x.previous_step = x.done[k];
    }
    const size_t next = beside ? std::min(k + 2, n) : k + 1;
    x.wait[next] = std::max(x.wait[next], x.done[k]);
  }
  double end() const { return end_; }

 private:
  const GroupLinkMap& links_;
  const bool overlap_;
  const std::vector<CommGroup>& skip_;
  std::map<CommGroup, double> link_free_;
  double end_ = 0;
};

double pass_time(const TpProgram& prog, const GroupLinkMap& links, bool overlap, double share,
                 const std::vector<CommGroup>& skip = {}) {
  PieceRunner run(links, overlap, skip);
  PieceRunner::Pass x(prog, share);
  for (size_t k = 0; k <= prog.collectives(); ++k) run.step(x, k);
  return run.end();
}

// An overlapped pair (DualPipe's, Megatron-Core's A2A overlap): a forward's and another chunk's
// backward's pieces interleaved, the backward's first (B1 F1 B2 F2 ...), as the lowering orders them
// (Lowering::add_compute_tasks), each pass's collectives beside the other's compute. The pair's time.
double pair_time(const TpProgram& f, const TpProgram& b, const GroupLinkMap& links, bool overlap,
                 double share_f, double share_b) {
  const std::vector<CommGroup> none;
  PieceRunner run(links, overlap, none);
  PieceRunner::Pass fx(f, share_f), bx(b, share_b);
  for (size_t k = 0; k <= std::max(f.collectives(), b.collectives()); ++k) {
    if (k <= b.collectives()) run.step(bx, k);
    if (k <= f.collectives()) run.step(fx, k);
  }
  return run.end();
}

// pair_time of every overlapped pair of `sched` (the forward's stage, the backward's), by the stages'
// programs.
std::map<std::pair<int, int>, double> pair_times(const Schedule& sched, const std::vector<TpProgram>& forward,
                                                 const std::vector<TpProgram>& backward,
                                                 const std::vector<double>& shares, const GroupLinkMap& links,
                                                 bool overlap) {
  std::map<std::pair<int, int>, double> out;
  for (size_t d = 0; d < sched.device_actions.size(); ++d) {
    const std::vector<Action>& acts = sched.device_actions[d];
    for (size_t i = 0; i + 1 < acts.size(); ++i) {
      if (!sched.is_paired(d, i)) continue;
      const size_t x = static_cast<size_t>(acts[i].stage), y = static_cast<size_t>(acts[i + 1].stage);
      if (!out.count({x, y}))
        out[{x, y}] = pair_time(forward[x], backward[y], links, overlap, shares[x], shares[y]);
      ++i;
    }
  }
  return out;
}

// The routes of candidate c's groups, of pipeline rank 0's first members (the cluster is homogeneous).
Result<GroupLinkMap> rank0_group_links(const Router& router, const Cluster& cl, const Search3dCandidate& c) {
  GroupLinkMap links;
  const ExpertSizes es{c.ep, c.etp};
  for (CommGroup g : {CommGroup::Tensor, CommGroup::Context, CommGroup::Expert, CommGroup::ExpertTensor,
                      CommGroup::ExpertAndTensor}) {
    if (g != CommGroup::Tensor && g != CommGroup::Context && !c.moe) continue;
    const std::vector<int> devices = group_members(g, 0, c.t, es, c.cp);  // rank 0: device = position
    if (devices.size() < 2) continue;
    Result<GroupLinks> gl = group_links(router, cl, devices);
    if (!gl) return gl.error();
    links.emplace(g, *gl);
  }
  return links;
}

// Each stage edge carries 1/T of an activation: what each rank of a group sends to the same rank of
// the next.
void divide_edge_bytes(Partition& p, int T) {
  for (auto [it, end] = boost::edges(p.graph); it != end; ++it) p.graph[*it].bytes_per_sample /= T;
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

}  // namespace

Search3dEstimator::Search3dEstimator(const Experiment& base) : base_(base), router_(base_.cluster) {}

Result<Search3dEstimator::FoldedPlan> Search3dEstimator::folded_plan(const Search3dCandidate& c,
                                                                     int replicas) {
  const Workload& w = base_.workload;
  const Cluster& cl = base_.cluster;
  const int T = c.t, d = c.d, p = c.p, m = c.micro_batches;
  const size_t D = cl.devices.size();
  // Pipeline rank r's representative: rank 0 of replica 0, device (r d) cp T in Megatron's order.
  auto rep = [&](int rank) { return rank * d * c.cp * T; };

  // The plan of one replica without tensor parallelism: the megatron partitioner and the schedule,
  // pipeline rank r on device r, then moved to its representative.
  Result<const PartitionStrategy*> partitioner = find_partitioner("megatron");
  if (!partitioner) return partitioner.error();
  Result<const ScheduleStrategy*> scheduler = find_schedule(c.schedule);
  if (!scheduler) return scheduler.error();
  FoldedPlan fp;
  fp.memory = base_.memory;
  fp.memory.recompute = c.recompute;
  fp.memory.zero1 = false;  // sharded below, over the d replicas
  Result<Partition> part =
      (*partitioner)
          ->build({w, cl, p, static_cast<double>(c.b), c.v, m, fp.memory, (*scheduler)->name, 1,
                   PartitionerOptions{.megatron = search3d_split(c)}});
  if (!part) return part.error();
  Result<Schedule> sched = (*scheduler)->build({*part, D, m, c.v, {}, {}, c.moe_overlap && c.moe});
  if (!sched) return sched.error();
  // Megatron-Core's A2A overlap pairs a forward with another micro-batch's backward, as the run does
  // (core/planners/common.cc); DualPipe's schedule pairs its own.
  if (c.moe_overlap && c.moe) pair_forward_backward(*sched);
  const size_t S = part->stage_count();
  fp.rank_of.resize(S);
  for (size_t s = 0; s < S; ++s) {
    Stage& st = part->graph[s];
    if (st.devices.size() != 1) return Error{"internal error: a one-replica stage on several devices"};
    fp.rank_of[s] = st.devices[0];
    st.devices = {rep(fp.rank_of[s])};
  }
  std::vector<std::vector<Action>> moved(D);
  std::vector<std::vector<char>> paired(sched->paired.empty() ? 0 : D);  // DualPipe's pairs move too
  for (int r = 0; r < p && static_cast<size_t>(r) < sched->device_actions.size(); ++r) {
    moved[rep(r)] = std::move(sched->device_actions[r]);
    if (static_cast<size_t>(r) < sched->paired.size()) paired[rep(r)] = std::move(sched->paired[r]);
  }
  sched->device_actions = std::move(moved);
  sched->paired = std::move(paired);
  fp.part = std::move(*part);
  fp.sched = std::move(*sched);
  if (Status s = fold_costs(c, fp); !s) return s.error();
  if (replicas > 1)
    if (Status s = replicate(c, replicas, **partitioner, **scheduler, fp); !s) return s.error();
  return fp;
}

namespace {

// A stage's representative position: the busiest expert-parallel rank's first device; among equal
// loads the position with the most compute (a context-parallel rank of the contiguous split,
// cp_load_balance false, does more attention the later its part of the sequence).
size_t representative_position(const std::vector<StageCost>& x) {
  auto work = [&](size_t j) { return sum(x[j].tp_forward.compute) + sum(x[j].tp_backward.compute); };
  size_t q = 0;
  for (size_t j = 1; j < x.size(); ++j)
    if (x[j].expert_load > x[q].expert_load || (x[j].expert_load == x[q].expert_load && work(j) > work(q)))
      q = j;
  return q;
}

}  // namespace

// Per-device costs of each stage of fp's one-replica plan: under tensor (or expert) parallelism, of
// the stage's representative (rank 0 of replica 0's group; MoE: the device of the busiest expert-
// parallel rank, rank 0 under balanced routing), with each pass's collectives folded into the pass
// (pass_time), and each rank's 1/T of an activation sent to the same rank of the next group. A MoE
// stage is costed on all its t x d devices, since its expert groups span the replicas.
Status Search3dEstimator::fold_costs(const Search3dCandidate& c, FoldedPlan& fp) {
  const int T = c.t, d = c.d, cp = c.cp;
  const int width = c.moe ? T * cp * d : T * cp;  // the positions of a stage costed
  auto rep = [&](int rank, int position) { return rank * d * cp * T + position; };
  const size_t S = fp.part.stage_count();
  fp.tp_exposed.assign(S, 0.0);  // per stage: TP time in one F and one B of the representative
  fp.cp_exposed.assign(S, 0.0);  // the context-parallel exchanges' time beyond it
  fp.ep_exposed.assign(S, 0.0);  // the expert groups' time beyond both
  TensorParallelOptions tpo{c.sequence_parallel, base_.strategy.tp_overlap};
  tpo.moe = base_.strategy.moe;
  tpo.moe.dispatcher = c.dispatcher;
  tpo.context = base_.strategy.context;
  tpo.context.algorithm = c.cp_algorithm;
  tpo.recompute_modules = base_.memory.modules;
  tpo.wgrad_overlap = base_.strategy.tp_wgrad_overlap;
  tpo.activation_fp8_input_store = base_.memory.activation_fp8_input_store;
  const auto key = std::make_tuple(T, c.p, c.v, c.b, static_cast<int>(c.recompute), c.sequence_parallel,
                                   c.moe ? d : 0, c.ep, c.etp, static_cast<int>(c.dispatcher), cp,
                                   // the uneven split and DualPipe's stages (mirrored, or in a V) too
                                   static_cast<int>(c.cp_algorithm) + (c.uneven ? 16 : 0) +
                                       32 * (c.schedule == "dualpipe"    ? 1
                                             : c.schedule == "dualpipev" ? 2
                                                                         : 0));
  auto cached = costs_.find(key);
  if (cached == costs_.end()) {
    Partition groups = fp.part;  // replica 0's groups (MoE: every replica's devices)
    for (size_t s = 0; s < S && width > 1; ++s) {
      Stage& st = groups.graph[s];
      st.devices.clear();
      for (int i = 0; i < width; ++i) st.devices.push_back(rep(fp.rank_of[s], i));
      st.tensor_parallel = T;
      st.context_parallel = cp;
      if (c.moe) st.expert_parallel = c.ep, st.expert_tensor_parallel = c.etp;
    }
    // The micro-batch the stage's replicas share: b each (MoE: all d replicas costed).
    const double shared = static_cast<double>(c.b) * (c.moe ? d : 1);
    auto r = stage_costs(base_.workload, base_.cluster, groups, shared, c.recompute, tpo);
    if (!r) return r.error();
    // Only each stage's representative is read below: the cache keeps it alone. It kept every one of
    // a stage's t x cp positions, over 24 GB for a default-cp search at 262,144 tokens on 256 GPUs.
    for (std::vector<StageCost>& x : *r) {
      StageCost keep = std::move(x[representative_position(x)]);
      x.clear();
      x.push_back(std::move(keep));
    }
    cached = costs_.emplace(key, std::move(*r)).first;
  }
  Result<GroupLinkMap> group_routes = rank0_group_links(router_, base_.cluster, c);
  if (!group_routes) return group_routes.error();
  const GroupLinkMap& links = *group_routes;
  const bool split = fp.sched.split_backward;
  const std::vector<CommGroup> expert_groups{CommGroup::Expert, CommGroup::ExpertTensor,
                                             CommGroup::ExpertAndTensor};
  std::vector<CommGroup> tensor_only = expert_groups;
  tensor_only.push_back(CommGroup::Context);
  // Every stage of the candidate is grouped alike (Stage::grouped, as set above).
  const bool grouped = T > 1 || cp > 1 || (c.moe && c.ep * c.etp > 1);
  fp.passes.assign(S, {});
  std::vector<TpProgram> forward_programs(S), backward_programs(S);  // for the overlapped pairs below
  std::vector<double> shares(S, 1.0);
  for (size_t s = 0; s < S; ++s) {
    StageCost sc = cached->second[s].front();
    if (!grouped) {
      fp.costs.push_back({std::move(sc)});
      continue;
    }
    const double share = sc.expert_load / c.ep;
    const TpProgram& bprog = split ? sc.tp_backward_input : sc.tp_backward;
    // Each pass whole, then without the expert groups' collectives, then without the context-parallel
    // ones too (the same pass where the candidate has none of them).
    const double f = pass_time(sc.tp_forward, links, tpo.overlap, share);
    const double b = pass_time(bprog, links, tpo.overlap, share);
    const double f_cp = c.moe ? pass_time(sc.tp_forward, links, tpo.overlap, share, expert_groups) : f;
    const double b_cp = c.moe ? pass_time(bprog, links, tpo.overlap, share, expert_groups) : b;
    const double f_tp = cp > 1 ? pass_time(sc.tp_forward, links, tpo.overlap, share, tensor_only) : f_cp;
    const double b_tp = cp > 1 ? pass_time(bprog, links, tpo.overlap, share, tensor_only) : b_cp;
    const double fc = sum(sc.tp_forward.compute), bc = sum(bprog.compute);
    fp.tp_exposed[s] = (f_tp - fc) + (b_tp - bc);
    fp.cp_exposed[s] = (f_cp - f_tp) + (b_cp - b_tp);
    fp.ep_exposed[s] = (f - f_cp) + (b - b_cp);
    if (!fp.sched.paired.empty()) {
      forward_programs[s] = sc.tp_forward;
      backward_programs[s] = bprog;
      shares[s] = share;
    }
    fp.passes[s] = {Search3dPassParts{fc, f_tp - fc, f_cp - f_tp, f - f_cp},
                    Search3dPassParts{bc, b_tp - bc, b_cp - b_tp, b - b_cp}};
    sc.times.forward = f;
    // The lowering runs recompute_s + backward() (+ W when split) for a stage without TP.
    sc.times.backward_input = split ? b : b - sc.times.backward_weight;
    sc.recompute_s = 0;
    sc.tp_forward = sc.tp_backward = sc.tp_backward_input = {};
    fp.costs.push_back({std::move(sc)});
  }
  if (grouped)
    fp.pair_times = pair_times(fp.sched, forward_programs, backward_programs, shares, links, tpo.overlap);
  if (T * cp > 1) divide_edge_bytes(fp.part, T * cp);
  return {};
}

// fp's plan with every replica: the partitioner's d devices of a stage, replica j of pipeline rank r
// moved to its representative, each with rank 0's costs.
Status Search3dEstimator::replicate(const Search3dCandidate& c, int replicas,
                                    const PartitionStrategy& partitioner, const ScheduleStrategy& scheduler,
                                    FoldedPlan& fp) {
  const int T = c.t, d = c.d, m = c.micro_batches;
  const size_t D = base_.cluster.devices.size(), S = fp.part.stage_count();
  auto rep = [&](int rank, int replica) { return (rank * d + replica) * T; };
  Result<Partition> all = partitioner.build(
      {base_.workload, base_.cluster, c.p, static_cast<double>(c.b) * replicas, c.v, m, fp.memory,
       scheduler.name, replicas, PartitionerOptions{.megatron = search3d_split(c)}});
  if (!all) return all.error();
  Result<Schedule> all_sched = scheduler.build({*all, D, m, c.v, {}, {}});
  if (!all_sched) return all_sched.error();
  if (all->stage_count() != S) return Error{"internal error: the replicated plan has other stages"};
  std::map<int, std::pair<int, int>> where;  // partitioner's device -> (pipeline rank, replica)
  for (size_t s = 0; s < S; ++s) {
    Stage& st = all->graph[s];
    if (st.devices.size() != static_cast<size_t>(replicas))
      return Error{"internal error: a replicated stage on another number of devices"};
    for (int j = 0; j < replicas; ++j) {
      auto [it, fresh] = where.emplace(st.devices[j], std::make_pair(fp.rank_of[s], j));
      if (!fresh && it->second != std::make_pair(fp.rank_of[s], j))
        return Error{"internal error: the replicated plan places its stages otherwise"};
      st.devices[j] = rep(fp.rank_of[s], j);
    }
    fp.costs[s].assign(static_cast<size_t>(replicas), fp.costs[s][0]);
  }
  std::vector<std::vector<Action>> moved(D);
  std::vector<std::vector<char>> paired(all_sched->paired.empty() ? 0 : D);
  for (const auto& [dev, at] : where) {
    if (static_cast<size_t>(dev) < all_sched->device_actions.size())
      moved[rep(at.first, at.second)] = std::move(all_sched->device_actions[dev]);
    if (static_cast<size_t>(dev) < all_sched->paired.size())
      paired[rep(at.first, at.second)] = std::move(all_sched->paired[dev]);
  }
  all_sched->device_actions = std::move(moved);
  all_sched->paired = std::move(paired);
  if (T > 1) divide_edge_bytes(*all, T);
  fp.part = std::move(*all);
  fp.sched = std::move(*all_sched);
  return {};
}

Result<PreparedRun> Search3dEstimator::tp_folded(const Search3dCandidate& c) {
  if (c.moe || c.cp > 1)
    return Error{
        "the TP-folded replay folds tensor-parallel groups only, not expert or context-parallel groups"};
  Result<FoldedPlan> fp = folded_plan(c, c.d);
  if (!fp) return fp.error();
  LoweringOptions lo;
  lo.micro_batches = c.micro_batches;
  lo.micro_batch_size = static_cast<double>(c.b) * c.d;
  lo.memory = fp->memory;
  lo.memory.zero1 = c.distributed_optimizer;  // the lowering shards the optimizer over the d replicas
  lo.allreduce = base_.strategy.allreduce;
  lo.dp_overlap = base_.strategy.dp_overlap;
  lo.gradient_reduce_bytes = base_.strategy.gradient_reduce_bytes;
  lo.costs = &fp->costs;
  Result<TaskGraph> g = lower(base_.workload, base_.cluster, fp->part, fp->sched, lo);
  if (!g) return g.error();
  overlap_pairs(c, *fp, *g);  // DualPipe's pairs: the folded collectives beside the other pass's compute
  PreparedRun run;
  run.partition = std::move(fp->part);
  run.schedule = std::move(fp->sched);
  run.schedule_name = c.schedule;
  run.partitioner = "megatron";
  run.micro_batch_size = lo.micro_batch_size;
  run.micro_batches = c.micro_batches;
  run.graph = std::move(*g);
  run.planner = "search (TP-folded)";
  return run;
}

namespace {

// The expert data-parallel size: the devices holding the same experts (1 for a dense workload).
int expert_data_parallel(const Search3dCandidate& c) {
  return c.moe ? c.t * c.cp * c.d / (c.ep * c.etp) : 1;
}

// A device's static memory for a stage (weights, gradients, optimizer state), the optimizer state
// `sharded` as the distributed optimizer does it: the dense part over the d x cp devices reducing
// together, the experts' over the expert data-parallel group (the lowering's
// add_data_parallel_collectives).
MemoryBytes stage_static(const Search3dCandidate& c, const StageCost& sc, const MemoryOptions& memory,
                         bool sharded) {
  MemoryBytes st = static_memory(sc.parameters - sc.expert_parameters,
                                 sc.parameter_bytes - sc.expert_parameter_bytes, memory);
  constexpr int kOpt = static_cast<int>(MemoryCategory::OptimizerState);
  if (sharded) st[kOpt] /= c.d * c.cp;
  if (sc.expert_parameters > 0) {
    MemoryBytes ex = static_memory(sc.expert_parameters, sc.expert_parameter_bytes, memory);
    if (sharded) ex[kOpt] /= expert_data_parallel(c);
    for (int k = 0; k < kMemoryCategoryCount; ++k) st[k] += ex[k];
  }
  return st;
}

// A lower bound on each representative's peak before anything is lowered: its static memory and, in
// the backward pass of one of its stages, that micro-batch's stash, what it re-materialises and its
// workspace. Returns the estimate of a candidate that cannot fit (not lowered), or none.
std::optional<Search3dEstimate> over_memory(const Search3dCandidate& c,
                                            const std::vector<std::vector<StageCost>>& costs,
                                            const std::vector<int>& rank_of, const MemoryOptions& memory,
                                            const Cluster& cl) {
  std::map<int, MemoryBytes> statics;
  std::map<int, double> transient;
  for (size_t s = 0; s < costs.size(); ++s) {
    const StageCost& sc = costs[s][0];
    const MemoryBytes st = stage_static(c, sc, memory, c.distributed_optimizer);
    for (int k = 0; k < kMemoryCategoryCount; ++k) statics[rank_of[s]][k] += st[k];
    transient[rank_of[s]] =
        std::max(transient[rank_of[s]], sc.stash_bytes + sc.recompute_bytes + sc.workspace_bytes);
  }
  Search3dEstimate over;
  for (const auto& [rank, bytes] : statics) {
    const double bound = total(bytes) + transient[rank];
    if (bound > cl.devices[rank * c.d * c.cp * c.t].spec.usable_memory()) {
      over.fits = over.lowered = false;
      over.peak_memory_bytes = std::max(over.peak_memory_bytes, bound);
    }
  }
  if (over.fits) return std::nullopt;
  return over;
}

// When each stage's gradients are ready (its last backward pass, B or W when split, ends) and, under
// bucketed overlap, where the first stage's last backward pass starts.
struct GradientsReady {
  std::vector<double> ready;  // per stage
  bool bucketed = false;      // strategy dp_overlap, as lower() builds it
  bool per_stage = false;     // dp_overlap: each stage's reduction from its own last backward
  int buckets = 1;            // the first stage's
  double start0 = 0;
};

GradientsReady gradients_ready(const TaskGraph& g, const Timeline& tl, size_t S, bool dp_overlap, int d,
                               double first_stage_parameters) {
  GradientsReady out;
  out.ready.assign(S, 0.0);
  size_t last0 = SIZE_MAX;  // the first stage's last backward task (its last piece)
  for (size_t i = 0; i < g.tasks.size(); ++i) {
    const Task& t = g.tasks[i];
    if (t.kind == TaskKind::Backward || t.kind == TaskKind::Weight) {
      out.ready[t.stage] = std::max(out.ready[t.stage], tl.end[i]);
      if (t.stage == 0 && (last0 == SIZE_MAX || tl.end[i] >= tl.end[last0])) last0 = i;
    }
  }
  // The first stage's buckets follow its last backward pass, which starts where that pass's first
  // piece starts.
  out.per_stage = dp_overlap;
  out.bucketed = dp_overlap && d > 1 && last0 != SIZE_MAX;
  out.buckets = out.bucketed ? dp_buckets(first_stage_parameters, d) : 1;
  if (out.bucketed) {
    out.start0 = tl.start[last0];
    const Task& l = g.tasks[last0];
    for (size_t i = 0; i < g.tasks.size(); ++i) {
      const Task& t = g.tasks[i];
      if (t.stage == 0 && t.kind == l.kind && t.micro_batch == l.micro_batch && t.device == l.device)
        out.start0 = std::min(out.start0, tl.start[i]);
    }
  }
  return out;
}

// Per pipeline rank, after its data-parallel all-reduces: when its optimizer step ends, how long it
// takes, the all-reduce time exposed after its last gradients, and when those were ready.
struct RankEnd {
  double step_end = 0, step = 0, dp_exposed = 0, last_ready = 0;
};

using TiedReduce = Search3dEstimator::TiedReduce;

// One rank's gradient reductions (ready, all-reduce, start of the last backward, buckets, expert
// gradients' reduction, their buckets), in the order they become ready: when the last ends and when
// its last gradients were ready.
std::pair<double, double> reductions_end(
    std::vector<std::tuple<double, double, double, int, double, int>>& list, bool per_stage) {
  // Without dp_overlap every reduction of the rank waits for its last backward (lower.cc,
  // reduce_after_device_backward): they then run one after another here.
  if (!per_stage) {
    const double last = std::get<0>(*std::max_element(list.begin(), list.end()));
    for (auto& x : list) std::get<0>(x) = std::get<2>(x) = last;
  }
  std::sort(list.begin(), list.end());
  double t = 0, last = 0;
  for (auto [r, a, from, k, e, ke] : list) {
    // K buckets, bucket i ready once (i + 1) / K of the last backward (from .. r) has run, each
    // all-reduced after the one before (lower.h); one bucket: ready at r. The expert gradients
    // after them, in one piece or in their own K_e buckets likewise (an upper bound: the lowering
    // starts both together, and they share links where the groups' rings cross the same NICs).
    for (int i = 0; i < k; ++i) t = std::max(t, from + (i + 1) * (r - from) / k) + a / k;
    if (e > 0)
      for (int i = 0; i < ke; ++i) t = std::max(t, from + (i + 1) * (r - from) / ke) + e / ke;
    last = std::max(last, r);
  }
  return {std::max(t, last), last};
}

// Each stage's data-parallel all-reduce (`ar`) once its gradients are ready (a device's stages, with
// interleaving, one after another in the order they become ready; the first stage's in buckets under
// overlap), then the tied weights' all-reduces between ranks once both ranks' reductions are done
// (the lowering's order, Megatron-Core's finalize_model_grads), then the optimizer step. Per pipeline
// rank.
std::map<int, RankEnd> rank_ends(const Search3dCandidate& c, const Workload& w, const DeviceSpec& spec,
                                 const std::vector<std::vector<StageCost>>& costs,
                                 const std::vector<int>& rank_of, const std::vector<int>& mirror_of,
                                 const MemoryOptions& memory, const GradientsReady& gr,
                                 const std::vector<double>& ar, const std::vector<double>& expert_ar,
                                 const std::vector<TiedReduce>& tied) {
  // rank -> (ready, all-reduce, start of the last backward, buckets, expert gradients' reduction, their
  // buckets)
  std::map<int, std::vector<std::tuple<double, double, double, int, double, int>>> per_device;
  std::map<int, double> step_parameters;
  for (size_t s = 0; s < costs.size(); ++s) {
    const StageCost& sc = costs[s][0];
    // The parameters the device's step updates: with the distributed optimizer its shard of the
    // dense ones (1/d) and of its experts' (1/edp).
    step_parameters[rank_of[s]] += c.distributed_optimizer
                                       ? (sc.parameters - sc.expert_parameters) / (c.d * c.cp) +
                                             sc.expert_parameters / expert_data_parallel(c)
                                       : sc.parameters;
    // DualPipe: a stage's reduction with its mirror's (listed once, at the first of the two) runs on
    // both ranks once both copies' gradients are ready, in one piece (the lowering's).
    const int m = mirror_of[s];
    if (m >= 0 && m < static_cast<int>(s)) continue;
    const bool b0 = gr.bucketed && s == 0 && m < 0;
    const double ready = m >= 0 ? std::max(gr.ready[s], gr.ready[static_cast<size_t>(m)]) : gr.ready[s];
    // The expert buffer's buckets (lower.cc, add_data_parallel_collectives): Megatron's bucket size.
    const int eb = b0 ? first_stage_buckets(sc.parameters - sc.expert_parameters, sc.expert_parameters,
                                            c.d * c.cp, false)
                            .expert
                      : 1;
    for (int rank : {rank_of[s], m >= 0 ? rank_of[static_cast<size_t>(m)] : -1})
      if (rank >= 0)
        per_device[rank].emplace_back(ready, ar[s], b0 ? gr.start0 : ready, b0 ? gr.buckets : 1, expert_ar[s],
                                      eb);
  }
  std::map<int, std::pair<double, double>> reduced;  // rank -> (its reductions' end, its last gradients)
  for (auto& [rank, list] : per_device) reduced[rank] = reductions_end(list, gr.per_stage);
  for (const TiedReduce& x : tied) {
    if (!reduced.count(x.copy_rank) || !reduced.count(x.source_rank)) continue;
    const double end = std::max(reduced[x.copy_rank].first, reduced[x.source_rank].first) + x.time;
    reduced[x.copy_rank].first = reduced[x.source_rank].first = end;
  }
  std::map<int, RankEnd> ends;
  for (const auto& [rank, r] : reduced) {
    const auto [start, last] = r;
    const double params = step_parameters[rank];
    const double step =
        w.optimizer_step_s >= 0 ? w.optimizer_step_s : optimizer_step_time(params, memory, w.precision, spec);
    ends[rank] = RankEnd{start + step, step, start - last, last};
  }
  return ends;
}

using PassParts = Search3dPassParts;

// The representatives' breakdown with the TP collectives, the closed-form all-reduce and the step in
// (the mean over them), their peak memory and whether they fit.
void fill_breakdown(const Search3dCandidate& c, const Metrics& pm, const std::vector<int>& rank_of,
                    const std::vector<double>& tp_exposed, const std::vector<double>& cp_exposed,
                    const std::vector<double>& ep_exposed, const std::map<int, PassParts>& hidden,
                    const std::map<int, RankEnd>& ends, Search3dEstimate& est) {
  const double pipeline_end = pm.iteration_time_s;
  int used = 0;
  for (size_t dev = 0; dev < pm.devices.size(); ++dev) {
    const DeviceMetrics& dm = pm.devices[dev];
    if (!dm.used) continue;
    est.peak_memory_bytes = std::max(est.peak_memory_bytes, dm.peak_memory_bytes);
    if (dm.peak_memory_bytes > dm.capacity_bytes) est.fits = false;
    const int rank = static_cast<int>(dev) / (c.d * c.cp * c.t);
    double tp = 0, cp = 0, ep = 0;
    // DualPipe runs half the micro-batches through each of its two pipelines (a rank's two stages).
    const double runs = c.schedule == "dualpipe" ? c.micro_batches / 2.0 : c.micro_batches;
    for (size_t s = 0; s < rank_of.size(); ++s)
      if (rank_of[s] == rank) {
        tp += runs * tp_exposed[s];
        cp += runs * cp_exposed[s];
        ep += runs * ep_exposed[s];
      }
    if (const auto h = hidden.find(rank); h != hidden.end()) {  // hidden by overlapped pairs
      tp -= h->second.tp;
      cp -= h->second.cp;
      ep -= h->second.ep;
    }
    const auto it = ends.find(rank);
    const RankEnd e = it == ends.end() ? RankEnd{} : it->second;
    TimeBreakdown b = dm.breakdown;
    b.compute_s -= tp + cp + ep;
    b.tensor_parallel_s += tp;
    b.context_parallel_s += cp;
    b.expert_parallel_s += ep;
    b.bubble_s -= pipeline_end - e.last_ready;  // the pipeline's trailing idle, replaced:
    b.data_parallel_s += e.dp_exposed;
    b.optimizer_s += e.step;
    b.bubble_s += est.iteration_time_s - e.step_end;
    est.breakdown.compute_s += b.compute_s;
    est.breakdown.optimizer_s += b.optimizer_s;
    est.breakdown.tensor_parallel_s += b.tensor_parallel_s;
    est.breakdown.expert_parallel_s += b.expert_parallel_s;
    est.breakdown.context_parallel_s += b.context_parallel_s;
    est.breakdown.pipeline_s += b.pipeline_s;
    est.breakdown.data_parallel_s += b.data_parallel_s;
    est.breakdown.bubble_s += b.bubble_s;
    ++used;
  }
  if (used > 0)
    for (double* x : {&est.breakdown.compute_s, &est.breakdown.optimizer_s, &est.breakdown.tensor_parallel_s,
                      &est.breakdown.pipeline_s, &est.breakdown.data_parallel_s, &est.breakdown.bubble_s,
                      &est.breakdown.expert_parallel_s, &est.breakdown.context_parallel_s})
      *x /= used;
}

}  // namespace

// The data-parallel all-reduce of a stage of pipeline rank `rank`: rank i of each of the d replicas'
// groups (T rings at once), in closed form, cached.
Result<double> Search3dEstimator::dp_allreduce(const Search3dCandidate& c, int rank, int mirror, double bytes,
                                               CollectiveKind kind) {
  const int T = c.t, d = c.d * c.cp;  // Megatron reduces over the data x context-parallel group
  const auto rkey = std::make_tuple(T, d, rank, mirror, bytes, kind, 0);
  if (auto hit = allreduce_.find(rkey); hit != allreduce_.end()) return hit->second;
  std::vector<std::vector<int>> groups;
  for (int i = 0; i < T; ++i) {
    std::vector<int>& group = groups.emplace_back();
    for (int r : {rank, mirror})
      for (int j = 0; j < d && r >= 0; ++j) group.push_back((r * d + j) * T + i);
  }
  Result<double> x = rings_time(groups, bytes, kind);
  if (!x) return x.error();
  return allreduce_.emplace(rkey, *x).first->second;
}

// The expert gradients: position j inner + q of the stage (inner = ep etp) with the same q of every
// j (Lowering::add_data_parallel_collectives), and of the mirror's, the inner rings at once.
Result<double> Search3dEstimator::expert_allreduce(const Search3dCandidate& c, int rank, int mirror,
                                                   double bytes, CollectiveKind kind) {
  const int inner = c.ep * c.etp, edp = expert_data_parallel(c);
  const auto rkey = std::make_tuple(c.t, c.d * c.cp, rank, mirror, bytes, kind, inner);
  if (auto hit = allreduce_.find(rkey); hit != allreduce_.end()) return hit->second;
  std::vector<std::vector<int>> groups;
  for (int q = 0; q < inner; ++q) {
    std::vector<int>& group = groups.emplace_back();
    for (int r : {rank, mirror})
      for (int j = 0; j < edp && r >= 0; ++j) group.push_back(r * c.d * c.cp * c.t + j * inner + q);
  }
  Result<double> x = rings_time(groups, bytes, kind);
  if (!x) return x.error();
  return allreduce_.emplace(rkey, *x).first->second;
}

// The groups' rings; with multi-ring each group's m rings (one per NIC of a node) carry 1/m of the
// bytes each (core/collectives.h), all rings at once.
Result<double> Search3dEstimator::rings_time(const std::vector<std::vector<int>>& groups, double bytes,
                                             CollectiveKind kind) {
  const Cluster& cl = base_.cluster;
  std::map<size_t, std::vector<std::vector<int>>> rings_by_m;
  for (const std::vector<int>& group : groups) {
    if (group.size() < 2) continue;
    // NCCL's trees (Tree, Nccl) are estimated as its ring per NIC: the same bandwidth term, the
    // ring's latency (docs/3d-search.md); the finalists' replay runs the trees.
    const AllReduceAlgorithm a = base_.strategy.allreduce;
    if (a != AllReduceAlgorithm::MultiRing && a != AllReduceAlgorithm::Tree &&
        a != AllReduceAlgorithm::Nccl) {
      rings_by_m[1].push_back(group);
      continue;
    }
    const std::vector<std::vector<size_t>> orders = multi_ring_orders(cl, group);
    for (const std::vector<size_t>& order : orders) {
      std::vector<int>& ring = rings_by_m[orders.size()].emplace_back();
      for (size_t j : order) ring.push_back(group[j]);
    }
  }
  double longest = 0;  // groups of different m (not on a homogeneous cluster): timed apart
  for (const auto& [m, rings] : rings_by_m) {
    Result<double> x = concurrent_ring_time(cl, router_, rings, bytes / static_cast<double>(m), kind);
    if (!x) return x.error();
    longest = std::max(longest, *x);
  }
  return longest;
}

// Each stage's data-parallel all-reduce time (0 without replicas) and, for MoE stages, its expert
// gradients' reduction over the expert data-parallel group.
Result<std::pair<std::vector<double>, std::vector<double>>> Search3dEstimator::dp_allreduces(
    const Search3dCandidate& c, const FoldedPlan& fp, const std::vector<int>& mirror_of) {
  std::vector<double> ar(fp.costs.size(), 0.0), expert(fp.costs.size(), 0.0);
  // The distributed optimizer's reduce-scatter under overlap (the lowering's; core/lower.cc).
  const CollectiveKind kind = base_.strategy.dp_overlap && c.distributed_optimizer
                                  ? CollectiveKind::ReduceScatter
                                  : CollectiveKind::AllReduce;
  const double per_parameter = base_.strategy.gradient_reduce_bytes;
  for (size_t s = 0; s < fp.costs.size(); ++s) {
    // DualPipe: a stage reduces with its mirror, counted once, on the first of the two (the lowering's).
    const int mirror = mirror_of[s];
    if (mirror >= 0 && mirror < static_cast<int>(s)) continue;
    const int with = mirror >= 0 ? fp.rank_of[static_cast<size_t>(mirror)] : -1;
    const StageCost& sc = fp.costs[s][0];
    const double dense = sc.parameters - sc.expert_parameters;
    if (c.d * c.cp > 1 || with >= 0) {
      Result<double> x = dp_allreduce(
          c, fp.rank_of[s], with,
          per_parameter > 0 ? dense * per_parameter : sc.parameter_bytes - sc.expert_parameter_bytes, kind);
      if (!x) return x.error();
      ar[s] = *x;
    }
    if (sc.expert_parameters > 0 && (expert_data_parallel(c) > 1 || with >= 0)) {
      Result<double> x = expert_allreduce(
          c, fp.rank_of[s], with,
          per_parameter > 0 ? sc.expert_parameters * per_parameter : sc.expert_parameter_bytes, kind);
      if (!x) return x.error();
      expert[s] = *x;
    }
  }
  return std::make_pair(std::move(ar), std::move(expert));
}

// The tied weights' all-reduces (partition.h TiedCopy) of fp's plan with every replica: the copy's
// pipeline rank's device of replica j and tensor-parallel rank i with the source's, all pairs at once.
Result<std::vector<Search3dEstimator::TiedReduce>> Search3dEstimator::tied_reduces(const Search3dCandidate& c,
                                                                                   const FoldedPlan& fp) {
  std::vector<TiedReduce> out;
  const int T = c.t, d = c.d * c.cp;
  for (const TiedCopy& tc : tied_copies(base_.workload, fp.part)) {
    const double n = fp.costs[static_cast<size_t>(tc.stage)][0].tied_parameters;
    const Layer& tied = base_.workload.layer(static_cast<size_t>(
        fp.part.stage(static_cast<size_t>(tc.stage)).layers[static_cast<size_t>(tc.index)]));
    const double bytes = tied_gradient_bytes(base_.workload, tied, n, base_.strategy.gradient_reduce_bytes);
    const int a = fp.rank_of[static_cast<size_t>(tc.stage)],
              b = fp.rank_of[static_cast<size_t>(tc.source_stage)];
    std::vector<std::vector<int>> pairs;
    for (int j = 0; j < d; ++j)
      for (int i = 0; i < T; ++i) pairs.push_back({(b * d + j) * T + i, (a * d + j) * T + i});
    Result<double> x = rings_time(pairs, bytes, CollectiveKind::AllReduce);
    if (!x) return x.error();
    out.push_back({a, b, *x});
  }
  return out;
}

// The overlapped pairs (Schedule::paired: a forward and the next action, a backward of another
// micro-batch; DualPipe's, Megatron-Core's A2A overlap): the lowering interleaves their pieces so that
// each pass's collectives run beside the other pass's compute (core/lower.cc, add_compute_tasks). This
// graph's folded passes carry their collectives' exposed time in their durations; each pair's two tasks
// are shortened to the interleaved pair's time (pair_time), the time hidden taken from each pass in
// proportion to its collectives and from each group in proportion to its share of them. Returns what
// was hidden per pipeline rank, by group (compute: 0).
std::map<int, PassParts> Search3dEstimator::overlap_pairs(const Search3dCandidate& c, const FoldedPlan& fp,
                                                          TaskGraph& g) {
  std::map<int, PassParts> hidden;
  const Schedule& sched = fp.sched;
  for (size_t d = 0; d < sched.device_actions.size() && d < g.device_order.size(); ++d) {
    const std::vector<Action>& acts = sched.device_actions[d];
    const std::vector<int32_t>& order = g.device_order[d];
    if (acts.empty() || order.size() < acts.size()) continue;
    bool aligned = true;  // one compute task per action, in the schedule's order
    for (size_t i = 0; i < acts.size() && aligned; ++i)
      aligned =
          g.tasks[order[i]].stage == acts[i].stage && g.tasks[order[i]].micro_batch == acts[i].micro_batch;
    if (!aligned) continue;
    PassParts& h = hidden[static_cast<int>(d) / (c.d * c.cp * c.t)];
    for (size_t i = 0; i + 1 < acts.size(); ++i) {
      if (!sched.is_paired(d, i)) continue;
      const int x = acts[i].stage, y = acts[i + 1].stage;
      const auto it = fp.pair_times.find({x, y});
      const PassParts& f = fp.passes[static_cast<size_t>(x)][0];
      const PassParts& b = fp.passes[static_cast<size_t>(y)][1];
      const double collectives = f.collectives() + b.collectives();
      if (it != fp.pair_times.end() && collectives > 0) {
        const double gone = std::clamp(f.compute + b.compute + collectives - it->second, 0.0, collectives);
        const double k = gone / collectives;  // of each pass's collectives, and of each group's
        for (const auto& [pass, task] : {std::pair{&f, order[i]}, std::pair{&b, order[i + 1]}}) {
          g.tasks[task].duration -= k * pass->collectives();
          h.tp += k * pass->tp, h.cp += k * pass->cp, h.ep += k * pass->ep;
        }
      }
      ++i;
    }
  }
  return hidden;
}

Result<Search3dEstimate> Search3dEstimator::estimate(const Search3dCandidate& c) {
  const Cluster& cl = base_.cluster;
  Result<FoldedPlan> fp = folded_plan(c, 1);
  if (!fp) return fp.error();
  if (std::optional<Search3dEstimate> over = over_memory(c, fp->costs, fp->rank_of, fp->memory, cl))
    return *over;

  // DualPipe's stages reduce their gradients with their mirrors' (core/lower.cc), which the lowering
  // would add to this one-replica graph too: they are timed in closed form below (dp_allreduces), so
  // the graph is lowered without the mirrors.
  std::vector<int> mirror_of(fp->part.stage_count());
  for (size_t s = 0; s < mirror_of.size(); ++s) {
    mirror_of[s] = fp->part.stage(s).mirror;
    fp->part.graph[s].mirror = -1;
  }
  LoweringOptions lo;
  lo.micro_batches = c.micro_batches;
  lo.micro_batch_size = c.b;
  lo.memory = fp->memory;
  lo.allreduce = base_.strategy.allreduce;
  lo.costs = &fp->costs;
  Result<TaskGraph> g = lower(base_.workload, cl, fp->part, fp->sched, lo);
  if (!g) return g.error();
  const std::map<int, PassParts> hidden = overlap_pairs(c, *fp, *g);
  // The optimizer step comes after the data-parallel all-reduce (rank_ends): none here.
  for (Task& t : g->tasks)
    if (t.kind == TaskKind::Optimizer) t.duration = 0;
  if (c.distributed_optimizer)  // ZeRO-1: the optimizer state sharded over the (expert) data-parallel group
    for (size_t s = 0; s < fp->costs.size(); ++s) {
      constexpr int kOpt = static_cast<int>(MemoryCategory::OptimizerState);
      const StageCost& sc = fp->costs[s][0];
      g->static_memory[static_cast<size_t>(fp->rank_of[s] * c.d * c.cp * c.t)][kOpt] +=
          stage_static(c, sc, fp->memory, true)[kOpt] - stage_static(c, sc, fp->memory, false)[kOpt];
    }
  Result<Timeline> tl = evaluate(*g, cl, router_);
  if (!tl) return tl.error();
  const Metrics pm = compute_metrics(cl, *g, *tl);

  const GradientsReady gr =
      gradients_ready(*g, *tl, fp->part.stage_count(), base_.strategy.dp_overlap, c.d * c.cp,
                      fp->costs[0][0].parameters - fp->costs[0][0].expert_parameters);
  auto ar = dp_allreduces(c, *fp, mirror_of);
  if (!ar) return ar.error();
  Result<std::vector<TiedReduce>> tied = tied_reduces(c, *fp);
  if (!tied) return tied.error();
  const std::map<int, RankEnd> ends = rank_ends(c, base_.workload, cl.devices[0].spec, fp->costs, fp->rank_of,
                                                mirror_of, fp->memory, gr, ar->first, ar->second, *tied);
  Search3dEstimate est;
  for (const auto& [rank, e] : ends) est.iteration_time_s = std::max(est.iteration_time_s, e.step_end);
  est.iteration_time_s = std::max(est.iteration_time_s, pm.iteration_time_s);
  // Memory and the breakdown, from the representatives (every replica and rank alike).
  fill_breakdown(c, pm, fp->rank_of, fp->tp_exposed, fp->cp_exposed, fp->ep_exposed, hidden, ends, est);
  return est;
}

}  // namespace pipegrid
