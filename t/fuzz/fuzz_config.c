/*
 * fuzz_config.c -- libFuzzer target for the config file parser.
 *
 * The input is a config file's text. It is parsed into a defaulted options
 * struct by options_parse_config_buffer; whatever was accepted is then
 * checked (options_validate), listed as `stats settings` would list it, and
 * freed. The error message must be NUL-terminated within its buffer, and a
 * successful parse must be reproducible from the listing: every emitted
 * setting, fed back through options_set, is accepted.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where the listing of one parse is replayed. */
typedef struct replay {
    options *o;
    int failures;
} replay;

static void replay_setting(void *arg, const char *name, const char *value)
{
    replay *r = arg;
    char err[256];
    if (name == NULL || value == NULL) {
        abort();
    }
    /* Unset strings print as NULL, which is no value to set. */
    if (strcmp(value, "NULL") == 0) {
        return;
    }
    if (options_set(r->o, name, value, err, sizeof(err)) != OPTIONS_OK) {
        r->failures++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    options o, back;
    char err[128];

    memset(err, 'x', sizeof(err));
    options_init(&o);
    int rc =
        options_parse_config_buffer(&o, (const char *)data, size, err, 64);
    if (rc != OPTIONS_OK && rc != OPTIONS_ERR_USAGE &&
        rc != OPTIONS_ERR_NOMEM) {
        abort();
    }
    if (rc != OPTIONS_OK && memchr(err, '\0', 64) == NULL) {
        abort(); /* the message must fit and be terminated */
    }
    if (err[64] != 'x') {
        abort(); /* nothing written past errlen */
    }
    (void)options_validate(&o, err, sizeof(err));
    if (rc == OPTIONS_OK) {
        replay r = {.o = &back, .failures = 0};
        options_init(&back);
        options_emit(&o, replay_setting, &r);
        options_free(&back);
        if (r.failures != 0) {
            abort();
        }
    }
    options_free(&o);
    return 0;
}
