/* service.runtime._beam: the per-step arithmetic of beam search over a batch's logits, in C (service/decoding/ calls it).

   scores(logits, rows, log_norm, block_max)
       For each row r in rows: log_norm[r] = log sum_v exp(logits[r, v]) and block_max[r, b] = the largest logit of
       tokens b*BLOCK .. (b+1)*BLOCK-1. Two passes over the row (the maxima, then the exponentials), vectorized.
   top(logits, log_norm, block_max, rows, hyp, n, out_j, out_r, out_t, out_v) -> count
       The n best continuations of each of J requests with k rows each (rows (J, k), hyp (J, k) the rows'
       hypothesis log-probabilities, -inf for a row that holds none), ranked together:
       value = hyp + logits[r, t] - log_norm[r]; request by request, best first, ties by row then token, only
       finite values. Exact in two passes: the n-th best block value (hyp - log_norm + block maximum) is a cut that
       at least n continuations reach, and every continuation above it lies in a block above it.
   copy_rows(out, dst, cache, src, used)
       out[dst[i], :, :used[i]] = cache[src[i], :, :used[i]] for C-contiguous (N, h, C, d) caches of any C, one
       memmove a head (numpy's fancy indexing gathers into a temporary first, and copies one slot count for all).
       out may be cache (in place): then dst and src rows are disjoint (beam children move into rows no child
       continues, compaction moves rows into holes). A row's own count: a short row next to a long one copies (and
       faults in the fresh pages of) its own slots, not the long one's.
   copy_spans(out, dst, cache, src, start, used)
       out[dst[i], :, :used[i]] = cache[src[i], :, start[i]:start[i] + used[i]] and the rest of out[dst[i]] zero:
       a newcomer's cross keys or values, out of the encoder row it was packed into, straight into its batch row
       (no gathered temporary, no second copy).

   One pass over each row instead of numpy's whole-array passes (subtract, exp, sum, block maxima over (N, V)), and
   the ranking needs no (J, k * blocks) arrays. The exponential is Cephes' polynomial (within 2 ulp of expf), 8
   lanes at a time through GCC/Clang vector extensions; GCC on x86-64 Linux compiles it for AVX-512, AVX2 and
   baseline x86-64 and picks one at load time (target_clones); other compilers build it once, at baseline speed.
   The GIL is released meanwhile. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_vector.h"

#define BLOCK 64 /* tokens a block: 8,000 logits have 125 */

/* The row's largest logit; block_max[b] of each block. */
CLONES static float row_max(const float *x, int64_t V, float *block_max) {
    float top = -INFINITY;
    for (int64_t b0 = 0; b0 < V; b0 += BLOCK) {
        int64_t end = b0 + BLOCK < V ? b0 + BLOCK : V, v = b0;
        float m = -INFINITY;
        if (end - b0 == BLOCK) {
            vf lanes = vload(x + b0);
            for (v = b0 + LANES; v < end; v += LANES) lanes = vmax(lanes, vload(x + v));
            for (int l = 0; l < LANES; l++) m = lanes[l] > m ? lanes[l] : m;
        }
        for (; v < end; v++) m = x[v] > m ? x[v] : m;
        block_max[b0 / BLOCK] = m;
        top = m > top ? m : top;
    }
    return top;
}

/* sum_v exp(x[v] - top). */
CLONES static float sum_exp(const float *x, int64_t V, float top) {
    vf acc = {0};
    int64_t v = 0;
    for (; v + LANES <= V; v += LANES) acc += vexp(vload(x + v) - top);
    float s = 0.0f;
    for (int l = 0; l < LANES; l++) s += acc[l];
    for (; v < V; v++) s += expf(x[v] - top);
    return s;
}

typedef struct {
    double value;
    int64_t row, token;
} Candidate;

/* a ranks before b: a higher value, then a lower row, then a lower token. */
INLINE int before(const Candidate *a, const Candidate *b) {
    if (a->value != b->value) return a->value > b->value;
    if (a->row != b->row) return a->row < b->row;
    return a->token < b->token;
}

