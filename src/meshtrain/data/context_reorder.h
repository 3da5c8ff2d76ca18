// The sequence reorder of context parallelism (shared/specs/context-parallel.md): the permutation of one
// sequence laid over the context ranks, and the cut of a batch into one context rank's shard (every
// per-token field permuted together, positions keeping their original values, as RoPE and the causal mask
// need them).
//
// Legend: B batch rows, S sequence length (max_target_length), C context ranks (mesh.context), r a context
// rank, L = S / C tokens per rank, g = S / (2C) chunk length under dual_chunk_swap.
// Natural index i: a token's place in the row as the loader made it. Reordered position p: its place after
// the permutation; rank r holds reordered positions [r L, (r + 1) L), in that order.
//   none:            p = i.
//   dual_chunk_swap: the row is cut into 2C chunks of g; rank r holds chunks r and 2C-1-r, in that order.
//                    Source of p: r = p / 2g, w = p % 2g, chunk = (w < g ? r : 2C-1-r), i = chunk g + w % g.
//                    C = 2, S = 8: natural [0 1 2 3 4 5 6 7] -> reordered [0 1 6 7 2 3 4 5].
//   striped:         rank r holds i = r, r + C, r + 2C, ...: source of p = r L + k is i = k C + r.
// With causal attention a rank's work is the number of (query, key) pairs with key index <= query index over
// its queries: a plain split (none) gives rank r about (2r + 1) / C^2 of it, dual_chunk_swap exactly 1 / C,
// striped 1 / C to within L (C - 1) pairs.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/data/batch.h"
#include "meshtrain/mesh/context_reorder.h"

namespace meshtrain {

// How one sequence of S tokens is laid over C context ranks. Only a valid layout can be built, so the
// index functions below need no checks of their own.
class ContextLayout {
 public:
  // Throws MeshError naming max_target_length, mesh.context and the reorder key when S does not split:
  // dual_chunk_swap needs S % (2C) == 0, striped and none S % C == 0. With C = 1 every reorder is the
  // identity (and S may be anything), so the layout's reorder() is none.
  ContextLayout(ContextReorder reorder, int64_t sequence_length, int64_t context_ranks);

  ContextReorder reorder() const { return reorder_; }
  int64_t sequence_length() const { return sequence_length_; }               // S
  int64_t context_ranks() const { return context_ranks_; }                   // C
  int64_t rank_length() const { return sequence_length_ / context_ranks_; }  // L = S / C

  // The natural index that reordered position `reordered` (in [0, S)) comes from.
  int64_t source(int64_t reordered) const;
  // The reordered position of natural index `natural` (in [0, S)): the inverse of source().
  int64_t destination(int64_t natural) const;
  std::vector<int64_t> sources() const;       // [S] source(p) for every reordered position p
  std::vector<int64_t> destinations() const;  // [S] destination(i) for every natural index i
  // [L] the natural indices context rank `rank` holds, in its order: source(rank L + k) for k in [0, L).
  std::vector<int64_t> rank_sources(int64_t rank) const;

 private:
  ContextReorder reorder_;
  int64_t sequence_length_;
  int64_t context_ranks_;
};

// [C] the causal attention work of each context rank: the (query, key) pairs with key index <= query index
// over the queries it holds, sum over its natural indices i of (i + 1). No document mask (packed rows only
// remove pairs), as the planned attention FLOPs assume. The ranks together count S (S + 1) / 2.
// C = 2, S = 8: none {10, 26}, dual_chunk_swap {18, 18}, striped {16, 20}.
std::vector<int64_t> attention_pairs_per_context_rank(const ContextLayout& layout);

// Context rank `rank`'s shard of `rows` ([B, S] per field -> [B, L]): in each row, the tokens at
// layout.rank_sources(rank). Tokens, targets, positions, segment ids and the loss mask travel together;
// positions keep their original values (the shard's positions are not 0..L-1).
Batch context_shard(const Batch& rows, const ContextLayout& layout, int64_t rank);

// The inverse gather: the C shards of context_shard, in rank order ([B, L] each), back to natural order
// ([B, S]). For tests and for anything that must see the row in natural order.
Batch context_unshard(const std::vector<Batch>& shards, const ContextLayout& layout);

}  // namespace meshtrain
