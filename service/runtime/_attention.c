/* The fast graphs' attention as ONNX Runtime custom ops (domain "attnserve"), for the CPU. Runner registers this
   library with SessionOptions.register_custom_ops_library; model/export/ writes the nodes.

   attnserve.Attention (cross-attention): q (J, G, h d_k) float, K and V (J, h, S, d_k) float, mask (J, S) int32
       -> (J, G, h d_k): each of source j's G query rows attends to its keys where mask[j] is not 0; padding comes
       last, and what lies past the last such key (in whole vectors of 8) is not read.
   attnserve.CachedAttention (masked self-attention, one step): q, k, v (B, 1, h d_k), K and V (B, h, C, d_k),
       lengths (B,) int32, total (1,) int32 -> out (B, 1, h d_k), K and V with row b's new key and value written at
       slot lengths[b]; row b attends to slots 0 .. lengths[b]. Bound as both input and output, the caches are
       written in place (a row's other slots are neither read nor written); otherwise the outputs start as copies.

   attnserve.SegmentAttention (the fast encoder's self-attention): q, k, v (B, S, h d_k) float (the projections,
       heads side by side), segments (B, S) int32 (0: padding, n > 0: the row's n-th text), h () int64 -> (B, S, h d_k):
       a query attends to the keys of its own text, a padding query to every real key (model/transformer.py's
       segment_mask); a row with no real key gets zeros.

   attnserve.GreedyTokens (greedy search's next tokens, the float32 fast decoder's): acc (T, V) int32 = h's rows
       quantized (DynamicQuantizeLinear: uint8, scale, zero point) times the projection's rows quantized to int8
       (MatMulInteger), scale () float (h's), h (T, d) float, W (V, d) float (the projection), its panels (as
       Logits reads them) and its bias (V,), w_scale () float (W's int8 scale), w_l1 () float (the largest L1 norm
       of W's rows), pad () int64 (never chosen) -> (T,) int64: each row's argmax over v of h . W[v] + bias[v], as a
       float32 projection and argmax compute it, for about a quarter of the projection's work.
   attnserve.Logits (the float32 fast decoder's logit rows): h (R, d) float, the projection's panels
       (ceil(V / 16), d, 16) float (16 tokens' weights side by side), bias (V,) float -> (R, V): h W^T + bias, the
       projection held once (no transposed copy beside the rows that the embedding reads).

   Both attentions are softmax(q K^T / sqrt(d_k)) V per row and head, as ONNX Runtime's MultiHeadAttention and
   GroupQueryAttention compute them (model/transformer.py's attention), in another order of summation (float32
   results differ in the last bits). Those kernels spend most of a small step's attention on fixed costs per row
   and head; here a head is a few dot products of d_k floats, exponentials 8 at a time and a weighted sum of the
   value rows 8 floats at a time, and the next head's keys and values (C d_k floats further) are prefetched while
   this one's are used.

   It uses the C API of ONNX Runtime 1.24 (third_party/onnxruntime holds its headers). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_vector.h"
#include "onnxruntime_c_api.h"

#define API_VERSION 24 /* GetTensorElementTypeAndShapeDataReference */

static const OrtApi *ort;

INLINE float dot(const float *q, const float *k, int64_t d) {
    int64_t i = 0;
    float s = 0;
    if (d >= LANES) {
        vf acc = vload(q) * vload(k);
        for (i = LANES; i + LANES <= d; i += LANES) acc += vload(q + i) * vload(k + i);
        s = vsum(acc);
    }
    for (; i < d; i++) s += q[i] * k[i];
    return s;
}

/* Ask for n rows of d floats at p before they are used. */
INLINE void prefetch(const float *p, int64_t n, int64_t d) {
    for (const char *c = (const char *)p, *end = (const char *)(p + n * d); c < end; c += 64) __builtin_prefetch(c);
}

/* One query q (d) against n keys and values (rows of d floats; keep[t] == 0 leaves key t out, keep NULL keeps every
   one) into out (d); scores holds n floats. A query with no key left gets zeros (a hole's: never read). The
   exponentials are taken 8 at a time (vexp), and out is summed 8 floats at a time over the keys, in two
   accumulators (every value row is in the L1 cache: a head's few keys). */
CLONES static void attend(const float *q, const float *K, const float *V, const int32_t *keep, int64_t n, int64_t d,
                          float scale, float *scores, float *out) {
    float max = -INFINITY, sum = 0;
    for (int64_t t = 0; t < n; t++) {
        scores[t] = keep && !keep[t] ? -INFINITY : dot(q, K + t * d, d) * scale;
        max = scores[t] > max ? scores[t] : max;
    }
    if (max == -INFINITY) {
        memset(out, 0, (size_t)d * sizeof(float));
        return;
    }
    int64_t t = 0;
    for (; t + LANES <= n; t += LANES) vstore(scores + t, vexp(vload(scores + t) - max));
    for (; t < n; t++) scores[t] = expf(scores[t] - max);
    for (t = 0; t < n; t++) {
        if (keep && !keep[t]) scores[t] = 0; /* vexp gives exp(-87) for -inf */
        sum += scores[t];
    }
    float inverse = 1 / sum;
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES) {
        vf even = {0}, odd = {0};
        for (t = 0; t + 1 < n; t += 2) {
            even += scores[t] * vload(V + t * d + i);
            odd += scores[t + 1] * vload(V + (t + 1) * d + i);
        }
        if (t < n) even += scores[t] * vload(V + t * d + i);
        vstore(out + i, (even + odd) * inverse);
    }
    for (; i < d; i++) {
        float o = 0;
        for (t = 0; t < n; t++) o += scores[t] * V[t * d + i];
        out[i] = o * inverse;
    }
}

