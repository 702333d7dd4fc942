/* Attention over a session's KV cache for conch's HF engine on CPU: single-token decoding and chunks behind a
 * cache (a turn's observation). First prefills and everything on GPU stay with torch's SDPA.
 *
 * Why kernels of our own: late in a long episode a turn is dominated by attention over the cache. At decode time
 * one query row per head meets the whole cache, so the work is a read of K and V and little arithmetic; torch's
 * CPU SDPA/flash kernel ran it at about a third of the memory-read bound on the engine's worker thread. A chunk
 * (tens of tokens x heads as query rows) is compute-bound. Measurements: benchmarks/README.md.
 * - decode: K and V are read once, block by block, with an online softmax (float32 accumulation); the call also
 *   writes the step's new key/value rows into the caches, so one call per layer serves every decoding session.
 * - chunk: keys are transposed 64 at a time and shared by all query rows; tiles of 4 rows run on vertical FMAs.
 * - both cut a long cache into key pieces (split-K, merged by log-sum-exp) that the calling thread and the
 *   helper threads of pool.h claim one at a time.
 *
 * Built at run time by conch/engine/native.py with the machine's C compiler (-O3 -march=native -ffast-math);
 * needs AVX-512F, otherwise it fails to build and the engine keeps torch's kernels.
 */
#ifndef __AVX512F__
#error "conch attention kernels need AVX-512F"
#endif
#define _GNU_SOURCE /* CPU affinity in pool.h */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define BLK 64   /* keys per block: the block's scores stay in L1 */
#define MAXG 64  /* query heads per KV head */
#define MAXD 256 /* head dim */

typedef struct {
    int64_t k, v;   /* addresses of the session's K and V buffers: [layers, kv_heads, capacity, D] */
    int64_t cap;    /* capacity (tokens) */
    int64_t pos;    /* cache position of the new token (its key/value are written there) */
    int64_t row;    /* the token's row in the packed step */
} seg_t;

static inline __attribute__((always_inline)) __m512 load16(const void *p, const int bf16) {
    if (bf16) {
        __m256i h = _mm256_loadu_si256((const __m256i *)p);
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    return _mm512_loadu_ps((const float *)p);
}

static inline float to_f32(const void *p, int64_t i, const int bf16) {
    if (bf16) {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    return ((const float *)p)[i];
}

static inline void store_out(void *p, int64_t i, float y, const int bf16) {
    if (bf16) { /* round to nearest even, as torch does */
        uint32_t u;
        memcpy(&u, &y, 4);
        u += 0x7fff + ((u >> 16) & 1);
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else {
        ((float *)p)[i] = y;
    }
}

/* Lane i of the result = sum of the 16 lanes of v[i]. */
static inline __attribute__((always_inline)) __m512 reduce16(const __m512 *v) {
    __m512 x[4];
    for (int i = 0; i < 4; i++) {
        const __m512 *w = v + 4 * i;
        __m512 a = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
        __m512 b = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
        x[i] = _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
    }
    __m512 z01 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(x[0], x[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 z23 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(x[2], x[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(z01, z23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* exp(x) for x <= 0 (a score minus its row's max), about 1 ulp: 2^n * p(f) with n = round(x / ln 2), f = x - n ln 2
 * in [-ln2/2, ln2/2] and p the degree-6 Taylor polynomial (error < 1.2e-7). Inline: libmvec's call costs 3x. */
static inline __attribute__((always_inline)) __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), f);
    __m512 p = _mm512_set1_ps(1.f / 720);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* One online-softmax step for a row's block of scores s[0, nb) (s has room for BLK), of which [0, vis) are
 * visible: s becomes p = exp(s - new max), 0 where not visible; m and l (running max and sum) are updated.
 * Returns exp(old max - new max), the factor for what the row has accumulated so far. */
static inline __attribute__((always_inline)) float softmax_block(float *s, int vis, int nb, float *m, float *l) {
    __m512 mx = _mm512_set1_ps(*m), sum = _mm512_setzero_ps();
    for (int j = 0; j < vis; j += 16) {
        const __mmask16 k = vis - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (vis - j)) - 1);
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + j));
    }
    const float mnew = _mm512_reduce_max_ps(mx);
    const __m512 mv = _mm512_set1_ps(mnew);
    for (int j = 0; j < nb; j += 16) {
        const int left = vis - j;
        const __mmask16 k = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1);
        const __m512 p = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mv)));
        _mm512_storeu_ps(s + j, p);
        sum = _mm512_add_ps(sum, p);
    }
    const float corr = expf(*m - mnew);
    *l = *l * corr + _mm512_reduce_add_ps(sum);
    *m = mnew;
    return corr;
}

