/* rlx-cpu native kernels: float32 elementwise regions run by a small block interpreter.
 *
 * Built when rlx-cpu's wheel is built (rlx_cpu/_build.py, run by hatch_build.py; after an
 * edit in a checkout: python -m rlx_cpu._build), loaded with ctypes (rlx_cpu/native.py).
 * A fused elementwise region is a program of instructions over values: the region's
 * inputs and block-sized registers. The output is walked in blocks of RLX_BLOCK elements;
 * in each block every instruction runs as one tight loop over the block (registers stay in
 * L1), so a region reads its inputs once and writes its output once whatever its length,
 * and every loop is vectorized by the compiler (AVX-512 / AVX2 / SSE2 clones picked when
 * the library loads, on x86-64).
 *
 * The math functions below are float32, branch-free (so that they vectorize), and keep
 * IEEE's edges: NaN in gives NaN out, exp overflows to inf and underflows to 0, log(0) is
 * -inf, log(x < 0) NaN, tanh and erf saturate to exactly +-1 and keep the sign of zero.
 * Accuracy against float64 (tests/test_native.py, dense sweeps): exp and log within 1 ulp,
 * tanh 1.4, sigmoid 2.5 (e^-x's error, then 1 + e and the division), erf 4.
 */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_setaffinity and cpu_set_t (rlx_bind_team) */
#endif
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__linux__)
#include <sched.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(RLX_NO_CLONES)
#define RLX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define RLX_CLONES
#endif
#if defined(_WIN32)
#define RLX_API __declspec(dllexport)
#else
#define RLX_API __attribute__((visibility("default")))
#endif

#define RLX_ABI 33
#define RLX_BLOCK 1024
/* 16 floats: one AVX-512 register (two AVX2 ones) in the kernels that keep sums in vectors */
typedef float rlx_v16 __attribute__((vector_size(64)));
/* their lanes as integers (masks, bit operations, shuffle indices) */
typedef int32_t rlx_i16 __attribute__((vector_size(64)));
/* 8 floats: one AVX2 register (two NEON ones). The tiles written for AVX-512's 32
 * registers of 16 keep 24 rlx_v16 sums: 48 AVX2 registers of 16, so off AVX-512 those
 * kernels run their sums through the stack (rlx_gemm at 2.5 GF/s on a Zen 3). There they
 * run as sub-tiles of 6 x 16 in rlx_v8 (12 sums, 2 columns, 1 broadcast: 15 of AVX2's 16
 * registers), over the same packed panels. */
typedef float rlx_v8 __attribute__((vector_size(32)));
typedef int32_t rlx_i8 __attribute__((vector_size(32)));
#define RLX_SUB_MR 6
#define RLX_SUB_NR 16
#define RLX_MAX_DIMS 8
#define RLX_CHUNK_BLOCKS 16 /* blocks per unit of work a thread takes at a time */

enum {
    OP_COPY = 0, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_POW, OP_MAX, OP_MIN, OP_NEG, OP_ABS,
    OP_EXP, OP_LOG, OP_SQRT, OP_RSQRT, OP_ERF, OP_TANH, OP_SIGMOID, OP_RELU, OP_GELU,
    OP_GELU_TANH, OP_EQ, OP_LT, OP_GT, OP_WHERE, OP_NONZERO, OP_SILU, OP_HARDSIGMOID, OP_HARDSWISH, OP_POWS, OP_COUNT
};

enum { IN_FULL = 0, IN_SCALAR = 1, IN_STRIDED = 2 };
/* An input's kind with this bit set holds bools (one byte each, 0 or 1), read as 0/1 floats:
 * a mask the region chooses by, with no float copy of it made first. */
#define IN_BYTES 8
#define IN_KIND(k) ((k) & 7)
/* An input's kind with this bit set (IN_FULL only) holds bf16 (two bytes each): a value
 * a build under precision="bf16" holds in that format between the steps that write and
 * read it (rlx_cpu/held.py). A region whose meta[0] is OUT_BF16 writes its output so:
 * each block computed in float32, then rounded to nearest even (as oneDNN's reorders
 * round), NaN kept NaN. */
#define IN_BF16 16
#define OUT_BF16 2

static RLX_CLONES void bf16_to_float(const uint16_t *src, float *dst, int64_t n) {
    for (int64_t t = 0; t < n; t++) {
        const uint32_t u = (uint32_t)src[t] << 16;
        memcpy(dst + t, &u, 4);
    }
}

/* f rounded to bf16, to nearest even; a NaN stays a (quiet) NaN. */
static inline __attribute__((always_inline)) uint16_t bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u) : rounded;
}

static RLX_CLONES void float_to_bf16(const float *src, uint16_t *dst, int64_t n) {
    for (int64_t t = 0; t < n; t++) dst[t] = bf16_round(src[t]);
}

RLX_API int64_t rlx_abi(void) { return RLX_ABI; }
RLX_API int64_t rlx_block(void) { return RLX_BLOCK; }
RLX_API int64_t rlx_op_count(void) { return OP_COUNT; }

/* Threads: OpenMP's (libgomp's, the runtime MKL's threads use too, so a region right
 * after a product finds the team awake). rlx_set_max_threads(1) keeps every call on the
 * caller's thread (a forked child of a process that ran a parallel region must not start
 * one: libgomp's team does not survive fork). */
static int64_t g_max_threads = 1 << 20;
RLX_API void rlx_set_max_threads(int64_t n) { g_max_threads = n < 1 ? 1 : n; }
/* Pins OpenMP's worker threads (thread 1 .. threads - 1 of a team; never the caller's
 * thread) each to one CPU of the caller's set other than the one the caller runs on now,
 * thread t to the t-th of those (mod their count), and returns how many were pinned (0
 * where there is nothing to do or no way to). Why: an unpinned worker woken by the caller
 * is often placed on the caller's own CPU (Linux wakes a thread near its waker) and stays
 * there until the load balancer moves it, so every parallel region ran as two threads
 * sharing one core: on a 2-vCPU VM, blocks of runs took exactly the one-thread time
 * (resnet18 17.5 ms against 9.0) while ORT kept its two-thread speed in the same process.
 * libgomp keeps its pool's threads, so the pinning outlasts this call. The caller is not
 * pinned (its affinity is the application's), so it may later land on a worker's CPU:
 * rlx_team_check moves the workers off it. */
#if defined(__linux__) && defined(_OPENMP)
static int g_team_threads = 0; /* the team rlx_bind_team pinned (0: none) */
static int g_caller_cpu = -1;  /* the caller's CPU when the workers were last pinned */
static cpu_set_t g_team_allowed; /* the caller's CPUs when the team was bound */
static int64_t pin_workers(int threads, int caller) {
    if (threads < 2) return 0;
    int cpus[CPU_SETSIZE], count = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &g_team_allowed) && c != caller) cpus[count++] = c;
    if (count < 1 || (count < 2 && caller < 0)) return 0;
    int64_t pinned = 0;
#pragma omp parallel num_threads(threads) reduction(+ : pinned)
    {
        const int t = omp_get_thread_num();
        if (t > 0) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(cpus[(t - 1) % count], &one);
            pinned += sched_setaffinity(0, sizeof one, &one) == 0;
        }
    }
    return pinned;
}
#endif

RLX_API int64_t rlx_bind_team(int64_t threads) {
#if defined(__linux__) && defined(_OPENMP)
    if (sched_getaffinity(0, sizeof g_team_allowed, &g_team_allowed) != 0) return 0;
    const int caller = sched_getcpu();
    const int64_t pinned = pin_workers((int)threads, caller);
    if (pinned > 0) g_team_threads = (int)threads, g_caller_cpu = caller;
    return pinned;
#else
    (void)threads;
    return 0;
#endif
}

/* Once per run of a plan: where the caller has moved to another CPU since the workers were
 * pinned, pin them again around it (1 when it did). Why: a caller that lands on a
 * worker's CPU shares that core with it for every region of the run; on the 2-core EPYC a
 * 192 -> 1152 1x1 convolution over 7x7 took 139 us so, 75-81 us with the caller on the
 * other CPU, and which one a process got was a coin toss that held for seconds. A call
 * that finds the caller where it was costs a sched_getcpu (the vDSO: tens of ns). */
RLX_API int64_t rlx_team_check(void) {
#if defined(__linux__) && defined(_OPENMP)
    if (g_team_threads < 2 || g_max_threads < 2) return 0; /* (a forked child has no team to start) */
    const int caller = sched_getcpu();
    if (caller < 0 || caller == g_caller_cpu) return 0;
    if (pin_workers(g_team_threads, caller) <= 0) return 0;
    g_caller_cpu = caller;
    return 1;
#else
    return 0;
#endif
}

RLX_API int64_t rlx_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* ------------------------------------------------------------------------ math */
static inline float as_f(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t as_i(float f) { int32_t i; memcpy(&i, &f, 4); return i; }
/* 2^e for e in [-126, 127], by its bits; other e (a NaN's garbage) give some float, never
 * a signed overflow in the shift. */
static inline float pow2i(int32_t e) { return as_f((int32_t)((uint32_t)(e + 127) << 23)); }

/* e^r for x = n ln2 + r (Cody-Waite: n rounded to nearest, by adding 1.5 2^23 so that
 * n lands in the low bits of the sum, which *ni_out takes as an integer: a NaN gives a
 * garbage integer rather than the undefined float-to-int conversion, and the NaN goes on
 * through r to the result), by a degree-7 polynomial (Cephes expf); x already clamped to a
 * finite range. */
static inline float rx_exp_reduced(float xc, int32_t *ni_out) {
    float t = xc * 1.44269504088896341f + 12582912.0f;
    float n = t - 12582912.0f;
    *ni_out = as_i(t) - 0x4B400000;
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return p * r * r + r + 1.0f;
}

/* exp: e^r times 2^n, applied in two halves so that results down to the subnormals and
 * up to overflow are reached without an integer overflow in the exponent field. A NaN
 * passes the clamps (its comparisons are false) and the arithmetic unchanged. */
static inline float rx_exp(float x) {
    float xc = x > 89.0f ? 89.0f : x;
    xc = xc < -104.0f ? -104.0f : xc;
    int32_t ni;
    float y = rx_exp_reduced(xc, &ni);
    int32_t n1 = ni >> 1, n2 = ni - n1; /* a shift, not / 2's sign fix: exp 10% faster */
    return y * pow2i(n1) * pow2i(n2);
}

/* log: x = m 2^e with m in [sqrt(1/2), sqrt(2)), log(m) by Cephes logf's polynomial. */
static inline float rx_log(float x) {
    int sub = x < 1.17549435e-38f;
    float xs = sub ? x * 8388608.0f : x;
    int32_t b = as_i(xs);
    int32_t e = ((b >> 23) & 0xff) - 127 - (sub ? 23 : 0);
    float m = as_f((b & 0x7fffff) | 0x3f800000);
    int big = m > 1.41421356f;
    m = big ? m * 0.5f : m;
    e = big ? e + 1 : e;
    float f = m - 1.0f, z = f * f, fe = (float)e;
    float y = 7.0376836292e-2f;
    y = y * f - 1.1514610310e-1f;
    y = y * f + 1.1676998740e-1f;
    y = y * f - 1.2420140846e-1f;
    y = y * f + 1.4249322787e-1f;
    y = y * f - 1.6668057665e-1f;
    y = y * f + 2.0000714765e-1f;
    y = y * f - 2.4999993993e-1f;
    y = y * f + 3.3333331174e-1f;
    y = y * f * z;
    y += -2.12194440e-4f * fe;
    y += -0.5f * z;
    float res = f + y;
    res += 0.693359375f * fe;
    res = x == 0.0f ? -INFINITY : res;
    res = x < 0.0f ? NAN : res;
    res = x == INFINITY ? x : res;
    return x == x ? res : x;
}

/* tanh: an odd polynomial below |x| = 0.625 (Cephes tanhf), 1 - 2 / (e^2|x| + 1) above. */
static inline float rx_tanh(float x) {
    float a = x < 0.0f ? -x : x;
    float z = x * x;
    float s = -5.70498872745e-3f;
    s = s * z + 2.06390887954e-2f;
    s = s * z - 5.37397155531e-2f;
    s = s * z + 1.33314422036e-1f;
    s = s * z - 3.33332819422e-1f;
    s = s * z * x + x;
    float l = 1.0f - 2.0f / (rx_exp(2.0f * a) + 1.0f);
    return copysignf(a < 0.625f ? s : l, x); /* tanh(-0) = -0: s's last add made it +0 */
}

/* max and min that return NaN when either operand is NaN (numpy's maximum and minimum),
 * written as two selects so that they vectorize and never branch. */
static inline float rx_max(float a, float b) {
    float r = a > b ? a : b;
    return a != a ? a : r;
}
/* The max of three with rx_max's result (ties to the later operand, NaN when any is NaN),
 * as two plain maxima and one NaN test for all three: nesting rx_max twice compiled to
 * eight compares and blends a vector, this to five (2.5x faster: the max pools' rows and
 * taps). A NaN result comes from the sum. */
static inline float rx_max3(float a, float b, float c) {
    float m = a > b ? a : b;
    m = m > c ? m : c;
    return (a != a) | (b != b) | (c != c) ? a + b + c : m;
}
/* clamp(t, 0, 1) with NaN through, as two plain min/max instructions: x86's min and max
 * return their second operand when either is NaN, which `c < t ? c : t` compiles to, so a
 * NaN t comes out as itself (nested rx_min/rx_max compiled to a dozen compares, blends and
 * mask ops a vector: the hard-swish stem epilogue took longer than its convolution). Same
 * values as rx_max(rx_min(t, 1), 0) (a zero's sign aside). */
static inline float rx_clamp01(float t) {
    t = 1.0f < t ? 1.0f : t;
    return 0.0f > t ? 0.0f : t;
}
static inline float rx_min(float a, float b) {
    float r = a < b ? a : b;
    return a != a ? a : r;
}

/* sigmoid = 1 / (1 + e^-x), with -x clamped to [-87.3, 89]: below, e^-x < 2^-126 leaves
 * 1 + e^-x = 1 anyway; above, e^-x overflows to inf and the result is 0 (the true value
 * there is below 2^-126 and reaches 0 at -104). Up to 88.72 e^-x is finite and the
 * division rounds the subnormal results correctly. One scaling (2^(n-1) times 2: n is at
 * most 129), no selects beyond the clamps: a NaN goes through the arithmetic. 1.55x
 * faster than e^-|x| with a select of the numerator (the form before), on the 2-core Zen 5. */
static inline float rx_sigmoid(float x) {
    float a = -x < -87.3f ? -87.3f : -x;
    a = a > 89.0f ? 89.0f : a;
    int32_t ni;
    float e = rx_exp_reduced(a, &ni) * pow2i(ni - 1) * 2.0f;
    return 1.0f / (1.0f + e);
}

/* erf(x) = tanh(x P(x^2)) and gelu(x) = x / (1 + exp(x R(x^2))): the polynomials of
 * rlx_cpu/mathfn.py (which documents the fit), so both paths compute the same function. */
static inline float rx_erf(float x) {
    float u = x * x;
    float p = 1.478960868783511e-07f;
    p = p * u + -5.759449765919744e-06f;
    p = p * u + 8.809502806981163e-05f;
    p = p * u + -0.0006207040958476631f;
    p = p * u + -0.00019115759860315734f;
    p = p * u + 0.10276895704253466f;
    p = p * u + 1.1283792602695377f;
    return rx_tanh(x * p);
}

static inline float rx_gelu(float x) {
    /* r_k = -sqrt(2) p_k / 2^k */
    float u = x * x;
    float r = -3.2680726857074013e-09f;
    r = r * u + 2.5453412408657034e-07f;
    r = r * u + -7.786573967122882e-06f;
    r = r * u + 0.00010972601882103684f;
    r = r * u + 6.758441712381434e-05f;
    r = r * u + -0.07266862642024527f;
    r = r * u + -1.595769253373701f;
    return x / (1.0f + rx_exp(x * r));
}

static inline float rx_gelu_tanh(float x) {
    float t = x * x;
    t = t * 0.044715f;
    t = t + 1.0f;
    t = t * x;
    t = t * 0.7978845608028654f;
    t = rx_tanh(t);
    t = t + 1.0f;
    t = t * x;
    return t * 0.5f;
}

/* ------------------------------------------------------------- the interpreter */
/* An optional table of vector-math functions by opcode, with oneMKL's signature
 * (vmsExp, vmsLn, vmsTanh, vmsErf: n, a, r, mode): where the caller passes one, a unary
 * op that has an entry runs through it (2.5-5x faster than rx_* here, about 1 ulp). */
typedef void (*rlx_vml_fn)(int, const float *, float *, long long);
typedef struct {
    rlx_vml_fn fn[OP_COUNT];
    long long mode;
} rlx_vml;
RLX_API int64_t rlx_vml_size(void) { return (int64_t)sizeof(rlx_vml); }

/* d[i] = f(a[i], b[i], c[i]) for one instruction over n elements. Every case is a loop of
 * its own, so that each vectorizes; d may be a, b or c (same index, read before write). */
static RLX_CLONES void run_op(int64_t op, float *d, const float *a, const float *b, const float *c, int64_t n,
                              const rlx_vml *vml) {
    int64_t i;
    if (vml && vml->fn[op]) {
        vml->fn[op]((int)n, a, d, vml->mode);
        return;
    }
    switch (op) {
    case OP_COPY: for (i = 0; i < n; i++) d[i] = a[i]; break;
    case OP_ADD: for (i = 0; i < n; i++) d[i] = a[i] + b[i]; break;
    case OP_SUB: for (i = 0; i < n; i++) d[i] = a[i] - b[i]; break;
    case OP_MUL: for (i = 0; i < n; i++) d[i] = a[i] * b[i]; break;
    case OP_DIV: for (i = 0; i < n; i++) d[i] = a[i] / b[i]; break;
    case OP_POW: for (i = 0; i < n; i++) d[i] = powf(a[i], b[i]); break;
    case OP_MAX: for (i = 0; i < n; i++) d[i] = rx_max(a[i], b[i]); break;
    case OP_MIN: for (i = 0; i < n; i++) d[i] = rx_min(a[i], b[i]); break;
    case OP_NEG: for (i = 0; i < n; i++) d[i] = -a[i]; break;
    case OP_ABS: for (i = 0; i < n; i++) d[i] = fabsf(a[i]); break;
    case OP_EXP: for (i = 0; i < n; i++) d[i] = rx_exp(a[i]); break;
    case OP_LOG: for (i = 0; i < n; i++) d[i] = rx_log(a[i]); break;
    case OP_SQRT: for (i = 0; i < n; i++) d[i] = sqrtf(a[i]); break;
    case OP_RSQRT: for (i = 0; i < n; i++) d[i] = 1.0f / sqrtf(a[i]); break;
    case OP_ERF: for (i = 0; i < n; i++) d[i] = rx_erf(a[i]); break;
    case OP_TANH: for (i = 0; i < n; i++) d[i] = rx_tanh(a[i]); break;
    case OP_SIGMOID: for (i = 0; i < n; i++) d[i] = rx_sigmoid(a[i]); break;
    case OP_RELU: for (i = 0; i < n; i++) d[i] = 0.0f > a[i] ? 0.0f : a[i]; break; /* one max: x86 returns a NaN a */
    case OP_GELU: for (i = 0; i < n; i++) d[i] = rx_gelu(a[i]); break;
    case OP_GELU_TANH: for (i = 0; i < n; i++) d[i] = rx_gelu_tanh(a[i]); break;
    case OP_EQ: for (i = 0; i < n; i++) d[i] = a[i] == b[i] ? 1.0f : 0.0f; break;
    case OP_LT: for (i = 0; i < n; i++) d[i] = a[i] < b[i] ? 1.0f : 0.0f; break;
    case OP_GT: for (i = 0; i < n; i++) d[i] = a[i] > b[i] ? 1.0f : 0.0f; break;
    case OP_WHERE: for (i = 0; i < n; i++) d[i] = a[i] != 0.0f ? b[i] : c[i]; break;
    case OP_NONZERO: for (i = 0; i < n; i++) d[i] = a[i] != 0.0f ? 1.0f : 0.0f; break;
    /* chains in one pass (rlx_cpu/peephole.py): b and c are scalars (b[0], c[0]) */
    case OP_SILU: for (i = 0; i < n; i++) d[i] = a[i] * rx_sigmoid(a[i]); break;
    case OP_HARDSIGMOID: {
        const float al = b[0], be = c[0];
        for (i = 0; i < n; i++) d[i] = rx_clamp01(a[i] * al + be);
        break;
    }
    case OP_HARDSWISH: {
        const float al = b[0], be = c[0];
        for (i = 0; i < n; i++) d[i] = a[i] * rx_clamp01(a[i] * al + be);
        break;
    }
    case OP_POWS: { /* a ** b[0], the exponent one scalar read now (a param may change it) */
        const float e = b[0];
        if (e == 2.0f)
            for (i = 0; i < n; i++) d[i] = a[i] * a[i];
        else if (e == 3.0f)
            for (i = 0; i < n; i++) d[i] = a[i] * a[i] * a[i];
        else
            for (i = 0; i < n; i++) d[i] = powf(a[i], e);
        break;
    }
    default: break;
    }
}

/* Copy elements [start, start + n) of the output's row-major order, as seen through an
 * operand with these element strides (0 along broadcast axes), into buf: gather over
 * floats, gather_bytes over bools (one byte each, read as 0/1 floats). */
#define RLX_GATHER(NAME, T, LOAD)                                                                            \
    static void NAME(const T *src, int64_t ndim, const int64_t *shape, const int64_t *strides, int64_t start, \
                     int64_t n, float *buf) {                                                                 \
        int64_t idx[RLX_MAX_DIMS];                                                                            \
        int64_t rest = start, k, off = 0;                                                                     \
        for (k = ndim - 1; k >= 0; k--) {                                                                     \
            idx[k] = rest % shape[k];                                                                         \
            rest /= shape[k];                                                                                 \
        }                                                                                                     \
        for (k = 0; k < ndim - 1; k++) off += idx[k] * strides[k];                                            \
        int64_t inner = shape[ndim - 1], step = strides[ndim - 1], done = 0;                                  \
        while (done < n) {                                                                                    \
            int64_t j = idx[ndim - 1], cnt = inner - j;                                                       \
            if (cnt > n - done) cnt = n - done;                                                               \
            const T *row = src + off + j * step;                                                              \
            if (step == 1 && sizeof(T) == sizeof(float)) {                                                    \
                memcpy(buf + done, row, (size_t)cnt * sizeof(float));                                         \
            } else if (step == 0) { /* broadcast along the rows (a per-channel scale): a fill */              \
                const float v = LOAD(row[0]);                                                                 \
                float *restrict dst = buf + done;                                                             \
                for (int64_t t = 0; t < cnt; t++) dst[t] = v;                                                 \
            } else {                                                                                          \
                for (int64_t t = 0; t < cnt; t++) buf[done + t] = LOAD(row[t * step]);                        \
            }                                                                                                 \
            done += cnt;                                                                                      \
            idx[ndim - 1] = 0;                                                                                \
            for (k = ndim - 2; k >= 0; k--) { /* carry into the outer axes */                                 \
                off += strides[k];                                                                            \
                if (++idx[k] < shape[k]) break;                                                               \
                off -= idx[k] * strides[k];                                                                   \
                idx[k] = 0;                                                                                   \
            }                                                                                                 \
        }                                                                                                     \
    }
#define RLX_LOAD_FLOAT(x) (x)
#define RLX_LOAD_BOOL(x) ((x) ? 1.0f : 0.0f)
RLX_GATHER(gather, float, RLX_LOAD_FLOAT)
RLX_GATHER(gather_bytes, uint8_t, RLX_LOAD_BOOL)


static int region_range(const int64_t *meta, void *const *ptrs, const rlx_vml *vml, int64_t start, int64_t stop);

/* meta (int64): abi, n_in, n_instr, n_regs, ndim, size, shape[ndim],
 *   then per input: kind, strides[ndim]; then per instruction: op, dst, a, b, c.
 * Values: 0..n_in-1 are the inputs, n_in + r is register r; dst -1 is the output.
 * ptrs: output, then the inputs; vml: NULL or the vector-math table. Computes output
 * elements [start, stop) on up to `threads` threads, taking chunks of blocks as they come free.
 * Returns 0, or -1 when memory for the registers cannot be had. */
RLX_API int rlx_region(const int64_t *meta, void *const *ptrs, const rlx_vml *vml, int64_t start, int64_t stop,
                       int64_t threads) {
    int64_t blocks = (stop - start + RLX_BLOCK - 1) / RLX_BLOCK;
    if (threads > g_max_threads) threads = g_max_threads;
    if (threads > blocks) threads = blocks;
#ifdef _OPENMP
    if (threads > 1) {
        int status = 0;
        /* chunks of blocks handed out as threads come free: on a host where another
         * process's threads hold a core, the other core takes the larger share */
        int64_t chunk = RLX_CHUNK_BLOCKS * RLX_BLOCK, chunks = (stop - start + chunk - 1) / chunk;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1) reduction(| : status)
        for (int64_t c = 0; c < chunks; c++) {
            int64_t s0 = start + c * chunk, s1 = s0 + chunk < stop ? s0 + chunk : stop;
            status |= region_range(meta, ptrs, vml, s0, s1);
        }
        return status;
    }
#endif
    return region_range(meta, ptrs, vml, start, stop);
}

/* The values a region reads: inputs, then registers. A scalar input is a block filled with
 * its value (in work, after the registers); a strided one gets its block there per run. */
#define RLX_REGION_VALUES (64 + 256)
static int64_t region_work_floats(const int64_t *meta) {
    return (meta[3] + meta[1] + (meta[0] == OUT_BF16)) * RLX_BLOCK; /* (a bf16 output's float32 block last) */
}

static void region_bind(const int64_t *meta, void *const *ptrs, float *work, const float **vals) {
    const int64_t n_in = meta[1], n_regs = meta[3], ndim = meta[4];
    const int64_t *in_meta = meta + 6 + ndim;
    const float *const *in = (const float *const *)(ptrs + 1);
    float *inbuf = work + n_regs * RLX_BLOCK;
    for (int64_t i = 0; i < n_in; i++) {
        const int64_t kind = in_meta[i * (1 + ndim)];
        if (IN_KIND(kind) == IN_SCALAR) {
            const float v = kind & IN_BYTES ? (((const uint8_t *)ptrs[1 + i])[0] ? 1.0f : 0.0f) : in[i][0];
            float *buf = inbuf + i * RLX_BLOCK;
            for (int64_t t = 0; t < RLX_BLOCK; t++) buf[t] = v;
            vals[i] = buf;
        }
    }
    for (int64_t r = 0; r < n_regs; r++) vals[n_in + r] = work + r * RLX_BLOCK;
}

/* Output elements [start, stop), block by block, with work and vals from region_bind. */
static void region_blocks(const int64_t *meta, void *const *ptrs, const rlx_vml *vml, float *work,
                          const float **vals, int64_t start, int64_t stop) {
    const int64_t n_in = meta[1], n_instr = meta[2], n_regs = meta[3], ndim = meta[4];
    const int64_t *shape = meta + 6;
    const int64_t *in_meta = shape + ndim;
    const int64_t *code = in_meta + n_in * (1 + ndim);
    const int out_bf16 = meta[0] == OUT_BF16;
    float *out = out_bf16 ? work + (n_regs + n_in) * RLX_BLOCK : (float *)ptrs[0];
    const float *const *in = (const float *const *)(ptrs + 1);
    float *regs = work, *inbuf = work + n_regs * RLX_BLOCK;
    for (int64_t s = start, n; s < stop; s += n) {
        /* blocks end on multiples of 16 elements: an epilogue's span may start anywhere (a
         * 14 x 14 plane is 196 floats), and vector stores across cache lines ran its
         * sigmoid at half speed */
        n = RLX_BLOCK - (s & 15);
        n = stop - s < n ? stop - s : n;
        for (int64_t i = 0; i < n_in; i++) {
            const int64_t *im = in_meta + i * (1 + ndim);
            if (im[0] == IN_FULL) vals[i] = in[i] + s;
            else if (im[0] == IN_STRIDED) {
                gather(in[i], ndim, shape, im + 1, s, n, inbuf + i * RLX_BLOCK);
                vals[i] = inbuf + i * RLX_BLOCK;
            } else if (im[0] == (IN_FULL | IN_BYTES)) {
                const uint8_t *src = (const uint8_t *)ptrs[1 + i] + s;
                float *buf = inbuf + i * RLX_BLOCK;
                for (int64_t t = 0; t < n; t++) buf[t] = src[t] ? 1.0f : 0.0f;
                vals[i] = buf;
            } else if (im[0] == (IN_STRIDED | IN_BYTES)) {
                gather_bytes((const uint8_t *)ptrs[1 + i], ndim, shape, im + 1, s, n, inbuf + i * RLX_BLOCK);
                vals[i] = inbuf + i * RLX_BLOCK;
            } else if (im[0] == (IN_FULL | IN_BF16)) {
                bf16_to_float((const uint16_t *)ptrs[1 + i] + s, inbuf + i * RLX_BLOCK, n);
                vals[i] = inbuf + i * RLX_BLOCK;
            }
        }
        for (int64_t k = 0; k < n_instr; k++) {
            const int64_t *ins = code + 5 * k;
            float *d = ins[1] < 0 ? (out_bf16 ? out : out + s) : regs + ins[1] * RLX_BLOCK;
            const float *a = ins[2] >= 0 ? vals[ins[2]] : NULL;
            const float *b = ins[3] >= 0 ? vals[ins[3]] : NULL;
            const float *c = ins[4] >= 0 ? vals[ins[4]] : NULL;
            run_op(ins[0], d, a, b, c, n, vml);
        }
        if (out_bf16) float_to_bf16(out, (uint16_t *)ptrs[0] + s, n);
    }
}

static int region_range(const int64_t *meta, void *const *ptrs, const rlx_vml *vml, int64_t start, int64_t stop) {
    if (meta[1] + meta[3] > RLX_REGION_VALUES) return -1;
    size_t bytes = (size_t)region_work_floats(meta) * sizeof(float);
    float *work = bytes ? (float *)malloc(bytes) : NULL;
    if (bytes && !work) return -1;
    const float *vals[RLX_REGION_VALUES];
    region_bind(meta, ptrs, work, vals);
    region_blocks(meta, ptrs, vml, work, vals, start, stop);
    free(work);
    return 0;
}

/* ------------------------------------------------------------------ epilogues
 * An elementwise program a kernel applies to its own output part by part, as each part is
 * finished and still in cache: a region (rlx_region's meta, ptrs and vml) whose output is
 * the kernel's output and whose input 0 is that output too (ptrs[0] == ptrs[1]: each
 * element is read before it is written), other inputs anything a region takes (a residual,
 * scalars). A part is a run of consecutive elements; its flat position is its distance
 * from ptrs[0]. work holds `per` floats (region_work_floats) for each of the kernel's
 * threads. The caller plans it (regions.py) with at most RLX_REGION_VALUES values. */
typedef struct {
    const int64_t *meta;
    void *const *ptrs;
    const rlx_vml *vml;
    float *work;
    int64_t per;
    /* Nonzero when the whole program is y = min(max(x, lo), hi) (a ReLU, ReLU6, Clip): a
     * kernel that stores its sums in registers may clamp them there and skip the program
     * (rlx's GEMM does); any other kernel runs the program as usual. */
    int64_t clamp;
    float lo, hi;
} rlx_epilogue;

/* A thread's epilogue state. Spans that follow one another in memory are gathered into one
 * pending run (up to RLX_EPI_RUN floats, still in L2) and applied together: a 7 x 7 plane
 * is 49 floats, and a call of the interpreter per plane cost more than the work (a
 * 5-instruction hard-swish over 576 such planes took longer in-kernel than as a region of
 * its own). */
#define RLX_EPI_RUN (16 * RLX_BLOCK)
#define RLX_CONV_GEMM_CHUNK (64 * 1024) /* output floats an implicit GEMM's thread revisits per k block (256 KB) */
typedef struct {
    const rlx_epilogue *e;
    float *work;
    int64_t at, len; /* the pending run, in flat positions */
    const float *vals[RLX_REGION_VALUES];
} epi_state;

static inline int64_t rlx_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* The bounds of an epilogue that is one clamp (ReLU, ReLU6, Clip), which a kernel applies in
 * its registers as it stores; NULL for none or any other epilogue. */
static inline const float *epi_clamp(const rlx_epilogue *e) { return e && e->clamp ? &e->lo : NULL; }

/* Ready thread t's state for e (NULL: no epilogue, every span a no-op). */
static void epi_begin(epi_state *st, const rlx_epilogue *e, int64_t t) {
    st->e = e;
    st->at = st->len = 0;
    if (!e) return;
    st->work = e->work + t * e->per;
    region_bind(e->meta, e->ptrs, st->work, st->vals);
}

/* Apply the pending run. Every part function ends with this. */
static void epi_flush(epi_state *st) {
    if (!st->e || st->len <= 0) return;
    region_blocks(st->e->meta, st->e->ptrs, st->e->vml, st->work, st->vals, st->at, st->at + st->len);
    st->len = 0;
}

/* The epilogue over the len elements from p (part of the kernel's output, final): now, or
 * with the spans after it when they follow on in memory. */
static void epi_span(epi_state *st, const float *p, int64_t len) {
    if (!st->e || len <= 0) return;
    int64_t at = p - (const float *)st->e->ptrs[0];
    if (st->len > 0 && st->at + st->len == at && st->len + len <= RLX_EPI_RUN) {
        st->len += len;
        return;
    }
    epi_flush(st);
    st->at = at, st->len = len;
    if (len >= RLX_EPI_RUN) epi_flush(st);
}

/* How many channel panels a part function takes at a time, of `panels` whose tiles
 * hold `tile` floats, `tiles` of them across the part's columns, `span` columns each:
 * all of them, unless it has an epilogue and a chunk (RLX_CONV_GEMM_CHUNK floats) over
 * all the panels would leave short spans (under RLX_EPI_SHORT floats a channel): then as
 * many as keep all the tiles in one chunk, so that each group ends with whole channels'
 * outputs, one contiguous run. Small planes with many channels made chunks of a few
 * tiles (14 x 14 into 672 channels: spans of 96 floats, three a channel, runs of the
 * interpreter that do not follow on in memory; efficientnet's SiLU expansions took 1.7x
 * their time without it). */
#define RLX_EPI_SHORT 256
static int64_t epi_panel_group(const rlx_epilogue *e, int64_t panels, int64_t tile, int64_t tiles, int64_t span) {
    if (!e || RLX_CONV_GEMM_CHUNK / (panels * tile) * span >= RLX_EPI_SHORT) return panels;
    int64_t group = RLX_CONV_GEMM_CHUNK / (tile * tiles);
    return group < 1 ? 1 : group > panels ? panels : group;
}

/* ------------------------------------------------------------ row kernels */
/* Both take rows of `len` contiguous floats (rows `stride` apart for x and y) and split
 * the rows over up to `threads` threads. Reductions are `omp simd` loops (-fopenmp-simd:
 * the compiler may keep partial results in vector lanes, which plain C forbids it); the
 * max tracks NaN apart, since a vector max drops it. */
#define RLX_SHORT_ROW 16

static inline float row_max(const float *x, int64_t len) {
    float m = -INFINITY;
    int nan = 0;
#pragma omp simd reduction(max : m) reduction(| : nan)
    for (int64_t i = 0; i < len; i++) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    return nan ? NAN : m;
}

static inline float row_min(const float *x, int64_t len) {
    float m = INFINITY;
    int nan = 0;
#pragma omp simd reduction(min : m) reduction(| : nan)
    for (int64_t i = 0; i < len; i++) {
        m = x[i] < m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    return nan ? NAN : m;
}

/* sum of x[i] - shift */
static inline float row_sum(const float *x, int64_t len, float shift) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; i++) s += x[i] - shift;
    return s;
}

