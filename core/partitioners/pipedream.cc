#include "core/partitioners/pipedream.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "core/strategy.h"

namespace pipegrid {
namespace {

// Transitive reachability over the planning graph, as bitsets.
class Bits {
 public:
  Bits(size_t n) : words_((n + 63) / 64), data_(n * words_, 0) {}
  bool get(size_t row, size_t col) const { return data_[row * words_ + col / 64] >> (col % 64) & 1; }
  void set(size_t row, size_t col) { data_[row * words_ + col / 64] |= uint64_t{1} << (col % 64); }
  void merge(size_t row, size_t from) {
    for (size_t k = 0; k < words_; ++k) data_[row * words_ + k] |= data_[from * words_ + k];
  }

 private:
  size_t words_;
  std::vector<uint64_t> data_;
};

// The planning graph: the workload without "Input" sources and "__getitem__" sinks.
struct Graph {
  size_t n = 0;
  std::vector<char> alive;
  std::vector<std::vector<int>> out, in;
  std::vector<int> topo;  // alive nodes, topological
  Bits pred{0}, succ{0};  // strict transitive predecessors / successors

  void compute_reachability() {
    // Kahn's order over alive nodes.
    std::vector<int> indeg(n, 0);
    for (size_t v = 0; v < n; ++v)
      if (alive[v]) indeg[v] = static_cast<int>(in[v].size());
    std::deque<int> q;
    for (size_t v = 0; v < n; ++v)
      if (alive[v] && indeg[v] == 0) q.push_back(static_cast<int>(v));
    while (!q.empty()) {
      int u = q.front();
      q.pop_front();
      topo.push_back(u);
      for (int v : out[u])
        if (--indeg[v] == 0) q.push_back(v);
    }
    pred = Bits(n);
    succ = Bits(n);
    for (int v : topo)
      for (int u : in[v]) {
        pred.set(v, u);
        pred.merge(v, u);
      }
    for (auto it = topo.rbegin(); it != topo.rend(); ++it)
      for (int w : out[*it]) {
        succ.set(*it, w);
        succ.merge(*it, w);
      }
  }
};

using Antichain = std::vector<int>;

Antichain key_of(Antichain a) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}

class AntichainBuilder {
 public:
  explicit AntichainBuilder(const Graph& g) : g_(g) {}

  // PipeDream's augmentation: the antichain plus every predecessor of one of its nodes that feeds a
  // node outside that node's predecessors (its output is still needed after the cut).
  const Antichain& augment(const Antichain& a) {
    const Antichain key = key_of(a);
    if (auto it = augmented_.find(key); it != augmented_.end()) return it->second;
    std::vector<char> extra(g_.n, 0);
    for (int x : a)
      for (int p : g_.topo)
        if (g_.pred.get(x, p))
          for (int o : g_.out[p])
            if (!g_.pred.get(x, o) && o != x) extra[p] = 1;
    Antichain out;
    for (size_t v = 0; v < g_.n; ++v)
      if (extra[v]) out.push_back(static_cast<int>(v));
    out.insert(out.end(), a.begin(), a.end());
    return augmented_.emplace(key, std::move(out)).first->second;
  }

