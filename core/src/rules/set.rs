//! A validated rule set: rules ready to match, and the overrides in force.

use std::collections::{BTreeMap, HashMap};

use super::file::RuleFile;
#[cfg(feature = "serde")]
use super::file::{OverrideSpec, RuleSpec};
#[cfg(feature = "serde")]
use super::timestamp::format_rfc3339;
use super::timestamp::{parse_rfc3339, MAX_TIMESTAMP_MS};
use super::validate::{limit_error_field, rule_label, validate_rule, Identity, Rule};
use super::RulesError;
use crate::algorithm::Limit;
use crate::wire::MAX_IDENTITY_BYTES;

/// A temporary limit for one identity under one rule (`[[override]]`, or the admin API).
///
/// The override keeps the rule's algorithm, window, shaping and `max_delay` and replaces
/// its `limit`. The burst keeps the rule's burst-to-limit ratio: a rule with `burst = 0`
/// (capacity = limit) gets capacity = the override's limit; a rule with `burst = b` gets
/// `b × override_limit / limit`, rounded down, at least 1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The name of the rule it applies to.
    pub rule: String,
    /// The identity value (e.g. the user id; `global` for a `by = "global"` rule).
    pub identity: String,
    /// The replacing limit, in cost units per the rule's window.
    pub limit: u64,
    /// When it ends, unix milliseconds: it applies while `now < until_ms`.
    pub until_ms: u64,
}

#[derive(Debug, Clone)]
struct ActiveOverride {
    limit: Limit,
    spec: Override,
}

/// Rules in evaluation order plus the overrides in force.
///
/// Built once per (re)load with `RuleSet::from_toml` (the `toml` feature) or
/// [`RuleSet::from_json`]; the service then calls [`RuleSet::matching`] and
/// [`RuleSet::limit_for`] per request, which neither parse nor allocate. The default set
/// has no rules.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    /// The rules as written, for writing them back (the service's; the filter needs none).
    #[cfg(feature = "serde")]
    specs: Vec<RuleSpec>,
    /// rule name → identity → override.
    overrides: HashMap<String, HashMap<String, ActiveOverride>>,
}

/// 1-based line of byte `offset` in `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end].iter().filter(|&&b| b == b'\n').count() + 1
}

/// The text of line `line` (1-based), trimmed and cut to a readable length.
#[cfg(feature = "toml")]
fn line_text(text: &str, line: usize) -> &str {
    crate::text::truncate(text.lines().nth(line.saturating_sub(1)).unwrap_or("").trim(), 80)
}

