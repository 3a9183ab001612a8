/*
 * repl_place.c -- placement (replicas > 0): the ring of live members that
 * maps partitions to owners, rebuilt on the tick as members come and go;
 * the partitions this node owns, is catching up on, or still holds after
 * losing them, and the hand-off that drops those; the route the client
 * threads read to relay a request to an owner; and `stats ring`.
 *
 * Threading: the ring, owned, lost_ns and the rest of the placement state
 * belong to the replication thread (repl_ring_refresh runs under plock,
 * which the stats reader takes). repl_route and repl_emit_ring_stats run
 * on any thread: they read the published route under the read side of
 * rlock and the per-partition arrays with relaxed atomics.
 */
#include "repl_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ========================================================== partitions */

/* A round covering these partitions completed: the owned ones caught up. */
void repl_parts_mark_ready(struct repl *r, const uint32_t *parts, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (parts[i] < r->P && r->owned[parts[i]])
            ASTORE(r->ready[parts[i]], 1);
}

/*
 * The partitions a round with peer reconciles, ascending into out (room
 * for P + 1): those both own, and those this node lost but still holds
 * that the peer owns (the hand-off), and the global partition last. Full
 * replication: the one partition, 0.
 */
size_t repl_round_parts(struct repl *r, uint32_t peer, uint32_t *out)
{
    if (!repl_partitioned(r)) {
        out[0] = 0;
        return 1;
    }
    size_t n = 0;
    for (uint32_t p = 0; p < r->P; p++)
        if ((r->owned[p] || r->lost_ns[p]) && ring_is_owner(r->ring, p, peer))
            out[n++] = p;
    out[n++] = r->P;
    return n;
}

/* Bytes of the partition bitmap a round request carries (P + 1 bits). */
size_t repl_parts_bitmap_size(const struct repl *r)
{
    return ((size_t)r->P + 1 + 7) / 8;
}

/* =============================================================== ring */

/* What the client threads read: a copy of the ring and the client
 * addresses of its members. Immutable once published. */
struct route_member {
    uint32_t node;
    bool self;
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char name[REPL_LINK_ADDR_MAX + 1];
};

struct route {
    ring *ring;
    ring *prev;        /* the ring before the last change, or NULL */
    uint64_t prev_end; /* until when (repl_now_ns) prev orders reads */
    size_t n;
    struct route_member m[]; /* sorted by node id */
};

void repl_route_free(struct route *rt)
{
    if (!rt)
        return;
    ring_destroy(rt->ring);
    ring_destroy(rt->prev);
    free(rt);
}

/* Copies the current ring and addresses and swaps them in for readers. */
static void route_publish(struct repl *r)
{
    size_t n = ring_size(r->ring);
    ring_member *m = calloc(n ? n : 1, sizeof(*m));
    struct route *rt = calloc(1, sizeof(*rt) + n * sizeof(rt->m[0]));
    if (!m || !rt || !(rt->ring = ring_clone(r->ring, NULL)) ||
        (r->prev_ring && !(rt->prev = ring_clone(r->prev_ring, NULL)))) {
        free(m);
        repl_route_free(rt);
        r->republish = true; /* try again next tick */
        return;
    }
    ring_members(r->ring, m, n);
    rt->n = n;
    /* A ring change publishes at once: the new owners catch up within
     * about ring_handoff_ms, and reads prefer the old ones until then. */
    rt->prev_end = r->ring_changed_ns + (uint64_t)r->o.handoff_ms * 1000000ull;
    for (size_t i = 0; i < n; i++) {
        struct route_member *rm = &rt->m[i];
        rm->node = m[i].node;
        if (m[i].node == r->o.node_id) {
            rm->self = true;
            rm->addr = r->adv_addr;
            rm->addrlen = r->adv_len;
            snprintf(rm->name, sizeof(rm->name), "%s", r->advertise);
            continue;
        }
        for (int j = 0; j < r->npeers; j++) {
            struct peer *p = &r->peers[j];
            if (!p->vacant && p->info && p->node_id == m[i].node) {
                rm->addr = p->client_addr;
                rm->addrlen = p->client_addrlen;
                snprintf(rm->name, sizeof(rm->name), "%s", p->client);
                break;
            }
        }
    }
    free(m);
    pthread_rwlock_wrlock(&r->rlock);
    struct route *old = r->route;
    r->route = rt;
    pthread_rwlock_unlock(&r->rlock);
    repl_route_free(old);
    r->republish = false;
}