  // Drops every node that has a successor in the list (keeps the order, drops duplicates).
  Antichain deaugment(const Antichain& l) const {
    Antichain out;
    for (int x : l) {
      bool dominated = false;
      for (int y : l)
        if (g_.succ.get(x, y)) dominated = true;
      if (!dominated && std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
    }
    return out;
  }

  std::vector<Antichain> next(const Antichain& a) {
    const Antichain aug = augment(a);  // a copy: augment() may rehash
    std::vector<Antichain> out;
    for (int x : aug)
      for (int n : g_.out[x]) {
        if (std::find(a.begin(), a.end(), n) != a.end()) continue;
        bool ok = true;
        for (int y : aug)
          if (g_.succ.get(n, y)) ok = false;
        if (!ok) continue;
        Antichain replaced = aug;
        for (int& y : replaced)
          if (y == x) y = n;
        out.push_back(deaugment(replaced));
      }
    return out;
  }

 private:
  const Graph& g_;
  std::map<Antichain, Antichain> augmented_;
};

struct Entry {
  double time = std::numeric_limits<double>::quiet_NaN();  // NaN: none
  int split_k = -1, split_m = -1;                          // -1: no split (one stage)
  int machines = 0;
  bool has() const { return !std::isnan(time); }
};

// Sums over states i..j of compute, activations and parameters, from prefix sums (i in 0..S,
// j in 0..S-1; NaN for none). Row i >= 1 covers states i..j, row 0 everything up to j.
struct Sums {
  std::vector<double> ct, act, par;  // per state: the sum over the layers it covers
  // A layer tied to another's weight (Layer::tied_to): per state, whether it covers the tied layer
  // and its source. A range with the tied layer but not its source keeps a copy of `bytes`, as the
  // lowering gives it (core/partition.h tied_copies); PipeDream's own profiles have no ties.
  struct Tie {
    std::vector<char> tied, source;
    double bytes = 0;
  };
  std::vector<Tie> ties;
  static double range(const std::vector<double>& v, size_t i, size_t j) {
    if (i == 0) return v[j];
    return j >= i ? v[j] - v[i - 1] : std::numeric_limits<double>::quiet_NaN();
  }
  double compute(size_t i, size_t j) const { return range(ct, i, j); }
  double activation(size_t i, size_t j) const { return range(act, i, j); }
  double parameters(size_t i, size_t j) const { return range(par, i, j) + tied_copy(i, j); }
  double tied_copy(size_t i, size_t j) const {
    double sum = 0;
    for (const Tie& t : ties) {
      const auto in = [&](const std::vector<char>& c) { return c[j] && !(i > 0 && c[i - 1]); };
      if (j >= i && in(t.tied) && !in(t.source)) sum += t.bytes;
    }
    return sum;
  }
};
using Table = std::vector<std::vector<double>>;

// One row of a level's programme: entry (j, m) for states up to j on m + 1 machines.
struct Row {
  size_t machines;
  std::vector<Entry> entries;
  Row(size_t states, size_t machines) : machines(machines), entries(states * machines) {}
  Entry& operator()(size_t j, size_t m) { return entries[j * machines + m]; }
  const Entry& operator()(size_t j, size_t m) const { return entries[j * machines + m]; }
};

// One level's dynamic programme, row by row: row i covers the states from i on (i = 0: from the
// start). Entries are PipeDream's (time, split, machines); a non-final level only needs each row's
// all-machines times, which become the next level's compute.
class Solver {
 public:
  // `many_rows`: keep the candidate lists for every state (worth it when most rows are solved).
  // `compute`, when given, replaces t.compute (a level above the innermost plans on the level
  // below's times).
  Solver(const PipeDreamOptions& o, const std::vector<double>& out_act,
         const std::vector<std::vector<int>>& preds, const std::vector<std::vector<char>>& pred_set,
         const Sums& t, const Table* compute, int machines, int machines_within, double bandwidth,
         bool many_rows, std::atomic<double>* steps)
      : steps_(steps),
        o_(o),
        out_act_(out_act),
        preds_(preds),
        pred_set_(pred_set),
        t_(t),
        table_(compute),
        S_(out_act.size()),
        M_(machines),
        within_(machines_within),
        bw_(bandwidth),
        max_mp_(o.straight ? 2 : machines) {
    if (!many_rows) return;
    last_.resize(S_);
    for (size_t j = 0; j < S_; ++j) last_[j] = candidates(j);
  }

