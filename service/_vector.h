/* What attnserve's C extensions share (service/_beam.c, service/_attention.c): functions built three times with GCC
   on x86-64 Linux, for AVX-512, AVX2 and baseline x86-64, one picked at load time (CLONES; see service/_beam.c), and
   float vectors of LANES lanes through GCC/Clang vector extensions. */
#ifndef ATTNSERVE_VECTOR_H
#define ATTNSERVE_VECTOR_H

#include <string.h>

#define LANES 8

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(LANES * sizeof(float))));

INLINE vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

#endif
