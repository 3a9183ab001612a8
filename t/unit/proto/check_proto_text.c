/*
 * check_proto_text.c -- the classic text protocol, byte for byte.
 *
 * Requests are fed to proto_text_execute with a real store; every test
 * asserts the exact reply bytes a memcached 1.6 client would read. The
 * store runs on a fixed clock so ttls are exact.
 */
#include "prototest.h"

/* The parser still works: "version" answers. */
static void expect_alive(void)
{
    EXPECT("version\r\n", "VERSION 1.6.99-test\r\n");
}

/* ----------------------------------------------------------- storage */

START_TEST(test_set_get)
{
    EXPECT("set k 5 0 3\r\nabc\r\n", "STORED\r\n");
    EXPECT("get k\r\n", "VALUE k 5 3\r\nabc\r\nEND\r\n");
    EXPECT("get nope\r\n", "END\r\n");
    EXPECT("set k 4294967295 0 0\r\n\r\n", "STORED\r\n");
    EXPECT("get k\r\n", "VALUE k 4294967295 0\r\n\r\nEND\r\n");
    EXPECT("bget k\r\n", "VALUE k 4294967295 0\r\n\r\nEND\r\n");
    /* spaces around tokens do not matter, a bare \n ends a line too */
    EXPECT("  set   k2  0 0 1  \na\r\n", "STORED\r\n");
    EXPECT("get k2   \n", "VALUE k2 0 1\r\na\r\nEND\r\n");
    ck_assert_uint_eq(sth.cmd_set, 3);
    ck_assert_uint_eq(sth.cmd_get, 5);
    ck_assert_uint_eq(sth.get_hits, 4);
    ck_assert_uint_eq(sth.get_misses, 1);
}
END_TEST

START_TEST(test_multiget_and_gets)
{
    EXPECT("set a 1 0 1\r\nA\r\nset c 3 0 3\r\nCCC\r\n",
           "STORED\r\nSTORED\r\n");
    EXPECT("get a b c a\r\n", "VALUE a 1 1\r\nA\r\nVALUE c 3 3\r\nCCC\r\n"
                              "VALUE a 1 1\r\nA\r\nEND\r\n");
    char want[256], req[] = "gets a c\r\n";
    snprintf(want, sizeof(want),
             "VALUE a 1 1 %" PRIu64 "\r\nA\r\nVALUE c 3 3 %" PRIu64
             "\r\nCCC\r\nEND\r\n",
             cas_of("a"), cas_of("c"));
    expect_bytes(req, strlen(req), want, strlen(want), __LINE__);
    ck_assert_uint_eq(sth.cmd_get, 6);
    ck_assert_uint_eq(sth.get_hits, 5);
    ck_assert_uint_eq(sth.get_misses, 1);
}
END_TEST

START_TEST(test_many_keys)
{
    /* more keys than memcached's 24 tokens: every key is served */
    char req[2048];
    size_t n = (size_t)snprintf(req, sizeof(req), "get");
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(req + n, sizeof(req) - n, " k%d", i);
    n += (size_t)snprintf(req + n, sizeof(req) - n, "\r\n");
    EXPECT("set k99 0 0 2\r\n99\r\nset k0 0 0 1\r\n0\r\n",
           "STORED\r\nSTORED\r\n");
    const char want[] = "VALUE k0 0 1\r\n0\r\nVALUE k99 0 2\r\n99\r\nEND\r\n";
    expect_bytes(req, n, want, sizeof(want) - 1, __LINE__);
    ck_assert_uint_eq(sth.cmd_get, 100);
    ck_assert_uint_eq(sth.get_hits, 2);
}
END_TEST

START_TEST(test_large_value_by_reference)
{
    enum { N = 100000 };
    char *req = malloc(N + 64), *want = malloc(N + 64);
    size_t n = (size_t)sprintf(req, "set big 7 0 %d\r\n", N);
    for (int i = 0; i < N; i++)
        req[n + i] = (char)('a' + i % 26);
    n += N;
    memcpy(req + n, "\r\nget big\r\n", 11);
    n += 11;
    size_t w = (size_t)sprintf(want, "STORED\r\nVALUE big 7 %d\r\n", N);
    for (int i = 0; i < N; i++)
        want[w + i] = (char)('a' + i % 26);
    w += N;
    memcpy(want + w, "\r\nEND\r\n", 7);
    w += 7;
    expect_bytes(req, n, want, w, __LINE__);
    /* arriving in small pieces, spread over many chunks */
    size_t got_n;
    char *got = run_split(req, n, 1000, &got_n);
    ck_assert_uint_eq(got_n, w);
    ck_assert(memcmp(got, want, w) == 0);
    ck_assert_uint_eq(left_in, 0);
    free(got);
    free(req);
    free(want);
}
END_TEST