typedef struct {
    const float *q, *K, *V;
    const int32_t *mask;
    float *out;
    int64_t J, G, h, S, d;
    float scale; /* 1 / sqrt(d_k) */
} Cross;

/* The keys of source j that attention reads: up to its last unmasked one (padding comes last), in whole vectors of
   LANES while S allows, so that every key read is summed as before. */
static int64_t keys_read(const int32_t *mask, int64_t S) {
    int64_t n = S;
    while (n > 0 && !mask[n - 1]) n--;
    n = (n + LANES - 1) / LANES * LANES;
    return n < S ? n : S;
}

static void cross_source(void *arg, size_t source) {
    const Cross *c = arg;
    int64_t j = (int64_t)source, block = c->S * c->d, n = keys_read(c->mask + j * c->S, c->S);
    int64_t next = j + 1 < c->J ? keys_read(c->mask + (j + 1) * c->S, c->S) : 0; /* the next source's */
    float scores[c->S > 0 ? c->S : 1];
    for (int64_t head = 0; head < c->h; head++) {
        const float *K = c->K + (j * c->h + head) * block, *V = c->V + (j * c->h + head) * block;
        int64_t ahead = head + 1 < c->h ? n : next; /* the next head's keys, or the next source's first head's */
        prefetch(K + block, ahead, c->d);
        prefetch(V + block, ahead, c->d);
        for (int64_t g = 0; g < c->G; g++) {
            int64_t at = ((j * c->G + g) * c->h + head) * c->d;
            attend(c->q + at, K, V, c->mask + j * c->S, n, c->d, c->scale, scores, c->out + at);
        }
    }
}

typedef struct {
    const float *q, *k, *v;
    float *K, *V, *out;
    const int32_t *lengths;
    int64_t B, h, C, d;
    float scale;
} Self;

static void self_row(void *arg, size_t row) {
    const Self *s = arg;
    int64_t b = (int64_t)row, at = s->lengths[b], block = s->C * s->d;
    float scores[at + 1];
    for (int64_t head = 0; head < s->h; head++) {
        int64_t i = (b * s->h + head) * s->d;
        float *K = s->K + (b * s->h + head) * block, *V = s->V + (b * s->h + head) * block;
        int64_t next = head + 1 < s->h ? at + 1 : b + 1 < s->B ? s->lengths[b + 1] + 1 : 0;
        prefetch(K + block, next, s->d); /* the next head's slots, or the next row's first head's */
        prefetch(V + block, next, s->d);
        memcpy(K + at * s->d, s->k + i, (size_t)s->d * sizeof(float));
        memcpy(V + at * s->d, s->v + i, (size_t)s->d * sizeof(float));
        attend(s->q + i, K, V, NULL, at + 1, s->d, s->scale, scores, s->out + i);
    }
}

typedef struct {
    const float *q, *k, *v;
    const int32_t *segments;
    float *heads, *out; /* heads: B (h, S, d_k) keys then as many values, each row's heads apart */
    int64_t S, h, d;
    float scale;
} Segment;

static void segment_row(void *arg, size_t row) {
    const Segment *s = arg;
    int64_t b = (int64_t)row, S = s->S, h = s->h, d = s->d, D = h * d;
    const int32_t *segments = s->segments + b * S;
    float *K = s->heads + b * 2 * S * D, *V = K + S * D;
    for (int64_t t = 0; t < S; t++)
        for (int64_t head = 0; head < h; head++) {
            memcpy(K + (head * S + t) * d, s->k + (b * S + t) * D + head * d, (size_t)d * sizeof(float));
            memcpy(V + (head * S + t) * d, s->v + (b * S + t) * D + head * d, (size_t)d * sizeof(float));
        }
    int32_t keep[S > 0 ? S : 1];
    float scores[S > 0 ? S : 1];
    for (int64_t t = 0; t < S; t++) {
        int32_t own = segments[t];
        int64_t first = -1, last = -1; /* the keys it attends to lie in first .. last */
        for (int64_t u = 0; u < S; u++)
            if ((keep[u] = segments[u] != 0 && (own == 0 || segments[u] == own))) {
                if (first < 0) first = u;
                last = u;
            }
        for (int64_t head = 0; head < h; head++) {
            int64_t at = (b * S + t) * D + head * d;
            if (last < 0)
                memset(s->out + at, 0, (size_t)d * sizeof(float));
            else
                attend(s->q + at, K + (head * S + first) * d, V + (head * S + first) * d, keep + first,
                       last - first + 1, d, s->scale, scores, s->out + at);
        }
    }
}

