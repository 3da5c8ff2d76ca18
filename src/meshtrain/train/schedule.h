// The learning-rate schedule: a linear warmup, then one of lr_schedule_type's shapes, over a length of its
// own (learning_rate_schedule_steps, MaxText's key and meaning: -1 is the run's `steps`), so a run extended
// or resumed with more steps keeps its curve when the length is set. As data (phases of whole steps), so that
// `meshtrain info` and `compile` print what a run will do.
//
// Closed forms, for step t (0-based, as the optimizer counts; metrics.jsonl's step is t + 1), peak rate p
// (learning_rate), final fraction f (learning_rate_final_fraction), schedule length L, and the phases W
// (warmup), S (stable), D (decay) with W + S + D = L:
//   W = floor(warmup_steps_fraction x L)
//   cosine:   S = 0,                                   D = L - W
//   wsd:      D = floor(wsd_decay_steps_fraction x L), S = L - W - D
//   constant: S = L - W,                               D = 0
// and
//   t < W           (warmup)  p (t + 1) / (W + 1)
//   t < W + S       (stable)  p
//   t < L           (decay)   p (f + (1 - f) g(x))
//   t >= L          (after)   0: MaxText's choice (its "constant learning rate of 0 from
//                             learning_rate_schedule_steps to steps", base.yml), which a run with
//                             steps > L trains at (AdamW's decoupled weight decay is scaled by the rate too)
// with the decay's progress x and shape g:
//   cosine type: x = (t - W) / max(1, L - W),        g = (1 + cos(pi x)) / 2
//   wsd:         x = (t - W - S) / (D - 1) (D = 1: 1), g = 1 - x (linear), (1 + cos(pi x)) / 2 (cosine),
//                                                     1 - sqrt(x) (1-sqrt)
// Two places differ from MaxText, both kept from meshtrain's first schedule so that existing runs and
// checkpoints keep their rates: the warmup starts above zero (MaxText's starts at 0, so its step 0 does not
// move the weights), and the cosine type's last step sits just above the final value (MaxText's reaches it).
// WSD's decay is MaxText's: its first step at the peak, its last exactly at p f.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/config/config.h"

namespace meshtrain {

struct LearningRateSchedule {
  LrScheduleType type = LrScheduleType::cosine;
  WsdDecayStyle decay_style = WsdDecayStyle::linear;            // wsd only
  double peak = 0.0;                                            // learning_rate
  double final_fraction = 0.0;                                  // of the peak, at the decay's end
  int64_t length = 1;                                           // L: the steps the schedule spans
  int64_t warmup_steps = 0, stable_steps = 0, decay_steps = 0;  // W + S + D = L

  // The rate of optimizer step `step` (0-based).
  double at(int64_t step) const;
};

// The run's schedule from its config (learning_rate_schedule_steps -1: the run's steps, at least 1).
LearningRateSchedule learning_rate_schedule(const Config& config);

// The schedule as a small table for `info` and `compile`: its type, each phase's steps (numbered from 1, as
// in metrics.jsonl) with the rate at its first and last step, the rate after the schedule, and where a run of
// `steps` ends on it.
std::string learning_rate_schedule_table(const LearningRateSchedule& schedule, int64_t steps);

}  // namespace meshtrain
