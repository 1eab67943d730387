/* LMI-Dist's decode attention on the CPU: each decode row (one query per request) against its own
 * keys, read in place from the paged cache through the row's slot list, in float32.
 *
 * Built into the same shared library as lora_kernel.c (setup.py); lmforge.engines.lmi_dist.attention
 * calls it with ctypes for float32 CPU steps.
 *
 * Why: PyTorch's way first gathers every row's keys and values into a padded block (index_select,
 * a copy of the whole context per layer) and then runs one masked SDPA over the block; on SmolLM2-135M
 * at 32 rows the two gathers cost more than the attention itself. Here each key and value is read once,
 * where it lies, by the query heads that share its key head.
 *
 * Batch-invariant: a row's output is computed from its own query, its own keys and values and nothing
 * else, by one fixed sequence of operations (the same vector widths, the same summation order) whatever
 * the other rows are, so a request's tokens do not depend on the requests beside it. Results differ
 * from PyTorch's SDPA by float rounding only (tests compare them).
 *
 * Per row, for each key head: s_j = (q . k_j) * scale over the row's keys, m = max s_j, p_j =
 * exp(s_j - m), out = (sum_j p_j v_j) / (sum_j p_j). The AVX2+FMA path takes exp from a polynomial
 * (relative error ~2e-7); the portable path uses expf.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define LMFORGE_ATTN_X86 1
#endif

static void row_portable(const float *q, int64_t q_head_stride, const float *kc, const float *vc,
                         const int64_t *slots, int64_t len, int64_t kv_heads, int64_t groups, int64_t dim,
                         float scale, float *out, int64_t out_head_stride, float *scores) {
  const int64_t slot_stride = kv_heads * dim;
  for (int64_t h = 0; h < kv_heads; h++) {
    for (int64_t g = 0; g < groups; g++) {
      const int64_t head = h * groups + g;
      const float *qh = q + head * q_head_stride;
      float *s = scores + g * len;
      float m = -INFINITY;
      for (int64_t j = 0; j < len; j++) {
        const float *k = kc + slots[j] * slot_stride + h * dim;
        float acc = 0.0f;
        for (int64_t d = 0; d < dim; d++) acc += qh[d] * k[d];
        s[j] = acc * scale;
        m = s[j] > m ? s[j] : m;
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < len; j++) {
        s[j] = expf(s[j] - m);
        sum += s[j];
      }
      float *o = out + head * out_head_stride;
      for (int64_t d = 0; d < dim; d++) o[d] = 0.0f;
      for (int64_t j = 0; j < len; j++) {
        const float *v = vc + slots[j] * slot_stride + h * dim;
        for (int64_t d = 0; d < dim; d++) o[d] += s[j] * v[d];
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < dim; d++) o[d] *= inv;
    }
  }
}

#ifdef LMFORGE_ATTN_X86
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

AVX2 static inline float hmax8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_max_ps(lo, hi);
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

/* exp(x) for x <= 0 (scores minus their maximum): 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2 */
AVX2 static inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* dim a multiple of 8 */
AVX2 static void row_avx2(const float *q, int64_t q_head_stride, const float *kc, const float *vc,
                          const int64_t *slots, int64_t len, int64_t kv_heads, int64_t groups, int64_t dim,
                          float scale, float *out, int64_t out_head_stride, float *scores) {
  const int64_t slot_stride = kv_heads * dim;
  for (int64_t h = 0; h < kv_heads; h++) {
    for (int64_t j = 0; j < len; j++) { /* each key read once, by every query head of its group */
      const float *k = kc + slots[j] * slot_stride + h * dim;
      for (int64_t g = 0; g < groups; g++) {
        const float *qh = q + (h * groups + g) * q_head_stride;
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d + 16 <= dim; d += 16) {
          a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k + d), a0);
          a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d + 8), _mm256_loadu_ps(k + d + 8), a1);
        }
        if (d < dim) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k + d), a0);
        scores[g * len + j] = hsum8(_mm256_add_ps(a0, a1)) * scale;
      }
    }
    for (int64_t g = 0; g < groups; g++) {
      float *s = scores + g * len;
      __m256 vm = _mm256_set1_ps(-INFINITY);
      int64_t j = 0;
      for (; j + 8 <= len; j += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(s + j));
      float m = hmax8(vm);
      for (; j < len; j++) m = s[j] > m ? s[j] : m;
      const __m256 mm = _mm256_set1_ps(m);
      __m256 vs = _mm256_setzero_ps();
      for (j = 0; j + 8 <= len; j += 8) {
        const __m256 p = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mm));
        _mm256_storeu_ps(s + j, p);
        vs = _mm256_add_ps(vs, p);
      }
      if (j < len) { /* the tail through the same polynomial, padded with -inf's 0 */
        float tail[8];
        for (int64_t t = 0; t < 8; t++) tail[t] = j + t < len ? s[j + t] - m : -INFINITY;
        const __m256 p = exp8(_mm256_loadu_ps(tail));
        _mm256_storeu_ps(tail, p);
        for (int64_t t = 0; j + t < len; t++) s[j + t] = tail[t];
        const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(len - j)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        vs = _mm256_add_ps(vs, _mm256_and_ps(p, _mm256_castsi256_ps(keep)));
      }
      const float inv = 1.0f / hsum8(vs);
      float *o = out + (h * groups + g) * out_head_stride;
      for (int64_t d0 = 0; d0 < dim; d0 += 64) { /* 8 accumulators: one pass over the values per 64 */
        const int64_t width = dim - d0 < 64 ? (dim - d0) / 8 : 8;
        __m256 acc[8];
        for (int c = 0; c < 8; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t jj = 0; jj < len; jj++) {
          const float *v = vc + slots[jj] * slot_stride + h * dim + d0;
          const __m256 p = _mm256_set1_ps(s[jj]);
          if (width == 8) {
            for (int c = 0; c < 8; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
          } else {
            for (int c = 0; c < width; c++) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8 * c), acc[c]);
          }
        }
        const __m256 vi = _mm256_set1_ps(inv);
        for (int c = 0; c < width; c++) _mm256_storeu_ps(o + d0 + 8 * c, _mm256_mul_ps(acc[c], vi));
      }
    }
  }
}
#endif

