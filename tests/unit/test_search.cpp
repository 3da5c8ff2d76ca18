// plan/search: the candidate enumeration, a candidate applied to a config equals the config its overrides
// load, and the ranking of the fitting candidates.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
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
  // 4 devices, context 1, tensor <= 2 (and dividing 6 query heads): tensor 1 -> fsdp {1, 2, 4}, tensor 2 ->
  // fsdp {1, 2}; batch x GA = 4 -> batch {1, 2, 4}; three remat policies.
  const std::vector<SearchCandidate> candidates = search_candidates(base, 4, 1, 2);
  ASSERT_EQ(candidates.size(), (3u + 2u) * 3u * 3u);
  for (const SearchCandidate& candidate : candidates) {
    EXPECT_EQ(candidate.mesh.devices(), 4);
    EXPECT_LE(candidate.mesh.size(MeshAxis::tensor), 2);
    EXPECT_EQ(candidate.per_device_batch_size * candidate.gradient_accumulation_steps, 4);
  }
  const SearchCandidate& first = candidates.front();
  EXPECT_EQ(first.mesh.to_string(), "data=4 fsdp=1 context=1 tensor=1");
  EXPECT_EQ(first.per_device_batch_size, 1);
  EXPECT_EQ(first.remat_policy, RematPolicy::none);
  EXPECT_EQ(candidates[1].remat_policy, RematPolicy::minimal);
  EXPECT_EQ(candidates.back().mesh.to_string(), "data=1 fsdp=2 context=1 tensor=2");
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
  EXPECT_EQ(result.planned, (2 + 1) * 2 * 3);
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

}  // namespace
}  // namespace meshtrain