START_TEST(test_add_replace_append_prepend)
{
    EXPECT("add k 1 0 1\r\na\r\n", "STORED\r\n");
    EXPECT("add k 1 0 1\r\nb\r\n", "NOT_STORED\r\n");
    EXPECT("replace nope 1 0 1\r\nb\r\n", "NOT_STORED\r\n");
    EXPECT("replace k 2 0 1\r\nr\r\n", "STORED\r\n");
    EXPECT("append k 9 0 2\r\nAP\r\n", "STORED\r\n");
    EXPECT("prepend k 9 0 2\r\nPR\r\n", "STORED\r\n");
    EXPECT("append nope 0 0 1\r\nx\r\n", "NOT_STORED\r\n");
    EXPECT("prepend nope 0 0 1\r\nx\r\n", "NOT_STORED\r\n");
    /* append keeps the flags of the item */
    EXPECT("get k\r\n", "VALUE k 2 5\r\nPRrAP\r\nEND\r\n");
    expect_missing("nope");
}
END_TEST

START_TEST(test_cas)
{
    EXPECT("cas k 0 0 1 1\r\na\r\n", "NOT_FOUND\r\n");
    EXPECT("set k 0 0 1\r\na\r\n", "STORED\r\n");
    uint64_t c = cas_of("k");
    char req[128];
    snprintf(req, sizeof(req), "cas k 3 0 1 %" PRIu64 "\r\nb\r\n", c + 1);
    expect_bytes(req, strlen(req), "EXISTS\r\n", 8, __LINE__);
    snprintf(req, sizeof(req), "cas k 3 0 1 %" PRIu64 "\r\nb\r\n", c);
    expect_bytes(req, strlen(req), "STORED\r\n", 8, __LINE__);
    /* the cas moved on: the same cas fails now */
    expect_bytes(req, strlen(req), "EXISTS\r\n", 8, __LINE__);
    snprintf(req, sizeof(req), "cas k 3 0 1 %" PRIu64 " noreply\r\nc\r\n",
             cas_of("k"));
    expect_bytes(req, strlen(req), "", 0, __LINE__);
    EXPECT("get k\r\n", "VALUE k 3 1\r\nc\r\nEND\r\n");
    EXPECT("cas k 0 0 1 x\r\na\r\n",
           "CLIENT_ERROR bad command line format\r\nERROR\r\n");
    EXPECT("cas k 0 0 1\r\n", "ERROR\r\n");
    ck_assert_uint_eq(sth.cas_misses, 1);
    ck_assert_uint_eq(sth.cas_badval, 2);
    ck_assert_uint_eq(sth.cas_hits, 2);
}
END_TEST

START_TEST(test_cas_disabled)
{
    cfg.cas_enabled = false;
    EXPECT("set k 0 0 1\r\na\r\n", "STORED\r\n");
    EXPECT("gets k\r\n", "VALUE k 0 1 0\r\na\r\nEND\r\n");
    char req[128];
    snprintf(req, sizeof(req), "cas k 0 0 1 %" PRIu64 "\r\nb\r\n",
             cas_of("k"));
    expect_bytes(req, strlen(req), "EXISTS\r\n", 8, __LINE__);
    EXPECT("cas x 0 0 1 0\r\nb\r\n", "NOT_FOUND\r\n");
    expect_value("k", "a");
}
END_TEST

START_TEST(test_noreply_storage)
{
    EXPECT("set k 0 0 1 noreply\r\na\r\n"
           "add k 0 0 1 noreply\r\nb\r\n"
           "replace k 0 0 1 noreply\r\nc\r\n"
           "append k 0 0 1 noreply\r\nd\r\n"
           "prepend k 0 0 1 noreply\r\ne\r\n"
           "get k\r\n",
           "VALUE k 0 3\r\necd\r\nEND\r\n");
}
END_TEST

/* ---------------------------------------------------- bad storage input */

START_TEST(test_bad_byte_counts)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    /* a refused command line leaves its data to be read as a command */
    EXPECT("set k 0 0 -1\r\nfoo\r\n",
           "CLIENT_ERROR bad command line format\r\nERROR\r\n");
    EXPECT("set k 0 0 2147483647\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 0 0 4294967295\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 0 0 4294967298\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 0 0 18446744073709551616\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 0 0 1x\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k x 0 1\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k -1 0 1\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 18446744073709551616 0 1\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("set k 0 x 1\r\n", "CLIENT_ERROR bad command line format\r\n");
    /* noreply hides even the error, as in memcached */
    EXPECT("set k 0 0 -1 noreply\r\n", "");
    expect_alive();
    expect_value("k", "v");
    ck_assert_uint_eq(sth.cmd_set, 1);
}
END_TEST

