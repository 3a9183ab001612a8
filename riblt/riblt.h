/*
 * riblt.h -- rateless invertible Bloom lookup tables (R-IBLT).
 *
 * The public interface of the riblt library: set reconciliation over sets of
 * 16-byte ids (Yang, Gilad, Alizadeh, "Practical Rateless Set
 * Reconciliation", SIGCOMM 2024). Every set defines an infinite stream of
 * coded symbols; a peer holding another set needs about 1.35 * d symbols of
 * that stream to learn the d ids in which the two sets differ.
 *
 * Pieces:
 *   riblt_id / riblt_symbol   source ids and coded symbols, their hash and
 *                             their little-endian wire form;
 *   riblt_encoder             produces the stream for a set from any offset;
 *   riblt_decoder             peels a stream (or a difference stream) into
 *                             the ids each side alone holds;
 *   riblt_sketch              a materialized prefix of S coded symbols,
 *                             updated in place as ids come and go.
 *
 * The library depends on libc (and libm) only. Functions return RIBLT_OK (0)
 * or a negative RIBLT_ERR_* code; riblt_strerror() names it. A call made in
 * the wrong order returns RIBLT_ERR_ORDER instead of corrupting state. None of
 * the objects is thread-safe: callers serialize access to each one.
 * Allocation happens at creation and, amortized, while an encoder or decoder
 * takes in its source set; producing, consuming and peeling coded symbols
 * never allocates.
 */
#ifndef RIBLT_H
#define RIBLT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ errors */

#define RIBLT_OK 0
#define RIBLT_NEED_MORE 1    /* decoder: not decoded yet, send more symbols */
#define RIBLT_ERR_NOMEM (-1) /* allocation failed */
#define RIBLT_ERR_INVAL (-2) /* bad argument (NULL, zero size, mismatch) */
#define RIBLT_ERR_ORDER (-3) /* call made in the wrong order */
#define RIBLT_ERR_FULL (-4)  /* a capacity given at creation is reached */
#define RIBLT_ERR_CORRUPT                                                     \
    (-5)                     /* symbols are inconsistent with any two sets    \
                              */
#define RIBLT_ERR_SHORT (-6) /* not enough symbols to decode */
#define RIBLT_ERR_WIRE (-7)  /* malformed wire encoding */

/* Returns a static, human-readable name for a RIBLT_* code. */
const char *riblt_strerror(int code);

/* ------------------------------------------------------- ids and symbols */

/*
 * A source id: 16 bytes. In memory it is two 64-bit words; its byte form
 * (riblt_id_to_bytes) is lo then hi, each little-endian, on every host.
 */
typedef struct riblt_id {
    uint64_t lo;
    uint64_t hi;
} riblt_id;

/*
 * A coded symbol: the XOR of the ids mapped to it, the XOR of their hashes,
 * and how many were added minus how many were removed (or, in a difference
 * stream, remote count minus local count).
 */
typedef struct riblt_symbol {
    riblt_id sum;
    uint64_t hash;
    int64_t count;
} riblt_symbol;

/* Size of one coded symbol on the wire: sum (16) + hash (8) + count (8). */
#define RIBLT_SYMBOL_WIRE_SIZE 32

/*
 * Largest |count| a decoded wire symbol may carry. Bounding it keeps every
 * subtraction of two symbols free of signed overflow.
 */
#define RIBLT_COUNT_MAX ((int64_t)1 << 62)

/* The 64-bit hash of an id used for checksums and for the random mapping. */
uint64_t riblt_hash(const riblt_id *id);

void riblt_id_to_bytes(const riblt_id *id, uint8_t out[16]);
void riblt_id_from_bytes(riblt_id *id, const uint8_t in[16]);

/* 1 when the two ids are equal, else 0. */
int riblt_id_equal(const riblt_id *a, const riblt_id *b);

/* out = a - b, cell by cell: XOR of sums and hashes, difference of counts. */
void riblt_symbol_subtract(riblt_symbol *out, const riblt_symbol *a,
                           const riblt_symbol *b);

/* 1 when the symbol is all zeros (empty cell), else 0. */
int riblt_symbol_is_zero(const riblt_symbol *s);

/*
 * Writes n symbols to buf in wire form. cap is buf's size in bytes; returns
 * the number of bytes written (n * RIBLT_SYMBOL_WIRE_SIZE), or
 * RIBLT_ERR_INVAL when cap is too small.
 */
long riblt_symbols_encode(const riblt_symbol *syms, size_t n, uint8_t *buf,
                          size_t cap);

/*
 * Reads len bytes of wire symbols into out (room for max symbols). Returns
 * the number of symbols read, RIBLT_ERR_WIRE when len is not a multiple of
 * RIBLT_SYMBOL_WIRE_SIZE or a count exceeds RIBLT_COUNT_MAX in magnitude,
 * RIBLT_ERR_FULL when the buffer holds more than max symbols. On error
 * nothing of out is meaningful.
 */