static int cmp_member(const void *a, const void *b)
{
    const ring_member *x = a, *y = b;
    return x->node < y->node ? -1 : x->node > y->node;
}

/*
 * Rebuilds the ring when its membership changed: this node, and every
 * peer whose INFO arrived, with our P and R, that is alive (registry
 * members: not dead in the view; static peers: connected, or down for
 * less than down_ms). Partitions gained start catching up; partitions
 * lost are remembered as held until handed off.
 */
void repl_ring_refresh(struct repl *r, uint64_t now)
{
    ring_member m[PEER_MAX + 1], cur[PEER_MAX + 1];
    size_t n = 0;
    m[n++] = (ring_member){r->o.node_id, r->o.ring_weight};
    for (int i = 0; i < r->npeers; i++) {
        struct peer *p = &r->peers[i];
        if (p->vacant || p->self || !p->info || p->node_id == 0 ||
            p->node_id == r->o.node_id || p->client_addrlen == 0 ||
            p->info_partitions != r->P || p->info_replicas != r->o.replicas)
            continue;
        bool alive = p->origin == PEER_REGISTRY || p->origin == PEER_ETCD
                         ? p->member != REGISTRY_DEAD
                         : repl_peer_ready(p) ||
                               (p->down_since_ns != 0 &&
                                now - p->down_since_ns <
                                    (uint64_t)r->o.down_ms * 1000000ull);
        if (!alive)
            continue;
        bool dup = false;
        for (size_t k = 0; k < n; k++)
            dup |= m[k].node == p->node_id;
        if (!dup)
            m[n++] = (ring_member){p->node_id, p->weight};
    }
    qsort(m, n, sizeof(m[0]), cmp_member);
    size_t ncur = ring_members(r->ring, cur, PEER_MAX + 1);
    if (ncur == n && memcmp(cur, m, n * sizeof(m[0])) == 0) {
        if (r->republish)
            route_publish(r);
        return;
    }
    ring *next = ring_clone(r->ring, NULL);
    if (!next || ring_set_members(next, m, n) != RING_OK) {
        ring_destroy(next);
        return;
    }
    for (uint32_t p = 0; p < r->P; p++) {
        bool own = ring_is_owner(next, p, r->o.node_id);
        if (own && !r->owned[p]) {
            ASTORE(r->owned[p], 1);
            ASTORE(r->ready[p], 0);
            ASTORE(r->lost_ns[p], 0);
            r->gained_ns[p] = now;
        } else if (!own && r->owned[p]) {
            ASTORE(r->owned[p], 0);
            ASTORE(r->ready[p], 0);
            ASTORE(r->lost_ns[p], now);
        }
    }
    ring_destroy(r->prev_ring);
    r->prev_ring = r->ring;
    r->ring = next;
    r->ring_changed_ns = now;
    r->ring_gen++;
    repl_rounds_wanted(r);
    PST_ADD(&r->st, ring_changes, 1);
    size_t nown = 0;
    for (uint32_t p = 0; p < r->P; p++)
        nown += r->owned[p] ? 1 : 0;
    LOG(LOG_LEVEL_INFO, "ring",
        "ring changed (generation %llu): %zu members, this node owns %zu of "
        "%u partitions",
        (unsigned long long)r->ring_gen, ring_size(r->ring), nown,
        (unsigned)r->P);
    route_publish(r);
}

