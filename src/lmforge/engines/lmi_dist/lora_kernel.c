/* LMI-Dist's LoRA pass on the CPU: out[row] += (x[row] A^T)(s B^T) of each row's own adapter, in one
 * call per adapted layer that reads each adapter's factors once, front to back.
 *
 * Built by setuptools as lmforge/engines/lmi_dist/_lora_kernel*.so (a plain shared library, no Python
 * API: lmforge.engines.lmi_dist.lora_kernel loads it with ctypes). It reads each adapter's factors
 * where the adapter's host copy keeps them (lora.LoraLayers._read), or a step's stacked copy of them
 * (lora_mixed.build_stacks): A^T as [in, r] and (s B)^T as [r, n], float32, C-contiguous. A table
 * gives, per adapter of the step, the addresses of its two factors for this layer and its rank, so a
 * step whose set of adapters changes stacks nothing.
 *
 * Why: in a decode step each adapter has one or a few rows, so its two products are matrix-vector
 * products over 18-48 KB of factors that arrive from memory. Two batched BLAS products per layer pay
 * a BLAS call's fixed cost twice and read the factors in the order a GEMM tiles them; this pass
 * streams them (docs/performance.md, "LoRA adapters on LMI-Dist").
 *
 * Batch-invariant: a row's delta is one fixed sequence of float32 operations on that row's own x, its
 * adapter's factors and its own out, whatever the other rows, their number, the row's place among them
 * or the chunk it falls in. Per rank lane j, h_j = (p0 + p1) + (p2 + p3), where p_u is the fused
 * multiply-add chain over the inputs i = u mod 4 of the unrolled part, the last in % 4 inputs going
 * into p0; then out[c] = fma(h_j, bt[j][c], out[c]) for j = 0, 1, ..., r - 1. A lane's sums do not
 * depend on the lanes beside it, so ranks padded with zero columns and rows (a step's stack) give the
 * same bits as the adapter's own rank; the AVX2 path (8 lanes, the last rank lanes masked) and the
 * portable path (scalar fmaf) run that same sequence, so they agree bit for bit. The next layer then
 * sees the same input alone or in a crowd: an int8 layer's per-token activation scale, or an int4
 * layer's bfloat16 cast, cannot round it one step apart.
 *
 * The AVX2+FMA path is picked at run time (function attributes, __builtin_cpu_supports), so the
 * library loads on any x86-64 CPU; other CPUs (aarch64) get the portable loop.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define MAX_RANK 512

/* h[j] = x A^T for one row, lane by lane in the fixed order above */
static void down_portable(const float *xt, const float *at_a, int64_t r, int64_t in, float *h) {
  const int64_t body = in - in % 4;
  for (int64_t j = 0; j < r; j++) {
    float p0 = 0.0f, p1 = 0.0f, p2 = 0.0f, p3 = 0.0f;
    const float *aj = at_a + j;
    int64_t i = 0;
    for (; i < body; i += 4) {
      p0 = fmaf(xt[i], aj[i * r], p0);
      p1 = fmaf(xt[i + 1], aj[(i + 1) * r], p1);
      p2 = fmaf(xt[i + 2], aj[(i + 2) * r], p2);
      p3 = fmaf(xt[i + 3], aj[(i + 3) * r], p3);
    }
    for (; i < in; i++) p0 = fmaf(xt[i], aj[i * r], p0);
    h[j] = (p0 + p1) + (p2 + p3);
  }
}

/* o[c] = fma(h[j], bt[j][c], o[c]) for j in order, for one row */
static void up_portable(const float *h, const float *bt_a, int64_t r, int64_t n, float *o) {
  for (int64_t c = 0; c < n; c++) {
    float sum = o[c];
    for (int64_t j = 0; j < r; j++) sum = fmaf(h[j], bt_a[j * n + c], sum);
    o[c] = sum;
  }
}

/* One adapter's rows: slot s is row rows[s] (-1: padding) or first + s when rows is NULL. */
static void adapter_portable(const float *x, float *out, const float *at_a, const float *bt_a, int64_t r,
                             const int64_t *rows, int64_t first, int64_t slots, int64_t in, int64_t n,
                             int64_t x_stride, int64_t out_stride) {
  float h[MAX_RANK];
  for (int64_t s = 0; s < slots; s++) {
    int64_t row = rows ? rows[s] : first + s;
    if (row < 0) continue;
    down_portable(x + row * x_stride, at_a, r, in, h);
    up_portable(h, bt_a, r, n, out + row * out_stride);
  }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* the lanes of the last group of 8 rank lanes that are in the rank (all 8 when r % 8 == 0) */
__attribute__((target("avx2,fma"))) static __m256i lane_mask(int64_t lanes) {
  const __m256i index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)lanes), index);
}

