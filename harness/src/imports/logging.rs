//! Logging: `proxy_log` and the log level.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_log",
        |mut c: Ctx<'_>, level: i32, ptr: i32, len: i32| -> HostResult {
            let Some(message) = read_str(&mut c, ptr, len) else {
                return status(Status::BadArgument);
            };
            let context_id = c.data().current;
            let level = LogLevel::from_raw(level);
            tracing::debug!(target: "wasm", ?level, context_id, "{message}");
            c.data_mut().logs.push(LogRecord {
                level,
                context_id,
                message,
            });
            OK
        },
    )?;
    linker.func_wrap("env", "proxy_get_log_level", |mut c: Ctx<'_>, ret: i32| -> HostResult {
        nginx_trap(&mut c, "proxy_get_log_level")?;
        return_u32(&mut c, ret, 0)
    })?;
    Ok(())
}
