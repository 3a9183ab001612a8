/*
 * check_registry.c -- the registry's member directory driven by a fake
 * clock (join, heartbeats, direct and indirect probes, suspicion, death,
 * rejoin, leave, bounds) and the VIEW payload codec.
 */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "registry.h"

static registry_timing timing(void)
{
    registry_timing t;
    registry_timing_default(&t);
    t.heartbeat_ms = 100;
    t.probe_ms = 100;
    t.probe_timeout_ms = 50;
    t.suspect_timeout_ms = 300;
    t.indirect_probes = 2;
    return t;
}

static int state_of(registry_dir *d, uint32_t node)
{
    registry_member m;
    if (!registry_dir_get(d, node, &m))
        return -1;
    return m.state;
}

/* A directory with members 1..n registered and connected at time 0. */
static registry_dir *dir_with(uint32_t n)
{
    registry_timing t = timing();
    registry_dir *d = registry_dir_create(&t, 42);
    ck_assert_ptr_nonnull(d);
    for (uint32_t i = 1; i <= n; i++) {
        char addr[32];
        uint64_t known = 0;
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", 7000 + i);
        ck_assert_int_eq(registry_dir_register(d, i, 10, addr, 0, &known),
                         REGISTRY_OK);
        registry_dir_connected(d, i, true, 0);
    }
    return d;
}

/* Steps the clock from *now to until in 10 ms ticks, answering every PING
 * for members in `answer` (a bitmask by node id) and every PING_REQ with
 * ack_ok. Returns the number of PING_REQ actions seen. */
static int run(registry_dir *d, uint64_t *now, uint64_t until, uint32_t answer,
               bool ack_ok)
{
    int reqs = 0;
    registry_action a[64];
    for (; *now <= until; *now += 10) {
        size_t n = registry_dir_step(d, *now, a, 64);
        for (size_t i = 0; i < n; i++) {
            if (a[i].kind == REGISTRY_ACT_PING) {
                ck_assert_uint_ne(a[i].token, 0);
                if (answer & (1u << a[i].to))
                    registry_dir_pong(d, a[i].to, a[i].token, *now);
            } else {
                ck_assert_int_eq(a[i].kind, REGISTRY_ACT_PING_REQ);
                ck_assert_uint_ne(a[i].to, a[i].target);
                reqs++;
                registry_dir_ack(d, a[i].to, a[i].target, a[i].token, ack_ok,
                                 *now);
            }
        }
    }
    return reqs;
}

