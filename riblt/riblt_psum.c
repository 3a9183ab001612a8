/*
 * riblt_psum.c -- power sums over GF(2^128): the field, the tables and the
 * decoder (Berlekamp-Massey, then the roots of the locator by Berlekamp's
 * trace splitting). See riblt_psum.h for what the terms are.
 */
#include "riblt_psum.h"

#include <stdlib.h>
#include <string.h>

typedef riblt_id gf;

static int limit = RIBLT_PSUM_VPCLMUL;

int riblt_psum_limit(int level)
{
    int was = limit;
    limit = level;
    return was;
}

/* ============================================================== field */

static inline bool gf_zero(const gf *a)
{
    return (a->lo | a->hi) == 0;
}

/* w * (x^7 + x^2 + x + 1) for a 64-bit w: the low 64 bits and the 7 above. */
static inline void times_poly(uint64_t w, uint64_t *lo, uint64_t *hi)
{
    *lo = w ^ (w << 1) ^ (w << 2) ^ (w << 7);
    *hi = (w >> 63) ^ (w >> 62) ^ (w >> 57);
}

/* Reduces the 256-bit product p3:p2:p1:p0 modulo x^128 + x^7 + x^2 + x + 1.
 * x^192 = x^64 * x^128 folds p3 into p2:p1, then x^128 folds p2 into
 * p1:p0 (its 7 spilled bits stay below x^128). */
static inline gf reduce(uint64_t p0, uint64_t p1, uint64_t p2, uint64_t p3)
{
    uint64_t lo, hi;
    times_poly(p3, &lo, &hi);
    p1 ^= lo;
    p2 ^= hi;
    times_poly(p2, &lo, &hi);
    gf r = {p0 ^ lo, p1 ^ hi};
    return r;
}

/* Carry-less 64 x 64 -> 128 bits, portably: a times each 4-bit value in
 * a table, then b four bits at a time. */
static inline void clmul64(uint64_t a, uint64_t b, uint64_t *lo, uint64_t *hi)
{
    uint64_t tl[16], th[16]; /* a * i, up to 67 bits */
    tl[0] = th[0] = 0;
    tl[1] = a;
    th[1] = 0;
    for (int i = 2; i < 16; i += 2) {
        tl[i] = tl[i / 2] << 1;
        th[i] = (th[i / 2] << 1) | (tl[i / 2] >> 63);
        tl[i + 1] = tl[i] ^ a;
        th[i + 1] = th[i];
    }
    uint64_t l = 0, h = 0;
    for (int sh = 60; sh >= 0; sh -= 4) {
        h = (h << 4) | (l >> 60);
        l <<= 4;
        unsigned nib = (unsigned)(b >> sh) & 15;
        l ^= tl[nib];
        h ^= th[nib];
    }
    *lo = l;
    *hi = h;
}

static gf mul_portable(const gf *a, const gf *b)
{
    uint64_t l0, h0, l1, h1, l2, h2, l3, h3;
    clmul64(a->lo, b->lo, &l0, &h0);
    clmul64(a->lo, b->hi, &l1, &h1);
    clmul64(a->hi, b->lo, &l2, &h2);
    clmul64(a->hi, b->hi, &l3, &h3);
    return reduce(l0, h0 ^ l1 ^ l2, h1 ^ h2 ^ l3, h3);
}

/*
 * PCLMULQDQ. A term costs one field multiplication, four carry-less
 * products and two more for the reduction, in registers. The portable
 * products above cost about 25 times as much; they are there for other
 * CPUs and compilers, and for tests that compare them.
 */
