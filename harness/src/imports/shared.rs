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
            let Some((value, cas)) = c.data().shared.get(&key).cloned() else {
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
            let shared = &mut c.data_mut().shared;
            let current = shared.get(&key).map_or(0, |(_, v)| *v);
            if cas != 0 && cas as u32 != current {
                return status(Status::CasMismatch);
            }
            shared.insert(key, (value, current.wrapping_add(1).max(1)));
            OK
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
