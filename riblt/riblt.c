/*
 * riblt.c -- rateless IBLT: hashing, random mapping, encoder, decoder,
 * materialized sketch and the wire form of coded symbols.
 *
 * The coding follows Yang, Gilad and Alizadeh (SIGCOMM 2024): every source
 * id maps to coded symbol 0 and then to an increasing random sequence of
 * indices in which index i appears with probability ~1/(1 + i/2). The
 * sequence is driven by a 64-bit multiplicative PRNG seeded with the id's
 * hash, so any two parties compute the same mapping for the same id.
 *
 * Encoder and decoder both keep "windows": source entries together with the
 * state of their mapping and a min-heap keyed by the next index each entry
 * maps to. Producing coded symbol i pops every entry whose next index is i,
 * folds it into the cell, advances its mapping and sifts the root down in
 * place.
 */
#include "riblt.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/*
 * SSE4.1. A mapping's dependency chain from one index to the next holds a
 * ceil(). x86-64's baseline (SSE2) has no instruction for it, so the
 * compiler spells it as a sequence of several; SSE4.1's roundsd is one.
 * Where the CPU has it, the hot walks (the sketch's per-id walks and the
 * batch walk of encoder and decoder, window_walk) run a copy compiled for
 * it: the same IEEE operations, so the same indices bit for bit, about 28%
 * less time per sketch replace (525 -> 380 ns with the sketch in cache).
 * Elsewhere, and with other compilers, the portable copy.
 */
#if (defined(__x86_64__) || defined(__i386__)) &&                             \
    (defined(__GNUC__) || defined(__clang__))
#define RIBLT_SSE41_WALKS 1
#define RIBLT_TARGET_SSE41 __attribute__((target("sse4.1")))
static bool cpu_sse41(void)
{
    return __builtin_cpu_supports("sse4.1");
}
#else
#define RIBLT_SSE41_WALKS 0
static bool cpu_sse41(void)
{
    return false;
}
#endif

#if defined(__GNUC__) || defined(__clang__)
#define RIBLT_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define RIBLT_ALWAYS_INLINE inline
#endif

/* ============================================================== errors */

const char *riblt_strerror(int code)
{
    switch (code) {
    case RIBLT_OK:
        return "ok";
    case RIBLT_NEED_MORE:
        return "more coded symbols needed";
    case RIBLT_ERR_NOMEM:
        return "out of memory";
    case RIBLT_ERR_INVAL:
        return "invalid argument";
    case RIBLT_ERR_ORDER:
        return "call made in the wrong order";
    case RIBLT_ERR_FULL:
        return "capacity reached";
    case RIBLT_ERR_CORRUPT:
        return "inconsistent coded symbols";
    case RIBLT_ERR_SHORT:
        return "not enough coded symbols";
    case RIBLT_ERR_WIRE:
        return "malformed wire encoding";
    default:
        return "unknown error";
    }
}

/* ===================================================== ids and symbols */

/* Finalizer of splitmix64: a bijective 64-bit mixer with full avalanche. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

/*
 * The checksum hash must not be linear over XOR, or a cell holding several
 * ids could pass for a pure one: the multiplications make it non-linear.
 */
static inline uint64_t hash_words(uint64_t lo, uint64_t hi)
{
    return mix64(lo ^ mix64(hi ^ 0x6a09e667f3bcc908ULL));
}

uint64_t riblt_hash(const riblt_id *id)
{
    return hash_words(id->lo, id->hi);
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

void riblt_id_to_bytes(const riblt_id *id, uint8_t out[16])
{
    put_le64(out, id->lo);
    put_le64(out + 8, id->hi);
}

void riblt_id_from_bytes(riblt_id *id, const uint8_t in[16])
{
    id->lo = get_le64(in);
    id->hi = get_le64(in + 8);
}

int riblt_id_equal(const riblt_id *a, const riblt_id *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}

/*
 * Counts are added with unsigned arithmetic: wrapping is well defined there,
 * and honest counts never come near the limits (wire input is bounded by
 * RIBLT_COUNT_MAX).
 */
static inline int64_t count_add(int64_t a, int64_t b)
{
    return (int64_t)((uint64_t)a + (uint64_t)b);
}

void riblt_symbol_subtract(riblt_symbol *out, const riblt_symbol *a,
                           const riblt_symbol *b)
{
    out->sum.lo = a->sum.lo ^ b->sum.lo;
    out->sum.hi = a->sum.hi ^ b->sum.hi;
    out->hash = a->hash ^ b->hash;
    out->count = (int64_t)((uint64_t)a->count - (uint64_t)b->count);
}

int riblt_symbol_is_zero(const riblt_symbol *s)
{
    return s->sum.lo == 0 && s->sum.hi == 0 && s->hash == 0 && s->count == 0;
}

/* Folds one id into a cell, changing its count by delta. */
static inline void cell_apply(riblt_symbol *c, const riblt_id *id,
                              uint64_t hash, int64_t delta)
{
    c->sum.lo ^= id->lo;
    c->sum.hi ^= id->hi;
    c->hash ^= hash;
    c->count = count_add(c->count, delta);
}

/* A cell holding exactly one id (+1 or -1) whose checksum matches it. */
static inline bool cell_pure(const riblt_symbol *c)
{
    return (c->count == 1 || c->count == -1) &&
           c->hash == hash_words(c->sum.lo, c->sum.hi);
}

long riblt_symbols_encode(const riblt_symbol *syms, size_t n, uint8_t *buf,
                          size_t cap)
{
    if (n > cap / RIBLT_SYMBOL_WIRE_SIZE || (n > 0 && !buf) ||
        n > (size_t)(LONG_MAX / RIBLT_SYMBOL_WIRE_SIZE))
        return RIBLT_ERR_INVAL;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = buf + i * RIBLT_SYMBOL_WIRE_SIZE;
        put_le64(p, syms[i].sum.lo);
        put_le64(p + 8, syms[i].sum.hi);
        put_le64(p + 16, syms[i].hash);
        put_le64(p + 24, (uint64_t)syms[i].count);
    }
    return (long)(n * RIBLT_SYMBOL_WIRE_SIZE);
}

