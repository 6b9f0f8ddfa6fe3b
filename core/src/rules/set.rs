//! A validated rule set: rules ready to match, and the overrides in force.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use super::duration::parse_duration;
use super::file::{OverrideSpec, RuleFile, RuleSpec};
use super::glob::Glob;
use super::timestamp::parse_rfc3339;
use super::RulesError;
use crate::algorithm::{Algorithm, Limit, LimitError, MICROS_PER_MS};

/// What a rule limits by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The client IP.
    Ip,
    /// The authenticated user.
    User,
    /// The API key.
    ApiKey,
    /// The plan tier.
    Tier,
    /// Any other identity the proxy extracts, named `header:<name>` on the wire.
    Header(String),
    /// One bucket for everyone.
    Global,
}

impl Identity {
    fn parse(s: &str) -> Result<Identity, String> {
        Ok(match s {
            "ip" => Identity::Ip,
            "user" => Identity::User,
            "api_key" => Identity::ApiKey,
            "tier" => Identity::Tier,
            "global" => Identity::Global,
            _ => match s.strip_prefix("header:") {
                Some(name) if !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic()) => {
                    Identity::Header(format!("header:{}", name.to_ascii_lowercase()))
                }
                _ => {
                    return Err(format!(
                        "{s:?} is not an identity: use ip, user, api_key, tier, header:<name> or global"
                    ))
                }
            },
        })
    }

    /// The key of this identity in a check request's `identities`.
    pub fn key(&self) -> &str {
        match self {
            Identity::Ip => "ip",
            Identity::User => "user",
            Identity::ApiKey => "api_key",
            Identity::Tier => "tier",
            Identity::Header(key) => key,
            Identity::Global => "global",
        }
    }
}

/// What a rule does when the counter store is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureMode {
    /// Decide from a local fallback bucket.
    Open,
    /// Deny.
    Closed,
}

/// One validated rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Unique name; the policy name in headers.
    pub name: String,
    /// What it limits by.
    pub by: Identity,
    /// Path glob.
    pub path: Glob,
    /// Upper-case methods; empty means all.
    pub methods: Vec<String>,
    /// Required tier, if any.
    pub tier: Option<String>,
    /// The validated limit.
    pub limit: Limit,
    /// The window in milliseconds (for headers).
    pub window_ms: u64,
    /// Store-failure policy.
    pub failure: FailureMode,
    /// Count, never deny.
    pub shadow: bool,
}

impl Rule {
    fn applies(&self, identities: &BTreeMap<String, String>, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m.eq_ignore_ascii_case(method)))
            && self.tier.as_ref().is_none_or(|t| identities.get("tier") == Some(t))
            && self.path.matches(path)
    }
}

/// A temporary limit for one identity under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The rule it applies to.
    pub rule: String,
    /// The identity value.
    pub identity: String,
    /// The replacing limit.
    pub limit: u64,
    /// When it ends, unix ms.
    pub until_ms: u64,
}

#[derive(Debug, Clone)]
struct ActiveOverride {
    limit: Limit,
    until_ms: u64,
    spec: Override,
}

/// Rules in evaluation order plus the overrides in force.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    specs: Vec<RuleSpec>,
    /// rule name → identity → override.
    overrides: HashMap<String, HashMap<String, ActiveOverride>>,
}

