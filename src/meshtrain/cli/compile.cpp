#include "meshtrain/cli/compile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "meshtrain/cli/arguments.h"
#include "meshtrain/core/durable_file.h"
#include "meshtrain/core/error.h"
#include "meshtrain/model/layers/engram.h"
#include "meshtrain/model/layers/moe.h"
#include "meshtrain/model/pipeline_placement.h"
#include "meshtrain/model/segments.h"
#include "meshtrain/plan/context_attention.h"
#include "meshtrain/plan/pipeline_step.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/search.h"
#include "meshtrain/train/schedule.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

template <class... Args>
std::string format(const char* pattern, Args... args) {
  const int length = std::snprintf(nullptr, 0, pattern, args...);
  std::string text(static_cast<size_t>(std::max(length, 0)) + 1, '\0');
  std::snprintf(text.data(), text.size(), pattern, args...);
  text.pop_back();  // the terminating NUL snprintf wrote
  return text;
}

std::string gib(double bytes) {
  return format("%.2f GiB", bytes / kGiB);
}

// "12.34 GiB (13249974108 bytes)": GiB to read, exact bytes to compare.
std::string bytes_text(double bytes) {
  return gib(bytes) + format(" (%.0f bytes)", bytes);
}

std::string seconds_text(double seconds) {
  if (seconds >= 1.0) return format("%.3f s", seconds);
  if (seconds >= 1e-3) return format("%.3f ms", seconds * 1e3);
  return format("%.1f us", seconds * 1e6);
}

double elapsed_seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// "name  value" rows with the values aligned.
std::string row(const std::string& name, const std::string& value) {
  return format("  %-18s %s\n", name.c_str(), value.c_str());
}

std::string collective_text(const KernelPlan& kernel) {
  std::string text;
  // Mesh axis order (outermost first), then anything else the plan names.
  std::vector<std::string> names;
  for (MeshAxis axis : kMeshAxes) names.push_back(mesh_axis_name(axis));
  for (const auto& entry : kernel.collective_bytes) {
    if (std::find(names.begin(), names.end(), entry.first) == names.end()) names.push_back(entry.first);
  }
  for (const std::string& name : names) {
    const auto found = kernel.collective_bytes.find(name);
    if (found == kernel.collective_bytes.end() || found->second == 0.0) continue;
    text += (text.empty() ? "" : ", ") + name + " " + bytes_text(found->second);
  }
  return text.empty() ? "none" : text;
}