long riblt_symbols_decode(const uint8_t *buf, size_t len, riblt_symbol *out,
                          size_t max)
{
    if (len % RIBLT_SYMBOL_WIRE_SIZE != 0 || (len > 0 && !buf))
        return RIBLT_ERR_WIRE;
    size_t n = len / RIBLT_SYMBOL_WIRE_SIZE;
    if (n > max || n > (size_t)LONG_MAX)
        return RIBLT_ERR_FULL;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = buf + i * RIBLT_SYMBOL_WIRE_SIZE;
        int64_t count = (int64_t)get_le64(p + 24);
        if (count > RIBLT_COUNT_MAX || count < -RIBLT_COUNT_MAX)
            return RIBLT_ERR_WIRE;
        out[i].sum.lo = get_le64(p);
        out[i].sum.hi = get_le64(p + 8);
        out[i].hash = get_le64(p + 16);
        out[i].count = count;
    }
    return (long)n;
}

/* ====================================================== random mapping */

/* Used in place of a zero hash: a zero PRNG state would stay zero. */
#define MAPPING_ZERO_STATE 0x9e3779b97f4a7c15ULL

void riblt_mapping_init(riblt_mapping *m, uint64_t h)
{
    m->state = h ? h : MAPPING_ZERO_STATE;
    m->index = 0;
}

/* riblt_mapping_next's body, inlined into the walks (see "SSE4.1"). */
static RIBLT_ALWAYS_INLINE uint64_t mapping_next(riblt_mapping *m)
{
    if (m->index == UINT64_MAX)
        return UINT64_MAX;
    /* The multiplier is odd, so a non-zero state never becomes zero. */
    uint64_t r = m->state * 0xda942042e4dd58b5ULL;
    m->state = r;
    /*
     * diff = (i + 1.5) * ((1 - u)^(-1/2) - 1) with u = r / 2^64, written as
     * 2^32 / sqrt(r + 1) as in the paper's reference implementation.
     */
    double diff = ceil(((double)m->index + 1.5) *
                       (4294967296.0 / sqrt((double)r + 1.0) - 1.0));
    /* A double beyond the uint64 range cannot be cast: saturate first. */
    if (diff >= (double)(UINT64_MAX - m->index)) {
        m->index = UINT64_MAX;
    } else if (diff >= 1.0) {
        m->index += (uint64_t)diff;
    } else {
        m->index += 1; /* includes NaN, which compares false */
    }
    return m->index;
}

uint64_t riblt_mapping_next(riblt_mapping *m)
{
    return mapping_next(m);
}

/* ============================================================ windows */

/* A source entry with the state of its mapping. */
struct entry {
    riblt_id id;
    uint64_t hash;
    riblt_mapping map;
    int64_t sign; /* +1 added, -1 removed */
};

/* Heap node: the next index of entry `src`, kept here for locality. */
struct hnode {
    uint64_t index;
    size_t src;
};

/*
 * A window: entries plus, for the encoder, a min-heap of their next
 * indices (built lazily by window_heapify). `fixed` windows never grow past
 * their initial capacity (the decoder's peeled sets); windows without
 * `heaped` have no heap at all (the decoder's, which only walk).
 */
struct window {
    struct entry *e;
    struct hnode *heap;
    size_t n;
    size_t cap;
    bool fixed;
    bool heaped;
};

/*
 * Arrays of millions of entries are allocated on 2 MiB boundaries with a
 * request for transparent huge pages where the system has them: faulting
 * in tens of megabytes page by page costs more than the work done on them.
 */
#define BIG_ALLOC (4u << 20)

static void *big_alloc(size_t n)
{
    if (n < BIG_ALLOC)
        return malloc(n);
    void *p = NULL;
    if (posix_memalign(&p, 2u << 20, n) != 0)
        return NULL;
#ifdef MADV_HUGEPAGE
    madvise(p, n, MADV_HUGEPAGE); /* advice only: failure is harmless */
#endif
    return p;
}

/* realloc for big_alloc's arrays. */
static void *big_realloc(void *old, size_t oldn, size_t n)
{
    if (n < BIG_ALLOC)
        return realloc(old, n);
    void *p = big_alloc(n);
    if (!p)
        return NULL;
    if (old)
        memcpy(p, old, oldn < n ? oldn : n);
    free(old);
    return p;
}

