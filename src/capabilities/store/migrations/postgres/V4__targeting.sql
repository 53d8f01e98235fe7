-- Migration 4: targeted plans. The engine flags a `planbot plan [ROOT] -- …` comment asked for,
-- per MR head and root: every plan of that head (a re-run, another replica) uses them, and the
-- apply re-plans the reviewed head with them. A head without a row is planned in full, so a new
-- push drops them; the next `planbot plan` comment on the MR replaces them all.
CREATE TABLE plan_targeting (
    project_id  BIGINT NOT NULL,
    mr_iid      BIGINT NOT NULL,
    sha         TEXT NOT NULL,
    root        TEXT NOT NULL,
    targeting   TEXT NOT NULL,          -- core::targeting::Targeting as JSON
    author_id   BIGINT NOT NULL,       -- who commented
    set_at      BIGINT NOT NULL,
    PRIMARY KEY (project_id, mr_iid, sha, root)
);