/* GreedyTokens. The int8 product approximates row t's logit for v, z[v] = h . W[v] + bias[v], as
   acc[v] c + bias[v] (c = scale w_scale), off by at most e = scale |W[v]|_1 + w_scale / 2 |h'|_1 (h' = h quantized:
   each element within one scale of h's; each of W[v]'s within half an int8 step of the int8 one's), taken with the
   largest |W[v]|_1 and enlarged by SLACK and ROUNDING for float32's rounding. With m the largest acc[v], some logit
   is at least m c + min(bias) - e, and a token whose logit reaches that has acc[v] >= m - (2e + max(bias) -
   min(bias)) / c: only those (a handful a row) get their float32 logits, and the largest wins (the first on ties,
   as numpy's argmax). So a row reads its int32 products twice, comparing integers, and a few rows of W.

   W's int8 values use 7 bits (-63..63): x86 CPUs without VNNI multiply uint8 by int8 in pairs summed into 16 bits,
   which saturate past 32,767 (255 * 127 * 2 does; 255 * 63 * 2 does not), and a saturated product would break the
   bound.

   On flat logits (a model unsure of the next token) many tokens reach the bar, and rescoring them one row of W at a
   time, each read from memory alone, costs more than the whole product. So each step first counts every row's
   survivors, then decides: the rows whose survivors cost more to rescore than a row of the whole product does get
   every token's float32 logit instead, all of them together, W read once a step (greedy_full), when what they save
   pays for that read. Their argmax is the same: the float32 logits, the first of equal ones. */
#define RESCORE 60 /* a survivor's logit, its row of W read alone, in units of one token of a row in greedy_full */
#define W_READ 10  /* reading W once for greedy_full, in the same unit per token */
#define SLACK 1.001
#define ROUNDING 1e-3 /* added to the bound: far more than float32 rounding moves a logit of tens */

typedef struct {
    const int32_t *acc;
    const float *h, *W, *bias;
    double c, spread, e_scale, e_l1; /* c, max(bias) - min(bias), e = e_scale + e_l1 |h'|_1 */
    int64_t V, d, pad;
    int64_t *tokens;       /* -1: the row's logits come from greedy_full */
    int32_t *bars;         /* each row's bar */
    vi *tops;              /* (T, blocks): each row's block maxima (row_top's) */
    int64_t *reached;      /* and how many of its tokens reach it */
    int64_t n_full, *full; /* the rows with tokens -1 */
} Greedy;

INLINE vi vimax(vi a, vi b) {
    vi m = a > b;
    return (a & m) | (b & ~m);
}

INLINE int any(vi m) {
    uint64_t x[sizeof m / 8];
    memcpy(x, &m, sizeof m);
    uint64_t y = 0;
    for (size_t i = 0; i < sizeof m / 8; i++) y |= x[i];
    return y != 0;
}

INLINE vi viload(const int32_t *p) {
    vi v;
    memcpy(&v, p, sizeof v);
    return v;
}

#define BLOCK (8 * LANES) /* tokens a block: pass 1 keeps each block's lane maxima, pass 2 reads only the blocks
                            that reach the bar */

/* Row t's largest product m without padding's, and its block maxima (tops: BLOCK tokens each). */
INLINE int32_t row_top(const int32_t *acc, int64_t V, int64_t pad, vi *tops) {
    const int64_t blocks = V / BLOCK;
    vi top = (vi){0} + INT32_MIN;
    for (int64_t b = 0; b < blocks; b++) {
        const int32_t *a = acc + b * BLOCK;
        vi x = vimax(vimax(vimax(viload(a), viload(a + LANES)), vimax(viload(a + 2 * LANES), viload(a + 3 * LANES))),
                     vimax(vimax(viload(a + 4 * LANES), viload(a + 5 * LANES)),
                           vimax(viload(a + 6 * LANES), viload(a + 7 * LANES))));
        tops[b] = x;
        top = vimax(top, x);
    }
    int32_t m = INT32_MIN;
    for (int i = 0; i < LANES; i++) m = top[i] > m ? top[i] : m;
    for (int64_t v = blocks * BLOCK; v < V; v++) m = acc[v] > m ? acc[v] : m;
    if (pad >= 0 && pad < V && acc[pad] == m) { /* padding's: m without it */
        m = INT32_MIN;
        for (int64_t v = 0; v < V; v++)
            if (v != pad && acc[v] > m) m = acc[v];
    }
    return m;
}

