/*
 * options.c -- parsing and printing of the settings declared in options.h.
 *
 * The descriptor array below is generated from OPTIONS_TABLE; every reader
 * (flags, config file, -o, stats settings, --help) walks it, so a setting
 * exists in all of them or in none.
 */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct options_desc {
    const char *name;
    int shortc;
    const char *longname;
    enum options_type type;
    const char *defval;
    uint64_t min;
    uint64_t max;
    const char *help;
    size_t offset;
} options_desc;

static const options_desc descs[OPTIONS_COUNT] = {
#define OPTIONS_DESC(nm, sh, lng, ty, def, mn, mx, hlp)                       \
    {#nm, sh, lng, ty, def, mn, mx, hlp, offsetof(options, nm)},
    OPTIONS_TABLE(OPTIONS_DESC)
#undef OPTIONS_DESC
};

static const char *const proto_names[] = {"auto-negotiate", "ascii", "binary"};
/* ssl_min_version: memcached's numbers 0..3 stand for these. */
static const char *const tlsver_names[] = {"tlsv1", "tlsv1.1", "tlsv1.2",
                                           "tlsv1.3"};

/* Formats a message into err (always NUL-terminated when errlen > 0). */
static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return OPTIONS_ERR_USAGE;
}

static uint64_t *field_u64(options *o, const options_desc *d)
{
    return (uint64_t *)((char *)o + d->offset);
}

static bool *field_bool(options *o, const options_desc *d)
{
    return (bool *)((char *)o + d->offset);
}

static char **field_str(options *o, const options_desc *d)
{
    return (char **)((char *)o + d->offset);
}

static const void *cfield(const options *o, const options_desc *d)
{
    return (const char *)o + d->offset;
}

/*
 * Parses an unsigned decimal (or octal) number with an optional k/m/g
 * suffix (when suffix_ok). Returns 0 and sets *out and *had_suffix, or -1.
 */