long riblt_symbols_decode(const uint8_t *buf, size_t len, riblt_symbol *out,
                          size_t max);

/* -------------------------------------------------------------- encoder */

typedef struct riblt_encoder riblt_encoder;

/*
 * Creates an empty encoder with room for capacity_hint source ids (it grows
 * beyond that as ids are added). Returns NULL when out of memory.
 */
riblt_encoder *riblt_encoder_create(size_t capacity_hint);
void riblt_encoder_destroy(riblt_encoder *enc);

/*
 * Adds (remove: subtracts) a source id. Only allowed before the first
 * produce/seek since the last reset: RIBLT_ERR_ORDER afterwards. Removing an
 * id is recorded as a negative entry, so add(x) then remove(x) leave the
 * stream as if x had never been added.
 */
int riblt_encoder_add(riblt_encoder *enc, const riblt_id *id);
int riblt_encoder_remove(riblt_encoder *enc, const riblt_id *id);

/* Number of entries (adds plus removes) held. */
size_t riblt_encoder_size(const riblt_encoder *enc);

/*
 * Moves the stream position to offset, skipping the symbols in between
 * without computing them (each id's mapping is advanced; the heap is rebuilt
 * once). Seeking backwards restarts the mappings from their beginning.
 */
int riblt_encoder_seek(riblt_encoder *enc, uint64_t offset);

/* Index of the next symbol riblt_encoder_produce will write. */
uint64_t riblt_encoder_position(const riblt_encoder *enc);

/*
 * Where an id's mapping leaves a sketch of S symbols: its first index >= S
 * and the number of mapping steps taken to get there (the PRNG state is
 * the initial one advanced that many times). Recorded by
 * riblt_sketch_add_tail / riblt_sketch_replace_tail, so that an encoder
 * for the stream beyond the sketch can start each id there
 * (riblt_encoder_add_tail) instead of walking its mapping again.
 */
typedef struct riblt_tail {
    uint64_t index;
    uint32_t steps;
} riblt_tail;

/*
 * Adds an id whose mapping stands at tail (recorded by a sketch of `base`
 * symbols; tail->index >= base). Producing or seeking below base restarts
 * every mapping from its beginning, which is correct but slow: callers
 * seek to base or beyond first. Same call-order rules as riblt_encoder_add.
 */
int riblt_encoder_add_tail(riblt_encoder *enc, const riblt_id *id,
                           uint64_t hash, const riblt_tail *tail,
                           uint64_t base);

/* Writes the next n coded symbols of the stream to out. */
int riblt_encoder_produce(riblt_encoder *enc, riblt_symbol *out, size_t n);

/* Forgets every id and returns to position 0; keeps the memory. */
void riblt_encoder_reset(riblt_encoder *enc);

/* -------------------------------------------------------------- decoder */

typedef struct riblt_decoder riblt_decoder;

/*
 * Creates a decoder that accepts at most max_symbols coded symbols (the cap
 * of one reconciliation) and so yields at most that many ids. Returns NULL
 * when out of memory or max_symbols is 0.
 */
riblt_decoder *riblt_decoder_create(size_t max_symbols);
void riblt_decoder_destroy(riblt_decoder *dec);

/*
 * Adds an id to the decoder's local set, to be subtracted from full remote
 * symbols given to riblt_decoder_add_coded. Only before the first symbol:
 * RIBLT_ERR_ORDER afterwards.
 */
int riblt_decoder_add_local(riblt_decoder *dec, const riblt_id *id);

/*
 * Feeds the next symbol of the remote stream. add_coded takes a remote
 * symbol and subtracts the local set itself; add_diff takes a symbol from
 * which the caller already subtracted its own symbol at the same index. A
 * decoder takes one kind only (RIBLT_ERR_ORDER on mixing, or on add_diff
 * after add_local). RIBLT_ERR_FULL once max_symbols were fed. Peeling is
 * deferred to riblt_decoder_decode.
 */
int riblt_decoder_add_coded(riblt_decoder *dec, const riblt_symbol *sym);
int riblt_decoder_add_diff(riblt_decoder *dec, const riblt_symbol *sym);

/*
 * Peels every symbol it can. Returns RIBLT_OK when the difference is fully
 * known (coded symbol 0 is empty and so is every other cell),
 * RIBLT_NEED_MORE when more symbols are needed, RIBLT_ERR_CORRUPT when the
 * symbols cannot come from two sets (cell 0 empty while others are not, or
 * more ids peeled than symbols received). Work is bounded by the symbols
 * received; it never loops forever on adversarial input. After RIBLT_OK or
 * an error, further symbols are refused with RIBLT_ERR_ORDER until reset.
 */
int riblt_decoder_decode(riblt_decoder *dec);