/* A row's bar (the product a token's must reach to be the largest logit) and how many tokens reach it. */
CLONES static void greedy_bar(void *arg, size_t row) {
    const Greedy *g = arg;
    const int64_t V = g->V, d = g->d, blocks = V / BLOCK;
    const int32_t *acc = g->acc + (int64_t)row * V;
    const float *h = g->h + (int64_t)row * d;
    vi *tops = g->tops + (int64_t)row * blocks;
    int32_t m = row_top(acc, V, g->pad, tops);
    vf sums = {0};
    int64_t i = 0;
    for (; i + LANES <= d; i += LANES) sums += (vf)((vi)vload(h + i) & INT32_MAX); /* |h| */
    double l1 = vsum(sums);
    for (; i < d; i++) l1 += fabsf(h[i]);
    double e = (g->e_scale + g->e_l1 * l1) * SLACK + ROUNDING, reach = (2 * e + g->spread) / g->c;
    int32_t bar = g->c > 0 && reach < (double)m - INT32_MIN ? (int32_t)((double)m - floor(reach)) : INT32_MIN;
    const vi bars = (vi){0} + bar;
    int64_t reached = 0;
    for (int64_t b = 0; b <= blocks; b++) {
        if (b < blocks && !any(tops[b] >= bars)) continue;
        for (int64_t v = b * BLOCK, end = b < blocks ? v + BLOCK : V; v < end; v++) reached += acc[v] >= bar;
    }
    g->bars[row] = bar;
    g->reached[row] = reached;
}

/* A row that greedy_full does not take: the float32 logits of the tokens that reach its bar, the largest wins. */
CLONES static void greedy_row(void *arg, size_t row) {
    const Greedy *g = arg;
    if (g->tokens[row] < 0) return;
    const int64_t V = g->V, d = g->d, pad = g->pad, blocks = V / BLOCK;
    const int32_t *acc = g->acc + (int64_t)row * V, bar = g->bars[row];
    const float *h = g->h + (int64_t)row * d;
    const vi bars = (vi){0} + bar, *tops = g->tops + (int64_t)row * blocks;
    int64_t token = -1;
    float best = -INFINITY;
    for (int64_t b = 0; b <= blocks; b++) {
        if (b < blocks && !any(tops[b] >= bars)) continue;
        for (int64_t v = b * BLOCK, end = b < blocks ? v + BLOCK : V; v < end; v++) {
            if (acc[v] < bar || v == pad) continue;
            float z = dot(h, g->W + v * d, d) + (g->bias ? g->bias[v] : 0);
            if (token < 0 || z > best) token = v, best = z;
        }
    }
    g->tokens[row] = token < 0 ? 0 : token;
}

/* Which rows greedy_full takes (tokens -1): those each of which costs more rescored than in the whole product,
   if together they save more than reading W once costs; the others 0 (greedy_row's). */
static void choose_full(Greedy *g, int64_t T) {
    int64_t saved = 0;
    for (int64_t t = 0; t < T; t++)
        if (RESCORE * g->reached[t] > g->V) saved += RESCORE * g->reached[t] - g->V;
    for (int64_t t = 0; t < T; t++)
        g->tokens[t] = saved > W_READ * g->V && RESCORE * g->reached[t] > g->V ? -1 : 0;
}

/* Sixteen floats: a panel's tokens (one AVX-512 register; two AVX2 ones). */
typedef float vw __attribute__((vector_size(16 * sizeof(float))));
#define WIDE 16

