// core/src/linear_blocks_avx2.cpp: the block formats' products with q8 activations (linear_blocks-inl.h) compiled for
// AVX2 - x86 targets from AVX2 up where linear_blocks_vnni.cpp's are not used - and the panels of rotary's own q8
// weights' prefill there.
#include "byte_products_avx2.h"

#if ROTARY_BYTE_PRODUCTS_AVX2

#define ROTARY_BLOCKS_TARGET ROTARY_AVX2_TARGET
#define ROTARY_BLOCKS_VNNI 0
#include "linear_blocks-inl.h"

namespace rotary::linear_detail {

ROTARY_AVX2_TARGET void q8_avx2_panels(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  Panels<WeightFormat::Q8>(j, t0, t1, r0, r1);
}

ROTARY_AVX2_TARGET void blocks_avx2_block(const Job& j, int64_t t0, int64_t t1, int64_t r0, int64_t r1) {
  ByteProductBlock(j, t0, t1, r0, r1);
}

}  // namespace rotary::linear_detail

#else

namespace rotary::linear_detail {
void q8_avx2_panels(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: q8_avx2_supported() is false
void blocks_avx2_block(const Job&, int64_t, int64_t, int64_t, int64_t) {}  // never called: q8_avx2_supported() is false
}  // namespace rotary::linear_detail

#endif
