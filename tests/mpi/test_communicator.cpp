// Multi-process tests of the MPI communicator, run under mpirun (any number of ranks; CI runs 2 and 4):
// every call's values and byte counters, splits and the mesh sub-communicators, non-blocking overlap, the
// engine's executor of send_recv ops (runtime/transfers.h), and the engine's split kernels on a mesh.
// With --stall RANK it is instead the failure case that tests/mpi/stall_timeout.sh drives: RANK sleeps
// past the collective timeout and the others must name it and end the job.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "meshtrain/comm/communicator.h"
#include "meshtrain/core/error.h"
#include "meshtrain/runtime/engine.h"
#include "meshtrain/runtime/transfers.h"
#include "mpi_checks.h"
#include "plan/split_programs.h"
#include "plan/tiny_plan.h"
#include "tiny_batch.h"

namespace meshtrain {
namespace {

using mpi_test::check;
using mpi_test::checks_failed;
using mpi_test::checks_passed;
using mpi_test::world_rank;

// Collective bytes per rank by the aot-plan.md definitions.
double leaving(double bytes, int n) {
  return bytes * (n - 1.0) / n;
}

void check_counter(const Communicator& comm, CommCall call, int64_t calls, double bytes,
                   const std::string& what) {
  const CommCallStats stats = comm.stats()[call];
  check(stats.calls == calls, what + ": " + std::to_string(stats.calls) + " " + comm_call_name(call) +
                                  " calls, expected " + std::to_string(calls));
  check(std::fabs(stats.bytes - bytes) < 1e-6,
        what + ": " + std::to_string(stats.bytes) + " bytes, expected " + std::to_string(bytes));
}

uint16_t bf16_of(float value) {  // exact for the small integers used here
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return static_cast<uint16_t>(bits >> 16);
}

void test_all_reduce(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.reset_stats();
  std::vector<float> sum_f32(100), max_f32(100);
  for (int i = 0; i < 100; ++i) {
    sum_f32[static_cast<size_t>(i)] = static_cast<float>(r) + 0.5f * static_cast<float>(i);
    max_f32[static_cast<size_t>(i)] = static_cast<float>(10 * r + i);
  }
  world.all_reduce(comm_buffer(sum_f32), ReduceOp::sum, "test/f32_sum");
  check_counter(world, CommCall::all_reduce, 1, 2.0 * leaving(400.0, n), "all_reduce f32 bytes");
  world.all_reduce(comm_buffer(max_f32), ReduceOp::max, "test/f32_max");
  bool f32_ok = true;
  for (int i = 0; i < 100; ++i) {
    f32_ok &= sum_f32[static_cast<size_t>(i)] ==
              static_cast<float>(n * (n - 1) / 2) + 0.5f * static_cast<float>(n * i);
    f32_ok &= max_f32[static_cast<size_t>(i)] == static_cast<float>(10 * (n - 1) + i);
  }
  check(f32_ok, "all_reduce f32 sum and max");

  std::vector<int32_t> sum_i32 = {r, -r, 1}, max_i32 = {r, -r, 7};
  world.all_reduce(comm_buffer(sum_i32), ReduceOp::sum, "test/i32_sum");
  world.all_reduce(comm_buffer(max_i32), ReduceOp::max, "test/i32_max");
  check(sum_i32 == std::vector<int32_t>{n * (n - 1) / 2, -n * (n - 1) / 2, n}, "all_reduce i32 sum");
  check(max_i32 == std::vector<int32_t>{n - 1, 0, 7}, "all_reduce i32 max");

  // 64-bit scalars: loss sums and token counts beyond f32 / i32 precision.
  double loss_sum = 1e9 + 0.25 * r;
  int64_t tokens = 3'000'000'000LL + r;
  world.all_reduce(comm_buffer(&loss_sum, 1), ReduceOp::sum, "test/f64_sum");
  world.all_reduce(comm_buffer(&tokens, 1), ReduceOp::sum, "test/i64_sum");
  check(loss_sum == 1e9 * n + 0.25 * (n * (n - 1) / 2), "all_reduce f64 sum");
  check(tokens == 3'000'000'000LL * n + n * (n - 1) / 2, "all_reduce i64 sum");

  std::vector<uint16_t> bf16_values = {bf16_of(static_cast<float>(r + 1)), bf16_of(-static_cast<float>(r))};
  std::vector<uint16_t> bf16_max = bf16_values;
  world.all_reduce({bf16_values.data(), 2, CommElement::bf16}, ReduceOp::sum, "test/bf16_sum");
  world.all_reduce({bf16_max.data(), 2, CommElement::bf16}, ReduceOp::max, "test/bf16_max");
  check(bf16_values[0] == bf16_of(static_cast<float>(n * (n + 1) / 2)) &&
            bf16_values[1] == bf16_of(-static_cast<float>(n * (n - 1) / 2)),
        "all_reduce bf16 sum");
  check(bf16_max[0] == bf16_of(static_cast<float>(n)) && bf16_max[1] == bf16_of(-0.0f),
        "all_reduce bf16 max");

  std::vector<uint8_t> mask = {1, static_cast<uint8_t>(r)};
  world.all_reduce(comm_buffer(mask), ReduceOp::max, "test/u8_max");
  check(mask[0] == 1 && mask[1] == n - 1, "all_reduce u8 max");
  check_counter(world, CommCall::all_reduce, 9, 2.0 * leaving(400.0 + 400.0 + 12 + 12 + 8 + 8 + 4 + 4 + 2, n),
                "all_reduce bytes over all element types");
}

void test_all_gather(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.reset_stats();
  const float base = 100.0f * static_cast<float>(r);
  std::vector<float> shard = {base, base + 1.0f, base + 2.0f};
  std::vector<float> full(static_cast<size_t>(3 * n), -1.0f);
  world.all_gather(comm_buffer(shard), comm_buffer(full), "test/gather");
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < 3; ++j) ok &= full[static_cast<size_t>(3 * i + j)] == static_cast<float>(100 * i + j);
  }
  check(ok, "all_gather rank-ordered");
  check_counter(world, CommCall::all_gather, 1, leaving(12.0 * n, n), "all_gather bytes");

