/*
 * authfile.h -- user:password credentials from a file (memcached's -Y
 * authfile, and the SASL file): one entry per line, "user:password"
 * (the password may hold colons); empty lines and lines starting with '#'
 * are skipped.
 *
 * A check compares against every entry in time that depends only on the
 * lengths involved, never on where the first differing byte is. A reload
 * swaps the entries atomically for every thread (a reader holds the lock
 * for one check); a file that fails to load leaves the old entries.
 */
#ifndef AUTHFILE_H
#define AUTHFILE_H

#include <stdbool.h>
#include <stddef.h>

#define AUTHFILE_MAX_ENTRIES 64
#define AUTHFILE_MAX_LINE 512

typedef struct authfile authfile;

enum authfile_rc {
    AUTHFILE_OK = 0,
    AUTHFILE_ERR_OPEN = -1,   /* cannot open or read the file */
    AUTHFILE_ERR_FORMAT = -2, /* a line without "user:" */
    AUTHFILE_ERR_EMPTY = -3,  /* no entry at all */
    AUTHFILE_ERR_TOO_MANY = -4,
    AUTHFILE_ERR_NOMEM = -5,
};

const char *authfile_strerror(int rc);

/* Loads path. Returns the credentials, or NULL with *rc set (and *line,
 * when not NULL, the 1-based line at fault for a format error). */
authfile *authfile_open(const char *path, int *rc, int *line);

/* The same from text in memory (n bytes). */
authfile *authfile_parse(const char *text, size_t n, int *rc, int *line);

/* Reads path again into af; on failure af keeps its entries. Returns
 * AUTHFILE_OK or an error. Any thread. */
int authfile_reload(authfile *af, const char *path, int *line);

void authfile_close(authfile *af);

/* True when user/pass match an entry. Any thread. */
bool authfile_check(authfile *af, const char *user, size_t nuser,
                    const char *pass, size_t npass);

#endif /* AUTHFILE_H */
