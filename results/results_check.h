/* results_check.h — whether a results database can be trusted to say what it holds: SQLite's structural check
 * of the whole file, and how many rows a table holds (0 when the table was never created). Readers that must
 * tell "this database has no such results" from "this database could not be read" (kvsim report: a section is
 * listed as absent only when its data really is absent; plots/report.h) ask here first, because every reader
 * of results/results.h and the family headers answers both with KVS_ERR_DB.
 */
#ifndef KVS_RESULTS_CHECK_H
#define KVS_RESULTS_CHECK_H

#include <stdint.h>

#include "results.h"

/*! kvs_results_check() : SQLite's PRAGMA quick_check over the whole file (every page and B-tree read once; on
 *  a 70 MB study about 0.3 s). @return KVS_OK when intact; KVS_ERR_DB "<path>: database disk image is
 *  malformed (SQLite quick_check: <its first finding>)" when damaged, or "<path>: cannot check the database:
 *  <SQLite's message>" when the check itself fails (an I/O error, a damaged page it cannot step past). */
kvs_status kvs_results_check(kvs_results_db *db);

/*! kvs_results_table_rows() : *n = the number of rows of table `name` ([A-Za-z0-9_]+), 0 when the database has
 *  no such table (a family whose writer never ran; results/results_internal.h). KVS_ERR_INVALID_ARG for
 *  another name; KVS_ERR_DB when the count cannot be read (the database is damaged or unreadable). */
kvs_status kvs_results_table_rows(kvs_results_db *db, const char *name, int64_t *n);

#endif /* KVS_RESULTS_CHECK_H */