static inline float row_sq_dev(const float *x, int64_t len, float mean) {
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < len; i++) {
        float d = x[i] - mean;
        s += d * d;
    }
    return s;
}

/* exp over n contiguous floats, in place: one flat loop the compiler vectorizes. */
static inline void exp_inplace(float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = rx_exp(y[i]);
}

/* rlx_softmax's flags */
#define RLX_SOFTMAX_NAN_ZERO 1 /* a row whose softmax is NaN is written as zeros */
#define RLX_SOFTMAX_BF16 2     /* y is bf16 (uint16), x the float32 work space */
/* rows at least this long are done one at a time, exp and sum in one pass */
#define RLX_LONG_ROW 256

/* A row's end: scale the exps in w by 1 / total into y's row r (float32 in place, or
 * rounded to bf16), or zeros where the total is NaN and nan_zero says so. */
static inline void softmax_finish(float *w, void *y, int64_t r, int64_t len, int64_t stride, float total,
                                  int nan_zero, int to_bf16) {
    if (nan_zero && total != total) {
        if (to_bf16)
            memset((uint16_t *)y + r * stride, 0, (size_t)len * sizeof(uint16_t));
        else
            memset(w, 0, (size_t)len * sizeof(float));
        return;
    }
    const float inv = 1.0f / total;
    if (to_bf16) {
        uint16_t *yr = (uint16_t *)y + r * stride;
        for (int64_t i = 0; i < len; i++) yr[i] = bf16_round(w[i] * inv);
    } else {
        for (int64_t i = 0; i < len; i++) w[i] = w[i] * inv;
    }
}

/* y = softmax(x * scale) along each row. A row of at least RLX_LONG_ROW: its max (of x *
 * scale), then exp(x * scale - max) written and summed in one pass, then the scaling:
 * three passes over the row, not five (one thread, rows in cache, 2-core Zen 5: rows of
 * 1500 in 0.94x the grouped passes' time, of 3136 in 0.84x). Shorter rows are taken in groups of about 4096 elements: per row the
 * max, then y = x * scale - max; exp over the whole group in one flat loop (short rows
 * get full vectors too: a 10-wide row alone would run exp one element at a time); then
 * per row the sum and the scaling. A NaN anywhere in a row (or a row all -inf, or one
 * holding +inf) makes its sum NaN and the whole row NaN; with RLX_SOFTMAX_NAN_ZERO such a
 * row is written as zeros instead (attention's nan_to_zero: torch's where(isnan(p), 0, p)
 * after the softmax), at the cost of one test per row. With RLX_SOFTMAX_BF16 the result
 * is written rounded to bf16 (y uint16, same stride) and x, the caller's own scores,
 * holds the exps meanwhile: the rounding bf16 attention needs for its second product
 * comes with the scaling pass, not as a pass of its own. */
static RLX_CLONES void softmax_rows(float *x, void *y, int64_t r0, int64_t r1, int64_t len, int64_t stride,
                                   float scale, int64_t flags) {
    const int nan_zero = (flags & RLX_SOFTMAX_NAN_ZERO) != 0, to_bf16 = (flags & RLX_SOFTMAX_BF16) != 0;
    float *work = to_bf16 ? x : (float *)y;
    if (len >= RLX_LONG_ROW) {
        for (int64_t r = r0; r < r1; r++) {
            const float *xr = x + r * stride;
            float *wr = work + r * stride;
            const float ms = (scale >= 0.0f ? row_max(xr, len) : row_min(xr, len)) * scale;
            float total = 0.0f;
#pragma omp simd reduction(+ : total)
            for (int64_t i = 0; i < len; i++) {
                const float e = rx_exp(xr[i] * scale - ms);
                wr[i] = e;
                total += e;
            }
            softmax_finish(wr, y, r, len, stride, total, nan_zero, to_bf16);
        }
        return;
    }
    int64_t group = 4096 / len;
    for (int64_t g0 = r0; g0 < r1; g0 += group) {
        int64_t g1 = g0 + group < r1 ? g0 + group : r1;
        for (int64_t r = g0; r < g1; r++) {
            const float *xr = x + r * stride;
            float *yr = work + r * stride;
            /* the largest of x * scale: the largest x, or the smallest when scale < 0 */
            float ms;
            if (len < RLX_SHORT_ROW) { /* a plain loop: a vector reduction's set-up costs more */
                ms = xr[0];
                for (int64_t i = 1; i < len; i++) ms = scale >= 0.0f ? rx_max(ms, xr[i]) : rx_min(ms, xr[i]);
                ms *= scale;
            } else {
                ms = (scale >= 0.0f ? row_max(xr, len) : row_min(xr, len)) * scale;
            }
            for (int64_t i = 0; i < len; i++) yr[i] = xr[i] * scale - ms;
        }
        if (stride == len) {
            exp_inplace(work + g0 * stride, (g1 - g0) * len);
        } else {
            for (int64_t r = g0; r < g1; r++) exp_inplace(work + r * stride, len);
        }
        for (int64_t r = g0; r < g1; r++) {
            float *yr = work + r * stride, total = 0.0f;
            if (len < RLX_SHORT_ROW)
                for (int64_t i = 0; i < len; i++) total += yr[i];
            else
                total = row_sum(yr, len, 0.0f);
            softmax_finish(yr, y, r, len, stride, total, nan_zero, to_bf16);
        }
    }
}

/* y = (x - mean) / sqrt(var + eps) * scale + bias along each row (scale and bias have
 * `len` elements; bias may be NULL). The variance is the mean of squared deviations. */
static RLX_CLONES void layer_norm_rows(const float *x, const float *scale, const float *bias, float *y, int64_t r0,
                                       int64_t r1, int64_t len, int64_t stride, float eps) {
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = x + r * stride;
        float *yr = y + r * stride;
        /* the mean of x - x[0], plus x[0]: rows far from 0 relative to their spread keep
         * their precision (a plain float32 sum of 1000 + small loses it) */
        float shift = xr[0];
        float mean = shift + row_sum(xr, len, shift) / (float)len;
        float rstd = 1.0f / sqrtf(row_sq_dev(xr, len, mean) / (float)len + eps);
        int64_t i;
        if (bias)
            for (i = 0; i < len; i++) yr[i] = (xr[i] - mean) * rstd * scale[i] + bias[i];
        else
            for (i = 0; i < len; i++) yr[i] = (xr[i] - mean) * rstd * scale[i];
    }
}

/* rows per unit of work a thread takes at a time: about RLX_CHUNK_BLOCKS blocks of elements */
static int64_t row_chunk(int64_t len) {
    int64_t per = RLX_CHUNK_BLOCKS * RLX_BLOCK / (len > 0 ? len : 1);
    return per > 0 ? per : 1;
}

static int64_t row_threads(int64_t threads, int64_t rows) {
    if (threads > g_max_threads) threads = g_max_threads;
    if (threads > rows) threads = rows;
    return threads < 1 ? 1 : threads;
}

/* CALL (a statement using t, lo and hi) for each of up to `threads` threads (row_threads'
 * cap), thread t taking [lo, hi) of [0, total) in even parts; on one thread, t = 0 and the
 * whole range. The kernel call is written once, whatever the team. */
#ifdef _OPENMP
#define RLX_ACROSS_TEAM(threads, total, CALL)                                                                      \
    do {                                                                                                           \
        const int64_t total_ = (total), team_ = row_threads((threads), total_);                                   \
        if (team_ > 1) {                                                                                           \
            _Pragma("omp parallel num_threads((int)team_)") {                                                      \
                const int64_t t = omp_get_thread_num(), nt_ = omp_get_num_threads();                               \
                const int64_t lo = total_ * t / nt_, hi = total_ * (t + 1) / nt_;                                  \
                (void)t;                                                                                           \
                CALL;                                                                                              \
            }                                                                                                      \
        } else {                                                                                                   \
            const int64_t t = 0, lo = 0, hi = total_;                                                              \
            (void)t;                                                                                               \
            CALL;                                                                                                  \
        }                                                                                                          \
    } while (0)
#else
#define RLX_ACROSS_TEAM(threads, total, CALL)                                                                      \
    do {                                                                                                           \
        const int64_t t = 0, lo = 0, hi = (total);                                                                 \
        (void)(threads), (void)t;                                                                                  \
        CALL;                                                                                                      \
    } while (0)
#endif

/* CALL once for each of `images` images i (its values at i times the caller's stride): with
 * `threads` > 1 and at least as many images, each thread of one parallel region runs the
 * images i = t, t + threads, ... of the whole rounds alone (CALL sees `t`, the thread, and
 * `inner` = 1, the threads of that image's call), then the images short of a round each
 * on every thread (t = 0, inner = threads). rlx_conv_gemm's and rlx_conv_nhwc's batches. */
#ifdef _OPENMP
#define RLX_OVER_IMAGES(threads, images, CALL)                                                                      \
    do {                                                                                                           \
        const int64_t team_ = (threads), count_ = (images);                                                        \
        const int64_t whole_ = team_ > 1 && count_ >= team_ ? count_ / team_ * team_ : 0;                          \
        if (whole_) {                                                                                              \
            _Pragma("omp parallel num_threads((int)team_)") {                                                      \
                const int64_t t = omp_get_thread_num(), nt_ = omp_get_num_threads(), inner = 1;                    \
                for (int64_t i = t; i < whole_; i += nt_) CALL;                                                    \
            }                                                                                                      \
        }                                                                                                          \
        for (int64_t i = whole_; i < count_; i++) {                                                                \
            const int64_t t = 0, inner = team_;                                                                    \
            CALL;                                                                                                  \
        }                                                                                                          \
    } while (0)
#else
#define RLX_OVER_IMAGES(threads, images, CALL)                                                                      \
    do {                                                                                                           \
        const int64_t inner = (threads), count_ = (images), t = 0;                                                 \
        for (int64_t i = 0; i < count_; i++) CALL;                                                                 \
    } while (0)
#endif

/* ------------------------------------------------------ float16 <-> float32
 * Elementwise conversions of IEEE half floats, to nearest even (as numpy's). Why: a
 * float16 graph's products and convolutions run on the float32 kernels over float32
 * copies (kernels.as_float32); numpy converts at ~1.4 ns a value on the 2-core Zen 5,
 * as long as a 1x1 convolution over the same values; F16C's vcvtph2ps / vcvtps2ph (the
 * x86-64-v3 and v4 clones) convert 8 or 16 a cycle. */
#if defined(__FLT16_MANT_DIG__) && !defined(RLX_NO_FLOAT16)
typedef _Float16 rlx_half;
#define RLX_HALF_TO_FLOAT(h) ((float)(h))
#define RLX_FLOAT_TO_HALF(f) ((rlx_half)(f))
#else
/* A compiler without _Float16 (clang before 15 on x86): the same conversions on the bits. */
typedef uint16_t rlx_half;
static inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t bits;
    if (e == 0x1f) bits = sign | 0x7f800000 | (m << 13) | (m ? 0x400000 : 0); /* inf, NaN (quiet) */
    else if (e) bits = sign | ((e + 112) << 23) | (m << 13);
    else {
        const float f = (float)m * 5.9604644775390625e-8f; /* a subnormal: m x 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t float_to_half_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000, e = (x >> 23) & 0xff, m = x & 0x7fffff;
    if (e == 0xff) return (uint16_t)(sign | 0x7c00 | (m ? 0x200 | (m >> 13) : 0));
    const int32_t he = (int32_t)e - 112;
    if (he >= 0x1f) return (uint16_t)(sign | 0x7c00); /* past the range: inf */
    if (he <= 0) {                                     /* a subnormal half, or zero */
        if (he < -10) return (uint16_t)sign;
        const uint32_t full = m | 0x800000, shift = (uint32_t)(14 - he);
        const uint32_t hm = full >> shift, rest = full & ((1u << shift) - 1), half = 1u << (shift - 1);
        return (uint16_t)(sign | (hm + (rest > half || (rest == half && (hm & 1)))));
    }
    const uint32_t hm = m >> 13, rest = m & 0x1fff;
    /* a carry out of the mantissa steps the exponent, to inf past the largest half */
    return (uint16_t)((sign | ((uint32_t)he << 10) | hm) + (rest > 0x1000 || (rest == 0x1000 && (hm & 1))));
}
#define RLX_HALF_TO_FLOAT(h) half_bits_to_float(h)
#define RLX_FLOAT_TO_HALF(f) float_to_half_bits(f)
#endif

static RLX_CLONES void half_to_float_part(const rlx_half *x, float *y, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) y[i] = RLX_HALF_TO_FLOAT(x[i]);
}

static RLX_CLONES void float_to_half_part(const float *x, rlx_half *y, int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; i++) y[i] = RLX_FLOAT_TO_HALF(x[i]);
}

/* y (n floats) = x (n halves); x == y's memory never. */
RLX_API void rlx_half_to_float(const void *x, float *y, int64_t n, int64_t threads) {
    RLX_ACROSS_TEAM(threads, n, half_to_float_part((const rlx_half *)x, y, lo, hi));
}

/* y (n halves) = x (n floats) rounded to nearest even (overflow to +-inf, NaN kept). */
RLX_API void rlx_float_to_half(const float *x, void *y, int64_t n, int64_t threads) {
    RLX_ACROSS_TEAM(threads, n, float_to_half_part(x, (rlx_half *)y, lo, hi));
}

RLX_API void rlx_softmax(float *x, void *y, int64_t rows, int64_t len, int64_t stride, float scale,
                         int64_t flags, int64_t threads) {
    threads = row_threads(threads, rows);
#ifdef _OPENMP
    if (threads > 1) {
        int64_t per = row_chunk(len), chunks = (rows + per - 1) / per;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; c++)
            softmax_rows(x, y, c * per, (c + 1) * per < rows ? (c + 1) * per : rows, len, stride, scale, flags);
        return;
    }
#endif
    softmax_rows(x, y, 0, rows, len, stride, scale, flags);
}

RLX_API void rlx_layer_norm(const float *x, const float *scale, const float *bias, float *y, int64_t rows,
                            int64_t len, int64_t stride, float eps, int64_t threads) {
    threads = row_threads(threads, rows);
#ifdef _OPENMP
    if (threads > 1) {
        int64_t per = row_chunk(len), chunks = (rows + per - 1) / per;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1)
        for (int64_t c = 0; c < chunks; c++)
            layer_norm_rows(x, scale, bias, y, c * per, (c + 1) * per < rows ? (c + 1) * per : rows, len, stride, eps);
        return;
    }
#endif
    layer_norm_rows(x, scale, bias, y, 0, rows, len, stride, eps);
}

/* ------------------------------------------------------- convolution windows */
/* im2col for `count` images of `c` channels (H x W, `x_stride` floats apart): row
 * (ch, ki, kj) of an image's columns (`cols_stride` floats apart, rows oh * ow long)
 * holds x[ch, oy * sh - pt + ki * dh, ox * sw - pl + kj * dw], 0 outside the image. */
static RLX_CLONES void im2col_one(const float *x, float *cols, int64_t c0, int64_t c1, int64_t h, int64_t w,
                                  int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                                  int64_t pl, int64_t oh, int64_t ow) {
    float *row = cols + c0 * kh * kw * oh * ow;
    for (int64_t ch = c0; ch < c1; ch++) {
        const float *plane = x + ch * h * w;
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++, row += oh * ow) {
                /* the output columns whose input column is inside: ox in [lo, hi) */
                int64_t off = kj * dw - pl, lo = 0, hi = ow;
                while (lo < ow && lo * sw + off < 0) lo++;
                while (hi > lo && (hi - 1) * sw + off >= w) hi--;
                for (int64_t oy = 0; oy < oh; oy++) {
                    float *dst = row + oy * ow;
                    int64_t iy = oy * sh - pt + ki * dh;
                    if (iy < 0 || iy >= h || lo >= hi) {
                        for (int64_t ox = 0; ox < ow; ox++) dst[ox] = 0.0f;
                        continue;
                    }
                    const float *src = plane + iy * w + off;
                    int64_t ox;
                    for (ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
                    if (sw == 1)
                        for (ox = lo; ox < hi; ox++) dst[ox] = src[ox];
                    else
                        for (ox = lo; ox < hi; ox++) dst[ox] = src[ox * sw];
                    for (ox = hi; ox < ow; ox++) dst[ox] = 0.0f;
                }
            }
    }
}

static int64_t row_threads(int64_t threads, int64_t rows);

RLX_API void rlx_im2col(const float *x, float *cols, int64_t count, int64_t x_stride, int64_t cols_stride, int64_t c,
                        int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                        int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t threads) {
    threads = row_threads(threads, c);
    for (int64_t i = 0; i < count; i++) {
        const float *xi = x + i * x_stride;
        float *ci = cols + i * cols_stride;
#ifdef _OPENMP
        if (threads > 1) {
#pragma omp parallel num_threads((int)threads)
            {
                int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
                im2col_one(xi, ci, c * t / nt, c * (t + 1) / nt, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
            }
            continue;
        }
#endif
        im2col_one(xi, ci, 0, c, h, w, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow);
    }
}

/* Depthwise convolution (groups == channels, one filter per channel): plane p of x
 * (N*C planes H x W) convolved with filter p % c (kh x kw, stride, dilation, zero padding
 * pt/pl) into plane p of y (oh x ow), plus bias[p % c] when bias is not NULL. Each plane
 * is first copied into a zero-padded scratch covering every window, so the loops carry
 * no bounds checks; 3x3 and 5x5 at stride 1 (MobileNet's, EfficientNet's) sum their taps
 * per output with the filter in registers, over a row the compiler vectorizes. */
/* One output row of a 3x3 / 5x5 stride-1 depthwise window: restrict pointers and the
 * filter in locals, so the compiler vectorizes over the row. */
/* 8 floats from p, any alignment. */
static inline __attribute__((always_inline)) rlx_v8 ld8(const float *p) {
    rlx_v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* 16 floats from p, any alignment. */
static inline __attribute__((always_inline)) rlx_v16 ld16(const float *p) {
    rlx_v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}
/* The first n (0 < n < 16) floats from p into a vector, the rest zero, and v's first n
 * into p: fixed-size pieces (8, 4, 2, 1), no call. Why: a memcpy of a variable size is a
 * libc call, and every vector register is the caller's to save around it: a tile's
 * partial last vector, so stored, cost rlx_conv_nhwc about as much as its products for
 * 24 or 72 output channels (a call a tile row, each spilling the accumulators). */
static inline __attribute__((always_inline)) rlx_v16 ld16_part(const float *p, int64_t n) {
    float t[16] = {0};
    int64_t i = 0;
    if (n & 8) memcpy(t, p, 8 * sizeof(float)), i = 8;
    if (n & 4) memcpy(t + i, p + i, 4 * sizeof(float)), i += 4;
    if (n & 2) memcpy(t + i, p + i, 2 * sizeof(float)), i += 2;
    if (n & 1) t[i] = p[i];
    rlx_v16 v;
    memcpy(&v, t, sizeof v);
    return v;
}
static inline __attribute__((always_inline)) void st16_part(float *p, rlx_v16 v, int64_t n) {
    float t[16];
    memcpy(t, &v, sizeof v);
    int64_t i = 0;
    if (n & 8) memcpy(p, t, 8 * sizeof(float)), i = 8;
    if (n & 4) memcpy(p + i, t + i, 4 * sizeof(float)), i += 4;
    if (n & 2) memcpy(p + i, t + i, 2 * sizeof(float)), i += 2;
    if (n & 1) p[i] = t[i];
}
/* v clamped to [cl[0], cl[1]], NaN kept (the lanes of clamp8 and clamp16, one at a time):
 * two selects, each x86's max / min (a NaN v is the one kept). Why not one nested
 * ternary: GCC made it a branch on v < cl[0], taken for about half of a ReLU's inputs, and
 * the mispredictions of a depthwise row's 8-float tail took a third of the kernel's time
 * (MobileNetV3's 64 x 112 x 112 stride-2 layer at batch 4: 0.99 ms against 0.75 with no
 * clamp). */
static inline float clamp1(float v, const float *cl) {
    const float up = cl[0] > v ? cl[0] : v;
    return up > cl[1] ? cl[1] : up;
}

/* v with every lane clamped to [cl[0], cl[1]] (NaN stays NaN, as numpy's maximum and
 * minimum keep it: a comparison with NaN is false, so the lane keeps v). */
static inline __attribute__((always_inline)) rlx_v8 clamp8(rlx_v8 v, const float *cl) {
    rlx_v8 lo = (rlx_v8){0} + cl[0], hi = (rlx_v8){0} + cl[1];
    rlx_i8 under = v < lo, over = v > hi;
    rlx_i8 bits = ((rlx_i8)lo & under) | ((rlx_i8)v & ~under);
    return (rlx_v8)(((rlx_i8)hi & over) | (bits & ~over));
}
static inline __attribute__((always_inline)) rlx_v16 clamp16(rlx_v16 v, const float *cl) {
    rlx_v16 lo = (rlx_v16){0} + cl[0], hi = (rlx_v16){0} + cl[1];
    rlx_i16 under = v < lo, over = v > hi;
    rlx_i16 bits = ((rlx_i16)lo & under) | ((rlx_i16)v & ~under);
    return (rlx_v16)(((rlx_i16)hi & over) | (bits & ~over));
}

/* d[0 .. n) clamped to [cl[0], cl[1]] (a row just written, in L1): the epilogue of a
 * kernel whose epilogue is a clamp (rlx_epilogue.clamp), instead of a region's pass. */
static inline __attribute__((always_inline)) void clamp_row(float *d, int64_t n, const float *cl) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        rlx_v16 v = clamp16(ld16(d + i), cl);
        memcpy(d + i, &v, sizeof v);
    }
    if (i < n) st16_part(d + i, clamp16(ld16_part(d + i, n - i), cl), n - i); /* the tail: one partial vector */
}
RLX_API int64_t rlx_gemm_avx512(void);
#define DW_ROW_U 3
#if defined(__clang__)
#define RLX_SHUFFLE8_EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#define RLX_SHUFFLE8_ODD(a, b) __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15)
#else
#define RLX_SHUFFLE8_EVEN(a, b) __builtin_shuffle(a, b, (rlx_i8){0, 2, 4, 6, 8, 10, 12, 14})
#define RLX_SHUFFLE8_ODD(a, b) __builtin_shuffle(a, b, (rlx_i8){1, 3, 5, 7, 9, 11, 13, 15})
#endif

/* A padded row of wp columns (column q is src[q] for q in [x0, x1), else 0) stored split
 * at row: its (wp + 1) / 2 even columns, then its wp / 2 odd ones, so that a stride-2
 * window's taps read consecutive floats. [lo, v): columns whose even and odd inputs are
 * both data, 16 inputs at a time through two shuffles (one at a time, the split was most of
 * a 112x112 stride-2 depthwise layer's time). */
static inline __attribute__((always_inline)) void split_row(const float *src, float *row, int64_t x0, int64_t x1,
                                                            int64_t wp) {
    const int64_t we = (wp + 1) / 2;
    float *ev = row, *od = row + we;
    const int64_t e0 = (x0 + 1) / 2, e1 = (x1 + 1) / 2, o0 = x0 / 2, o1 = x1 / 2;
    const int64_t lo = e0 > o0 ? e0 : o0, hi = e1 < o1 ? e1 : o1;
    int64_t v = lo;
    for (; v + 8 <= hi; v += 8) {
        const rlx_v8 a = ld8(src + 2 * v), c = ld8(src + 2 * v + 8);
        const rlx_v8 even = RLX_SHUFFLE8_EVEN(a, c), odd = RLX_SHUFFLE8_ODD(a, c);
        memcpy(ev + v, &even, sizeof even);
        memcpy(od + v, &odd, sizeof odd);
    }
    for (int64_t i = 0; i < e0; i++) ev[i] = 0.0f;
    for (int64_t i = e0; i < (lo < e1 ? lo : e1); i++) ev[i] = src[2 * i];
    for (int64_t i = v; i < e1; i++) ev[i] = src[2 * i];
    for (int64_t i = e1; i < we; i++) ev[i] = 0.0f;
    for (int64_t i = 0; i < o0; i++) od[i] = 0.0f;
    for (int64_t i = o0; i < (lo < o1 ? lo : o1); i++) od[i] = src[2 * i + 1];
    for (int64_t i = v; i < o1; i++) od[i] = src[2 * i + 1];
    for (int64_t i = o1; i < wp / 2; i++) od[i] = 0.0f;
}

/* The row kernels' vector part: U vectors of 8 outputs at a time, each output's sum
 * accumulated tap by tap in the scalar formula's order (the same multiply-adds, so the
 * same results), in 2U (pairs of rows) or U independent chains. Left to GCC, the formula
 * vectorized as one chain of 9 dependent multiply-adds per 8 outputs (4 cycles each)
 * with its loads spilled: 144x56x56 3x3 on one Zen 3 core 630 us. Each returns how many
 * outputs it did (a multiple of 8), clamped to cl (NULL: none) as they are stored; the
 * scalar loop does the rest, and clamp_row clamps that. */
/* U vectors of W outputs (VT: rlx_v8 or, where the AVX-512 clones run, rlx_v16: half the
 * loads and multiply-adds a row) of two rows at once; the same sums in either width. */
#define DW3X2_BLOCK(NAME, VT, LOAD, CLAMP, W)                                                                      \
    static inline __attribute__((always_inline)) void NAME(                                                        \
        float *restrict d0, float *restrict d1, const float *restrict r0, const float *restrict r1,                \
        const float *restrict r2, const float *restrict r3, const float *restrict f, float b, const float *cl,      \
        const int U) {                                                                                             \
        VT p[DW_ROW_U], q[DW_ROW_U];                                                                               \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] = q[u] = (VT){0} + b;                             \
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) {                                                      \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] += f[j] * LOAD(r0 + W * u + j);               \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) {                                                  \
                const VT v = LOAD(r1 + W * u + j);                                                                 \
                p[u] += f[3 + j] * v;                                                                              \
                q[u] += f[j] * v;                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 3") for (int j = 0; j < 3; j++) {                                                      \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) {                                                  \
                const VT v = LOAD(r2 + W * u + j);                                                                 \
                p[u] += f[6 + j] * v;                                                                              \
                q[u] += f[3 + j] * v;                                                                              \
            }                                                                                                      \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) q[u] += f[6 + j] * LOAD(r3 + W * u + j);           \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) {                                                      \
            if (cl) p[u] = CLAMP(p[u], cl), q[u] = CLAMP(q[u], cl);                                                \
            memcpy(d0 + W * u, &p[u], sizeof p[u]);                                                                \
            memcpy(d1 + W * u, &q[u], sizeof q[u]);                                                                \
        }                                                                                                          \
    }
DW3X2_BLOCK(dw3x2_block, rlx_v8, ld8, clamp8, 8)
DW3X2_BLOCK(dw3x2_block16, rlx_v16, ld16, clamp16, 16)

static inline __attribute__((always_inline)) int64_t dw_row3x2_v(float *restrict d0, float *restrict d1,
                                                                 const float *restrict r0, const float *restrict r1,
                                                                 const float *restrict r2, const float *restrict r3,
                                                                 const float *restrict f, float b,
                                                                 const float *cl, int64_t ow) {
    int64_t ox = 0;
    if (rlx_gemm_avx512()) {
        for (; ox + 16 * DW_ROW_U <= ow; ox += 16 * DW_ROW_U)
            dw3x2_block16(d0 + ox, d1 + ox, r0 + ox, r1 + ox, r2 + ox, r3 + ox, f, b, cl, DW_ROW_U);
        for (; ox + 16 <= ow; ox += 16)
            dw3x2_block16(d0 + ox, d1 + ox, r0 + ox, r1 + ox, r2 + ox, r3 + ox, f, b, cl, 1);
    }
    for (; ox + 8 * DW_ROW_U <= ow; ox += 8 * DW_ROW_U)
        dw3x2_block(d0 + ox, d1 + ox, r0 + ox, r1 + ox, r2 + ox, r3 + ox, f, b, cl, DW_ROW_U);
    for (; ox + 8 <= ow; ox += 8) dw3x2_block(d0 + ox, d1 + ox, r0 + ox, r1 + ox, r2 + ox, r3 + ox, f, b, cl, 1);
    return ox;
}

/* One row of a 3x3 window, U vectors of W outputs: the three input rows tap after tap, as dw_row3. */
#define DW3_BLOCK(NAME, VT, LOAD, CLAMP, W)                                                                        \
    static inline __attribute__((always_inline)) void NAME(float *restrict d, const float *restrict r0,            \
                                                           const float *restrict r1, const float *restrict r2,     \
                                                           const float *restrict f, float b, const float *cl,      \
                                                           const int U) {                                          \
        VT p[4];                                                                                                   \
        const float *rows[3] = {r0, r1, r2};                                                                       \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] = (VT){0} + b;                                    \
        _Pragma("GCC unroll 9") for (int t = 0; t < 9; t++)                                                        \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] += f[t] * LOAD(rows[t / 3] + W * u + t % 3);  \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) {                                                      \
            if (cl) p[u] = CLAMP(p[u], cl);                                                                        \
            memcpy(d + W * u, &p[u], sizeof p[u]);                                                                 \
        }                                                                                                          \
    }
DW3_BLOCK(dw3_block, rlx_v8, ld8, clamp8, 8)
DW3_BLOCK(dw3_block16, rlx_v16, ld16, clamp16, 16)

static inline __attribute__((always_inline)) int64_t dw_row3_v(float *restrict d, const float *restrict r0,
                                                               const float *restrict r1, const float *restrict r2,
                                                               const float *restrict f, float b, const float *cl,
                                                               int64_t ow) {
    int64_t ox = 0;
    if (rlx_gemm_avx512()) {
        for (; ox + 64 <= ow; ox += 64) dw3_block16(d + ox, r0 + ox, r1 + ox, r2 + ox, f, b, cl, 4);
        for (; ox + 16 <= ow; ox += 16) dw3_block16(d + ox, r0 + ox, r1 + ox, r2 + ox, f, b, cl, 1);
    }
    for (; ox + 32 <= ow; ox += 32) dw3_block(d + ox, r0 + ox, r1 + ox, r2 + ox, f, b, cl, 4);
    for (; ox + 8 <= ow; ox += 8) dw3_block(d + ox, r0 + ox, r1 + ox, r2 + ox, f, b, cl, 1);
    return ox;
}

/* dw_row3_s2's taps (even row, odd row, even row one on, for each of the three rows), U
 * vectors of W outputs. */
#define DW3S2_BLOCK(NAME, VT, LOAD, CLAMP, W)                                                                      \
    static inline __attribute__((always_inline)) void NAME(float *restrict d, const float *const *rows,            \
                                                           const float *restrict f, float b, const float *cl,      \
                                                           int64_t ox, const int U) {                              \
        VT p[4];                                                                                                   \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] = (VT){0} + b;                                    \
        _Pragma("GCC unroll 3") for (int i = 0; i < 3; i++) {                                                      \
            const float *e = rows[2 * i] + ox, *o = rows[2 * i + 1] + ox;                                          \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] += f[3 * i] * LOAD(e + W * u);                \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] += f[3 * i + 1] * LOAD(o + W * u);            \
            _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) p[u] += f[3 * i + 2] * LOAD(e + W * u + 1);        \
        }                                                                                                          \
        _Pragma("GCC unroll 4") for (int u = 0; u < U; u++) {                                                      \
            if (cl) p[u] = CLAMP(p[u], cl);                                                                        \
            memcpy(d + ox + W * u, &p[u], sizeof p[u]);                                                            \
        }                                                                                                          \
    }
DW3S2_BLOCK(dw3s2_block, rlx_v8, ld8, clamp8, 8)
DW3S2_BLOCK(dw3s2_block16, rlx_v16, ld16, clamp16, 16)

static inline __attribute__((always_inline)) int64_t dw_row3_s2_v(float *restrict d, const float *const *rows,
                                                                  const float *restrict f, float b, const float *cl,
                                                                  int64_t ow) {
    int64_t ox = 0;
    if (rlx_gemm_avx512()) {
        for (; ox + 64 <= ow; ox += 64) dw3s2_block16(d, rows, f, b, cl, ox, 4);
        for (; ox + 16 <= ow; ox += 16) dw3s2_block16(d, rows, f, b, cl, ox, 1);
    }
    for (; ox + 32 <= ow; ox += 32) dw3s2_block(d, rows, f, b, cl, ox, 4);
    for (; ox + 8 <= ow; ox += 8) dw3s2_block(d, rows, f, b, cl, ox, 1);
    return ox;
}

static inline void dw_row3(float *restrict dst, const float *restrict r0, const float *restrict r1,
                           const float *restrict r2, const float *restrict f, float b, int64_t ow) {
    const float f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4], f5 = f[5], f6 = f[6], f7 = f[7], f8 = f[8];
    for (int64_t ox = 0; ox < ow; ox++)
        dst[ox] = b + f0 * r0[ox] + f1 * r0[ox + 1] + f2 * r0[ox + 2] + f3 * r1[ox] + f4 * r1[ox + 1] +
                  f5 * r1[ox + 2] + f6 * r2[ox] + f7 * r2[ox + 1] + f8 * r2[ox + 2];
}

/* Two output rows of a 3x3 window at once: they share two of their four input rows, each
 * loaded once for both (12 loads for 32 outputs instead of 18; the row kernel was
 * load-bound). Each output's sum in dw_row3's order, so the same results. */
static inline void dw_row3x2(float *restrict d0, float *restrict d1, const float *restrict r0,
                             const float *restrict r1, const float *restrict r2, const float *restrict r3,
                             const float *restrict f, float b, int64_t ow) {
    const float f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4], f5 = f[5], f6 = f[6], f7 = f[7], f8 = f[8];
    for (int64_t ox = 0; ox < ow; ox++) {
        const float a0 = r0[ox], a1 = r0[ox + 1], a2 = r0[ox + 2], b0 = r1[ox], b1 = r1[ox + 1], b2 = r1[ox + 2];
        const float c0 = r2[ox], c1 = r2[ox + 1], c2 = r2[ox + 2], e0 = r3[ox], e1 = r3[ox + 1], e2 = r3[ox + 2];
        d0[ox] = b + f0 * a0 + f1 * a1 + f2 * a2 + f3 * b0 + f4 * b1 + f5 * b2 + f6 * c0 + f7 * c1 + f8 * c2;
        d1[ox] = b + f0 * b0 + f1 * b1 + f2 * b2 + f3 * c0 + f4 * c1 + f5 * c2 + f6 * e0 + f7 * e1 + f8 * e2;
    }
}
static inline void dw_row5(float *restrict dst, const float *restrict r, int64_t wp, const float *restrict f, float b,
                           int64_t ow) {
    float g[25];
    for (int k = 0; k < 25; k++) g[k] = f[k];
    const float *restrict r0 = r, *restrict r1 = r + wp, *restrict r2 = r + 2 * wp, *restrict r3 = r + 3 * wp,
                          *restrict r4 = r + 4 * wp;
    for (int64_t ox = 0; ox < ow; ox++) {
        float a0 = g[0] * r0[ox] + g[1] * r0[ox + 1] + g[2] * r0[ox + 2] + g[3] * r0[ox + 3] + g[4] * r0[ox + 4];
        float a1 = g[5] * r1[ox] + g[6] * r1[ox + 1] + g[7] * r1[ox + 2] + g[8] * r1[ox + 3] + g[9] * r1[ox + 4];
        float a2 = g[10] * r2[ox] + g[11] * r2[ox + 1] + g[12] * r2[ox + 2] + g[13] * r2[ox + 3] + g[14] * r2[ox + 4];
        float a3 = g[15] * r3[ox] + g[16] * r3[ox + 1] + g[17] * r3[ox + 2] + g[18] * r3[ox + 3] + g[19] * r3[ox + 4];
        float a4 = g[20] * r4[ox] + g[21] * r4[ox + 1] + g[22] * r4[ox + 2] + g[23] * r4[ox + 3] + g[24] * r4[ox + 4];
        dst[ox] = b + a0 + a1 + a2 + a3 + a4;
    }
}