INLINE vw wload(const float *p) {
    vw v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Logits. Rows h (R, d) times the projection W (V, d) transposed, plus bias: out (R, V), with W read from its
   panels: (ceil(V / WIDE), d, WIDE), element k of WIDE tokens side by side (tokens past V zero), written at export
   (model/export/builder/graphs.py). A tile multiplies one element of a row of h, broadcast, by a panel's k-th
   vector: WIDE tokens' sums in one register, no horizontal sums, each panel read in order. A tile holds the sums of
   up to ROWS rows against PANEL_GROUP panels (more panels for a few rows: FEW_PANELS), 24 registers; a task's chunk
   of panels stays in the L2 cache while every group of rows passes it. */
#define ROWS 8
#define PANEL_GROUP 3
#define FEW_ROWS 4
#define FEW_PANELS 6
#define PANEL_CHUNK 12 /* panels a task */

typedef struct {
    const float *h, *panels, *bias;
    float *out;
    int64_t R, V, d, n_panels;
} Logits;

/* Rows r0 .. r0 + n (n <= ROWS) against panels p0 .. p0 + m (m <= FEW_PANELS, n m <= 24). */
INLINE void logits_tile(const Logits *L, int64_t r0, int n, int64_t p0, int m) {
    const int64_t d = L->d;
    const float *x[ROWS], *w = L->panels + p0 * d * WIDE;
#pragma GCC unroll 8
    for (int r = 0; r < n; r++) x[r] = L->h + (r0 + r) * d;
    vw acc[ROWS][FEW_PANELS];
#pragma GCC unroll 8
    for (int r = 0; r < n; r++)
#pragma GCC unroll 6
        for (int j = 0; j < m; j++) acc[r][j] = (vw){0};
    for (int64_t k = 0; k < d; k++) {
        vw a[FEW_PANELS];
#pragma GCC unroll 6
        for (int j = 0; j < m; j++) a[j] = wload(w + (j * d + k) * WIDE);
#pragma GCC unroll 8
        for (int r = 0; r < n; r++)
#pragma GCC unroll 6
            for (int j = 0; j < m; j++) acc[r][j] += x[r][k] * a[j]; /* broadcast from memory */
    }
    for (int j = 0; j < m; j++) {
        const int64_t v0 = (p0 + j) * WIDE, tokens = L->V - v0 < WIDE ? L->V - v0 : WIDE;
        vw b = {0};
        if (tokens == WIDE) { /* whole vectors; only the last panel may hold fewer tokens */
            if (L->bias) b = wload(L->bias + v0);
            for (int r = 0; r < n; r++) {
                vw z = acc[r][j] + b;
                memcpy(L->out + (r0 + r) * L->V + v0, &z, sizeof z);
            }
            continue;
        }
        if (L->bias) memcpy(&b, L->bias + v0, (size_t)tokens * sizeof(float));
        for (int r = 0; r < n; r++) {
            vw z = acc[r][j] + b;
            memcpy(L->out + (r0 + r) * L->V + v0, &z, (size_t)tokens * sizeof(float));
        }
    }
}

/* Rows r0 .. r0 + n against the panels first .. last, P panels a tile. */
INLINE void logits_rows(const Logits *L, int64_t r0, int n, int P, int64_t first, int64_t last) {
    for (int64_t p0 = first; p0 < last; p0 += P) {
        const int64_t m = last - p0 < P ? last - p0 : P;
        if (m == P) logits_tile(L, r0, n, p0, P);
        else for (int64_t j = 0; j < m; j++) logits_tile(L, r0, n, p0 + j, 1);
    }
}

/* One chunk of panels against every row of h, ROWS at a time (FEW_ROWS or fewer at once). */
CLONES static void logits_chunk(void *arg, size_t chunk) {
    const Logits *L = arg;
    const int64_t first = (int64_t)chunk * PANEL_CHUNK;
    const int64_t last = first + PANEL_CHUNK < L->n_panels ? first + PANEL_CHUNK : L->n_panels;
    switch (L->R) {
    case 1: logits_rows(L, 0, 1, FEW_PANELS, first, last); return;
    case 2: logits_rows(L, 0, 2, FEW_PANELS, first, last); return;
    case 3: logits_rows(L, 0, 3, FEW_PANELS, first, last); return;
    case FEW_ROWS: logits_rows(L, 0, FEW_ROWS, FEW_PANELS, first, last); return;
    }
    int64_t r0 = 0;
    for (; r0 + ROWS <= L->R; r0 += ROWS) logits_rows(L, r0, ROWS, PANEL_GROUP, first, last);
    switch (L->R - r0) {
    case 1: logits_rows(L, r0, 1, PANEL_GROUP, first, last); break;
    case 2: logits_rows(L, r0, 2, PANEL_GROUP, first, last); break;
    case 3: logits_rows(L, r0, 3, PANEL_GROUP, first, last); break;
    case 4: logits_rows(L, r0, 4, PANEL_GROUP, first, last); break;
    case 5: logits_rows(L, r0, 5, PANEL_GROUP, first, last); break;
    case 6: logits_rows(L, r0, 6, PANEL_GROUP, first, last); break;
    case 7: logits_rows(L, r0, 7, PANEL_GROUP, first, last); break;
    }
}

/* The rows that the screen gave up on: their float32 logits from the panels (Logits' tiles), then each row's
   largest, the first of equal ones, never padding's. */
static OrtStatusPtr greedy_full(OrtKernelContext *ctx, Greedy *g, const float *panels) {
    const int64_t n = g->n_full, V = g->V, d = g->d;
    float *rows = malloc((size_t)(n * d) * sizeof *rows), *z = malloc((size_t)(n * V) * sizeof *z);
    OrtStatusPtr status = NULL;
    if (!rows || !z) status = ort->CreateStatus(ORT_FAIL, "attnserve.GreedyTokens: out of memory");
    for (int64_t r = 0; !status && r < n; r++) memcpy(rows + r * d, g->h + g->full[r] * d, (size_t)d * sizeof *rows);
    Logits L = {.h = rows, .panels = panels, .bias = g->bias, .out = z, .R = n, .V = V, .d = d,
                .n_panels = (V + WIDE - 1) / WIDE};
    if (!status)
        status = ort->KernelContext_ParallelFor(ctx, logits_chunk, (size_t)((L.n_panels + PANEL_CHUNK - 1) / PANEL_CHUNK),
                                                0, &L);
    for (int64_t r = 0; !status && r < n; r++) {
        const float *row = z + r * V;
        int64_t token = -1;
        for (int64_t v = 0; v < V; v++)
            if (v != g->pad && (token < 0 || row[v] > row[token])) token = v;
        g->tokens[g->full[r]] = token < 0 ? 0 : token;
    }
    free(rows), free(z);
    return status;
}

#define TRY(expr)                             \
    do {                                      \
        OrtStatusPtr status_ = (expr);        \
        if (status_) return status_;          \
    } while (0)

static OrtStatusPtr input(OrtKernelContext *ctx, size_t i, const void **data, const int64_t **shape, size_t *rank) {
    const OrtValue *value;
    ONNXTensorElementDataType type;
    TRY(ort->KernelContext_GetInput(ctx, i, &value));
    TRY(ort->GetTensorElementTypeAndShapeDataReference(value, &type, shape, rank));
    return ort->GetTensorData(value, data);
}

static OrtStatusPtr output(OrtKernelContext *ctx, size_t i, const int64_t *shape, size_t rank, void *data) {
    OrtValue *value;
    TRY(ort->KernelContext_GetOutput(ctx, i, shape, rank, &value));
    return ort->GetTensorMutableData(value, (void **)data);
}

static OrtStatusPtr invalid(const char *message) { return ort->CreateStatus(ORT_INVALID_ARGUMENT, message); }

/* Input i's data and shape (rank numbers). */
typedef struct {
    const void *data;
    const int64_t *shape;
    size_t rank;
} Input;

static OrtStatusPtr inputs_of(OrtKernelContext *ctx, Input *in, size_t n) {
    for (size_t i = 0; i < n; i++) TRY(input(ctx, i, &in[i].data, &in[i].shape, &in[i].rank));
    return NULL;
}

static int same_shape(const Input *a, const Input *b) {
    return a->rank == b->rank && !memcmp(a->shape, b->shape, a->rank * sizeof *a->shape);
}

static int one_element(const Input *a) {
    int64_t n = 1;
    for (size_t i = 0; i < a->rank; i++) n *= a->shape[i];
    return n == 1;
}

/* Whether p holds the panels of a projection of V tokens by d (Logits' layout). */
static int are_panels(const Input *p, int64_t V, int64_t d) {
    return p->rank == 3 && p->shape[0] == (V + WIDE - 1) / WIDE && p->shape[1] == d && p->shape[2] == WIDE;
}

static OrtStatusPtr cross_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    Input in[4]; /* q, K, V, mask */
    TRY(inputs_of(ctx, in, 4));
    const int64_t *q = in[0].shape, *K = in[1].shape, *mask = in[3].shape;
    if (in[0].rank != 3 || in[1].rank != 4 || !same_shape(&in[1], &in[2]) || in[3].rank != 2 || q[0] != K[0] ||
        q[2] != K[1] * K[3] || mask[0] != K[0] || mask[1] != K[2])
        return invalid("attnserve.Attention: expected q (J, G, h d_k), K and V (J, h, S, d_k), mask (J, S)");
    Cross c = {in[0].data, in[1].data, in[2].data, in[3].data, NULL, K[0], q[1], K[1], K[2], K[3], 1 / sqrtf((float)K[3])};
    TRY(output(ctx, 0, q, 3, &c.out));
    return ort->KernelContext_ParallelFor(ctx, cross_source, (size_t)c.J, 0, &c);
}

