//! berth-net (doc written below once the modules exist).

pub mod policy;