// `plan_text`: the "plan" row (the identity, what was planned and how long it took).
void print_header(const TrainingPlan& plan, const std::string& config_argument, const std::string& plan_text,
                  std::ostream& out) {
  const Config& c = plan.spec.config;
  const Topology& t = plan.topology;
  const std::string model = c.model_name.empty() ? config_argument : c.model_name;
  out << "meshtrain compile: ahead-of-time plan, per device\n";
  out << row(
      "model",
      format("%s (%s): %lld layers, width %lld, %lld query / %lld kv heads x %lld, mlp %lld, "
             "vocab %lld, %s unembedding",
             model.c_str(), decoder_block_name(c.decoder_block),
             static_cast<long long>(c.base_num_decoder_layers), static_cast<long long>(c.base_emb_dim),
             static_cast<long long>(c.base_num_query_heads), static_cast<long long>(c.base_num_kv_heads),
             static_cast<long long>(c.head_dim), static_cast<long long>(c.base_mlp_dim),
             static_cast<long long>(c.vocab_size), c.logits_via_embedding ? "tied" : "untied"));
  out << row("layers",
             segments_text(decoder_segments(c)) +
                 (c.scan_layers ? ": each group stored stacked (scan_layers; checkpoints put the layer "
                                  "axis at param_scan_axis " +
                                      std::to_string(c.param_scan_axis) + ")"
                                : ": stored per layer"));
  out << row("dtypes", "compute " + dtype_config_name(c.dtype) + ", weights " +
                           dtype_config_name(c.weight_dtype) + ", gradients " +
                           dtype_config_name(c.grad_dtype) + ", moments " + dtype_config_name(c.mu_dtype) +
                           ", remat_policy " + std::string(remat_policy_name(c.remat_policy)));
  const int64_t devices = plan.mesh.devices();
  out << row(
      "batch",
      format("per_device_batch_size %lld x max_target_length %lld, "
             "gradient_accumulation_steps %lld: global batch %lld sequences",
             static_cast<long long>(c.per_device_batch_size), static_cast<long long>(c.max_target_length),
             static_cast<long long>(c.gradient_accumulation_steps),
             static_cast<long long>(c.per_device_batch_size * devices * c.gradient_accumulation_steps)));
  out << row("mesh", plan.mesh.to_string() + format(" (%lld devices)", static_cast<long long>(devices)));
  const std::string per_host = t.devices_per_host == 0
                                   ? "all on one host"
                                   : format("%lld per host", static_cast<long long>(t.devices_per_host));
  const ComputeRates& rates = t.rates(c.dtype);
  out << row(
      "topology",
      format("%s: %lld x %s, %s, %s per device, peak %.4g TFLOP/s %s (matmuls %.4g, attention %.4g, loss "
             "softmax %s), "
             "memory %.0f GB/s (elementwise %.4g), links %.0f GB/s within a host",
             t.name.c_str(), static_cast<long long>(devices), t.device_kind.c_str(), per_host.c_str(),
             bytes_text(plan.device_memory_bytes).c_str(), rates.peak_flops / 1e12,
             dtype_config_name(c.dtype).c_str(), rates.matmul_flops / 1e12, rates.attention_flops / 1e12,
             rates.loss_softmax_logits > 0.0
                 ? format("%.3g Glogit/s", rates.loss_softmax_logits / 1e9).c_str()
                 : "not priced",
             t.memory_bandwidth / 1e9, rates.elementwise_bandwidth / 1e9, t.intra_host_bandwidth / 1e9) +
          (t.inter_host_bandwidth > 0.0 ? format(" / %.0f GB/s between hosts", t.inter_host_bandwidth / 1e9)
                                        : std::string()));
  const EngramCounts engram = engram_counts(plan.spec);
  if (engram.layers > 0) {
    // What the tables take on this device as planned: the rows it holds (split like the vocabulary) with
    // their gradient and Adam moments (ZeRO-1's data shards of the moments where set).
    double table_bytes = 0.0;
    for (const PlanBuffer& buffer : plan.buffers) {
      if (buffer.persistent && buffer.part_of < 0 && is_engram_table(buffer.name))
        table_bytes += static_cast<double>(buffer.bytes);
    }
    out << row("engram",
               format("%lld layers, %lld hash tables of %lld rows together x %lld (%lld read per token "
                      "and layer): %s of tables with gradient and moments; forward %.4g TFLOP per "
                      "micro-batch",
                      static_cast<long long>(engram.layers), static_cast<long long>(engram.tables),
                      static_cast<long long>(engram.rows), static_cast<long long>(c.engram_head_dim),
                      static_cast<long long>(engram.rows_per_token), bytes_text(table_bytes).c_str(),
                      engram.forward_flops / 1e12));
  }
  if (c.mhc_expansion_rate > 1) {
    out << row("mhc", format("%lld residual streams, %lld sites, %lld Sinkhorn iterations",
                             static_cast<long long>(c.mhc_expansion_rate),
                             static_cast<long long>(2 * c.base_num_decoder_layers),
                             static_cast<long long>(c.sinkhorn_iterations)));
  }
  out << row("threads", format("%lld per rank", static_cast<long long>(plan.threads)));
  out << row("plan", plan_text);
  out << "\n" << learning_rate_schedule_table(learning_rate_schedule(c), c.steps);
}

void print_kernel(const KernelPlan& kernel, std::ostream& out) {
  size_t recomputed = 0;
  for (const PlanOp& op : kernel.ops) recomputed += op.recompute ? 1 : 0;
  out << "\nkernel " << kernel_name(kernel.kernel) << ": " << kernel.ops.size() << " ops";
  if (recomputed > 0) out << " (" << recomputed << " recomputed for remat)";
  out << "\n";
  out << row("FLOPs", format("%.4e (%.2f TFLOP)", kernel.flops, kernel.flops / 1e12));
  out << row("bytes accessed", bytes_text(kernel.bytes_accessed));
  out << row("collective bytes", collective_text(kernel));
  const MemoryFigures& m = kernel.memory;
  out << row("arguments", bytes_text(static_cast<double>(m.arguments)));
  out << row("outputs", bytes_text(static_cast<double>(m.outputs)));
  out << row("aliases", bytes_text(static_cast<double>(m.aliases)));
  out << row("temps", bytes_text(static_cast<double>(m.temps)));
  out << row("peak", bytes_text(static_cast<double>(m.peak)));
  out << row("predicted time", seconds_text(kernel.seconds));
}

// "layers 0..3" / "layer 4"
std::string layers_text(const LayerChunk& chunk) {
  return chunk.first_layer == chunk.last_layer
             ? format("layer %lld", static_cast<long long>(chunk.first_layer))
             : format("layers %lld..%lld", static_cast<long long>(chunk.first_layer),
                      static_cast<long long>(chunk.last_layer));
}