#define RT 4

/* acc rows [nr][NE x 16] (row stride D) = acc * corr + sum_j p[t][j] v_j, v rows D elements apart. */
static inline __attribute__((always_inline)) void pv_tile(float *acc, int D, const float *p, const char *v, int nb,
                                                          int nr, const float *corr, const int NE, const int bf16) {
    const int es = bf16 ? 2 : 4;
    __m512 o[RT][4];
#pragma GCC unroll 4
    for (int t = 0; t < RT; t++)
#pragma GCC unroll 4
        for (int c = 0; c < NE; c++)
            o[t][c] = t < nr ? _mm512_mul_ps(_mm512_set1_ps(corr[t]), _mm512_loadu_ps(acc + (int64_t)t * D + c * 16))
                             : _mm512_setzero_ps();
    for (int j = 0; j < nb; j++) {
        const char *vr = v + (int64_t)j * D * es;
        __m512 x[4];
#pragma GCC unroll 4
        for (int c = 0; c < NE; c++) x[c] = load16(vr + c * 16 * es, bf16);
#pragma GCC unroll 4
        for (int t = 0; t < RT; t++) {
            const __m512 pb = _mm512_set1_ps(p[t * BLK + j]);
#pragma GCC unroll 4
            for (int c = 0; c < NE; c++) o[t][c] = _mm512_fmadd_ps(pb, x[c], o[t][c]);
        }
    }
    for (int t = 0; t < nr; t++)
        for (int c = 0; c < NE; c++) _mm512_storeu_ps(acc + (int64_t)t * D + c * 16, o[t][c]);
}

/* pv_tile over all D dims of nr <= RT rows, 64 dims (4 registers per row) per pass. */
static inline __attribute__((always_inline)) void pv_rows(float *acc, int D, const float *p, const char *v, int nb,
                                                          int nr, const float *corr, const int bf16) {
    const int es = bf16 ? 2 : 4, per = D / 16;
    for (int e0 = 0; e0 < per; e0 += 4) {
        float *ar = acc + e0 * 16;
        const char *ve = v + e0 * 16 * es;
        switch (per - e0 < 4 ? per - e0 : 4) {
        case 4: pv_tile(ar, D, p, ve, nb, nr, corr, 4, bf16); break;
        case 3: pv_tile(ar, D, p, ve, nb, nr, corr, 3, bf16); break;
        case 2: pv_tile(ar, D, p, ve, nb, nr, corr, 2, bf16); break;
        default: pv_tile(ar, D, p, ve, nb, nr, corr, 1, bf16);
        }
    }
}

/* G pre-scaled query rows q [G][D] over T keys/values (rows D elements apart): acc [G][D] = sum_j p_j v_j,
 * l [G] = sum_j p_j with p_j = exp(q.k_j - m) and m [G] = max_j q.k_j. */
