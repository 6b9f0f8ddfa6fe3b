//! Which bucket a request belongs to: its host, or, once a response on the same route
//! named its rate-limit policy, its host and that policy.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use reqwest::Url;

use crate::queue::bucket_key;

/// Routes remembered at most; past that the memory starts over (paths with ids in them
/// would otherwise grow it without end).
const MAX_ROUTES: usize = 1_024;

/// The policy each route (host, port and path) was last seen under.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    learned: Mutex<HashMap<String, String>>,
}

fn route(url: &Url) -> String {
    format!("{}{}", bucket_key(url), url.path())
}

impl Routes {
    /// The bucket of a request to `url`: `"host:port policy"` when a response on this
    /// route advertised a policy, else `"host:port"`.
    pub(crate) fn bucket(&self, url: &Url) -> String {
        let learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        match learned.get(&route(url)) {
            Some(policy) => format!("{} {policy}", bucket_key(url)),
            None => bucket_key(url),
        }
    }

    /// Remembers the policy a response on `url`'s route advertised; when that is new, the
    /// host's bucket and the route's bucket from now on, so that the queue can let the
    /// host bucket's state go to the policy (see `Queues::hand_over`).
    pub(crate) fn learn(&self, url: &Url, policy: Option<&str>) -> Option<(String, String)> {
        let policy = policy?;
        let route = route(url);
        let mut learned = self.learned.lock().unwrap_or_else(PoisonError::into_inner);
        if learned.get(&route).is_some_and(|known| known == policy) {
            return None;
        }
        if learned.len() >= MAX_ROUTES {
            learned.clear();
        }
        learned.insert(route, policy.to_owned());
        let host = bucket_key(url);
        let bucket = format!("{host} {policy}");
        Some((host, bucket))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_joins_the_bucket_of_the_policy_it_was_seen_under() {
        let routes = Routes::default();
        let search: Url = "http://api.test/search?q=1".parse().unwrap();
        let users: Url = "http://api.test/users".parse().unwrap();
        assert_eq!(routes.bucket(&search), "api.test:80");
        let learned = routes.learn(&search, Some("search"));
        assert_eq!(learned, Some(("api.test:80".into(), "api.test:80 search".into())));
        assert_eq!(routes.learn(&search, Some("search")), None, "known already");
        assert_eq!(routes.learn(&users, None), None);
        assert_eq!(routes.bucket(&search), "api.test:80 search");
        assert_eq!(
            routes.bucket(&"http://api.test/search".parse().unwrap()),
            "api.test:80 search"
        );
        assert_eq!(routes.bucket(&users), "api.test:80");
    }

    #[test]
    fn the_memory_is_bounded() {
        let routes = Routes::default();
        for i in 0..=MAX_ROUTES {
            routes.learn(&format!("http://api.test/item/{i}").parse().unwrap(), Some("items"));
        }
        assert!(routes.learned.lock().unwrap().len() <= MAX_ROUTES);
    }
}
