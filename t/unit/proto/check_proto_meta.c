/*
 * check_proto_meta.c -- the meta protocol (mg ms md ma me mn), byte for byte.
 *
 * Requests are fed to proto_text_execute with a real store; every test
 * asserts the exact reply bytes a memcached 1.6 client would read. The
 * store runs on a fixed clock so ttls are exact.
 */
#include "prototest.h"

/*
 * Runs req, then expects want_fmt with its one PRIu64 conversion replaced by
 * the cas key has after the request.
 */
static void expect_cas(const char *req, const char *want_fmt, const char *key,
                       int line)
{
    size_t n;
    char w[1024];
    char *got = run_n(req, strlen(req), &n);
    snprintf(w, sizeof(w), want_fmt, cas_of(key));
    ck_assert_msg(strcmp(got, w) == 0, "line %d: got %s want %s", line, got,
                  w);
    free(got);
}

START_TEST(test_mn_and_basic)
{
    EXPECT("mn\r\n", "MN\r\n");
    EXPECT("mn x y\r\n", "MN\r\n");
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    EXPECT("mg a v\r\n", "VA 2\r\nhi\r\n");
    EXPECT("mg a\r\n", "HD\r\n");
    EXPECT("mg zz\r\nmg zz v\r\n", "EN\r\nEN\r\n");
    EXPECT("mg\r\n", "ERROR\r\n");
    EXPECT("ms\r\n", "ERROR\r\n");
    EXPECT("md\r\n", "ERROR\r\n");
    EXPECT("ma\r\n", "ERROR\r\n");
    ck_assert_uint_eq(sth.cmd_get, 4);
    ck_assert_uint_eq(sth.get_hits, 2);
    ck_assert_uint_eq(sth.get_misses, 2);
    ck_assert_uint_eq(sth.cmd_set, 1);
}
END_TEST

START_TEST(test_mg_flags_in_order)
{
    EXPECT("ms a 2 F7 T100\r\nhi\r\n", "HD\r\n");
    expect_cas("mg a s v f t c k O1\r\n",
               "VA 2 s2 f7 t100 c%" PRIu64 " ka O1\r\nhi\r\n", "a", __LINE__);
    expect_cas("mg a O2 c k t f s\r\n", "HD O2 c%" PRIu64 " ka t100 f7 s2\r\n",
               "a", __LINE__);
    /* ttl counts down with the clock; -1 without expiry */
    clock_ns += 40ULL * 1000000000ULL;
    EXPECT("mg a t\r\n", "HD t60\r\n");
    EXPECT("ms b 1\r\nx\r\nmg b t\r\n", "HD\r\nHD t-1\r\n");
    /* miss: only O and k come back */
    EXPECT("mg zz k O123 v s\r\n", "EN kzz O123\r\n");
    /* P and L (proxy hints) are accepted and ignored */
    EXPECT("mg a P L s\r\n", "HD s2\r\n");
}
END_TEST

START_TEST(test_mg_hit_and_access)
{
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    /* h and l report the state before this request */
    EXPECT("mg a h l\r\n", "HD h0 l0\r\n");
    clock_ns += 7ULL * 1000000000ULL;
    EXPECT("mg a h l\r\n", "HD h1 l7\r\n");
}
END_TEST

/* u reads without recording an access: not marked fetched, time kept. */
START_TEST(test_mg_no_update)
{
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    clock_ns += 3ULL * 1000000000ULL;
    EXPECT("mg a u h l v\r\n", "VA 2 h0 l3\r\nhi\r\n");
    clock_ns += 2ULL * 1000000000ULL;
    EXPECT("mg a u h l\r\n", "HD h0 l5\r\n");
    /* A read without u records it; the next one sees it. */
    EXPECT("mg a h l\r\n", "HD h0 l5\r\n");
    EXPECT("mg a u h l\r\n", "HD h1 l0\r\n");
}
END_TEST

START_TEST(test_mg_quiet)
{
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    /* q hides a miss (EN), never a hit */
    EXPECT("mg zz q\r\nmg zz k O1 q\r\nmg a q\r\nmg a v q k\r\nmn\r\n",
           "HD\r\nVA 2 ka\r\nhi\r\nMN\r\n");
    /* errors are always shown */
    EXPECT("mg a q Z\r\n", "CLIENT_ERROR invalid flag\r\n");
}
END_TEST

