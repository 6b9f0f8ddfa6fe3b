//! Buffers: configurations, bodies and call responses.

use super::*;

pub(super) fn register(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "env",
        "proxy_get_buffer_bytes",
        |mut c: Ctx<'_>, kind: i32, start: i32, max: i32, ret_data: i32, ret_size: i32| -> HostResult {
            let s = c.data();
            let buffer: Option<&[u8]> = match BufferType::from_raw(kind) {
                Some(BufferType::PluginConfiguration) => Some(&s.plugin_config),
                Some(BufferType::VmConfiguration) => Some(&s.vm_config),
                Some(BufferType::CallResponseBody) => s.call_reply.as_ref().map(|r| r.body.as_slice()),
                Some(BufferType::RequestBody) => s.streams.get(&s.current).map(|st| st.request_body.as_slice()),
                Some(BufferType::ResponseBody) => s.streams.get(&s.current).map(|st| st.response_body.as_slice()),
                None => return status(Status::BadArgument),
            };
            let Some(buffer) = buffer else {
                return status(Status::NotFound);
            };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            if buffer.is_empty() {
                return status(Status::NotFound);
            }
            let end = start.saturating_add(max).min(buffer.len());
            let slice = buffer.get(start..end).unwrap_or_default().to_vec();
            give(&mut c, &slice, ret_data, ret_size)
        },
    )?;
    linker.func_wrap(
        "env",
        "proxy_set_buffer_bytes",
        |mut c: Ctx<'_>, kind: i32, start: i32, size: i32, ptr: i32, len: i32| -> HostResult {
            let Some(data) = read(&mut c, ptr, len) else {
                return status(Status::BadArgument);
            };
            let kind = BufferType::from_raw(kind);
            let Some(stream) = current_stream(c.data_mut()) else {
                return status(Status::NotFound);
            };
            let buffer = match kind {
                Some(BufferType::RequestBody) => &mut stream.request_body,
                Some(BufferType::ResponseBody) => &mut stream.response_body,
                _ => return status(Status::BadArgument),
            };
            let start = (start as u32 as usize).min(buffer.len());
            let end = start.saturating_add(size as u32 as usize).min(buffer.len());
            buffer.splice(start..end, data);
            OK
        },
    )?;
    Ok(())
}
