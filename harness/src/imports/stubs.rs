//! Host functions the harness does not provide.

use super::*;

/// Defines every other `env` import of `module` as a function that logs and returns
/// `Unimplemented`, so a module never traps because the harness lacks a host function. In
/// the Nginx flavor it traps instead: ngx_wasm_module's not-yet-implemented host functions
/// (the `proxy_grpc_*` calls among them) do.
pub(crate) fn stub_missing(linker: &mut Linker<HostState>, module: &Module) -> wasmtime::Result<()> {
    let missing: Vec<_> = module
        .imports()
        .filter(|i| i.module() == "env")
        .filter_map(|i| i.ty().func().cloned().map(|f| (i.name().to_owned(), f)))
        .collect();
    for (name, ty) in missing {
        let fname = name.clone();
        let result_types: Vec<ValType> = ty.results().collect();
        let defined = linker.func_new("env", &name, ty, move |mut c: Caller<'_, HostState>, _args, results| {
            c.data_mut().unimplemented.push(fname.clone());
            if c.data().options.flavor == Flavor::Nginx {
                let msg = format!("{fname} is not implemented by ngx_wasm_module (NYI): it traps");
                c.data_mut().nginx_trap = Some(msg.clone());
                return Err(wasmtime::Error::msg(msg));
            }
            tracing::warn!(function = %fname, "host function not implemented by the harness: returning Unimplemented");
            for (r, t) in results.iter_mut().zip(&result_types) {
                *r = match t {
                    ValType::I64 => Val::I64(Status::Unimplemented as i64),
                    _ => Val::I32(Status::Unimplemented as i32),
                };
            }
            Ok(())
        });
        // Already defined: a function the harness implements.
        drop(defined);
    }
    Ok(())
}

/// Redefines every host function `module` imports that `refused` names as one that does
/// nothing but answer its status ([`crate::HostOptions::refused_calls`]).
pub(crate) fn refuse(
    linker: &mut Linker<HostState>,
    module: &Module,
    refused: &[(String, Status)],
) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    for import in module.imports().filter(|i| i.module() == "env") {
        let Some(&(_, answer)) = refused.iter().find(|(name, _)| name == import.name()) else {
            continue;
        };
        let Some(ty) = import.ty().func().cloned() else {
            continue;
        };
        let result_types: Vec<ValType> = ty.results().collect();
        linker.func_new("env", import.name(), ty, move |_c, _args, results| {
            for (r, t) in results.iter_mut().zip(&result_types) {
                *r = match t {
                    ValType::I64 => Val::I64(answer as i64),
                    _ => Val::I32(answer as i32),
                };
            }
            Ok(())
        })?;
    }
    linker.allow_shadowing(false);
    Ok(())
}