/* A 3x3 row at stride 2 (the downsampling layers), over rows stored split into their even
 * columns (e) and odd columns (o): every tap then reads consecutive floats. Read with a
 * stride of 2 instead, the taps cost the lanes kernel's time or more. (5x5 at stride 2 stays
 * with the lanes kernel: 144x56x56 124 us there, 137 here.) */
static inline void dw_row3_s2(float *restrict dst, const float *restrict e0, const float *restrict o0,
                              const float *restrict e1, const float *restrict o1, const float *restrict e2,
                              const float *restrict o2, const float *restrict f, float b, int64_t ow) {
    const float f0 = f[0], f1 = f[1], f2 = f[2], f3 = f[3], f4 = f[4], f5 = f[5], f6 = f[6], f7 = f[7], f8 = f[8];
    for (int64_t ox = 0; ox < ow; ox++)
        dst[ox] = b + f0 * e0[ox] + f1 * o0[ox] + f2 * e0[ox + 1] + f3 * e1[ox] + f4 * o1[ox] + f5 * e1[ox + 1] +
                  f6 * e2[ox] + f7 * o2[ox] + f8 * e2[ox + 1];
}

static RLX_CLONES void depthwise_planes(const float *x, const float *wt, const float *bias, float *y, float *pad,
                                        int64_t p0, int64_t p1, int64_t c, int64_t h, int64_t w, int64_t kh,
                                        int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                                        int64_t pl, int64_t oh, int64_t ow, const rlx_epilogue *epi, int64_t t) {
    int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    int64_t x0 = pl < wp ? pl : wp, x1 = pl + w < wp ? pl + w : wp; /* padded columns holding data */
    int unit = sh == 1 && sw == 1 && dh == 1 && dw == 1;
    int two = sh == 2 && sw == 2 && dh == 1 && dw == 1 && kh == 3 && kw == 3;
    int64_t we = (wp + 1) / 2; /* a split row: its we even columns, then its odd ones */
    /* a clamp (ReLU, ReLU6) applied in the row kernels' registers as they store, the rest of a row
     * (a scalar tail, other windows) clamped as it is written, in L1 */
    const float *cl = epi_clamp(epi);
    epi_state es;
    epi_begin(&es, cl ? NULL : epi, t);
    for (int64_t p = p0; p < p1; p++) {
        const float *plane = x + p * h * w, *f = wt + (p % c) * kh * kw;
        float b = bias ? bias[p % c] : 0.0f;
        for (int64_t yy = 0; yy < hp; yy++) {
            float *row = pad + yy * wp;
            int64_t iy = yy - pt;
            if (iy < 0 || iy >= h || x1 <= x0) {
                memset(row, 0, (size_t)wp * sizeof(float));
                continue;
            }
            if (two) { /* split straight from x (0.95x a copy, then the split) */
                split_row(plane + iy * w - pl, row, x0, x1, wp);
                continue;
            }
            /* the padding columns (a few floats) inline: a memset call each was a third of
             * the copy's time on 56-wide rows */
            for (int64_t i = 0; i < x0; i++) row[i] = 0.0f;
            memcpy(row + x0, plane + iy * w + (x0 - pl), (size_t)(x1 - x0) * sizeof(float));
            for (int64_t i = x1; i < wp; i++) row[i] = 0.0f;
        }
        float *out = y + p * oh * ow;
        /* the next plane's lines asked for while this one is computed (from L2): the copy
         * above then finds them on their way, not a stream started cold every plane */
        const char *next = (const char *)(plane + h * w);
        const int64_t lines = p + 1 < p1 ? (h * w * (int64_t)sizeof(float) + 63) / 64 : 0, per = (lines + oh - 1) / oh;
        int64_t asked = 0;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t upto = (oy + 2) * per < lines ? (oy + 2) * per : lines; /* (rows go two at a time) */
            for (; asked < upto; asked++) __builtin_prefetch(next + 64 * asked, 0, 2);
            float *dst = out + oy * ow;
            const float *r = pad + oy * sh * wp;
            if (unit && kh == 3 && kw == 3 && oy + 1 < oh) { /* 0.90-0.96x one row at a time */
                const float *r1 = r + wp, *r2 = r + 2 * wp, *r3 = r + 3 * wp;
                const int64_t v = dw_row3x2_v(dst, dst + ow, r, r1, r2, r3, f, b, cl, ow); /* clamped */
                dw_row3x2(dst + v, dst + ow + v, r + v, r1 + v, r2 + v, r3 + v, f, b, ow - v);
                if (cl && v < ow) clamp_row(dst + v, ow - v, cl), clamp_row(dst + ow + v, ow - v, cl);
                oy++;
                continue;
            }
            int64_t done = 0; /* outputs of the row the vector blocks wrote, clamped */
            if (unit && kh == 3 && kw == 3) {
                done = dw_row3_v(dst, r, r + wp, r + 2 * wp, f, b, cl, ow);
                dw_row3(dst + done, r + done, r + wp + done, r + 2 * wp + done, f, b, ow - done);
            } else if (unit && kh == 5 && kw == 5) {
                dw_row5(dst, r, wp, f, b, ow);
            } else if (two) {
                const float *rows[6] = {r, r + we, r + wp, r + wp + we, r + 2 * wp, r + 2 * wp + we};
                done = dw_row3_s2_v(dst, rows, f, b, cl, ow);
                dw_row3_s2(dst + done, rows[0] + done, rows[1] + done, rows[2] + done, rows[3] + done, rows[4] + done,
                           rows[5] + done, f, b, ow - done);
            } else {
                for (int64_t ox = 0; ox < ow; ox++) dst[ox] = b;
                for (int64_t i = 0; i < kh; i++) {
                    const float *r = pad + (oy * sh + i * dh) * wp;
                    for (int64_t j = 0; j < kw; j++) {
                        float fv = f[i * kw + j];
                        const float *rj = r + j * dw;
                        for (int64_t ox = 0; ox < ow; ox++) dst[ox] += fv * rj[ox * sw];
                    }
                }
            }
            if (cl && done < ow) clamp_row(dst + done, ow - done, cl);
        }
        epi_span(&es, out, oh * ow);
    }
    epi_flush(&es);
}

/* scratch: `threads` zero-padded planes of ((oh-1)*sh + (kh-1)*dh + 1) x ((ow-1)*sw + (kw-1)*dw + 1)
 * floats, one per thread; epi: NULL or the epilogue applied to each plane as it is done. */
RLX_API void rlx_depthwise_conv(const float *x, const float *wt, const float *bias, float *y, float *scratch,
                                int64_t planes, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                                int64_t threads, const rlx_epilogue *epi) {
    int64_t padded = ((oh - 1) * sh + (kh - 1) * dh + 1) * ((ow - 1) * sw + (kw - 1) * dw + 1);
    RLX_ACROSS_TEAM(threads, planes, depthwise_planes(x, wt, bias, y, scratch + t * padded, lo, hi, c, h, w, kh, kw, sh,
                                                      sw, dh, dw, pt, pl, oh, ow, epi, t));
}

/* Grouped convolution with few channels a group (ResNeXt's 4 to 32, RegNet's 8 to 48):
 * each group's cg input planes copied zero-padded (rows split into even and odd columns at
 * column stride 2, so every tap reads consecutive floats), then for each block of
 * GC_OB output channels of the group and each output row, sums kept in registers for
 * GC_U vectors of 8 outputs per channel while every (input channel, tap) input vector is
 * loaded once and multiplied into all GC_OB channels, instead of im2col and one product per
 * group with an M of 4 to 32 against 12-row panels (BENCHMARKS.md, session 18).
 * Channels past the group's last in a block repeat its weights (their sums are dropped),
 * and a row's last outputs short of a vector are its last 8 again, so the blocks have no
 * branches. A row of one vector (at most 8 outputs, or 16 where the AVX-512 clones run:
 * 7x7 and 14x14 planes) is computed over a copy padded that wide, two output rows at a
 * time, and its first outputs kept. Where the AVX-512 clones run, wider rows go 16
 * outputs to a vector (gc_block16), two vectors at a time, over copies padded to whole
 * vectors: RegNetX-800MF's groups of 16 at batch 1 ran 2.5-5x as fast on the 2-core Zen 5
 * (BENCHMARKS.md, "Grouped convolutions: every row width, 16-float vectors"). A block is 8
 * output channels where the group has 8 or more (16 sums in flight: both FMA pipes kept
 * busy past their latency, and 16 multiply-adds per two input loads: 0.96-1.2x the
 * speed of 4 on the 2-core Zen 5, BENCHMARKS.md "Grouped convolutions with the channels
 * in the lanes"), else 4. Groups of 16, 32, ... channels on AVX-512 go
 * to rlx_group_conv_lanes below instead.
 * Sums: the bias, then input channel by channel, tap by tap. Dilation 1; column stride 1
 * or 2. */
#define GC_OB 8 /* the most output channels a block sums (4 where a group has fewer than 8) */
#define GC_U 2

/* Whether rows of ow outputs are one vector each (of 16 where the AVX-512 clones run,
 * else of 8): then two output rows are done at a time, 8 sums in flight. */
static int gc_narrow(int64_t ow) { return ow <= 8 || (ow < 16 && rlx_gemm_avx512()); }
/* The outputs a padded row holds: a narrow row's whole vector. */
static int64_t gc_outputs(int64_t ow) {
    if (gc_narrow(ow)) return ow <= 8 ? 8 : 16;
    return rlx_gemm_avx512() ? (ow + 15) / 16 * 16 : ow; /* whole vectors of 16 (the last one's tail dropped) */
}
static int64_t gc_row_width(int64_t ow, int64_t kw, int64_t sw) { return (gc_outputs(ow) - 1) * sw + kw; }

RLX_API int64_t rlx_group_conv_scratch(int64_t cg, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t oh,
                                       int64_t ow) {
    /* + a row for dropped sums */
    return cg * ((oh - 1) * sh + kh) * (gc_row_width(ow, kw, sw) + 1) + gc_outputs(ow);
}

/* Sums of GC_OB output channels over U vectors of VT (8 or 16 outputs): the u-th reads its
 * inputs ustride floats past the first's (a vector along the row; sh * wq: the next
 * output row) and is stored from dst[o] + dox, dstride floats past the first's. */