static OrtStatusPtr self_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    Input in[7]; /* q, k, v, K, V, lengths, total */
    TRY(inputs_of(ctx, in, 7));
    const int64_t *q = in[0].shape, *K = in[3].shape;
    if (in[0].rank != 3 || !same_shape(&in[0], &in[1]) || !same_shape(&in[0], &in[2]) || in[3].rank != 4 ||
        !same_shape(&in[3], &in[4]) || q[0] != K[0] || q[1] != 1 || q[2] != K[1] * K[3] || in[5].rank != 1 ||
        in[5].shape[0] != K[0])
        return invalid("attnserve.CachedAttention: expected q, k, v (B, 1, h d_k), K and V (B, h, C, d_k), "
                       "lengths (B,)");
    Self s = {in[0].data, in[1].data, in[2].data, NULL, NULL, NULL, in[5].data,
              K[0], K[1], K[2], K[3], 1 / sqrtf((float)K[3])};
    for (int64_t b = 0; b < s.B; b++)
        if (s.lengths[b] < 0 || s.lengths[b] >= s.C)
            return invalid("attnserve.CachedAttention: a row's length leaves no slot for its new key in the cache");
    TRY(output(ctx, 0, q, 3, &s.out));
    TRY(output(ctx, 1, K, 4, &s.K));
    TRY(output(ctx, 2, K, 4, &s.V));
    size_t bytes = (size_t)(s.B * s.h * s.C * s.d) * sizeof(float);
    if ((const void *)s.K != in[3].data) memcpy(s.K, in[3].data, bytes); /* not bound in place */
    if ((const void *)s.V != in[4].data) memcpy(s.V, in[4].data, bytes);
    return ort->KernelContext_ParallelFor(ctx, self_row, (size_t)s.B, 0, &s);
}

static OrtStatusPtr segment_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    Input in[5]; /* q, k, v, segments, h */
    TRY(inputs_of(ctx, in, 5));
    const int64_t *q = in[0].shape, *segments = in[3].shape;
    int64_t h = one_element(&in[4]) ? *(const int64_t *)in[4].data : 0;
    if (in[0].rank != 3 || !same_shape(&in[0], &in[1]) || !same_shape(&in[0], &in[2]) || in[3].rank != 2 ||
        segments[0] != q[0] || segments[1] != q[1] || h < 1 || q[2] % h)
        return invalid("attnserve.SegmentAttention: expected q, k, v (B, S, h d_k), segments (B, S), h () dividing "
                       "h d_k");
    Segment s = {in[0].data, in[1].data, in[2].data, in[3].data, NULL, NULL, q[1], h, q[2] / h,
                 1 / sqrtf((float)(q[2] / h))};
    TRY(output(ctx, 0, q, 3, &s.out));
    size_t bytes = (size_t)(2 * q[0] * q[1] * q[2]) * sizeof(float);
    if (!bytes) return NULL;
    if (!(s.heads = malloc(bytes))) return ort->CreateStatus(ORT_FAIL, "attnserve.SegmentAttention: out of memory");
    OrtStatusPtr status = ort->KernelContext_ParallelFor(ctx, segment_row, (size_t)q[0], 0, &s);
    free(s.heads);
    return status;
}