/*
 * True when every owner of lost partition p has completed a round with us
 * under the current ring that started after the last change to p here:
 * each holds what we hold, and p may go.
 */
static bool handed_off(struct repl *r, uint32_t p)
{
    uint64_t changed = ALOAD(r->changed_ns[p]);
    const uint32_t *own = ring_owners_ref(r->ring, p);
    size_t k = ring_owner_count(r->ring);
    for (size_t i = 0; i < k; i++) {
        struct peer *peer = NULL;
        for (int j = 0; j < r->npeers && !peer; j++)
            if (!r->peers[j].vacant && r->peers[j].node_id == own[i])
                peer = &r->peers[j];
        if (!peer || peer->ok_gen != r->ring_gen ||
            peer->ok_started_ns <= changed)
            return false;
    }
    return k > 0;
}

/*
 * Every tick: partitions changed here that we do not own become held
 * (a write served while rings disagreed); held partitions empty again are
 * forgotten; held partitions past the hand-off time whose owners all
 * have what we hold are dropped, a bounded number of mutations a tick.
 */
void repl_handoff_tick(struct repl *r, uint64_t now)
{
    size_t n = 0;
    /* Alone in the ring since start-up for ring_down_ms: nobody else holds
     * anything, what we hold is all there is. */
    bool alone = ring_size(r->ring) == 1 &&
                 now - r->started_ns >= (uint64_t)r->o.down_ms * 1000000ull;
    for (uint32_t p = 0; p < r->P; p++) {
        if (r->owned[p]) {
            /* Catching up ends with a round covering p with another
             * owner (repl_parts_mark_ready). Without another owner there is
             * no such round: then once the holders have had
             * ring_handoff_ms to hand it over. */
            if (!r->ready[p] &&
                (alone || (ring_owner_count(r->ring) == 1 &&
                           now - r->gained_ns[p] >=
                               (uint64_t)r->o.handoff_ms * 1000000ull)))
                ASTORE(r->ready[p], 1);
            continue;
        }
        if (!r->lost_ns[p] && ALOAD(r->changed_ns[p]) > r->last_tick_ns)
            ASTORE(r->lost_ns[p], now);
        if (!r->lost_ns[p])
            continue;
        uint64_t muts = 0;
        store_partition_stats(r->s, p, &muts, NULL, NULL);
        if (muts == 0) {
            ASTORE(r->lost_ns[p], 0);
            continue;
        }
        if (now - r->lost_ns[p] < (uint64_t)r->o.handoff_ms * 1000000ull ||
            !handed_off(r, p))
            continue;
        r->parts_buf[n++] = p;
    }
    r->last_tick_ns = now;
    if (n == 0)
        return;
    size_t k = store_drop_partitions(r->s, r->parts_buf, n, DROP_BUDGET);
    PST_ADD(&r->st, items_dropped, k);
    for (size_t i = 0; i < n; i++) {
        uint64_t muts = 0;
        store_partition_stats(r->s, r->parts_buf[i], &muts, NULL, NULL);
        if (muts == 0) {
            ASTORE(r->lost_ns[r->parts_buf[i]], 0);
            PST_ADD(&r->st, partitions_dropped, 1);
        }
    }
}

/* ============================================================= set-up */

/*
 * With replicas > 0: checks that the store is partitioned like the ring,
 * resolves our client address, and starts from a ring of this node alone
 * (it owns everything until peers are learnt).
 */
