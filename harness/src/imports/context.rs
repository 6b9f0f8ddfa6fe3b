//! Contexts and the rest of the ABI: effective context, done, status, foreign functions.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_status",
        |mut c: Ctx<'_>, code: i32, ret_data: i32, ret_size: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_get_status")?;
            if write_u32(&mut c, code, 0).is_none() {
                return status(Status::BadArgument);
            }
            give(&mut c, &[], ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_effective_context",
        |mut c: Ctx<'_>, id: i32| -> HostResult {
            let id = id as u32;
            let s = c.data_mut();
            if s.options.flavor == Flavor::Nginx {
                return OK; // ngx_proxy_wasm_hfuncs_set_effective_context: answers Ok, does nothing
            }
            if id != s.root_id && !s.streams.contains_key(&id) {
                return status(Status::BadArgument);
            }
            s.current = id;
            OK
        },
    )?;
    linker.func_wrap("env", "proxy_done", |mut c: Ctx<'_>| -> HostResult {
        nginx_trap(&mut c, "proxy_done")?;
        OK
    })?;
    linker.func_wrap(
        "env",
        "proxy_call_foreign_function",
        |_c: Ctx<'_>, _n: i32, _nl: i32, _a: i32, _al: i32, _rd: i32, _rs: i32| -> HostResult {
            status(Status::NotFound)
        },
    )?;
    Ok(())
}
