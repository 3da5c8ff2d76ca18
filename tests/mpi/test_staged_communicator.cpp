// Multi-process test of the host-staged communicator (comm/staged_communicator.h), run under mpirun with 2-4
// ranks: the ranks keep their buffers on a fake device, memory the host may not touch (mprotect'ed to no
// access; only the device's copy entries open it for their memcpy), so MPI reading or writing a device
// buffer in place would crash the test. Every collective over device buffers must give, bit for bit, what
// the plain MPI communicator gives over host copies of the same values, and count the same calls and bytes.
// Then the engine trains two steps on the meshes of several layouts through staged communicators against
// the plain MPI run: the losses, gradient norms, parameters and each axis's bytes must be the same bit for
// bit. Where the dense kernels run it all (data, fsdp, tensor), its arena is the guarded one of
// tests/unit/kernels/guarded_backend.h, which the host may touch only inside a table entry, as on a GPU;
// context attention's kernels are not guarded, so the context meshes stage every buffer instead (each
// pointer counts as device memory, its copies a memcpy).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/guarded_backend.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/staged_communicator.h"
#include "meshtrain/core/dtype.h"
#include "meshtrain/core/error.h"
#include "meshtrain/runtime/engine.h"
#include "mpi_checks.h"
#include "plan/tiny_plan.h"
#include "tiny_batch.h"

