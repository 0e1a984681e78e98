// core/src/linear_blocks_avx_vnni.cpp: the block formats' products with q8 activations (linear_blocks-inl.h) compiled
// for AVX-VNNI - vpdpbusd in its VEX encoding, on 256-bit registers without AVX-512 - at AVX2 targets of a CPU with
// it (avx_vnni_supported): Intel's client CPUs from Alder Lake on, which have no AVX-512, and AVX-512 CPUs capped at
// the AVX2 target. The same lanes as the AVX2 and AVX512-VNNI builds', so the same bits.
#include "byte_products_avx2.h"

#if ROTARY_BYTE_PRODUCTS_AVX2

#include <cpuid.h>

#define ROTARY_BLOCKS_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ROTARY_BLOCKS_VNNI 2
#include "linear_blocks-inl.h"

namespace rotary::linear_detail {

// AVX2's kernels' features (q8_avx2_supported, which also means the OS saves the 256-bit registers) and AVX-VNNI:
// CPUID leaf 7, sub-leaf 1, EAX bit 4 (read directly: clang 14's __builtin_cpu_supports does not know "avxvnni").
bool avx_vnni_supported() {
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return q8_avx2_supported() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax >> 4 & 1) != 0;
  }();
  return has;
}

ROTARY_BLOCKS_TARGET void blocks_avx_vnni_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  ByteProductBlock(j, t0, t1, r0, r1);
}

}  // namespace rotary::linear_detail

#else

namespace rotary::linear_detail {
bool avx_vnni_supported() { return false; }
void blocks_avx_vnni_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: avx_vnni_supported() is false
}  // namespace rotary::linear_detail

#endif
