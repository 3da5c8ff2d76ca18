#include "meshtrain/core/cpu_features.h"

#include <asm/prctl.h>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace meshtrain {
namespace {

struct Registers {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Registers cpuid(unsigned leaf, unsigned subleaf = 0) {
  Registers r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return {};
  return r;
}

bool bit(unsigned value, int index) {
  return ((value >> index) & 1u) != 0;
}

// XCR0: which register states the OS saves on a context switch. Vector instructions whose state is not
// saved fault, whatever CPUID says.
uint64_t os_saved_states() {
  uint32_t low = 0, high = 0;
  __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
  return (static_cast<uint64_t>(high) << 32) | low;
}

// Linux hands out the AMX tile data state (XFEATURE_XTILEDATA, 8 KiB per thread) only on request: a tile
// instruction before arch_prctl(ARCH_REQ_XCOMP_PERM) faults. The permission is per process; asked once,
// when the features are read, so every thread may use tiles afterwards (Linux >= 5.16).
bool request_tile_permission() {
  constexpr unsigned long kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, kXfeatureTileData) == 0;
}

std::string trimmed(std::string text) {
  text.erase(0, text.find_first_not_of(' '));
  const size_t end = text.find_last_not_of(std::string(" \0", 2));
  text.erase(end == std::string::npos ? 0 : end + 1);
  return text;
}

CpuFeatures read_cpu_features() {
  CpuFeatures cpu;
  const Registers vendor = cpuid(0);
  char vendor_text[13] = {};
  std::memcpy(vendor_text, &vendor.ebx, 4);
  std::memcpy(vendor_text + 4, &vendor.edx, 4);
  std::memcpy(vendor_text + 8, &vendor.ecx, 4);
  cpu.vendor = vendor_text;

  const Registers version = cpuid(1);
  const int base_family = static_cast<int>((version.eax >> 8) & 0xF);
  const int base_model = static_cast<int>((version.eax >> 4) & 0xF);
  cpu.family = base_family == 0xF ? base_family + static_cast<int>((version.eax >> 20) & 0xFF) : base_family;
  cpu.model = (base_family == 0x6 || base_family == 0xF)
                  ? (static_cast<int>((version.eax >> 16) & 0xF) << 4) + base_model
                  : base_model;

  if (cpuid(0x80000000).eax >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Registers part = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &part, 16);
    }
    cpu.brand = trimmed(brand);
  }

  const bool osxsave = bit(version.ecx, 27);
  const uint64_t states = osxsave ? os_saved_states() : 0;
  const bool ymm_saved = (states & 0x6) == 0x6;            // SSE + AVX state
  const bool zmm_saved = (states & 0xE6) == 0xE6;          // + opmask, upper ZMM, ZMM16-31
  const bool tiles_saved = (states & 0x60000) == 0x60000;  // AMX tile config + data

  const unsigned max_leaf = vendor.eax;
  const Registers extended = max_leaf >= 7 ? cpuid(7, 0) : Registers{};
  const Registers extended1 = max_leaf >= 7 && extended.eax >= 1 ? cpuid(7, 1) : Registers{};
  cpu.sse42 = bit(version.ecx, 20);
  cpu.avx = ymm_saved && bit(version.ecx, 28);
  cpu.fma = cpu.avx && bit(version.ecx, 12);
  cpu.avx2 = cpu.avx && bit(extended.ebx, 5);
  cpu.avx512f = zmm_saved && bit(extended.ebx, 16);
  cpu.avx512dq = cpu.avx512f && bit(extended.ebx, 17);
  cpu.avx512bw = cpu.avx512f && bit(extended.ebx, 30);
  cpu.avx512vl = cpu.avx512f && bit(extended.ebx, 31);
  cpu.avx512_bf16 = cpu.avx512f && bit(extended1.eax, 5);
  const bool amx_hardware = tiles_saved && bit(extended.edx, 24) && bit(extended.edx, 22);  // AMX-TILE, -BF16
  cpu.amx_bf16 = amx_hardware && request_tile_permission();
  cpu.amx_refused_by_os = amx_hardware && !cpu.amx_bf16;
  return cpu;
}

}  // namespace

std::string CpuFeatures::widest_float_isa() const {
  if (avx512_core()) return "avx512";
  if (avx2 && fma) return "avx2";
  if (avx) return "avx";
  return "sse";
}

std::string CpuFeatures::describe() const {
  std::string text = (brand.empty() ? vendor : brand) + " (family " + std::to_string(family) + ", model " +
                     std::to_string(model) + "):";
  const std::pair<bool, const char*> flags[] = {{avx, "avx"},
                                                {avx2, "avx2"},
                                                {fma, "fma"},
                                                {avx512_core(), "avx512"},
                                                {avx512_bf16, "avx512_bf16"},
                                                {amx_bf16, "amx_bf16"}};
  bool any = false;
  for (const auto& [present, name] : flags) {
    if (!present) continue;
    text += std::string(" ") + name;
    any = true;
  }
  if (!any) text += " no AVX";
  if (amx_refused_by_os) text += " (amx_bf16 unusable: the OS refused the tile permission)";
  return text;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_cpu_features();
  return features;
}

}  // namespace meshtrain