static OrtStatusPtr greedy_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    Input in[9]; /* acc, scale, h, W, panels, bias, w_scale, w_l1, pad */
    TRY(inputs_of(ctx, in, 9));
    const int64_t *acc = in[0].shape, *h = in[2].shape, *W = in[3].shape;
    if (in[0].rank != 2 || !one_element(&in[1]) || in[2].rank != 2 || in[3].rank != 2 || h[0] != acc[0] ||
        W[0] != acc[1] || W[1] != h[1] || !are_panels(&in[4], W[0], W[1]) || in[5].rank != 1 ||
        in[5].shape[0] != W[0] || !one_element(&in[6]) || !one_element(&in[7]) || !one_element(&in[8]))
        return invalid("attnserve.GreedyTokens: expected acc (T, V), scale (), h (T, d), W (V, d), panels (ceil(V / "
                       "16), d, 16), bias (V,), w_scale (), w_l1 (), pad ()");
    double scale = *(const float *)in[1].data, w_scale = *(const float *)in[6].data;
    Greedy g = {.acc = in[0].data, .h = in[2].data, .W = in[3].data, .bias = in[5].data, .c = scale * w_scale,
                .e_scale = scale * *(const float *)in[7].data + 0.5 * w_scale * (double)W[1] * scale,
                .e_l1 = 0.5 * w_scale, .V = W[0], .d = W[1], .pad = *(const int64_t *)in[8].data};
    { /* finite biases: a token with -inf can never win */
        float lo = INFINITY, hi = -INFINITY;
        for (int64_t v = 0; v < g.V; v++)
            if (isfinite(g.bias[v])) lo = fminf(lo, g.bias[v]), hi = fmaxf(hi, g.bias[v]);
        g.spread = hi >= lo ? (double)hi - lo : 0;
    }
    TRY(output(ctx, 0, acc, 1, &g.tokens));
    if (!acc[0]) return NULL;
    const int64_t T = acc[0];
    g.bars = malloc((size_t)T * sizeof *g.bars);
    g.tops = aligned_alloc(sizeof *g.tops, (size_t)(T * (g.V / BLOCK) + 1) * sizeof *g.tops); /* vector stores */
    g.reached = malloc((size_t)T * sizeof *g.reached);
    g.full = malloc((size_t)T * sizeof *g.full);
    OrtStatusPtr status = NULL;
    if (!g.bars || !g.tops || !g.reached || !g.full)
        status = ort->CreateStatus(ORT_FAIL, "attnserve.GreedyTokens: out of memory");
    if (!status) status = ort->KernelContext_ParallelFor(ctx, greedy_bar, (size_t)T, 0, &g);
    if (!status) {
        choose_full(&g, T);
        status = ort->KernelContext_ParallelFor(ctx, greedy_row, (size_t)T, 0, &g);
    }
    for (int64_t t = 0; !status && t < T; t++)
        if (g.tokens[t] < 0) g.full[g.n_full++] = t;
    if (!status && g.n_full) status = greedy_full(ctx, &g, in[4].data);
    free(g.bars), free(g.tops), free(g.reached), free(g.full);
    return status;
}

static OrtStatusPtr logits_compute(void *kernel, OrtKernelContext *ctx) {
    (void)kernel;
    Input in[3]; /* h, panels, bias */
    TRY(inputs_of(ctx, in, 3));
    if (in[0].rank != 2 || in[2].rank != 1 || !are_panels(&in[1], in[2].shape[0], in[0].shape[1]))
        return invalid("attnserve.Logits: expected h (R, d), panels (ceil(V / 16), d, 16), bias (V,)");
    Logits L = {.h = in[0].data, .panels = in[1].data, .bias = in[2].data, .R = in[0].shape[0],
                .V = in[2].shape[0], .d = in[0].shape[1], .n_panels = in[1].shape[0]};
    const int64_t shape[2] = {L.R, L.V};
    TRY(output(ctx, 0, shape, 2, &L.out));
    if (!L.R || !L.V) return NULL;
    return ort->KernelContext_ParallelFor(ctx, logits_chunk, (size_t)((L.n_panels + PANEL_CHUNK - 1) / PANEL_CHUNK),
                                          0, &L);
}

/* The custom-op definitions: an op's name, types and compute function; every input and output required. */

typedef struct {
    OrtCustomOp op; /* first: ONNX Runtime passes &op back */
    const char *name;
    size_t inputs, outputs;
    const ONNXTensorElementDataType *types, *out_types;
} Op;

#define OP(op) ((const Op *)(op))
#define FLOAT ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
#define INT32 ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
#define INT64 ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64

