#include "meshtrain/model/segments.h"

#include "meshtrain/model/layers/moe.h"

namespace meshtrain {

std::vector<LayerSegment> decoder_segments(const Config& config) {
  std::vector<LayerSegment> segments;
  for (int64_t layer = 0; layer < config.base_num_decoder_layers; ++layer) {
    const bool engram = engram_layer(config, layer);
    const std::string kind =
        std::string(moe_layer(config, layer) ? "moe" : "dense") + (engram ? "+engram" : "");
    // An Engram layer's tables have sizes no other layer's have: it never joins a group.
    if (!engram && !segments.empty() && segments.back().group && segments.back().kind == kind) {
      ++segments.back().count;
      continue;
    }
    segments.push_back({kind, layer, 1, !engram});
  }
  return segments;
}

std::string segments_text(const std::vector<LayerSegment>& segments) {
  std::string text;
  for (const LayerSegment& segment : segments) {
    text += (text.empty() ? "" : " | ") + segment.kind + " " + std::to_string(segment.first);
    if (segment.group) text += ".." + std::to_string(segment.first + segment.count - 1);
  }
  return text;
}

}  // namespace meshtrain