  // ZeRO-1: the shard already sits in its slot of the full buffer.
  std::vector<int32_t> parameters(static_cast<size_t>(2 * n), -1);
  parameters[static_cast<size_t>(2 * r)] = 10 * r;
  parameters[static_cast<size_t>(2 * r + 1)] = 10 * r + 1;
  world.all_gather({parameters.data() + 2 * r, 2, CommElement::i32}, comm_buffer(parameters),
                   "test/in_place");
  ok = true;
  for (int i = 0; i < n; ++i)
    ok &= parameters[static_cast<size_t>(2 * i)] == 10 * i &&
          parameters[static_cast<size_t>(2 * i + 1)] == 10 * i + 1;
  check(ok, "all_gather in place");
}

void test_reduce_scatter(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.reset_stats();
  std::vector<int32_t> full(static_cast<size_t>(4 * n));
  for (int i = 0; i < 4 * n; ++i) full[static_cast<size_t>(i)] = r + i;
  std::vector<int32_t> shard(4, -1);
  world.reduce_scatter(comm_buffer(full), comm_buffer(shard), ReduceOp::sum, "test/scatter");
  bool ok = true;
  for (int j = 0; j < 4; ++j) ok &= shard[static_cast<size_t>(j)] == n * (n - 1) / 2 + n * (4 * r + j);
  check(ok, "reduce_scatter i32 sum");
  check_counter(world, CommCall::reduce_scatter, 1, leaving(16.0 * n, n), "reduce_scatter bytes");

  std::vector<float> gradients(static_cast<size_t>(2 * n));
  for (int i = 0; i < 2 * n; ++i) gradients[static_cast<size_t>(i)] = 0.25f * static_cast<float>(r * i);
  std::vector<float> gradient_shard(2);
  world.reduce_scatter(comm_buffer(gradients), comm_buffer(gradient_shard), ReduceOp::sum,
                       "test/scatter_f32");
  ok = true;
  for (int j = 0; j < 2; ++j) {
    ok &=
        gradient_shard[static_cast<size_t>(j)] == 0.25f * static_cast<float>((n * (n - 1) / 2) * (2 * r + j));
  }
  check(ok, "reduce_scatter f32 sum");
}

void test_all_to_all(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.reset_stats();
  std::vector<int32_t> input(static_cast<size_t>(2 * n)), output(static_cast<size_t>(2 * n), -1);
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < 2; ++k) input[static_cast<size_t>(2 * j + k)] = 1000 * r + 10 * j + k;
  }
  world.all_to_all(comm_buffer(input), comm_buffer(output), "test/all_to_all");
  bool ok = true;
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) ok &= output[static_cast<size_t>(2 * i + k)] == 1000 * i + 10 * r + k;
  }
  check(ok, "all_to_all blocks");
  check_counter(world, CommCall::all_to_all, 1, leaving(8.0 * n, n), "all_to_all bytes leaving the rank");
}