int repl_placement_setup(struct repl *r, char *err, size_t nerr)
{
    const repl_options *o = &r->o;
    snprintf(r->advertise, sizeof(r->advertise), "%s",
             o->advertise ? o->advertise : "");
    if (o->replicas == 0)
        return REPL_OK;
    if (o->ring_partitions == 0 || o->ring_partitions > RING_MAX_PARTITIONS ||
        store_partitions(r->s) != o->ring_partitions) {
        snprintf(err, nerr, "the store is not partitioned as ring_partitions");
        return REPL_ERR_CONFIG;
    }
    if (o->ring_weight == 0 || o->ring_weight > RING_MAX_WEIGHT) {
        snprintf(err, nerr, "ring_weight must be 1..%u", RING_MAX_WEIGHT);
        return REPL_ERR_CONFIG;
    }
    if (!r->advertise[0] ||
        repl_link_resolve("advertise", r->advertise, strlen(r->advertise),
                          &r->adv_addr, &r->adv_len, err, nerr) != 0) {
        if (!r->advertise[0])
            snprintf(err, nerr,
                     "replicas > 0 needs advertise (host:port of this "
                     "node's client port)");
        return REPL_ERR_CONFIG;
    }
    r->P = o->ring_partitions;
    size_t n = (size_t)r->P + 1;
    r->owned = calloc(n, 1);
    r->ready = calloc(n, 1);
    r->changed_ns = calloc(n, sizeof(uint64_t));
    r->lost_ns = calloc(n, sizeof(uint64_t));
    r->gained_ns = calloc(n, sizeof(uint64_t));
    r->parts_buf = calloc(n, sizeof(uint32_t));
    int rc = 0;
    r->ring = ring_create(r->P, o->replicas, &rc);
    if (!r->owned || !r->ready || !r->changed_ns || !r->lost_ns ||
        !r->gained_ns || !r->parts_buf || !r->ring ||
        ring_add(r->ring, o->node_id, o->ring_weight) != RING_OK) {
        snprintf(err, nerr, "out of memory");
        return REPL_ERR_NOMEM;
    }
    /* A node starts owning everything (it is alone in its ring) and
     * holding nothing: every partition but the global one catches up. */
    r->started_ns = repl_now_ns();
    memset(r->owned, 1, n);
    r->ready[r->P] = 1;
    for (size_t p = 0; p < n; p++)
        r->gained_ns[p] = r->started_ns;
    route_publish(r);
    if (!r->route) {
        snprintf(err, nerr, "out of memory");
        return REPL_ERR_NOMEM;
    }
    return REPL_OK;
}

/* ============================================================== route */

int repl_route(repl *r, const char *key, size_t nkey, bool write,
               repl_target *out, int cap)
{
    if (!r || !repl_partitioned(r))
        return 0;
    int n = 0;
    pthread_rwlock_rdlock(&r->rlock);
    const struct route *rt = r->route;
    uint32_t p = ring_partition(rt->ring, key, nkey);
    const uint32_t *own = ring_owners_ref(rt->ring, p);
    size_t k = own ? ring_owner_count(rt->ring) : 0;
    uint32_t self = r->o.node_id, ids[16];
    size_t nid = 0;
    bool mine = false;
    for (size_t i = 0; i < k; i++)
        mine |= own[i] == self;
    if (write) {
        /*
         * Writes go to the preferred owner (the first), so that a key's
         * writes meet in one place: cas is atomic there, and a read
         * relayed to it sees them. When it is unreachable the relay falls
         * down the list, this node included (its own client port, served
         * here).
         */
        if (k > 0 && own[0] != self)
            for (size_t i = 0; i < k && nid < 16; i++)
                ids[nid++] = own[i];
    } else if (!mine || !ALOAD(r->ready[p])) {
        /*
         * Reads are served by any owner that has caught up. Otherwise the
         * other owners, best first (where the writes go), except that
         * within ring_handoff_ms of a ring change those which already
         * owned p before it come first: one that just gained p may still
         * be catching up, and a relayed request is served where it lands.
         */
        bool prefer_old = rt->prev && repl_now_ns() < rt->prev_end;
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < k && nid < 16; i++)
                if (own[i] != self &&
                    (prefer_old && ring_is_owner(rt->prev, p, own[i])) ==
                        (pass == 0))
                    ids[nid++] = own[i];
    }
    {
        for (size_t i = 0; i < nid && n < cap; i++) {
            size_t lo = 0, hi = rt->n;
            while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                if (rt->m[mid].node < ids[i])
                    lo = mid + 1;
                else
                    hi = mid;
            }
            if (lo == rt->n || rt->m[lo].node != ids[i] ||
                rt->m[lo].addrlen == 0)
                continue;
            out[n].node = ids[i];
            out[n].addr = rt->m[lo].addr;
            out[n].addrlen = rt->m[lo].addrlen;
            n++;
        }
    }
    pthread_rwlock_unlock(&r->rlock);
    return n;
}

