/* LMI-Dist's W8A8 linear layer on the CPU: int8 weights (one scale per output channel) times int8
 * activations (one scale per row, symmetric, made here at each call), summed exactly in int32 with
 * AVX-512 VNNI (vpdpbusd), as compressed-tensors' W8A8 scheme declares it.
 *
 * Built into the same shared library as lora_kernel.c (setup.py); lmforge.engines.lmi_dist.int8_kernel
 * loads it with ctypes.
 *
 * Why: at a decode step of one or a few rows the product is bound by reading the int8 weight from
 * memory. fbgemm's dynamic-quantized linear, the kernel LMI-Dist used before, reads it at about a
 * third of the bandwidth one core has on the machines we measured, and it quantizes a batch with one
 * range, which LMI-Dist had to work around with a sentinel row. Here the weight is packed once into
 * the order the loop reads it (one stream, 256 bytes a step), and each row is quantized by its own
 * scale.
 *
 * From 8 rows up, where the CPU has AMX and k is a multiple of 64, the products run on AMX tiles
 * (tdpbusd) over the same packed weight and activations: the same exact int32 sums, the same epilogue.
 * For SmolLM2-135M's layers at 32 rows that is ~45 ms against ~63 ms on the VNNI loop (one thread).
 *
 * Batch-invariant: a row's output is computed from that row's own input, the weight and nothing
 * else, by one fixed sequence of operations whatever the other rows are: q = round-half-even(x * (127
 * / max|x|)) clamped to [-127, 127]; the int32 sum of q * w over k is exact (|q * w| <= 127 * 128 and
 * k < 2^17), whatever order the loop takes; y = ((float)sum * w_scale) * x_scale (+ bias), three
 * float32 roundings in that order. The blocking by rows therefore changes no bit, and neither does
 * the portable path, which does the same operations in scalar C, nor the AMX one (tests check each
 * against a reference in PyTorch, bit for bit).
 *
 * vpdpbusd multiplies unsigned by signed bytes: the activations are stored as q + 128 (0..255) and
 * 128 * sum_k w[n][k] is taken back from each sum, which is exact too.
 *
 * Packed layout of an n x k weight: k padded to a multiple of 4 (kp), n to a multiple of 64; for each
 * group of 64 output channels, for each 4 inputs j (kp / 4 of them), 4 blocks of 16 channels of 4
 * bytes: byte [(g * kp / 4 + j) * 256 + b * 64 + c * 4 + i] = w[64 g + 16 b + c][4 j + i], 0 in the
 * padding.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LMFORGE_X86 1
#endif

#define GROUP 64
#define ROWS 4 /* rows per pass over a channel group: 4 x 4 accumulators, 4 weight vectors */

int lmforge_int8_isa(void);
int lmforge_int8_amx(void);

static int64_t padded_k(int64_t k) { return (k + 3) / 4 * 4; }
static int64_t padded_n(int64_t n) { return (n + GROUP - 1) / GROUP * GROUP; }

int64_t lmforge_int8_packed_bytes(int64_t n, int64_t k) { return padded_n(n) * padded_k(k); }

/* Pack w (n x k int8, row stride k) into `packed` (lmforge_int8_packed_bytes(n, k) bytes) and write
 * 128 * sum_k w[c][k] into comp[c] for c < padded n (0 for padding channels). */
void lmforge_int8_pack(const int8_t *w, int64_t n, int64_t k, int8_t *packed, int32_t *comp) {
  const int64_t kp = padded_k(k), np = padded_n(n), steps = kp / 4;
  memset(packed, 0, (size_t)(np * kp));
  for (int64_t c = 0; c < np; c++) {
    int32_t sum = 0;
    if (c < n) {
      const int64_t g = c / GROUP, b = (c % GROUP) / 16, lane = c % 16;
      for (int64_t i = 0; i < k; i++) {
        const int8_t v = w[c * k + i];
        sum += v;
        packed[(g * steps + i / 4) * 256 + b * 64 + lane * 4 + i % 4] = v;
      }
    }
    comp[c] = 128 * sum;
  }
}