/* ROWS rows at once (1 or 2): they share the loads of A^T and of (s B)^T; each row's lanes run the
 * fixed sequence on their own accumulators, so the pairing changes no bit. */
#define DOWN_GROUP(ROWS, LOAD)                                                                      \
  do {                                                                                              \
    __m256 acc[ROWS][4];                                                                            \
    for (int t = 0; t < ROWS; t++)                                                                  \
      for (int u = 0; u < 4; u++) acc[t][u] = _mm256_setzero_ps();                                  \
    int64_t i = 0;                                                                                  \
    for (; i < body; i += 4) {                                                                      \
      for (int u = 0; u < 4; u++) {                                                                 \
        __m256 a = LOAD(ag + (i + u) * r);                                                          \
        for (int t = 0; t < ROWS; t++)                                                              \
          acc[t][u] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t][i + u]), a, acc[t][u]);                  \
      }                                                                                             \
    }                                                                                               \
    for (; i < in; i++) {                                                                           \
      __m256 a = LOAD(ag + i * r);                                                                  \
      for (int t = 0; t < ROWS; t++) acc[t][0] = _mm256_fmadd_ps(_mm256_set1_ps(xs[t][i]), a, acc[t][0]); \
    }                                                                                               \
    for (int t = 0; t < ROWS; t++)                                                                  \
      hs[t][g] = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3])); \
  } while (0)

#define FULL_LOAD(p) _mm256_loadu_ps(p)
#define MASK_LOAD(p) _mm256_maskload_ps((p), mask)

/* h = x A^T for ROWS rows, into hs[t][g] (8 lanes each; lanes past the rank are 0) */
#define DOWN(ROWS)                                                                                  \
  do {                                                                                              \
    int64_t g = 0;                                                                                  \
    for (; 8 * (g + 1) <= r; g++) {                                                                 \
      const float *ag = at_a + 8 * g;                                                               \
      DOWN_GROUP(ROWS, FULL_LOAD);                                                                  \
    }                                                                                               \
    if (r % 8) {                                                                                    \
      const float *ag = at_a + 8 * g;                                                               \
      DOWN_GROUP(ROWS, MASK_LOAD);                                                                  \
    }                                                                                               \
  } while (0)

__attribute__((target("avx2,fma"))) static void up_avx2(const float *ht, const float *bt_a, int64_t r,
                                                         int64_t n, float *o) {
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) {
    __m256 acc0 = _mm256_loadu_ps(o + c), acc1 = _mm256_loadu_ps(o + c + 8);
    for (int64_t j = 0; j < r; j++) {
      __m256 hj = _mm256_set1_ps(ht[j]);
      acc0 = _mm256_fmadd_ps(hj, _mm256_loadu_ps(bt_a + j * n + c), acc0);
      acc1 = _mm256_fmadd_ps(hj, _mm256_loadu_ps(bt_a + j * n + c + 8), acc1);
    }
    _mm256_storeu_ps(o + c, acc0);
    _mm256_storeu_ps(o + c + 8, acc1);
  }
  for (; c + 8 <= n; c += 8) {
    __m256 acc = _mm256_loadu_ps(o + c);
    for (int64_t j = 0; j < r; j++)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ht[j]), _mm256_loadu_ps(bt_a + j * n + c), acc);
    _mm256_storeu_ps(o + c, acc);
  }
  for (; c < n; c++) {
    float sum = o[c];
    for (int64_t j = 0; j < r; j++) sum = fmaf(ht[j], bt_a[j * n + c], sum);
    o[c] = sum;
  }
}

__attribute__((target("avx2,fma"))) static void adapter_avx2(
    const float *x, float *out, const float *at_a, const float *bt_a, int64_t r, const int64_t *rows,
    int64_t first, int64_t slots, int64_t in, int64_t n, int64_t x_stride, int64_t out_stride) {
  const int64_t body = in - in % 4;
  const __m256i mask = lane_mask(r % 8 ? r % 8 : 8);
  __m256 hs[2][MAX_RANK / 8];
  float h[2][MAX_RANK];
  int64_t s = 0;
  while (s < slots) {
    /* the next one or two rows that are not padding */
    int64_t pick[2];
    int found = 0;
    for (; s < slots && found < 2; s++) {
      int64_t row = rows ? rows[s] : first + s;
      if (row >= 0) pick[found++] = row;
    }
    if (!found) break;
    const float *xs[2] = {x + pick[0] * x_stride, x + pick[found - 1] * x_stride};
    if (found == 2)
      DOWN(2);
    else
      DOWN(1);
    for (int t = 0; t < found; t++) {
      for (int64_t g = 0; 8 * g < r; g++) _mm256_storeu_ps(h[t] + 8 * g, hs[t][g]);
      up_avx2(h[t], bt_a, r, n, out + pick[t] * out_stride);
    }
  }
}
#endif