void test_send_recv(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.reset_stats();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  std::vector<float> outgoing = {static_cast<float>(r), 0.5f}, incoming(2, -1.0f);
  auto receive = world.recv_start(comm_buffer(incoming), previous, "test/ring");
  world.send(comm_buffer(outgoing), next, "test/ring");
  receive->wait();
  check(incoming[0] == static_cast<float>(previous) && incoming[1] == 0.5f, "send/recv ring");
  check_counter(world, CommCall::send, 1, 8.0, "send bytes");
  check_counter(world, CommCall::recv, 1, 8.0, "recv bytes");
  check(world.stats().total_bytes() == 8.0, "total bytes count a send/recv pair once");

  world.reset_stats();
  world.barrier("test/barrier");
  check_counter(world, CommCall::barrier, 1, 0.0, "barrier");
  check(world.stats().total_calls() == 1, "reset_stats clears every counter");
}

// The engine's send_recv executor: a ring shift each way, completed only where its memory is touched, the
// bytes sent counted like every collective; and one-sided transfers (a pipeline's first and last stages).
void test_transfers(Communicator& world) {
  const int n = world.size(), r = world.rank();
  const auto view_of = [](std::vector<float>& values) {
    return TensorView{values.data(), DType::f32, shape_of({{"values", static_cast<int64_t>(values.size())}})};
  };
  for (const int64_t offset : {1, -1}) {
    world.reset_stats();
    std::vector<float> outgoing = {static_cast<float>(r), 0.25f, 0.5f}, incoming(3, -1.0f);
    std::vector<float> unrelated(3, 0.0f);
    Transfers transfers;
    transfers.start(world, offset, view_of(outgoing), view_of(incoming), "test/transfer");
    transfers.wait_touching(view_of(unrelated), nullptr);
    check(!transfers.empty(), "a transfer stays in flight while no op touches its memory");
    transfers.wait_touching(TensorView{incoming.data() + 1, DType::f32, shape_of({{"values", 1}})}, nullptr);
    check(transfers.empty(), "touching part of the received buffer waits for the transfer");
    const int from = static_cast<int>((r - offset + n) % n);
    check(incoming[0] == static_cast<float>(from) && incoming[1] == 0.25f && incoming[2] == 0.5f,
          "transfer from the rank " + std::to_string(offset) + " back");
    check_counter(world, CommCall::send, 1, 12.0, "transfer bytes sent");
    check(world.stats().total_bytes() == 12.0, "a transfer counts the bytes it sends");
  }
  // A chain: rank 0 only sends, the last rank only receives, the others both.
  world.reset_stats();
  std::vector<float> outgoing(2, static_cast<float>(r)), incoming(2, -1.0f);
  Transfers chain;
  const TensorView none;
  chain.start(world, 1, r + 1 < n ? view_of(outgoing) : none, r > 0 ? view_of(incoming) : none, "test/chain");
  chain.wait_all(nullptr);
  check(r == 0 ? incoming[0] == -1.0f : incoming[0] == static_cast<float>(r - 1), "one-sided transfers");
  check_counter(world, CommCall::send, r + 1 < n ? 1 : 0, r + 1 < n ? 8.0 : 0.0, "one-sided bytes sent");
}

