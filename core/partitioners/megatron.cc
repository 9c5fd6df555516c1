// megatron: Megatron-LM's split of a transformer: the transformer blocks in contiguous runs, one per
// stage (ranks x chunks stages with interleaving, stage i on rank i mod ranks), the layers before the
// first block (input, embeddings) with the first stage and those after the last block (final norm,
// head) with the last stage. The runs are equal, as Megatron requires by default (--num-layers a
// multiple of the pipeline size, times the virtual size when interleaving), or uneven as Megatron-Core's
// first/last-stage counts, its embedding and loss accounting or its explicit layout set them
// (megatron_layout).
#include "core/partitioners/megatron.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/partitioners/common.h"
#include "core/strategy.h"

namespace pipegrid {

namespace {

// One rank's problem: the layout names the key at fault and what was expected.
MegatronLayout refused(std::string_view key, std::string problem) {
  return {{}, std::string(key), std::move(problem)};
}

std::string chunk_multiple(int chunks, int count) {
  return fmt::format(
      "expected a multiple of the {} chunks per rank (Megatron-Core splits a rank's blocks equally "
      "over its chunks), got {}",
      chunks, count);
}

// The blocks of each pipeline rank (all its chunks) under the first/last-stage counts, or why not.
MegatronLayout first_last_ranks(int n, int ranks, const MegatronSplit& s) {
  const int f = s.first_stage_blocks, l = s.last_stage_blocks;
  const std::string_view key = f > 0 ? "first_stage_blocks" : "last_stage_blocks";
  const std::string_view later = l > 0 ? "last_stage_blocks" : "first_stage_blocks";
  if (s.account_for_embedding || s.account_for_loss)
    return refused(s.account_for_embedding ? "account_for_embedding" : "account_for_loss",
                   "expected false with first_stage_blocks or last_stage_blocks (Megatron-Core refuses the "
                   "two uneven splits together), got true");
  if (ranks < 2)
    return refused(key,
                   "expected a pipeline of at least 2 ranks (strategy.stages; with one the first rank is "
                   "the last), got 1");
  const int middle = n - f - l, middle_ranks = ranks - (f > 0) - (l > 0);
  if (middle < 0 || (middle == 0) != (middle_ranks == 0))
    return refused(
        later, fmt::format("expected the first and last ranks' blocks to leave {} for the {} middle "
                           "rank{} (the workload has {} transformer blocks), got {} + {}",
                           middle_ranks == 0 ? "none" : "some", middle_ranks, middle_ranks == 1 ? "" : "s", n,
                           f, l));
  if (middle_ranks > 0 && middle % middle_ranks != 0)
    return refused(later,
                   fmt::format("expected the {} blocks left by the first and last ranks ({} - {} - {}) "
                               "to be a multiple of the {} middle ranks, got {}",
                               middle, n, f, l, middle_ranks, middle));
  MegatronLayout out;
  out.blocks.assign(ranks, middle_ranks > 0 ? middle / middle_ranks : 0);
  if (f > 0) out.blocks.front() = f;
  if (l > 0) out.blocks.back() = l;
  return out;
}

// Each rank's blocks in an even split, the embedding and the loss counted as blocks where accounted.
MegatronLayout even_ranks(int n, int ranks, int chunks, const MegatronSplit& s) {
  if (!s.uneven()) {
    if (n % (ranks * chunks) == 0) return {std::vector<int>(ranks, n / ranks), {}, {}};
    return refused("",
                   fmt::format("the megatron partitioner needs the {} transformer blocks to be a multiple of "
                               "the {} stages ({} ranks x {} chunk{}), as Megatron-LM does",
                               n, ranks * chunks, ranks, chunks, chunks == 1 ? "" : "s"));
  }
  const int slots = n + s.account_for_embedding + s.account_for_loss;
  const std::string counted =
      fmt::format("{} blocks{}{} = {}", n, s.account_for_embedding ? " + the embedding" : "",
                  s.account_for_loss ? " + the loss" : "", slots);
  if (slots % ranks != 0)
    return refused(
        s.account_for_loss ? "account_for_loss" : "account_for_embedding",
        fmt::format("expected {} to be a multiple of the {} pipeline ranks (Megatron-Core's rule), got "
                    "{} left over",
                    counted, ranks, slots % ranks));
  if ((slots / ranks) % chunks != 0)
    return refused("chunks",
                   fmt::format("expected a divisor of the {} blocks per rank ({} over {} ranks), got {}",
                               slots / ranks, counted, ranks, chunks));
  return {std::vector<int>(ranks, slots / ranks), {}, {}};
}

// Megatron-Core splits each rank's blocks equally over its chunks: the first and last ranks' counts
// as given, the middle ranks' share.
MegatronLayout check_chunks(MegatronLayout out, int chunks, const MegatronSplit& s) {
  const int ranks = static_cast<int>(out.blocks.size());
  for (int r = 0; r < ranks; ++r) {
    if (out.blocks[r] % chunks == 0) continue;
    if (r == 0 && s.first_stage_blocks > 0)
      return refused("first_stage_blocks", chunk_multiple(chunks, out.blocks[r]));
    if (r == ranks - 1 && s.last_stage_blocks > 0)
      return refused("last_stage_blocks", chunk_multiple(chunks, out.blocks[r]));
    return refused("chunks", fmt::format("expected a divisor of the {} blocks on each middle rank, got {}",
                                         out.blocks[r], chunks));
  }
  return out;
}

// The longest a layout may expand to: far above any model's blocks (docs/limits.md's 131,072 layers).
constexpr size_t kMaxLayoutSymbols = size_t{1} << 20;

// A layout's text expanded into `out`: symbols and `|` copied, `x*n` and `(...)*n` repeated n times,
// commas dropped; each problem names its character (`offset`: the text's first in the whole layout).
// Megatron-Core expands the parenthesised groups first and then single symbols (parse_str_to_list), so
// its groups do not nest; neither do these.
class LayoutExpander {
 public:
  LayoutExpander(std::string_view text, size_t offset, bool in_group)
      : text_(text), offset_(offset), in_group_(in_group) {}

