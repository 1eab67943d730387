/* LMI-Dist's W4A16 linear layer on AVX-512 BF16: int4 weights (symmetric, one float32 scale per group
 * of input channels and output channel, as compressed-tensors' W4A16 / GPTQ scheme declares them)
 * times activations rounded to bfloat16, with float32 sums (vdpbf16ps).
 *
 * Built into the same shared library as lora_kernel.c (setup.py); lmforge.engines.lmi_dist.int4_kernel
 * loads it with ctypes.
 *
 * Why: PyTorch's CPU int4 kernel (_weight_int4pack_mm_for_cpu with bfloat16 activations) runs about as
 * fast as float32 at 32 rows (bench/results/quant-kernels-int4.json), so a GPTQ model gained little
 * under load. Here 16 output channels x 32 inputs are 256 bytes of the packed weight, unpacked in
 * registers (two nibbles a byte, each looked up as the bfloat16 of q - 8) and multiplied with up to 8
 * rows of the batch per pass: the weight is read from memory once per call and unpacked once per 8
 * rows.
 *
 * Numbers: q (-8..7) is exact in bfloat16; the activations are rounded to bfloat16 (round to nearest
 * even), as PyTorch's kernel rounds them; a group's products are summed in float32 by vdpbf16ps (pairs
 * of products, the input pairs in order), and y = sum over groups, in order, of (group sum * scale),
 * one float32 fused multiply-add each (the first one a product), then + bias. The output stays float32
 * (PyTorch's kernel rounds it to bfloat16).
 *
 * Batch-invariant: a row's output is made from that row's input, the weight and nothing else, by the
 * same sequence of operations whatever the other rows are (each row has its own accumulators; the rows
 * of a batch are only cut into passes of 8, 4, 2 and 1).
 *
 * Packed layout of an n x k weight (k a multiple of 32, n padded to a multiple of 16 with zero
 * channels): for each block of 16 channels, for each 32 inputs, 8 runs of 32 bytes; byte j of run p
 * holds the values (q + 8) of pair-rows 2p (low nibble) and 2p + 1 (high nibble) at word j, where
 * pair-row r, word j is channel j / 2 of the block at input 32 t + 2 r + j % 2 (the pairs vdpbf16ps
 * takes: a pair-row is one vector of 16 channels x 2 inputs).
 */

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#define LMFORGE_X86 1
#endif

#define BLOCK 16 /* output channels per block */
#define KT 32    /* inputs per 256-byte run of a block */

static int64_t padded_n(int64_t n) { return (n + BLOCK - 1) / BLOCK * BLOCK; }

int64_t lmforge_int4_packed_bytes(int64_t n, int64_t k) { return padded_n(n) * k / 2; }

/* Pack q (n x k int8 holding -8..7, row stride k; k a multiple of 32) into `packed`
 * (lmforge_int4_packed_bytes(n, k) bytes); 0 where it is not the layout's (k not a multiple of 32). */
int lmforge_int4_pack(const int8_t *q, int64_t n, int64_t k, uint8_t *packed) {
  if (k % KT) return 0;
  const int64_t np = padded_n(n), tiles = k / KT;
  for (int64_t b = 0; b < np / BLOCK; b++)
    for (int64_t t = 0; t < tiles; t++) {
      uint8_t *out = packed + (b * tiles + t) * 256;
      for (int p = 0; p < 8; p++)
        for (int j = 0; j < 32; j++) {
          const int64_t c = b * BLOCK + j / 2;
          uint8_t lo = 8, hi = 8; /* 0 in the padding channels */
          if (c < n) {
            lo = (uint8_t)(q[c * k + t * KT + 2 * (2 * p) + j % 2] + 8);
            hi = (uint8_t)(q[c * k + t * KT + 2 * (2 * p + 1) + j % 2] + 8);
          }
          out[p * 32 + j] = (uint8_t)((lo & 15) | (hi & 15) << 4);
        }
    }
  return 1;
}


#ifdef LMFORGE_X86
#define BF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#define R 8 /* rows per pass over a block of channels: 8 accumulators, one unpacked weight vector */

/* 1 where this CPU runs lmforge_int4_linear (AVX-512 BF16), else 0 */
int lmforge_int4_usable(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512bf16");
}

/* rows x k float32 (row stride x_stride) to bfloat16 (row stride k) */
BF16 static void to_bf16(const float *x, int64_t rows, int64_t k, int64_t x_stride, uint16_t *xb) {
  for (int64_t r = 0; r < rows; r++) {
    const float *row = x + r * x_stride;
    uint16_t *out = xb + r * k;
    for (int64_t i = 0; i < k; i += 32) {
      __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(row + i + 16), _mm512_loadu_ps(row + i));
      _mm512_storeu_si512((void *)(out + i), (__m512i)two);
    }
  }
}

/* `nr` (1..R, a constant where it is inlined) rows' sums over one group of one block of 16 channels:
 * each 32 bytes of the packed weight unpack (nibble -> bfloat16 of q - 8 by a 16-entry lookup) into two
 * vectors of 16 channels x one input pair, which vdpbf16ps multiplies with that pair of each row
 * (broadcast) into the row's accumulator; then out += sum * scale (the first group: out = sum * scale).
 * A row's operations are the same whatever nr is. */