void test_flags_and_hashes(Communicator& world) {
  const int n = world.size(), r = world.rank();
  check(world.any_rank_true(r == n - 1, "test/non_finite"), "any_rank_true with one rank true");
  check(!world.any_rank_true(false, "test/non_finite"), "any_rank_true with none true");

  bool threw = false;
  try {
    world.require_same_on_all_ranks(0x1234abcdULL, "binary hash");
  } catch (const MeshError&) {
    threw = true;
  }
  check(!threw, "require_same_on_all_ranks accepts equal hashes");

  std::string message;
  try {
    world.require_same_on_all_ranks(r == n - 1 ? 2 : 1, "config hash");
  } catch (const MeshError& error) {
    message = error.what();
  }
  const std::string odd_rank = "rank " + std::to_string(n - 1) + " have 0000000000000002";
  check(message.find("config hash") != std::string::npos && message.find(odd_rank) != std::string::npos,
        "require_same_on_all_ranks fails on every rank naming what and who: '" + message + "'");
}

void test_split(Communicator& world) {
  const int n = world.size(), r = world.rank();
  // Even and odd ranks, ordered by descending world rank.
  auto parity = world.split(r % 2, -r, "parity");
  std::vector<int> members;
  for (int i = n - 1; i >= 0; --i) {
    if (i % 2 == r % 2) members.push_back(i);
  }
  check(parity->size() == static_cast<int>(members.size()), "split size");
  check(parity->world_rank_of(parity->rank()) == r, "split world rank");
  std::vector<int32_t> gathered(members.size());
  int32_t mine = r;
  parity->all_gather(comm_buffer(&mine, 1), comm_buffer(gathered), "test/parity");
  check(std::vector<int>(gathered.begin(), gathered.end()) == members, "split orders by key");
  check(parity->axis_name() == "parity", "split axis name");
}

void test_mesh(Communicator& world) {
  const int n = world.size(), r = world.rank();
  world.set_context("step 7");
  int layouts = 0;
  for (int64_t data = 1; data <= n; ++data) {
    for (int64_t fsdp = 1; fsdp <= n; ++fsdp) {
      for (int64_t context = 1; context <= n; ++context) {
        if (n % (data * fsdp * context) != 0) continue;
        const int64_t tensor = n / (data * fsdp * context);
        const std::string layout = std::to_string(data) + "x" + std::to_string(fsdp) + "x" +
                                   std::to_string(context) + "x" + std::to_string(tensor);
        MeshCommunicators mesh = make_mesh_communicators(world, Mesh({{MeshAxis::data, data},
                                                                      {MeshAxis::fsdp, fsdp},
                                                                      {MeshAxis::context, context},
                                                                      {MeshAxis::tensor, tensor}}));
        ++layouts;
        const int64_t degrees[4] = {data, fsdp, context, tensor};
        int64_t coordinates[4] = {r / (tensor * context * fsdp), r / (tensor * context) % fsdp,
                                  r / tensor % context, r % tensor};
        const char* names[4] = {"data", "fsdp", "context", "tensor"};
        // The axes laid out here; mesh.expert stays 1.
        const MeshAxis axes[4] = {MeshAxis::data, MeshAxis::fsdp, MeshAxis::context, MeshAxis::tensor};
        for (int axis = 0; axis < 4; ++axis) {
          Communicator& comm = *mesh.at(axes[axis]);
          const std::string what = "mesh " + layout + " axis " + names[axis];
          check(comm.size() == degrees[axis] && comm.rank() == coordinates[axis], what + ": size and rank");
          check(comm.axis_name() == names[axis] && comm.context() == "step 7", what + ": name and context");
          // The group's members: this rank's coordinates with the axis's own running over its degree.
          std::vector<int32_t> expected;
          for (int64_t value = 0; value < degrees[axis]; ++value) {
            int64_t at[4] = {coordinates[0], coordinates[1], coordinates[2], coordinates[3]};
            at[axis] = value;
            expected.push_back(
                static_cast<int32_t>(((at[0] * fsdp + at[1]) * context + at[2]) * tensor + at[3]));
          }
          std::vector<int32_t> gathered(static_cast<size_t>(comm.size()));
          int32_t mine = r;
          comm.reset_stats();
          comm.all_gather(comm_buffer(&mine, 1), comm_buffer(gathered), "test/mesh");
          check(gathered == expected, what + ": members");
          check_counter(comm, CommCall::all_gather, 1, leaving(4.0 * comm.size(), comm.size()),
                        what + ": bytes");
        }
      }
    }
  }
  check(layouts >= 2, "mesh layouts enumerated");
  world.set_context("");

  std::string message;
  try {
    make_mesh_communicators(world, Mesh({{MeshAxis::data, n + 1}}));
  } catch (const MeshError& error) {
    message = error.what();
  }
  check(message.find("mesh") != std::string::npos &&
            message.find("data=" + std::to_string(n + 1)) != std::string::npos,
        "a mesh that does not match the world size is a user error: '" + message + "'");
}