#define GC_BLOCK(NAME, VT, LOAD)                                                                                   \
    static inline __attribute__((always_inline)) void NAME(                                                        \
        const float *pad, const float *const *wrow, const float *bv, float *const *dst, int64_t cg, int64_t kh,     \
        int64_t kw, int64_t plane, int64_t wq, int64_t we, int64_t row0, int64_t ox, int two, int64_t ustride,     \
        int64_t dox, int64_t dstride, const int U, const int OB) {                                                 \
        VT acc[GC_OB][GC_U];                                                                                       \
        _Pragma("GCC unroll 2") for (int u = 0; u < U; u++) {                                                      \
            _Pragma("GCC unroll 8") for (int o = 0; o < OB; o++) acc[o][u] = (VT){0} + bv[o];                      \
        }                                                                                                          \
        const int64_t taps = kh * kw;                                                                              \
        for (int64_t ic = 0; ic < cg; ic++) {                                                                      \
            for (int64_t ki = 0; ki < kh; ki++) {                                                                  \
                const float *row = pad + ic * plane + (row0 + ki) * wq;                                            \
                for (int64_t kj = 0; kj < kw; kj++) {                                                              \
                    const float *src = two ? row + (kj & 1) * we + ox + kj / 2 : row + ox + kj;                    \
                    const int64_t t = ic * taps + ki * kw + kj;                                                    \
                    VT v[GC_U];                                                                                    \
                    _Pragma("GCC unroll 2") for (int u = 0; u < U; u++) v[u] = LOAD(src + ustride * u);            \
                    _Pragma("GCC unroll 8") for (int o = 0; o < OB; o++) {                                         \
                        const float wo = wrow[o][t];                                                               \
                        _Pragma("GCC unroll 2") for (int u = 0; u < U; u++) acc[o][u] += wo * v[u];                \
                    }                                                                                              \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        _Pragma("GCC unroll 8") for (int o = 0; o < OB; o++)                                                       \
            _Pragma("GCC unroll 2") for (int u = 0; u < U; u++)                                                    \
                memcpy(dst[o] + dox + dstride * u, &acc[o][u], sizeof acc[o][u]);                                  \
    }
GC_BLOCK(gc_block, rlx_v8, ld8)
GC_BLOCK(gc_block16, rlx_v16, ld16)

/* The cg input planes of one (image, group) copied zero-padded into pad: hp rows `pitch`
 * floats apart, each holding padded columns 0 .. width - 1 (column q is input column
 * q - pl) and zeros up to the pitch; at column stride 2 (`two`) a row is split into its
 * even columns, then its odd ones (split_row). */
static inline __attribute__((always_inline)) void gc_pad_group(const float *planes, float *pad, int64_t cg,
                                                               int64_t h, int64_t wd, int64_t hp, int64_t width,
                                                               int64_t pitch, int64_t pt, int64_t pl, int two) {
    const int64_t x0 = pl < width ? pl : width, x1 = pl + wd < width ? pl + wd : width;
    for (int64_t ic = 0; ic < cg; ic++) {
        const float *src_plane = planes + ic * h * wd;
        for (int64_t yy = 0; yy < hp; yy++) {
            float *row = pad + (ic * hp + yy) * pitch;
            const int64_t iy = yy - pt;
            if (iy < 0 || iy >= h || x1 <= x0) {
                memset(row, 0, (size_t)pitch * sizeof(float));
                continue;
            }
            const float *src = src_plane + iy * wd - pl; /* padded column q is src[q] */
            if (two) {
                split_row(src, row, x0, x1, width);
                continue;
            }
            for (int64_t q = 0; q < x0; q++) row[q] = 0.0f;
            memcpy(row + x0, src + x0, (size_t)(x1 - x0) * sizeof(float));
            for (int64_t q = x1; q < pitch; q++) row[q] = 0.0f;
        }
    }
}

static inline __attribute__((always_inline)) void
group_conv_units_ob(const float *x, const float *w, const float *bias, float *y, float *pad, int64_t u0, int64_t u1,
                    int64_t groups, int64_t cg, int64_t og, int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh,
                    int64_t sw, int64_t pt, int64_t pl, int64_t oh, int64_t ow, const rlx_epilogue *epi, int64_t t,
                    const int OB) {
    const int64_t hp = (oh - 1) * sh + kh, wp = gc_row_width(ow, kw, sw), wq = wp + 1, plane = hp * wq;
    const int two = sw == 2, wide = rlx_gemm_avx512() != 0, narrow = gc_narrow(ow);
    const int64_t we = (wp + 1) / 2; /* a split row: its we even columns, then its odd ones */
    const int64_t taps = kh * kw;
    float *trash = pad + cg * plane; /* the stores of a block's channels past the group's last (a row) */
    epi_state es;
    epi_begin(&es, epi, t);
    for (int64_t unit = u0; unit < u1; unit++) {
        const int64_t img = unit / groups, g = unit % groups;
        gc_pad_group(x + (img * groups + g) * cg * h * wd, pad, cg, h, wd, hp, wp, wq, pt, pl, two);
        float *yg = y + (img * groups + g) * og * oh * ow;
        const float *wg = w + g * og * cg * taps;
        for (int64_t ob = 0; ob < og; ob += OB) {
            const float *wrow[GC_OB];
            float bv[GC_OB];
            for (int o = 0; o < OB; o++) {
                const int64_t oc = ob + o < og ? ob + o : og - 1;
                wrow[o] = wg + oc * cg * taps;
                bv[o] = bias ? bias[g * og + oc] : 0.0f;
            }
            for (int64_t oy = 0; oy < oh; oy++) {
                float *dst[GC_OB];
                for (int o = 0; o < OB; o++) dst[o] = ob + o < og ? yg + (ob + o) * oh * ow + oy * ow : trash;
                int64_t ox = 0;
                if (narrow) { /* rows of one vector over the padded row, two rows at once; ow outputs kept */
                    float part[GC_OB][2][16];
                    float *tmp[GC_OB];
                    for (int o = 0; o < GC_OB; o++) tmp[o] = part[o][0];
                    const int rows = oy + 1 < oh ? 2 : 1;
                    const int64_t down = sh * wq;
                    if (ow > 8 && rows == 2)
                        gc_block16(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, 0, two, down, 0, 16, 2, OB);
                    else if (ow > 8)
                        gc_block16(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, 0, two, down, 0, 16, 1, OB);
                    else if (rows == 2)
                        gc_block(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, 0, two, down, 0, 16, 2, OB);
                    else
                        gc_block(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, 0, two, down, 0, 16, 1, OB);
                    for (int o = 0; o < OB && ob + o < og; o++) /* (channels past the group's: dropped) */
                        for (int r = 0; r < rows; r++) memcpy(dst[o] + r * ow, part[o][r], (size_t)ow * sizeof(float));
                    oy += rows - 1;
                    continue;
                }
                if (wide) { /* vectors of 16, two at a time; the row's rest over the padded row */
                    for (; ox + 32 <= ow; ox += 32)
                        gc_block16(pad, wrow, bv, dst, cg, kh, kw, plane, wq, we, oy * sh, ox, two, 16, ox, 16, 2, OB);
                    if (ox < ow) {
                        float part[GC_OB][32];
                        float *tmp[GC_OB];
                        for (int o = 0; o < GC_OB; o++) tmp[o] = part[o];
                        if (ow - ox > 16)
                            gc_block16(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, ox, two, 16, 0, 16, 2,
                                       OB);
                        else
                            gc_block16(pad, wrow, bv, tmp, cg, kh, kw, plane, wq, we, oy * sh, ox, two, 16, 0, 16, 1,
                                       OB);
                        for (int o = 0; o < OB && ob + o < og; o++)
                            memcpy(dst[o] + ox, part[o], (size_t)(ow - ox) * sizeof(float));
                    }
                    continue;
                }
                for (; ox + 8 * GC_U <= ow; ox += 8 * GC_U)
                    gc_block(pad, wrow, bv, dst, cg, kh, kw, plane, wq, we, oy * sh, ox, two, 8, ox, 8, GC_U, OB);
                for (; ox + 8 <= ow; ox += 8)
                    gc_block(pad, wrow, bv, dst, cg, kh, kw, plane, wq, we, oy * sh, ox, two, 8, ox, 8, 1, OB);
                if (ox < ow) /* the row's last 8 outputs again (ow >= 8): the same sums, stored twice */
                    gc_block(pad, wrow, bv, dst, cg, kh, kw, plane, wq, we, oy * sh, ow - 8, two, 8, ow - 8, 8, 1, OB);
            }
        }
        epi_span(&es, yg, og * oh * ow);
    }
    epi_flush(&es);
}

static RLX_CLONES void group_conv_units(const float *x, const float *w, const float *bias, float *y, float *pad,
                                        int64_t u0, int64_t u1, int64_t groups, int64_t cg, int64_t og, int64_t h,
                                        int64_t wd, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                                        int64_t pl, int64_t oh, int64_t ow, const rlx_epilogue *epi, int64_t t) {
    if (og >= 8) /* blocks of 8 output channels, else of 4: a constant for each instance */
        group_conv_units_ob(x, w, bias, y, pad, u0, u1, groups, cg, og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, epi, t,
                            8);
    else
        group_conv_units_ob(x, w, bias, y, pad, u0, u1, groups, cg, og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, epi, t,
                            4);
}

/* x: N images of groups * cg planes H x W; w: (groups * og, cg, kh, kw); bias: NULL or
 * groups * og floats; y: N images of groups * og planes oh x ow; scratch: `threads` blocks
 * of rlx_group_conv_scratch(...) floats; epi: NULL or the epilogue applied to each group's
 * outputs as they are done. Work: one (image, group) at a time. */
RLX_API void rlx_group_conv(const float *x, const float *w, const float *bias, float *y, float *scratch, int64_t n,
                            int64_t groups, int64_t cg, int64_t og, int64_t h, int64_t wd, int64_t kh, int64_t kw,
                            int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t threads,
                            const rlx_epilogue *epi) {
    const int64_t per = rlx_group_conv_scratch(cg, kh, kw, sh, sw, oh, ow);
    RLX_ACROSS_TEAM(threads, n * groups, group_conv_units(x, w, bias, y, scratch + t * per, lo, hi, groups, cg, og, h,
                                                          wd, kh, kw, sh, sw, pt, pl, oh, ow, epi, t));
}


/* Grouped convolution with the output channels in the vector lanes (groups of 16, 32, 48
 * ... channels: RegNet's), for planes whose rows the kernel above fills badly: rows of 7
 * or 14 outputs padded to a vector of 8 or 16, and rows at stride 2 split into even and
 * odd columns. Here a vector is 16 output channels of one pixel: per (input channel, tap)
 * one load of the 16 channels' weights (packed by rlx_group_conv_lanes_pack) and one
 * multiply-add per pixel with the pixel's input broadcast, GCL_P pixels of a row at a
 * time (their sums in registers), at any column stride. Sums are stored pixel-major into a
 * tile and copied into the channels' planes. Sums: the bias, then input channel by input
 * channel, tap by tap, as the kernel above. Dilation 1. Against the kernel above, kernel
 * against kernel on the 2-core Zen 5 (BENCHMARKS.md, "Grouped convolutions with the
 * channels in the lanes"): 7x7 planes and 14x14 at stride 2 2-2.4x as fast, 28x28 at
 * stride 2 1.4x, 14x14 to 56x56 at stride 1 1.05-1.15x. */
#define GCL_P 12 /* the most pixels a block sums: 12 sums and the weights in 13 registers */
/* M(1) ... M(12): a switch's cases for an always-inlined kernel whose count is a constant */
#define RLX_CASES_1_TO_12(M) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12)

/* W (groups og, cg, kh, kw) -> per group, per block of 16 output channels, per (input
 * channel, tap): the 16 channels' weights. og a multiple of 16. */
RLX_API void rlx_group_conv_lanes_pack(const float *w, int64_t groups, int64_t og, int64_t cg, int64_t taps,
                                       float *dst) {
    for (int64_t g = 0; g < groups; g++)
        for (int64_t ob = 0; ob < og; ob += 16)
            for (int64_t t = 0; t < cg * taps; t++)
                for (int64_t l = 0; l < 16; l++) *dst++ = w[((g * og + ob + l) * cg) * taps + t];
}

RLX_API int64_t rlx_group_conv_lanes_scratch(int64_t cg, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t oh,
                                             int64_t ow) {
    return cg * ((oh - 1) * sh + kh) * ((ow - 1) * sw + kw) + 16;
}

static inline __attribute__((always_inline)) void gcl_block(const float *wp, const float *bv,
                                                            float *yo, int64_t plane_out, int64_t cg, int64_t kh,
                                                            int64_t kw, int64_t plane, int64_t wl, const float *row0,
                                                            const int P, const int SW, int64_t sw) {
    rlx_v16 acc[GCL_P], b;
    memcpy(&b, bv, sizeof b);
#pragma GCC unroll 12
    for (int p = 0; p < P; p++) acc[p] = b;
    const int64_t step = SW ? SW : sw;
    for (int64_t ic = 0; ic < cg; ic++) {
        const float *rows = row0 + ic * plane;
        for (int64_t ki = 0; ki < kh; ki++) {
            const float *r = rows + ki * wl;
            for (int64_t kj = 0; kj < kw; kj++, wp += 16) {
                rlx_v16 wv;
                memcpy(&wv, wp, sizeof wv);
                const float *src = r + kj;
#pragma GCC unroll 12
                for (int p = 0; p < P; p++) acc[p] += src[p * step] * wv;
            }
        }
    }
    float tile[GCL_P * 16];
#pragma GCC unroll 12
    for (int p = 0; p < P; p++) memcpy(tile + p * 16, &acc[p], sizeof acc[p]);
    for (int l = 0; l < 16; l++) {
        float *dst = yo + l * plane_out;
#pragma GCC unroll 12
        for (int p = 0; p < P; p++) dst[p] = tile[p * 16 + l];
    }
}

static inline __attribute__((always_inline)) void gcl_block_any(const float *wp, const float *bv,
                                                                float *yo, int64_t plane_out, int64_t cg, int64_t kh,
                                                                int64_t kw, int64_t plane, int64_t wl,
                                                                const float *row0, int64_t np, const int SW,
                                                                int64_t sw) {
    switch (np) {
#define RLX_GCL(N)                                                                                                   \
    case N:                                                                                                          \
        gcl_block(wp, bv, yo, plane_out, cg, kh, kw, plane, wl, row0, N, SW, sw);                                    \
        break;
        RLX_CASES_1_TO_12(RLX_GCL)
#undef RLX_GCL
    default:
        break;
    }
}

static inline __attribute__((always_inline)) void gcl_units(const float *x, const float *wpk, const float *bias,
                                                            float *y, float *pad, int64_t u0, int64_t u1,
                                                            int64_t groups, int64_t cg, int64_t og, int64_t h,
                                                            int64_t wd, int64_t kh, int64_t kw, int64_t sh,
                                                            int64_t sw, int64_t pt, int64_t pl, int64_t oh,
                                                            int64_t ow, epi_state *es, const int SW) {
    const int64_t hp = (oh - 1) * sh + kh, wl = (ow - 1) * sw + kw, plane = hp * wl, taps = kh * kw;
    const int64_t nb = (ow + GCL_P - 1) / GCL_P; /* blocks a row, sizes as even as can be */
    float zero[16] = {0};
    for (int64_t unit = u0; unit < u1; unit++) {
        const int64_t img = unit / groups, g = unit % groups;
        gc_pad_group(x + (img * groups + g) * cg * h * wd, pad, cg, h, wd, hp, wl, wl, pt, pl, 0);
        float *yg = y + (img * groups + g) * og * oh * ow;
        for (int64_t ob = 0; ob < og; ob += 16) {
            const float *wp = wpk + (g * og + ob) * cg * taps;
            const float *bv = bias ? bias + g * og + ob : zero;
            float *yo = yg + ob * oh * ow;
            for (int64_t oy = 0; oy < oh; oy++) {
                const float *row0 = pad + oy * sh * wl;
                for (int64_t b = 0, ox = 0; b < nb; b++) {
                    const int64_t np = (ow - ox) / (nb - b) + ((ow - ox) % (nb - b) != 0);
                    if (np == GCL_P)
                        gcl_block(wp, bv, yo + oy * ow + ox, oh * ow, cg, kh, kw, plane, wl, row0 + ox * sw,
                                  GCL_P, SW, sw);
                    else
                        gcl_block_any(wp, bv, yo + oy * ow + ox, oh * ow, cg, kh, kw, plane, wl, row0 + ox * sw,
                                      np, SW, sw);
                    ox += np;
                }
            }
        }
        epi_span(es, yg, og * oh * ow);
    }
}

static RLX_CLONES void group_conv_lanes_units(const float *x, const float *wpk, const float *bias, float *y,
                                              float *pad, int64_t u0, int64_t u1, int64_t groups, int64_t cg,
                                              int64_t og, int64_t h, int64_t wd, int64_t kh, int64_t kw, int64_t sh,
                                              int64_t sw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                                              const rlx_epilogue *epi, int64_t t) {
    epi_state es;
    epi_begin(&es, epi, t);
    if (sw == 1)
        gcl_units(x, wpk, bias, y, pad, u0, u1, groups, cg, og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, &es, 1);
    else if (sw == 2)
        gcl_units(x, wpk, bias, y, pad, u0, u1, groups, cg, og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, &es, 2);
    else
        gcl_units(x, wpk, bias, y, pad, u0, u1, groups, cg, og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, &es, 0);
    epi_flush(&es);
}

/* rlx_group_conv's arguments, the weights packed by rlx_group_conv_lanes_pack (og a
 * multiple of 16) and `threads` blocks of rlx_group_conv_lanes_scratch(...) floats. */
RLX_API void rlx_group_conv_lanes(const float *x, const float *wpk, const float *bias, float *y, float *scratch,
                                  int64_t n, int64_t groups, int64_t cg, int64_t og, int64_t h, int64_t wd, int64_t kh,
                                  int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                                  int64_t threads, const rlx_epilogue *epi) {
    const int64_t per = rlx_group_conv_lanes_scratch(cg, kh, kw, sh, sw, oh, ow);
    RLX_ACROSS_TEAM(threads, n * groups, group_conv_lanes_units(x, wpk, bias, y, scratch + t * per, lo, hi, groups, cg,
                                                                og, h, wd, kh, kw, sh, sw, pt, pl, oh, ow, epi, t));
}

/* Depthwise convolution with the channels in the vector lanes: DW_LANES planes at a time are
 * interleaved into a zero-padded scratch (pixel-major, a plane per lane), every output pixel
 * is a DW_LANES-wide multiply-add per tap over DW_PIXELS neighbouring pixels (their
 * accumulators in registers, the tap's weights loaded once for them), and the result is
 * de-interleaved into the planes. Vectorized whatever the plane's width, stride or
 * dilation: the row kernel above vectorizes along a row, which a 7x7 or 14x14 plane (and
 * any stride-2 window) leaves mostly scalar.
 * scratch per thread: depthwise_lanes_scratch(...) floats. */
#define DW_LANES 16
#define DW_PIXELS 4 /* the general vector path below unrolls exactly four */
#define DW_UNIT_PIXELS 8 /* dw_lanes_unit's most: eight accumulators keep both FMA pipes busy */
typedef float dw_vec __attribute__((vector_size(DW_LANES * sizeof(float))));
typedef float dw_uvec __attribute__((vector_size(DW_LANES * sizeof(float)), aligned(4)));

static int64_t dw_lanes_floats(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh,
                               int64_t ow) {
    int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    /* padded planes (+ DW_UNIT_PIXELS * sw pixels of slack: the last pixel group of a row
     * reads past its row), the interleaved result (+ DW_UNIT_PIXELS pixels: it writes past) */
    return (hp * wp + DW_UNIT_PIXELS * sw + 1) * DW_LANES + (oh * ow + DW_UNIT_PIXELS) * DW_LANES;
}

/* The filters and bias of c channels (wt: c x taps; bias: c floats or NULL) for the lanes
 * kernel: per block of DW_LANES channels, taps vectors of one weight per lane, then the
 * bias vector, 0 in the lanes past c. Packed once by the plan (again by set_param): the
 * kernel gathered them per call, 13% of a 1152x7x7 5x5 convolution's time. */
RLX_API int64_t rlx_depthwise_lanes_pack_size(int64_t c, int64_t taps) {
    return (c + DW_LANES - 1) / DW_LANES * (taps + 1) * DW_LANES;
}
RLX_API void rlx_depthwise_lanes_pack(const float *wt, const float *bias, int64_t c, int64_t taps, float *dest) {
    for (int64_t c0 = 0; c0 < c; c0 += DW_LANES) {
        float *blk = dest + c0 / DW_LANES * (taps + 1) * DW_LANES;
        for (int64_t t = 0; t <= taps; t++)
            for (int64_t l = 0; l < DW_LANES; l++) {
                const int64_t ch = c0 + l;
                float v = 0.0f;
                if (ch < c) v = t < taps ? wt[ch * taps + t] : (bias ? bias[ch] : 0.0f);
                blk[t * DW_LANES + l] = v;
            }
    }
}

RLX_API int64_t rlx_depthwise_lanes_scratch(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                                            int64_t oh, int64_t ow) {
    return dw_lanes_floats(kh, kw, sh, sw, dh, dw, oh, ow);
}

/* r[i] becomes column i of the 16 x 16 matrix whose rows were r[0..15]: four rounds of
 * interleaving rows i and i + 8 (a perfect shuffle, 64 two-vector shuffles in all: one
 * vpermt2ps each on AVX-512), instead of 256 scalar moves. */
#if defined(__clang__)
#define RLX_SHUFFLE_LO(a, b) __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define RLX_SHUFFLE_HI(a, b) __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)
#else
#define RLX_SHUFFLE_LO(a, b) \
    __builtin_shuffle(a, b, (rlx_i16){0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23})
#define RLX_SHUFFLE_HI(a, b) \
    __builtin_shuffle(a, b, (rlx_i16){8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31})
#endif
static inline __attribute__((always_inline)) void transpose16(rlx_v16 *r) {
    for (int round = 0; round < 4; round++) {
        rlx_v16 n[16];
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++) {
            n[2 * i] = RLX_SHUFFLE_LO(r[i], r[i + 8]);
            n[2 * i + 1] = RLX_SHUFFLE_HI(r[i], r[i + 8]);
        }
        memcpy(r, n, sizeof n);
    }
}

/* The pixel loop of the lanes kernel for a KH x KW window (constants: 3 or 5) at column
 * stride SW (1 or 2) and no dilation: the DW_UNIT_PIXELS pixels of a group read, for each
 * row of the window, KW + SW (P - 1) neighbouring input pixels, each loaded once into a
 * register and used by every (pixel, tap) pair that reads it (12 loads a row of a 5x5
 * window at stride 1 and P = 8, not 40): the loop was load-bound. P = 4 to 8 pixels where
 * the registers hold them (AVX-512's 32; dw_group_pixels), else 4: each pixel's sum is a
 * chain of dependent multiply-adds (4 cycles each, two issued a cycle), so four chains left
 * half the issue slots empty (5x5 over 240x14x14, one core: 44 -> 28 µs).
 * Same products in the same order as the general loop, so the same results. */
static inline __attribute__((always_inline)) void dw_lanes_unit(const float *pad, const float *filt, dw_vec b,
                                                                float *res, const int KH, const int KW, const int SW,
                                                                const int P, int64_t sh, int64_t dh, int64_t wp,
                                                                int64_t oh, int64_t ow) {
    for (int64_t oy = 0; oy < oh; oy++) {
        for (int64_t ox0 = 0; ox0 < ow; ox0 += P) {
            float *dst = res + (oy * ow + ox0) * DW_LANES;
            dw_vec a[DW_UNIT_PIXELS];
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) a[p] = b;
#pragma GCC unroll 5
            for (int i = 0; i < KH; i++) {
                const float *row = pad + ((oy * sh + i * dh) * wp + ox0 * SW) * DW_LANES;
                dw_vec v[5 + 2 * (DW_UNIT_PIXELS - 1)];
#pragma GCC unroll 19
                for (int q = 0; q < KW + SW * (P - 1); q++) v[q] = *(const dw_uvec *)(row + q * DW_LANES);
#pragma GCC unroll 5
                for (int j = 0; j < KW; j++) {
                    const dw_vec f = *(const dw_uvec *)(filt + (i * KW + j) * DW_LANES);
#pragma GCC unroll 8
                    for (int p = 0; p < P; p++) a[p] += f * v[j + p * SW];
                }
            }
            /* every pixel stored, those past the row's end too (into the next row's first
             * pixels, written again by its own group, or the slack after the last row):
             * stores under `p < n` let GCC sink each pixel's whole sum into its branch, one
             * chain of dependent multiply-adds after another, too long for the out-of-order
             * window to overlap (1152x7x7 5x5, one core: 47 -> 34 µs; 240x28x28 5x5 0.71x) */
#pragma GCC unroll 8
            for (int p = 0; p < P; p++) *(dw_uvec *)(dst + p * DW_LANES) = a[p];
        }
    }
}

/* dw_lanes_unit off AVX-512: the same loop on each half of the lanes in turn (8 floats,
 * one AVX2 register), so a group's inputs, sums and filter fit AVX2's 16 registers (in
 * 16-float vectors they took 22, and the loop ran through the stack). Same products in
 * the same order, so the same results. */
static inline __attribute__((always_inline)) void dw_lanes_unit8(const float *pad, const float *filt,
                                                                 const float *bias, float *res, const int KH,
                                                                 const int KW, const int SW, const int P, int64_t sh,
                                                                 int64_t dh, int64_t wp, int64_t oh, int64_t ow) {
    for (int64_t oy = 0; oy < oh; oy++) {
        for (int64_t ox0 = 0; ox0 < ow; ox0 += P) {
#pragma GCC unroll 2
            for (int h = 0; h < DW_LANES; h += 8) {
                float *dst = res + (oy * ow + ox0) * DW_LANES + h;
                rlx_v8 a[DW_UNIT_PIXELS];
                const rlx_v8 b = ld8(bias + h);
#pragma GCC unroll 8
                for (int p = 0; p < P; p++) a[p] = b;
#pragma GCC unroll 5
                for (int i = 0; i < KH; i++) {
                    const float *row = pad + ((oy * sh + i * dh) * wp + ox0 * SW) * DW_LANES + h;
                    rlx_v8 v[5 + 2 * (DW_UNIT_PIXELS - 1)];
#pragma GCC unroll 19
                    for (int q = 0; q < KW + SW * (P - 1); q++) v[q] = ld8(row + q * DW_LANES);
#pragma GCC unroll 5
                    for (int j = 0; j < KW; j++) {
                        const rlx_v8 f = ld8(filt + (i * KW + j) * DW_LANES + h);
#pragma GCC unroll 8
                        for (int p = 0; p < P; p++) a[p] += f * v[j + p * SW];
                    }
                }
#pragma GCC unroll 8
                for (int p = 0; p < P; p++) memcpy(dst + p * DW_LANES, &a[p], sizeof a[p]);
            }
        }
    }
}

/* The pixels a group of the lanes kernel takes on rows of ow outputs: with AVX-512's 32
 * registers, whichever of 8 down to 4 computes the fewest pixels past the row's end (the
 * most pixels on a tie), else 0 (dw_lanes_unit8: 4 pixels, half the lanes at a time). Why
 * not 8 always: each pixel's sum is a chain of
 * dependent multiply-adds, and a group of 8 over a 7-wide row computes 8 (or 4 + 4) for 7;
 * 7x7, 14x14 and 28x28 planes (every 224-input ImageNet net's) take groups of 7 with none
 * wasted (1152x7x7 5x5, one core, kernel against kernel: 51 -> 47 µs). */
static int dw_group_pixels(int64_t ow, int wide) {
    if (!wide) return 0; /* dw_lanes_unit8's four pixels, half the lanes at a time */
    int best = 8;
    int64_t best_work = (ow + 7) / 8 * 8;
    for (int p = 7; p >= 4; p--) {
        const int64_t work = (ow + p - 1) / p * p;
        if (work < best_work) best = p, best_work = work;
    }
    return best;
}

/* dw_lanes_unit for a window (3x3 or 5x5, stride 1 or 2) in groups of P pixels
 * (dw_group_pixels). */
static inline __attribute__((always_inline)) void dw_lanes_units(const float *pad, const float *filt, dw_vec b,
                                                                 float *res, const int K, const int SW, int P,
                                                                 int64_t sh, int64_t dh, int64_t wp, int64_t oh,
                                                                 int64_t ow) {
    if (P == 0) { /* off AVX-512: four pixels, half the lanes at a time */
        dw_lanes_unit8(pad, filt, filt + K * K * DW_LANES, res, K, K, SW, 4, sh, dh, wp, oh, ow);
        return;
    }
    switch (P) {
    case 8: dw_lanes_unit(pad, filt, b, res, K, K, SW, 8, sh, dh, wp, oh, ow); break;
    case 7: dw_lanes_unit(pad, filt, b, res, K, K, SW, 7, sh, dh, wp, oh, ow); break;
    case 6: dw_lanes_unit(pad, filt, b, res, K, K, SW, 6, sh, dh, wp, oh, ow); break;
    case 5: dw_lanes_unit(pad, filt, b, res, K, K, SW, 5, sh, dh, wp, oh, ow); break;
    default: dw_lanes_unit(pad, filt, b, res, K, K, SW, 4, sh, dh, wp, oh, ow); break;
    }
}

/* The lanes kernel's pixels: oh x ow outputs of one block of DW_LANES channels into res
 * (pixel-major, DW_LANES floats a pixel), from pad (the block's zero-padded input, wp
 * pixels a row, pixel-major) and filt (the block's packed taps, then its bias): the
 * unrolled groups for 3x3 and 5x5 windows without dilation, else the general loop. */
static inline __attribute__((always_inline)) void dw_lanes_compute(const float *pad, const float *filt, float *res,
                                                                   int group, int64_t taps, int64_t kh, int64_t kw,
                                                                   int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                                                                   int64_t wp, int64_t oh, int64_t ow) {
    const dw_vec bias_v = *(const dw_uvec *)(filt + taps * DW_LANES);
    /* 3x3 at stride 1: 0.83-0.87x the general loop's time; at stride 2, 0.92-0.94x */
    if (dw == 1 && kh == 3 && kw == 3 && sw == 1) {
        dw_lanes_units(pad, filt, bias_v, res, 3, 1, group, sh, dh, wp, oh, ow);
    } else if (dw == 1 && kh == 3 && kw == 3 && sw == 2) {
        dw_lanes_units(pad, filt, bias_v, res, 3, 2, group, sh, dh, wp, oh, ow);
    } else if (dw == 1 && kh == 5 && kw == 5 && sw == 1) {
        dw_lanes_units(pad, filt, bias_v, res, 5, 1, group, sh, dh, wp, oh, ow);
    } else if (dw == 1 && kh == 5 && kw == 5 && sw == 2) {
        dw_lanes_units(pad, filt, bias_v, res, 5, 2, group, sh, dh, wp, oh, ow);
    } else if (!group) { /* any window, stride and dilation, off AVX-512: half the lanes at a time */
        const int64_t step = sw * DW_LANES;
        for (int64_t oy = 0; oy < oh; oy++) {
            for (int64_t ox0 = 0; ox0 < ow; ox0 += DW_PIXELS) {
                const int64_t n = ow - ox0 < DW_PIXELS ? ow - ox0 : DW_PIXELS;
                for (int h = 0; h < DW_LANES; h += 8) {
                    float *dst = res + (oy * ow + ox0) * DW_LANES + h;
                    const rlx_v8 b = ld8(filt + taps * DW_LANES + h);
                    rlx_v8 a0 = b, a1 = b, a2 = b, a3 = b;
                    for (int64_t i = 0; i < kh; i++) {
                        const float *row = pad + ((oy * sh + i * dh) * wp + ox0 * sw) * DW_LANES + h;
                        for (int64_t j = 0; j < kw; j++) {
                            const rlx_v8 f = ld8(filt + (i * kw + j) * DW_LANES + h);
                            const float *q = row + j * dw * DW_LANES;
                            a0 += f * ld8(q);
                            a1 += f * ld8(q + step);
                            a2 += f * ld8(q + 2 * step);
                            a3 += f * ld8(q + 3 * step);
                        }
                    }
                    memcpy(dst, &a0, sizeof a0);
                    if (n > 1) memcpy(dst + DW_LANES, &a1, sizeof a1);
                    if (n > 2) memcpy(dst + 2 * DW_LANES, &a2, sizeof a2);
                    if (n > 3) memcpy(dst + 3 * DW_LANES, &a3, sizeof a3);
                }
            }
        }
    } else { /* any window, stride and dilation */
        for (int64_t oy = 0; oy < oh; oy++) {
            for (int64_t ox0 = 0; ox0 < ow; ox0 += DW_PIXELS) {
                const int64_t n = ow - ox0 < DW_PIXELS ? ow - ox0 : DW_PIXELS;
                float *dst = res + (oy * ow + ox0) * DW_LANES;
                /* GCC/Clang vector types: four accumulators of DW_LANES floats stay in
                 * registers (one zmm each on AVX-512, two ymm on AVX2). */
                const dw_vec b = bias_v;
                dw_vec a0 = b, a1 = b, a2 = b, a3 = b;
                const int64_t step = sw * DW_LANES;
                for (int64_t i = 0; i < kh; i++) {
                    const float *row = pad + ((oy * sh + i * dh) * wp + ox0 * sw) * DW_LANES;
                    for (int64_t j = 0; j < kw; j++) {
                        const dw_vec f = *(const dw_uvec *)(filt + (i * kw + j) * DW_LANES);
                        const float *s = row + j * dw * DW_LANES;
                        a0 += f * *(const dw_uvec *)s;
                        a1 += f * *(const dw_uvec *)(s + step);
                        a2 += f * *(const dw_uvec *)(s + 2 * step);
                        a3 += f * *(const dw_uvec *)(s + 3 * step);
                    }
                }
                *(dw_uvec *)dst = a0;
                if (n > 1) *(dw_uvec *)(dst + DW_LANES) = a1;
                if (n > 2) *(dw_uvec *)(dst + 2 * DW_LANES) = a2;
                if (n > 3) *(dw_uvec *)(dst + 3 * DW_LANES) = a3;
            }
        }
    }
}

static RLX_CLONES void depthwise_lane_blocks(const float *x, const float *wpk, float *y, float *scratch,
                                             int64_t b0, int64_t b1, int64_t c, int64_t h, int64_t w, int64_t kh,
                                             int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
                                             int64_t pl, int64_t oh, int64_t ow, const rlx_epilogue *epi,
                                             int64_t t) {
    const int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
    const int64_t per_image = (c + DW_LANES - 1) / DW_LANES, taps = kh * kw, opix = oh * ow;
    float *pad = scratch, *res = pad + (hp * wp + DW_UNIT_PIXELS * sw + 1) * DW_LANES;
    memset(pad + hp * wp * DW_LANES, 0, (size_t)(DW_UNIT_PIXELS * sw + 1) * DW_LANES * sizeof(float));
    const int group = dw_group_pixels(ow, rlx_gemm_avx512() != 0);
    /* a clamp (ReLU, ReLU6) applied as the results go back to their planes, in registers:
     * not a pass of the epilogue's program over the block after */
    const float *cl = epi_clamp(epi);
    epi_state es;
    epi_begin(&es, cl ? NULL : epi, t);
    for (int64_t blk = b0; blk < b1; blk++) {
        const int64_t img = blk / per_image, c0 = (blk % per_image) * DW_LANES;
        const int64_t lanes = c - c0 < DW_LANES ? c - c0 : DW_LANES;
        const float *xb = x + (img * c + c0) * h * w;
        float *yb = y + (img * c + c0) * opix;
        const float *filt = wpk + c0 / DW_LANES * (taps + 1) * DW_LANES;
        /* zeros only where no input lands (a whole-plane memset cost as much as the
         * convolution on 112x112 planes), then the planes interleaved pixel by pixel:
         * 16 sequential reads, one contiguous 64-byte write */
        const int64_t y0 = pt < hp ? pt : hp, y1 = pt + h < hp ? pt + h : hp;
        const int64_t x0 = pl < wp ? pl : wp, x1 = pl + w < wp ? pl + w : wp;
        const size_t lane_px = DW_LANES * sizeof(float);
        memset(pad, 0, (size_t)(y0 * wp) * lane_px);
        if (y1 < hp) memset(pad + y1 * wp * DW_LANES, 0, (size_t)((hp - y1) * wp) * lane_px);
        /* a whole plane inside the padded one (no input row or column cut off): 16 pixels
         * at a time, flat across rows, through one 16 x 16 transpose */
        int64_t flat = lanes == DW_LANES && y1 - y0 == h && x1 - x0 == w ? h * w / 16 * 16 : 0;
        for (int64_t f = 0, fy = 0, fx = 0; f < flat; f += 16) {
            rlx_v16 r[16];
            for (int l = 0; l < DW_LANES; l++) memcpy(&r[l], xb + l * h * w + f, sizeof r[l]);
            transpose16(r);
            for (int i = 0; i < 16; i++) {
                memcpy(pad + ((fy + pt) * wp + fx + pl) * DW_LANES, &r[i], sizeof r[i]);
                if (++fx == w) fx = 0, fy++;
            }
        }
        for (int64_t yy = y0; yy < y1; yy++) {
            float *prow = pad + yy * wp * DW_LANES;
            if (x0 > 0) memset(prow, 0, (size_t)x0 * lane_px);
            if (x1 < wp) memset(prow + x1 * DW_LANES, 0, (size_t)(wp - x1) * lane_px);
            if (lanes == DW_LANES) {
                const float *src[DW_LANES];
                for (int l = 0; l < DW_LANES; l++) src[l] = xb + l * h * w + (yy - pt) * w - pl;
                for (int64_t xx = x0; xx < x1; xx++) {
                    if ((yy - y0) * w + (xx - x0) < flat) continue; /* transposed above */
                    for (int l = 0; l < DW_LANES; l++) prow[xx * DW_LANES + l] = src[l][xx];
                }
            } else {
                for (int64_t xx = x0; xx < x1; xx++)
                    for (int64_t l = lanes; l < DW_LANES; l++) prow[xx * DW_LANES + l] = 0.0f;
                for (int64_t l = 0; l < lanes; l++) {
                    const float *src = xb + l * h * w + (yy - pt) * w - pl;
                    for (int64_t xx = x0; xx < x1; xx++) prow[xx * DW_LANES + l] = src[xx];
                }
            }
        }
        dw_lanes_compute(pad, filt, res, group, taps, kh, kw, sh, sw, dh, dw, wp, oh, ow);
        int64_t p0 = 0;
        if (lanes == DW_LANES) /* back to planes, 16 pixels at a time through one transpose */
            for (; p0 + 16 <= opix; p0 += 16) {
                rlx_v16 r[16];
                memcpy(r, res + p0 * DW_LANES, sizeof r);
                transpose16(r);
                for (int l = 0; l < DW_LANES; l++) {
                    if (cl) r[l] = clamp16(r[l], cl);
                    memcpy(yb + l * opix + p0, &r[l], sizeof r[l]);
                }
            }
        for (int64_t l = 0; l < lanes; l++) {
            float *plane = yb + l * opix;
            for (int64_t p = p0; p < opix; p++) plane[p] = res[p * DW_LANES + l];
            if (cl && p0 < opix) clamp_row(plane + p0, opix - p0, cl);
        }
        epi_span(&es, yb, lanes * opix);
    }
    epi_flush(&es);
}

/* x: N*C planes H x W; wpk: the C filters (kh x kw) and bias packed by
 * rlx_depthwise_lanes_pack; y: N*C planes oh x ow; scratch: `threads` blocks of
 * rlx_depthwise_lanes_scratch(...) floats; epi: NULL or the epilogue applied to
 * each block of planes as it is done. */
RLX_API void rlx_depthwise_lanes(const float *x, const float *wpk, float *y, float *scratch,
                                 int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
                                 int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                                 int64_t threads, const rlx_epilogue *epi) {
    const int64_t blocks = n * ((c + DW_LANES - 1) / DW_LANES);
    const int64_t per_thread = dw_lanes_floats(kh, kw, sh, sw, dh, dw, oh, ow);
    RLX_ACROSS_TEAM(threads, blocks, depthwise_lane_blocks(x, wpk, y, scratch + t * per_thread, lo, hi, c, h, w,
                                                           kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, epi, t));
}

/* ------------------------------------------------ depthwise convolution, channels-last
 * The lanes kernel on NHWC values, for the channels-last chains layout.py plans without
 * oneDNN (MobileNet's and EfficientNet's inverted residuals: expansion, depthwise and
 * projection all NHWC, no transpose between them). A unit is a band of output rows of one
 * image. For each group of up to DWN_GROUP blocks of DW_LANES channels, the band's input
 * rows are gathered into one zero-padded pixel-major scratch per block, the layout
 * rlx_depthwise_lanes builds by transposing 16 planes: here each pixel's channels of the
 * group are one sequential read (gathering a single block at a time read one 64-byte line
 * of every pixel, a stride the prefetchers did not follow: over half the kernel's time on
 * 48 x 112 x 112 at stride 2). Each block is computed there (dw_lanes_compute), the group's
 * results copied out pixel by pixel, and then the epilogue runs over the band, one
 * contiguous run of whole rows. */
#define DWN_GROUP 8
#define DWN_PAD_BYTES (192 * 1024) /* a band's gathered input: L2-resident with the outputs */

/* Output rows a band holds: as many as keep its gathered input (one group) within
 * DWN_PAD_BYTES. */
static int64_t dwn_band(int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
                        int64_t oh, int64_t ow) {
    const int64_t blocks = (c + DW_LANES - 1) / DW_LANES, group = blocks < DWN_GROUP ? blocks : DWN_GROUP;
    const int64_t wp = (ow - 1) * sw + (kw - 1) * dw + 1, reach = (kh - 1) * dh + 1;
    const int64_t in_rows = DWN_PAD_BYTES / (wp * group * DW_LANES * (int64_t)sizeof(float));
    const int64_t band = in_rows <= reach ? 1 : (in_rows - reach) / sh + 1;
    return band < 1 ? 1 : band > oh ? oh : band;
}

/* Parts the channels of a band are split into: 1 where the images' bands give the team
 * two units a thread, else enough for that (at most one a block). Why not thinner bands:
 * a 7x7 plane in bands of two rows gathered a 5x5 window's six input rows for every two
 * output rows, and two threads took longer than one (1152 x 7 x 7: 39 us against 34). */
static int64_t dwn_splits(int64_t n, int64_t c, int64_t oh, int64_t band, int64_t threads) {
    const int64_t units = n * ((oh + band - 1) / band), want = threads > 1 ? 2 * threads : 1;
    const int64_t blocks = (c + DW_LANES - 1) / DW_LANES;
    if (units >= want) return 1;
    const int64_t splits = (want + units - 1) / units;
    return splits < blocks ? splits : blocks;
}

/* lanes floats from s to d, the rest of d's DW_LANES zeros (the block past c). */
static inline void dwn_copy_in(float *d, const float *s, int64_t lanes) {
    if (lanes == DW_LANES) {
        memcpy(d, s, DW_LANES * sizeof(float));
    } else if (lanes == 8) { /* 24, 40, 72, 120 channels: the common partial block */
        memcpy(d, s, 8 * sizeof(float));
        memset(d + 8, 0, 8 * sizeof(float));
    } else {
        memcpy(d, s, (size_t)lanes * sizeof(float));
        memset(d + lanes, 0, (size_t)(DW_LANES - lanes) * sizeof(float));
    }
}

static inline void dwn_copy_out(float *d, const float *s, int64_t lanes) {
    if (lanes == DW_LANES) memcpy(d, s, DW_LANES * sizeof(float));
    else if (lanes == 8) memcpy(d, s, 8 * sizeof(float));
    else memcpy(d, s, (size_t)lanes * sizeof(float));
}

static RLX_CLONES void depthwise_nhwc_bands(const float *x, const float *wpk, float *y, float *scratch, int64_t u0,
                                            int64_t u1, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
                                            int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl,
                                            int64_t oh, int64_t ow, int64_t band, int64_t splits,
                                            const rlx_epilogue *epi, int64_t t) {
    const int64_t bands = (oh + band - 1) / band, taps = kh * kw, blocks = (c + DW_LANES - 1) / DW_LANES;
    const int64_t wp = (ow - 1) * sw + (kw - 1) * dw + 1, hpb = (band - 1) * sh + (kh - 1) * dh + 1;
    const int64_t per_block = dw_lanes_floats(kh, kw, sh, sw, dh, dw, band, ow);
    const int64_t pad_floats = (hpb * wp + DW_UNIT_PIXELS * sw + 1) * DW_LANES; /* then the block's results */
    const int64_t most = blocks < DWN_GROUP ? blocks : DWN_GROUP;
    for (int64_t g = 0; g < most; g++) /* the slack past a band's rows (read by a row's last pixel group) */
        memset(scratch + g * per_block + hpb * wp * DW_LANES, 0,
               (size_t)(pad_floats - hpb * wp * DW_LANES) * sizeof(float));
    const int group = dw_group_pixels(ow, rlx_gemm_avx512() != 0);
    const int64_t x0 = pl < wp ? pl : wp, x1 = pl + w < wp ? pl + w : wp; /* padded columns holding input */
    const size_t lane_px = DW_LANES * sizeof(float);
    epi_state es;
    epi_begin(&es, epi, t);
    for (int64_t u = u0; u < u1; u++) {
        const int64_t part = u % splits, b = u / splits, img = b / bands, oy0 = (b % bands) * band;
        const int64_t rows = oh - oy0 < band ? oh - oy0 : band;
        const int64_t first = blocks * part / splits, last = blocks * (part + 1) / splits; /* its channel blocks */
        const int64_t hp = (rows - 1) * sh + (kh - 1) * dh + 1, iy0 = oy0 * sh - pt;
        const float *xi = x + img * h * w * c;
        float *yb = y + (img * oh + oy0) * ow * c;
        for (int64_t b0 = first; b0 < last; b0 += DWN_GROUP) {
            const int64_t nb = last - b0 < DWN_GROUP ? last - b0 : DWN_GROUP, c0 = b0 * DW_LANES;
            const int64_t rest = c - (b0 + nb - 1) * DW_LANES, tail = rest < DW_LANES ? rest : DW_LANES;
            for (int64_t r = 0; r < hp; r++) {
                const int64_t iy = iy0 + r, inside = iy >= 0 && iy < h;
                for (int64_t k = 0; k < nb; k++) { /* zeros where no input lands: a row outside, or its borders */
                    float *prow = scratch + k * per_block + r * wp * DW_LANES;
                    if (!inside) memset(prow, 0, (size_t)wp * lane_px);
                    if (inside && x0 > 0) memset(prow, 0, (size_t)x0 * lane_px);
                    if (inside && x1 < wp) memset(prow + x1 * DW_LANES, 0, (size_t)(wp - x1) * lane_px);
                }
                if (!inside) continue;
                const float *src = xi + iy * w * c + c0;
                float *prow = scratch + r * wp * DW_LANES;
                for (int64_t xx = x0; xx < x1; xx++) {
                    const float *s = src + (xx - pl) * c;
                    float *d = prow + xx * DW_LANES;
                    for (int64_t k = 0; k + 1 < nb; k++) memcpy(d + k * per_block, s + k * DW_LANES, lane_px);
                    dwn_copy_in(d + (nb - 1) * per_block, s + (nb - 1) * DW_LANES, tail);
                }
            }
            for (int64_t k = 0; k < nb; k++)
                dw_lanes_compute(scratch + k * per_block, wpk + (b0 + k) * (taps + 1) * DW_LANES,
                                 scratch + k * per_block + pad_floats, group, taps, kh, kw, sh, sw, dh, dw, wp, rows,
                                 ow);
            const float *res = scratch + pad_floats;
            for (int64_t p = 0; p < rows * ow; p++) {
                float *d = yb + p * c + c0;
                for (int64_t k = 0; k + 1 < nb; k++)
                    memcpy(d + k * DW_LANES, res + k * per_block + p * DW_LANES, lane_px);
                dwn_copy_out(d + (nb - 1) * DW_LANES, res + (nb - 1) * per_block + p * DW_LANES, tail);
            }
        }
        if (splits == 1) {
            epi_span(&es, yb, rows * ow * c); /* whole rows: one run */
        } else {
            const int64_t c0 = first * DW_LANES, c1 = last * DW_LANES < c ? last * DW_LANES : c;
            for (int64_t p = 0; p < rows * ow; p++) epi_span(&es, yb + p * c + c0, c1 - c0);
        }
    }
    epi_flush(&es);
}

/* Floats of rlx_depthwise_nhwc's scratch for each of its threads: a padded band and a band
 * of results for each block of a group. */
RLX_API int64_t rlx_depthwise_nhwc_scratch(int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                                           int64_t dw, int64_t oh, int64_t ow) {
    const int64_t blocks = (c + DW_LANES - 1) / DW_LANES, group = blocks < DWN_GROUP ? blocks : DWN_GROUP;
    return group * dw_lanes_floats(kh, kw, sh, sw, dh, dw, dwn_band(c, kh, kw, sh, sw, dh, dw, oh, ow), ow);
}

/* x: N images H x W x C; wpk: the C filters (kh x kw) and bias packed by
 * rlx_depthwise_lanes_pack; y: N images oh x ow x C; scratch: `threads` blocks of
 * rlx_depthwise_nhwc_scratch(...) floats; epi: NULL or the epilogue, applied to each band
 * of rows (or its part of the channels) as it is done. */
RLX_API void rlx_depthwise_nhwc(const float *x, const float *wpk, float *y, float *scratch, int64_t n, int64_t c,
                                int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                                int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t threads,
                                const rlx_epilogue *epi) {
    const int64_t band = dwn_band(c, kh, kw, sh, sw, dh, dw, oh, ow), splits = dwn_splits(n, c, oh, band, threads);
    const int64_t units = n * ((oh + band - 1) / band) * splits;
    const int64_t per_thread = rlx_depthwise_nhwc_scratch(c, kh, kw, sh, sw, dh, dw, oh, ow);
    RLX_ACROSS_TEAM(threads, units, depthwise_nhwc_bands(x, wpk, y, scratch + t * per_thread, lo, hi, c, h, w, kh, kw,
                                                         sh, sw, dh, dw, pt, pl, oh, ow, band, splits, epi, t));
}

/* One output row of a pool whose windows are kw adjacent columns (sw 1 or 2): the kh input
 * rows combined elementwise first (contiguous: vectorized), then each window's kw columns
 * of that combined row, POOL_CHUNK outputs at a time through `v`. The plain loop below
 * reads every tap with a stride and ran the stem's 3x3 stride-2 max pool of resnet18 at
 * ~1 ns an output per plane. */
#define POOL_CHUNK 256
#define POOL_FLAT 4096 /* floats of a plane pool_planes takes flat (two such arrays on the stack) */
static inline __attribute__((always_inline)) void pool_row_taps(const float *restrict v, float *restrict dst,
                                                                int64_t n, int64_t kw, int64_t sw, int64_t is_max,
                                                                float inv) {
    if (is_max && kw == 3) { /* the 3-wide max pools (resnet's, squeezenet's): one pass, not three */
        for (int64_t ox = 0; ox < n; ox++) dst[ox] = rx_max3(v[ox * sw], v[ox * sw + 1], v[ox * sw + 2]);
    } else if (is_max) {
        for (int64_t ox = 0; ox < n; ox++) dst[ox] = v[ox * sw];
        for (int64_t kj = 1; kj < kw; kj++)
            for (int64_t ox = 0; ox < n; ox++) dst[ox] = rx_max(dst[ox], v[ox * sw + kj]);
    } else {
        for (int64_t ox = 0; ox < n; ox++) dst[ox] = v[ox * sw];
        for (int64_t kj = 1; kj < kw; kj++)
            for (int64_t ox = 0; ox < n; ox++) dst[ox] += v[ox * sw + kj];
        for (int64_t ox = 0; ox < n; ox++) dst[ox] *= inv;
    }
}

static RLX_CLONES void pool_row(const float *src, int64_t w, int64_t kh, int64_t dh, float *dst, int64_t ow,
                                int64_t kw, int64_t sw, int64_t is_max, float inv, float *v) {
    for (int64_t o0 = 0; o0 < ow; o0 += POOL_CHUNK) {
        int64_t n = ow - o0 < POOL_CHUNK ? ow - o0 : POOL_CHUNK;
        int64_t c0 = o0 * sw, cols = (n - 1) * sw + kw;
        const float *r = src + c0;
        int64_t k = 1;
        if (is_max && kh == 3) { /* three rows in one pass */
            const float *r1 = r + dh * w, *r2 = r + 2 * dh * w;
            for (int64_t c = 0; c < cols; c++) v[c] = rx_max3(r[c], r1[c], r2[c]);
            k = kh;
        } else {
            for (int64_t c = 0; c < cols; c++) v[c] = r[c];
        }
        for (int64_t ki = k; ki < kh; ki++) {
            const float *rk = r + ki * dh * w;
            if (is_max)
                for (int64_t c = 0; c < cols; c++) v[c] = rx_max(v[c], rk[c]);
            else
                for (int64_t c = 0; c < cols; c++) v[c] += rk[c];
        }
        if (sw == 1)
            pool_row_taps(v, dst + o0, n, kw, 1, is_max, inv);
        else
            pool_row_taps(v, dst + o0, n, kw, 2, is_max, inv);
    }
}

/* Max or average over kh x kw windows (stride sh, sw; dilation dh, dw) of `planes` planes
 * H x W, every window inside the plane (no padding): y is planes x oh x ow. The average
 * divides by kh * kw; the max propagates NaN like numpy's maximum. */
static RLX_CLONES void pool_planes(const float *x, float *y, int64_t p0, int64_t p1, int64_t h, int64_t w, int64_t kh,
                                   int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow,
                                   int64_t is_max) {
    float inv = 1.0f / (float)(kh * kw);
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2 && dh == 1 && dw == 1) { /* the common 2x2 pool, one pass */
        for (int64_t p = p0; p < p1; p++)
            for (int64_t oy = 0; oy < oh; oy++) {
                const float *r0 = x + p * h * w + 2 * oy * w, *r1 = r0 + w;
                float *dst = y + p * oh * ow + oy * ow;
                if (is_max)
                    for (int64_t ox = 0; ox < ow; ox++) {
                        float a = rx_max(r0[2 * ox], r0[2 * ox + 1]), c = rx_max(r1[2 * ox], r1[2 * ox + 1]);
                        dst[ox] = rx_max(a, c);
                    }
                else
                    for (int64_t ox = 0; ox < ow; ox++)
                        dst[ox] = ((r0[2 * ox] + r0[2 * ox + 1]) + (r1[2 * ox] + r1[2 * ox + 1])) * 0.25f;
            }
        return;
    }
    if (kh == 3 && kw == 3 && sh == sw && (sh == 1 || sh == 2) && dh == 1 && dw == 1 && h * w <= POOL_FLAT) {
        /* Small planes (squeezenet's 55x55, 27x27 and 13x13 at stride 2; Inception's
         * average pools over a padded 35x35, 17x17 or 8x8 at stride 1): rows of 6 to 27
         * outputs left most of the work to the loops' scalar ends. Here the plane's
         * three-row maxima (sums) at every position, then the three-column ones of those,
         * each one flat loop over the plane (all in vectors), and each output picked from
         * them: 256x27x27 at stride 2 ran in 0.6x the time. Positions whose windows would
         * cross a row's end are computed and never read. */
        float t[POOL_FLAT], u[POOL_FLAT];
        const int64_t nt = (h - 2) * w, nu = nt - 2;
        for (int64_t p = p0; p < p1; p++) {
            const float *plane = x + p * h * w;
            float *out = y + p * oh * ow;
            if (is_max) {
                for (int64_t i = 0; i < nt; i++) t[i] = rx_max3(plane[i], plane[i + w], plane[i + 2 * w]);
                for (int64_t i = 0; i < nu; i++) u[i] = rx_max3(t[i], t[i + 1], t[i + 2]);
            } else {
                for (int64_t i = 0; i < nt; i++) t[i] = plane[i] + plane[i + w] + plane[i + 2 * w];
                for (int64_t i = 0; i < nu; i++) u[i] = (t[i] + t[i + 1] + t[i + 2]) * inv;
            }
            if (sh == 2) /* (a constant stride: the picks vectorize) */
                for (int64_t oy = 0; oy < oh; oy++)
                    for (int64_t ox = 0; ox < ow; ox++) out[oy * ow + ox] = u[2 * oy * w + 2 * ox];
            else
                for (int64_t oy = 0; oy < oh; oy++) memcpy(out + oy * ow, u + oy * w, (size_t)ow * sizeof(float));
        }
        return;
    }
    if (dw == 1 && (sw == 1 || sw == 2) && kw <= 8) {
        float v[POOL_CHUNK * 2 + 8];
        for (int64_t p = p0; p < p1; p++)
            for (int64_t oy = 0; oy < oh; oy++)
                pool_row(x + p * h * w + oy * sh * w, w, kh, dh, y + p * oh * ow + oy * ow, ow, kw, sw, is_max, inv, v);
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const float *plane = x + p * h * w;
        float *out = y + p * oh * ow;
        for (int64_t oy = 0; oy < oh; oy++) {
            float *dst = out + oy * ow;
            for (int64_t ki = 0; ki < kh; ki++) {
                const float *src = plane + (oy * sh + ki * dh) * w;
                for (int64_t kj = 0; kj < kw; kj++) {
                    const float *s = src + kj * dw;
                    int64_t ox;
                    if (ki == 0 && kj == 0) {
                        for (ox = 0; ox < ow; ox++) dst[ox] = s[ox * sw];
                    } else if (is_max) {
                        for (ox = 0; ox < ow; ox++) dst[ox] = rx_max(dst[ox], s[ox * sw]);
                    } else {
                        for (ox = 0; ox < ow; ox++) dst[ox] += s[ox * sw];
                    }
                }
            }
            if (!is_max)
                for (int64_t ox = 0; ox < ow; ox++) dst[ox] *= inv;
        }
    }
}

RLX_API void rlx_pool2d(const float *x, float *y, int64_t planes, int64_t h, int64_t w, int64_t kh, int64_t kw,
                        int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t oh, int64_t ow, int64_t is_max,
                        int64_t threads) {
    RLX_ACROSS_TEAM(threads, planes, pool_planes(x, y, lo, hi, h, w, kh, kw, sh, sw, dh, dw, oh, ow, is_max));
}

/* A max or average pool whose windows may reach past the plane (padding pt, pl at the top
 * and left, pb, pr at the bottom and right, and ceil_mode's windows past those): each
 * window's taps clipped to the plane, which is what a copy padded with -inf (max) or 0
 * (average) gives, without making that copy (resnet18's stem pool spent as long copying
 * as pooling; Inception-v3's 3x3 average pools at batch 1, 0.9-1.6 ms a run of its
 * 17-19 with their padded copies and count corrections, take 0.19-0.27). A max window with no tap inside gives -inf, as the copy did. An
 * average divides its sum by the window's positions inside the plane, or inside the
 * plane and its declared padding with `include_pad` (ONNX's count_include_pad; ceil_mode's
 * positions past the padding never count). Windows of kw <= 8 adjacent columns, sw 1 or
 * 2, rows dilated by nothing. kind: 0 max, 1 average counting the padding, 2 average
 * counting the plane's positions only. */
static inline __attribute__((always_inline)) float pool_join(float a, float b, const int is_max) {
    return is_max ? rx_max(a, b) : a + b;
}
static inline __attribute__((always_inline)) float pool_join3(float a, float b, float c, const int is_max) {
    return is_max ? rx_max3(a, b, c) : a + b + c;
}

/* The taps of a window starting at s (of k, along an axis of n positions, padding p0 before
 * and p1 after) that count toward an average. */
static int64_t pool_count(int64_t s, int64_t k, int64_t n, int64_t p0, int64_t p1, int64_t include_pad) {
    int64_t lo = include_pad ? -p0 : 0, hi = include_pad ? n + p1 : n;
    int64_t a = s > lo ? s : lo, b = s + k < hi ? s + k : hi;
    return b > a ? b - a : 0;
}

/* One chunk of n outputs of a padded pool's output row: the window's rows ki0 .. ki1 - 1
 * below row r0 of `plane` (w wide), columns from s0 on (`fill` outside the plane),
 * joined into v, then each output's kw taps at stride sw into dst. */
