/*
 * check_repl_ring.c -- replicas below the cluster size, in one process over
 * loopback: three partitioned stores with replicas = 2 hold each key on
 * exactly its two owners (writes taken by a non-owner are handed off and
 * dropped there), a node that stops has its partitions re-replicated,
 * repl_route answers owner / relay targets, bad settings are refused.
 * Every wait is bounded (WAIT_MS) and polls.
 */
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "repl.h"
#include "repltest.h"
#include "ring.h"
#include "store.h"

#define WAIT_MS 20000
#define P 64
#define NKEYS 600

static uint32_t part_of(void *arg, const char *key, size_t nkey)
{
    (void)arg;
    return ring_key_partition(P, key, nkey);
}

struct node {
    store *s;
    repl *r;
    uint16_t port, client_port;
    uint32_t id;
};

static store *make_store(uint32_t id, uint32_t partitions)
{
    store_options so;
    store_options_default(&so);
    so.node_id = id;
    so.memory_limit = 256u << 20;
    so.partitions = partitions;
    so.partition_fn = part_of;
    so.partition_sketch_symbols = 64;
    int err = 0;
    store *s = store_create(&so, &err);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void node_options(struct node *n, repl_options *o, const char *peers,
                         char *adv, size_t nadv)
{
    repl_options_default(o);
    o->node_id = n->id;
    o->port = n->port;
    o->peers = peers;
    o->secret = "ring-secret";
    o->period_ms = 20;
    o->replicas = 2;
    o->ring_partitions = P;
    o->handoff_ms = 200;
    o->down_ms = 300;
    snprintf(adv, nadv, "127.0.0.1:%u", n->client_port);
    o->advertise = adv;
}

static void three_nodes(struct node n[3])
{
    char peers[128];
    for (int i = 0; i < 3; i++) {
        n[i].id = (uint32_t)i + 1;
        n[i].port = free_port();
        n[i].client_port = (uint16_t)(20000 + i); /* only advertised */
        n[i].s = make_store(n[i].id, P);
    }
    snprintf(peers, sizeof(peers), "127.0.0.1:%u,127.0.0.1:%u,127.0.0.1:%u",
             n[0].port, n[1].port, n[2].port);
    for (int i = 0; i < 3; i++) {
        repl_options o;
        char adv[64], err[256] = "";
        node_options(&n[i], &o, peers, adv, sizeof(adv));
        n[i].r = repl_create(n[i].s, &o, err, sizeof(err));
        ck_assert_msg(n[i].r != NULL, "repl_create: %s", err);
        ck_assert_int_eq(repl_start(n[i].r), REPL_OK);
    }
}

static void node_stop(struct node *n)
{
    repl_destroy(n->r);
    store_destroy(n->s);
    n->r = NULL;
    n->s = NULL;
}

static void put(store *s, const char *key, const char *val)
{
    store_write w = {.mode = STORE_SET,
                     .key = key,
                     .nkey = strlen(key),
                     .value = val,
                     .nvalue = strlen(val)};
    ck_assert_int_eq(store_write_item(s, &w, NULL), STORE_STORED);
}

static bool has(store *s, const char *key)
{
    store_item *it = store_get(s, key, strlen(key));
    if (it)
        store_item_release(it);
    return it != NULL;
}

/*
 * Number of keys placed wrongly: held by a node that does not own them
 * under a ring of `members`, or missing from an owner.
 */
static int misplaced(struct node *n, int nn, const uint32_t *members,
                     size_t nmembers)
{
    ring *rg = ring_create(P, 2, NULL);
    for (size_t i = 0; i < nmembers; i++)
        ring_add(rg, members[i], 1);
    int bad = 0;
    char key[32];
    for (int k = 0; k < NKEYS; k++) {
        snprintf(key, sizeof(key), "key:%d", k);
        uint32_t p = ring_partition(rg, key, strlen(key));
        for (int i = 0; i < nn; i++)
            if (n[i].s && has(n[i].s, key) != ring_is_owner(rg, p, n[i].id))
                bad++;
    }
    ring_destroy(rg);
    return bad;
}

static int wait_placed(struct node *n, int nn, const uint32_t *members,
                       size_t nmembers)
{
    int bad = -1;
    for (int t = 0; t < WAIT_MS / 50; t++) {
        bad = misplaced(n, nn, members, nmembers);
        if (bad == 0)
            return 0;
        sleep_ms(50);
    }
    return bad;
}

START_TEST(test_each_key_on_its_two_owners)
{
    struct node n[3];
    three_nodes(n);
    char key[32], val[32];
    /* Every node takes writes for every key: the non-owners' copies are
     * handed to the owners and then dropped. */
    for (int k = 0; k < NKEYS; k++) {
        snprintf(key, sizeof(key), "key:%d", k);
        snprintf(val, sizeof(val), "v%d", k);
        put(n[k % 3].s, key, val);
    }
    const uint32_t all[] = {1, 2, 3};
    ck_assert_int_eq(wait_placed(n, 3, all, 3), 0);
    store_stats st[3];
    uint64_t total = 0;
    for (int i = 0; i < 3; i++) {
        store_get_stats(n[i].s, &st[i]);
        total += st[i].curr_items;
    }
    ck_assert_uint_eq(total, 2 * NKEYS);

    /* Node 3 stops: once it is down for down_ms, nodes 1 and 2 own every
     * partition and each holds every key. */
    node_stop(&n[2]);
    const uint32_t two[] = {1, 2};
    ck_assert_int_eq(wait_placed(n, 2, two, 2), 0);
    store_get_stats(n[0].s, &st[0]);
    store_get_stats(n[1].s, &st[1]);
    ck_assert_uint_eq(st[0].curr_items, NKEYS);
    ck_assert_uint_eq(st[1].curr_items, NKEYS);
    node_stop(&n[0]);
    node_stop(&n[1]);
}
END_TEST

START_TEST(test_route)
{
    struct node n[3];
    three_nodes(n);
    /* Wait for node 1 to see a ring of three members. */
    ring *rg = ring_create(P, 2, NULL);
    ring_add(rg, 1, 1);
    ring_add(rg, 2, 1);
    ring_add(rg, 3, 1);
    bool same = false;
    for (int t = 0; t < WAIT_MS / 20 && !same; t++) {
        repl_target out[4];
        /* The ring is published once it changes; poll a key until the
         * route agrees with the expected three-member ring. */
        same = true;
        for (int k = 0; k < 50 && same; k++) {
            char key[32];
            snprintf(key, sizeof(key), "key:%d", k);
            uint32_t p = ring_partition(rg, key, strlen(key));
            uint32_t first;
            ring_owners(rg, p, &first, 1);
            /* Writes: here at the preferred owner, else to both owners
             * (node 1 itself included, as the last resort). */
            int r = repl_route(n[0].r, key, strlen(key), true, out, 4);
            same = first == 1 ? r == 0 : r == 2 && out[0].node == first;
        }
        if (!same)
            sleep_ms(20);
    }
    ck_assert(same);
    /* A key node 1 does not own: both owners (those that owned it before
     * the last ring change first), with their advertised client
     * addresses; with cap 1, the first of them. */
    for (int k = 0; k < NKEYS; k++) {
        char key[32];
        snprintf(key, sizeof(key), "key:%d", k);
        uint32_t p = ring_partition(rg, key, strlen(key));
        if (ring_is_owner(rg, p, 1))
            continue;
        repl_target out[4];
        ck_assert_int_eq(repl_route(n[0].r, key, strlen(key), false, out, 4),
                         2);
        ck_assert_uint_ne(out[0].node, out[1].node);
        for (int i = 0; i < 2; i++) {
            ck_assert(ring_is_owner(rg, p, out[i].node));
            const struct sockaddr_in *sa =
                (const struct sockaddr_in *)&out[i].addr;
            ck_assert_uint_eq(ntohs(sa->sin_port), 20000 + out[i].node - 1);
        }
        uint32_t first = out[0].node;
        ck_assert_int_eq(repl_route(n[0].r, key, strlen(key), false, out, 1),
                         1);
        ck_assert_uint_eq(out[0].node, first);
        break;
    }
    ring_destroy(rg);
    for (int i = 0; i < 3; i++)
        node_stop(&n[i]);
}
END_TEST

START_TEST(test_settings_refused)
{
    struct node a = {.id = 1, .port = free_port(), .client_port = 20000};
    repl_options o;
    char adv[64], err[256] = "";
    /* The store must be partitioned like the ring. */
    a.s = make_store(1, 0);
    node_options(&a, &o, "", adv, sizeof(adv));
    ck_assert_ptr_null(repl_create(a.s, &o, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "partitioned"));
    store_destroy(a.s);
    a.s = make_store(1, P);
    /* An advertised client address is required. */
    node_options(&a, &o, "", adv, sizeof(adv));
    o.advertise = "";
    ck_assert_ptr_null(repl_create(a.s, &o, err, sizeof(err)));
    ck_assert_ptr_nonnull(strstr(err, "advertise"));
    /* Full replication routes nothing. */
    node_options(&a, &o, "", adv, sizeof(adv));
    o.replicas = 0;
    store_destroy(a.s);
    a.s = make_store(1, 0);
    a.r = repl_create(a.s, &o, err, sizeof(err));
    ck_assert_msg(a.r != NULL, "%s", err);
    repl_target out[2];
    ck_assert_int_eq(repl_route(a.r, "k", 1, false, out, 2), 0);
    node_stop(&a);
}
END_TEST

static Suite *ring_suite(void)
{
    Suite *s = suite_create("repl_ring");
    TCase *tc = tcase_create("repl_ring");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_each_key_on_its_two_owners);
    tcase_add_test(tc, test_route);
    tcase_add_test(tc, test_settings_refused);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(ring_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
