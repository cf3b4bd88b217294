"""results.py — read-only access from Python (standard library sqlite3 + NumPy) to the SQLite results database that
`kvsim replay --db` writes, to the schema results/SCHEMA.md documents (versions 1 and 2): the runs with their trace
and run-wide aggregate, the per-layer aggregates, the per-step series and the turns. Like kvsim's own readers it
never creates, migrates or modifies a database, refuses a file that is not kvsim's, and selects only the columns a
table has (a column a database predates reads as not recorded: NaN, n = 0). What kvsim's readers compute on top
(`kvsim compare`'s interpolation at equal memory) stays in kvsim; this gives the stored numbers.
"""
import os
import sqlite3

import numpy as np

__all__ = ["Results", "ResultsError", "open_results", "STATS"]

STATS = ("n", "mean", "p50", "p95", "max", "min")


class ResultsError(ValueError):
    """The file is not a readable kvsim results database (or has no such results); the message says why."""


def _nan(x):
    return float("nan") if x is None else x


class Results:
    """An open results database (read-only). Methods return plain Python / NumPy values:

    runs(status='complete', policy=None, trace=None)  list of dicts, one per run (id order): every `runs` column,
        the trace's columns as trace_<column> (trace_path, trace_model, trace_n_positions, ...), trace_sha256 (None
        when not recorded), and metrics = {metric: {n, mean, p50, p95, max, min}} from run_summary (NaN / n = 0:
        not recorded; a failed run without an aggregate has NaN everywhere).
    layers(run_id)      list of dicts {layer, metrics} from run_layers, layer order.
    steps(run_id, metrics=None)  dict of NumPy arrays over the run's stored steps (layer, q_head, position order):
        layer, q_head, position (int64) and one float64 array per metric (NaN = not recorded).
    turns(trace_id)     [(turn, begin, prompt_end, end)] from trace_turns ([] when not recorded).
    metric_names()      the metrics the database has columns for, in table order.
    summary(metric, stat='mean', **runs_filters)  (run ids, values) as NumPy arrays.
    tables()            names of the tables present (replay's and any analysis families').
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise ResultsError("%s: no such results database" % self.path)
        if os.path.isdir(self.path):
            raise ResultsError("%s: is a directory, not a results database" % self.path)
        with open(self.path, "rb") as f:
            head = f.read(16)
        if len(head) == 0:
            raise ResultsError("%s: empty results database: no runs recorded" % self.path)
        if head != b"SQLite format 3\0":
            raise ResultsError("%s: not an SQLite database (no 'SQLite format 3' header)" % self.path)
        uri = "file:%s?mode=ro" % _uri_path(os.path.abspath(self.path))
        try:
            self.db = sqlite3.connect(uri, uri=True)
            self.db.execute("PRAGMA query_only = 1")
            names = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.Error as ex:
            raise ResultsError("%s: cannot read the database: %s" % (self.path, ex)) from None
        if not names:
            self.close()
            raise ResultsError("%s: empty results database: no runs recorded" % self.path)
        if "meta" not in names:
            self.close()
            raise ResultsError("%s: not a kvsim results database (no meta table)" % self.path)
        meta = dict(self.db.execute("SELECT key, value FROM meta"))
        if meta.get("creator") != "kvsim":
            self.close()
            raise ResultsError("%s: not a kvsim results database (meta.creator = %r)" % (self.path,
                                                                                      meta.get("creator")))
        if meta.get("schema_version") not in ("1", "2"):
            self.close()
            raise ResultsError("%s: schema version %s is newer than this reader (reads 1 and 2)"
                               % (self.path, meta.get("schema_version")))
        self.meta = meta
        self.schema_version = int(meta["schema_version"])
        self._tables = names
        self._cols = {}

    def close(self):
        if getattr(self, "db", None) is not None:
            self.db.close()
            self.db = None

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.close()

    def tables(self):
        return sorted(self._tables)

    def columns(self, table):
        """Column names of `table` in the database's order ([] when the table is absent)."""
        if table not in self._cols:
            self._cols[table] = ([r[1] for r in self.db.execute("PRAGMA table_info(%s)" % _ident(table))]
                                 if table in self._tables else [])
        return self._cols[table]

    def metric_names(self):
        return [c[:-5] for c in self.columns("run_summary") if c.endswith("_mean")]

    def _metrics_of(self, row, cols):
        out = {}
        for m in self.metric_names():
            st = {}
            for s in STATS:
                c = "%s_%s" % (m, s)
                v = row[cols[c]] if c in cols else None
                st[s] = (0 if v is None else int(v)) if s == "n" else _nan(v)
            out[m] = st
        return out

    def runs(self, status="complete", policy=None, trace=None):
        """Runs with their trace and run-wide metrics (see the class doc). status None = every run; trace: a
        trace id, or a path (the path given to replay)."""
        if "runs" not in self._tables:
            raise ResultsError("%s: no runs table (no replay results)" % self.path)
        rc = self.columns("runs")
        tc = [c for c in self.columns("traces") if c != "id"]
        sc = self.columns("run_summary")
        sel = ["r.%s" % _ident(c) for c in rc] + ["t.%s" % _ident(c) for c in tc] + \
              ["s.%s" % _ident(c) for c in sc]
        sha = "sweep_traces" in self._tables
        sel.append("w.sha256" if sha else "NULL")
        sql = "SELECT %s FROM runs r JOIN traces t ON t.id = r.trace_id LEFT JOIN run_summary s ON s.run_id = r.id" \
              % ", ".join(sel)
        if sha:
            sql += " LEFT JOIN sweep_traces w ON w.trace_id = r.trace_id"
        where, args = [], []
        if status is not None:
            where.append("r.status = ?")
            args.append(status)
        if policy is not None:
            where.append("r.policy = ?")
            args.append(policy)
        if trace is not None:
            if isinstance(trace, (int, np.integer)):
                where.append("r.trace_id = ?")
            else:
                where.append("t.path = ?")
            args.append(trace)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY r.id"
        out = []
        nr, nt = len(rc), len(tc)
        scols = {c: nr + nt + i for i, c in enumerate(sc)}
        for row in self.db.execute(sql, args):
            d = dict(zip(rc, row[:nr]))
            d.update(("trace_" + c, row[nr + i]) for i, c in enumerate(tc))
            d["trace_sha256"] = row[-1]
            d["metrics"] = self._metrics_of(row, scols)
            out.append(d)
        return out

    def layers(self, run_id):
        cols = self.columns("run_layers")
        if not cols:
            return []
        idx = {c: i for i, c in enumerate(cols)}
        rows = self.db.execute("SELECT %s FROM run_layers WHERE run_id = ? ORDER BY layer"
                               % ", ".join(_ident(c) for c in cols), (run_id,))
        return [{"layer": r[idx["layer"]], "metrics": self._metrics_of(r, idx)} for r in rows]

    def steps(self, run_id, metrics=None):
        cols = self.columns("steps")
        if not cols:
            return {}
        keys = ["layer", "q_head", "position"]
        avail = [c for c in cols if c not in keys + ["run_id"]]
        if metrics is None:
            metrics = avail
        for m in metrics:
            if m not in avail:
                raise ResultsError("%s: steps has no column %r (columns: %s)" % (self.path, m, ", ".join(avail)))
        rows = self.db.execute("SELECT %s FROM steps WHERE run_id = ? ORDER BY layer, q_head, position"
                               % ", ".join(_ident(c) for c in keys + list(metrics)), (run_id,)).fetchall()
        out = {k: np.array([r[i] for r in rows], np.int64) for i, k in enumerate(keys)}
        for j, m in enumerate(metrics):
            out[m] = np.array([_nan(r[3 + j]) for r in rows], np.float64)
        return out

    def turns(self, trace_id):
        if "trace_turns" not in self._tables:
            return []
        return [tuple(r) for r in self.db.execute(
            "SELECT turn, begin_pos, prompt_end, end_pos FROM trace_turns WHERE trace_id = ? ORDER BY turn",
            (trace_id,))]

    def summary(self, metric, stat="mean", **filters):
        rs = self.runs(**filters)
        return (np.array([r["id"] for r in rs], np.int64),
                np.array([r["metrics"][metric][stat] if metric in r["metrics"] else np.nan for r in rs],
                         np.float64))


def _ident(name):
    return '"%s"' % name.replace('"', '""')


def _uri_path(p):
    from urllib.parse import quote
    return quote(p, safe="/")


def open_results(path):
    """Results(path)."""
    return Results(path)
