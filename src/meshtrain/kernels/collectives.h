// What an op calls on other ranks while it runs (the vocab-parallel loss's per-chunk reductions, ring
// attention's block passes, Engram's halos): interfaces declared here, beside the op arguments, so the
// model's ops can call them without a communicator, and implemented by the runtime (runtime/engine.cpp) over
// its communicators. A parallel building block declares the traffic to the plan (model/parallel/); these run
// it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "meshtrain/core/tensor.h"

namespace meshtrain::kernels {

// The tensor-parallel group as an op sees it: its place, and all-reduces an op may need mid-kernel (the
// vocab-parallel cross-entropy combines per-row statistics chunk by chunk).
struct TensorGroup {
  int64_t rank = 0, size = 1;
  std::function<void(float* values, int64_t count)> all_reduce_max;
  std::function<void(double* values, int64_t count)> all_reduce_sum;
};

// The context ranks as ring attention sees them: blocks pass to the next rank of the ring (rank + 1 mod
// size) while the op computes. start_pass sends `send` to the next rank and receives the previous rank's
// block of the same size into `receive`, without waiting; neither buffer is touched until wait(), which
// completes every pass started since the last wait. `name` labels the pass in traces and failure messages.
// progress() moves the passes in flight along: MPI moves a non-blocking call only inside MPI calls, so the
// op calls it between pieces of its compute (without it the bytes move inside wait()).
// start_reverse_pass is the same the other way round: to rank - 1, from rank + 1 (Engram's ShortConv halos
// go both ways under dual_chunk_swap).
struct ContextRing {
  int64_t rank = 0, size = 1;
  std::function<void(const TensorView& send, const TensorView& receive, const std::string& name)> start_pass;
  std::function<void(const std::string& name)> wait;
  std::function<void()> progress;
  std::function<void(const TensorView& send, const TensorView& receive, const std::string& name)>
      start_reverse_pass = {};
};

}  // namespace meshtrain::kernels
