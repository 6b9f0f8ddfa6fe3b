//! Stream control: resume, close, answer locally.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_continue_stream",
        |mut c: Ctx<'_>, kind: i32| -> HostResult {
            if c.data().options.flavor == Flavor::Nginx && c.data().current == c.data().root_id {
                // With set_effective_context a no-op, a root's on_tick that resumes a stream
                // reaches ngx_wasm_module with no request to resume (its source dereferences
                // the root's missing request context): never rely on it.
                return nginx_trap_with(
                    &mut c,
                    "resume outside a request context: the root has no request to resume",
                );
            }
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            match kind {
                0 => stream.request_resumes += 1,
                1 => stream.response_resumes += 1,
                _ => return status(Status::BadArgument),
            }
            OK
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_close_stream",
        |mut c: Ctx<'_>, _kind: i32| -> HostResult {
            nginx_trap(&mut c, "proxy_close_stream")?;
            match current_stream(c.data_mut()) {
                Some(stream) => {
                    stream.closed = true;
                    OK
                }
                None => status(Status::NotFound),
            }
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_send_local_response",
        |mut c: Ctx<'_>,
         code: i32,
         dptr: i32,
         dlen: i32,
         bptr: i32,
         blen: i32,
         hptr: i32,
         hlen: i32,
         _grpc: i32|
         -> HostResult {
            let details = read_str(&mut c, dptr, dlen).unwrap_or_default();
            let Some(body) = read(&mut c, bptr, blen) else {
                return status(Status::BadArgument);
            };
            let headers = if hlen == 0 {
                Some(Vec::new())
            } else {
                read(&mut c, hptr, hlen).and_then(|b| map::deserialize_text(&b))
            };
            let Some(headers) = headers else {
                return status(Status::BadArgument);
            };
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            stream.local_response = Some(LocalResponse {
                status: code as u16,
                details,
                headers,
                body,
            });
            OK
        },
    )?;
    Ok(())
}
