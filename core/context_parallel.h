// Context parallelism as Megatron-Core runs it with Transformer Engine (Megatron-Core's
// context_parallel guide; TE's attention/dot_product_attention/context_parallel.py; docs/
// context-parallelism.md): each data-parallel replica's sequence of s tokens is split over cp groups
// of t devices (rank order tp-cp-dp), every layer but the attention core runs on its s / cp tokens,
// and the attention core exchanges keys and values (or, for a2a, queries, keys, values and outputs)
// over the context-parallel group. Gradients reduce over the data x context-parallel group.
//
// Sequence split: with load balancing (Megatron's default, TE's "DualChunkSwap") the sequence is cut
// into 2 cp chunks and rank r holds chunks r and 2 cp - 1 - r, which gives every rank the same causal
// work; without it (a naive contiguous split, kept to show why balancing matters) rank r holds tokens
// [r s / cp, (r + 1) s / cp) and later ranks attend to more keys.
//
// Attention work is counted in blocks: one block is the (s / cp) x (s / cp) scores of a rank's
// queries against one rank's keys (all of the device's heads), unmasked.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "core/workload.h"

namespace pipegrid {

// Megatron-Core's --cp-comm-type (a2a+p2p, the hierarchical combination, is not modelled).
enum class CpAlgorithm : unsigned char {
  // Ring attention over point-to-point transfers: cp steps; at the start of step i every rank sends
  // the K/V block it holds to the next rank (cp - 1 transfers) while computing on it. Backward (TE
  // reverses the ring; modelled in the forward's direction): step 0 sends K/V, steps 1 .. cp - 2
  // send K/V and the partial dK/dV, and after the last step the dK/dV reach their owner (cp
  // transfers, the last one exposed).
  P2P,
  // Llama 3's: all-gather K and V (exposed), attend, and in the backward all-gather them again and
  // reduce-scatter dK, dV.
  AllGather,
  // DeepSpeed-Ulysses: all-to-all of Q, K, V (sequence split to heads split) before the core and of
  // the output after it; the backward mirrors them. Heads and KV heads per device divisible by cp.
  AllToAll,
};
std::string_view to_string(CpAlgorithm a);  // "p2p", "all_gather", "a2a"
std::optional<CpAlgorithm> parse_cp_algorithm(std::string_view name);

struct ContextParallelOptions {
  CpAlgorithm algorithm = CpAlgorithm::P2P;
  bool load_balance = true;  // zigzag chunks (Megatron's and TE's); false: contiguous split
};

// A device's place in its context-parallel group: the size and its rank.
struct ContextRank {
  int cp = 1, rank = 0;
};

// The attention core's work on context-parallel rank `r.rank`, per step of the algorithm, in blocks
// (see above): p2p has cp steps (causal and balanced: 1/2 block each; causal and contiguous: 1/2 at
// step 0, 1 for the steps whose K/V come from an earlier rank, 0 for those from a later one; not
// causal: 1 each); all_gather and a2a one step with the same total (a2a: the whole causal sequence
// on heads / cp, cp / 2 blocks, whatever the split). Causal total over the ranks: cp^2 / 2 blocks,
// i.e. s^2 / 2 scores per head.
std::vector<double> attention_step_work(const ContextRank& r, const ContextParallelOptions& o, bool causal);

// Bytes per sample of the K and V of a device's s / cp tokens (what a p2p ring step sends; the
// all-gather's input), and of its Q, K, V and output (the a2a's), under tensor parallelism t.
double kv_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes);
double qkv_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes);
double output_block_bytes(const TensorSplit& sp, int t, int cp, double element_bytes);

// Fails unless cp splits the layer as the algorithm needs: the sequence into 2 cp chunks (balanced)
// or cp chunks, the heads and KV heads of a device (heads / t) into cp groups (a2a), no sliding
// window (not modelled). The message names the layer.
Status check_context_parallel(const Layer& l, int t, int cp, const ContextParallelOptions& o);

}  // namespace pipegrid