static inline __attribute__((always_inline)) void attend(const float *q, const char *k, const char *v, int64_t T,
                                                         int G, int D, float *acc, float *l, float *m, const int bf16) {
    const int es = bf16 ? 2 : 4;
    float sc[MAXG * BLK] __attribute__((aligned(64)));
    memset(sc + G * BLK, 0, sizeof(float) * BLK * ((G + RT - 1) / RT * RT - G)); /* rows a last tile reads past G */
    for (int g = 0; g < G; g++) {
        m[g] = -FLT_MAX; /* no infinities: built with -ffast-math */
        l[g] = 0.f;
    }
    memset(acc, 0, sizeof(float) * G * D);
    for (int64_t j0 = 0; j0 < T; j0 += BLK) {
        const int nb = T - j0 < BLK ? (int)(T - j0) : BLK;
        const char *kb = k + j0 * D * es, *vb = v + j0 * D * es;
        /* scores, 16 keys at a time per query row; a short last block repeats its last key (scores unused) */
        for (int g = 0; g < G; g++) {
            const float *qg = q + g * D;
            for (int j1 = 0; j1 < nb; j1 += 16) {
                __m512 d[16];
#pragma GCC unroll 16
                for (int u = 0; u < 16; u++) {
                    const int j = j1 + u < nb ? j1 + u : nb - 1;
                    const char *kr = kb + (int64_t)j * D * es;
                    __m512 s = _mm512_mul_ps(_mm512_loadu_ps(qg), load16(kr, bf16));
                    for (int e = 16; e < D; e += 16)
                        s = _mm512_fmadd_ps(_mm512_loadu_ps(qg + e), load16(kr + e * es, bf16), s);
                    d[u] = s;
                }
                _mm512_store_ps(sc + g * BLK + j1, reduce16(d));
            }
        }
        /* online softmax, then acc = acc * exp(old max - new max) + P.V, RT rows x up to 64 dims per pass */
        float corr[MAXG];
        for (int g = 0; g < G; g++) corr[g] = softmax_block(sc + g * BLK, nb, nb, m + g, l + g);
        for (int g0 = 0; g0 < G; g0 += RT)
            pv_rows(acc + g0 * D, D, sc + g0 * BLK, vb, nb, G - g0 < RT ? G - g0 : RT, corr + g0, bf16);
    }
}

/* Row r of `pieces` split-K partial results stored one after another, each m [rows], l [rows], acc [rows][D]
 * (running max, sum and unnormalised output of its keys), merged into o: sum_p w_p acc_p / sum_p w_p l_p with
 * w_p = exp(m_p - max_p m_p), 0 for a piece that saw no key of this row. */
static void merge_row(const float *part, int rows, int D, int pieces, int r, void *o, const int bf16) {
    const int64_t stride = (int64_t)rows * (D + 2);
    float mx = -FLT_MAX, sum = 0.f, y[MAXD] = {0};
    for (int p = 0; p < pieces; p++) mx = part[p * stride + r] > mx ? part[p * stride + r] : mx;
    for (int p = 0; p < pieces; p++) {
        const float *m = part + p * stride, *acc = m + 2 * rows + (int64_t)r * D;
        const float w = pieces == 1 ? 1.f : m[r] == -FLT_MAX ? 0.f : expf(m[r] - mx);
        sum += w * m[rows + r];
        for (int e = 0; e < D; e++) y[e] += w * acc[e];
    }
    const float inv = 1.f / sum;
    for (int e = 0; e < D; e++) store_out(o, e, y[e] * inv, bf16);
}

/* Decoding sessions x KV heads x key splits ("items"): a long cache is split into pieces (split-K) that the
 * pool's threads claim, each piece gives a partial (m, l, acc) and the pieces are merged afterwards, as in
 * flash-decoding. */
typedef struct {
    const seg_t *segs;
    int layer, kv_heads, G, D, nsplit;
    int64_t window;
    const float *qs; /* [sessions][kv_heads][G][D], pre-scaled */
    float *part;     /* per item: m [G], l [G], acc [G][D] */
} decode_job;

static inline int64_t window_start(const seg_t *sg, int64_t window) {
    return window > 0 && sg->pos + 1 > window ? sg->pos + 1 - window : 0;
}

