//! The check as Redis Functions (Redis ≥ 7): one library, `sluice_<hash of its code>`, loaded with
//! `FUNCTION LOAD` when a connection opens (on every master of a cluster) and again when a
//! call finds it gone (a restart without persistence, `FUNCTION FLUSH`, a master that never
//! had it). Its body — helpers, each algorithm — is built once when loaded; a script builds
//! it again on every `EVALSHA`. Each operation is its own function, `<library>_<op>`; the
//! hash keeps two versions of Sluice on one Redis from calling each other's code.
//!
//! A server without Functions (Redis 6) or a user without the right to load them keeps the
//! script (`EVALSHA`), said once in the log.

use std::sync::LazyLock;

use redis::{Cmd, FromRedisValue, Script};

use super::check_script::{check_library, library_name};
use super::connection::{Connection, Engine};
use crate::store::StoreError;

static LIBRARY: LazyLock<String> = LazyLock::new(check_library);
static LIBRARY_NAME: LazyLock<String> = LazyLock::new(library_name);

/// One call of the check: an operation, its keys and its arguments (see the driver,
/// `lua/check.lua`).
pub(super) struct CheckCall {
    pub(super) op: &'static str,
    pub(super) keys: Vec<String>,
    pub(super) args: Vec<String>,
}

/// Loads (or replaces) the library on `connection`: `Functions` when the server took it,
/// `Script` (and why, logged) when it refuses `FUNCTION` as a command it does not know or a
/// right the user lacks. An unreachable server is an error.
pub(super) async fn load(connection: &Connection) -> Result<Engine, StoreError> {
    let mut load = redis::cmd("FUNCTION");
    load.arg("LOAD").arg("REPLACE").arg(LIBRARY.as_str());
    match connection.query::<redis::Value>(&load).await {
        Ok(_) => {
            tracing::debug!(library = %*LIBRARY_NAME, "check library loaded");
            Ok(Engine::Functions)
        }
        // Redis 6 does not know the command; a user without `function|load` may not run it.
        Err(StoreError::Protocol(why) | StoreError::Unavailable(why)) if refused(&why) => {
            tracing::warn!("Redis refused FUNCTION LOAD ({why}): checks run as a script (EVALSHA) instead");
            Ok(Engine::Script)
        }
        Err(e) => Err(e),
    }
}

/// Whether `FUNCTION LOAD` failed for want of the command or of the right to run it.
fn refused(why: &str) -> bool {
    why.contains("unknown command") || why.contains("NOPERM")
}

/// Runs `call` as the connection's engine has it; a library found gone is loaded again and
/// the call sent once more.
pub(super) async fn run<T: FromRedisValue>(
    connection: &Connection,
    script: &Script,
    call: &CheckCall,
) -> Result<T, StoreError> {
    match connection.engine {
        Engine::Script => {
            let mut invocation = script.prepare_invoke();
            invocation.arg(call.op);
            for arg in &call.args {
                invocation.arg(arg);
            }
            for key in &call.keys {
                invocation.key(key);
            }
            connection.decide(&invocation).await
        }
        Engine::Functions => {
            let fcall = fcall(call);
            match connection.decide_cmd(&fcall).await {
                Err(StoreError::Protocol(why)) if why.contains("Function not found") => {
                    tracing::info!("the check library is gone from Redis (restarted or flushed): loading it again");
                    load(connection).await?;
                    connection.decide_cmd(&fcall).await
                }
                answer => answer,
            }
        }
    }
}

fn fcall(call: &CheckCall) -> Cmd {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{}_{}", *LIBRARY_NAME, call.op)).arg(call.keys.len());
    for key in &call.keys {
        cmd.arg(key);
    }
    for arg in &call.args {
        cmd.arg(arg);
    }
    cmd
}