/* Keep the n best of a stream in best[0..*kept) (best first): one insertion step. */
INLINE void keep_best(Candidate *best, int64_t *kept, int64_t n, Candidate c) {
    if (*kept == n && !before(&c, &best[n - 1])) return;
    int64_t p = *kept < n ? (*kept)++ : n - 1;
    for (; p > 0 && before(&c, &best[p - 1]); p--) best[p] = best[p - 1];
    best[p] = c;
}

/* One request's n best continuations into best[0..kept); returns kept, or -1 when out of memory. */
static int64_t request_top(const float *logits, int64_t V, const float *log_norm, const float *block_max,
                           const int64_t *rows, const double *hyp, int64_t k, int64_t n, Candidate *best) {
    int64_t nb = (V + BLOCK - 1) / BLOCK, kept = 0, blocks = 0;
    /* The cut: the n-th best block value (the n best kept as candidates of value only). */
    for (int64_t i = 0; i < k; i++) {
        if (!(hyp[i] > -INFINITY)) continue; /* not alive */
        double base = hyp[i] - (double)log_norm[rows[i]];
        const float *bm = block_max + rows[i] * nb;
        for (int64_t b = 0; b < nb; b++) keep_best(best, &kept, n, (Candidate){base + (double)bm[b], 0, 0});
    }
    double cut = kept == n ? best[n - 1].value : -INFINITY;
    for (int64_t i = 0; i < k; i++) {
        if (!(hyp[i] > -INFINITY)) continue;
        double base = hyp[i] - (double)log_norm[rows[i]];
        const float *bm = block_max + rows[i] * nb;
        for (int64_t b = 0; b < nb; b++) blocks += base + (double)bm[b] >= cut;
    }
    /* Every continuation at or above the cut, from the blocks at or above it; then the n best of them. */
    Candidate *found = malloc((size_t)(blocks ? blocks : 1) * BLOCK * sizeof(Candidate));
    if (!found) return -1;
    int64_t m = 0;
    for (int64_t i = 0; i < k; i++) {
        if (!(hyp[i] > -INFINITY)) continue;
        int64_t r = rows[i];
        double base = hyp[i] - (double)log_norm[r];
        const float *bm = block_max + r * nb, *x = logits + r * V;
        for (int64_t b = 0; b < nb; b++) {
            if (!(base + (double)bm[b] >= cut)) continue;
            int64_t end = (b + 1) * BLOCK < V ? (b + 1) * BLOCK : V;
            for (int64_t t = b * BLOCK; t < end; t++) {
                double value = base + (double)x[t];
                if (value >= cut && value > -INFINITY) found[m++] = (Candidate){value, r, t};
            }
        }
    }
    kept = 0;
    for (int64_t q = 0; q < m; q++) keep_best(best, &kept, n, found[q]);
    free(found);
    return kept;
}

