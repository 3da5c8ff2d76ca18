// The GEMM seam: the backend is oneDNN on this machine and agrees with the plain reference in every layout;
// the reference is the textbook sum; without oneDNN a run says so and still trains.
#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gradcheck.h"
#include "meshtrain/core/cpu_features.h"
#include "meshtrain/kernels/cpu/gemm.h"

namespace {

using meshtrain::kernels::gemm;
using meshtrain::kernels::gemm_backend;
using meshtrain::kernels::gemm_reference;
using meshtrain::testing::random_values;
using meshtrain::testing::to_double;
using meshtrain::testing::to_float;

// max |found - expected| over every element, relative to the largest |expected| (the scale of the product).
double worst_relative_to_scale(const std::vector<float>& found, const std::vector<double>& expected) {
  double worst = 0.0, scale = 1e-30;
  for (size_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::abs(expected[i]));
    worst = std::max(worst, std::abs(found[i] - expected[i]));
  }
  return worst / scale;
}

TEST(Gemm, ReferenceIsTheTextbookSum) {
  // [[1 2 3] [4 5 6]] @ [[1 0] [0 1] [1 1]] = [[4 5] [10 11]], stored transposed or not.
  const std::vector<double> a = {1, 2, 3, 4, 5, 6}, a_t = {1, 4, 2, 5, 3, 6};
  const std::vector<double> b = {1, 0, 0, 1, 1, 1}, b_t = {1, 0, 1, 0, 1, 1};
  const std::vector<double> expected = {4, 5, 10, 11};
  for (const bool ta : {false, true}) {
    for (const bool tb : {false, true}) {
      std::vector<double> c(4, 7.0);
      gemm_reference(ta, tb, 2, 2, 3, (ta ? a_t : a).data(), ta ? 2 : 3, (tb ? b_t : b).data(), tb ? 3 : 2,
                     false, c.data(), 2);
      EXPECT_EQ(c, expected) << "transpose_a " << ta << " transpose_b " << tb;
      gemm_reference(ta, tb, 2, 2, 3, (ta ? a_t : a).data(), ta ? 2 : 3, (tb ? b_t : b).data(), tb ? 3 : 2,
                     true, c.data(), 2);
      EXPECT_EQ(c, (std::vector<double>{8, 10, 20, 22})) << "accumulate";
    }
  }
}

TEST(Gemm, BackendIsOneDnnAtTheCpusWidestIsa) {
  if (std::getenv("MESHTRAIN_GEMM_BACKEND") != nullptr || std::getenv("MESHTRAIN_ONEDNN_LIBRARY") != nullptr)
    GTEST_SKIP() << "the environment chooses the GEMM backend";
  const auto& backend = gemm_backend();
  std::printf("  gemm backend: %s; cpu %s\n", backend.describe().c_str(),
              meshtrain::cpu_features().describe().c_str());
  EXPECT_EQ(backend.name, "onednn") << backend.warning;
  EXPECT_EQ(backend.warning, "");
  const std::string isa = meshtrain::cpu_features().widest_float_isa();
  if (isa == "avx512") {
    EXPECT_EQ(backend.isa.rfind("avx512_core", 0), 0u) << backend.isa;
  } else if (isa == "avx2") {
    EXPECT_EQ(backend.isa.rfind("avx2", 0), 0u) << backend.isa;
  }
}

// The features read from CPUID against the kernel's own reading in /proc/cpuinfo (an independent source).
TEST(Gemm, CpuFeaturesMatchProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo";
  std::string line, flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  }
  ASSERT_FALSE(flags.empty());
  const auto has = [&](const char* flag) {
    return flags.find(std::string(" ") + flag + " ") != std::string::npos;
  };
  const meshtrain::CpuFeatures& cpu = meshtrain::cpu_features();
  EXPECT_EQ(cpu.avx2, has("avx2"));
  EXPECT_EQ(cpu.fma, has("fma"));
  EXPECT_EQ(cpu.avx512f, has("avx512f"));
  EXPECT_EQ(cpu.avx512bw, has("avx512bw"));
  EXPECT_EQ(cpu.avx512_bf16, has("avx512_bf16"));
}