/* one row quantized: xq[i] = q + 128 (kp bytes, 128 in the padding), returns the row's scale */
static float quantize_row_portable(const float *x, int64_t k, int64_t kp, uint8_t *xq) {
  float m = 0.0f;
  for (int64_t i = 0; i < k; i++) {
    const float a = fabsf(x[i]);
    m = a > m ? a : m;
  }
  if (!(m > 0.0f)) { /* a zero row: every q is 0 */
    memset(xq, 128, (size_t)kp);
    return m;
  }
  const float inv = 127.0f / m;
  for (int64_t i = 0; i < k; i++) {
    float q = nearbyintf(x[i] * inv);
    q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
    xq[i] = (uint8_t)((int32_t)q + 128);
  }
  for (int64_t i = k; i < kp; i++) xq[i] = 128;
  return m / 127.0f;
}

static void linear_portable(const uint8_t *xq, const float *xs, int64_t rows, int64_t kp, const int8_t *packed,
                            const int32_t *comp, const float *wscale, const float *bias, int64_t n, float *y) {
  const int64_t steps = kp / 4;
  for (int64_t r = 0; r < rows; r++) {
    const uint8_t *xr = xq + r * kp;
    for (int64_t c = 0; c < n; c++) {
      const int8_t *wg = packed + (c / GROUP) * steps * 256 + ((c % GROUP) / 16) * 64 + (c % 16) * 4;
      int32_t sum = 0;
      for (int64_t j = 0; j < steps; j++)
        for (int64_t i = 0; i < 4; i++) sum += (int32_t)xr[4 * j + i] * (int32_t)wg[j * 256 + i];
      float v = (float)(sum - comp[c]) * wscale[c];
      v = v * xs[r];
      if (bias) v = v + bias[c];
      y[r * n + c] = v;
    }
  }
}

#ifdef LMFORGE_X86
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

VNNI static float quantize_row_vnni(const float *x, int64_t k, int64_t kp, uint8_t *xq) {
  __m512 vm = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) vm = _mm512_max_ps(vm, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
  float m = _mm512_reduce_max_ps(vm);
  for (; i < k; i++) {
    const float a = fabsf(x[i]);
    m = a > m ? a : m;
  }
  if (!(m > 0.0f)) return quantize_row_portable(x, k, kp, xq);
  const float inv = 127.0f / m;
  const __m512 vinv = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
  const __m512i off = _mm512_set1_epi32(128);
  for (i = 0; i + 16 <= k; i += 16) {
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vinv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    _mm_storeu_si128((__m128i *)(xq + i), _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), off)));
  }
  for (; i < k; i++) {
    float q = nearbyintf(x[i] * inv);
    q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
    xq[i] = (uint8_t)((int32_t)q + 128);
  }
  for (; i < kp; i++) xq[i] = 128;
  return m / 127.0f;
}

/* y[r][c0 + c] for R rows and the 64 channels of a group from their exact sums (sums[c / 16][r * 16 +
 * c % 16]): ((float)(sum - comp) * w_scale) * x_scale (+ bias), the one epilogue of every path */
VNNI static inline __attribute__((always_inline)) void finish_group(const int32_t sums[4][256], int64_t R,
                                                                     const float *xs, const int32_t *comp,
                                                                     const float *wscale, const float *bias,
                                                                     int64_t n, int64_t c0, float *y) {
  for (int b = 0; b < 4; b++) {
    const int64_t c = c0 + 16 * b;
    if (c >= n) break;
    const __mmask16 keep = n - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - c)) - 1u);
    const __m512i vc = _mm512_maskz_loadu_epi32(keep, comp + c);
    const __m512 vw = _mm512_maskz_loadu_ps(keep, wscale + c);
    const __m512 vb = bias ? _mm512_maskz_loadu_ps(keep, bias + c) : _mm512_setzero_ps();
    for (int64_t r = 0; r < R; r++) {
      __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(sums[b] + r * 16), vc)), vw);
      v = _mm512_mul_ps(v, _mm512_set1_ps(xs[r]));
      if (bias) v = _mm512_add_ps(v, vb);
      _mm512_mask_storeu_ps(y + r * n + c, keep, v);
    }
  }
}