/* A C-contiguous buffer of ndim dimensions and one of the struct formats in formats (itemsize bytes each). */
static int get_buffer(PyObject *obj, Py_buffer *view, const char *name, const char *formats, Py_ssize_t itemsize,
                      int ndim, int writable) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=' || format[0] == '@') format++;
    if (view->ndim != ndim || view->itemsize != itemsize || strlen(format) != 1 || !strchr(formats, format[0])) {
        PyErr_Format(PyExc_ValueError, "%s: expected a C-contiguous %d-d array of %s", name, ndim,
                     itemsize == 4 ? "float32" : formats[0] == 'd' ? "float64" : "int64");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *scores(PyObject *self, PyObject *args) {
    PyObject *objs[4];
    Py_buffer logits, rows, log_norm, block_max;
    if (!PyArg_ParseTuple(args, "OOOO:scores", &objs[0], &objs[1], &objs[2], &objs[3])) return NULL;
    if (get_buffer(objs[0], &logits, "logits", "f", 4, 2, 0) < 0) return NULL;
    if (get_buffer(objs[1], &rows, "rows", "lq", 8, 1, 0) < 0) goto fail_rows;
    if (get_buffer(objs[2], &log_norm, "log_norm", "f", 4, 1, 1) < 0) goto fail_log_norm;
    if (get_buffer(objs[3], &block_max, "block_max", "f", 4, 2, 1) < 0) goto fail_block_max;
    int64_t N = logits.shape[0], V = logits.shape[1], m = rows.shape[0];
    const int64_t *r = rows.buf;
    int bad = log_norm.shape[0] != N || block_max.shape[0] != N || block_max.shape[1] != (V + BLOCK - 1) / BLOCK;
    for (int64_t i = 0; i < m && !bad; i++) bad = r[i] < 0 || r[i] >= N;
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "scores: shapes or rows do not match the logits");
    } else {
        Py_BEGIN_ALLOW_THREADS
        int64_t nb = (V + BLOCK - 1) / BLOCK;
        for (int64_t i = 0; i < m; i++) {
            const float *x = (const float *)logits.buf + r[i] * V;
            float top = row_max(x, V, (float *)block_max.buf + r[i] * nb);
            ((float *)log_norm.buf)[r[i]] = top + logf(sum_exp(x, V, top));
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&block_max);
fail_block_max:
    PyBuffer_Release(&log_norm);
fail_log_norm:
    PyBuffer_Release(&rows);
fail_rows:
    PyBuffer_Release(&logits);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *top(PyObject *self, PyObject *args) {
    PyObject *objs[9];
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOOOOnOOOO:top", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &n, &objs[5],
                          &objs[6], &objs[7], &objs[8]))
        return NULL;
    static const char *names[] = {"logits", "log_norm", "block_max", "rows", "hyp", "out_j", "out_r", "out_t", "out_v"};
    static const char *formats[] = {"f", "f", "f", "lq", "d", "lq", "lq", "lq", "d"};
    static const Py_ssize_t itemsizes[] = {4, 4, 4, 8, 8, 8, 8, 8, 8};
    static const int ndims[] = {2, 1, 2, 2, 2, 1, 1, 1, 1};
    Py_buffer views[9];
    int got = 0;
    for (; got < 9; got++)
        if (get_buffer(objs[got], &views[got], names[got], formats[got], itemsizes[got], ndims[got], got >= 5) < 0)
            break;
    int64_t count = 0;
    if (got == 9) {
        int64_t N = views[0].shape[0], V = views[0].shape[1], J = views[3].shape[0], k = views[3].shape[1];
        const int64_t *rows = views[3].buf;
        int bad = n < 1 || views[1].shape[0] != N || views[2].shape[0] != N ||
                  views[2].shape[1] != (V + BLOCK - 1) / BLOCK || views[4].shape[0] != J || views[4].shape[1] != k;
        for (int i = 5; i < 9; i++) bad = bad || views[i].shape[0] < J * n;
        for (int64_t i = 0; i < J * k && !bad; i++) bad = rows[i] < 0 || rows[i] >= N;
        Candidate *best = bad ? NULL : malloc((size_t)n * sizeof(Candidate));
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "top: shapes or rows do not match the logits");
        } else if (!best) {
            PyErr_NoMemory();
        } else {
            int64_t *out_j = views[5].buf, *out_r = views[6].buf, *out_t = views[7].buf;
            double *out_v = views[8].buf;
            Py_BEGIN_ALLOW_THREADS
            for (int64_t j = 0; j < J && count >= 0; j++) {
                int64_t kept = request_top(views[0].buf, V, views[1].buf, views[2].buf, rows + j * k,
                                           (const double *)views[4].buf + j * k, k, n, best);
                for (int64_t q = 0; q < kept; q++, count++) {
                    out_j[count] = j;
                    out_r[count] = best[q].row;
                    out_t[count] = best[q].token;
                    out_v[count] = best[q].value;
                }
                if (kept < 0) count = -1;
            }
            Py_END_ALLOW_THREADS
            free(best);
            if (count < 0) PyErr_NoMemory();
        }
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    if (PyErr_Occurred()) return NULL;
    return PyLong_FromLongLong(count);
}

/* copy_rows (spans 0) and copy_spans (spans 1): out[dst[i], :, :used[i]] = cache[src[i], :, start[i]:][:used[i]],
   start 0 for copy_rows; copy_spans also zeroes the rest of out's row. */
