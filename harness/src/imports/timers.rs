//! The clock and the tick period.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_current_time_nanoseconds",
        |mut c: Ctx<'_>, ret: i32| -> HostResult {
            let mut now = c.data().clock_ns;
            if c.data().options.flavor == Flavor::Nginx {
                now -= now % 1_000_000; // ngx_wasm_module's clock has millisecond resolution
            }
            match write(&mut c, ret, &now.to_le_bytes()) {
                Some(()) => OK,
                None => status(Status::BadArgument),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_tick_period_milliseconds",
        |mut c: Ctx<'_>, period: i32| -> HostResult {
            if c.data().options.flavor == Flavor::Nginx {
                // ngx_proxy_wasm_hfuncs_set_tick_period: root context only, and once.
                if c.data().current != c.data().root_id {
                    return nginx_trap_with(&mut c, "can only set tick_period in root context");
                }
                if period != 0 && c.data().tick_period_ms != 0 {
                    return nginx_trap_with(&mut c, "tick_period already set");
                }
            }
            let s = c.data_mut();
            s.tick_period_ms = period as u32;
            s.next_tick_ns = s.clock_ns + u64::from(period as u32) * 1_000_000;
            OK
        },
    )?;
    Ok(())
}
