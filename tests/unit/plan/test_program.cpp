// The step as a planned program: the plan holds the kernels of a step and of eval in order, the plan file
// carries them (and is verified on them), the engine runs them (the run decides no kernel order), and a
// send_recv op of a kernel moves its bytes, traced, without blocking the op that starts it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "error_text.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/metrics/trace.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/program.h"
#include "meshtrain/runtime/engine.h"
#include "tiny_batch.h"
#include "tiny_plan.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

void expect_entry(const ProgramEntry& entry, KernelName kernel, int64_t micro_batch, bool last_backward) {
  EXPECT_EQ(entry.kernel, kernel);
  EXPECT_EQ(entry.micro_batch, micro_batch);
  EXPECT_EQ(entry.chunk, 0);
  EXPECT_EQ(entry.last_backward, last_backward);
}

TEST(PlanProgram, AStepIsItsMicroBatchesThenTheUpdate) {
  const StepProgram program = plan_step_program(3);
  ASSERT_EQ(program.gradients.size(), 3u);
  expect_entry(program.gradients[0], KernelName::fwd_bwd, 0, false);
  expect_entry(program.gradients[1], KernelName::fwd_bwd_accum, 1, false);
  expect_entry(program.gradients[2], KernelName::fwd_bwd_accum, 2, true);
  ASSERT_EQ(program.update.size(), 1u);
  expect_entry(program.update[0], KernelName::update, ProgramEntry::kNoMicroBatch, false);
  ASSERT_EQ(program.eval.size(), 1u);
  expect_entry(program.eval[0], KernelName::eval, 0, false);
  // Without accumulation the one micro-batch is the last backward.
  const StepProgram single = plan_step_program(1);
  ASSERT_EQ(single.gradients.size(), 1u);
  expect_entry(single.gradients[0], KernelName::fwd_bwd, 0, true);
  EXPECT_EQ(program_kernels(program.gradients),
            (std::vector<KernelName>{KernelName::fwd_bwd, KernelName::fwd_bwd_accum}));
}

TEST(PlanProgram, ThePlanHoldsItsConfigsStepAndThePlanFileIsVerifiedOnIt) {
  const TrainingPlan plan = testing::tiny_plan({"gradient_accumulation_steps=2"});
  ASSERT_EQ(plan.program.gradients.size(), 2u);
  expect_entry(plan.program.gradients[1], KernelName::fwd_bwd_accum, 1, true);
  const std::string text = serialize_kernel_plan(plan, KernelName::update);
  const size_t program = text.find("\"program\"");
  ASSERT_NE(program, std::string::npos);
  // The same file with the program changed: another plan, named by its section.
  std::string changed = text;
  const size_t last = changed.find("\"last_backward\": true", program);
  ASSERT_NE(last, std::string::npos) << text.substr(program);
  changed.replace(last, std::string("\"last_backward\": true").size(), "\"last_backward\": false");
  const fs::path dir = fs::temp_directory_path() / ("meshtrain_program_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string stem = (dir / "tiny").string();
  std::ofstream(plan_file_path(stem, KernelName::update)) << text;
  EXPECT_NO_THROW(verify_plan_file(plan, KernelName::update, stem));
  std::ofstream(plan_file_path(stem, KernelName::update)) << changed;
  const std::string error = testing::error_of([&] { verify_plan_file(plan, KernelName::update, stem); });
  EXPECT_NE(error.find("'program'"), std::string::npos) << error;
  fs::remove_all(dir);
}

// The engine walking the program computes exactly what the kernels called by hand in its order do.
TEST(EngineProgram, RunsTheStepsKernelsInTheProgramsOrder) {
  const Config config = testing::tiny_config({"gradient_accumulation_steps=2", "init_weights_seed=5"});
  Engine by_program(config), by_hand(config);
  const StepProgram& program = by_program.plan().program;
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<int64_t> asked;
    const auto batches = [&](int64_t micro) {
      asked.push_back(micro);
      return testing::tiny_batch(by_program.spec().dims, static_cast<uint32_t>(10 * step + micro));
    };
    const LossSums sums = by_program.run_program(program.gradients, {batches}).sums;
    EXPECT_EQ(asked, (std::vector<int64_t>{0, 1}));
    const ProgramInputs update_inputs{
        .micro_batch = nullptr, .valid_count = sums.valid_count, .learning_rate = 1e-2, .step = step};
    const UpdateResult update = by_program.run_program(program.update, update_inputs).update;

    const ModelDims& m = by_hand.spec().dims;
    const LossSums first = by_hand.fwd_bwd(testing::tiny_batch(m, static_cast<uint32_t>(10 * step)));
    const LossSums second =
        by_hand.fwd_bwd_accum(testing::tiny_batch(m, static_cast<uint32_t>(10 * step + 1)), true);
    EXPECT_EQ(sums.loss_sum, first.loss_sum + second.loss_sum);
    EXPECT_EQ(sums.valid_count, first.valid_count + second.valid_count);
    EXPECT_EQ(update.grad_norm, by_hand.update(sums.valid_count, 1e-2, step).grad_norm);
  }
  const auto eval_batch = [&](int64_t micro) {
    return testing::tiny_batch(by_program.spec().dims, static_cast<uint32_t>(100 + micro));
  };
  EXPECT_EQ(by_program.run_program(program.eval, {eval_batch}).sums.loss_sum,
            by_hand.eval(testing::tiny_batch(by_hand.spec().dims, 100)).loss_sum);
}