static int parse_number(const char *s, int base, bool suffix_ok, uint64_t *out,
                        bool *had_suffix)
{
    *had_suffix = false;
    if (s == NULL || !isdigit((unsigned char)s[0])) {
        return -1;
    }
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, base);
    if (errno != 0 || end == s) {
        return -1;
    }
    uint64_t mult = 1;
    if (*end != '\0' && suffix_ok) {
        switch (*end) {
        case 'k':
        case 'K':
            mult = OPTIONS_KB;
            break;
        case 'm':
        case 'M':
            mult = OPTIONS_MB;
            break;
        case 'g':
        case 'G':
            mult = OPTIONS_GB;
            break;
        default:
            return -1;
        }
        end++;
        *had_suffix = true;
    }
    if (*end != '\0') {
        return -1;
    }
    if (mult > 1 && v > UINT64_MAX / mult) {
        return -1;
    }
    *out = (uint64_t)v * mult;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    static const char *const yes[] = {"yes", "true", "on", "1"};
    static const char *const no[] = {"no", "false", "off", "0"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

/*
 * Stores `value` into the setting d. from_flag: the value came with the
 * short or long flag (MEGS then defaults to megabytes; flags without an
 * argument pass NULL). Returns 0 or OPTIONS_ERR_USAGE with a message.
 */
static int set_value(options *o, const options_desc *d, const char *value,
                     bool from_flag, char *err, size_t errlen)
{
    uint64_t v = 0;
    bool suffix = false;

    switch (d->type) {
    case OPTIONS_UINT:
    case OPTIONS_SIZE:
    case OPTIONS_MEGS:
    case OPTIONS_KILOS:
    case OPTIONS_OCTAL:
        if (parse_number(value, d->type == OPTIONS_OCTAL ? 8 : 10,
                         d->type == OPTIONS_SIZE || d->type == OPTIONS_MEGS ||
                             d->type == OPTIONS_KILOS,
                         &v, &suffix) != 0) {
            return fail(err, errlen, "%s: '%s' is not a valid %s", d->name,
                        value ? value : "",
                        d->type == OPTIONS_OCTAL  ? "octal number"
                        : d->type == OPTIONS_UINT ? "number"
                                                  : "size (number[k|m|g])");
        }
        if (d->type == OPTIONS_MEGS && from_flag && !suffix) {
            if (v > UINT64_MAX / OPTIONS_MB) {
                return fail(err, errlen, "%s: '%s' is out of range", d->name,
                            value);
            }
            v *= OPTIONS_MB;
        }
        if (d->type == OPTIONS_KILOS && from_flag && !suffix) {
            if (v > UINT64_MAX / OPTIONS_KB) {
                return fail(err, errlen, "%s: '%s' is out of range", d->name,
                            value);
            }
            v *= OPTIONS_KB;
        }
        if (v < d->min || v > d->max) {
            if (d->type == OPTIONS_OCTAL) {
                return fail(err, errlen,
                            "%s: '%s' is out of range (%" PRIo64 "..%" PRIo64
                            ")",
                            d->name, value, d->min, d->max);
            }
            return fail(err, errlen,
                        "%s: '%s' is out of range (%" PRIu64 "..%" PRIu64 ")",
                        d->name, value, d->min, d->max);
        }
        *field_u64(o, d) = v;
        return 0;
    case OPTIONS_VERB:
        if (from_flag && value == NULL) {
            if (*field_u64(o, d) < d->max) {
                (*field_u64(o, d))++;
            }
            return 0;
        }
        if (parse_number(value, 10, false, &v, &suffix) != 0 || v > d->max) {
            return fail(err, errlen, "%s: '%s' is not a level 0..%" PRIu64,
                        d->name, value ? value : "", d->max);
        }
        *field_u64(o, d) = v;
        return 0;
    case OPTIONS_BOOL_ON:
    case OPTIONS_BOOL_OFF: {
        bool b;
        if (from_flag && value == NULL) {
            *field_bool(o, d) = d->type == OPTIONS_BOOL_ON;
            return 0;
        }
        if (value == NULL || parse_bool(value, &b) != 0) {
            return fail(err, errlen, "%s: '%s' is not yes or no", d->name,
                        value ? value : "");
        }
        *field_bool(o, d) = b;
        return 0;
    }
    case OPTIONS_TLSVER:
        for (size_t i = 0; i < 4; i++) {
            char num[2] = {(char)('0' + i), '\0'};
            if (value != NULL && (strcmp(value, tlsver_names[i]) == 0 ||
                                  strcmp(value, num) == 0)) {
                *field_u64(o, d) = i;
                return 0;
            }
        }
        return fail(err, errlen,
                    "%s: '%s' is not 0..3 or tlsv1, tlsv1.1, tlsv1.2, tlsv1.3",
                    d->name, value ? value : "");
    case OPTIONS_PROTO:
        if (value != NULL && strcmp(value, "auto") == 0) {
            *field_u64(o, d) = OPTIONS_PROTO_AUTO;
            return 0;
        }
        for (size_t i = 0; i < 3; i++) {
            if (value != NULL && strcmp(value, proto_names[i]) == 0) {
                *field_u64(o, d) = i;
                return 0;
            }
        }
        return fail(err, errlen, "%s: '%s' is not auto, ascii or binary",
                    d->name, value ? value : "");
    case OPTIONS_STR:
    case OPTIONS_SECRET: {
        if (value == NULL) {
            return fail(err, errlen, "%s: a value is required", d->name);
        }
        if (strlen(value) > 4096) {
            return fail(err, errlen, "%s: value too long", d->name);
        }
        if (value[0] == '\0') {
            free(*field_str(o, d));
            *field_str(o, d) = NULL;
            return 0;
        }
        char *copy = strdup(value);
        if (copy == NULL) {
            return fail(err, errlen, "%s: out of memory", d->name);
        }
        free(*field_str(o, d));
        *field_str(o, d) = copy;
        return 0;
    }
    case OPTIONS_CLI:
        break;
    }
    return fail(err, errlen, "%s: only allowed on the command line", d->name);
}

/*
 * Finds a setting by name: the table name, or the long flag name with
 * dashes or underscores. *by_flag_name tells which matched (for MEGS).
 */
static const options_desc *find_by_name(const char *name, size_t n,
                                        bool *by_flag_name)
{
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        if (strlen(descs[i].name) == n &&
            memcmp(descs[i].name, name, n) == 0) {
            *by_flag_name = false;
            return &descs[i];
        }
    }
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const char *l = descs[i].longname;
        if (strlen(l) != n) {
            continue;
        }
        size_t k = 0;
        while (k < n && (l[k] == name[k] || (l[k] == '-' && name[k] == '_')))
            k++;
        if (k == n) {
            *by_flag_name = true;
            return &descs[i];
        }
    }
    return NULL;
}

