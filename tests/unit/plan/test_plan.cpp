// The plan: exact per-device bytes under sharding, collective bytes by the aot-plan.md definitions, the
// live engine running exactly the AOT plan, remat policies that change memory and not results, and the
// errors for meshes and plan files that do not fit the run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/attention.h"
#include "meshtrain/kernels/cpu/backend.h"
#include "meshtrain/plan/decode.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/engine.h"
#include "tiny_plan.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

// A tiny model's overrides; `extra` adds keys or replaces the tiny defaults (a key twice is a config error).
std::vector<std::string> tiny(const std::vector<std::string>& extra = {}) {
  return testing::with_overrides(
      {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8", "base_mlp_dim=48",
       "base_num_decoder_layers=2", "vocab_size=100", "max_target_length=16", "per_device_batch_size=2",
       "init_weights_seed=3", "dataset_type=synthetic", "tokenizer_path="},
      extra);
}

TrainingPlan plan_for(const std::string& preset, const std::vector<std::string>& overrides,
                      std::vector<KernelName> kernels = {kKernelNames.begin(), kKernelNames.end()}) {
  PlanRequest request;
  request.config = load_config(preset, overrides);
  request.kernels = std::move(kernels);
  return plan_training(request);
}

size_t persistent_bytes_of(const TrainingPlan& plan, BufferKind kind) {
  size_t bytes = 0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.persistent && buffer.kind == kind) bytes += buffer.bytes;
  }
  return bytes;
}

double collective_bytes(const KernelPlan& kernel, const std::string& axis) {
  const auto found = kernel.collective_bytes.find(axis);
  return found == kernel.collective_bytes.end() ? 0.0 : found->second;
}

using testing::error_of;

Batch batch_for(const ModelSpec& spec, uint32_t seed) {
  const ModelDims& m = spec.dims;
  Batch batch;
  uint32_t state = seed * 2654435761u + 1;
  for (int64_t b = 0; b < m.B; ++b) {
    for (int64_t s = 0; s < m.S; ++s) {
      state = state * 1664525u + 1013904223u;
      batch.tokens.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(m.V_valid)));
      batch.targets.push_back(static_cast<int32_t>((state >> 16) % static_cast<uint32_t>(m.V_valid)));
      batch.positions.push_back(static_cast<int32_t>(s));
      batch.segment_ids.push_back(0);
      batch.loss_mask.push_back(s % 5 != 4);
    }
  }
  return batch;
}

// Losses of `steps` training steps (GA 2) and the final parameters.
struct RunResult {
  std::vector<double> losses, grad_norms;
  std::vector<float> parameters;
};

// The cpu table storing every activation in float32, each bf16 matmul rounding its own x: the cpu plan
// without the producers' rounding.
const kernels::KernelBackend& cpu_rounding_in_the_matmuls() {
  static const kernels::KernelBackend table = [] {
    kernels::KernelBackend cpu = kernels::cpu_backend();
    cpu.matmul_input_dtype = [](DType) { return DType::f32; };
    return cpu;
  }();
  return table;
}

using kernels::AttentionProducts;

// The cpu table with the given attention kernels under dtype=bfloat16, whichever this CPU's table picks: the
// float32 ones (the bf16 run as it was before attention had bf16 products), the AVX512-BF16 ones or the AMX
// ones (bf16 products).
const kernels::KernelBackend& cpu_with_bf16_attention(AttentionProducts kind) {
  const auto make = [](AttentionProducts products) {
    kernels::KernelBackend cpu = kernels::cpu_backend();
    const kernels::AttentionKernels set = kernels::attention_kernels_with(products);
    cpu.attention_forward_bf16 = set.forward;
    cpu.attention_backward_bf16 = set.backward;
    cpu.context_attention_forward_bf16 = set.context_forward;
    cpu.context_attention_backward_bf16 = set.context_backward;
    return cpu;
  };
  static const kernels::KernelBackend with_float32 = make(AttentionProducts::float32),
                                      with_avx512_bf16 = make(AttentionProducts::avx512_bf16),
                                      with_amx = make(AttentionProducts::amx);
  return kind == AttentionProducts::amx           ? with_amx
         : kind == AttentionProducts::avx512_bf16 ? with_avx512_bf16
                                                  : with_float32;
}

RunResult train(Engine& engine, int steps) {
  RunResult result;
  for (int step = 0; step < steps; ++step) {
    const LossSums first = engine.fwd_bwd(batch_for(engine.spec(), static_cast<uint32_t>(2 * step)));
    const LossSums second =
        engine.fwd_bwd_accum(batch_for(engine.spec(), static_cast<uint32_t>(2 * step + 1)));
    const int64_t count = first.valid_count + second.valid_count;
    result.losses.push_back((first.loss_sum + second.loss_sum) / static_cast<double>(count));
    result.grad_norms.push_back(engine.update(count, 1e-2, step).grad_norm);
  }
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    const TensorView value = engine.view(parameter.value);
    result.parameters.insert(result.parameters.end(), value.f32(), value.f32() + value.elements());
  }
  return result;
}

// Issue 4's cross-check: qwen3-8b, h100x8, fsdp=8, fp32 everything.
TEST(Plan, Qwen3_8bFsdp8BytesPerDevice) {
  const TrainingPlan plan = plan_for("qwen3-8b", {"topology=h100x8", "mesh.fsdp=8"}, {KernelName::update});
  EXPECT_EQ(plan.spec.parameter_count() * 4 / 8, 4095367680);  // the model is the issue's
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::parameter), 4095367680u);
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::gradient), 4095367680u);
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::optimizer_state), 8190735360u);
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::step_counter), 4u);
}

