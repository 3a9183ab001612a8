/*
 * authfile.c -- see authfile.h.
 */
#include "authfile.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct entry {
    char *user;
    size_t nuser;
    char *pass;
    size_t npass;
} entry;

struct authfile {
    pthread_rwlock_t lock;
    entry *v;
    size_t n;
};

const char *authfile_strerror(int rc)
{
    switch (rc) {
    case AUTHFILE_OK:
        return "ok";
    case AUTHFILE_ERR_OPEN:
        return "cannot read the file";
    case AUTHFILE_ERR_FORMAT:
        return "a line is not user:password";
    case AUTHFILE_ERR_EMPTY:
        return "no user:password line";
    case AUTHFILE_ERR_TOO_MANY:
        return "too many entries";
    default:
        return "out of memory";
    }
}

static void entries_free(entry *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        /* the password shares the user's allocation */
        if (v[i].user != NULL)
            memset(v[i].user, 0, v[i].nuser + 1 + v[i].npass);
        free(v[i].user);
    }
    free(v);
}

/* Parses text (n bytes) into a new entry array. Returns AUTHFILE_OK or
 * an error, with *line the 1-based line at fault. */
static int parse(const char *text, size_t n, entry **out, size_t *nout,
                 int *line)
{
    entry *v = calloc(AUTHFILE_MAX_ENTRIES, sizeof(*v));
    const char *p = text, *e = text + n;
    size_t count = 0;
    int rc = AUTHFILE_OK, lineno = 0;

    if (v == NULL)
        return AUTHFILE_ERR_NOMEM;
    while (rc == AUTHFILE_OK && p < e) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *end = nl != NULL ? nl : e;
        size_t len = (size_t)(end - p);
        lineno++;
        if (len > 0 && p[len - 1] == '\r')
            len--;
        const char *colon = memchr(p, ':', len);
        if (len == 0 || p[0] == '#') {
            /* blank or comment */
        } else if (len > AUTHFILE_MAX_LINE || memchr(p, '\0', len) != NULL ||
                   colon == NULL || colon == p) {
            rc = AUTHFILE_ERR_FORMAT;
        } else if (count == AUTHFILE_MAX_ENTRIES) {
            rc = AUTHFILE_ERR_TOO_MANY;
        } else {
            char *copy = malloc(len + 1);
            if (copy == NULL) {
                rc = AUTHFILE_ERR_NOMEM;
                break;
            }
            memcpy(copy, p, len);
            copy[len] = '\0';
            size_t nu = (size_t)(colon - p);
            copy[nu] = '\0';
            v[count].user = copy;
            v[count].nuser = nu;
            v[count].pass = copy + nu + 1;
            v[count].npass = len - nu - 1;
            count++;
        }
        p = nl != NULL ? nl + 1 : e;
    }
    if (rc == AUTHFILE_OK && count == 0)
        rc = AUTHFILE_ERR_EMPTY;
    if (rc != AUTHFILE_OK) {
        if (line != NULL)
            *line = lineno;
        entries_free(v, count);
        return rc;
    }
    *out = v;
    *nout = count;
    return AUTHFILE_OK;
}

/* Reads path (at most AUTHFILE_MAX_ENTRIES lines' worth) and parses it. */
static int load(const char *path, entry **out, size_t *nout, int *line)
{
    enum { CAP = AUTHFILE_MAX_ENTRIES * 4 * (AUTHFILE_MAX_LINE + 2) };
    FILE *f = fopen(path, "r");
    char *buf;
    size_t n;
    int rc;

    if (f == NULL)
        return AUTHFILE_ERR_OPEN;
    buf = malloc(CAP + 1);
    if (buf == NULL) {
        fclose(f);
        return AUTHFILE_ERR_NOMEM;
    }
    n = fread(buf, 1, CAP + 1, f);
    if (ferror(f))
        rc = AUTHFILE_ERR_OPEN;
    else if (n > CAP)
        rc = AUTHFILE_ERR_TOO_MANY;
    else
        rc = parse(buf, n, out, nout, line);
    fclose(f);
    memset(buf, 0, n < CAP ? n : CAP);
    free(buf);
    return rc;
}

static authfile *wrap(entry *v, size_t n, int *rc)
{
    authfile *af = calloc(1, sizeof(*af));
    if (af == NULL || pthread_rwlock_init(&af->lock, NULL) != 0) {
        free(af);
        entries_free(v, n);
        *rc = AUTHFILE_ERR_NOMEM;
        return NULL;
    }
    af->v = v;
    af->n = n;
    return af;
}

authfile *authfile_parse(const char *text, size_t n, int *rc, int *line)
{
    entry *v;
    size_t count;

    *rc = parse(text, n, &v, &count, line);
    return *rc == AUTHFILE_OK ? wrap(v, count, rc) : NULL;
}

authfile *authfile_open(const char *path, int *rc, int *line)
{
    entry *v;
    size_t count;

    *rc = load(path, &v, &count, line);
    return *rc == AUTHFILE_OK ? wrap(v, count, rc) : NULL;
}

int authfile_reload(authfile *af, const char *path, int *line)
{
    entry *v, *old;
    size_t n, nold;
    int rc = load(path, &v, &n, line);

    if (rc != AUTHFILE_OK)
        return rc;
    pthread_rwlock_wrlock(&af->lock);
    old = af->v;
    nold = af->n;
    af->v = v;
    af->n = n;
    pthread_rwlock_unlock(&af->lock);
    entries_free(old, nold);
    return AUTHFILE_OK;
}

void authfile_close(authfile *af)
{
    if (af == NULL)
        return;
    entries_free(af->v, af->n);
    pthread_rwlock_destroy(&af->lock);
    free(af);
}

/* 0 when a (na bytes) equals b (nb), in time that depends on the lengths
 * only. */
static unsigned diff(const char *a, size_t na, const char *b, size_t nb)
{
    unsigned d = na != nb;
    size_t n = na < nb ? na : nb;

    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d;
}

bool authfile_check(authfile *af, const char *user, size_t nuser,
                    const char *pass, size_t npass)
{
    bool ok = false;

    if (af == NULL)
        return false;
    pthread_rwlock_rdlock(&af->lock);
    /* every entry, both fields: the time does not tell which matched */
    for (size_t i = 0; i < af->n; i++) {
        unsigned d = diff(user, nuser, af->v[i].user, af->v[i].nuser) |
                     diff(pass, npass, af->v[i].pass, af->v[i].npass);
        ok |= d == 0;
    }
    pthread_rwlock_unlock(&af->lock);
    return ok;
}
