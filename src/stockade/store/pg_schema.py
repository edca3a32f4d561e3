"""The PostgreSQL store's tables (``stockade_`` prefix), idempotent to apply.

Kept apart from ``postgres.py`` so the schema reads in one place. Imports nothing of stockade.
"""

SCHEMA = """
CREATE TABLE IF NOT EXISTS stockade_runs (
    run_id TEXT PRIMARY KEY,
    workflow TEXT NOT NULL,
    workflow_path TEXT NOT NULL,
    workflow_sha256 TEXT NOT NULL,
    root TEXT NOT NULL,
    status TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION,
    sandbox TEXT NOT NULL,
    enforced BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS stockade_items (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    status TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    result TEXT,
    value TEXT,
    message TEXT NOT NULL,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION NOT NULL,
    key TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, step, item)
);
CREATE TABLE IF NOT EXISTS stockade_artifacts (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    size BIGINT NOT NULL,
    PRIMARY KEY (run_id, step, item, name)
);
CREATE TABLE IF NOT EXISTS stockade_attempts (
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    exit_code INTEGER,
    started_at DOUBLE PRECISION NOT NULL,
    ended_at DOUBLE PRECISION NOT NULL,
    message TEXT NOT NULL,
    PRIMARY KEY (run_id, step, item, attempt)
);
CREATE TABLE IF NOT EXISTS stockade_events (
    id BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    kind TEXT NOT NULL,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS stockade_events_run ON stockade_events (run_id, id);
CREATE TABLE IF NOT EXISTS stockade_leases (
    name TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    token BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
CREATE TABLE IF NOT EXISTS stockade_lease_users (
    name TEXT NOT NULL,
    holder TEXT NOT NULL,
    "user" TEXT NOT NULL,
    PRIMARY KEY (name, holder, "user")
);
CREATE TABLE IF NOT EXISTS stockade_fences (
    scope TEXT PRIMARY KEY,
    high_water BIGINT NOT NULL,
    holder TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS stockade_effects (
    key TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    lease TEXT NOT NULL,
    sink TEXT NOT NULL,
    sink_key TEXT NOT NULL,
    payload_sha256 TEXT NOT NULL,
    status TEXT NOT NULL,
    token BIGINT,
    claimed_at DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS stockade_effects_run ON stockade_effects (run_id, key);
CREATE TABLE IF NOT EXISTS stockade_reuse_index (
    key TEXT NOT NULL,
    run_id TEXT NOT NULL,
    step TEXT NOT NULL,
    item INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (key, run_id, step, item)
);
CREATE INDEX IF NOT EXISTS stockade_reuse_run ON stockade_reuse_index (run_id);
CREATE TABLE IF NOT EXISTS stockade_removed_runs (
    run_id TEXT PRIMARY KEY
);
CREATE TABLE IF NOT EXISTS stockade_last_publish (
    lease TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    payload_sha256 TEXT NOT NULL,
    input_fingerprint TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL
);
ALTER TABLE stockade_last_publish
    ADD COLUMN IF NOT EXISTS run_started_at DOUBLE PRECISION NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS token BIGINT NOT NULL DEFAULT 0;
ALTER TABLE stockade_items ADD COLUMN IF NOT EXISTS key TEXT NOT NULL DEFAULT '';
ALTER TABLE stockade_items ADD COLUMN IF NOT EXISTS reused_from TEXT;
ALTER TABLE stockade_attempts ADD COLUMN IF NOT EXISTS provenance TEXT;
CREATE INDEX IF NOT EXISTS stockade_items_key ON stockade_items (run_id, step, key);
CREATE INDEX IF NOT EXISTS stockade_items_tally
    ON stockade_items (run_id, step, status, started_at, ended_at);
ALTER TABLE stockade_items ADD COLUMN IF NOT EXISTS usage TEXT NOT NULL DEFAULT '{}';
ALTER TABLE stockade_items ADD COLUMN IF NOT EXISTS not_reused TEXT;
"""