  // Candidate last stages (states k + 1 .. j on mp machines), cheapest first, per mp. Every
  // candidate's pipeline time is at least its last stage's, so a scan can stop at the best found.
  std::vector<std::vector<std::pair<double, int>>> candidates(size_t j) const {
    std::vector<std::vector<std::pair<double, int>>> out(max_mp_);
    for (int mp = 1; mp < max_mp_; ++mp) {
      const double dp_factor = 4.0 * (mp - 1) / (bw_ * mp);
      auto& list = out[mp];
      if (!allowed(mp)) continue;  // no last stage on mp replicas: they would split samples
      list.reserve(preds_[j].size());
      for (int k : preds_[j]) {
        const double c = compute(k + 1, j);
        if (std::isnan(c)) continue;
        list.emplace_back((c + dp_factor * t_.parameters(k + 1, j)) / mp, k);
      }
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    return out;
  }

  // A(j, m) of row i.
  Row row(size_t i) const {
    Row A(S_, M_);
    for (size_t j = i; j < S_; ++j) {
      const double cum = compute(i, j);
      const int max_m = o_.straight ? 1 : M_;
      for (int m = 0; m < max_m; ++m) {
        if (!allowed(m + 1)) continue;
        const double stashed = std::ceil(static_cast<double>(M_ - (m + 1)) / (m + 1)) *
                               (t_.activation(i, j) + t_.parameters(i, j));
        if (o_.memory_constraint && stashed > o_.memory_bytes) continue;
        double dp = (4.0 * m * t_.parameters(i, j)) / (bw_ * (m + 1));
        dp /= within_;
        if (std::isnan(cum)) continue;
        A(j, m) = {(cum + dp) / (m + 1), -1, -1, m + 1};
      }
    }
    // Times mirrored in one flat array ([k * M + m]) for the inner loop's lookups.
    // None is +inf there: it never wins and never stops a scan.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> T(S_ * M_, inf);
    for (size_t j = i; j < S_; ++j)
      for (int m = 0; m < M_; ++m)
        if (A(j, m).has()) T[j * M_ + m] = A(j, m).time;
    std::vector<std::vector<std::pair<double, int>>> local;
    std::vector<int> open;  // the m still improvable by the rest of the list
    for (size_t j = i + 1; j < S_; ++j) {
      if (last_.empty()) local = candidates(j);
      const auto& lists = last_.empty() ? local : last_[j];
      double* best_t = &T[j * M_];
      for (int mp = 1; mp < max_mp_; ++mp) {
        // One pass over the candidates (cheapest last stage first) for every m at once; each m
        // sees the candidates in the same order as a pass of its own, so ties resolve the same.
        open.clear();
        for (int m = mp; m < M_; ++m) open.push_back(m);
        double counted = 0;
        for (const auto& [last, k] : lists[mp]) {
          size_t n = 0;
          for (int m : open)
            if (last < best_t[m]) open[n++] = m;
          open.resize(n);
          if (open.empty()) break;
          counted += static_cast<double>(n);
          if (i > 0 && pred_set_[i - 1][k]) continue;
          double floor = last;
          if (o_.activation_compression_ratio) {
            const double ratio = *o_.activation_compression_ratio;
            floor = std::max(floor, (2.0 * out_act_[k]) / (bw_ * mp) / ratio);
            if (j < S_ - 1) floor = std::max(floor, (2.0 * out_act_[j]) / (bw_ * mp) / ratio);
          }
          const double* before_t = &T[static_cast<size_t>(k) * M_];
          for (int m : open) {
            const double before = before_t[m - mp];
            if (o_.memory_constraint) {
              const double stashed = (t_.activation(k + 1, j) + t_.parameters(k + 1, j)) *
                                     std::ceil(static_cast<double>(M_ - (m + 1)) / mp);
              if (stashed > o_.memory_bytes) continue;
            }
            const double pipeline = std::max(before, floor);
            if (best_t[m] > pipeline) {
              best_t[m] = pipeline;
              A(j, m) = {pipeline, k, m - mp, mp};
            }
          }
        }
        // Over budget: stop (the caller reports it); the row is then incomplete and unused.
        if (steps_->fetch_add(counted) + counted > o_.max_steps) return A;
      }
    }
    return A;
  }

 private:
  std::atomic<double>* steps_;  // shared by every row of the search, whatever its thread
  const PipeDreamOptions& o_;
  const std::vector<double>& out_act_;
  const std::vector<std::vector<int>>& preds_;
  const std::vector<std::vector<char>>& pred_set_;
  double compute(size_t i, size_t j) const { return table_ ? (*table_)[i][j] : t_.compute(i, j); }
  bool allowed(int replicas) const {
    return !(o_.whole_samples_of > 0) || whole_samples_per_replica(o_.whole_samples_of, replicas);
  }

  const Sums& t_;
  const Table* table_;
  size_t S_;
  int M_, within_;
  double bw_;
  int max_mp_;
  std::vector<std::vector<std::vector<std::pair<double, int>>>> last_;  // [j][mp] -> (last stage time, k)
};

// The planning graph of a workload: without its "Input" sources (they go to the first stage and are
// not planned) and its "__getitem__" sinks (dropped, then given to the last stage).
struct PipeDreamPlanned {
  Graph g;
  std::vector<int> getitem;
  int first_source = -1;
};

Result<PipeDreamPlanned> planning_graph(const Workload& w) {
  PipeDreamPlanned p;
  Graph& g = p.g;
  g.n = w.layer_count();
  g.alive.assign(g.n, 1);
  g.out.resize(g.n);
  g.in.resize(g.n);
  for (size_t u = 0; u < g.n; ++u)
    for (auto [e, end] = boost::out_edges(u, w.graph); e != end; ++e) {
      const int v = static_cast<int>(boost::target(*e, w.graph));
      g.out[u].push_back(v);
      g.in[v].push_back(static_cast<int>(u));
    }
  auto remove = [&](int v) {
    g.alive[v] = 0;
    for (int x : g.out[v]) g.in[x].erase(std::find(g.in[x].begin(), g.in[x].end(), v));
    for (int x : g.in[v]) g.out[x].erase(std::find(g.out[x].begin(), g.out[x].end(), v));
    g.out[v].clear();
    g.in[v].clear();
  };
  std::vector<int> inputs;
  for (size_t v = 0; v < g.n; ++v)
    if (g.in[v].empty() && (w.layer(v).kind == "input" || w.layer(v).description.rfind("Input", 0) == 0))
      inputs.push_back(static_cast<int>(v));
  for (int v : inputs) remove(v);
  for (size_t v = 0; v < g.n; ++v)
    if (g.alive[v] && g.out[v].empty() && w.layer(v).description.rfind("__getitem__", 0) == 0)
      p.getitem.push_back(static_cast<int>(v));
  for (int v : p.getitem) remove(v);
  for (size_t v = 0; v < g.n && p.first_source < 0; ++v)
    if (g.alive[v] && g.in[v].empty()) p.first_source = static_cast<int>(v);
  if (p.first_source < 0) return Error{"pipedream: the model has no layer to plan"};
  g.compute_reachability();
  return p;
}

// The states planned over: for each, the layers it covers, the activations crossing its cut and its
// predecessor states.
struct States {
  std::vector<std::vector<char>> covers;
  std::vector<double> out_act;
  std::vector<std::vector<int>> preds;
};

// PipeDream's antichain DAG, breadth first from the first source: the augmented antichain of each
// node and its successors, and the nodes in the order PipeDream's graph gets them (edges added).
struct AntichainDag {
  std::vector<Antichain> augmented;
  std::vector<std::vector<int>> out;
  std::vector<int> insertion;
};

AntichainDag antichain_dag(const Graph& g, int first_source, size_t max_states) {
  AntichainBuilder builder(g);
  AntichainDag dag;
  std::map<Antichain, int> id;
  std::vector<char> inserted;
  auto node_of = [&](const Antichain& a) {
    Antichain key = key_of(a);
    auto it = id.find(key);
    if (it != id.end()) return it->second;
    const int n = static_cast<int>(dag.augmented.size());
    id.emplace(std::move(key), n);
    dag.augmented.push_back(builder.augment(a));
    dag.out.emplace_back();
    inserted.push_back(0);
    return n;
  };
  auto insert = [&](int n) {
    if (!inserted[n]) {
      inserted[n] = 1;
      dag.insertion.push_back(n);
    }
  };
  std::deque<Antichain> queue{{first_source}};
  node_of(queue.front());
  std::map<Antichain, char> expanded;
  while (!queue.empty() && dag.augmented.size() <= max_states) {
    Antichain a = queue.front();
    queue.pop_front();
    const Antichain key = key_of(a);
    if (expanded.count(key)) continue;
    expanded.emplace(key, 1);
    const int from = node_of(a);
    for (Antichain& next : builder.next(a)) {
      const int to = node_of(next);
      insert(from);
      insert(to);
      dag.out[from].push_back(to);
      queue.push_back(std::move(next));
    }
  }
  if (dag.insertion.empty()) dag.insertion.push_back(0);
  return dag;
}

// Topological order of the DAG as PipeDream's depth-first sort gives it (reverse post-order).
std::vector<int> dag_order(const AntichainDag& dag) {
  std::vector<int> order;
  std::vector<char> mark(dag.augmented.size(), 0);
  for (int root : dag.insertion) {
    if (mark[root]) continue;
    std::vector<std::pair<int, size_t>> stack{{root, 0}};
    mark[root] = 1;
    while (!stack.empty()) {
      auto& [v, next] = stack.back();
      if (next < dag.out[v].size()) {
        const int c = dag.out[v][next++];
        if (!mark[c]) {
          mark[c] = 1;
          stack.emplace_back(c, 0);
        }
      } else {
        order.push_back(v);
        stack.pop_back();
      }
    }
  }
  std::reverse(order.begin(), order.end());
  return order;
}

// The states of the antichain DAG, in dag_order: each covers every layer that precedes or is in its
// augmented antichain.
States antichain_states(const Graph& g, const AntichainDag& dag,
                        const std::vector<double>& activation_bytes) {
  const std::vector<int> order = dag_order(dag);
  const size_t S = order.size();
  std::vector<int> index(dag.augmented.size(), -1);
  for (size_t i = 0; i < S; ++i) index[order[i]] = static_cast<int>(i);
  States st;
  st.covers.assign(S, std::vector<char>(g.n, 0));
  st.out_act.assign(S, 0);
  for (size_t i = 0; i < S; ++i) {
    const Antichain& a = dag.augmented[order[i]];
    for (int x : a) st.out_act[i] += activation_bytes[x];
    for (int x : a) {
      st.covers[i][x] = 1;
      for (int p : g.topo)
        if (g.pred.get(x, p)) st.covers[i][p] = 1;
    }
  }
  // Transitive predecessors of each state in the antichain DAG.
  std::vector<std::vector<char>> reach(S, std::vector<char>(S, 0));
  for (size_t i = 0; i < S; ++i)
    for (int c : dag.out[order[i]]) {
      const int j = index[c];
      reach[j][i] = 1;
      for (size_t k = 0; k < S; ++k)
        if (reach[i][k]) reach[j][k] = 1;
    }
  st.preds.assign(S, {});
  for (size_t j = 0; j < S; ++j)
    for (size_t k = 0; k < S; ++k)
      if (reach[j][k]) st.preds[j].push_back(static_cast<int>(k));
  return st;
}

// The prefixes of the workload's topological order (ties by layer index) over the planned layers.
States linear_states(const Workload& w, const Graph& g, const std::vector<double>& activation_bytes) {
  std::vector<int> order;
  for (int v : topological_order(w))
    if (g.alive[v]) order.push_back(v);
  const size_t S = order.size();
  States st;
  st.covers.assign(S, std::vector<char>(g.n, 0));
  st.out_act.assign(S, 0);
  st.preds.assign(S, {});
  std::vector<char> in_prefix(g.n, 0);
  for (size_t k = 0; k < S; ++k) {
    in_prefix[order[k]] = 1;
    st.covers[k] = in_prefix;
    for (size_t x = 0; x <= k; ++x) {
      bool crosses = false;
      for (int o2 : g.out[order[x]]) crosses = crosses || !in_prefix[o2];
      if (crosses) st.out_act[k] += activation_bytes[order[x]];
    }
    for (size_t x = 0; x < k; ++x) st.preds[k].push_back(static_cast<int>(x));
  }
  return st;
}

// A range of states being split into stages, level by level from the outermost.
struct Range {
  size_t start, end;          // states [start, end)
  std::vector<int> replicas;  // per level above the current one, outermost first
  std::vector<int> bases;     // first machine of each unit it holds at the enclosing level
};

// The search over the states: the levels' programmes (innermost first, each non-final level's best
// times becoming the next level's compute), then the stages reconstructed outermost first.
class PipeDreamSearch {
 public:
  PipeDreamSearch(const Workload& w, const std::vector<double>& time_s,
                  const std::vector<double>& activation_bytes, const PipeDreamOptions& o,
                  const PipeDreamPlanned& planned, States states)
      : o_(o), planned_(planned), g_(planned.g), st_(std::move(states)), S_(st_.covers.size()) {
    ct_.assign(S_, 0);
    act_.assign(S_, 0);
    par_.assign(S_, 0);
    for (size_t i = 0; i < S_; ++i)
      for (int v : g_.topo)
        if (st_.covers[i][v]) {
          ct_[i] += time_s[v];
          act_[i] += activation_bytes[v];
          par_[i] += w.layer(v).parameter_bytes;
        }
    t_ = Sums{ct_, act_, par_, {}};
    for (size_t v = 0; v < w.layer_count(); ++v) {
      const Layer& l = w.layer(v);
      if (l.tied_to < 0 || l.tied_parameters <= 0) continue;
      Sums::Tie tie{std::vector<char>(S_), std::vector<char>(S_), tied_bytes(w, l, l.tied_parameters)};
      for (size_t i = 0; i < S_; ++i) {
        tie.tied[i] = st_.covers[i][v];
        tie.source[i] = st_.covers[i][static_cast<size_t>(l.tied_to)];
      }
      t_.ties.push_back(std::move(tie));
    }
    pred_set_.assign(S_, std::vector<char>(S_, 0));
    for (size_t j = 0; j < S_; ++j)
      for (int k : st_.preds[j]) pred_set_[j][k] = 1;
    level_compute_.resize(o.levels.size());
    for (const PipeDreamLevel& l : o.levels) widest_ = std::max(widest_, l.machines);
  }