static inline __attribute__((always_inline)) void pool_padded_chunk(const float *plane, float *dst, float *v,
                                                                    int64_t w, int64_t kw, int64_t sw, int64_t r0,
                                                                    int64_t ki0, int64_t ki1, int64_t s0, int64_t n,
                                                                    float fill, const int is_max) {
    const int64_t cols = (n - 1) * sw + kw;
    const int64_t lo = s0 < 0 ? (-s0 < cols ? -s0 : cols) : 0;
    int64_t hi = w - s0 < cols ? w - s0 : cols;
    if (hi < lo) hi = lo;
    for (int64_t q = 0; q < lo; q++) v[q] = fill;
    for (int64_t q = hi; q < cols; q++) v[q] = fill;
    if (ki1 <= ki0) {
        for (int64_t q = lo; q < hi; q++) v[q] = fill;
    } else {
        const float *r = plane + (r0 + ki0) * w + s0;
        int64_t k = ki0 + 1;
        if (ki1 - ki0 >= 3) { /* three rows in one pass */
            const float *ra = r + w, *rb = r + 2 * w;
            for (int64_t q = lo; q < hi; q++) v[q] = pool_join3(r[q], ra[q], rb[q], is_max);
            k = ki0 + 3;
        } else {
            for (int64_t q = lo; q < hi; q++) v[q] = r[q];
        }
        for (int64_t ki = k; ki < ki1; ki++) {
            const float *rk = plane + (r0 + ki) * w + s0;
            for (int64_t q = lo; q < hi; q++) v[q] = pool_join(v[q], rk[q], is_max);
        }
    }
    if (sw == 1)
        pool_row_taps(v, dst, n, kw, 1, is_max, 1.0f);
    else
        pool_row_taps(v, dst, n, kw, 2, is_max, 1.0f);
}

/* 1 / count of an average's outputs o0 .. o0 + n - 1 of a row whose windows count `rows`
 * rows (0 where a window counts nothing). */
static void pool_inverse_counts(float *cinv, int64_t o0, int64_t n, int64_t rows, int64_t kw, int64_t sw, int64_t w,
                                int64_t pl, int64_t pr, int64_t include_pad) {
    for (int64_t j = 0; j < n; j++) {
        const int64_t count = rows * pool_count((o0 + j) * sw - pl, kw, w, pl, pr, include_pad);
        cinv[j] = count ? 1.0f / (float)count : 0.0f;
    }
}

static inline __attribute__((always_inline)) void pool_padded_body(
    const float *x, float *y, int64_t p0, int64_t p1, int64_t h, int64_t w, int64_t kh, int64_t kw, int64_t sh,
    int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t oh, int64_t ow, const int is_max,
    int64_t include_pad) {
    float v[POOL_CHUNK * 2 + 8], cinv[POOL_CHUNK];
    const float fill = is_max ? -__builtin_inff() : 0.0f;
    if (kh == 3 && kw == 3 && sh == 1 && sw == 1 && pt == 1 && pl == 1 && oh == h && ow == w && h >= 2 && w >= 2 &&
        h * w <= POOL_FLAT) {
        /* Inception's branch pool (3x3, stride 1, padding 1) over planes of up to 4096
         * floats, flat: every position's maximum (sum) over its column of three (two at
         * the top and bottom rows), then over its row of three, one loop over the whole
         * plane each (all in vectors), and the first and last column of each row again
         * with their two taps. Row by row, rows of 7 to 28 outputs left most of the work
         * to the loops' scalar ends: 512x14x14 on two threads 63.5 -> 16.8 us. */
        float t[POOL_FLAT];
        const int64_t n = h * w;
        /* an average's divisor: 9 everywhere counting the padding (here pb = pr = 1),
         * else 3 or 2 taps along each axis */
        const float edge = include_pad ? 1.0f / 3.0f : 0.5f, mid = 1.0f / 3.0f;
        for (int64_t p = p0; p < p1; p++) {
            const float *a = x + p * n;
            float *out = y + p * n;
            for (int64_t i = 0; i < w; i++) t[i] = pool_join(a[i], a[i + w], is_max);
            for (int64_t i = w; i < n - w; i++) t[i] = pool_join3(a[i - w], a[i], a[i + w], is_max);
            for (int64_t i = n - w; i < n; i++) t[i] = pool_join(a[i - w], a[i], is_max);
            for (int64_t i = 1; i < n - 1; i++) out[i] = pool_join3(t[i - 1], t[i], t[i + 1], is_max);
            for (int64_t r = 0; r < n; r += w) {
                out[r] = pool_join(t[r], t[r + 1], is_max);
                out[r + w - 1] = pool_join(t[r + w - 2], t[r + w - 1], is_max);
            }
            if (!is_max) {
                if (include_pad) {
                    for (int64_t i = 0; i < n; i++) out[i] *= 1.0f / 9.0f;
                } else {
                    for (int64_t r = 0; r < h; r++) {
                        const float rs = r == 0 || r == h - 1 ? edge : mid;
                        float *o = out + r * w;
                        o[0] *= rs * edge;
                        for (int64_t c = 1; c < w - 1; c++) o[c] *= rs * mid;
                        o[w - 1] *= rs * edge;
                    }
                }
            }
        }
        return;
    }
    for (int64_t p = p0; p < p1; p++) {
        const float *plane = x + p * h * w;
        for (int64_t oy = 0; oy < oh; oy++) {
            const int64_t r0 = oy * sh - pt, ki0 = r0 < 0 ? -r0 : 0, ki1 = h - r0 < kh ? h - r0 : kh;
            float *dst = y + p * oh * ow + oy * ow;
            const int64_t rows = is_max ? 1 : pool_count(r0, kh, h, pt, pb, include_pad);
            for (int64_t o0 = 0; o0 < ow; o0 += POOL_CHUNK) {
                const int64_t n = ow - o0 < POOL_CHUNK ? ow - o0 : POOL_CHUNK;
                pool_padded_chunk(plane, dst + o0, v, w, kw, sw, r0, ki0, ki1, o0 * sw - pl, n, fill, is_max);
                if (!is_max) {
                    pool_inverse_counts(cinv, o0, n, rows, kw, sw, w, pl, pr, include_pad);
                    for (int64_t j = 0; j < n; j++) dst[o0 + j] *= cinv[j];
                }
            }
        }
    }
}

static RLX_CLONES void max_pool_padded_planes(const float *x, float *y, int64_t p0, int64_t p1, int64_t h, int64_t w,
                                              int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
                                              int64_t pb, int64_t pr, int64_t oh, int64_t ow) {
    pool_padded_body(x, y, p0, p1, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, 1, 0);
}

static RLX_CLONES void avg_pool_padded_planes(const float *x, float *y, int64_t p0, int64_t p1, int64_t h, int64_t w,
                                              int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl,
                                              int64_t pb, int64_t pr, int64_t oh, int64_t ow, int64_t include_pad) {
    pool_padded_body(x, y, p0, p1, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, 0, include_pad);
}

RLX_API void rlx_pool2d_padded(const float *x, float *y, int64_t planes, int64_t h, int64_t w, int64_t kh, int64_t kw,
                               int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t oh,
                               int64_t ow, int64_t kind, int64_t threads) {
    if (kind == 0)
        RLX_ACROSS_TEAM(threads, planes,
                        max_pool_padded_planes(x, y, lo, hi, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow));
    else
        RLX_ACROSS_TEAM(threads, planes,
                        avg_pool_padded_planes(x, y, lo, hi, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind == 1));
}

/* ------------------------------------------------------- direct convolution */
/* An undilated 2-d convolution of one image without im2col: the input is copied once
 * into zero-padded rows, each split into its `sw` column phases (phase p holds padded
 * columns p, p + sw, p + 2 sw, ...), so that the 16 inputs a tap reads for 16 adjacent
 * outputs are contiguous at any stride. Each output row is then computed in tiles of 16
 * columns for RLX_CONV_OB output channels at a time, every tap one vector load shared by
 * RLX_CONV_OB multiply-adds whose accumulators stay in registers. For few input channels
 * (an image's first layer: 3 x 3 x 3 taps, often at stride 2) this does the product's
 * work with no 27-row copy of the image and no thin gemm. */
/* 8 output channels a tile: 8 accumulators (16 registers on AVX2). 16 was 5-10% faster
 * with AVX-512 (resnet18's 7x7: 654 -> 616 us) but would spill on AVX2. */
#define RLX_CONV_OB 8
#define RLX_CONV_SLACK 16 /* zeros after each phase row: a tile's load never needs a bound */
#define RLX_CONV_MAX_KW 64 /* the widest window the direct convolution takes */

/* Floats in one phase row of the padded copy (its data, then the slack). */
static int64_t conv_phase_width(int64_t ow, int64_t kw, int64_t sw) { return ow + (kw - 1) / sw + RLX_CONV_SLACK; }

RLX_API int64_t rlx_conv_direct_scratch(int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t oh,
                                        int64_t ow) {
    return c * ((oh - 1) * sh + kh) * sw * conv_phase_width(ow, kw, sw);
}

static RLX_CLONES void conv_rows(const float *xp, const float *wpk, const float *bias, float *y, int64_t c,
                                 int64_t hp, int64_t wq, int64_t o, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                 int64_t oh, int64_t ow, int64_t u0, int64_t u1) {
    /* work unit u = (output-channel block, output row); wpk holds the weights as
     * (blocks, c, kh, kw, RLX_CONV_OB), zero past the last channel; xp is (c, hp, sw, wq) */
    int64_t blocks = (o + RLX_CONV_OB - 1) / RLX_CONV_OB;
    const int wide = rlx_gemm_avx512() != 0; /* AVX-512's 8 x 16 sums in rlx_v16, else 4 x 16 in rlx_v8 */
    int64_t off[RLX_CONV_MAX_KW]; /* where tap kj's inputs start in a row's phases: no division per tap */
    for (int64_t kj = 0; kj < kw; kj++) off[kj] = (kj % sw) * wq + kj / sw;
    for (int64_t u = u0; u < u1; u++) {
        int64_t ob = u % blocks, oy = u / blocks, o0 = ob * RLX_CONV_OB;
        int64_t nb = o - o0 < RLX_CONV_OB ? o - o0 : RLX_CONV_OB;
        const float *wb = wpk + ob * c * kh * kw * RLX_CONV_OB;
        if (!wide) { /* AVX2: 4 channels x 16 outputs at a time in 8-float vectors (8 sums, not 8 x 2) */
            for (int64_t x0 = 0; x0 < ow; x0 += 16) {
                int64_t nx = ow - x0 < 16 ? ow - x0 : 16;
                for (int64_t jh = 0; jh < nb; jh += 4) {
                    rlx_v8 acc[4][2];
#pragma GCC unroll 4
                    for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = (rlx_v8){0};
                    for (int64_t ci = 0; ci < c; ci++)
                        for (int64_t ki = 0; ki < kh; ki++) {
                            const float *row = xp + ((ci * hp + oy * sh + ki) * sw) * wq + x0;
                            const float *wt = wb + (ci * kh + ki) * kw * RLX_CONV_OB + jh;
                            for (int64_t kj = 0; kj < kw; kj++, wt += RLX_CONV_OB) {
                                const rlx_v8 v0 = ld8(row + off[kj]), v1 = ld8(row + off[kj] + 8);
#pragma GCC unroll 4
                                for (int j = 0; j < 4; j++) acc[j][0] += wt[j] * v0, acc[j][1] += wt[j] * v1;
                            }
                        }
                    for (int64_t j = 0; j < 4 && jh + j < nb; j++) {
                        float *dst = y + ((o0 + jh + j) * oh + oy) * ow + x0;
                        const float b = bias ? bias[o0 + jh + j] : 0.0f;
                        float out[16];
                        const rlx_v8 lo = acc[j][0] + b, hi = acc[j][1] + b;
                        memcpy(out, &lo, sizeof lo);
                        memcpy(out + 8, &hi, sizeof hi);
                        memcpy(dst, out, (size_t)nx * sizeof(float));
                    }
                }
            }
            continue;
        }
        for (int64_t x0 = 0; x0 < ow; x0 += 16) {
            int64_t nx = ow - x0 < 16 ? ow - x0 : 16;
            rlx_v16 acc[RLX_CONV_OB];
#pragma GCC unroll 16
            for (int j = 0; j < RLX_CONV_OB; j++) acc[j] = (rlx_v16){0};
            for (int64_t ci = 0; ci < c; ci++)
                for (int64_t ki = 0; ki < kh; ki++) {
                    const float *row = xp + ((ci * hp + oy * sh + ki) * sw) * wq + x0;
                    const float *wt = wb + (ci * kh + ki) * kw * RLX_CONV_OB;
                    for (int64_t kj = 0; kj < kw; kj++, wt += RLX_CONV_OB) {
                        rlx_v16 v;
                        memcpy(&v, row + off[kj], sizeof v);
#pragma GCC unroll 16
                        for (int j = 0; j < RLX_CONV_OB; j++) acc[j] += wt[j] * v;
                    }
                }
            for (int64_t j = 0; j < nb; j++) {
                float *dst = y + ((o0 + j) * oh + oy) * ow + x0;
                rlx_v16 out = acc[j] + (bias ? bias[o0 + j] : 0.0f);
                if (nx == 16)
                    memcpy(dst, &out, sizeof out); /* one vector store (element by element: 16) */
                else
                    for (int64_t l = 0; l < nx; l++) dst[l] = out[l];
            }
        }
    }
}

/* Lay out w (o, c, kh, kw) as the direct convolution reads it: (blocks, c, kh, kw, 8),
 * zero past the last output channel. */
RLX_API void rlx_conv_pack(const float *w, float *wpk, int64_t o, int64_t c, int64_t kh, int64_t kw) {
    int64_t blocks = (o + RLX_CONV_OB - 1) / RLX_CONV_OB, taps = c * kh * kw;
    for (int64_t ob = 0; ob < blocks; ob++)
        for (int64_t t = 0; t < taps; t++)
            for (int64_t j = 0; j < RLX_CONV_OB; j++) {
                int64_t oc = ob * RLX_CONV_OB + j;
                wpk[(ob * taps + t) * RLX_CONV_OB + j] = oc < o ? w[oc * taps + t] : 0.0f;
            }
}

/* Rows [r0, r1) of the padded, phase-split copy (row r of channel r / hp; see above),
 * which took half of a first layer's time on one thread. Stride 2 (most first layers)
 * pads a row once and splits it into its two phases in one pass; other strides gather
 * each phase from the input row. */
#define CONV_SPLIT_MAX 4096
static RLX_CLONES void conv_copy_rows(const float *x, float *xp, int64_t r0, int64_t r1, int64_t h, int64_t wd,
                                      int64_t hp, int64_t wq, int64_t sw, int64_t pt, int64_t pl) {
    int64_t qmax = wq - RLX_CONV_SLACK;
    float t[CONV_SPLIT_MAX];
    for (int64_t cr = r0; cr < r1; cr++) {
        int64_t ci = cr / hp, iy = cr % hp - pt;
        float *row = xp + cr * sw * wq;
        if (iy < 0 || iy >= h) {
            memset(row, 0, (size_t)(sw * wq) * sizeof(float));
            continue;
        }
        const float *src = x + (ci * h + iy) * wd;
        if (sw == 2 && 2 * wq <= CONV_SPLIT_MAX) {
            /* padded column pc is input column pc - pl; phase p holds pc = p + 2 q, q < qmax */
            int64_t lo = pl < 2 * qmax ? pl : 2 * qmax, hi = pl + wd < 2 * qmax ? pl + wd : 2 * qmax;
            memset(t, 0, (size_t)lo * sizeof(float));
            memcpy(t + lo, src + (lo - pl), (size_t)(hi - lo) * sizeof(float));
            memset(t + hi, 0, (size_t)(2 * wq - hi) * sizeof(float));
            float *e = row, *o = row + wq;
            for (int64_t q = 0; q < qmax; q++) e[q] = t[2 * q], o[q] = t[2 * q + 1];
            memset(e + qmax, 0, RLX_CONV_SLACK * sizeof(float));
            memset(o + qmax, 0, RLX_CONV_SLACK * sizeof(float));
            continue;
        }
        for (int64_t p = 0; p < sw; p++) {
            float *dst = row + p * wq;
            /* padded column p + q sw is input column p + q sw - pl: inside the input for
             * q in [q0, q1), zeros around (no branch per element) */
            int64_t q0 = pl > p ? (pl - p + sw - 1) / sw : 0;
            int64_t q1 = (wd + pl - p + sw - 1) / sw;
            if (q1 > qmax) q1 = qmax;
            if (q0 > q1) q0 = q1;
            for (int64_t q = 0; q < q0; q++) dst[q] = 0.0f;
            const float *s = src + p + q0 * sw - pl;
            if (sw == 1)
                memcpy(dst + q0, s, (size_t)(q1 - q0) * sizeof(float));
            else
                for (int64_t q = q0; q < q1; q++) dst[q] = s[(q - q0) * sw];
            for (int64_t q = q1; q < wq; q++) dst[q] = 0.0f;
        }
    }
}

/* y (o, oh, ow) = conv(x (c, h, w), w (o, c, kh, kw)) + bias (o or NULL), stride (sh, sw),
 * no dilation, padding pt (top) and pl (left); oh = (h + pt + pb - kh) / sh + 1 and likewise
 * ow. wpk: the weights laid out by rlx_conv_pack; xp: scratch of
 * rlx_conv_direct_scratch(c, kh, kw, sh, sw, oh, ow) floats. */
RLX_API void rlx_conv_direct(const float *x, const float *wpk, const float *bias, float *y, float *xp, int64_t c,
                             int64_t h, int64_t wd, int64_t o, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                             int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t threads) {
    if (kw > RLX_CONV_MAX_KW) return; /* never sent: native_nn.conv_direct_steps takes kw <= 16 */
    int64_t hp = (oh - 1) * sh + kh, wq = conv_phase_width(ow, kw, sw);
    int64_t copy_threads = row_threads(threads, c * hp);
#ifdef _OPENMP
    if (copy_threads > 1) {
#pragma omp parallel num_threads((int)copy_threads)
        {
            int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            conv_copy_rows(x, xp, c * hp * t / nt, c * hp * (t + 1) / nt, h, wd, hp, wq, sw, pt, pl);
        }
    } else
#endif
        conv_copy_rows(x, xp, 0, c * hp, h, wd, hp, wq, sw, pt, pl);
    int64_t units = ((o + RLX_CONV_OB - 1) / RLX_CONV_OB) * oh;
    threads = row_threads(threads, units);
#ifdef _OPENMP
    if (threads > 1) {
        int64_t per = (units + threads - 1) / threads, chunks = (units + per - 1) / per;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1)
        for (int64_t k = 0; k < chunks; k++)
            conv_rows(xp, wpk, bias, y, c, hp, wq, o, kh, kw, sh, sw, oh, ow, k * per,
                      (k + 1) * per < units ? (k + 1) * per : units);
        return;
    }
#endif
    conv_rows(xp, wpk, bias, y, c, hp, wq, o, kh, kw, sh, sw, oh, ow, 0, units);
}

/* ------------------------------------------------------------------ float32 GEMM
 * C (m, n) = A (m, k) @ B (k, n), row-major C, A and B at any element strides (a
 * transposed operand is a stride swap), a batch of such products at one stride per
 * operand (0: the same matrix for every product).
 *
 * Why rlx has its own: the BLAS libraries pick their kernels by CPU vendor and model, and
 * on AMD's AVX-512 parts (Zen 4, Zen 5) both oneMKL and numpy's OpenBLAS run AVX2 code,
 * half the machine's multiply-add rate (measured on a 2-core Zen 5: sgemm 2048^3, MKL
 * 178-208 GF/s, OpenBLAS 229-242, OpenBLAS told to use its AVX-512 kernels 446). The
 * AVX-512 clone of this code is what the AVX-512 units run; rlx_cpu/gemm.py times it
 * against the BLAS once per process and uses it only where it wins.
 *
 * How (GotoBLAS/BLIS): B is copied into panels of RLX_GEMM_NR columns (k rows of NR
 * floats each), A into panels of RLX_GEMM_MR rows (k columns of MR floats), both padded
 * with zeros to whole panels so the micro-kernel never needs a bound; the micro-kernel
 * keeps an MR x NR tile of C in 2 MR vector registers, and per k broadcasts MR floats of A
 * against two vectors of B. Blocks of RLX_GEMM_KC along k keep one B panel in L1 and the
 * packed A block in L2; RLX_GEMM_NC columns of packed B stay in L2 as well. A resident
 * operand (weights) can be packed once (rlx_gemm_pack_a / _b, over the whole of k, k
 * block after k block: the order it is read in) and passed packed. Threads take disjoint ranges of C's column panels (or row panels, when
 * that balances better), so no two write the same element. Each thread packs into its
 * own buffer, grown once and kept (per OpenMP thread, so no allocation per call). */
#ifndef RLX_GEMM_MR
#define RLX_GEMM_MR 12
#endif
#define RLX_GEMM_NR 32
#ifndef RLX_GEMM_KC
#define RLX_GEMM_KC 256
#endif
#ifndef RLX_GEMM_MC
#define RLX_GEMM_MC (RLX_GEMM_MR * 16)
#endif
#ifndef RLX_GEMM_NC
#define RLX_GEMM_NC (RLX_GEMM_NR * 64)
#endif
#ifndef RLX_GEMM_PREFETCH
#define RLX_GEMM_PREFETCH (RLX_GEMM_MR * RLX_GEMM_KC)
#endif
#ifndef RLX_GEMM_C_STRIPE /* bytes of C a dense layer's block of columns keeps in L2 (gemm_range) */
#define RLX_GEMM_C_STRIPE (512 * 1024)
#endif
#define RLX_GEMM_PACKED_A 1
#define RLX_GEMM_PACKED_B 2

/* 1 where the AVX-512 clones run (the loader picked x86-64-v4): the only place the GEMM
 * can beat a vendor BLAS, so the only place rlx_cpu/gemm.py bothers to time it. Asked
 * once, then kept: the depthwise lanes kernel asks on every call. */
RLX_API int64_t rlx_gemm_avx512(void) {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(RLX_NO_CLONES)
    static int known = -1; /* relaxed atomics: racing first calls store the same answer */
    int found = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (found < 0) {
        __builtin_cpu_init();
        found = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        __atomic_store_n(&known, found, __ATOMIC_RELAXED);
    }
    return found;
#else
    return 0;
#endif
}

/* Floats of a whole operand packed by rlx_gemm_pack_a (rows = m) or _b (rows = n). */
static int64_t gemm_packed_floats(int64_t rows, int64_t k, int64_t panel) {
    return (rows + panel - 1) / panel * panel * k;
}
RLX_API int64_t rlx_gemm_pack_a_size(int64_t m, int64_t k) { return gemm_packed_floats(m, k, RLX_GEMM_MR); }
RLX_API int64_t rlx_gemm_pack_b_size(int64_t n, int64_t k) { return gemm_packed_floats(n, k, RLX_GEMM_NR); }

/* Rows [r0, r0 + rows) of X (element (r, p) at x[r rs + p cs]), columns [p0, p0 + kc),
 * into panels of `panel` rows: panel q holds kc groups of `panel` floats, group p the
 * column p of its rows, zero past the last row; consecutive panels `pstride` floats apart.
 * Used for A's rows (panel MR) and for B's columns (B^T's rows, panel NR). */
static RLX_CLONES void gemm_pack(const float *x, int64_t rs, int64_t cs, int64_t r0, int64_t rows, int64_t p0,
                                 int64_t kc, int64_t panel, int64_t pstride, float *dst) {
    int64_t q0 = 0;
    if (rs == 1) { /* the whole panels' rows contiguous in each column of x (a run-time B: a 1x1
                    * convolution's input): column by column of x, each read once, in order, not
                    * panel by panel, which hops across kc columns of x at once, one stream each
                    * (measured: BENCHMARKS.md, "GEMM packing in order, clamps in registers") */
        q0 = rows / panel;
        for (int64_t p = 0; p < kc; p++) {
            const float *src = x + r0 + (p0 + p) * cs;
            for (int64_t q = 0; q < q0; q++)
                memcpy(dst + q * pstride + p * panel, src + q * panel, (size_t)panel * sizeof(float));
        }
    }
    for (int64_t q = q0; q * panel < rows; q++) {
        float *d = dst + q * pstride;
        int64_t nr = rows - q * panel < panel ? rows - q * panel : panel;
        const float *src = x + (r0 + q * panel) * rs + p0 * cs;
        if (cs == 1) { /* rows are contiguous: read each row once, write its column */
            for (int64_t r = 0; r < nr; r++)
                for (int64_t p = 0; p < kc; p++) d[p * panel + r] = src[r * rs + p];
            for (int64_t r = nr; r < panel; r++)
                for (int64_t p = 0; p < kc; p++) d[p * panel + r] = 0.0f;
        } else {
            for (int64_t p = 0; p < kc; p++)
                for (int64_t r = 0; r < panel; r++) d[p * panel + r] = r < nr ? src[r * rs + p * cs] : 0.0f;
        }
    }
}

/* A whole resident operand, in the order the GEMM reads it: block by block of
 * RLX_GEMM_KC along k, and within a block panel after panel (kc groups of `panel` floats
 * each). Block pc starts at pc * (rows padded to whole panels), panel q of it q * panel *
 * kc further. Laid out panel-major instead (each panel's whole k contiguous), a product
 * whose weights come from memory read them in kc-long pieces a panel's k apart: 512x4608
 * weights against 49 columns ran at 199 GF/s from memory, 366 from cache (2-core Zen 5). */
static RLX_CLONES void gemm_pack_blocked(const float *x, int64_t rs, int64_t cs, int64_t rows, int64_t k,
                                         int64_t panel, float *dst) {
    int64_t padded = (rows + panel - 1) / panel * panel;
    for (int64_t pc = 0; pc < k; pc += RLX_GEMM_KC) {
        int64_t kc = k - pc < RLX_GEMM_KC ? k - pc : RLX_GEMM_KC;
        gemm_pack(x, rs, cs, 0, rows, pc, kc, panel, panel * kc, dst + pc * padded);
    }
}

RLX_API void rlx_gemm_pack_a(const float *a, int64_t rs, int64_t cs, int64_t m, int64_t k, float *dst) {
    gemm_pack_blocked(a, rs, cs, m, k, RLX_GEMM_MR, dst);
}
/* B (k, n), element (p, j) at b[p rs + j cs]: its columns are the rows of the panels. */
RLX_API void rlx_gemm_pack_b(const float *b, int64_t rs, int64_t cs, int64_t k, int64_t n, float *dst) {
    gemm_pack_blocked(b, cs, rs, n, k, RLX_GEMM_NR, dst);
}

/* Offset of element (row r, column p) in an operand packed by gemm_pack_blocked. */
static inline int64_t gemm_blocked_at(int64_t r, int64_t p, int64_t rows, int64_t k, int64_t panel) {
    int64_t padded = (rows + panel - 1) / panel * panel, pc = p / RLX_GEMM_KC * RLX_GEMM_KC;
    int64_t kc = k - pc < RLX_GEMM_KC ? k - pc : RLX_GEMM_KC;
    return pc * padded + (r / panel) * panel * kc + (p - pc) * panel + r % panel;
}

/* One row of a tile's sums (lo: its first 16 columns, hi: the next 16) stored at c, or
 * added to what c holds when `add`, then clamped to [cl[0], cl[1]] when cl is not NULL. */
static inline __attribute__((always_inline)) void tile_row_store(float *c, rlx_v16 lo, rlx_v16 hi, int add,
                                                                 const float *cl) {
    if (add) {
        rlx_v16 o0, o1;
        memcpy(&o0, c, sizeof o0);
        memcpy(&o1, c + 16, sizeof o1);
        lo += o0;
        hi += o1;
    }
    if (cl) lo = clamp16(lo, cl), hi = clamp16(hi, cl);
    memcpy(c, &lo, sizeof lo);
    memcpy(c + 16, &hi, sizeof hi);
}

/* The accumulators of an MR x NR tile into C[0:mr, 0:nr], added to it when `add`, plus
 * rb[i] on row i when rb is not NULL. */
static inline __attribute__((always_inline)) void gemm_store(rlx_v16 *lo, rlx_v16 *hi, float *c, int64_t ldc,
                                                             int64_t mr, int64_t nr, int add, const float *rb,
                                                             const float *cl) {
    if (rb) { /* the last k block of a product with a bias per row of C (a convolution's channels) */
#pragma GCC unroll 16
        for (int i = 0; i < RLX_GEMM_MR; i++) {
            const float bi = rb[i < mr ? i : mr - 1];
            lo[i] += bi;
            hi[i] += bi;
        }
    }
    /* cl (the last k block of a product whose epilogue is a clamp): applied after the add */
    if (mr == RLX_GEMM_MR && nr == RLX_GEMM_NR) {
#pragma GCC unroll 16
        for (int i = 0; i < RLX_GEMM_MR; i++) tile_row_store(c + i * ldc, lo[i], hi[i], add, cl);
        return;
    }
    if (nr == RLX_GEMM_NR) { /* whole rows, fewer of them: still vector stores */
        for (int64_t i = 0; i < mr; i++) tile_row_store(c + i * ldc, lo[i], hi[i], add, cl);
        return;
    }
    for (int64_t i = 0; i < mr; i++) {
        float *ci = c + i * ldc;
        float row[RLX_GEMM_NR];
        memcpy(row, &lo[i], sizeof lo[i]);
        memcpy(row + 16, &hi[i], sizeof hi[i]);
        for (int64_t j = 0; j < nr; j++) {
            float v = add ? ci[j] + row[j] : row[j];
            if (cl) v = clamp1(v, cl);
            ci[j] = v;
        }
    }
}


/* Both lines of a sub-tile's row of C (16 floats), fetched for writing as its sums start:
 * the stores at the end of a sub-tile otherwise wait on C's lines, which no hardware
 * prefetcher predicts (rows ldc apart, visited tile by tile). Measured off AVX-512,
 * interleaved against the same library without it (bench notes in BENCHMARKS.md): 1.1-1.35x
 * the GF/s on products whose C outgrows L2 (a ViT's 1576 x 384 x 1536 dense layer). */
static inline __attribute__((always_inline)) void gemm_fetch_row(const float *row) {
    __builtin_prefetch(row, 1, 3);
    __builtin_prefetch(row + 15, 1, 3);
}

/* One row of a 6 x 16 sub-tile (v0, v1) into ci: plus rb[i], plus what ci holds when
 * `add`, clamped when cl is not NULL. */
static inline __attribute__((always_inline)) void gemm_sub_row(rlx_v8 v0, rlx_v8 v1, float *ci, int add,
                                                               const float *rb, int64_t i, const float *cl) {
    if (rb) v0 += rb[i], v1 += rb[i];
    if (add) {
        rlx_v8 o0, o1;
        memcpy(&o0, ci, sizeof o0);
        memcpy(&o1, ci + 8, sizeof o1);
        v0 += o0, v1 += o1;
    }
    if (cl) v0 = clamp8(v0, cl), v1 = clamp8(v1, cl);
    memcpy(ci, &v0, sizeof v0);
    memcpy(ci + 8, &v1, sizeof v1);
}

/* A 6 x 16 sub-tile's sums into C[0:mr, 0:nr] (mr <= 6, nr <= 16), plus rb[i] on row i
 * when rb is not NULL, added to what C holds when `add`, then clamped to [cl[0], cl[1]]
 * when cl is not NULL (the product's last k block, its epilogue a clamp). */
static inline __attribute__((always_inline)) void gemm_sub_store(rlx_v8 (*acc)[2], float *c, int64_t ldc,
                                                                 int64_t mr, int64_t nr, int add, const float *rb,
                                                                 const float *cl) {
    if (mr == RLX_SUB_MR && nr == RLX_SUB_NR) {
#pragma GCC unroll 8
        for (int i = 0; i < RLX_SUB_MR; i++) gemm_sub_row(acc[i][0], acc[i][1], c + i * ldc, add, rb, i, cl);
        return;
    }
    if (nr == RLX_SUB_NR) { /* whole rows, fewer of them (C's last rows): still vector stores */
        for (int64_t i = 0; i < mr; i++) gemm_sub_row(acc[i][0], acc[i][1], c + i * ldc, add, rb, i, cl);
        return;
    }
    for (int64_t i = 0; i < mr; i++) {
        float *ci = c + i * ldc, row[RLX_SUB_NR];
        memcpy(row, &acc[i][0], sizeof acc[i][0]);
        memcpy(row + 8, &acc[i][1], sizeof acc[i][1]);
        const float bi = rb ? rb[i] : 0.0f;
        for (int64_t j = 0; j < nr; j++) {
            float v = add ? ci[j] + (row[j] + bi) : row[j] + bi;
            if (cl) v = clamp1(v, cl);
            ci[j] = v;
        }
    }
}

/* One 6 x 16 sub-tile of an MR x NR tile: rows from A (packed: a + p MR + i; in place:
 * rows[i][p]), columns from the B panel at b (16 of its NR a row). The k loop is unrolled
 * by 4, and with A packed fetches B 8 rows ahead (a prefetch never faults: past the
 * panel's end is harmless; with A in place it measured no better): 1.03-1.38x the GF/s of the plain loop on the dense and convolution shapes of
 * bench/gemm_shapes.py, interleaved, on the 2-core Zen 3. */
static inline __attribute__((always_inline)) void gemm_sub(int64_t kc, const float *restrict a,
                                                           const float *const *rows, const float *restrict b,
                                                           float *c, int64_t ldc, int64_t mr, int64_t nr, int add,
                                                           const float *rb, const float *cl) {
    rlx_v8 acc[RLX_SUB_MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < RLX_SUB_MR; i++) {
        acc[i][0] = acc[i][1] = (rlx_v8){0};
        if (i < mr) gemm_fetch_row(c + i * ldc);
    }
    if (rows) {
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            rlx_v8 b0, b1;
            memcpy(&b0, b + p * RLX_GEMM_NR, sizeof b0);
            memcpy(&b1, b + p * RLX_GEMM_NR + 8, sizeof b1);
#pragma GCC unroll 8
            for (int i = 0; i < RLX_SUB_MR; i++) {
                const float av = rows[i][p];
                acc[i][0] += av * b0;
                acc[i][1] += av * b1;
            }
        }
    } else {
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            __builtin_prefetch(b + (p + 8) * RLX_GEMM_NR, 0, 3);
            rlx_v8 b0, b1;
            memcpy(&b0, b + p * RLX_GEMM_NR, sizeof b0);
            memcpy(&b1, b + p * RLX_GEMM_NR + 8, sizeof b1);
            const float *ap = a + p * RLX_GEMM_MR;
#pragma GCC unroll 8
            for (int i = 0; i < RLX_SUB_MR; i++) {
                acc[i][0] += ap[i] * b0;
                acc[i][1] += ap[i] * b1;
            }
        }
    }
    gemm_sub_store(acc, c, ldc, mr, nr, add, rb, cl);
}

/* The MR x NR tile as 6 x 16 sub-tiles (those with a row and a column of C to store),
 * column half by column half so each half of the B panel is read from L1 twice. */
static inline __attribute__((always_inline)) void gemm_tile8(int64_t kc, const float *restrict a,
                                                             const float *const *rows, const float *restrict b,
                                                             float *c, int64_t ldc, int64_t mr, int64_t nr, int add,
                                                             const float *rb, const float *cl) {
    for (int64_t cj = 0; cj * RLX_SUB_NR < nr; cj++) {
        int64_t n2 = nr - cj * RLX_SUB_NR < RLX_SUB_NR ? nr - cj * RLX_SUB_NR : RLX_SUB_NR;
        for (int64_t ri = 0; ri * RLX_SUB_MR < mr; ri++) {
            int64_t m2 = mr - ri * RLX_SUB_MR < RLX_SUB_MR ? mr - ri * RLX_SUB_MR : RLX_SUB_MR;
            gemm_sub(kc, a ? a + ri * RLX_SUB_MR : NULL, rows ? rows + ri * RLX_SUB_MR : NULL, b + cj * RLX_SUB_NR,
                     c + ri * RLX_SUB_MR * ldc + cj * RLX_SUB_NR, ldc, m2, n2, add, rb ? rb + ri * RLX_SUB_MR : NULL,
                     cl);
        }
    }
}