fn rule_label(spec: &RuleSpec, index: usize) -> String {
    if spec.name.is_empty() {
        format!("#{}", index + 1)
    } else {
        format!("{:?}", spec.name)
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text.get(..offset)
        .map_or(1, |t| t.lines().count().max(1) + usize::from(t.ends_with('\n')))
}

impl RuleSet {
    /// Parses and validates a TOML rule file.
    pub fn from_toml(text: &str) -> Result<RuleSet, RulesError> {
        let file: RuleFile = toml::from_str(text).map_err(|e| RulesError::Syntax {
            line: e.span().map_or(1, |s| line_of(text, s.start)),
            message: e.message().to_owned(),
        })?;
        RuleSet::from_file(file)
    }

    /// Parses and validates the same structure as JSON (`{"rule": [...], "override": [...]}`).
    pub fn from_json(text: &str) -> Result<RuleSet, RulesError> {
        let file: RuleFile = serde_json::from_str(text).map_err(|e| RulesError::Syntax {
            line: e.line().max(1),
            message: e.to_string(),
        })?;
        RuleSet::from_file(file)
    }

    /// Validates a parsed file.
    pub fn from_file(file: RuleFile) -> Result<RuleSet, RulesError> {
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, spec) in file.rules.iter().enumerate() {
            let rule = validate_rule(spec, i)?;
            if rules.iter().any(|r: &Rule| r.name == rule.name) {
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
            specs: file.rules,
            overrides: HashMap::new(),
        };
        for (i, o) in file.overrides.iter().enumerate() {
            let until_ms = parse_rfc3339(&o.until).map_err(|message| RulesError::Override {
                index: i + 1,
                rule: o.rule.clone(),
                identity: o.identity.clone(),
                field: "until",
                message,
            })?;
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

    /// The rule file this set was built from, overrides included, as TOML.
    pub fn to_toml(&self) -> String {
        let mut overrides: Vec<&ActiveOverride> = self.overrides.values().flat_map(HashMap::values).collect();
        overrides.sort_by(|a, b| (&a.spec.rule, &a.spec.identity).cmp(&(&b.spec.rule, &b.spec.identity)));
        let file = RuleFile {
            rules: self.specs.clone(),
            overrides: overrides
                .into_iter()
                .map(|o| OverrideSpec {
                    rule: o.spec.rule.clone(),
                    identity: o.spec.identity.clone(),
                    limit: o.spec.limit,
                    until: super::format_rfc3339(o.spec.until_ms),
                })
                .collect(),
        };
        toml::to_string(&file).unwrap_or_else(|e| {
            let mut s = String::new();
            let _ = write!(s, "# cannot serialise rules: {e}");
            s
        })
    }

    /// The rules in evaluation order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The overrides in force or pending expiry.
    pub fn overrides(&self) -> impl Iterator<Item = &Override> {
        self.overrides.values().flat_map(HashMap::values).map(|o| &o.spec)
    }

    /// The rules that apply to a request, each with the identity value it limits by.
    pub fn matching<'a>(
        &'a self,
        identities: &'a BTreeMap<String, String>,
        method: &'a str,
        path: &'a str,
    ) -> impl Iterator<Item = (&'a Rule, &'a str)> + 'a {
        self.rules.iter().filter_map(move |rule| {
            let identity = match &rule.by {
                Identity::Global => "global",
                by => identities.get(by.key())?.as_str(),
            };
            rule.applies(identities, method, path).then_some((rule, identity))
        })
    }

    /// The limit for `identity` under `rule` at `now_ms`: an unexpired override's, else the rule's.
    pub fn limit_for(&self, rule: &Rule, identity: &str, now_ms: u64) -> Limit {
        if self.overrides.is_empty() {
            return rule.limit;
        }
        match self.overrides.get(&rule.name).and_then(|m| m.get(identity)) {
            Some(o) if now_ms < o.until_ms => o.limit,
            _ => rule.limit,
        }
    }

    /// Adds or replaces an override, validated against its rule.
    pub fn add_override(&mut self, o: Override) -> Result<(), RulesError> {
        self.insert_override(o, 0)
    }

    /// Removes the override for (`rule`, `identity`); whether there was one.
    pub fn remove_override(&mut self, rule: &str, identity: &str) -> bool {
        self.overrides.get_mut(rule).and_then(|m| m.remove(identity)).is_some()
    }

    /// Drops overrides that ended before `now_ms`.
    pub fn expire_overrides(&mut self, now_ms: u64) {
        for m in self.overrides.values_mut() {
            m.retain(|_, o| o.until_ms > now_ms);
        }
        self.overrides.retain(|_, m| !m.is_empty());
    }

    fn insert_override(&mut self, o: Override, index: usize) -> Result<(), RulesError> {
        let fail = |field, message: String| RulesError::Override {
            index,
            rule: o.rule.clone(),
            identity: o.identity.clone(),
            field,
            message,
        };
        let Some(rule) = self.rules.iter().find(|r| r.name == o.rule) else {
            return Err(fail("rule", "no rule has this name".into()));
        };
        if o.identity.is_empty() || o.identity.len() > 256 {
            return Err(fail("identity", "must be 1 to 256 bytes".into()));
        }
        let base = rule.limit;
        // The override scales the burst with the limit, so a rule whose burst is twice its
        // limit keeps that shape.
        let burst = if base.capacity() == base.limit() {
            0
        } else {
            (u128::from(base.capacity()) * u128::from(o.limit) / u128::from(base.limit())).max(1) as u64
        };
        let limit = Limit::new(
            base.algorithm(),
            o.limit,
            base.window(),
            burst,
            base.shaping(),
            base.max_delay(),
        )
        .map_err(|e| fail("limit", e.to_string()))?;
        let active = ActiveOverride {
            limit,
            until_ms: o.until_ms,
            spec: o.clone(),
        };
        self.overrides
            .entry(o.rule.clone())
            .or_default()
            .insert(o.identity.clone(), active);
        Ok(())
    }
}

fn validate_rule(spec: &RuleSpec, index: usize) -> Result<Rule, RulesError> {
    let fail = |field, message: String| RulesError::Rule {
        rule: rule_label(spec, index),
        field,
        message,
    };
    if spec.name.trim().is_empty() {
        return Err(fail("name", "must not be empty".into()));
    }
    if spec.name.len() > 128 || spec.name.chars().any(char::is_control) {
        return Err(fail("name", "must be at most 128 printable characters".into()));
    }
    let by = Identity::parse(&spec.by).map_err(|m| fail("by", m))?;
    let algorithm: Algorithm = spec
        .algorithm
        .parse()
        .map_err(|e: crate::algorithm::UnknownAlgorithm| fail("algorithm", e.to_string()))?;
    let window_ms = parse_duration(&spec.window).map_err(|m| fail("window", m))?;
    if window_ms == 0 {
        return Err(fail("window", "must be at least 1ms".into()));
    }
    let max_delay_ms = parse_duration(&spec.max_delay).map_err(|m| fail("max_delay", m))?;
    if spec.shaping && algorithm != Algorithm::LeakyBucket {
        return Err(fail("shaping", format!("only leaky_bucket can shape, not {algorithm}")));
    }
    let failure = match spec.failure.as_str() {
        "open" => FailureMode::Open,
        "closed" => FailureMode::Closed,
        other => return Err(fail("failure", format!("{other:?} is not open or closed"))),
    };
    let mut methods = Vec::with_capacity(spec.methods.len());
    for m in &spec.methods {
        if m.is_empty() || m.len() > 16 || !m.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(fail("methods", format!("{m:?} is not an HTTP method")));
        }
        methods.push(m.to_ascii_uppercase());
    }
    let limit = Limit::new(
        algorithm,
        spec.limit,
        window_ms * MICROS_PER_MS,
        spec.burst,
        spec.shaping,
        max_delay_ms * MICROS_PER_MS,
    )
    .map_err(|e| {
        let field = match &e {
            LimitError::ZeroLimit | LimitError::TooFast { .. } => "limit",
            LimitError::BadWindow => "window",
            LimitError::TooLarge { field, .. } => field,
        };
        fail(field, e.to_string())
    })?;
    Ok(Rule {
        name: spec.name.clone(),
        by,
        path: Glob::new(&spec.path),
        methods,
        tier: spec.tier.clone(),
        limit,
        window_ms,
        failure,
        shadow: spec.shadow,
    })
}

/// The hash-tagged key prefix of one limit: `sluice:{<rule>:<identity>}`.
///
/// Braces in names are replaced so that a client's identity cannot move the hash tag;
/// stores append `:<suffix>`.
pub fn limit_key(rule: &str, identity: &str) -> String {
    let mut key = String::with_capacity(rule.len() + identity.len() + 10);
    key.push_str("sluice:{");
    for c in rule.chars().chain(std::iter::once(':')).chain(identity.chars()) {
        key.push(match c {
            '{' => '(',
            '}' => ')',
            c => c,
        });
    }
    key.push('}');
    key
}