/* R rows (1..ROWS) times one group of 64 channels */
VNNI static inline __attribute__((always_inline)) void group_vnni(const uint8_t *xq, const float *xs, int R,
                                                                   int64_t kp, const int8_t *wg, const int32_t *comp,
                                                                   const float *wscale, const float *bias, int64_t n,
                                                                   int64_t c0, float *y) {
  __m512i acc[ROWS][4];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < 4; b++) acc[r][b] = _mm512_setzero_si512();
  const int64_t steps = kp / 4;
  for (int64_t j = 0; j < steps; j++) {
    const int8_t *wj = wg + j * 256;
    const __m512i w0 = _mm512_loadu_si512(wj), w1 = _mm512_loadu_si512(wj + 64);
    const __m512i w2 = _mm512_loadu_si512(wj + 128), w3 = _mm512_loadu_si512(wj + 192);
    for (int r = 0; r < R; r++) {
      int32_t four;
      memcpy(&four, xq + r * kp + 4 * j, 4);
      const __m512i xb = _mm512_set1_epi32(four);
      acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], xb, w1);
      acc[r][2] = _mm512_dpbusd_epi32(acc[r][2], xb, w2);
      acc[r][3] = _mm512_dpbusd_epi32(acc[r][3], xb, w3);
    }
  }
  int32_t sums[4][256];
  for (int r = 0; r < R; r++)
    for (int b = 0; b < 4; b++) _mm512_storeu_si512(sums[b] + r * 16, acc[r][b]);
  finish_group(sums, R, xs, comp, wscale, bias, n, c0, y);
}

VNNI static void linear_vnni(const uint8_t *xq, const float *xs, int64_t rows, int64_t kp, const int8_t *packed,
                             const int32_t *comp, const float *wscale, const float *bias, int64_t n, float *y) {
  const int64_t steps = kp / 4;
  for (int64_t c0 = 0; c0 < n; c0 += GROUP) {
    const int8_t *wg = packed + (c0 / GROUP) * steps * 256;
    int64_t r = 0;
    for (; r + ROWS <= rows; r += ROWS)
      group_vnni(xq + r * kp, xs + r, ROWS, kp, wg, comp, wscale, bias, n, c0, y + r * n);
    switch (rows - r) {
      case 3: group_vnni(xq + r * kp, xs + r, 3, kp, wg, comp, wscale, bias, n, c0, y + r * n); break;
      case 2: group_vnni(xq + r * kp, xs + r, 2, kp, wg, comp, wscale, bias, n, c0, y + r * n); break;
      case 1: group_vnni(xq + r * kp, xs + r, 1, kp, wg, comp, wscale, bias, n, c0, y + r * n); break;
      default: break;
    }
  }
}
#endif


#ifdef LMFORGE_X86
/* AMX (tdpbusd): 16 rows x 16 channels x 64 bytes of k per instruction, on the same packed weight (a
 * block of 16 channels over 16 k-steps is a 16 x 64-byte tile at a row stride of 256 bytes) and the same
 * u8 activations, so its int32 sums are the VNNI loop's exactly and its epilogue is the same: rows
 * computed here are the same bits as rows computed there. Used from AMX_MIN_ROWS rows up where k is a
 * multiple of 64 and the process may use AMX (Linux grants it on request). */
#include <sys/syscall.h>
#include <unistd.h>
#define AMX_MIN_ROWS 8
#define AMX __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))

struct tile_config {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

static int amx_state = -1; /* -1: not asked yet, 0: no, 1: yes */

static int amx_usable(void) {
  if (amx_state < 0) {
    amx_state = 0;
    if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-int8") &&
        __builtin_cpu_supports("avx512vnni"))
      amx_state = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  }
  return amx_state;
}

