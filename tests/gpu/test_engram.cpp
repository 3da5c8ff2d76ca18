// The CUDA kernels of an Engram block against the cpu kernels of the same name on the same inputs: the
// per-stream RMSNorm, the table rows and the table read over them (embedding's gather and ordered
// scatter-add, as the layer calls them), the gate, the ShortConv with and without its halo, and the block's
// output. Odd shapes; outputs pre-filled with NaN where the kernel must write and with random values where
// it must add; every backward run twice, bitwise equal (fixed reduction orders, no atomics). Tolerances are
// on gpu_test.h's metric |gpu - cpu| / (1 + |cpu|), each justified where defined.
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.h"
#include "meshtrain/kernels/cpu/embedding.h"
#include "meshtrain/kernels/cpu/engram_gate.h"
#include "meshtrain/kernels/cpu/engram_table.h"
#include "meshtrain/kernels/cpu/rmsnorm.h"
#include "meshtrain/kernels/cpu/short_conv.h"

namespace meshtrain::gpu_test {
namespace {

// Row-wise values (the norm's out, rstd, dx; the gate's dot products): float sums over one row of D <= 257
// in different orders (cpu simd lanes, the GPU's 256-thread tree), typical relative error ~sqrt(D / 4) 2^-24
// < 1e-6; 1e-5 leaves a factor > 10. A wrong row, stream scale or formula gives O(1e-1).
constexpr double kRowTolerance = 1e-5;
// Sums over tokens (dw, the taps' gradient): <= 300 O(1) terms in different orders (cpu: token order; GPU:
// 32 lanes, then the lanes in order): typical error ~sqrt(N) 2^-24 |sum| on sums ~sqrt(N), ~1e-6 on the
// metric; 1e-4 allows float summation's worst case over 300 terms with margin. A missed row is O(1).
constexpr double kReductionTolerance = 1e-4;
// Elementwise chains of a few operations (the conv's K products, silu with expf against std::exp, each <= 2
// ulp): <= ~1e-6 on the metric; 1e-5 leaves a factor 10. A wrong tap, dilation or slope is O(1e-1).
constexpr double kElementTolerance = 1e-5;

size_t elements(int64_t count) {
  return static_cast<size_t>(count);
}

// ---- RMSNorm per stream --------------------------------------------------------------------------------

// Forward (out, rstd NaN-filled) and backward both ways of accumulate_dx, dw [G, D] accumulated onto random
// values; the backward of both sides takes the cpu's rstd.
void check_rmsnorm_streams(int64_t N, int64_t G, int64_t D, uint32_t seed) {
  const std::string what =
      "rmsnorm_streams N=" + std::to_string(N) + " G=" + std::to_string(G) + " D=" + std::to_string(D);
  const float eps = 1e-6f;
  const std::vector<float> x = normal_values(elements(N * G * D), seed, 1.5f);
  std::vector<float> w = normal_values(elements(G * D), seed + 1, 0.3f);
  for (float& value : w) value += 1.0f;
  const std::vector<float> dout = normal_values(elements(N * G * D), seed + 2);
  std::vector<float> out_cpu(elements(N * G * D)), rstd_cpu(elements(N * G));
  kernels::rmsnorm_streams_forward(out_cpu.data(), rstd_cpu.data(), x.data(), w.data(), N, G, D, eps);
  const DeviceBuffer<float> x_gpu(x), w_gpu(w), dout_gpu(dout), rstd_in(rstd_cpu);
  {
    const DeviceBuffer<float> out_gpu(nan_filled(N * G * D)), rstd_gpu(nan_filled(N * G));
    cuda().rmsnorm_streams_forward(out_gpu.get(), rstd_gpu.get(), x_gpu.get(), w_gpu.get(), N, G, D, eps);
    expect_close(out_gpu.read(), out_cpu, kRowTolerance, what + " forward out");
    expect_close(rstd_gpu.read(), rstd_cpu, kRowTolerance, what + " forward rstd");
  }
  for (const bool accumulate : {false, true}) {
    const std::string case_what = what + (accumulate ? " backward (dx +=)" : " backward (dx =)");
    const std::vector<float> dx_start =
        accumulate ? normal_values(elements(N * G * D), seed + 3) : nan_filled(N * G * D);
    const std::vector<float> dw_start = normal_values(elements(G * D), seed + 4);
    std::vector<float> dx_cpu = dx_start, dw_cpu = dw_start;
    kernels::rmsnorm_streams_backward(dx_cpu.data(), dw_cpu.data(), dout.data(), x.data(), w.data(),
                                      rstd_cpu.data(), N, G, D, accumulate);
    std::vector<float> dx_runs[2], dw_runs[2];
    for (int run = 0; run < 2; ++run) {
      const DeviceBuffer<float> dx_gpu(dx_start), dw_gpu(dw_start);
      cuda().rmsnorm_streams_backward(dx_gpu.get(), dw_gpu.get(), dout_gpu.get(), x_gpu.get(), w_gpu.get(),
                                      rstd_in.get(), N, G, D, accumulate);
      dx_runs[run] = dx_gpu.read();
      dw_runs[run] = dw_gpu.read();
    }
    expect_close(dx_runs[0], dx_cpu, kRowTolerance, case_what + " dx");
    expect_close(dw_runs[0], dw_cpu, kReductionTolerance, case_what + " dw");
    expect_same_bits(dx_runs[1], dx_runs[0], case_what + " dx, second run");
    expect_same_bits(dw_runs[1], dw_runs[0], case_what + " dw, second run");
  }
}

TEST(CudaRmsnormStreams, OddShapes) {
  MT_REQUIRE_GPU();
  check_rmsnorm_streams(37, 3, 53, 1101);
  check_rmsnorm_streams(70, 4, 257, 1102);  // a row one column past the 256 threads
  check_rmsnorm_streams(1, 2, 33, 1103);
  check_rmsnorm_streams(300, 1, 40, 1104);  // one stream: the plain norm's path
}

// ---- The table rows and the table read -----------------------------------------------------------------

// N tokens of `heads` hash ids, each below its head's table size; the rows (pre-filled with a sentinel) must
// equal the cpu's exactly. Then the read as the layer does it: the gather of those rows (a copy: bitwise)
// and the scatter-add of their gradient onto a pre-filled table gradient, which the cuda embedding sums in
// token order as the cpu does (bitwise too), with few rows so that rows repeat many times.
void check_table(int64_t N, int64_t heads, int64_t Dh, uint32_t seed) {
  const std::string what =
      "engram table N=" + std::to_string(N) + " heads=" + std::to_string(heads) + " Dh=" + std::to_string(Dh);
  std::mt19937 generator(seed);
  std::uniform_int_distribution<int32_t> size_of(1, 13);
  std::vector<int32_t> sizes(elements(heads)), offsets(elements(heads), 0);
  for (int32_t& size : sizes) size = size_of(generator);
  for (size_t i = 1; i < offsets.size(); ++i) offsets[i] = offsets[i - 1] + sizes[i - 1];
  const int64_t R = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  std::vector<int32_t> ids(elements(N * heads));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = std::uniform_int_distribution<int32_t>(0, sizes[i % elements(heads)] - 1)(generator);
  }
  std::vector<int32_t> rows_cpu(ids.size());
  kernels::engram_table_rows(rows_cpu.data(), ids.data(), offsets.data(), N, heads);
  const DeviceBuffer<int32_t> ids_gpu(ids), rows_gpu(std::vector<int32_t>(ids.size(), -7));
  cuda().engram_table_rows(rows_gpu.get(), ids_gpu.get(), offsets.data(), N, heads);
  const std::vector<int32_t> rows = rows_gpu.read();
  EXPECT_EQ(rows, rows_cpu) << what << " rows";