static int window_init(struct window *w, size_t cap, bool fixed, bool heaped)
{
    memset(w, 0, sizeof(*w));
    w->fixed = fixed;
    w->heaped = heaped;
    if (cap == 0)
        return RIBLT_OK;
    w->e = big_alloc(cap * sizeof(*w->e));
    if (heaped)
        w->heap = big_alloc(cap * sizeof(*w->heap));
    if (!w->e || (heaped && !w->heap)) {
        free(w->e);
        free(w->heap);
        w->e = NULL;
        w->heap = NULL;
        return RIBLT_ERR_NOMEM;
    }
    w->cap = cap;
    return RIBLT_OK;
}

static void window_free(struct window *w)
{
    free(w->e);
    free(w->heap);
    memset(w, 0, sizeof(*w));
}

static int window_grow(struct window *w)
{
    if (w->fixed)
        return RIBLT_ERR_FULL;
    size_t ncap = w->cap ? w->cap * 2 : 64;
    if (ncap < w->cap || ncap > SIZE_MAX / sizeof(struct entry))
        return RIBLT_ERR_NOMEM;
    struct entry *e = big_realloc(w->e, w->n * sizeof(*e), ncap * sizeof(*e));
    if (!e)
        return RIBLT_ERR_NOMEM;
    w->e = e;
    if (w->heaped) {
        /* The heap is rebuilt before use: its contents need not move. */
        struct hnode *h = big_realloc(w->heap, 0, ncap * sizeof(*h));
        if (!h)
            return RIBLT_ERR_NOMEM;
        w->heap = h;
    }
    w->cap = ncap;
    return RIBLT_OK;
}

static void heap_sift_down(struct hnode *h, size_t n, size_t i)
{
    struct hnode x = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h[c + 1].index < h[c].index)
            c++;
        if (x.index <= h[c].index)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = x;
}

static void heap_build(struct hnode *h, size_t n)
{
    for (size_t i = n / 2; i-- > 0;)
        heap_sift_down(h, n, i);
}

/*
 * Appends an entry whose mapping is in state m. The heap is not touched:
 * whoever uses it rebuilds it first (window_heapify).
 */
static int window_push(struct window *w, const riblt_id *id, uint64_t hash,
                       const riblt_mapping *m, int64_t sign)
{
    if (w->n == w->cap) {
        int rc = window_grow(w);
        if (rc != RIBLT_OK)
            return rc;
    }
    size_t i = w->n++;
    w->e[i].id = *id;
    w->e[i].hash = hash;
    w->e[i].map = *m;
    w->e[i].sign = sign;
    return RIBLT_OK;
}

/*
 * Folds into `cell` every entry that maps to index idx, with count change
 * mult * sign, and advances those entries. Entries never lag behind idx:
 * callers apply consecutive indices (or seek first).
 */
static inline void window_apply(struct window *w, riblt_symbol *cell,
                                uint64_t idx, int64_t mult)
{
    struct hnode *h = w->heap;
    while (w->n > 0 && h[0].index == idx) {
        struct entry *e = &w->e[h[0].src];
        cell_apply(cell, &e->id, e->hash, mult * e->sign);
        h[0].index = mapping_next(&e->map);
        heap_sift_down(h, w->n, 0);
    }
}

/*
 * Advances every entry's mapping to the first index >= end, folding each
 * entry into out[index - pos] on the way when out is not NULL (entries
 * must not lag behind pos then). Four entries at a time, so that their
 * independent mapping computations (each a chain of multiply, sqrt and
 * divide) overlap in the CPU.
 */
#define WALK_APPLY(e)                                                         \
    do {                                                                      \
        if (out)                                                              \
            cell_apply(&out[(e)->map.index - pos], &(e)->id, (e)->hash,       \
                       (e)->sign);                                            \
        mapping_next(&(e)->map);                                              \
    } while (0)

static RIBLT_ALWAYS_INLINE void window_walk_body(struct window *w,
                                                 riblt_symbol *out,
                                                 uint64_t pos, uint64_t end)
{
    size_t i = 0, to = w->n;
    for (; i + 4 <= to; i += 4) {
        struct entry *e0 = &w->e[i], *e1 = &w->e[i + 1];
        struct entry *e2 = &w->e[i + 2], *e3 = &w->e[i + 3];
        for (;;) {
            bool a0 = e0->map.index < end, a1 = e1->map.index < end;
            bool a2 = e2->map.index < end, a3 = e3->map.index < end;
            if (!(a0 | a1 | a2 | a3))
                break;
            if (a0)
                WALK_APPLY(e0);
            if (a1)
                WALK_APPLY(e1);
            if (a2)
                WALK_APPLY(e2);
            if (a3)
                WALK_APPLY(e3);
        }
    }
    for (; i < to; i++) {
        struct entry *e = &w->e[i];
        while (e->map.index < end)
            WALK_APPLY(e);
    }
}

#undef WALK_APPLY

#if RIBLT_SSE41_WALKS
RIBLT_TARGET_SSE41 static void window_walk_sse41(struct window *w,
                                                 riblt_symbol *out,
                                                 uint64_t pos, uint64_t end)
{
    window_walk_body(w, out, pos, end);
}
#endif

/* The batch walk of encoder and decoder, in the CPU's best copy. */
static void window_walk(struct window *w, riblt_symbol *out, uint64_t pos,
                        uint64_t end)
{
#if RIBLT_SSE41_WALKS
    if (cpu_sse41()) {
        window_walk_sse41(w, out, pos, end);
        return;
    }
#endif
    window_walk_body(w, out, pos, end);
}

