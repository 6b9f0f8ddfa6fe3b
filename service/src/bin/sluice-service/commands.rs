//! The subcommands besides serving: `check-rules` and `explain`.

use sluice_core::rules::check_toml;
use sluice_core::text::visible as shown;
use sluice_service::{admin, grpc, rules_source};

use crate::args::{Args, Command};

/// `check-rules FILE`: the summary on stdout and 0 for a valid file; every problem on
/// stderr, each as `FILE: line N: …`, and 1 otherwise.
pub fn check_rules(file: &std::path::Path, allow_empty: bool) -> i32 {
    let shown = file.display();
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{shown}: cannot read it: {e}");
            return 1;
        }
    };
    let yaml = grpc::config::is_yaml(file);
    let checked = if yaml {
        grpc::config::check(&text)
    } else {
        check_toml(&text).map_err(|problems| problems.iter().map(ToString::to_string).collect())
    };
    let what = if yaml { "descriptor limits" } else { "rules" };
    match checked {
        Ok(0) if !allow_empty => {
            eprintln!(
                "{shown}: holds no rule, which would turn every limit off (a node keeps the rules in force \
                 unless started with --allow-empty-rules; pass it here too if that is meant)"
            );
            1
        }
        Ok(count) => {
            println!("{shown}: valid, {count} {what}");
            0
        }
        Err(problems) => {
            for problem in &problems {
                eprintln!("{shown}: {problem}");
            }
            eprintln!("{shown}: invalid, {} problem(s)", problems.len());
            1
        }
    }
}

/// `explain`: which rules of a file a request matches and why the others do not; 1 when
/// the file or the request is invalid.
pub fn explain(args: &Args) -> i32 {
    let Some(Command::Explain {
        rules,
        path,
        method,
        host,
        ip,
        identities,
        ipv6_prefix,
    }) = &args.command
    else {
        return 1;
    };
    let set = match rules_source::load_file(rules) {
        Ok((set, _)) => set,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let ids: std::collections::BTreeMap<&str, &str> =
        identities.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let body = serde_json::json!({"method": method, "path": path, "host": host, "ip": ip, "identities": ids});
    let serde_json::Value::Object(body) = body else {
        return 1;
    };
    let req = match admin::console::explain_request(body, *ipv6_prefix) {
        Ok(req) => req,
        Err(e) => {
            eprintln!("invalid request: {e}");
            return 1;
        }
    };
    // What a client sent is printed with its hidden characters written out (text::visible).
    println!("path: {}", shown(&req.path));
    if let Some(host) = &req.host {
        println!("host: {}", shown(host));
    }
    for (key, value) in &req.identities {
        println!("identity {}: {}", shown(key), shown(value));
    }
    for (rule, found) in admin::console::explain_matching(&set, &req) {
        match found {
            Ok(identity) => println!(
                "rule {:?}: matches ({}), identity {}",
                rule.name,
                rule.conditions(),
                shown(identity)
            ),
            Err(why) => println!("rule {:?}: no match: {why}", rule.name),
        }
    }
    0
}
