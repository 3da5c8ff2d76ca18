// Vocab-parallel tables and loss: a table whose rows split over mesh.tensor like the vocabulary (the token
// embedding and the tied unembedding, Engram's memory tables), each rank looking up the rows it holds, and
// the cross-entropy whose per-row statistics the tensor ranks combine. The tensor collectives of the
// embedding, the loss and Engram's lookup are declared here.
// Legend: N tokens, V vocabulary rows on this rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "meshtrain/model/spec_builder.h"

namespace meshtrain {

// Rank r of `degree` holds rows [r rows, (r + 1) rows) of a table of `rows x degree` rows (padded as the
// vocabulary: a multiple of 128 and of the degree, so the global table has the same shape on any mesh whose
// degree divides 128).
struct TableShard {
  int64_t rows = 0;         // on this rank
  int64_t global_rows = 0;  // rows x degree: ids are checked against the whole table on every rank
  bool split = false;       // degree > 1
  // This rank's first global row (0 unsplit or outside a tensor group).
  int64_t row_offset(const OpContext& context) const {
    return split && context.tensor ? context.tensor->rank * rows : 0;
  }
  // The rank that adds what every rank would otherwise add once each (the learned positions).
  bool first_rank(const OpContext& context) const {
    return !split || !context.tensor || context.tensor->rank == 0;
  }
};

// The shard of a table of `rows` rows along `logical_axis` ("vocab", "engram_rows").
TableShard table_shard(const SpecBuilder& builder, const std::string& logical_axis, int64_t rows);

// Each tensor rank looks up the rows it holds (zeros elsewhere): the sum over tensor is the lookup.
std::vector<OpDecl> table_lookup_reduction(const SpecBuilder& builder, const std::string& name,
                                           BufferId lookup);

// The vocab-parallel cross-entropy's traffic: ranks exchange per-token max, sum of exponentials and target
// logit. These ops only count it (a float max and two doubles per token: 5 floats' worth of `N` tokens, in
// a scratch of that size); the loss op moves it chunk by chunk through loss_reductions(). None unsplit.
struct VocabParallelLoss {
  TableShard vocab;
  std::vector<OpDecl> statistics;  // the accounting ops, before the loss op
  // The loss op's mid-kernel reductions over tensor (none unsplit or outside a tensor group).
  std::optional<kernels::VocabParallel> loss_reductions(const OpContext& context) const;
};
VocabParallelLoss vocab_parallel_loss(SpecBuilder& builder, const TableShard& vocab, int64_t N);

// The hidden state's gradient after a vocab-parallel unembedding is a partial sum over the vocab shards.
std::vector<OpDecl> hidden_gradient_reduction(const SpecBuilder& builder, BufferId d_hidden);

}  // namespace meshtrain