TEST(Plan, Bf16WeightsKeepFloat32MasterAndMoments) {
  const TrainingPlan plan =
      plan_for("qwen3-8b", {"topology=h100x8", "mesh.fsdp=8", "weight_dtype=bfloat16", "dtype=bfloat16"},
               {KernelName::update});
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::parameter), 4095367680u / 2);
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::gradient), 4095367680u);  // grad_dtype float32
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::optimizer_state), 8190735360u + 4095367680u);  // + master
}

TEST(Plan, LiveEngineRunsTheAotPlan) {
  for (const char* remat : {"none", "minimal", "full"}) {
    const std::vector<std::string> overrides = tiny({std::string("remat_policy=") + remat});
    const TrainingPlan aot = plan_for("qwen3-tiny", overrides);
    Engine engine(load_config("qwen3-tiny", overrides));
    EXPECT_EQ(engine.arena_bytes(), aot.arena_bytes) << remat;
    EXPECT_EQ(aot.arena_bytes, aot.persistent_bytes + aot.kernel(KernelName::fwd_bwd).memory.temps) << remat;
    std::vector<std::string> before;
    for (KernelName kernel : kKernelNames) {
      before.push_back(serialize_kernel_plan(engine.plan(), kernel));
      EXPECT_EQ(before.back(), serialize_kernel_plan(aot, kernel)) << remat << " " << kernel_name(kernel);
    }
    // Running steps changes no plan: the plan of step 2 is the plan of step 1.
    train(engine, 2);
    for (KernelName kernel : kKernelNames) {
      EXPECT_EQ(serialize_kernel_plan(engine.plan(), kernel), before[static_cast<size_t>(kernel)]);
    }
    EXPECT_EQ(serialize_kernel_plan(plan_for("qwen3-tiny", overrides), KernelName::fwd_bwd), before[0]);
  }
}

// Remat changes memory, never results: every policy gives bitwise the losses and parameters of `none`, also
// with the temporaries poisoned (an op reading memory it did not declare would turn results into NaN).
TEST(Plan, RematPoliciesSaveMemoryWithIdenticalResults) {
  for (const char* preset : {"qwen3-tiny", "gpt2-124m", "deepseek-tiny"}) {
    std::vector<std::string> family = tiny();
    if (std::string(preset) == "gpt2-124m")
      family = tiny({"base_num_kv_heads=4", "max_position_embeddings=16"});
    // Multi-head latent attention: in-place RoPE on q, column slices through shared scratch.
    if (std::string(preset) == "deepseek-tiny")
      family = tiny({"base_num_kv_heads=4", "q_lora_rank=12", "kv_lora_rank=10", "qk_nope_head_dim=6",
                     "qk_rope_head_dim=4", "v_head_dim=8"});
    Engine reference(load_config(preset, family));
    const RunResult expected = train(reference, 3);
    size_t previous_temps = SIZE_MAX;
    for (const char* remat : {"none", "minimal", "full"}) {
      std::vector<std::string> overrides = family;
      overrides.push_back(std::string("remat_policy=") + remat);
      Engine engine(load_config(preset, overrides));
      engine.set_poison_temporaries(true);
      const RunResult result = train(engine, 3);
      EXPECT_EQ(result.losses, expected.losses) << preset << " " << remat;
      EXPECT_EQ(result.grad_norms, expected.grad_norms) << preset << " " << remat;
      EXPECT_EQ(result.parameters, expected.parameters) << preset << " " << remat;
      const KernelPlan& fwd_bwd = engine.plan().kernel(KernelName::fwd_bwd);
      EXPECT_LT(fwd_bwd.memory.temps, previous_temps) << preset << " " << remat << " saves no memory";
      previous_temps = fwd_bwd.memory.temps;
      int recomputed = 0;
      for (const PlanOp& op : fwd_bwd.ops) recomputed += op.recompute ? 1 : 0;
      EXPECT_EQ(recomputed > 0, std::string(remat) != "none") << preset << " " << remat;
    }
  }
}

TEST(Plan, DataParallelBytesDoNotDependOnAccumulation) {
  double update_bytes = -1.0;
  for (const char* ga : {"1", "4", "16"}) {
    const TrainingPlan plan =
        plan_for("qwen3-tiny", tiny({"mesh.data=2", std::string("gradient_accumulation_steps=") + ga}));
    EXPECT_EQ(collective_bytes(plan.kernel(KernelName::fwd_bwd), "data"), 0.0);
    EXPECT_EQ(collective_bytes(plan.kernel(KernelName::fwd_bwd_accum), "data"), 0.0);
    const double bytes = collective_bytes(plan.kernel(KernelName::update), "data");
    if (update_bytes >= 0.0) {
      EXPECT_EQ(bytes, update_bytes) << "GA " << ga;
    }
    update_bytes = bytes;
  }
  // All-reduce of every gradient: 2 x bytes x (n-1)/n = the gradient bytes for n = 2, plus the valid count
  // (8 bytes) all-reduced the same way. The norm needs no reduction: gradients are whole on every rank.
  const TrainingPlan plan = plan_for("qwen3-tiny", tiny({"mesh.data=2"}));
  const double gradients = static_cast<double>(persistent_bytes_of(plan, BufferKind::gradient));
  EXPECT_EQ(update_bytes, gradients + 8.0);
}