int options_init(options *o)
{
    memset(o, 0, sizeof(*o));
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const options_desc *d = &descs[i];
        if (d->defval == NULL || d->type == OPTIONS_CLI) {
            continue;
        }
        /* Defaults pass the same checks as user values. */
        if (set_value(o, d, d->defval, false, NULL, 0) != 0) {
            abort();
        }
    }
    return OPTIONS_OK;
}

void options_free(options *o)
{
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        if (descs[i].type == OPTIONS_STR || descs[i].type == OPTIONS_SECRET) {
            free(*field_str(o, &descs[i]));
            *field_str(o, &descs[i]) = NULL;
        }
    }
    free(o->config_path);
    o->config_path = NULL;
}

int options_set(options *o, const char *name, const char *value, char *err,
                size_t errlen)
{
    bool by_flag = false;
    const options_desc *d = find_by_name(name, strlen(name), &by_flag);
    if (d == NULL) {
        return fail(err, errlen, "unknown setting '%s'", name);
    }
    if (d->type == OPTIONS_CLI) {
        return fail(err, errlen, "'%s' is only allowed on the command line",
                    name);
    }
    return set_value(o, d, value, by_flag, err, errlen);
}

static bool is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r';
}

int options_parse_config_buffer(options *o, const char *buf, size_t len,
                                char *err, size_t errlen)
{
    char line[OPTIONS_MAX_LINE + 1];
    char sub[OPTIONS_MAX_LINE + 64];
    size_t pos = 0;
    unsigned lineno = 0;

    while (pos < len) {
        lineno++;
        const char *start = buf + pos;
        const char *nl = memchr(start, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - start) : len - pos;
        pos += n + (nl ? 1 : 0);
        if (n > OPTIONS_MAX_LINE) {
            return fail(err, errlen, "line %u: longer than %d bytes", lineno,
                        OPTIONS_MAX_LINE);
        }
        if (memchr(start, '\0', n) != NULL) {
            return fail(err, errlen, "line %u: contains a NUL byte", lineno);
        }
        memcpy(line, start, n);
        line[n] = '\0';

        char *p = line;
        while (is_blank(*p)) {
            p++;
        }
        char *e = p + strlen(p);
        while (e > p && is_blank(e[-1])) {
            *--e = '\0';
        }
        if (*p == '\0' || *p == '#') {
            continue;
        }
        char *eq = strchr(p, '=');
        if (eq == NULL) {
            return fail(err, errlen, "line %u: expected 'name = value'",
                        lineno);
        }
        char *ne = eq;
        while (ne > p && is_blank(ne[-1])) {
            ne--;
        }
        *ne = '\0';
        char *v = eq + 1;
        while (is_blank(*v)) {
            v++;
        }
        if (*p == '\0') {
            return fail(err, errlen, "line %u: missing name before '='",
                        lineno);
        }
        if (options_set(o, p, v, sub, sizeof(sub)) != 0) {
            return fail(err, errlen, "line %u: %s", lineno, sub);
        }
    }
    return OPTIONS_OK;
}

int options_parse_config_file(options *o, const char *path, char *err,
                              size_t errlen)
{
    enum { MAX_FILE = 1 << 20 };
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fail(err, errlen, "cannot open config file %s: %s", path,
             strerror(errno));
        return OPTIONS_ERR_IO;
    }
    char *buf = malloc(MAX_FILE + 1);
    if (buf == NULL) {
        fclose(f);
        fail(err, errlen, "out of memory reading %s", path);
        return OPTIONS_ERR_NOMEM;
    }
    size_t n = fread(buf, 1, MAX_FILE + 1, f);
    int rd_err = ferror(f);
    fclose(f);
    if (rd_err) {
        free(buf);
        fail(err, errlen, "cannot read config file %s", path);
        return OPTIONS_ERR_IO;
    }
    if (n > MAX_FILE) {
        free(buf);
        return fail(err, errlen, "config file %s is larger than 1 MB", path);
    }
    char sub[512];
    int rc = options_parse_config_buffer(o, buf, n, sub, sizeof(sub));
    free(buf);
    if (rc != 0) {
        return fail(err, errlen, "%s: %s", path, sub);
    }
    return OPTIONS_OK;
}

/*
 * memcached's -o settings that mean nothing here (slab, LRU, crawler,
 * logging, extstore, TLS, proxy tuning): accepted, collected in
 * extended_ignored for the start-up warning. Names, or prefixes ending in
 * '_' that stand for a family.
 */
