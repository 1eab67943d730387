/* LMI-Dist's fused LoRA pass for a CPU decode step: out[row] += (x[row] A^T)(s B^T) of each row's own
 * adapter, in one call per adapted layer that reads each adapter's factors once, front to back.
 *
 * Built by setuptools as lmforge/engines/lmi_dist/_lora_kernel*.so (a plain shared library, no Python
 * API: lmforge.engines.lmi_dist.lora_kernel loads it with ctypes). The layouts are those of
 * lora_mixed.build_stacks: A^T as [k, in, r] and (s B)^T as [k, r, n], float32, C-contiguous, where
 * k is the number of adapters in the step and r the (padded) rank.
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

/* The row of x/out that slot s (of k * slots) reads and writes, or -1 for a padding slot. */
static inline int64_t row_of(const int64_t *rows, int64_t s) { return rows ? rows[s] : s; }

static void pass_portable(const float *x, float *out, const float *at, const float *bt,
                          const int64_t *rows, int64_t k, int64_t slots, int64_t in, int64_t n,
                          int64_t r, int64_t x_stride, int64_t out_stride) {
  float h[CHUNK * MAX_RANK];
  for (int64_t a = 0; a < k; a++) {
    const float *at_a = at + a * in * r;
    const float *bt_a = bt + a * r * n;
    for (int64_t s0 = 0; s0 < slots; s0 += CHUNK) {
      int64_t m = slots - s0 < CHUNK ? slots - s0 : CHUNK;
      int64_t row[CHUNK];
      for (int64_t t = 0; t < m; t++) row[t] = row_of(rows, a * slots + s0 + t);
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
}

#if defined(__x86_64__)
#include <immintrin.h>

/* r a multiple of 8: each row's intermediate is r / 8 vectors of 8 lanes. */
__attribute__((target("avx2,fma"))) static void pass_avx2(
    const float *x, float *out, const float *at, const float *bt, const int64_t *rows, int64_t k,
    int64_t slots, int64_t in, int64_t n, int64_t r, int64_t x_stride, int64_t out_stride) {
  float h[CHUNK * MAX_RANK] __attribute__((aligned(32)));
  const int64_t q = r / 8;
  for (int64_t a = 0; a < k; a++) {
    const float *at_a = at + a * in * r;
    const float *bt_a = bt + a * r * n;
    for (int64_t s0 = 0; s0 < slots; s0 += CHUNK) {
      int64_t m = slots - s0 < CHUNK ? slots - s0 : CHUNK;
      int64_t row[CHUNK];
      for (int64_t t = 0; t < m; t++) row[t] = row_of(rows, a * slots + s0 + t);
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
          _mm256_store_ps(h + t * r + 8 * g,
                          _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
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

/* out[row] += (x[row] A_a^T)(s B_a)^T for every slot of every adapter a; slot s of adapter a is row
 * rows[a * slots + s] (-1: padding, skipped), or a * slots + s when rows is NULL. x has x_rows rows
 * x_stride floats apart, out out_rows rows out_stride apart. Returns 0; -1 (nothing done) for a rank
 * over MAX_RANK, -2 for a row outside x or out. */
int lmforge_lora_pass(const float *x, float *out, const float *at, const float *bt,
                      const int64_t *rows, int64_t k, int64_t slots, int64_t in, int64_t n,
                      int64_t r, int64_t x_stride, int64_t out_stride, int64_t x_rows,
                      int64_t out_rows) {
  static int isa = 0;
  int64_t limit = x_rows < out_rows ? x_rows : out_rows;
  if (r <= 0 || r > MAX_RANK) return -1;
  if (rows) {
    for (int64_t s = 0; s < k * slots; s++)
      if (rows[s] < -1 || rows[s] >= limit) return -2;
  } else if (k * slots > limit) {
    return -2;
  }
  if (!isa) isa = lmforge_lora_isa();
#if defined(__x86_64__)
  if (isa == 2 && forced_isa != 1 && r % 8 == 0) {
    pass_avx2(x, out, at, bt, rows, k, slots, in, n, r, x_stride, out_stride);
    return 0;
  }
#endif
  pass_portable(x, out, at, bt, rows, k, slots, in, n, r, x_stride, out_stride);
  return 0;
}
