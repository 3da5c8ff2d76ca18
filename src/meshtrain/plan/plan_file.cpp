// Plan files: one kernel's plan (and the step's program) as deterministic JSON, and the check that a plan
// file matches this run's plan (the first differing key or section named, never a silent re-plan).
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "meshtrain/core/error.h"
#include "meshtrain/plan/context_attention.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {
namespace {

using json = nlohmann::ordered_json;

json shape_json(const PlanBuffer& buffer) {
  json dims = json::array();
  for (size_t i = 0; i < buffer.shape.dims.size(); ++i) {
    json axes = json::array();
    if (i < buffer.sharding.size()) {
      for (MeshAxis axis : buffer.sharding[i].axes) axes.push_back(mesh_axis_name(axis));
    }
    dims.push_back({{"axis", buffer.shape.axes[i]}, {"size", buffer.shape.dims[i]}, {"mesh", axes}});
  }
  return dims;
}

json program_json(const std::vector<ProgramEntry>& entries) {
  json list = json::array();
  for (const ProgramEntry& entry : entries) {
    json item = {{"kernel", kernel_name(entry.kernel)},
                 {"micro_batch", entry.micro_batch},
                 {"chunk", entry.chunk},
                 {"last_backward", entry.last_backward}};
    if (entry.slot != ProgramEntry::kNoSlot) item["slot"] = entry.slot;  // the split kernels'
    list.push_back(item);
  }
  return list;
}

}  // namespace

std::string serialize_kernel_plan(const TrainingPlan& plan, KernelName name, int64_t chunk) {
  const KernelPlan& kernel = plan.kernel(name, chunk);
  json out;
  out["format"] = "meshtrain-plan";
  out["version"] = 1;
  out["kernel"] = kernel_name(name);
  if (chunk > 0) out["chunk"] = chunk;  // the rank's chunk (files of chunk 0 read as before chunks existed)
  json keys = json::object();
  for (const auto& [key, value] : plan.identity.keys) keys[key] = value;
  out["identity"] = {{"hash", plan.identity.hash}, {"keys", keys}};
  const Topology& t = plan.topology;
  const ComputeRates& rates = t.rates(plan.spec.config.dtype);
  out["topology"] = {{"name", t.name},
                     {"device_kind", t.device_kind},
                     {"devices", plan.mesh.devices()},
                     {"device_memory_bytes", plan.device_memory_bytes},
                     {"peak_flops", rates.peak_flops},
                     {"matmul_flops", rates.matmul_flops},
                     {"attention_flops", rates.attention_flops},
                     {"loss_softmax_logits_per_second", rates.loss_softmax_logits},
                     {"elementwise_bandwidth", rates.elementwise_bandwidth},
                     {"memory_bandwidth", t.memory_bandwidth},
                     {"intra_host_bandwidth", t.intra_host_bandwidth},
                     {"inter_host_bandwidth", t.inter_host_bandwidth}};
  const MemoryFigures& m = kernel.memory;
  out["memory"] = {{"arguments", m.arguments},
                   {"outputs", m.outputs},
                   {"aliases", m.aliases},
                   {"temps", m.temps},
                   {"peak", m.peak},
                   {"persistent", plan.persistent_bytes},
                   {"process_arena", plan.arena_bytes}};
  if (plan.stash.slots > 0 && runs_over_a_slot(name)) {
    out["memory"]["activation_slots"] = {
        {"slots", plan.stash.slots}, {"slot_bytes", plan.stash.slot_bytes}, {"offset", plan.stash.offset}};
    if (plan.stash.weight_bytes > 0)
      out["memory"]["activation_slots"]["weight_bytes"] = plan.stash.weight_bytes;
  }
  json collective = json::object();
  for (const auto& [axis, bytes] : kernel.collective_bytes) collective[axis] = bytes;
  out["cost"] = {{"flops", kernel.flops},
                 {"bytes_accessed", kernel.bytes_accessed},
                 {"collective_bytes", collective},
                 {"predicted_seconds", kernel.seconds}};
  // Under mesh.context > 1: this kernel's attention FLOPs on each context rank (plan/context_attention.h).
  const ContextAttentionLoad context_load = context_attention_load(plan, kernel);
  if (!context_load.empty()) out["cost"]["attention_flops_per_context_rank"] = context_load.flops;
  std::set<PlanBufferId> touched;
  for (const PlanOp& op : kernel.ops) {
    for (const auto& binding : op.buffers) touched.insert(binding.second);
  }
  json buffers = json::array();
  for (PlanBufferId id : touched) {
    const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(id)];
    json entry = {{"name", buffer.name},
                  {"kind", buffer_kind_name(buffer.kind)},
                  {"dtype", dtype_config_name(buffer.dtype)},
                  {"shape", shape_json(buffer)},
                  {"bytes", buffer.bytes}};
    // The split kernels read what crosses from forward to backward in the micro-batch's activation slot (a
    // stage plan's eval its boundary buffers too).
    const bool binds_slots = runs_over_a_slot(name) || (name == KernelName::eval && plan.pipeline.stages > 1);
    const ActivationStash::Entry* stashed = binds_slots ? plan.stash.find(id, kernel.chunk) : nullptr;
    if (stashed) entry["slot_offset"] = stashed->offset;
    if (buffer.persistent || buffer.part_of >= 0) {
      if (!stashed) entry["offset"] = buffer.offset;
    } else {
      json ranges = json::array();
      for (const PlanValue& value : kernel.values) {
        if (value.buffer == id) ranges.push_back({value.first_op, value.last_op, value.offset});
      }
      entry["live"] = ranges;  // [first op, last op, offset]
    }
    buffers.push_back(entry);
  }
  out["buffers"] = buffers;
  json ops = json::array();
  for (const PlanOp& op : kernel.ops) {
    json entry = {{"name", op.op->name + (op.recompute ? " (recompute)" : "")},
                  {"kind", op_kind_name(op.op->kind)},
                  {"flops", op.flops},
                  {"bytes", op.bytes_accessed},
                  {"seconds", op.seconds}};
    if (op.op->kind == OpKind::collective) {
      const CollectiveDecl& c = op.op->collective;
      entry["collective"] = {{"kind", collective_kind_name(c.kind)},
                             {"axis", mesh_axis_name(c.axis)},
                             {"group", c.group},
                             {"bytes", op.collective_bytes}};
    }
    ops.push_back(entry);
  }
  out["ops"] = ops;
  // The step's program (the same in every kernel's file): where this kernel runs in a step.
  out["program"] = {{"gradients", program_json(plan.program.gradients)},
                    {"update", program_json(plan.program.update)},
                    {"eval", program_json(plan.program.eval)}};
  return out.dump(1) + "\n";
}