void test_nonblocking(Communicator& world) {
  const int n = world.size(), r = world.rank();
  // Overlap: compute while a large all-reduce progresses, calling test() between "kernels".
  std::vector<float> gradients(1 << 20, static_cast<float>(r + 1));
  auto reduction = world.all_reduce_start(comm_buffer(gradients), ReduceOp::sum, "test/overlap");
  double busywork = 0.0;
  int kernels = 0;
  while (!reduction->test()) {
    for (int i = 0; i < 10000; ++i) busywork += std::sqrt(static_cast<double>(i + kernels));
    ++kernels;
  }
  reduction->wait();  // a no-op once complete
  const float expected = static_cast<float>(n * (n + 1) / 2);
  bool ok = busywork > 0.0;
  for (float value : gradients) ok &= value == expected;
  check(ok, "overlapped all_reduce");

  // Bucketed reduce-scatter: three outstanding at once, completed in reverse order.
  std::vector<std::vector<float>> buckets(3, std::vector<float>(static_cast<size_t>(4 * n)));
  std::vector<std::vector<float>> shards(3, std::vector<float>(4));
  std::vector<std::unique_ptr<CollectiveRequest>> pending;
  for (int b = 0; b < 3; ++b) {
    for (int i = 0; i < 4 * n; ++i)
      buckets[static_cast<size_t>(b)][static_cast<size_t>(i)] = static_cast<float>(b * 100 + i);
    pending.push_back(world.reduce_scatter_start(comm_buffer(buckets[static_cast<size_t>(b)]),
                                                 comm_buffer(shards[static_cast<size_t>(b)]), ReduceOp::sum,
                                                 "test/bucket" + std::to_string(b)));
  }
  for (int b = 2; b >= 0; --b) pending[static_cast<size_t>(b)]->wait();
  ok = true;
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < 4; ++j) {
      ok &= shards[static_cast<size_t>(b)][static_cast<size_t>(j)] ==
            static_cast<float>(n * (b * 100 + 4 * r + j));
    }
  }
  check(ok, "three outstanding reduce_scatters");

  // A request destroyed before it was waited for completes first.
  int32_t flag = r;
  { auto unwaited = world.all_reduce_start(comm_buffer(&flag, 1), ReduceOp::max, "test/unwaited"); }
  check(flag == n - 1, "destroying a request waits for it");

  // Chunked: MPI counts are int, so large buffers go in pieces; a small chunk size runs that path.
  testing::set_mpi_max_chunk_elements(7);
  std::vector<int32_t> chunked(50);
  for (int i = 0; i < 50; ++i) chunked[static_cast<size_t>(i)] = r * i;
  world.all_reduce(comm_buffer(chunked), ReduceOp::sum, "test/chunked");
  std::vector<int32_t> ring_out(50, r), ring_in(50, -1);
  auto receive = world.recv_start(comm_buffer(ring_in), (r + n - 1) % n, "test/chunked_ring");
  world.send(comm_buffer(ring_out), (r + 1) % n, "test/chunked_ring");
  receive->wait();
  testing::set_mpi_max_chunk_elements(2147483647);
  ok = true;
  for (int i = 0; i < 50; ++i) {
    ok &= chunked[static_cast<size_t>(i)] == (n * (n - 1) / 2) * i &&
          ring_in[static_cast<size_t>(i)] == (r + n - 1) % n;
  }
  check(ok, "chunked all_reduce and send/recv");
}