  Status solve_inner_levels();
  Result<PipeDreamPlan> plan(bool linear, const std::string& note);

 private:
  std::optional<Error> over_budget() const;
  Row row_at(int lv, size_t i) const;
  Result<std::vector<Range>> reconstruct(const Row& top_row, int top_m);
  void refine(const Row& A, const Range& r, int lv, size_t last_m, const std::vector<int>& unit,
              std::vector<Range>& refined) const;
  std::vector<PipeDreamStage> stages_of(const std::vector<Range>& ranges) const;

  const PipeDreamOptions& o_;
  const PipeDreamPlanned& planned_;
  const Graph& g_;
  const States st_;
  const size_t S_;
  std::vector<double> ct_, act_, par_;  // per state: the sums over the layers it covers
  Sums t_;
  std::vector<std::vector<char>> pred_set_;
  std::vector<Table> level_compute_;      // [lv]: the compute level lv plans on (level 0: the sums)
  mutable std::atomic<double> steps_{0};  // Solver rows count their steps here
  int widest_ = 0;
};

std::optional<Error> PipeDreamSearch::over_budget() const {
  if (steps_.load() <= o_.max_steps) return std::nullopt;
  return Error{fmt::format(
      "pipedream: the search stopped after {:.3g} steps, above the planner's limit of {:.3g} (about 80 "
      "s; {} states, {} machines at the widest level); use fewer machines per level (a hierarchy), "
      "straight mode, or another partitioner",
      steps_.load(), o_.max_steps, S_, widest_)};
}

// Every non-final level's programme, all rows; its all-machines times become the next level's compute.
Status PipeDreamSearch::solve_inner_levels() {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  int within = 1;
  for (size_t lv = 0; lv + 1 < o_.levels.size(); ++lv) {
    const Solver solver(o_, st_.out_act, st_.preds, pred_set_, t_, lv == 0 ? nullptr : &level_compute_[lv],
                        o_.levels[lv].machines, within, o_.levels[lv].bandwidth, true, &steps_);
    std::vector<std::vector<double>> next(S_ + 1, std::vector<double>(S_, nan));
    // Rows are independent: spread them over the machine's threads (deterministic results).
    const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 8));
    std::atomic<size_t> next_row{0};
    auto work = [&] {
      for (size_t i; (i = next_row++) < S_;) {
        auto A = solver.row(i);
        for (size_t j = 0; j < S_; ++j) next[i][j] = A(j, A.machines - 1).time;
      }
    };
    std::vector<std::thread> pool;
    for (unsigned k = 1; k < threads; ++k) pool.emplace_back(work);
    work();
    for (std::thread& th : pool) th.join();
    if (auto e = over_budget()) return *e;
    level_compute_[lv + 1] = std::move(next);
    within = o_.levels[lv].machines;
  }
  return {};
}

Row PipeDreamSearch::row_at(int lv, size_t i) const {
  int w_in = 1;
  for (int x = 0; x < lv; ++x) w_in = o_.levels[x].machines;
  return Solver(o_, st_.out_act, st_.preds, pred_set_, t_, lv == 0 ? nullptr : &level_compute_[lv],
                o_.levels[lv].machines, w_in, o_.levels[lv].bandwidth, false, &steps_)
      .row(i);
}

Result<PipeDreamPlan> PipeDreamSearch::plan(bool linear, const std::string& note) {
  const int top = static_cast<int>(o_.levels.size()) - 1;
  const Row top_row = row_at(top, 0);
  if (auto e = over_budget()) return *e;
  // PipeDream uses every machine of the top level. With whole samples per replica, every machine may
  // be out of reach (8 layers, 64 machines, micro-batches of 1 sample: no replication): then the
  // most machines that have a plan, the rest left idle.
  int top_m = o_.levels[top].machines - 1;
  if (o_.whole_samples_of > 0)
    while (top_m > 0 && !top_row(S_ - 1, static_cast<size_t>(top_m)).has()) --top_m;
  const Entry& answer = top_row(S_ - 1, static_cast<size_t>(top_m));
  if (!answer.has())
    return Error{o_.memory_constraint ? "pipedream: no partition meets the memory constraint"
                                      : "pipedream: no partition found"};
  PipeDreamPlan plan;
  plan.states = S_;
  plan.linearized = linear;
  plan.note = note;
  plan.time_per_stage = answer.time;
  plan.single_stage_time = ct_[S_ - 1];
  double dp = ct_[S_ - 1];
  int w_in = 1;
  for (const PipeDreamLevel& l : o_.levels) {
    dp = (dp + (4.0 * (l.machines - 1) * par_[S_ - 1]) / (l.bandwidth * l.machines) / w_in) / l.machines;
    w_in = l.machines;
  }
  plan.data_parallel_time = dp;
  Result<std::vector<Range>> ranges = reconstruct(top_row, top_m);
  if (!ranges) return ranges.error();
  plan.stages = stages_of(*ranges);
  return plan;
}

// The stages, level by level (outermost first), like PipeDream's analysis. Machines: level lv's unit
// spans the product of the machine counts below it; a stage gets consecutive units of its level
// inside every unit its enclosing stage holds.
Result<std::vector<Range>> PipeDreamSearch::reconstruct(const Row& top_row, int top_m) {
  const int top = static_cast<int>(o_.levels.size()) - 1;
  std::vector<int> unit(o_.levels.size() + 1, 1);
  for (size_t lv = 0; lv < o_.levels.size(); ++lv) unit[lv + 1] = unit[lv] * o_.levels[lv].machines;
  std::vector<Range> ranges{{0, S_, {}, {0}}};
  for (int lv = top; lv >= 0; --lv) {
    std::vector<Range> refined;
    for (const Range& r : ranges) {
      const Row A = lv == top ? top_row : row_at(lv, r.start);
      if (auto e = over_budget()) return *e;
      refine(A, r, lv, lv == top ? static_cast<size_t>(top_m) : o_.levels[lv].machines - 1, unit, refined);
    }
    ranges = std::move(refined);
  }
  return ranges;
}

// Range r split at level lv as row A's entry (r.end - 1, last_m) says.
void PipeDreamSearch::refine(const Row& A, const Range& r, int lv, size_t last_m,
                             const std::vector<int>& unit, std::vector<Range>& refined) const {
  std::vector<size_t> splits;
  std::vector<int> reps;
  Entry meta = A(r.end - 1, last_m);
  while (meta.split_k >= 0) {
    splits.push_back(static_cast<size_t>(meta.split_k) + 1);
    reps.push_back(meta.machines);
    meta = A(meta.split_k, meta.split_m);
  }
  reps.push_back(meta.machines);
  std::reverse(splits.begin(), splits.end());
  std::reverse(reps.begin(), reps.end());
  splits.push_back(r.end);
  size_t from = r.start;
  int offset = 0;
  for (size_t q = 0; q < splits.size(); ++q) {
    Range sub{from, splits[q], r.replicas, {}};
    sub.replicas.push_back(reps[q]);
    for (int b : r.bases)
      for (int t = 0; t < reps[q]; ++t) sub.bases.push_back(b + (offset + t) * unit[lv]);
    offset += reps[q];
    refined.push_back(sub);
    from = splits[q];
  }
}

// The stages of the innermost ranges, with their layers: layers outside the planned graph (Input
// sources and unreached nodes) go to the first stage, dropped sinks to the last.
std::vector<PipeDreamStage> PipeDreamSearch::stages_of(const std::vector<Range>& ranges) const {
  std::vector<PipeDreamStage> stages;
  std::vector<int> stage_of(g_.n, -1);
  for (size_t q = 0; q < ranges.size(); ++q) {
    PipeDreamStage st;
    for (int v : g_.topo)
      if (st_.covers[ranges[q].end - 1][v] && stage_of[v] < 0) stage_of[v] = static_cast<int>(q);
    st.replicas_per_level.assign(ranges[q].replicas.rbegin(), ranges[q].replicas.rend());  // innermost first
    st.replicas = 1;
    for (int r : st.replicas_per_level) st.replicas *= r;
    st.devices = ranges[q].bases;
    std::sort(st.devices.begin(), st.devices.end());
    const size_t a = ranges[q].start, b = ranges[q].end;
    st.time = (a == 0 ? ct_[b - 1] : ct_[b - 1] - ct_[a - 1]);
    stages.push_back(std::move(st));
  }
  const std::vector<int>& getitem = planned_.getitem;
  for (size_t v = 0; v < g_.n; ++v) {
    int s = stage_of[v];
    if (s < 0)
      s = (std::find(getitem.begin(), getitem.end(), static_cast<int>(v)) != getitem.end())
              ? static_cast<int>(stages.size()) - 1
              : 0;
    stages[s].layers.push_back(static_cast<int>(v));
  }
  return stages;
}

}  // namespace