#if (defined(__x86_64__) || defined(__i386__)) &&                             \
    (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PSUM_CLMUL 1
#define TARGET_CLMUL __attribute__((target("pclmul,sse2")))

static inline bool use_clmul(void)
{
    return limit >= RIBLT_PSUM_CLMUL && __builtin_cpu_supports("pclmul");
}

static inline bool use_vpclmul(void)
{
    return limit >= RIBLT_PSUM_VPCLMUL &&
           __builtin_cpu_supports("vpclmulqdq") &&
           __builtin_cpu_supports("avx2") && use_clmul();
}

TARGET_CLMUL static inline __m128i mulx(__m128i a, __m128i b)
{
    const __m128i poly = _mm_set_epi64x(0, 0x87);
    __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
    __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
    __m128i mid = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01),
                                _mm_clmulepi64_si128(a, b, 0x10));
    lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
    hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
    /* the same folds as reduce(): p3 first, then p2 */
    __m128i t = _mm_clmulepi64_si128(hi, poly, 0x01);
    hi = _mm_xor_si128(hi, _mm_srli_si128(t, 8));
    lo = _mm_xor_si128(lo, _mm_slli_si128(t, 8));
    t = _mm_clmulepi64_si128(hi, poly, 0x00);
    return _mm_xor_si128(lo, t);
}

TARGET_CLMUL static gf mul_clmul(const gf *a, const gf *b)
{
    __m128i r = mulx(_mm_loadu_si128((const __m128i *)(const void *)a),
                     _mm_loadu_si128((const __m128i *)(const void *)b));
    gf out;
    _mm_storeu_si128((__m128i *)(void *)&out, r);
    return out;
}

/*
 * The odd powers x, x^3, ..., x^(2T-1) in four independent chains (x^8
 * apart), so that the products overlap: one chain would wait on each
 * product's latency.
 */
TARGET_CLMUL static void toggle_clmul(gf *t, const gf *id)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)id);
    __m128i x2 = mulx(x, x);
    __m128i a0 = x, a1 = mulx(a0, x2), a2 = mulx(a1, x2), a3 = mulx(a2, x2);
    __m128i step = mulx(a3, x);
    __m128i *v = (__m128i *)(void *)t;
    for (int i = 0;; i += 4) {
        _mm_storeu_si128(v + i, _mm_xor_si128(_mm_loadu_si128(v + i), a0));
        _mm_storeu_si128(v + i + 1,
                         _mm_xor_si128(_mm_loadu_si128(v + i + 1), a1));
        _mm_storeu_si128(v + i + 2,
                         _mm_xor_si128(_mm_loadu_si128(v + i + 2), a2));
        _mm_storeu_si128(v + i + 3,
                         _mm_xor_si128(_mm_loadu_si128(v + i + 3), a3));
        if (i + 4 >= RIBLT_PSUM_TERMS)
            break;
        a0 = mulx(a0, step);
        a1 = mulx(a1, step);
        a2 = mulx(a2, step);
        a3 = mulx(a3, step);
    }
}
/*
 * VPCLMULQDQ: the same products two at a time in 256-bit registers (each
 * 128-bit lane as mulx computes it), two terms a register: about 30 %
 * less time a toggle where the CPU has it.
 */
#define TARGET_VPCLMUL __attribute__((target("vpclmulqdq,avx2,pclmul")))

TARGET_VPCLMUL static inline __m256i mulx2(__m256i a, __m256i b)
{
    const __m256i poly = _mm256_set_epi64x(0, 0x87, 0, 0x87);
    __m256i lo = _mm256_clmulepi64_epi128(a, b, 0x00);
    __m256i hi = _mm256_clmulepi64_epi128(a, b, 0x11);
    __m256i mid = _mm256_xor_si256(_mm256_clmulepi64_epi128(a, b, 0x01),
                                   _mm256_clmulepi64_epi128(a, b, 0x10));
    lo = _mm256_xor_si256(lo, _mm256_slli_si256(mid, 8));
    hi = _mm256_xor_si256(hi, _mm256_srli_si256(mid, 8));
    __m256i t = _mm256_clmulepi64_epi128(hi, poly, 0x01);
    hi = _mm256_xor_si256(hi, _mm256_srli_si256(t, 8));
    lo = _mm256_xor_si256(lo, _mm256_slli_si256(t, 8));
    t = _mm256_clmulepi64_epi128(hi, poly, 0x00);
    return _mm256_xor_si256(lo, t);
}

/* Terms 4i .. 4i + 3 from two registers, (x^(8i+1), x^(8i+3)) and
 * (x^(8i+5), x^(8i+7)), each stepped by x^8. */