// What stage rank `stage` holds: "chunk 0 (layers 0..3, embedding): 4 layers".
std::string stage_holds_text(const Config& c, const PipelinePlacement& placement, int64_t stage) {
  const std::string embedding = c.max_position_embeddings > 0 ? "embedding and position table" : "embedding";
  std::string text;
  int64_t layers = 0;
  for (int64_t index : placement.chunks_of(stage)) {
    const LayerChunk& chunk = placement.chunks[static_cast<size_t>(index)];
    std::string holds = layers_text(chunk);
    if (chunk.with_embedding) holds += ", " + embedding;
    if (chunk.with_head) holds += ", final norm, unembedding and loss";
    text +=
        (text.empty() ? "" : "; ") + format("chunk %lld (%s)", static_cast<long long>(index), holds.c_str());
    layers += chunk.last_layer - chunk.first_layer + 1;
  }
  return text + format(": %lld layers", static_cast<long long>(layers));
}

// Under mesh.stage > 1: how the layers are cut into chunks, the schedule, and where the tied table is.
void print_pipeline_placement(const Config& c, const PipelinePlacement& placement, std::ostream& out) {
  const auto chunk_count = static_cast<long long>(placement.chunks.size());
  std::string split = "pipeline_layers_per_chunk";
  if (!placement.explicit_split) {
    const auto size_of = [](const LayerChunk& chunk) {
      return static_cast<long long>(chunk.last_layer - chunk.first_layer + 1);
    };
    const long long longer = size_of(placement.chunks.front()), shorter = size_of(placement.chunks.back());
    const long long extra = c.base_num_decoder_layers % chunk_count;
    split = longer == shorter ? format("the default placement: %lld chunks of %lld", chunk_count, longer)
                              : format("the default placement: %lld chunks of %lld, then %lld of %lld", extra,
                                       longer, chunk_count - extra, shorter);
  }
  out << row("pipeline",
             format("mesh.stage %lld x num_pipeline_repeats %lld = %lld chunks of %lld layers "
                    "(%s), pipeline_schedule %s over gradient_accumulation_steps %lld micro-batches",
                    static_cast<long long>(placement.stages), static_cast<long long>(placement.repeats),
                    chunk_count, static_cast<long long>(c.base_num_decoder_layers), split.c_str(),
                    pipeline_schedule_name(c.pipeline_schedule),
                    static_cast<long long>(c.gradient_accumulation_steps)));
  if (c.logits_via_embedding) {
    out << row("tied embeddings",
               format("stage 0 and stage %lld each hold the embedding table (logits_via_embedding); its two "
                      "gradients are summed before the update",
                      static_cast<long long>(placement.stage_of(chunk_count - 1))));
  }
}

// "1.23 TFLOP", "4.56 MFLOP": two decimals in the largest unit the figure reaches.
std::string flops_text(double flops) {
  if (flops >= 1e12) return format("%.2f TFLOP", flops / 1e12);
  if (flops >= 1e9) return format("%.2f GFLOP", flops / 1e9);
  if (flops >= 1e6) return format("%.2f MFLOP", flops / 1e6);
  return format("%.0f FLOP", flops);
}

// Under mesh.context > 1: one training step's attention FLOPs on each context rank (the whole sequence's
// attention FLOPs of GA micro-batches' forward + backward, remat recomputes included, split by each rank's
// causal (query, key) pairs under the reorder; plan/context_attention.h) and max / mean over the ranks.
void print_context_attention(const TrainingPlan& plan, std::ostream& out) {
  const ContextAttentionLoad load = step_context_attention_load(plan);
  if (load.empty()) return;
  const std::string reorder = load.reorder == ContextReorder::none
                                  ? "none: context_parallel_load_balance=false"
                                  : std::string(context_reorder_name(load.reorder));
  const int64_t micro_batches = plan.spec.config.gradient_accumulation_steps;
  out << "\nattention per context rank (" << reorder << ", C=" << load.context_ranks
      << "; one step: " << micro_batches << " micro-batch" << (micro_batches == 1 ? "" : "es")
      << ", forward + backward):";
  for (size_t rank = 0; rank < load.flops.size(); ++rank)
    out << (rank == 0 ? " " : "  ") << "rank " << rank << " " << flops_text(load.flops[rank]);
  out << format("  max/mean %.3f\n", load.max_over_mean());
}