TEST(Plan, Zero1ReduceScattersAndGathersOnce) {
  const TrainingPlan plan = plan_for("qwen3-tiny", tiny({"mesh.data=2", "shard_optimizer_over_data=true"}));
  const double gradients = static_cast<double>(persistent_bytes_of(plan, BufferKind::gradient));
  // Reduce-scatter of the gradients (bytes x 1/2) and all-gather of the parameters (bytes x 1/2).
  EXPECT_EQ(collective_bytes(plan.kernel(KernelName::update), "data"), gradients / 2 + gradients / 2 + 16.0);
  // Moments are halved over data; parameters and gradients stay whole.
  const TrainingPlan replicated = plan_for("qwen3-tiny", tiny({"mesh.data=2"}));
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::optimizer_state) * 2,
            persistent_bytes_of(replicated, BufferKind::optimizer_state));
  EXPECT_EQ(persistent_bytes_of(plan, BufferKind::parameter),
            persistent_bytes_of(replicated, BufferKind::parameter));
}

TEST(Plan, FsdpGathersEachLayerPerPhaseAndScattersGradients) {
  const TrainingPlan plan = plan_for("qwen3-tiny", tiny({"mesh.fsdp=2"}));
  const double parameters = static_cast<double>(persistent_bytes_of(plan, BufferKind::parameter));  // shards
  // Tied qwen3: every parameter is read in the forward and again in the backward (two gathers of the full
  // tensor, each moving half of it), and its gradient is reduce-scattered once (half of the full tensor).
  const double full = 2.0 * parameters;
  EXPECT_EQ(collective_bytes(plan.kernel(KernelName::fwd_bwd), "fsdp"), 3.0 * full / 2.0);
  // Eval gathers everything once for the forward, and the tied table again for the loss.
  double table = 0.0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.name == "token_embedder/embedding") table = static_cast<double>(buffer.bytes);
  }
  EXPECT_EQ(collective_bytes(plan.kernel(KernelName::eval), "fsdp"), full / 2.0 + table / 2.0);
  const TrainingPlan single = plan_for("qwen3-tiny", tiny());
  EXPECT_EQ(2 * persistent_bytes_of(plan, BufferKind::parameter),
            persistent_bytes_of(single, BufferKind::parameter));
  // The batch splits over fsdp: per_device_batch_size x 2 devices / 2 = the same rows per device.
  EXPECT_EQ(plan.spec.dims.B, single.spec.dims.B);
}

TEST(Plan, TensorParallelShardsHeadsMlpAndVocab) {
  const TrainingPlan plan = plan_for("qwen3-tiny", tiny({"mesh.tensor=2"}));
  const ModelDims& m = plan.spec.dims;
  EXPECT_EQ(m.H, 2);
  EXPECT_EQ(m.K, 1);
  EXPECT_EQ(m.F, 24);
  EXPECT_EQ(m.V_padded, 128);
  EXPECT_EQ(m.V, 64);
  EXPECT_EQ(m.B, 4);  // per_device_batch_size x 2 devices, replicated over tensor
  EXPECT_GT(collective_bytes(plan.kernel(KernelName::fwd_bwd), "tensor"), 0.0);
  EXPECT_EQ(collective_bytes(plan.kernel(KernelName::fwd_bwd), "data"), 0.0);
  // More tensor ranks than kv heads: kv heads are replicated, one per rank.
  EXPECT_EQ(plan_for("qwen3-tiny", tiny({"mesh.tensor=4"})).spec.dims.K, 1);
}

// Every rank's shard of every parameter maps to distinct global elements, and together they cover the global
// tensor exactly once per replica (kv heads over a larger tensor degree: once per group).
TEST(Plan, ShardsTileTheGlobalTensors) {
  for (const char* mesh : {"mesh.tensor=2", "mesh.fsdp=2", "mesh.tensor=4"}) {
    const TrainingPlan plan = plan_for("qwen3-tiny", tiny({mesh, "mesh.data=2"}));
    for (size_t p = 0; p < plan.spec.parameters.size(); ++p) {
      const PlanBuffer& store = plan.buffers[static_cast<size_t>(plan.storage[p].value_store)];
      const std::vector<int64_t> global =
          global_dims(plan, plan.spec.buffer(plan.spec.parameters[p].value).shape);
      int64_t global_count = 1;
      for (int64_t size : global) global_count *= size;
      std::vector<int> hits(static_cast<size_t>(global_count), 0);
      for (int64_t rank = 0; rank < plan.mesh.devices(); ++rank) {
        const GlobalIndex index(store.shape, store.sharding, global, plan.mesh,
                                mesh_coordinates(plan.mesh, rank));
        for (int64_t i = 0; i < store.shape.elements(); ++i) ++hits[static_cast<size_t>(index(i))];
      }
      // Each element is held by the same number of ranks (the replicas).
      const int replicas = hits[0];
      EXPECT_GT(replicas, 0);
      for (int count : hits) ASSERT_EQ(count, replicas) << mesh << " " << store.name;
      EXPECT_EQ(static_cast<int64_t>(replicas) * global_count, plan.mesh.devices() * store.shape.elements());
    }
  }
}