TARGET_VPCLMUL static void toggle_vpclmul(gf *t, const gf *id)
{
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)id);
    __m128i x2 = mulx(x, x), x3 = mulx(x, x2), x5 = mulx(x3, x2);
    __m128i x7 = mulx(x5, x2), x8 = mulx(x7, x);
    __m256i a = _mm256_set_m128i(x3, x), b = _mm256_set_m128i(x7, x5);
    __m256i step = _mm256_set_m128i(x8, x8);
    __m256i *v = (__m256i *)(void *)t;
    for (int i = 0;; i += 2) {
        _mm256_storeu_si256(v + i,
                            _mm256_xor_si256(_mm256_loadu_si256(v + i), a));
        _mm256_storeu_si256(
            v + i + 1, _mm256_xor_si256(_mm256_loadu_si256(v + i + 1), b));
        if (2 * (i + 2) >= RIBLT_PSUM_TERMS)
            break;
        a = mulx2(a, step);
        b = mulx2(b, step);
    }
}
/* y[j] += c * x[j] and y[j] *= c, for j < n: the loops of the decoder's
 * polynomial arithmetic, with the products inline. */
TARGET_CLMUL static void axpy_clmul(gf *y, const gf *c, const gf *x, int n)
{
    __m128i cv = _mm_loadu_si128((const __m128i *)(const void *)c);
    for (int j = 0; j < n; j++) {
        __m128i *yj = (__m128i *)(void *)&y[j];
        __m128i m =
            mulx(cv, _mm_loadu_si128((const __m128i *)(const void *)&x[j]));
        _mm_storeu_si128(yj, _mm_xor_si128(_mm_loadu_si128(yj), m));
    }
}

/* sum of c[j] * s[-j] for j < n (s points at the last term used). */
TARGET_CLMUL static gf dot_rev_clmul(const gf *c, const gf *s, int n)
{
    __m128i acc = _mm_setzero_si128();
    for (int j = 0; j < n; j++)
        acc = _mm_xor_si128(
            acc,
            mulx(_mm_loadu_si128((const __m128i *)(const void *)&c[j]),
                 _mm_loadu_si128((const __m128i *)(const void *)(s - j))));
    gf out;
    _mm_storeu_si128((__m128i *)(void *)&out, acc);
    return out;
}

TARGET_CLMUL static void scale_clmul(gf *y, const gf *c, int n)
{
    __m128i cv = _mm_loadu_si128((const __m128i *)(const void *)c);
    for (int j = 0; j < n; j++) {
        __m128i *yj = (__m128i *)(void *)&y[j];
        _mm_storeu_si128(yj, mulx(cv, _mm_loadu_si128(yj)));
    }
}
/* axpy_clmul two coefficients at a time. */
TARGET_VPCLMUL static void axpy_vpclmul(gf *y, const gf *c, const gf *x, int n)
{
    __m128i c1 = _mm_loadu_si128((const __m128i *)(const void *)c);
    __m256i cv = _mm256_set_m128i(c1, c1);
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        __m256i *yj = (__m256i *)(void *)&y[j];
        __m256i m = mulx2(
            cv, _mm256_loadu_si256((const __m256i *)(const void *)&x[j]));
        _mm256_storeu_si256(yj, _mm256_xor_si256(_mm256_loadu_si256(yj), m));
    }
    if (j < n) {
        __m128i *yj = (__m128i *)(void *)&y[j];
        __m128i m =
            mulx(c1, _mm_loadu_si128((const __m128i *)(const void *)&x[j]));
        _mm_storeu_si128(yj, _mm_xor_si128(_mm_loadu_si128(yj), m));
    }
}
#else
#define PSUM_CLMUL 0
static inline bool use_clmul(void)
{
    return false;
}
#endif

_Static_assert(RIBLT_PSUM_TERMS % 4 == 0, "toggle_clmul takes 4 terms a step");
_Static_assert(RIBLT_PSUM_BUCKETS == 8, "riblt_psum_bucket takes 3 bits");

