// core/src/linear_blocks_vnni.cpp: the block formats' products with q8 activations (linear_blocks-inl.h) compiled for
// AVX512-VNNI - at AVX-512 targets of a CPU with it (q8_dot_supported(): the features linear_q8_dot.cpp's kernels
// need) - on 256-bit vpdpbusd, the same lanes as the AVX2 build's and so the same bits.
#include "byte_products_avx2.h"

#if ROTARY_BYTE_PRODUCTS_AVX2

#define ROTARY_BLOCKS_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define ROTARY_BLOCKS_VNNI 1
#include "linear_blocks-inl.h"

namespace rotary::linear_detail {

ROTARY_BLOCKS_TARGET void blocks_vnni_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  ByteProductBlock(j, t0, t1, r0, r1);
}

}  // namespace rotary::linear_detail

#else

namespace rotary::linear_detail {
void blocks_vnni_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: q8_dot_supported() is false
}  // namespace rotary::linear_detail

#endif