static const char *const memcached_extended[] = {"maxconns_fast",
                                                 "no_maxconns_fast",
                                                 "tail_repair_time",
                                                 "hash_algorithm",
                                                 "lru_crawler",
                                                 "no_lru_crawler",
                                                 "lru_crawler_sleep",
                                                 "lru_crawler_tocrawl",
                                                 "lru_maintainer",
                                                 "no_lru_maintainer",
                                                 "hot_lru_pct",
                                                 "warm_lru_pct",
                                                 "hot_max_factor",
                                                 "warm_max_factor",
                                                 "temporary_ttl",
                                                 "worker_logbuf_size",
                                                 "read_buf_mem_limit",
                                                 "resp_obj_mem_limit",
                                                 "slab_reassign",
                                                 "no_slab_reassign",
                                                 "slab_automove",
                                                 "no_slab_automove",
                                                 "slab_automove_ratio",
                                                 "slab_automove_window",
                                                 "slab_sizes",
                                                 "slab_chunk_max",
                                                 "track_sizes",
                                                 "no_inline_ascii_resp",
                                                 "inline_ascii_resp",
                                                 "modern",
                                                 "no_modern",
                                                 "no_chunked_items",
                                                 "expirezero_does_not_evict",
                                                 "drop_privileges",
                                                 "no_drop_privileges",
                                                 "lru_segmented",
                                                 "no_lru_segmented",
                                                 "bind_ipv6",
                                                 "no_hashexpand",
                                                 "relaxed_privileges",
                                                 "ext_",
                                                 "proxy_",
                                                 NULL};

static bool memcached_extended_name(const char *name)
{
    for (size_t i = 0; memcached_extended[i] != NULL; i++) {
        const char *n = memcached_extended[i];
        size_t len = strlen(n);
        if (n[len - 1] == '_' ? strncmp(name, n, len) == 0
                              : strcmp(name, n) == 0) {
            return true;
        }
    }
    return false;
}

/* Appends "name[=value]" to extended_ignored (comma separated). */
static int note_ignored(options *o, const char *name, const char *value,
                        char *err, size_t errlen)
{
    size_t old = o->extended_ignored ? strlen(o->extended_ignored) : 0;
    size_t add = strlen(name) + (value ? strlen(value) + 1 : 0) + 1;
    char *s = realloc(o->extended_ignored, old + add + 1);

    if (s == NULL) {
        return fail(err, errlen, "out of memory");
    }
    snprintf(s + old, add + 1, "%s%s%s%s", old ? "," : "", name,
             value ? "=" : "", value ? value : "");
    o->extended_ignored = s;
    return OPTIONS_OK;
}

/* The index of the setting called name, or OPTIONS_COUNT. */
static size_t setting_index(const char *name)
{
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        if (descs[i].type != OPTIONS_CLI && strcmp(descs[i].name, name) == 0) {
            return i;
        }
    }
    return OPTIONS_COUNT;
}

/* options_set for -o: memcached's -o takes ssl_wbuf_size in kilobytes, so
 * a KILOS setting reads a bare number as the flag does. */
static int set_from_o(options *o, const char *name, const char *value,
                      char *err, size_t errlen)
{
    bool by_flag = false;
    const options_desc *d = find_by_name(name, strlen(name), &by_flag);
    if (d == NULL || d->type == OPTIONS_CLI) {
        return options_set(o, name, value, err, errlen);
    }
    return set_value(o, d, value, by_flag || d->type == OPTIONS_KILOS, err,
                     errlen);
}

/* A yes/no setting named alone in -o means yes (memcached's
 * -o ssl_session_cache). */
static bool bare_flag(const char *name)
{
    size_t i = setting_index(name);
    return i != OPTIONS_COUNT && descs[i].type == OPTIONS_BOOL_ON;
}

/* Applies one -o argument: name=value pairs separated by commas (a comma
 * not followed by name= belongs to the value, as in -o inter=a,b), and
 * memcached's own -o settings, bare names included (-o no_modern). */
