// The communicators of several processes on GPUs, on the one GPU of a device check: the host-staged
// communicator (comm/staged_communicator.h) over the cuda table's memory entries, and the NCCL communicator
// (comm/nccl_communicator.cpp, where built) as a one-rank group. One rank moves no bytes between ranks, so
// what these prove is the device side: which pointers count as device memory, the staging copies, NCCL's
// set-up, every call's launch, and the order between the compute stream and NCCL's (a buffer a kernel
// writes just before a collective reaches it, and a kernel just after its completion sees the result).
// Several ranks: tests/mpi/test_staged_communicator.cpp (on the cpu, a fake device) and tests/gpu/run.sh.
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/comm/communicator.h"
#include "meshtrain/comm/staged_communicator.h"

#ifdef MESHTRAIN_WITH_NCCL
extern "C" meshtrain::Communicator* meshtrain_nccl_communicator(meshtrain::Communicator* mpi);
#endif

namespace meshtrain::gpu_test {
namespace {

std::unique_ptr<Communicator> staged_one_rank() {
  return stage_through_host(std::make_unique<LocalCommunicator>(),
                            {cuda().memory_is_device, cuda().memory_copy_in, cuda().memory_copy_out});
}

TEST(GpuCommunicators, DeviceMemoryIsToldFromHostMemory) {
  MT_REQUIRE_GPU();
  DeviceBuffer<float> device(std::vector<float>(5, 1.0f));
  std::vector<float> heap(5);
  float stack = 0.0f;
  EXPECT_TRUE(cuda().memory_is_device(device.get()));
  EXPECT_TRUE(cuda().memory_is_device(device.get() + 3));  // inside an allocation, as a shard of the arena
  EXPECT_FALSE(cuda().memory_is_device(heap.data()));
  EXPECT_FALSE(cuda().memory_is_device(&stack));
  EXPECT_GE(cuda().device_count(), 1);
}

// Every call of one rank over device buffers: each result is its input, copied through host memory.
void check_one_rank_calls(Communicator& comm, const std::string& what) {
  const std::vector<float> values = normal_values(1001, 7);
  DeviceBuffer<float> reduced(values);
  comm.all_reduce({reduced.get(), 1001, CommElement::f32}, ReduceOp::sum, "test/all_reduce");
  EXPECT_EQ(reduced.read(), values) << what << ": all_reduce";

  DeviceBuffer<float> shard(std::vector<float>(values.begin(), values.begin() + 13));
  DeviceBuffer<float> full(13);
  comm.all_gather({shard.get(), 13, CommElement::f32}, {full.get(), 13, CommElement::f32}, "test/all_gather");
  EXPECT_EQ(full.read(), std::vector<float>(values.begin(), values.begin() + 13)) << what << ": all_gather";

  DeviceBuffer<float> scattered(13);
  comm.reduce_scatter({full.get(), 13, CommElement::f32}, {scattered.get(), 13, CommElement::f32},
                      ReduceOp::sum, "test/reduce_scatter");
  EXPECT_EQ(scattered.read(), full.read()) << what << ": reduce_scatter";

  DeviceBuffer<int32_t> input(std::vector<int32_t>{4, -5, 6}), output(3);
  comm.all_to_all({input.get(), 3, CommElement::i32}, {output.get(), 3, CommElement::i32}, "test/all_to_all");
  EXPECT_EQ(output.read(), (std::vector<int32_t>{4, -5, 6})) << what << ": all_to_all";

  // A message to itself: the receive first (the engine's transfers start it first), then the send.
  DeviceBuffer<float> sent(values), received(1001);
  auto receive = comm.recv_start({received.get(), 1001, CommElement::f32}, 0, "test/ring");
  auto send = comm.send_start({sent.get(), 1001, CommElement::f32}, 0, "test/ring");
  send->wait();
  receive->wait();
  EXPECT_EQ(received.read(), values) << what << ": send / recv to itself";

  double host_scalar = 2.5;  // host memory passes to the wrapped communicator
  comm.all_reduce(comm_buffer(&host_scalar, 1), ReduceOp::sum, "test/host");
  EXPECT_EQ(host_scalar, 2.5) << what;
  EXPECT_EQ(comm.stats()[CommCall::all_reduce].calls, 2) << what;
  EXPECT_EQ(comm.stats().total_bytes(), 0.0) << what << ": one rank sends nothing";
}

TEST(GpuCommunicators, StagedCallsOfOneRankOnTheDevice) {
  MT_REQUIRE_GPU();
  std::unique_ptr<Communicator> comm = staged_one_rank();
  check_one_rank_calls(*comm, "staged");
}

#ifdef MESHTRAIN_WITH_NCCL
std::unique_ptr<Communicator> nccl_one_rank() {
  return std::unique_ptr<Communicator>(meshtrain_nccl_communicator(new LocalCommunicator()));
}

TEST(GpuCommunicators, NcclCallsOfOneRank) {
  MT_REQUIRE_GPU();
  std::unique_ptr<Communicator> comm = nccl_one_rank();
  check_one_rank_calls(*comm, "nccl");
  // A split is a new NCCL communicator over the split's ranks.
  std::unique_ptr<Communicator> data = comm->split(0, 0, "data");
  EXPECT_EQ(data->axis_name(), "data");
  DeviceBuffer<float> values(std::vector<float>{1.0f, 2.0f});
  data->all_reduce({values.get(), 2, CommElement::f32}, ReduceOp::max, "test/split");
  EXPECT_EQ(values.read(), (std::vector<float>{1.0f, 2.0f}));
}

// NCCL runs on a stream of its own: it must wait for the kernels queued before it, and the kernels after
// its completion must see its result. A fill kernel writes the shard without a host synchronisation, a
// non-blocking all-gather copies it into the full buffer (out of place: one rank's in-place call may move
// nothing), then a residual add on the compute stream reads the gathered buffer.
TEST(GpuCommunicators, NcclOrdersAgainstTheComputeStream) {
  MT_REQUIRE_GPU();
  std::unique_ptr<Communicator> comm = nccl_one_rank();
  const size_t count = size_t{1} << 24;  // 64 MB: long enough for a missing wait to show
  DeviceBuffer<float> shard(count), full(count), sum(count);
  cuda().memory_fill(shard.get(), 0x3f, count * sizeof(float));  // 0x3f3f3f3f = 0.7470...
  auto request =
      comm->all_gather_start({shard.get(), static_cast<int64_t>(count), CommElement::f32},
                             {full.get(), static_cast<int64_t>(count), CommElement::f32}, "test/ordered");
  request->wait();
  cuda().residual_add(sum.get(), full.get(), static_cast<int64_t>(count));  // sum += full
  float filled = 0.0f;
  const uint32_t bits = 0x3f3f3f3fu;
  std::memcpy(&filled, &bits, sizeof(filled));
  const std::vector<float> result = sum.read();
  size_t wrong = 0;
  for (float value : result) wrong += value != filled;
  EXPECT_EQ(wrong, 0u) << "elements of the gathered buffer the next kernel did not see as filled";
}
#endif

}  // namespace
}  // namespace meshtrain::gpu_test