static inline __attribute__((always_inline)) void decode_item(const decode_job *c, int it, const int bf16) {
    const int es = bf16 ? 2 : 4, G = c->G, D = c->D, stride = 2 * G + G * D;
    const int i = it / (c->kv_heads * c->nsplit), h = (it / c->nsplit) % c->kv_heads, sp = it % c->nsplit;
    const seg_t *sg = c->segs + i;
    const int64_t lo = window_start(sg, c->window), T = sg->pos + 1 - lo;
    const int64_t a = lo + T * sp / c->nsplit, b = lo + T * (sp + 1) / c->nsplit;
    const int64_t base = ((int64_t)c->layer * c->kv_heads + h) * sg->cap * D;
    float *m = c->part + (int64_t)it * stride, *l = m + G, *acc = l + G;
    if (b > a)
        attend(c->qs + ((int64_t)i * c->kv_heads + h) * G * D, (const char *)(intptr_t)sg->k + (base + a * D) * es,
               (const char *)(intptr_t)sg->v + (base + a * D) * es, b - a, G, D, acc, l, m, bf16);
    else
        for (int g = 0; g < G; g++) {
            m[g] = -FLT_MAX;
            l[g] = 0.f;
            memset(acc + g * D, 0, sizeof(float) * D);
        }
}

static void decode_item_f32(const void *c, int it) { decode_item((const decode_job *)c, it, 0); }
static void decode_item_bf16(const void *c, int it) { decode_item((const decode_job *)c, it, 1); }

/* Multiply-adds (query rows x keys x head dim) per call from which helpers are woken. A helper takes ~20 us to
 * wake on the 2-vCPU VM, so below this the caller would finish alone anyway; at and above it, the work is cut in
 * pieces small enough that the caller never waits long for a helper's last one. */
#define DECODE_PARALLEL_WORK (1 << 20)
#define DECODE_PIECE 2048 /* keys per split-K piece when helpers work */
#define CHUNK_PARALLEL_WORK (1 << 20)
#define CHUNK_PIECE 1024 /* keys per split-K piece of a chunk when helpers work (a multiple of BLK) */
#define CHUNK_GROUP_ROWS 256 /* query rows per chunk item: 64 tiles share each transposed key block */
#define SPLIT_PARTIAL_FLOATS (1 << 22) /* at most 16 MiB of split-K partial results per call (decode too) */

static inline __attribute__((always_inline)) int run(int nseg, const seg_t *segs, int layer, const void *q, int64_t q_hs,
                                                     int64_t q_rs, const void *key, int64_t k_hs, int64_t k_rs,
                                                     const void *value, int64_t v_hs, int64_t v_rs, void *out,
                                                     int64_t o_hs, int64_t o_rs, int kv_heads, int G, int D,
                                                     int64_t window, float scale, int threads, const int bf16) {
    if (G < 1 || G > MAXG || D < 16 || D > MAXD || D % 16) return 1;
    const int es = bf16 ? 2 : 4;
    int64_t work = 0, longest = 0;
    for (int i = 0; i < nseg; i++) {
        const seg_t *sg = segs + i;
        if (sg->pos < 0 || sg->pos >= sg->cap) return 2;
        const int64_t T = sg->pos + 1 - window_start(sg, window);
        work += T * kv_heads * G * D;
        longest = T > longest ? T : longest;
    }
    if (work < DECODE_PARALLEL_WORK) threads = 1;
    const int pairs = nseg * kv_heads;
    /* with helpers, split so that every thread has several pieces (the longest cache sets the count; a shorter
     * cache's surplus pieces are empty) */
    const int stride = 2 * G + G * D;
    int nsplit = 1;
    if (threads > 1 && pairs < 4 * threads) {
        int64_t want = longest / DECODE_PIECE, room = SPLIT_PARTIAL_FLOATS / ((int64_t)pairs * stride);
        want = want < room ? want : room;
        nsplit = want < 1 ? 1 : want > 64 ? 64 : (int)want;
    }
    const int items = pairs * nsplit;
    float *qs = malloc(sizeof(float) * ((size_t)pairs * G * D + (size_t)items * stride));
    if (!qs) return 3;
    float *part = qs + (size_t)pairs * G * D;
    /* the step's new key/value rows go into the caches first: every split reads up to and including them */
    for (int i = 0; i < nseg; i++) {
        const seg_t *sg = segs + i;
        for (int h = 0; h < kv_heads; h++) {
            const int64_t base = ((int64_t)layer * kv_heads + h) * sg->cap * D + sg->pos * D;
            memcpy((char *)(intptr_t)sg->k + base * es, (const char *)key + (h * k_hs + sg->row * k_rs) * es, (size_t)D * es);
            memcpy((char *)(intptr_t)sg->v + base * es, (const char *)value + (h * v_hs + sg->row * v_rs) * es, (size_t)D * es);
            for (int g = 0; g < G; g++) {
                const char *qr = (const char *)q + ((int64_t)(h * G + g) * q_hs + sg->row * q_rs) * es;
                float *qd = qs + (((int64_t)i * kv_heads + h) * G + g) * D;
                for (int e = 0; e < D; e++) qd[e] = to_f32(qr, e, bf16) * scale;
            }
        }
    }
    const decode_job job = {segs, layer, kv_heads, G, D, nsplit, window, qs, part};
    pool_run(bf16 ? decode_item_bf16 : decode_item_f32, &job, items, threads);
    for (int p = 0; p < pairs; p++) {
        const int i = p / kv_heads, h = p % kv_heads;
        for (int g = 0; g < G; g++)
            merge_row(part + (int64_t)p * nsplit * stride, G, D, nsplit, g,
                      (char *)out + ((int64_t)(h * G + g) * o_hs + segs[i].row * o_rs) * es, bf16);
    }
    free(qs);
    return 0;
}