// The split kernels (plan.h's ActivationStash) on 2 and 4 ranks: GPipe's and 1F1B's orders of forward and
// backward give the fused step bitwise with FSDP's gathers and reduce-scatters, the tensor- and
// context-parallel collectives inside the kernels, and the data-axis reductions in update (which the fused
// step's last backward overlaps). Each rank compares its own loss sums, norms and stored parameters.
void test_split_kernels(Communicator& world) {
  const int n = world.size();
  if (n != 2 && n != 4) return;
  const std::vector<std::vector<std::string>> meshes =
      n == 2 ? std::vector<std::vector<std::string>>{{"mesh.data=2"},
                                                     {"mesh.fsdp=2"},
                                                     {"mesh.tensor=2"},
                                                     {"mesh.context=2"}}
             : std::vector<std::vector<std::string>>{{"mesh.data=2", "mesh.fsdp=2"},
                                                     {"mesh.data=2", "mesh.tensor=2"},
                                                     {"mesh.fsdp=2", "mesh.context=2"}};
  constexpr int64_t kMicroBatches = 4;
  for (const std::vector<std::string>& mesh : meshes) {
    std::vector<std::string> keys = {"gradient_accumulation_steps=4",
                                     "init_weights_seed=3",
                                     "mesh.data=1",
                                     "mesh.fsdp=1",
                                     "mesh.tensor=1",
                                     "mesh.context=1"};
    const Config config = testing::tiny_config(testing::with_overrides(keys, mesh));
    struct Step {
      double loss_sum = 0.0, grad_norm = 0.0;
      std::vector<float> parameters;
    };
    // Two steps of `gradients` on a plan with `slots` activation slots.
    const auto run = [&](const std::vector<ProgramEntry>* gradients, int64_t slots) {
      PlanRequest request;
      request.config = config;
      request.devices = n;
      request.activation_slots = slots;
      TrainingPlan plan = plan_training(request);
      MeshCommunicators axes = make_mesh_communicators(world, plan.mesh);
      Engine engine(std::move(plan), {&world, &axes});
      engine.set_poison_temporaries(true);
      std::vector<Step> steps;
      for (int64_t step = 0; step < 2; ++step) {
        const auto batches = [&](int64_t micro) {
          return testing::tiny_batch(engine.spec().dims, static_cast<uint64_t>(10 * step + micro));
        };
        const LossSums sums =
            engine.run_program(gradients ? *gradients : engine.plan().program.gradients, {batches}).sums;
        const ProgramInputs update{
            .micro_batch = nullptr, .valid_count = sums.valid_count, .learning_rate = 1e-2, .step = step};
        Step result{
            sums.loss_sum, engine.run_program(engine.plan().program.update, update).update.grad_norm, {}};
        for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {
          const TensorView value = engine.parameters().value(p);
          result.parameters.insert(result.parameters.end(), value.f32(), value.f32() + value.elements());
        }
        steps.push_back(std::move(result));
      }
      return steps;
    };
    const std::vector<Step> fused = run(nullptr, 0);
    check(fused[1].grad_norm > 0.0, "split kernels: the fused step's gradients are not zero");
    const std::vector<ProgramEntry> gpipe = testing::gpipe_gradients(kMicroBatches),
                                    one_f_one_b = testing::one_f_one_b_gradients(kMicroBatches, 2);
    for (const auto& [schedule, gradients, slots] :
         {std::tuple{"gpipe", &gpipe, kMicroBatches}, std::tuple{"1f1b", &one_f_one_b, int64_t{2}}}) {
      const std::vector<Step> split = run(gradients, slots);
      for (size_t step = 0; step < split.size(); ++step) {
        const std::string what = std::string("split kernels ") + schedule + " " + mesh.front() +
                                 (mesh.size() > 1 ? " " + mesh.back() : "") + " step " + std::to_string(step);
        check(split[step].loss_sum == fused[step].loss_sum, what + ": loss sum");
        check(split[step].grad_norm == fused[step].grad_norm, what + ": grad norm");
        check(split[step].parameters == fused[step].parameters, what + ": parameters");
      }
    }
  }
}

