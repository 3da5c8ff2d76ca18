// The decoder as segments (shared/specs/layers-and-checkpoints.md, "Segments and scan groups"), derived from
// the config: runs of consecutive, structurally identical layers (scan groups: same kind, the same parameter
// names and shapes), and single layers whose parameters no other layer shares the shapes of (an Engram
// layer: its tables' sizes are primes of its own). `scan_layers` (issue 14) stores a group's parameters as
// one tensor with a layer axis; the grouping itself never depends on it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct LayerSegment {
  std::string kind;   // "dense", "moe", "moe+engram", ...: what every layer of the segment is
  int64_t first = 0;  // global index of its first layer
  int64_t count = 1;  // layers [first, first + count)
  bool group = true;  // a scan group (stackable, even of one layer); false: a single layer of its own
};

// Every layer in exactly one segment, in order. A layer's kind is its feed-forward (dense or moe) plus
// "+engram" for an Engram layer; attention and mHC are the same on every layer of a model.
std::vector<LayerSegment> decoder_segments(const Config& config);

// "dense 0..0 | moe+engram 1 | moe 2..3 | moe+engram 4 | moe 5..5": a group as `kind first..last`, a single
// layer as `kind index`.
std::string segments_text(const std::vector<LayerSegment>& segments);

// The name of each segment's stacked tensors under scan_layers (parallel to `segments`; "" for a single
// layer, which keeps its per-layer names): "layers" when the decoder is one group, else "<kind>_layers"
// ("dense_layers", "moe_layers"), with "_at_<first>" on every group of a kind that has several.
std::vector<std::string> scan_group_names(const std::vector<LayerSegment>& segments);

// Where a layer's parameters are stacked under scan_layers: its group's name, its index in the group's
// layer axis and the group's length; nullopt for a single layer (and a layer outside the decoder).
struct ScanPlace {
  std::string group;
  int64_t index = 0, count = 1;
};
std::optional<ScanPlace> scan_place(const std::vector<LayerSegment>& segments, int64_t layer);

// Per-layer parameter names: "decoder/layers_<global index>/<module>/<param>" (the canonical names, which
// name the init streams and checkpoints of the per-layer layout). Stacked:
// "decoder/<group>/<module>/<param>".
std::string per_layer_name(int64_t layer, const std::string& rest);
std::string stacked_name(const std::string& group, const std::string& rest);
// "decoder/layers_5/mlp/wi/kernel" -> {5, "mlp/wi/kernel"}; nullopt for a name outside the decoder layers.
std::optional<std::pair<int64_t, std::string>> split_per_layer_name(const std::string& name);

}  // namespace meshtrain