std::string plan_file_path(const std::string& stem, KernelName kernel, int64_t chunk) {
  return stem + "_" + kernel_name(kernel) + (chunk > 0 ? "_chunk" + std::to_string(chunk) : "") + ".json";
}

std::string plan_file_stem(const std::string& stem, const TrainingPlan& plan) {
  if (plan.pipeline.stages == 1) return stem;
  return stem + "_stage" + std::to_string(plan.pipeline.stage);
}

void verify_plan_file(const TrainingPlan& plan, KernelName kernel, const std::string& stem, int64_t chunk) {
  const std::string path = plan_file_path(plan_file_stem(stem, plan), kernel, chunk);
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    fail(path, std::string("the ") + kernel_name(kernel) + " plan written by meshtrain compile",
         "no such file",
         "run: meshtrain compile <config> plan_out=" + stem + " (with kernels including " +
             kernel_name(kernel) + ")");
  }
  std::stringstream text;
  text << file.rdbuf();
  const std::string expected = serialize_kernel_plan(plan, kernel, chunk);
  if (text.str() == expected) return;
  json found;
  try {
    found = json::parse(text.str());
  } catch (const json::exception& error) {
    fail(path, "a plan file (JSON)", error.what(),
         "write it again with meshtrain compile ... plan_out=" + stem);
  }
  if (!found.is_object()) {
    fail(path, "a plan file (a JSON object)", "another JSON value", "write it again with meshtrain compile");
  }
  const json wanted = json::parse(expected);
  const json found_keys = found.value("/identity/keys"_json_pointer, json::object());
  for (const auto& [key, value] : wanted["identity"]["keys"].items()) {
    const bool present = found_keys.is_object() && found_keys.contains(key) && found_keys[key].is_string();
    const std::string have = present ? found_keys[key].get<std::string>() : "(absent)";
    if (have != value.get<std::string>()) {
      fail(path, "a plan for this run (" + key + "=" + value.get<std::string>() + ")",
           "a plan made with " + key + "=" + have,
           "re-run meshtrain compile with this run's settings, or drop plan_in to plan afresh");
    }
  }
  std::string field = "contents";
  for (const char* section : {"topology", "memory", "cost", "buffers", "ops", "program"}) {
    if (found.value(section, json()) != wanted[section]) {
      field = section;
      break;
    }
  }
  fail(path, "the plan this build makes for the same inputs", "a different '" + field + "' section",
       "the file was written by another meshtrain version or machine; write it again with meshtrain compile");
}

}  // namespace meshtrain