/* ---- a chunk of n new tokens behind s cached ones (the observation of a turn) ----
 * Every query row meets up to s+n keys: compute-bound, so keys are taken 64 at a time, transposed once into
 * Kt [D][64] and shared by all rows, and each tile of 4 query rows runs on vertical FMAs (no horizontal sums).
 * With helpers the keys are cut into pieces (split-K, as for decode) and the rows into groups: an item is one
 * group of one KV head's rows over one piece, so each piece's transpose serves many rows; the pieces' partial
 * results are merged at the end. */
typedef struct {
    const char *k, *v; /* layer buffers for KV head 0: [kv_heads][cap][D] */
    int64_t cap, s;
    int n, G, D, R;    /* R = G n rows per KV head */
    int pieces;        /* key pieces per KV head */
    int groups;        /* row groups per KV head (CHUNK_GROUP_ROWS rows each) */
    const float *qs;   /* [kv_heads R][D], pre-scaled */
    float *part;       /* per KV head and piece: m [R], l [R], acc [R][D] */
} chunk_job;

static inline __attribute__((always_inline)) void chunk_item(const chunk_job *c, int it, const int bf16) {
    const int es = bf16 ? 2 : 4, D = c->D, G = c->G, R = c->R;
    const int h = it / (c->pieces * c->groups), p = it / c->groups % c->pieces, grp = it % c->groups;
    const int r_lo = grp * CHUNK_GROUP_ROWS, r_hi = r_lo + CHUNK_GROUP_ROWS < R ? r_lo + CHUNK_GROUP_ROWS : R;
    const int64_t T = c->s + c->n, blocks = (T + BLK - 1) / BLK;
    const int64_t a = blocks * p / c->pieces * BLK, b0 = blocks * (p + 1) / c->pieces * BLK, b = b0 < T ? b0 : T;
    const char *kh = c->k + (int64_t)h * c->cap * D * es, *vh = c->v + (int64_t)h * c->cap * D * es;
    const float *qs = c->qs + (int64_t)h * R * D;
    float *m = c->part + (int64_t)(h * c->pieces + p) * R * (D + 2), *l = m + R, *acc = l + R;
    float kt[MAXD * BLK] __attribute__((aligned(64)));
    float sc[RT * BLK] __attribute__((aligned(64)));
    for (int r = r_lo; r < r_hi; r++) {
        m[r] = -FLT_MAX; /* no infinities: built with -ffast-math */
        l[r] = 0.f;
    }
    memset(acc + (int64_t)r_lo * D, 0, sizeof(float) * (r_hi - r_lo) * D);
    for (int64_t j0 = a; j0 < b; j0 += BLK) {
        const int nb = b - j0 < BLK ? (int)(b - j0) : BLK;
        if (c->s + (r_hi - 1) / G + 1 <= j0) break; /* rows only see more keys further down: none sees this block */
        for (int j = 0; j < BLK; j++) {
            const int jj = j < nb ? j : nb - 1;
            const char *kr = kh + (j0 + jj) * D * es;
            for (int e = 0; e < D; e++) kt[e * BLK + j] = to_f32(kr, e, bf16);
        }
        const char *vb = vh + j0 * D * es;
        /* rows see keys < s + r / G + 1: the first row that sees this block, and tiles from it */
        const int64_t first = (j0 - c->s) * G;
        for (int r0 = first > r_lo ? r_lo + (int)((first - r_lo) / RT * RT) : r_lo; r0 < r_hi; r0 += RT) {
            const int nr = r_hi - r0 < RT ? r_hi - r0 : RT;
            /* scores of RT rows x 64 keys */
            __m512 acc4[RT][4];
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++)
#pragma GCC unroll 4
                for (int q4 = 0; q4 < 4; q4++) acc4[t][q4] = _mm512_setzero_ps();
            for (int e = 0; e < D; e++) {
                __m512 kv[4];
#pragma GCC unroll 4
                for (int q4 = 0; q4 < 4; q4++) kv[q4] = _mm512_load_ps(kt + e * BLK + 16 * q4);
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++) {
                    const __m512 qb = _mm512_set1_ps(qs[(int64_t)(r0 + (t < nr ? t : 0)) * D + e]);
#pragma GCC unroll 4
                    for (int q4 = 0; q4 < 4; q4++) acc4[t][q4] = _mm512_fmadd_ps(qb, kv[q4], acc4[t][q4]);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < RT; t++)
#pragma GCC unroll 4
                for (int q4 = 0; q4 < 4; q4++) _mm512_store_ps(sc + t * BLK + 16 * q4, acc4[t][q4]);
            /* causal limit and online softmax per row */
            float corr[RT];
            for (int t = 0; t < nr; t++) {
                const int r = r0 + t;
                const int64_t lim = c->s + r / G + 1 - j0; /* keys [0, lim) of this block are visible */
                const int vis = lim < 0 ? 0 : lim < nb ? (int)lim : nb;
                corr[t] = softmax_block(sc + t * BLK, vis, nb, m + r, l + r);
            }
            for (int t = nr; t < RT; t++) {
                corr[t] = 0.f;
                for (int j = 0; j < nb; j++) sc[t * BLK + j] = 0.f;
            }
            /* acc[rows] = acc * corr + P.V, up to 4 x 16 dims of RT rows in registers per pass */
            pv_rows(acc + (int64_t)r0 * D, D, sc, vb, nb, nr, corr, bf16);
        }
    }
}

