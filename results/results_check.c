/* results_check.c — the integrity check and table row counts of results/results_check.h, through the SQLite
 * handle results/results_internal.h shares with the files of results/.
 */
#include "results_check.h"

#include <stdio.h>
#include <string.h>

#include "results_internal.h"

kvs_status kvs_results_check(kvs_results_db *db) {
    if (!db) return kvs_fail(KVS_ERR_INVALID_ARG, "check: NULL results database");
    sqlite3 *h = kvs_results_sqlite(db);
    sqlite3_stmt *q = NULL;
    /* quick_check(1): stop at the first finding, which is all a message can usefully say. */
    if (sqlite3_prepare_v2(h, "PRAGMA quick_check(1)", -1, &q, NULL) != SQLITE_OK)
        return kvs_fail(KVS_ERR_DB, "%s: cannot check the database: %s", kvs_results_path(db), sqlite3_errmsg(h));
    kvs_status st = KVS_OK;
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) {
        const char *r = (const char *)sqlite3_column_text(q, 0);
        if (!r || strcmp(r, "ok")) {
            /* quick_check's first line names the schema ("*** in database main ***"); the finding follows. */
            const char *nl = r ? strrchr(r, '\n') : NULL;
            st = kvs_fail(KVS_ERR_DB, "%s: database disk image is malformed (SQLite quick_check: %s)",
                          kvs_results_path(db), nl ? nl + 1 : r ? r : "no result");
        }
    } else if (rc == SQLITE_CORRUPT || rc == SQLITE_NOTADB)
        st = kvs_fail(KVS_ERR_DB, "%s: database disk image is malformed (SQLite quick_check: %s)",
                      kvs_results_path(db), sqlite3_errmsg(h));
    else
        st = kvs_fail(KVS_ERR_DB, "%s: cannot check the database: %s", kvs_results_path(db), sqlite3_errmsg(h));
    sqlite3_finalize(q);
    return st;
}

kvs_status kvs_results_table_rows(kvs_results_db *db, const char *name, int64_t *n) {
    if (!db || !name || !n) return kvs_fail(KVS_ERR_INVALID_ARG, "table rows: NULL argument");
    *n = 0;
    size_t len = strspn(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_");
    if (len == 0 || name[len] || len > 64) return kvs_fail(KVS_ERR_INVALID_ARG, "table rows: bad table name '%s'", name);
    int have = kvs_results_table_exists(db, name);
    if (have < 0) return KVS_ERR_DB;
    if (!have) return KVS_OK;
    char sql[128];
    snprintf(sql, sizeof sql, "SELECT count(*) FROM \"%s\"", name); /* the name is [A-Za-z0-9_]: no quoting needed */
    sqlite3_stmt *q = NULL;
    kvs_status st = kvs_results_prepare(db, sql, &q, "cannot count rows");
    if (st != KVS_OK) return st;
    int rc = sqlite3_step(q);
    if (rc == SQLITE_ROW) *n = sqlite3_column_int64(q, 0);
    else st = kvs_results_db_error(db, "cannot count rows");
    sqlite3_finalize(q);
    return st;
}
