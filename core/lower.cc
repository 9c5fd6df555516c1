#include "core/lower.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

namespace pipegrid {
namespace {

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
// of different sizes pair rank q mod t.
template <class F>
void for_each_device_pair(const Partition& p, size_t s, int t, F&& f) {
  const Stage& a = p.stage(s);
  const Stage& b = p.stage(t);
  const int ta = a.tensor_parallel, tb = b.tensor_parallel, ra = a.replicas(), rb = b.replicas();
  const int ranks = std::max(ta, tb);
  for (int i = 0; i < ra; ++i)
    for (int j = 0; j < rb; ++j) {
      const double share = replica_overlap(i, ra, j, rb);
      if (share <= 0) continue;
      for (int q = 0; q < ranks; ++q)
        f(static_cast<size_t>(i * ta + q % ta), static_cast<size_t>(j * tb + q % tb), share / ranks);
    }
}

}  // namespace

TaskCount count_tasks(const Partition& p, int micro_batches, int passes) {
  TaskCount n;
  const size_t m = static_cast<size_t>(std::max(0, micro_batches));
  std::vector<char> busy;
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const size_t r = static_cast<size_t>(p.stage(s).replicas());
    n.compute += p.stage(s).devices.size() * m * static_cast<size_t>(passes);
    for (int d : p.stage(s).devices) {
      if (d >= static_cast<int>(busy.size())) busy.resize(d + 1, 0);
      busy[d] = 1;
    }
    if (r > 1) n.ring_steps += 2 * (r - 1) * r * static_cast<size_t>(p.stage(s).tensor_parallel);
    for (int t : p.successors(static_cast<int>(s))) {
      const auto& from = p.stage(s).devices;
      const auto& to = p.stage(t).devices;
      for_each_device_pair(p, s, t, [&](size_t i, size_t j, double) {
        n.transfers += from[i] == to[j] ? 0 : 2 * m;
        n.dependencies += 4 * m;
      });
    }
  }
  n.compute += static_cast<size_t>(std::count(busy.begin(), busy.end(), 1));  // optimizer steps
  return n;
}

Status check_task_count(const TaskCount& n, const Partition& p, int micro_batches, int passes) {
  if (n.total() <= kMaxTasks) return {};
  size_t replicas = 0;
  for (size_t s = 0; s < p.stage_count(); ++s) replicas += p.stage(s).devices.size();
  return Error{fmt::format(
      "the plan is too large to simulate: {} micro-batches x {} stage replicas ({} stages) x {} passes "
      "= {} compute tasks, + {} transfers + {} all-reduce steps = {} tasks in one iteration, above "
      "pipegrid's limit of {} (2^25); use fewer micro-batches, stages or replicas",
      micro_batches, replicas, p.stage_count(), passes, n.compute, n.transfers, n.ring_steps, n.total(),
      kMaxTasks)};
}