int riblt_psum_level(void)
{
#if PSUM_CLMUL
    if (use_vpclmul())
        return RIBLT_PSUM_VPCLMUL;
    if (use_clmul())
        return RIBLT_PSUM_CLMUL;
#endif
    return RIBLT_PSUM_PORTABLE;
}

static inline gf gf_mul(const gf *a, const gf *b)
{
#if PSUM_CLMUL
    if (use_clmul())
        return mul_clmul(a, b);
#endif
    return mul_portable(a, b);
}

static void gf_axpy(gf *y, const gf *c, const gf *x, int n)
{
#if PSUM_CLMUL
    if (n >= 4 && use_vpclmul()) {
        axpy_vpclmul(y, c, x, n);
        return;
    }
    if (use_clmul()) {
        axpy_clmul(y, c, x, n);
        return;
    }
#endif
    for (int j = 0; j < n; j++) {
        gf m = mul_portable(c, &x[j]);
        y[j].lo ^= m.lo;
        y[j].hi ^= m.hi;
    }
}

static gf gf_dot_rev(const gf *c, const gf *s, int n)
{
#if PSUM_CLMUL
    if (use_clmul())
        return dot_rev_clmul(c, s, n);
#endif
    gf acc = {0, 0};
    for (int j = 0; j < n; j++) {
        gf m = mul_portable(&c[j], s - j);
        acc.lo ^= m.lo;
        acc.hi ^= m.hi;
    }
    return acc;
}

static void gf_scale(gf *y, const gf *c, int n)
{
#if PSUM_CLMUL
    if (use_clmul()) {
        scale_clmul(y, c, n);
        return;
    }
#endif
    for (int j = 0; j < n; j++)
        y[j] = mul_portable(c, &y[j]);
}

/* a^(2^128 - 2) = 1 / a for a nonzero a (Fermat): 127 squarings and 126
 * products. */
static gf gf_inv(const gf *a)
{
    gf p = *a, r = {1, 0};
    for (int i = 1; i < 128; i++) {
        p = gf_mul(&p, &p);
        r = gf_mul(&r, &p);
    }
    return r;
}

/* ============================================================= tables */

unsigned riblt_psum_bucket(uint64_t hash)
{
    return (unsigned)(hash >> 61);
}

void riblt_psum_toggle(riblt_id *table, const riblt_id *id, uint64_t hash)
{
    gf *t = table + (size_t)riblt_psum_bucket(hash) * RIBLT_PSUM_TERMS;
#if PSUM_CLMUL
    if (use_vpclmul()) {
        toggle_vpclmul(t, id);
        return;
    }
    if (use_clmul()) {
        toggle_clmul(t, id);
        return;
    }
#endif
    gf x2 = mul_portable(id, id), p = *id;
    for (int k = 0; k < RIBLT_PSUM_TERMS; k++) {
        t[k].lo ^= p.lo;
        t[k].hi ^= p.hi;
        if (k + 1 < RIBLT_PSUM_TERMS)
            p = mul_portable(&p, &x2);
    }
}

void riblt_psum_add(riblt_id *a, const riblt_id *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a[i].lo ^= b[i].lo;
        a[i].hi ^= b[i].hi;
    }
}

void riblt_psum_combine(const riblt_id *table, riblt_id *out)
{
    memset(out, 0, RIBLT_PSUM_TERMS * sizeof(*out));
    for (int b = 0; b < RIBLT_PSUM_BUCKETS; b++)
        riblt_psum_add(out, table + (size_t)b * RIBLT_PSUM_TERMS,
                       RIBLT_PSUM_TERMS);
}

/* ======================================================== polynomials */

/*
 * Polynomials over the field, coefficient k of x^k at index k. The
 * locator has degree below RIBLT_PSUM_TERMS.
 */
#define DEG_MAX (RIBLT_PSUM_TERMS - 1)

/* z (degree dz) modulo the monic f (degree df >= 1), in place: the rest
 * has degree below df. */
