#include "core/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <set>

#include "core/partition.h"

namespace pipegrid {

char pass_letter(Pass p) {
  switch (p) {
    case Pass::Forward:
      return 'F';
    case Pass::Backward:
      return 'B';
    case Pass::Weight:
      return 'W';
  }
  return '?';
}

std::string to_string(const Action& a) {
  return fmt::format("{}{}{}", a.stage, pass_letter(a.pass), a.micro_batch);
}

Result<Action> parse_action(std::string_view text) {
  auto fail = [&] {
    return Error{
        fmt::format("expected an action like \"2F0\" (stage, F/B/W, micro-batch), got \"{}\"", text)};
  };
  Action a;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto r1 = std::from_chars(p, end, a.stage);
  if (r1.ec != std::errc() || r1.ptr == end) return fail();
  switch (*r1.ptr) {
    case 'F':
      a.pass = Pass::Forward;
      break;
    case 'B':
    case 'I':
      a.pass = Pass::Backward;
      break;
    case 'W':
      a.pass = Pass::Weight;
      break;
    default:
      return fail();
  }
  auto r2 = std::from_chars(r1.ptr + 1, end, a.micro_batch);
  if (r2.ec != std::errc() || r2.ptr != end || a.stage < 0 || a.micro_batch < 0) return fail();
  return a;
}

std::string Schedule::location(size_t device, size_t index) const {
  if (source.empty() || device >= positions.size() || index >= positions[device].size()) return "";
  const SourcePosition& p = positions[device][index];
  return fmt::format("{}:{}:{}: ", source, p.line, p.column);
}

namespace {

constexpr std::string_view kOverlap = "OVERLAP_F_B";

// An action as torch writes it in a CSV: a split backward's input-gradient pass is "I"
// (BACKWARD_INPUT); "B" is torch's FULL_BACKWARD, input and weight gradients in one.
std::string torch_string(const Action& a, bool split) {
  if (split && a.pass == Pass::Backward) return fmt::format("{}I{}", a.stage, a.micro_batch);
  return to_string(a);
}

// Device d's actions as cells: an overlapped pair is one cell, "(<F>;<B>)" plus `pair_suffix`, as
// torch.distributed.pipelining's _Action writes an OVERLAP_F_B action with its two sub-actions; with
// `torch_letters`, a split backward's input gradient as torch writes it.
std::vector<std::string> action_cells(const Schedule& s, size_t d, std::string_view pair_suffix,
                                      bool torch_letters) {
  const bool split = torch_letters && s.split_backward;
  std::vector<std::string> cells;
  const auto& row = s.device_actions[d];
  for (size_t i = 0; i < row.size(); ++i) {
    if (s.is_paired(d, i) && i + 1 < row.size()) {
      cells.push_back(fmt::format("({};{}){}", torch_string(row[i], split), torch_string(row[i + 1], split),
                                  pair_suffix));
      ++i;
    } else {
      cells.push_back(torch_string(row[i], split));
    }
  }
  return cells;
}

// Whether an action's text names torch's FULL_BACKWARD ("2B0", not "2I0").
bool written_full(std::string_view action) {
  while (!action.empty() && (action.front() == ' ' || (action.front() >= '0' && action.front() <= '9')))
    action.remove_prefix(1);
  return !action.empty() && action.front() == 'B';
}

struct OverlapCell {
  Action forward, backward;
  bool full = false;  // the backward written "B" (torch's FULL_BACKWARD)
};

// torch's OVERLAP_F_B cell, "(3F1;0B0)OVERLAP_F_B": a forward and a backward (B or I) run as one
// overlapped unit, in either order inside the parentheses.
Result<OverlapCell> parse_overlap(std::string_view cell) {
  const std::string expected = fmt::format(
      "expected an overlapped pair like \"(3F1;0B0){}\" (a forward and a backward of another "
      "stage or micro-batch), got \"{}\"",
      kOverlap, cell);
  const size_t close = cell.find(')');
  if (close == std::string_view::npos || cell.substr(close + 1) != kOverlap) return Error{expected};
  const std::string_view inside = cell.substr(1, close - 1);
  const size_t semi = inside.find(';');
  if (semi == std::string_view::npos || inside.find(';', semi + 1) != std::string_view::npos)
    return Error{expected};
  auto trim = [](std::string_view x) {
    while (!x.empty() && x.front() == ' ') x.remove_prefix(1);
    while (!x.empty() && x.back() == ' ') x.remove_suffix(1);
    return x;
  };
  std::string_view first = trim(inside.substr(0, semi)), second = trim(inside.substr(semi + 1));
  Result<Action> a = parse_action(first);
  Result<Action> b = parse_action(second);
  if (!a || !b) return Error{expected};
  if (a->pass == Pass::Backward && b->pass == Pass::Forward) {
    std::swap(*a, *b);
    std::swap(first, second);
  }
  if (a->pass != Pass::Forward || b->pass != Pass::Backward ||
      (a->stage == b->stage && a->micro_batch == b->micro_batch))
    return Error{expected};
  return OverlapCell{*a, *b, written_full(second)};
}

// One CSV row's actions; full[i] = 1 where action i, a backward, was written "B".
struct CsvRow {
  std::vector<Action> actions;
  std::vector<SourcePosition> positions;
  std::vector<char> paired, full;
};

// A cell with leading and trailing blanks and quotes removed, and its 1-based column.
std::pair<std::string_view, size_t> trimmed_cell(std::string_view cell, size_t col) {
  size_t lead = 0;
  while (lead < cell.size() && (cell[lead] == ' ' || cell[lead] == '\t' || cell[lead] == '"')) ++lead;
  cell.remove_prefix(lead);
  while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t' || cell.back() == '"'))
    cell.remove_suffix(1);
  return {cell, col + lead + 1};
}

Result<CsvRow> parse_csv_row(std::string_view row, size_t line, std::string_view name) {
  CsvRow out;
  for (size_t col = 0; col <= row.size();) {
    size_t comma = row.find(',', col);
    if (comma == std::string_view::npos) comma = row.size();
    // Not a structured binding: the lambda below captures both, which clang 14 refuses for bindings.
    const std::pair<std::string_view, size_t> trimmed = trimmed_cell(row.substr(col, comma - col), col);
    const std::string_view cell = trimmed.first;
    const size_t cell_col = trimmed.second;
    col = comma + 1;
    if (cell.empty() || cell == "None") continue;
    bool ignored = false;
    for (std::string_view comm :
         {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"})
      if (cell.find(comm) != std::string_view::npos) ignored = true;
    if (ignored) continue;
    const SourcePosition at{static_cast<int>(line), static_cast<int>(cell_col)};
    auto fail = [&](const Error& e) {
      return Error{fmt::format("{}:{}:{}: {}", name, line, cell_col, e.message)};
    };
    if (cell.front() == '(') {
      Result<OverlapCell> pair = parse_overlap(cell);
      if (!pair) return fail(pair.error());
      out.paired.resize(out.actions.size() + 2, 0);
      out.paired[out.actions.size()] = 1;
      out.actions.insert(out.actions.end(), {pair->forward, pair->backward});
      out.full.insert(out.full.end(), {0, pair->full});
      out.positions.insert(out.positions.end(), 2, at);
      continue;
    }
    Result<Action> a = parse_action(cell);
    if (!a) return fail(a.error());
    out.actions.push_back(*a);
    out.full.push_back(a->pass == Pass::Backward && written_full(cell));
    out.positions.push_back(at);
  }
  if (!out.paired.empty()) out.paired.resize(out.actions.size(), 0);
  return out;
}

// In a schedule that splits the backward, a backward written "B" whose weight gradient appears nowhere
// in its row is torch's FULL_BACKWARD: its W follows it at once (after its pair, when paired). One with a
// W of its own is an input gradient, as pipegrid wrote split backwards before it wrote "I".
void add_full_backward_weights(Schedule& s, const std::vector<std::vector<char>>& full) {
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    auto& acts = s.device_actions[d];
    std::set<std::pair<int, int>> weights;  // (stage, micro-batch) of the row's own W actions
    for (const Action& a : acts)
      if (a.pass == Pass::Weight) weights.emplace(a.stage, a.micro_batch);
    const bool paired = d < s.paired.size() && !s.paired[d].empty();
    std::vector<Action> out;
    std::vector<SourcePosition> at;
    std::vector<char> pairs;
    for (size_t i = 0; i < acts.size(); ++i) {
      out.push_back(acts[i]);
      at.push_back(s.positions[d][i]);
      if (paired) pairs.push_back(s.paired[d][i]);
      if (!full[d][i] || weights.count({acts[i].stage, acts[i].micro_batch})) continue;
      out.push_back(Action{acts[i].stage, Pass::Weight, acts[i].micro_batch});
      at.push_back(s.positions[d][i]);
      if (paired) pairs.push_back(0);
    }
    acts = std::move(out);
    s.positions[d] = std::move(at);
    if (paired) s.paired[d] = std::move(pairs);
  }
}

}  // namespace

std::string to_csv(const Schedule& s) {
  std::string out;
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    const std::vector<std::string> cells = action_cells(s, d, kOverlap, true);
    for (size_t i = 0; i < cells.size(); ++i) {
      if (i) out += ',';
      out += cells[i];
    }
    out += '\n';
  }
  return out;
}

Result<Schedule> parse_schedule_csv(std::string_view text, std::string_view name) {
  Schedule s;
  s.source = std::string(name);
  std::vector<std::vector<char>> full;
  size_t line = 0;
  // A UTF-8 byte-order mark, as spreadsheets save CSV, is not part of the first cell.
  size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view row = text.substr(pos, eol - pos);
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    Result<CsvRow> r = parse_csv_row(row, ++line, name);
    if (!r) return r.error();
    for (const Action& a : r->actions) s.split_backward = s.split_backward || a.pass == Pass::Weight;
    if (!r->paired.empty()) {
      s.paired.resize(s.device_actions.size());
      s.paired.push_back(std::move(r->paired));
    }
    s.device_actions.push_back(std::move(r->actions));
    s.positions.push_back(std::move(r->positions));
    full.push_back(std::move(r->full));
    pos = eol + 1;
  }
  while (!s.device_actions.empty() && s.device_actions.back().empty()) {
    s.device_actions.pop_back();
    s.positions.pop_back();
  }
  if (s.paired.size() > s.device_actions.size()) s.paired.resize(s.device_actions.size());
  if (s.device_actions.empty()) return Error{fmt::format("{}: the schedule has no action", name)};
  if (s.split_backward) add_full_backward_weights(s, full);
  return s;
}

