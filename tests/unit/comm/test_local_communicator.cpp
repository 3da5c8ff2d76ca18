// The one-process communicator: every collective is a copy or nothing and moves zero bytes, the mesh of a
// single process has four size-1 axes, and the helpers behave as they do on many ranks.
#include <gtest/gtest.h>

#include <vector>

#include "error_text.h"
#include "meshtrain/comm/communicator.h"

namespace meshtrain {
namespace {

using testing::error_of;

TEST(LocalCommunicator, CollectivesCopyAndMoveNoBytes) {
  LocalCommunicator world;
  EXPECT_EQ(world.rank(), 0);
  EXPECT_EQ(world.size(), 1);
  EXPECT_EQ(world.axis_name(), "world");

  std::vector<float> values = {1.5f, -2.0f};
  world.all_reduce(comm_buffer(values), ReduceOp::sum, "loss");
  EXPECT_EQ(values, (std::vector<float>{1.5f, -2.0f}));

  std::vector<int32_t> shard = {7, 8}, full(2, 0);
  world.all_gather(comm_buffer(shard), comm_buffer(full), "gather");
  EXPECT_EQ(full, shard);

  std::vector<double> gradients = {0.25, 0.5}, gradient_shard(2, 0.0);
  world.reduce_scatter(comm_buffer(gradients), comm_buffer(gradient_shard), ReduceOp::sum, "scatter");
  EXPECT_EQ(gradient_shard, gradients);

  std::vector<int64_t> input = {3, 4}, output(2, 0);
  world.all_to_all(comm_buffer(input), comm_buffer(output), "exchange");
  EXPECT_EQ(output, input);
  world.barrier("barrier");

  const CommunicatorStats stats = world.stats();
  EXPECT_EQ(stats[CommCall::all_reduce].calls, 1);
  EXPECT_EQ(stats[CommCall::all_gather].calls, 1);
  EXPECT_EQ(stats[CommCall::reduce_scatter].calls, 1);
  EXPECT_EQ(stats[CommCall::all_to_all].calls, 1);
  EXPECT_EQ(stats[CommCall::barrier].calls, 1);
  EXPECT_EQ(stats.total_calls(), 5);
  EXPECT_EQ(stats.total_bytes(), 0.0);  // (n-1)/n = 0 for one rank
  world.reset_stats();
  EXPECT_EQ(world.stats().total_calls(), 0);
}

TEST(LocalCommunicator, NonBlockingCallsCompleteAtOnce) {
  LocalCommunicator world;
  std::vector<float> shard = {1.0f}, full(1, 0.0f);
  auto request = world.all_gather_start(comm_buffer(shard), comm_buffer(full), "gather");
  EXPECT_TRUE(request->test());
  request->wait();
  EXPECT_EQ(full[0], 1.0f);
}

TEST(LocalCommunicator, SendToItselfReachesTheMatchingRecv) {
  LocalCommunicator world;
  std::vector<int32_t> sent = {1, 2, 3}, received(3, 0);
  world.send(comm_buffer(sent), 0, "ring");
  world.recv(comm_buffer(received), 0, "ring");
  EXPECT_EQ(received, sent);
  EXPECT_EQ(world.stats()[CommCall::send].calls, 1);
  EXPECT_EQ(world.stats()[CommCall::send].bytes, 0.0);  // never leaves the rank

  // A recv started first completes once the send is queued.
  auto receive = world.recv_start(comm_buffer(received), 0, "ring");
  EXPECT_FALSE(receive->test());
  std::vector<int32_t> next = {4, 5, 6};
  world.send(comm_buffer(next), 0, "ring");
  receive->wait();
  EXPECT_EQ(received, next);
}

TEST(LocalCommunicator, FlagsAndHashes) {
  LocalCommunicator world;
  EXPECT_TRUE(world.any_rank_true(true, "non_finite"));
  EXPECT_FALSE(world.any_rank_true(false, "non_finite"));
  EXPECT_EQ(error_of([&] { world.require_same_on_all_ranks(42, "binary hash"); }), "");
}

TEST(LocalCommunicator, TensorViewsAndElementTypes) {
  std::vector<float> data(6, 1.0f);
  const TensorView view{data.data(), DType::f32, shape_of({{"embed", 2}, {"mlp", 3}})};
  const CommBuffer buffer = comm_buffer(view);
  EXPECT_EQ(buffer.count, 6);
  EXPECT_EQ(buffer.element, CommElement::f32);
  EXPECT_EQ(buffer.bytes(), 24);
  EXPECT_EQ(comm_element_of(DType::bf16), CommElement::bf16);
  EXPECT_EQ(comm_element_bytes(CommElement::bf16), 2u);
  EXPECT_EQ(comm_element_bytes(CommElement::f64), 8u);
  double scalar = 0.0;
  EXPECT_EQ(comm_buffer(&scalar, 1).element, CommElement::f64);
}

TEST(LocalCommunicator, MeshOfOneProcess) {
  LocalCommunicator world;
  world.set_context("step 3");
  MeshCommunicators mesh = make_mesh_communicators(world, Mesh());
  for (MeshAxis axis : kMeshAxes) {
    EXPECT_EQ(mesh.at(axis)->size(), 1);
    EXPECT_EQ(mesh.at(axis)->rank(), 0);
    EXPECT_EQ(mesh.at(axis)->axis_name(), mesh_axis_name(axis));
    EXPECT_EQ(mesh.at(axis)->context(), "step 3");  // shared with the world it was split from
  }
  world.set_context("step 4");
  EXPECT_EQ(mesh.at(MeshAxis::data)->context(), "step 4");
}

TEST(LocalCommunicator, MeshThatDoesNotMatchTheWorldIsAUserError) {
  LocalCommunicator world;
  const std::string message = error_of([&] { make_mesh_communicators(world, Mesh({{MeshAxis::data, 2}})); });
  EXPECT_NE(message.find("mesh"), std::string::npos) << message;
  EXPECT_NE(message.find("data=2 x fsdp=1 x context=1 x expert=1 x tensor=1"), std::string::npos) << message;
  EXPECT_NE(message.find("number of ranks (1)"), std::string::npos) << message;
}

TEST(LocalCommunicator, WorldWithoutMpirunIsLocal) {
  if (started_by_mpi_launcher()) GTEST_SKIP() << "running under mpirun";
  auto world = make_world_communicator(5.0);
  EXPECT_EQ(world->size(), 1);
  EXPECT_EQ(world->host_ranks().size, 1);
  const std::string message = error_of([] { make_world_communicator(0.0); });
  EXPECT_NE(message.find("collective_timeout_s"), std::string::npos) << message;
}

}  // namespace
}  // namespace meshtrain