static void poly_mod(gf *z, int dz, const gf *f, int df)
{
    for (int k = dz; k >= df; k--) {
        gf c = z[k];
        if (gf_zero(&c))
            continue;
        gf_axpy(z + k - df, &c, f, df);
        z[k].lo = z[k].hi = 0;
    }
}

/* The degree of p (length n), -1 for the zero polynomial. */
static int poly_deg(const gf *p, int n)
{
    for (int k = n - 1; k >= 0; k--)
        if (!gf_zero(&p[k]))
            return k;
    return -1;
}

/* Makes p (degree d >= 0) monic. */
static void poly_monic(gf *p, int d)
{
    gf inv = gf_inv(&p[d]);
    for (int k = 0; k < d; k++)
        p[k] = gf_mul(&p[k], &inv);
    p[d].lo = 1;
    p[d].hi = 0;
}

/* z (degree dz) modulo b (degree db >= 1, any leading coefficient), up to
 * a nonzero constant factor: each step scales z by b's leading coefficient
 * instead of dividing by it, so no inverse is taken. In place. */
static void poly_prem(gf *z, int dz, const gf *b, int db)
{
    const gf *lb = &b[db];
    for (int k = dz; k >= db; k--) {
        gf c = z[k];
        if (gf_zero(&c))
            continue;
        gf_scale(z, lb, k);
        gf_axpy(z + k - db, &c, b, db);
        z[k].lo = z[k].hi = 0;
    }
}

/* g = gcd(a, b), monic, into a (length DEG_MAX + 1 both; a of degree da,
 * b of degree below that; both are clobbered). Returns its degree. The
 * remainders are taken up to constant factors, which a gcd ignores: one
 * inverse at the end instead of one a step. */
static int poly_gcd(gf *a, int da, gf *b)
{
    int db = poly_deg(b, DEG_MAX + 1);
    while (db >= 0) {
        if (db == 0)
            return 0; /* coprime */
        poly_prem(a, da, b, db);
        int dr = poly_deg(a, db);
        /* (a, b) <- (b, a mod b) */
        for (int k = 0; k <= DEG_MAX; k++) {
            gf t = a[k];
            a[k] = k <= db ? b[k] : (gf){0, 0};
            b[k] = k < db ? t : (gf){0, 0};
        }
        da = db;
        db = dr;
    }
    poly_monic(a, da);
    return da;
}

/* q = f / g for monic f (degree df) and g (degree dg) with g dividing f.
 * f is clobbered. */
static void poly_div(gf *f, int df, const gf *g, int dg, gf *q)
{
    memset(q, 0, (DEG_MAX + 1) * sizeof(gf));
    for (int k = df; k >= dg; k--) {
        gf c = f[k];
        q[k - dg] = c;
        if (gf_zero(&c))
            continue;
        gf_axpy(f + k - dg, &c, g, dg + 1);
    }
}

/* ============================================================== roots */

/*
 * Berlekamp's trace algorithm. For beta in the field, Tr(beta z) = sum of
 * (beta z)^(2^i), i < 128, is 0 or 1 for every z, so the polynomial
 * Tr(beta x) mod f is 0 on some roots of f and 1 on the others, and its
 * gcd with f takes the first ones apart. Two distinct roots differ under
 * Tr(beta .) for some basis element beta = x^k, so the basis, tried in
 * turn, splits f down to linear factors within 128 tries.
 *
 * Tr(beta x) mod f = sum of beta^(2^i) (x^(2^i) mod f): the 128 powers
 * x^(2^i) mod f are computed once (they also tell whether f splits), and
 * each try costs 128 scalar-by-polynomial products. A trace mod f, taken
 * mod a factor g of f, is the trace mod g: one try serves every factor.
 */
struct roots {
    gf frob[128][DEG_MAX + 1];    /* x^(2^i) mod f */
    gf rk[DEG_MAX][DEG_MAX + 1];  /* x^(2k) mod f, k >= ceil(deg f / 2) */
    gf fac[DEG_MAX][DEG_MAX + 1]; /* the factors found, monic */
    int deg[DEG_MAX];
    int nfac;
    gf t[DEG_MAX + 1], r[DEG_MAX + 1], g[DEG_MAX + 1], q[DEG_MAX + 1];
};