impl RuleSet {
    /// Parses and validates a TOML rule file (`[[rule]]` and `[[override]]` tables).
    /// (With the `toml` feature.)
    ///
    /// Syntax errors, wrong types and unknown fields are [`RulesError::Syntax`] with the
    /// line; invalid values are [`RulesError::Rule`] / [`RulesError::Override`] naming the
    /// rule and the field.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<RuleSet, RulesError> {
        let file: RuleFile = toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(1, |s| line_of(text, s.start));
            let mut message = e.message().trim_end().to_owned();
            let snippet = line_text(text, line);
            if e.span().is_some() && !snippet.is_empty() {
                message = format!("{message} (at `{snippet}`)");
            }
            RulesError::Syntax { line, message }
        })?;
        RuleSet::from_file(file)
    }

    /// Parses and validates the same structure as JSON:
    /// `{"rule": [{...}, ...], "override": [{...}, ...]}`, with the same field names and values.
    pub fn from_json(text: &str) -> Result<RuleSet, RulesError> {
        let file = crate::json::parse(text.as_bytes())
            .and_then(|doc| RuleFile::read(&doc))
            .map_err(|e| RulesError::Syntax {
                line: e.offset().map_or(1, |at| line_of(text, at)),
                message: e.to_string(),
            })?;
        RuleSet::from_file(file)
    }

    /// Validates a parsed file.
    pub fn from_file(file: RuleFile) -> Result<RuleSet, RulesError> {
        let mut rules: Vec<Rule> = Vec::with_capacity(file.rules.len());
        for (i, spec) in file.rules.iter().enumerate() {
            let rule = validate_rule(spec, i)?;
            if rules.iter().any(|r| r.name == rule.name) {
                return Err(RulesError::Rule {
                    rule: rule_label(spec, i),
                    field: "name",
                    message: "another rule has the same name; names must be unique".into(),
                });
            }
            rules.push(rule);
        }
        let mut set = RuleSet {
            rules,
            #[cfg(feature = "serde")]
            specs: file.rules,
            overrides: HashMap::new(),
        };
        for (i, o) in file.overrides.iter().enumerate() {
            let fail = |field, message: String| RulesError::Override {
                index: i + 1,
                rule: o.rule.clone(),
                identity: o.identity.clone(),
                field,
                message,
            };
            let until_ms = parse_rfc3339(&o.until).map_err(|m| fail("until", m))?;
            if set.override_of(&o.rule, &o.identity).is_some() {
                return Err(fail(
                    "identity",
                    "another override has the same rule and identity".into(),
                ));
            }
            let spec = Override {
                rule: o.rule.clone(),
                identity: o.identity.clone(),
                limit: o.limit,
                until_ms,
            };
            set.insert_override(spec, i + 1)?;
        }
        Ok(set)
    }

    /// The rule file this set was built from, with the overrides currently held (file ones
    /// and those added at run time, sorted by rule then identity).
    #[cfg(feature = "serde")]
    fn to_file(&self) -> RuleFile {
        let mut overrides: Vec<&Override> = self.overrides().collect();
        overrides.sort_by(|a, b| (&a.rule, &a.identity).cmp(&(&b.rule, &b.identity)));
        RuleFile {
            rules: self.specs.clone(),
            overrides: overrides
                .into_iter()
                .map(|o| OverrideSpec {
                    rule: o.rule.clone(),
                    identity: o.identity.clone(),
                    limit: o.limit,
                    until: format_rfc3339(o.until_ms),
                })
                .collect(),
        }
    }

    /// The set as a TOML rule file that [`RuleSet::from_toml`] reads back to the same set:
    /// the rules as written (defaults left out) and the overrides held. (With the `toml`
    /// feature.)
    #[cfg(feature = "toml")]
    pub fn to_toml(&self) -> String {
        // Serialising plain strings, integers, booleans and arrays of tables cannot fail.
        toml::to_string(&self.to_file()).unwrap_or_default()
    }

    /// The set as JSON that [`RuleSet::from_json`] reads back to the same set. (With the
    /// `serde` feature.)
    #[cfg(feature = "serde")]
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.to_file()).unwrap_or_default()
    }

    /// The rules alone as JSON, without the overrides (which name identities, and which
    /// only the service applies): what a proxy needs to match requests to rules itself.
    /// (With the `serde` feature.)
    #[cfg(feature = "serde")]
    pub fn rules_json(&self) -> String {
        let file = RuleFile {
            rules: self.specs.clone(),
            overrides: Vec::new(),
        };
        serde_json::to_string(&file).unwrap_or_default()
    }

    /// The rules in evaluation (file) order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| r.name == name)
    }

    /// The overrides held, in no particular order, including ended ones not yet dropped by
    /// [`RuleSet::expire_overrides`].
    pub fn overrides(&self) -> impl Iterator<Item = &Override> {
        self.overrides.values().flat_map(HashMap::values).map(|o| &o.spec)
    }

    fn override_of(&self, rule: &str, identity: &str) -> Option<&ActiveOverride> {
        self.overrides.get(rule)?.get(identity)
    }

    /// The rules that apply to a request, in rule-file order, each with the identity value
    /// it limits by.
    ///
    /// A rule applies when the request carries its identity (a missing or empty value skips
    /// the rule; `global` rules always apply, with identity `"global"`), its path glob
    /// matches `path`, its methods (if any) contain `method` (ignoring case), and, when it
    /// names a `tier`, the request's `tier` identity equals it; a rule naming `hosts` never
    /// applies here (no host is known: see [`RuleSet::matching_host`]). Allocates nothing.
    pub fn matching<'a>(
        &'a self,
        identities: &'a BTreeMap<String, String>,
        method: &'a str,
        path: &'a str,
    ) -> impl Iterator<Item = (&'a Rule, &'a str)> + 'a {
        self.matching_host(identities, method, None, path)
    }

    /// [`RuleSet::matching`] for a request to `host` (its `Host`/`:authority`, port and
    /// case ignored): rules naming `hosts` apply when one of them is it.
    pub fn matching_host<'a>(
        &'a self,
        identities: &'a BTreeMap<String, String>,
        method: &'a str,
        host: Option<&'a str>,
        path: &'a str,
    ) -> impl Iterator<Item = (&'a Rule, &'a str)> + 'a {
        self.rules
            .iter()
            .filter_map(move |rule| Some((rule, rule.explain(identities, method, host, path).ok()?)))
    }

    /// Whether no rule looks at a request's method, host or path ([`Rule::ignores_target`]):
    /// [`RuleSet::matching_host`] then answers the same whatever they are, and a proxy
    /// need not read them to match a request.
    pub fn ignores_target(&self) -> bool {
        self.rules.iter().all(Rule::ignores_target)
    }

    /// The limit for `identity` under `rule` at `now_ms` (unix ms): the override's while
    /// `now_ms < until_ms`, else the rule's own. Allocates nothing.
    pub fn limit_for(&self, rule: &Rule, identity: &str, now_ms: u64) -> Limit {
        if self.overrides.is_empty() {
            return rule.limit;
        }
        match self.override_of(&rule.name, identity) {
            Some(o) if now_ms < o.spec.until_ms => o.limit,
            _ => rule.limit,
        }
    }

    /// Adds an override, or replaces the one for the same rule and identity, after checking
    /// it: the rule exists, the identity is 1 to 256 bytes (`global` for a global rule),
    /// `until_ms` is at most [`MAX_TIMESTAMP_MS`] and the limit is valid for the rule.
    pub fn add_override(&mut self, o: Override) -> Result<(), RulesError> {
        self.insert_override(o, 0)
    }

    /// Removes the override for (`rule`, `identity`); whether there was one.
    pub fn remove_override(&mut self, rule: &str, identity: &str) -> bool {
        let Some(m) = self.overrides.get_mut(rule) else {
            return false;
        };
        let removed = m.remove(identity).is_some();
        if m.is_empty() {
            self.overrides.remove(rule);
        }
        removed
    }

    /// Drops overrides that have ended at `now_ms` (`until_ms <= now_ms`); returns how many.
    pub fn expire_overrides(&mut self, now_ms: u64) -> usize {
        let mut removed = 0;
        for m in self.overrides.values_mut() {
            let before = m.len();
            m.retain(|_, o| o.spec.until_ms > now_ms);
            removed += before - m.len();
        }
        self.overrides.retain(|_, m| !m.is_empty());
        removed
    }

    fn insert_override(&mut self, o: Override, index: usize) -> Result<(), RulesError> {
        let fail = |field, message: String| RulesError::Override {
            index,
            rule: o.rule.clone(),
            identity: o.identity.clone(),
            field,
            message,
        };
        let Some(rule) = self.rule(&o.rule) else {
            return Err(fail("rule", "no rule has this name".into()));
        };
        if o.identity.is_empty() || o.identity.len() > MAX_IDENTITY_BYTES {
            return Err(fail("identity", format!("must be 1 to {MAX_IDENTITY_BYTES} bytes")));
        }
        if rule.by == Identity::Global && o.identity != "global" {
            return Err(fail(
                "identity",
                "the rule limits by global: its only identity is \"global\"".into(),
            ));
        }
        if o.until_ms > MAX_TIMESTAMP_MS {
            return Err(fail(
                "until",
                format!("{} is after 9999-12-31T23:59:59.999Z", o.until_ms),
            ));
        }
        let base = rule.limit;
        let burst = if base.capacity() == base.limit() {
            0
        } else {
            let scaled = u128::from(base.capacity()) * u128::from(o.limit) / u128::from(base.limit());
            u64::try_from(scaled).unwrap_or(u64::MAX).max(1)
        };
        let limit = Limit::builder(base.algorithm(), o.limit, base.window())
            .burst(burst)
            .shaping(base.shaping().then_some(base.max_delay()))
            .build()
            .map_err(|e| {
                // The override has no burst of its own: a too-large scaled burst means its limit is too large.
                let field = match limit_error_field(&e) {
                    "burst" => "limit",
                    f => f,
                };
                fail(field, e.to_string())
            })?;
        self.overrides
            .entry(o.rule.clone())
            .or_default()
            .insert(o.identity.clone(), ActiveOverride { limit, spec: o });
        Ok(())
    }
}