static int apply_extended(options *o, const char *arg, char *err,
                          size_t errlen)
{
    char *copy = strdup(arg);
    if (copy == NULL) {
        return fail(err, errlen, "out of memory");
    }
    int rc = 0;
    char *p = copy;
    while (*p != '\0' && rc == 0) {
        char *eq = strchr(p, '=');
        char *comma = strchr(p, ',');
        if (eq == NULL || (comma != NULL && comma < eq)) {
            /* A bare name: one of memcached's flags-like -o settings. */
            if (comma != NULL) {
                *comma = '\0';
            }
            if (bare_flag(p)) {
                rc = options_set(o, p, "yes", err, errlen);
            } else if (!memcached_extended_name(p)) {
                rc = fail(err, errlen, "-o %s: expected name=value", p);
                break;
            } else {
                rc = note_ignored(o, p, NULL, err, errlen);
            }
            if (comma == NULL) {
                break;
            }
            p = comma + 1;
            continue;
        }
        *eq = '\0';
        char *v = eq + 1;
        /* The value runs to the next ",name=" or the end. */
        char *next = NULL;
        for (char *c = strchr(v, ','); c != NULL; c = strchr(c + 1, ',')) {
            char *q = c + 1;
            while (*q != '\0' && *q != '=' && *q != ',') {
                q++;
            }
            if (*q == '=') {
                next = c;
                break;
            }
            /* ",no_modern": a bare memcached setting starts there too. */
            char save = *q;
            *q = '\0';
            bool bare = memcached_extended_name(c + 1) || bare_flag(c + 1);
            *q = save;
            if (bare) {
                next = c;
                break;
            }
        }
        if (next != NULL) {
            *next = '\0';
        }
        if (setting_index(p) == OPTIONS_COUNT && memcached_extended_name(p)) {
            rc = note_ignored(o, p, v, err, errlen);
        } else {
            rc = set_from_o(o, p, v, err, errlen);
        }
        if (next == NULL) {
            break;
        }
        p = next + 1;
    }
    free(copy);
    return rc;
}

typedef struct flag_use {
    const options_desc *d;
    const char *arg;
} flag_use;

static bool takes_argument(const options_desc *d, bool *optional)
{
    *optional = false;
    switch (d->type) {
    case OPTIONS_BOOL_ON:
    case OPTIONS_BOOL_OFF:
        return false;
    case OPTIONS_VERB:
        *optional = true;
        return false;
    case OPTIONS_CLI:
        return d == &descs[OPTIONS_IDX_config] || d->shortc == 'o';
    default:
        return true;
    }
}

int options_parse_argv(options *o, int argc, char **argv,
                       enum options_action *action, char *err, size_t errlen)
{
    char shortopts[3 * OPTIONS_COUNT + 2];
    struct option longopts[OPTIONS_COUNT + 1];
    size_t ns = 0;
    int rc = OPTIONS_OK;

    *action = OPTIONS_RUN;
    options_init(o);