/* Fills frob for the monic f (degree df >= 2); true when f divides
 * x^(2^128) - x, that is, f is a product of distinct x - z. */
static bool frobenius(struct roots *rs, const gf *f, int df)
{
    /* y^2 = sum of y_k^2 x^(2k): below k0 = ceil(df / 2) the x^(2k) need
     * no reduction; from k0 on, rk[k - k0] = x^(2k) mod f, computed once
     * by steps of x. A squaring then costs df squares and df^2 / 2
     * products, against df^2 for a square reduced term by term. */
    int k0 = (df + 1) / 2;
    gf p[DEG_MAX + 1];
    memset(p, 0, sizeof(p));
    p[df - 1].lo = 1; /* x^(df - 1) */
    for (int e = df - 1, k = k0; k < df;) {
        /* p <- p * x mod f */
        gf top = p[df - 1];
        memmove(p + 1, p, (size_t)(df - 1) * sizeof(gf));
        p[0].lo = p[0].hi = 0;
        if (!gf_zero(&top))
            gf_axpy(p, &top, f, df);
        if (++e == 2 * k)
            memcpy(rs->rk[k++ - k0], p, sizeof(p));
    }
    gf u[DEG_MAX + 1];
    memset(u, 0, sizeof(u));
    u[1].lo = 1;
    for (int i = 0; i < 128; i++) {
        memcpy(rs->frob[i], u, sizeof(u));
        gf v[DEG_MAX + 1];
        memset(v, 0, sizeof(v));
        for (int k = 0; k < k0; k++)
            v[2 * k] = gf_mul(&u[k], &u[k]);
        for (int k = k0; k < df; k++) {
            gf sq = gf_mul(&u[k], &u[k]);
            if (!gf_zero(&sq))
                gf_axpy(v, &sq, rs->rk[k - k0], df);
        }
        memcpy(u, v, sizeof(u));
    }
    for (int k = 0; k < df; k++)
        if ((k == 1 ? u[k].lo != 1 : u[k].lo != 0) || u[k].hi != 0)
            return false;
    return true;
}

/* The roots of the monic f (degree df >= 2, a product of distinct linear
 * factors) into out. false when 128 tries left a factor unsplit, which
 * such an f cannot do. */
static bool find_roots(struct roots *rs, const gf *f, int df, gf *out)
{
    memcpy(rs->fac[0], f, sizeof(rs->fac[0]));
    rs->deg[0] = df;
    rs->nfac = 1;
    int linear = 0;
    for (int k = 0; k < 128 && linear < df; k++) {
        /* t = Tr(beta x) mod f, beta = x^k */
        gf beta = {k < 64 ? (uint64_t)1 << k : 0,
                   k >= 64 ? (uint64_t)1 << (k - 64) : 0};
        memset(rs->t, 0, sizeof(rs->t));
        for (int i = 0; i < 128; i++) {
            gf_axpy(rs->t, &beta, rs->frob[i], df);
            beta = gf_mul(&beta, &beta);
        }
        int nfac = rs->nfac;
        for (int a = 0; a < nfac; a++) {
            int dg = rs->deg[a];
            if (dg < 2)
                continue;
            memcpy(rs->r, rs->t, sizeof(rs->r));
            poly_mod(rs->r, df - 1, rs->fac[a], dg);
            for (int j = dg; j <= DEG_MAX; j++)
                rs->r[j].lo = rs->r[j].hi = 0;
            memcpy(rs->g, rs->fac[a], sizeof(rs->g));
            int dh = poly_gcd(rs->g, dg, rs->r);
            if (dh <= 0 || dh >= dg)
                continue;
            /* fac[a] = g * q: g stays at a, q goes to the end */
            poly_div(rs->fac[a], dg, rs->g, dh, rs->q);
            memcpy(rs->fac[rs->nfac], rs->q, sizeof(rs->q));
            rs->deg[rs->nfac] = dg - dh;
            memcpy(rs->fac[a], rs->g, sizeof(rs->g));
            rs->deg[a] = dh;
            linear += (dh == 1) + (dg - dh == 1);
            rs->nfac++;
        }
    }
    if (linear < df)
        return false;
    for (int a = 0; a < rs->nfac; a++)
        out[a] = rs->fac[a][0]; /* x + z */
    return true;
}