TEST(Plan, NonFiniteGradientLeavesParametersUnchanged) {
  Engine engine(load_config("qwen3-tiny", tiny()));
  const LossSums sums = engine.fwd_bwd(batch_for(engine.spec(), 1));
  engine.view(engine.spec().parameters[3].gradient).f32()[5] = std::numeric_limits<float>::quiet_NaN();
  const RunResult before = train(engine, 0);  // parameters only
  const UpdateResult update = engine.update(sums.valid_count, 1e-2, 0);
  EXPECT_TRUE(update.nonfinite);
  EXPECT_EQ(train(engine, 0).parameters, before.parameters);
  // And a finite step does change them (the comparison can fail).
  const LossSums next = engine.fwd_bwd(batch_for(engine.spec(), 2));
  EXPECT_FALSE(engine.update(next.valid_count, 1e-2, 1).nonfinite);
  EXPECT_NE(train(engine, 0).parameters, before.parameters);
}

TEST(Plan, BadMeshesNameTheKey) {
  EXPECT_NE(error_of([] {
              plan_for("qwen3-tiny", tiny({"topology=h100x8", "mesh.data=3"}));
            }).find("product of 8"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_for("qwen3-tiny", tiny({"mesh.tensor=3"})); }).find("base_num_query_heads"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              plan_for("qwen3-tiny", tiny({"topology=h100x8", "mesh.tensor=8"}));
            }).find("base_num_query_heads"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              plan_for("qwen3-tiny", tiny({"topology=h100x8", "mesh.data=-1", "mesh.fsdp=-1"}));
            }).find("-1"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_for("qwen3-tiny", tiny({"topology=h100x9"})); }).find("h100x"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              plan_for("qwen3-tiny", tiny({"logical_axis_rules.mlp=data"}));
            }).find("logical_axis_rules.mlp"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_for("qwen3-tiny", tiny({"remat_policy=some"})); }).find("remat_policy"),
            std::string::npos);
  // -1 fills in from the topology's devices.
  EXPECT_EQ(plan_for("qwen3-tiny", tiny({"topology=h100x8", "mesh.data=-1", "mesh.tensor=2"}))
                .mesh.size(MeshAxis::data),
            4);
}

// plan_training checks the pipeline placement for every mesh and refuses one with stages (not built yet)
// once it passes: with the key, the value and the fix, before anything is planned or allocated. A mesh with
// stage -1 filled in to 1 plans as before.
// A mesh with stages plans one stage rank (PlanRequest::stage): its chunks' layers (the first stage the
// embedding, the last the head), the split kernels per chunk with its boundary buffers in the activation
// slots, update and eval, and its schedule as program entries with their transfers; each stage's identity
// is its own. The placement's own errors come first.
TEST(Plan, AStageRankPlansItsChunksAndItsSchedule) {
  const auto stage_plan = [](int64_t stage, const std::vector<std::string>& keys) {
    PlanRequest request;
    request.config = load_config("qwen3-tiny", tiny(keys));
    request.stage = stage;
    return plan_training(request);
  };
  const std::vector<std::string> two = {"topology=h100x2", "mesh.stage=2", "gradient_accumulation_steps=2"};
  const TrainingPlan first = stage_plan(0, two), last = stage_plan(1, two);
  ASSERT_EQ(first.spec.chunks.size(), 1u);
  EXPECT_TRUE(first.spec.chunks[0].layers.with_embedding && !first.spec.with_head());
  EXPECT_TRUE(!last.spec.chunks[0].layers.with_embedding && last.spec.with_head());
  EXPECT_NE(first.identity.hash, last.identity.hash);
  for (const TrainingPlan* plan : {&first, &last}) {
    EXPECT_EQ(plan->find(KernelName::fwd_bwd), nullptr);
    for (KernelName kernel : {KernelName::zero_gradients, KernelName::forward, KernelName::backward,
                              KernelName::update, KernelName::eval})
      EXPECT_NE(plan->find(kernel), nullptr) << kernel_name(kernel);
    EXPECT_EQ(plan->stash.slots, 2);  // 1F1B, M = P = 2: the first stage holds both micro-batches
  }
  // Stage 0 sends activations and receives gradients; stage 1 the reverse; each boundary buffer in a slot.
  std::map<ProgramEntry::Transfer, int> transfers;
  for (const ProgramEntry& entry : first.program.gradients) {
    if (entry.transfer == ProgramEntry::Transfer::none) continue;
    ++transfers[entry.transfer];
    EXPECT_EQ(entry.peer, 1);
    EXPECT_NE(first.stash.find(first.pipeline.buffer_of(entry.transfer, entry.chunk)), nullptr);
  }
  EXPECT_EQ(transfers,
            (std::map<ProgramEntry::Transfer, int>{{ProgramEntry::Transfer::send_activation, 2},
                                                   {ProgramEntry::Transfer::receive_gradient, 2}}));
  // Interleaved: 4 layers over 2 stages x 2 repeats; stage 1 holds layers 1 and 3, the head on the second.
  const TrainingPlan interleaved = stage_plan(
      1, {"topology=h100x2", "mesh.stage=2", "gradient_accumulation_steps=2", "base_num_decoder_layers=4",
          "pipeline_schedule=interleaved_1f1b", "num_pipeline_repeats=2"});
  ASSERT_EQ(interleaved.spec.chunks.size(), 2u);
  EXPECT_EQ(interleaved.spec.chunks[0].layers.first_layer, 1);
  EXPECT_EQ(interleaved.spec.chunks[1].layers.first_layer, 3);
  EXPECT_TRUE(interleaved.spec.with_head());
  for (int64_t chunk : {0, 1}) {
    EXPECT_NE(interleaved.find(KernelName::forward, chunk), nullptr);
    EXPECT_NE(interleaved.find(KernelName::backward, chunk), nullptr);
  }
  const std::string placement = error_of([] {
    plan_for("qwen3-tiny", tiny({"topology=h100x4", "mesh.stage=4"}));
  });
  EXPECT_NE(placement.find("config keys 'mesh.stage' / 'num_pipeline_repeats'"), std::string::npos)
      << placement;
  const std::string split = error_of([] { plan_for("qwen3-tiny", tiny({"pipeline_layers_per_chunk=[3]"})); });
  EXPECT_NE(split.find("a sum of 3 ([3])"), std::string::npos) << split;
  const TrainingPlan filled =
      plan_for("qwen3-tiny",
               tiny({"topology=h100x2", "mesh.data=2", "mesh.stage=-1", "pipeline_layers_per_chunk=[2]"}),
               {KernelName::fwd_bwd});
  EXPECT_EQ(filled.mesh.size(MeshAxis::stage), 1);
  EXPECT_EQ(
      filled.identity.hash,
      plan_for("qwen3-tiny", tiny({"topology=h100x2", "mesh.data=2"}), {KernelName::fwd_bwd}).identity.hash);
}