/*
 * Moves every mapping to the first index >= offset (from the beginning
 * when restart) and marks nothing: the caller rebuilds the heap when it
 * needs it (window_heapify).
 */
static void window_seek(struct window *w, uint64_t offset, bool restart)
{
    if (restart)
        for (size_t i = 0; i < w->n; i++)
            riblt_mapping_init(&w->e[i].map, w->e[i].hash);
    window_walk(w, NULL, 0, offset);
}

/* Rebuilds the heap from the entries' current mapping indices. */
static void window_heapify(struct window *w)
{
    for (size_t i = 0; i < w->n; i++) {
        w->heap[i].index = w->e[i].map.index;
        w->heap[i].src = i;
    }
    heap_build(w->heap, w->n);
}

/* ============================================================ encoder */

struct riblt_encoder {
    struct window w;
    uint64_t pos;    /* index of the next symbol to produce */
    bool started;    /* produce or seek called since the last reset */
    bool heap_stale; /* a walk or seek moved the mappings: rebuild the heap */
    uint64_t floor;  /* entries added at a tail are valid from here on */
};

riblt_encoder *riblt_encoder_create(size_t capacity_hint)
{
    riblt_encoder *enc = calloc(1, sizeof(*enc));
    if (!enc)
        return NULL;
    if (window_init(&enc->w, capacity_hint, false, true) != RIBLT_OK) {
        free(enc);
        return NULL;
    }
    return enc;
}

void riblt_encoder_destroy(riblt_encoder *enc)
{
    if (!enc)
        return;
    window_free(&enc->w);
    free(enc);
}

static int encoder_put(riblt_encoder *enc, const riblt_id *id, int64_t sign)
{
    if (!enc || !id)
        return RIBLT_ERR_INVAL;
    if (enc->started)
        return RIBLT_ERR_ORDER;
    riblt_mapping m;
    uint64_t h = riblt_hash(id);
    riblt_mapping_init(&m, h);
    enc->heap_stale = true;
    return window_push(&enc->w, id, h, &m, sign);
}

int riblt_encoder_add(riblt_encoder *enc, const riblt_id *id)
{
    return encoder_put(enc, id, 1);
}

int riblt_encoder_remove(riblt_encoder *enc, const riblt_id *id)
{
    return encoder_put(enc, id, -1);
}

int riblt_encoder_add_tail(riblt_encoder *enc, const riblt_id *id,
                           uint64_t hash, const riblt_tail *tail,
                           uint64_t base)
{
    if (!enc || !id || !tail || tail->index < base)
        return RIBLT_ERR_INVAL;
    if (enc->started)
        return RIBLT_ERR_ORDER;
    /* The PRNG state after `steps` steps: one multiply per step. */
    riblt_mapping m;
    riblt_mapping_init(&m, hash);
    for (uint32_t i = 0; i < tail->steps; i++)
        m.state *= 0xda942042e4dd58b5ULL;
    m.index = tail->index;
    if (base > enc->floor)
        enc->floor = base;
    enc->heap_stale = true;
    return window_push(&enc->w, id, hash, &m, 1);
}

size_t riblt_encoder_size(const riblt_encoder *enc)
{
    return enc ? enc->w.n : 0;
}

int riblt_encoder_seek(riblt_encoder *enc, uint64_t offset)
{
    if (!enc)
        return RIBLT_ERR_INVAL;
    /* Below the floor the tail entries miss cells: restart them all. */
    bool restart = offset < enc->pos || offset < enc->floor;
    if (offset != enc->pos || restart) {
        window_seek(&enc->w, offset, restart);
        enc->heap_stale = true;
        if (restart)
            enc->floor = 0;
    }
    enc->pos = offset;
    enc->started = true;
    return RIBLT_OK;
}

uint64_t riblt_encoder_position(const riblt_encoder *enc)
{
    return enc ? enc->pos : 0;
}

/*
 * A batch is produced by walking every entry's mapping through it instead
 * of popping the heap symbol by symbol when that is cheaper: the walk
 * visits every entry once (a compare for most) but does no heap sift; the
 * heap touches only the entries that map into the batch, about
 * N * 2 ln((pos + n) / pos) of them, at log N sifts each. The walk wins
 * once the batch is more than about 2% of its offset.
 */
#define ENCODER_BATCH_MIN 16
#define ENCODER_WALK_RATIO 50

int riblt_encoder_produce(riblt_encoder *enc, riblt_symbol *out, size_t n)
{
    if (!enc || (n > 0 && !out))
        return RIBLT_ERR_INVAL;
    if (n > UINT64_MAX - enc->pos)
        return RIBLT_ERR_INVAL;
    if (enc->pos < enc->floor)
        riblt_encoder_seek(enc, enc->pos);
    enc->started = true;
    memset(out, 0, n * sizeof(*out));
    if (n >= ENCODER_BATCH_MIN &&
        (uint64_t)n * ENCODER_WALK_RATIO >= enc->pos + 2) {
        window_walk(&enc->w, out, enc->pos, enc->pos + n);
        enc->heap_stale = true;
        enc->pos += n;
        return RIBLT_OK;
    }
    if (enc->heap_stale) {
        window_heapify(&enc->w);
        enc->heap_stale = false;
    }
    for (size_t i = 0; i < n; i++) {
        window_apply(&enc->w, &out[i], enc->pos, 1);
        enc->pos++;
    }
    return RIBLT_OK;
}

