#include "meshtrain/model/segments.h"

#include <map>

#include "meshtrain/model/options.h"

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

std::vector<std::string> scan_group_names(const std::vector<LayerSegment>& segments) {
  std::map<std::string, int> groups_of_kind;
  size_t groups = 0;
  for (const LayerSegment& segment : segments) {
    if (!segment.group) continue;
    ++groups;
    ++groups_of_kind[segment.kind];
  }
  std::vector<std::string> names;
  for (const LayerSegment& segment : segments) {
    if (!segment.group) {
      names.emplace_back();
    } else if (groups == 1) {
      names.emplace_back("layers");
    } else {
      std::string name = segment.kind + "_layers";
      for (char& c : name) {
        if (c == '+') c = '_';
      }
      if (groups_of_kind[segment.kind] > 1) name += "_at_" + std::to_string(segment.first);
      names.push_back(name);
    }
  }
  return names;
}

std::optional<ScanPlace> scan_place(const std::vector<LayerSegment>& segments, int64_t layer) {
  const std::vector<std::string> names = scan_group_names(segments);
  for (size_t s = 0; s < segments.size(); ++s) {
    const LayerSegment& segment = segments[s];
    if (layer < segment.first || layer >= segment.first + segment.count) continue;
    if (!segment.group) return std::nullopt;
    return ScanPlace{names[s], layer - segment.first, segment.count};
  }
  return std::nullopt;
}

namespace {
const std::string kPerLayerPrefix = "decoder/layers_";
}  // namespace

std::string per_layer_name(int64_t layer, const std::string& rest) {
  return kPerLayerPrefix + std::to_string(layer) + "/" + rest;
}

std::string stacked_name(const std::string& group, const std::string& rest) {
  return "decoder/" + group + "/" + rest;
}

std::optional<std::pair<int64_t, std::string>> split_per_layer_name(const std::string& name) {
  if (name.rfind(kPerLayerPrefix, 0) != 0) return std::nullopt;
  const size_t digits = kPerLayerPrefix.size(), slash = name.find('/', digits);
  if (slash == std::string::npos || slash == digits) return std::nullopt;
  int64_t layer = 0;
  for (size_t i = digits; i < slash; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  return std::make_pair(layer, name.substr(slash + 1));
}

}  // namespace meshtrain
