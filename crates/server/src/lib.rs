//! berth-server
