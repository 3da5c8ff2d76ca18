// The context-parallel sequence reorder: index formulas (legend and formulas in context_reorder.h) and the
// batch shard / unshard built on them.
#include "meshtrain/data/context_reorder.h"

#include <algorithm>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

// How the user chose `reorder`, as the keys they would edit to change it.
std::string reorder_setting(ContextReorder reorder) {
  if (reorder == ContextReorder::none) return "context_parallel_load_balance=false";
  return std::string("context_parallel_reorder=") + context_reorder_name(reorder);
}

// "96 or 104": the multiples of `divisor` on either side of `value` (only the upper one below `divisor`).
std::string nearest_multiples(int64_t value, int64_t divisor) {
  const int64_t below = value / divisor * divisor;
  const std::string above = std::to_string(below + divisor);
  return below > 0 ? std::to_string(below) + " or " + above : above;
}

void check_sequence_splits(ContextReorder reorder, int64_t sequence_length, int64_t context_ranks) {
  const std::string length_text = std::to_string(sequence_length);
  const std::string ranks_text = std::to_string(context_ranks);
  if (context_ranks < 1) {
    fail("config key 'mesh.context'", "a context degree >= 1", ranks_text, "set mesh.context to 1 or more");
  }
  if (sequence_length < 1) {
    fail("config key 'max_target_length'", "a sequence length >= 1", length_text,
         "set max_target_length to 1 or more");
  }
  if (context_ranks == 1) return;  // one rank holds the whole row whatever the reorder
  const std::string where = "config key 'max_target_length' (with mesh.context=" + ranks_text + " and " +
                            reorder_setting(reorder) + ")";
  if (reorder == ContextReorder::dual_chunk_swap) {
    const int64_t chunks = 2 * context_ranks;
    if (sequence_length % chunks == 0) return;
    const std::string chunks_text = "2 x mesh.context = " + std::to_string(chunks);
    std::string hint = "use a max_target_length that is a multiple of " + chunks_text + " (" +
                       nearest_multiples(sequence_length, chunks) + ")";
    if (sequence_length % context_ranks == 0) {
      hint += ", or context_parallel_reorder=striped, which needs only a multiple of mesh.context = " +
              ranks_text;
    }
    fail(where,
         "a multiple of " + chunks_text +
             " (dual_chunk_swap cuts every row into 2 x mesh.context equal chunks)",
         "max_target_length=" + length_text, hint);
  }
  if (sequence_length % context_ranks == 0) return;
  fail(where,
       "a multiple of mesh.context = " + ranks_text +
           " (each context rank holds max_target_length / mesh.context tokens of a row)",
       "max_target_length=" + length_text,
       "use a max_target_length that is a multiple of mesh.context = " + ranks_text + " (" +
           nearest_multiples(sequence_length, context_ranks) + "), or a mesh.context that divides " +
           length_text);
}

// One per-token field of [rows, in_width, inner] -> [rows, columns.size(), inner]:
// out[b, k, :] = values[b, columns[k], :] (inner: values per token, 1 but for Engram's hash ids).
template <typename Value>
std::vector<Value> gather_columns(const std::vector<Value>& values, int64_t rows, int64_t in_width,
                                  const std::vector<int64_t>& columns, int64_t inner = 1) {
  const int64_t out_width = static_cast<int64_t>(columns.size());
  std::vector<Value> gathered(static_cast<size_t>(rows * out_width * inner));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t k = 0; k < out_width; ++k) {
      const auto from = values.begin() + (b * in_width + columns[k]) * inner;
      std::copy(from, from + inner, gathered.begin() + (b * out_width + k) * inner);
    }
  }
  return gathered;
}

