// What this x86-64 CPU can run, read from CPUID and XGETBV (the OS must save the vector registers too), so
// the engine picks and reports its fast code from the CPU's features, never from a library's table of
// models (a table that does not know a new model silently picks slow kernels).
#pragma once

#include <string>

namespace meshtrain {

struct CpuFeatures {
  std::string vendor;         // "AuthenticAMD", "GenuineIntel", ...
  std::string brand;          // "AMD EPYC 9R45 ...", as CPUID reports it
  int family = 0, model = 0;  // display family and model (family 26 = AMD Zen 5, 6 = Intel Core/Xeon)
  bool sse42 = false;         // SSE4.2: the CRC32 instruction (CRC-32C)
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false;
  // AMX-TILE and AMX-BF16 usable: CPUID, the OS saves the tile state (XCR0 bits 17, 18) and granted this
  // process the tile data permission (arch_prctl). amx_refused_by_os: the CPU and XCR0 have it, the
  // permission request failed (an old kernel): describe() says so, and bf16 attention stays float32
  // (kernels/cpu/backend.cpp).
  bool amx_bf16 = false, amx_refused_by_os = false;

  // AVX-512 as oneDNN's avx512_core and OpenBLAS's SkylakeX kernels need it (F, BW, VL, DQ).
  bool avx512_core() const { return avx512f && avx512bw && avx512vl && avx512dq; }
  // The widest instruction set for float32 GEMM: "avx512", "avx2", "avx" or "sse".
  std::string widest_float_isa() const;
  // "AMD EPYC (family 26, model 2): avx2 fma avx512 avx512_bf16"
  std::string describe() const;
};

// Read once per process.
const CpuFeatures& cpu_features();

}  // namespace meshtrain
