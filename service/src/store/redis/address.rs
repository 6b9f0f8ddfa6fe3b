//! Where the Redis store is: the URL forms `--store` and `--global-store` accept, parsed
//! here (the redis crate knows neither a cluster's seed list nor Sentinel's), and shown
//! without their password.
//!
//! ```text
//! redis[s]://[USER[:PASSWORD]@]HOST[:PORT][/DB]              one server
//! redis[s]+cluster://[USER[:PASSWORD]@]H1[:P1],H2[:P2],...     a Redis Cluster (seed nodes)
//! redis[s]+sentinel://[USER[:PASSWORD]@]S1[:P1],S2[:P2]/MASTER the master Sentinel names
//! ```
//!
//! `rediss` means TLS (to the sentinels too). USER and PASSWORD are the data servers'
//! (percent-encoded); a password is better given in a file (`--store-password-file`), where
//! `ps` and logs do not see it. Ports default to 6379, and to 26379 for sentinels.

use std::fmt;

use percent_encoding::percent_decode_str;

/// How the servers of an address are deployed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deployment {
    /// One server (a primary, or a managed endpoint that fails over behind one name).
    Single {
        /// The logical database.
        db: i64,
    },
    /// A Redis Cluster, found through its seed nodes.
    Cluster,
    /// The master that these sentinels name `master`, followed across failovers.
    Sentinel {
        /// The name the sentinels monitor it under.
        master: String,
    },
}

/// A parsed store address, in one of these forms (`rediss` for TLS):
///
/// ```text
/// redis://[USER[:PASSWORD]@]HOST[:PORT][/DB]
/// redis+cluster://[USER[:PASSWORD]@]H1[:P1],H2[:P2],...
/// redis+sentinel://[USER[:PASSWORD]@]S1[:P1],S2[:P2]/MASTER
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Address {
    /// Single server, cluster or Sentinel.
    pub deployment: Deployment,
    /// Whether to speak TLS (`rediss`).
    pub tls: bool,
    /// The server, the seed nodes or the sentinels, as host and port.
    pub hosts: Vec<(String, u16)>,
    /// The ACL user, if any (Redis's `default` user otherwise).
    pub username: Option<String>,
    /// The password given in the URL, if any.
    pub password: Option<String>,
}

/// Why an address cannot be used, in words that say how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}; the forms are redis://HOST:PORT, redis+cluster://H1:P1,H2:P2 and redis+sentinel://S1:P1,S2:P2/MASTER (rediss for TLS)")]
pub struct AddressError(String);

impl Address {
    /// Parses one of the forms in the module documentation.
    pub fn parse(url: &str) -> Result<Address, AddressError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| AddressError(format!("{:?} is not a Redis address", redact(url))))?;
        let (tls, kind) = match scheme {
            "redis" => (false, ""),
            "rediss" => (true, ""),
            "redis+cluster" => (false, "cluster"),
            "rediss+cluster" => (true, "cluster"),
            "redis+sentinel" => (false, "sentinel"),
            "rediss+sentinel" => (true, "sentinel"),
            other => return Err(AddressError(format!("unknown scheme {other:?}"))),
        };
        if rest.contains(['?', '#']) {
            return Err(AddressError("a store address takes no query or fragment".into()));
        }
        let (userinfo, rest) = match rest.rsplit_once('@') {
            Some((userinfo, rest)) => (Some(userinfo), rest),
            None => (None, rest),
        };
        let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
        let default_port = if kind == "sentinel" { 26379 } else { 6379 };
        let hosts = hosts
            .split(',')
            .map(|h| host_port(h.trim(), default_port))
            .collect::<Result<Vec<_>, _>>()?;
        let deployment = match kind {
            "cluster" if path.is_empty() => Deployment::Cluster,
            "cluster" => return Err(AddressError("a cluster address has no path".into())),
            "sentinel" if !path.is_empty() && !path.contains('/') => Deployment::Sentinel {
                master: decode(path, "master name")?,
            },
            "sentinel" => return Err(AddressError("a Sentinel address ends with /MASTER_NAME".into())),
            _ if hosts.len() > 1 => {
                return Err(AddressError(
                    "a single-server address names one host: use redis+cluster:// or redis+sentinel:// for several"
                        .into(),
                ))
            }
            _ => Deployment::Single {
                db: match path {
                    "" => 0,
                    db => db
                        .parse()
                        .map_err(|_| AddressError(format!("{db:?} is not a database number")))?,
                },
            },
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, password) = match info.split_once(':') {
                    Some((user, password)) => (user, Some(decode(password, "password")?)),
                    None => (info, None),
                };
                let user = Some(decode(user, "user")?).filter(|u| !u.is_empty());
                (user, password)
            }
        };
        Ok(Address {
            deployment,
            tls,
            hosts,
            username,
            password,
        })
    }
}

