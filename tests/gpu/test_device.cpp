// The cuda table's device entries on a GPU: device_resources describes the device the engine's checks
// (check_device_runs_plan) judge, and an arena larger than the free memory is refused as nullptr (the
// engine's message), not an abort, leaving the device usable.
#include <cstddef>
#include <string>

#include "gpu_test.h"
#include "meshtrain/kernels/cuda/gemm.h"

namespace meshtrain::gpu_test {
namespace {

// "... compute capability 9.0)" -> 9; -1 when the name does not say.
int compute_capability_major(const std::string& name) {
  const std::string key = "compute capability ";
  const size_t at = name.find(key);
  if (at == std::string::npos || at + key.size() >= name.size()) return -1;
  return std::stoi(name.substr(at + key.size()));
}

TEST(CudaDevice, ResourcesDescribeTheGpu) {
  MT_REQUIRE_GPU();
  const kernels::DeviceResources device = cuda().device_resources();
  const int major = compute_capability_major(device.name);
  ASSERT_GE(major, 1) << "the name does not give the compute capability: " << device.name;
  EXPECT_EQ(device.bf16, major >= 8) << device.name;
  EXPECT_GT(device.free_bytes, size_t{0}) << device.name;
  EXPECT_GE(device.overhead_bytes, kernels::cuda::gemm_workspace_bytes());
  // The free memory shrinks by an allocation's size (within the driver's 2 MiB granularity).
  constexpr size_t kBytes = size_t{256} << 20;
  void* held = cuda().memory_allocate(kBytes);
  ASSERT_NE(held, nullptr);
  const size_t free_while_held = cuda().device_resources().free_bytes;
  cuda().memory_free(held);
  EXPECT_LE(free_while_held + kBytes, device.free_bytes + (size_t{2} << 20)) << device.name;
}

TEST(CudaDevice, AnArenaPastTheFreeMemoryIsNullAndTheDeviceStaysUsable) {
  MT_REQUIRE_GPU();
  const size_t free_bytes = cuda().device_resources().free_bytes;
  EXPECT_EQ(cuda().memory_allocate(free_bytes + (size_t{1} << 30)), nullptr);
  void* small = cuda().memory_allocate(size_t{1} << 20);
  EXPECT_NE(small, nullptr) << "an allocation after the refused one failed";
  cuda().memory_free(small);
}

}  // namespace
}  // namespace meshtrain::gpu_test