namespace {

// The times of some of a layer's kernels (a piece of it), run as one layer.
Result<PassTimes> kernel_times(const Layer& layer, const std::vector<Kernel>& ks, Precision precision,
                               const DeviceSpec& spec, double share) {
  Layer piece;
  piece.name = layer.name;
  piece.kind = layer.kind;
  piece.kernels = ks;
  for (const Kernel& k : ks) {
    piece.forward_flops += k.forward_flops;
    piece.backward_input_flops += k.backward_input_flops;
    piece.backward_weight_flops += k.backward_weight_flops;
  }
  return layer_times(piece, precision, spec, share);
}

// A tensor-parallel stage's costs on each of its devices.
Result<std::vector<StageCost>> tp_stage_costs(const Workload& w, const Cluster& c, const Partition& p,
                                              size_t s, double micro_batch_size, Recompute recompute,
                                              const TensorParallelOptions& tp) {
  const Stage& st = p.stage(s);
  const int T = st.tensor_parallel;
  const double share = micro_batch_size / st.replicas();
  std::vector<TpLayer> layers;
  for (int l : st.layers) {
    Result<TpLayer> r = tensor_parallel_layer(w.layer(l), T, tp, w.precision);
    if (!r) return Error{fmt::format("stage {}: {}", s, r.error().message)};
    layers.push_back(std::move(*r));
  }
  double largest_output = 0;
  for (int l : st.layers) largest_output = std::max(largest_output, w.layer(l).output_bytes);
  std::vector<StageCost> out;
  for (int d : st.devices) {
    const DeviceSpec& spec = c.devices[d].spec;
    // The pieces of one layer pass pay the layer overhead once, as the layer would.
    auto piece_times = [&](const Layer& layer, const std::vector<Kernel>& ks) -> Result<PassTimes> {
      Result<PassTimes> t = kernel_times(layer, ks, w.precision, spec, share);
      if (!t) return Error{fmt::format("stage {} on {}: {}", s, c.devices[d].name, t.error().message)};
      return t;
    };
    StageCost sc;
    TpProgram fwd, bwd, bwd_in, rec;  // rec: the transformer layers' forward, re-run by full recomputation
    fwd.compute = {0.0};
    rec.compute = {0.0};
    bwd.compute = {0.0};
    bwd_in.compute = {0.0};
    auto push = [](TpProgram& prog, const TpPiece& piece) {
      prog.kinds.push_back(piece.kind);
      prog.bytes.push_back(piece.bytes);
      prog.compute.push_back(0.0);
    };
    double selective_s = 0, recompute_full_s = 0, stash_none = 0, stash_sel = 0, stash_full = 0,
           largest_stash = 0, largest_recomputed = 0;
    for (size_t i = 0; i < st.layers.size(); ++i) {
      const Layer& layer = w.layer(st.layers[i]);
      double overhead = 0;  // to take back: the layer's pieces after its first pay none
      // Megatron's full recomputation checkpoints the transformer layers: their forward is re-run.
      const bool checkpointed = layer.split.kind == TensorSplitKind::Transformer;
      for (const TpPiece& piece : layers[i].forward) {
        if (piece.collective) {
          push(fwd, piece);
          fwd.bytes.back() = piece.bytes * share;
          if (checkpointed) {
            push(rec, piece);
            rec.bytes.back() = piece.bytes * share;
          }
          continue;
        }
        Result<PassTimes> t = piece_times(layer, piece.kernels);
        if (!t) return t.error();
        double x = t->forward;
        if (x > 0) x -= overhead, overhead = spec.layer_overhead_s;
        fwd.compute.back() += x;
        sc.times.forward += x;
        if (checkpointed) {
          rec.compute.back() += x;
          recompute_full_s += x;
        }
      }
      if (!layers[i].recompute.empty()) {
        Result<PassTimes> t = piece_times(layer, layers[i].recompute);
        if (!t) return t.error();
        selective_s += std::max(0.0, t->forward - spec.layer_overhead_s);
      }
      stash_none += layers[i].stash_none;
      stash_sel += layers[i].stash_selective;
      stash_full += layers[i].stash_full;
      largest_stash = std::max(largest_stash, layers[i].stash_none);
      largest_recomputed = std::max(largest_recomputed, layers[i].stash_none - layers[i].stash_selective);
      sc.parameters += layers[i].parameters;
      sc.parameter_bytes += layers[i].parameter_bytes;
    }
    for (size_t i = st.layers.size(); i-- > 0;) {
      const Layer& layer = w.layer(st.layers[i]);
      double over_in = 0, over_w = 0;
      for (const TpPiece& piece : layers[i].backward) {
        if (piece.collective) {
          push(bwd, piece);
          push(bwd_in, piece);
          bwd.bytes.back() = bwd_in.bytes.back() = piece.bytes * share;
          continue;
        }
        Result<PassTimes> t = piece_times(layer, piece.kernels);
        if (!t) return t.error();
        double bi = t->backward_input, bw = t->backward_weight;
        if (bi > 0) bi -= over_in, over_in = spec.layer_overhead_s;
        if (bw > 0) bw -= over_w, over_w = spec.layer_overhead_s;
        bwd.compute.back() += bi + bw;
        bwd_in.compute.back() += bi;
        sc.times.backward_input += bi;
        sc.times.backward_weight += bw;
      }
    }
    switch (recompute) {
      case Recompute::None:
        sc.stash_bytes = stash_none * share;
        break;
      case Recompute::Selective:
        sc.stash_bytes = stash_sel * share;
        sc.recompute_bytes = largest_recomputed * share;
        sc.recompute_s = selective_s;
        bwd.compute.front() += selective_s;
        bwd_in.compute.front() += selective_s;
        break;
      case Recompute::Full: {
        sc.stash_bytes = stash_full * share;
        sc.recompute_bytes = largest_stash * share;
        sc.recompute_s = recompute_full_s;
        // The backward re-runs the transformer layers' forward, collectives included, then runs.
        auto prefixed = [&](const TpProgram& b) {
          TpProgram r = rec;
          r.compute.back() += b.compute.front();
          r.compute.insert(r.compute.end(), b.compute.begin() + 1, b.compute.end());
          r.kinds.insert(r.kinds.end(), b.kinds.begin(), b.kinds.end());
          r.bytes.insert(r.bytes.end(), b.bytes.begin(), b.bytes.end());
          return r;
        };
        bwd = prefixed(bwd);
        bwd_in = prefixed(bwd_in);
        break;
      }
    }
    sc.workspace_bytes = largest_output * share / (tp.sequence_parallel ? T : 1);
    sc.tp_forward = std::move(fwd);
    sc.tp_backward = std::move(bwd);
    sc.tp_backward_input = std::move(bwd_in);
    out.push_back(std::move(sc));
  }
  return out;
}

}  // namespace