std::string to_grid(const Schedule& s, const std::vector<std::string>& names) {
  std::vector<std::vector<std::string>> cells;
  size_t steps = 0, width = 8;
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    cells.push_back(action_cells(s, d, "", false));
    steps = std::max(steps, cells.back().size());
    for (const std::string& c : cells.back()) width = std::max(width, c.size());
  }
  std::string out = fmt::format("{:<6}", "step");
  for (size_t d = 0; d < s.device_actions.size(); ++d)
    out += fmt::format(" {:<{}}", d < names.size() ? names[d] : fmt::format("rank {}", d), width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (size_t i = 0; i < steps; ++i) {
    out += fmt::format("{:<6}", i);
    for (const auto& row : cells) out += fmt::format(" {:<{}}", i < row.size() ? row[i] : "", width);
    while (!out.empty() && out.back() == ' ') out.pop_back();
    out += '\n';
  }
  return out;
}

std::string to_text(const Schedule& s, const std::vector<std::string>& names) {
  std::string out;
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    if (s.device_actions[d].empty()) continue;
    out += d < names.size() ? names[d] : fmt::format("device{}", d);
    out += ':';
    for (const std::string& c : action_cells(s, d, "", false)) out += ' ' + c;
    out += '\n';
  }
  return out;
}

std::vector<int> file_stage_ranks(const Schedule& s, int ranks, int chunks, int devices_per_rank) {
  if (ranks < 1 || chunks < 1 || devices_per_rank < 1) return {};
  const size_t stages = static_cast<size_t>(ranks) * static_cast<size_t>(chunks);
  std::vector<int> rank(stages, -1), held(static_cast<size_t>(ranks), 0);
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    const int q = static_cast<int>(d) / devices_per_rank;
    for (const Action& a : s.device_actions[d]) {
      if (a.stage < 0 || static_cast<size_t>(a.stage) >= stages || q >= ranks) return {};
      int& r = rank[static_cast<size_t>(a.stage)];
      if (r == -1) {
        r = q;
        ++held[static_cast<size_t>(q)];
      } else if (r != q) {
        return {};
      }
    }
  }
  if (std::count(rank.begin(), rank.end(), -1) > 0 ||
      std::any_of(held.begin(), held.end(), [&](int h) { return h != chunks; }))
    return {};
  return rank;
}