void riblt_encoder_reset(riblt_encoder *enc)
{
    if (!enc)
        return;
    enc->w.n = 0;
    enc->pos = 0;
    enc->started = false;
    enc->heap_stale = false;
    enc->floor = 0;
}

/* ============================================================ decoder */

enum dec_mode { DEC_NONE, DEC_CODED, DEC_DIFF };
enum dec_state { DEC_OPEN, DEC_DONE, DEC_FAILED };

/*
 * The decoder never pops a heap. What it must take out of each arriving
 * symbol (its own set in coded mode, and every id peeled so far) is
 * computed ahead for a batch of indices in `adj` by walking the windows'
 * mappings through the batch, as the encoder does. An id peeled in the
 * middle of a batch adds itself to the rest of the batch right away.
 * Batches grow with the index (1/16 of it, at least 64) so that each
 * walk over a large local set covers many symbols.
 */
#define DEC_BATCH_MIN 64
#define DEC_BATCH_SHIFT 4

struct riblt_decoder {
    size_t max;          /* cap on cells and on peeled ids */
    riblt_symbol *cells; /* received symbols, peeled in place */
    size_t ncells;
    riblt_symbol *adj; /* what to fold into symbols adj_base.. */
    size_t adj_cap;
    uint64_t adj_base;
    size_t adj_n;
    size_t *queue;   /* ring of cells that may be pure */
    uint8_t *queued; /* 1 while a cell sits in the ring */
    size_t qhead, qlen;
    struct window own;    /* the local set (sign -1), for add_coded */
    struct window remote; /* peeled ids only the remote holds (sign -1) */
    struct window local;  /* peeled ids only we hold (sign +1) */
    riblt_id *remote_ids; /* contiguous copies for the borrowed views */
    riblt_id *local_ids;
    enum dec_mode mode;
    enum dec_state state;
    int error;
};

riblt_decoder *riblt_decoder_create(size_t max_symbols)
{
    if (max_symbols == 0 || max_symbols > SIZE_MAX / sizeof(riblt_symbol))
        return NULL;
    riblt_decoder *d = calloc(1, sizeof(*d));
    if (!d)
        return NULL;
    d->max = max_symbols;
    d->adj_cap = (max_symbols >> DEC_BATCH_SHIFT) + DEC_BATCH_MIN;
    d->cells = malloc(max_symbols * sizeof(*d->cells));
    d->adj = malloc(d->adj_cap * sizeof(*d->adj));
    d->queue = malloc(max_symbols * sizeof(*d->queue));
    d->queued = calloc(max_symbols, 1);
    d->remote_ids = malloc(max_symbols * sizeof(*d->remote_ids));
    d->local_ids = malloc(max_symbols * sizeof(*d->local_ids));
    bool ok = d->cells && d->adj && d->queue && d->queued && d->remote_ids &&
              d->local_ids;
    ok = ok && window_init(&d->own, 0, false, false) == RIBLT_OK;
    ok = ok && window_init(&d->remote, max_symbols, true, false) == RIBLT_OK;
    ok = ok && window_init(&d->local, max_symbols, true, false) == RIBLT_OK;
    if (!ok) {
        riblt_decoder_destroy(d);
        return NULL;
    }
    return d;
}

void riblt_decoder_destroy(riblt_decoder *d)
{
    if (!d)
        return;
    free(d->cells);
    free(d->adj);
    free(d->queue);
    free(d->queued);
    free(d->remote_ids);
    free(d->local_ids);
    window_free(&d->own);
    window_free(&d->remote);
    window_free(&d->local);
    free(d);
}

int riblt_decoder_add_local(riblt_decoder *d, const riblt_id *id)
{
    if (!d || !id)
        return RIBLT_ERR_INVAL;
    if (d->mode != DEC_NONE || d->state != DEC_OPEN)
        return RIBLT_ERR_ORDER;
    riblt_mapping m;
    uint64_t h = riblt_hash(id);
    riblt_mapping_init(&m, h);
    return window_push(&d->own, id, h, &m, -1);
}

static void queue_push(riblt_decoder *d, size_t ci)
{
    if (d->queued[ci])
        return;
    d->queued[ci] = 1;
    size_t at = d->qhead + d->qlen;
    d->queue[at >= d->max ? at - d->max : at] = ci;
    d->qlen++;
}

/* Computes adj for the next batch of indices, starting at ncells. */
static void decoder_refill(riblt_decoder *d)
{
    uint64_t base = d->ncells;
    size_t n = (size_t)(base >> DEC_BATCH_SHIFT);
    if (n < DEC_BATCH_MIN)
        n = DEC_BATCH_MIN;
    if (n > d->adj_cap)
        n = d->adj_cap;
    if (n > d->max - d->ncells)
        n = d->max - d->ncells;
    memset(d->adj, 0, n * sizeof(*d->adj));
    window_walk(&d->own, d->adj, base, base + n);
    window_walk(&d->remote, d->adj, base, base + n);
    window_walk(&d->local, d->adj, base, base + n);
    d->adj_base = base;
    d->adj_n = n;
}