int run_all_tests() {
  auto world = make_world_communicator(60.0);
  world_rank = world->rank();
  check(world->size() >= 2,
        "started by mpirun with at least 2 ranks (size " + std::to_string(world->size()) + ")");
  const std::vector<std::pair<const char*, std::function<void(Communicator&)>>> tests = {
      {"all_reduce", test_all_reduce},
      {"all_gather", test_all_gather},
      {"reduce_scatter", test_reduce_scatter},
      {"all_to_all", test_all_to_all},
      {"send_recv", test_send_recv},
      {"transfers", test_transfers},
      {"flags_and_hashes", test_flags_and_hashes},
      {"split", test_split},
      {"mesh", test_mesh},
      {"nonblocking", test_nonblocking},
      {"split_kernels", test_split_kernels}};
  for (const auto& [name, test] : tests) {
    try {
      test(*world);
    } catch (const std::exception& error) {
      check(false, std::string(name) + " threw: " + error.what());
    }
  }
  std::vector<int64_t> totals = {checks_passed, checks_failed};
  world->all_reduce(comm_buffer(totals), ReduceOp::sum, "test/totals");
  if (world->rank() == 0) {
    std::printf("meshtrain_mpi_tests on %d ranks: %lld passed, %lld failed\n", world->size(),
                static_cast<long long>(totals[0]), static_cast<long long>(totals[1]));
  }
  return totals[1] == 0 ? 0 : 1;
}

// The failure case: `stall_rank` sleeps (or, with sleep_s < 0, returns from main as a rank-local error
// would) instead of joining 'update/grad_norm' at step 12.
int run_stall(int stall_rank, double timeout_s, const std::string& axis, double sleep_s) {
  auto world = make_world_communicator(timeout_s);
  world_rank = world->rank();
  world->barrier("start");
  MeshCommunicators mesh;
  Communicator* group = world.get();
  if (axis == "data") {  // data = size/2, tensor = 2
    mesh =
        make_mesh_communicators(*world, Mesh({{MeshAxis::data, world->size() / 2}, {MeshAxis::tensor, 2}}));
    group = mesh.at(MeshAxis::data).get();
  }
  world->set_context("step 12");
  float grad_norm_squared = 1.0f;
  group->all_reduce(comm_buffer(&grad_norm_squared, 1), ReduceOp::sum, "update/loss");
  if (world->rank() == stall_rank) {
    if (sleep_s < 0.0) return 3;
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  }
  group->all_reduce(comm_buffer(&grad_norm_squared, 1), ReduceOp::sum, "update/grad_norm");
  // Ranks outside the stalled group stay in ordinary code, so the group's own verdict is what ends the job.
  std::printf("rank %d: finished\n", world->rank());
  std::fflush(stdout);
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  return 0;
}

}  // namespace
}  // namespace meshtrain

int main(int argc, char** argv) {
  int stall_rank = -1;
  double timeout_s = 3.0, sleep_s = 30.0;
  std::string axis = "world";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--stall") {
      stall_rank = std::atoi(value.c_str());
    } else if (flag == "--timeout") {
      timeout_s = std::atof(value.c_str());
    } else if (flag == "--sleep") {
      sleep_s = std::atof(value.c_str());
    } else if (flag == "--axis") {
      axis = value;
    } else {
      std::fprintf(stderr,
                   "usage: meshtrain_mpi_tests [--stall RANK --timeout S --sleep S --axis world|data]\n");
      return 2;
    }
  }
  try {
    if (stall_rank >= 0) return meshtrain::run_stall(stall_rank, timeout_s, axis, sleep_s);
    return meshtrain::run_all_tests();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "meshtrain_mpi_tests: error: %s\n", error.what());
    return 1;
  }
}