START_TEST(test_join_and_view)
{
    registry_dir *d = dir_with(3);
    registry_member v[8];
    ck_assert_uint_eq(registry_dir_view(d, v, 8), 3);
    ck_assert_uint_eq(v[0].node, 1);
    ck_assert_str_eq(v[2].addr, "127.0.0.1:7003");
    ck_assert_int_eq(v[1].state, REGISTRY_ALIVE);
    ck_assert_uint_eq(v[1].incarnation, 10);
    /* Re-registering the same incarnation and address changes nothing. */
    uint64_t e = registry_dir_epoch(d), known = 0;
    ck_assert_int_eq(
        registry_dir_register(d, 2, 10, "127.0.0.1:7002", 5, &known),
        REGISTRY_OK);
    ck_assert_uint_eq(registry_dir_epoch(d), e);
    /* A new address does. */
    ck_assert_int_eq(
        registry_dir_register(d, 2, 10, "127.0.0.1:9002", 5, &known),
        REGISTRY_OK);
    ck_assert_uint_gt(registry_dir_epoch(d), e);
    /* Bad input changes nothing. */
    ck_assert_int_eq(registry_dir_register(d, 0, 1, "a:1", 5, &known),
                     REGISTRY_ERR_FORMAT);
    ck_assert_int_eq(registry_dir_register(d, 9, 1, "", 5, &known),
                     REGISTRY_ERR_FORMAT);
    ck_assert_int_eq(registry_dir_register(d, 9, 1, "a b:1", 5, &known),
                     REGISTRY_ERR_FORMAT);
    ck_assert_uint_eq(registry_dir_view(d, v, 8), 3);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_answered_probes_keep_members_alive)
{
    registry_dir *d = dir_with(3);
    uint64_t now = 0;
    int reqs = run(d, &now, 5000, 0xe, true);
    ck_assert_int_eq(reqs, 0);
    for (uint32_t i = 1; i <= 3; i++)
        ck_assert_int_eq(state_of(d, i), REGISTRY_ALIVE);
    registry_counters c;
    registry_dir_counters(d, &c);
    /* One probe per period, round robin. */
    ck_assert_uint_ge(c.probes, 45);
    ck_assert_uint_le(c.probes, 51);
    ck_assert_uint_eq(c.probes_failed, 0);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_indirect_probe_saves_a_slow_link)
{
    registry_dir *d = dir_with(4);
    uint64_t now = 0;
    /* Node 3 never answers the registry, but the helpers reach it. */
    int reqs = run(d, &now, 3000, 0x16, true);
    ck_assert_int_gt(reqs, 0);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_ALIVE);
    registry_counters c;
    registry_dir_counters(d, &c);
    ck_assert_uint_gt(c.indirect_probes, 0);
    ck_assert_uint_eq(c.suspected, 0);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_unreachable_member_dies_in_time)
{
    registry_dir *d = dir_with(4);
    uint64_t now = 0;
    /* Node 4 answers nobody: suspect after a failed probe round, dead a
     * suspect timeout later. */
    run(d, &now, 2000, 0xe, false);
    ck_assert_int_eq(state_of(d, 4), REGISTRY_DEAD);
    for (uint32_t i = 1; i <= 3; i++)
        ck_assert_int_eq(state_of(d, i), REGISTRY_ALIVE);
    registry_counters c;
    registry_dir_counters(d, &c);
    ck_assert_uint_eq(c.suspected, 1);
    ck_assert_uint_eq(c.declared_dead, 1);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_disconnect_probes_at_once)
{
    registry_dir *d = dir_with(3);
    uint64_t now = 0;
    run(d, &now, 200, 0xe, true);
    /* The connection drops: the next step asks the helpers right away. */
    registry_dir_connected(d, 2, false, now);
    registry_action a[16];
    size_t n = registry_dir_step(d, now, a, 16);
    size_t reqs = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i].kind == REGISTRY_ACT_PING_REQ && a[i].target == 2) {
            reqs++;
            registry_dir_ack(d, a[i].to, 2, a[i].token, false, now);
        }
    ck_assert_uint_eq(reqs, 2);
    /* Every helper said no: suspect now, dead after the timeout. */
    ck_assert_int_eq(state_of(d, 2), REGISTRY_SUSPECT);
    now += 290;
    registry_dir_step(d, now, a, 16);
    ck_assert_int_eq(state_of(d, 2), REGISTRY_SUSPECT);
    now += 20;
    registry_dir_step(d, now, a, 16);
    ck_assert_int_eq(state_of(d, 2), REGISTRY_DEAD);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_heartbeat_refutes_suspicion)
{
    registry_dir *d = dir_with(3);
    uint64_t now = 0, known = 0;
    registry_dir_connected(d, 3, false, now);
    run(d, &now, 100, 0x6, false);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_SUSPECT);
    uint64_t e = registry_dir_epoch(d);
    ck_assert_int_eq(registry_dir_heartbeat(d, 3, 10, now, &known),
                     REGISTRY_OK);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_ALIVE);
    ck_assert_uint_gt(registry_dir_epoch(d), e);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_dead_member_rejoins_with_newer_incarnation)
{
    registry_dir *d = dir_with(3);
    uint64_t now = 0, known = 0;
    registry_dir_connected(d, 3, false, now);
    run(d, &now, 1000, 0x6, false);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_DEAD);
    /* Its heartbeats and the old incarnation are refused... */
    ck_assert_int_eq(registry_dir_heartbeat(d, 3, 10, now, &known),
                     REGISTRY_ERR_STALE);
    ck_assert_uint_eq(known, 10);
    ck_assert_int_eq(
        registry_dir_register(d, 3, 10, "127.0.0.1:7003", now, &known),
        REGISTRY_ERR_STALE);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_DEAD);
    /* ...a newer one is alive again. */
    ck_assert_int_eq(
        registry_dir_register(d, 3, known + 1, "127.0.0.1:7003", now, &known),
        REGISTRY_OK);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_ALIVE);
    registry_member m;
    ck_assert(registry_dir_get(d, 3, &m));
    ck_assert_uint_eq(m.incarnation, 11);
    /* An older incarnation of a live member is refused too. */
    ck_assert_int_eq(
        registry_dir_register(d, 3, 5, "127.0.0.1:7003", now, &known),
        REGISTRY_ERR_STALE);
    ck_assert_uint_eq(known, 11);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_dead_members_are_forgotten)
{
    registry_dir *d = dir_with(2);
    uint64_t now = 0;
    registry_dir_connected(d, 2, false, now);
    run(d, &now, 1000, 0x2, false);
    ck_assert_int_eq(state_of(d, 2), REGISTRY_DEAD);
    registry_action a[8];
    registry_dir_step(d, now + 59000, a, 8);
    ck_assert_int_eq(state_of(d, 2), REGISTRY_DEAD);
    registry_dir_step(d, now + 61000, a, 8);
    ck_assert_int_eq(state_of(d, 2), -1);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_leave_and_unknown)
{
    registry_dir *d = dir_with(3);
    uint64_t known = 99;
    ck_assert_int_eq(registry_dir_leave(d, 2, 9), REGISTRY_ERR_STALE);
    ck_assert_int_eq(state_of(d, 2), REGISTRY_ALIVE);
    uint64_t e = registry_dir_epoch(d);
    ck_assert_int_eq(registry_dir_leave(d, 2, 10), REGISTRY_OK);
    ck_assert_int_eq(state_of(d, 2), -1);
    ck_assert_uint_gt(registry_dir_epoch(d), e);
    ck_assert_int_eq(registry_dir_leave(d, 2, 10), REGISTRY_ERR_UNKNOWN);
    ck_assert_int_eq(registry_dir_heartbeat(d, 2, 10, 0, &known),
                     REGISTRY_ERR_UNKNOWN);
    ck_assert_uint_eq(known, 0);
    /* Stray answers about unknown members or wrong tokens are ignored. */
    registry_dir_pong(d, 77, 1, 0);
    registry_dir_ack(d, 1, 3, 12345, true, 0);
    ck_assert_int_eq(state_of(d, 3), REGISTRY_ALIVE);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_directory_is_bounded)
{
    registry_dir *d = dir_with(REGISTRY_MEMBERS_MAX);
    uint64_t known;
    ck_assert_int_eq(registry_dir_register(d, 1000, 1, "h:1", 0, &known),
                     REGISTRY_ERR_FULL);
    registry_counters c;
    registry_dir_counters(d, &c);
    ck_assert_uint_eq(c.refused_full, 1);
    /* A leave frees a place. */
    ck_assert_int_eq(registry_dir_leave(d, 5, 10), REGISTRY_OK);
    ck_assert_int_eq(registry_dir_register(d, 1000, 1, "h:1", 0, &known),
                     REGISTRY_OK);
    /* The step never writes more actions than it is given room for. */
    for (uint32_t i = 1; i <= REGISTRY_MEMBERS_MAX; i++)
        registry_dir_connected(d, i, false, 0);
    registry_action a[3];
    ck_assert_uint_le(registry_dir_step(d, 0, a, 3), 3);
    registry_dir_destroy(d);
}
END_TEST