/*
 * Appends one remote (coded mode) or difference symbol as cell ncells,
 * after taking out every id already peeled and, for remote symbols, the
 * local set.
 */
static int decoder_feed(riblt_decoder *d, const riblt_symbol *sym,
                        enum dec_mode mode)
{
    if (!d || !sym)
        return RIBLT_ERR_INVAL;
    if (d->state != DEC_OPEN || (d->mode != DEC_NONE && d->mode != mode))
        return RIBLT_ERR_ORDER;
    if (mode == DEC_DIFF && d->own.n > 0)
        return RIBLT_ERR_ORDER;
    if (d->ncells == d->max)
        return RIBLT_ERR_FULL;
    d->mode = mode;
    if (d->ncells == d->adj_base + d->adj_n)
        decoder_refill(d);
    size_t i = d->ncells;
    const riblt_symbol *a = &d->adj[i - d->adj_base];
    riblt_symbol c = *sym;
    c.sum.lo ^= a->sum.lo;
    c.sum.hi ^= a->sum.hi;
    c.hash ^= a->hash;
    c.count = count_add(c.count, a->count);
    d->cells[i] = c;
    d->ncells++;
    if (cell_pure(&c))
        queue_push(d, i);
    return RIBLT_OK;
}

int riblt_decoder_add_coded(riblt_decoder *d, const riblt_symbol *sym)
{
    return decoder_feed(d, sym, DEC_CODED);
}

int riblt_decoder_add_diff(riblt_decoder *d, const riblt_symbol *sym)
{
    return decoder_feed(d, sym, DEC_DIFF);
}

static int decoder_fail(riblt_decoder *d, int rc)
{
    d->state = DEC_FAILED;
    d->error = rc;
    return rc;
}

/*
 * Peels the pure cell ci: removes its id from every received cell it maps
 * to (queueing cells that become pure) and from the rest of the current
 * batch, and records the id with its mapping advanced past the batch, so
 * later batches take it out of symbols as they arrive.
 */
static int decoder_peel(riblt_decoder *d, size_t ci)
{
    riblt_symbol c = d->cells[ci];
    bool is_remote = c.count == 1;
    struct window *w = is_remote ? &d->remote : &d->local;
    /* More ids than cells cannot come from honest symbols. */
    if (d->remote.n + d->local.n >= d->max)
        return RIBLT_ERR_CORRUPT;
    riblt_mapping m;
    riblt_mapping_init(&m, c.hash);
    int64_t delta = -c.count;
    while (m.index < d->ncells) {
        riblt_symbol *x = &d->cells[m.index];
        cell_apply(x, &c.sum, c.hash, delta);
        if (cell_pure(x))
            queue_push(d, (size_t)m.index);
        riblt_mapping_next(&m);
    }
    uint64_t end = d->adj_base + d->adj_n;
    while (m.index < end) {
        cell_apply(&d->adj[m.index - d->adj_base], &c.sum, c.hash, delta);
        riblt_mapping_next(&m);
    }
    riblt_id *ids = is_remote ? d->remote_ids : d->local_ids;
    ids[w->n] = c.sum;
    return window_push(w, &c.sum, c.hash, &m, delta);
}

int riblt_decoder_decode(riblt_decoder *d)
{
    if (!d)
        return RIBLT_ERR_INVAL;
    if (d->state == DEC_DONE)
        return RIBLT_OK;
    if (d->state == DEC_FAILED)
        return d->error;
    while (d->qlen > 0) {
        size_t ci = d->queue[d->qhead];
        d->qhead = d->qhead + 1 == d->max ? 0 : d->qhead + 1;
        d->qlen--;
        d->queued[ci] = 0;
        /* Re-check: on adversarial input a queued cell can change again. */
        if (!cell_pure(&d->cells[ci]))
            continue;
        int rc = decoder_peel(d, ci);
        if (rc != RIBLT_OK)
            return decoder_fail(d, rc);
    }
    if (d->ncells == 0 || !riblt_symbol_is_zero(&d->cells[0]))
        return RIBLT_NEED_MORE;
    /* Cell 0 holds every remaining difference: all others must be empty. */
    for (size_t i = 1; i < d->ncells; i++)
        if (!riblt_symbol_is_zero(&d->cells[i]))
            return decoder_fail(d, RIBLT_ERR_CORRUPT);
    d->state = DEC_DONE;
    return RIBLT_OK;
}

size_t riblt_decoder_symbols(const riblt_decoder *d)
{
    return d ? d->ncells : 0;
}

const riblt_id *riblt_decoder_remote(const riblt_decoder *d, size_t *n)
{
    if (n)
        *n = d ? d->remote.n : 0;
    return d ? d->remote_ids : NULL;
}

const riblt_id *riblt_decoder_local(const riblt_decoder *d, size_t *n)
{
    if (n)
        *n = d ? d->local.n : 0;
    return d ? d->local_ids : NULL;
}

void riblt_decoder_reset(riblt_decoder *d)
{
    if (!d)
        return;
    /* Clear only what may be set: cells that were queued and peeled. */
    while (d->qlen > 0) {
        d->queued[d->queue[d->qhead]] = 0;
        d->qhead = d->qhead + 1 == d->max ? 0 : d->qhead + 1;
        d->qlen--;
    }
    d->qhead = 0;
    d->ncells = 0;
    d->adj_base = 0;
    d->adj_n = 0;
    d->own.n = 0;
    d->remote.n = 0;
    d->local.n = 0;
    d->mode = DEC_NONE;
    d->state = DEC_OPEN;
    d->error = 0;
}

