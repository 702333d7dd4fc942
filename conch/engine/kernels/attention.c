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
 * - both split a long cache across a few threads (started and joined per call, none left spinning).
 *
 * Built at run time by conch/engine/native.py with the machine's C compiler (-O3 -march=native -ffast-math);
 * needs AVX-512F, otherwise it fails to build and the engine keeps torch's kernels.
 */
#ifndef __AVX512F__
#error "conch attention kernels need AVX-512F"
#endif
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

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

/* Decoding sessions x KV heads x key splits ("items"): a long cache is split across threads (split-K), each
 * split gives a partial (m, l, acc) and the splits are merged afterwards, as in flash-decoding. */
typedef struct {
    const seg_t *segs;
    int layer, kv_heads, G, D, nsplit;
    int64_t window;
    const float *qs; /* [sessions][kv_heads][G][D], pre-scaled */
    float *part;     /* per item: m [G], l [G], acc [G][D] */
    int lo, hi;      /* this worker's items */
} decode_job;

static inline int64_t window_start(const seg_t *sg, int64_t window) {
    return window > 0 && sg->pos + 1 > window ? sg->pos + 1 - window : 0;
}

static inline __attribute__((always_inline)) void decode_items(const decode_job *c, const int bf16) {
    const int es = bf16 ? 2 : 4, G = c->G, D = c->D, stride = 2 * G + G * D;
    for (int it = c->lo; it < c->hi; it++) {
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
}

static void *decode_items_f32(void *c) { decode_items((const decode_job *)c, 0); return NULL; }
static void *decode_items_bf16(void *c) { decode_items((const decode_job *)c, 1); return NULL; }

#define MAX_THREADS 16
/* Multiply-adds per call below which helper threads cost more than they save (a helper costs ~35 us to start
 * and join on the 2-vCPU VM). Decode is memory-bound, so a second thread helps it less: measured there, a 16k-token
 * cache (2M) decoded no faster with two threads, while a 35-token chunk behind it ran 1.4x faster. */
#define DECODE_PARALLEL_WORK (1 << 23)
#define CHUNK_PARALLEL_WORK (1 << 21)

/* Runs items [0, n) of job on up to `threads` threads (helpers started per call and joined: none is left
 * spinning between calls, which on a small VM would take the core from the engine's other work). */
static void run_split(void *(*fn)(void *), void *jobs, size_t size, size_t lo_at, size_t hi_at, int n, int threads) {
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > n) threads = n;
    if (threads < 1) threads = 1;
    pthread_t helper[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    for (int w = threads - 1; w >= 0; w--) {
        char *job = (char *)jobs + size * w;
        *(int *)(job + lo_at) = (int)((int64_t)n * w / threads);
        *(int *)(job + hi_at) = (int)((int64_t)n * (w + 1) / threads);
        if (w > 0)
            started[w] = pthread_create(&helper[w], NULL, fn, job) == 0;
        if (w == 0 || !started[w])
            fn(job); /* this thread's share, or a helper's that could not start */
    }
    for (int w = 1; w < threads; w++)
        if (started[w]) pthread_join(helper[w], NULL);
}

static inline __attribute__((always_inline)) int run(int nseg, const seg_t *segs, int layer, const void *q, int64_t q_hs,
                                                     int64_t q_rs, const void *key, int64_t k_hs, int64_t k_rs,
                                                     const void *value, int64_t v_hs, int64_t v_rs, void *out,
                                                     int64_t o_hs, int64_t o_rs, int kv_heads, int G, int D,
                                                     int64_t window, float scale, int threads, const int bf16) {
    if (G < 1 || G > MAXG || D < 16 || D > MAXD || D % 16) return 1;
    const int es = bf16 ? 2 : 4;
    int64_t work = 0, shortest = INT64_MAX;
    for (int i = 0; i < nseg; i++) {
        const seg_t *sg = segs + i;
        if (sg->pos < 0 || sg->pos >= sg->cap) return 2;
        const int64_t T = sg->pos + 1 - window_start(sg, window);
        work += T * kv_heads * G * D;
        shortest = T < shortest ? T : shortest;
    }
    if (work < DECODE_PARALLEL_WORK) threads = 1;
    const int pairs = nseg * kv_heads;
    int nsplit = threads > pairs ? (threads + pairs - 1) / pairs : 1;
    if (nsplit > 1 && shortest / nsplit < BLK) nsplit = shortest / BLK > 1 ? (int)(shortest / BLK) : 1;
    const int items = pairs * nsplit, stride = 2 * G + G * D;
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
    decode_job jobs[MAX_THREADS];
    for (int w = 0; w < MAX_THREADS; w++)
        jobs[w] = (decode_job){segs, layer, kv_heads, G, D, nsplit, window, qs, part, 0, items};
    run_split(bf16 ? decode_items_bf16 : decode_items_f32, jobs, sizeof(decode_job), offsetof(decode_job, lo),
              offsetof(decode_job, hi), items, threads);
    /* merge the splits: weights exp(m_split - m) */
    for (int p = 0; p < pairs; p++) {
        const int i = p / kv_heads, h = p % kv_heads;
        for (int g = 0; g < G; g++) {
            float mx = -FLT_MAX, sum = 0.f, y[MAXD] = {0};
            for (int sp = 0; sp < nsplit; sp++) {
                const float mm = part[(int64_t)(p * nsplit + sp) * stride + g];
                mx = mm > mx ? mm : mx;
            }
            for (int sp = 0; sp < nsplit; sp++) {
                const float *m = part + (int64_t)(p * nsplit + sp) * stride, *l = m + G, *acc = l + G + g * D;
                const float w = nsplit == 1 ? 1.f : expf(m[g] - mx);
                sum += w * l[g];
                for (int e = 0; e < D; e++) y[e] += w * acc[e];
            }
            char *o = (char *)out + ((int64_t)(h * G + g) * o_hs + segs[i].row * o_rs) * es;
            const float inv = 1.f / sum;
            for (int e = 0; e < D; e++) store_out(o, e, y[e] * inv, bf16);
        }
    }
    free(qs);
    return 0;
}

/* ---- a chunk of n new tokens behind s cached ones (the observation of a turn) ----
 * Every query row meets up to s+n keys: compute-bound, so keys are taken 64 at a time, transposed once into
 * Kt [D][64] and shared by all rows, and each tile of 4 query rows runs on vertical FMAs (no horizontal sums). */
typedef struct {
    const char *k, *v;                        /* layer buffers for KV head 0: [kv_heads][cap][D] */
    int64_t cap, s;
    int n, G, D, R;                           /* R = G n rows per KV head */
    float *qs, *acc, *m, *l;                  /* [kv_heads R][D], [kv_heads R][D], [kv_heads R], [kv_heads R] */
    int lo, hi;                               /* this worker's tiles, numbered across KV heads */
} chunk_job;

/* Tiles [lo, hi) of RT rows: scores, causal limit, online softmax and P.V over every key block they see. */
static inline __attribute__((always_inline)) void chunk_tiles(const chunk_job *c, const int bf16) {
    const int es = bf16 ? 2 : 4, D = c->D, G = c->G, R = c->R;
    const int per_head = (R + RT - 1) / RT;
    const int64_t T = c->s + c->n;
    float kt[MAXD * BLK] __attribute__((aligned(64)));
    float sc[RT * BLK] __attribute__((aligned(64)));
    for (int h = c->lo / per_head; h <= (c->hi - 1) / per_head; h++) {
        const int t_lo = c->lo > h * per_head ? c->lo - h * per_head : 0;
        const int t_hi = c->hi < (h + 1) * per_head ? c->hi - h * per_head : per_head;
        const int last = (t_hi * RT < R ? t_hi * RT : R) - 1; /* my last row in this head */
        const char *kh = c->k + (int64_t)h * c->cap * D * es, *vh = c->v + (int64_t)h * c->cap * D * es;
        float *qs = c->qs + (int64_t)h * R * D, *acc = c->acc + (int64_t)h * R * D, *m = c->m + h * R, *l = c->l + h * R;
        for (int64_t j0 = 0; j0 < T; j0 += BLK) {
            const int nb = T - j0 < BLK ? (int)(T - j0) : BLK;
            if (c->s + last / G + 1 <= j0) break; /* rows only see more keys further down: none sees this block */
            for (int j = 0; j < BLK; j++) {
                const int jj = j < nb ? j : nb - 1;
                const char *kr = kh + (j0 + jj) * D * es;
                for (int e = 0; e < D; e++) kt[e * BLK + j] = to_f32(kr, e, bf16);
            }
            const char *vb = vh + j0 * D * es;
            for (int r0 = t_lo * RT; r0 <= last; r0 += RT) {
                const int nr = R - r0 < RT ? R - r0 : RT;
                if (c->s + (r0 + nr - 1) / G + 1 <= j0) continue; /* no row of the tile sees this block */
                /* scores of RT rows x 64 keys */
                __m512 a[RT][4];
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++)
#pragma GCC unroll 4
                    for (int q4 = 0; q4 < 4; q4++) a[t][q4] = _mm512_setzero_ps();
                for (int e = 0; e < D; e++) {
                    __m512 kv[4];
#pragma GCC unroll 4
                    for (int q4 = 0; q4 < 4; q4++) kv[q4] = _mm512_load_ps(kt + e * BLK + 16 * q4);
#pragma GCC unroll 4
                    for (int t = 0; t < RT; t++) {
                        const __m512 qb = _mm512_set1_ps(qs[(int64_t)(r0 + (t < nr ? t : 0)) * D + e]);
#pragma GCC unroll 4
                        for (int q4 = 0; q4 < 4; q4++) a[t][q4] = _mm512_fmadd_ps(qb, kv[q4], a[t][q4]);
                    }
                }
#pragma GCC unroll 4
                for (int t = 0; t < RT; t++)
#pragma GCC unroll 4
                    for (int q4 = 0; q4 < 4; q4++) _mm512_store_ps(sc + t * BLK + 16 * q4, a[t][q4]);
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
}

static void *chunk_tiles_f32(void *c) { chunk_tiles((const chunk_job *)c, 0); return NULL; }
static void *chunk_tiles_bf16(void *c) { chunk_tiles((const chunk_job *)c, 1); return NULL; }

static inline __attribute__((always_inline)) int chunk(const void *q, int64_t q_hs, int64_t q_rs, const char *k,
                                                       const char *v, int64_t cap, int64_t s, int n, void *out,
                                                       int64_t o_hs, int64_t o_rs, int kv_heads, int G, int D,
                                                       float scale, float *work, int threads, const int bf16) {
    const int es = bf16 ? 2 : 4, R = G * n, tiles = kv_heads * ((R + RT - 1) / RT);
    const int64_t rows = (int64_t)kv_heads * R;
    chunk_job job = {k, v, cap, s, n, G, D, R, work, work + rows * D, work + 2 * rows * D, work + 2 * rows * D + rows,
                     0, tiles};
    /* row r of KV head h = token i, query head h G + g (r = i G + g): a tile spans few tokens */
    for (int h = 0; h < kv_heads; h++)
        for (int r = 0; r < R; r++) {
            const int i = r / G, g = r % G;
            const char *qr = (const char *)q + ((int64_t)(h * G + g) * q_hs + (int64_t)i * q_rs) * es;
            float *qd = job.qs + ((int64_t)h * R + r) * D;
            for (int e = 0; e < D; e++) qd[e] = to_f32(qr, e, bf16) * scale;
            job.m[h * R + r] = -FLT_MAX;
            job.l[h * R + r] = 0.f;
        }
    memset(job.acc, 0, sizeof(float) * rows * D);
    if ((int64_t)rows * (s + n) * D < CHUNK_PARALLEL_WORK) threads = 1;
    chunk_job jobs[MAX_THREADS];
    for (int w = 0; w < MAX_THREADS; w++) jobs[w] = job;
    run_split(bf16 ? chunk_tiles_bf16 : chunk_tiles_f32, jobs, sizeof(chunk_job), offsetof(chunk_job, lo),
              offsetof(chunk_job, hi), tiles, threads);
    for (int h = 0; h < kv_heads; h++)
        for (int r = 0; r < R; r++) {
            const int i = r / G, g = r % G;
            char *o = (char *)out + ((int64_t)(h * G + g) * o_hs + (int64_t)i * o_rs) * es;
            const float inv = 1.f / job.l[h * R + r], *a = job.acc + ((int64_t)h * R + r) * D;
            for (int e = 0; e < D; e++) store_out(o, e, a[e] * inv, bf16);
        }
    return 0;
}

/* query/out point at the chunk's first row; k/v at the layer's buffer for KV head 0 ([kv_heads][cap][D]),
 * whose positions [0, s+n) are filled; work holds (2 D + 2) G n floats. */
#define CHUNK_ENTRY(NAME, BF16)                                                                                    \
    int NAME(const void *q, int64_t q_hs, int64_t q_rs, const void *k, const void *v, int64_t cap, int64_t s,      \
             int n, void *out, int64_t o_hs, int64_t o_rs, int kv_heads, int groups, int D, float scale,          \
             float *work, int threads) {                                                                          \
        if (groups < 1 || groups > MAXG || D < 16 || D > MAXD || D % 16 || n < 1 || s < 0 || s + n > cap)          \
            return 1;                                                                                              \
        return chunk(q, q_hs, q_rs, (const char *)k, (const char *)v, cap, s, n, out, o_hs, o_rs, kv_heads,       \
                     groups, D, scale, work, threads, BF16);                                                       \
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