// Under expert parallelism: the block each pair of expert ranks exchanges in every all_to_all and one
// training step's all-to-all bytes per device (GA micro-batches: every MoE layer's dispatch and return,
// forward and backward, remat recomputes included).
void print_expert_dispatch(const TrainingPlan& plan, std::ostream& out) {
  const Config& c = plan.spec.config;
  const int64_t P = plan.spec.sharding.compute("experts").degree;
  if (P == 1 || plan.spec.moe_layers.empty()) return;
  double step_bytes = 0.0;
  for (const KernelPlan& kernel : plan.kernels) {
    const double times = kernel.kernel == KernelName::fwd_bwd ? 1.0
                         : kernel.kernel == KernelName::fwd_bwd_accum
                             ? static_cast<double>(c.gradient_accumulation_steps - 1)
                             : 0.0;
    for (const PlanOp& op : kernel.ops) {
      if (op.op->kind == OpKind::collective && op.op->collective.kind == CollectiveKind::all_to_all)
        step_bytes += times * op.collective_bytes;
    }
  }
  const int64_t N = plan.spec.dims.N, k = c.num_experts_per_tok, E_local = c.num_experts / P;
  const int64_t capacity = moe_expert_capacity(c.capacity_factor, N, k, c.num_experts);
  const int64_t block = moe_dispatch_block_rows(capacity, N, k, E_local);
  out << "\nexpert parallelism (P=" << P << ", " << E_local << " routed expert" << (E_local == 1 ? "" : "s")
      << " a rank): all_to_all blocks of " << block << " rows a pair of ranks ("
      << (capacity > 0 ? format("capacity_factor %g: %lld rows an expert", c.capacity_factor,
                                static_cast<long long>(capacity))
                       : std::string("dropless: the worst case, tokens x min(k, experts a rank); "
                                     "capacity_factor > 0 bounds it"))
      << "); one step: " << bytes_text(step_bytes) << " all-to-all per device\n";
}

// The n largest buffers that own memory (a shard viewed inside another buffer does not), largest first;
// equal sizes keep plan order so the listing is stable.
std::vector<const PlanBuffer*> largest_buffers(const TrainingPlan& plan, size_t n) {
  std::vector<const PlanBuffer*> owners;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.part_of < 0) owners.push_back(&buffer);
  }
  std::stable_sort(owners.begin(), owners.end(),
                   [](const PlanBuffer* a, const PlanBuffer* b) { return a->bytes > b->bytes; });
  if (owners.size() > n) owners.resize(n);
  return owners;
}

void print_verdict(const TrainingPlan& plan, std::ostream& out) {
  const KernelPlan* largest = nullptr;
  for (const KernelPlan& kernel : plan.kernels) {
    if (largest == nullptr || kernel.memory.temps > largest->memory.temps) largest = &kernel;
  }
  const double arena = static_cast<double>(plan.arena_bytes);
  out << "\nprocess arena: persistent " << gib(static_cast<double>(plan.persistent_bytes))
      << " + largest temporaries "
      << gib(largest == nullptr ? 0.0 : static_cast<double>(largest->memory.temps))
      << (largest == nullptr ? std::string() : std::string(" (") + kernel_name(largest->kernel) + ")")
      << " = " << bytes_text(arena) << "\n";
  const std::string figures = format("%.2f of %.2f GiB", arena / kGiB, plan.device_memory_bytes / kGiB);
  if (plan.fits()) {
    out << "fits: " << figures << "\n";
    return;
  }
  out << "does not fit: " << figures << ", largest buffers:";
  // Under expert parallelism the routed experts' rows (logical axes dispatch_rows and expert_rows) are sized
  // by the all_to_all blocks.
  const bool expert_parallel = plan.spec.sharding.compute("experts").degree > 1;
  bool dispatch_blocks = false;
  for (const PlanBuffer* buffer : largest_buffers(plan, 5)) {
    out << "\n  " << buffer->name << " (" << buffer_kind_name(buffer->kind) << ", " << buffer->layer << ") "
        << bytes_text(static_cast<double>(buffer->bytes));
    const std::string& rows = buffer->shape.axes.empty() ? std::string() : buffer->shape.axes.front();
    dispatch_blocks =
        dispatch_blocks || (expert_parallel && (rows == "dispatch_rows" || rows == "expert_rows"));
  }
  out << "\n";
  if (dispatch_blocks && plan.spec.config.capacity_factor <= 0.0) {
    out << "hint: dropless expert parallelism sizes every all_to_all block for the worst case; "
           "capacity_factor > 0 (e.g. 1.25) bounds the blocks to the experts' capacity\n";
  }
}

// --explain: bytes per buffer kind and per layer of a set of buffers.
struct Breakdown {
  std::map<BufferKind, size_t> by_kind;
  std::vector<std::pair<std::string, size_t>> by_layer;  // in order of first appearance in plan.buffers
  size_t total = 0, count = 0;

  void add(const PlanBuffer& buffer) {
    by_kind[buffer.kind] += buffer.bytes;
    const auto found = std::find_if(by_layer.begin(), by_layer.end(),
                                    [&](const auto& entry) { return entry.first == buffer.layer; });
    if (found == by_layer.end()) {
      by_layer.emplace_back(buffer.layer, buffer.bytes);
    } else {
      found->second += buffer.bytes;
    }
    total += buffer.bytes;
    ++count;
  }
};

// "decoder/layers_12" -> 12; anything else -> -1.
long layer_index(const std::string& layer) {
  const std::string prefix = "decoder/layers_";
  if (!layer.starts_with(prefix)) return -1;
  return std::strtol(layer.c_str() + prefix.size(), nullptr, 10);
}