// dtype=bfloat16 on the cpu backend: activations stay float32 except those only dense matmuls read (the
// pre-norms' outputs and the MLP's gated hidden), which their producers store rounded to bf16; each dense
// matmul (and the fused loss) has a bf16 scratch for the inputs it rounds itself, live only inside its op;
// the live arena is the plan's, and the losses follow float32's (training-step.md: bf16 to rtol 1e-2).
TEST(Plan, Bf16ComputeRunsThePlan) {
  const TrainingPlan f32 = plan_for("qwen3-tiny", tiny());
  const TrainingPlan bf16 = plan_for("qwen3-tiny", tiny({"dtype=bfloat16"}));
  int64_t bf16_scratches = 0, bf16_activations = 0;
  for (const BufferDecl& buffer : bf16.spec.buffers) {
    if (buffer.kind == BufferKind::activation) {
      const bool matmul_input =
          buffer.name.ends_with("layer_norm/out") || buffer.name.ends_with("/activated");
      EXPECT_EQ(buffer.dtype, matmul_input ? DType::bf16 : DType::f32) << buffer.name;
      bf16_activations += matmul_input;
    }
    if (buffer.dtype == DType::bf16 && buffer.kind != BufferKind::activation) {
      EXPECT_EQ(buffer.kind, BufferKind::scratch) << buffer.name;
      EXPECT_TRUE(buffer.name.ends_with("bf16_inputs")) << buffer.name;
      ++bf16_scratches;
    }
  }
  // Two pre-norms and the gated hidden per layer x 2 layers.
  EXPECT_EQ(bf16_activations, 3 * 2);
  // Seven projections per layer (q, k, v, o, gate, up, down) x 2 layers, and the loss.
  EXPECT_EQ(bf16_scratches, 7 * 2 + 1);
  EXPECT_EQ(bf16.persistent_bytes, f32.persistent_bytes);
  if (!cpu_features().avx512_bf16 && !cpu_features().amx_bf16) {
    GTEST_SKIP() << "a live bf16 run needs AVX512-BF16 or AMX-BF16; this CPU: " << cpu_features().describe();
  }
  Engine bf16_engine(load_config("qwen3-tiny", tiny({"dtype=bfloat16"})));
  EXPECT_EQ(bf16_engine.arena_bytes(), bf16.arena_bytes);
  Engine f32_engine(load_config("qwen3-tiny", tiny()));
  const RunResult with_bf16 = train(bf16_engine, 3), with_f32 = train(f32_engine, 3);
  for (size_t step = 0; step < with_f32.losses.size(); ++step) {
    EXPECT_NEAR(with_bf16.losses[step], with_f32.losses[step], 1e-2 * with_f32.losses[step]) << step;
    EXPECT_NE(with_bf16.losses[step], with_f32.losses[step]) << step << ": bf16 rounding changes the loss";
  }
}

// The producers' rounding (matmul_input_dtype: norms, SwiGLU and GELU write the bf16 input of the matmuls
// that read them) against the same run with every activation float32 and each matmul rounding its own x (the
// cpu table with that one entry changed): the same losses, gradient norms and parameters bit for bit, for
// RMSNorm + SwiGLU (qwen3) and LayerNorm + GELU (gpt2), in a smaller arena.
TEST(Plan, Bf16MatmulInputsRoundedByTheirProducersChangeNoBit) {
  for (const std::string preset : {"qwen3-tiny", "gpt2-124m"}) {
    const Config config = load_config(preset, tiny({"dtype=bfloat16", "max_position_embeddings=16"}));
    PlanRequest fused_request, unfused_request;
    fused_request.config = unfused_request.config = config;
    unfused_request.backend = &cpu_rounding_in_the_matmuls();
    TrainingPlan fused = plan_training(fused_request), unfused = plan_training(unfused_request);
    EXPECT_LT(fused.arena_bytes, unfused.arena_bytes) << preset;
    for (const BufferDecl& buffer : unfused.spec.buffers) {
      if (buffer.kind == BufferKind::activation) {
        EXPECT_EQ(buffer.dtype, DType::f32) << buffer.name;
      }
    }
    if (!cpu_features().avx512_bf16 && !cpu_features().amx_bf16) {
      GTEST_SKIP() << "a live bf16 run needs AVX512-BF16 or AMX-BF16; this CPU: "
                   << cpu_features().describe();
    }
    Engine fused_engine(std::move(fused)), unfused_engine(std::move(unfused));
    const RunResult with_fusion = train(fused_engine, 3), without = train(unfused_engine, 3);
    EXPECT_EQ(with_fusion.losses, without.losses) << preset;
    EXPECT_EQ(with_fusion.grad_norms, without.grad_norms) << preset;
    EXPECT_EQ(with_fusion.parameters, without.parameters) << preset;
  }
}