/* memcached's slab and memory admin commands, answered in its words. */
START_TEST(test_slabs_and_memlimit)
{
    EXPECT("slabs automove 1\r\n", "OK\r\n");
    EXPECT("slabs automove 0\r\n", "OK\r\n");
    EXPECT("slabs automove 3\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("slabs reassign 1 1\r\n",
           "SAME src and dst class are identical\r\n");
    EXPECT("slabs reassign 1 5\r\n", "BADCLASS invalid src or dst class\r\n");
    EXPECT("slabs reassign -1 1\r\n", "BADCLASS invalid src or dst class\r\n");
    EXPECT("slabs reassign x 1\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    EXPECT("slabs\r\n", "ERROR\r\n");
    EXPECT("cache_memlimit 4\r\n",
           "MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n");
    EXPECT("cache_memlimit x\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("cache_memlimit\r\n", "ERROR\r\n");
    store_stats ss;
    store_get_stats(st, &ss);
    ck_assert_uint_eq(ss.limit_maxbytes, 64u << 20);
    EXPECT("cache_memlimit 100\r\n", "OK\r\n");
    store_get_stats(st, &ss);
    ck_assert_uint_eq(ss.limit_maxbytes, 100u << 20);
    EXPECT("cache_memlimit 9 noreply\r\n", "");
    store_get_stats(st, &ss);
    ck_assert_uint_eq(ss.limit_maxbytes, 9u << 20);
}
END_TEST

/* Client flags beyond 32 bits are kept modulo 2^32, as memcached does. */
START_TEST(test_flags_modulo_2_32)
{
    EXPECT("set k 4294967296 0 1\r\nv\r\nget k\r\n",
           "STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n");
    EXPECT("set k 4294967301 0 1\r\nv\r\nget k\r\n",
           "STORED\r\nVALUE k 5 1\r\nv\r\nEND\r\n");
    EXPECT("ms k 1 F4294967303\r\nv\r\nmg k f\r\n", "HD\r\nHD f7\r\n");
}
END_TEST

START_TEST(test_too_large_swallowed)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    enum { N = 2 * 1024 * 1024 };
    char *req = malloc(N + 128);
    size_t n = (size_t)sprintf(req, "set k 0 0 %d\r\n", N);
    memset(req + n, 'x', N);
    n += N;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    const char want[] = "SERVER_ERROR object too large for cache\r\n"
                        "VERSION 1.6.99-test\r\n";
    expect_bytes(req, n, want, sizeof(want) - 1, __LINE__);
    ck_assert_uint_eq(sth.store_too_large, 1);
    /* as memcached: the refused set removes the key (no stale value) */
    expect_missing("k");
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    /* the same, arriving in pieces: nothing of it is buffered or parsed */
    size_t got_n;
    char *got = run_split(req, n, 4096, &got_n);
    ck_assert_uint_eq(got_n, sizeof(want) - 1);
    ck_assert(memcmp(got, want, got_n) == 0);
    ck_assert_uint_eq(left_in, 0);
    free(got);
    expect_missing("k");
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    /* noreply hides the error; the data is still swallowed */
    n = (size_t)sprintf(req, "set k 0 0 %d noreply\r\n", N);
    memset(req + n, 'x', N);
    n += N;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    expect_bytes(req, n, "VERSION 1.6.99-test\r\n", 21, __LINE__);
    expect_missing("k");
    /* other modes refuse it and leave the key: only set removes */
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    n = (size_t)sprintf(req, "append k 0 0 %d\r\n", N);
    memset(req + n, 'x', N);
    n += N;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    expect_bytes(req, n, want, sizeof(want) - 1, __LINE__);
    expect_value("k", "v");
    /* ms refuses it the same way, and its set mode removes the key too */
    n = (size_t)sprintf(req, "ms k %d T0\r\n", N);
    memset(req + n, 'x', N);
    n += N;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    expect_bytes(req, n, want, sizeof(want) - 1, __LINE__);
    expect_missing("k");
    free(req);
}
END_TEST

START_TEST(test_bad_data_chunk)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    /* exactly bytes+2 are taken; what follows is the next command */
    EXPECT("set k 0 0 3\r\nabcde\r\n",
           "CLIENT_ERROR bad data chunk\r\nERROR\r\n");
    EXPECT("set k 0 0 3 noreply\r\nabcde\r\n", "ERROR\r\n");
    EXPECT("set k 0 0 1\r\nabc", "CLIENT_ERROR bad data chunk\r\n");
    expect_alive();
    expect_value("k", "v");
}
END_TEST

START_TEST(test_incomplete_waits)
{
    /* a partial line or data block is left in place */
    char *got = run_n("set k 0 0 5\r\nab", 15, NULL);
    ck_assert_str_eq(got, "");
    ck_assert_uint_eq(left_in, 15);
    free(got);
    got = run_n("get k", 5, NULL);
    ck_assert_str_eq(got, "");
    ck_assert_uint_eq(left_in, 5);
    free(got);
    expect_missing("k");
}
END_TEST

START_TEST(test_key_limits)
{
    char k250[251], req[600];
    memset(k250, 'a', 250);
    k250[250] = '\0';
    snprintf(req, sizeof(req), "set %s 0 0 1\r\nx\r\n", k250);
    expect_bytes(req, strlen(req), "STORED\r\n", 8, __LINE__);
    /* 251 bytes: refused, the data line read as a command */
    snprintf(req, sizeof(req), "set %sb 0 0 1\r\nx\r\n", k250);
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    const char e1[] = "CLIENT_ERROR bad command line format\r\nERROR\r\n";
    expect_bytes(req, strlen(req), e1, sizeof(e1) - 1, __LINE__);
    /* a get with one over-long key answers only the error */
    snprintf(req, sizeof(req), "get k %sb\r\n", k250);
    const char e2[] = "CLIENT_ERROR bad command line format\r\n";
    expect_bytes(req, strlen(req), e2, sizeof(e2) - 1, __LINE__);
    snprintf(req, sizeof(req), "delete %sb\r\n", k250);
    expect_bytes(req, strlen(req), e2, sizeof(e2) - 1, __LINE__);
    snprintf(req, sizeof(req), "incr %sb 1\r\n", k250);
    expect_bytes(req, strlen(req), e2, sizeof(e2) - 1, __LINE__);
    snprintf(req, sizeof(req), "touch %sb 1\r\n", k250);
    expect_bytes(req, strlen(req), e2, sizeof(e2) - 1, __LINE__);
    /* control bytes are part of a key, as in memcached */
    EXPECT("set a\tb 0 0 1\r\nx\r\n", "STORED\r\n");
    EXPECT("get k a\x01\r\n", "VALUE k 0 1\r\nv\r\nEND\r\n");
    EXPECT("get a\tb\r\n", "VALUE a\tb 0 1\r\nx\r\nEND\r\n");
    expect_alive();
    expect_value("k", "v");
    expect_value("a\tb", "x");
}
END_TEST

