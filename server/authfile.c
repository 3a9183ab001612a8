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

/* Reads path into a new entry array. Returns AUTHFILE_OK or an error. */
static int load(const char *path, entry **out, size_t *nout, int *line)
{
    FILE *f = fopen(path, "r");
    char buf[AUTHFILE_MAX_LINE + 2];
    entry *v;
    size_t n = 0;
    int rc = AUTHFILE_OK, lineno = 0;

    if (f == NULL)
        return AUTHFILE_ERR_OPEN;
    v = calloc(AUTHFILE_MAX_ENTRIES, sizeof(*v));
    if (v == NULL) {
        fclose(f);
        return AUTHFILE_ERR_NOMEM;
    }
    while (rc == AUTHFILE_OK && fgets(buf, sizeof(buf), f) != NULL) {
        lineno++;
        size_t len = strcspn(buf, "\r\n");
        if (buf[len] == '\0' && !feof(f)) {
            rc = AUTHFILE_ERR_FORMAT; /* longer than a line may be */
            break;
        }
        buf[len] = '\0';
        if (len == 0 || buf[0] == '#')
            continue;
        char *colon = memchr(buf, ':', len);
        if (colon == NULL || colon == buf) {
            rc = AUTHFILE_ERR_FORMAT;
            break;
        }
        if (n == AUTHFILE_MAX_ENTRIES) {
            rc = AUTHFILE_ERR_TOO_MANY;
            break;
        }
        char *copy = malloc(len + 1);
        if (copy == NULL) {
            rc = AUTHFILE_ERR_NOMEM;
            break;
        }
        memcpy(copy, buf, len + 1);
        size_t nu = (size_t)(colon - buf);
        copy[nu] = '\0';
        v[n].user = copy;
        v[n].nuser = nu;
        v[n].pass = copy + nu + 1;
        v[n].npass = len - nu - 1;
        n++;
    }
    memset(buf, 0, sizeof(buf));
    if (rc == AUTHFILE_OK && ferror(f))
        rc = AUTHFILE_ERR_OPEN;
    fclose(f);
    if (rc == AUTHFILE_OK && n == 0)
        rc = AUTHFILE_ERR_EMPTY;
    if (rc != AUTHFILE_OK) {
        if (line != NULL)
            *line = lineno;
        entries_free(v, n);
        return rc;
    }
    *out = v;
    *nout = n;
    return AUTHFILE_OK;
}

authfile *authfile_open(const char *path, int *rc, int *line)
{
    authfile *af = calloc(1, sizeof(*af));
    if (af == NULL) {
        *rc = AUTHFILE_ERR_NOMEM;
        return NULL;
    }
    *rc = load(path, &af->v, &af->n, line);
    if (*rc != AUTHFILE_OK || pthread_rwlock_init(&af->lock, NULL) != 0) {
        if (*rc == AUTHFILE_OK) {
            entries_free(af->v, af->n);
            *rc = AUTHFILE_ERR_NOMEM;
        }
        free(af);
        return NULL;
    }
    return af;
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