/* ============================================================= sketch */

struct riblt_sketch {
    size_t n;
    bool sse41; /* the walks may use SSE4.1 (see "SSE4.1" above) */
    riblt_symbol cells[];
};

riblt_sketch *riblt_sketch_create(size_t nsymbols)
{
    if (nsymbols == 0 ||
        nsymbols > (SIZE_MAX - sizeof(riblt_sketch)) / sizeof(riblt_symbol))
        return NULL;
    riblt_sketch *sk =
        calloc(1, sizeof(*sk) + nsymbols * sizeof(riblt_symbol));
    if (!sk)
        return NULL;
    sk->n = nsymbols;
    sk->sse41 = cpu_sse41();
    return sk;
}

void riblt_sketch_destroy(riblt_sketch *sk)
{
    free(sk);
}

bool riblt_sketch_portable(riblt_sketch *sk)
{
    bool was = sk->sse41;
    sk->sse41 = false;
    return was;
}

size_t riblt_sketch_size(const riblt_sketch *sk)
{
    return sk->n;
}

/*
 * The sketch walks a mapping only while its index is below the sketch size
 * (far below 2^53), so the index can stay a double: integers that small
 * are exact in double arithmetic, and the sequence is bit for bit the one
 * riblt_mapping_next gives, without an int/double conversion on the
 * dependency chain of every step.
 */
static inline double mapping_step(uint64_t *state, double idx)
{
    uint64_t r = *state * 0xda942042e4dd58b5ULL;
    *state = r;
    double d =
        ceil((idx + 1.5) * (4294967296.0 / sqrt((double)r + 1.0) - 1.0));
    return idx + (d >= 1.0 ? d : 1.0);
}

/*
 * A walk computes its indices first, prefetching each cell as its index
 * becomes known, and folds the id into the cells at the end. Past the
 * first thousand or so, a sketch's cells are each touched by a few ids in
 * a thousand and are rarely in the cache of a node whose items and
 * connections share it; the mapping's chain (multiply, sqrt, divide) does
 * not depend on the cells, so its arithmetic hides their loads instead of
 * waiting on each in turn. Cells take an id in any order (XOR and wrapping
 * add); a walk longer than a batch (rare: about 17 steps are expected in
 * 8192 symbols) folds batch by batch.
 */
#define WALK_BATCH 32

struct walk_cells {
    uint32_t n;
    size_t at[WALK_BATCH];
};

static RIBLT_ALWAYS_INLINE void walk_fold(riblt_sketch *sk,
                                          struct walk_cells *w,
                                          const riblt_id *id, uint64_t hash,
                                          int64_t delta)
{
    for (uint32_t i = 0; i < w->n; i++)
        cell_apply(&sk->cells[w->at[i]], id, hash, delta);
    w->n = 0;
}

static RIBLT_ALWAYS_INLINE void walk_visit(riblt_sketch *sk,
                                           struct walk_cells *w, double idx,
                                           const riblt_id *id, uint64_t hash,
                                           int64_t delta)
{
    size_t i = (size_t)idx;
    __builtin_prefetch(&sk->cells[i], 1);
    w->at[w->n++] = i;
    if (w->n == WALK_BATCH)
        walk_fold(sk, w, id, hash, delta);
}

static RIBLT_ALWAYS_INLINE void walk1_body(riblt_sketch *sk,
                                           const riblt_id *id, uint64_t hash,
                                           int64_t delta, riblt_tail *tail)
{
    uint64_t state = hash ? hash : MAPPING_ZERO_STATE;
    double end = (double)sk->n, idx = 0;
    uint32_t steps = 0;
    struct walk_cells w;
    w.n = 0;
    for (; idx < end; idx = mapping_step(&state, idx), steps++)
        walk_visit(sk, &w, idx, id, hash, delta);
    walk_fold(sk, &w, id, hash, delta);
    if (tail) {
        /* Exact: a step from below 2^24 cannot pass 2^53. */
        tail->index = (uint64_t)idx;
        tail->steps = steps;
    }
}

/*
 * Two walks interleaved: their steps are independent, so the CPU overlaps
 * the two chains of multiply, sqrt and divide.
 */
static RIBLT_ALWAYS_INLINE void walk2_body(riblt_sketch *sk, const riblt_id *a,
                                           uint64_t ha, int64_t da,
                                           const riblt_id *b, uint64_t hb,
                                           int64_t db, riblt_tail *btail)
{
    uint64_t sa = ha ? ha : MAPPING_ZERO_STATE;
    uint64_t sb = hb ? hb : MAPPING_ZERO_STATE;
    double end = (double)sk->n, ia = 0, ib = 0;
    uint32_t bsteps = 0;
    struct walk_cells wa, wb;
    wa.n = wb.n = 0;
    while (ia < end && ib < end) {
        walk_visit(sk, &wa, ia, a, ha, da);
        walk_visit(sk, &wb, ib, b, hb, db);
        ia = mapping_step(&sa, ia);
        ib = mapping_step(&sb, ib);
        bsteps++;
    }
    for (; ia < end; ia = mapping_step(&sa, ia))
        walk_visit(sk, &wa, ia, a, ha, da);
    for (; ib < end; ib = mapping_step(&sb, ib), bsteps++)
        walk_visit(sk, &wb, ib, b, hb, db);
    walk_fold(sk, &wa, a, ha, da);
    walk_fold(sk, &wb, b, hb, db);
    if (btail) {
        btail->index = (uint64_t)ib;
        btail->steps = bsteps;
    }
}