START_TEST(test_line_too_long)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    char *req = malloc(10000);
    memset(req, 'x', 5000);
    /* no newline yet, beyond max_line: refused at once */
    size_t n;
    char *got = run_n(req, 5000, &n);
    ck_assert_str_eq(got, "CLIENT_ERROR line too long\r\n");
    ck_assert_uint_eq(left_in, 0);
    free(got);
    /* the rest of that line is dropped; the next line is served */
    memcpy(req, "yyyy\r\nversion\r\n", 15);
    got = run_n(req, 15, &n);
    ck_assert_str_eq(got, "VERSION 1.6.99-test\r\n");
    free(got);
    /* a get longer than max_line, newline included */
    n = (size_t)sprintf(req, "get");
    while (n < 3000)
        n += (size_t)sprintf(req + n, " k");
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    const char want[] = "CLIENT_ERROR line too long\r\n"
                        "VERSION 1.6.99-test\r\n";
    expect_bytes(req, n, want, sizeof(want) - 1, __LINE__);
    got = run_split(req, n, 100, NULL);
    ck_assert_str_eq(got, want);
    free(got);
    /* "get" followed by hundreds of spaces is a get without keys */
    n = (size_t)sprintf(req, "get");
    memset(req + n, ' ', 500);
    n += 500;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    expect_bytes(req, n, "ERROR\r\nVERSION 1.6.99-test\r\n", 28, __LINE__);
    n = (size_t)sprintf(req, "get k");
    memset(req + n, ' ', 500);
    n += 500;
    n += (size_t)sprintf(req + n, "\r\n");
    expect_bytes(req, n, "VALUE k 0 1\r\nv\r\nEND\r\n", 21, __LINE__);
    expect_value("k", "v");
    free(req);
}
END_TEST

START_TEST(test_too_many_tokens)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    EXPECT("set k 0 0 1 noreply extra\r\na\r\n", "ERROR\r\nERROR\r\n");
    EXPECT("touch k 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\r\n",
           "ERROR\r\n");
    EXPECT("incr k 1 2 3\r\n", "ERROR\r\n");
    EXPECT("delete k 0 noreply x\r\n", "ERROR\r\n");
    EXPECT("set k 0 0\r\n", "ERROR\r\n");
    EXPECT("mg k v v v v v v v v v v v v v v v v v v v v v v v v v v\r\n",
           "CLIENT_ERROR options flags are too long\r\n");
    expect_alive();
    expect_value("k", "v");
}
END_TEST

/* ------------------------------------------------------------- others */

START_TEST(test_delete)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    EXPECT("delete k\r\n", "DELETED\r\n");
    EXPECT("delete k\r\n", "NOT_FOUND\r\n");
    EXPECT("delete k 0\r\n", "NOT_FOUND\r\n");
    EXPECT("delete k 1\r\n", "CLIENT_ERROR bad command line format.  "
                             "Usage: delete <key> [noreply]\r\n");
    EXPECT("delete k 0 0\r\n", "CLIENT_ERROR bad command line format.  "
                               "Usage: delete <key> [noreply]\r\n");
    EXPECT("delete k noreply\r\n", "");
    EXPECT("delete k 0 noreply\r\n", "");
    EXPECT("delete k x noreply\r\n", "");
    EXPECT("delete\r\n", "ERROR\r\n");
    EXPECT("set k 0 0 1\r\nv\r\ndelete k 0 noreply\r\nget k\r\n",
           "STORED\r\nEND\r\n");
    ck_assert_uint_eq(sth.delete_hits, 2);
    ck_assert_uint_eq(sth.delete_misses, 4);
}
END_TEST