START_TEST(test_view_codec)
{
    registry_member in[3] = {
        {1, 100, REGISTRY_ALIVE, "127.0.0.1:11601"},
        {2, 200, REGISTRY_SUSPECT, "[::1]:11602"},
        {3, 300, REGISTRY_DEAD, "node3.example:11603"},
    };
    uint8_t buf[1024];
    long n = registry_view_encode(buf, sizeof(buf), 77, in, 3);
    ck_assert_int_eq(n, 12 + 3 * 14 + 15 + 11 + 19);
    ck_assert_int_eq(buf[0], 77);
    ck_assert_int_eq(buf[8], 3);
    registry_member out[3];
    uint64_t epoch = 0;
    size_t k = 0;
    ck_assert_int_eq(registry_view_decode(buf, (size_t)n, &epoch, out, 3, &k),
                     REGISTRY_OK);
    ck_assert_uint_eq(epoch, 77);
    ck_assert_uint_eq(k, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(out[i].node, in[i].node);
        ck_assert_uint_eq(out[i].incarnation, in[i].incarnation);
        ck_assert_int_eq(out[i].state, in[i].state);
        ck_assert_str_eq(out[i].addr, in[i].addr);
    }
    /* Every truncation, an extra byte, too many entries: refused. */
    for (long i = 0; i < n; i++)
        ck_assert_int_eq(
            registry_view_decode(buf, (size_t)i, &epoch, out, 3, &k),
            REGISTRY_ERR_FORMAT);
    ck_assert_int_eq(
        registry_view_decode(buf, (size_t)n + 1, &epoch, out, 3, &k),
        REGISTRY_ERR_FORMAT);
    ck_assert_int_eq(registry_view_decode(buf, (size_t)n, &epoch, out, 2, &k),
                     REGISTRY_ERR_FORMAT);
    /* A bad state, node 0, a control byte in an address: refused. */
    uint8_t bad[1024];
    memcpy(bad, buf, (size_t)n);
    bad[12 + 12] = 3;
    ck_assert_int_eq(registry_view_decode(bad, (size_t)n, &epoch, out, 3, &k),
                     REGISTRY_ERR_FORMAT);
    memcpy(bad, buf, (size_t)n);
    memset(bad + 12, 0, 4);
    ck_assert_int_eq(registry_view_decode(bad, (size_t)n, &epoch, out, 3, &k),
                     REGISTRY_ERR_FORMAT);
    memcpy(bad, buf, (size_t)n);
    bad[12 + 14] = '\n';
    ck_assert_int_eq(registry_view_decode(bad, (size_t)n, &epoch, out, 3, &k),
                     REGISTRY_ERR_FORMAT);
    /* The encoder refuses what does not fit. */
    ck_assert_int_eq(registry_view_encode(buf, 40, 1, in, 3),
                     REGISTRY_ERR_FORMAT);
}
END_TEST