  // Appends the expansion to `out`; the problem, or empty.
  std::string run(std::string& out) {
    while (i_ < text_.size()) {
      if (text_[i_] == ',') {
        ++i_;
        continue;
      }
      const size_t start = i_;
      std::string unit;
      long long n = 1;
      if (std::string problem = next_unit(unit); !problem.empty()) return problem;
      if (std::string problem = repeats(n); !problem.empty()) return problem;
      if (unit.size() * static_cast<size_t>(n) > kMaxLayoutSymbols - out.size())
        return at(start, fmt::format("expected a layout of at most {} symbols expanded, got more",
                                     kMaxLayoutSymbols));
      for (long long k = 0; k < n; ++k) out += unit;
    }
    return "";
  }

 private:
  std::string at(size_t i, std::string_view what) const {
    return fmt::format("at character {}: {}", offset_ + i + 1, what);
  }

  // The symbol or group at i_ (a group expanded), i_ moved past it.
  std::string next_unit(std::string& unit) {
    const char c = text_[i_];
    if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
      unit = std::string(1, c);
      ++i_;
      return "";
    }
    if (c != '(')
      return at(i_, fmt::format("expected E (the embedding), t (a transformer block), m (a multi-token-"
                                "prediction module), L (the loss), '|' between stages, '(', '*' or ',', got "
                                "'{}'",
                                c));
    if (in_group_) return at(i_, "expected no '(' inside a group (Megatron-Core's groups do not nest)");
    const size_t close = text_.find(')', i_);
    if (close == std::string_view::npos) return at(i_, "expected a ')' closing this group");
    LayoutExpander inner(text_.substr(i_ + 1, close - i_ - 1), offset_ + i_ + 1, true);
    if (std::string problem = inner.run(unit); !problem.empty()) return problem;
    i_ = close + 1;
    if (i_ >= text_.size() || text_[i_] != '*')
      return at(close, "expected *n after a group (Megatron-Core repeats a group n times)");
    return "";
  }