void repl_emit_ring_stats(repl *r, stats_emit_fn emit, void *arg)
{
    char name[64], val[256];
    if (!repl_partitioned(r)) {
        emit(arg, "ring_replicas", "0");
        emit(arg, "ring_mode", "full");
        return;
    }
    pthread_rwlock_rdlock(&r->rlock);
    const struct route *rt = r->route;
    snprintf(val, sizeof(val), "%u", ring_partitions(rt->ring));
    emit(arg, "ring_partitions", val);
    snprintf(val, sizeof(val), "%u", ring_replicas(rt->ring));
    emit(arg, "ring_replicas", val);
    emit(arg, "ring_hash", "fnv1a64-splitmix64");
    snprintf(val, sizeof(val), "%016llx",
             (unsigned long long)ring_fingerprint(rt->ring));
    emit(arg, "ring_fingerprint", val);
    snprintf(val, sizeof(val), "%zu", rt->n);
    emit(arg, "ring_members", val);
    ring_member *m = calloc(rt->n ? rt->n : 1, sizeof(*m));
    if (m) {
        ring_members(rt->ring, m, rt->n);
        for (size_t i = 0; i < rt->n; i++) {
            snprintf(name, sizeof(name), "ring_member:%u", rt->m[i].node);
            snprintf(val, sizeof(val), "%u %s %s", m[i].weight,
                     rt->m[i].name[0] ? rt->m[i].name : "-",
                     rt->m[i].self ? "self" : "alive");
            emit(arg, name, val);
        }
        free(m);
    }
    uint64_t owned = 0, catching = 0, held = 0;
    for (uint32_t p = 0; p < r->P; p++) {
        if (ALOAD(r->owned[p])) {
            owned++;
            catching += !ALOAD(r->ready[p]);
        } else if (ALOAD(r->lost_ns[p])) {
            held++;
        }
    }
#define RING_EMIT(label, v)                                                   \
    snprintf(val, sizeof(val), "%llu", (unsigned long long)(v));              \
    emit(arg, label, val);
    RING_EMIT("ring_changes", PST_GET(&r->st, ring_changes))
    RING_EMIT("partitions_owned", owned)
    RING_EMIT("partitions_catching_up", catching)
    RING_EMIT("partitions_held", held)
    RING_EMIT("ring_mismatch", PST_GET(&r->st, ring_mismatch))
    RING_EMIT("rejected_records", PST_GET(&r->st, rejected_records))
    RING_EMIT("partitions_dropped", PST_GET(&r->st, partitions_dropped))
    RING_EMIT("items_dropped", PST_GET(&r->st, items_dropped))
#undef RING_EMIT
    uint32_t k = ring_owner_count(rt->ring);
    for (uint32_t p = 0; p < r->P; p++) {
        const uint32_t *own = ring_owners_ref(rt->ring, p);
        size_t len = 0;
        val[0] = '\0';
        for (uint32_t i = 0; own && i < k && len < sizeof(val) - 12; i++)
            len += (size_t)snprintf(val + len, sizeof(val) - len, "%s%u",
                                    i ? "," : "", own[i]);
        snprintf(name, sizeof(name), "ring_partition:%u", p);
        emit(arg, name, val);
    }
    pthread_rwlock_unlock(&r->rlock);
}