static PyObject *copy(PyObject *args, int spans) {
    PyObject *objs[6] = {NULL};
    if (!PyArg_ParseTuple(args, spans ? "OOOOOO:copy_spans" : "OOOOO:copy_rows", &objs[0], &objs[1], &objs[2],
                          &objs[3], &objs[4], &objs[5]))
        return NULL;
    static const char *names[] = {"out", "dst", "cache", "src", "start", "used"};
    Py_buffer views[6]; /* out, dst, cache, src, (start,) used */
    int want = spans ? 6 : 5, got = 0;
    for (; got < want; got++) {
        int array = got == 0 || got == 2; /* out and cache: any 4-d C-contiguous array */
        int ok = array ? PyObject_GetBuffer(objs[got], &views[got], PyBUF_C_CONTIGUOUS | (got ? 0 : PyBUF_WRITABLE))
                       : get_buffer(objs[got], &views[got], names[got + (!spans && got == 4)], "lq", 8, 1, 0);
        if (ok < 0) break;
    }
    if (got == want) {
        Py_buffer *out = &views[0], *cache = &views[2];
        const int64_t *d = views[1].buf, *s = views[3].buf, *u = views[want - 1].buf, m = views[1].shape[0];
        const int64_t *f = spans ? views[4].buf : NULL;
        int bad = out->ndim != 4 || cache->ndim != 4 || views[3].shape[0] != m || views[4].shape[0] != m ||
                  views[want - 1].shape[0] != m;
        bad = bad || out->shape[1] != cache->shape[1] || out->shape[3] != cache->shape[3] ||
              out->itemsize != cache->itemsize;
        for (int64_t i = 0; i < m && !bad; i++) {
            int64_t first = f ? f[i] : 0;
            bad = d[i] < 0 || d[i] >= out->shape[0] || s[i] < 0 || s[i] >= cache->shape[0] || u[i] < 0 || first < 0 ||
                  u[i] > out->shape[2] || first + u[i] > cache->shape[2];
        }
        if (bad) {
            PyErr_Format(PyExc_ValueError,
                         "%s: expected C-contiguous (N, h, C, d) arrays of one h, d and type, their rows, spans "
                         "within them",
                         spans ? "copy_spans" : "copy_rows");
        } else {
            Py_ssize_t h = out->shape[1], slot = out->shape[3] * out->itemsize;
            Py_ssize_t to = out->shape[2] * slot, from = cache->shape[2] * slot; /* bytes a head */
            char *o = out->buf;
            const char *c = cache->buf;
            Py_BEGIN_ALLOW_THREADS
            for (int64_t i = 0; i < m; i++)
                for (Py_ssize_t j = 0; j < h; j++) {
                    char *row = o + (d[i] * h + j) * to;
                    memmove(row, c + (s[i] * h + j) * from + (f ? f[i] : 0) * slot, (size_t)(u[i] * slot));
                    if (spans) memset(row + u[i] * slot, 0, (size_t)(to - u[i] * slot));
                }
            Py_END_ALLOW_THREADS
        }
    }
    for (int i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *copy_rows(PyObject *self, PyObject *args) { return copy(args, 0); }

static PyObject *copy_spans(PyObject *self, PyObject *args) { return copy(args, 1); }

static PyMethodDef methods[] = {
    {"scores", scores, METH_VARARGS, "scores(logits, rows, log_norm, block_max): rows' log-normalizers and block maxima"},
    {"top", top, METH_VARARGS,
     "top(logits, log_norm, block_max, rows, hyp, n, out_j, out_r, out_t, out_v) -> count: each request's n best"},
    {"copy_rows", copy_rows, METH_VARARGS,
     "copy_rows(out, dst, cache, src, used): out[dst[i], :, :used[i]] = cache[src[i], :, :used[i]], row by row"},
    {"copy_spans", copy_spans, METH_VARARGS,
     "copy_spans(out, dst, cache, src, start, used): out[dst[i], :, :used[i]] = cache[src[i], :, start[i]:][:used[i]], "
     "the rest of out's row zero"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_beam", "Beam search's per-step arithmetic.", -1, methods};

PyMODINIT_FUNC PyInit__beam(void) {
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "BLOCK", BLOCK) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