// The inverse of gather_columns into `out` ([rows, out_width, inner]): out[b, columns[k], :] = values[b, k,
// :].
template <typename Value>
void scatter_columns(const std::vector<Value>& values, int64_t rows, int64_t out_width,
                     const std::vector<int64_t>& columns, std::vector<Value>& out, int64_t inner = 1) {
  const int64_t in_width = static_cast<int64_t>(columns.size());
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t k = 0; k < in_width; ++k) {
      const auto from = values.begin() + (b * in_width + k) * inner;
      std::copy(from, from + inner, out.begin() + (b * out_width + columns[k]) * inner);
    }
  }
}

// Values per token of an Engram layer's hash ids ([B, S, inner]).
int64_t hash_ids_per_token(const std::vector<int32_t>& hash_ids, int64_t B, int64_t S) {
  MT_CHECK(B * S > 0 && hash_ids.size() % static_cast<size_t>(B * S) == 0,
           "Engram hash ids must be [B, S, heads]");
  return static_cast<int64_t>(hash_ids.size()) / (B * S);
}

// Rows of a batch whose fields are each [rows, width]; a mismatch is a bug in the caller, not user input.
int64_t batch_rows(const Batch& batch, int64_t width) {
  const size_t cells = batch.tokens.size();
  MT_CHECK(cells % static_cast<size_t>(width) == 0 && batch.targets.size() == cells &&
               batch.positions.size() == cells && batch.segment_ids.size() == cells &&
               batch.loss_mask.size() == cells,
           "every per-token field must be [B, " + std::to_string(width) + "]; tokens has " +
               std::to_string(cells) + " cells");
  return static_cast<int64_t>(cells) / width;
}

}  // namespace

ContextLayout::ContextLayout(ContextReorder reorder, int64_t sequence_length, int64_t context_ranks)
    : reorder_(context_ranks == 1 ? ContextReorder::none : reorder),
      sequence_length_(sequence_length),
      context_ranks_(context_ranks) {
  check_sequence_splits(reorder, sequence_length, context_ranks);
}

int64_t ContextLayout::source(int64_t reordered) const {
  MT_CHECK(reordered >= 0 && reordered < sequence_length_, "reordered position " + std::to_string(reordered));
  const int64_t C = context_ranks_, L = rank_length();
  switch (reorder_) {
    case ContextReorder::none:
      return reordered;
    case ContextReorder::dual_chunk_swap: {
      const int64_t g = L / 2;
      const int64_t rank = reordered / L, within = reordered % L;
      const int64_t chunk = within < g ? rank : 2 * C - 1 - rank;
      return chunk * g + within % g;
    }
    case ContextReorder::striped:
      return (reordered % L) * C + reordered / L;
  }
  MT_CHECK(false, "unknown ContextReorder");
  return 0;
}

int64_t ContextLayout::destination(int64_t natural) const {
  MT_CHECK(natural >= 0 && natural < sequence_length_, "natural index " + std::to_string(natural));
  const int64_t C = context_ranks_, L = rank_length();
  switch (reorder_) {
    case ContextReorder::none:
      return natural;
    case ContextReorder::dual_chunk_swap: {
      // Chunk k < C is the first half of rank k's slice; chunk k >= C the second half of rank 2C-1-k's.
      const int64_t g = L / 2;
      const int64_t chunk = natural / g, within = natural % g;
      return chunk < C ? chunk * L + within : (2 * C - 1 - chunk) * L + g + within;
    }
    case ContextReorder::striped:
      return (natural % C) * L + natural / C;
  }
  MT_CHECK(false, "unknown ContextReorder");
  return 0;
}

std::vector<int64_t> ContextLayout::sources() const {
  std::vector<int64_t> indices(static_cast<size_t>(sequence_length_));
  for (int64_t p = 0; p < sequence_length_; ++p) indices[p] = source(p);
  return indices;
}

std::vector<int64_t> ContextLayout::destinations() const {
  std::vector<int64_t> indices(static_cast<size_t>(sequence_length_));
  for (int64_t i = 0; i < sequence_length_; ++i) indices[i] = destination(i);
  return indices;
}

