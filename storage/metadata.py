"""The store's metadata in SQLite: topics, seals, committed offsets, writer
snapshots and key-value tables.

SQLite runs in WAL mode with ``synchronous=NORMAL``: a commit writes the WAL
without an fsync, and the store makes it durable by handing the ``-wal``
file to the group-commit syncer, exactly like a segment. So metadata
changes share the data's fsync policy and its group commit, and no fsync
ever runs on the reactor thread. (Under ``fsync: never`` SQLite's own
syncing is switched off as well.)

The connection belongs to the reactor thread; every call here is short.
"""
import json
import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS topics (
    name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL,
    kind TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    attrs TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS sealed (
    topic TEXT NOT NULL, partition INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS offsets (
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL,
    offset INTEGER NOT NULL, metadata TEXT, commit_ms INTEGER NOT NULL,
    PRIMARY KEY (grp, topic, partition)
);
CREATE TABLE IF NOT EXISTS writer_snapshots (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS writers (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, writer_id BLOB NOT NULL,
    event_number INTEGER NOT NULL,
    PRIMARY KEY (topic, partition, writer_id)
);
CREATE TABLE IF NOT EXISTS kv_tables (
    name TEXT PRIMARY KEY, next_version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS kv_entries (
    tbl TEXT NOT NULL, key BLOB NOT NULL, value BLOB NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (tbl, key)
);
CREATE INDEX IF NOT EXISTS kv_by_version ON kv_entries (tbl, version);
"""


class TopicRow:
    __slots__ = ("name", "partitions", "kind", "created_ms", "attrs")

    def __init__(self, name, partitions, kind, created_ms, attrs):
        self.name = name
        self.partitions = partitions
        self.kind = kind
        self.created_ms = created_ms
        self.attrs = attrs


class MetadataDB:
    def __init__(self, path, synchronous=True):
        self.path = path
        self.wal_path = path + "-wal"
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=%s" % ("NORMAL" if synchronous else "OFF"))
        self.db.executescript(SCHEMA)

    def close(self):
        self.db.close()

    def transaction(self):
        """A context manager: BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on error."""
        return _Transaction(self.db)

    # -- topics ------------------------------------------------------------

    def load_topics(self):
        rows = self.db.execute("SELECT name, partitions, kind, created_ms, attrs FROM topics")
        return {name: TopicRow(name, parts, kind, created, json.loads(attrs))
                for name, parts, kind, created, attrs in rows}

    def load_sealed(self):
        return set(self.db.execute("SELECT topic, partition FROM sealed"))

    def insert_topic(self, row):
        with self.transaction():
            self.db.execute("INSERT INTO topics VALUES (?, ?, ?, ?, ?)",
                            (row.name, row.partitions, row.kind, row.created_ms,
                             json.dumps(row.attrs)))

    def update_topic(self, row):
        with self.transaction():
            self.db.execute("UPDATE topics SET partitions=?, kind=?, attrs=? WHERE name=?",
                            (row.partitions, row.kind, json.dumps(row.attrs), row.name))

    def delete_topic(self, name):
        with self.transaction():
            for table in ("sealed", "writer_snapshots", "writers"):
                self.db.execute(f"DELETE FROM {table} WHERE topic=?", (name,))
            self.db.execute("DELETE FROM offsets WHERE topic=?", (name,))
            self.db.execute("DELETE FROM topics WHERE name=?", (name,))

    def seal(self, topic, partition):
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO sealed VALUES (?, ?)", (topic, partition))

    # -- committed offsets ---------------------------------------------------

    def commit_offset(self, group, topic, partition, offset, metadata, now_ms):
        with self.transaction():
            self.db.execute("INSERT OR REPLACE INTO offsets VALUES (?, ?, ?, ?, ?, ?)",
                            (group, topic, partition, offset, metadata, now_ms))

    def committed_offset(self, group, topic, partition):
        row = self.db.execute(
            "SELECT offset, metadata FROM offsets WHERE grp=? AND topic=? AND partition=?",
            (group, topic, partition)).fetchone()
        return None if row is None else (row[0], row[1])

    def groups(self):
        return [g for (g,) in self.db.execute("SELECT DISTINCT grp FROM offsets ORDER BY grp")]

    def group_offsets(self, group):
        return {(t, p): (o, m) for t, p, o, m in self.db.execute(
            "SELECT topic, partition, offset, metadata FROM offsets WHERE grp=? "
            "ORDER BY topic, partition", (group,))}

    # -- writer snapshots -------------------------------------------------------

    def load_writer_snapshot(self, topic, partition):
        row = self.db.execute("SELECT offset FROM writer_snapshots WHERE topic=? AND partition=?",
                              (topic, partition)).fetchone()
        if row is None:
            return None, {}
        states = dict(self.db.execute(
            "SELECT writer_id, event_number FROM writers WHERE topic=? AND partition=?",
            (topic, partition)))
        return row[0], states

    def save_writer_snapshot(self, topic, partition, offset, states):
        with self.transaction():
            self.db.execute("DELETE FROM writers WHERE topic=? AND partition=?", (topic, partition))
            self.db.executemany("INSERT INTO writers VALUES (?, ?, ?, ?)",
                                [(topic, partition, w, n) for w, n in states.items()])
            self.db.execute("INSERT OR REPLACE INTO writer_snapshots VALUES (?, ?, ?)",
                            (topic, partition, offset))

    # -- key-value tables ----------------------------------------------------------

    def table_next_version(self, name):
        row = self.db.execute("SELECT next_version FROM kv_tables WHERE name=?", (name,)).fetchone()
        return None if row is None else row[0]

    def table_create(self, name):
        with self.transaction():
            self.db.execute("INSERT INTO kv_tables VALUES (?, 0)", (name,))

    def table_delete(self, name):
        with self.transaction():
            self.db.execute("DELETE FROM kv_entries WHERE tbl=?", (name,))
            self.db.execute("DELETE FROM kv_tables WHERE name=?", (name,))

    def table_is_empty(self, name):
        return self.db.execute("SELECT 1 FROM kv_entries WHERE tbl=? LIMIT 1",
                               (name,)).fetchone() is None

    def table_get(self, name, keys):
        out = []
        for key in keys:
            row = self.db.execute("SELECT value, version FROM kv_entries WHERE tbl=? AND key=?",
                                  (name, key)).fetchone()
            out.append(None if row is None else (row[0], row[1]))
        return out

    def table_versions(self, name, keys):
        return {key: ver for key, ver in self.db.execute(
            "SELECT key, version FROM kv_entries WHERE tbl=? AND key IN (%s)"
            % ",".join("?" * len(keys)), (name, *keys))} if keys else {}

    def table_write(self, name, puts, removes, next_version):
        """Apply puts ``[(key, value, version)]`` and removes ``[key]`` atomically."""
        with self.transaction():
            self.db.executemany("INSERT OR REPLACE INTO kv_entries VALUES (?, ?, ?, ?)",
                                [(name, k, v, ver) for k, v, ver in puts])
            self.db.executemany("DELETE FROM kv_entries WHERE tbl=? AND key=?",
                                [(name, k) for k in removes])
            self.db.execute("UPDATE kv_tables SET next_version=? WHERE name=?",
                            (next_version, name))

    def table_scan(self, name, from_version, limit):
        """Entries with version >= ``from_version``, ascending, at most ``limit``."""
        return self.db.execute(
            "SELECT key, value, version FROM kv_entries WHERE tbl=? AND version>=? "
            "ORDER BY version LIMIT ?", (name, from_version, limit)).fetchall()


class _Transaction:
    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, kind, value, tb):
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")
        return False