namespace meshtrain {
namespace {

using mpi_test::check;
using mpi_test::checks_failed;
using mpi_test::checks_passed;
using mpi_test::world_rank;

// The fake device: one mapping, no access from the host except inside the copy entries.
struct FakeDevice {
  uint8_t* base = nullptr;
  size_t bytes = 0;
  size_t used = 0;
  int64_t copies_in = 0, copies_out = 0;
} device;

void device_open(size_t bytes) {
  void* mapping = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  MT_CHECK(mapping != MAP_FAILED, "mmap of the fake device");
  device.base = static_cast<uint8_t*>(mapping);
  device.bytes = bytes;
}

// Opens the pages of [pointer, pointer + bytes) for one memcpy, then closes the whole device again.
void device_access(const void* pointer, size_t bytes, bool open) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(pointer) / page * page;
  const auto end = reinterpret_cast<uintptr_t>(pointer) + bytes;
  MT_CHECK(
      mprotect(reinterpret_cast<void*>(begin), end - begin, open ? PROT_READ | PROT_WRITE : PROT_NONE) == 0,
      "mprotect of the fake device");
}

bool device_is_device(const void* pointer) {
  const auto* bytes = static_cast<const uint8_t*>(pointer);
  return bytes >= device.base && bytes < device.base + device.bytes;
}

void device_copy_in(void* to, const void* from, size_t bytes) {
  MT_CHECK(device_is_device(to) && device_is_device(static_cast<uint8_t*>(to) + bytes - 1), "copy_in target");
  device_access(to, bytes, true);
  std::memcpy(to, from, bytes);
  device_access(to, bytes, false);
  ++device.copies_in;
}

void device_copy_out(void* to, const void* from, size_t bytes) {
  MT_CHECK(device_is_device(from) && device_is_device(static_cast<const uint8_t*>(from) + bytes - 1),
           "copy_out source");
  device_access(from, bytes, true);
  std::memcpy(to, from, bytes);
  device_access(from, bytes, false);
  ++device.copies_out;
}

const DeviceMemoryAccess kFakeDeviceMemory{device_is_device, device_copy_in, device_copy_out};

// Device memory for `values`, filled with them.
template <class T>
T* to_device(const std::vector<T>& values) {
  const size_t bytes = values.size() * sizeof(T);
  const size_t aligned = (bytes + 63) / 64 * 64;
  MT_CHECK(device.used + aligned <= device.bytes, "fake device full");
  T* pointer = reinterpret_cast<T*>(device.base + device.used);
  device.used += aligned;
  if (bytes > 0) device_copy_in(pointer, values.data(), bytes);
  return pointer;
}

template <class T>
std::vector<T> from_device(const T* pointer, size_t count) {
  std::vector<T> values(count);
  if (count > 0) device_copy_out(values.data(), pointer, count * sizeof(T));
  return values;
}

// Values that differ by rank and position and whose sums round (float) or overflow 32 bits (int64).
template <class T>
std::vector<T> rank_values(int rank, size_t count, int salt) {
  std::vector<T> values(count);
  for (size_t i = 0; i < count; ++i) {
    const double x = 0.37 * (rank + 1) * static_cast<double>((i * 7 + static_cast<size_t>(salt)) % 23) -
                     0.011 * static_cast<double>(i) + 1e-3 * salt;
    if constexpr (std::is_same_v<T, int64_t>) {
      values[i] = static_cast<int64_t>(x * 1e9) + (int64_t{1} << 33);
    } else {
      values[i] = static_cast<T>(x);
    }
  }
  return values;
}

std::vector<uint16_t> rank_bf16(int rank, size_t count, int salt) {
  std::vector<uint16_t> values(count);
  const std::vector<float> floats = rank_values<float>(rank, count, salt);
  for (size_t i = 0; i < count; ++i) values[i] = bfloat16_from_float(floats[i]);
  return values;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void check_same_counters(const Communicator& plain, const Communicator& staged, const std::string& what) {
  for (int call = 0; call < kCommCallCount; ++call) {
    const CommCallStats a = plain.stats()[static_cast<CommCall>(call)];
    const CommCallStats b = staged.stats()[static_cast<CommCall>(call)];
    check(a.calls == b.calls && a.bytes == b.bytes,
          what + ": " + comm_call_name(static_cast<CommCall>(call)) + " counted " + std::to_string(b.calls) +
              " calls, " + std::to_string(b.bytes) + " bytes staged against " + std::to_string(a.calls) +
              ", " + std::to_string(a.bytes) + " plain");
  }
}

// Each collective over device buffers (staged) against the same values in host buffers (plain MPI).
void test_collectives(Communicator& plain, Communicator& staged) {
  const int n = plain.size(), r = plain.rank();
  plain.reset_stats();
  staged.reset_stats();

  {  // all_reduce: an odd count, every reduced element type
    std::vector<float> host = rank_values<float>(r, 1001, 1);
    float* on_device = to_device(host);
    plain.all_reduce(comm_buffer(host), ReduceOp::sum, "test/f32_sum");
    staged.all_reduce({on_device, 1001, CommElement::f32}, ReduceOp::sum, "test/f32_sum");
    check(same_bits(from_device(on_device, 1001), host), "all_reduce f32 sum");

    std::vector<uint16_t> bf16 = rank_bf16(r, 37, 2);
    uint16_t* bf16_on_device = to_device(bf16);
    plain.all_reduce({bf16.data(), 37, CommElement::bf16}, ReduceOp::max, "test/bf16_max");
    staged.all_reduce({bf16_on_device, 37, CommElement::bf16}, ReduceOp::max, "test/bf16_max");
    check(same_bits(from_device(bf16_on_device, 37), bf16), "all_reduce bf16 max");

    std::vector<int64_t> wide = rank_values<int64_t>(r, 5, 3);
    int64_t* wide_on_device = to_device(wide);
    plain.all_reduce(comm_buffer(wide), ReduceOp::sum, "test/i64_sum");
    staged.all_reduce({wide_on_device, 5, CommElement::i64}, ReduceOp::sum, "test/i64_sum");
    check(same_bits(from_device(wide_on_device, 5), wide), "all_reduce i64 sum");

    // A host scalar passes through: the loss sums and flags the engine reduces in host memory.
    double plain_scalar = 0.5 + r, staged_scalar = 0.5 + r;
    plain.all_reduce(comm_buffer(&plain_scalar, 1), ReduceOp::sum, "test/host_scalar");
    staged.all_reduce(comm_buffer(&staged_scalar, 1), ReduceOp::sum, "test/host_scalar");
    check(plain_scalar == staged_scalar && staged_scalar == 0.5 * n + n * (n - 1) / 2.0,
          "all_reduce of a host scalar through the staged communicator");
  }

  {  // all_gather: a separate shard, a shard in its own slot of the full buffer (ZeRO-1), a host shard
    const size_t shard = 13;
    const std::vector<float> mine = rank_values<float>(r, shard, 4);
    std::vector<float> full(shard * static_cast<size_t>(n), -1.0f);
    plain.all_gather(comm_buffer(mine), comm_buffer(full), "test/gather");
    const float* shard_on_device = to_device(mine);
    float* full_on_device = to_device(std::vector<float>(full.size(), -2.0f));
    staged.all_gather({const_cast<float*>(shard_on_device), static_cast<int64_t>(shard), CommElement::f32},
                      {full_on_device, static_cast<int64_t>(full.size()), CommElement::f32}, "test/gather");
    check(same_bits(from_device(full_on_device, full.size()), full), "all_gather of a device shard");

    std::vector<float> in_place(full.size(), -3.0f);
    std::copy(mine.begin(), mine.end(), in_place.begin() + static_cast<std::ptrdiff_t>(shard * r));
    float* in_place_on_device = to_device(in_place);
    staged.all_gather(
        {in_place_on_device + shard * static_cast<size_t>(r), static_cast<int64_t>(shard), CommElement::f32},
        {in_place_on_device, static_cast<int64_t>(full.size()), CommElement::f32}, "test/in_place");
    plain.all_gather(
        {in_place.data() + shard * static_cast<size_t>(r), static_cast<int64_t>(shard), CommElement::f32},
        comm_buffer(in_place), "test/in_place");
    check(same_bits(from_device(in_place_on_device, full.size()), in_place) && same_bits(in_place, full),
          "all_gather of a shard in its own slot of the device buffer");

    float* mixed_on_device = to_device(std::vector<float>(full.size(), -4.0f));
    staged.all_gather(comm_buffer(mine),
                      {mixed_on_device, static_cast<int64_t>(full.size()), CommElement::f32},
                      "test/host_shard");
    plain.all_gather(comm_buffer(mine), comm_buffer(full), "test/host_shard");
    check(same_bits(from_device(mixed_on_device, full.size()), full),
          "all_gather of a host shard to the device");
  }

  {  // reduce_scatter (f32 sums round: the same order as MPI's own) and all_to_all
    const size_t block = 9;
    std::vector<float> full = rank_values<float>(r, block * static_cast<size_t>(n), 5);
    std::vector<float> shard(block, -1.0f);
    const float* full_on_device = to_device(full);
    float* shard_on_device = to_device(shard);
    plain.reduce_scatter(comm_buffer(full), comm_buffer(shard), ReduceOp::sum, "test/scatter");
    staged.reduce_scatter(
        {const_cast<float*>(full_on_device), static_cast<int64_t>(full.size()), CommElement::f32},
        {shard_on_device, static_cast<int64_t>(block), CommElement::f32}, ReduceOp::sum, "test/scatter");
    check(same_bits(from_device(shard_on_device, block), shard), "reduce_scatter f32 sum");
    check(same_bits(from_device(full_on_device, full.size()), full), "reduce_scatter leaves its input");

    std::vector<int32_t> input(static_cast<size_t>(3 * n)), output(input.size(), -1);
    for (size_t i = 0; i < input.size(); ++i) input[i] = 1000 * r + static_cast<int32_t>(i);
    const int32_t* input_on_device = to_device(input);
    int32_t* output_on_device = to_device(output);
    plain.all_to_all(comm_buffer(input), comm_buffer(output), "test/all_to_all");
    staged.all_to_all(
        {const_cast<int32_t*>(input_on_device), static_cast<int64_t>(input.size()), CommElement::i32},
        {output_on_device, static_cast<int64_t>(output.size()), CommElement::i32}, "test/all_to_all");
    check(same_bits(from_device(output_on_device, output.size()), output), "all_to_all blocks");
  }

  {  // a ring pass each way (ring attention's send / recv), non-blocking, between device buffers
    const int next = (r + 1) % n, previous = (r + n - 1) % n;
    const std::vector<float> outgoing = rank_values<float>(r, 21, 6);
    std::vector<float> incoming(21, -1.0f);
    auto plain_receive = plain.recv_start(comm_buffer(incoming), previous, "test/ring");
    plain.send(comm_buffer(outgoing), next, "test/ring");
    plain_receive->wait();
    const float* outgoing_on_device = to_device(outgoing);
    float* incoming_on_device = to_device(std::vector<float>(21, -2.0f));
    auto staged_receive =
        staged.recv_start({incoming_on_device, 21, CommElement::f32}, previous, "test/ring");
    auto staged_send =
        staged.send_start({const_cast<float*>(outgoing_on_device), 21, CommElement::f32}, next, "test/ring");
    staged_send->wait();
    staged_receive->wait();
    check(same_bits(from_device(incoming_on_device, 21), incoming), "send / recv ring of device buffers");
  }
  staged.barrier("test/barrier");
  plain.barrier("test/barrier");
  check_same_counters(plain, staged, "every collective");
}

// A non-blocking all-reduce over a device buffer: its result reaches the device when test() or wait()
// finds it complete, not before (the engine overlaps gradient buckets with the backward pass this way).
void test_nonblocking(Communicator& staged) {
  const int n = staged.size(), r = staged.rank();
  std::vector<float> expected(64);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<float>(n * (n - 1) / 2 + n * i);
  std::vector<float> mine(64);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<float>(r + static_cast<int>(i));
  float* on_device = to_device(mine);
  const int64_t copies_in_before = device.copies_in;
  auto request = staged.all_reduce_start({on_device, 64, CommElement::f32}, ReduceOp::sum, "test/overlap");
  check(device.copies_in == copies_in_before, "no copy to the device before the call completes");
  while (!request->test()) {
  }
  check(device.copies_in == copies_in_before + 1, "one copy to the device once test() finds it complete");
  check(request->test(), "test() stays true");
  request->wait();
  check(device.copies_in == copies_in_before + 1, "wait() after completion copies nothing again");
  check(same_bits(from_device(on_device, 64), expected), "non-blocking all_reduce result on the device");
}

// Splits of a staged communicator are staged too (the mesh axes are splits of the world).
void test_split(Communicator& plain, Communicator& staged) {
  const int r = plain.rank();
  std::unique_ptr<Communicator> plain_pairs = plain.split(r / 2, r, "pairs");
  std::unique_ptr<Communicator> staged_pairs = staged.split(r / 2, r, "pairs");
  check(staged_pairs->size() == plain_pairs->size() && staged_pairs->rank() == plain_pairs->rank() &&
            staged_pairs->axis_name() == "pairs" &&
            staged_pairs->world_rank_of(0) == plain_pairs->world_rank_of(0),
        "a split's ranks and name");
  std::vector<float> host = rank_values<float>(r, 17, 7);
  float* on_device = to_device(host);
  plain_pairs->all_reduce(comm_buffer(host), ReduceOp::sum, "test/pairs");
  staged_pairs->all_reduce({on_device, 17, CommElement::f32}, ReduceOp::sum, "test/pairs");
  check(same_bits(from_device(on_device, 17), host), "all_reduce on a split of device buffers");
  staged.set_context("step 7");
  check(staged_pairs->context() == "step 7", "a split shares the failure context");
}

// Every pointer counts as device memory, its copies a memcpy: the engine's arena stays host memory its cpu
// kernels can run on, and each collective goes through the staging copies.
bool everything_is_device(const void* /*pointer*/) {
  return true;
}
void memcpy_in(void* to, const void* from, size_t bytes) {
  std::memcpy(to, from, bytes);
}
void memcpy_out(void* to, const void* from, size_t bytes) {
  std::memcpy(to, from, bytes);
}

void test_engine_layouts() {
  const kernels::KernelBackend& guarded = testing::guarded_backend();
  std::unique_ptr<Communicator> plain_world = make_mpi_world_communicator(60.0);
  std::unique_ptr<Communicator> guarded_world =
      stage_through_host(make_mpi_world_communicator(60.0),
                         {guarded.memory_is_device, guarded.memory_copy_in, guarded.memory_copy_out});
  std::unique_ptr<Communicator> all_staged_world =
      stage_through_host(make_mpi_world_communicator(60.0), {everything_is_device, memcpy_in, memcpy_out});
  const int n = plain_world->size();
  if (n != 2 && n != 4) return;
  const std::vector<std::vector<std::string>> meshes =
      n == 2
          ? std::vector<std::vector<std::string>>{{"mesh.data=2"},
                                                  {"mesh.fsdp=2"},
                                                  {"mesh.tensor=2"},
                                                  {"mesh.context=2", "context_parallel_strategy=all_gather"},
                                                  {"mesh.context=2", "context_parallel_strategy=ring"}}
          : std::vector<std::vector<std::string>>{
                {"mesh.data=2", "mesh.fsdp=2"},
                {"mesh.data=2", "mesh.tensor=2"},
                {"mesh.fsdp=2", "mesh.tensor=2"},
                {"mesh.fsdp=2", "mesh.context=2"},
                {"mesh.data=2", "mesh.fsdp=2", "shard_optimizer_over_data=true"}};
  for (const std::vector<std::string>& mesh : meshes) {
    bool context = false;
    for (const std::string& key : mesh) context |= key.starts_with("mesh.context");
    std::vector<std::string> keys = {"gradient_accumulation_steps=2",
                                     "init_weights_seed=3",
                                     "mesh.data=1",
                                     "mesh.fsdp=1",
                                     "mesh.tensor=1",
                                     "mesh.context=1"};
    const Config config = testing::tiny_config(testing::with_overrides(keys, mesh));
    struct Steps {
      std::vector<double> loss_sums, grad_norms;
      std::vector<float> parameters;
      std::map<std::string, double> bytes;
    };
    const auto train = [&](Communicator& world, const kernels::KernelBackend* table) {
      PlanRequest request;
      request.config = config;
      request.devices = n;
      TrainingPlan plan = plan_training(request);
      if (table != nullptr) plan.spec.kernels = table;
      MeshCommunicators axes = make_mesh_communicators(world, plan.mesh);
      Engine engine(std::move(plan), {&world, &axes});
      Steps steps;
      for (int64_t step = 0; step < 2; ++step) {
        const auto batches = [&](int64_t micro) {
          return testing::tiny_batch(engine.spec().dims, static_cast<uint64_t>(10 * step + micro));
        };
        const LossSums sums = engine.run_program(engine.plan().program.gradients, {batches}).sums;
        const ProgramInputs update{
            .micro_batch = nullptr, .valid_count = sums.valid_count, .learning_rate = 1e-2, .step = step};
        steps.loss_sums.push_back(sums.loss_sum);
        steps.grad_norms.push_back(engine.run_program(engine.plan().program.update, update).update.grad_norm);
      }
      for (size_t p = 0; p < engine.spec().parameters.size(); ++p) {  // through the table: a device's memory
        const TensorView value = engine.parameters().value(p);
        std::vector<float> host(static_cast<size_t>(value.elements()));
        engine.backend().memory_copy_out(host.data(), value.f32(), host.size() * sizeof(float));
        steps.parameters.insert(steps.parameters.end(), host.begin(), host.end());
      }
      steps.bytes = engine.collective_bytes();
      return steps;
    };
    const Steps plain = train(*plain_world, nullptr);
    const Steps staged = context ? train(*all_staged_world, nullptr) : train(*guarded_world, &guarded);
    std::string what = context ? "engine, every buffer staged," : "engine on a guarded arena,";
    for (const std::string& key : mesh) what += " " + key;
    check(plain.grad_norms.back() > 0.0, what + ": the gradients are not zero");
    check(staged.loss_sums == plain.loss_sums, what + ": loss sums");
    check(staged.grad_norms == plain.grad_norms, what + ": grad norms");
    check(staged.parameters == plain.parameters, what + ": parameters");
    check(staged.bytes == plain.bytes && !plain.bytes.empty(), what + ": bytes per mesh axis");
  }
}

int run() {
  std::unique_ptr<Communicator> plain = make_mpi_world_communicator(60.0);
  std::unique_ptr<Communicator> staged =
      stage_through_host(make_mpi_world_communicator(60.0), kFakeDeviceMemory);
  world_rank = plain->rank();
  device_open(size_t{1} << 20);
  check(staged->rank() == plain->rank() && staged->size() == plain->size(), "the staged world's ranks");
  test_collectives(*plain, *staged);
  // MPI splits large calls into int-sized chunks: the staged copies go through the same path.
  testing::set_mpi_max_chunk_elements(100);
  test_collectives(*plain, *staged);
  testing::set_mpi_max_chunk_elements(INT32_MAX);
  test_nonblocking(*staged);
  test_split(*plain, *staged);
  test_engine_layouts();

  int64_t failed = checks_failed;
  plain->all_reduce(comm_buffer(&failed, 1), ReduceOp::sum, "test/failures");
  if (world_rank == 0) {
    std::printf("staged communicator, %d ranks: %lld checks passed here, %lld failed on all ranks\n",
                plain->size(), static_cast<long long>(checks_passed), static_cast<long long>(failed));
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace
}  // namespace meshtrain

int main() {
  try {
    return meshtrain::run();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "meshtrain_mpi_staged_tests: error: %s\n", error.what());
    return 1;
  }
}
