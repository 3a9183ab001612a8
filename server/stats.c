/*
 * stats.c -- storage of the daemon-wide connection counters (stats.h).
 *
 * Kept apart from the code that sums counters into listings
 * (stats_registry.c) so that the modules that bump these counters (the
 * accepting thread, workers, connections) need not know that code, which
 * in turn knows the workers.
 */
#include "stats.h"

stats_conns stats_conn_counters;