void keep_round_robin_turns(Schedule& s, const Partition& p) {
  if (!s.source.empty()) return;
  for (size_t st = 0; st < p.stage_count(); ++st) {
    const Stage& stage = p.stage(st);
    if (!stage.round_robin || stage.replicas() <= 1) continue;
    for (size_t j = 0; j < stage.devices.size(); ++j) {
      const size_t d = static_cast<size_t>(stage.devices[j]);
      if (d >= s.device_actions.size()) continue;
      const int replica = static_cast<int>(j) / (stage.tensor_parallel * stage.context_parallel);
      auto& acts = s.device_actions[d];
      const auto dropped = [&](const Action& a) {
        return a.stage == static_cast<int>(st) && a.micro_batch % stage.replicas() != replica;
      };
      if (d < s.paired.size() && !s.paired[d].empty()) {  // a pair stays one only if both of it stay
        std::vector<char> kept;
        for (size_t i = 0; i < acts.size(); ++i)
          if (!dropped(acts[i]))
            kept.push_back(s.is_paired(d, i) && i + 1 < acts.size() && !dropped(acts[i + 1]));
        s.paired[d] = std::move(kept);
      }
      acts.erase(std::remove_if(acts.begin(), acts.end(), dropped), acts.end());
    }
  }
}

namespace {

// F0 B0 F1 B1 ...: each forward directly followed by its own backward, no W, at least two micro-batches
// (the caller has checked that every action is of the one stage).
bool no_pipelining_order(const std::vector<Action>& a) {
  if (a.size() < 4 || a.size() % 2 != 0) return false;
  for (size_t i = 0; i < a.size(); i += 2)
    if (a[i].pass != Pass::Forward || a[i + 1].pass != Pass::Backward ||
        a[i].micro_batch != a[i + 1].micro_batch)
      return false;
  return true;
}

}  // namespace