  // The count after i_ ("*n"; 1 where none follows), i_ moved past it.
  std::string repeats(long long& n) {
    n = 1;
    if (i_ >= text_.size() || text_[i_] != '*') return "";
    size_t j = ++i_;
    while (j < text_.size() && text_[j] >= '0' && text_[j] <= '9' && j - i_ < 8) ++j;
    if (j == i_) return at(i_ - 1, "expected a count after '*' (x*n repeats x n times)");
    n = std::stoll(std::string(text_.substr(i_, j - i_)));
    i_ = j;
    return "";
  }

  std::string_view text_;
  size_t offset_;
  bool in_group_;
  size_t i_ = 0;
};

// What Megatron-Core's validate_layer_layout refuses in the expanded stages, with the two places pipegrid
// fixes (the embedding's stage; the MTP modules', the head's), and empty stages; or empty.
std::string layout_problem(const std::vector<std::string>& st, int n, int mtp) {
  std::string all;
  for (const std::string& stage : st) all += stage;
  const auto count = [](std::string_view text, char c) {
    return static_cast<int>(std::count(text.begin(), text.end(), c));
  };
  for (size_t s = 0; s < st.size(); ++s)
    if (st[s].empty())
      return fmt::format(
          "expected a layer in every stage, got none in stage {} (pipegrid runs no empty stage)", s);
  if (all.front() != 'E' || count(all, 'E') != 1 || st.front().front() != 'E')
    return fmt::format(
        "expected the embedding (E) once, first in stage 0, as Megatron-Core requires, got {} E "
        "and \"{}\" first",
        count(all, 'E'), all.front());
  if (all.back() != 'L' || count(all, 'L') != 1)
    return fmt::format(
        "expected the loss (L) once, last in the last stage, as Megatron-Core requires, got {} L "
        "and \"{}\" last",
        count(all, 'L'), all.back());
  if (count(all, 't') != n)
    return fmt::format("expected the workload's {} transformer blocks (t), got {}", n, count(all, 't'));
  if (count(all, 'm') != mtp)
    return fmt::format(
        "expected the workload's {} multi-token-prediction module{} (m; workload.mtp_layers), got {}", mtp,
        mtp == 1 ? "" : "s", count(all, 'm'));
  if (count(st.back(), 'm') != mtp)
    return "expected the multi-token-prediction modules (m) in the loss's stage: pipegrid keeps them with "
           "the head "
           "(docs/moe.md) and does not model a stage of them alone";
  if (mtp > 0 && all.find('m') < all.rfind('t'))
    return "expected every transformer block (t) before the first multi-token-prediction module (m), as "
           "Megatron-Core requires";
  return "";
}

// The blocks of each stage under an explicit layout, or why not.
MegatronLayout from_layout(const std::string& text, int n, int mtp, int ranks, int chunks) {
  const ParsedLayout parsed = parse_megatron_layout(text);
  if (!parsed.problem.empty()) return refused("layout", parsed.problem);
  const std::vector<std::string>& st = parsed.stages;
  const size_t want = static_cast<size_t>(ranks) * chunks;
  if (st.size() != want)
    return refused("layout",
                   fmt::format("expected {} stages ({} ranks x {} chunk{}, '|' between them), got {}{}", want,
                               ranks, chunks, chunks == 1 ? "" : "s", st.size(),
                               st.size() % ranks == 0 && st.size() > want
                                   ? fmt::format(" (strategy.chunks: {} would fit)", st.size() / ranks)
                                   : ""));
  if (std::string problem = layout_problem(st, n, mtp); !problem.empty()) return refused("layout", problem);
  MegatronLayout out;
  for (const std::string& stage : st)
    out.blocks.push_back(static_cast<int>(std::count(stage.begin(), stage.end(), 't')));
  return out;
}

}  // namespace

MegatronBlocks megatron_blocks(const Workload& w) {
  MegatronBlocks out;
  for (size_t l = 0; l < w.layer_count(); ++l) {
    const Layer& layer = w.layer(static_cast<int>(l));
    out.blocks += is_layout_block(layer);
    out.mtp += is_block(layer.split.kind) && layer.multi_token_prediction;
  }
  return out;
}

ParsedLayout parse_megatron_layout(std::string_view text) {
  std::string flat;
  if (std::string problem = LayoutExpander(text, 0, false).run(flat); !problem.empty()) return {{}, problem};
  ParsedLayout out;
  out.stages.emplace_back();
  for (char c : flat) {
    if (c == '|')
      out.stages.emplace_back();
    else
      out.stages.back() += c;
  }
  return out;
}

