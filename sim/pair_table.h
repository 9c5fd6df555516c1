// Values for a sparse set of (from, to) pairs of small non-negative ids (devices, SimGrid netpoints):
// one row per `from` holding its `to` ids in increasing order, in flat arrays. A look-up reads the
// row's bounds and searches its few ids: no hashing and no node to follow. The replay looks a pair up
// twice per transfer (its start delay and, from SimGrid, its route); with hash maps those look-ups
// were 4-7% of the samples at 1,024 devices, mostly the division and the miss on the node.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace pipegrid::sim {

template <class T>
class PairTable {
 public:
  // Pairs may come in any order, before or between look-ups; a pair given twice keeps its last value.
  void add(uint32_t from, uint32_t to, T value) { staged_.push_back({from, to, std::move(value)}); }

  const T* find(uint32_t from, uint32_t to) const {
    if (!staged_.empty()) build();
    if (size_t{from} + 1 >= row_.size()) return nullptr;
    const auto begin = to_.begin() + row_[from], end = to_.begin() + row_[from + 1];
    const auto it = std::lower_bound(begin, end, to);
    return it != end && *it == to ? &values_[static_cast<size_t>(it - to_.begin())] : nullptr;
  }

 private:
  struct Item {
    uint32_t from, to;
    T value;
  };

  void build() const {
    std::vector<Item> all;
    all.reserve(to_.size() + staged_.size());
    for (size_t f = 0; f + 1 < row_.size(); ++f)
      for (uint32_t k = row_[f]; k < row_[f + 1]; ++k)
        all.push_back({static_cast<uint32_t>(f), to_[k], std::move(values_[k])});
    for (Item& i : staged_) all.push_back(std::move(i));  // after the older ones: they win ties
    staged_.clear();
    std::stable_sort(all.begin(), all.end(), [](const Item& a, const Item& b) {
      return a.from != b.from ? a.from < b.from : a.to < b.to;
    });
    // Keep the last of each run of equal pairs.
    std::vector<Item> unique;
    unique.reserve(all.size());
    for (size_t i = 0; i < all.size(); ++i)
      if (i + 1 == all.size() || all[i + 1].from != all[i].from || all[i + 1].to != all[i].to)
        unique.push_back(std::move(all[i]));
    const size_t rows = unique.empty() ? 0 : size_t{unique.back().from} + 1;
    row_.assign(rows + 1, 0);
    to_.clear();
    values_.clear();
    to_.reserve(unique.size());
    values_.reserve(unique.size());
    for (Item& i : unique) {
      ++row_[size_t{i.from} + 1];
      to_.push_back(i.to);
      values_.push_back(std::move(i.value));
    }
    for (size_t f = 0; f < rows; ++f) row_[f + 1] += row_[f];
  }

  mutable std::vector<Item> staged_;
  mutable std::vector<uint32_t> row_;  // the pairs of `from`: to_[row_[from] .. row_[from + 1])
  mutable std::vector<uint32_t> to_;
  mutable std::vector<T> values_;
};

}  // namespace pipegrid::sim
