#include "core/sp_tree.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

namespace pipegrid {
namespace {

// Reachability as bitsets (layer counts of DNN graphs are in the thousands at most).
class Reach {
 public:
  explicit Reach(const Workload& w, const std::vector<int>& topo) : n_(w.layer_count()), words_((n_ + 63) / 64) {
    bits_.assign(n_ * words_, 0);
    for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
      const int u = *it;
      for (auto [e, end] = boost::out_edges(u, w.graph); e != end; ++e) {
        const int v = static_cast<int>(boost::target(*e, w.graph));
        set(u, v);
        for (size_t k = 0; k < words_; ++k) bits_[u * words_ + k] |= bits_[v * words_ + k];
      }
    }
  }
  bool before(int u, int v) const { return bits_[u * words_ + v / 64] >> (v % 64) & 1; }
  void add(int u, int v, const std::vector<int>& topo) {
    // u < v now, and so is every ancestor of u below every descendant of v: recompute ancestors.
    std::vector<uint64_t> row(bits_.begin() + v * words_, bits_.begin() + (v + 1) * words_);
    row[v / 64] |= uint64_t{1} << (v % 64);
    for (int x : topo)
      if (x == u || before(x, u))
        for (size_t k = 0; k < words_; ++k) bits_[x * words_ + k] |= row[k];
  }

 private:
  void set(int u, int v) { bits_[u * words_ + v / 64] |= uint64_t{1} << (v % 64); }
  size_t n_, words_;
  std::vector<uint64_t> bits_;
};

class Builder {
 public:
  explicit Builder(const Workload& w) : topo_(topological_order(w)), reach_(w, topo_) {}

  SpTree build() {
    tree_.root = build(topo_);
    return std::move(tree_);
  }

 private:
  bool related(int a, int b) const { return reach_.before(a, b) || reach_.before(b, a); }

  int add_node(SpNode n) {
    tree_.nodes.push_back(std::move(n));
    return static_cast<int>(tree_.nodes.size() - 1);
  }

  // `set` is in topological order.
  int build(const std::vector<int>& set) {
    if (set.size() == 1) return add_node({SpNode::Kind::Leaf, set, {}});
    // Series: every prefix that precedes the whole rest.
    std::vector<size_t> cuts = series_cuts(set);
    if (!cuts.empty()) return series(set, cuts);
    // Parallel: weakly connected components (unrelated layers in different components).
    std::vector<std::vector<int>> parts = components(set);
    if (parts.size() > 1) {
      SpNode n{SpNode::Kind::Parallel, set, {}};
      for (const auto& part : parts) n.children.push_back(build(part));
      return add_node(std::move(n));
    }
    // Neither: make the prefix whose ordering removes the least concurrency (fewest unordered
    // pairs across it) precede the rest, then split there.
    const std::vector<size_t> crossing = crossing_unordered(set);
    size_t best = 0, best_cost = std::numeric_limits<size_t>::max();
    for (size_t k = 1; k < set.size(); ++k) {
      auto balance = [&](size_t x) { return std::max(x, set.size() - x); };
      if (crossing[k] < best_cost || (crossing[k] == best_cost && balance(k) < balance(best))) {
        best_cost = crossing[k];
        best = k;
      }
    }
    for (auto [a, b] : missing_pairs(set, best)) {
      reach_.add(a, b, topo_);
      ++tree_.added_dependencies;
    }
    return build(set);  // now a series composition at `best` (at least)
  }

  // crossing[k]: unordered pairs (i < k <= j) of the topologically ordered set (k in 1..size-1).
  std::vector<size_t> crossing_unordered(const std::vector<int>& set) const {
    std::vector<long long> diff(set.size() + 1, 0);
    for (size_t j = 0; j < set.size(); ++j)
      for (size_t i = 0; i < j; ++i)
        if (!reach_.before(set[i], set[j])) {  // later never precedes earlier in a topological order
          ++diff[i + 1];
          --diff[j + 1];
        }
    std::vector<size_t> crossing(set.size(), 0);
    long long run = 0;
    for (size_t k = 1; k < set.size(); ++k) crossing[k] = static_cast<size_t>(run += diff[k]);
    return crossing;
  }

  // Positions k (1 <= k < size) where set[0..k) precedes set[k..): no unordered pair crosses k.
  std::vector<size_t> series_cuts(const std::vector<int>& set) const {
    const std::vector<size_t> crossing = crossing_unordered(set);
    std::vector<size_t> cuts;
    for (size_t k = 1; k < set.size(); ++k)
      if (crossing[k] == 0) cuts.push_back(k);
    return cuts;
  }

  // Pairs (maximal of the prefix, minimal of the rest) that are not yet ordered.
  std::vector<std::pair<int, int>> missing_pairs(const std::vector<int>& set, size_t k) const {
    std::vector<int> maxima, minima;
    for (size_t i = 0; i < k; ++i) {
      bool maximal = true;
      for (size_t j = i + 1; j < k && maximal; ++j) maximal = !reach_.before(set[i], set[j]);
      if (maximal) maxima.push_back(set[i]);
    }
    for (size_t i = k; i < set.size(); ++i) {
      bool minimal = true;
      for (size_t j = k; j < i && minimal; ++j) minimal = !reach_.before(set[j], set[i]);
      if (minimal) minima.push_back(set[i]);
    }
    std::vector<std::pair<int, int>> out;
    for (int a : maxima)
      for (int b : minima)
        if (!reach_.before(a, b)) out.emplace_back(a, b);
    return out;
  }

  int series(const std::vector<int>& set, const std::vector<size_t>& cuts) {
    SpNode n{SpNode::Kind::Series, set, {}};
    size_t from = 0;
    for (size_t i = 0; i <= cuts.size(); ++i) {
      size_t to = i < cuts.size() ? cuts[i] : set.size();
      n.children.push_back(build(std::vector<int>(set.begin() + from, set.begin() + to)));
      from = to;
    }
    return add_node(std::move(n));
  }

  std::vector<std::vector<int>> components(const std::vector<int>& set) const {
    std::vector<int> comp(set.size(), -1);
    int count = 0;
    for (size_t i = 0; i < set.size(); ++i) {
      if (comp[i] >= 0) continue;
      std::vector<size_t> stack{i};
      comp[i] = count;
      while (!stack.empty()) {
        size_t x = stack.back();
        stack.pop_back();
        for (size_t j = 0; j < set.size(); ++j)
          if (comp[j] < 0 && related(set[x], set[j])) {
            comp[j] = count;
            stack.push_back(j);
          }
      }
      ++count;
    }
    std::vector<std::vector<int>> parts(count);
    for (size_t i = 0; i < set.size(); ++i) parts[comp[i]].push_back(set[i]);
    return parts;
  }

  std::vector<int> topo_;
  Reach reach_;
  SpTree tree_;
};

}  // namespace

SpTree sp_decompose(const Workload& w) { return Builder(w).build(); }

std::string SpTree::to_string(const Workload& w) const {
  std::function<std::string(int)> text = [&](int i) -> std::string {
    const SpNode& n = nodes[i];
    if (n.kind == SpNode::Kind::Leaf) return w.layer(n.layers.front()).name;
    std::string out = n.kind == SpNode::Kind::Series ? "S(" : "P(";
    for (size_t c = 0; c < n.children.size(); ++c) {
      if (c) out += ", ";
      out += text(n.children[c]);
    }
    return out + ")";
  };
  return root < 0 ? "" : text(root);
}

}  // namespace pipegrid
