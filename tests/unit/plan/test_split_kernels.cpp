// The split kernels (plan.h's ActivationStash): a micro-batch's forward and backward as two planned kernels
// over activation slots, and zero_bubble's backward as its two parts (backward_input, backward_weight). A
// step run in a pipeline schedule's order (GPipe: every forward, then every backward; 1F1B: each backward as
// soon as it can run, slots reused; ZB-H1: each W deferred as a stage of it defers it, or every W last) gives
// bitwise the fused program's loss sums, gradients and parameters, with the temporaries poisoned before every
// kernel; the slots are in the arena; and the kernels a plan had without slots do not change.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/arena.h"
#include "meshtrain/plan/pipeline_program.h"
#include "meshtrain/plan/pipeline_schedule.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/program.h"
#include "meshtrain/runtime/engine.h"
#include "split_programs.h"
#include "tiny_batch.h"
#include "tiny_plan.h"

namespace meshtrain {
namespace {

constexpr int64_t kMicroBatches = 4;

// A step of kMicroBatches micro-batches; `extra` adds keys or replaces these.
std::vector<std::string> step_keys(const std::vector<std::string>& extra = {}) {
  return testing::with_overrides(
      {"gradient_accumulation_steps=" + std::to_string(kMicroBatches), "init_weights_seed=3"}, extra);
}

// `devices` 0: as many as the mesh asks for (plans only). `split_backward`: backward_input and
// backward_weight too.
TrainingPlan plan_with_slots(const Config& config, int64_t slots, int64_t devices = 1,
                             bool split_backward = false) {
  PlanRequest request;
  request.config = config;
  request.devices = devices;
  request.activation_slots = slots;
  request.split_backward = split_backward;
  return plan_training(request);
}

ProgramEntry forward_entry(int64_t micro_batch, int64_t slot) {
  return testing::split_entry(KernelName::forward, micro_batch, slot);
}

ProgramEntry backward_entry(int64_t micro_batch, int64_t slot) {
  return testing::split_entry(KernelName::backward, micro_batch, slot);
}

std::vector<char> bytes_of(const Engine& engine, BufferId id) {
  const TensorView view = engine.view(id);
  const char* data = static_cast<const char*>(view.data);
  return {data, data + view.bytes()};
}

struct StepResult {
  LossSums sums;
  std::vector<std::vector<char>> gradients, parameters;
  UpdateResult update;
};

// One step of `gradients` then the plan's update: the loss sums, the gradients before the update and the
// parameters after it.
StepResult run_step(Engine& engine, const std::vector<ProgramEntry>& gradients, int64_t step) {
  const Config& config = engine.spec().config;
  const auto batches = [&](int64_t micro) {
    return testing::tiny_batch_for(config, engine.spec().dims, static_cast<uint64_t>(10 * step + micro));
  };
  StepResult result;
  result.sums = engine.run_program(gradients, {batches}).sums;
  for (const ParameterDecl& parameter : engine.spec().parameters) {
    if (parameter.gradient != kNoBuffer) result.gradients.push_back(bytes_of(engine, parameter.gradient));
  }
  const ProgramInputs update{
      .micro_batch = nullptr, .valid_count = result.sums.valid_count, .learning_rate = 1e-2, .step = step};
  result.update = engine.run_program(engine.plan().program.update, update).update;
  for (const ParameterDecl& parameter : engine.spec().parameters)
    result.parameters.push_back(bytes_of(engine, parameter.value));
  return result;
}

void expect_same_step(const StepResult& split, const StepResult& fused, const std::string& what) {
  EXPECT_EQ(split.sums.loss_sum, fused.sums.loss_sum) << what;
  EXPECT_EQ(split.sums.valid_count, fused.sums.valid_count) << what;
  EXPECT_EQ(split.sums.routing.expert_load, fused.sums.routing.expert_load) << what;
  EXPECT_EQ(split.sums.routing.dropped, fused.sums.routing.dropped) << what;
  EXPECT_EQ(split.sums.routing.balance_loss, fused.sums.routing.balance_loss) << what;
  EXPECT_TRUE(split.gradients == fused.gradients) << what << ": gradients differ";
  EXPECT_EQ(split.update.raw_grad_norm, fused.update.raw_grad_norm) << what;
  EXPECT_TRUE(split.parameters == fused.parameters) << what << ": parameters differ";
}

// Two steps (the second's gradients start from zero again only if zero_gradients zeroes them) of the fused
// program against GPipe's and 1F1B's orders of the split kernels, and ZB-H1's as the last stage of two runs
// it (slots reused once their W has run) and as the last of four (W deferred by three backwards), and every W
// last.
void expect_split_equals_fused(const Config& config, const std::string& what) {
  ASSERT_EQ(config.gradient_accumulation_steps, kMicroBatches);
  Engine fused(plan_with_slots(config, 0));
  fused.set_poison_temporaries(true);
  std::vector<StepResult> expected;
  for (int64_t step = 0; step < 2; ++step)
    expected.push_back(run_step(fused, fused.plan().program.gradients, step));
  ASSERT_GT(expected[0].sums.valid_count, 0) << what;
  ASSERT_GT(expected[1].update.raw_grad_norm, 0.0) << what;  // the comparisons can fail
  const testing::SplitGradients of_two = testing::zero_bubble_gradients(kMicroBatches, 2, 1);
  const testing::SplitGradients of_four = testing::zero_bubble_gradients(kMicroBatches, 4, 3);
  for (const auto& [schedule, slots, gradients, split_backward] :
       {std::tuple{"gpipe", kMicroBatches, testing::gpipe_gradients(kMicroBatches), false},
        std::tuple{"1f1b", int64_t{2}, testing::one_f_one_b_gradients(kMicroBatches, 2), false},
        std::tuple{"zero_bubble stage 1 of 2", of_two.slots, of_two.entries, true},
        std::tuple{"zero_bubble stage 3 of 4", of_four.slots, of_four.entries, true},
        std::tuple{"weights last", kMicroBatches, testing::weights_last_gradients(kMicroBatches), true}}) {
    Engine split(plan_with_slots(config, slots, 1, split_backward));
    split.set_poison_temporaries(true);
    for (int64_t step = 0; step < 2; ++step) {
      expect_same_step(run_step(split, gradients, step), expected[static_cast<size_t>(step)],
                       what + " " + schedule + " step " + std::to_string(step));
    }
  }
}

TEST(SplitKernels, PipelineOrdersGiveTheFusedStepBitwise) {
  for (const char* remat : {"none", "minimal", "full"}) {
    for (const char* scan : {"false", "true"}) {
      expect_split_equals_fused(testing::tiny_config(step_keys({std::string("remat_policy=") + remat,
                                                                std::string("scan_layers=") + scan})),
                                std::string("qwen3 remat ") + remat + " scan " + scan);
    }
  }
}

// Learned positions, tied embeddings, LayerNorm and GELU.
TEST(SplitKernels, Gpt2GivesTheFusedStepBitwise) {
  for (const char* remat : {"none", "full"}) {
    const std::vector<std::string> gpt2 = {"base_emb_dim=32",
                                           "base_num_query_heads=4",
                                           "base_num_kv_heads=4",
                                           "head_dim=8",
                                           "base_mlp_dim=48",
                                           "base_num_decoder_layers=2",
                                           "vocab_size=100",
                                           "max_target_length=16",
                                           "max_position_embeddings=16",
                                           "per_device_batch_size=2",
                                           "dataset_type=synthetic",
                                           "tokenizer_path="};
    expect_split_equals_fused(
        load_config("gpt2-124m",
                    testing::with_overrides(gpt2, step_keys({std::string("remat_policy=") + remat}))),
        std::string("gpt2 remat ") + remat);
  }
}

// MLA, MoE (its routing sums, and the balance loss its forward adds), Engram and mHC.
TEST(SplitKernels, DeepseekStyleGivesTheFusedStepBitwise) {
  for (const auto& [remat, scan] :
       {std::pair{"none", "false"}, std::pair{"full", "false"}, std::pair{"minimal", "true"}}) {
    expect_split_equals_fused(testing::tiny_deepseek_config(step_keys({"load_balance_loss_weight=0.01",
                                                                       std::string("remat_policy=") + remat,
                                                                       std::string("scan_layers=") + scan})),
                              std::string("deepseek remat ") + remat + " scan " + scan);
  }
}

// The poisoning is what makes the comparison catch a value the backward needs but the plan left among the
// temporaries: the same run with one stashed activation's backward bindings moved into the temporaries'
// region gives other gradients.
TEST(SplitKernels, AnActivationLeftAmongTheTemporariesIsCaught) {
  const Config config = testing::tiny_config(step_keys());
  Engine fused(plan_with_slots(config, 0));
  const StepResult expected = run_step(fused, fused.plan().program.gradients, 0);
  TrainingPlan plan = plan_with_slots(config, kMicroBatches);
  const ActivationStash& stash = plan.stash;
  KernelPlan& backward = plan.kernels.back();
  ASSERT_EQ(backward.kernel, KernelName::backward);
  PlanBufferId moved = -1;
  for (PlanOp& op : backward.ops) {
    for (size_t b = 0; b < op.buffers.size(); ++b) {
      const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(op.buffers[b].second)];
      if (moved < 0 && stash.in_slot_zero(op.offsets[b]) && buffer.kind == BufferKind::activation)
        moved = op.buffers[b].second;
      if (op.buffers[b].second == moved) op.offsets[b] = plan.arena_bytes - buffer.bytes;
    }
  }
  ASSERT_GE(moved, 0);
  Engine split(std::move(plan));
  split.set_poison_temporaries(true);
  const StepResult result = run_step(split, testing::gpipe_gradients(kMicroBatches), 0);
  EXPECT_FALSE(result.gradients == expected.gradients)
      << split.plan().buffers[static_cast<size_t>(moved)].name;
}

std::vector<std::string> op_names(const TrainingPlan& plan, std::initializer_list<KernelName> kernels) {
  std::vector<std::string> names;
  for (KernelName kernel : kernels) {
    for (const PlanOp& op : plan.kernel(kernel).ops)
      names.push_back(op.op->name + (op.recompute ? " (recompute)" : ""));
  }
  return names;
}

// zero_gradients, forward and backward run fwd_bwd's ops in its order; forward and backward, fwd_bwd_accum's
// (FSDP's gathers for the backward are the backward's).
TEST(SplitKernels, TheirOpsAreTheFusedKernelsCutAtTheBackward) {
  for (const std::vector<std::string>& keys : {std::vector<std::string>{"remat_policy=none"},
                                               {"remat_policy=full"},
                                               {"remat_policy=minimal", "mesh.fsdp=2"}}) {
    const TrainingPlan plan = plan_with_slots(testing::tiny_config(step_keys(keys)), 2, 0);
    const std::vector<std::string> forward = op_names(plan, {KernelName::forward});
    ASSERT_FALSE(forward.empty());
    ASSERT_FALSE(op_names(plan, {KernelName::backward}).empty());
    EXPECT_EQ(op_names(plan, {KernelName::zero_gradients, KernelName::forward, KernelName::backward}),
              op_names(plan, {KernelName::fwd_bwd}))
        << keys.front();
    EXPECT_EQ(op_names(plan, {KernelName::forward, KernelName::backward}),
              op_names(plan, {KernelName::fwd_bwd_accum}))
        << keys.front();
    EXPECT_EQ(forward.size(), plan.spec.forward.size() + (keys.size() > 1 ? plan.spec.parameters.size() : 0))
        << keys.front();
  }
}

// The stash holds what crosses the cut (less under a remat policy that keeps less), once per slot, between
// the persistent region and the split kernels' temporaries; the arena holds it.
TEST(SplitKernels, TheSlotsAreInTheArena) {
  size_t previous_slot_bytes = SIZE_MAX;
  for (const char* remat : {"none", "minimal", "full"}) {
    const Config config = testing::tiny_config(step_keys({std::string("remat_policy=") + remat}));
    const TrainingPlan fused = plan_with_slots(config, 0);
    for (int64_t slots : {1, 2, 4}) {
      const TrainingPlan plan = plan_with_slots(config, slots);
      const ActivationStash& stash = plan.stash;
      EXPECT_EQ(stash.slots, slots);
      EXPECT_EQ(stash.offset, plan.persistent_bytes);
      std::vector<std::string> names;
      size_t entry_bytes = 0;
      for (const ActivationStash::Entry& entry : stash.entries) {
        const PlanBuffer& buffer = plan.buffers[static_cast<size_t>(entry.buffer)];
        names.push_back(buffer.name);
        entry_bytes += align_up(buffer.bytes);
        EXPECT_LE(entry.offset + buffer.bytes, stash.slot_bytes) << buffer.name;
      }
      EXPECT_EQ(stash.slot_bytes, entry_bytes) << remat;  // all live at the cut: packed, none overlapping
      // The loss reads the targets and their mask in the backward, from the micro-batch's slot.
      EXPECT_NE(std::find(names.begin(), names.end(), "batch/targets"), names.end());
      EXPECT_NE(std::find(names.begin(), names.end(), "batch/loss_mask"), names.end());
      size_t largest_temps = 0;
      for (const KernelPlan& kernel : plan.kernels)
        largest_temps = std::max(largest_temps, kernel.memory.temps);
      for (KernelName name : {KernelName::forward, KernelName::backward}) {
        const KernelPlan& kernel = plan.kernel(name);
        // Under remat none the forward's every value is the backward's: its temporaries are the slots.
        EXPECT_GE(kernel.memory.temps, static_cast<size_t>(slots) * stash.slot_bytes);
        for (const PlanValue& value : kernel.values)
          EXPECT_GE(value.offset, stash.end()) << kernel_name(name);
      }
      EXPECT_GT(plan.kernel(KernelName::backward).memory.temps,
                static_cast<size_t>(slots) * stash.slot_bytes);
      EXPECT_EQ(plan.arena_bytes, plan.persistent_bytes + largest_temps);
      EXPECT_GE(plan.arena_bytes, stash.end());
      // One micro-batch in flight at a time needs no more than the fused step; four need more.
      if (slots == 4) {
        EXPECT_GT(plan.arena_bytes, fused.arena_bytes) << remat;
      }
    }
    const size_t slot_bytes = plan_with_slots(config, 1).stash.slot_bytes;
    EXPECT_LT(slot_bytes, previous_slot_bytes) << remat << " keeps no less";
    previous_slot_bytes = slot_bytes;
  }
}

// Without slots there are no split kernels; with them, the other kernels' plans are the same but for the
// arena that holds the slots.
TEST(SplitKernels, WithoutSlotsThePlanIsTodays) {
  const Config config = testing::tiny_config(step_keys());
  const TrainingPlan today = plan_with_slots(config, 0);
  EXPECT_EQ(today.kernels.size(), kKernelNames.size());
  EXPECT_EQ(today.stash.slots, 0);
  EXPECT_TRUE(today.stash.entries.empty());
  EXPECT_EQ(today.find(KernelName::forward), nullptr);
  const TrainingPlan with_slots = plan_with_slots(config, 4);
  EXPECT_GT(with_slots.arena_bytes, today.arena_bytes);
  for (KernelName kernel : kKernelNames) {
    nlohmann::json expected = nlohmann::json::parse(serialize_kernel_plan(today, kernel));
    nlohmann::json found = nlohmann::json::parse(serialize_kernel_plan(with_slots, kernel));
    found["memory"]["process_arena"] = expected["memory"]["process_arena"];
    EXPECT_EQ(found, expected) << kernel_name(kernel);
  }
  // The split kernels' plan files say where their slots are.
  const std::string forward = serialize_kernel_plan(with_slots, KernelName::forward);
  EXPECT_NE(forward.find("\"activation_slots\""), std::string::npos);
  EXPECT_NE(forward.find("\"slot_offset\""), std::string::npos);
}

// The internal error a program run stops with ("" when none).
std::string refusal_of(Engine& engine, const std::vector<ProgramEntry>& entries) {
  const auto batches = [&](int64_t micro) {
    return testing::tiny_batch(engine.spec().dims, static_cast<uint64_t>(micro));
  };
  try {
    engine.run_program(entries, {batches});
  } catch (const std::logic_error& error) {
    return error.what();
  }
  return "";
}

// A program whose backward reads a slot its forward did not fill, or whose forward fills a slot in flight, is
// a planner's bug, stopped before it runs on another micro-batch's activations; so is a fused kernel (whose
// temporaries overlap the slots) while a micro-batch is in flight.
TEST(SplitKernels, ASlotIsFilledOnceAndReadOnce) {
  const Config config = testing::tiny_config(step_keys());
  const ProgramEntry zero{KernelName::zero_gradients}, eval{KernelName::eval, 0};
  Engine engine(plan_with_slots(config, 2));
  EXPECT_NE(refusal_of(engine, {zero, backward_entry(0, 0)}).find("which holds no forward"),
            std::string::npos);
  EXPECT_NE(refusal_of(engine, {backward_entry(0, 1)}).find("which holds no forward"), std::string::npos);
  EXPECT_NE(
      refusal_of(engine, {zero, forward_entry(0, 0), backward_entry(1, 0)})
          .find("the backward of micro-batch 1 (chunk 0) from activation slot 0, which holds micro-batch 0"),
      std::string::npos);
  EXPECT_NE(refusal_of(engine, {forward_entry(1, 0)}).find("whose micro-batch 0's backward has not run"),
            std::string::npos);
  EXPECT_NE(refusal_of(engine, {eval}).find("eval while a micro-batch's activations wait"),
            std::string::npos);
  EXPECT_NE(refusal_of(engine, {forward_entry(0, 2)}).find("activation slot 2 of a plan with 2"),
            std::string::npos);
  Engine valid(plan_with_slots(config, 2));
  EXPECT_EQ(refusal_of(valid, {zero, forward_entry(0, 0), backward_entry(0, 0), eval}), "");
  // A bad batch is the user's error, named before its forward fills the slot, which stays free.
  Batch bad = testing::tiny_batch(valid.spec().dims, 0);
  bad.tokens[0] = -1;
  EXPECT_NE(testing::error_of([&] { valid.forward(bad, 1); }).find("batch token 0"), std::string::npos);
  EXPECT_EQ(refusal_of(valid, {forward_entry(1, 1), backward_entry(1, 1), eval}), "");
}

// backward_input then backward_weight run exactly backward's ops (and the copies W reads), each part in
// backward's order: every dense projection's weight-gradient op in W (with FSDP, the reduce-scatter of its
// gathered gradient after it), nothing else.
TEST(SplitKernels, TheBackwardPartsPartitionTheBackward) {
  for (const std::vector<std::string>& keys : {std::vector<std::string>{"remat_policy=none"},
                                               {"remat_policy=full"},
                                               {"remat_policy=minimal", "mesh.fsdp=2"}}) {
    const TrainingPlan plan = plan_with_slots(testing::tiny_config(step_keys(keys)), 2, 0, true);
    const std::vector<std::string> backward = op_names(plan, {KernelName::backward});
    std::vector<std::string> input, copies;
    for (const std::string& name : op_names(plan, {KernelName::backward_input}))
      (name.starts_with("zero_bubble/copy/") ? copies : input).push_back(name);
    std::vector<std::string> weight = op_names(plan, {KernelName::backward_weight});
    ASSERT_FALSE(weight.empty()) << keys.front();
    EXPECT_FALSE(copies.empty()) << keys.front();  // the residual stream's gradient, for out and wo
    // Each part is a subsequence of the backward, and together they are all of it.
    for (const std::vector<std::string>* part : {&input, &weight}) {
      auto next = backward.begin();
      for (const std::string& name : *part) {
        next = std::find(next, backward.end(), name);
        ASSERT_NE(next, backward.end()) << keys.front() << ": " << name << " out of the backward's order";
        ++next;
      }
    }
    EXPECT_EQ(input.size() + weight.size(), backward.size()) << keys.front();
    size_t projections = 0;
    for (const PlanOp& op : plan.kernel(KernelName::backward).ops)
      projections += op.op->weight_gradients_only;
    size_t moved = 0;
    for (const PlanOp& op : plan.kernel(KernelName::backward_weight).ops) {
      moved += op.op->weight_gradients_only;
      EXPECT_TRUE(op.op->weight_gradients_only || op.op->role == OpRole::fsdp_reduce_scatter) << op.op->name;
    }
    EXPECT_EQ(moved, projections) << keys.front();
    // The slot holds the forward's stash and, after it, what W still reads.
    const TrainingPlan whole = plan_with_slots(testing::tiny_config(step_keys(keys)), 2, 0);
    EXPECT_GT(plan.stash.weight_bytes, 0u);
    EXPECT_EQ(plan.stash.slot_bytes, whole.stash.slot_bytes + plan.stash.weight_bytes) << keys.front();
  }
}

// A slot holds its micro-batch from its forward until its W: B_input then W, each once, and nothing that
// overwrites the slot (a forward, a fused kernel) before W.
TEST(SplitKernels, ASlotIsHeldUntilItsWeightGradients) {
  const Config config = testing::tiny_config(step_keys());
  const ProgramEntry zero{KernelName::zero_gradients}, eval{KernelName::eval, 0};
  const auto input = [](int64_t micro, int64_t slot) {
    return testing::split_entry(KernelName::backward_input, micro, slot);
  };
  const auto weight = [](int64_t micro, int64_t slot) {
    return testing::split_entry(KernelName::backward_weight, micro, slot);
  };
  {
    Engine engine(plan_with_slots(config, 2, 1, true));
    EXPECT_NE(refusal_of(engine, {zero, forward_entry(0, 0), weight(0, 0)})
                  .find("which holds micro-batch 0 (chunk 0) after its forward"),
              std::string::npos);
  }
  {
    Engine engine(plan_with_slots(config, 2, 1, true));
    EXPECT_NE(refusal_of(engine, {zero, forward_entry(0, 0), input(0, 0), input(0, 0)})
                  .find("which holds micro-batch 0 (chunk 0) after its B_input"),
              std::string::npos);
  }
  {
    Engine engine(plan_with_slots(config, 2, 1, true));
    EXPECT_NE(refusal_of(engine, {zero, forward_entry(0, 0), input(0, 0), forward_entry(1, 0)})
                  .find("whose micro-batch 0's backward has not run"),
              std::string::npos);
  }
  {
    Engine engine(plan_with_slots(config, 2, 1, true));
    EXPECT_NE(refusal_of(engine, {zero, forward_entry(0, 0), input(0, 0), eval})
                  .find("eval while a micro-batch's activations wait"),
              std::string::npos);
  }
  Engine valid(plan_with_slots(config, 2, 1, true));
  EXPECT_EQ(refusal_of(valid, {zero, forward_entry(0, 0), input(0, 0), forward_entry(1, 1), weight(0, 0),
                               input(1, 1), weight(1, 1), eval}),
            "");
}

// A zero_bubble stage's program: its ops' B_input and W as the split kernels, each micro-batch's slot held
// until its W, so a stage holds as many slots as the schedule's simulation holds micro-batches until W: at
// most P, no more than 1F1B's most over its stages (its first stage's; an activation is received into a slot
// one op ahead of its forward, except ahead of a W, which frees one only when it ends).
TEST(SplitKernels, AZeroBubbleStageHoldsItsSlotsUntilW) {
  for (const auto& [stages, micro_batches] : {std::pair{2, 4}, std::pair{4, 4}, std::pair{4, 8}}) {
    const PipelineSchedule schedule =
        build_pipeline_schedule(PipelineScheduleKind::zero_bubble, stages, micro_batches, 1);
    const PipelineSimulation simulation =
        simulate_pipeline_schedule(schedule, equal_chunk_op_times(stages, 1.0, 1.0, 1.0));
    const PipelineSchedule one_f_one_b =
        build_pipeline_schedule(PipelineScheduleKind::one_f_one_b, stages, micro_batches, 1);
    int64_t one_f_one_b_most = 0;
    for (int64_t stage = 0; stage < stages; ++stage)
      one_f_one_b_most = std::max(one_f_one_b_most, plan_stage_program(one_f_one_b, stage).slots);
    for (int64_t stage = 0; stage < stages; ++stage) {
      const StageProgram program = plan_stage_program(schedule, stage);
      const std::string what = std::to_string(stages) + " stages, " + std::to_string(micro_batches) +
                               " micro-batches, stage " + std::to_string(stage);
      EXPECT_EQ(program.slots, simulation.ranks[static_cast<size_t>(stage)].peak_activations) << what;
      EXPECT_LE(program.slots, stages) << what;
      EXPECT_LE(program.slots, one_f_one_b_most) << what;
      std::map<int64_t, std::string> held;  // slot -> the kernels its micro-batch has run
      int64_t weights = 0;
      for (const ProgramEntry& entry : program.program.gradients) {
        if (entry.transfer != ProgramEntry::Transfer::none || entry.slot == ProgramEntry::kNoSlot) continue;
        std::string& history = held[entry.slot];
        switch (entry.kernel) {
          case KernelName::forward:
            EXPECT_EQ(history, "") << what;
            history = "F";
            break;
          case KernelName::backward_input:
            EXPECT_EQ(history, "F") << what;
            history = "FI";
            break;
          case KernelName::backward_weight:
            EXPECT_EQ(history, "FI") << what;
            history = "";
            ++weights;
            break;
          default:
            ADD_FAILURE() << what << ": " << kernel_name(entry.kernel);
        }
      }
      EXPECT_EQ(weights, micro_batches) << what;
    }
  }
}

}  // namespace
}  // namespace meshtrain