MegatronLayout megatron_layout(int n, int ranks, int chunks, std::string_view schedule,
                               const MegatronSplit& s, int mtp_modules) {
  const bool first_last = s.first_stage_blocks > 0 || s.last_stage_blocks > 0;
  // DualPipe runs the chain's stage s on rank s and its mirror on rank p - 1 - s: every form names
  // stages of the chain. DualPipeV's V puts the first and the last stage on rank 0, so a count per
  // first or last rank names no one stage there: it takes a layout or the (stage-even) accounting.
  if (first_last && schedule == "dualpipev")
    return refused(s.first_stage_blocks > 0 ? "first_stage_blocks" : "last_stage_blocks",
                   "expected a layout (strategy.layout) with dualpipev: its V puts the first and the "
                   "last stage on rank 0, so a first or last rank's count names no one stage");
  if (!s.layout.empty()) {
    if (first_last || s.account_for_embedding || s.account_for_loss)
      return refused(
          "layout",
          "expected alone: a layout places every layer itself, and Megatron-Core refuses it beside "
          "the first/last-stage counts and the embedding and loss accounting");
    return from_layout(s.layout, n, mtp_modules, ranks, chunks);
  }
  MegatronLayout out = first_last ? first_last_ranks(n, ranks, s) : even_ranks(n, ranks, chunks, s);
  if (out.ok() && first_last) out = check_chunks(std::move(out), chunks, s);
  if (!out.ok()) return out;
  std::vector<int> stages(static_cast<size_t>(ranks) * chunks);
  for (int k = 0; k < chunks; ++k)
    for (int r = 0; r < ranks; ++r) stages[k * ranks + r] = out.blocks[r] / chunks;
  // The embedding and the loss take one block's place in the first and the last model chunk.
  stages.front() -= s.account_for_embedding;
  stages.back() -= s.account_for_loss;
  out.blocks = std::move(stages);
  return out;
}

Result<Partition> partition_megatron(const PartitionRequest& r) {
  if (Status st = check_stage_count(r); !st) return st.error();
  const std::vector<int> order = topological_order(r.workload);
  std::vector<int> blocks;  // positions in `order` of the transformer blocks
  for (size_t i = 0; i < order.size(); ++i)
    if (is_layout_block(r.workload.layer(order[i]))) blocks.push_back(static_cast<int>(i));
  const int n = static_cast<int>(blocks.size());
  if (n == 0)
    return Error{fmt::format(
        "the megatron partitioner splits transformer (or MoE) blocks, and workload \"{}\" has none",
        r.workload.name)};
  const MegatronSplit& split = r.options.megatron;
  const MegatronLayout layout =
      megatron_layout(n, r.stages, r.chunks, r.schedule, split, megatron_blocks(r.workload).mtp);
  if (!layout.ok())
    return Error{layout.key.empty() ? layout.problem
                                    : fmt::format("strategy.{}: {}", layout.key, layout.problem)};
  for (int i = 1; i < n; ++i)
    if (blocks[i] != blocks[i - 1] + 1)
      return Error{
          fmt::format("the megatron partitioner needs the transformer blocks to be consecutive in the "
                      "layer order; layer \"{}\" lies between two of them",
                      r.workload.layer(order[blocks[i - 1] + 1]).name)};
  std::vector<int> bounds{0};
  int end = blocks[0];  // the position after the last block placed so far
  for (size_t s = 0; s + 1 < layout.blocks.size(); ++s) bounds.push_back(end += layout.blocks[s]);
  bounds.push_back(static_cast<int>(order.size()));
  for (size_t s = 0; s + 1 < bounds.size(); ++s)
    if (bounds[s] == bounds[s + 1])
      return Error{
          fmt::format("the megatron partitioner's stage {} would hold no layer (its chunk has no "
                      "transformer block and the workload has no layer {} the blocks)",
                      s, s == 0 ? "before" : "after")};
  return contiguous_partition(r, order, bounds);
}

}  // namespace pipegrid