static const ONNXTensorElementDataType CROSS_TYPES[] = {FLOAT, FLOAT, FLOAT, INT32}, CROSS_OUT[] = {FLOAT};
static const ONNXTensorElementDataType SELF_TYPES[] = {FLOAT, FLOAT, FLOAT, FLOAT, FLOAT, INT32, INT32},
                                       SELF_OUT[] = {FLOAT, FLOAT, FLOAT};
static const ONNXTensorElementDataType SEGMENT_TYPES[] = {FLOAT, FLOAT, FLOAT, INT32, INT64}, SEGMENT_OUT[] = {FLOAT};
static const ONNXTensorElementDataType GREEDY_TYPES[] = {INT32, FLOAT, FLOAT, FLOAT, FLOAT, FLOAT, FLOAT, FLOAT, INT64},
                                       GREEDY_OUT[] = {INT64};
static const ONNXTensorElementDataType LOGITS_TYPES[] = {FLOAT, FLOAT, FLOAT}, LOGITS_OUT[] = {FLOAT};

static const char *name(const OrtCustomOp *op) { return OP(op)->name; }
static const char *provider(const OrtCustomOp *op) { return (void)op, "CPUExecutionProvider"; }
static size_t inputs(const OrtCustomOp *op) { return OP(op)->inputs; }
static size_t outputs(const OrtCustomOp *op) { return OP(op)->outputs; }
static ONNXTensorElementDataType input_type(const OrtCustomOp *op, size_t i) { return OP(op)->types[i]; }
static ONNXTensorElementDataType output_type(const OrtCustomOp *op, size_t i) { return OP(op)->out_types[i]; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) {
    return (void)op, (void)i, INPUT_OUTPUT_REQUIRED;
}
static OrtMemType memory(const OrtCustomOp *op, size_t i) { return (void)op, (void)i, OrtMemTypeDefault; }
static int one(const OrtCustomOp *op) { return (void)op, 1; }
static int any_version(const OrtCustomOp *op) { return (void)op, INT32_MAX; }
static size_t no_pairs(int **in, int **out) { return *in = NULL, *out = NULL, 0; }
static void release_pairs(int *in, int *out) { (void)in, (void)out; }
static OrtStatusPtr create_kernel(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **kernel) {
    (void)api, (void)info;
    *kernel = (void *)op; /* the kernels keep no state */
    return NULL;
}
static void destroy_kernel(void *kernel) { (void)kernel; }

static Op define(const char *op_name, size_t n_in, size_t n_out, const ONNXTensorElementDataType *types,
                 const ONNXTensorElementDataType *out_types, OrtStatusPtr (*compute)(void *, OrtKernelContext *)) {
    Op op = {.name = op_name, .inputs = n_in, .outputs = n_out, .types = types, .out_types = out_types};
    op.op = (OrtCustomOp){
        .version = API_VERSION,
        .GetName = name,
        .GetExecutionProviderType = provider,
        .GetInputType = input_type,
        .GetInputTypeCount = inputs,
        .GetOutputType = output_type,
        .GetOutputTypeCount = outputs,
        .KernelDestroy = destroy_kernel,
        .GetInputCharacteristic = required,
        .GetOutputCharacteristic = required,
        .GetInputMemoryType = memory,
        .GetVariadicInputMinArity = one,
        .GetVariadicInputHomogeneity = one,
        .GetVariadicOutputMinArity = one,
        .GetVariadicOutputHomogeneity = one,
        .CreateKernelV2 = create_kernel,
        .KernelComputeV2 = compute,
        .GetStartVersion = one,
        .GetEndVersion = any_version,
        .GetMayInplace = no_pairs,
        .ReleaseMayInplace = release_pairs,
        .GetAliasMap = no_pairs,
        .ReleaseAliasMap = release_pairs,
    };
    return op;
}

static Op ops[5];

/* Called by ONNX Runtime when SessionOptions.register_custom_ops_library loads this file (once for each options:
   the domain lives as long as the process, as sessions made with them may). */
ORT_EXPORT OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
    if (!(ort = base->GetApi(API_VERSION))) return NULL; /* older than 1.24: session creation names the missing op */
    if (!ops[0].name) {
        ops[0] = define("Attention", 4, 1, CROSS_TYPES, CROSS_OUT, cross_compute);
        ops[1] = define("CachedAttention", 7, 3, SELF_TYPES, SELF_OUT, self_compute);
        ops[2] = define("GreedyTokens", 9, 1, GREEDY_TYPES, GREEDY_OUT, greedy_compute);
        ops[3] = define("SegmentAttention", 5, 1, SEGMENT_TYPES, SEGMENT_OUT, segment_compute);
        ops[4] = define("Logits", 3, 1, LOGITS_TYPES, LOGITS_OUT, logits_compute);
    }
    OrtCustomOpDomain *domain;
    TRY(ort->CreateCustomOpDomain("attnserve", &domain));
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) TRY(ort->CustomOpDomain_Add(domain, &ops[i].op));
    return ort->AddCustomOpDomain(options, domain);
}

/* Importable, so that service.runtime.runner finds the file: ``service.runtime._attention.__file__``. */
static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, .m_name = "_attention", .m_doc = "attnserve's attention kernels for ONNX Runtime"};

PyMODINIT_FUNC PyInit__attention(void) { return PyModule_Create(&module); }