Result<PipeDreamPlan> plan_pipedream(const Workload& w, const std::vector<double>& time_s,
                                     const std::vector<double>& activation_bytes, const PipeDreamOptions& o) {
  if (o.levels.empty()) return Error{"pipedream: no machine level given"};
  for (const PipeDreamLevel& l : o.levels)
    if (l.machines < 1 || !(l.bandwidth > 0))
      return Error{"pipedream: every level needs machines >= 1 and a bandwidth"};
  Result<PipeDreamPlanned> planned = planning_graph(w);
  if (!planned) return planned.error();
  // States: PipeDream's antichain DAG, or the prefixes of a topological order when linearised.
  bool linear = o.linearize;
  std::string note;
  States states;
  if (!linear) {
    const AntichainDag dag = antichain_dag(planned->g, planned->first_source, o.max_states);
    if (dag.augmented.size() > o.max_states) {
      linear = true;
      note = fmt::format("the antichain DAG has more than {} states: planned on the linearised graph",
                         o.max_states);
    } else {
      states = antichain_states(planned->g, dag, activation_bytes);
    }
  }
  if (linear) states = linear_states(w, planned->g, activation_bytes);
  PipeDreamSearch search(w, time_s, activation_bytes, o, *planned, std::move(states));
  if (Status s = search.solve_inner_levels(); !s) return s.error();
  return search.plan(linear, note);
}

}  // namespace pipegrid