/* The MR x NR tile: C[0:mr, 0:nr] (+)= A panel (kc x MR) @ B panel (kc x NR). */
static inline __attribute__((always_inline)) void gemm_micro(int64_t kc, const float *restrict a,
                                                             const float *restrict b, float *c, int64_t ldc,
                                                             int64_t mr, int64_t nr, int add, const float *rb,
                                                             const float *cl, int wide) {
    if (!wide) {
        gemm_tile8(kc, a, NULL, b, c, ldc, mr, nr, add, rb, cl);
        return;
    }
    rlx_v16 lo[RLX_GEMM_MR], hi[RLX_GEMM_MR];
#pragma GCC unroll 16
    for (int i = 0; i < RLX_GEMM_MR; i++) lo[i] = hi[i] = (rlx_v16){0};
    for (int64_t p = 0; p < kc; p++) {
        rlx_v16 b0, b1;
        memcpy(&b0, b + p * RLX_GEMM_NR, sizeof b0);
        memcpy(&b1, b + p * RLX_GEMM_NR + 16, sizeof b1);
        const float *ap = a + p * RLX_GEMM_MR;
        __builtin_prefetch(ap + RLX_GEMM_PREFETCH, 0, 0);
#pragma GCC unroll 16
        for (int i = 0; i < RLX_GEMM_MR; i++) {
            lo[i] += ap[i] * b0;
            hi[i] += ap[i] * b1;
        }
    }
    gemm_store(lo, hi, c, ldc, mr, nr, add, rb, cl);
}

/* Row p of a B panel (NR floats) into b0, b1, fetching the same row of the next panel
 * (bnext, NULL at none) on the way: the tile that reads A in place runs over it once. */
static inline __attribute__((always_inline)) void gemm_b_row(const float *restrict b, const float *bnext, int64_t p,
                                                             rlx_v16 *b0, rlx_v16 *b1) {
    memcpy(b0, b + p * RLX_GEMM_NR, sizeof *b0);
    memcpy(b1, b + p * RLX_GEMM_NR + 16, sizeof *b1);
    if (bnext) {
        __builtin_prefetch(bnext + p * RLX_GEMM_NR, 0, 1);
        __builtin_prefetch(bnext + p * RLX_GEMM_NR + 16, 0, 1);
    }
}

/* The same tile with A read in place, its rows contiguous (lda apart): no packing copy
 * for an A computed at run time (every linear layer's activations). Rows past mr read the
 * last row again (their sums are dropped), so nothing past A is touched. */
static inline __attribute__((always_inline)) void gemm_micro_rows(int64_t kc, const float *restrict a, int64_t lda,
                                                                  const float *restrict b, float *c, int64_t ldc,
                                                                  int64_t mr, int64_t nr, int add, const float *rb,
                                                                  const float *cl, const float *bnext, int wide) {
    rlx_v16 lo[RLX_GEMM_MR], hi[RLX_GEMM_MR];
    const float *rows[RLX_GEMM_MR];
#pragma GCC unroll 16
    for (int i = 0; i < RLX_GEMM_MR; i++) {
        lo[i] = hi[i] = (rlx_v16){0};
        rows[i] = a + (i < mr ? i : mr - 1) * lda;
    }
    if (!wide) {
        gemm_tile8(kc, NULL, rows, b, c, ldc, mr, nr, add, rb, cl);
        return;
    }
    /* C's rows fetched for writing as the sums start (as gemm_fetch_row does off AVX-512):
     * a tile's 24 lines of C, ldc apart, come from L3 or memory when C outgrows L2 */
#pragma GCC unroll 16
    for (int i = 0; i < RLX_GEMM_MR; i++)
        if (i < mr) __builtin_prefetch(c + i * ldc, 1, 3), __builtin_prefetch(c + i * ldc + 31, 1, 3);
    if (mr == RLX_GEMM_MR && RLX_GEMM_MR == 12) {
        /* A whole tile's rows through four pointers, each the first of three rows lda apart
         * (an x86 address is a base plus an index times 1, 2, 4 or 8): twelve row pointers
         * do not fit the registers beside the loop's own, and the loop reloaded four of them
         * from the stack every k. With the k loop unrolled, and C's stripe kept in L2
         * (gemm_range), a transformer's dense layers (128 to 4096 rows, B packed) ran in
         * 0.84-0.94x the time on one core, 0.71-0.99x on two (BENCHMARKS.md, "Dense layers
         * and attention chains of transformers without the extras (issue 35, session 48)"). */
        const char *q0 = (const char *)a, *q3 = (const char *)(a + 3 * lda), *q6 = (const char *)(a + 6 * lda),
                   *q9 = (const char *)(a + 9 * lda);
        const int64_t L = lda * (int64_t)sizeof(float);
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            rlx_v16 b0, b1;
            gemm_b_row(b, bnext, p, &b0, &b1);
            const int64_t o = p * (int64_t)sizeof(float);
            float av[12];
            memcpy(&av[0], q0 + o, 4); memcpy(&av[1], q0 + o + L, 4); memcpy(&av[2], q0 + o + 2 * L, 4);
            memcpy(&av[3], q3 + o, 4); memcpy(&av[4], q3 + o + L, 4); memcpy(&av[5], q3 + o + 2 * L, 4);
            memcpy(&av[6], q6 + o, 4); memcpy(&av[7], q6 + o + L, 4); memcpy(&av[8], q6 + o + 2 * L, 4);
            memcpy(&av[9], q9 + o, 4); memcpy(&av[10], q9 + o + L, 4); memcpy(&av[11], q9 + o + 2 * L, 4);
#pragma GCC unroll 16
            for (int i = 0; i < 12; i++) {
                lo[i] += av[i] * b0;
                hi[i] += av[i] * b1;
            }
        }
        gemm_store(lo, hi, c, ldc, mr, nr, add, rb, cl);
        return;
    }
    for (int64_t p = 0; p < kc; p++) {
        rlx_v16 b0, b1;
        gemm_b_row(b, bnext, p, &b0, &b1);
#pragma GCC unroll 16
        for (int i = 0; i < RLX_GEMM_MR; i++) {
            const float av = rows[i][p];
            lo[i] += av * b0;
            hi[i] += av * b1;
        }
    }
    gemm_store(lo, hi, c, ldc, mr, nr, add, rb, cl);
}

typedef struct {
    int64_t m, n, k;
    const float *a;
    int64_t a_rs, a_cs;
    const float *b;
    int64_t b_rs, b_cs;
    float *c;
    int64_t ldc, flags;
    const float *bias; /* one per row of C, or NULL */
    const rlx_epilogue *epi; /* applied to C's rows as each block of them is final, or NULL */
} gemm_args;

/* Each thread's packing buffer: grown when a product needs more, never shrunk. */
static _Thread_local float *g_gemm_buf;
static _Thread_local int64_t g_gemm_buf_floats;

static float *gemm_buffer(int64_t floats) {
    if (floats > g_gemm_buf_floats) {
        free(g_gemm_buf);
        size_t bytes = ((size_t)floats * sizeof(float) + 63) / 64 * 64;
        g_gemm_buf = (float *)aligned_alloc(64, bytes);
        g_gemm_buf_floats = g_gemm_buf ? floats : 0;
    }
    return g_gemm_buf;
}

/* Element (i, p) of A, packed or not. */
static inline float gemm_a_at(const gemm_args *g, int64_t i, int64_t p) {
    if (g->flags & RLX_GEMM_PACKED_A) return g->a[gemm_blocked_at(i, p, g->m, g->k, RLX_GEMM_MR)];
    return g->a[i * g->a_rs + p * g->a_cs];
}
static inline float gemm_b_at(const gemm_args *g, int64_t p, int64_t j) {
    if (g->flags & RLX_GEMM_PACKED_B) return g->b[gemm_blocked_at(j, p, g->n, g->k, RLX_GEMM_NR)];
    return g->b[p * g->b_rs + j * g->b_cs];
}

/* C[r0:r1, c0:c1] without a packing buffer: the way out when one cannot be allocated
 * (slow, but the product is still right). */
static void gemm_plain(const gemm_args *g, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    epi_state es;
    epi_begin(&es, g->epi, rlx_thread());
    for (int64_t i = r0; i < r1; i++) {
        for (int64_t j = c0; j < c1; j++) {
            float s = 0.0f;
            for (int64_t p = 0; p < g->k; p++) s += gemm_a_at(g, i, p) * gemm_b_at(g, p, j);
            g->c[i * g->ldc + j] = s + (g->bias ? g->bias[i] : 0.0f);
        }
        epi_span(&es, g->c + i * g->ldc + c0, c1 - c0);
    }
    epi_flush(&es);
}

/* C's row panels [i0, i1) x column panels [j0, j1) of one product, on this thread. */
static RLX_CLONES void gemm_range(const gemm_args *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    const int64_t MR = RLX_GEMM_MR, NR = RLX_GEMM_NR, k = g->k;
    /* A dense layer's rows in even chunks of at most `most` panels, whose C stripe of four
     * column panels fits RLX_GEMM_C_STRIPE (1024 rows): 4096 rows (a batch of 32 sequences
     * of 128) otherwise made a stripe of 2 MB at the fewest columns */
    const int64_t most = (RLX_GEMM_C_STRIPE / (4 * NR * (int64_t)sizeof(float)) + MR - 1) / MR;
    const int packed_a = (g->flags & RLX_GEMM_PACKED_A) != 0, packed_b = (g->flags & RLX_GEMM_PACKED_B) != 0;
    const int direct_a = !packed_a && g->a_cs == 1; /* A's rows contiguous: read in place, not packed */
    /* Only where A is never packed per block (read in place or packed once): an A packed
     * per block of columns would be packed once more for each narrower block */
    const int dense = packed_b && (direct_a || packed_a);
    if (dense && i1 - i0 > most) {
        int64_t chunks = (i1 - i0 + most - 1) / most, per = (i1 - i0 + chunks - 1) / chunks;
        for (int64_t ib = i0; ib < i1; ib += per) gemm_range(g, ib, i1 - ib < per ? i1 : ib + per, j0, j1);
        return;
    }
    int64_t kmax = k < RLX_GEMM_KC ? k : RLX_GEMM_KC;
    const int wide = rlx_gemm_avx512() != 0; /* AVX-512's 12 x 32 tile in rlx_v16, else 6 x 16 sub-tiles */
    int64_t need = (packed_a || direct_a ? 0 : RLX_GEMM_MC * kmax) + (packed_b ? 0 : RLX_GEMM_NC * kmax);
    float *buf = need ? gemm_buffer(need) : NULL;
    if (need && !buf) {
        gemm_plain(g, i0 * MR, i1 * MR < g->m ? i1 * MR : g->m, j0 * NR, j1 * NR < g->n ? j1 * NR : g->n);
        return;
    }
    float *ap_buf = buf, *bp_buf = buf + (packed_a || direct_a ? 0 : RLX_GEMM_MC * kmax);
    const float *clamp = epi_clamp(g->epi); /* applied as C is stored */
    epi_state es;
    epi_begin(&es, clamp ? NULL : g->epi, rlx_thread());
    const int64_t mcp = RLX_GEMM_MC / MR; /* panels per block */
    int64_t ncp = RLX_GEMM_NC / NR;
    /* A dense layer's product (B its packed weights, A the activations read in place): as
     * few columns a block as keep C's stripe of this part's rows (RLX_GEMM_C_STRIPE bytes)
     * in L2 while the k blocks go by. With RLX_GEMM_NC columns, 1024 rows of C made 1.5 MB
     * a thread, read back from L3 or memory once per k block (twelve times over a 3072-term
     * sum); A, streamed in order, is read once per block of columns instead. */
    if (dense) {
        int64_t fit = RLX_GEMM_C_STRIPE / ((i1 - i0) * MR * NR * (int64_t)sizeof(float));
        ncp = fit < 4 ? 4 : fit < ncp ? fit : ncp;
    }
    const int64_t mp_pad = (g->m + MR - 1) / MR * MR, np_pad = (g->n + NR - 1) / NR * NR; /* packed rows */
    for (int64_t jc = j0; jc < j1; jc += ncp) {
        int64_t jn = j1 - jc < ncp ? j1 - jc : ncp;
        int64_t cols = g->n - jc * NR < jn * NR ? g->n - jc * NR : jn * NR;
        for (int64_t pc = 0; pc < k; pc += RLX_GEMM_KC) {
            int64_t kc = k - pc < RLX_GEMM_KC ? k - pc : RLX_GEMM_KC;
            const int last = pc + kc >= k; /* the bias goes in with the last k block */
            const float *bp;
            int64_t bstride;
            if (packed_b) {
                bp = g->b + pc * np_pad + jc * NR * kc;
                bstride = NR * kc;
            } else {
                gemm_pack(g->b, g->b_cs, g->b_rs, jc * NR, cols, pc, kc, NR, kc * NR, bp_buf);
                bp = bp_buf;
                bstride = kc * NR;
            }
            for (int64_t ic = i0; ic < i1; ic += mcp) {
                int64_t in = i1 - ic < mcp ? i1 - ic : mcp;
                int64_t rows = g->m - ic * MR < in * MR ? g->m - ic * MR : in * MR;
                const float *ap = NULL, *a0 = NULL;
                int64_t astride = 0;
                if (direct_a) {
                    a0 = g->a + ic * MR * g->a_rs + pc;
                } else if (packed_a) {
                    ap = g->a + pc * mp_pad + ic * MR * kc;
                    astride = MR * kc;
                } else {
                    gemm_pack(g->a, g->a_rs, g->a_cs, ic * MR, rows, pc, kc, MR, kc * MR, ap_buf);
                    ap = ap_buf;
                    astride = kc * MR;
                }
                for (int64_t jr = 0; jr < jn; jr++) {
                    int64_t nr = cols - jr * NR < NR ? cols - jr * NR : NR;
                    for (int64_t ir = 0; ir < in; ir++) {
                        int64_t mr = rows - ir * MR < MR ? rows - ir * MR : MR;
                        float *c = g->c + ((ic + ir) * MR) * g->ldc + (jc + jr) * NR;
                        const float *rb = last && g->bias ? g->bias + (ic + ir) * MR : NULL;
                        const float *cl = last ? clamp : NULL;
                        if (direct_a)
                            gemm_micro_rows(kc, a0 + ir * MR * g->a_rs, g->a_rs, bp + jr * bstride, c, g->ldc, mr,
                                            nr, pc > 0, rb, cl, ir == 0 && jr + 1 < jn ? bp + (jr + 1) * bstride : NULL,
                                            wide);
                        else
                            gemm_micro(kc, ap + ir * astride, bp + jr * bstride, c, g->ldc, mr, nr, pc > 0, rb, cl,
                                       wide);
                    }
                }
                if (last && g->epi && !clamp) /* this block of C is final: its rows while in cache */
                    for (int64_t r = ic * MR; r < ic * MR + rows; r++) epi_span(&es, g->c + r * g->ldc + jc * NR, cols);
            }
        }
    }
    epi_flush(&es);
}

/* How one product is split over `threads`: along C's column panels (*by_rows = 0) or
 * row panels (1), whichever leaves the busiest thread the least padded work. */
static int64_t gemm_split(int64_t m, int64_t n, int64_t threads, int *by_rows) {
    int64_t mp = (m + RLX_GEMM_MR - 1) / RLX_GEMM_MR, np = (n + RLX_GEMM_NR - 1) / RLX_GEMM_NR;
    if (threads > mp && threads > np) threads = mp > np ? mp : np;
    if (threads < 1) threads = 1;
    double cost_n = (double)((np + threads - 1) / threads) * RLX_GEMM_NR / (double)n;
    double cost_m = (double)((mp + threads - 1) / threads) * RLX_GEMM_MR / (double)m;
    *by_rows = cost_m < cost_n * 0.95;
    return threads;
}

static void gemm_part(const gemm_args *g, int64_t part, int64_t parts, int by_rows) {
    int64_t mp = (g->m + RLX_GEMM_MR - 1) / RLX_GEMM_MR, np = (g->n + RLX_GEMM_NR - 1) / RLX_GEMM_NR;
    int64_t total = by_rows ? mp : np, per = (total + parts - 1) / parts;
    int64_t lo = part * per, hi = lo + per < total ? lo + per : total;
    if (lo >= hi) return;
    if (by_rows)
        gemm_range(g, lo, hi, 0, np);
    else
        gemm_range(g, 0, mp, lo, hi);
}

/* C = A @ B for `count` products: product q reads A at a + q a_bs, B at b + q b_bs and
 * writes C at c + q c_bs (element strides). flags: RLX_GEMM_PACKED_A / _B when that
 * operand is already packed by rlx_gemm_pack_a / _b (its strides are then ignored, and
 * its batch stride counts packed floats). row_bias (NULL or m floats) is added to every row
 * of every product's C as the last k block is stored: a convolution's bias without a pass
 * of its own. epi (NULL or an epilogue with work for `threads` threads) is applied to C's
 * rows block by block as they are final: a 1x1 convolution's activation. A thread whose
 * packing buffer cannot be allocated computes its part with a plain loop. */
RLX_API void rlx_gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                      const float *b, int64_t b_rs, int64_t b_cs, int64_t b_bs, float *c, int64_t ldc, int64_t c_bs,
                      int64_t count, int64_t flags, int64_t threads, const float *row_bias,
                      const rlx_epilogue *epi) {
    if (m <= 0 || n <= 0 || count <= 0) return;
    if (k <= 0) {
        epi_state es;
        epi_begin(&es, epi, 0);
        for (int64_t q = 0; q < count; q++)
            for (int64_t i = 0; i < m; i++) {
                for (int64_t j = 0; j < n; j++) c[q * c_bs + i * ldc + j] = row_bias ? row_bias[i] : 0.0f;
                epi_span(&es, c + q * c_bs + i * ldc, n);
            }
        epi_flush(&es);
        return;
    }
    threads = threads > g_max_threads ? g_max_threads : threads;
    gemm_args base = {m, n, k, a, a_rs, a_cs, b, b_rs, b_cs, c, ldc, flags, row_bias, epi};
#ifdef _OPENMP
    if (threads > 1 && count >= 2 * threads) { /* whole products per thread */
        threads = threads > count ? count : threads;
#pragma omp parallel for num_threads((int)threads) schedule(dynamic, 1)
        for (int64_t q = 0; q < count; q++) {
            gemm_args g = base;
            g.a += q * a_bs, g.b += q * b_bs, g.c += q * c_bs;
            gemm_part(&g, 0, 1, 0);
        }
        return;
    }
#endif
    int by_rows;
    int64_t parts = gemm_split(m, n, threads, &by_rows);
    for (int64_t q = 0; q < count; q++) {
        gemm_args g = base;
        g.a += q * a_bs, g.b += q * b_bs, g.c += q * c_bs;
#ifdef _OPENMP
        if (parts > 1) {
#pragma omp parallel for num_threads((int)parts) schedule(static, 1)
            for (int64_t t = 0; t < parts; t++) gemm_part(&g, t, parts, by_rows);
            continue;
        }
#endif
        gemm_part(&g, 0, 1, by_rows);
    }
}

/* ------------------------------------------- convolutions as implicit GEMMs
 * y (o, oh, ow) = conv(x (c, h, w), W (o, c, kh, kw)) + bias, at any stride, dilation
 * and padding, as the product W (o, c kh kw) @ columns with no columns matrix. The
 * columns are read straight from xs (c, sh, kw, hq, ow), a copy of x that holds for each
 * input channel, row phase py and tap column kj the rows of inputs those taps read:
 * xs[ci, py, kj, r, q] = x[ci, r sh + py - pt, q sw + kj dw - pl] (0 outside x), with
 * hq = oh + (kh - 1) dh / sh. Output (oy, ox) of tap t = (ci, ki, kj) then reads
 * xs[toff[t] + oy ow + ox], toff[t] the start of plane (ci, ki dh % sh, kj) plus
 * ki dh / sh rows: one offset per tap, and every run of consecutive outputs (across
 * rows too) is consecutive in xs. So a tile's 32 columns are one 32-float load per tap
 * (the micro-kernel loads B's rows from xs itself), and C is y itself (the other form,
 * with the channels in vectors, is further down). Gone: the im2col
 * copy (kh kw times the input: 7.2 MB for resnet18's 64 x 56 x 56, 15-30% of those
 * convolutions' time on the 2-core Zen 5) and the packing of it into panels; xs is kw
 * times the input at stride 1 (a copy with the padding shifted per kj), and fewer at
 * stride 2. A layout with one padded copy (wq = ow + kw - 1 columns a row, every tap an
 * offset into it) computed kw - 1 dropped columns a row: 2 of 9 at 7 x 7, 2 of 15 at
 * 13 x 13, and copied the valid ones out after.
 *
 * W is packed by rlx_conv_gemm_pack in panels of mr rows (8 or 12: rlx_gemm's 12 x 32
 * tile wastes 8 of every 72 rows on 64 channels; 8 x 32 runs as fast from L1; 32 for the
 * channels-in-vectors form), k block by k block; implicit_gemm.conv_gemm_panel picks mr. GotoBLAS's loop order: for each k block, a tile's columns (kc taps of 32
 * columns, a few KB of xs) stay in L1 while every row panel of the block's W streams
 * past from L2 (keeping each tile's sums over the whole of k instead, W's panel in L1
 * and xs from L2, ran at 200 GF/s a core where the kernel does 255 from L1). Columns go
 * in chunks whose outputs stay in L2 between k blocks. Threads split C's row panels or
 * column tiles as rlx_gemm does; the copy is split over its rows first, in the same
 * parallel region. */

static int64_t conv_gemm_hq(int64_t kh, int64_t sh, int64_t dh, int64_t oh) { return oh + (kh - 1) * dh / sh; }

/* Floats of xs, with the slack a last tile's loads reach past its end (zeros). */
RLX_API int64_t rlx_conv_gemm_scratch(int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh,
                                      int64_t dw, int64_t oh, int64_t ow) {
    (void)sw, (void)dw;
    return c * sh * kw * conv_gemm_hq(kh, sh, dh, oh) * ow + RLX_GEMM_NR;
}

/* toff[t] for every tap t = (ci kh + ki) kw + kj (the order of W's columns). Returns 0,
 * or -1 when xs would not be addressable in 32 bits (the caller keeps im2col). */
RLX_API int64_t rlx_conv_gemm_offsets(int32_t *toff, int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                                      int64_t dh, int64_t dw, int64_t oh, int64_t ow) {
    int64_t hq = conv_gemm_hq(kh, sh, dh, oh);
    if (rlx_conv_gemm_scratch(c, kh, kw, sh, sw, dh, dw, oh, ow) > INT32_MAX) return -1;
    for (int64_t ci = 0; ci < c; ci++)
        for (int64_t ki = 0; ki < kh; ki++)
            for (int64_t kj = 0; kj < kw; kj++) {
                int64_t plane = (ci * sh + ki * dh % sh) * kw + kj;
                toff[(ci * kh + ki) * kw + kj] = (int32_t)((plane * hq + ki * dh / sh) * ow);
            }
    return 0;
}

/* W (o, k) packed for rlx_conv_gemm: panels of mr rows (8, 12 or 32), k block by k block. */
RLX_API int64_t rlx_conv_gemm_pack_size(int64_t o, int64_t k, int64_t mr) { return gemm_packed_floats(o, k, mr); }
RLX_API void rlx_conv_gemm_pack(const float *w, int64_t o, int64_t k, int64_t mr, float *dst) {
    gemm_pack_blocked(w, k, 1, o, k, mr, dst);
}

typedef struct {
    const float *a; /* W packed by rlx_conv_gemm_pack */
    const int32_t *toff;
    const float *xs, *bias;
    float *y;
    int64_t o, k, n, mr; /* n = oh ow */
    int64_t tail_j;      /* the first column the partial tile (if any) computes */
    int64_t tail_w;      /* and how many: 16 where it has at most 16 of its own, else RLX_GEMM_NR */
    const rlx_epilogue *epi;
} conv_gemm_args;

/* Rows [r0, r1) of xs, row R = ((ci sh + py) kw + kj) hq + r: plane by plane (ci, py,
 * kj), whose rows share their bounds (rows of 7 to 56 floats: a division or a memset call
 * per row was most of the copy's time). */
static RLX_CLONES void conv_gemm_copy(const float *x, float *xs, int64_t r0, int64_t r1, int64_t h, int64_t wd,
                                      int64_t kw, int64_t sh, int64_t sw, int64_t dw, int64_t hq, int64_t ow,
                                      int64_t pt, int64_t pl) {
    for (int64_t plane = r0 / hq; plane * hq < r1; plane++) {
        int64_t kj = plane % kw, py = plane / kw % sh, ci = plane / (kw * sh);
        int64_t shift = kj * dw - pl; /* output column q reads input column q sw + shift */
        int64_t q0 = shift < 0 ? (-shift + sw - 1) / sw : 0, q1 = wd - shift <= 0 ? 0 : (wd - shift + sw - 1) / sw;
        if (q1 > ow) q1 = ow;
        if (q0 > q1) q0 = q1;
        int64_t ra = plane * hq < r0 ? r0 - plane * hq : 0, rb = (plane + 1) * hq > r1 ? r1 - plane * hq : hq;
        for (int64_t r = ra; r < rb; r++) {
            float *dst = xs + (plane * hq + r) * ow;
            int64_t iy = r * sh + py - pt;
            if (iy < 0 || iy >= h) {
                for (int64_t q = 0; q < ow; q++) dst[q] = 0.0f;
                continue;
            }
            const float *src = x + (ci * h + iy) * wd + shift;
            for (int64_t q = 0; q < q0; q++) dst[q] = 0.0f;
            if (sw == 1) {
                for (int64_t q = q0; q < q1; q++) dst[q] = src[q];
            } else if (sw == 2) { /* a constant stride: vectorized (one even/odd shuffle a vector) */
                for (int64_t q = q0; q < q1; q++) dst[q] = src[2 * q];
            } else {
                for (int64_t q = q0; q < q1; q++) dst[q] = src[q * sw];
            }
            for (int64_t q = q1; q < ow; q++) dst[q] = 0.0f;
        }
    }
}

/* The panel after row panel ir of k block pc in the packed weights (panels of `rows`,
 * `padded` rows in all): the next panel of the block, or the next block's first (the
 * block's own first after the last block). A panel's tile in the chunk's first column
 * prefetches the next panel as it goes, one line or two a k: weights that come from
 * memory (resnet18's last stage reads 9.4 MB a convolution) then arrive before their
 * use, where fetched on first use they made a 3x3 stride-2 convolution into 512 channels
 * take 552 µs in the model against 290 alone. */
static inline const float *conv_gemm_next_panel(const conv_gemm_args *g, int64_t rows, int64_t padded, int64_t ir,
                                                int64_t pc) {
    int64_t kc = g->k - pc < RLX_GEMM_KC ? g->k - pc : RLX_GEMM_KC;
    if ((ir + 1) * rows < padded) return g->a + pc * padded + (ir + 1) * rows * kc; /* the next panel of this block */
    int64_t next = pc + RLX_GEMM_KC < g->k ? pc + RLX_GEMM_KC : pc;
    return g->a + next * padded; /* the next block's first panel */
}

/* One MR x NR tile of C: row panel ir, columns [j, j + NR), over k block [pc, pc + kc);
 * stored at c (rows ldc apart: y itself, or a scratch tile where the columns pass the
 * end of y), plus the bias when `first`, else added to what is there, then clamped to
 * [cl[0], cl[1]] when cl is not NULL (the last k block, the epilogue a clamp). Rows past
 * o are not stored. NEXT: the tile also asks for the next tile's columns (the 32 after
 * j, each tap's row), as the first panel to read them does: a plain 1x1 convolution
 * reads x in place, kc rows some KB apart that the hardware's prefetcher does not follow
 * (24 -> 144 channels over 56x56: 1.4x faster with it, one core). The k loop is unrolled
 * 4 times: 1.03-1.11x faster on 1x1 convolutions over 7x7 to 56x56 (up to 1.3x where
 * few panels share a tile), 3x3s unchanged (2-core Zen 5, one core, kernel alone). */
static inline __attribute__((always_inline)) void conv_gemm_tile(const conv_gemm_args *g, const int MR, const int NV,
                                                                 int64_t ir, int64_t pc, int64_t kc, int64_t j,
                                                                 float *c, int64_t ldc, int first, int fetch,
                                                                 const float *cl, const int NEXT) {
    const int64_t mp_pad = (g->o + MR - 1) / MR * MR;
    const float *restrict ap = g->a + pc * mp_pad + ir * MR * kc;
    const float *pf = fetch ? conv_gemm_next_panel(g, MR, mp_pad, ir, pc) : ap;
    const int32_t *restrict to = g->toff + pc;
    const float *restrict xb = g->xs + j;
    rlx_v16 lo[12], hi[12];
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) lo[i] = hi[i] = (rlx_v16){0};
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; p++) {
        rlx_v16 b0, b1 = {0};
        memcpy(&b0, xb + to[p], sizeof b0);
        if (NV == 2) memcpy(&b1, xb + to[p] + 16, sizeof b1);
        const float *a = ap + p * MR;
        __builtin_prefetch(pf + p * MR, 0, 2);
        if (NEXT) {
            __builtin_prefetch(xb + to[p] + RLX_GEMM_NR, 0, 3);
            __builtin_prefetch(xb + to[p] + RLX_GEMM_NR + 16, 0, 3);
        }
#pragma GCC unroll 16
        for (int i = 0; i < MR; i++) {
            lo[i] += a[i] * b0;
            if (NV == 2) hi[i] += a[i] * b1;
        }
    }
    int64_t rows = g->o - ir * MR < MR ? g->o - ir * MR : MR;
#pragma GCC unroll 16
    for (int i = 0; i < MR; i++) {
        if (i >= rows) break;
        float *ci = c + i * ldc;
        rlx_v16 o0, o1;
        if (first) {
            o0 = o1 = (rlx_v16){0} + (g->bias ? g->bias[ir * MR + i] : 0.0f);
        } else {
            memcpy(&o0, ci, sizeof o0);
            if (NV == 2) memcpy(&o1, ci + 16, sizeof o1);
        }
        o0 += lo[i];
        if (cl) o0 = clamp16(o0, cl);
        memcpy(ci, &o0, sizeof o0);
        if (NV == 2) {
            o1 += hi[i];
            if (cl) o1 = clamp16(o1, cl);
            memcpy(ci + 16, &o1, sizeof o1);
        }
    }
}

/* conv_gemm_tile off AVX-512: the MR x (16 NV) tile as sub-tiles of MR / 2 rows x 16
 * columns in rlx_v8 (6 x 16 or 4 x 16: at most 12 sums), over the same packed panels. */
static inline __attribute__((always_inline)) void conv_gemm_tile8(const conv_gemm_args *g, const int MR, const int NV,
                                                                  int64_t ir, int64_t pc, int64_t kc, int64_t j,
                                                                  float *c, int64_t ldc, int first, int fetch,
                                                                  const float *cl) {
    const int R = MR / 2;
    const int64_t mp_pad = (g->o + MR - 1) / MR * MR;
    const float *restrict ap = g->a + pc * mp_pad + ir * MR * kc;
    const float *pf = fetch ? conv_gemm_next_panel(g, MR, mp_pad, ir, pc) : ap;
    const int32_t *restrict to = g->toff + pc;
    const int64_t rows = g->o - ir * MR < MR ? g->o - ir * MR : MR;
    for (int h = 0; h < NV; h++) {
        const float *restrict xb = g->xs + j + h * RLX_SUB_NR;
        for (int r0 = 0; r0 < MR && r0 < rows; r0 += R) {
            rlx_v8 acc[RLX_SUB_MR][2];
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                acc[i][0] = acc[i][1] = (rlx_v8){0};
                if (r0 + i < rows) gemm_fetch_row(c + (r0 + i) * ldc + h * RLX_SUB_NR);
            }
            const int lead = h == 0 && r0 == 0;
#pragma GCC unroll 4 /* as conv_gemm_tile's: 1x1s 1.02-1.28x faster on AVX2 */
            for (int64_t p = 0; p < kc; p++) {
                rlx_v8 b0, b1;
                memcpy(&b0, xb + to[p], sizeof b0);
                memcpy(&b1, xb + to[p] + 8, sizeof b1);
                const float *a = ap + p * MR + r0;
                if (lead) __builtin_prefetch(pf + p * MR, 0, 2);
#pragma GCC unroll 8
                for (int i = 0; i < R; i++) {
                    acc[i][0] += a[i] * b0;
                    acc[i][1] += a[i] * b1;
                }
            }
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                if (r0 + i >= rows) break;
                float *ci = c + (r0 + i) * ldc + h * RLX_SUB_NR;
                rlx_v8 o0, o1;
                if (first) {
                    o0 = o1 = (rlx_v8){0} + (g->bias ? g->bias[ir * MR + r0 + i] : 0.0f);
                } else {
                    memcpy(&o0, ci, sizeof o0);
                    memcpy(&o1, ci + 8, sizeof o1);
                }
                o0 += acc[i][0], o1 += acc[i][1];
                if (cl) o0 = clamp8(o0, cl), o1 = clamp8(o1, cl);
                memcpy(ci, &o0, sizeof o0);
                memcpy(ci + 8, &o1, sizeof o1);
            }
        }
    }
}

/* Row panels [i0, i1) x column tiles [t0, t1), on this thread, the epilogue's spans to
 * es. A tile reaching past the end of y (n not a multiple of NR: 49 columns of 7 x 7 make
 * one full tile and one of 17) is summed in a scratch tile of the thread's and copied out
 * after the last k block.
 * It computes g->tail_w columns (NR, or 16 where it has at most 16 of its own) from
 * g->tail_j: its own where xs has slack past its end (the copy), the last tail_w of y
 * where xs is x itself (a plain 1x1 convolution: loads past its own columns would pass
 * the end of x), overlapping the tile before, whose columns it then does not copy out. */