void print_breakdown(const Breakdown& breakdown, std::ostream& out) {
  out << "    by kind:\n";
  for (const auto& [kind, bytes] : breakdown.by_kind) {
    out << format("      %-18s %s\n", buffer_kind_name(kind), bytes_text(static_cast<double>(bytes)).c_str());
  }
  out << "    by layer:\n";
  // Consecutive decoder layers with the same bytes print as one row (an 80-layer model is one line, not 80).
  const auto& rows = breakdown.by_layer;
  for (size_t i = 0; i < rows.size();) {
    size_t end = i + 1;
    const long first = layer_index(rows[i].first);
    while (first >= 0 && end < rows.size() && rows[end].second == rows[i].second &&
           layer_index(rows[end].first) == first + static_cast<long>(end - i)) {
      ++end;
    }
    if (end - i == 1) {
      out << format("      %-26s %s\n", rows[i].first.c_str(),
                    bytes_text(static_cast<double>(rows[i].second)).c_str());
    } else {
      const std::string name =
          format("decoder/layers_%ld..%ld", first, first + static_cast<long>(end - i) - 1);
      out << format("      %-26s %s each, %s together\n", name.c_str(),
                    bytes_text(static_cast<double>(rows[i].second)).c_str(),
                    gib(static_cast<double>(rows[i].second * (end - i))).c_str());
    }
    i = end;
  }
}

void print_explain(const TrainingPlan& plan, std::ostream& out) {
  out << "\nmemory by buffer kind and layer (--explain), per device\n";
  Breakdown persistent;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.persistent && buffer.part_of < 0) persistent.add(buffer);
  }
  out << "  persistent region (arguments of every kernel): " << persistent.count << " buffers, "
      << bytes_text(static_cast<double>(persistent.total)) << "\n";
  print_breakdown(persistent, out);
  for (const KernelPlan& kernel : plan.kernels) {
    std::set<PlanBufferId> seen;
    Breakdown temporaries;
    for (const PlanValue& value : kernel.values) {
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(value.buffer)];
      if (!buffer.persistent && buffer.part_of < 0 && seen.insert(value.buffer).second)
        temporaries.add(buffer);
    }
    // Sum of distinct buffers is what the temporaries would take with no reuse; the arena's temps extent is
    // what they take after liveness-based reuse. Neither is "what is alive at the peak" per layer.
    out << "  " << kernel_name(kernel.kernel) << " temporaries: " << temporaries.count
        << " distinct buffers, " << bytes_text(static_cast<double>(temporaries.total))
        << " if none shared memory; after liveness reuse the temps extent is "
        << bytes_text(static_cast<double>(kernel.memory.temps)) << "\n";
    if (temporaries.count > 0) print_breakdown(temporaries, out);
  }
}

// Writes `plan`'s files under plan_file_stem(stem): one per kernel, each listed in `out`.
void write_plan_files(const TrainingPlan& plan, const std::string& stem, std::ostream& out) {
  for (const KernelPlan& kernel : plan.kernels) {
    const fs::path path = plan_file_path(plan_file_stem(stem, plan), kernel.kernel, kernel.chunk);
    if (path.has_parent_path()) {
      std::error_code error;
      fs::create_directories(path.parent_path(), error);
      if (error) {
        fail("config key 'plan_out'", "a directory that can be created", path.parent_path().string(),
             error.message());
      }
    }
    const std::string text = serialize_kernel_plan(plan, kernel.kernel, kernel.chunk);
    write_file_atomically(path.string(), text);
    out << "  " << path.string() << " (" << text.size() << " bytes)\n";
  }
}

// --- pipeline stages -------------------------------------------------------------------------------------

// Bytes of the persistent buffers of one kind that own memory (a view inside another buffer does not).
double persistent_bytes_of(const TrainingPlan& plan, std::initializer_list<BufferKind> kinds) {
  double bytes = 0.0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.persistent && buffer.part_of < 0 &&
        std::find(kinds.begin(), kinds.end(), buffer.kind) != kinds.end())
      bytes += static_cast<double>(buffer.bytes);
  }
  return bytes;
}