// bf16 attention (bf16 products, float32 softmax and accumulation) against the same bf16 runs with float32
// attention, qwen3-tiny (GQA, QK-norm, RoPE) and gpt2: the same arena, and losses within the bound a bf16
// run keeps to float32 (1e-2 relative, as in Plan.Bf16ComputeRunsThePlan), not equal (the bf16 kernels did
// run). The tables are explicit, so this runs the AVX512-BF16 kernels on every CPU with AVX512-BF16 and the
// AMX ones on every CPU with AMX, whichever one cpu_backend picks.
TEST(Plan, Bf16AttentionLossesWithinBf16BoundsOfFloat32Attention) {
  if (!cpu_features().avx512_bf16) {
    GTEST_SKIP() << "bf16 attention needs AVX512-BF16; this CPU: " << cpu_features().describe();
  }
  std::vector<AttentionProducts> kinds = {AttentionProducts::avx512_bf16};
  if (cpu_features().amx_bf16) {
    kinds.push_back(AttentionProducts::amx);
  } else {
    std::printf("  no AMX on this CPU (%s): the AMX attention kernels are not run\n",
                cpu_features().describe().c_str());
  }
  for (const AttentionProducts kind : kinds) {
    for (const std::string preset : {"qwen3-tiny", "gpt2-124m"}) {
      const Config config = load_config(preset, tiny({"dtype=bfloat16", "max_position_embeddings=16"}));
      PlanRequest bf16_request, f32_request;
      bf16_request.config = f32_request.config = config;
      bf16_request.backend = &cpu_with_bf16_attention(kind);
      f32_request.backend = &cpu_with_bf16_attention(AttentionProducts::float32);
      TrainingPlan bf16 = plan_training(bf16_request), f32 = plan_training(f32_request);
      EXPECT_EQ(bf16.arena_bytes, f32.arena_bytes) << preset;
      Engine bf16_engine(std::move(bf16)), f32_engine(std::move(f32));
      const RunResult with_bf16 = train(bf16_engine, 3), with_f32 = train(f32_engine, 3);
      for (size_t step = 0; step < with_f32.losses.size(); ++step) {
        EXPECT_NEAR(with_bf16.losses[step], with_f32.losses[step], 1e-2 * with_f32.losses[step])
            << preset << " step " << step << " kernels " << static_cast<int>(kind);
        EXPECT_NE(with_bf16.losses[step], with_f32.losses[step])
            << preset << " step " << step << " kernels " << static_cast<int>(kind);
      }
    }
  }
}

// A TPU topology (no backend here) is planned as its backend will store it: bf16 activations, no rounding
// scratch; and a decode spec computes in float32 (no rounding of W for every token).
TEST(Plan, Bf16OnAcceleratorsStoresBf16ActivationsAndDecodesInFloat32) {
  const TrainingPlan f32 = plan_for("qwen3-tiny", tiny({"topology=v5p-16", "mesh.data=8"}));
  const TrainingPlan bf16 =
      plan_for("qwen3-tiny", tiny({"topology=v5p-16", "mesh.data=8", "dtype=bfloat16"}));
  size_t f32_activations = 0, bf16_activations = 0;
  for (const PlanBuffer& buffer : f32.buffers) {
    if (buffer.kind == BufferKind::activation) f32_activations += buffer.bytes;
  }
  for (const PlanBuffer& buffer : bf16.buffers) {
    if (buffer.kind == BufferKind::activation) {
      EXPECT_EQ(buffer.dtype, DType::bf16) << buffer.name;
      bf16_activations += buffer.bytes;
    }
    EXPECT_FALSE(buffer.name.ends_with("bf16_inputs")) << buffer.name;
  }
  EXPECT_GT(f32_activations, 0u);
  EXPECT_EQ(2 * bf16_activations, f32_activations);
  const TrainingPlan decode = plan_decode(load_config("qwen3-tiny", tiny({"dtype=bfloat16"})), 4);
  for (const BufferDecl& buffer : decode.spec.buffers) EXPECT_NE(buffer.dtype, DType::bf16) << buffer.name;
}

