//! The commit statuses planbot sets, one name per flow: what GitLab shows beside a commit, and
//! what one flow reads of another's (a drift check asks whether the head's apply succeeded).

/// The plan of an MR head (`flows::review::plan`).
pub const PLAN: &str = "planbot/plan";
/// The policy verdict of an MR head (`flows::review::policies`).
pub const POLICY: &str = "planbot/policy";
/// The engine's tests of an MR head (`test -json` beside its plan; only when a root has tests).
pub const TEST: &str = "planbot/test";
/// The apply of a default-branch commit (`flows::apply`).
pub const APPLY: &str = "planbot/apply";
/// The drift check of the default branch's head (`flows::drift::check`).
pub const DRIFT: &str = "planbot/drift";