/* rows (padded to 16 in xq, 128 in the padding rows) x all channels */
AMX static void linear_amx(const uint8_t *xq, const float *xs, int64_t rows, int64_t kp, const int8_t *packed,
                           const int32_t *comp, const float *wscale, const float *bias, int64_t n, float *y) {
  struct tile_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.palette = 1;
  for (int t = 0; t < 8; t++) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
  const int64_t steps = kp / 4, chunks = kp / 64;
  int32_t acc[4][16 * 16];
  for (int64_t c0 = 0; c0 < n; c0 += GROUP) {
    const int8_t *wg = packed + (c0 / GROUP) * steps * 256;
    for (int64_t r0 = 0; r0 < rows; r0 += 16) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      const uint8_t *xa = xq + r0 * kp;
      for (int64_t kc = 0; kc < chunks; kc++) {
        const int8_t *wk = wg + kc * 16 * 256;
        if (r0 == 0) { /* the weight streams from memory once: ask for the chunk after next now (a
                          prefetch past the end of the buffer is a hint, never a fault) */
          const char *next = (const char *)(wk + 2 * 16 * 256);
          for (int line = 0; line < 64; line++) _mm_prefetch(next + line * 64, _MM_HINT_T0);
        }
        _tile_loadd(4, xa + kc * 64, kp);
        _tile_loadd(5, wk, 256);
        _tile_dpbusd(0, 4, 5);
        _tile_loadd(6, wk + 64, 256);
        _tile_dpbusd(1, 4, 6);
        _tile_loadd(7, wk + 128, 256);
        _tile_dpbusd(2, 4, 7);
        _tile_loadd(5, wk + 192, 256);
        _tile_dpbusd(3, 4, 5);
      }
      _tile_stored(0, acc[0], 64);
      _tile_stored(1, acc[1], 64);
      _tile_stored(2, acc[2], 64);
      _tile_stored(3, acc[3], 64);
      const int64_t rn = rows - r0 < 16 ? rows - r0 : 16;
      finish_group(acc, rn, xs + r0, comp, wscale, bias, n, c0, y + r0 * n);
    }
  }
  _tile_release();
}
#endif

static int forced_portable = 0;
static int forced_no_amx = 0;

/* 1 where batches of AMX_MIN_ROWS rows and more run on AMX (where k allows), else 0 */
int lmforge_int8_amx(void) {
#ifdef LMFORGE_X86
  return !forced_no_amx && lmforge_int8_isa() == 2 && amx_usable();
#else
  return 0;
#endif
}

void lmforge_int8_force_no_amx(int no) { forced_no_amx = no; }

/* bytes of the xq scratch lmforge_int8_linear needs for `rows` rows of k inputs (rows padded to 16) */
int64_t lmforge_int8_scratch_bytes(int64_t rows, int64_t k) { return (rows + 15) / 16 * 16 * padded_k(k); }

/* 2 where the AVX-512 VNNI path runs, 1 for the portable loop */
int lmforge_int8_isa(void) {
#ifdef LMFORGE_X86
  if (!forced_portable && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vnni"))
    return 2;
#endif
  return 1;
}

void lmforge_int8_force_portable(int portable) { forced_portable = portable; }

/* y (rows x n, contiguous) = the W8A8 product of x (rows x k, row stride x_stride) with a packed
 * weight; xq (lmforge_int8_scratch_bytes(rows, k) bytes) and xs (rows floats) are scratch the caller
 * owns. */
void lmforge_int8_linear(const float *x, int64_t rows, int64_t k, int64_t x_stride, const int8_t *packed,
                         const int32_t *comp, const float *wscale, const float *bias, int64_t n, float *y,
                         uint8_t *xq, float *xs) {
  const int64_t kp = padded_k(k);
#ifdef LMFORGE_X86
  if (lmforge_int8_isa() == 2) {
    for (int64_t r = 0; r < rows; r++) xs[r] = quantize_row_vnni(x + r * x_stride, k, kp, xq + r * kp);
    if (rows >= AMX_MIN_ROWS && kp % 64 == 0 && lmforge_int8_amx()) {
      const int64_t padded = (rows + 15) / 16 * 16;
      memset(xq + rows * kp, 128, (size_t)((padded - rows) * kp));
      linear_amx(xq, xs, rows, kp, packed, comp, wscale, bias, n, y);
      return;
    }
    linear_vnni(xq, xs, rows, kp, packed, comp, wscale, bias, n, y);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; r++) xs[r] = quantize_row_portable(x + r * x_stride, k, kp, xq + r * kp);
  linear_portable(xq, xs, rows, kp, packed, comp, wscale, bias, n, y);
}
