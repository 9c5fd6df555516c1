#include "core/stage_costs.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace pipegrid {
namespace {

// The times of some of a layer's kernels (a piece of it), run as one layer.
Result<PassTimes> kernel_times(const Layer& layer, const std::vector<Kernel>& ks, Precision precision,
                               const DeviceSpec& spec, double share, HostCarry* carry = nullptr) {
  Layer piece;
  piece.name = layer.name;
  piece.kind = layer.kind;
  piece.kernels = ks;
  for (const Kernel& k : ks) {
    piece.forward_flops += k.forward_flops;
    piece.backward_input_flops += k.backward_input_flops;
    piece.backward_weight_flops += k.backward_weight_flops;
  }
  return carry ? layer_times(piece, precision, spec, share, *carry)
               : layer_times(piece, precision, spec, share);
}

// ---- Tensor-parallel stages ------------------------------------------------------------------------

// One device of a tensor-parallel stage, while its programs are built: the pieces of one layer pass
// pay the layer overhead once, as the layer would.
struct TpDevice {
  const Workload& w;
  const Cluster& c;
  size_t stage;
  int device;
  double share;     // samples of the replica's slice
  double load = 1;  // MoE: the device's expert load factor
  // The times of a piece's kernels (scaled by the device's expert load when the piece's are), the
  // host's streams carried in `carry` from the pass's pieces before it.
  Result<PassTimes> times(const Layer& layer, const TpPiece& piece, HostCarry& carry) const {
    if (!piece.expert_load || load == 1) return times(layer, piece.kernels, &carry);
    std::vector<Kernel> ks;
    for (const Kernel& k : piece.kernels) {
      Kernel x = k;
      x.forward_flops *= load;
      x.backward_input_flops *= load;
      x.backward_weight_flops *= load;
      x.forward_bytes *= load;
      x.backward_bytes *= load;
      ks.push_back(x);
    }
    return times(layer, ks, &carry);
  }
  Result<PassTimes> times(const Layer& layer, const std::vector<Kernel>& ks,
                          HostCarry* carry = nullptr) const {
    Result<PassTimes> t = kernel_times(layer, ks, w.precision, c.devices[device].spec, share, carry);
    if (!t) return Error{fmt::format("stage {} on {}: {}", stage, c.devices[device].name, t.error().message)};
    return t;
  }
  double overhead() const { return c.devices[device].spec.layer_overhead_s; }
};

// A collective between a program's compute pieces (and the piece after it).
void push_collective(TpProgram& prog, const TpPiece& piece, const TpDevice& dev) {
  prog.kinds.push_back(piece.kind);
  prog.bytes.push_back(piece.bytes * dev.share * (piece.expert_load ? dev.load : 1));
  prog.groups.push_back(piece.group);
  prog.combines.push_back(piece.combine ? 1 : 0);
  prog.deduplicates.push_back(piece.deduplicates);
  prog.flags.push_back(piece.flags);
  prog.compute.push_back(0.0);
}

// What the forward pass over the stage's layers gives: its program, the transformer layers' forward
// (what full recomputation re-runs, collectives included) and the memory and recompute figures.
struct TpForward {
  TpProgram forward, recompute;
  double selective_s = 0, recompute_full_s = 0, stash_none = 0, stash_selective = 0, stash_full = 0,
         largest_stash = 0, largest_recomputed = 0;
};

Result<TpForward> tp_forward(const TpDevice& dev, const std::vector<int>& layer_ids,
                             const std::vector<TpLayer>& layers, StageCost& sc) {
  TpForward f;
  f.forward.compute = {0.0};
  f.recompute.compute = {0.0};
  HostCarry host;  // the host runs ahead across the pass's pieces and layers (HostCarry)
  for (size_t i = 0; i < layer_ids.size(); ++i) {
    const Layer& layer = dev.w.layer(layer_ids[i]);
    double overhead = 0;  // to take back: the layer's pieces after its first pay none
    // Megatron's full recomputation checkpoints the transformer layers: their forward is re-run.
    const bool checkpointed = is_block(layer.split.kind);
    for (const TpPiece& piece : layers[i].forward) {
      if (piece.collective) {
        push_collective(f.forward, piece, dev);
        if (checkpointed) push_collective(f.recompute, piece, dev);
        continue;
      }
      // Megatron-Core's dispatchers wait for the tokens' counts per expert before the experts run
      // (the all-to-all dispatcher's `d2h_event.synchronize()` at its cuda_sync_point, DeepEP's
      // received counts, the grouped GEMM's splits on the host): the host drains there.
      if (piece.expert_load) host.forward.sync();
      Result<PassTimes> t = dev.times(layer, piece, host);
      if (!t) return t.error();
      double x = t->forward;
      if (x > 0) x -= overhead, overhead = dev.overhead();
      f.forward.compute.back() += x;
      sc.times.forward += x;
      sc.times.host_forward_s += t->host_forward_s;
      if (checkpointed) {
        f.recompute.compute.back() += x;
        f.recompute_full_s += x;
      }
    }
    if (!layers[i].recompute.empty()) {
      Result<PassTimes> t = dev.times(layer, layers[i].recompute);
      if (!t) return t.error();
      f.selective_s += std::max(0.0, t->forward - dev.overhead());
    }
    const double experts = layers[i].expert_stash * dev.load;  // MoE: the experts' activations
    f.stash_none += layers[i].stash_none + experts;
    f.stash_selective += layers[i].stash_selective + layers[i].expert_stash_selective * dev.load;
    f.stash_full += layers[i].stash_full;
    f.largest_stash = std::max(f.largest_stash, layers[i].stash_none + experts);
    f.largest_recomputed = std::max(
        f.largest_recomputed, layers[i].stash_none - layers[i].stash_selective +
                                  (layers[i].expert_stash - layers[i].expert_stash_selective) * dev.load);
    sc.parameters += layers[i].parameters;
    sc.parameter_bytes += layers[i].parameter_bytes;
    sc.expert_parameters += layers[i].expert_parameters;
    sc.expert_parameter_bytes += layers[i].expert_parameter_bytes;
  }
  return f;
}

// The backward over the stage's layers (last first): the whole backward's program and its
// input-gradient part's (split backward), with the same collectives.
Status tp_backward(const TpDevice& dev, const std::vector<int>& layer_ids, const std::vector<TpLayer>& layers,
                   StageCost& sc, TpProgram& bwd, TpProgram& bwd_in) {
  bwd.compute = {0.0};
  bwd_in.compute = {0.0};
  HostCarry host;  // the backward keeps the forward's splits: no synchronisation
  for (size_t i = layer_ids.size(); i-- > 0;) {
    const Layer& layer = dev.w.layer(layer_ids[i]);
    double over_in = 0, over_w = 0;
    for (const TpPiece& piece : layers[i].backward) {
      if (piece.collective) {
        push_collective(bwd, piece, dev);
        push_collective(bwd_in, piece, dev);
        continue;
      }
      Result<PassTimes> t = dev.times(layer, piece, host);
      if (!t) return t.error();
      double bi = t->backward_input, bw = t->backward_weight;
      if (bi > 0) bi -= over_in, over_in = dev.overhead();
      if (bw > 0) bw -= over_w, over_w = dev.overhead();
      bwd.compute.back() += bi + bw;
      bwd_in.compute.back() += bi;
      sc.times.backward_input += bi;
      sc.times.backward_weight += bw;
      sc.times.host_backward_s += t->host_backward_s;
    }
  }
  return {};
}

// `before`, then `after`: the last piece of one and the first of the other run as one piece.
TpProgram concatenated(const TpProgram& before, const TpProgram& after) {
  TpProgram r = before;
  r.compute.back() += after.compute.front();
  r.compute.insert(r.compute.end(), after.compute.begin() + 1, after.compute.end());
  r.kinds.insert(r.kinds.end(), after.kinds.begin(), after.kinds.end());
  r.bytes.insert(r.bytes.end(), after.bytes.begin(), after.bytes.end());
  r.groups.insert(r.groups.end(), after.groups.begin(), after.groups.end());
  r.combines.insert(r.combines.end(), after.combines.begin(), after.combines.end());
  r.deduplicates.insert(r.deduplicates.end(), after.deduplicates.begin(), after.deduplicates.end());
  r.flags.insert(r.flags.end(), after.flags.begin(), after.flags.end());
  return r;
}

// Memory and the backward's re-run forward under the recomputation mode.
void apply_tp_recompute(Recompute recompute, const TpForward& f, double share, StageCost& sc, TpProgram& bwd,
                        TpProgram& bwd_in) {
  switch (recompute) {
    case Recompute::None:
      sc.stash_bytes = f.stash_none * share;
      break;
    case Recompute::Selective:
      sc.stash_bytes = f.stash_selective * share;
      sc.recompute_bytes = f.largest_recomputed * share;
      sc.recompute_s = f.selective_s;
      bwd.compute.front() += f.selective_s;
      bwd_in.compute.front() += f.selective_s;
      break;
    case Recompute::Full:
      sc.stash_bytes = f.stash_full * share;
      sc.recompute_bytes = f.largest_stash * share;
      sc.recompute_s = f.recompute_full_s;
      // The backward re-runs the transformer layers' forward, collectives included, then runs.
      bwd = concatenated(f.recompute, bwd);
      bwd_in = concatenated(f.recompute, bwd_in);
      break;
  }
}

// A tensor-parallel stage's costs on each of its devices.
Result<std::vector<StageCost>> tp_stage_costs(const Workload& w, const Cluster& c, const Partition& p,
                                              size_t s, double micro_batch_size, Recompute recompute,
                                              const TensorParallelOptions& tp) {
  const Stage& st = p.stage(s);
  const int T = st.tensor_parallel, cp = st.context_parallel;
  const double share = micro_batch_size / st.replicas();
  const ExpertSizes es{st.expert_parallel, st.expert_tensor_parallel};
  // The layers as each context-parallel rank runs them (their attention work differs without load
  // balancing).
  std::vector<std::vector<TpLayer>> layers(static_cast<size_t>(cp));
  double experts = 0, cp_workspace = 0;  // the stage's MoE blocks' routed experts (0: none)
  for (int rank = 0; rank < cp; ++rank)
    for (int l : st.layers) {
      if (w.layer(l).split.kind == TensorSplitKind::MoeBlock) experts = w.layer(l).split.moe.experts;
      Result<TpLayer> r = tensor_parallel_layer(w.layer(l), T, tp, w.precision, es, {cp, rank});
      if (!r) return Error{fmt::format("stage {}: {}", s, r.error().message)};
      cp_workspace = std::max(cp_workspace, r->cp_workspace);
      layers[static_cast<size_t>(rank)].push_back(std::move(*r));
    }
  // The backward's workspace: the largest output a device holds. The head's logits are split over the
  // vocabulary whatever the sequence parallelism (s x V / t each); the others are whole without it
  // (until 2026-12-05 the logits were taken whole without SP: 1.84 GB too many for Llama 3 8B at t 8).
  double largest_output = 0;
  for (int l : st.layers) {
    const bool split = tp.sequence_parallel || w.layer(l).split.kind == TensorSplitKind::VocabHead;
    largest_output = std::max(largest_output, w.layer(l).output_bytes / (split ? T : 1));
  }
  const std::vector<double> loads =
      experts > 0 ? expert_loads(tp.moe, static_cast<int>(experts), es.ep) : std::vector<double>(1, 1.0);
  std::vector<StageCost> out;
  for (size_t j = 0; j < st.devices.size(); ++j) {
    const int d = st.devices[j];
    TpDevice dev{w, c, s, d, share};
    if (experts > 0) dev.load = es.ep * loads[static_cast<size_t>(expert_rank(static_cast<int>(j), es))];
    const auto& mine = layers[(j / static_cast<size_t>(T)) % static_cast<size_t>(cp)];
    StageCost sc;
    sc.expert_load = dev.load;
    for (int l : st.layers) sc.parameter_tensors += parameter_tensors(w.layer(l), es.ep);
    Result<TpForward> f = tp_forward(dev, st.layers, mine, sc);
    if (!f) return f.error();
    TpProgram bwd, bwd_in;
    if (Status b = tp_backward(dev, st.layers, mine, sc, bwd, bwd_in); !b) return b.error();
    apply_tp_recompute(recompute, *f, share, sc, bwd, bwd_in);
    sc.workspace_bytes = largest_output * share;
    if (cp > 1) sc.workspace_bytes = sc.workspace_bytes / cp + cp_workspace * share;
    sc.tp_forward = std::move(f->forward);
    sc.tp_backward = std::move(bwd);
    sc.tp_backward_input = std::move(bwd_in);
    out.push_back(std::move(sc));
  }
  return out;
}

// ---- Stages without tensor parallelism ---------------------------------------------------------------

// A stage's layers on one device, summed: pass times, parameters and the activation figures each
// recomputation mode needs.
struct PlainSums {
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
};

// A stage's layers' pass times on one device with the host's streams carried across them (HostCarry):
// the forward in the layers' order, synchronised before each MoE block (its dispatcher waits for the
// counts per expert, tp_forward), the backward in reverse.
Result<std::vector<PassTimes>> carried_times(const Workload& w, const DeviceSpec& spec, const Stage& st,
                                             double share) {
  std::vector<PassTimes> times(st.layers.size());
  if (!spec.host_bound()) {  // nothing to carry: each layer's times once
    for (size_t i = 0; i < st.layers.size(); ++i) {
      Result<PassTimes> t = layer_times(w.layer(st.layers[i]), w.precision, spec, share);
      if (!t) return t.error();
      times[i] = *t;
    }
    return times;
  }
  HostCarry forward, backward;
  for (size_t i = 0; i < st.layers.size(); ++i) {
    const Layer& layer = w.layer(st.layers[i]);
    if (layer.split.kind == TensorSplitKind::MoeBlock) forward.forward.sync();
    Result<PassTimes> t = layer_times(layer, w.precision, spec, share, forward);
    if (!t) return t.error();
    times[i].forward = t->forward;
    times[i].host_forward_s = t->host_forward_s;
  }
  for (size_t i = st.layers.size(); i-- > 0;) {
    Result<PassTimes> t = layer_times(w.layer(st.layers[i]), w.precision, spec, share, backward);
    if (!t) return t.error();
    times[i].backward_input = t->backward_input;
    times[i].backward_weight = t->backward_weight;
    times[i].host_backward_s = t->host_backward_s;
  }
  return times;
}

Result<PlainSums> plain_sums(const Workload& w, const Cluster& c, const Stage& st, size_t s, int d,
                             double share, const TensorParallelOptions& tp, StageCost& sc) {
  PlainSums x;
  const DeviceSpec& spec = c.devices[d].spec;
  auto located = [&](const Error& e) {
    return Error{fmt::format("stage {} on {}: {}", s, c.devices[d].name, e.message)};
  };
  // Recompute modules other than Megatron's default: a block's selective stash as they leave it (the
  // workload's own figure is the default's).
  const bool modules = tp.recompute_modules != RecomputeModules{};
  Result<std::vector<PassTimes>> carried = carried_times(w, spec, st, share);
  if (!carried) return located(carried.error());
  const std::vector<PassTimes>& times = *carried;
  for (size_t i = 0; i < st.layers.size(); ++i) {
    const Layer& layer = w.layer(st.layers[i]);
    const PassTimes* t = &times[i];
    x.largest_stash = std::max(x.largest_stash, layer.stash_bytes);
    double selective = layer.selective_stash_bytes >= 0 ? layer.selective_stash_bytes : layer.stash_bytes;
    double stash_saved = 0;  // activation_fp8_input_store's bytes per sample off the layer's own figure
    if (is_block(layer.split.kind)) {
      Result<TpLayer> whole = tensor_parallel_layer(layer, 1, tp, w.precision);
      if (!whole) return Error{fmt::format("stage {}: {}", s, whole.error().message)};
      x.blocks = true;
      x.block_stash += whole->stash_full;
      x.block_forward_s += t->forward;
      Result<PassTimes> core = kernel_times(layer, whole->recompute, w.precision, spec, share);
      if (!core) return located(core.error());
      x.block_selective_s += std::max(0.0, core->forward - spec.layer_overhead_s);
      const double kept = whole->stash_selective + whole->expert_stash_selective;
      stash_saved = whole->fp8_store_saved;
      selective = modules ? kept : selective - whole->fp8_store_saved_selective;
      x.largest_recomputed = std::max(x.largest_recomputed, whole->stash_none + whole->expert_stash - kept);
    } else {
      x.block_stash += layer.stash_bytes;
    }
    sc.times.forward += t->forward;
    sc.times.backward_input += t->backward_input;
    sc.times.backward_weight += t->backward_weight;
    sc.times.host_forward_s += t->host_forward_s;
    sc.times.host_backward_s += t->host_backward_s;
    x.full_stash += layer.stash_bytes - stash_saved;
    x.selective_stash += selective;
    x.selective_s += layer.selective_recompute_fraction * t->forward;
    x.largest_output = std::max(x.largest_output, layer.output_bytes);
    sc.parameters += layer.parameters;
    sc.parameter_tensors += parameter_tensors(layer);
    sc.parameter_bytes += layer.parameter_bytes;
  }
  return x;
}

void apply_plain_recompute(Recompute recompute, const PlainSums& x, double input, double share,
                           StageCost& sc) {
  switch (recompute) {
    case Recompute::None:
      sc.stash_bytes = x.full_stash * share;
      break;
    case Recompute::Full:
      if (x.blocks) {
        sc.stash_bytes = x.block_stash * share;
        sc.recompute_bytes = x.largest_stash * share;
        sc.recompute_s = x.block_forward_s;
      } else {
        sc.stash_bytes = input * share;
        sc.recompute_bytes = x.full_stash * share;
        sc.recompute_s = sc.times.forward;
      }
      break;
    case Recompute::Selective:
      sc.stash_bytes = x.selective_stash * share;
      sc.recompute_bytes =
          (x.blocks ? x.largest_recomputed : std::max(0.0, x.full_stash - x.selective_stash)) * share;
      sc.recompute_s = x.blocks ? x.block_selective_s : x.selective_s;
      break;
  }
  sc.workspace_bytes = x.largest_output * share;
}

Result<std::vector<StageCost>> plain_stage_costs(const Workload& w, const Cluster& c, const Partition& p,
                                                 size_t s, double micro_batch_size, Recompute recompute,
                                                 const TensorParallelOptions& tp) {
  const Stage& st = p.stage(s);
  // Split replicas each take 1/d of a micro-batch; round-robin ones a whole micro-batch in turn.
  const double share =
      st.round_robin ? micro_batch_size : micro_batch_size / static_cast<double>(st.devices.size());
  // The stage's input per sample: what its predecessors send, or the model's input.
  double input = 0;
  for (auto [it, end] = boost::in_edges(s, p.graph); it != end; ++it) input += p.graph[*it].bytes_per_sample;
  if (boost::in_degree(s, p.graph) == 0) input = w.input_bytes_per_sample;
  std::vector<StageCost> out;
  for (int d : st.devices) {
    StageCost sc;
    Result<PlainSums> x = plain_sums(w, c, st, s, d, share, tp, sc);
    if (!x) return x.error();
    apply_plain_recompute(recompute, *x, input, share, sc);
    out.push_back(sc);
  }
  return out;
}

// The fraction of the token copies a stage's MoE blocks keep under the options' capacity factor (1:
// none dropped, or no MoE block).
double kept_copies(const Workload& w, const Stage& st, const MoeOptions& o) {
  for (int l : st.layers)
    if (w.layer(l).split.kind == TensorSplitKind::MoeBlock)
      return kept_copy_share(o, static_cast<int>(w.layer(l).split.moe.experts));
  return 1;
}

// The copies of tied weights the partition's devices keep (partition.h tied_copies): each adds the
// shared weight as the tied layer holds it on the device (split as under its stage's tensor
// parallelism), at the source layer's bytes per parameter, as one tensor.
Status add_tied_copies(const Workload& w, const Partition& p, const TensorParallelOptions& tp,
                       std::vector<std::vector<StageCost>>& out) {
  for (const TiedCopy& c : tied_copies(w, p)) {
    const Stage& st = p.stage(static_cast<size_t>(c.stage));
    const Layer& l = w.layer(static_cast<size_t>(st.layers[static_cast<size_t>(c.index)]));
    Result<double> r = tied_copy_parameters(w, st, c.index, tp);
    if (!r) return Error{fmt::format("stage {}: {}", c.stage, r.error().message)};
    const double params = *r;
    for (size_t j = 0; j < c.copies.size(); ++j) {
      if (!c.copies[j]) continue;
      StageCost& sc = out[static_cast<size_t>(c.stage)][j];
      sc.parameters += params;
      sc.tied_parameters += params;
      sc.parameter_bytes += tied_bytes(w, l, params);
      sc.parameter_tensors += 1;
    }
  }
  return {};
}

}  // namespace