/* ============================================================= decode */

int riblt_psum_decode(const riblt_id *terms, size_t n, riblt_id *out,
                      size_t max, size_t *nout)
{
    if (terms == NULL || nout == NULL || n > RIBLT_PSUM_TERMS ||
        (out == NULL && max > 0))
        return RIBLT_ERR_INVAL;
    *nout = 0;
    if (n == 0)
        return RIBLT_NEED_MORE;

    /* The power sums s1..s2n: odd ones given, s(2j) = s(j)^2. */
    int N = (int)(2 * n);
    gf s[2 * RIBLT_PSUM_TERMS];
    for (int i = 0; i < N; i++)
        s[i] = (i % 2 == 0) ? terms[i / 2]
                            : gf_mul(&s[(i + 1) / 2 - 1], &s[(i + 1) / 2 - 1]);

    /*
     * Berlekamp-Massey without inversions: the connection polynomial C,
     * scaled by a nonzero constant, of the shortest recurrence the sums
     * satisfy. For a set X of d <= n ids it is prod (1 + x z), z in X, and
     * its length L is d.
     */
    gf C[2 * RIBLT_PSUM_TERMS + 1], B[2 * RIBLT_PSUM_TERMS + 1],
        T[2 * RIBLT_PSUM_TERMS + 1];
    memset(C, 0, sizeof(C));
    memset(B, 0, sizeof(B));
    C[0].lo = B[0].lo = 1;
    gf b = {1, 0};
    int L = 0, m = 1, dc = 0, db = 0; /* dc, db: bounds on the degrees */
    for (int i = 0; i < N; i++) {
        /* C[0] is the scale, not 1: it weighs s[i] too */
        gf d = gf_dot_rev(C, s + i, L + 1);
        if (gf_zero(&d)) {
            m++;
            continue;
        }
        bool grow = 2 * L <= i;
        if (grow)
            memcpy(T, C, (size_t)(dc + 1) * sizeof(gf));
        int dt = dc;
        /* C <- b C - d x^m B */
        gf_scale(C, &b, dc + 1);
        gf_axpy(C + m, &d, B, db + 1);
        if (db + m > dc)
            dc = db + m;
        if (grow) {
            L = i + 1 - L;
            /* L never falls: past n - 1 it cannot end at n - 1 or below */
            if ((size_t)L > n - 1)
                return RIBLT_NEED_MORE;
            memset(B, 0, sizeof(B));
            memcpy(B, T, (size_t)(dt + 1) * sizeof(gf));
            db = dt;
            b = d;
            m = 1;
        } else {
            m++;
        }
    }
    /* Taken only when the last term agreed with the recurrence: L at most
     * n - 1. A larger set gives L = n, or a smaller L by a chance of 2^-128
     * that the roots below then refuse. */
    if ((size_t)L > n - 1 || poly_deg(C, N + 1) != L)
        return RIBLT_NEED_MORE;
    if (L == 0)
        return RIBLT_OK;
    if ((size_t)L > max)
        return RIBLT_ERR_FULL;

    /* The ids are the roots of x^L C(1/x), made monic. */
    gf f[DEG_MAX + 1];
    memset(f, 0, sizeof(f));
    gf inv = gf_inv(&C[0]);
    for (int k = 0; k <= L; k++)
        f[k] = gf_mul(&C[L - k], &inv);
    if (L == 1) {
        out[0] = f[0]; /* x + z */
        *nout = 1;
        return RIBLT_OK;
    }
    struct roots *rs = malloc(sizeof(*rs));
    if (rs == NULL)
        return RIBLT_ERR_NOMEM;
    bool ok = frobenius(rs, f, L) && find_roots(rs, f, L, out);
    free(rs);
    if (!ok)
        return RIBLT_NEED_MORE;
    *nout = (size_t)L;
    return RIBLT_OK;
}
