// The decoder as segments (shared/specs/layers-and-checkpoints.md, "Segments and scan groups"), derived from
// the config: runs of consecutive, structurally identical layers (scan groups: same kind, the same parameter
// names and shapes), and single layers whose parameters no other layer shares the shapes of (an Engram
// layer: its tables' sizes are primes of its own). `scan_layers` (issue 14) stores a group's parameters as
// one tensor with a layer axis; the grouping itself never depends on it.
#pragma once

#include <cstdint>
#include <string>
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

}  // namespace meshtrain
