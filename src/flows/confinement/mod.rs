//! What an engine run may see and reach: its credentials (plan or apply), its sandbox, and the
//! one plan request per trust level built from them. Used by the service's flows and the CLI.
pub mod credentials;
pub mod network;
pub mod plan_request;
pub mod sandbox;