    shortopts[ns++] = ':';
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const options_desc *d = &descs[i];
        bool optional;
        bool arg = takes_argument(d, &optional);
        longopts[i].name = d->longname;
        longopts[i].has_arg = arg        ? required_argument
                              : optional ? optional_argument
                                         : no_argument;
        longopts[i].flag = NULL;
        longopts[i].val = d->shortc ? d->shortc : 256 + (int)i;
        if (d->shortc) {
            shortopts[ns++] = (char)d->shortc;
            if (arg) {
                shortopts[ns++] = ':';
            }
        }
    }
    shortopts[ns] = '\0';
    memset(&longopts[OPTIONS_COUNT], 0, sizeof(longopts[0]));

    flag_use *uses = calloc((size_t)argc + 1, sizeof(*uses));
    if (uses == NULL) {
        return fail(err, errlen, "out of memory");
    }
    size_t nuses = 0;

    opterr = 0;
    optind = 1;
    int c;
    int longidx;
    while ((c = getopt_long(argc, argv, shortopts, longopts, &longidx)) !=
           -1) {
        if (c == '?') {
            if (optopt != 0 && optopt < 256) {
                rc = fail(err, errlen, "unknown option '-%c'", optopt);
            } else {
                rc =
                    fail(err, errlen, "unknown option '%s'", argv[optind - 1]);
            }
            goto out;
        }
        if (c == ':') {
            const char *given = argv[optind - 1];
            if (strncmp(given, "--", 2) == 0) {
                rc = fail(err, errlen, "option '%s' requires a value", given);
            } else {
                rc =
                    fail(err, errlen, "option '-%c' requires a value", optopt);
            }
            goto out;
        }
        const options_desc *d = NULL;
        for (size_t i = 0; i < OPTIONS_COUNT; i++) {
            if ((descs[i].shortc && descs[i].shortc == c) ||
                (!descs[i].shortc && c == 256 + (int)i)) {
                d = &descs[i];
                break;
            }
        }
        if (d == NULL) {
            rc = fail(err, errlen, "unknown option");
            goto out;
        }
        if (d == &descs[OPTIONS_IDX_help]) {
            *action = OPTIONS_HELP;
        } else if (d == &descs[OPTIONS_IDX_version]) {
            if (*action != OPTIONS_HELP) {
                *action = OPTIONS_VERSION;
            }
        } else if (d == &descs[OPTIONS_IDX_man]) {
            if (*action == OPTIONS_RUN) {
                *action = OPTIONS_MAN;
            }
        } else if (d == &descs[OPTIONS_IDX_config]) {
            free(o->config_path);
            o->config_path = strdup(optarg);
            o->config = true;
            if (o->config_path == NULL) {
                rc = fail(err, errlen, "out of memory");
                goto out;
            }
        } else {
            uses[nuses].d = d;
            uses[nuses].arg = optarg;
            nuses++;
        }
    }
    if (optind < argc) {
        rc = fail(err, errlen, "unexpected argument '%s'", argv[optind]);
        goto out;
    }
    if (*action != OPTIONS_RUN) {
        goto out;
    }
    if (o->config_path != NULL) {
        rc = options_parse_config_file(o, o->config_path, err, errlen);
        if (rc != 0) {
            goto out;
        }
    }
    for (size_t i = 0; i < nuses; i++) {
        const options_desc *d = uses[i].d;
        if (d == &descs[OPTIONS_IDX_extended]) {
            rc = apply_extended(o, uses[i].arg, err, errlen);
        } else {
            char sub[512];
            rc = set_value(o, d, uses[i].arg, true, sub, sizeof(sub));
            if (rc != 0) {
                if (d->shortc) {
                    fail(err, errlen, "-%c/--%s: %s", d->shortc, d->longname,
                         sub);
                } else {
                    fail(err, errlen, "--%s: %s", d->longname, sub);
                }
            }
        }
        if (rc != 0) {
            goto out;
        }
    }
    rc = options_validate(o, err, errlen);
out:
    free(uses);
    return rc;
}

int options_validate(const options *o, char *err, size_t errlen)
{
    /* Asked-for protection that is not there yet: refuse, never run
     * without it. */
    if (o->ssl_enabled && (o->ssl_chain_cert == NULL || o->ssl_key == NULL)) {
        return fail(err, errlen,
                    "-Z/ssl_enabled needs ssl_chain_cert and ssl_key (-o "
                    "ssl_chain_cert=FILE,ssl_key=FILE)");
    }
    if (o->ssl_enabled && o->ssl_verify_mode > 0 && o->ssl_ca_cert == NULL) {
        return fail(err, errlen,
                    "ssl_verify_mode %" PRIu64
                    " checks client certificates: it needs ssl_ca_cert",
                    o->ssl_verify_mode);
    }
    if (o->ssl_enabled && o->domain_socket != NULL) {
        return fail(err, errlen,
                    "-Z/ssl_enabled is for TCP listeners; a unix socket (-s) "
                    "is served without TLS: drop one of them");
    }
    if (o->auth_enabled_sasl && o->sasl_file == NULL) {
        return fail(err, errlen,
                    "-S/--enable-sasl needs --sasl-file FILE (a line "
                    "user:password)");
    }
    if (o->domain_socket == NULL && o->tcpport == 0) {
        return fail(err, errlen,
                    "nothing to listen on: set a TCP port (-p) or a unix "
                    "socket (-s)");
    }
    if (o->domain_socket != NULL && strlen(o->domain_socket) >= 108) {
        return fail(err, errlen, "unix socket path longer than 107 bytes");
    }
    if (o->maxbytes != 0 && o->item_size_max > o->maxbytes / 2) {
        return fail(err, errlen,
                    "item_size_max (%" PRIu64 ") must be at most half of "
                    "maxbytes (%" PRIu64 ")",
                    o->item_size_max, o->maxbytes);
    }
    if (o->inter == NULL || o->inter[0] == '\0') {
        return fail(err, errlen, "inter (-l) must name an address");
    }
    if (o->registry != NULL && o->repl_port == 0) {
        return fail(err, errlen,
                    "registry needs repl_port: a member registers its peer "
                    "port");
    }
    if (o->registry_port != 0 && o->registry_port == o->repl_port) {
        return fail(err, errlen,
                    "registry_port and repl_port must differ (%" PRIu64 ")",
                    o->registry_port);
    }
    return OPTIONS_OK;
}

