//! Capabilities: one concrete client per external thing.
