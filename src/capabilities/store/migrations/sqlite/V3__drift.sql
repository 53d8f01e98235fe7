-- Migration 3: drift. One row per occurrence of `[drift] schedule` that a replica claimed
-- (unix milliseconds): the primary key lets exactly one replica claim each tick, and the newest
-- row is the last tick, from which a replica starting up finds a tick it missed. And each
-- checked root's last check, what /metrics and `planbot doctor` show.
CREATE TABLE drift_ticks (
    tick_at    INTEGER PRIMARY KEY,
    job_id     INTEGER,                   -- the drift_tick job the claim queued
    claimed_at INTEGER NOT NULL
);
CREATE TABLE drift_roots (
    project_id    INTEGER NOT NULL,
    root          TEXT NOT NULL,
    project_path  TEXT NOT NULL,
    outcome       TEXT NOT NULL,        -- clean | drifted | waiting | could_not_check
    drifted       INTEGER NOT NULL,     -- resources that differ, at the last check
    checked_at    INTEGER NOT NULL,     -- the last check (unix ms)
    checked_ok_at INTEGER,              -- the last check that could check (any outcome but could_not_check)
    PRIMARY KEY (project_id, root)
);