Result<double> tied_copy_parameters(const Workload& w, const Stage& st, int index,
                                    const TensorParallelOptions& tp) {
  const Layer& l = w.layer(static_cast<size_t>(st.layers[static_cast<size_t>(index)]));
  if (st.tensor_parallel <= 1) return l.tied_parameters;
  Result<TpLayer> r = tensor_parallel_layer(l, st.tensor_parallel, tp, w.precision);
  if (!r) return r.error();
  return r->tied_parameters;
}

Result<std::vector<std::vector<StageCost>>> stage_costs(const Workload& w, const Cluster& c,
                                                        const Partition& p, double micro_batch_size,
                                                        Recompute recompute,
                                                        const TensorParallelOptions& tp) {
  std::vector<std::vector<StageCost>> out(p.stage_count());
  for (size_t s = 0; s < p.stage_count(); ++s) {
    // A capacity factor that drops token copies scales the experts' work by the copies kept
    // (expert_loads), which only the grouped costing applies: a stage of MoE blocks takes it at
    // t = ep = 1 too.
    const bool dropping = tp.moe.capacity_factor > 0 && kept_copies(w, p.stage(s), tp.moe) < 1;
    auto r = p.stage(s).grouped() || dropping
                 ? tp_stage_costs(w, c, p, s, micro_batch_size, recompute, tp)
                 : plain_stage_costs(w, c, p, s, micro_batch_size, recompute, tp);
    if (!r) return r.error();
    out[s] = std::move(*r);
  }
  if (Status st = add_tied_copies(w, p, tp, out); !st) return st.error();
  return out;
}

}  // namespace pipegrid
