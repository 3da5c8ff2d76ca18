// plan/search: the candidate enumeration (context degrees included), a candidate applied to a config equals
// the config its overrides load, and the ranking of the fitting candidates.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/plan/pipeline_step.h"
#include "meshtrain/plan/plan.h"
#include "meshtrain/plan/search.h"

namespace meshtrain {
namespace {

std::vector<std::string> words_of(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

TEST(Search, CandidatesCoverMeshesBatchSplitsAndRematPolicies) {
  const Config base = load_config("qwen3-tiny", {"per_device_batch_size=2", "gradient_accumulation_steps=2"});
  // 4 devices, tensor <= 2 (and dividing 6 query heads); batch x GA = 4 -> batch {1, 2, 4}; three remat
  // policies. Context {1, 2, 4} (max_target_length 128 splits into 2C chunks for each):
  //   context 1: tensor 1 -> fsdp {1, 2, 4}, tensor 2 -> fsdp {1, 2}: 5 meshes
  //   context 2: tensor 1 -> fsdp {1, 2}, tensor 2 -> fsdp {1}: 3 meshes
  //   context 4: 1 mesh
  // Then stages (6 layers: 2 and 4), with gpipe, 1f1b and zero_bubble where GA >= the stages, and
  // interleaved (2 chunks a rank) where the stages divide GA and 2 x stages <= 6 layers: stage 2 leaves 2
  // devices (context 1: tensor 1 -> fsdp {1, 2}, tensor 2: 3 meshes; context 2: 1), GA {4, 2, 1} -> 4 + 4 + 1
  // schedules; stage 4 leaves 1 mesh, GA {4, 2, 1} -> 3 + 1 + 1.
  const std::vector<SearchCandidate> candidates = search_candidates(base, 4, 2);
  ASSERT_EQ(candidates.size(), (5u + 3u + 1u) * 3u * 3u + 4u * 9u * 3u + 1u * 5u * 3u);
  std::pair<int64_t, int64_t> previous{1, 1};  // (stage, context): stage the outermost loop, then context
  for (const SearchCandidate& candidate : candidates) {
    EXPECT_EQ(candidate.mesh.devices(), 4);
    EXPECT_LE(candidate.mesh.size(MeshAxis::tensor), 2);
    EXPECT_EQ(candidate.per_device_batch_size * candidate.gradient_accumulation_steps, 4);
    const std::pair<int64_t, int64_t> order{candidate.mesh.size(MeshAxis::stage),
                                            candidate.mesh.size(MeshAxis::context)};
    EXPECT_GE(order, previous) << candidate.overrides();
    previous = order;
    if (candidate.pipelined()) {
      const int64_t stages = candidate.mesh.size(MeshAxis::stage), M = candidate.gradient_accumulation_steps;
      const PipelineScheduleKind kind = candidate.pipeline_schedule;
      const bool interleaved = kind == PipelineScheduleKind::interleaved_one_f_one_b;
      EXPECT_EQ(candidate.pipeline_repeats, interleaved ? 2 : 1) << candidate.overrides();
      EXPECT_TRUE(kind == PipelineScheduleKind::gpipe ||
                  ((kind == PipelineScheduleKind::one_f_one_b || kind == PipelineScheduleKind::zero_bubble) &&
                   M >= stages) ||
                  (interleaved && M % stages == 0 && 2 * stages <= base.base_num_decoder_layers))
          << candidate.overrides();
    }
  }
  const SearchCandidate& first = candidates.front();
  EXPECT_EQ(first.mesh.to_string(), "data=4 fsdp=1 context=1 expert=1 tensor=1");
  EXPECT_EQ(first.per_device_batch_size, 1);
  EXPECT_EQ(first.remat_policy, RematPolicy::none);
  EXPECT_EQ(candidates[1].remat_policy, RematPolicy::minimal);
  EXPECT_EQ(candidates[5 * 9 - 1].mesh.to_string(), "data=1 fsdp=2 context=1 expert=1 tensor=2");
  EXPECT_EQ(candidates[5 * 9].mesh.to_string(), "data=2 fsdp=1 context=2 expert=1 tensor=1");
  EXPECT_EQ(candidates[81].mesh.to_string(), "data=2 stage=2 fsdp=1 context=1 expert=1 tensor=1");
  EXPECT_EQ(
      candidates[81].overrides(),
      "mesh.data=2 mesh.stage=2 mesh.fsdp=1 mesh.context=1 mesh.expert=1 mesh.tensor=1 "
      "per_device_batch_size=1 gradient_accumulation_steps=4 remat_policy=none pipeline_schedule=gpipe");
  EXPECT_EQ(candidates[82].pipeline_schedule, PipelineScheduleKind::one_f_one_b);
  EXPECT_EQ(candidates.back().mesh.to_string(), "data=1 stage=4 fsdp=1 context=1 expert=1 tensor=1");
  EXPECT_EQ(candidates.back().gradient_accumulation_steps, 1);
  EXPECT_EQ(search_stage_degrees(base, 12), (std::vector<int64_t>{1, 2, 3, 4, 6}));  // not 12 > 6 layers
}

// The config's expert degree stays; the other axes are searched over the devices it leaves.
TEST(Search, CandidatesKeepTheConfigsExpertDegree) {
  const Config base = load_config("deepseek-tiny", {"per_device_batch_size=1", "mesh.expert=2"});
  // 8 devices / expert 2 = 4 left, tensor <= 2 (dividing 6 query heads), batch {1}: as the qwen3 case above
  // (context 1: 5 meshes, 2: 3, 4: 1) x 3 remat policies; stage 2: 4 meshes, stage 4: 1, gpipe only (GA 1).
  const std::vector<SearchCandidate> candidates = search_candidates(base, 8, 2);
  ASSERT_EQ(candidates.size(), (5u + 3u + 1u) * 3u + (4u + 1u) * 3u);
  for (const SearchCandidate& candidate : candidates) {
    EXPECT_EQ(candidate.mesh.devices(), 8);
    EXPECT_EQ(candidate.mesh.size(MeshAxis::expert), 2);
  }
  EXPECT_EQ(candidates.front().mesh.to_string(), "data=4 fsdp=1 context=1 expert=2 tensor=1");
  EXPECT_TRUE(search_candidates(base, 3, 2).empty());  // 2 does not divide 3 devices
}

// The context degrees are the device count's divisors the reorder can cut max_target_length over:
// dual_chunk_swap a multiple of 2C, striped and the plain split a multiple of C.
TEST(Search, ContextDegreesSkipThoseTheReorderCannotSplit) {
  const auto degrees = [](const std::vector<std::string>& overrides, int64_t devices) {
    return search_context_degrees(load_config("qwen3-tiny", overrides), devices);
  };
  const ContextDegrees dual = degrees({"max_target_length=20"}, 8);
  EXPECT_EQ(dual.searched, (std::vector<int64_t>{1, 2}));  // 20 = 5 x (2 x 2)
  EXPECT_EQ(dual.skipped, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(dual.sequence_length, 20);
  EXPECT_EQ(dual.reorder_setting, "context_parallel_reorder=dual_chunk_swap");
  EXPECT_NE(dual.first_skip_reason.find("config key 'max_target_length' (with mesh.context=4"),
            std::string::npos)
      << dual.first_skip_reason;
  const ContextDegrees striped = degrees({"max_target_length=20", "context_parallel_reorder=striped"}, 8);
  EXPECT_EQ(striped.searched, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(striped.skipped, (std::vector<int64_t>{8}));
  const ContextDegrees plain = degrees({"max_target_length=20", "context_parallel_load_balance=false"}, 8);
  EXPECT_EQ(plain.searched, (std::vector<int64_t>{1, 2, 4}));
  EXPECT_EQ(plain.reorder_setting, "context_parallel_load_balance=false");
  // An odd length: only one context rank holds a row.
  const ContextDegrees odd = degrees({"max_target_length=127"}, 4);
  EXPECT_EQ(odd.searched, (std::vector<int64_t>{1}));
  EXPECT_EQ(odd.skipped, (std::vector<int64_t>{2, 4}));
  EXPECT_TRUE(degrees({}, 6).first_skip_reason.find("mesh.context=3") != std::string::npos);
  // And the candidates hold only the searched degrees.
  for (const SearchCandidate& candidate :
       search_candidates(load_config("qwen3-tiny", {"max_target_length=20"}), 8, 8))
    EXPECT_LE(candidate.mesh.size(MeshAxis::context), 2) << candidate.overrides();
}

TEST(Search, AppliedCandidateEqualsTheConfigItsOverridesLoad) {
  const Config base = load_config("qwen3-tiny", {"topology=cpu"});
  const SearchCandidate candidate{Mesh({{MeshAxis::fsdp, 2}, {MeshAxis::tensor, 2}}), 2, 3,
                                  RematPolicy::full};
  Config applied = base;
  candidate.apply_to(applied);
  std::vector<std::string> overrides = {"topology=cpu"};
  for (const std::string& word : words_of(candidate.overrides())) overrides.push_back(word);
  const Config loaded = load_config("qwen3-tiny", overrides);
  EXPECT_EQ(applied.mesh[MeshAxis::fsdp], 2);
  EXPECT_EQ(applied.mesh[MeshAxis::tensor], 2);
  EXPECT_EQ(applied.per_device_batch_size, 2);
  EXPECT_EQ(applied.gradient_accumulation_steps, 3);
  EXPECT_EQ(applied.remat_policy, RematPolicy::full);
  EXPECT_EQ(applied.resolved, loaded.resolved);
  // The same plan, identity included.
  PlanRequest from_applied, from_loaded;
  from_applied.config = applied;
  from_loaded.config = loaded;
  from_applied.kernels = from_loaded.kernels = {KernelName::fwd_bwd, KernelName::update};
  const TrainingPlan a = plan_training(from_applied), b = plan_training(from_loaded);
  EXPECT_EQ(a.arena_bytes, b.arena_bytes);
  EXPECT_EQ(serialize_kernel_plan(a, KernelName::fwd_bwd), serialize_kernel_plan(b, KernelName::fwd_bwd));
}

TEST(Search, RanksFittingCandidatesFastestFirst) {
  const SearchResult result = search_training_configurations(
      load_config("qwen3-tiny", {"topology=cpu", "mesh.data=2", "per_device_batch_size=2"}));
  EXPECT_EQ(result.devices, 2);
  EXPECT_EQ(result.global_batch, 4);
  // context 1: tensor 1 -> fsdp {1, 2}, tensor 2 -> fsdp {1}; context 2: one mesh; batch {1, 2}; 3 remat.
  // Stage 2: one mesh; GA 2: gpipe, 1f1b, zero_bubble and interleaved, GA 1: gpipe.
  EXPECT_EQ(result.planned, (2 + 1 + 1) * 2 * 3 + (4 + 1) * 3);
  EXPECT_EQ(result.stages, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(result.contexts.searched, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(result.contexts.skipped.empty());
  ASSERT_FALSE(result.fitting.empty());
  for (size_t i = 1; i < result.fitting.size(); ++i) {
    const FittingCandidate& before = result.fitting[i - 1];
    const FittingCandidate& after = result.fitting[i];
    EXPECT_TRUE(before.step_seconds < after.step_seconds ||
                (before.step_seconds == after.step_seconds && before.arena_bytes <= after.arena_bytes))
        << "rank " << i;
  }
}

TEST(Search, PlanOutIsRejected) {
  EXPECT_THROW(search_training_configurations(load_config("qwen3-tiny", {"plan_out=/tmp/x"})), MeshError);
}

// A pipelined candidate is ranked by its pipeline step (plan/pipeline_step.h: the schedule's span over every
// stage's predicted forward and backward, bubble included, + the slowest update) and its largest stage's
// arena; its overrides reproduce it, and a config's own mesh.stage is searched over like the other axes.
TEST(Search, StageCandidatesAreRankedByTheirPipelineStep) {
  const Config base = load_config("qwen3-tiny", {"topology=cpu", "mesh.stage=2", "per_device_batch_size=2",
                                                 "gradient_accumulation_steps=2", "max_target_length=32"});
  const SearchResult result = search_training_configurations(base);
  EXPECT_EQ(result.stages, (std::vector<int64_t>{1, 2}));
  size_t pipelined = 0;
  for (const FittingCandidate& fit : result.fitting) {
    if (!fit.candidate.pipelined()) continue;
    ++pipelined;
    std::vector<std::string> overrides = {"topology=cpu", "max_target_length=32"};
    for (const std::string& word : words_of(fit.candidate.overrides())) overrides.push_back(word);
    PlanRequest request;
    request.config = load_config("qwen3-tiny", overrides);
    Config applied = base;
    fit.candidate.apply_to(applied);
    EXPECT_EQ(applied.resolved, request.config.resolved) << fit.candidate.overrides();
    request.kernels = {KernelName::update};
    const PipelineStepPlan step = plan_pipeline_step(request);
    EXPECT_EQ(fit.step_seconds, step.step_seconds) << fit.candidate.overrides();
    EXPECT_EQ(fit.arena_bytes, step.largest_arena_bytes) << fit.candidate.overrides();
  }
  // 4 sequences a device: GA {4, 2, 1} -> gpipe 3 times, 1f1b, zero_bubble and interleaved twice each, 3
  // remat policies, all fit.
  EXPECT_EQ(pipelined, 9u * 3u);
}

}  // namespace
}  // namespace meshtrain
