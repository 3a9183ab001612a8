/*
 * chunk.c -- item memory: fine size classes carved from 64 KiB pages (see
 * chunk.h for the contract).
 *
 * A page is CHUNK_PAGE bytes aligned to CHUNK_PAGE, so a chunk finds its
 * page, and through it its class, by masking its address. The page header
 * comes first, then the chunks. A fresh page is carved lazily (a bump
 * counter); freed chunks go on the page's own free list, linked through
 * their first word. A class keeps the pages that have a free chunk on a
 * doubly linked list, so that allocation takes the first of them and a
 * page that empties can leave from anywhere in it.
 *
 * Why per page rather than per class free lists: a page knows when its
 * last chunk comes back, so memory a class no longer needs leaves the
 * class instead of staying with it (memcached keeps a slab page with its
 * class until it is moved on purpose).
 *
 * Pages come from regions of REGION_PAGES pages mapped with mmap, not from
 * the general allocator: jemalloc serves a 64 KiB allocation aligned to
 * 64 KiB from a larger extent whose rest it hands to other allocations, and
 * with items in them that cost 15-20 % more resident memory than the pages
 * themselves (a node at -m 64 holding 1000-byte values: 86 MiB resident
 * against 74 with mmap). An empty page goes to a pool of free pages with
 * madvise(MADV_DONTNEED), so its memory leaves the process while the
 * address range stays for the next page; regions are never unmapped
 * (address space only), and a few thousand of them stay well inside the
 * kernel's limit on mappings.
 */
#include "chunk.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#define CHUNK_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CHUNK_ASAN 1
#endif
#endif
#ifdef CHUNK_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

struct cclass;

struct cpage {
    struct cclass *cls;
    struct cpage *prev, *next; /* the class's pages with a free chunk */
    void *free;                /* freed chunks of this page */
    uint32_t used;             /* chunks handed out */
    uint32_t carved;           /* chunks carved so far */
};

#define HDR 48u
#define USABLE (CHUNK_PAGE - HDR)
_Static_assert(sizeof(struct cpage) <= HDR, "the page header fits");
_Static_assert(HDR % 8 == 0, "chunks stay 8-byte aligned");

struct cclass {
    pthread_mutex_t lock;
    uint32_t size;       /* bytes a chunk */
    uint32_t per_page;   /* chunks a page */
    struct cpage *avail; /* pages with a free chunk */
    struct cpage *spare; /* one empty page kept */
};

#define NCLASSES_MAX 160
static struct cclass classes[NCLASSES_MAX];
static unsigned nclasses;
/* class_of[(n + 7) / 8]: the class for a request of n bytes. */
static uint8_t class_of[CHUNK_MAX / 8 + 1];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static _Atomic uint64_t n_pages, n_chunk_bytes;

/* The page pool: regions mapped so far, pages not in use. */
#define REGION_PAGES 64u
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cpage *pool_free; /* linked through next */
static char *region_next;       /* uncarved pages of the newest region */
static unsigned region_left;

/* A page of the pool, or NULL when no more can be mapped. */
static struct cpage *pool_get(void)
{
    struct cpage *pg = NULL;

    pthread_mutex_lock(&pool_lock);
    if (pool_free != NULL) {
        pg = pool_free;
        pool_free = pg->next;
    } else {
        if (region_left == 0) {
            /* One page more than needed, to align the start. */
            size_t len = (size_t)(REGION_PAGES + 1) * CHUNK_PAGE;
            char *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (m != MAP_FAILED) {
                uintptr_t a = ((uintptr_t)m + CHUNK_PAGE - 1) &
                              ~(uintptr_t)(CHUNK_PAGE - 1);
                size_t lead = a - (uintptr_t)m;
                if (lead != 0)
                    munmap(m, lead);
                munmap((char *)a + (size_t)REGION_PAGES * CHUNK_PAGE,
                       CHUNK_PAGE - lead);
                region_next = (char *)a;
                region_left = REGION_PAGES;
                POISON(region_next, (size_t)REGION_PAGES * CHUNK_PAGE);
            }
        }
        if (region_left != 0) {
            pg = (struct cpage *)region_next;
            region_next += CHUNK_PAGE;
            region_left--;
        }
    }
    pthread_mutex_unlock(&pool_lock);
    if (pg != NULL) {
        UNPOISON(pg, sizeof(*pg));
        atomic_fetch_add_explicit(&n_pages, 1, memory_order_relaxed);
    }
    return pg;
}

/* Gives a page's memory back to the system and its place to the pool. */
static void pool_put(struct cpage *pg)
{
    UNPOISON(pg, CHUNK_PAGE);
    (void)madvise(pg, CHUNK_PAGE, MADV_DONTNEED);
    POISON((char *)pg + HDR, USABLE);
    atomic_fetch_sub_explicit(&n_pages, 1, memory_order_relaxed);
    pthread_mutex_lock(&pool_lock);
    pg->next = pool_free;
    pool_free = pg;
    pthread_mutex_unlock(&pool_lock);
}

