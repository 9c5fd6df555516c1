#include "core/schedule.h"

#include <fmt/format.h>

#include <charconv>

namespace pipegrid {

char pass_letter(Pass p) {
  switch (p) {
    case Pass::Forward: return 'F';
    case Pass::Backward: return 'B';
    case Pass::Weight: return 'W';
  }
  return '?';
}

std::string to_string(const Action& a) { return fmt::format("{}{}{}", a.stage, pass_letter(a.pass), a.micro_batch); }

Result<Action> parse_action(std::string_view text) {
  auto fail = [&] {
    return Error{fmt::format("expected an action like \"2F0\" (stage, F/B/W, micro-batch), got \"{}\"", text)};
  };
  Action a;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  auto r1 = std::from_chars(p, end, a.stage);
  if (r1.ec != std::errc() || r1.ptr == end) return fail();
  switch (*r1.ptr) {
    case 'F': a.pass = Pass::Forward; break;
    case 'B': case 'I': a.pass = Pass::Backward; break;
    case 'W': a.pass = Pass::Weight; break;
    default: return fail();
  }
  auto r2 = std::from_chars(r1.ptr + 1, end, a.micro_batch);
  if (r2.ec != std::errc() || r2.ptr != end || a.stage < 0 || a.micro_batch < 0) return fail();
  return a;
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

}  // namespace pipegrid