// One stage rank's figures: what it holds, its memory (the activation slots its schedule keeps in flight and
// the largest kernel's temporaries above them), the bytes it sends, its kernels' predicted times, its bubble
// in the simulated schedule, and its verdict.
void print_stage(const TrainingPlan& plan, const PipelinePlacement& placement,
                 const PipelineRankSimulation& simulated, double formula, std::ostream& out) {
  const int64_t stage = plan.pipeline.stage;
  out << "\nstage " << stage << ": " << stage_holds_text(plan.spec.config, placement, stage) << "\n";
  out << row("identity", plan.identity.hash);
  out << row("parameters", bytes_text(persistent_bytes_of(plan, {BufferKind::parameter})));
  out << row("gradients", bytes_text(persistent_bytes_of(plan, {BufferKind::gradient})));
  out << row("optimizer state",
             bytes_text(persistent_bytes_of(plan, {BufferKind::optimizer_state, BufferKind::step_counter})));
  const KernelPlan* largest = nullptr;
  for (const KernelPlan& kernel : plan.kernels) {
    if (largest == nullptr || kernel.memory.temps > largest->memory.temps) largest = &kernel;
  }
  const ActivationStash& stash = plan.stash;
  const size_t slots_bytes = stash.end() - stash.offset;
  // The split kernels and eval place their temporaries above the slots; update's overlap them.
  const size_t above = largest->memory.temps > slots_bytes ? largest->memory.temps - slots_bytes : 0;
  out << row("activations",
             format("%lld slot%s in flight x %zu bytes = %s, + %s's temporaries %s: peak %s",
                    static_cast<long long>(stash.slots), stash.slots == 1 ? "" : "s", stash.slot_bytes,
                    bytes_text(static_cast<double>(slots_bytes)).c_str(), kernel_name(largest->kernel),
                    bytes_text(static_cast<double>(above)).c_str(),
                    bytes_text(static_cast<double>(largest->memory.temps)).c_str()));
  // Whom the program's sends go to: "activations to stage 1, input gradients to stage 3".
  std::map<ProgramEntry::Transfer, std::set<int64_t>> peers;
  for (const ProgramEntry& entry : plan.program.gradients) {
    if (entry.transfer == ProgramEntry::Transfer::send_activation ||
        entry.transfer == ProgramEntry::Transfer::send_gradient)
      peers[entry.transfer].insert(entry.peer);
  }
  std::string neighbours;
  for (const auto& [transfer, ranks] : peers) {
    std::string listed;
    for (int64_t rank : ranks) listed += (listed.empty() ? "" : " and ") + std::to_string(rank);
    neighbours += std::string(neighbours.empty() ? "" : ", ") +
                  (transfer == ProgramEntry::Transfer::send_activation ? "activations" : "input gradients") +
                  " to stage " + listed;
  }
  out << row("point-to-point", bytes_text(step_transfer_bytes(plan)) + " sent a step (" + neighbours + ")");
  KernelPlan step_bytes;
  step_bytes.collective_bytes = step_collective_bytes(plan);
  out << row("bytes per step", collective_text(step_bytes));
  std::string times;
  for (const KernelPlan& kernel : plan.kernels) {
    // With several chunks a rank (interleaved), each chunk's forward, backward and eval are its own:
    // "forward (chunk 3)".
    const bool per_chunk = kernel.kernel == KernelName::forward || kernel.kernel == KernelName::backward ||
                           kernel.kernel == KernelName::eval;
    const std::string chunk =
        plan.spec.chunks.size() > 1 && per_chunk
            ? format(" (chunk %lld)", static_cast<long long>(stage + kernel.chunk * plan.pipeline.stages))
            : "";
    times += (times.empty() ? "" : ", ") + std::string(kernel_name(kernel.kernel)) + chunk + " " +
             seconds_text(kernel.seconds);
  }
  out << row("predicted", times);
  out << row("bubble", format("%.2f%% of the schedule's span idle (busy %s, idle %s), from the planned ops' "
                              "times; the formula gives %.2f%%",
                              100.0 * simulated.bubble_fraction, seconds_text(simulated.busy_seconds).c_str(),
                              seconds_text(simulated.idle_seconds).c_str(), 100.0 * formula));
  print_verdict(plan, out);
}

// The whole step: the schedule's span over the stages' predicted times, the largest bubble, and whether
// every stage fits.
void print_pipeline_step(const PipelineStepPlan& step, double formula, std::ostream& out) {
  const PipelineSchedule& schedule = step.stages.front().pipeline.schedule;
  size_t most_idle = 0, largest = 0, not_fitting = 0;
  for (size_t s = 0; s < step.stages.size(); ++s) {
    if (step.simulation.ranks[s].bubble_fraction > step.simulation.ranks[most_idle].bubble_fraction)
      most_idle = s;
    if (step.stages[s].arena_bytes > step.stages[largest].arena_bytes) largest = s;
    not_fitting += step.stages[s].fits() ? 0 : 1;
  }
  out << "\npipeline step: predicted " << seconds_text(step.step_seconds) << " (the schedule's span "
      << seconds_text(step.simulation.makespan_seconds) << " + the slowest update "
      << seconds_text(step.step_seconds - step.simulation.makespan_seconds) << ")"
      << format("; bubble up to %.2f%% (stage %zu); the formula %s = %.2f%%\n",
                100.0 * step.simulation.ranks[most_idle].bubble_fraction, most_idle,
                schedule.kind == PipelineScheduleKind::zero_bubble
                    ? "(P - 1)(F + B_input - W) / (M (F + B) + that), mean op times,"
                    : (schedule.repeats > 1 ? "(P - 1) / (V M + P - 1)" : "(P - 1) / (M + P - 1)"),
                100.0 * formula);
  const TrainingPlan& widest = step.stages[largest];
  const std::string figures = format("%.2f of %.2f GiB", static_cast<double>(widest.arena_bytes) / kGiB,
                                     widest.device_memory_bytes / kGiB);
  if (step.fits) {
    out << "fits: every stage; the largest arena is stage " << largest << "'s, " << figures << "\n";
  } else {
    out << "does not fit: " << not_fitting << " of " << step.stages.size()
        << " stages; the largest arena is stage " << largest << "'s, " << figures << "\n";
  }
}

