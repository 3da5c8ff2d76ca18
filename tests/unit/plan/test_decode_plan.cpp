// The decode plan: the decode spec of the same layers (no gradients, moments, loss or update), one decode
// kernel whose arena is the parameter values, the key / value caches and a little scratch, and the default
// training kernels unchanged by its existence.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/plan/decode.h"
#include "meshtrain/plan/plan.h"

namespace meshtrain {
namespace {

Config tiny_config(const std::string& preset) {
  return load_config(preset, {"base_emb_dim=32", "base_num_query_heads=4", "base_num_kv_heads=2",
                              "head_dim=8", "base_mlp_dim=48", "base_num_decoder_layers=2", "vocab_size=100",
                              "max_target_length=16", "per_device_batch_size=2", "max_position_embeddings=16",
                              "dataset_type=synthetic", "tokenizer_path="});
}

size_t bytes_of(const TrainingPlan& plan, BufferKind kind, bool persistent) {
  size_t bytes = 0;
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.kind == kind && buffer.persistent == persistent) bytes += buffer.bytes;
  }
  return bytes;
}

TEST(DecodePlan, DeclaresNoTrainingStateAndOnlyTheDecodeKernel) {
  for (const char* preset : {"qwen3-tiny", "gpt2-124m"}) {
    const TrainingPlan plan = plan_decode(tiny_config(preset), 10);
    const ModelSpec& spec = plan.spec;
    EXPECT_TRUE(spec.decoding()) << preset;
    EXPECT_EQ(spec.dims.N, 1);
    EXPECT_EQ(spec.dims.T, 10);
    for (const BufferDecl& buffer : spec.buffers) {
      EXPECT_NE(buffer.kind, BufferKind::gradient) << buffer.name;
      EXPECT_NE(buffer.kind, BufferKind::optimizer_state) << buffer.name;
      EXPECT_NE(buffer.kind, BufferKind::step_counter) << buffer.name;
    }
    for (const ParameterDecl& parameter : spec.parameters) EXPECT_EQ(parameter.gradient, kNoBuffer);
    EXPECT_TRUE(spec.loss_forward.empty() && spec.loss_backward.empty());
    EXPECT_TRUE(plan.optimizer.parameters.empty() && plan.optimizer.update.empty());  // no optimizer
    EXPECT_EQ(spec.targets, kNoBuffer);
    EXPECT_NE(spec.logits, kNoBuffer);
    ASSERT_EQ(plan.kernels.size(), 1u);
    EXPECT_EQ(plan.kernels[0].kernel, KernelName::decode);
    // The same parameters (names and shapes) as the training spec: one model.
    const ModelSpec training = build_model_spec(tiny_config(preset));
    ASSERT_EQ(spec.parameters.size(), training.parameters.size());
    for (size_t p = 0; p < spec.parameters.size(); ++p) {
      EXPECT_EQ(spec.buffer(spec.parameters[p].value).name,
                training.buffer(training.parameters[p].value).name);
      EXPECT_EQ(spec.buffer(spec.parameters[p].value).shape,
                training.buffer(training.parameters[p].value).shape);
    }
  }
}

TEST(DecodePlan, DeclaresOnlyBuffersItsOpsTouch) {
  // No backward temporary (activation gradients, the attention backward's scratch) is left declared.
  for (const char* preset : {"qwen3-tiny", "gpt2-124m"}) {
    const ModelSpec spec = plan_decode(tiny_config(preset), 6).spec;
    std::vector<bool> touched(spec.buffers.size(), false);
    for (const OpDecl& op : spec.forward) {
      for (const std::vector<BufferId>* ids : {&op.reads, &op.writes}) {
        for (BufferId id : *ids) touched.at(static_cast<size_t>(id)) = true;
      }
    }
    for (size_t id = 0; id < spec.buffers.size(); ++id) {
      EXPECT_TRUE(touched[id]) << preset << ": " << spec.buffers[id].name << " is declared and never used";
    }
  }
}

TEST(DecodePlan, ArenaIsParametersCachesAndSmallScratch) {
  const Config config = tiny_config("qwen3-tiny");
  const int64_t T = 10, L = 2, K = 2, d = 8;
  const TrainingPlan plan = plan_decode(config, T);
  const size_t parameters = bytes_of(plan, BufferKind::parameter, true);
  const size_t caches = bytes_of(plan, BufferKind::cache, true);
  EXPECT_EQ(caches, static_cast<size_t>(2 * L * T * K * d) * sizeof(float));  // key and value per layer
  EXPECT_EQ(parameters, static_cast<size_t>(plan.spec.parameter_count()) * sizeof(float));
  // Persistent: parameters, caches and the two step inputs (token, position), each aligned.
  EXPECT_GE(plan.persistent_bytes, parameters + caches);
  EXPECT_LE(plan.persistent_bytes, parameters + caches + 64 * 1024);
  // Temporaries of one token: far below one layer's parameters.
  EXPECT_LT(plan.arena_bytes - plan.persistent_bytes, parameters / 4);
  for (const PlanBuffer& buffer : plan.buffers) {
    if (buffer.persistent) {
      EXPECT_TRUE(buffer.kind == BufferKind::parameter || buffer.kind == BufferKind::cache ||
                  buffer.kind == BufferKind::input)
          << buffer.name;
    }
  }
  // The training plan of the same config holds gradients and both moments besides.
  PlanRequest request;
  request.config = config;
  request.devices = 1;
  const TrainingPlan training = plan_training(request);
  EXPECT_GT(training.persistent_bytes, 3 * parameters);
  ASSERT_EQ(training.kernels.size(), kKernelNames.size());
  for (size_t k = 0; k < kKernelNames.size(); ++k) EXPECT_EQ(training.kernels[k].kernel, kKernelNames[k]);
}

TEST(DecodePlan, AttentionDecodeOpReadsAndUpdatesItsCaches) {
  const TrainingPlan plan = plan_decode(tiny_config("qwen3-tiny"), 4);
  int decode_ops = 0;
  for (const PlanOp& op : plan.kernel(KernelName::decode).ops) {
    if (op.op->name.find("attention_decode") == std::string::npos) continue;
    ++decode_ops;
    int caches_written = 0;
    for (BufferId id : op.op->writes) caches_written += plan.spec.buffer(id).kind == BufferKind::cache;
    EXPECT_EQ(caches_written, 2) << op.op->name;
  }
  EXPECT_EQ(decode_ops, 2);  // one per layer
  EXPECT_EQ(plan.kernel(KernelName::decode).ops.back().op->name, "decoder/logits_forward");
}

}  // namespace
}  // namespace meshtrain