START_TEST(test_mg_touch_and_vivify)
{
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    EXPECT("mg a T30 t v\r\n", "VA 2 t30\r\nhi\r\n");
    EXPECT("mg zz T30\r\n", "EN\r\n");
    ck_assert_uint_eq(sth.cmd_touch, 2);
    ck_assert_uint_eq(sth.touch_hits, 1);
    ck_assert_uint_eq(sth.touch_misses, 1);
    /* N: a miss creates an empty item and wins (W) the right to fill it */
    EXPECT("mg v N30 s t v\r\n", "VA 0 s0 t30 W\r\n\r\n");
    /* later readers see that another client is filling it (Z) */
    EXPECT("mg v N30 s t\r\n", "HD s0 t30 Z\r\n");
    EXPECT("mg v\r\n", "HD Z\r\n");
    EXPECT("mg w N0 q\r\n", "HD W\r\n");
    EXPECT("mg v Nx\r\n", "CLIENT_ERROR bad token in command line format\r\n");
    EXPECT("mg v T\r\n", "CLIENT_ERROR bad token in command line format\r\n");
}
END_TEST

START_TEST(test_mg_errors)
{
    EXPECT("ms a 2\r\nhi\r\n", "HD\r\n");
    EXPECT("mg a Z\r\n", "CLIENT_ERROR invalid flag\r\n");
    EXPECT("mg a E0\r\n", "CLIENT_ERROR bad token in command line format\r\n");
    EXPECT("mg a R\r\n", "CLIENT_ERROR bad token in command line format\r\n");
    EXPECT("mg a Rx\r\n", "CLIENT_ERROR bad token in command line format\r\n");
    /* I and x are md/ms flags: accepted and ignored by mg */
    EXPECT("mg a I x\r\n", "HD\r\n");
    EXPECT("mg a v v\r\n", "CLIENT_ERROR duplicate flag\r\n");
    /* 32 bytes including the O itself is the longest opaque */
    EXPECT("mg a O12345678901234567890123456789012\r\n",
           "CLIENT_ERROR opaque token too long\r\n");
    EXPECT("mg a O1234567890123456789012345678901\r\n",
           "HD O1234567890123456789012345678901\r\n");
    EXPECT("mg a s s s s s s s s s s s s s s s s s s s\r\n",
           "CLIENT_ERROR options flags are too long\r\n");
    EXPECT("mg a\x01 v k\r\n", "EN ka\x01\r\n"); /* a key like any other */
    /* regression: a bad F number used to answer with no error text */
    EXPECT("mg a F\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("mg a Fx\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("mg a F99999999999999999999\r\n",
           "CLIENT_ERROR bad command line format\r\n");
    char req[600];
    memset(req, 0, sizeof(req));
    memcpy(req, "mg ", 3);
    memset(req + 3, 'k', 251);
    memcpy(req + 254, " v\r\n", 4);
    expect_bytes(req, strlen(req), "CLIENT_ERROR bad command line format\r\n",
                 38, __LINE__);
    EXPECT("version\r\n", "VERSION 1.6.99-test\r\n");
}
END_TEST

START_TEST(test_base64_keys)
{
    /* "abc" is YWJj */
    EXPECT("mg YWJj b k v\r\n", "EN kYWJj b\r\n");
    expect_cas("ms YWJj 2 b k c O5 T0\r\nhi\r\n",
               "HD kYWJj b c%" PRIu64 " O5\r\n", "abc", __LINE__);
    EXPECT("mg YWJj b k v s\r\n", "VA 2 kYWJj b s2\r\nhi\r\n");
    EXPECT("get abc\r\n", "VALUE abc 0 2\r\nhi\r\nEND\r\n");
    EXPECT("mg YWI b\r\n", "CLIENT_ERROR error decoding key\r\n");
    EXPECT("mg YWI= b k\r\n", "EN kYWI= b\r\n");
    /* binary bytes (a space, a newline) are fine in a base64 key */
    EXPECT("ms IAo= 1 b\r\nz\r\n", "HD\r\n");
    EXPECT("mg IAo= b v k\r\n", "VA 1 kIAo= b\r\nz\r\n");
    EXPECT("md IAo= b q\r\nmg IAo= b v\r\n", "EN\r\n");
    /* a bad key with a data block: the block is swallowed */
    EXPECT("ms b 2 b\r\nhi\r\nmn\r\n",
           "CLIENT_ERROR error decoding key\r\nMN\r\n");
}
END_TEST

START_TEST(test_ms_modes)
{
    EXPECT("ms k 1 ME\r\na\r\n", "HD\r\n");
    EXPECT("ms k 1 ME\r\nb\r\n", "NS\r\n");
    EXPECT("ms k 1 MA\r\nc\r\n", "HD\r\n");
    EXPECT("ms k 1 MP\r\nd\r\n", "HD\r\n");
    EXPECT("ms zz 1 MA\r\nc\r\nms zz 1 MP\r\nc\r\nms zz 1 MR\r\nc\r\n",
           "NS\r\nNS\r\nNS\r\n");
    EXPECT("ms k 1 MR F3\r\ne\r\n", "HD\r\n");
    EXPECT("ms k 2 MS\r\nff\r\n", "HD\r\n");
    EXPECT("ms k 1 MX\r\nx\r\nmn\r\n",
           "CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n");
    EXPECT("ms k 1 MEE\r\nx\r\nmn\r\n",
           "CLIENT_ERROR incorrect length for M token\r\nMN\r\n");
    EXPECT("get k zz\r\n", "VALUE k 0 2\r\nff\r\nEND\r\n");
    EXPECT("ms k 1 q\r\ng\r\nms k 1 q ME\r\nh\r\nmn\r\n", "NS\r\nMN\r\n");
    expect_value("k", "g");
}
END_TEST

START_TEST(test_ms_cas)
{
    EXPECT("ms k 1 C5\r\na\r\n", "NF\r\n");
    EXPECT("ms k 1\r\na\r\n", "HD\r\n");
    uint64_t c = cas_of("k");
    char req[128], want[128];
    snprintf(req, sizeof(req), "ms k 1 C%" PRIu64 " c\r\nb\r\n", c + 1);
    expect_bytes(req, strlen(req), "EX c0\r\n", 7, __LINE__);
    snprintf(req, sizeof(req), "ms k 1 C%" PRIu64 " c\r\nb\r\n", c);
    size_t n;
    char *got = run_n(req, strlen(req), &n);
    snprintf(want, sizeof(want), "HD c%" PRIu64 "\r\n", cas_of("k"));
    ck_assert_str_eq(got, want);
    ck_assert_uint_ne(cas_of("k"), c);
    free(got);
    /* append with a wrong cas fails; add ignores the cas */
    snprintf(req, sizeof(req), "ms k 1 MA C%" PRIu64 "\r\nz\r\n", c);
    expect_bytes(req, strlen(req), "EX\r\n", 4, __LINE__);
    EXPECT("ms n 1 ME C1\r\nz\r\n", "HD\r\n");
    expect_value("k", "b");
    ck_assert_uint_eq(sth.cas_misses, 1);
    ck_assert_uint_eq(sth.cas_badval, 1);
    ck_assert_uint_eq(sth.cas_hits, 1);
}
END_TEST

START_TEST(test_ms_errors)
{
    EXPECT("ms k 1\r\nv\r\n", "HD\r\n");
    EXPECT("ms k\r\n", "CLIENT_ERROR bad command line format\r\n");
    /* a bad length: nothing is swallowed */
    EXPECT("ms k x\r\nhi\r\n",
           "CLIENT_ERROR bad command line format\r\nERROR\r\n");
    EXPECT("ms k -1\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("ms k 2147483647\r\n", "CLIENT_ERROR bad command line format\r\n");
    /* a bad flag after a good length: the block is swallowed */
    EXPECT("ms k 1 C\r\nx\r\nmn\r\n",
           "CLIENT_ERROR bad token in command line format\r\nMN\r\n");
    EXPECT("ms k 1 Fx\r\nx\r\nmn\r\n",
           "CLIENT_ERROR bad command line format\r\nMN\r\n");
    EXPECT("ms k 1 Z q\r\nx\r\nmn\r\n", "CLIENT_ERROR invalid flag\r\nMN\r\n");
    /* I without C: nothing to invalidate against, a plain set */
    EXPECT("ms j 1 I\r\nx\r\nmn\r\n", "HD\r\nMN\r\n");
    EXPECT("ms k 1 c c\r\nx\r\nmn\r\n",
           "CLIENT_ERROR duplicate flag\r\nMN\r\n");
    EXPECT("ms k 1 O123456789012345678901234567890123\r\nx\r\nmn\r\n",
           "CLIENT_ERROR opaque token too long\r\nMN\r\n");
    EXPECT("ms k 1 s s s s s s s s s s s s s s s s s s\r\nx\r\n",
           "CLIENT_ERROR options flags too long\r\nERROR\r\n");
    /* a bad data chunk is reported even in quiet mode */
    EXPECT("ms k 1 q\r\nxyz\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\n");
    EXPECT("version\r\n", "VERSION 1.6.99-test\r\n");
    expect_value("k", "v");
}
END_TEST

START_TEST(test_md)
{
    EXPECT("md zz q\r\nmd zz\r\nmd zz k O1\r\n", "NF\r\nNF\r\nNF kzz O1\r\n");
    EXPECT("ms zz 1\r\nx\r\n", "HD\r\n");
    EXPECT("md zz q C1\r\n", "EX\r\n");
    EXPECT("md zz O9 k\r\n", "HD O9 kzz\r\n");
    EXPECT("ms zz 1\r\nx\r\nmd zz q\r\nmn\r\n", "HD\r\nMN\r\n");
    expect_missing("zz");
    EXPECT("ms zz 1\r\nx\r\n", "HD\r\n");
    char req[64];
    snprintf(req, sizeof(req), "md zz C%" PRIu64 " T30\r\n", cas_of("zz"));
    expect_bytes(req, strlen(req), "HD\r\n", 4, __LINE__);
    EXPECT("md zz I\r\n", "NF\r\n");
    EXPECT("md zz Z\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("md zz Q\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("md zz k k\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("md zz s s s s s s s s s s s s s s s s s s s\r\n",
           "CLIENT_ERROR options flags too long\r\n");
    ck_assert_uint_eq(sth.delete_hits, 3);
    ck_assert_uint_eq(sth.delete_misses, 5);
}
END_TEST

START_TEST(test_ma)
{
    EXPECT("ma n\r\nma n q\r\n", "NF\r\nNF\r\n");
    EXPECT("ma n N0 J5 v\r\n", "VA 1\r\n5\r\n");
    EXPECT("ma n v q\r\n", "");
    EXPECT("ma n v\r\n", "VA 1\r\n7\r\n");
    expect_cas("ma n MD D100 v c t\r\n", "VA 1 c%" PRIu64 " t-1\r\n0\r\n", "n",
               __LINE__);
    EXPECT("ma n M+ D10 O3 k\r\n", "HD O3 kn\r\n");
    EXPECT("ma n M- D3 v\r\n", "VA 1\r\n7\r\n");
    EXPECT("ma n MI v\r\n", "VA 1\r\n8\r\n");
    EXPECT("ma n T100 t v\r\n", "VA 1 t100\r\n9\r\n");
    EXPECT("ma n Mx\r\n", "CLIENT_ERROR invalid mode for ma M token\r\n");
    EXPECT("ma n Dx\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("ma n Jx\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("ms s 1\r\nx\r\nma s\r\n",
           "HD\r\nCLIENT_ERROR cannot increment or decrement non-numeric "
           "value\r\n");
    EXPECT("ma n C1\r\n", "EX\r\n");
    /* quiet hides a success but not a creation */
    EXPECT("ma n N0 q\r\nma m N0 J9 q\r\nmn\r\n", "HD\r\nMN\r\n");
    EXPECT("ma zz N0 J18446744073709551615\r\nma zz v\r\n",
           "HD\r\nVA 1\r\n0\r\n");
    EXPECT("mg n v\r\n", "VA 2\r\n10\r\n");
    ck_assert_uint_eq(sth.incr_misses, 2);
}
END_TEST

/*
 * Stale-while-revalidate: md I marks a value stale (new cas, T sets its
 * ttl); the first mg wins the recache (W), later ones see Z; a recache
 * with the cas read before the invalidation and I is stored but stays
 * stale; one with the current cas is clean. R wins when the ttl left is
 * below its token. md x empties a value and keeps the item.
 */
START_TEST(test_stale_while_revalidate)
{
    char req[128];
    EXPECT("ms s 2 T100\r\nhi\r\n", "HD\r\n");
    uint64_t c0 = cas_of("s");
    EXPECT("mg s\r\n", "HD\r\n");
    EXPECT("md s I T30 q\r\nmn\r\n", "MN\r\n");
    ck_assert_uint_ne(cas_of("s"), c0);
    uint64_t c1 = cas_of("s");
    EXPECT("mg s t v\r\n", "VA 2 t30 X W\r\nhi\r\n");
    EXPECT("mg s v\r\n", "VA 2 Z X\r\nhi\r\n");
    EXPECT("mg s k\r\n", "HD ks Z X\r\n");
    ck_assert_uint_eq(cas_of("s"), c1); /* winning keeps the cas */
    /* the winner's recache raced the invalidation: stored, still stale */
    snprintf(req, sizeof(req), "ms s 3 C%" PRIu64 " T500\r\nnew\r\n", c0);
    expect_bytes(req, strlen(req), "EX\r\n", 4, __LINE__);
    snprintf(req, sizeof(req), "ms s 3 C%" PRIu64 " I T500\r\nnew\r\n", c0);
    expect_bytes(req, strlen(req), "HD\r\n", 4, __LINE__);
    EXPECT("mg s t v\r\n", "VA 3 t30 Z X\r\nnew\r\n");
    /* a recache with the current cas clears the marks */
    snprintf(req, sizeof(req), "ms s 2 C%" PRIu64 " I T500\r\nok\r\n",
             cas_of("s"));
    expect_bytes(req, strlen(req), "HD\r\n", 4, __LINE__);
    EXPECT("mg s t v\r\n", "VA 2 t500\r\nok\r\n");
    EXPECT("md s I C1\r\n", "EX\r\n");
    EXPECT("md s I E77 T0\r\nmg s c t\r\n", "HD\r\nHD c77 t-1 X W\r\n");

    /* R: win once the ttl left is below the token; no expiry never wins */
    EXPECT("ms r 1 T100\r\nx\r\n", "HD\r\n");
    EXPECT("mg r R30 t\r\n", "HD t100\r\n");
    clock_ns += 80ULL * 1000000000ULL;
    EXPECT("mg r R30 t\r\n", "HD t20 W\r\n");
    EXPECT("mg r R30 t\r\n", "HD t20 Z\r\n");
    EXPECT("mg r t\r\n", "HD t20 Z\r\n");
    EXPECT("ms r 1 T100\r\ny\r\nmg r R30\r\n", "HD\r\nHD\r\n");
    EXPECT("ms n 1\r\nx\r\nmg n R30\r\n", "HD\r\nHD\r\n");
    /* T and R together: R looks at the new ttl */
    EXPECT("mg r T10 R30 t\r\n", "HD t10 W\r\n");

    /* md x: the value goes, the item stays (flags 0, no ttl, same cas) */
    EXPECT("ms x 5 F3 T100\r\nhello\r\n", "HD\r\n");
    uint64_t cx = cas_of("x");
    EXPECT("md x x\r\n", "HD\r\n");
    snprintf(req, sizeof(req), "VA 0 f0 t-1 c%" PRIu64 "\r\n\r\n", cx);
    char *got = run_n("mg x v f t c\r\n", 14, NULL);
    ck_assert_str_eq(got, req);
    free(got);
    EXPECT("md x x I T10\r\nmg x s t\r\n", "HD\r\nHD s0 t10 X W\r\n");
    EXPECT("md nothere x\r\n", "NF\r\n");
    /* md I and x are not deletions */
    ck_assert_uint_eq(sth.delete_hits, 1);
}
END_TEST

/* E: the cas the stored item gets (ms, ma); the cas of a later write is
 * fresh again. mg does not keep E; 0 is not a cas. */
START_TEST(test_explicit_cas)
{
    EXPECT("ms e 1 E777 c\r\nx\r\n", "HD c777\r\n");
    EXPECT("mg e c v\r\n", "VA 1 c777\r\nx\r\n");
    EXPECT("ms e 1 C777 E900\r\ny\r\n", "HD\r\n");
    EXPECT("mg e c\r\n", "HD c900\r\n");
    EXPECT("ms e 1 C777 E901\r\nz\r\n", "EX\r\n");
    EXPECT("mg e v\r\n", "VA 1\r\ny\r\n");
    EXPECT("ma n N0 J5 E42 c v\r\n", "VA 1 c42\r\n5\r\n");
    EXPECT("ma n E43 c v\r\n", "VA 1 c43\r\n6\r\n");
    EXPECT("ma n C43 E44 c\r\n", "HD c44\r\n");
    ck_assert_uint_eq(cas_of("e"), 900);
    /* mg: E is the cas of a vivified item; a hit or a touch keeps its cas */
    EXPECT("mg e E5 c\r\n", "HD c900\r\n");
    EXPECT("mg e E5 T30 c\r\n", "HD c900\r\n");
    EXPECT("mg v N30 E55 c\r\n", "HD c55 W\r\n");
    EXPECT("mg v N30 E56 c\r\n", "HD c55 Z\r\n");
    EXPECT("ms e 1\r\nw\r\n", "HD\r\n");
    ck_assert_uint_ne(cas_of("e"), 900);
    ck_assert_uint_ne(cas_of("e"), 0);
    EXPECT("ms e 1 E0\r\nq\r\nmn\r\n",
           "CLIENT_ERROR bad token in command line format\r\nMN\r\n");
    EXPECT("ma n Ex\r\n", "CLIENT_ERROR invalid or duplicate flag\r\n");
    EXPECT("md e E9\r\n", "HD\r\n");
}
END_TEST

START_TEST(test_me)
{
    EXPECT("me zz\r\n", "EN\r\n");
    EXPECT("me\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("me a b c\r\n", "CLIENT_ERROR bad command line format\r\n");
    EXPECT("ms a 2 T100\r\nhi\r\n", "HD\r\n");
    /* cas_of reads the item once: me reports that earlier fetch */
    char want[256];
    snprintf(want, sizeof(want),
             "ME a exp=100 la=0 cas=%" PRIu64 " fetch=yes cls=1 size=3\r\n",
             cas_of("a"));
    size_t n;
    char *got = run_n("me a\r\n", 6, &n);
    ck_assert_str_eq(got, want);
    free(got);
    EXPECT("me zz\r\n", "EN\r\n");
    EXPECT("ms YWJj 2 b\r\nhi\r\n", "HD\r\n");
    got = run_n("me YWJj b\r\n", 11, &n);
    ck_assert_msg(strncmp(got, "ME YWJj exp=-1 la=0 cas=", 24) == 0 &&
                      strstr(got, " cls=1 size=5\r\n") != NULL,
                  "got %s", got);
    free(got);
}
END_TEST

START_TEST(test_meta_pipeline_split)
{
    static const char req[] =
        "ms a 3 T0 F1 q\r\nabc\r\nmg a v q k\r\nmg b v q k\r\nma c N0 J1 q\r\n"
        "ma c q\r\nmg c v\r\nmd a q\r\nmd a q\r\nmg a q\r\nmn\r\n";
    static const char want[] = "VA 3 ka\r\nabc\r\nHD\r\nVA 1\r\n2\r\nNF\r\n"
                               "MN\r\n";
    size_t steps[] = {sizeof(req), 1, 3, 5, 11};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        teardown();
        setup();
        size_t n;
        char *got = run_split(req, sizeof(req) - 1, steps[i], &n);
        ck_assert_msg(strcmp(got, want) == 0, "step %zu: got %s", steps[i],
                      got);
        ck_assert_uint_eq(left_in, 0);
        free(got);
        /* the same pieces through the worker's memory */
        teardown();
        setup();
        size_t lent;
        got = run_lent(req, sizeof(req) - 1, steps[i], &n, &lent);
        ck_assert_msg(strcmp(got, want) == 0, "lent, step %zu: got %s",
                      steps[i], got);
        ck_assert_uint_eq(left_in, 0);
        ck_assert_uint_gt(lent, 0);
        free(got);
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("proto_meta");
    TCase *tc = tcase_create("meta");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_mn_and_basic);
    tcase_add_test(tc, test_explicit_cas);
    tcase_add_test(tc, test_stale_while_revalidate);
    tcase_add_test(tc, test_mg_flags_in_order);
    tcase_add_test(tc, test_mg_hit_and_access);
    tcase_add_test(tc, test_mg_no_update);
    tcase_add_test(tc, test_mg_quiet);
    tcase_add_test(tc, test_mg_touch_and_vivify);
    tcase_add_test(tc, test_mg_errors);
    tcase_add_test(tc, test_base64_keys);
    tcase_add_test(tc, test_ms_modes);
    tcase_add_test(tc, test_ms_cas);
    tcase_add_test(tc, test_ms_errors);
    tcase_add_test(tc, test_md);
    tcase_add_test(tc, test_ma);
    tcase_add_test(tc, test_me);
    tcase_add_test(tc, test_meta_pipeline_split);
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