BF16 static inline __attribute__((always_inline)) void group_rows(
    const int nr, const uint32_t *xr, int64_t pairs_per_row, const uint8_t *wg, int64_t per_group, __m512i lut,
    __m512 s, int first, float *out, int64_t n, __mmask16 keep) {
  const __m512i low = _mm512_set1_epi16(15);
  __m512 acc[R];
  for (int i = 0; i < nr; i++) acc[i] = _mm512_setzero_ps();
  for (int64_t t = 0; t < per_group; t++) {
    const uint8_t *src = wg + t * 256;
    for (int p = 0; p < 8; p++) {
      const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(src + p * 32)));
      const __m512bh lo = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(w, low), lut);
      const __m512bh hi = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(w, 4), lut);
      const int64_t at = t * 16 + 2 * p; /* the input pair of `lo`; `hi` is the next one */
      for (int i = 0; i < nr; i++) {
        const uint32_t *row = xr + i * pairs_per_row + at;
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_set1_epi32((int)row[0]), lo);
        acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)_mm512_set1_epi32((int)row[1]), hi);
      }
    }
  }
  for (int i = 0; i < nr; i++) {
    float *o = out + i * n;
    const __m512 v = first ? _mm512_mul_ps(acc[i], s) : _mm512_fmadd_ps(acc[i], s, _mm512_maskz_loadu_ps(keep, o));
    _mm512_mask_storeu_ps(o, keep, v);
  }
}

/* y (rows x n, contiguous) = x (rows x k, row stride x_stride) times the packed int4 weight, scaled
 * per group: scale_t is groups x padded n float32 (scale_t[g * np + c]); group a multiple of 32 that
 * divides k; xb is scratch of rows x k bfloat16 (rows * k * 2 bytes) the caller owns. Rows go R at
 * a time, the rest 4, 2 and 1 at a time. */
BF16 void lmforge_int4_linear(const float *x, int64_t rows, int64_t k, int64_t x_stride, const uint8_t *packed,
                              const float *scale_t, int64_t group, const float *bias, int64_t n, float *y,
                              uint16_t *xb) {
  const int64_t np = padded_n(n), tiles = k / KT, per_group = group / KT, groups = k / group;
  to_bf16(x, rows, k, x_stride, xb);
  uint16_t table[32];
  for (int i = 0; i < 32; i++) {
    const float v = (float)((i & 15) - 8);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    table[i] = (uint16_t)(bits >> 16); /* exact: a small integer */
  }
  const __m512i lut = _mm512_loadu_si512((const void *)table);
  const uint32_t *xw = (const uint32_t *)xb; /* input pairs: row r, pair i at xw[r * k / 2 + i] */
  const int64_t ppr = k / 2;
  for (int64_t b = 0; b < np / BLOCK; b++) {
    const int64_t c0 = b * BLOCK, width = n - c0 < BLOCK ? n - c0 : BLOCK;
    const __mmask16 keep = (__mmask16)((1u << width) - 1);
    for (int64_t g = 0; g < groups; g++) {
      const uint8_t *wg = packed + (b * tiles + g * per_group) * 256;
      const __m512 s = _mm512_maskz_loadu_ps(keep, scale_t + g * np + c0);
      const uint32_t *xg = xw + g * group / 2;
      float *yg = y + c0;
      int64_t r0 = 0;
      for (; r0 + R <= rows; r0 += R)
        group_rows(R, xg + r0 * ppr, ppr, wg, per_group, lut, s, g == 0, yg + r0 * n, n, keep);
      if (rows - r0 >= 4) {
        group_rows(4, xg + r0 * ppr, ppr, wg, per_group, lut, s, g == 0, yg + r0 * n, n, keep);
        r0 += 4;
      }
      if (rows - r0 >= 2) {
        group_rows(2, xg + r0 * ppr, ppr, wg, per_group, lut, s, g == 0, yg + r0 * n, n, keep);
        r0 += 2;
      }
      if (rows - r0 >= 1) group_rows(1, xg + r0 * ppr, ppr, wg, per_group, lut, s, g == 0, yg + r0 * n, n, keep);
    }
    if (bias != NULL) {
      const __m512 bv = _mm512_maskz_loadu_ps(keep, bias + c0);
      for (int64_t r = 0; r < rows; r++) {
        float *out = y + r * n + c0;
        _mm512_mask_storeu_ps(out, keep, _mm512_add_ps(_mm512_maskz_loadu_ps(keep, out), bv));
      }
    }
  }
}
#else
int lmforge_int4_usable(void) { return 0; }
void lmforge_int4_linear(const float *x, int64_t rows, int64_t k, int64_t x_stride, const uint8_t *packed,
                         const float *scale_t, int64_t group, const float *bias, int64_t n, float *y,
                         uint16_t *xb) {
  (void)x, (void)rows, (void)k, (void)x_stride, (void)packed, (void)scale_t, (void)group, (void)bias;
  (void)n, (void)y, (void)xb;
}
#endif