// A send_recv op appended to eval: parameter 0's value passed along the data axis (here one rank, a message
// to itself) into its gradient buffer; the op and the wait for it are trace events.
TEST(EngineProgram, SendRecvOpsMoveTheirBytes) {
  TrainingPlan plan = testing::tiny_plan();
  const ParameterDecl& parameter = plan.spec.parameters.front();
  const ParameterStorage& storage = plan.storage.front();
  CollectiveDecl transfer;
  transfer.kind = CollectiveKind::send_recv;
  transfer.axis = MeshAxis::data;
  transfer.buffer = parameter.value;
  transfer.shard = parameter.gradient;
  const OpDecl* op = &plan.plan_ops.emplace_back("test/send_recv", std::vector<BufferId>{parameter.value},
                                                 std::vector<BufferId>{parameter.gradient}, 0.0, nullptr,
                                                 OpKind::collective, transfer);
  KernelPlan& eval = plan.kernels[3];
  ASSERT_EQ(eval.kernel, KernelName::eval);
  PlanOp planned;
  planned.op = op;
  planned.buffers = {{parameter.value, storage.value_store}, {parameter.gradient, storage.gradient_store}};
  planned.offsets = {plan.buffers[static_cast<size_t>(storage.value_store)].offset,
                     plan.buffers[static_cast<size_t>(storage.gradient_store)].offset};
  eval.ops.push_back(planned);

  LocalCommunicator world;
  MeshCommunicators axes = make_mesh_communicators(world, plan.mesh);
  Engine engine(std::move(plan), {&world, &axes});
  TraceRecorder trace({1});
  trace.begin_step(1);
  engine.set_trace(&trace);
  const ModelDims& m = engine.spec().dims;
  engine.run_program(engine.plan().program.eval, {[&](int64_t) { return testing::tiny_batch(m, 7); }});
  const std::vector<float> value = engine.read(parameter.value);
  EXPECT_EQ(engine.read(parameter.gradient), value);
  EXPECT_NE(value, std::vector<float>(value.size(), 0.0f));  // the comparison can fail
  const fs::path path =
      fs::temp_directory_path() / ("meshtrain_send_recv_" + std::to_string(::getpid()) + ".json");
  trace.write(path.string());
  std::stringstream events;
  events << std::ifstream(path).rdbuf();
  EXPECT_NE(events.str().find("\"test/send_recv\""), std::string::npos);
  EXPECT_NE(events.str().find("\"wait test/send_recv\""), std::string::npos);
  fs::remove(path);
}

}  // namespace
}  // namespace meshtrain
