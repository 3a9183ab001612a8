/*
 * listspec.h -- the lists settings give: items separated by commas or
 * spaces ("host:port,host:port", "name:port name:port"). One reader for
 * the peer list, the registries, peers_dns and etcd's URLs.
 */
#ifndef LISTSPEC_H
#define LISTSPEC_H

#include <stdbool.h>
#include <stddef.h>

/*
 * The next item of the list at *p: false at the end; otherwise *item and
 * *n are the item (not NUL-terminated) and *p moves past it.
 */
static inline bool listspec_next(const char **p, const char **item, size_t *n)
{
    const char *s = *p ? *p : "";
    while (*s == ' ' || *s == ',')
        s++;
    if (!*s) {
        *p = s;
        return false;
    }
    const char *e = s;
    while (*e && *e != ',' && *e != ' ')
        e++;
    *item = s;
    *n = (size_t)(e - s);
    *p = e;
    return true;
}

#endif /* LISTSPEC_H */