static const char *arg_hint(const options_desc *d)
{
    switch (d->type) {
    case OPTIONS_UINT:
        return "<num>";
    case OPTIONS_SIZE:
        return "<size>";
    case OPTIONS_MEGS:
        return "<MB>";
    case OPTIONS_KILOS:
        return "<KB>";
    case OPTIONS_TLSVER:
        return "<version>";
    case OPTIONS_OCTAL:
        return "<mask>";
    case OPTIONS_PROTO:
        return "<proto>";
    case OPTIONS_STR:
        if (d == &descs[OPTIONS_IDX_inter] ||
            d == &descs[OPTIONS_IDX_repl_listen]) {
            return "<addr>";
        }
        if (d == &descs[OPTIONS_IDX_user]) {
            return "<user>";
        }
        if (d == &descs[OPTIONS_IDX_slab_growth_factor] ||
            d == &descs[OPTIONS_IDX_slab_min_size] ||
            d == &descs[OPTIONS_IDX_prefix_delimiter] ||
            d == &descs[OPTIONS_IDX_napi_ids] ||
            d == &descs[OPTIONS_IDX_extended_ignored]) {
            return "<value>";
        }
        if (d == &descs[OPTIONS_IDX_registry_listen] ||
            d == &descs[OPTIONS_IDX_advertise]) {
            return "<addr>";
        }
        return d == &descs[OPTIONS_IDX_peers] ||
                       d == &descs[OPTIONS_IDX_registry]
                   ? "<list>"
                   : "<path>";
    case OPTIONS_SECRET:
        return "<secret>";
    case OPTIONS_VERB:
        return "[<level>]";
    case OPTIONS_CLI:
        if (d == &descs[OPTIONS_IDX_config]) {
            return "<file>";
        }
        if (d->shortc == 'o') {
            return "<name=value>";
        }
        return "";
    default:
        return "";
    }
}

void options_print_help(FILE *f, const char *prog)
{
    fprintf(f,
            "ribltcached %s, a memcached-compatible replicated cache\n"
            "usage: %s [options]\n\n"
            "Each setting can be given as a flag, as -o name=value, or as a\n"
            "`name = value` line in the config file (--config); flags "
            "override "
            "the\n"
            "file. The [name] is what `stats settings` shows.\n\n",
            RIBLTCACHE_VERSION, prog);
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const options_desc *d = &descs[i];
        char flag[64];
        const char *hint = arg_hint(d);
        if (d->shortc) {
            snprintf(flag, sizeof(flag), "-%c, --%s%s%s", d->shortc,
                     d->longname, hint[0] ? " " : "", hint);
        } else {
            snprintf(flag, sizeof(flag), "    --%s%s%s", d->longname,
                     hint[0] ? " " : "", hint);
        }
        fprintf(f, "  %-34s %s\n", flag, d->help);
        if (d->type != OPTIONS_CLI) {
            fprintf(f, "  %-34s [%s] default: %s\n", "", d->name,
                    d->defval ? d->defval : "unset");
        }
    }
}

/* Writes s for roff: a backslash doubled, a leading dot or quote guarded,
 * and a hyphen kept as a hyphen-minus (option names are typed). */
static void roff_text(FILE *f, const char *s)
{
    if (*s == '.' || *s == '\'')
        fputs("\\&", f);
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\e", f);
        else if (*s == '-')
            fputs("\\-", f);
        else
            fputc(*s, f);
    }
}