/// `host[:port]` or `[v6]:port`.
fn host_port(text: &str, default_port: u16) -> Result<(String, u16), AddressError> {
    let bad = || AddressError(format!("{text:?} is not HOST:PORT"));
    let (host, port) = match text.strip_prefix('[') {
        Some(v6) => {
            let (host, rest) = v6.split_once(']').ok_or_else(bad)?;
            (host, rest.strip_prefix(':'))
        }
        None => match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        },
    };
    // A name or an address: no control characters, no spaces (found by the fuzz target
    // `redis_address`: a host of three NULs was taken, and shown).
    if host.is_empty() || host.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad());
    }
    let port = port.map_or(Ok(default_port), |p| p.parse().map_err(|_| bad()))?;
    if port == 0 {
        // Nothing listens on port 0 (found by the fuzz target `redis_address`: "h:00").
        return Err(AddressError(format!("{text:?}: port 0 is no port")));
    }
    Ok((host.to_owned(), port))
}

fn decode(text: &str, what: &str) -> Result<String, AddressError> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| AddressError(format!("the {what} is not UTF-8 once percent-decoded")))
}

/// `url` with any password replaced by `***`, for messages about an address that did not
/// parse.
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    match url[start..].rsplit_once('@') {
        Some((info, hosts)) => match info.split_once(':') {
            Some((user, _)) => format!("{}{user}:***@{hosts}", &url[..start]),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// The address as a URL, its password shown as `***`: safe for logs.
impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "s" } else { "" };
        let kind = match self.deployment {
            Deployment::Single { .. } => "",
            Deployment::Cluster => "+cluster",
            Deployment::Sentinel { .. } => "+sentinel",
        };
        write!(f, "redis{s}{kind}://")?;
        match (&self.username, &self.password) {
            (Some(user), Some(_)) => write!(f, "{user}:***@")?,
            (None, Some(_)) => write!(f, ":***@")?,
            (Some(user), None) => write!(f, "{user}@")?,
            (None, None) => {}
        }
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|(h, p)| {
                if h.contains(':') {
                    format!("[{h}]:{p}")
                } else {
                    format!("{h}:{p}")
                }
            })
            .collect();
        write!(f, "{}", hosts.join(","))?;
        match &self.deployment {
            Deployment::Single { db: 0 } | Deployment::Cluster => Ok(()),
            Deployment::Single { db } => write!(f, "/{db}"),
            Deployment::Sentinel { master } => write!(f, "/{master}"),
        }
    }
}

/// Like `Display`: never shows the password.
impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_parses_and_shows_no_password() {
        let a = Address::parse("rediss://app:s%40cret@cache.example:6380/2").unwrap();
        assert_eq!(a.deployment, Deployment::Single { db: 2 });
        assert!(a.tls);
        assert_eq!(a.hosts, vec![("cache.example".to_owned(), 6380)]);
        assert_eq!(a.username.as_deref(), Some("app"));
        assert_eq!(a.password.as_deref(), Some("s@cret"));
        assert_eq!(a.to_string(), "rediss://app:***@cache.example:6380/2");
        assert_eq!(format!("{a:?}"), a.to_string());

        let c = Address::parse("redis+cluster://10.0.0.1:7000, 10.0.0.2").unwrap();
        assert_eq!(c.deployment, Deployment::Cluster);
        assert_eq!(c.hosts[1], ("10.0.0.2".to_owned(), 6379));

        let s = Address::parse("rediss+sentinel://:pw@[::1]:5000,s2/mymaster").unwrap();
        assert_eq!(
            s.deployment,
            Deployment::Sentinel {
                master: "mymaster".into()
            }
        );
        assert_eq!(s.hosts, vec![("::1".to_owned(), 5000), ("s2".to_owned(), 26379)]);
        assert_eq!(s.username, None);
        assert_eq!(s.to_string(), "rediss+sentinel://:***@[::1]:5000,s2:26379/mymaster");
    }

    #[test]
    fn bad_addresses_say_what_is_wrong_without_the_password() {
        let cases = [
            ("memcached://h:1", "unknown scheme"),
            ("redis://a:1,b:2", "names one host"),
            ("redis+sentinel://s1:1", "ends with /MASTER_NAME"),
            ("redis+cluster://a:1/0", "no path"),
            ("redis://h:port", "is not HOST:PORT"),
            ("redis+cluster://u:hunter2@a:00,b:1", "port 0 is no port"),
            ("redis+sentinel://u:hunter2@\0\0,s2/m", "is not HOST:PORT"),
            ("redis://h:1/x", "not a database number"),
            ("redis://h:1?tls=1", "no query"),
            ("u:hunter2@h:1", "not a Redis address"),
        ];
        for (url, expected) in cases {
            let e = Address::parse(url).unwrap_err().to_string();
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("hunter2"), "{url}: {e}");
        }
        assert_eq!(redact("redis://u:hunter2@h:1"), "redis://u:***@h:1");
    }
}