void combine_no_pipelining(Schedule& s) {
  // Only a schedule without a pipeline: every action of every device on stage 0. (The last stage of a
  // 1F1B pipeline runs F0 B0 F1 B1 ... too, and must keep it: its backwards feed the stages before.)
  for (const auto& a : s.device_actions)
    for (const Action& x : a)
      if (x.stage != 0) return;
  for (auto& a : s.device_actions) {
    if (!no_pipelining_order(a)) continue;
    std::vector<Action> out;
    out.reserve(a.size());
    out.push_back(a[0]);
    for (size_t k = 2; k < a.size(); k += 2) {
      out.push_back(a[k]);      // forward of micro-batch k / 2
      out.push_back(a[k - 1]);  // backward of the one before
    }
    out.push_back(a.back());
    a = std::move(out);
  }
}

void pair_forward_backward(Schedule& s) {
  // A schedule that pairs already (interleaved-1f1b's steady state under the overlap, a file's
  // OVERLAP_F_B cells) keeps exactly its pairs.
  for (const auto& d : s.paired)
    if (std::find(d.begin(), d.end(), 1) != d.end()) return;
  if (s.source.empty()) combine_no_pipelining(s);
  s.paired.resize(s.device_actions.size());
  for (size_t d = 0; d < s.device_actions.size(); ++d) {
    const auto& a = s.device_actions[d];
    s.paired[d].resize(a.size(), 0);
    for (size_t i = 0; i + 1 < a.size(); ++i)
      if (a[i].pass == Pass::Forward && a[i + 1].pass == Pass::Backward &&
          a[i].micro_batch != a[i + 1].micro_batch && !(i > 0 && s.paired[d][i - 1])) {
        s.paired[d][i] = 1;
        ++i;
      }
  }
}

}  // namespace pipegrid
