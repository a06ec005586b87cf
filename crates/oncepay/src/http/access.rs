//! Which scope each route needs, one row per route and method of
//! [`super::ROUTES`] (a test checks both tables name the same routes, so a
//! new route cannot be added without saying who may call it). Checked in
//! `authenticate`, before anything is read or written and before the
//! `Idempotency-Key` is looked at: a refused request consumes nothing.

use crate::api_keys::Scope;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No API key (checkout pages, provider webhooks, health, metrics, the
    /// OpenAPI document): they authenticate otherwise, or not at all.
    Public,
    /// A key with this scope.
    Needs(Scope),
}

use Access::{Needs, Public};
use Scope::{Admin, Read, Write};

/// `(path pattern, method, access)`.
pub const ACCESS: &[(&str, &str, Access)] = &[
    ("/orders", "GET", Needs(Read)),
    ("/orders", "POST", Needs(Write)),
    ("/orders/{id}", "GET", Needs(Read)),
    ("/orders/{id}/cancel", "POST", Needs(Write)),
    ("/orders/{id}/payments", "GET", Needs(Read)),
    ("/orders/{id}/checkout", "POST", Needs(Write)),
    ("/checkout/assets/checkout.js", "GET", Public),
    ("/checkout/assets/checkout.css", "GET", Public),
    ("/checkout/{token}", "GET", Public),
    ("/checkout/{token}/status", "GET", Public),
    ("/checkout/{token}/payments", "POST", Public),
    ("/payments", "GET", Needs(Read)),
    ("/payments", "POST", Needs(Write)),
    ("/refunds", "GET", Needs(Read)),
    ("/payments/{id}", "GET", Needs(Read)),
    ("/payments/{id}/refunds", "POST", Needs(Write)),
    ("/refunds/{id}", "GET", Needs(Read)),
    ("/orders/{id}/events", "GET", Needs(Read)),
    ("/payments/{id}/events", "GET", Needs(Read)),
    ("/refunds/{id}/events", "GET", Needs(Read)),
    ("/events", "GET", Needs(Read)),
    ("/events/{id}", "GET", Needs(Read)),
    ("/events/{id}/redeliver", "POST", Needs(Admin)),
    ("/webhook_endpoints", "GET", Needs(Admin)),
    ("/webhook_endpoints", "POST", Needs(Admin)),
    ("/webhook_endpoints/{id}", "DELETE", Needs(Admin)),
    ("/webhooks/{provider}", "POST", Public),
    ("/api_keys", "GET", Needs(Admin)),
    ("/api_keys", "POST", Needs(Admin)),
    ("/api_keys/{id}", "DELETE", Needs(Admin)),
    ("/audit_events", "GET", Needs(Admin)),
    ("/healthz", "GET", Public),
    ("/readyz", "GET", Public),
    ("/metrics", "GET", Public),
    ("/openapi.yaml", "GET", Public),
];

/// The scope a request to `pattern` with `method` needs (`HEAD` as `GET`);
/// `None` for a public route. A route missing here (which the test below
/// forbids) needs `admin`: the safe side.
pub fn required(pattern: &str, method: &str) -> Option<Scope> {
    let method = if method == "HEAD" { "GET" } else { method };
    match ACCESS
        .iter()
        .find(|(p, m, _)| *p == pattern && *m == method)
    {
        Some((_, _, Public)) => None,
        Some((_, _, Needs(scope))) => Some(*scope),
        None => Some(Admin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_method_says_who_may_call_it() {
        let mut routed = Vec::new();
        for (path, allow) in super::super::ROUTES {
            for method in allow.split(", ") {
                routed.push((*path, method));
            }
        }
        let mut listed: Vec<(&str, &str)> = ACCESS.iter().map(|(p, m, _)| (*p, *m)).collect();
        routed.sort_unstable();
        listed.sort_unstable();
        assert_eq!(
            routed, listed,
            "http::ROUTES and http::access::ACCESS differ"
        );
    }
}