static int attn_forced_portable = 0;

/* 2 where the AVX2+FMA path runs (for a head size that is a multiple of 8), 1 for the portable loop */
int lmforge_attention_isa(void) {
#ifdef LMFORGE_ATTN_X86
  if (!attn_forced_portable && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
#endif
  return 1;
}

void lmforge_attention_force_portable(int portable) { attn_forced_portable = portable; }

/* out[head][row] (head stride rows * dim) = attention of q[head][row] (the same layout) over the row's
 * lengths[row] keys and values at slots[row * longest + j] of the caches ([slots, kv_heads, dim],
 * contiguous). scores: groups * longest floats of scratch. Returns 0, or -1 for a slot outside
 * [0, n_slots) (nothing is read then) or a length outside [1, longest]. */
int lmforge_decode_attention(const float *q, const float *k_cache, const float *v_cache, int64_t n_slots,
                             const int64_t *slots, const int64_t *lengths, int64_t rows, int64_t longest,
                             int64_t heads, int64_t kv_heads, int64_t dim, float scale, float *out,
                             float *scores) {
  if (kv_heads <= 0 || heads % kv_heads) return -1;
  for (int64_t r = 0; r < rows; r++) {
    if (lengths[r] < 1 || lengths[r] > longest) return -1;
    for (int64_t j = 0; j < lengths[r]; j++) {
      const int64_t slot = slots[r * longest + j];
      if (slot < 0 || slot >= n_slots) return -1;
    }
  }
  const int64_t groups = heads / kv_heads, stride = rows * dim;
#ifdef LMFORGE_ATTN_X86
  const int vector = lmforge_attention_isa() == 2 && dim % 8 == 0;
#endif
  for (int64_t r = 0; r < rows; r++) {
#ifdef LMFORGE_ATTN_X86
    if (vector) {
      row_avx2(q + r * dim, stride, k_cache, v_cache, slots + r * longest, lengths[r], kv_heads, groups, dim,
               scale, out + r * dim, stride, scores);
      continue;
    }
#endif
    row_portable(q + r * dim, stride, k_cache, v_cache, slots + r * longest, lengths[r], kv_heads, groups, dim,
                 scale, out + r * dim, stride, scores);
  }
  return 0;
}