// Every layout, beta 0 and 1, odd sizes and row strides wider than the rows (sub-matrices, as the
// cross-entropy's vocab chunks use), against the double reference on the same float inputs. Bound: float
// sums of length K <= 700 round to about sqrt(K) * 6e-8 relative; a wrong index or transpose gives O(1).
TEST(Gemm, EveryLayoutMatchesTheReference) {
  const std::array<std::array<int64_t, 3>, 5> sizes = {
      {{1, 1, 1}, {37, 53, 29}, {256, 96, 700}, {5, 300, 64}, {130, 7, 3}}};
  uint64_t seed = 100;
  for (const auto& [M, N, K] : sizes) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const bool accumulate : {false, true}) {
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          const std::vector<float> a = to_float(random_values((ta ? K : M) * lda, ++seed));
          const std::vector<float> b = to_float(random_values((tb ? N : K) * ldb, ++seed));
          std::vector<float> c = to_float(random_values(M * ldc, ++seed));
          std::vector<double> expected = to_double(c);
          const std::vector<double> a_double = to_double(a), b_double = to_double(b);
          gemm_reference(ta, tb, M, N, K, a_double.data(), lda, b_double.data(), ldb, accumulate,
                         expected.data(), ldc);
          gemm(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, accumulate, c.data(), ldc);
          EXPECT_LT(worst_relative_to_scale(c, expected), 1e-5)
              << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb << " accumulate " << accumulate;
        }
      }
    }
  }
}

// bfloat16 rounding is to nearest even, NaN stays a quiet NaN, overflow goes to infinity, and the bulk
// conversion (whole rows per thread, or one wide row split) agrees with the scalar one.
TEST(Gemm, Bfloat16RoundsToNearestEven) {
  using meshtrain::bfloat16_from_float;
  using meshtrain::float_from_bfloat16;
  EXPECT_EQ(bfloat16_from_float(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16_from_float(1.0f + 0x1p-8f), 0x3f80);             // halfway, kept bit even: down
  EXPECT_EQ(bfloat16_from_float(1.0f + 3 * 0x1p-8f), 0x3f82);         // halfway, kept bit odd: up
  EXPECT_EQ(bfloat16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above halfway: up
  EXPECT_EQ(bfloat16_from_float(-2.5f), 0xc020);
  EXPECT_EQ(bfloat16_from_float(3.4028235e38f), 0x7f80);  // the largest float rounds to infinity
  EXPECT_EQ(bfloat16_from_float(-INFINITY), 0xff80);
  EXPECT_TRUE(std::isnan(float_from_bfloat16(bfloat16_from_float(NAN))));
  EXPECT_TRUE(std::isnan(float_from_bfloat16(bfloat16_from_float(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(float_from_bfloat16(0x3f81), 1.0f + 0x1p-7f);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1000}, {3, 17}, {40, 33}}) {
    const int64_t ld = cols + 4;
    const std::vector<float> in = to_float(random_values(rows * ld, 7));
    std::vector<uint16_t> out(rows * cols, 0xffff);
    meshtrain::round_to_bfloat16(in.data(), rows, cols, ld, out.data());
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(out[r * cols + c], bfloat16_from_float(in[r * ld + c])) << rows << "x" << cols;
    }
  }
}

// gemm_bf16 against the double reference on the same bf16 values, in every layout: the products of two bf16
// values are exact in float32, so only the float32 sums round (the float32 GEMM's bound). And its result is
// not the float32 GEMM's on the unrounded inputs: the inputs were rounded.
TEST(Gemm, Bf16InputsMatchTheReferenceOnTheRoundedValues) {
  const std::array<std::array<int64_t, 3>, 4> sizes = {
      {{1, 1, 1}, {37, 53, 29}, {256, 96, 700}, {130, 7, 3}}};
  uint64_t seed = 500;
  double worst_vs_float32 = 0.0;
  for (const auto& [M, N, K] : sizes) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const bool accumulate : {false, true}) {
          const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
          const std::vector<float> a = to_float(random_values((ta ? K : M) * lda, ++seed));
          const std::vector<float> b = to_float(random_values((tb ? N : K) * ldb, ++seed));
          std::vector<uint16_t> a_bf16(a.size()), b_bf16(b.size());
          meshtrain::round_to_bfloat16(a.data(), 1, static_cast<int64_t>(a.size()), 0, a_bf16.data());
          meshtrain::round_to_bfloat16(b.data(), 1, static_cast<int64_t>(b.size()), 0, b_bf16.data());
          std::vector<float> c = to_float(random_values(M * ldc, ++seed)), c_float32 = c;
          std::vector<double> expected = to_double(c), expected_float32 = expected;
          const std::vector<double> a_double = to_double(a), b_double = to_double(b);
          gemm_reference(ta, tb, M, N, K, a_double.data(), lda, b_double.data(), ldb, accumulate,
                         expected_float32.data(), ldc);
          gemm_reference(ta, tb, M, N, K, a_bf16.data(), lda, b_bf16.data(), ldb, accumulate, expected.data(),
                         ldc);
          meshtrain::kernels::gemm_bf16(ta, tb, M, N, K, a_bf16.data(), lda, b_bf16.data(), ldb, accumulate,
                                        c.data(), ldc);
          gemm(ta, tb, M, N, K, a.data(), lda, b.data(), ldb, accumulate, c_float32.data(), ldc);
          // The float32 GEMM of the same shape right after it (a primitive cache keyed without the input
          // type would run it in bf16) is still the float32 reference's.
          double worst = 0.0, scale = 1e-30, from_float32 = 0.0, worst_float32 = 0.0;
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < ldc; ++n) {
              const double e = expected[m * ldc + n];
              scale = std::max(scale, std::abs(e));
              worst = std::max(worst, std::abs(c[m * ldc + n] - e));
              worst_float32 =
                  std::max(worst_float32, std::abs(c_float32[m * ldc + n] - expected_float32[m * ldc + n]));
              from_float32 =
                  std::max(from_float32, std::abs(c[m * ldc + n] - double{c_float32[m * ldc + n]}));
            }
          }
          EXPECT_LT(worst / scale, 1e-5)
              << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb << " accumulate " << accumulate;
          EXPECT_LT(worst_float32 / scale, 1e-5) << M << "x" << N << "x" << K << " float32 after bf16";
          if (K > 1) worst_vs_float32 = std::max(worst_vs_float32, from_float32 / scale);
        }
      }
    }
  }
  // bf16 keeps 8 significant bits: the inputs' rounding moves the results by about 2^-9 of their scale.
  EXPECT_GT(worst_vs_float32, 1e-4);
  std::printf("  gemm_bf16 vs float32 GEMM on unrounded inputs: %.2e of the scale (%s)\n", worst_vs_float32,
              gemm_backend().bf16_isa.c_str());
}

