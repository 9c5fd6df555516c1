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
#include "core/tensor_parallel.h"

namespace pipegrid {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) out.push_back(i);
  return out;
}

bool allowed(const std::vector<int>& list, int x) {
  return list.empty() || std::find(list.begin(), list.end(), x) != list.end();
}

bool same_device(const DeviceSpec& a, const DeviceSpec& b) {
  return a.kind == b.kind && a.memory_bytes == b.memory_bytes && a.peak_flops == b.peak_flops;
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
  return fmt::format("t{} p{} d{} b{} m{} {} {}{}{}", t, p, d, b, micro_batches, sched, to_string(recompute),
                     sequence_parallel ? " sp" : "", distributed_optimizer ? " dist-opt" : "");
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
}
}  // namespace

Experiment search3d_experiment(const Experiment& base, const Search3dCandidate& c) {
  Experiment e = base;
  apply(e, c);
  return e;
}

Result<Search3dResult> search3d(const Experiment& base, const Search3dOptions& o) {
  const Workload& w = base.workload;
  const Cluster& cl = base.cluster;
  if (o.global_batch < 1)
    return Error{fmt::format("the global batch must be at least 1, got {}", o.global_batch)};
  const int n = static_cast<int>(cl.devices.size());
  if (n == 0) return Error{"the cluster has no devices"};
  for (int i = 1; i < n; ++i)
    if (!same_device(cl.devices[i].spec, cl.devices[0].spec))
      return Error{fmt::format(
          "the 3D search needs a homogeneous cluster; device \"{}\" ({}) differs from \"{}\" ({})",
          cl.devices[i].name, cl.devices[i].spec.kind, cl.devices[0].name, cl.devices[0].spec.kind)};
  if (!o.exact && base.strategy.allreduce == AllReduceAlgorithm::Hierarchical)
    return Error{
        "the 3D search's one-replica estimate times ring and multi-ring data-parallel all-reduces, not "
        "allreduce: hierarchical; rank with --exact-ranking (the whole graph) or choose ring or multi-ring"};
  for (const std::string& s : o.schedules)
    if (s != "1f1b" && s != "interleaved-1f1b" && s != "zb-h1" && s != "zb-h2")
      return Error{fmt::format(
          "the 3D search knows schedules 1f1b, interleaved-1f1b, zb-h1 and zb-h2, not \"{}\"", s)};
  int blocks = 0;
  double sequence = 0;
  for (size_t l = 0; l < w.layer_count(); ++l)
    if (w.layer(static_cast<int>(l)).split.kind == TensorSplitKind::Transformer) {
      ++blocks;
      sequence = w.layer(static_cast<int>(l)).split.sequence;
    }
  if (blocks == 0)
    return Error{
        fmt::format("the 3D search splits transformer blocks, and workload \"{}\" has none", w.name)};
  int per_node = 0;
  for (int i = 0; i < n; ++i) per_node += cl.machine_of(i) == cl.machine_of(0);

  Search3dResult res;
  res.parameters = total_parameters(w);
  res.tokens_per_iteration = o.global_batch * sequence;
  res.peak_flops = cl.devices[0].spec.peak_flops[static_cast<int>(math_precision(w.precision))];

  // Megatron's divisibility rules for t, with and without SP: tensor_parallel_layer checks them.
  auto divides = [&](int t, bool sp) -> std::string {
    for (size_t l = 0; l < w.layer_count(); ++l) {
      const Layer& layer = w.layer(static_cast<int>(l));
      if (layer.split.kind == TensorSplitKind::Undefined) continue;
      Result<TpLayer> r = tensor_parallel_layer(layer, t, {sp, false}, w.precision);
      if (!r) return r.error().message;
    }
    return "";
  };

  std::vector<Search3dCandidate> pending;
  for (int t : divisors(n)) {
    if (!allowed(o.tensor_parallel, t)) continue;
    for (int p : divisors(n / t)) {
      if (!allowed(o.pipeline, p)) continue;
      const int d = n / t / p;
      if (t > per_node) {
        ++res.left_out[fmt::format("(t, p, d): t above the {} devices of a node", per_node)];
        continue;
      }
      if (t > 1 && !divides(t, false).empty()) {
        ++res.left_out["(t, p, d): t does not divide the heads, KV heads, FFN width or vocabulary"];
        continue;
      }
      if (blocks % p != 0) {
        ++res.left_out[fmt::format("(t, p, d): p does not divide the {} transformer blocks", blocks)];
        continue;
      }
      if (o.global_batch % d != 0) {
        ++res.left_out["(t, p, d): d does not divide the global batch"];
        continue;
      }
      const bool sp_ok = t > 1 && divides(t, true).empty();
      for (int b : divisors(o.global_batch / d)) {
        if (!allowed(o.micro_batch_sizes, b)) continue;
        const int m = o.global_batch / (b * d);
        for (const std::string& sched : o.schedules) {
          std::vector<int> vs{1};
          if (sched == "interleaved-1f1b") vs = o.chunks;
          for (int v : vs)
            for (Recompute rc : o.recompute)
              for (bool sp : o.sequence_parallel)
                for (bool zero : o.distributed_optimizer) {
                  ++res.combinations;
                  if (sched == "interleaved-1f1b") {
                    if (p < 2) {
                      ++res.left_out["interleaved-1f1b with p = 1 (no pipeline to interleave)"];
                      continue;
                    }
                    if (blocks % (p * v) != 0) {
                      ++res.left_out["interleaved-1f1b: p x v does not divide the transformer blocks"];
                      continue;
                    }
                    if (m % p != 0) {
                      ++res.left_out
                            ["interleaved-1f1b: p does not divide the micro-batches (Megatron's rule)"];
                      continue;
                    }
                  }
                  if (sp && t == 1) {
                    ++res.left_out["sequence parallelism at t = 1 (the same run as without)"];
                    continue;
                  }
                  if (sp && !sp_ok) {
                    ++res.left_out["sequence parallelism: t does not divide the sequence"];
                    continue;
                  }
                  if (zero && d == 1) {
                    ++res.left_out["distributed optimizer at d = 1 (the same run as without)"];
                    continue;
                  }
                  Search3dCandidate c;
                  c.t = t, c.p = p, c.d = d, c.b = b, c.micro_batches = m, c.schedule = sched, c.v = v;
                  c.recompute = rc, c.sequence_parallel = sp, c.distributed_optimizer = zero;
                  pending.push_back(std::move(c));
                }
        }
      }
    }
  }

  Experiment e = base;  // one working copy, its strategy set per candidate (exact ranking)
  std::optional<Search3dEstimator> estimator;
  if (!o.exact) estimator.emplace(base);
  size_t done = 0;
  std::vector<std::pair<size_t, Search3dCandidate>> ranked;  // enumeration index, candidate
  auto rank = [&](Search3dCandidate& c, double time, double peak, const TimeBreakdown& breakdown) {
    c.iteration_time_s = time;
    c.throughput_samples_per_s = time > 0 ? o.global_batch / time : 0;
    c.mfu = res.peak_flops > 0 && time > 0
                ? 6 * res.parameters * res.tokens_per_iteration / (time * n * res.peak_flops)
                : 0;
    c.peak_memory_bytes = peak;
    c.breakdown = breakdown;
    ranked.emplace_back(ranked.size(), std::move(c));
  };
  if (!o.exact) {
    // The estimates, on up to o.threads threads (each its own estimator: routes and caches are not
    // shared); the calling thread takes every threads-th candidate and reports progress.
    const size_t threads =
        pending.size() >= kSearch3dThreadedFrom ? static_cast<size_t>(std::max(1, o.threads)) : 1;
    std::vector<std::optional<Result<Search3dEstimate>>> estimates(pending.size());
    std::atomic<size_t> finished{0};
    auto work = [&](size_t first, Search3dEstimator& est, bool report) {
      for (size_t i = first; i < pending.size(); i += threads) {
        estimates[i] = est.estimate(pending[i]);
        const size_t now = ++finished;
        if (report && o.progress) o.progress(now, pending.size());
      }
    };
    std::vector<std::thread> helpers;
    std::vector<std::unique_ptr<Search3dEstimator>> others;
    for (size_t k = 1; k < threads; ++k) others.push_back(std::make_unique<Search3dEstimator>(base));
    for (size_t k = 1; k < threads; ++k) helpers.emplace_back(work, k, std::ref(*others[k - 1]), false);
    work(0, *estimator, true);
    for (std::thread& h : helpers) h.join();
    if (threads > 1 && o.progress) o.progress(pending.size(), pending.size());
    for (size_t i = 0; i < pending.size(); ++i) {
      Search3dCandidate& c = pending[i];
      const Result<Search3dEstimate>& est = *estimates[i];
      if (!est) {
        ++res.left_out["not lowered: " + reason_of(est.error().message)];
      } else {
        if (est->lowered) ++res.evaluated;
        if (!est->lowered)
          ++res.left_out
                ["does not fit device memory (static memory + one micro-batch's activations, before "
                 "lowering)"];
        else if (!est->fits)
          ++res.left_out["does not fit device memory"];
        else
          rank(c, est->iteration_time_s, est->peak_memory_bytes, est->breakdown);
      }
    }
  }
  for (Search3dCandidate& c : pending) {
    if (!o.exact) break;
    ++done;
    apply(e, c);
    Result<PreparedRun> run = prepare(e);
    if (run) {
      ++res.evaluated;
      Result<Timeline> tl = evaluate(run->graph, e.cluster);
      if (!tl) {
        ++res.left_out["the analytic evaluator failed: " + reason_of(tl.error().message)];
      } else {
        const Metrics m = compute_metrics(e.cluster, run->graph, *tl);
        if (!m.feasible()) {
          ++res.left_out["does not fit device memory"];
        } else {
          double peak = 0;
          for (const DeviceMetrics& dm : m.devices) peak = std::max(peak, dm.peak_memory_bytes);
          rank(c, m.iteration_time_s, peak, m.breakdown);
        }
      }
    } else {
      ++res.left_out["not lowered: " + reason_of(run.error().message)];
    }
    if (o.progress) o.progress(done, pending.size());
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
    if (a.second.iteration_time_s != b.second.iteration_time_s)
      return a.second.iteration_time_s < b.second.iteration_time_s;
    return a.second.peak_memory_bytes < b.second.peak_memory_bytes;
  });
  for (auto& [i, c] : ranked) res.ranked.push_back(std::move(c));
  return res;
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