static void add_class(uint32_t size)
{
    struct cclass *c = &classes[nclasses++];

    pthread_mutex_init(&c->lock, NULL);
    c->size = size;
    c->per_page = USABLE / size;
}

/*
 * The classes: every 8 bytes from 16 to 512, every 16 to 1 KiB, every 32
 * to 2 KiB; above, the largest 8-byte multiple that fits n chunks in a
 * page, for n = 31 down to 8 (no tail left in the page, at most 1/n between
 * two classes).
 */
static void init_classes(void)
{
    uint32_t sz;

    for (sz = 16; sz <= 512; sz += 8)
        add_class(sz);
    for (sz = 528; sz <= 1024; sz += 16)
        add_class(sz);
    for (sz = 1056; sz <= 2048; sz += 32)
        add_class(sz);
    for (uint32_t n = 31; n >= 8; n--) {
        sz = USABLE / n & ~7u;
        if (sz > classes[nclasses - 1].size)
            add_class(sz);
    }
    unsigned ci = 0;
    for (uint32_t i = 0; i <= CHUNK_MAX / 8; i++) {
        while (classes[ci].size < i * 8)
            ci++;
        class_of[i] = (uint8_t)ci;
    }
}

_Static_assert(NCLASSES_MAX <= 256, "class indices fit a byte");

static inline struct cclass *class_for(size_t n)
{
    pthread_once(&once, init_classes);
    return &classes[class_of[(n + 7) / 8]];
}

size_t chunk_size(size_t n)
{
    if (n == 0 || n > CHUNK_MAX)
        return 0;
    return class_for(n)->size;
}

static void avail_push(struct cclass *c, struct cpage *pg)
{
    pg->prev = NULL;
    pg->next = c->avail;
    if (c->avail != NULL)
        c->avail->prev = pg;
    c->avail = pg;
}

static void avail_remove(struct cclass *c, struct cpage *pg)
{
    if (pg->prev != NULL)
        pg->prev->next = pg->next;
    else
        c->avail = pg->next;
    if (pg->next != NULL)
        pg->next->prev = pg->prev;
    pg->prev = pg->next = NULL;
}

static struct cpage *page_new(struct cclass *c)
{
    struct cpage *pg = c->spare;

    if (pg != NULL) {
        c->spare = NULL;
    } else {
        pg = pool_get();
        if (pg == NULL)
            return NULL;
    }
    memset(pg, 0, sizeof(*pg));
    pg->cls = c;
    return pg;
}

static void page_release(struct cclass *c, struct cpage *pg)
{
    if (c->spare == NULL) {
        c->spare = pg;
        return;
    }
    pool_put(pg);
}

void *chunk_alloc(size_t n)
{
    struct cclass *c;
    struct cpage *pg;
    char *p;

    if (n == 0 || n > CHUNK_MAX)
        return NULL;
    c = class_for(n);
    pthread_mutex_lock(&c->lock);
    pg = c->avail;
    if (pg == NULL) {
        pg = page_new(c);
        if (pg == NULL) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        avail_push(c, pg);
    }
    if (pg->free != NULL) {
        p = pg->free;
        UNPOISON(p, c->size);
        memcpy(&pg->free, p, sizeof(void *));
    } else {
        p = (char *)pg + HDR + (size_t)pg->carved++ * c->size;
        UNPOISON(p, c->size);
    }
    if (++pg->used == c->per_page)
        avail_remove(c, pg);
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_add_explicit(&n_chunk_bytes, c->size, memory_order_relaxed);
    return p;
}

void chunk_free(void *p)
{
    struct cpage *pg;
    struct cclass *c;

    if (p == NULL)
        return;
    pg = (struct cpage *)((uintptr_t)p & ~(uintptr_t)(CHUNK_PAGE - 1));
    c = pg->cls;
    pthread_mutex_lock(&c->lock);
    memcpy(p, &pg->free, sizeof(void *));
    POISON(p, c->size);
    pg->free = p;
    if (pg->used-- == c->per_page)
        avail_push(c, pg);
    if (pg->used == 0) {
        avail_remove(c, pg);
        page_release(c, pg);
    }
    pthread_mutex_unlock(&c->lock);
    atomic_fetch_sub_explicit(&n_chunk_bytes, c->size, memory_order_relaxed);
}

void chunk_stats_read(chunk_stats *out)
{
    out->pages = atomic_load_explicit(&n_pages, memory_order_relaxed);
    out->chunk_bytes =
        atomic_load_explicit(&n_chunk_bytes, memory_order_relaxed);
}