static void chunk_item_f32(const void *c, int it) { chunk_item((const chunk_job *)c, it, 0); }
static void chunk_item_bf16(const void *c, int it) { chunk_item((const chunk_job *)c, it, 1); }

static inline __attribute__((always_inline)) int chunk(const void *q, int64_t q_hs, int64_t q_rs, const char *k,
                                                       const char *v, int64_t cap, int64_t s, int n, void *out,
                                                       int64_t o_hs, int64_t o_rs, int kv_heads, int G, int D,
                                                       float scale, int threads, const int bf16) {
    const int es = bf16 ? 2 : 4, R = G * n;
    const int64_t rows = (int64_t)kv_heads * R, T = s + n;
    if (rows * T * D < CHUNK_PARALLEL_WORK) threads = 1;
    int pieces = 1, groups = (R + CHUNK_GROUP_ROWS - 1) / CHUNK_GROUP_ROWS;
    if (threads > 1) { /* pieces of the keys, as many as SPLIT_PARTIAL_FLOATS of partial results allow */
        int64_t want = T / CHUNK_PIECE, room = SPLIT_PARTIAL_FLOATS / (rows * (D + 2));
        want = want < room ? want : room;
        pieces = want < 1 ? 1 : want > 64 ? 64 : (int)want;
    }
    float *qs = malloc(sizeof(float) * (size_t)(rows * D + (int64_t)pieces * rows * (D + 2)));
    if (!qs) return 3;
    const chunk_job job = {k, v, cap, s, n, G, D, R, pieces, groups, qs, qs + rows * D};
    /* row r of KV head h = token i, query head h G + g (r = i G + g): a tile spans few tokens */
    for (int h = 0; h < kv_heads; h++)
        for (int r = 0; r < R; r++) {
            const int i = r / G, g = r % G;
            const char *qr = (const char *)q + ((int64_t)(h * G + g) * q_hs + (int64_t)i * q_rs) * es;
            float *qd = qs + ((int64_t)h * R + r) * D;
            for (int e = 0; e < D; e++) qd[e] = to_f32(qr, e, bf16) * scale;
        }
    pool_run(bf16 ? chunk_item_bf16 : chunk_item_f32, &job, kv_heads * pieces * groups, threads);
    for (int h = 0; h < kv_heads; h++)
        for (int r = 0; r < R; r++)
            merge_row(job.part + (int64_t)h * pieces * R * (D + 2), R, D, pieces, r,
                      (char *)out + ((int64_t)(h * G + r % G) * o_hs + (int64_t)(r / G) * o_rs) * es, bf16);
    free(qs);
    return 0;
}