// --- --search -------------------------------------------------------------------------------------------

void print_search(const SearchResult& result, std::ostream& out) {
  out << "meshtrain compile --search: " << result.topology << ", " << result.devices << " devices, "
      << gib(result.device_memory_bytes) << " per device";
  if (result.memory_budget_bytes > 0.0) out << " (memory budget " << gib(result.memory_budget_bytes) << ")";
  out << ", global batch " << result.global_batch << " sequences per step\n";
  std::string remat_policies;
  for (const char* policy : kRematPolicyNames)
    remat_policies += (remat_policies.empty() ? "" : ", ") + std::string(policy);
  const auto listed = [](const std::vector<int64_t>& values) {
    std::string text;
    for (int64_t value : values) text += (text.empty() ? "" : ", ") + std::to_string(value);
    return text;
  };
  const ContextDegrees& contexts = result.contexts;
  std::string skipped;
  if (!contexts.skipped.empty()) {
    skipped = " (skipped " + listed(contexts.skipped) +
              ": max_target_length=" + std::to_string(contexts.sequence_length) + " does not split over " +
              (contexts.skipped.size() == 1 ? "it" : "them") + " with " + contexts.reorder_setting + ")";
  }
  out << "searched: data x stage x fsdp x context x tensor = " << result.devices << "; stage "
      << listed(result.stages) << " (at most the " << result.layers
      << " layers; gpipe, and 1f1b where gradient_accumulation_steps >= stage); context "
      << listed(contexts.searched) << skipped << "; tensor <= " << result.tensor_limit << " and dividing the "
      << result.query_heads << " query heads; per_device_batch_size x gradient_accumulation_steps = "
      << result.global_batch / result.devices << "; remat_policy " << remat_policies << "\n";
  out << format(
      "planned %lld candidates (fwd_bwd, fwd_bwd_accum, update each; with stages every stage's forward, "
      "backward and update): %lld rejected as invalid, %lld valid, %zu fit; %.2f s\n",
      static_cast<long long>(result.planned), static_cast<long long>(result.invalid),
      static_cast<long long>(result.planned - result.invalid), result.fitting.size(), result.wall_seconds);
  if (result.planned > 0 && result.invalid == result.planned) {
    out << "every candidate was rejected; the first: " << result.first_invalid_reason << "\n";
    return;
  }
  if (result.fitting.empty()) {
    out << "no configuration fits";
    if (result.smallest_arena_bytes > 0) {
      out << ": the smallest arena is " << gib(static_cast<double>(result.smallest_arena_bytes)) << " of "
          << gib(result.memory_limit_bytes())
          << (result.memory_budget_bytes > 0.0 ? " (the memory budget)" : "");
    }
    out << "\n";
    return;
  }
  const size_t shown = std::min<size_t>(result.fitting.size(), 10);
  out << "fastest " << shown
      << " (step time = fwd_bwd + (GA - 1) x fwd_bwd_accum + update, predicted; with stages the schedule's "
         "span over every stage's forward and backward, its bubble included, + the slowest update, and the "
         "largest stage's arena):\n";
  out << format("  %-4s %-5s %-6s %-5s %-8s %-7s %-6s %-4s %-8s %-9s %10s %12s\n", "rank", "data", "stage",
                "fsdp", "context", "tensor", "batch", "GA", "remat", "schedule", "arena GiB", "step time");
  for (size_t i = 0; i < shown; ++i) {
    const FittingCandidate& fit = result.fitting[i];
    const SearchCandidate& c = fit.candidate;
    out << format("  %-4zu %-5lld %-6lld %-5lld %-8lld %-7lld %-6lld %-4lld %-8s %-9s %10.2f %12s\n", i + 1,
                  static_cast<long long>(c.mesh.size(MeshAxis::data)),
                  static_cast<long long>(c.mesh.size(MeshAxis::stage)),
                  static_cast<long long>(c.mesh.size(MeshAxis::fsdp)),
                  static_cast<long long>(c.mesh.size(MeshAxis::context)),
                  static_cast<long long>(c.mesh.size(MeshAxis::tensor)),
                  static_cast<long long>(c.per_device_batch_size),
                  static_cast<long long>(c.gradient_accumulation_steps), remat_policy_name(c.remat_policy),
                  c.pipelined() ? pipeline_schedule_name(c.pipeline_schedule) : "-",
                  static_cast<double>(fit.arena_bytes) / kGiB, seconds_text(fit.step_seconds).c_str());
  }
  out << "best: meshtrain compile <config> topology=" << result.topology << " "
      << result.fitting[0].candidate.overrides() << "\n";
}

