//! Properties (`source.address`, `request.path`, and the module's own).

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_property",
        |mut c: Ctx<'_>, pptr: i32, plen: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(path) = read(&mut c, pptr, plen) else {
                return status(Status::BadArgument);
            };
            let path = property_path(&path);
            let s = c.data_mut();
            if s.options.flavor == Flavor::Nginx && !s.streams.contains_key(&s.current) && path.contains('.') {
                // ngx_proxy_wasm_properties_get: a dotted path outside a request is refused
                // and logged (seen in a real Nginx), where in a request an unknown one is
                // NotFound.
                s.host_errors
                    .push("[wasm] cannot get scoped properties outside of a request".into());
                return status(Status::InternalFailure);
            }
            let value = s
                .streams
                .get(&s.current)
                .and_then(|st| st.properties.get(&path))
                .or_else(|| s.root_properties.get(&path))
                .cloned();
            give_found(&mut c, value, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_property",
        |mut c: Ctx<'_>, pptr: i32, plen: i32, vptr: i32, vlen: i32| -> HostResult {
            let (Some(path), Some(value)) = (read(&mut c, pptr, plen), read(&mut c, vptr, vlen)) else {
                return status(Status::BadArgument);
            };
            let path = property_path(&path);
            let s = c.data_mut();
            match s.streams.get_mut(&s.current) {
                Some(st) => st.properties.insert(path, value),
                None => s.root_properties.insert(path, value),
            };
            OK
        },
    )?;
    Ok(())
}

/// A property path from the ABI's NUL-separated segments to the dotted form.
fn property_path(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).trim_end_matches('\0').replace('\0', ".")
}
