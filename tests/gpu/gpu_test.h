// What every GPU test shares: the skip rule (no visible GPU: each test skips, naming why) and device
// buffers filled from and read back into host vectors through the cuda table's memory entries. Each test
// runs a CUDA kernel and the cpu kernel of the same name on the same inputs and compares the results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/core/dtype.h"
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
    if (std::isnan(worst)) break;  // the first NaN stays the worst (a later element must not replace it)
    if (!(error <= worst)) {       // NaN counts as worst
      worst = error;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, tolerance) << what << ": element " << worst_at << " gpu " << gpu[worst_at] << " cpu "
                              << cpu[worst_at];
}

// ---- bf16 outputs (the *_forward_bf16 producers) ----------------------------------------------------------

// What a bf16 output holds before the kernel runs: a NaN pattern that rounding a finite value never gives, so
// an element left at it was not written.
constexpr uint16_t kBf16Unwritten = 0xFFFF;
// Elements past the end of a bf16 output, which the kernel must leave at kBf16Unwritten.
constexpr size_t kBf16Guard = 37;

// Each value's bf16 bits, nearest even (the cpu kernels' rounding, core/dtype.h).
inline std::vector<uint16_t> bf16_rounded(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bfloat16_from_float(values[i]);
  return bits;
}

// Runs produce(out) on a device output of `count` bf16 elements (pre-filled with kBf16Unwritten, kBf16Guard
// more behind it) and returns the count elements; fails where an element past them changed.
template <class Produce>
std::vector<uint16_t> run_bf16_output(size_t count, Produce produce, const std::string& what) {
  const DeviceBuffer<uint16_t> out(std::vector<uint16_t>(count + kBf16Guard, kBf16Unwritten));
  produce(out.get());
  std::vector<uint16_t> values = out.read();
  size_t touched = 0;
  for (size_t i = count; i < values.size(); ++i) touched += values[i] == kBf16Unwritten ? 0 : 1;
  EXPECT_EQ(touched, 0u) << what << ": written past its " << count << " elements";
  values.resize(count);
  return values;
}

// A bf16 output against the cpu kernel's: the float32 results behind them differ by at most `tolerance` on
// expect_close's metric, and each was rounded once (at most half a bf16 ulp), so |gpu - cpu| <= one bf16 ulp
// (at the larger of the two) + tolerance (1 + |cpu|) for every element. Reports the worst element and how
// many differ at all; an unwritten element or a NaN counts as worst.
inline void expect_bf16_close(const std::vector<uint16_t>& gpu, const std::vector<uint16_t>& cpu,
                              double tolerance, const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  const auto ulp_at = [](uint16_t bits) {  // the spacing of bf16 values at |value|
    const auto magnitude = static_cast<uint16_t>(bits & 0x7fffu);
    return static_cast<double>(float_from_bfloat16(static_cast<uint16_t>(magnitude + 1))) -
           static_cast<double>(float_from_bfloat16(magnitude));
  };
  double worst = 0.0;
  size_t worst_at = 0, differing = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double g = float_from_bfloat16(gpu[i]), c = float_from_bfloat16(cpu[i]);
    const double allowed = std::max(ulp_at(gpu[i]), ulp_at(cpu[i])) + tolerance * (1.0 + std::abs(c));
    const double excess = std::abs(g - c) / allowed;  // <= 1 passes; NaN fails
    differing += gpu[i] == cpu[i] ? 0 : 1;
    if (std::isnan(worst)) continue;  // the first NaN stays the worst
    if (!(excess <= worst)) {
      worst = excess;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_at << " gpu 0x" << std::hex << gpu[worst_at]
                        << " cpu 0x" << cpu[worst_at] << std::dec << " (" << differing << " of " << gpu.size()
                        << " differ)";
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
