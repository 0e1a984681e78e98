// core/src/linear_blocks_avx_vnni.cpp: the block formats' products with q8 activations (linear_blocks-inl.h) compiled
// for AVX-VNNI - vpdpbusd in its VEX encoding, on 256-bit registers without AVX-512 - at AVX2 targets of a CPU with
// it (avx_vnni_supported): Intel's client CPUs from Alder Lake on, which have no AVX-512, and AVX-512 CPUs capped at
// the AVX2 target. The same lanes as the AVX2 and AVX512-VNNI builds', so the same bits.
#include "byte_products_avx2.h"

#if ROTARY_BYTE_PRODUCTS_AVX2

#define ROTARY_BLOCKS_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define ROTARY_BLOCKS_VNNI 2
#include "linear_blocks-inl.h"

namespace rotary::linear_detail {

bool avx_vnni_supported() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avxvnni");
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