Result<std::vector<std::vector<StageCost>>> stage_costs(const Workload& w, const Cluster& c,
                                                        const Partition& p, double micro_batch_size,
                                                        Recompute recompute,
                                                        const TensorParallelOptions& tp) {
  std::vector<std::vector<StageCost>> out(p.stage_count());
  for (size_t s = 0; s < p.stage_count(); ++s) {
    const Stage& st = p.stage(s);
    if (st.tensor_parallel > 1) {
      auto r = tp_stage_costs(w, c, p, s, micro_batch_size, recompute, tp);
      if (!r) return r.error();
      out[s] = std::move(*r);
      continue;
    }
    const double share = micro_batch_size / static_cast<double>(st.devices.size());
    // The stage's input per sample: what its predecessors send, or the model's input.
    double input = 0;
    for (auto [it, end] = boost::in_edges(s, p.graph); it != end; ++it)
      input += p.graph[*it].bytes_per_sample;
    if (boost::in_degree(s, p.graph) == 0) input = w.input_bytes_per_sample;
    for (int d : st.devices) {
      StageCost sc;
      double full_stash = 0, selective_stash = 0, selective_s = 0, largest_output = 0;
      // Full recomputation of transformer blocks is Megatron's, as at t > 1 (tp_stage_costs): each
      // block keeps its input and re-runs its forward one block at a time; the other layers keep
      // their stash and are not re-run. A stage without blocks recomputes as GPipe does: it keeps
      // its input and re-runs its whole forward.
      double block_stash = 0, block_forward_s = 0, largest_stash = 0;
      // Selective recomputation of blocks likewise: the attention core's kernels re-run
      // (TpLayer::recompute), one block's scores re-materialised at a time.
      double block_selective_s = 0, largest_recomputed = 0;
      bool blocks = false;
      for (int l : st.layers) {
        const Layer& layer = w.layer(l);
        Result<PassTimes> t = layer_times(layer, w.precision, c.devices[d].spec, share);
        if (!t) return Error{fmt::format("stage {} on {}: {}", s, c.devices[d].name, t.error().message)};
        largest_stash = std::max(largest_stash, layer.stash_bytes);
        if (layer.split.kind == TensorSplitKind::Transformer) {
          Result<TpLayer> whole = tensor_parallel_layer(layer, 1, tp, w.precision);
          if (!whole) return Error{fmt::format("stage {}: {}", s, whole.error().message)};
          blocks = true;
          block_stash += whole->stash_full;
          block_forward_s += t->forward;
          Result<PassTimes> core =
              kernel_times(layer, whole->recompute, w.precision, c.devices[d].spec, share);
          if (!core)
            return Error{fmt::format("stage {} on {}: {}", s, c.devices[d].name, core.error().message)};
          block_selective_s += std::max(0.0, core->forward - c.devices[d].spec.layer_overhead_s);
          largest_recomputed = std::max(largest_recomputed, whole->stash_none - whole->stash_selective);
        } else {
          block_stash += layer.stash_bytes;
        }
        sc.times.forward += t->forward;
        sc.times.backward_input += t->backward_input;
        sc.times.backward_weight += t->backward_weight;
        full_stash += layer.stash_bytes;
        selective_stash += layer.selective_stash_bytes >= 0 ? layer.selective_stash_bytes : layer.stash_bytes;
        selective_s += layer.selective_recompute_fraction * t->forward;
        largest_output = std::max(largest_output, layer.output_bytes);
        sc.parameters += layer.parameters;
        sc.parameter_bytes += layer.parameter_bytes;
      }
      switch (recompute) {
        case Recompute::None:
          sc.stash_bytes = full_stash * share;
          break;
        case Recompute::Full:
          if (blocks) {
            sc.stash_bytes = block_stash * share;
            sc.recompute_bytes = largest_stash * share;
            sc.recompute_s = block_forward_s;
          } else {
            sc.stash_bytes = input * share;
            sc.recompute_bytes = full_stash * share;
            sc.recompute_s = sc.times.forward;
          }
          break;
        case Recompute::Selective:
          sc.stash_bytes = selective_stash * share;
          sc.recompute_bytes =
              (blocks ? largest_recomputed : std::max(0.0, full_stash - selective_stash)) * share;
          sc.recompute_s = blocks ? block_selective_s : selective_s;
          break;
      }
      sc.workspace_bytes = largest_output * share;
      out[s].push_back(sc);
    }
  }
  return out;
}