/* Number of coded symbols fed since creation or the last reset. */
size_t riblt_decoder_symbols(const riblt_decoder *dec);

/*
 * The ids only the remote side holds (remote) and only the local side holds
 * (local), found so far. Borrowed: valid until the next call that feeds,
 * decodes, resets or destroys the decoder.
 */
const riblt_id *riblt_decoder_remote(const riblt_decoder *dec, size_t *n);
const riblt_id *riblt_decoder_local(const riblt_decoder *dec, size_t *n);

/* Empties the decoder (local set included); keeps the memory. */
void riblt_decoder_reset(riblt_decoder *dec);

/* --------------------------------------------------------------- sketch */

typedef struct riblt_sketch riblt_sketch;

/*
 * Creates a sketch of the empty set: the first nsymbols coded symbols,
 * materialized. Returns NULL when out of memory or nsymbols is 0.
 */
riblt_sketch *riblt_sketch_create(size_t nsymbols);
void riblt_sketch_destroy(riblt_sketch *sk);

/*
 * A sketch walks its ids' mappings with code compiled for the CPU's SSE4.1
 * where it has it, the same cells bit for bit. This makes sk use the
 * portable code whatever the CPU: for tests that compare the two, and
 * measurements. Returns whether sk used the SSE4.1 code until now.
 */
bool riblt_sketch_portable(riblt_sketch *sk);

size_t riblt_sketch_size(const riblt_sketch *sk);

/*
 * Adds (remove: takes out) one id, touching only the cells its mapping hits
 * below nsymbols (about 2 ln(nsymbols) of them). Never allocates.
 */
void riblt_sketch_add(riblt_sketch *sk, const riblt_id *id);
void riblt_sketch_remove(riblt_sketch *sk, const riblt_id *id);

/*
 * Same, with the id's riblt_hash precomputed by the caller (who may keep
 * hashes alongside ids to save the work).
 */
void riblt_sketch_add_hashed(riblt_sketch *sk, const riblt_id *id,
                             uint64_t hash);
void riblt_sketch_remove_hashed(riblt_sketch *sk, const riblt_id *id,
                                uint64_t hash);

/*
 * Removes old_id and adds new_id in one pass (the two walks interleaved,
 * which is faster than two calls). Hashes as riblt_hash gives them.
 */
void riblt_sketch_replace_hashed(riblt_sketch *sk, const riblt_id *old_id,
                                 uint64_t old_hash, const riblt_id *new_id,
                                 uint64_t new_hash);

/* Same as riblt_sketch_add_hashed / _replace_hashed, recording the new
 * id's tail (see riblt_tail). */
void riblt_sketch_add_tail(riblt_sketch *sk, const riblt_id *id, uint64_t hash,
                           riblt_tail *tail);
void riblt_sketch_replace_tail(riblt_sketch *sk, const riblt_id *old_id,
                               uint64_t old_hash, const riblt_id *new_id,
                               uint64_t new_hash, riblt_tail *new_tail);

/*
 * Copies n symbols starting at offset into out. RIBLT_ERR_INVAL when the
 * range leaves the sketch.
 */
int riblt_sketch_read(const riblt_sketch *sk, size_t offset, riblt_symbol *out,
                      size_t n);

/* Borrowed view of all cells; valid until the sketch changes or dies. */
const riblt_symbol *riblt_sketch_cells(const riblt_sketch *sk);

/* Coded symbol 0's count: the number of ids in the set. */
int64_t riblt_sketch_count(const riblt_sketch *sk);

/* a -= b cell by cell. RIBLT_ERR_INVAL when the sizes differ. */
int riblt_sketch_subtract(riblt_sketch *a, const riblt_sketch *b);

/* Zeroes every cell. */
void riblt_sketch_clear(riblt_sketch *sk);

/*
 * Feeds every cell of sk, taken as difference symbols, to dec (which must be
 * fresh or reset) and decodes. Returns RIBLT_OK when decoded,
 * RIBLT_ERR_SHORT when the sketch is too short for the difference, or the
 * decoder's error.
 */
int riblt_sketch_decode(const riblt_sketch *sk, riblt_decoder *dec);

/* ------------------------------------------------------ random mapping */

/*
 * The random mapping of one id onto coded symbol indices: 0 first, then an
 * increasing sequence in which index i appears with probability about
 * 1 / (1 + i / 2). Exposed for tests and for callers that walk a mapping
 * themselves.
 */
typedef struct riblt_mapping {
    uint64_t state; /* PRNG state, never zero */
    uint64_t index; /* the current index */
} riblt_mapping;

/* Starts the mapping of an id with hash h (index 0). */
void riblt_mapping_init(riblt_mapping *m, uint64_t h);

/* Advances to and returns the next index (saturates at UINT64_MAX). */
uint64_t riblt_mapping_next(riblt_mapping *m);

#ifdef __cplusplus
}
#endif

#endif /* RIBLT_H */