// An NVIDIA topology is planned as the cuda kernels run it, with or without CUDA in this build: as the cpu
// kernels (dtype=bfloat16: the norms, SwiGLU and GELU store the matmul-only activations in bf16, the other
// matmul inputs rounded into planned scratch), so its memory and every buffer are the cpu plan's.
TEST(Plan, NvidiaTopologiesArePlannedAsTheCudaKernelsRunThem) {
  for (const char* dtype : {"dtype=float32", "dtype=bfloat16"}) {
    const bool bf16 = std::string(dtype) == "dtype=bfloat16";
    const TrainingPlan gpu = plan_for("qwen3-tiny", tiny({"topology=h200x1", dtype}));
    const TrainingPlan cpu = plan_for("qwen3-tiny", tiny({dtype}));
    EXPECT_EQ(gpu.arena_bytes, cpu.arena_bytes) << dtype;
    EXPECT_EQ(gpu.persistent_bytes, cpu.persistent_bytes) << dtype;
    ASSERT_EQ(gpu.buffers.size(), cpu.buffers.size()) << dtype;
    bool bf16_activation = false, rounding_scratch = false;
    for (size_t i = 0; i < gpu.buffers.size(); ++i) {
      const PlanBuffer& buffer = gpu.buffers[i];
      EXPECT_EQ(buffer.name, cpu.buffers[i].name) << dtype;
      EXPECT_EQ(buffer.dtype, cpu.buffers[i].dtype) << buffer.name;
      EXPECT_EQ(buffer.bytes, cpu.buffers[i].bytes) << buffer.name;
      bf16_activation =
          bf16_activation || (buffer.kind == BufferKind::activation && buffer.dtype == DType::bf16);
      rounding_scratch = rounding_scratch || buffer.name.ends_with("bf16_inputs");
    }
    EXPECT_EQ(bf16_activation, bf16) << dtype;
    EXPECT_EQ(rounding_scratch, bf16) << dtype;
  }
}

TEST(Plan, LiveRunsRefuseWhatThisProcessCannotRun) {
  EXPECT_NE(error_of([] { Engine engine(load_config("qwen3-tiny", tiny({"mesh.data=2"}))); }).find("mesh"),
            std::string::npos);
  // bf16 compute runs where the CPU has bf16 instructions (Plan.Bf16ComputeRunsThePlan), else is refused.
  if (!cpu_features().avx512_bf16 && !cpu_features().amx_bf16) {
    EXPECT_NE(
        error_of([] { Engine engine(load_config("qwen3-tiny", tiny({"dtype=bfloat16"}))); }).find("dtype"),
        std::string::npos);
  }
  // A topology no backend here runs, and an NVIDIA one without CUDA in this build or a visible GPU, are
  // refused naming the key and why.
  EXPECT_NE(
      error_of([] { Engine engine(load_config("qwen3-tiny", tiny({"topology=v5p-8"}))); }).find("topology"),
      std::string::npos);
  if (const std::string why = kernels::kernel_backend_for_device("h200").device_check(); !why.empty()) {
    const std::string no_gpu =
        error_of([] { Engine engine(load_config("qwen3-tiny", tiny({"topology=h200x1"}))); });
    EXPECT_NE(no_gpu.find("'topology'"), std::string::npos) << no_gpu;
    EXPECT_NE(no_gpu.find(why), std::string::npos) << no_gpu;
    // Engram and mHC have cuda kernels: such a model is refused here only for want of a GPU.
    const std::string engram_mhc = error_of([] {
      Engine engine(load_config(
          "qwen3-tiny",
          tiny({"topology=h200x1", "decoder_block=deepseek", "engram_layers=[0,1]", "engram_num_heads=2",
                "engram_head_dim=4", "engram_vocab_bases=[31,37]", "mhc_expansion_rate=2"})));
    });
    EXPECT_NE(engram_mhc.find("'topology'"), std::string::npos) << engram_mhc;
    EXPECT_NE(engram_mhc.find(why), std::string::npos) << engram_mhc;
    // So do MoE and MLA.
    const std::string moe =
        error_of([] { Engine engine(load_config("deepseek-tiny", {"topology=h200x1"})); });
    EXPECT_NE(moe.find("'topology'"), std::string::npos) << moe;
    EXPECT_NE(moe.find(why), std::string::npos) << moe;
  }
  // What the cuda kernels do not cover yet is refused on an NVIDIA topology on any machine, naming the key.
  const std::string mesh = error_of([] {
    Engine engine(load_config("qwen3-tiny", tiny({"topology=h200x2", "mesh.data=2"})));
  });
  EXPECT_NE(mesh.find("'mesh'"), std::string::npos) << mesh;
  // A plan larger than this machine is refused before anything is allocated, with the breakdown.
  const std::string too_big =
      error_of([] { Engine engine(load_config("qwen3-32b", {"per_device_batch_size=64"})); });
  EXPECT_NE(too_big.find("GiB"), std::string::npos) << too_big;
  EXPECT_NE(too_big.find("largest buffers"), std::string::npos) << too_big;
}