int dp_buckets(double parameters, int replicas) {
  const double bucket = std::max(40e6, 1e6 * replicas);
  return static_cast<int>(std::clamp(std::ceil(parameters / bucket), 1.0, 1e6));
}

Result<TaskGraph> lower(const Workload& w, const Cluster& c, const Partition& p, const Schedule& sched,
                        const LoweringOptions& o) {
  const int m = o.micro_batches;
  const size_t S = p.stage_count();
  const size_t D = c.devices.size();
  // Room for every task and dependency, counted up front: compute tasks and optimizer steps, two
  // transfers (or two direct dependencies) per replica pair and micro-batch, ring all-reduce steps.
  const int passes = sched.split_backward ? 3 : 2;
  TaskCount count = count_tasks(p, m, passes);
  count.compute = 0;
  for (size_t d = 0; d < D && d < sched.device_actions.size(); ++d)
    count.compute += sched.device_actions[d].size() + (sched.device_actions[d].empty() ? 0 : 1);
  if (Status s = check_task_count(count, p, m, passes); !s) return s.error();
  const size_t compute = count.compute, transfers = count.transfers, ring_steps = count.ring_steps,
               dependencies = count.dependencies;
  auto costs = o.costs ? Result<std::vector<std::vector<StageCost>>>(*o.costs)
                       : stage_costs(w, c, p, o.micro_batch_size, o.memory.recompute, o.tensor_parallel);
  if (!costs) return costs.error();
  if (costs->size() != S) return Error{"internal error: the stage costs given do not match the partition"};
  for (size_t s = 0; s < S; ++s)
    if ((*costs)[s].size() != p.stage(s).devices.size())
      return Error{"internal error: the stage costs given do not match the partition"};
  // Tensor-parallel stages: a pass is several compute tasks and each device sends one flow per
  // collective. Counted here, exactly, now that the programs are known.
  auto program = [&](int stage, size_t j, Pass pass) -> const TpProgram* {
    if (p.stage(stage).tensor_parallel <= 1 || pass == Pass::Weight) return nullptr;
    const StageCost& sc = (*costs)[stage][j];
    return pass == Pass::Forward  ? &sc.tp_forward
           : sched.split_backward ? &sc.tp_backward_input
                                  : &sc.tp_backward;
  };
  bool any_tp = false;
  size_t tp_tasks = 0, tp_flows = 0;
  for (size_t st = 0; st < S; ++st)
    if (p.stage(st).tensor_parallel > 1) {
      any_tp = true;
      for (size_t j = 0; j < p.stage(st).devices.size(); ++j)
        for (Pass pass : {Pass::Forward, Pass::Backward}) {
          const size_t n = program(static_cast<int>(st), j, pass)->collectives();
          tp_tasks += n * static_cast<size_t>(m);
          tp_flows += n * static_cast<size_t>(m);
        }
    }
  // Data-parallel overlap (o.dp_overlap): the first stage's gradients in K buckets, bucket k ready
  // once (k + 1) / K of its last backward (length L) has run, all-reduced one after another (NCCL
  // runs them in turn on one stream; on a ring of links they go in turn anyway). Bucket k then ends at
  // max_j<=k (r_j + (k + 1 - j) A / K), A the whole all-reduce's time, and the last at
  // max(r_0 + A, r_K-1 + A / K): r_j is linear in j, so the maximum is at an end. Lowered as two
  // all-reduces with the same ends: buckets 0 .. K - 2 together from r_0 (the backward's first K-th
  // done), then the last after the backward; without tensor parallelism the backward becomes those
  // two compute tasks (under it, its pieces are shared out).
  const bool bucketed = o.dp_overlap && S > 0 && p.stage(0).replicas() > 1;
  const int buckets = bucketed ? dp_buckets((*costs)[0][0].parameters, p.stage(0).replicas()) : 1;
  if (any_tp || bucketed) {
    TaskCount with_tp = count;
    with_tp.compute += tp_tasks;
    with_tp.transfers += tp_flows;
    if (bucketed && buckets > 1) {
      const size_t r0 = static_cast<size_t>(p.stage(0).replicas()), t0 = p.stage(0).tensor_parallel;
      if (t0 == 1) with_tp.compute += p.stage(0).devices.size();
      with_tp.ring_steps += 2 * (r0 - 1) * r0 * t0;
    }
    if (Status st = check_task_count(with_tp, p, m, passes); !st) return st.error();
  }

  TaskGraph g;
  g.samples_per_iteration = m * o.micro_batch_size;
  g.device_order.resize(D);
  g.static_memory.assign(D, MemoryBytes{});

  // (stage, replica) pairs are numbered rep_base[s] + j. A device's replicas, (stage, j) by stage,
  // give the replica index of a (stage, device) (a stages x devices table would be quadratic).
  std::vector<std::vector<std::pair<int, int>>> hosted(D);
  std::vector<size_t> rep_base(S + 1, 0);
  for (size_t s = 0; s < S; ++s) {
    const auto& devs = p.stage(s).devices;
    for (size_t j = 0; j < devs.size(); ++j)
      hosted[devs[j]].emplace_back(static_cast<int>(s), static_cast<int>(j));
    rep_base[s + 1] = rep_base[s] + devs.size();
  }
  auto replica_of = [&](int s, size_t d) {
    const auto& h = hosted[d];
    auto it = std::lower_bound(h.begin(), h.end(), std::pair<int, int>{s, -1});
    return it != h.end() && it->first == s ? it->second : -1;
  };
  auto rep_index = [&](int s, int j) { return rep_base[s] + j; };
  // Compute task of every (stage, replica, pass, micro-batch).
  std::vector<int32_t> slot(rep_base[S] * m * 3, -1);
  auto slot_index = [&](int s, int replica, Pass pass, int k) {
    return (rep_index(s, replica) * m + k) * 3 + static_cast<int>(pass);
  };
  auto slot_of = [&](int s, int replica, Pass pass, int k) -> int32_t& {
    return slot[slot_index(s, replica, pass, k)];
  };
  std::vector<int32_t> last_backward(rep_base[S], -1);  // last B or W of each (stage, replica)
  // Bucketed overlap: where the first stage's last backward (B, or W when split) sits on each of its
  // devices (device, action index), and the task after which bucket k is ready there.
  std::vector<std::pair<size_t, size_t>> dp_last(bucketed ? p.stage(0).devices.size() : 0, {SIZE_MAX, 0});
  std::vector<std::vector<int32_t>> dp_piece(dp_last.size());
  for (size_t d = 0; bucketed && d < D && d < sched.device_actions.size(); ++d)
    for (size_t i = 0; i < sched.device_actions[d].size(); ++i) {
      const Action& a = sched.device_actions[d][i];
      if (a.stage == 0 && a.pass != Pass::Forward) dp_last[replica_of(0, d)] = {d, i};
    }
  // Task numbering: each compute task is followed by the transfers it produces (activations after an
  // F, gradients after a B), so that the replay's loop finds a task, its transfers, their times and
  // successor rows in neighbouring memory (on a 1F1B chain of 1,024 devices the executor's loop went
  // from 18.5% to 12.4% of the samples; sim/README.md). Count them per (stage, replica) first.
  std::vector<int32_t> out_forward(rep_base[S], 0), out_backward(rep_base[S], 0);
  auto for_each_transfer_pair = [&](auto&& f) {
    for (size_t s = 0; s < S; ++s)
      for (int t : p.successors(static_cast<int>(s)))
        for_each_device_pair(p, s, t, [&](size_t i, size_t j, double share) { f(s, t, i, j, share); });
  };
  for_each_transfer_pair([&](size_t s, int t, size_t i, size_t j, double) {
    if (p.stage(s).devices[i] == p.stage(t).devices[j]) return;
    ++out_forward[rep_index(static_cast<int>(s), static_cast<int>(i))];
    ++out_backward[rep_index(t, static_cast<int>(j))];
  });
  size_t reserved = 0, placed = 0, missing = 0;

  g.reserve(compute + transfers + ring_steps + tp_tasks + tp_flows,
            dependencies + 2 * ring_steps + compute + 4 * tp_flows);
  reserve_huge(g.memory_changes, compute * 2);
  for (size_t d = 0; d < D && d < sched.device_actions.size(); ++d)
    g.device_order[d].reserve(sched.device_actions[d].size() + 1);
  // Under tensor parallelism or bucketed overlap, the first compute task of each pass (slot_of holds the
  // last).
  std::vector<int32_t> head;
  const bool multi_task_passes = any_tp || bucketed;
  if (multi_task_passes) head.assign(slot.size(), -1);

  // Compute tasks in device order, with their memory effects.
  for (size_t d = 0; d < D && d < sched.device_actions.size(); ++d) {
    for (size_t action = 0; action < sched.device_actions[d].size(); ++action) {
      const Action& a = sched.device_actions[d][action];
      const int j = replica_of(a.stage, d);
      const StageCost& sc = (*costs)[a.stage][j];
      Task t;
      t.kind = kind_of(a.pass);
      t.stage = a.stage;
      t.micro_batch = a.micro_batch;
      t.device = static_cast<int32_t>(d);
      int32_t first = -1;  // the pass's first compute task when it has several (tensor parallelism)
      if (const TpProgram* prog = program(a.stage, static_cast<size_t>(j), a.pass)) {
        for (size_t piece = 0; piece + 1 < prog->compute.size(); ++piece) {
          t.duration = prog->compute[piece];
          const int32_t id = g.add(t);
          if (first < 0) first = id;
          g.device_order[d].push_back(id);
        }
      }
      switch (a.pass) {
        case Pass::Forward:
          t.duration = sc.times.forward;
          break;
        case Pass::Backward:
          t.duration =
              sc.recompute_s + (sched.split_backward ? sc.times.backward_input : sc.times.backward());
          break;
        case Pass::Weight:
          t.duration = sc.times.backward_weight;
          break;
      }
      const TpProgram* tp_prog = program(a.stage, static_cast<size_t>(j), a.pass);
      if (tp_prog) t.duration = tp_prog->compute.back();
      const bool split = bucketed && a.stage == 0 && dp_last[j] == std::pair<size_t, size_t>{d, action};
      if (split && !tp_prog && buckets > 1) {  // its first K-th, then the rest
        Task head_piece = t;
        head_piece.duration = t.duration / buckets;
        t.duration -= head_piece.duration;
        const int32_t piece = g.add(head_piece);
        if (first < 0) first = piece;
        g.device_order[d].push_back(piece);
        dp_piece[j].push_back(piece);
      }
      int32_t id = g.add(t);
      // Under tensor parallelism the pass's P pieces (first .. id): the first K-th is taken as done
      // after piece ceil(P / K) - 1.
      if (split && tp_prog && buckets > 1)
        dp_piece[j].push_back(first +
                              (static_cast<int64_t>(tp_prog->compute.size()) + buckets - 1) / buckets - 1);
      if (split) dp_piece[j].push_back(id);
      slot_of(a.stage, j, a.pass, a.micro_batch) = id;
      if (first < 0) first = id;
      if (multi_task_passes) head[slot_index(a.stage, j, a.pass, a.micro_batch)] = first;
      const int32_t out = a.pass == Pass::Forward    ? out_forward[rep_index(a.stage, j)]
                          : a.pass == Pass::Backward ? out_backward[rep_index(a.stage, j)]
                                                     : 0;
      for (int32_t x = 0; x < out; ++x) g.add(Task{});  // its transfers, filled in below
      reserved += out;
      g.device_order[d].push_back(id);
      // Memory: F stashes; B re-materialises what was recomputed and holds its workspace; the
      // activations go when the last backward pass of the micro-batch (B, or W when split) ends.
      // Allocations when the pass starts (its first task), frees when it ends (its last).
      auto change = [&](MemoryCategory cat, bool at_end, double bytes) {
        if (bytes != 0) g.memory_changes.push_back({at_end ? id : first, cat, at_end, bytes});
      };
      if (a.pass == Pass::Forward) change(MemoryCategory::Activations, false, sc.stash_bytes);
      if (a.pass == Pass::Backward) {
        change(MemoryCategory::Activations, false, sc.recompute_bytes);
        change(MemoryCategory::Workspace, false, sc.workspace_bytes);
        change(MemoryCategory::Workspace, true, -sc.workspace_bytes);
      }
      const bool frees = sched.split_backward ? a.pass == Pass::Weight : a.pass == Pass::Backward;
      if (frees) change(MemoryCategory::Activations, true, -(sc.stash_bytes + sc.recompute_bytes));
      if (a.pass != Pass::Forward) last_backward[rep_index(a.stage, j)] = id;
    }
  }

  // Activations forward, gradients backward, between stages, each in the place its producer left.
  // The pairs come in the same order as when the places were counted, and every pair sends one
  // transfer per micro-batch: a pair's place in the block after its producer's F (or B) is the
  // same for every micro-batch, counted per (stage, replica) (no counter per compute task).
  std::vector<int32_t> forward_offset(rep_base[S], 0), backward_offset(rep_base[S], 0);
  auto place = [&](int s, int replica, Pass pass, int k, int32_t offset, const Task& task) {
    const int32_t id = slot_of(s, replica, pass, k) + offset;
    g.tasks[id] = task;
    ++placed;
    return id;
  };
  for_each_transfer_pair([&](size_t s, int t, size_t i, size_t j, double share) {
    auto e = boost::edge(s, t, p.graph).first;
    const double bytes = p.graph[e].bytes_per_sample * o.micro_batch_size;
    const auto& from = p.stage(s).devices;
    const auto& to = p.stage(t).devices;
    int32_t fo = 0, bo = 0;  // this pair's places after the F and the B (from 1; 0: no transfer)
    if (from[i] != to[j]) {
      fo = ++forward_offset[rep_index(static_cast<int>(s), static_cast<int>(i))];
      bo = ++backward_offset[rep_index(t, static_cast<int>(j))];
    }
    for (int k = 0; k < m; ++k) {
      const int32_t f_src = slot_of(static_cast<int>(s), static_cast<int>(i), Pass::Forward, k);
      int32_t f_dst = slot_of(t, static_cast<int>(j), Pass::Forward, k);
      const int32_t b_src = slot_of(t, static_cast<int>(j), Pass::Backward, k);
      int32_t b_dst = slot_of(static_cast<int>(s), static_cast<int>(i), Pass::Backward, k);
      if (f_src < 0 || f_dst < 0 || b_src < 0 || b_dst < 0) {  // validate_schedule rules it out
        ++missing;
        continue;
      }
      if (multi_task_passes) {  // a pass receives into its first compute task
        f_dst = head[slot_index(t, static_cast<int>(j), Pass::Forward, k)];
        b_dst = head[slot_index(static_cast<int>(s), static_cast<int>(i), Pass::Backward, k)];
      }
      if (from[i] == to[j]) {
        g.depend(f_src, f_dst);
        g.depend(b_src, b_dst);
        continue;
      }
      Task act{TaskKind::Transfer, TransferKind::Activation, static_cast<int32_t>(s), t, k, from[i], to[j], 0,
               bytes * share};
      int32_t a = place(static_cast<int>(s), static_cast<int>(i), Pass::Forward, k, fo, act);
      g.depend(f_src, a);
      g.depend(a, f_dst);
      Task grad{TaskKind::Transfer, TransferKind::Gradient, t, static_cast<int32_t>(s), k, to[j], from[i], 0,
                bytes * share};
      int32_t b = place(t, static_cast<int>(j), Pass::Backward, k, bo, grad);
      g.depend(b_src, b);
      g.depend(b, b_dst);
    }
  });
  if (missing > 0 || placed != reserved)
    return Error{"internal error: the schedule's passes and the transfers between them do not match"};

  // The tensor-parallel groups' collectives, each as one flow per device to the next device of its
  // group (ring order), carrying what that device sends over all the ring's steps
  // (ring_flow_bytes). A flow starts once both its ends reached the collective; a device goes on
  // once its flows in and out are done (with overlap, one compute piece later).
  if (any_tp) {
    std::vector<int32_t> heads, flows;
    for (size_t st = 0; st < S; ++st) {
      const Stage& stage = p.stage(st);
      const int T = stage.tensor_parallel;
      if (T <= 1) continue;
      for (int r = 0; r < stage.replicas(); ++r)
        for (Pass pass : {Pass::Forward, Pass::Backward})
          for (int k = 0; k < m; ++k) {
            heads.assign(T, -1);
            for (int q = 0; q < T; ++q) heads[q] = head[slot_index(static_cast<int>(st), r * T + q, pass, k)];
            if (std::count(heads.begin(), heads.end(), -1) > 0) continue;
            const TpProgram& prog = *program(static_cast<int>(st), static_cast<size_t>(r * T), pass);
            const size_t n = prog.collectives();
            for (size_t x = 0; x < n; ++x) {
              flows.assign(T, -1);
              for (int q = 0; q < T; ++q) {
                Task f{TaskKind::Transfer,
                       TransferKind::TensorParallel,
                       static_cast<int32_t>(st),
                       static_cast<int32_t>(st),
                       k,
                       stage.devices[r * T + q],
                       stage.devices[r * T + (q + 1) % T],
                       0,
                       ring_flow_bytes(prog.kinds[x], prog.bytes[x], T)};
                flows[q] = g.add(f);
                g.depend(heads[q] + static_cast<int32_t>(x), flows[q]);
                g.depend(heads[(q + 1) % T] + static_cast<int32_t>(x), flows[q]);
              }
              const size_t next = o.tensor_parallel.overlap ? std::min(x + 2, n) : x + 1;
              for (int q = 0; q < T; ++q) {
                g.depend(flows[q], heads[q] + static_cast<int32_t>(next));
                g.depend(flows[(q - 1 + T) % T], heads[q] + static_cast<int32_t>(next));
              }
            }
          }
    }
  }

  // Static memory, gradient all-reduce of replicated stages, optimizer step.
  std::vector<std::vector<int32_t>> step_inputs(D);
  std::vector<double> step_parameters(D, 0.0);  // parameters each device's optimizer step updates
  for (size_t s = 0; s < S; ++s) {
    const auto& all = p.stage(s).devices;
    const int r = p.stage(s).replicas();
    const int T = p.stage(s).tensor_parallel;
    for (size_t j = 0; j < all.size(); ++j) {
      const StageCost& sc = (*costs)[s][j];
      MemoryBytes st = static_memory(sc.parameters, sc.parameter_bytes, o.memory);
      if (o.memory.zero1) st[static_cast<int>(MemoryCategory::OptimizerState)] /= r;  // ZeRO-1 sharding
      for (int k = 0; k < kMemoryCategoryCount; ++k) g.static_memory[all[j]][k] += st[k];
      step_parameters[all[j]] += o.memory.zero1 ? sc.parameters / r : sc.parameters;
    }
    // Each rank of the tensor-parallel groups all-reduces its shard with the same rank of the other
    // replicas (every device of the stage when there is no tensor parallelism).
    for (int q = 0; q < T; ++q) {
      std::vector<int> devs(r);
      std::vector<int32_t> ready(r);
      for (int j = 0; j < r; ++j) {
        devs[j] = all[j * T + q];
        ready[j] = last_backward[rep_index(static_cast<int>(s), j * T + q)];
      }
      if (r == 1) {
        if (ready[0] >= 0) step_inputs[devs[0]].push_back(ready[0]);
        continue;
      }
      const StageCost& sq = (*costs)[s][q];
      double bytes =
          o.gradient_reduce_bytes > 0 ? sq.parameters * o.gradient_reduce_bytes : sq.parameter_bytes;
      if (o.dp_overlap && o.memory.zero1) bytes /= 2;  // the reduce-scatter; the all-gather hidden
      // Bucketed (above): buckets 0 .. K - 2 together, then the last.
      const int k_count = bucketed && s == 0 && buckets > 1 ? 2 : 1;
      for (int k = 0; k < k_count; ++k) {
        if (k_count > 1)
          for (int j = 0; j < r; ++j)
            ready[j] = dp_piece[static_cast<size_t>(j * T + q)][static_cast<size_t>(k)];
        const double share = k_count == 1 ? 1.0 : k == 0 ? (buckets - 1.0) / buckets : 1.0 / buckets;
        auto done = append_allreduce(g, o.allreduce, c, devs, ready, bytes * share, static_cast<int32_t>(s));
        for (int j = 0; j < r; ++j)
          step_inputs[devs[j]].insert(step_inputs[devs[j]].end(), done[j].begin(), done[j].end());
      }
    }
  }
  for (size_t d = 0; d < D; ++d) {
    if (g.device_order[d].empty()) continue;
    Task t;
    t.kind = TaskKind::Optimizer;
    t.device = static_cast<int32_t>(d);
    t.duration = w.optimizer_step_s >= 0
                     ? w.optimizer_step_s
                     : optimizer_step_time(step_parameters[d], o.memory, w.precision, c.devices[d].spec);
    int32_t id = g.add(t);
    for (int32_t in : step_inputs[d])
      if (g.tasks[in].kind == TaskKind::Transfer)
        g.depend(in, id);  // compute inputs on d precede it in order
    g.device_order[d].push_back(id);
  }
  // The dependency list (8 bytes per dependency) is freed here, not by the replay's first
  // successors() call after the executor's arrays exist: at p = 1,024, m = 4,096 that moved the
  // peak RSS from 1,846 MB to 1,675 MB when the tasks are not renumbered.
  g.pack_dependencies();
  return g;
}

}  // namespace pipegrid
