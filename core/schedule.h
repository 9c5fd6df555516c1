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

// Where an action was read from (schedules read from files), 1-based.
struct SourcePosition {
  int line = 0;
  int column = 0;
};

struct Schedule {
  std::vector<std::vector<Action>> device_actions;  // indexed by cluster device index
  bool split_backward = false;                      // B is the input gradient only; W actions follow
  // paired[d][i] = 1: device d's action i (a forward) and action i + 1 (a backward of another
  // micro-batch) run as one overlapped unit (DualPipe's F&B chunks, Megatron-Core's
  // --overlap-moe-expert-parallel-comm): the unit starts once both have their inputs, and on stages
  // whose passes are pieces separated by collectives the two interleave (F piece, B piece, ...), so
  // that one's collectives run beside the other's compute. Empty: no pairs.
  std::vector<std::vector<char>> paired;
  bool is_paired(size_t d, size_t i) const {
    return d < paired.size() && i < paired[d].size() && paired[d][i];
  }
  // For schedules read from a file: its name and each action's position (same shape as
  // device_actions); empty otherwise.
  std::string source;
  std::vector<std::vector<SourcePosition>> positions;

  // "<source>:<line>:<column>: " for an action read from a file, "" otherwise.
  std::string location(size_t device, size_t index) const;
};

struct Partition;

// Round-robin replicas (Stage::round_robin): drops from each replica device the actions of the
// micro-batches another replica of that stage takes, so a schedule plug-in's per-stage order (every
// replica alike) becomes each replica's turns, in the same order. A subsequence of a valid order on
// every device stays deadlock-free. Schedules read from a file are left as written (the validator
// checks them).
void keep_round_robin_turns(Schedule& s, const Partition& p);

// Megatron-Core's --overlap-moe-expert-parallel-comm: on each device, every forward directly
// followed by a backward of another micro-batch forms an overlapped pair with it (Schedule::paired);
// a schedule that has pairs already (interleaved-1f1b built with ScheduleRequest::a2a_overlap pairs its
// steady state only, as Megatron-Core does; a file's OVERLAP_F_B cells) keeps exactly those. A device
// without a pipeline (F0 B0 F1 B1 ...) first takes Megatron-Core's combined order for it
// (combine_no_pipelining), unless the schedule was read from a file.
void pair_forward_backward(Schedule& s);

// Megatron-Core's schedule without pipelining under --overlap-moe-expert-parallel-comm
// (megatron/core/pipeline_parallel/combined_1f1b.py, combined_1f1b_schedule_for_no_pipelining, at
// d98e8a64dd): the first micro-batch's forward alone, then micro-batch k's forward with micro-batch
// k - 1's backward, then the last backward alone. In a schedule of one stage (no pipeline), on every
// device whose actions are F0 B0 F1 B1 ... (at least two micro-batches, no split backward) the order
// becomes F0 F1 B0 F2 B1 ... F(m-1) B(m-2) B(m-1); a pipeline's schedule is left as it is.
void combine_no_pipelining(Schedule& s);

// One line per device that has actions: "<name>: 0F0 0F1 ... 0B7" (a pair: "(3F1;0B0)").
std::string to_text(const Schedule& s, const std::vector<std::string>& device_names);

// torch.distributed.pipelining's CSV: one row per rank (device), one action per cell; an overlapped
// pair (Schedule::paired) is one cell as torch writes its OVERLAP_F_B action, "(3F1;0B0)OVERLAP_F_B".
std::string to_csv(const Schedule& s);

// Reads that CSV. Empty cells and "None" are idle steps; torch's communication and sharding cells
// (SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, REDUCE_GRAD) are accepted and ignored, since
// pipegrid inserts communication itself; "I" (torch's input-gradient backward) reads as B; an
// OVERLAP_F_B cell (a forward and a backward, either order) is a pair, forward first. The backward
// counts as split when any W appears. Errors name "<name>:<line>:<column>".
Result<Schedule> parse_schedule_csv(std::string_view text, std::string_view name);

// The placement a schedule read from a file implies, for a partition of `ranks` x `chunks` stages whose
// rank q is devices q x devices_per_rank ..: stage s on the rank whose rows run it. Empty unless every
// stage runs on exactly one rank and every rank runs `chunks` stages (the partition then keeps its own
// rule and the validator names what disagrees). torch's V schedules (ScheduleDualPipeV,
// ScheduleZBVZeroBubble) place stages s and 2 ranks - 1 - s on rank s, not s mod ranks.
std::vector<int> file_stage_ranks(const Schedule& s, int ranks, int chunks, int devices_per_rank);

// torch's _format_pipeline_order layout: a header of ranks, then one row per step with each
// rank's action at that position of its list (a pair in one cell, "(3F1;0B0)", as to_text).
std::string to_grid(const Schedule& s, const std::vector<std::string>& device_names);

}  // namespace pipegrid