static RLX_CLONES void conv_gemm_block(const conv_gemm_args *g, int64_t i0, int64_t i1, int64_t t0, int64_t t1,
                                       epi_state *es) {
    const int64_t NR = RLX_GEMM_NR, MR = g->mr, tail = g->n % NR ? g->n / NR : -1; /* the partial tile */
    const int64_t ch0 = i0 * MR, ch1 = i1 * MR < g->o ? i1 * MR : g->o; /* this block's channels */
    const int wide = rlx_gemm_avx512() != 0; /* AVX-512's tiles in rlx_v16, else conv_gemm_tile8 */
    float *edge = tail >= t0 && tail < t1 ? gemm_buffer((i1 - i0) * MR * NR) : NULL;
    const float *clamp = epi_clamp(g->epi); /* applied as tiles are stored */
    if (tail >= t0 && tail < t1 && !edge) { /* no scratch: that tile as plain sums */
        for (int64_t ch = ch0; ch < ch1; ch++) {
            for (int64_t j = tail * NR; j < g->n; j++) {
                float s = g->bias ? g->bias[ch] : 0.0f;
                for (int64_t t = 0; t < g->k; t++)
                    s += g->a[gemm_blocked_at(ch, t, g->o, g->k, MR)] * g->xs[g->toff[t] + j];
                if (clamp) s = clamp1(s, clamp);
                g->y[ch * g->n + j] = s;
            }
            epi_span(es, g->y + ch * g->n + tail * NR, g->n - tail * NR);
        }
        t1 = tail;
    }
    int64_t ts = RLX_CONV_GEMM_CHUNK / ((i1 - i0) * MR * NR); /* tiles a chunk holds */
    ts = ts < 1 ? 1 : ts;
    for (int64_t tb = t0; tb < t1; tb += ts) {
        int64_t te = t1 - tb < ts ? t1 : tb + ts;
        /* the larger operand of the block read once: the weights' panels as the outer loop
         * where they outnumber the chunk's columns (efficientnet's 192 -> 1152 over 7x7
         * read its 885 KB of weights once per tile the other way: 203 -> 135 µs in the
         * model, one core), else the column tiles, whose columns then stay in L1 across
         * the panels (resnet18's 64 -> 64 3x3s over 56x56: 1.06-1.08x faster that way) */
        const int panels_outer = (i1 - i0) * MR > (te - tb) * NR;
        const int64_t panels = i1 - i0, tiles = te - tb;
        for (int64_t pc = 0; pc < g->k; pc += RLX_GEMM_KC) {
            int64_t kc = g->k - pc < RLX_GEMM_KC ? g->k - pc : RLX_GEMM_KC;
            const float *cl = pc + kc >= g->k ? clamp : NULL;
            for (int64_t q = 0; q < panels * tiles; q++) {
                const int64_t ir = i0 + (panels_outer ? q / tiles : q % panels);
                const int64_t t = tb + (panels_outer ? q % tiles : q / panels);
                float *c = t == tail ? edge + (ir - i0) * MR * NR : g->y + ir * MR * g->n + t * NR;
                int64_t ldc = t == tail ? NR : g->n, j = t == tail ? g->tail_j : t * NR;
                const int half = t == tail && g->tail_w == 16;
                /* the first panel over a tile's columns fetches the next tile's (not the
                 * partial one's: its columns start elsewhere) */
                const int next = ir == i0 && t + 1 < te && t + 1 != tail;
                if (!wide && MR == 8)
                    conv_gemm_tile8(g, 8, half ? 1 : 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl);
                else if (!wide)
                    conv_gemm_tile8(g, 12, half ? 1 : 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl);
                else if (MR == 8 && half)
                    conv_gemm_tile(g, 8, 1, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 0);
                else if (MR == 8 && next)
                    conv_gemm_tile(g, 8, 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 1);
                else if (MR == 8)
                    conv_gemm_tile(g, 8, 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 0);
                else if (half)
                    conv_gemm_tile(g, 12, 1, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 0);
                else if (next)
                    conv_gemm_tile(g, 12, 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 1);
                else
                    conv_gemm_tile(g, 12, 2, ir, pc, kc, j, c, ldc, pc == 0, t == tb, cl, 0);
            }
        }
        if (tail >= tb && tail < te) /* the partial tile's own columns, from `edge` */
            for (int64_t ch = ch0; ch < ch1; ch++)
                memcpy(g->y + ch * g->n + tail * NR, edge + (ch - i0 * MR) * NR + (tail * NR - g->tail_j),
                       (size_t)(g->n - tail * NR) * sizeof(float));
        /* the chunk's columns in y are final: one span a channel (which follow on in
         * memory where the chunk holds whole channels) */
        const int64_t c0 = tb * NR, c1 = te * NR < g->n ? te * NR : g->n;
        if (g->epi)
            for (int64_t ch = ch0; ch < ch1; ch++) epi_span(es, g->y + ch * g->n + c0, c1 - c0);
    }
}

/* Row panels [i0, i1) x column tiles [t0, t1), on this thread, in groups of panels where
 * the epilogue wants whole channels at a time (epi_panel_group). */
static void conv_gemm_part(const conv_gemm_args *g, int64_t i0, int64_t i1, int64_t t0, int64_t t1) {
    epi_state es;
    epi_begin(&es, g->epi && g->epi->clamp ? NULL : g->epi, rlx_thread()); /* a clamp: done in the tiles */
    const int64_t group = epi_panel_group(es.e, i1 - i0, g->mr * RLX_GEMM_NR, t1 - t0, RLX_GEMM_NR);
    for (int64_t ib = i0; ib < i1; ib += group) conv_gemm_block(g, ib, i1 - ib < group ? i1 : ib + group, t0, t1, &es);
    epi_flush(&es);
}

/* The same product with the roles of the operands swapped, for small planes: vectors run
 * along 32 output channels and each output pixel is broadcast, C^T (n, o) = columns^T @
 * W^T. A tile is np <= 12 consecutive outputs x 32 channels, so the outputs are covered
 * exactly where 32-column tiles round 49 (7 x 7) up to 64 and 196 (14 x 14) up to 224;
 * the channels (multiples of 32 in most networks) pad o instead. W is packed in panels of
 * 32 rows (rlx_conv_gemm_pack with mr = 32: each k of a panel is the 32 channels' weights,
 * two vector loads). The tiles' sums go to a strip of the thread's (outputs x its
 * channels, in L2) and are transposed into y with the bias after the last k block. */
static inline __attribute__((always_inline)) void conv_gemm_tile_t(const conv_gemm_args *g, const int NP, int64_t jp,
                                                                   int64_t pc, int64_t kc, int64_t j, float *s,
                                                                   int64_t lds, int first, int fetch) {
    const int64_t op_pad = (g->o + 31) / 32 * 32;
    const float *restrict bp = g->a + pc * op_pad + jp * 32 * kc;
    const float *pf = fetch ? conv_gemm_next_panel(g, 32, op_pad, jp, pc) : bp;
    const int32_t *restrict to = g->toff + pc;
    const float *restrict xb = g->xs + j;
    rlx_v16 lo[12], hi[12];
#pragma GCC unroll 16
    for (int i = 0; i < NP; i++) lo[i] = hi[i] = (rlx_v16){0};
    for (int64_t p = 0; p < kc; p++) {
        rlx_v16 b0, b1;
        memcpy(&b0, bp + p * 32, sizeof b0);
        memcpy(&b1, bp + p * 32 + 16, sizeof b1);
        __builtin_prefetch(pf + p * 32, 0, 2);
        __builtin_prefetch(pf + p * 32 + 16, 0, 2);
        const float *xa = xb + to[p];
#pragma GCC unroll 16
        for (int i = 0; i < NP; i++) {
            lo[i] += xa[i] * b0;
            hi[i] += xa[i] * b1;
        }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NP; i++) tile_row_store(s + i * lds, lo[i], hi[i], !first, NULL);
}

/* np outputs from j (1 to 12: one instance each, so every tile keeps its sums in
 * registers and reads no pixel past the last). */
static inline __attribute__((always_inline)) void conv_gemm_tile_t_any(const conv_gemm_args *g, int64_t np, int64_t jp,
                                                                       int64_t pc, int64_t kc, int64_t j, float *s,
                                                                       int64_t lds, int first, int fetch) {
    switch (np) {
#define RLX_TILE_T(N)                                                                                                \
    case N:                                                                                                          \
        conv_gemm_tile_t(g, N, jp, pc, kc, j, s, lds, first, fetch);                                                 \
        break;
        RLX_CASES_1_TO_12(RLX_TILE_T)
#undef RLX_TILE_T
    default:
        break;
    }
}

/* Channel panels [c0, c1) x outputs [j0, j1), on this thread: per chunk of outputs, per k
 * block, each tile's inputs (np pixels of kc taps, a few KB of xs) stay in L1 while the
 * block's W^T panels stream past from L2. */
static RLX_CLONES void conv_gemm_block_t(const conv_gemm_args *g, int64_t c0, int64_t c1, int64_t j0, int64_t j1,
                                         epi_state *es) {
    int64_t width = (c1 - c0) * 32, chunk = RLX_CONV_GEMM_CHUNK / width / 12 * 12;
    chunk = chunk < 12 ? 12 : chunk;
    float *strip = gemm_buffer((chunk < j1 - j0 ? chunk : j1 - j0) * width);
    if (!strip) { /* no scratch: plain sums */
        for (int64_t ch = c0 * 32; ch < c1 * 32 && ch < g->o; ch++) {
            for (int64_t j = j0; j < j1; j++) {
                float s = g->bias ? g->bias[ch] : 0.0f;
                for (int64_t t = 0; t < g->k; t++)
                    s += g->a[gemm_blocked_at(ch, t, g->o, g->k, 32)] * g->xs[g->toff[t] + j];
                g->y[ch * g->n + j] = s;
            }
            epi_span(es, g->y + ch * g->n + j0, j1 - j0);
        }
        return;
    }
    for (int64_t jb = j0; jb < j1; jb += chunk) {
        int64_t je = j1 - jb < chunk ? j1 : jb + chunk;
        for (int64_t pc = 0; pc < g->k; pc += RLX_GEMM_KC) {
            int64_t kc = g->k - pc < RLX_GEMM_KC ? g->k - pc : RLX_GEMM_KC;
            for (int64_t jp = c0; jp < c1; jp++) {
                for (int64_t j = jb; j < je; j += 12) {
                    int64_t np = je - j < 12 ? je - j : 12;
                    float *s = strip + (j - jb) * width + (jp - c0) * 32;
                    if (np == 12)
                        conv_gemm_tile_t(g, 12, jp, pc, kc, j, s, width, pc == 0, j == jb);
                    else
                        conv_gemm_tile_t_any(g, np, jp, pc, kc, j, s, width, pc == 0, j == jb);
                }
            }
        }
        for (int64_t ch = c0 * 32; ch < c1 * 32 && ch < g->o; ch++) {
            const float *sc = strip + (ch - c0 * 32);
            float *yc = g->y + ch * g->n, bv = g->bias ? g->bias[ch] : 0.0f;
            for (int64_t j = jb; j < je; j++) yc[j] = sc[(j - jb) * width] + bv;
            epi_span(es, yc + jb, je - jb);
        }
    }
}

/* Channel panels [c0, c1) x outputs [j0, j1), on this thread, in groups of panels where
 * the epilogue wants whole channels at a time (epi_panel_group). */
static void conv_gemm_part_t(const conv_gemm_args *g, int64_t c0, int64_t c1, int64_t j0, int64_t j1) {
    epi_state es;
    epi_begin(&es, g->epi, rlx_thread());
    const int64_t group = epi_panel_group(g->epi, c1 - c0, 32 * 12, (j1 - j0 + 11) / 12, 12);
    for (int64_t cb = c0; cb < c1; cb += group) conv_gemm_block_t(g, cb, c1 - cb < group ? c1 : cb + group, j0, j1, &es);
    epi_flush(&es);
}

/* Part `part` of `parts`: a range of row (channel) panels when by_rows, else of column
 * tiles (outputs, in tiles of 12 when the channels run in vectors: mr == 32). */
static void conv_gemm_run_part(const conv_gemm_args *g, int64_t part, int64_t parts, int by_rows) {
    const int64_t cols = g->mr == 32 ? 12 : RLX_GEMM_NR;
    int64_t mp = (g->o + g->mr - 1) / g->mr, np = (g->n + cols - 1) / cols;
    int64_t total = by_rows ? mp : np, per = (total + parts - 1) / parts;
    int64_t lo = part * per, hi = lo + per < total ? lo + per : total;
    if (lo >= hi) return;
    if (g->mr == 32) {
        if (by_rows)
            conv_gemm_part_t(g, lo, hi, 0, g->n);
        else
            conv_gemm_part_t(g, 0, mp, lo * cols, hi * cols < g->n ? hi * cols : g->n);
    } else if (by_rows) {
        conv_gemm_part(g, lo, hi, 0, np);
    } else {
        conv_gemm_part(g, 0, mp, lo, hi);
    }
}

/* One image: y (o, oh, ow) = conv(x (c, h, wd), W) + bias, on `threads` threads. */
static void conv_gemm_image(const float *x, const float *apk, const int32_t *toff, const float *bias, float *y,
                            float *xs, int64_t c, int64_t h, int64_t wd, int64_t o, int64_t kh, int64_t kw, int64_t sh,
                            int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                            int64_t mr, int64_t threads, const rlx_epilogue *epi) {
    int64_t hq = conv_gemm_hq(kh, sh, dh, oh), rows = c * sh * kw * hq;
    /* a plain 1x1 convolution reads x itself, no copy: with the channels in vectors, or
     * with the outputs in vectors where a partial tile can be moved back to the last NR
     * outputs (loads of its own columns only would pass the end of x) */
    const int64_t n = oh * ow;
    const int plain = kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && oh == h && ow == wd &&
                      (mr == 32 || n >= RLX_GEMM_NR);
    if (plain) rows = 0;
    else memset(xs + rows * ow, 0, RLX_GEMM_NR * sizeof(float));
    /* a partial tile of at most 16 outputs is computed 16 wide (13x13 planes: 169 outputs
     * in 176 columns, not 192; 14x14: 208, not 224) */
    const int64_t tail_w = n % RLX_GEMM_NR && n % RLX_GEMM_NR <= 16 ? 16 : RLX_GEMM_NR;
    conv_gemm_args g = {apk, toff, plain ? x : xs, bias, y, o, c * kh * kw, n, mr,
                        plain && n % RLX_GEMM_NR ? n - tail_w : n / RLX_GEMM_NR * RLX_GEMM_NR, tail_w, epi};
    int by_rows;
    /* gemm_split counts rows in panels of RLX_GEMM_MR and columns in RLX_GEMM_NR: scaled */
    int64_t parts = mr == 32 ? gemm_split(o * RLX_GEMM_MR / 32, oh * ow * RLX_GEMM_NR / 12, threads, &by_rows)
                             : gemm_split(o * RLX_GEMM_MR / mr, oh * ow, threads, &by_rows);
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads((int)threads)
        {
            int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            conv_gemm_copy(x, xs, rows * t / nt, rows * (t + 1) / nt, h, wd, kw, sh, sw, dw, hq, ow, pt, pl);
#pragma omp barrier
            for (int64_t part = t; part < parts; part += nt) conv_gemm_run_part(&g, part, parts, by_rows);
        }
        return;
    }
#endif
    conv_gemm_copy(x, xs, 0, rows, h, wd, kw, sh, sw, dw, hq, ow, pt, pl);
    for (int64_t part = 0; part < parts; part++) conv_gemm_run_part(&g, part, parts, by_rows);
}

/* y (images, o, oh, ow) = conv(x (images, c, h, wd), W) + bias (o floats or NULL), each
 * image's values contiguous; apk: W packed by rlx_conv_gemm_pack with panels of mr rows
 * (8 or 12: outputs in vectors; 32: channels in vectors); toff: rlx_conv_gemm_offsets';
 * xs: rlx_conv_gemm_scratch floats for each of `threads` threads when images >= threads,
 * else for one (unused by a plain 1x1 convolution with mr 32); epi: NULL or the epilogue
 * applied to each channel's outputs as a chunk of them is finished (work for `threads`
 * threads). With at least as many images as threads, each thread computes whole images
 * alone (the batch's last images, short of a round, each on all threads): one parallel
 * region for the batch, no thread waiting on another within an image. Why: an image's
 * product over a 7x7 or 14x14 plane is tens of microseconds, and a region per image
 * (two threads splitting its panels) lost a tenth of it to the start, the split's
 * padding and the wait for the slower thread (measured: BENCHMARKS.md, section
 * "Whole images per thread in the implicit GEMM (issue 35, session 47)"). The caller
 * (implicit_gemm.conv_gemm_steps) sends a batch only where the images are that small. */
RLX_API void rlx_conv_gemm(const float *x, const float *apk, const int32_t *toff, const float *bias, float *y,
                           float *xs, int64_t c, int64_t h, int64_t wd, int64_t o, int64_t kh, int64_t kw, int64_t sh,
                           int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow,
                           int64_t mr, int64_t images, int64_t threads, const rlx_epilogue *epi) {
    if (mr != 8 && mr != 12 && mr != 32) return; /* never sent: implicit_gemm.conv_gemm_steps packs for these */
    const int64_t xi = c * h * wd, yi = o * oh * ow, xsf = rlx_conv_gemm_scratch(c, kh, kw, sh, sw, dh, dw, oh, ow);
    threads = threads > g_max_threads ? g_max_threads : threads;
    RLX_OVER_IMAGES(threads, images,
                    conv_gemm_image(x + i * xi, apk, toff, bias, y + i * yi, xs + t * xsf, c, h, wd, o, kh, kw, sh, sw,
                                    dh, dw, pt, pl, oh, ow, mr, inner, epi));
}

/* ------------------------------------------------------------ transposes */
/* y[b, j, i] = x[b, i, j] for b < batch, i < rows, j < cols, 4-byte elements: the
 * batched matrix transpose every permutation that moves the last axis comes to once
 * adjacent axes are merged ((0, 2, 1) between a transformer's tokens and a CNN's
 * channels; NCHW <-> NHWC). numpy's strided copy moves 2-3 GB/s at those shapes. Here
 * 8 x 8 tiles are transposed in registers (eight row loads, three rounds of shuffles,
 * eight row stores: GCC's vector extensions, so each clone gets its own instructions),
 * 32 x 32 blocks at a time, the edges element by element: 3-5x numpy's speed on one
 * core at segformer's and whisper's shapes. */
#define TRANSPOSE_BLOCK 32
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
typedef float rx_v8f __attribute__((vector_size(32), aligned(4)));
#define TR_LO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 4, 12, 5, 13)
#define TR_HI(a, b) __builtin_shufflevector(a, b, 2, 10, 3, 11, 6, 14, 7, 15)
#define TR_S44(a, b) __builtin_shufflevector(a, b, 0, 1, 8, 9, 4, 5, 12, 13)
#define TR_SEE(a, b) __builtin_shufflevector(a, b, 2, 3, 10, 11, 6, 7, 14, 15)
#define TR_P20(a, b) __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11)
#define TR_P31(a, b) __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15)
static inline void transpose8(const float *src, int64_t ls, float *dst, int64_t ld) {
    const rx_v8f r0 = *(const rx_v8f *)src, r1 = *(const rx_v8f *)(src + ls), r2 = *(const rx_v8f *)(src + 2 * ls),
                 r3 = *(const rx_v8f *)(src + 3 * ls), r4 = *(const rx_v8f *)(src + 4 * ls),
                 r5 = *(const rx_v8f *)(src + 5 * ls), r6 = *(const rx_v8f *)(src + 6 * ls),
                 r7 = *(const rx_v8f *)(src + 7 * ls);
    const rx_v8f t0 = TR_LO(r0, r1), t1 = TR_HI(r0, r1), t2 = TR_LO(r2, r3), t3 = TR_HI(r2, r3);
    const rx_v8f t4 = TR_LO(r4, r5), t5 = TR_HI(r4, r5), t6 = TR_LO(r6, r7), t7 = TR_HI(r6, r7);
    const rx_v8f s0 = TR_S44(t0, t2), s1 = TR_SEE(t0, t2), s2 = TR_S44(t1, t3), s3 = TR_SEE(t1, t3);
    const rx_v8f s4 = TR_S44(t4, t6), s5 = TR_SEE(t4, t6), s6 = TR_S44(t5, t7), s7 = TR_SEE(t5, t7);
    *(rx_v8f *)dst = TR_P20(s0, s4);
    *(rx_v8f *)(dst + ld) = TR_P20(s1, s5);
    *(rx_v8f *)(dst + 2 * ld) = TR_P20(s2, s6);
    *(rx_v8f *)(dst + 3 * ld) = TR_P20(s3, s7);
    *(rx_v8f *)(dst + 4 * ld) = TR_P31(s0, s4);
    *(rx_v8f *)(dst + 5 * ld) = TR_P31(s1, s5);
    *(rx_v8f *)(dst + 6 * ld) = TR_P31(s2, s6);
    *(rx_v8f *)(dst + 7 * ld) = TR_P31(s3, s7);
}
#define TRANSPOSE_TILE 8
#else
static inline void transpose8(const float *src, int64_t ls, float *dst, int64_t ld) {
    for (int64_t i = 0; i < 8; i++)
        for (int64_t j = 0; j < 8; j++) dst[j * ld + i] = src[i * ls + j];
}
#define TRANSPOSE_TILE 8
#endif

/* dst[j ld + i] = src[i ls + j] for rows i in [i0, i1) and columns j in [j0, j1): one
 * block (at most TRANSPOSE_BLOCK each way) in 8 x 8 register tiles, its edges element
 * by element. */
static inline __attribute__((always_inline)) void transpose_block(const float *src, int64_t ls, float *dst, int64_t ld, int64_t i0, int64_t i1,
                                   int64_t j0, int64_t j1) {
    const int64_t i8 = i0 + (i1 - i0) / TRANSPOSE_TILE * TRANSPOSE_TILE;
    const int64_t j8 = j0 + (j1 - j0) / TRANSPOSE_TILE * TRANSPOSE_TILE;
    for (int64_t i = i0; i < i8; i += TRANSPOSE_TILE)
        for (int64_t j = j0; j < j8; j += TRANSPOSE_TILE) transpose8(src + i * ls + j, ls, dst + j * ld + i, ld);
    for (int64_t i = i0; i < i1; i++) /* the block's edges: rows past i8, columns past j8 */
        for (int64_t j = i < i8 ? j8 : j0; j < j1; j++) dst[j * ld + i] = src[i * ls + j];
}

/* transpose_block over rows [i0, i1) x columns [j0, j1) of any size, block by block
 * (rlx_conv_nhwc's moves between NCHW and NHWC). */
static RLX_CLONES void transpose_blocks(const float *src, int64_t ls, float *dst, int64_t ld, int64_t i0,
                                        int64_t i1, int64_t j0, int64_t j1) {
    for (int64_t i = i0; i < i1; i += TRANSPOSE_BLOCK)
        for (int64_t j = j0; j < j1; j += TRANSPOSE_BLOCK)
            transpose_block(src, ls, dst, ld, i, i + TRANSPOSE_BLOCK < i1 ? i + TRANSPOSE_BLOCK : i1, j,
                            j + TRANSPOSE_BLOCK < j1 ? j + TRANSPOSE_BLOCK : j1);
}

static RLX_CLONES void transpose_part(const float *x, float *y, int64_t lo, int64_t hi, int64_t rows, int64_t cols) {
    const int64_t row_blocks = (rows + TRANSPOSE_BLOCK - 1) / TRANSPOSE_BLOCK;
    const int64_t col_blocks = (cols + TRANSPOSE_BLOCK - 1) / TRANSPOSE_BLOCK;
    const int64_t per = row_blocks * col_blocks;
    for (int64_t t = lo; t < hi; t++) {
        const int64_t b = t / per, rb = (t % per) / col_blocks, cb = t % col_blocks;
        const int64_t i0 = rb * TRANSPOSE_BLOCK, j0 = cb * TRANSPOSE_BLOCK;
        transpose_block(x + b * rows * cols, cols, y + b * rows * cols, rows, i0,
                        i0 + TRANSPOSE_BLOCK < rows ? i0 + TRANSPOSE_BLOCK : rows, j0,
                        j0 + TRANSPOSE_BLOCK < cols ? j0 + TRANSPOSE_BLOCK : cols);
    }
}

RLX_API void rlx_transpose(const void *x, void *y, int64_t batch, int64_t rows, int64_t cols, int64_t threads) {
    const int64_t blocks = batch * ((rows + TRANSPOSE_BLOCK - 1) / TRANSPOSE_BLOCK) *
                           ((cols + TRANSPOSE_BLOCK - 1) / TRANSPOSE_BLOCK);
    RLX_ACROSS_TEAM(threads, blocks, transpose_part((const float *)x, (float *)y, lo, hi, rows, cols));
}

/* A max or average pool from NCHW x (n, c, h, w) into NHWC y (n, oh, ow, c), windows
 * clipped to the image as in rlx_pool2d_padded (kind 0 max, 1 average counting the
 * padding, 2 average over the image's positions). Why: a chain held channels-last that
 * starts at a pool of an NCHW value (ResNet's stem: its 7x7 convolution, then a 3x3
 * stride-2 max pool over 64 x 112 x 112) pooled into NCHW scratch and then transposed
 * that: the pooled copy written, read and written again. Here a unit is one output row of
 * 16 channels: each channel's row pooled as rlx_pool2d_padded pools it (into L1), then
 * the 16 rows transposed in 8 x 8 register tiles into their pixels' channels of y. */
#define PN_CB 16    /* channels a unit */
#define PN_CHUNK 64 /* outputs of a row at a time */
#define PN_COLS (PN_CHUNK * 2 + 8)
static inline __attribute__((always_inline)) void pool_to_nhwc_body(
    const float *x, float *y, int64_t u0, int64_t u1, int64_t c, int64_t h, int64_t w, int64_t kh, int64_t kw,
    int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr, int64_t oh, int64_t ow,
    const int is_max, int64_t include_pad) {
    float v[PN_COLS] __attribute__((aligned(64)));
    float t[PN_CB][PN_CHUNK] __attribute__((aligned(64)));
    float cinv[PN_CHUNK];
    const float fill = is_max ? -__builtin_inff() : 0.0f;
    const int64_t blocks = (c + PN_CB - 1) / PN_CB;
    for (int64_t u = u0; u < u1; u++) {
        const int64_t img = u / (blocks * oh), cb = u / oh % blocks, oy = u % oh;
        const int64_t c0 = cb * PN_CB, nc = c - c0 < PN_CB ? c - c0 : PN_CB;
        const int64_t r0 = oy * sh - pt, ki0 = r0 < 0 ? -r0 : 0, ki1 = h - r0 < kh ? h - r0 : kh;
        const int64_t rows = is_max ? 1 : pool_count(r0, kh, h, pt, pb, include_pad);
        for (int64_t o0 = 0; o0 < ow; o0 += PN_CHUNK) {
            const int64_t n = ow - o0 < PN_CHUNK ? ow - o0 : PN_CHUNK;
            if (!is_max) pool_inverse_counts(cinv, o0, n, rows, kw, sw, w, pl, pr, include_pad);
            for (int64_t ch = 0; ch < nc; ch++) { /* each channel's row of outputs, as rlx_pool2d_padded */
                pool_padded_chunk(x + ((img * c + c0 + ch) * h) * w, t[ch], v, w, kw, sw, r0, ki0, ki1, o0 * sw - pl,
                                  n, fill, is_max);
                if (!is_max)
                    for (int64_t j = 0; j < n; j++) t[ch][j] *= cinv[j];
            }
            /* the 16 rows of outputs into their pixels' channels */
            transpose_block(&t[0][0], PN_CHUNK, y + ((img * oh + oy) * ow + o0) * c + c0, c, 0, nc, 0, n);
        }
    }
}

static RLX_CLONES void max_pool_to_nhwc(const float *x, float *y, int64_t u0, int64_t u1, int64_t c, int64_t h,
                                        int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                                        int64_t pl, int64_t pb, int64_t pr, int64_t oh, int64_t ow) {
    pool_to_nhwc_body(x, y, u0, u1, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, 1, 0);
}

static RLX_CLONES void avg_pool_to_nhwc(const float *x, float *y, int64_t u0, int64_t u1, int64_t c, int64_t h,
                                        int64_t w, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                                        int64_t pl, int64_t pb, int64_t pr, int64_t oh, int64_t ow,
                                        int64_t include_pad) {
    pool_to_nhwc_body(x, y, u0, u1, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, 0, include_pad);
}

/* y (n, oh, ow, c) = pool of x (n, c, h, w); kind as rlx_pool2d_padded's; windows of
 * kw <= 8 at sw <= 2 (never sent otherwise: native_nn.pool_to_nhwc_step). */
RLX_API void rlx_pool_to_nhwc(const float *x, float *y, int64_t n, int64_t c, int64_t h, int64_t w, int64_t kh,
                              int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr,
                              int64_t oh, int64_t ow, int64_t kind, int64_t threads) {
    if (kw > 8 || sw < 1 || sw > 2) return;
    const int64_t units = n * ((c + PN_CB - 1) / PN_CB) * oh;
    if (kind == 0)
        RLX_ACROSS_TEAM(threads, units, max_pool_to_nhwc(x, y, lo, hi, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow));
    else
        RLX_ACROSS_TEAM(threads, units,
                        avg_pool_to_nhwc(x, y, lo, hi, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind == 1));
}

/* ------------------------------------------------ direct convolution over NHWC
 * y = conv(x, W) + bias with the channels innermost: a tile is RLX_CONV_NHWC_R consecutive
 * outputs of a row x a block of up to 64 output channels (four vectors); per input
 * channel of a tap it loads the block's four weight vectors and broadcasts each output's
 * input value (28 sums in registers; 11 loads a 28 FMAs, all but the weights' from L1).
 * Why: rlx_conv_gemm (outputs in vectors) first copies each image kw times over, the
 * shifted copy, and reads its columns at unaligned offsets; on the 2-core Zen 5 that
 * copy and those reads are what its 3x3 convolutions lose to MLAS's blocked kernels,
 * more so under cache pressure (the copy 30 -> 125 us a resnet18 layer when a co-tenant
 * fills L3), and most on small planes (7 x 7 x 512: 358 GF/s against 500 here).
 *
 * x and y are each NHWC or NCHW (`layout`: bit 0 x is NCHW, bit 1 y is NCHW). An NCHW x
 * is first transposed into scratch by the threads together (one copy, not kw; in
 * rlx_transpose's 8 x 8 register tiles), an NCHW
 * y is computed into scratch NHWC and each thread transposes its own outputs out: the
 * kernel serves NCHW graphs now and channels-last chains as they are. A tap that falls
 * outside x reads a row of zeros in scratch (no test in the loop: the tile's pointers
 * are set per tap). W is packed once (rlx_conv_nhwc_pack) in blocks of 64 output
 * channels (the last one 16, 32 or 48 wide, zero-filled), each [tap][input channel]
 * [channel of the block]. Input channels go in k blocks whose weight slice stays in L2
 * (RLX_CONV_NHWC_SLICE floats): the first block's tiles store sums plus bias, the later ones
 * add to what is there, the last one clamps (a ReLU/ReLU6 epilogue); any other epilogue
 * program runs over each thread's outputs once they are final. Threads take ranges of
 * output rows, or of channel blocks where there are too few rows to share. Built for
 * AVX-512's 32 registers: conv_nhwc.py takes it only there (rlx_gemm_avx512). */
#define RLX_CONV_NHWC_R 7
#define RLX_CONV_NHWC_OB 64
#define RLX_CONV_NHWC_SLICE (64 * 1024)

typedef struct {
    const float *x, *wpk, *bias, *zeros;
    float *y;
    int64_t c, h, w, o, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow;
    int64_t cb;         /* input channels a k block */
    const float *clamp; /* [lo, hi] or NULL */
} nhwc_args;

RLX_API int64_t rlx_conv_nhwc_pack_size(int64_t o, int64_t c, int64_t kh, int64_t kw) {
    return (o + 15) / 16 * 16 * c * kh * kw;
}

/* W (o, c, kh, kw) into dst (rlx_conv_nhwc_pack_size floats). */
RLX_API void rlx_conv_nhwc_pack(const float *w, int64_t o, int64_t c, int64_t kh, int64_t kw, float *dst) {
    const int64_t taps = kh * kw, op = (o + 15) / 16 * 16;
    for (int64_t b = 0; b * RLX_CONV_NHWC_OB < o; b++) {
        const int64_t width = op - b * RLX_CONV_NHWC_OB < RLX_CONV_NHWC_OB ? op - b * RLX_CONV_NHWC_OB : RLX_CONV_NHWC_OB;
        float *d = dst + b * RLX_CONV_NHWC_OB * c * taps;
        for (int64_t t = 0; t < taps; t++)
            for (int64_t ic = 0; ic < c; ic++)
                for (int64_t j = 0; j < width; j++) {
                    const int64_t oc = b * RLX_CONV_NHWC_OB + j;
                    d[(t * c + ic) * width + j] = oc < o ? w[(oc * c + ic) * taps + t] : 0.0f;
                }
    }
}

/* Floats of rlx_conv_nhwc's scratch: x transposed, y before its transpose, a row of zeros. */
RLX_API int64_t rlx_conv_nhwc_scratch(int64_t c, int64_t h, int64_t w, int64_t o, int64_t oh, int64_t ow,
                                      int64_t layout) {
    return (layout & 1 ? c * h * w : 0) + (layout & 2 ? o * oh * ow : 0) + c;
}

/* One tile: outputs [ox0, ox0 + R) of row oy (yr: the row's first output) x block b of
 * V vectors (the last of which holds `last` channels), over input channels [c0, c1). */
static inline __attribute__((always_inline)) void nhwc_tile(const nhwc_args *g, float *yr, int64_t oy, int64_t ox0,
                                                            int64_t b, int64_t c0, int64_t c1, int first,
                                                            const float *cl, int64_t last, const int R, const int V) {
    const int64_t taps = g->kh * g->kw, width = 16 * V;
    rlx_v16 a0[RLX_CONV_NHWC_R], a1[RLX_CONV_NHWC_R], a2[RLX_CONV_NHWC_R], a3[RLX_CONV_NHWC_R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) a0[r] = a1[r] = a2[r] = a3[r] = (rlx_v16){0};
    const float *wb = g->wpk + b * RLX_CONV_NHWC_OB * g->c * taps;
    for (int64_t ky = 0; ky < g->kh; ky++) {
        const int64_t iy = oy * g->sh + ky * g->dh - g->pt;
        if (iy < 0 || iy >= g->h) continue;
        const float *xrow = g->x + iy * g->w * g->c;
        for (int64_t kx = 0; kx < g->kw; kx++) {
            const float *restrict px[RLX_CONV_NHWC_R];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const int64_t ix = (ox0 + r) * g->sw + kx * g->dw - g->pl;
                px[r] = ix < 0 || ix >= g->w ? g->zeros : xrow + ix * g->c;
            }
            const float *restrict wp = wb + ((ky * g->kw + kx) * g->c + c0) * width;
            for (int64_t ic = c0; ic < c1; ic++, wp += width) {
                rlx_v16 w0 = ld16(wp), w1 = {0}, w2 = {0}, w3 = {0};
                if (V > 1) w1 = ld16(wp + 16);
                if (V > 2) w2 = ld16(wp + 32);
                if (V > 3) w3 = ld16(wp + 48);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    const float s = px[r][ic];
                    a0[r] += s * w0;
                    if (V > 1) a1[r] += s * w1;
                    if (V > 2) a2[r] += s * w2;
                    if (V > 3) a3[r] += s * w3;
                }
            }
        }
    }
    const float *bias = g->bias ? g->bias + b * RLX_CONV_NHWC_OB : NULL;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
        float *yo = yr + (ox0 + r) * g->o + b * RLX_CONV_NHWC_OB;
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) {
            const rlx_v16 s = v == 0 ? a0[r] : v == 1 ? a1[r] : v == 2 ? a2[r] : a3[r];
            const int64_t n = v == V - 1 ? last : 16;
            const float *from = first ? bias : yo; /* the bias, or the earlier k blocks' sums */
            rlx_v16 t = {0};
            if (from && n == 16) t = ld16(from + 16 * v);
            else if (from) t = ld16_part(from + 16 * v, n);
            t += s;
            if (cl) t = clamp16(t, cl);
            if (n == 16) memcpy(yo + 16 * v, &t, sizeof t);
            else st16_part(yo + 16 * v, t, n);
        }
    }
}

#define RLX_CONV_NHWC_TILE(R, V) nhwc_tile(g, yr, oy, ox, b, c0, c1, first, cl, last, R, V)
#define RLX_CONV_NHWC_BY_R(V)                                                                                     \
    switch (r) {                                                                                             \
    case 7: RLX_CONV_NHWC_TILE(7, V); break;                                                                      \
    case 6: RLX_CONV_NHWC_TILE(6, V); break;                                                                      \
    case 5: RLX_CONV_NHWC_TILE(5, V); break;                                                                      \
    case 4: RLX_CONV_NHWC_TILE(4, V); break;                                                                      \
    case 3: RLX_CONV_NHWC_TILE(3, V); break;                                                                      \
    case 2: RLX_CONV_NHWC_TILE(2, V); break;                                                                      \
    default: RLX_CONV_NHWC_TILE(1, V); break;                                                                     \
    }

