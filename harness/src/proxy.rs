//! Proxy mode (being written).