START_TEST(test_incr_decr)
{
    EXPECT("set n 3 0 2\r\n10\r\n", "STORED\r\n");
    EXPECT("incr n 5\r\n", "15\r\n");
    EXPECT("decr n 100\r\n", "0\r\n");
    EXPECT("incr n 18446744073709551615\r\n", "18446744073709551615\r\n");
    EXPECT("incr n 2\r\n", "1\r\n"); /* wraps at 2^64 */
    EXPECT("incr n -1\r\n", "CLIENT_ERROR invalid numeric delta argument\r\n");
    EXPECT("incr n abc\r\n",
           "CLIENT_ERROR invalid numeric delta argument\r\n");
    EXPECT("incr n 18446744073709551616\r\n",
           "CLIENT_ERROR invalid numeric delta argument\r\n");
    EXPECT("incr nx 1\r\n", "NOT_FOUND\r\n");
    EXPECT("decr nx 1\r\n", "NOT_FOUND\r\n");
    EXPECT("set s 0 0 2\r\nab\r\n", "STORED\r\n");
    EXPECT("incr s 1\r\n", "CLIENT_ERROR cannot increment or decrement "
                           "non-numeric value\r\n");
    EXPECT("incr n 1 noreply\r\n", "");
    EXPECT("decr n 1 noreply\r\nincr n 7\r\n", "8\r\n");
    EXPECT("incr n\r\n", "ERROR\r\n");
    ck_assert_uint_eq(sth.incr_hits, 5);
    ck_assert_uint_eq(sth.decr_hits, 2);
    ck_assert_uint_eq(sth.incr_misses, 1);
    ck_assert_uint_eq(sth.decr_misses, 1);
    /* flags survive arithmetic */
    store_item *it = store_get(st, "n", 1);
    ck_assert_ptr_nonnull(it);
    ck_assert_uint_eq(store_item_flags(it), 3);
    store_item_release(it);
}
END_TEST

