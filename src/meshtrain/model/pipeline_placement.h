// Pipeline stages' layer placement (shared/specs/pipeline.md): the decoder's layers cut into
// mesh.stage x num_pipeline_repeats contiguous chunks, and which stage rank holds which chunks.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/model/spec.h"

namespace meshtrain {

// P = mesh.stage stage ranks, V = num_pipeline_repeats chunks each: P x V chunks in layer order, chunk c on
// stage rank c mod P, so rank s holds chunks s, s + P, ..., s + (V - 1) P (round robin: Megatron's
// interleaved placement, MaxText's circular pipeline). The first chunk holds the embedding (and GPT-2's
// position table), the last the final norm, the unembedding and the loss; with tied embeddings
// (logits_via_embedding) both hold the table.
struct PipelinePlacement {
  int64_t stages = 1;              // P
  int64_t repeats = 1;             // V
  std::vector<LayerChunk> chunks;  // P x V, in layer order, last_layer resolved
  bool explicit_split = false;     // from pipeline_layers_per_chunk (else the default placement)

  int64_t stage_of(int64_t chunk) const { return chunk % stages; }
  // The chunks stage rank `stage` holds, in layer order.
  std::vector<int64_t> chunks_of(int64_t stage) const;
};

// The placement of the config's base_num_decoder_layers L over `stages` (mesh.stage, resolved) stage ranks:
// pipeline_layers_per_chunk when given, else the default: equal chunks where P x V divides L, otherwise one
// extra layer on each of the first L mod (P x V) chunks (Megatron's and torchtitan's even split;
// deepseek-v3's 61 layers over 16 stages: 13 chunks of 4, then 3 of 3). Refused before anything is
// allocated (MeshError naming the keys, their values and the fix): num_pipeline_repeats < 1; more chunks
// than layers; a split of another length than P x V, with an entry below 1, or whose sum is not L. (Which
// V a schedule takes is the schedule's rule: plan/pipeline_schedule.h.)
PipelinePlacement pipeline_placement(const Config& config, int64_t stages);

}  // namespace meshtrain