std::vector<int64_t> ContextLayout::rank_sources(int64_t rank) const {
  MT_CHECK(rank >= 0 && rank < context_ranks_,
           "context rank " + std::to_string(rank) + " of " + std::to_string(context_ranks_));
  const int64_t L = rank_length();
  std::vector<int64_t> indices(static_cast<size_t>(L));
  for (int64_t k = 0; k < L; ++k) indices[k] = source(rank * L + k);
  return indices;
}

std::vector<int64_t> attention_pairs_per_context_rank(const ContextLayout& layout) {
  std::vector<int64_t> pairs(static_cast<size_t>(layout.context_ranks()), 0);  // [C]
  for (int64_t rank = 0; rank < layout.context_ranks(); ++rank) {
    for (int64_t natural : layout.rank_sources(rank)) pairs[rank] += natural + 1;  // keys 0..natural
  }
  return pairs;
}

Batch context_shard(const Batch& rows, const ContextLayout& layout, int64_t rank) {
  const int64_t S = layout.sequence_length();
  const int64_t B = batch_rows(rows, S);
  const std::vector<int64_t> columns = layout.rank_sources(rank);  // [L]
  Batch shard;
  shard.tokens = gather_columns(rows.tokens, B, S, columns);            // [B, L]
  shard.targets = gather_columns(rows.targets, B, S, columns);          // [B, L]
  shard.positions = gather_columns(rows.positions, B, S, columns);      // [B, L] original positions
  shard.segment_ids = gather_columns(rows.segment_ids, B, S, columns);  // [B, L]
  shard.loss_mask = gather_columns(rows.loss_mask, B, S, columns);      // [B, L]
  // Hashed in natural order before this cut: they travel with their tokens.
  for (const std::vector<int32_t>& hash_ids : rows.engram_hash_ids) {
    shard.engram_hash_ids.push_back(
        gather_columns(hash_ids, B, S, columns, hash_ids_per_token(hash_ids, B, S)));  // [B, L, heads]
  }
  return shard;
}

Batch context_unshard(const std::vector<Batch>& shards, const ContextLayout& layout) {
  const int64_t S = layout.sequence_length(), L = layout.rank_length();
  MT_CHECK(static_cast<int64_t>(shards.size()) == layout.context_ranks(),
           "one shard per context rank: " + std::to_string(shards.size()) +
               " shards for mesh.context=" + std::to_string(layout.context_ranks()));
  const int64_t B = batch_rows(shards.front(), L);
  const size_t cells = static_cast<size_t>(B * S);
  Batch rows;
  rows.tokens.resize(cells);       // [B, S]
  rows.targets.resize(cells);      // [B, S]
  rows.positions.resize(cells);    // [B, S]
  rows.segment_ids.resize(cells);  // [B, S]
  rows.loss_mask.resize(cells);    // [B, S]
  for (int64_t rank = 0; rank < layout.context_ranks(); ++rank) {
    const Batch& shard = shards[rank];
    MT_CHECK(batch_rows(shard, L) == B, "every shard has the same rows");
    const std::vector<int64_t> columns = layout.rank_sources(rank);  // [L]
    scatter_columns(shard.tokens, B, S, columns, rows.tokens);
    scatter_columns(shard.targets, B, S, columns, rows.targets);
    scatter_columns(shard.positions, B, S, columns, rows.positions);
    scatter_columns(shard.segment_ids, B, S, columns, rows.segment_ids);
    scatter_columns(shard.loss_mask, B, S, columns, rows.loss_mask);
    rows.engram_hash_ids.resize(shard.engram_hash_ids.size());
    for (size_t layer = 0; layer < shard.engram_hash_ids.size(); ++layer) {
      const int64_t inner = hash_ids_per_token(shard.engram_hash_ids[layer], B, L);
      rows.engram_hash_ids[layer].resize(cells * static_cast<size_t>(inner));  // [B, S, heads]
      scatter_columns(shard.engram_hash_ids[layer], B, S, columns, rows.engram_hash_ids[layer], inner);
    }
  }
  return rows;
}

}  // namespace meshtrain
