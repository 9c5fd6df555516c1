#include "core/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>

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

std::string to_csv(const Schedule& s) {
  std::string out;
  for (const auto& row : s.device_actions) {
    for (size_t i = 0; i < row.size(); ++i) {
      if (i) out += ',';
      out += to_string(row[i]);
    }
    out += '\n';
  }
  return out;
}

Result<Schedule> parse_schedule_csv(std::string_view text, std::string_view name) {
  Schedule s;
  s.source = std::string(name);
  size_t line = 0;
  // A UTF-8 byte-order mark, as spreadsheets save CSV, is not part of the first cell.
  size_t pos = text.starts_with("\xEF\xBB\xBF") ? 3 : 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view row = text.substr(pos, eol - pos);
    if (!row.empty() && row.back() == '\r') row.remove_suffix(1);
    ++line;
    std::vector<Action> actions;
    std::vector<SourcePosition> positions;
    size_t col = 0;
    while (col <= row.size()) {
      size_t comma = row.find(',', col);
      if (comma == std::string_view::npos) comma = row.size();
      std::string_view cell = row.substr(col, comma - col);
      size_t lead = 0;
      while (lead < cell.size() && (cell[lead] == ' ' || cell[lead] == '\t' || cell[lead] == '"')) ++lead;
      const size_t cell_col = col + lead + 1;
      cell.remove_prefix(lead);
      while (!cell.empty() && (cell.back() == ' ' || cell.back() == '\t' || cell.back() == '"'))
        cell.remove_suffix(1);
      col = comma + 1;
      if (cell.empty() || cell == "None") continue;
      bool ignored = false;
      for (std::string_view comm :
           {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"})
        if (cell.find(comm) != std::string_view::npos) ignored = true;
      if (ignored) continue;
      Result<Action> a = parse_action(cell);
      if (!a) return Error{fmt::format("{}:{}:{}: {}", name, line, cell_col, a.error().message)};
      if (a->pass == Pass::Weight) s.split_backward = true;
      actions.push_back(*a);
      positions.push_back({static_cast<int>(line), static_cast<int>(cell_col)});
    }
    s.device_actions.push_back(std::move(actions));
    s.positions.push_back(std::move(positions));
    pos = eol + 1;
  }
  while (!s.device_actions.empty() && s.device_actions.back().empty()) {
    s.device_actions.pop_back();
    s.positions.pop_back();
  }
  if (s.device_actions.empty()) return Error{fmt::format("{}: the schedule has no action", name)};
  return s;
}

std::string to_grid(const Schedule& s, const std::vector<std::string>& names) {
  size_t steps = 0;
  for (const auto& row : s.device_actions) steps = std::max(steps, row.size());
  const size_t width = 8;
  std::string out = fmt::format("{:<6}", "step");
  for (size_t d = 0; d < s.device_actions.size(); ++d)
    out += fmt::format(" {:<{}}", d < names.size() ? names[d] : fmt::format("rank {}", d), width);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (size_t i = 0; i < steps; ++i) {
    out += fmt::format("{:<6}", i);
    for (const auto& row : s.device_actions)
      out += fmt::format(" {:<{}}", i < row.size() ? to_string(row[i]) : "", width);
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
    for (const Action& a : s.device_actions[d]) out += ' ' + to_string(a);
    out += '\n';
  }
  return out;
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
      acts.erase(std::remove_if(acts.begin(), acts.end(),
                                [&](const Action& a) {
                                  return a.stage == static_cast<int>(st) &&
                                         a.micro_batch % stage.replicas() != replica;
                                }),
                 acts.end());
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
