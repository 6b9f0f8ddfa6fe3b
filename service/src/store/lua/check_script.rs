//! The check script's source, in the order Redis loads it. A module of the Redis store, and
//! included by path in `sluice-load` (load/), which loads the same script for its
//! `redis-benchmark` ceiling without depending on the service.

/// The check script: the shared helpers, each algorithm, then the driver.
const CHECK: [&str; 7] = [
    include_str!("common.lua"),
    include_str!("token_bucket.lua"),
    include_str!("gcra.lua"),
    include_str!("fixed_window.lua"),
    include_str!("sliding_window_log.lua"),
    include_str!("sliding_window_counter.lua"),
    include_str!("check.lua"),
];

/// The source of the check script, as loaded into Redis (for load tools and tests).
pub fn check_script() -> String {
    CHECK.join("\n")
}
