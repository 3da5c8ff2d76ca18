// train/schedule and train/spike_skip: the rate of each schedule type at chosen steps against the closed
// forms (written out here, not taken from the code), the rate after the schedule, the length's default, the
// final fraction's two names, the printed table; the spike window's statistic, its filling, counting and
// checkpoint form.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "error_text.h"
#include "meshtrain/config/config.h"
#include "meshtrain/core/error.h"
#include "meshtrain/train/schedule.h"
#include "meshtrain/train/spike_skip.h"

namespace meshtrain {
namespace {

using testing::error_of;

constexpr double kPeak = 2e-3, kFinal = 0.1;

// A run of 30 steps on a schedule of L = 20: W = floor(0.1 x 20) = 2 warmup steps, then the type's phases.
LearningRateSchedule schedule_of(const std::vector<std::string>& keys) {
  std::vector<std::string> overrides = {"learning_rate=2e-3", "learning_rate_final_fraction=0.1", "steps=30",
                                        "learning_rate_schedule_steps=20", "warmup_steps_fraction=0.1"};
  overrides.insert(overrides.end(), keys.begin(), keys.end());
  return learning_rate_schedule(load_config("qwen3-tiny", overrides));
}

double decayed(double shape) {
  return kPeak * (kFinal + (1.0 - kFinal) * shape);
}

TEST(LearningRateSchedule, CosineWarmsUpThenDecaysOverTheRestOfTheSchedule) {
  const LearningRateSchedule cosine = schedule_of({"lr_schedule_type=cosine"});
  EXPECT_EQ(cosine.warmup_steps, 2);
  EXPECT_EQ(cosine.stable_steps, 0);
  EXPECT_EQ(cosine.decay_steps, 18);
  EXPECT_DOUBLE_EQ(cosine.at(0), kPeak * 1.0 / 3.0);  // p (t + 1) / (W + 1)
  EXPECT_DOUBLE_EQ(cosine.at(1), kPeak * 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(cosine.at(2), kPeak);  // x = 0
  EXPECT_DOUBLE_EQ(cosine.at(11), decayed(0.5 * (1.0 + std::cos(std::numbers::pi * 9.0 / 18.0))));
  EXPECT_DOUBLE_EQ(cosine.at(19), decayed(0.5 * (1.0 + std::cos(std::numbers::pi * 17.0 / 18.0))));
}

TEST(LearningRateSchedule, WsdHoldsThePeakThenDecaysToTheFinalValueInEachStyle) {
  // D = floor(0.25 x 20) = 5, S = 20 - 2 - 5 = 13: the decay is steps 15..19, x = (t - 15) / 4.
  for (const char* style : kWsdDecayStyleNames) {
    const LearningRateSchedule wsd = schedule_of(
        {"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.25", std::string("wsd_decay_style=") + style});
    EXPECT_EQ(wsd.warmup_steps, 2) << style;
    EXPECT_EQ(wsd.stable_steps, 13) << style;
    EXPECT_EQ(wsd.decay_steps, 5) << style;
    EXPECT_DOUBLE_EQ(wsd.at(1), kPeak * 2.0 / 3.0) << style;
    EXPECT_DOUBLE_EQ(wsd.at(2), kPeak) << style;
    EXPECT_DOUBLE_EQ(wsd.at(14), kPeak) << style;
    EXPECT_DOUBLE_EQ(wsd.at(15), kPeak) << style << ": MaxText's decay starts at the peak";
    EXPECT_DOUBLE_EQ(wsd.at(19), kPeak * kFinal) << style << ": and ends at the final value";
  }
  const double x = 1.0 / 4.0;  // step 16
  EXPECT_DOUBLE_EQ(schedule_of({"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.25"}).at(16),
                   decayed(1.0 - x));
  EXPECT_DOUBLE_EQ(
      schedule_of({"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.25", "wsd_decay_style=cosine"}).at(16),
      decayed(0.5 * (1.0 + std::cos(std::numbers::pi * x))));
  EXPECT_DOUBLE_EQ(
      schedule_of({"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.25", "wsd_decay_style=1-sqrt"}).at(16),
      decayed(1.0 - std::sqrt(x)));
  // One decay step is the final value itself.
  EXPECT_DOUBLE_EQ(schedule_of({"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.05"}).at(19),
                   kPeak * kFinal);
}

TEST(LearningRateSchedule, ConstantHoldsThePeakAfterTheWarmup) {
  const LearningRateSchedule constant = schedule_of({"lr_schedule_type=constant"});
  EXPECT_EQ(constant.stable_steps, 18);
  EXPECT_EQ(constant.decay_steps, 0);
  EXPECT_DOUBLE_EQ(constant.at(0), kPeak / 3.0);
  EXPECT_DOUBLE_EQ(constant.at(2), kPeak);
  EXPECT_DOUBLE_EQ(constant.at(19), kPeak);
}

TEST(LearningRateSchedule, TheRateIsZeroAfterTheSchedule) {
  for (const char* type : kLrScheduleTypeNames) {
    const LearningRateSchedule schedule = schedule_of({std::string("lr_schedule_type=") + type});
    EXPECT_GT(schedule.at(19), 0.0) << type;
    EXPECT_EQ(schedule.at(20), 0.0) << type;
    EXPECT_EQ(schedule.at(29), 0.0) << type;
  }
}

TEST(LearningRateSchedule, ItsLengthIsTheRunsStepsUnlessSetAndThenTheStepsDoNotMoveIt) {
  const Config default_length = load_config("qwen3-tiny", {"steps=50"});
  EXPECT_EQ(default_length.learning_rate_schedule_steps, -1);
  EXPECT_EQ(learning_rate_schedule(default_length).length, 50);
  const LearningRateSchedule short_leg =
      learning_rate_schedule(load_config("qwen3-tiny", {"steps=2", "learning_rate_schedule_steps=40"}));
  const LearningRateSchedule whole_run =
      learning_rate_schedule(load_config("qwen3-tiny", {"steps=40", "learning_rate_schedule_steps=40"}));
  for (int64_t step = 0; step < 40; ++step) EXPECT_EQ(short_leg.at(step), whole_run.at(step)) << step;
  const LearningRateSchedule unset = learning_rate_schedule(load_config("qwen3-tiny", {"steps=2"}));
  EXPECT_NE(unset.at(1), whole_run.at(1)) << "without the key, a shorter run has another curve";
}

TEST(LearningRateSchedule, TheFinalFractionHasTwoNamesThatMustAgree) {
  const Config old_name = load_config("qwen3-tiny", {"cosine_learning_rate_final_fraction=0.25"});
  EXPECT_EQ(old_name.learning_rate_final_fraction, 0.25);
  EXPECT_EQ(old_name.cosine_learning_rate_final_fraction, 0.25);
  const Config new_name = load_config("qwen3-tiny", {"learning_rate_final_fraction=0.125"});
  EXPECT_EQ(new_name.learning_rate_final_fraction, 0.125);
  EXPECT_EQ(new_name.cosine_learning_rate_final_fraction, 0.125);
  for (const auto& [key, text] : new_name.resolved) {
    if (key.find("learning_rate_final_fraction") != std::string::npos) {
      EXPECT_EQ(text, "0.125") << key;
    }
  }
  EXPECT_NO_THROW(load_config(
      "qwen3-tiny", {"learning_rate_final_fraction=0.2", "cosine_learning_rate_final_fraction=0.2"}));
  const std::string both = error_of([] {
    load_config("qwen3-tiny",
                {"learning_rate_final_fraction=0.2", "cosine_learning_rate_final_fraction=0.3"});
  });
  EXPECT_NE(both.find("'learning_rate_final_fraction' / 'cosine_learning_rate_final_fraction'"),
            std::string::npos)
      << both;
  EXPECT_NE(both.find("0.2 / 0.3"), std::string::npos) << both;
}

TEST(LearningRateSchedule, TheTableNamesEachPhaseAndWhatComesAfter) {
  const LearningRateSchedule wsd = schedule_of({"lr_schedule_type=wsd", "wsd_decay_steps_fraction=0.25"});
  const std::string table = learning_rate_schedule_table(wsd, 30);
  EXPECT_NE(table.find("wsd (linear decay) schedule of 20 steps"), std::string::npos) << table;
  EXPECT_NE(table.find("warmup    1..2 "), std::string::npos) << table;
  EXPECT_NE(table.find("stable    3..15 "), std::string::npos) << table;
  EXPECT_NE(table.find("decay     16..20 "), std::string::npos) << table;
  EXPECT_NE(table.find("after     21.. "), std::string::npos) << table;
  EXPECT_NE(table.find("this run: 30 steps, the last at lr 0 (10 steps after the schedule"),
            std::string::npos)
      << table;
  const std::string cosine = learning_rate_schedule_table(schedule_of({}), 10);
  EXPECT_EQ(cosine.find("stable"), std::string::npos) << "a cosine schedule has no stable phase: " << cosine;
  EXPECT_NE(cosine.find("(the schedule goes on"), std::string::npos) << cosine;
}

// MaxText's statistic over {1, 2, 3}: mean 2, standard deviation with Bessel's correction
// sqrt(((1 - 2)^2 + 0 + (3 - 2)^2) / 2) = 1.
TEST(LossSpikeWindow, ASpikeIsMoreThanTheScalingFactorOfStandardDeviationsAboveTheMean) {
  LossSpikeWindow window(6, 2.0);  // checks once it holds max(2, 6 / 2) - 1 = 2 losses
  window.record(1.0, false);
  EXPECT_EQ(window.spike_reason(100.0), "") << "one loss: the window is still filling";
  window.record(2.0, false);
  window.record(3.0, false);
  EXPECT_EQ(window.spike_reason(4.0), "") << "mean + 2 x std exactly is no spike";
  const std::string reason = window.spike_reason(4.5);
  EXPECT_EQ(reason, "loss 4.5 > mean 2 + 2 x std 1 of the last 3 losses");
}

TEST(LossSpikeWindow, KeepsTheLastIntervalLossesSkippedOnesTooAndCountsSkipsInARow) {
  LossSpikeWindow window(2, 1.0);
  for (double loss : {50.0, 1.0, 3.0})
    window.record(loss, false);  // 50 falls out: {1, 3}, mean 2, std sqrt(2)
  EXPECT_EQ(window.spike_reason(3.4), "") << "below 2 + sqrt(2)";
  EXPECT_NE(window.spike_reason(3.5), "");
  window.record(3.5, true);
  window.record(9.0, true);
  EXPECT_EQ(window.skips_in_a_row(), 2);
  EXPECT_EQ(window.spike_reason(9.0), "") << "skipped losses are the new baseline: {3.5, 9}";
  window.record(9.0, false);
  EXPECT_EQ(window.skips_in_a_row(), 0);
}

TEST(LossSpikeWindow, ItsCheckpointFormRestoresTheSameDecisions) {
  LossSpikeWindow saved(4, 1.0);
  for (double loss : {2.0, 2.5, 2.25, 2.125}) saved.record(loss, false);
  saved.record(9.0, true);
  const nlohmann::json form = saved.to_json();
  LossSpikeWindow restored(4, 1.0);
  restored.restore(form, "test");
  EXPECT_EQ(restored.to_json(), form);
  EXPECT_EQ(restored.skips_in_a_row(), 1);
  for (double probe : {2.0, 5.0, 8.0, 12.0})
    EXPECT_EQ(restored.spike_reason(probe), saved.spike_reason(probe));
  LossSpikeWindow narrower(2, 1.0);  // a resume with a shorter interval keeps the newest losses
  narrower.restore(form, "test");
  EXPECT_EQ(narrower.to_json()["recent_losses"], nlohmann::json({2.125, 9.0}));
  const std::string damaged = error_of([&] {
    restored.restore({{"recent_losses", "x"}}, "step_2/metadata.json");
  });
  EXPECT_NE(damaged.find("step_2/metadata.json"), std::string::npos) << damaged;
}

}  // namespace
}  // namespace meshtrain