void options_print_man(FILE *f)
{
    fprintf(f, ".TH RIBLTCACHED 1 \"\" \"ribltcache %s\" \"User Commands\"\n",
            RIBLTCACHE_VERSION);
    fputs(".SH NAME\n"
          "ribltcached \\- memcached\\-compatible cache whose nodes "
          "replicate without a leader\n"
          ".SH SYNOPSIS\n"
          ".B ribltcached\n"
          "[\\fIoptions\\fR]\n"
          ".SH DESCRIPTION\n"
          "ribltcached speaks memcached's text, meta and binary protocols "
          "and accepts memcached's command line. With \\fBrepl_port\\fR "
          "and \\fBpeers\\fR (or \\fBregistry\\fR) set, nodes replicate "
          "every write to each other: fresh writes are pushed at once, and "
          "rounds of rateless IBLT set reconciliation repair whatever a "
          "push missed, moving only the mutations that differ. Conflicts "
          "resolve by last writer wins on a hybrid\\-clock version.\n"
          ".PP\n"
          "Each setting can be given as a flag, as \\fB\\-o\\fR "
          "\\fIname\\fR=\\fIvalue\\fR, or as a \\fIname\\fR = \\fIvalue\\fR "
          "line in the file given with \\fB\\-\\-config\\fR; flags override "
          "the file. The name in brackets is what \\fBstats settings\\fR "
          "shows.\n"
          ".SH OPTIONS\n",
          f);
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const options_desc *d = &descs[i];
        const char *hint = arg_hint(d);
        fputs(".TP\n", f);
        if (d->shortc)
            fprintf(f, "\\fB\\-%c\\fR, ", d->shortc);
        fputs("\\fB\\-\\-", f);
        roff_text(f, d->longname);
        fputs("\\fR", f);
        if (hint[0]) {
            fputs(" \\fI", f);
            roff_text(f, hint);
            fputs("\\fR", f);
        }
        fputc('\n', f);
        roff_text(f, d->help);
        fputc('\n', f);
        if (d->type != OPTIONS_CLI) {
            fputs(".br\n[", f);
            roff_text(f, d->name);
            fputs("] default: ", f);
            roff_text(f, d->defval ? d->defval : "unset");
            fputc('\n', f);
        }
    }
    fputs(".SH SIGNALS\n"
          ".TP\n.B SIGTERM, SIGINT\nStop accepting, finish the clients, "
          "exit.\n"
          ".TP\n.B SIGHUP\nKept running (a log rotation or a reload does "
          "not stop the cache).\n"
          ".SH SEE ALSO\n"
          ".BR memcached (1)\n",
          f);
}

void options_emit(const options *o, options_emit_fn emit, void *arg)
{
    char val[64];
    for (size_t i = 0; i < OPTIONS_COUNT; i++) {
        const options_desc *d = &descs[i];
        const void *p = cfield(o, d);
        const char *out = val;
        switch (d->type) {
        case OPTIONS_UINT:
        case OPTIONS_SIZE:
        case OPTIONS_MEGS:
        case OPTIONS_VERB:
            snprintf(val, sizeof(val), "%" PRIu64, *(const uint64_t *)p);
            break;
        case OPTIONS_OCTAL:
            snprintf(val, sizeof(val), "%" PRIo64, *(const uint64_t *)p);
            break;
        case OPTIONS_BOOL_ON:
        case OPTIONS_BOOL_OFF:
            out = *(const bool *)p ? "yes" : "no";
            break;
        case OPTIONS_KILOS:
            snprintf(val, sizeof(val), "%" PRIu64, *(const uint64_t *)p);
            break;
        case OPTIONS_PROTO:
            out = proto_names[*(const uint64_t *)p % 3];
            break;
        case OPTIONS_TLSVER:
            out = tlsver_names[*(const uint64_t *)p % 4];
            break;
        case OPTIONS_STR:
            out = *(char *const *)p ? *(char *const *)p : "NULL";
            break;
        case OPTIONS_SECRET:
            out = *(char *const *)p ? "<hidden>" : "NULL";
            break;
        case OPTIONS_CLI:
            continue;
        }
        emit(arg, d->name, out);
    }
}

const char *options_strerror(int rc)
{
    switch (rc) {
    case OPTIONS_OK:
        return "ok";
    case OPTIONS_ERR_USAGE:
        return "invalid option";
    case OPTIONS_ERR_IO:
        return "cannot read config file";
    case OPTIONS_ERR_NOMEM:
        return "out of memory";
    default:
        return "unknown error";
    }
}

char *options_listen_entry(char *entry, bool *notls, char **port)
{
    static const char prefix[] = OPTIONS_NOTLS_PREFIX;
    *notls = strncmp(entry, prefix, sizeof(prefix) - 1) == 0;
    *port = NULL;
    if (*notls) {
        entry += sizeof(prefix) - 1;
    }
    if (entry[0] == '[') {
        char *close = strchr(entry, ']');
        if (close == NULL || (close[1] != '\0' && close[1] != ':')) {
            return NULL;
        }
        if (close[1] == ':') {
            *port = close + 2;
        }
        *close = '\0';
        return entry + 1;
    }
    char *colon = strchr(entry, ':');
    if (colon != NULL && strchr(colon + 1, ':') == NULL) {
        *colon = '\0';
        *port = colon + 1;
    }
    return entry;
}
