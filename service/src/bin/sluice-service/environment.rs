//! No silent configuration: every `SLUICE_*` variable in the node's environment must be one a
//! flag reads. A misspelt name, or a secret given inline where only its `_FILE` form exists,
//! would otherwise be ignored, and the node would start with a default (open, unguarded)
//! where its operator meant a setting.

use std::collections::BTreeSet;
use std::ffi::OsString;

use clap::CommandFactory;

use crate::args::Args;

/// The prefix of the node's own variables.
const PREFIX: &str = "SLUICE_";

/// Every variable a flag of `sluice-service` (or of one of its subcommands) reads.
fn known() -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut stack = vec![Args::command()];
    while let Some(command) = stack.pop() {
        for arg in command.get_arguments() {
            if let Some(env) = arg.get_env() {
                names.insert(env.to_string_lossy().into_owned());
            }
        }
        stack.extend(command.get_subcommands().cloned());
    }
    names
}

/// Checks `vars` (the process's environment): the first `SLUICE_*` variable no flag reads is
/// an error naming it and what to do instead.
pub fn check(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Result<(), String> {
    let known = known();
    let mut unknown: Vec<String> = vars
        .into_iter()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .filter(|name| name.starts_with(PREFIX) && !known.contains(name))
        .collect();
    unknown.sort();
    match unknown.first() {
        None => Ok(()),
        Some(name) => Err(explain(name, &known)),
    }
}

/// Why `name` is refused, and the fix.
fn explain(name: &str, known: &BTreeSet<String>) -> String {
    let file = format!("{name}_FILE");
    if known.contains(&file) {
        return format!(
            "{name} is set, but a secret is read only from a file: write it to a file and set {file} to its path"
        );
    }
    if is_service_link(name) {
        return format!(
            "{name} is not a setting of sluice-service: Kubernetes adds it for a Service named sluice; \
             set `enableServiceLinks: false` in the pod's spec (deploy/sluice/deployment.yaml does)"
        );
    }
    let nearest = known
        .iter()
        .min_by_key(|k| strsim::levenshtein(name, k))
        .map(|k| format!(" (did you mean {k}?)"))
        .unwrap_or_default();
    format!("{name} is not a setting of sluice-service{nearest}; `sluice-service --help` lists every SLUICE_* variable")
}

/// Whether `name` has the shape of a variable Kubernetes' service links add for a Service
/// `sluice` or `sluice-*`: `SLUICE[_X]_SERVICE_HOST`, `SLUICE[_X]_SERVICE_PORT[_P]`,
/// `SLUICE[_X]_PORT[_N_TCP[_…]]`.
fn is_service_link(name: &str) -> bool {
    name.contains("_SERVICE_HOST")
        || name.contains("_SERVICE_PORT")
        || name.ends_with("_PORT")
        || name
            .split("_PORT_")
            .nth(1)
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(names: &[&str]) -> Vec<(OsString, OsString)> {
        names.iter().map(|n| (OsString::from(n), OsString::from("x"))).collect()
    }

    #[test]
    fn every_flags_variable_and_other_prefixes_pass() {
        let all: Vec<String> = known().into_iter().collect();
        assert!(all.contains(&"SLUICE_STORE".to_owned()), "{all:?}");
        assert!(all.contains(&"SLUICE_DATA_TOKEN_FILE".to_owned()), "{all:?}");
        let mut vars: Vec<&str> = all.iter().map(String::as_str).collect();
        vars.extend(["HOSTNAME", "RUST_LOG", "SLUICEWAY", "OTEL_BSP_SCHEDULE_DELAY"]);
        assert_eq!(check(env(&vars)), Ok(()));
    }

    #[test]
    fn a_misspelt_variable_is_named_with_the_nearest_known_one() {
        let said = check(env(&["SLUICE_STORE", "SLUICE_STROE_TIMEOUT_MS"])).expect_err("misspelt");
        assert!(said.starts_with("SLUICE_STROE_TIMEOUT_MS is not a setting"), "{said}");
        assert!(said.contains("did you mean SLUICE_STORE_TIMEOUT_MS?"), "{said}");
    }

    #[test]
    fn an_inline_secret_is_refused_for_its_file_form() {
        for (inline, file) in [
            ("SLUICE_DATA_TOKEN", "SLUICE_DATA_TOKEN_FILE"),
            ("SLUICE_STORE_PASSWORD", "SLUICE_STORE_PASSWORD_FILE"),
        ] {
            let said = check(env(&[inline])).expect_err("inline secret");
            assert!(said.contains("read only from a file"), "{said}");
            assert!(said.contains(&format!("set {file} to its path")), "{said}");
        }
    }

    #[test]
    fn kubernetes_service_links_are_explained() {
        for name in [
            "SLUICE_SERVICE_HOST",
            "SLUICE_SERVICE_PORT_HTTP",
            "SLUICE_PORT",
            "SLUICE_PORT_8081_TCP_ADDR",
            "SLUICE_ADMIN_SERVICE_HOST",
        ] {
            let said = check(env(&[name])).expect_err(name);
            assert!(said.contains("enableServiceLinks: false"), "{name}: {said}");
        }
        let said = check(env(&["SLUICE_PORTS"])).expect_err("not a link");
        assert!(!said.contains("enableServiceLinks"), "{said}");
    }
}