/* Which pass lmforge_lora_pass runs on this CPU: 2 = AVX2+FMA, 1 = portable. */
int lmforge_lora_isa(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
#endif
  return 1;
}

static int forced_isa = 0;

/* Run the portable pass (1), or the best this CPU has (0, the default); for tests. */
void lmforge_lora_force_isa(int isa) { forced_isa = isa; }

/* out[row] += (x[row] A_a^T)(s B_a)^T for every slot of every adapter a < k. adapters holds k triples
 * (address of A_a^T [in, r_a], address of (s B_a)^T [r_a, n], r_a); a zero address: the adapter leaves
 * this layer alone. Slot s of adapter a is row rows[a * slots + s] (-1: padding, skipped), or
 * a * slots + s when rows is NULL. x has x_rows rows x_stride floats apart, out out_rows rows
 * out_stride apart. Checks every row and rank first: returns 0; -1 (nothing done) for a rank outside
 * 1..MAX_RANK, -2 for a row outside x or out. */
int lmforge_lora_pass(const float *x, float *out, const int64_t *adapters, const int64_t *rows,
                      int64_t k, int64_t slots, int64_t in, int64_t n, int64_t x_stride,
                      int64_t out_stride, int64_t x_rows, int64_t out_rows) {
  static int isa = 0;
  int64_t limit = x_rows < out_rows ? x_rows : out_rows;
  for (int64_t a = 0; a < k; a++)
    if (adapters[3 * a] && (adapters[3 * a + 2] <= 0 || adapters[3 * a + 2] > MAX_RANK)) return -1;
  if (rows) {
    for (int64_t s = 0; s < k * slots; s++)
      if (rows[s] < -1 || rows[s] >= limit) return -2;
  } else if (k * slots > limit) {
    return -2;
  }
  if (!isa) isa = lmforge_lora_isa();
  for (int64_t a = 0; a < k; a++) {
    const float *at_a = (const float *)(intptr_t)adapters[3 * a];
    const float *bt_a = (const float *)(intptr_t)adapters[3 * a + 1];
    int64_t r = adapters[3 * a + 2];
    const int64_t *rows_a = rows ? rows + a * slots : NULL;
    if (!at_a) continue;
#if defined(__x86_64__)
    if (isa == 2 && forced_isa != 1) {
      adapter_avx2(x, out, at_a, bt_a, r, rows_a, a * slots, slots, in, n, x_stride, out_stride);
      continue;
    }
#endif
    adapter_portable(x, out, at_a, bt_a, r, rows_a, a * slots, slots, in, n, x_stride, out_stride);
  }
  return 0;
}

/* --- W8A8: the per-token scaling around fbgemm's int8 linear (cpu_linear.Int8Weight) -------------
 *
 * Int8Weight divides each input row by its own largest magnitude and appends the constant row
 * (-1, 1, 0, ...) so that fbgemm's one-scale-per-batch quantization is a per-token one; the output
 * rows are then multiplied back and the bias added. In PyTorch that is eight operator calls around
 * each int8 product, which cost as much as the product itself at one row (45 us of a 85 us call for
 * SmolLM2-135M's 960 x 576 q/k/v). These two calls do the same float32 operations (an IEEE division
 * by the magnitude, then a multiplication and an addition per output), so the results are the same
 * bits as PyTorch's, and each row's depends on that row alone. */

/* buf[r] = x[r] / m[r] for r < n, m[r] = max(max_i |x[r][i]|, 1e-30); buf[n] = (-1, 1, 0, ...). */
void lmforge_int8_scale_rows(const float *x, int64_t n, int64_t in, int64_t x_stride, float *buf, float *mags) {
  for (int64_t r = 0; r < n; r++) {
    const float *xr = x + r * x_stride;
    float m = 0.0f;
    for (int64_t i = 0; i < in; i++) {
      float a = fabsf(xr[i]);
      m = a > m ? a : m;
    }
    m = m < 1e-30f ? 1e-30f : m;
    mags[r] = m;
    float *br = buf + r * in;
    for (int64_t i = 0; i < in; i++) br[i] = xr[i] / m;
  }
  float *s = buf + n * in;
  for (int64_t i = 0; i < in; i++) s[i] = 0.0f;
  s[0] = -1.0f;
  if (in > 1) s[1] = 1.0f;
}

/* y[r][c] = y[r][c] * m[r] (+ bias[c]) for r < n, in place (y: n rows of `out`, contiguous). */
void lmforge_int8_unscale_rows(float *y, int64_t n, int64_t out, const float *mags, const float *bias) {
  for (int64_t r = 0; r < n; r++) {
    float *yr = y + r * out;
    const float m = mags[r];
    if (bias) {
      for (int64_t c = 0; c < out; c++) yr[c] = yr[c] * m + bias[c];
    } else {
      for (int64_t c = 0; c < out; c++) yr[c] *= m;
    }
  }
}