std::string run_and_capture(const std::string& environment, const std::string& arguments, int& status) {
  const std::string command = environment + " '" MESHTRAIN_BINARY "' " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  std::array<char, 4096> chunk{};
  while (pipe != nullptr && std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) output += chunk.data();
  status = pipe != nullptr ? pclose(pipe) : -1;
  return output;
}

// A missing oneDNN is a warning naming the library and what the engine does instead; the run still trains.
// B given in float32 and rounded by the GEMM (with oneDNN: into its kernel's layout, or row-major where that
// layout would not fit the [K, N] scratch): the reference on the rounded values, for shapes that pack (the
// model's, multiples of 64) and shapes whose padding does not fit (the fallback). With a bias, the reference
// starts from the bias rows (K = 0: C is the bias rows).
TEST(Gemm, Bf16WithFloat32BMatchesTheReferenceOnTheRoundedValues) {
  const std::array<std::array<int64_t, 3>, 5> sizes = {
      {{1, 1, 1}, {37, 53, 29}, {128, 192, 256}, {70, 64, 768}, {5, 7, 0}}};
  uint64_t seed = 900;
  for (const auto& [M, N, K] : sizes) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        for (const int mode : {0, 1, 2}) {  // write, accumulate, write with a bias
          const bool accumulate = mode == 1, with_bias = mode == 2;
          const int64_t lda = ta ? M : K, ldb = (tb ? K : N) + 3, ldc = N + 2;
          const std::vector<float> a = to_float(random_values((ta ? K : M) * lda, ++seed));
          const std::vector<float> b = to_float(random_values((tb ? N : K) * ldb, ++seed));
          const std::vector<float> bias = to_float(random_values(N, ++seed));
          std::vector<uint16_t> a_bf16(a.size()), b_bf16(b.size()), scratch(K * N, 0xFFFF);
          meshtrain::round_to_bfloat16(a.data(), 1, static_cast<int64_t>(a.size()), 0, a_bf16.data());
          meshtrain::round_to_bfloat16(b.data(), 1, static_cast<int64_t>(b.size()), 0, b_bf16.data());
          std::vector<float> c = to_float(random_values(M * ldc, ++seed));
          std::vector<double> expected = to_double(c);
          if (with_bias) {
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) expected[m * ldc + n] = bias[n];
          }
          gemm_reference(ta, tb, M, N, K, a_bf16.data(), lda, b_bf16.data(), ldb, accumulate || with_bias,
                         expected.data(), ldc);
          meshtrain::kernels::gemm_bf16_float32_b(ta, tb, M, N, K, a_bf16.data(), lda, b.data(), ldb,
                                                  accumulate, c.data(), ldc, scratch.data(),
                                                  with_bias ? bias.data() : nullptr);
          EXPECT_LT(worst_relative_to_scale(c, expected), 1e-5)
              << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb << " mode " << mode;
        }
      }
    }
  }
}