// mesh.stage > 1: every stage rank planned (plan_pipeline_step), the header, the placement, each stage's
// figures, the step; --explain adds each stage's kernels and memory breakdown; plan_out writes each stage's
// files under STEM_stage<s> (plan_file_stem), which a run's ranks verify (plan_in).
void compile_pipeline(const PlanRequest& request, const std::string& config, bool explain,
                      std::ostream& out) {
  const Clock::time_point start = Clock::now();
  const PipelineStepPlan step = plan_pipeline_step(request);
  const double plan_seconds = elapsed_seconds(start);
  const TrainingPlan& first = step.stages.front();
  const PipelinePlacement placement = pipeline_placement(first.spec.config, first.pipeline.stages);
  const double formula = pipeline_bubble_formula(first.pipeline.schedule, stage_op_times(step.stages));
  print_header(first, config,
               format("%zu stage plans of %zu kernels each, planned in %.1f ms", step.stages.size(),
                      first.kernels.size(), plan_seconds * 1e3),
               out);
  print_pipeline_placement(first.spec.config, placement, out);
  for (size_t s = 0; s < step.stages.size(); ++s) {
    print_stage(step.stages[s], placement, step.simulation.ranks[s], formula, out);
    if (explain) {
      for (const KernelPlan& kernel : step.stages[s].kernels) print_kernel(kernel, out);
      print_explain(step.stages[s], out);
    }
  }
  print_pipeline_step(step, formula, out);
  if (!request.config.plan_out.empty()) {
    out << "\nplan files:\n";
    for (const TrainingPlan& stage : step.stages) write_plan_files(stage, request.config.plan_out, out);
  }
}

}  // namespace

int run_compile(const std::vector<std::string>& arguments, std::ostream& out) {
  const ParsedArguments parsed = parse_arguments(find_command("compile"), arguments);
  const std::string config = parsed.config();
  const bool explain = parsed.has("--explain"), search = parsed.has("--search");
  const std::string budget_flag = "--memory-budget";
  // --search only: the most one device's arena may use
  const double memory_budget_bytes =
      parsed.has(budget_flag) ? static_cast<double>(parse_byte_size(budget_flag, *parsed.value(budget_flag)))
                              : 0.0;
  if (memory_budget_bytes > 0.0 && !search) {
    fail("meshtrain compile " + budget_flag, "it together with --search (the search ranks what fits it)",
         "it without --search", "add --search, or drop --memory-budget to plan one configuration");
  }
  if (search) {
    if (explain) fail("meshtrain compile", "--explain or --search, not both", "both");
    const SearchResult result =
        search_training_configurations(load_config(config, parsed.overrides), memory_budget_bytes);
    print_search(result, out);
    return 0;
  }

  PlanRequest request;
  request.config = load_config(config, parsed.overrides);
  request.kernels.clear();
  for (const std::string& name : request.config.kernels) {
    const KernelName kernel = parse_kernel_name(name, "config key 'kernels'");
    if (std::find(request.kernels.begin(), request.kernels.end(), kernel) == request.kernels.end()) {
      request.kernels.push_back(kernel);
    }
  }
  if (request.kernels.empty()) {
    fail("config key 'kernels'", "at least one of fwd_bwd, fwd_bwd_accum, update, eval", "an empty list");
  }
  if (request.config.mesh[MeshAxis::stage] != 1 &&
      resolve_plan_target(request).mesh.size(MeshAxis::stage) > 1) {
    compile_pipeline(request, config, explain, out);
    return 0;
  }
  const Clock::time_point start = Clock::now();
  const TrainingPlan plan = plan_training(request);
  const double plan_seconds = elapsed_seconds(start);

  print_header(plan, config,
               format("identity %s, %zu kernel%s planned in %.1f ms", plan.identity.hash.c_str(),
                      plan.kernels.size(), plan.kernels.size() == 1 ? "" : "s", plan_seconds * 1e3),
               out);
  for (const KernelPlan& kernel : plan.kernels) print_kernel(kernel, out);
  print_context_attention(plan, out);
  print_expert_dispatch(plan, out);
  print_verdict(plan, out);
  if (explain) print_explain(plan, out);
  if (!request.config.plan_out.empty()) {
    out << "\nplan files:\n";
    write_plan_files(plan, request.config.plan_out, out);
  }
  return 0;
}

}  // namespace meshtrain
