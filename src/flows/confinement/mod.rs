//! What an engine run may see and reach: its credentials (plan or apply) and its sandbox.
//! Used by the service's review and apply flows and by the CLI.
pub mod credentials;
pub mod network;
pub mod sandbox;
