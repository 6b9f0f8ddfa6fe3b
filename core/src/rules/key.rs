//! Store keys of limits.

/// The hash-tagged key prefix of one limit: `sluice:{<rule>:<identity>}`.
///
/// Stores append `:<suffix>`. Everything between the braces is the Redis Cluster hash tag,
/// so all keys of one limit share a slot. The encoding is injective and keeps exactly one
/// pair of braces whatever a client sends: `%`, `{` and `}` are percent-encoded in both
/// parts (`%25`, `%7B`, `%7D`) and `:` in the rule name (`%3A`), so the first `:` inside the
/// braces always ends the rule name. Names and identities without those characters appear
/// as they are.
pub fn limit_key(rule: &str, identity: &str) -> String {
    let mut key = String::with_capacity(rule.len() + identity.len() + 10);
    key.push_str("sluice:{");
    push_escaped(&mut key, rule, true);
    key.push(':');
    push_escaped(&mut key, identity, false);
    key.push('}');
    key
}

fn push_escaped(key: &mut String, part: &str, colon: bool) {
    for c in part.chars() {
        match c {
            '%' => key.push_str("%25"),
            '{' => key.push_str("%7B"),
            '}' => key.push_str("%7D"),
            ':' if colon => key.push_str("%3A"),
            c => key.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::limit_key;

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(limit_key("per-ip", "203.0.113.9"), "sluice:{per-ip:203.0.113.9}");
        assert_eq!(limit_key("per-ip", "2001:db8::1"), "sluice:{per-ip:2001:db8::1}");
        assert_eq!(limit_key("g", "global"), "sluice:{g:global}");
    }

    #[test]
    fn braces_cannot_move_the_hash_tag_and_keys_do_not_collide() {
        let k = limit_key("r", "a}b{c");
        assert_eq!(k, "sluice:{r:a%7Db%7Bc}");
        assert_eq!(k.matches('{').count(), 1);
        assert_eq!(k.matches('}').count(), 1);
        assert!(k.ends_with('}'));
        let pairs = [
            ("a:b", "c"),
            ("a", "b:c"),
            ("r", "x}"),
            ("r", "x%7D"),
            ("r", "x)"),
            ("r%", "x"),
            ("r%25", "x"),
        ];
        let keys: std::collections::BTreeSet<String> = pairs.iter().map(|(r, i)| limit_key(r, i)).collect();
        assert_eq!(keys.len(), pairs.len(), "{keys:?}");
    }
}
