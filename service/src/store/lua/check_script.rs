//! The check's Lua source, in the order Redis loads it, as a script (`EVALSHA`, Redis 6) and
//! as a Function library (`FCALL`, Redis 7). A module of the Redis store, and included by
//! path in `sluice-load` (load/), which loads the same script for its `redis-benchmark`
//! ceiling without depending on the service.

/// The check's body: the shared helpers, each algorithm, then the driver, `run`.
const CHECK: [&str; 8] = [
    include_str!("common.lua"),
    include_str!("token_bucket.lua"),
    include_str!("gcra.lua"),
    include_str!("fixed_window.lua"),
    include_str!("sliding_window_log.lua"),
    include_str!("sliding_window_counter.lua"),
    include_str!("concurrency.lua"),
    include_str!("check.lua"),
];

/// The library's name: `sluice_` and a hash of its code, which its functions' names carry
/// too, so two versions of Sluice sharing a Redis each call their own code (as `EVALSHA`
/// names a script by its SHA-1).
pub fn library_name() -> String {
    // FNV-1a, 64 bits: a name, not a defence.
    let hash = CHECK
        .iter()
        .flat_map(|part| part.bytes())
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("sluice_{hash:016x}")
}

/// The operations the driver runs; the library has a function `<library>_<op>` for each.
pub const OPS: [&str; 8] = [
    "decide", "peek", "refund", "grant", "take", "giveback", "release", "renew",
];

/// The source of the check script, as loaded into Redis (for load tools and tests): the op
/// first in `ARGV`, then the driver's arguments.
pub fn check_script() -> String {
    let mut source = CHECK.join("\n");
    source.push_str("\nreturn run(ARGV[1], KEYS, ARGV, 2)\n");
    source
}

/// The source of the Function library: the same body, built once when loaded (not on
/// every call, as a script is), an entry point `<library>_<op>` per operation, and
/// `<library>_batch`, several checks decided in turn in one call.
pub fn check_library() -> String {
    let name = library_name();
    let mut source = format!("#!lua name={name}\n");
    source.push_str(&CHECK.join("\n"));
    for op in OPS {
        source.push_str(&format!(
            "\nredis.register_function('{name}_{op}', function(keys, args) return run('{op}', keys, args, 1) end)"
        ));
    }
    source.push_str(&format!("\nredis.register_function('{name}_batch', batch)"));
    source.push('\n');
    source
}
