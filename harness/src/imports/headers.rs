//! Header and trailer maps of the current stream and of call responses.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_header_map_pairs",
        |mut c: Ctx<'_>, kind: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let bytes = map_mut(c.data_mut(), kind)
                .map(|m| map::serialize(m))
                .unwrap_or_else(|| map::serialize::<&[u8]>(&[]));
            give(&mut c, &bytes, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_header_map_pairs",
        |mut c: Ctx<'_>, kind: i32, ptr: i32, len: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let Some(pairs) = read(&mut c, ptr, len).and_then(|b| map::deserialize(&b)) else {
                return status(Status::BadArgument);
            };
            match map_mut(c.data_mut(), kind) {
                Some(m) => {
                    *m = pairs;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_get_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some(kind) = MapType::from_raw(kind) else {
                return status(Status::BadArgument);
            };
            let Some(key) = read_str(&mut c, kptr, klen) else {
                return status(Status::BadArgument);
            };
            let value = map_mut(c.data_mut(), kind).and_then(|m| {
                m.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(&key))
                    .map(|(_, v)| v.clone())
            });
            give_found(&mut c, value, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_replace_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, Some((vptr, vlen)), true)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_add_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32, vptr: i32, vlen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, Some((vptr, vlen)), false)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_remove_header_map_value",
        |mut c: Ctx<'_>, kind: i32, kptr: i32, klen: i32| -> HostResult {
            edit_map(&mut c, kind, kptr, klen, None, true)
        },
    )?;
    Ok(())
}

fn edit_map(c: &mut Ctx<'_>, kind: i32, kptr: i32, klen: i32, value: Option<(i32, i32)>, replace: bool) -> HostResult {
    let Some(kind) = MapType::from_raw(kind) else {
        return status(Status::BadArgument);
    };
    let Some(key) = read_str(c, kptr, klen) else {
        return status(Status::BadArgument);
    };
    let value = match value {
        Some((p, l)) => match read(c, p, l) {
            Some(v) => Some(v),
            None => return status(Status::BadArgument),
        },
        None => None,
    };
    let Some(m) = map_mut(c.data_mut(), kind) else {
        return status(Status::NotFound);
    };
    if replace {
        m.retain(|(k, _)| !k.eq_ignore_ascii_case(&key));
    }
    if let Some(v) = value {
        m.push((key.to_ascii_lowercase(), v));
    }
    OK
}