/* query/out point at the chunk's first row; k/v at the layer's buffer for KV head 0 ([kv_heads][cap][D]),
 * whose positions [0, s+n) are filled. Returns 0, 1 for an unsupported shape, 3 when out of memory. */
#define CHUNK_ENTRY(NAME, BF16)                                                                                    \
    int NAME(const void *q, int64_t q_hs, int64_t q_rs, const void *k, const void *v, int64_t cap, int64_t s,      \
             int n, void *out, int64_t o_hs, int64_t o_rs, int kv_heads, int groups, int D, float scale,          \
             int threads) {                                                                                       \
        if (groups < 1 || groups > MAXG || D < 16 || D > MAXD || D % 16 || n < 1 || s < 0 || s + n > cap)          \
            return 1;                                                                                              \
        return chunk(q, q_hs, q_rs, (const char *)k, (const char *)v, cap, s, n, out, o_hs, o_rs, kv_heads,       \
                     groups, D, scale, threads, BF16);                                                             \
    }
CHUNK_ENTRY(conch_chunk_attention_f32, 0)
CHUNK_ENTRY(conch_chunk_attention_bf16, 1)

/* Strides are in elements; the last dimension of q, key, value and out must be contiguous. Returns 0 on
 * success, 1 for an unsupported shape, 2 for a position outside a session's buffer. */
#define ENTRY(NAME, BF16)                                                                                          \
    int NAME(int nseg, const seg_t *segs, int layer, const void *q, int64_t q_hs, int64_t q_rs, const void *key,     \
             int64_t k_hs, int64_t k_rs, const void *value, int64_t v_hs, int64_t v_rs, void *out, int64_t o_hs,     \
             int64_t o_rs, int kv_heads, int groups, int D, int64_t window, float scale, int threads) {             \
        return run(nseg, segs, layer, q, q_hs, q_rs, key, k_hs, k_rs, value, v_hs, v_rs, out, o_hs, o_rs, kv_heads, \
                   groups, D, window, scale, threads, BF16);                                                       \
    }
ENTRY(conch_decode_attention_f32, 0)
ENTRY(conch_decode_attention_bf16, 1)
