// What every GPU test shares: the skip rule (no visible GPU: each test skips, naming why) and device
// buffers filled from and read back into host vectors through the cuda table's memory entries. Each test
// runs a CUDA kernel and the cpu kernel of the same name on the same inputs and compares the results.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/kernels/cpu/backend.h"
#include "meshtrain/kernels/cuda/backend.h"

namespace meshtrain::gpu_test {

inline const kernels::KernelBackend& cuda() {
  return kernels::cuda::cuda_backend();
}

#define MT_REQUIRE_GPU()                                                                 \
  do {                                                                                   \
    const std::string why = ::meshtrain::gpu_test::cuda().device_check();                \
    if (!why.empty()) GTEST_SKIP() << "SKIP: no GPU for the CUDA kernel tests: " << why; \
  } while (0)

// A device allocation holding a copy of a host vector (or zeros); read() copies it back.
template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : count_(host.size()) {
    data_ = static_cast<T*>(cuda().memory_allocate(bytes()));
    if (!host.empty()) {  // an empty vector's data() may be null: nothing to copy
      cuda().memory_copy_in(data_, host.data(), host.size() * sizeof(T));
    }
  }
  explicit DeviceBuffer(size_t count) : count_(count) {
    data_ = static_cast<T*>(cuda().memory_allocate(bytes()));  // zeroed
  }
  ~DeviceBuffer() { cuda().memory_free(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return data_; }
  std::vector<T> read() const {
    std::vector<T> host(count_);
    if (count_ > 0) cuda().memory_copy_out(host.data(), data_, count_ * sizeof(T));
    return host;
  }

 private:
  size_t bytes() const { return (count_ == 0 ? 1 : count_) * sizeof(T); }
  size_t count_;
  T* data_ = nullptr;
};

inline std::vector<float> normal_values(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(count);
  for (float& value : values) value = normal(generator);
  return values;
}

// |gpu - cpu| <= tolerance * (1 + |cpu|) for every element, reporting the worst one.
inline void expect_close(const std::vector<float>& gpu, const std::vector<float>& cpu, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  double worst = 0.0;
  size_t worst_at = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double error = std::abs(static_cast<double>(gpu[i]) - cpu[i]) / (1.0 + std::abs(cpu[i]));
    if (!(error <= worst)) {  // NaN counts as worst
      worst = error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << worst_at << " gpu " << gpu[worst_at] << " cpu "
                              << cpu[worst_at];
}

// `count` NaNs: the start of an output every element of which the kernel must write.
inline std::vector<float> nan_filled(int64_t count) {
  return std::vector<float>(static_cast<size_t>(count), std::numeric_limits<float>::quiet_NaN());
}

// Every element bitwise equal (NaN payloads included): a result run twice (fixed reduction orders), or a
// copy. Reports the first difference and the count.
inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                             const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t differing = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      if (differing == 0) first = i;
      ++differing;
    }
  }
  EXPECT_EQ(differing, 0u) << what << ": first at " << first << " (" << a[first] << " vs " << b[first] << ")";
}

}  // namespace meshtrain::gpu_test
