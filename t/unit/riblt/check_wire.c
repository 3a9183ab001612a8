/*
 * check_wire.c -- the fixed little-endian wire form of coded symbols.
 */
#include <check.h>
#include <stdlib.h>

#include "riblt.h"
#include "testutil.h"

START_TEST(test_exact_bytes)
{
    riblt_symbol s = {{0x0706050403020100ULL, 0x0f0e0d0c0b0a0908ULL},
                      0x1716151413121110ULL,
                      -2};
    uint8_t buf[RIBLT_SYMBOL_WIRE_SIZE];
    ck_assert_int_eq(riblt_symbols_encode(&s, 1, buf, sizeof(buf)), 32);
    for (int i = 0; i < 24; i++)
        ck_assert_uint_eq(buf[i], i);
    ck_assert_uint_eq(buf[24], 0xfe);
    for (int i = 25; i < 32; i++)
        ck_assert_uint_eq(buf[i], 0xff);
    uint8_t idb[16];
    riblt_id_to_bytes(&s.sum, idb);
    for (int i = 0; i < 16; i++)
        ck_assert_uint_eq(idb[i], i);
    riblt_id back;
    riblt_id_from_bytes(&back, idb);
    ck_assert(riblt_id_equal(&back, &s.sum));
}
END_TEST

START_TEST(test_round_trip)
{
    enum { N = 100 };
    riblt_symbol in[N], out[N];
    uint64_t seed = 4;
    for (int i = 0; i < N; i++) {
        in[i].sum = tu_id(&seed);
        in[i].hash = tu_next(&seed);
        in[i].count = (int64_t)(tu_next(&seed) % 2001) - 1000;
    }
    uint8_t buf[N * RIBLT_SYMBOL_WIRE_SIZE];
    ck_assert_int_eq(riblt_symbols_encode(in, N, buf, sizeof(buf)),
                     (long)sizeof(buf));
    ck_assert_int_eq(riblt_symbols_decode(buf, sizeof(buf), out, N), N);
    ck_assert_int_eq(memcmp(in, out, sizeof(in)), 0);
}
END_TEST

START_TEST(test_malformed)
{
    riblt_symbol s[4] = {{{1, 2}, 3, 4}};
    riblt_symbol out[4];
    uint8_t buf[4 * RIBLT_SYMBOL_WIRE_SIZE];
    ck_assert_int_eq(riblt_symbols_encode(s, 4, buf, sizeof(buf)), 128);
    /* Truncated and over-long buffers. */
    ck_assert_int_eq(riblt_symbols_decode(buf, 31, out, 4), RIBLT_ERR_WIRE);
    ck_assert_int_eq(riblt_symbols_decode(buf, 33, out, 4), RIBLT_ERR_WIRE);
    ck_assert_int_eq(riblt_symbols_decode(buf, 127, out, 4), RIBLT_ERR_WIRE);
    ck_assert_int_eq(riblt_symbols_decode(buf, 128, out, 3), RIBLT_ERR_FULL);
    ck_assert_int_eq(riblt_symbols_decode(buf, 0, out, 4), 0);
    /* A count beyond RIBLT_COUNT_MAX. */
    memset(buf + 24, 0, 8);
    buf[31] = 0x40;
    buf[24] = 1;
    ck_assert_int_eq(riblt_symbols_decode(buf, 32, out, 4), RIBLT_ERR_WIRE);
    memset(buf + 24, 0xff, 8);
    buf[31] = 0xbf; /* -2^62 - 1 */
    ck_assert_int_eq(riblt_symbols_decode(buf, 32, out, 4), RIBLT_ERR_WIRE);
    /* Encoding into too small a buffer. */
    ck_assert_int_eq(riblt_symbols_encode(s, 4, buf, 127), RIBLT_ERR_INVAL);
    ck_assert_str_eq(riblt_strerror(RIBLT_ERR_WIRE),
                     "malformed wire encoding");
    ck_assert_str_eq(riblt_strerror(12345), "unknown error");
}
END_TEST

static Suite *wire_suite(void)
{
    Suite *s = suite_create("riblt_wire");
    TCase *tc = tcase_create("wire");
    tcase_add_test(tc, test_exact_bytes);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_malformed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    SRunner *sr = srunner_create(wire_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
