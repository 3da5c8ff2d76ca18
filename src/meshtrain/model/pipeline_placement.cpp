// Pipeline stages' layer placement: the chunks' layer ranges and their stage ranks (pipeline_placement.h).
#include "meshtrain/model/pipeline_placement.h"

#include <numeric>
#include <string>

#include "meshtrain/core/error.h"

namespace meshtrain {
namespace {

std::string text_of(int64_t value) {
  return std::to_string(value);
}

// "[4, 4, 3]"
std::string list_text(const std::vector<int64_t>& values) {
  std::string text;
  for (int64_t value : values) text += (text.empty() ? "" : ", ") + text_of(value);
  return "[" + text + "]";
}

// Equal chunks, the first L mod chunks one layer longer.
std::vector<int64_t> default_split(int64_t layers, int64_t chunks) {
  std::vector<int64_t> split(static_cast<size_t>(chunks), layers / chunks);
  for (int64_t c = 0; c < layers % chunks; ++c) split[static_cast<size_t>(c)] += 1;
  return split;
}

// The explicit split's rules: one positive count a chunk, summing to the layer count.
void check_split(const std::vector<int64_t>& split, int64_t chunks, const std::string& chunk_count,
                 int64_t layers) {
  const std::string where = "config key 'pipeline_layers_per_chunk'";
  const std::string suggestion = "the default placement is " + list_text(default_split(layers, chunks)) +
                                 "; or leave the key empty ([]) to use it";
  if (static_cast<int64_t>(split.size()) != chunks) {
    fail(
        where, chunk_count + " layer counts, one a chunk in layer order",
        text_of(static_cast<int64_t>(split.size())) + " (" + list_text(split) + ")",
        "give one count a chunk summing to base_num_decoder_layers = " + text_of(layers) + ": " + suggestion);
  }
  for (size_t c = 0; c < split.size(); ++c) {
    if (split[c] < 1) {
      fail(where, "a positive layer count for every chunk",
           text_of(split[c]) + " for chunk " + text_of(static_cast<int64_t>(c)) + " (" + list_text(split) +
               ")",
           "every chunk holds at least one layer: " + suggestion);
    }
  }
  const int64_t sum = std::accumulate(split.begin(), split.end(), int64_t{0});
  if (sum != layers) {
    fail(where, "counts summing to base_num_decoder_layers = " + text_of(layers),
         "a sum of " + text_of(sum) + " (" + list_text(split) + ")", "place every layer once: " + suggestion);
  }
}

}  // namespace

std::vector<int64_t> PipelinePlacement::chunks_of(int64_t stage) const {
  std::vector<int64_t> held;
  for (int64_t chunk = stage; chunk < static_cast<int64_t>(chunks.size()); chunk += stages)
    held.push_back(chunk);
  return held;
}

PipelinePlacement pipeline_placement(const Config& config, int64_t stages) {
  MT_CHECK(stages >= 1, "a resolved mesh.stage");
  const int64_t layers = config.base_num_decoder_layers, V = config.num_pipeline_repeats;
  if (V < 1) {
    fail("config key 'num_pipeline_repeats'", "1 or more chunks a stage rank (1 except for interleaved_1f1b)",
         text_of(V), "set num_pipeline_repeats=1, or 2 or more with pipeline_schedule=interleaved_1f1b");
  }
  const int64_t chunks = stages * V;
  const std::string chunk_count =
      "mesh.stage x num_pipeline_repeats = " + text_of(stages) + " x " + text_of(V) + " = " + text_of(chunks);
  if (chunks > layers) {
    fail("config keys 'mesh.stage' / 'num_pipeline_repeats'",
         "at most base_num_decoder_layers = " + text_of(layers) + " chunks (each holds at least one layer)",
         chunk_count + " chunks",
         "use fewer stages or repeats, so that mesh.stage x num_pipeline_repeats <= " + text_of(layers));
  }
  PipelinePlacement placement;
  placement.stages = stages;
  placement.repeats = V;
  placement.explicit_split = !config.pipeline_layers_per_chunk.empty();
  const std::vector<int64_t> split =
      placement.explicit_split ? config.pipeline_layers_per_chunk : default_split(layers, chunks);
  if (placement.explicit_split) check_split(split, chunks, chunk_count, layers);
  int64_t first = 0;
  for (size_t c = 0; c < split.size(); ++c) {
    placement.chunks.push_back({first, first + split[c] - 1, c == 0, c + 1 == split.size()});
    first += split[c];
  }
  return placement;
}

}  // namespace meshtrain