TEST(Gemm, MissingLibraryFallsBackWithAWarning) {
  const std::string run_dir = ::testing::TempDir() + "gemm_missing_library";
  int status = 0;
  const std::string output = run_and_capture("MESHTRAIN_ONEDNN_LIBRARY=/nonexistent/libdnnl.so.2",
                                             "train qwen3-tiny dataset_type=synthetic steps=1 "
                                             "enable_checkpointing=false eval_interval=0 base_emb_dim=64 "
                                             "base_num_decoder_layers=1 base_mlp_dim=128 vocab_size=256 "
                                             "max_target_length=16 per_device_batch_size=2 "
                                             "run_dir=" +
                                                 run_dir,
                                             status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("warning: oneDNN could not be loaded (/nonexistent/libdnnl.so.2"), std::string::npos)
      << output;
  EXPECT_NE(output.find("plain reference GEMM"), std::string::npos) << output;
  EXPECT_NE(output.find("matmuls: reference GEMM"), std::string::npos) << output;
  std::ifstream machine(run_dir + "/machine.json");
  std::stringstream text;
  text << machine.rdbuf();
  EXPECT_NE(text.str().find("reference GEMM"), std::string::npos) << text.str();
}

const char* const kTinyRun =
    "train qwen3-tiny dataset_type=synthetic steps=1 enable_checkpointing=false eval_interval=0 "
    "base_emb_dim=64 "
    "base_num_decoder_layers=1 base_mlp_dim=128 vocab_size=256 max_target_length=16 per_device_batch_size=2 ";

// The engine does not use OpenBLAS: an OPENBLAS_CORETYPE this CPU cannot run, or a slow one, changes nothing.
TEST(Gemm, OpenBlasCoreTypeDoesNotMatter) {
  if (std::getenv("MESHTRAIN_GEMM_BACKEND") != nullptr || std::getenv("MESHTRAIN_ONEDNN_LIBRARY") != nullptr)
    GTEST_SKIP() << "the environment chooses the GEMM backend";
  for (const char* core : {"Prescott", "SapphireRapids"}) {
    int status = 0;
    const std::string output = run_and_capture(
        std::string("OPENBLAS_CORETYPE=") + core,
        std::string(kTinyRun) + "run_dir=" + ::testing::TempDir() + "gemm_openblas_core", status);
    EXPECT_EQ(status, 0) << output;
    EXPECT_NE(output.find("matmuls: " + gemm_backend().describe()), std::string::npos) << output;
    EXPECT_EQ(output.find("warning"), std::string::npos) << output;
  }
}

// oneDNN held below the CPU's instruction set (here by its own variable): the run says so, naming the cause.
TEST(Gemm, OneDnnBelowTheCpusIsaIsAWarning) {
  if (meshtrain::cpu_features().widest_float_isa() == "sse" ||
      std::getenv("MESHTRAIN_GEMM_BACKEND") != nullptr)
    GTEST_SKIP() << "needs a CPU with AVX2 or AVX-512 and the default backend";
  int status = 0;
  const std::string output =
      run_and_capture("ONEDNN_MAX_CPU_ISA=SSE41",
                      std::string(kTinyRun) + "run_dir=" + ::testing::TempDir() + "gemm_low_isa", status);
  EXPECT_EQ(status, 0) << output;
  EXPECT_NE(output.find("warning: this CPU has " + meshtrain::cpu_features().widest_float_isa() +
                        " but oneDNN runs sse41 kernels (is ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA set?)"),
            std::string::npos)
      << output;
}

TEST(Gemm, UnknownBackendNamesTheVariable) {
  int status = 0;
  const std::string output =
      run_and_capture("MESHTRAIN_GEMM_BACKEND=openblas",
                      "train qwen3-tiny dataset_type=synthetic steps=1 enable_checkpointing=false run_dir=" +
                          ::testing::TempDir() + "gemm_bad_backend",
                      status);
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("MESHTRAIN_GEMM_BACKEND"), std::string::npos) << output;
  EXPECT_NE(output.find("onednn or reference"), std::string::npos) << output;
}

}  // namespace
