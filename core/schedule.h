// The schedule IR: per device, an ordered list of actions. Schedules hold no times: the simulator
// supplies time. Text form as in torch.distributed.pipelining: "2F0" = stage 2, forward,
// micro-batch 0; "1B3" = backward; "1W3" = weight gradient (when the backward is split).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"

namespace pipegrid {

enum class Pass : unsigned char {
  Forward,   // F
  Backward,  // B: the whole backward, or the input-gradient part when the backward is split
  Weight,    // W: the weight-gradient part of a split backward
};

struct Action {
  int stage = 0;
  Pass pass = Pass::Forward;
  int micro_batch = 0;
  friend bool operator==(const Action&, const Action&) = default;
};

char pass_letter(Pass p);
std::string to_string(const Action& a);
// Accepts "<stage><F|B|W|I><micro-batch>"; torch's "I" (backward input) reads as B.
Result<Action> parse_action(std::string_view text);

struct Schedule {
  std::vector<std::vector<Action>> device_actions;  // indexed by cluster device index
  bool split_backward = false;                      // B is the input gradient only; W actions follow
};

// One line per device that has actions: "<name>: 0F0 0F1 ... 0B7".
std::string to_text(const Schedule& s, const std::vector<std::string>& device_names);

}  // namespace pipegrid