START_TEST(test_timing_checks)
{
    registry_timing t;
    char err[128];
    registry_timing_default(&t);
    ck_assert_int_eq(registry_timing_check(&t, err, sizeof(err)), REGISTRY_OK);
    t.probe_timeout_ms = 0;
    ck_assert_int_eq(registry_timing_check(&t, err, sizeof(err)),
                     REGISTRY_ERR_CONFIG);
    registry_timing_default(&t);
    t.indirect_probes = 17;
    ck_assert_int_eq(registry_timing_check(&t, err, sizeof(err)),
                     REGISTRY_ERR_CONFIG);
    ck_assert_str_eq(registry_state_name(REGISTRY_SUSPECT), "suspect");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("registry");
    TCase *tc = tcase_create("directory");
    tcase_add_test(tc, test_join_and_view);
    tcase_add_test(tc, test_answered_probes_keep_members_alive);
    tcase_add_test(tc, test_indirect_probe_saves_a_slow_link);
    tcase_add_test(tc, test_unreachable_member_dies_in_time);
    tcase_add_test(tc, test_disconnect_probes_at_once);
    tcase_add_test(tc, test_heartbeat_refutes_suspicion);
    tcase_add_test(tc, test_dead_member_rejoins_with_newer_incarnation);
    tcase_add_test(tc, test_dead_members_are_forgotten);
    tcase_add_test(tc, test_leave_and_unknown);
    tcase_add_test(tc, test_directory_is_bounded);
    suite_add_tcase(s, tc);
    TCase *tw = tcase_create("wire");
    tcase_add_test(tw, test_view_codec);
    tcase_add_test(tw, test_timing_checks);
    suite_add_tcase(s, tw);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
