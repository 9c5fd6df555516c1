#include "core/planners/search3d.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <thread>

#include "core/evaluate.h"
#include "core/model_flops.h"
#include "core/moe.h"
#include "core/strategy.h"
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

// Ascending; in O(sqrt n) steps, and without overflow at n = INT_MAX (i <= n ran i past it).
std::vector<int> divisors(int n) {
  std::vector<int> low, high;
  for (int i = 1; i <= n / i; ++i)
    if (n % i == 0) {
      low.push_back(i);
      if (i != n / i) high.push_back(n / i);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

bool allowed(const std::vector<int>& list, int x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

// The first clause of an error message, so that reasons group (numbers after the first ':' vary).
std::string reason_of(const std::string& message) {
  const size_t cut = message.find(" (");
  return message.substr(0, std::min<size_t>(cut, 160));
}

}  // namespace

std::string Search3dCandidate::label() const {
  std::string sched = schedule;
  if (schedule == "interleaved-1f1b") sched = fmt::format("interleaved v{}", v);
  if (uneven) sched += " uneven";
  if (!layout.empty()) sched += " layout";
  const std::string experts = moe ? fmt::format(" ep{} etp{}", ep, etp) : "";
  const std::string context = cp > 1 ? fmt::format(" cp{}", cp) : "";
  return fmt::format(
      "t{}{} p{} d{}{} b{} m{} {} {}{}{}{}{}", t, context, p, d, experts, b, micro_batches, sched,
      to_string(recompute), sequence_parallel ? " sp" : "", distributed_optimizer ? " dist-opt" : "",
      moe ? fmt::format(" {}{}", to_string(dispatcher), moe_overlap ? " a2a-overlap" : "") : "",
      cp > 1 ? fmt::format(" {}", to_string(cp_algorithm)) : "");
}

namespace {
// Sets every field a candidate decides; the rest stay the base's.
void apply(Experiment& e, const Search3dCandidate& c) {
  StrategySpec& s = e.strategy;
  s.planner.clear();
  s.partitioner = "megatron";
  s.schedule = c.schedule;
  s.schedule_given = true;
  s.micro_batches = c.micro_batches;
  s.mini_batch = 0;
  s.stages = c.p;
  s.chunks = c.v;
  s.replicas = c.d;
  s.tensor_parallel = c.t;
  s.sequence_parallel = c.sequence_parallel;
  e.memory.recompute = c.recompute;
  e.memory.zero1 = c.distributed_optimizer;
  e.micro_batch_size = static_cast<double>(c.b) * c.d;
  s.context_parallel = c.cp;
  if (c.cp > 1) s.context.algorithm = c.cp_algorithm;
  s.partitioner_options.megatron = search3d_split(c);
  if (c.moe) {
    s.expert_parallel = c.ep;
    s.expert_tensor_parallel = c.etp;
    s.moe.dispatcher = c.dispatcher;
    s.moe_overlap = c.moe_overlap;
  }
}
}  // namespace

MegatronSplit search3d_split(const Search3dCandidate& c) {
  MegatronSplit s;
  s.account_for_embedding = s.account_for_loss = c.uneven;
  s.layout = c.layout;
  return s;
}

std::string search3d_layout(int blocks, int mtp, int stages) {
  const int slots = blocks + 2 + mtp;
  if (stages < 2 || slots < stages) return "";
  std::vector<int> share(static_cast<size_t>(stages), slots / stages);
  int extra = slots % stages;  // below `stages`: the middle stages' and then the first's
  for (int s = 1; s + 1 < stages && extra > 0; ++s, --extra) ++share[static_cast<size_t>(s)];
  share.front() += extra;
  if (share.back() < 1 + mtp) return "";
  std::string out;
  for (int s = 0; s < stages; ++s) {
    const bool first = s == 0, last = s == stages - 1;
    const int t = share[static_cast<size_t>(s)] - first - (last ? 1 + mtp : 0);
    out += first ? "E" : "|";
    out += t == 1 ? std::string("t") : t > 1 ? fmt::format("t*{}", t) : std::string();
    if (last) out += std::string(static_cast<size_t>(mtp), 'm') + "L";
  }
  return out;
}

Experiment search3d_experiment(const Experiment& base, const Search3dCandidate& c) {
  Experiment e = base;
  apply(e, c);
  return e;
}

namespace {

// One search: the checks, the enumeration of the axes (with every combination left out counted by
// reason), the ranking by the estimate or the whole graph, and the order.
class Search3d {
 public:
  Search3d(const Experiment& base, const Search3dOptions& o)
      : base_(base), o_(o), w_(base.workload), cl_(base.cluster), n_(static_cast<int>(cl_.devices.size())) {}

  Result<Search3dResult> run() {
    if (Status s = check(); !s) return s.error();
    if (Status s = model_shape(); !s) return s.error();
    res_.parameters = total_parameters(w_);
    if (experts_ > 0)  // 6 N counts the parameters a token uses
      if (const std::optional<ModelFlops> f = model_flops(w_)) res_.parameters = f->active_parameters;
    res_.tokens_per_iteration = o_.global_batch * sequence_;
    res_.peak_flops = cl_.devices[0].spec.peak_flops[static_cast<int>(math_precision(w_.precision))];
    enumerate();
    if (o_.exact)
      rank_exact();
    else
      rank_estimated();
    std::stable_sort(ranked_.begin(), ranked_.end(), [](const auto& a, const auto& b) {
      if (a.second.iteration_time_s != b.second.iteration_time_s)
        return a.second.iteration_time_s < b.second.iteration_time_s;
      return a.second.peak_memory_bytes < b.second.peak_memory_bytes;
    });
    for (auto& [i, c] : ranked_) res_.ranked.push_back(std::move(c));
    return std::move(res_);
  }

 private:
  Status check() const;
  Status model_shape();
  std::string divides(int t, bool sp) const;
  void enumerate();
  bool cp_allowed(int cp) const;
  std::optional<std::string> tpd_left_out(int t, int p, int d) const;
  void enumerate_configurations(int t, int cp, int p, int d);
  // A context-parallel configuration and why the blocks rule it out (empty: they allow it).
  struct ContextConfiguration {
    int cp = 1;
    CpAlgorithm algorithm = CpAlgorithm::P2P;
    std::string left_out;
  };
  std::vector<ContextConfiguration> context_configurations(int t, int cp) const;
  std::optional<std::string> left_out(const Search3dCandidate& c, bool sp_ok) const;
  std::vector<Search3dCandidate> expert_configurations(int devices) const;
  std::optional<std::string> expert_left_out(const Search3dCandidate& c) const;
  void rank(Search3dCandidate& c, double time, double peak, const TimeBreakdown& breakdown);
  void rank_estimated();
  void rank_exact();

  const Experiment& base_;
  const Search3dOptions& o_;
  const Workload& w_;
  const Cluster& cl_;
  const int n_;
  int blocks_ = 0, mtp_ = 0, per_node_ = 0;  // mtp_: multi-token-prediction modules
  // Mixture of experts: the routed experts (0: a dense workload) and the MoE blocks.
  double experts_ = 0;
  std::vector<int> moe_layers_;
  double sequence_ = 0;
  Search3dResult res_;
  std::vector<Search3dCandidate> pending_;
  std::vector<std::pair<size_t, Search3dCandidate>> ranked_;  // enumeration index, candidate
};

Status Search3d::check() const {
  if (o_.global_batch < 1)
    return Error{fmt::format("the global batch must be at least 1, got {}", o_.global_batch)};
  if (n_ == 0) return Error{"the cluster has no devices"};
  for (int i = 1; i < n_; ++i)
    if (!same_device(cl_.devices[i].spec, cl_.devices[0].spec))
      return Error{fmt::format(
          "the 3D search needs a homogeneous cluster; device \"{}\" ({}) differs from \"{}\" ({})",
          cl_.devices[i].name, cl_.devices[i].spec.kind, cl_.devices[0].name, cl_.devices[0].spec.kind)};
  if (!o_.exact && base_.strategy.allreduce == AllReduceAlgorithm::Hierarchical)
    return Error{
        "the 3D search's one-replica estimate times ring, multi-ring, tree and nccl data-parallel "
        "all-reduces, "
        "not allreduce: hierarchical; rank with --exact-ranking (the whole graph) or choose another"};
  for (const std::string& s : o_.schedules)
    if (s != "1f1b" && s != "interleaved-1f1b" && s != "zb-h1" && s != "zb-h2" && s != "dualpipe" &&
        s != "dualpipev")
      return Error{fmt::format(
          "the 3D search knows schedules 1f1b, interleaved-1f1b, zb-h1, zb-h2, dualpipe and dualpipev, not "
          "\"{}\"",
          s)};
  return {};
}

// The transformer blocks, their sequence length, and the devices of a node.
Status Search3d::model_shape() {
  for (size_t l = 0; l < w_.layer_count(); ++l) {
    const TensorSplit& split = w_.layer(static_cast<int>(l)).split;
    if (!is_block(split.kind)) continue;
    blocks_ += is_layout_block(w_.layer(static_cast<int>(l)));  // a multi-token-prediction block: not split
    mtp_ += w_.layer(static_cast<int>(l)).multi_token_prediction;
    sequence_ = split.sequence;
    if (split.kind == TensorSplitKind::MoeBlock) moe_layers_.push_back(static_cast<int>(l));
  }
  experts_ = routed_experts(w_);
  if (experts_ == 0 && (!o_.expert_parallel.empty() || !o_.expert_tensor_parallel.empty()))
    return Error{
        fmt::format("expert-parallel sizes were given (--ep, --etp), and workload \"{}\" has no "
                    "mixture-of-experts blocks",
                    w_.name)};
  if (experts_ > 0 && o_.dispatchers.empty()) return Error{"no token dispatcher to search"};
  for (int ep : o_.expert_parallel)
    if (experts_ > 0 && (ep < 1 || std::fmod(experts_, ep) != 0))
      return Error{
          fmt::format("--ep {} does not divide the {:g} routed experts of workload \"{}\" (each "
                      "device holds E / ep)",
                      ep, experts_, w_.name)};
  if (blocks_ == 0)
    return Error{
        fmt::format("the 3D search splits transformer blocks, and workload \"{}\" has none", w_.name)};
  for (int i = 0; i < n_; ++i) per_node_ += cl_.machine_of(i) == cl_.machine_of(0);
  return {};
}

// Megatron's divisibility rules for t, with and without SP: tensor_parallel_layer checks them. Empty
// when t passes, else why not.
std::string Search3d::divides(int t, bool sp) const {
  for (size_t l = 0; l < w_.layer_count(); ++l) {
    const Layer& layer = w_.layer(static_cast<int>(l));
    if (layer.split.kind == TensorSplitKind::Undefined) continue;
    Result<TpLayer> r = tensor_parallel_layer(layer, t, {sp, false}, w_.precision);
    if (!r) return r.error().message;
  }
  return "";
}

void Search3d::enumerate() {
  for (int t : divisors(n_)) {
    if (!allowed(o_.tensor_parallel, t)) continue;
    for (int cp : divisors(n_ / t)) {
      if (!cp_allowed(cp)) continue;
      for (int p : divisors(n_ / t / cp)) {
        if (!allowed(o_.pipeline, p)) continue;
        const int d = n_ / t / cp / p;
        if (std::optional<std::string> why = tpd_left_out(t, p, d)) {
          ++res_.left_out[*why];
          continue;
        }
        enumerate_configurations(t, cp, p, d);
      }
    }
  }
}

// The cp axis: the sizes given, or 1 and every cp > 1 leaving each rank kSearch3dCpMinTokens tokens.
bool Search3d::cp_allowed(int cp) const {
  if (!o_.context_parallel.empty()) return allowed(o_.context_parallel, cp);
  return cp == 1 || sequence_ / cp >= kSearch3dCpMinTokens;
}

// The context-parallel configurations of (t, cp): one per algorithm for cp > 1 (those the blocks do
// not allow say why, counted once per combination they would have made), one for cp = 1.
namespace {

// The reason a check_context_parallel message gives, for counting (numbers and layer names dropped).
std::string context_left_out(const std::string& message, CpAlgorithm a) {
  if (message.find("no defined split") != std::string::npos)
    return "CP: a layer has no defined split of the sequence (a convolution, recurrent or custom layer)";
  if (message.find("sliding-window") != std::string::npos)
    return "CP: sliding-window attention is not modelled under context parallelism";
  if (message.find("does not split its sequence") != std::string::npos)
    return fmt::format("CP: cp does not split the sequence as {} needs", to_string(a));
  if (message.find("per device") != std::string::npos)
    return fmt::format("CP: cp does not divide the heads per device ({} scatters them)", to_string(a));
  return "CP: " + reason_of(message);
}

}  // namespace

std::vector<Search3d::ContextConfiguration> Search3d::context_configurations(int t, int cp) const {
  if (cp == 1) return {ContextConfiguration{}};
  std::vector<ContextConfiguration> out;
  for (CpAlgorithm a : o_.cp_algorithms) {
    ContextParallelOptions co = base_.strategy.context;
    co.algorithm = a;
    std::string why;
    if (a == CpAlgorithm::AllToAll && !co.load_balance)  // the experiment loader refuses the pair
      why =
          "CP: a2a beside the base's cp_load_balance false (a2a splits the sequence evenly; Megatron "
          "and run refuse the pair)";
    for (size_t l = 0; l < w_.layer_count() && why.empty(); ++l)
      if (Status st = check_context_parallel(w_.layer(static_cast<int>(l)), t, cp, co); !st)
        why = context_left_out(st.error().message, a);
    out.push_back({cp, a, std::move(why)});
  }
  return out;
}

std::optional<std::string> Search3d::tpd_left_out(int t, int p, int d) const {
  if (t > per_node_) return fmt::format("(t, p, d): t above the {} devices of a node", per_node_);
  // (MoE blocks need sequence parallelism under t > 1: checked with it.)
  if (t > 1 && !divides(t, experts_ > 0).empty())
    return "(t, p, d): t does not divide the heads, KV heads or FFN width";
  if (p > blocks_ + 2 + mtp_)
    return fmt::format(
        "(t, p, d): p above the {} transformer blocks with the embedding, the loss and the MTP modules "
        "as one more each (a stage would hold nothing)",
        blocks_);
  if (o_.global_batch % d != 0) return "(t, p, d): d does not divide the global batch";
  return std::nullopt;
}

// Every micro-batch size, schedule (and interleaving), recomputation, sequence parallelism and
// optimizer sharding of one (t, p, d).
void Search3d::enumerate_configurations(int t, int cp, int p, int d) {
  const bool sp_ok = t > 1 && divides(t, true).empty();
  const std::vector<Search3dCandidate> experts = expert_configurations(t * cp * d);
  const std::vector<ContextConfiguration> contexts = context_configurations(t, cp);
  for (int b : divisors(o_.global_batch / d)) {
    if (!allowed(o_.micro_batch_sizes, b)) continue;
    const int m = o_.global_batch / (b * d);
    for (const std::string& sched : o_.schedules) {
      std::vector<int> vs{1};
      if (sched == "interleaved-1f1b") vs = o_.chunks;
      if (sched == "dualpipev") vs = {2};  // two chunks per rank, in a V
      for (int v : vs) {
        // Uneven: the embedding and the loss count as blocks where that fits, else a layout.
        const bool uneven = blocks_ % (p * v) != 0 && (blocks_ + 2) % (p * v) == 0 && p > 1;
        const std::string layout =
            blocks_ % (p * v) != 0 && !uneven ? search3d_layout(blocks_, mtp_, p * v) : std::string();
        for (Recompute rc : o_.recompute)
          for (bool sp : o_.sequence_parallel)
            for (bool zero : o_.distributed_optimizer)
              for (const ContextConfiguration& x : contexts)
                for (Search3dCandidate c : experts) {
                  ++res_.combinations;
                  c.t = t, c.p = p, c.d = d, c.b = b, c.micro_batches = m, c.schedule = sched, c.v = v;
                  c.uneven = uneven, c.layout = layout;
                  c.recompute = rc, c.sequence_parallel = sp, c.distributed_optimizer = zero;
                  c.cp = x.cp, c.cp_algorithm = x.algorithm;
                  std::optional<std::string> why = left_out(c, sp_ok);
                  if (!why && !x.left_out.empty()) why = x.left_out;
                  if (!why && c.moe) why = expert_left_out(c);
                  if (why)
                    ++res_.left_out[*why];
                  else
                    pending_.push_back(std::move(c));
                }
      }
    }
  }
}

std::optional<std::string> Search3d::left_out(const Search3dCandidate& c, bool sp_ok) const {
  // The estimate builds one replica's pipeline: a global batch of 2^31 - 1 at b 1 hung the search.
  if (3.0 * c.micro_batches * c.p * c.v > static_cast<double>(kMaxSweepTasks))
    return "more than 2^25 compute tasks in one replica's pipeline (micro-batches x stages x 3 passes; "
           "docs/limits.md)";
  if (blocks_ % (c.p * c.v) != 0 && !c.uneven && c.layout.empty())
    return "p x v: no even split, accounted split or layout places the blocks (a stage would hold nothing)";
  if (c.schedule == "interleaved-1f1b") {
    if (c.p < 2) return "interleaved-1f1b with p = 1 (no pipeline to interleave)";
    if (c.micro_batches % c.p != 0)
      return "interleaved-1f1b: p does not divide the micro-batches (Megatron's rule)";
  }
  if (c.schedule == "dualpipe" || c.schedule == "dualpipev")
    if (dual_pipeline_refusal(c.schedule, c.p, c.micro_batches))
      return c.schedule == "dualpipe"
                 ? "dualpipe: p or the micro-batches odd, or fewer than 2p micro-batches (DeepSeek's "
                   "reference "
                   "asserts it)"
                 : "dualpipev: fewer than 2p micro-batches (DeepSeek's reference asserts it)";
  if (c.sequence_parallel && c.t == 1) return "sequence parallelism at t = 1 (the same run as without)";
  if (c.sequence_parallel && !sp_ok) return "sequence parallelism: t does not divide the sequence";
  // It shards the dense state over the dp x cp group, as Megatron's, and the experts' over their
  // expert data-parallel group of t x cp x d / (ep x etp) devices, which d = cp = 1 does not empty.
  if (c.distributed_optimizer && c.d * c.cp == 1 && !(c.moe && c.t > c.ep * c.etp))
    return c.moe ? "distributed optimizer at d = cp = 1 and ep x etp = t (the same run as without)"
                 : "distributed optimizer at d = cp = 1 (the same run as without)";
  return std::nullopt;
}

// The expert axes of one (t, d): every (ep, etp, dispatcher) of the options (empty lists: ep dividing
// the experts, etp dividing the expert FFN width, both up to t x d); one dense candidate for a dense
// workload.
std::vector<Search3dCandidate> Search3d::expert_configurations(int devices) const {
  if (experts_ == 0) return {Search3dCandidate{}};
  std::vector<int> eps = o_.expert_parallel, etps = o_.expert_tensor_parallel;
  if (eps.empty())
    for (int ep : divisors(devices))
      if (std::fmod(experts_, ep) == 0) eps.push_back(ep);
  if (etps.empty()) etps = divisors(devices);
  std::vector<bool> overlaps = o_.moe_overlap;
  if (overlaps.empty()) overlaps = {base_.strategy.moe_overlap};
  std::vector<Search3dCandidate> out;
  for (int ep : eps)
    for (int etp : etps)
      for (MoeDispatcher disp : o_.dispatchers)
        for (bool overlap : overlaps) {
          Search3dCandidate& c = out.emplace_back();
          c.moe = true, c.ep = ep, c.etp = etp, c.dispatcher = disp, c.moe_overlap = overlap;
        }
  return out;
}

// Megatron-Core's rules for the expert sizes (MoE parallel folding) and the combinations that would
// repeat another. Empty when the candidate passes.
std::optional<std::string> Search3d::expert_left_out(const Search3dCandidate& c) const {
  if ((c.t * c.cp * c.d) % (c.ep * c.etp) != 0)
    return "MoE: ep x etp does not divide t x cp x d (a stage's devices)";
  if (c.etp > per_node_) return fmt::format("MoE: etp above the {} devices of a node", per_node_);
  MoeOptions moe = base_.strategy.moe;
  moe.dispatcher = c.dispatcher;
  for (int l : moe_layers_)
    if (Status st = check_moe(w_.layer(l), {c.ep, c.etp}, moe); !st) {
      const std::string& m = st.error().message;
      if (m.find("expert_parallel") != std::string::npos) return "MoE: ep does not divide the routed experts";
      if (m.find("expert_tensor_parallel") != std::string::npos)
        return "MoE: etp does not divide the expert FFN width";
      return "MoE: " + reason_of(m);
    }
  if (c.t > 1 && !c.sequence_parallel)
    return "MoE: t > 1 without sequence parallelism (Megatron-Core requires it with experts)";
  if (c.dispatcher == MoeDispatcher::AllGather && c.ep * c.etp == 1)
    return "MoE: the all-gather dispatcher at ep = etp = 1 (the same run as all-to-all)";
  if (c.dispatcher == MoeDispatcher::DeepEP && c.ep == 1)
    return "MoE: the deepep dispatcher at ep = 1 (the same run as all-to-all)";
  if (c.moe_overlap && moe_overlap_refusal(c.ep, c.dispatcher, c.p, c.schedule, c.micro_batches))
    return "MoE: moe.overlap outside Megatron-Core's rules (ep > 1; alltoall or deepep; interleaved-1f1b "
           "when p > 1) or with nothing to pair (one micro-batch; zb-h1 or zb-h2 at p = 1)";
  return std::nullopt;
}

void Search3d::rank(Search3dCandidate& c, double time, double peak, const TimeBreakdown& breakdown) {
  c.iteration_time_s = time;
  c.throughput_samples_per_s = time > 0 ? o_.global_batch / time : 0;
  c.mfu = res_.peak_flops > 0 && time > 0
              ? 6 * res_.parameters * res_.tokens_per_iteration / (time * n_ * res_.peak_flops)
              : 0;
  c.peak_memory_bytes = peak;
  c.breakdown = breakdown;
  ranked_.emplace_back(ranked_.size(), std::move(c));
}

// The estimates, on up to o.threads threads (each its own estimator: routes and caches are not
// shared); the calling thread takes every threads-th candidate and reports progress.
void Search3d::rank_estimated() {
  Search3dEstimator estimator(base_);
  const size_t threads =
      pending_.size() >= kSearch3dThreadedFrom ? static_cast<size_t>(std::max(1, o_.threads)) : 1;
  std::vector<std::optional<Result<Search3dEstimate>>> estimates(pending_.size());
  std::atomic<size_t> finished{0};
  auto work = [&](size_t first, Search3dEstimator& est, bool report) {
    for (size_t i = first; i < pending_.size(); i += threads) {
      estimates[i] = est.estimate(pending_[i]);
      const size_t now = ++finished;
      if (report && o_.progress) o_.progress(now, pending_.size());
    }
  };
  std::vector<std::thread> helpers;
  std::vector<std::unique_ptr<Search3dEstimator>> others;
  for (size_t k = 1; k < threads; ++k) others.push_back(std::make_unique<Search3dEstimator>(base_));
  for (size_t k = 1; k < threads; ++k) helpers.emplace_back(work, k, std::ref(*others[k - 1]), false);
  work(0, estimator, true);
  for (std::thread& h : helpers) h.join();
  if (threads > 1 && o_.progress) o_.progress(pending_.size(), pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    Search3dCandidate& c = pending_[i];
    const Result<Search3dEstimate>& est = *estimates[i];
    if (!est) {
      ++res_.left_out["not lowered: " + reason_of(est.error().message)];
      continue;
    }
    if (est->lowered) ++res_.evaluated;
    if (!est->lowered)
      ++res_.left_out
            ["does not fit device memory (static memory + one micro-batch's activations, before "
             "lowering)"];
    else if (!est->fits)
      ++res_.left_out["does not fit device memory"];
    else
      rank(c, est->iteration_time_s, est->peak_memory_bytes, est->breakdown);
  }
}

// Every candidate's whole graph, lowered and run by the analytic evaluator.
void Search3d::rank_exact() {
  Experiment e = base_;  // one working copy, its strategy set per candidate
  size_t done = 0;
  for (Search3dCandidate& c : pending_) {
    ++done;
    apply(e, c);
    Result<PreparedRun> run = prepare(e);
    if (run) {
      ++res_.evaluated;
      Result<Timeline> tl = evaluate(run->graph, e.cluster);
      if (!tl) {
        ++res_.left_out["the analytic evaluator failed: " + reason_of(tl.error().message)];
      } else {
        const Metrics m = compute_metrics(e.cluster, run->graph, *tl);
        if (!m.feasible()) {
          ++res_.left_out["does not fit device memory"];
        } else {
          double peak = 0;
          for (const DeviceMetrics& dm : m.devices) peak = std::max(peak, dm.peak_memory_bytes);
          rank(c, m.iteration_time_s, peak, m.breakdown);
        }
      }
    } else {
      ++res_.left_out["not lowered: " + reason_of(run.error().message)];
    }
    if (o_.progress) o_.progress(done, pending_.size());
  }
}

}  // namespace

Result<Search3dResult> search3d(const Experiment& base, const Search3dOptions& o) {
  return Search3d(base, o).run();
}

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  const size_t n = std::min(x.size(), y.size());
  if (n < 2) return 1;
  auto ranks = [n](const std::vector<double>& v) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return v[a] < v[b]; });
    std::vector<double> r(n);
    for (size_t i = 0; i < n;) {
      size_t j = i;
      while (j + 1 < n && v[idx[j + 1]] == v[idx[i]]) ++j;
      const double avg = (static_cast<double>(i) + static_cast<double>(j)) / 2 + 1;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = avg;
      i = j + 1;
    }
    return r;
  };
  const std::vector<double> rx = ranks(x), ry = ranks(y);
  const double mx = std::accumulate(rx.begin(), rx.end(), 0.0) / n,
               my = std::accumulate(ry.begin(), ry.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < n; ++i) {
    sxy += (rx[i] - mx) * (ry[i] - my);
    sxx += (rx[i] - mx) * (rx[i] - mx);
    syy += (ry[i] - my) * (ry[i] - my);
  }
  if (sxx == 0 || syy == 0) return sxx == syy ? 1 : 0;
  return sxy / std::sqrt(sxx * syy);
}

}  // namespace pipegrid