  const std::vector<float> table = normal_values(elements(R * Dh), seed + 1);
  const std::vector<float> d_memory = normal_values(elements(N * heads * Dh), seed + 2);
  const std::vector<float> d_table_start = normal_values(elements(R * Dh), seed + 3);
  std::vector<float> memory_cpu(elements(N * heads * Dh)), d_table_cpu = d_table_start;
  kernels::embedding_forward(memory_cpu.data(), rows_cpu.data(), table.data(), N * heads, R, Dh, false, 0, R);
  kernels::embedding_backward(d_table_cpu.data(), rows_cpu.data(), d_memory.data(), N * heads, R, Dh, 0, R);
  const DeviceBuffer<float> table_gpu(table), d_memory_gpu(d_memory), memory_gpu(nan_filled(N * heads * Dh));
  cuda().embedding_forward(memory_gpu.get(), rows_gpu.get(), table_gpu.get(), N * heads, R, Dh, false, 0, R);
  expect_same_bits(memory_gpu.read(), memory_cpu, what + " read");
  const DeviceBuffer<float> d_table_gpu(d_table_start);
  cuda().embedding_backward(d_table_gpu.get(), rows_gpu.get(), d_memory_gpu.get(), N * heads, R, Dh, 0, R);
  expect_same_bits(d_table_gpu.read(), d_table_cpu, what + " read backward");
}

TEST(CudaEngramTable, RowsAndRead) {
  MT_REQUIRE_GPU();
  check_table(37, 4, 9, 1201);    // heads as engram_num_heads 2 x orders 2 and 3
  check_table(5, 70, 3, 1202);    // more heads than one launch's offsets (64): two launches
  check_table(300, 6, 64, 1203);  // a row width of deepseek-custom's
}

// ---- The gate ------------------------------------------------------------------------------------------

// q random; k_g = +-(q_g + noise) with the sign alternating over rows, so every score is bounded away from 0
// (|s| ~ |q|^2 / sqrt(D) ~ 0.25 sqrt(D)), in both signs: the gate's slope 1 / sqrt(|s|) makes a score near 0
// ill-conditioned on either side alone (two float dot products may differ there by more than any fixed
// tolerance). One row of q is zero: a score of exactly 0 on both sides, where the gate is 1/2 and q, k get
// no gradient (the floor's branch).
void check_gate(int64_t N, int64_t G, int64_t D, uint32_t seed) {
  const std::string what =
      "engram_gate N=" + std::to_string(N) + " G=" + std::to_string(G) + " D=" + std::to_string(D);
  std::vector<float> q = normal_values(elements(N * G * D), seed, 0.5f);
  const std::vector<float> noise = normal_values(elements(N * G * D), seed + 1, 0.2f);
  std::vector<float> k(q.size());
  for (int64_t row = 0; row < N * G; ++row) {
    const float sign = row % 2 == 0 ? 1.0f : -1.0f;
    for (int64_t c = 0; c < D; ++c)
      k[elements(row * D + c)] = sign * (q[elements(row * D + c)] + noise[elements(row * D + c)]);
  }
  const int64_t zero_row = (N * G) / 2;
  for (int64_t c = 0; c < D; ++c) q[elements(zero_row * D + c)] = 0.0f;
  const std::vector<float> v = normal_values(elements(N * D), seed + 2);
  const std::vector<float> d_gated = normal_values(elements(N * G * D), seed + 3);

  std::vector<float> gated_cpu(elements(N * G * D)), gate_cpu(elements(N * G));
  kernels::engram_gate_forward(gated_cpu.data(), gate_cpu.data(), q.data(), k.data(), v.data(), N, G, D);
  EXPECT_EQ(gate_cpu[elements(zero_row)], 0.5f) << what << ": the zero row's cpu gate";
  const DeviceBuffer<float> q_gpu(q), k_gpu(k), v_gpu(v), d_gated_gpu(d_gated), gate_in(gate_cpu);
  {
    const DeviceBuffer<float> gated_gpu(nan_filled(N * G * D)), gate_gpu(nan_filled(N * G));
    cuda().engram_gate_forward(gated_gpu.get(), gate_gpu.get(), q_gpu.get(), k_gpu.get(), v_gpu.get(), N, G,
                               D);
    expect_close(gate_gpu.read(), gate_cpu, kRowTolerance, what + " forward gate");
    expect_close(gated_gpu.read(), gated_cpu, kRowTolerance, what + " forward gated");
  }
  std::vector<float> d_q_cpu(q.size()), d_k_cpu(q.size()), d_v_cpu(v.size());
  kernels::engram_gate_backward(d_q_cpu.data(), d_k_cpu.data(), d_v_cpu.data(), d_gated.data(),
                                gate_cpu.data(), q.data(), k.data(), v.data(), N, G, D);
  std::vector<float> runs[2][3];
  for (int run = 0; run < 2; ++run) {
    const DeviceBuffer<float> d_q(nan_filled(N * G * D)), d_k(nan_filled(N * G * D)), d_v(nan_filled(N * D));
    cuda().engram_gate_backward(d_q.get(), d_k.get(), d_v.get(), d_gated_gpu.get(), gate_in.get(),
                                q_gpu.get(), k_gpu.get(), v_gpu.get(), N, G, D);
    runs[run][0] = d_q.read();
    runs[run][1] = d_k.read();
    runs[run][2] = d_v.read();
  }
  expect_close(runs[0][0], d_q_cpu, kRowTolerance, what + " backward d_q");
  expect_close(runs[0][1], d_k_cpu, kRowTolerance, what + " backward d_k");
  expect_close(runs[0][2], d_v_cpu, kElementTolerance, what + " backward d_v");
  for (int64_t c = 0; c < D; ++c) {
    EXPECT_EQ(runs[0][0][elements(zero_row * D + c)], 0.0f) << what << ": d_q of the zero score's row";
  }
  for (int i = 0; i < 3; ++i) expect_same_bits(runs[1][i], runs[0][i], what + " backward, second run");
}

TEST(CudaEngramGate, OddShapes) {
  MT_REQUIRE_GPU();
  check_gate(37, 3, 53, 1301);
  check_gate(9, 4, 257, 1302);
  check_gate(300, 1, 64, 1303);
}

// ---- ShortConv -----------------------------------------------------------------------------------------

// Forward and backward of B rows of T times: y, d_u and d_halo NaN-filled (written), d_w random (+=). With a
// halo (the context-parallel case) or without (zeros before the row); H = (K - 1) dilation may exceed T (a
// stretch shorter than its halo), and K = 1 reads no history.
void check_short_conv(int64_t B, int64_t T, int64_t C, int64_t K, int64_t dilation, bool with_halo,
                      uint32_t seed) {
  const int64_t H = (K - 1) * dilation;
  const std::string what = "short_conv B=" + std::to_string(B) + " T=" + std::to_string(T) +
                           " C=" + std::to_string(C) + " K=" + std::to_string(K) +
                           " dilation=" + std::to_string(dilation) + (with_halo ? " with halo" : " no halo");
  const std::vector<float> u = normal_values(elements(B * T * C), seed);
  const std::vector<float> halo = normal_values(elements(B * H * C), seed + 1);
  const std::vector<float> w = normal_values(elements(K * C), seed + 2, 0.5f);
  const std::vector<float> d_y = normal_values(elements(B * T * C), seed + 3);
  const std::vector<float> d_w_start = normal_values(elements(K * C), seed + 4);
  const float* halo_cpu = with_halo ? halo.data() : nullptr;

  std::vector<float> y_cpu(elements(B * T * C));
  kernels::short_conv_forward(y_cpu.data(), u.data(), halo_cpu, w.data(), B, T, C, K, dilation);
  std::vector<float> d_u_cpu(elements(B * T * C)), d_halo_cpu(elements(B * H * C)), d_w_cpu = d_w_start;
  kernels::short_conv_backward(d_u_cpu.data(), with_halo ? d_halo_cpu.data() : nullptr, d_w_cpu.data(),
                               d_y.data(), u.data(), halo_cpu, w.data(), B, T, C, K, dilation);

  const DeviceBuffer<float> u_gpu(u), halo_gpu(halo), w_gpu(w), d_y_gpu(d_y);
  const float* halo_device = with_halo ? halo_gpu.get() : nullptr;
  {
    const DeviceBuffer<float> y_gpu(nan_filled(B * T * C));
    cuda().short_conv_forward(y_gpu.get(), u_gpu.get(), halo_device, w_gpu.get(), B, T, C, K, dilation);
    expect_close(y_gpu.read(), y_cpu, kElementTolerance, what + " forward");
  }
  std::vector<float> runs[2][3];
  for (int run = 0; run < 2; ++run) {
    // Without a halo d_halo is not written: its sentinel must survive.
    const DeviceBuffer<float> d_u(nan_filled(B * T * C)), d_w(d_w_start);
    const DeviceBuffer<float> d_halo(with_halo ? nan_filled(B * H * C)
                                               : std::vector<float>(elements(B * H * C), 3.0f));
    cuda().short_conv_backward(d_u.get(), with_halo ? d_halo.get() : nullptr, d_w.get(), d_y_gpu.get(),
                               u_gpu.get(), halo_device, w_gpu.get(), B, T, C, K, dilation);
    runs[run][0] = d_u.read();
    runs[run][1] = d_halo.read();
    runs[run][2] = d_w.read();
  }
  expect_close(runs[0][0], d_u_cpu, kElementTolerance, what + " backward d_u");
  if (with_halo) {
    expect_close(runs[0][1], d_halo_cpu, kElementTolerance, what + " backward d_halo");
  } else {
    expect_same_bits(runs[0][1], std::vector<float>(elements(B * H * C), 3.0f), what + " d_halo untouched");
  }
  expect_close(runs[0][2], d_w_cpu, kReductionTolerance, what + " backward d_w");
  for (int i = 0; i < 3; ++i) expect_same_bits(runs[1][i], runs[0][i], what + " backward, second run");
}

TEST(CudaShortConv, OddShapes) {
  MT_REQUIRE_GPU();
  for (const bool with_halo : {false, true}) {
    check_short_conv(3, 11, 37, 4, 3, with_halo, 1401);   // H = 9 < T
    check_short_conv(2, 5, 33, 4, 3, with_halo, 1402);    // a stretch shorter than its halo
    check_short_conv(4, 70, 130, 3, 2, with_halo, 1403);  // 280 (row, time) pairs over the 32 lanes
    check_short_conv(2, 7, 5, 1, 3, with_halo, 1404);     // K = 1: no history
  }
}

// out = x + gated + silu(y); d_gated = d_out, d_y = d_out silu'(y). y spans +-90, where e^-y overflows.
TEST(CudaShortConvOutput, ForwardAndBackward) {
  MT_REQUIRE_GPU();
  const int64_t count = 1001;
  const std::vector<float> x = normal_values(elements(count), 1501),
                           gated = normal_values(elements(count), 1502);
  std::vector<float> y = normal_values(elements(count), 1503, 3.0f);
  y[0] = 90.0f;
  y[1] = -90.0f;
  y[2] = 0.0f;
  const std::vector<float> d_out = normal_values(elements(count), 1504);
  std::vector<float> out_cpu(elements(count)), d_gated_cpu(elements(count)), d_y_cpu(elements(count));
  kernels::short_conv_output_forward(out_cpu.data(), x.data(), gated.data(), y.data(), count);
  kernels::short_conv_output_backward(d_gated_cpu.data(), d_y_cpu.data(), d_out.data(), y.data(), count);
  const DeviceBuffer<float> x_gpu(x), gated_gpu(gated), y_gpu(y), d_out_gpu(d_out);
  const DeviceBuffer<float> out(nan_filled(count)), d_gated(nan_filled(count)), d_y(nan_filled(count));
  cuda().short_conv_output_forward(out.get(), x_gpu.get(), gated_gpu.get(), y_gpu.get(), count);
  cuda().short_conv_output_backward(d_gated.get(), d_y.get(), d_out_gpu.get(), y_gpu.get(), count);
  expect_close(out.read(), out_cpu, kElementTolerance, "short_conv_output forward");
  expect_same_bits(d_gated.read(), d_gated_cpu, "short_conv_output backward d_gated (a copy)");
  expect_close(d_y.read(), d_y_cpu, kElementTolerance, "short_conv_output backward d_y");
}

}  // namespace
}  // namespace meshtrain::gpu_test