#if RIBLT_SSE41_WALKS
RIBLT_TARGET_SSE41 static void walk1_sse41(riblt_sketch *sk,
                                           const riblt_id *id, uint64_t hash,
                                           int64_t delta, riblt_tail *tail)
{
    walk1_body(sk, id, hash, delta, tail);
}

RIBLT_TARGET_SSE41 static void walk2_sse41(riblt_sketch *sk, const riblt_id *a,
                                           uint64_t ha, int64_t da,
                                           const riblt_id *b, uint64_t hb,
                                           int64_t db, riblt_tail *btail)
{
    walk2_body(sk, a, ha, da, b, hb, db, btail);
}
#endif

static void sketch_walk(riblt_sketch *sk, const riblt_id *id, uint64_t hash,
                        int64_t delta, riblt_tail *tail)
{
#if RIBLT_SSE41_WALKS
    if (sk->sse41) {
        walk1_sse41(sk, id, hash, delta, tail);
        return;
    }
#endif
    walk1_body(sk, id, hash, delta, tail);
}

static void sketch_walk2(riblt_sketch *sk, const riblt_id *a, uint64_t ha,
                         int64_t da, const riblt_id *b, uint64_t hb,
                         int64_t db, riblt_tail *btail)
{
#if RIBLT_SSE41_WALKS
    if (sk->sse41) {
        walk2_sse41(sk, a, ha, da, b, hb, db, btail);
        return;
    }
#endif
    walk2_body(sk, a, ha, da, b, hb, db, btail);
}

void riblt_sketch_replace_hashed(riblt_sketch *sk, const riblt_id *old_id,
                                 uint64_t old_hash, const riblt_id *new_id,
                                 uint64_t new_hash)
{
    sketch_walk2(sk, old_id, old_hash, -1, new_id, new_hash, 1, NULL);
}

void riblt_sketch_replace_tail(riblt_sketch *sk, const riblt_id *old_id,
                               uint64_t old_hash, const riblt_id *new_id,
                               uint64_t new_hash, riblt_tail *new_tail)
{
    sketch_walk2(sk, old_id, old_hash, -1, new_id, new_hash, 1, new_tail);
}

void riblt_sketch_add_tail(riblt_sketch *sk, const riblt_id *id, uint64_t hash,
                           riblt_tail *tail)
{
    sketch_walk(sk, id, hash, 1, tail);
}

void riblt_sketch_add_hashed(riblt_sketch *sk, const riblt_id *id,
                             uint64_t hash)
{
    sketch_walk(sk, id, hash, 1, NULL);
}

void riblt_sketch_remove_hashed(riblt_sketch *sk, const riblt_id *id,
                                uint64_t hash)
{
    sketch_walk(sk, id, hash, -1, NULL);
}

void riblt_sketch_add(riblt_sketch *sk, const riblt_id *id)
{
    sketch_walk(sk, id, riblt_hash(id), 1, NULL);
}

void riblt_sketch_remove(riblt_sketch *sk, const riblt_id *id)
{
    sketch_walk(sk, id, riblt_hash(id), -1, NULL);
}

int riblt_sketch_read(const riblt_sketch *sk, size_t offset, riblt_symbol *out,
                      size_t n)
{
    if (!sk || (n > 0 && !out) || offset > sk->n || n > sk->n - offset)
        return RIBLT_ERR_INVAL;
    memcpy(out, sk->cells + offset, n * sizeof(*out));
    return RIBLT_OK;
}

const riblt_symbol *riblt_sketch_cells(const riblt_sketch *sk)
{
    return sk->cells;
}

int64_t riblt_sketch_count(const riblt_sketch *sk)
{
    return sk->cells[0].count;
}

int riblt_sketch_subtract(riblt_sketch *a, const riblt_sketch *b)
{
    if (!a || !b || a->n != b->n)
        return RIBLT_ERR_INVAL;
    for (size_t i = 0; i < a->n; i++)
        riblt_symbol_subtract(&a->cells[i], &a->cells[i], &b->cells[i]);
    return RIBLT_OK;
}

void riblt_sketch_clear(riblt_sketch *sk)
{
    memset(sk->cells, 0, sk->n * sizeof(riblt_symbol));
}

int riblt_sketch_decode(const riblt_sketch *sk, riblt_decoder *dec)
{
    if (!sk || !dec)
        return RIBLT_ERR_INVAL;
    if (dec->ncells != 0 || dec->mode != DEC_NONE)
        return RIBLT_ERR_ORDER;
    for (size_t i = 0; i < sk->n; i++) {
        int rc = riblt_decoder_add_diff(dec, &sk->cells[i]);
        if (rc != RIBLT_OK)
            return rc;
    }
    int rc = riblt_decoder_decode(dec);
    return rc == RIBLT_NEED_MORE ? RIBLT_ERR_SHORT : rc;
}