TEST(Plan, PlanFilesAreVerifiedNeverSilentlyReplanned) {
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_plan_files_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string stem = (dir / "tiny").string();
  const TrainingPlan plan = plan_for("qwen3-tiny", tiny());
  for (KernelName kernel : kKernelNames) {
    std::ofstream(plan_file_path(stem, kernel)) << serialize_kernel_plan(plan, kernel);
  }
  for (KernelName kernel : kKernelNames) EXPECT_NO_THROW(verify_plan_file(plan, kernel, stem));
  const TrainingPlan other = plan_for("qwen3-tiny", tiny({"per_device_batch_size=3"}));
  const std::string mismatch = error_of([&] { verify_plan_file(other, KernelName::fwd_bwd, stem); });
  EXPECT_NE(mismatch.find("per_device_batch_size"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find("tiny_fwd_bwd.json"), std::string::npos) << mismatch;
  const std::string missing = error_of([&] { verify_plan_file(plan, KernelName::eval, stem + "_absent"); });
  EXPECT_NE(missing.find("meshtrain compile"), std::string::npos) << missing;
  fs::remove_all(dir);
}

// Context parallelism: the plan refuses a row length the reorder cannot cut, before any buffer exists,
// with the reorder's error (the keys, the values and the fix); a length that splits plans the CP ops.
TEST(Plan, ContextParallelRefusesALengthTheReorderCannotSplit) {
  const auto plan_on_two = [](const std::vector<std::string>& extra) {
    PlanRequest request;
    request.config = load_config("qwen3-tiny", tiny(extra));
    request.devices = 2;
    return plan_training(request);
  };
  const std::string odd = testing::error_of([&] { plan_on_two({"mesh.context=2", "max_target_length=18"}); });
  EXPECT_NE(odd.find("config key 'max_target_length' (with mesh.context=2"), std::string::npos) << odd;
  EXPECT_NE(odd.find("dual_chunk_swap"), std::string::npos) << odd;
  EXPECT_NE(odd.find("max_target_length=18"), std::string::npos) << odd;
  // Striped (and the plain split) need only a multiple of mesh.context.
  const TrainingPlan striped =
      plan_on_two({"mesh.context=2", "max_target_length=18", "context_parallel_reorder=striped"});
  EXPECT_EQ(striped.spec.dims.S, 9);
  const TrainingPlan balanced = plan_on_two({"mesh.context=2"});
  EXPECT_EQ(balanced.spec.dims.S, 8);
  int gathers = 0, scatters = 0, context_reductions = 0;
  for (const OpDecl& op : balanced.spec.forward)
    gathers += op.kind == OpKind::collective && op.collective.axis == MeshAxis::context &&
               op.collective.kind == CollectiveKind::all_gather;
  for (const OpDecl& op : balanced.spec.loss_backward)
    scatters += op.kind == OpKind::collective && op.collective.axis == MeshAxis::context &&
                op.collective.kind == CollectiveKind::reduce_scatter;
  for (const OpDecl& op : balanced.plan_ops)
    context_reductions += op.name.rfind("context/all_reduce/", 0) == 0;
  EXPECT_EQ(gathers, 2 + 2 * 2);  // positions and segment ids once, key and value per layer
  EXPECT_EQ(scatters, 2 * 2);     // per layer: d_key, d_value
  EXPECT_EQ(context_reductions, static_cast<int>(balanced.spec.parameters.size()));
}

// The same 4 rows of 64 tokens on one device or cut over C context ranks (per_device_batch_size 4 / C: the
// global batch is per_device_batch_size x devices): the sequence-sharded buffers per device fall as 1 / C.
// With the ring strategy every activation is one (its blocks are scratch), so a device's activations are
// exactly 1 / C of one device's; all_gather adds only the gathered positions and segment ids ([B, S] int32
// each, whole rows) and holds the whole rows' K / V in scratch while a layer's attention runs, where the
// ring holds two blocks of a rank's own.
TEST(Plan, ContextParallelActivationsFallAsOneOverTheContextDegree) {
  const auto plan_on = [](int64_t context, const std::string& strategy) {
    PlanRequest request;
    request.config = load_config(
        "qwen3-tiny",
        tiny({"max_target_length=64", "per_device_batch_size=" + std::to_string(4 / context),
              "mesh.context=" + std::to_string(context), "context_parallel_strategy=" + strategy}));
    request.devices = context;
    return plan_training(request);
  };
  const auto bytes_of = [](const TrainingPlan& plan, const std::function<bool(const PlanBuffer&)>& which) {
    size_t bytes = 0;
    for (const PlanBuffer& buffer : plan.buffers) bytes += which(buffer) ? buffer.bytes : 0;
    return bytes;
  };
  const auto activation = [](const PlanBuffer& b) { return b.kind == BufferKind::activation; };
  const auto gathered_tokens = [](const PlanBuffer& b) {
    return b.kind == BufferKind::activation && b.name.rfind("context/", 0) == 0;
  };
  const auto kv_gathered = [](const PlanBuffer& b) {
    return b.name.find("scratch/context_gathered_") != std::string::npos;
  };
  const auto ring_blocks = [](const PlanBuffer& b) {
    return b.name.find("scratch/ring_") != std::string::npos;
  };
  const size_t one = bytes_of(plan_on(1, "all_gather"), activation);
  ASSERT_GT(one, 0u);
  for (const int64_t C : {2, 4}) {
    const TrainingPlan ring = plan_on(C, "ring");
    EXPECT_EQ(bytes_of(ring, activation) * static_cast<size_t>(C), one) << "ring, C=" << C;
    EXPECT_GT(bytes_of(ring, ring_blocks), 0u);
    const TrainingPlan gather = plan_on(C, "all_gather");
    EXPECT_GT(bytes_of(gather, gathered_tokens), 0u);
    EXPECT_EQ((bytes_of(gather, activation) - bytes_of(gather, gathered_tokens)) * static_cast<size_t>(C),
              one)
        << "all_gather, C=" << C;
    EXPECT_EQ(bytes_of(gather, ring_blocks), 0u);
  }
  EXPECT_EQ(bytes_of(plan_on(2, "ring"), ring_blocks), 2 * bytes_of(plan_on(4, "ring"), ring_blocks));
  EXPECT_EQ(bytes_of(plan_on(2, "all_gather"), kv_gathered), bytes_of(plan_on(4, "all_gather"), kv_gathered));
}

}  // namespace
}  // namespace meshtrain
