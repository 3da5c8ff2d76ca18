#include "meshtrain/checkpoint/checkpoint_layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <optional>

#include "meshtrain/core/error.h"
#include "meshtrain/core/json_number.h"

namespace meshtrain {
namespace {

int64_t product(std::vector<int64_t>::const_iterator begin, std::vector<int64_t>::const_iterator end) {
  int64_t count = 1;
  for (auto it = begin; it != end; ++it) count *= *it;
  return count;
}

}  // namespace

CheckpointLayout::CheckpointLayout(const Config& model, bool stacked, int64_t scan_axis)
    : segments_(decoder_segments(model)), stacked_(stacked), scan_axis_(scan_axis) {}

CheckpointLayout CheckpointLayout::saved(const nlohmann::json& metadata, const Config& model,
                                         const std::string& metadata_path) {
  const std::string hint = "the checkpoint is damaged or not a meshtrain checkpoint; use another checkpoint";
  bool stacked = false;
  int64_t scan_axis = 1;
  if (metadata.is_object() && metadata.contains("scan_layers")) {
    const nlohmann::json& value = metadata.at("scan_layers");
    if (!value.is_boolean()) fail(metadata_path, "scan_layers as true or false", value.dump(), hint);
    stacked = value.get<bool>();
  }
  if (metadata.is_object() && metadata.contains("param_scan_axis")) {
    // An axis below 0 would place a stacked tensor's layer axis before its first dim.
    scan_axis = json_integer(metadata.at("param_scan_axis"), 0, std::numeric_limits<int64_t>::max(),
                             metadata_path, "param_scan_axis", hint);
  }
  return CheckpointLayout(model, stacked, scan_axis);
}

CheckpointTensorPlace CheckpointLayout::place(const std::string& name,
                                              const std::vector<int64_t>& dims) const {
  CheckpointTensorPlace whole{name, dims, -1, 0};
  if (!stacked_) return whole;
  const size_t decoder = name.find("decoder/layers_");
  if (decoder == std::string::npos) return whole;
  const std::optional<std::pair<int64_t, std::string>> split = split_per_layer_name(name.substr(decoder));
  if (!split) return whole;
  const std::optional<ScanPlace> scan = scan_place(segments_, split->first);
  if (!scan) return whole;  // a single layer keeps its per-layer names
  CheckpointTensorPlace place;
  place.name = name.substr(0, decoder) + stacked_name(scan->group, split->second);
  place.axis = std::min<int64_t>(scan_axis_, static_cast<int64_t>(dims.size()));
  place.dims = dims;
  place.dims.insert(place.dims.begin() + place.axis, scan->count);
  place.index = scan->index;
  return place;
}

void CheckpointLayout::read(const SafetensorsFile& file, const CheckpointTensorPlace& place, float* out) {
  if (place.index < 0) {
    file.read_f32(place.name, place.dims, out);
    return;
  }
  // Layer `index` of [outer..., count, inner...]: `outer` runs of `inner` elements, count * inner apart.
  const auto axis = place.dims.begin() + place.axis;
  const int64_t outer = product(place.dims.begin(), axis), inner = product(axis + 1, place.dims.end());
  file.read_f32_blocks(place.name, place.dims, place.index * inner, outer, inner, *axis * inner, out);
}

}  // namespace meshtrain
