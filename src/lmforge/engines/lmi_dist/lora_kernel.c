/* LMI-Dist's fused LoRA pass for a CPU decode step: out[row] += (x[row] A^T)(s B^T) of each row's own
 * adapter, in one call per adapted layer that reads each adapter's factors once, front to back.
 *
 * Built by setuptools as lmforge/engines/lmi_dist/_lora_kernel*.so (a plain shared library, no Python
 * API: lmforge.engines.lmi_dist.lora_kernel loads it with ctypes). It reads each adapter's factors
 * where the adapter's host copy keeps them (lora.LoraLayers._read): A^T as [in, r] and (s B)^T as
 * [r, n], float32, C-contiguous, r the adapter's own rank. A table gives, per adapter of the step, the
 * addresses of its two factors for this layer and its rank, so a step whose set of adapters changes
 * stacks nothing.
 *
 * Why: in a decode step each adapter has one or a few rows, so its two products are matrix-vector
 * products over 18-48 KB of factors that arrive from memory. Two batched BLAS products per layer pay
 * a BLAS call's fixed cost twice and read the factors in the order a GEMM tiles them; this pass
 * streams them (docs/performance.md, "LoRA adapters on LMI-Dist").
 *
 * The AVX2+FMA path is picked at run time (function attributes, __builtin_cpu_supports), so the
 * library loads on any x86-64 CPU; other CPUs (aarch64) get the portable loop, which the compiler
 * vectorizes. Results equal the batched products to float32 rounding (they sum in another order).
 */
#include <stddef.h>
#include <stdint.h>

/* rows of one adapter handled together: their rank-r intermediates live in a stack buffer */
#define CHUNK 8
#define MAX_RANK 512

/* One adapter's rows: slot s is row rows[s] (-1: padding) or first + s when rows is NULL. */
static void adapter_portable(const float *x, float *out, const float *at_a, const float *bt_a, int64_t r,
                             const int64_t *rows, int64_t first, int64_t slots, int64_t in, int64_t n,
                             int64_t x_stride, int64_t out_stride) {
  float h[CHUNK * MAX_RANK];
  for (int64_t s0 = 0; s0 < slots; s0 += CHUNK) {
    int64_t m = slots - s0 < CHUNK ? slots - s0 : CHUNK;
    int64_t row[CHUNK];
    for (int64_t t = 0; t < m; t++) row[t] = rows ? rows[s0 + t] : first + s0 + t;
    for (int64_t t = 0; t < m * r; t++) h[t] = 0.0f;
    for (int64_t i = 0; i < in; i++) {
      const float *ai = at_a + i * r;
      for (int64_t t = 0; t < m; t++) {
        if (row[t] < 0) continue;
        float xi = x[row[t] * x_stride + i];
        float *ht = h + t * r;
        for (int64_t j = 0; j < r; j++) ht[j] += xi * ai[j];
      }
    }
    for (int64_t t = 0; t < m; t++) {
      if (row[t] < 0) continue;
      float *o = out + row[t] * out_stride;
      const float *ht = h + t * r;
      for (int64_t j = 0; j < r; j++) {
        const float *bj = bt_a + j * n;
        float hj = ht[j];
        for (int64_t c = 0; c < n; c++) o[c] += hj * bj[c];
      }
    }
  }
}

#if defined(__x86_64__)
#include <immintrin.h>

/* r a multiple of 4: each row's intermediate is r / 8 vectors of 8 lanes, then one of 4 when r % 8 = 4. */
__attribute__((target("avx2,fma"))) static void adapter_avx2(
    const float *x, float *out, const float *at_a, const float *bt_a, int64_t r, const int64_t *rows,
    int64_t first, int64_t slots, int64_t in, int64_t n, int64_t x_stride, int64_t out_stride) {
  float h[CHUNK * MAX_RANK];
  const int64_t q = r / 8;
  for (int64_t s0 = 0; s0 < slots; s0 += CHUNK) {
    int64_t m = slots - s0 < CHUNK ? slots - s0 : CHUNK;
    int64_t row[CHUNK];
    for (int64_t t = 0; t < m; t++) row[t] = rows ? rows[s0 + t] : first + s0 + t;
    /* h[t] = x[row t] A^T: A^T's rows (r floats each) are read in order, once per chunk */
    for (int64_t t = 0; t < m; t++) {
      if (row[t] < 0) continue;
      const float *xt = x + row[t] * x_stride;
      for (int64_t g = 0; g < q; g++) {
        const float *ag = at_a + 8 * g;
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 4 <= in; i += 4) {
          acc0 = _mm256_fmadd_ps(_mm256_set1_ps(xt[i]), _mm256_loadu_ps(ag + i * r), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_set1_ps(xt[i + 1]), _mm256_loadu_ps(ag + (i + 1) * r), acc1);
          acc2 = _mm256_fmadd_ps(_mm256_set1_ps(xt[i + 2]), _mm256_loadu_ps(ag + (i + 2) * r), acc2);
          acc3 = _mm256_fmadd_ps(_mm256_set1_ps(xt[i + 3]), _mm256_loadu_ps(ag + (i + 3) * r), acc3);
        }
        for (; i < in; i++)
          acc0 = _mm256_fmadd_ps(_mm256_set1_ps(xt[i]), _mm256_loadu_ps(ag + i * r), acc0);
        _mm256_storeu_ps(h + t * r + 8 * g,
                         _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
      }
      if (r % 8) { /* the last 4 lanes of the rank */
        const float *ag = at_a + 8 * q;
        __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
        int64_t i = 0;
        for (; i + 2 <= in; i += 2) {
          acc0 = _mm_fmadd_ps(_mm_set1_ps(xt[i]), _mm_loadu_ps(ag + i * r), acc0);
          acc1 = _mm_fmadd_ps(_mm_set1_ps(xt[i + 1]), _mm_loadu_ps(ag + (i + 1) * r), acc1);
        }
        for (; i < in; i++) acc0 = _mm_fmadd_ps(_mm_set1_ps(xt[i]), _mm_loadu_ps(ag + i * r), acc0);
        _mm_storeu_ps(h + t * r + 8 * q, _mm_add_ps(acc0, acc1));
      }
    }
    /* out[row t] += h[t] (s B)^T: 16 columns at a time, the r rows of (s B)^T read in order */
    for (int64_t t = 0; t < m; t++) {
      if (row[t] < 0) continue;
      float *o = out + row[t] * out_stride;
      const float *ht = h + t * r;
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
      for (; c < n; c++) {
        float sum = o[c];
        for (int64_t j = 0; j < r; j++) sum += ht[j] * bt_a[j * n + c];
        o[c] = sum;
      }
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
    if (isa == 2 && forced_isa != 1 && r % 4 == 0) {
      adapter_avx2(x, out, at_a, bt_a, r, rows_a, a * slots, slots, in, n, x_stride, out_stride);
      continue;
    }
#endif
    adapter_portable(x, out, at_a, bt_a, r, rows_a, a * slots, slots, in, n, x_stride, out_stride);
  }
  return 0;
}
