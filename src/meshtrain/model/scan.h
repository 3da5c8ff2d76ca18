// The scan_layers pass (shared/specs/layers-and-checkpoints.md, "Segments and scan groups"): each scan
// group's per-layer parameters become ONE stacked parameter [layers, ...] per module parameter, whose
// members view the layers' blocks; the layers' ops keep reading and writing their own (now viewing) buffers,
// so the math is the same in both layouts. Also numbers every per-layer parameter's norm slot.
//
// The layer axis is outermost in memory (so a layer's block, and its block of any shard, is contiguous);
// checkpoints store it at min(param_scan_axis, rank) (checkpoint/checkpoint.h converts). Single layers (an
// Engram layer), tied and other parameters outside the decoder layers stay as they are; a model with
// nothing to stack is left unchanged. A pipeline stage's chunk stacks the layers it holds of each group
// ([held layers, ...] under the group's name; checkpoints place them at their offset in the group). A
// parameter of a group that another layer's ops also use is refused.
#pragma once

#include "meshtrain/model/spec.h"

namespace meshtrain {

// The last step of building a spec (SpecBuilder::finish), before the optimizer pass declares its state at
// the stacked shapes. Without scan_layers only numbers the slots.
void stack_scan_groups(ModelSpec& spec);

}  // namespace meshtrain
