//! Shared data (with compare-and-swap) and shared queues.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_shared_data",
        |mut c: Ctx<'_>, kptr: i32, klen: i32, ret_data: i32, ret_size: i32, ret_cas: i32| -> HostResult {
            let Some(key) = read_str(&mut c, kptr, klen) else {
                return status(Status::BadArgument);
            };
            nginx_zone(&mut c, &key, "getting value from")?;
            let Some((value, cas)) = c.data().options.shared_data.get(&key) else {
                return status(Status::NotFound);
            };
            if write_u32(&mut c, ret_cas, cas).is_none() {
                return status(Status::BadArgument);
            }
            give(&mut c, &value, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_shared_data",
        |mut c: Ctx<'_>, kptr: i32, klen: i32, vptr: i32, vlen: i32, cas: i32| -> HostResult {
            let (Some(key), Some(value)) = (read_str(&mut c, kptr, klen), read(&mut c, vptr, vlen)) else {
                return status(Status::BadArgument);
            };
            nginx_zone(&mut c, &key, "setting value to")?;
            let cas = cas as u32;
            let nginx = c.data().options.flavor == Flavor::Nginx;
            let written = c.data().options.shared_data.with(|shared| {
                let current = shared.get(&key).map(|(_, v)| *v);
                // Envoy: a CAS of 0 sets whatever is there. ngx_wasm_module: a CAS of 0
                // sets only a key that is absent (its CAS is 0).
                let agrees = match (cas, current) {
                    (0, _) if !nginx => true,
                    (cas, current) => cas == current.unwrap_or(0),
                };
                if agrees {
                    let next = current.unwrap_or(0).wrapping_add(1).max(1);
                    shared.insert(key, (value, next));
                }
                agrees
            });
            if written {
                OK
            } else {
                status(Status::CasMismatch)
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_register_shared_queue",
        |mut c: Ctx<'_>, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let queues = &mut c.data_mut().queues;
            let id = match queues.iter().position(|(n, _)| *n == name) {
                Some(i) => i,
                None => {
                    queues.push((name, VecDeque::new()));
                    queues.len() - 1
                }
            };
            return_u32(&mut c, ret, id as u32 + 1)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_resolve_shared_queue",
        |mut c: Ctx<'_>, _vptr: i32, _vlen: i32, nptr: i32, nlen: i32, ret: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_resolve_shared_queue")?;
            let Some(name) = read_str(&mut c, nptr, nlen) else {
                return status(Status::BadArgument);
            };
            let Some(i) = c.data().queues.iter().position(|(n, _)| *n == name) else {
                return status(Status::NotFound);
            };
            return_u32(&mut c, ret, i as u32 + 1)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_dequeue_shared_queue",
        |mut c: Ctx<'_>, id: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let Some((_, q)) = c.data_mut().queues.get_mut((id as u32 as usize).wrapping_sub(1)) else {
                return status(Status::NotFound);
            };
            match q.pop_front() {
                Some(v) => give(&mut c, &v, ret_data, ret_size),
                None => status(Status::Empty),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_enqueue_shared_queue",
        |mut c: Ctx<'_>, id: i32, vptr: i32, vlen: i32| -> HostResult {
            let Some(value) = read(&mut c, vptr, vlen) else {
                return status(Status::BadArgument);
            };
            match c.data_mut().queues.get_mut((id as u32 as usize).wrapping_sub(1)) {
                Some((_, q)) => {
                    q.push_back(value);
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    Ok(())
}

/// ngx_wasm_module resolves a key's zone from its `zone/` prefix, else the default zone
/// (`*`), and traps when neither is declared (`shm_kv` in nginx.conf).
fn nginx_zone(c: &mut Ctx<'_>, key: &str, doing: &str) -> wasmtime::Result<()> {
    let options = &c.data().options;
    if options.flavor != Flavor::Nginx {
        return Ok(());
    }
    let zone = key.split_once('/').map(|(zone, _)| zone);
    let declared = |name: &str| options.shm_kv.iter().any(|z| z == name);
    if zone.is_some_and(declared) || declared("*") {
        return Ok(());
    }
    nginx_trap_with(
        c,
        &format!("failed {doing} shm (could not resolve namespace): declare `shm_kv` for {key:?} in nginx.conf"),
    )?;
    Ok(())
}