/* Row oy's outputs (yr: its first, NHWC) in block b, over input channels [c0, c1). */
static RLX_CLONES void nhwc_row(const nhwc_args *g, float *yr, int64_t oy, int64_t b, int64_t c0, int64_t c1,
                                int first, const float *cl) {
    const int64_t rest = g->o - b * RLX_CONV_NHWC_OB, vs = rest >= RLX_CONV_NHWC_OB ? 4 : (rest + 15) / 16;
    const int64_t last = rest >= RLX_CONV_NHWC_OB ? 16 : rest - (vs - 1) * 16;
    for (int64_t ox = 0; ox < g->ow;) {
        const int64_t r = g->ow - ox < RLX_CONV_NHWC_R ? g->ow - ox : RLX_CONV_NHWC_R;
        if (vs == 4) {
            RLX_CONV_NHWC_BY_R(4)
        } else if (vs == 3) {
            RLX_CONV_NHWC_BY_R(3)
        } else if (vs == 2) {
            RLX_CONV_NHWC_BY_R(2)
        } else {
            RLX_CONV_NHWC_BY_R(1)
        }
        ox += r;
    }
}

/* Output rows [r0, r1) in channel blocks [b0, b1) into yn (NHWC), then, where y is
 * NCHW, those outputs transposed into it; then the epilogue program over them. */
static void nhwc_part(const nhwc_args *g, float *yn, float *y, int64_t r0, int64_t r1, int64_t b0, int64_t b1,
                      const rlx_epilogue *epi) {
    const int64_t plane = g->ow * g->o;
    for (int64_t b = b0; b < b1; b++)
        for (int64_t c0 = 0; c0 < g->c; c0 += g->cb) {
            const int64_t c1 = c0 + g->cb < g->c ? c0 + g->cb : g->c;
            for (int64_t oy = r0; oy < r1; oy++)
                nhwc_row(g, yn + oy * plane, oy, b, c0, c1, c0 == 0, c1 == g->c ? g->clamp : NULL);
        }
    epi_state es;
    epi_begin(&es, g->clamp ? NULL : epi, rlx_thread());
    const int64_t ch0 = b0 * RLX_CONV_NHWC_OB, ch1 = b1 * RLX_CONV_NHWC_OB < g->o ? b1 * RLX_CONV_NHWC_OB : g->o;
    const int64_t p0 = r0 * g->ow, p1 = r1 * g->ow, pixels = g->oh * g->ow;
    if (y == yn) {
        if (ch0 == 0 && ch1 == g->o) epi_span(&es, yn + p0 * g->o, (p1 - p0) * g->o);
        else
            for (int64_t p = p0; p < p1; p++) epi_span(&es, yn + p * g->o + ch0, ch1 - ch0);
    } else {
        transpose_blocks(yn, g->o, y, pixels, p0, p1, ch0, ch1); /* (pixels, o) -> (o, pixels) */
        for (int64_t ch = ch0; ch < ch1; ch++) epi_span(&es, y + ch * pixels + p0, p1 - p0);
    }
    epi_flush(&es);
}

/* One image on `threads` threads (rlx_conv_nhwc's). */
static void conv_nhwc_image(const float *x, const float *wpk, const float *bias, float *y, float *scratch, int64_t c,
                            int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                            int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t layout,
                            int64_t threads, const rlx_epilogue *epi) {
    const int64_t taps = kh * kw, blocks = (o + RLX_CONV_NHWC_OB - 1) / RLX_CONV_NHWC_OB;
    const int64_t most = RLX_CONV_NHWC_SLICE / (taps * RLX_CONV_NHWC_OB) < 1 ? 1 : RLX_CONV_NHWC_SLICE / (taps * RLX_CONV_NHWC_OB);
    const int64_t ks = (c + most - 1) / most;
    float *xt = layout & 1 ? scratch : NULL, *yn = layout & 2 ? scratch + (layout & 1 ? c * h * w : 0) : y;
    float *zeros = scratch + rlx_conv_nhwc_scratch(c, h, w, o, oh, ow, layout) - c;
    memset(zeros, 0, (size_t)c * sizeof(float));
    nhwc_args g = {xt ? xt : x, wpk, bias, zeros, NULL, c, h, w, o, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow,
                   (c + ks - 1) / ks, epi_clamp(epi)};
    threads = threads > g_max_threads ? g_max_threads : threads;
    threads = threads > oh * blocks ? oh * blocks : threads;
    /* the channel blocks are split where the rows would leave threads uneven (7 rows on
     * 2 threads), and where y is NCHW and the epilogue has a program (each thread's
     * outputs then whole planes: one span for its channels, not one a channel) */
    const int bsplit = threads > 1 && blocks >= threads && (oh < 4 * threads || (layout & 2 && epi && !epi->clamp));
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads((int)threads)
        {
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            if (xt) {
                /* (c, hw) -> (hw, c), each thread its pixels */
                transpose_blocks(x, h * w, xt, c, 0, c, h * w * t / nt, h * w * (t + 1) / nt);
#pragma omp barrier
            }
            if (bsplit) nhwc_part(&g, yn, y, 0, oh, blocks * t / nt, blocks * (t + 1) / nt, epi);
            else nhwc_part(&g, yn, y, oh * t / nt, oh * (t + 1) / nt, 0, blocks, epi);
        }
        return;
    }
#endif
    if (xt) transpose_blocks(x, h * w, xt, c, 0, c, 0, h * w);
    nhwc_part(&g, yn, y, 0, oh, 0, blocks, epi);
}

/* `images` images, each's values contiguous: y = conv(x, W) + bias, then the epilogue
 * (NULL, or applied to y as its outputs are final: a clamp in the tiles). wpk:
 * rlx_conv_nhwc_pack's; bias: o floats or NULL; layout: bit 0 x (c, h, w) rather than
 * (h, w, c), bit 1 the same for y; scratch: rlx_conv_nhwc_scratch floats for each of
 * `threads` threads when images >= threads, else for one. Whole images a thread where
 * there are as many as threads, as rlx_conv_gemm does and for the same reason. */
RLX_API void rlx_conv_nhwc(const float *x, const float *wpk, const float *bias, float *y, float *scratch, int64_t c,
                           int64_t h, int64_t w, int64_t o, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
                           int64_t dh, int64_t dw, int64_t pt, int64_t pl, int64_t oh, int64_t ow, int64_t layout,
                           int64_t images, int64_t threads, const rlx_epilogue *epi) {
    const int64_t xi = c * h * w, yi = o * oh * ow, sf = rlx_conv_nhwc_scratch(c, h, w, o, oh, ow, layout);
    threads = threads > g_max_threads ? g_max_threads : threads;
    RLX_OVER_IMAGES(threads, images,
                    conv_nhwc_image(x + i * xi, wpk, bias, y + i * yi, scratch + t * sf, c, h, w, o, kh, kw, sh, sw,
                                    dh, dw, pt, pl, oh, ow, layout, inner, epi));
}

/* ------------------------------------------------------------ pooling over NHWC
 * Max and average pools of a channels-last value (n, h, w, c) into (n, oh, ow, c): the
 * channels are the vector lanes, so any window, stride, padding or ceil_mode overhang is
 * the same loop over the taps inside the image (padding never read: -inf for a max, a
 * count for an average). kind 0: max (NaN kept, as numpy's maximum); 1: average over the
 * window's positions inside the declared padding (pb, pr: the bottom and right padding,
 * count_include_pad); 2: average over its positions inside the image. Why: inside a
 * channels-last chain a pool would otherwise be two transposes around rlx's NCHW pool. */
static inline __attribute__((always_inline)) rlx_v16 max16(rlx_v16 m, rlx_v16 v) {
    const rlx_i16 take = v > m;
    return (rlx_v16)(((rlx_i16)v & take) | ((rlx_i16)m & ~take));
}
/* The lanes of v that are NaN, by their bits (`v != v` on vectors compiled to a scalar
 * compare a lane). */
static inline __attribute__((always_inline)) rlx_i16 nan16(rlx_v16 v) {
    return ((rlx_i16)v & 0x7fffffff) > 0x7f800000;
}

static RLX_CLONES void pool_nhwc_rows(const float *x, float *y, int64_t u0, int64_t u1, int64_t h, int64_t w,
                                      int64_t c, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t pt,
                                      int64_t pl, int64_t pb, int64_t pr, int64_t oh, int64_t ow, int64_t kind) {
    for (int64_t u = u0; u < u1; u++) {
        const int64_t img = u / oh, oy = u % oh, y0 = oy * sh - pt;
        const int64_t ya = y0 < 0 ? 0 : y0, yb = y0 + kh < h ? y0 + kh : h;
        const float *xi = x + img * h * w * c;
        for (int64_t ox = 0; ox < ow; ox++) {
            const int64_t x0 = ox * sw - pl, xa = x0 < 0 ? 0 : x0, xb = x0 + kw < w ? x0 + kw : w;
            float *yo = y + (u * ow + ox) * c;
            float scale = 1.0f;
            if (kind == 1) {
                int64_t r0 = y0 < -pt ? -pt : y0, r1 = y0 + kh < h + pb ? y0 + kh : h + pb;
                int64_t q0 = x0 < -pl ? -pl : x0, q1 = x0 + kw < w + pr ? x0 + kw : w + pr;
                scale = 1.0f / (float)((r1 - r0) * (q1 - q0));
            } else if (kind == 2) {
                scale = 1.0f / (float)((yb - ya) * (xb - xa));
            }
            int64_t ch = 0;
            for (; ch + 16 <= c; ch += 16) {
                rlx_v16 acc = (rlx_v16){0} - INFINITY, sum = {0};
                rlx_i16 nan = {0}; /* lanes that met a NaN (a max of it is NaN) */
                for (int64_t iy = ya; iy < yb; iy++)
                    for (int64_t ix = xa; ix < xb; ix++) {
                        const rlx_v16 v = ld16(xi + (iy * w + ix) * c + ch);
                        if (kind) {
                            sum += v;
                        } else {
                            acc = max16(acc, v);
                            nan |= nan16(v);
                        }
                    }
                const rlx_v16 quiet = (rlx_v16){0} + NAN;
                acc = kind ? sum * scale : (rlx_v16)(((rlx_i16)quiet & nan) | ((rlx_i16)acc & ~nan));
                memcpy(yo + ch, &acc, sizeof acc);
            }
            for (; ch < c; ch++) {
                float acc = kind ? 0.0f : -INFINITY;
                for (int64_t iy = ya; iy < yb; iy++)
                    for (int64_t ix = xa; ix < xb; ix++) {
                        const float v = xi[(iy * w + ix) * c + ch];
                        acc = kind ? acc + v : (v > acc || v != v) ? v : acc;
                    }
                yo[ch] = kind ? acc * scale : acc;
            }
        }
    }
}

RLX_API void rlx_pool_nhwc(const float *x, float *y, int64_t n, int64_t h, int64_t w, int64_t c, int64_t kh,
                           int64_t kw, int64_t sh, int64_t sw, int64_t pt, int64_t pl, int64_t pb, int64_t pr,
                           int64_t oh, int64_t ow, int64_t kind, int64_t threads) {
    const int64_t rows = n * oh;
    threads = threads > g_max_threads ? g_max_threads : threads;
    threads = threads > rows ? rows : threads;
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads((int)threads)
        {
            const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            pool_nhwc_rows(x, y, rows * t / nt, rows * (t + 1) / nt, h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow,
                           kind);
        }
        return;
    }
#endif
    pool_nhwc_rows(x, y, 0, rows, h, w, c, kh, kw, sh, sw, pt, pl, pb, pr, oh, ow, kind);
}

/* ------------------------------------------------------- matrix-vector products */
/* y[i] = sum_k mat[i * si + k * sk] * v[k * sv], i < len, written at y[i * sy]: a product
 * with one row or one column (a dense layer at batch 1, a squeeze-excitation block's 1x1
 * convolutions on a 1x1 plane). Memory-bound: each element of the matrix is read once,
 * either along k (sk == 1: a dot product per output) or along i (si == 1: the rows of
 * the matrix scaled and summed into a block of outputs), on OpenMP's team like every
 * other kernel here — numpy's OpenBLAS would wake a pool of its own beside it. Other
 * layouts are not taken (the caller keeps the BLAS). */
#define RLX_GEMV_BLOCK 256 /* outputs a thread accumulates at once in the axpy form */

static RLX_CLONES void gemv_part(const float *mat, const float *v, float *y, int64_t i0, int64_t i1, int64_t k,
                                 int64_t si, int64_t sk, int64_t sy, const float *bias) {
    if (sk == 1) {
        for (int64_t i = i0; i < i1; i++) {
            const float *row = mat + i * si;
            rlx_v16 a0 = {0}, a1 = {0};
            int64_t j = 0;
            for (; j + 32 <= k; j += 32) {
                rlx_v16 r0, r1, v0, v1;
                memcpy(&r0, row + j, sizeof r0);
                memcpy(&r1, row + j + 16, sizeof r1);
                memcpy(&v0, v + j, sizeof v0);
                memcpy(&v1, v + j + 16, sizeof v1);
                a0 += r0 * v0;
                a1 += r1 * v1;
            }
            a0 += a1;
            float s = 0.0f;
            for (int l = 0; l < 16; l++) s += a0[l];
            for (; j < k; j++) s += row[j] * v[j];
            y[i * sy] = bias ? s + bias[i] : s;
        }
        return;
    }
    float acc[RLX_GEMV_BLOCK];
    for (int64_t b0 = i0; b0 < i1; b0 += RLX_GEMV_BLOCK) {
        int64_t n = i1 - b0 < RLX_GEMV_BLOCK ? i1 - b0 : RLX_GEMV_BLOCK;
        for (int64_t i = 0; i < n; i++) acc[i] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const float *row = mat + j * sk + b0;
            const float s = v[j];
            for (int64_t i = 0; i < n; i++) acc[i] += s * row[i];
        }
        for (int64_t i = 0; i < n; i++) y[(b0 + i) * sy] = bias ? acc[i] + bias[b0 + i] : acc[i];
    }
}

/* v must be contiguous (sv == 1: the caller copies a strided vector first); one of si, sk is 1.
 * bias: NULL, or len floats added to the outputs (a convolution's bias on a 1x1 plane). */
/* Outputs [i0, i1) and then the epilogue over them (y contiguous: sy == 1), on thread t. */
static void gemv_part_epi(const float *mat, const float *v, float *y, int64_t i0, int64_t i1, int64_t k, int64_t si,
                          int64_t sk, int64_t sy, const float *bias, const rlx_epilogue *epi, int64_t t) {
    gemv_part(mat, v, y, i0, i1, k, si, sk, sy, bias);
    if (epi && sy == 1) {
        epi_state es;
        epi_begin(&es, epi, t);
        epi_span(&es, y + i0, i1 - i0);
        epi_flush(&es);
    }
}

/* epi: NULL, or an epilogue applied to each thread's outputs (y contiguous): a 1x1
 * convolution's activation on a 1x1 plane (squeeze-excitation blocks), without a region
 * call of its own. */
RLX_API void rlx_gemv(const float *mat, const float *v, float *y, int64_t len, int64_t k, int64_t si, int64_t sk,
                      int64_t sy, int64_t threads, const float *bias, const rlx_epilogue *epi) {
    threads = row_threads(threads, (len + 15) / 16);
#ifdef _OPENMP
    if (threads > 1) {
#pragma omp parallel num_threads((int)threads)
        {
            int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
            /* split on multiples of 16 outputs: each thread's block of y starts a vector */
            int64_t units = (len + 15) / 16, u0 = units * t / nt, u1 = units * (t + 1) / nt;
            int64_t i0 = u0 * 16, i1 = u1 * 16 < len ? u1 * 16 : len;
            if (i0 < i1) gemv_part_epi(mat, v, y, i0, i1, k, si, sk, sy, bias, epi, t);
        }
        return;
    }
#endif
    gemv_part_epi(mat, v, y, 0, len, k, si, sk, sy, bias, epi, 0);
}

/* ------------------------------------------------------------ gathers along an axis */
/* y[o, j, i] = x[o, idx[j], i] for o < outer, j < n_out, i < inner, elements of `size`
 * bytes (1, 2, 4 or 8), the indices already within [0, n_in) (checked when the plan was
 * made: they are constants). numpy's take copies element by element through a generic
 * loop: the last-axis gathers a bilinear Resize imports as took 1.4 ms for 1M floats. */
static RLX_CLONES void gather_part(const char *x, const int64_t *idx, char *y, int64_t lo, int64_t hi, int64_t n_in,
                                   int64_t n_out, int64_t inner, int64_t size) {
    if (inner == 1) { /* rows of `n_out` elements, one per o */
        for (int64_t o = lo; o < hi; o++) {
            const char *src = x + o * n_in * size;
            char *dst = y + o * n_out * size;
            switch (size) {
            case 4:
                for (int64_t j = 0; j < n_out; j++) ((int32_t *)dst)[j] = ((const int32_t *)src)[idx[j]];
                break;
            case 8:
                for (int64_t j = 0; j < n_out; j++) ((int64_t *)dst)[j] = ((const int64_t *)src)[idx[j]];
                break;
            case 2:
                for (int64_t j = 0; j < n_out; j++) ((int16_t *)dst)[j] = ((const int16_t *)src)[idx[j]];
                break;
            default:
                for (int64_t j = 0; j < n_out; j++) dst[j] = src[idx[j]];
            }
        }
        return;
    }
    const int64_t row = inner * size; /* rows of `inner` elements, one per (o, j) */
    for (int64_t r = lo; r < hi; r++) {
        const int64_t o = r / n_out, j = r % n_out;
        memcpy(y + r * row, x + (o * n_in + idx[j]) * row, (size_t)row);
    }
}

RLX_API void rlx_gather_axis(const void *x, const int64_t *idx, void *y, int64_t outer, int64_t n_in, int64_t n_out,
                             int64_t inner, int64_t size, int64_t threads) {
    RLX_ACROSS_TEAM(threads, inner == 1 ? outer : outer * n_out,
                    gather_part((const char *)x, idx, (char *)y, lo, hi, n_in, n_out, inner, size));
}

/* y[o, j, i] = sum over t < taps of w[j, t] * x[o, idx[j, t], i]: one axis of a linear or
 * cubic Resize (its taps' gathers and weighted sum, which the importer writes as `taps`
 * gathers and a region) in one pass that reads the small input and writes the output
 * once, where the gathers wrote `taps` outputs for the region to read back. The terms
 * are added in tap order, as the region adds them; a product and the sum it joins may be
 * one fused multiply-add (-ffp-contract=fast), within an ulp of the region's roundings. */
static RLX_CLONES void resize_part(const float *x, const int64_t *idx, const float *w, float *y, int64_t lo,
                                   int64_t hi, int64_t n_in, int64_t n_out, int64_t inner, int64_t taps) {
    if (inner == 1) {
        for (int64_t o = lo; o < hi; o++) {
            const float *src = x + o * n_in;
            float *dst = y + o * n_out;
            if (taps == 2) {
                for (int64_t j = 0; j < n_out; j++) {
                    const float a = src[idx[2 * j]] * w[2 * j], b = src[idx[2 * j + 1]] * w[2 * j + 1];
                    dst[j] = a + b;
                }
                continue;
            }
            for (int64_t j = 0; j < n_out; j++) {
                float acc = src[idx[j * taps]] * w[j * taps];
                for (int64_t t = 1; t < taps; t++) {
                    const float term = src[idx[j * taps + t]] * w[j * taps + t];
                    acc = acc + term;
                }
                dst[j] = acc;
            }
        }
        return;
    }
    for (int64_t r = lo; r < hi; r++) {
        const int64_t o = r / n_out, j = r % n_out;
        float *dst = y + r * inner;
        const float *s0 = x + (o * n_in + idx[j * taps]) * inner;
        const float w0 = w[j * taps];
        if (taps == 2) {
            const float *s1 = x + (o * n_in + idx[j * taps + 1]) * inner;
            const float w1 = w[j * taps + 1];
            for (int64_t i = 0; i < inner; i++) {
                const float a = s0[i] * w0, b = s1[i] * w1;
                dst[i] = a + b;
            }
            continue;
        }
        for (int64_t i = 0; i < inner; i++) dst[i] = s0[i] * w0;
        for (int64_t t = 1; t < taps; t++) {
            const float *st = x + (o * n_in + idx[j * taps + t]) * inner;
            const float wt = w[j * taps + t];
            for (int64_t i = 0; i < inner; i++) {
                const float term = st[i] * wt;
                dst[i] = dst[i] + term;
            }
        }
    }
}

RLX_API void rlx_resize_taps(const float *x, const int64_t *idx, const float *w, float *y, int64_t outer,
                             int64_t n_in, int64_t n_out, int64_t inner, int64_t taps, int64_t threads) {
    RLX_ACROSS_TEAM(threads, inner == 1 ? outer : outer * n_out,
                    resize_part(x, idx, w, y, lo, hi, n_in, n_out, inner, taps));
}

/* ------------------------------------------------------------ plane reductions
 * The sum, mean or max of each channel of NHWC planes x (n, hw, c: float32, or bf16 when
 * `bf16`) into y (n, c): a global pool, a squeeze-excitation's mean. Each unit of work is
 * one image's rows [lo, hi): at batch 1 the rows are split among the threads, each
 * keeping its own c partial results, combined after. Why not a product with a row of
 * 1 / hw (what ran before): at batch 8 MKL's products of one row took 3.1 ms over
 * EfficientNet-B0's 17 pools, against 1.3 on oneDNN's pooling; and a value held bf16
 * (held.py) is read as it lies, with no widening copy first. */
enum { RLX_REDUCE_SUM = 0, RLX_REDUCE_MEAN = 1, RLX_REDUCE_MAX = 2 };
#define RLX_REDUCE_PARTS 8 /* most row ranges one image's planes split into */

typedef float rd_v16 __attribute__((vector_size(64), aligned(4)));
typedef uint16_t rd_h16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t rd_u16 __attribute__((vector_size(64)));

/* 16 channels from element `at` of x (float32, or bf16 widened: its bits are a float's top half) */
static inline __attribute__((always_inline)) rd_v16 rd_load(const void *x, int64_t at, int bf16) {
    if (bf16) {
        const rd_u16 u = __builtin_convertvector(*(const rd_h16 *)((const uint16_t *)x + at), rd_u16) << 16;
        rd_v16 f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    return *(const rd_v16 *)((const float *)x + at);
}

/* acc[j, j + 16 * nv) += the sums over `rows` rows of x's c channels there, in nv
 * registers (nv a constant where this is inlined: the loop over them unrolls). */
static inline __attribute__((always_inline)) void sum_tile(const void *x, float *acc, int64_t rows, int64_t c,
                                                           int64_t j, const int nv, const int bf16) {
    rd_v16 s[16], s2[8]; /* (up to 8 registers: rows in pairs, two sums each, for the adds' latency) */
    for (int v = 0; v < nv; v++) s[v] = (rd_v16){0};
    for (int v = 0; v < nv && nv <= 8; v++) s2[v] = (rd_v16){0};
    int64_t r = 0, at = j;
    if (nv <= 8)
        for (; r + 2 <= rows; r += 2, at += 2 * c)
            for (int v = 0; v < nv; v++) s[v] += rd_load(x, at + 16 * v, bf16), s2[v] += rd_load(x, at + c + 16 * v, bf16);
    for (; r < rows; r++, at += c)
        for (int v = 0; v < nv; v++) s[v] += rd_load(x, at + 16 * v, bf16);
    for (int v = 0; v < nv && nv <= 8; v++) s[v] += s2[v];
    for (int v = 0; v < nv; v++)
        for (int t = 0; t < 16; t++) acc[j + 16 * v + t] += s[v][t];
}

/* acc[j] += the sum over `rows` rows of x's channel j, for j < the returned count (a
 * multiple of 16): up to 256 channels at a time down the rows, their sums in registers,
 * so that a row of up to 256 channels is read in order (a pass adding each row into acc
 * in memory ran at half oneDNN's pooling's speed, and tiles of 64 channels, their reads
 * strided, at 0.6x in a model, where the planes come from memory). */
static inline __attribute__((always_inline)) int64_t sum_tiles(const void *x, float *acc, int64_t rows, int64_t c,
                                                                 int bf16) {
    int64_t j = 0;
    for (; j + 256 <= c; j += 256) sum_tile(x, acc, rows, c, j, 16, bf16);
    switch ((c - j) / 16) {
#define RLX_SUM_TILE(k)                                                                                            \
    case k:                                                                                                        \
        sum_tile(x, acc, rows, c, j, k, bf16);                                                                     \
        break;
        RLX_SUM_TILE(1) RLX_SUM_TILE(2) RLX_SUM_TILE(3) RLX_SUM_TILE(4) RLX_SUM_TILE(5) RLX_SUM_TILE(6)
        RLX_SUM_TILE(7) RLX_SUM_TILE(8) RLX_SUM_TILE(9) RLX_SUM_TILE(10) RLX_SUM_TILE(11) RLX_SUM_TILE(12)
        RLX_SUM_TILE(13) RLX_SUM_TILE(14) RLX_SUM_TILE(15)
#undef RLX_SUM_TILE
    default:
        break;
    }
    return j + (c - j) / 16 * 16;
}

/* acc (c floats, set to 0 or -inf) reduced with `rows` rows of x's c channels. */
static RLX_CLONES void reduce_rows(const void *x, float *acc, int64_t rows, int64_t c, int64_t kind, int64_t bf16) {
    const int64_t j0 = kind == RLX_REDUCE_MAX ? 0 : bf16 ? sum_tiles(x, acc, rows, c, 1) : sum_tiles(x, acc, rows, c, 0);
    if (j0 == c) return;
    const float *xf = (const float *)x;
    const uint16_t *xh = (const uint16_t *)x;
    for (int64_t r = 0; r < rows; r++) { /* the channels left (a max: all), row by row */
        if (bf16) {
            const uint16_t *row = xh + r * c;
            for (int64_t j = j0; j < c; j++) {
                uint32_t u = (uint32_t)row[j] << 16;
                float v;
                memcpy(&v, &u, 4);
                acc[j] = kind == RLX_REDUCE_MAX ? (v > acc[j] || v != v ? v : acc[j]) : acc[j] + v;
            }
        } else {
            const float *row = xf + r * c;
            for (int64_t j = j0; j < c; j++)
                acc[j] = kind == RLX_REDUCE_MAX ? (row[j] > acc[j] || row[j] != row[j] ? row[j] : acc[j]) : acc[j] + row[j];
        }
    }
}

/* Units [lo, hi) of rlx_plane_reduce: unit u is image u / parts, its part u % parts of
 * the rows, reduced into y's row (one part) or into partial's row u. */
static void plane_reduce_units(const void *x, float *y, float *partial, int64_t lo, int64_t hi, int64_t parts,
                               int64_t hw, int64_t c, int64_t kind, int64_t bf16) {
    const size_t esize = bf16 ? 2 : 4;
    const float start = kind == RLX_REDUCE_MAX ? -INFINITY : 0.0f;
    for (int64_t u = lo; u < hi; u++) {
        const int64_t img = u / parts, part = u % parts;
        const int64_t r0 = hw * part / parts, r1 = hw * (part + 1) / parts;
        float *acc = parts > 1 ? partial + u * c : y + img * c;
        for (int64_t j = 0; j < c; j++) acc[j] = start;
        reduce_rows((const char *)x + (size_t)((img * hw + r0) * c) * esize, acc, r1 - r0, c, kind, bf16);
    }
}

RLX_API void rlx_plane_reduce(const void *x, float *y, int64_t n, int64_t hw, int64_t c, int64_t kind, int64_t bf16,
                              int64_t threads) {
    if (threads > g_max_threads) threads = g_max_threads;
    int64_t parts = n >= threads ? 1 : (threads + n - 1) / n;
    parts = parts > RLX_REDUCE_PARTS ? RLX_REDUCE_PARTS : parts > hw ? hw : parts < 1 ? 1 : parts;
    float *partial = parts > 1 ? (float *)malloc((size_t)(n * parts * c) * sizeof(float)) : NULL;
    if (parts > 1 && !partial) parts = 1;
    RLX_ACROSS_TEAM(threads, n * parts, plane_reduce_units(x, y, partial, lo, hi, parts, hw, c, kind, bf16));
    for (int64_t img = 0; img < n; img++) {
        float *out = y + img * c;
        if (parts > 1) {
            const float *p = partial + img * parts * c;
            for (int64_t j = 0; j < c; j++) out[j] = p[j];
            for (int64_t k = 1; k < parts; k++)
                for (int64_t j = 0; j < c; j++)
                    out[j] = kind == RLX_REDUCE_MAX ? (p[k * c + j] > out[j] || p[k * c + j] != p[k * c + j] ? p[k * c + j] : out[j])
                                                    : out[j] + p[k * c + j];
        }
        if (kind == RLX_REDUCE_MEAN)
            for (int64_t j = 0; j < c; j++) out[j] /= (float)hw;
    }
    free(partial);
}

/* ------------------------------------------------------------ packed calls */
/* One entry point for the kernels a plan calls, their arguments in one int64 array built
 * when the plan is bound: a[0] names the kernel (RLX_PK_*), a[1..] are its arguments in
 * order, pointers as addresses and floats as the bits of a double. Through ctypes each
 * Python argument is converted on every call, 80 ns apiece: rlx_gemm's 18 cost 1.5 µs, a
 * call with one pointer 0.1 µs; over mobilenet_v3_small's ~150 native steps that was a
 * sixth of its run. Returns the kernel's status (rlx_region), 0 for the others, -1 for an
 * unknown kernel. */
enum {
    RLX_PK_GEMM = 1,
    RLX_PK_GEMV,
    RLX_PK_SOFTMAX,
    RLX_PK_LAYER_NORM,
    RLX_PK_IM2COL,
    RLX_PK_POOL2D,
    RLX_PK_POOL2D_PADDED,
    RLX_PK_DEPTHWISE,
    RLX_PK_DEPTHWISE_LANES,
    RLX_PK_CONV_DIRECT,
    RLX_PK_REGION,
    RLX_PK_CONV_GEMM,
    RLX_PK_GROUP_CONV,
    RLX_PK_GATHER_AXIS,
    RLX_PK_RESIZE_TAPS,
    RLX_PK_TRANSPOSE,
    RLX_PK_PLANE_REDUCE,
    RLX_PK_GROUP_CONV_LANES,
    RLX_PK_POOL_TO_NHWC,
    RLX_PK_DEPTHWISE_NHWC,
};
#define PK_IN(i) ((const float *)(intptr_t)a[i])
#define PK_OUT(i) ((float *)(intptr_t)a[i])
static float pk_float(int64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return (float)d;
}

RLX_API int64_t rlx_packed(const int64_t *a) {
    switch (a[0]) {
    case RLX_PK_GEMM:
        rlx_gemm(a[1], a[2], a[3], PK_IN(4), a[5], a[6], a[7], PK_IN(8), a[9], a[10], a[11], PK_OUT(12), a[13], a[14],
                 a[15], a[16], a[17], PK_IN(18), (const rlx_epilogue *)(intptr_t)a[19]);
        return 0;
    case RLX_PK_GEMV:
        rlx_gemv(PK_IN(1), PK_IN(2), PK_OUT(3), a[4], a[5], a[6], a[7], a[8], a[9], PK_IN(10),
                 (const rlx_epilogue *)(intptr_t)a[11]);
        return 0;
    case RLX_PK_SOFTMAX:
        rlx_softmax(PK_OUT(1), PK_OUT(2), a[3], a[4], a[5], pk_float(a[6]), a[7], a[8]);
        return 0;
    case RLX_PK_LAYER_NORM:
        rlx_layer_norm(PK_IN(1), PK_IN(2), PK_IN(3), PK_OUT(4), a[5], a[6], a[7], pk_float(a[8]), a[9]);
        return 0;
    case RLX_PK_IM2COL:
        rlx_im2col(PK_IN(1), PK_OUT(2), a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14],
                   a[15], a[16], a[17], a[18], a[19]);
        return 0;
    case RLX_PK_POOL2D:
        rlx_pool2d(PK_IN(1), PK_OUT(2), a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14],
                   a[15]);
        return 0;
    case RLX_PK_POOL2D_PADDED:
        rlx_pool2d_padded(PK_IN(1), PK_OUT(2), a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
                          a[14], a[15], a[16], a[17]);
        return 0;
    case RLX_PK_DEPTHWISE:
        rlx_depthwise_conv(PK_IN(1), PK_IN(2), PK_IN(3), PK_OUT(4), PK_OUT(5), a[6], a[7], a[8], a[9], a[10], a[11],
                           a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20],
                           (const rlx_epilogue *)(intptr_t)a[21]);
        return 0;
    case RLX_PK_DEPTHWISE_LANES:
        rlx_depthwise_lanes(PK_IN(1), PK_IN(2), PK_OUT(3), PK_OUT(4), a[5], a[6], a[7], a[8], a[9], a[10], a[11],
                            a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19],
                            (const rlx_epilogue *)(intptr_t)a[20]);
        return 0;
    case RLX_PK_CONV_DIRECT:
        rlx_conv_direct(PK_IN(1), PK_IN(2), PK_IN(3), PK_OUT(4), PK_OUT(5), a[6], a[7], a[8], a[9], a[10], a[11],
                        a[12], a[13], a[14], a[15], a[16], a[17], a[18]);
        return 0;
    case RLX_PK_REGION:
        return rlx_region((const int64_t *)(intptr_t)a[1], (void *const *)(intptr_t)a[2],
                          (const rlx_vml *)(intptr_t)a[3], a[4], a[5], a[6]);
    case RLX_PK_CONV_GEMM:
        rlx_conv_gemm(PK_IN(1), PK_IN(2), (const int32_t *)(intptr_t)a[3], PK_IN(4), PK_OUT(5), PK_OUT(6), a[7], a[8],
                      a[9], a[10], a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], a[21], a[22],
                      a[23], (const rlx_epilogue *)(intptr_t)a[24]);
        return 0;
    case RLX_PK_GROUP_CONV:
        rlx_group_conv(PK_IN(1), PK_IN(2), PK_IN(3), PK_OUT(4), PK_OUT(5), a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                       a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20], (const rlx_epilogue *)(intptr_t)a[21]);
        return 0;
    case RLX_PK_GATHER_AXIS:
        rlx_gather_axis((const void *)(intptr_t)a[1], (const int64_t *)(intptr_t)a[2], (void *)(intptr_t)a[3], a[4],
                        a[5], a[6], a[7], a[8], a[9]);
        return 0;
    case RLX_PK_RESIZE_TAPS:
        rlx_resize_taps(PK_IN(1), (const int64_t *)(intptr_t)a[2], PK_IN(3), PK_OUT(4), a[5], a[6], a[7], a[8], a[9],
                        a[10]);
        return 0;
    case RLX_PK_TRANSPOSE:
        rlx_transpose((const void *)(intptr_t)a[1], (void *)(intptr_t)a[2], a[3], a[4], a[5], a[6]);
        return 0;
    case RLX_PK_PLANE_REDUCE:
        rlx_plane_reduce((const void *)(intptr_t)a[1], PK_OUT(2), a[3], a[4], a[5], a[6], a[7], a[8]);
        return 0;
    case RLX_PK_GROUP_CONV_LANES:
        rlx_group_conv_lanes(PK_IN(1), PK_IN(2), PK_IN(3), PK_OUT(4), PK_OUT(5), a[6], a[7], a[8], a[9], a[10], a[11],
                             a[12], a[13], a[14], a[15], a[16], a[17], a[18], a[19], a[20],
                             (const rlx_epilogue *)(intptr_t)a[21]);
        return 0;
    case RLX_PK_POOL_TO_NHWC:
        rlx_pool_to_nhwc(PK_IN(1), PK_OUT(2), a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13],
                         a[14], a[15], a[16], a[17], a[18]);
        return 0;
    case RLX_PK_DEPTHWISE_NHWC:
        rlx_depthwise_nhwc(PK_IN(1), PK_IN(2), PK_OUT(3), PK_OUT(4), a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12],
                           a[13], a[14], a[15], a[16], a[17], a[18], a[19], (const rlx_epilogue *)(intptr_t)a[20]);
        return 0;
    default:
        return -1;
    }
}
