// The backend seam (kernels/backend.h): the cpu table is complete and is the cpu functions, and a model
// reaches every kernel through the table its spec carries (a counting backend sees each entry called).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/guarded_backend.h"
#include "meshtrain/checkpoint/checkpoint.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/core/error.h"
#include "meshtrain/kernels/backend.h"
#include "meshtrain/kernels/cpu/attention.h"
#include "meshtrain/kernels/cpu/backend.h"
#include "meshtrain/kernels/cpu/matmul.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"
#include "meshtrain/model/spec.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/plan/decode.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/train/run.h"
#include "tiny_batch.h"

namespace meshtrain {
namespace {

using kernels::KernelBackend;
using testing::guarded_backend;
namespace fs = std::filesystem;

// The table is a name followed by function pointers, all pointer-sized: its slots can be read as words, so
// an entry added to the struct is checked here without editing this test.
constexpr size_t kSlots = sizeof(KernelBackend) / sizeof(uintptr_t);
static_assert(sizeof(KernelBackend) % sizeof(uintptr_t) == 0);

std::vector<uintptr_t> slots_of(const KernelBackend& backend) {
  std::vector<uintptr_t> slots(kSlots);
  std::memcpy(slots.data(), &backend, sizeof(KernelBackend));
  return slots;
}

TEST(KernelBackend, CpuTableHasEveryEntry) {
  const KernelBackend& cpu = kernels::cpu_backend();
  EXPECT_STREQ(cpu.name, "cpu");
  const std::vector<uintptr_t> slots = slots_of(cpu);
  for (size_t i = 0; i < kSlots; ++i) EXPECT_NE(slots[i], 0u) << "slot " << i << " is null";
}

TEST(KernelBackend, DeviceKindsChooseTheirTables) {
  EXPECT_EQ(&kernels::kernel_backend_for_device("cpu"), &kernels::cpu_backend());
  // NVIDIA kinds: the cuda table (its kernels where built, else the cpu functions for planning), sized as
  // the cpu kernels are whatever the build, so a plan does not depend on the build.
  const KernelBackend& cpu = kernels::cpu_backend();
  for (const std::string kind : {"a100", "h100", "h200", "b200"}) {
    const KernelBackend& nvidia = kernels::kernel_backend_for_device(kind);
    EXPECT_TRUE(kernels::nvidia_device_kind(kind));
    EXPECT_STRNE(nvidia.name, "cpu") << kind;
    EXPECT_EQ(nvidia.activation_dtype, cpu.activation_dtype) << kind;
    // As on the cpu: under bfloat16 the norms, SwiGLU and GELU write the matmuls' inputs in bf16.
    EXPECT_EQ(nvidia.matmul_input_dtype, cpu.matmul_input_dtype) << kind;
    EXPECT_EQ(nvidia.matmul_bf16_scratch_elements, cpu.matmul_bf16_scratch_elements) << kind;
    EXPECT_EQ(nvidia.cross_entropy_scratch_floats, cpu.cross_entropy_scratch_floats) << kind;
    EXPECT_EQ(nvidia.cross_entropy_bf16_scratch_elements, cpu.cross_entropy_bf16_scratch_elements) << kind;
    EXPECT_EQ(nvidia.attention_backward_scratch_floats, cpu.attention_backward_scratch_floats) << kind;
    if (std::string(nvidia.name) == "cuda") {
      EXPECT_FALSE(nvidia.memory_on_host()) << kind;
      // dtype=bfloat16 runs the cuda table's tensor-core attention, not its float32 kernels.
      EXPECT_NE(nvidia.attention_forward_bf16, nvidia.attention_forward) << kind;
      EXPECT_NE(nvidia.attention_backward_bf16, nvidia.attention_backward) << kind;
    }
  }
  // Other accelerator kinds: the cpu kernels, but stored as an accelerator backend stores them.
  for (const std::string kind : {"v5p", "mi300x"}) {
    EXPECT_FALSE(kernels::nvidia_device_kind(kind));
    EXPECT_NE(kernels::kernel_backend_for_device(kind).device_check(), "") << kind << " runs nowhere";
    const KernelBackend& planning = kernels::kernel_backend_for_device(kind);
    EXPECT_EQ(planning.matmul_forward, kernels::cpu_backend().matmul_forward) << kind;
    EXPECT_EQ(planning.attention_backward, kernels::cpu_backend().attention_backward) << kind;
    EXPECT_EQ(planning.activation_dtype(DType::bf16), DType::bf16) << kind;
    EXPECT_EQ(planning.matmul_input_dtype(DType::bf16), DType::bf16) << kind;
    EXPECT_EQ(planning.matmul_bf16_scratch_elements(8, 4, 2, false), 0) << kind;
    EXPECT_EQ(planning.cross_entropy_bf16_scratch_elements(16, 8, 4, 2), 0) << kind;
  }
  EXPECT_EQ(kernels::cpu_backend().activation_dtype(DType::bf16), DType::f32);
  EXPECT_EQ(kernels::cpu_backend().matmul_input_dtype(DType::bf16), DType::bf16);
  EXPECT_EQ(kernels::cpu_backend().matmul_input_dtype(DType::f32), DType::f32);
}

// bf16 attention: AMX where the CPU has it and the OS granted the tile permission, AVX512-BF16 without AMX,
// float32 otherwise (also on an AMX CPU whose OS refused the permission: the AVX512-BF16 kernels are slower
// than float32 there); and the table holds this CPU's choice.
TEST(KernelBackend, CpuBf16AttentionFollowsTheCpuFeatures) {
  using kernels::AttentionProducts;
  CpuFeatures zen4;
  zen4.avx512f = zen4.avx512_bf16 = true;
  CpuFeatures xeon_amx = zen4;
  xeon_amx.amx_bf16 = true;
  CpuFeatures xeon_refused = zen4;
  xeon_refused.amx_refused_by_os = true;
  CpuFeatures avx2;
  avx2.avx2 = true;
  EXPECT_EQ(kernels::bf16_attention_products(xeon_amx), AttentionProducts::amx);
  EXPECT_EQ(kernels::bf16_attention_products(zen4), AttentionProducts::avx512_bf16);
  EXPECT_EQ(kernels::bf16_attention_products(xeon_refused), AttentionProducts::float32);
  EXPECT_EQ(kernels::bf16_attention_products(avx2), AttentionProducts::float32);

  // The three sets are distinct kernels, and the table holds this CPU's.
  const kernels::AttentionKernels amx = kernels::attention_kernels_with(AttentionProducts::amx),
                                  bf16 = kernels::attention_kernels_with(AttentionProducts::avx512_bf16),
                                  float32 = kernels::attention_kernels_with(AttentionProducts::float32);
  EXPECT_NE(amx.forward, bf16.forward);
  EXPECT_NE(amx.context_backward, bf16.context_backward);
  EXPECT_EQ(float32.forward, &kernels::attention_forward);
  EXPECT_EQ(float32.context_backward, &kernels::context_attention_backward);
  const kernels::AttentionKernels picked =
      kernels::attention_kernels_with(kernels::bf16_attention_products(cpu_features()));
  const KernelBackend& cpu = kernels::cpu_backend();
  EXPECT_EQ(cpu.attention_forward_bf16, picked.forward);
  EXPECT_EQ(cpu.attention_backward_bf16, picked.backward);
  EXPECT_EQ(cpu.context_attention_forward_bf16, picked.context_forward);
  EXPECT_EQ(cpu.context_attention_backward_bf16, picked.context_backward);
}

TEST(KernelBackend, CpuEntriesAreTheCpuFunctions) {
  const KernelBackend& cpu = kernels::cpu_backend();
  EXPECT_EQ(cpu.matmul_forward, &kernels::matmul_forward);
  EXPECT_EQ(cpu.rmsnorm_backward, &kernels::rmsnorm_backward);
  // And a call through the table gives bitwise the direct call's result.
  const int64_t N = 5, I = 7, O = 3;
  std::mt19937 generator(4);
  std::normal_distribution<float> normal;
  std::vector<float> x(N * I), w(I * O), bias(O), direct(N * O), through_table(N * O);
  for (std::vector<float>* values : {&x, &w, &bias}) {
    for (float& value : *values) value = normal(generator);
  }
  kernels::matmul_forward(direct.data(), x.data(), w.data(), bias.data(), N, I, O, nullptr);
  cpu.matmul_forward(through_table.data(), x.data(), w.data(), bias.data(), N, I, O, nullptr);
  EXPECT_EQ(std::memcmp(direct.data(), through_table.data(), direct.size() * sizeof(float)), 0);
}

// A backend that forwards every entry to cpu and counts the calls per entry.
std::map<std::string, int>& calls() {
  static std::map<std::string, int> counts;
  return counts;
}

const KernelBackend& counting_backend() {
  static const KernelBackend table = [] {
    KernelBackend counting = kernels::cpu_backend();
    counting.name = "counting";
#define MT_COUNTED(entry)                              \
  counting.entry = [](auto... arguments) {             \
    ++calls()[#entry];                                 \
    return kernels::cpu_backend().entry(arguments...); \
  }
    MT_COUNTED(device_check);
    MT_COUNTED(device_description);
    MT_COUNTED(device_resources);
    MT_COUNTED(memory_on_host);
    MT_COUNTED(memory_allocate);
    MT_COUNTED(memory_free);
    MT_COUNTED(memory_copy_in);
    MT_COUNTED(memory_copy_out);
    MT_COUNTED(memory_fill);
    MT_COUNTED(memory_is_device);
    MT_COUNTED(device_count);
    MT_COUNTED(device_synchronize);
    MT_COUNTED(activation_dtype);
    MT_COUNTED(matmul_input_dtype);
    MT_COUNTED(matmul_forward);
    MT_COUNTED(matmul_forward_bf16_x);
    MT_COUNTED(matmul_backward);
    MT_COUNTED(matmul_backward_bf16_x);
    MT_COUNTED(matmul_bf16_scratch_elements);
    MT_COUNTED(residual_add);
    MT_COUNTED(embedding_forward);
    MT_COUNTED(embedding_backward);
    MT_COUNTED(unembed_cross_entropy);
    MT_COUNTED(cross_entropy_scratch_floats);
    MT_COUNTED(cross_entropy_bf16_scratch_elements);
    MT_COUNTED(unembed_logits);
    MT_COUNTED(rmsnorm_forward);
    MT_COUNTED(rmsnorm_forward_bf16);
    MT_COUNTED(rmsnorm_backward);
    MT_COUNTED(layernorm_forward);
    MT_COUNTED(layernorm_forward_bf16);
    MT_COUNTED(layernorm_backward);
    MT_COUNTED(swiglu_forward);
    MT_COUNTED(swiglu_forward_bf16);
    MT_COUNTED(swiglu_backward);
    MT_COUNTED(gelu_forward);
    MT_COUNTED(gelu_forward_bf16);
    MT_COUNTED(gelu_backward);
    MT_COUNTED(rope_forward);
    MT_COUNTED(rope_backward);
    MT_COUNTED(column_slice_forward);
    MT_COUNTED(column_slice_backward);
    MT_COUNTED(attention_forward);
    MT_COUNTED(attention_backward);
    MT_COUNTED(attention_backward_scratch_floats);
    MT_COUNTED(context_attention_forward);
    MT_COUNTED(context_attention_backward);
    MT_COUNTED(context_attention_backward_scratch_floats);
    MT_COUNTED(attention_decode);
    MT_COUNTED(attention_forward_bf16);
    MT_COUNTED(attention_backward_bf16);
    MT_COUNTED(context_attention_forward_bf16);
    MT_COUNTED(context_attention_backward_bf16);
    MT_COUNTED(moe_router_forward);
    MT_COUNTED(moe_router_backward);
    MT_COUNTED(moe_balance_loss_forward);
    MT_COUNTED(moe_balance_loss_backward);
    MT_COUNTED(moe_route_plan);
    MT_COUNTED(moe_gather_forward);
    MT_COUNTED(moe_dispatch_plan);
    MT_COUNTED(moe_receive_plan);
    MT_COUNTED(moe_gather_backward);
    MT_COUNTED(moe_combine_forward);
    MT_COUNTED(moe_combine_backward);
    MT_COUNTED(grouped_matmul_forward);
    MT_COUNTED(grouped_matmul_backward);
    MT_COUNTED(rmsnorm_streams_forward);
    MT_COUNTED(rmsnorm_streams_backward);
    MT_COUNTED(engram_table_rows);
    MT_COUNTED(engram_gate_forward);
    MT_COUNTED(engram_gate_backward);
    MT_COUNTED(short_conv_forward);
    MT_COUNTED(short_conv_backward);
    MT_COUNTED(short_conv_output_forward);
    MT_COUNTED(short_conv_output_backward);
    MT_COUNTED(mhc_coefficients_forward);
    MT_COUNTED(mhc_coefficients_backward);
    MT_COUNTED(sinkhorn_forward);
    MT_COUNTED(sinkhorn_backward);
    MT_COUNTED(mhc_collapse_forward);
    MT_COUNTED(mhc_collapse_backward);
    MT_COUNTED(mhc_expand_forward);
    MT_COUNTED(mhc_expand_backward);
    MT_COUNTED(mhc_streams_repeat);
    MT_COUNTED(mhc_streams_sum);
    MT_COUNTED(adamw_update);
    MT_COUNTED(sum_of_squares);
    MT_COUNTED(muon_update);
    MT_COUNTED(muon_scratch_floats);
#undef MT_COUNTED
    return counting;
  }();
  return table;
}

Config tiny_config(const std::string& preset) {
  std::vector<std::string> overrides = {
      "base_emb_dim=32",     "base_num_query_heads=4",    "head_dim=8",
      "base_mlp_dim=48",     "base_num_decoder_layers=2", "vocab_size=100",
      "max_target_length=8", "per_device_batch_size=2",   "init_weights_seed=3"};
  overrides.push_back(preset == "qwen3-tiny" ? "base_num_kv_heads=2" : "base_num_kv_heads=4");
  if (preset == "gpt2-124m") overrides.push_back("max_position_embeddings=16");
  if (preset.starts_with("deepseek")) {
    for (const char* mla :
         {"q_lora_rank=12", "kv_lora_rank=10", "qk_nope_head_dim=6", "qk_rope_head_dim=4", "v_head_dim=8",
          "load_balance_loss_weight=0.01"})  // the preset's experts, with the balance loss's kernels too
      overrides.push_back(mla);
  }
  if (preset == "deepseek-custom-tiny") {  // the preset's Engram (both layers here) and mHC, small tables
    for (const char* engram :
         {"engram_layers=[0,1]", "engram_num_heads=2", "engram_head_dim=4", "engram_vocab_bases=[31,37]"})
      overrides.push_back(engram);
  }
  return load_config(preset, overrides);
}

Batch tiny_batch(const ModelDims& m) {
  Batch batch;
  for (int64_t b = 0; b < m.B; ++b) {
    for (int64_t s = 0; s < m.S; ++s) {
      batch.tokens.push_back(static_cast<int32_t>((7 * b + 3 * s) % m.V_valid));
      batch.targets.push_back(static_cast<int32_t>((5 * b + 11 * s + 1) % m.V_valid));
      batch.positions.push_back(static_cast<int32_t>(s));
      batch.segment_ids.push_back(0);
      batch.loss_mask.push_back(1);
    }
  }
  return batch;
}

// The one-process training plan of `config` with `backend` in its spec.
TrainingPlan plan_through(const Config& config, const KernelBackend& backend) {
  PlanRequest request;
  request.config = config;
  request.devices = 1;
  TrainingPlan plan = plan_training(request);
  plan.spec.kernels = &backend;
  return plan;
}

// One training step and one decode step of `preset` with the counting backend in the plans; the losses
// equal those of the plain (cpu) engine.
void run_through_counting_backend(const std::string& preset, DType dtype = DType::f32,
                                  OptimizerType optimizer = OptimizerType::adamw) {
  Config config = tiny_config(preset);
  config.dtype = dtype;
  config.opt_type = optimizer;
  Engine counted(plan_through(config, counting_backend()));
  Engine plain(config);
  Batch batch = tiny_batch(counted.spec().dims);
  std::optional<EngramHashing> hashing;
  if (!config.engram_layers.empty()) {
    hashing = make_engram_hashing(engram_hash_options(config), nullptr);
    hashing->add_to(batch, counted.spec().dims.S);
  }
  const LossSums counted_sums = counted.fwd_bwd(batch, true);
  const LossSums plain_sums = plain.fwd_bwd(batch, true);
  EXPECT_EQ(counted_sums.loss_sum, plain_sums.loss_sum);
  EXPECT_EQ(counted.update(counted_sums.valid_count, 1e-3, 0).grad_norm,
            plain.update(plain_sums.valid_count, 1e-3, 0).grad_norm);
  // Values leave the arena through the backend's copies (a device arena is not host memory).
  const BufferId first = counted.spec().parameters.front().value;
  EXPECT_EQ(counted.read(first), plain.read(first));

  TrainingPlan decode_plan = plan_decode(config, 4);
  decode_plan.spec.kernels = &counting_backend();
  Engine decoder(std::move(decode_plan));
  std::vector<std::vector<int32_t>> hash_ids;
  for (size_t layer = 0; hashing && layer < hashing->layers.size(); ++layer)
    hash_ids.push_back(hashing->last_token_ids(layer, {1}));
  decoder.decode(1, 0, hash_ids);
}

TEST(KernelBackend, ModelReachesEveryKernelThroughTheTable) {
  calls().clear();
  // The spec builder's scratch-size queries come from the backend the spec is built for.
  build_model_spec(tiny_config("qwen3-tiny"), Mesh{}, counting_backend());
  EXPECT_GT(calls()["attention_backward_scratch_floats"], 0);
  EXPECT_GT(calls()["cross_entropy_scratch_floats"], 0);
  EXPECT_GT(calls()["activation_dtype"], 0);
  // The optimizer pass sizes Muon's update scratch through the spec's table.
  Config muon = tiny_config("qwen3-tiny");
  muon.opt_type = OptimizerType::muon;
  ModelSpec muon_spec = build_model_spec(muon, Mesh{}, counting_backend());
  apply_optimizer(muon_spec, muon);
  EXPECT_GT(calls()["muon_scratch_floats"], 0);
  // bf16 compute sizes the matmuls' rounded-input scratch through the table too.
  Config bf16 = tiny_config("qwen3-tiny");
  bf16.dtype = DType::bf16;
  build_model_spec(bf16, Mesh{}, counting_backend());
  EXPECT_GT(calls()["matmul_bf16_scratch_elements"], 0);
  EXPECT_GT(calls()["cross_entropy_bf16_scratch_elements"], 0);
  run_through_counting_backend("qwen3-tiny");            // rmsnorm, rope, swiglu
  run_through_counting_backend("gpt2-124m");             // layernorm, gelu, learned positions
  run_through_counting_backend("deepseek-tiny");         // multi-head latent attention, mixture of experts
  run_through_counting_backend("deepseek-custom-tiny");  // Engram, mHC
  run_through_counting_backend("qwen3-tiny", DType::f32, OptimizerType::muon);  // Muon's update
  // bf16 compute: the producers that store a matmul's bf16 input, and the matmuls that read it. They run
  // only on a CPU with bf16 instructions (elsewhere dtype=bfloat16 is refused; Plan.Bf16ComputeRunsThePlan).
  const std::vector<std::string> bf16_only = {
      "rmsnorm_forward_bf16",  "layernorm_forward_bf16", "swiglu_forward_bf16",    "gelu_forward_bf16",
      "matmul_forward_bf16_x", "matmul_backward_bf16_x", "attention_forward_bf16", "attention_backward_bf16"};
  if (cpu_features().avx512_bf16 || cpu_features().amx_bf16) {
    run_through_counting_backend("qwen3-tiny", DType::bf16);  // rmsnorm, swiglu
    run_through_counting_backend("gpt2-124m", DType::bf16);   // layernorm, gelu
  } else {
    for (const std::string& entry : bf16_only) {
      EXPECT_EQ(calls().count(entry), 0u) << entry;
      calls()[entry] = 1;
    }
  }
  // Context parallelism: the spec of a mesh.context=2 plan sizes its scratch through the table; its two
  // attention kernels run only in a multi-process run (tests/mpi/equivalence.sh, the context cases), so
  // this one-process test counts them as reached without calling them.
  build_model_spec(tiny_config("qwen3-tiny"), Mesh({{MeshAxis::context, 2}}), counting_backend());
  EXPECT_GT(calls()["context_attention_backward_scratch_floats"], 0);
  // Expert parallelism's block layouts likewise run only under mesh.expert > 1 (tests/mpi/
  // deepseek_equivalence.sh, the expert cases).
  // The GPU queries: how many GPUs a host's processes share (check_plan_runs_here on an NVIDIA topology) and
  // which buffers the host-staged communicator copies (tests/mpi/test_staged_communicator.cpp).
  for (const char* multi_process_only :
       {"context_attention_forward", "context_attention_backward", "context_attention_forward_bf16",
        "context_attention_backward_bf16", "moe_dispatch_plan", "moe_receive_plan", "memory_is_device",
        "device_count"}) {
    EXPECT_EQ(calls().count(multi_process_only), 0u) << multi_process_only;
    calls()[multi_process_only] = 1;
  }
  EXPECT_EQ(calls().size(), kSlots - 1) << "every entry but the name is counted";
  for (const auto& [entry, count] : calls()) EXPECT_GT(count, 0) << entry << " was never called";
}

// Where this build has the cuda kernels (MESHTRAIN_CUDA=ON: the NVIDIA table is the loaded cuda table,
// with or without a GPU), every entry a dense decoder runs is a cuda kernel; a build without them skips.
TEST(KernelBackend, CudaTableCoversTheDenseDecoders) {
  const KernelBackend& nvidia = kernels::kernel_backend_for_device("h200");
  if (std::string(nvidia.name) != "cuda") {
    GTEST_SKIP() << "SKIP: this build has no cuda table: " << nvidia.device_check();
  }
  const KernelBackend& cpu = kernels::cpu_backend();
#define MT_COVERED(entry)                                       \
  EXPECT_TRUE(nvidia.entry != nullptr) << #entry << " is null"; \
  EXPECT_TRUE(nvidia.entry != cpu.entry) << #entry << " is the cpu function";
  MT_DENSE_DECODER_ENTRIES(MT_COVERED)
  MT_ENGRAM_MHC_ENTRIES(MT_COVERED)
  MT_MOE_ENTRIES(MT_COVERED)
#undef MT_COVERED
}

// What the cuda backend runs (the dense decoders, a dense decoder with Engram and mHC, and DeepSeek's block
// with MLA, MoE, Engram and mHC), over an arena the host cannot touch: training steps, eval and a checkpoint
// round trip reach the arena only through the table, and give bitwise the losses, gradients and parameters of
// the host-memory engine; in float32, and in bfloat16 where this CPU computes it.
TEST(KernelBackend, DenseTrainingTouchesADeviceArenaOnlyThroughTheTable) {
  std::vector<DType> dtypes = {DType::f32};
  if (cpu_features().avx512_bf16 || cpu_features().amx_bf16) dtypes.push_back(DType::bf16);
  for (const DType dtype : dtypes) {
    for (const std::string preset :
         {"qwen3-tiny", "gpt2-124m", "qwen3-tiny engram mhc", "deepseek-custom-tiny"}) {
      SCOPED_TRACE(preset + (dtype == DType::bf16 ? " bfloat16" : " float32"));
      Config config = tiny_config(preset.substr(0, preset.find(' ')));
      if (preset.ends_with("engram mhc")) {
        config = load_config(
            "qwen3-tiny",
            {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2", "head_dim=8",
             "base_mlp_dim=48", "base_num_decoder_layers=2", "vocab_size=100", "max_target_length=8",
             "per_device_batch_size=2", "init_weights_seed=3", "decoder_block=deepseek",
             "engram_layers=[0,1]", "engram_num_heads=2", "engram_head_dim=4", "engram_vocab_bases=[31,37]",
             "engram_kernel_size=3", "mhc_expansion_rate=2"});
      }
      config.dtype = dtype;
      Engine plain(config);
      const fs::path dir = fs::temp_directory_path() / ("meshtrain_guarded_" + std::to_string(::getpid()));
      {
        Engine guarded(plan_through(config, guarded_backend()));
        const Batch batch = testing::tiny_batch_for(config, guarded.spec().dims, 7);
        for (int64_t step = 0; step < 2; ++step) {
          const LossSums a = guarded.fwd_bwd(batch), b = plain.fwd_bwd(batch);
          EXPECT_EQ(a.loss_sum, b.loss_sum) << preset;
          const LossSums a2 = guarded.fwd_bwd_accum(batch, true), b2 = plain.fwd_bwd_accum(batch, true);
          EXPECT_EQ(a2.loss_sum, b2.loss_sum) << preset;
          EXPECT_EQ(guarded.update(a.valid_count + a2.valid_count, 1e-2, step).grad_norm,
                    plain.update(b.valid_count + b2.valid_count, 1e-2, step).grad_norm)
              << preset;
        }
        EXPECT_EQ(guarded.eval(batch).loss_sum, plain.eval(batch).loss_sum) << preset;
        save_checkpoint(dir.string(), guarded, {2, {}, {}, {}}, {});
        EXPECT_EQ(guarded.host_copy_bytes(), 0u) << preset << ": the save's host copy outlived it";
      }
      // Loaded into a fresh guarded engine, the state trains on as the host engine does.
      Engine loaded(plan_through(config, guarded_backend()));
      EXPECT_EQ(load_checkpoint(dir.string() + "/step_00000002", loaded, false).step, 2);
      EXPECT_EQ(loaded.host_copy_bytes(), 0u) << preset << ": the load's host copy outlived it";
      const Batch batch = testing::tiny_batch_for(config, loaded.spec().dims, 7);
      EXPECT_EQ(loaded.fwd_bwd(batch).loss_sum, plain.fwd_bwd(batch).loss_sum) << preset;
      for (const ParameterDecl& parameter : loaded.spec().parameters) {
        EXPECT_EQ(loaded.read(parameter.gradient), plain.read(parameter.gradient)) << preset;
      }
      fs::remove_all(dir);
    }
  }
}

}  // namespace
}  // namespace meshtrain
