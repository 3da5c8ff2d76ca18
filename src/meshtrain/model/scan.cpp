#include "meshtrain/model/scan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "meshtrain/core/error.h"
#include "meshtrain/model/segments.h"

namespace meshtrain {
namespace {

// The decoder layer an op belongs to (its name's "decoder/layers_<i>/" prefix), or -1.
int64_t layer_of_op(const OpDecl& op) {
  const std::optional<std::pair<int64_t, std::string>> split = split_per_layer_name(op.name);
  return split ? split->first : -1;
}

BufferId add_buffer(ModelSpec& spec, BufferDecl buffer) {
  spec.buffers.push_back(std::move(buffer));
  return static_cast<BufferId>(spec.buffers.size() - 1);
}

std::string layers_text(const std::set<int64_t>& layers) {
  std::string text;
  for (int64_t layer : layers)
    text += (text.empty() ? "" : ", ") +
            (layer < 0 ? std::string("ops outside the layers") : std::to_string(layer));
  return text;
}

}  // namespace

void stack_scan_groups(ModelSpec& spec) {
  for (size_t k = 0; k < spec.parameters.size(); ++k) spec.parameters[k].norm_slot = static_cast<int32_t>(k);
  spec.norm_slots = static_cast<int32_t>(spec.parameters.size());
  if (!spec.config.scan_layers) return;

  // Which layers' ops touch each buffer: a member used outside its own layer is shared.
  std::map<BufferId, std::set<int64_t>> users;
  for (const std::vector<OpDecl>* ops : {&spec.forward, &spec.loss_forward, &spec.loss_backward}) {
    for (const OpDecl& op : *ops) {
      for (const std::vector<BufferId>* ids : {&op.reads, &op.writes}) {
        for (BufferId id : *ids) users[id].insert(layer_of_op(op));
      }
    }
  }
  std::map<int64_t, std::vector<size_t>> of_layer;  // layer -> its parameters, in declaration order
  for (size_t k = 0; k < spec.parameters.size(); ++k) {
    if (const auto split = split_per_layer_name(spec.parameters[k].canonical_name))
      of_layer[split->first].push_back(k);
  }

  const std::vector<LayerSegment> segments = decoder_segments(spec.config);
  const std::vector<std::string> group_names = scan_group_names(segments);
  std::map<size_t, ParameterDecl> stacked_at;  // first member's index -> the stacked parameter
  std::set<size_t> members;
  // The layers this spec holds (a hand-built spec's chunk is unresolved: all of them). A pipeline stage's
  // chunk may hold part of a group: that part is stacked under the group's name (checkpoints place it at
  // its layers' offset in the whole group).
  // (plan_training refuses scan_layers for a stage holding several chunks, whose layers are not contiguous.)
  MT_CHECK(spec.chunks.size() <= 1, "scan groups stacked in a spec of one chunk");
  const LayerChunk held = spec.chunks.empty() ? LayerChunk{} : spec.chunks.front().layers;
  const int64_t held_end = held.last_layer < 0 ? std::numeric_limits<int64_t>::max() : held.last_layer + 1;
  for (size_t s = 0; s < segments.size(); ++s) {
    if (!segments[s].group) continue;
    LayerSegment segment = segments[s];
    const int64_t end = std::min(segment.first + segment.count, held_end);
    segment.first = std::max(segment.first, held.first_layer);
    segment.count = end - segment.first;
    if (segment.count <= 0) continue;
    const std::vector<size_t>& first = of_layer[segment.first];
    for (size_t j = 0; j < first.size(); ++j) {
      const ParameterDecl& head = spec.parameters[first[j]];
      const std::string rest = split_per_layer_name(head.canonical_name)->second;
      ParameterDecl stacked = head;
      stacked.canonical_name = stacked_name(group_names[s], rest);
      const BufferDecl head_value = spec.buffer(head.value);
      Shape shape = head_value.shape;
      shape.dims.insert(shape.dims.begin(), segment.count);
      shape.axes.insert(shape.axes.begin(), "layers");
      stacked.value =
          add_buffer(spec, {stacked.canonical_name, BufferKind::parameter, head_value.dtype, shape});
      stacked.gradient = head.gradient == kNoBuffer
                             ? kNoBuffer
                             : add_buffer(spec, {"grad/" + stacked.canonical_name, BufferKind::gradient,
                                                 spec.buffer(head.gradient).dtype, shape});
      for (int64_t i = 0; i < segment.count; ++i) {
        const int64_t layer = segment.first + i;
        const std::vector<size_t>& own = of_layer[layer];
        MT_CHECK(own.size() == first.size() && j < own.size(),
                 "layers " + std::to_string(segment.first) + " and " + std::to_string(layer) +
                     " of one scan group declare different parameters");
        const ParameterDecl& member = spec.parameters[own[j]];
        const BufferDecl& value = spec.buffer(member.value);
        MT_CHECK(split_per_layer_name(member.canonical_name)->second == rest &&
                     value.shape == head_value.shape && value.dtype == head_value.dtype,
                 "scan group member " + member.canonical_name + " differs from " + head.canonical_name);
        std::set<int64_t> used_by = users[member.value];
        used_by.erase(layer);
        if (!used_by.empty()) {
          fail("config key 'scan_layers'", "parameters of a scan group used by their own layer only",
               member.canonical_name + " is also used by layer(s) " + layers_text(used_by),
               "set scan_layers=false: a parameter shared between layers stays one tensor and is never "
               "stacked");
        }
        spec.buffers[static_cast<size_t>(member.value)].stack = stacked.value;
        spec.buffers[static_cast<size_t>(member.value)].stack_index = i;
        if (member.gradient != kNoBuffer) {
          spec.buffers[static_cast<size_t>(member.gradient)].stack = stacked.gradient;
          spec.buffers[static_cast<size_t>(member.gradient)].stack_index = i;
        }
        stacked.members.push_back({member.value, member.gradient, member.canonical_name, member.norm_slot});
        members.insert(own[j]);
      }
      stacked_at.emplace(first[j], std::move(stacked));
    }
  }
  if (stacked_at.empty()) return;  // nothing to stack
  std::vector<ParameterDecl> parameters;
  for (size_t k = 0; k < spec.parameters.size(); ++k) {
    const auto found = stacked_at.find(k);
    if (found != stacked_at.end()) {
      parameters.push_back(std::move(found->second));
    } else if (!members.count(k)) {
      parameters.push_back(std::move(spec.parameters[k]));
    }
  }
  spec.parameters = std::move(parameters);
}

}  // namespace meshtrain