START_TEST(test_touch_gat)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    EXPECT("touch k 100\r\n", "TOUCHED\r\n");
    store_item *it = store_get(st, "k", 1);
    ck_assert_int_eq(store_item_exptime(it), (int64_t)T0_S + 100);
    store_item_release(it);
    EXPECT("touch zz 10\r\n", "NOT_FOUND\r\n");
    EXPECT("touch k x\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    EXPECT("touch k 10 noreply\r\n", "");
    EXPECT("gat 300 k zz\r\n", "VALUE k 0 1\r\nv\r\nEND\r\n");
    it = store_get(st, "k", 1);
    ck_assert_int_eq(store_item_exptime(it), (int64_t)T0_S + 300);
    store_item_release(it);
    char want[128];
    /* gats returns the cas of the item after the touch */
    size_t n;
    char *got = run_n("gats 0 k\r\n", 10, &n);
    snprintf(want, sizeof(want), "VALUE k 0 1 %" PRIu64 "\r\nv\r\nEND\r\n",
             cas_of("k"));
    ck_assert_str_eq(got, want);
    free(got);
    EXPECT("gat 10\r\n", "END\r\n");
    EXPECT("gat\r\n", "ERROR\r\n");
    EXPECT("gat x k\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    /* an expired item is gone */
    EXPECT("touch k -1\r\n", "TOUCHED\r\n");
    EXPECT("get k\r\n", "END\r\n");
    ck_assert_uint_eq(sth.cmd_touch, 7);
    ck_assert_uint_eq(sth.touch_hits, 5);
    ck_assert_uint_eq(sth.touch_misses, 2);
    /* as memcached: touch and gat misses on an expired value count in
     * get_expired, like the get above */
    ck_assert_uint_eq(sth.get_expired, 1);
    EXPECT("touch k 10\r\ngat 10 k\r\nmg k T10\r\n",
           "NOT_FOUND\r\nEND\r\nEN\r\n");
    ck_assert_uint_eq(sth.get_expired, 4);
    ck_assert_uint_eq(sth.touch_misses, 5);
    EXPECT("touch zz 10\r\n", "NOT_FOUND\r\n");
    ck_assert_uint_eq(sth.get_expired, 4);
}
END_TEST

START_TEST(test_exptime_relative_and_absolute)
{
    EXPECT("set a 0 100 1\r\na\r\nset b 0 1800000000 1\r\nb\r\n"
           "set c 0 -1 1\r\nc\r\n",
           "STORED\r\nSTORED\r\nSTORED\r\n");
    store_item *it = store_get(st, "a", 1);
    ck_assert_int_eq(store_item_exptime(it), (int64_t)T0_S + 100);
    store_item_release(it);
    it = store_get(st, "b", 1);
    ck_assert_int_eq(store_item_exptime(it), 1800000000);
    store_item_release(it);
    expect_missing("c");
    clock_ns += 101ULL * 1000000000ULL;
    EXPECT("get a b\r\n", "VALUE b 0 1\r\nb\r\nEND\r\n");
}
END_TEST

START_TEST(test_flush_all)
{
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    EXPECT("flush_all x\r\n", "CLIENT_ERROR invalid exptime argument\r\n");
    EXPECT("flush_all 1 2 3\r\n", "ERROR\r\n");
    expect_value("k", "v");
    EXPECT("flush_all\r\n", "OK\r\n");
    EXPECT("get k\r\n", "END\r\n");
    EXPECT("set k 0 0 1\r\nv\r\nflush_all 0\r\nget k\r\n",
           "STORED\r\nOK\r\nEND\r\n");
    EXPECT("set k 0 0 1\r\nv\r\nflush_all noreply\r\nget k\r\n",
           "STORED\r\nEND\r\n");
    /* a delayed flush takes effect later */
    clock_ns += 5ULL * 1000000000ULL;
    EXPECT("set k 0 0 1\r\nv\r\nflush_all 10 noreply\r\nget k\r\n",
           "STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n");
    clock_ns += 11ULL * 1000000000ULL;
    EXPECT("get k\r\n", "END\r\n");
    EXPECT("flush_all -1\r\n", "OK\r\n");
    cfg.flush_enabled = false;
    EXPECT("set k 0 0 1\r\nv\r\n", "STORED\r\n");
    EXPECT("flush_all\r\n", "CLIENT_ERROR flush_all not allowed\r\n");
    EXPECT("flush_all noreply\r\n", "");
    expect_value("k", "v");
    ck_assert_uint_eq(sth.cmd_flush, 8);
}
END_TEST

START_TEST(test_misc_commands)
{
    EXPECT("version\r\n", "VERSION 1.6.99-test\r\n");
    EXPECT("verbosity\r\n", "ERROR\r\n");
    EXPECT("verbosity 1\r\n", "OK\r\n");
    ck_assert_int_eq(ctx.verbose, 1);
    EXPECT("verbosity x\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("verbosity 9 noreply\r\n", "");
    ck_assert_int_eq(ctx.verbose, 2);
    EXPECT("verbosity 1 2\r\n", "OK\r\n");
    EXPECT("verbosity 1 2 3\r\n", "ERROR\r\n");
    EXPECT("foo\r\n", "ERROR\r\n");
    EXPECT("GET k\r\n", "ERROR\r\n");
    EXPECT("\r\n", "ERROR\r\n");
    EXPECT("\n", "ERROR\r\n");
    EXPECT(" \r\n", "ERROR\r\n");
    EXPECT("x\r\n", "ERROR\r\n");
    EXPECT("mz k\r\n", "ERROR\r\n");
    EXPECT("slabs nosuch 1\r\n", "ERROR\r\n");
}
END_TEST

START_TEST(test_stats)
{
    EXPECT("stats reset\r\n", "RESET\r\n");
    EXPECT("stats nosuchgroup\r\n", "ERROR\r\n");
    EXPECT("stats sizes\r\n", "STAT sizes_status disabled\r\nEND\r\n");
    EXPECT("stats detail\r\n",
           "CLIENT_ERROR usage: stats detail on|off|dump\r\n");
    EXPECT("stats detail dump\r\n", "END\r\n");
    EXPECT("stats detail on\r\n", "OK\r\n");
    EXPECT("stats detail dump\r\n", "END\r\n");
    /* as memcached: the prefix is the key up to ':'; get counts a hit */
    EXPECT("set foo:123 0 0 6\r\nfooval\r\n", "STORED\r\n");
    EXPECT("stats detail dump\r\n",
           "PREFIX foo get 0 hit 0 set 1 del 0\r\nEND\r\n");
    EXPECT("get foo:123 foo:nope nocolon\r\n",
           "VALUE foo:123 0 6\r\nfooval\r\nEND\r\n");
    EXPECT("delete foo:123\r\nset bar:1 0 0 1\r\nx\r\n",
           "DELETED\r\nSTORED\r\n");
    EXPECT("stats detail dump\r\n",
           "PREFIX foo get 2 hit 1 set 1 del 1\r\n"
           "PREFIX bar get 0 hit 0 set 1 del 0\r\nEND\r\n");
    EXPECT("stats detail off\r\n", "OK\r\n");
    EXPECT("get foo:123\r\n", "END\r\n");
    /* off stops counting; the counts stay until stats reset */
    EXPECT("stats detail dump\r\n",
           "PREFIX foo get 2 hit 1 set 1 del 1\r\n"
           "PREFIX bar get 0 hit 0 set 1 del 0\r\nEND\r\n");
    EXPECT("stats reset\r\nstats detail dump\r\n", "RESET\r\nEND\r\n");
    /* regression: a prefix counted again after a reset starts from 0 */
    EXPECT("stats detail on\r\n", "OK\r\n");
    EXPECT("get foo:123\r\nstats detail dump\r\n",
           "END\r\nPREFIX foo get 1 hit 0 set 0 del 0\r\nEND\r\n");
    EXPECT("stats detail off\r\n", "OK\r\n");
    size_t n;
    char *got = run_n("stats\r\n", 7, &n);
    ck_assert_msg(n > 10 && memcmp(got, "STAT ", 5) == 0 &&
                      memcmp(got + n - 5, "END\r\n", 5) == 0,
                  "stats: %s", got);
    free(got);
}
END_TEST

START_TEST(test_quit_shutdown_http)
{
    size_t n;
    char *got = run_n("get k\r\nquit\r\nversion\r\n", 22, &n);
    ck_assert_str_eq(got, "END\r\n");
    ck_assert_int_eq(last_rc, PROTO_CLOSE);
    free(got);
    EXPECT("shutdown\r\n", "ERROR: shutdown not enabled\r\n");
    EXPECT("shutdown graceful\r\n", "ERROR: shutdown not enabled\r\n");
    ck_assert_int_eq(last_rc, PROTO_OK);
    cfg.shutdown_enabled = true;
    EXPECT("shutdown foo\r\n", "CLIENT_ERROR invalid shutdown mode\r\n");
    got = run_n("shutdown\r\nversion\r\n", 19, &n);
    ck_assert_str_eq(got, "");
    ck_assert_int_eq(last_rc, PROTO_SHUTDOWN);
    free(got);
    got = run_n("shutdown graceful\r\n", 19, &n);
    ck_assert_int_eq(last_rc, PROTO_SHUTDOWN);
    free(got);
    got = run_n("GET / HTTP/1.1\r\nversion\r\n", 25, &n);
    ck_assert_str_eq(got, "");
    ck_assert_int_eq(last_rc, PROTO_CLOSE_ERROR); /* a protocol error */
    free(got);
}
END_TEST

START_TEST(test_pipeline_split_equivalence)
{
    static const char req[] =
        "set a 1 0 3\r\nabc\r\nget a\r\nincr n 1\r\nset n 0 0 1\r\n7\r\n"
        "incr n 3\r\nappend a 0 0 2 noreply\r\nde\r\ngets zz\r\n"
        "delete a\r\nget a n\r\ntouch n 0\r\nmn\r\nms m 2 T0 c\r\nhi\r\n"
        "mg m v s f\r\nset k 0 0 -5\r\nbogus\r\nversion\r\n";
    static const char want[] =
        "STORED\r\nVALUE a 1 3\r\nabc\r\nEND\r\nNOT_FOUND\r\nSTORED\r\n"
        "10\r\nEND\r\nDELETED\r\nVALUE n 0 2\r\n10\r\nEND\r\nTOUCHED\r\n"
        "MN\r\nHD c%" PRIu64 "\r\nVA 2 s2 f0\r\nhi\r\n"
        "CLIENT_ERROR bad command line format\r\nERROR\r\n"
        "VERSION 1.6.99-test\r\n";
    size_t steps[] = {sizeof(req), 1, 2, 3, 7, 16};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        teardown();
        setup();
        size_t n;
        char *got = run_split(req, sizeof(req) - 1, steps[i], &n);
        char w[512];
        snprintf(w, sizeof(w), want, cas_of("m"));
        ck_assert_msg(strcmp(got, w) == 0, "step %zu: got %s", steps[i], got);
        ck_assert_uint_eq(left_in, 0);
        free(got);
        /* the same pieces through the worker's memory */
        teardown();
        setup();
        size_t lent;
        got = run_lent(req, sizeof(req) - 1, steps[i], &n, &lent);
        snprintf(w, sizeof(w), want, cas_of("m"));
        ck_assert_msg(strcmp(got, w) == 0, "lent, step %zu: got %s", steps[i],
                      got);
        ck_assert_uint_eq(left_in, 0);
        ck_assert_uint_gt(lent, 0);
        free(got);
    }
}
END_TEST

/* Lent input and reply memory (proto.h) beside the connection's buffers. */
START_TEST(test_lent_memory)
{
    size_t n, lent;
    /* a whole request: nothing kept, the reply all in the lent memory */
    static const char whole[] = "set a 0 0 3\r\nabc\r\nget a\r\n";
    char *got =
        run_lent(whole, sizeof(whole) - 1, sizeof(whole) - 1, &n, &lent);
    ck_assert_str_eq(got, "STORED\r\nVALUE a 0 3\r\nabc\r\nEND\r\n");
    ck_assert_uint_eq(lent, n);
    ck_assert_uint_eq(left_in, 0);
    free(got);
    /* a request cut short: its head is kept in `in` */
    got = run_lent("set b 0 0 5\r\nab", 16, 16, &n, &lent);
    ck_assert_str_eq(got, "");
    ck_assert_uint_eq(left_in, 16);
    free(got);
    /* a value that fits the lent reply memory is copied there: the whole
     * reply stays lent */
    char big[9000 + 64];
    int h = sprintf(big, "set c 0 0 3000\r\n");
    memset(big + h, 'v', 3000);
    memcpy(big + h + 3000, "\r\nget c\r\n", 9);
    got = run_lent(big, (size_t)h + 3009, (size_t)h + 3009, &n, &lent);
    ck_assert_uint_eq(n, 8 + 16 + 3000 + 2 + 5);
    ck_assert(memcmp(got, "STORED\r\nVALUE c 0 3000\r\nvvv", 27) == 0);
    ck_assert(memcmp(got + n - 8, "v\r\nEND\r\n", 8) == 0);
    ck_assert_uint_eq(lent, n);
    free(got);
    /* one that does not is sent by reference: the head before it goes to
     * `out`, the tail after it stays lent, and together they read in
     * order */
    h = sprintf(big, "set d 0 0 9000\r\n");
    memset(big + h, 'w', 9000);
    memcpy(big + h + 9000, "\r\nget d\r\n", 9);
    got = run_lent(big, (size_t)h + 9009, (size_t)h + 9009, &n, &lent);
    ck_assert_uint_eq(n, 8 + 16 + 9000 + 2 + 5);
    ck_assert(memcmp(got, "STORED\r\nVALUE d 0 9000\r\nwww", 27) == 0);
    ck_assert(memcmp(got + n - 8, "w\r\nEND\r\n", 8) == 0);
    ck_assert_uint_eq(lent, 7);
    free(got);
    /* behind replies already in `out`, a value that would fit is still
     * referenced, so the lent memory never holds a copy it must move */
    static const char two[] = "get d c\r\n";
    got = run_lent(two, sizeof(two) - 1, sizeof(two) - 1, &n, &lent);
    ck_assert_uint_eq(n, 16 + 9000 + 2 + 16 + 3000 + 2 + 5);
    ck_assert(memcmp(got + n - 8, "v\r\nEND\r\n", 8) == 0);
    ck_assert_uint_eq(lent, 7);
    free(got);
    /* replies beyond the lent memory: the first ones go to `out` */
    char many[600 * 9];
    for (int i = 0; i < 600; i++)
        memcpy(many + i * 9, "version\r\n", 9);
    got = run_lent(many, sizeof(many), sizeof(many), &n, &lent);
    ck_assert_uint_eq(n, 600 * 21);
    ck_assert_uint_lt(lent, n);
    for (int i = 0; i < 600; i++)
        ck_assert(memcmp(got + i * 21, "VERSION 1.6.99-test\r\n", 21) == 0);
    free(got);
}
END_TEST

START_TEST(test_nomem)
{
    /* a store with a tiny memory limit and values that cannot fit */
    store_destroy(st);
    store_options o;
    int err = 0;
    store_options_default(&o);
    o.node_id = 1;
    o.clock = test_clock;
    o.memory_limit = 2048;
    st = store_create(&o, &err);
    ck_assert_ptr_nonnull(st);
    ctx.store = st;
    char req[8192];
    size_t n = (size_t)sprintf(req, "set k 0 0 4000\r\n");
    memset(req + n, 'x', 4000);
    n += 4000;
    n += (size_t)sprintf(req + n, "\r\nversion\r\n");
    size_t gn;
    char *got = run_n(req, n, &gn);
    ck_assert_msg(strcmp(got, "SERVER_ERROR out of memory storing object\r\n"
                              "VERSION 1.6.99-test\r\n") == 0 ||
                      strcmp(got, "SERVER_ERROR object too large for cache"
                                  "\r\nVERSION 1.6.99-test\r\n") == 0,
                  "got %s", got);
    free(got);
    expect_missing("k");
}
END_TEST

/*
 * A client that pipelines more than it reads: the parser stops taking
 * requests once `out` holds more than output_max and leaves the rest in
 * `in`; run again after the output drained, it goes on where it stopped.
 */
START_TEST(test_output_max_pauses_between_requests)
{
    char value[601];
    memset(value, 'v', 600);
    value[600] = '\0';
    char set[700];
    snprintf(set, sizeof(set), "set big 0 0 600\r\n%s\r\n", value);
    free(run_n(set, strlen(set), NULL));
    cfg.output_max = 1000;
    const char *one = "get big\r\n";
    struct evbuffer *in = evbuffer_new(), *out = evbuffer_new();
    for (int i = 0; i < 10; i++)
        evbuffer_add(in, one, strlen(one));
    size_t reply = strlen("VALUE big 0 600\r\n") + 600 + strlen("\r\nEND\r\n");
    size_t got = 0;
    int rounds = 0;
    while (evbuffer_get_length(in) > 0 && rounds < 20) {
        int rc = proto_text_execute(&ctx, in, out);
        /* Paused while requests are left, done once none are. */
        ck_assert_int_eq(rc,
                         (evbuffer_get_length(in) ? PROTO_PAUSED : PROTO_OK));
        size_t len = evbuffer_get_length(out);
        /* Two replies pass the 1000-byte mark: the third waits. */
        ck_assert_uint_le(len, 2 * reply);
        ck_assert_uint_eq(len % reply, 0);
        got += len / reply;
        evbuffer_drain(out, len);
        rounds++;
    }
    ck_assert_uint_eq(got, 10);
    ck_assert_int_eq(rounds, 5);
    evbuffer_free(in);
    evbuffer_free(out);
    cfg.output_max = 0;
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("proto_text");
    TCase *tc = tcase_create("text");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_set_get);
    tcase_add_test(tc, test_multiget_and_gets);
    tcase_add_test(tc, test_many_keys);
    tcase_add_test(tc, test_large_value_by_reference);
    tcase_add_test(tc, test_add_replace_append_prepend);
    tcase_add_test(tc, test_cas);
    tcase_add_test(tc, test_cas_disabled);
    tcase_add_test(tc, test_noreply_storage);
    tcase_add_test(tc, test_bad_byte_counts);
    tcase_add_test(tc, test_flags_modulo_2_32);
    tcase_add_test(tc, test_slabs_and_memlimit);
    tcase_add_test(tc, test_too_large_swallowed);
    tcase_add_test(tc, test_bad_data_chunk);
    tcase_add_test(tc, test_incomplete_waits);
    tcase_add_test(tc, test_key_limits);
    tcase_add_test(tc, test_line_too_long);
    tcase_add_test(tc, test_too_many_tokens);
    tcase_add_test(tc, test_delete);
    tcase_add_test(tc, test_incr_decr);
    tcase_add_test(tc, test_touch_gat);
    tcase_add_test(tc, test_exptime_relative_and_absolute);
    tcase_add_test(tc, test_flush_all);
    tcase_add_test(tc, test_misc_commands);
    tcase_add_test(tc, test_stats);
    tcase_add_test(tc, test_quit_shutdown_http);
    tcase_add_test(tc, test_pipeline_split_equivalence);
    tcase_add_test(tc, test_lent_memory);
    tcase_add_test(tc, test_nomem);
    tcase_add_test(tc, test_output_max_pauses_between_requests);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
