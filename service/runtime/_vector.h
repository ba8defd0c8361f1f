/* What attnserve's C extensions share (service/runtime/_beam.c, service/runtime/_attention.c): functions built three times with GCC
   on x86-64 Linux, for AVX-512, AVX2 and baseline x86-64, one picked at load time (CLONES; see service/runtime/_beam.c), and
   float vectors of LANES (8) lanes through GCC/Clang vector extensions, with the exponential that both use (vexp). */
#ifndef ATTNSERVE_VECTOR_H
#define ATTNSERVE_VECTOR_H

#include <stdint.h>
#include <string.h>

#define LANES 8

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(LANES * sizeof(float))));

typedef int32_t vi __attribute__((vector_size(LANES * sizeof(int32_t))));

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

INLINE void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* The sum of v's lanes, added in pairs. */
INLINE float vsum(vf v) {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

INLINE vf vmax(vf a, vf b) {
    vi m = a > b;
    return (vf)(((vi)a & m) | ((vi)b & ~m));
}

/* exp(x) lane by lane; below -87 (and -inf) as exp(-87), which no sum of exponentials of a row notices. */
INLINE vf vexp(vf x) {
    x = vmax(x, (vf){0} - 87.0f);
    vf n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x / ln 2) */
    vf r = x - n * 0.693359375f + n * 2.12194440e-4f;              /* x - n ln 2, in two parts */
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    vi e = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n */
    return p * (vf)e;
}

#endif
