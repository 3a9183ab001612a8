/*
 * riblt_psum.h -- power sums of a set of ids: the code for small
 * differences.
 *
 * R-IBLT needs 1.6-1.75 coded symbols a difference below about 50
 * differences (riblt.h gives the mean beyond). Power sums need one 16-byte
 * term a difference, half a coded symbol, at any size they cover.
 *
 * The ids are taken as elements of GF(2^128) (bit i of lo is the
 * coefficient of x^i, bit i of hi that of x^(64+i), modulo
 * x^128 + x^7 + x^2 + x + 1). The k-th term of a set is the sum of the
 * (2k+1)-th powers of its ids. In characteristic 2, a sum taken over two
 * sets cancels what they share, so the terms of A plus the terms of B are
 * the terms of their symmetric difference. The even powers follow from
 * the odd ones (s(2j) = s(j)^2), so n terms determine any difference of at
 * most n - 1 ids, and decoding a prefix of the terms tells whether it did.
 * That is the syndrome decoding of binary BCH codes (Berlekamp-Massey,
 * then the roots of the error locator).
 *
 * A table splits the ids by their riblt_hash into RIBLT_PSUM_BUCKETS
 * buckets of RIBLT_PSUM_TERMS terms each. A change of the set costs
 * RIBLT_PSUM_TERMS field multiplications (its bucket only), and the table
 * covers differences of several times RIBLT_PSUM_TERMS: about
 * RIBLT_PSUM_TERMS / 2 in one bucket, times the buckets. The sum of the
 * buckets (riblt_psum_combine) is the table of one bucket for the whole
 * set, which covers a difference of up to RIBLT_PSUM_TERMS - 1 ids at one
 * term each.
 *
 * A table is a plain array of RIBLT_PSUM_SIZE riblt_ids, owned by the
 * caller; bucket b's terms are [b * RIBLT_PSUM_TERMS, (b + 1) *
 * RIBLT_PSUM_TERMS). An all-zero array is the table of the empty set. The
 * functions keep no state; only decoding allocates (its scratch). The id 0 has
 * every term zero, so it is invisible to power sums: callers check a decoded
 * difference against another sum of the ids (coded symbol 0's sum and
 * hash) before they trust it.
 */
#ifndef RIBLT_PSUM_H
#define RIBLT_PSUM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "riblt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RIBLT_PSUM_BUCKETS 8
#define RIBLT_PSUM_TERMS 32
#define RIBLT_PSUM_SIZE (RIBLT_PSUM_BUCKETS * RIBLT_PSUM_TERMS)

/* Size of one term on the wire (riblt_id_to_bytes). */
#define RIBLT_PSUM_TERM_WIRE_SIZE 16

/* The bucket of an id whose riblt_hash is hash. */
unsigned riblt_psum_bucket(uint64_t hash);

/*
 * Adds or takes out (the same operation) an id with riblt_hash hash:
 * RIBLT_PSUM_TERMS multiplications in its bucket.
 */
void riblt_psum_toggle(riblt_id *table, const riblt_id *id, uint64_t hash);

/* a += b for n terms (ids XORed): the table of the symmetric difference
 * when a and b are two sets' tables. */
void riblt_psum_add(riblt_id *a, const riblt_id *b, size_t n);

/* out gets the sum of the table's buckets: RIBLT_PSUM_TERMS terms, those of
 * the whole set. */
void riblt_psum_combine(const riblt_id *table, riblt_id *out);

/*
 * Decodes the set whose first n terms are terms[0..n): n at most
 * RIBLT_PSUM_TERMS. RIBLT_OK when the terms are those of a set of at most
 * n - 1 nonzero ids: they are written to out (room for max) and counted
 * in *nout. RIBLT_NEED_MORE when they are not (the set is larger, or n is
 * too small to tell); RIBLT_ERR_FULL when the set is larger than max;
 * RIBLT_ERR_INVAL on bad arguments; RIBLT_ERR_NOMEM when the 97 KiB it
 * takes to find roots cannot be had. Work is bounded by n whatever the
 * terms (0.39 ms for 31 ids on one x86-64 core, 0.07 ms for 8).
 */
int riblt_psum_decode(const riblt_id *terms, size_t n, riblt_id *out,
                      size_t max, size_t *nout);

/*
 * The code that multiplies: portable C; the CPU's carry-less multiply
 * (PCLMULQDQ); and, for toggles, its 256-bit form (VPCLMULQDQ with AVX2).
 * All give the same results. riblt_psum_level() is the one in use: the
 * fastest the CPU has, at most the limit. riblt_psum_limit() sets the
 * limit (default RIBLT_PSUM_VPCLMUL), for tests that compare the codes
 * and for measurements, and returns the previous one. Process-wide: set it
 * before other threads use power sums. On one x86-64 core a toggle costs
 * 2.1 us portably, 131 ns with PCLMULQDQ and 89 ns with VPCLMULQDQ.
 */
#define RIBLT_PSUM_PORTABLE 0
#define RIBLT_PSUM_CLMUL 1
#define RIBLT_PSUM_VPCLMUL 2
int riblt_psum_level(void);
int riblt_psum_limit(int level);

#ifdef __cplusplus
}
#endif

#endif /* RIBLT_PSUM_H */
