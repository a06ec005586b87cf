//! Every route of the API, declared once: its path, method, handler, who
//! may call it and whether it takes an `Idempotency-Key`. The router
//! ([`super::routes`]), the access check ([`access`]) and
//! the tests that hold the table to `openapi.yaml` and to the service's
//! behaviour all read [`ROUTES`]: a route cannot be added without saying
//! who may call it, and one documented but not routed (or routed but not
//! documented) fails `every_route_is_documented_and_every_documented_operation_is_routed`.
//!
//! Who may call a route is one declaration, [`Access`], for every kind of
//! caller: a key by its scopes, a seller's token as a key with `read` and
//! `write`, a customer's token only where the route says how what it
//! touches is its own ([`Customers`]).

use super::{
    api_keys, balances, checkout, events, inbound, inventory, lists, ops, resources,
    webhook_endpoints,
};
use crate::api_keys::Scope::{self, Admin, Read, Write};

/// Who may call a route. Checked in `authenticate`, before anything is
/// read or written and before the `Idempotency-Key` is looked at: a
/// refused request consumes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No API key (checkout pages, provider webhooks, health, metrics, the
    /// OpenAPI document): they authenticate otherwise, or not at all.
    Public,
    /// A key with this scope (a seller's token holds `read` and `write`),
    /// and customers' tokens as the second part says.
    Needs(Scope, Customers),
}

use Access::{Needs, Public};

/// Whether a customer's token may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Customers {
    /// Never: `403 insufficient_scope` before anything is read (refunds,
    /// disputes, events, webhook endpoints, keys, the audit trail).
    Refused,
    /// For what it owns, checked as said.
    Owning(Ownership),
}

use Customers::{Owning, Refused};

/// How a customer's ownership of what a route touches is checked. An
/// order's `customer_id` must be the token's `sub`; another customer's
/// object answers `404`, as another merchant's does (no enumeration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// The path's `{id}` is an order: checked before anything else.
    OrderInPath,
    /// The path's `{id}` is a payment, whose order is checked.
    PaymentInPath,
    /// The body's `customer_id` must be the token's `sub` (`403
    /// not_owner` otherwise): a customer orders only for itself.
    CustomerInBody,
    /// The body's `order_id` is an order, checked before the command runs.
    OrderInBody,
    /// A list: its `customer_id` filter is forced to the token's `sub`.
    OwnList,
    /// The path's `{customer_id}` must be the token's `sub` (`403
    /// not_owner` otherwise): a customer reads only its own balance.
    CustomerInPath,
}

use Ownership::{CustomerInBody, CustomerInPath, OrderInBody, OrderInPath, OwnList, PaymentInPath};

/// Whether a route takes an `Idempotency-Key`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Required (`400 idempotency_key_missing` without one): every `POST`
    /// that creates or changes something.
    Required,
    /// A `POST` that needs none, and why.
    Exempt(&'static str),
    /// None: a read, or a `DELETE` (repeating it changes nothing more).
    Unused,
}

use Key::{Exempt, Required, Unused};

/// One route and method.
#[derive(Clone, Copy)]
pub struct Route {
    /// The path pattern, as `openapi.yaml` writes it.
    pub path: &'static str,
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Whether it takes an `Idempotency-Key`.
    pub key: Key,
    /// Binds the handler to the method's route.
    pub(super) handler: fn(actix_web::Route) -> actix_web::Route,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

const fn route(
    method: &'static str,
    path: &'static str,
    access: Access,
    key: Key,
    handler: fn(actix_web::Route) -> actix_web::Route,
) -> Route {
    Route {
        path,
        method,
        access,
        key,
        handler,
    }
}

const DEDUPLICATED_DELIVERY: &str =
    "its only effect is a delivery that receivers deduplicate by the event's id";
const SIGNED_EVENT: &str = "signed by the provider and deduplicated by the provider's event id";

/// Every route of the API, in the order they are registered.
pub const ROUTES: &[Route] = &[
    route(
        "GET",
        "/orders",
        Needs(Read, Owning(OwnList)),
        Unused,
        |r| r.to(lists::orders),
    ),
    route(
        "POST",
        "/orders",
        Needs(Write, Owning(CustomerInBody)),
        Required,
        |r| r.to(resources::create_order),
    ),
    route(
        "GET",
        "/orders/{id}",
        Needs(Read, Owning(OrderInPath)),
        Unused,
        |r| r.to(resources::get_order),
    ),
    route(
        "POST",
        "/orders/{id}/cancel",
        Needs(Write, Owning(OrderInPath)),
        Required,
        |r| r.to(resources::cancel_order),
    ),
    route(
        "GET",
        "/orders/{id}/payments",
        Needs(Read, Owning(OrderInPath)),
        Unused,
        |r| r.to(resources::list_payments),
    ),
    route(
        "POST",
        "/orders/{id}/checkout",
        Needs(Write, Owning(OrderInPath)),
        Required,
        |r| r.to(checkout::create),
    ),
    route("GET", "/checkout/assets/checkout.js", Public, Unused, |r| {
        r.to(checkout::script)
    }),
    route(
        "GET",
        "/checkout/assets/checkout.css",
        Public,
        Unused,
        |r| r.to(checkout::stylesheet),
    ),
    route(
        "GET",
        "/checkout/assets/card_{provider}.js",
        Public,
        Unused,
        |r| r.to(checkout::card_script),
    ),
    route("GET", "/checkout/{token}", Public, Unused, |r| {
        r.to(checkout::show)
    }),
    route("GET", "/checkout/{token}/status", Public, Unused, |r| {
        r.to(checkout::status)
    }),
    route(
        "POST",
        "/checkout/{token}/payments",
        Public,
        Required,
        |r| r.to(checkout::pay),
    ),
    route(
        "GET",
        "/payments",
        Needs(Read, Owning(OwnList)),
        Unused,
        |r| r.to(lists::payments),
    ),
    route(
        "POST",
        "/payments",
        Needs(Write, Owning(OrderInBody)),
        Required,
        |r| r.to(resources::create_payment),
    ),
    route("GET", "/refunds", Needs(Read, Refused), Unused, |r| {
        r.to(lists::refunds)
    }),
    route(
        "GET",
        "/payments/{id}",
        Needs(Read, Owning(PaymentInPath)),
        Unused,
        |r| r.to(resources::get_payment),
    ),
    route(
        "POST",
        "/payments/{id}/refunds",
        Needs(Write, Refused),
        Required,
        |r| r.to(resources::create_refund),
    ),
    route(
        "POST",
        "/payments/{id}/capture",
        Needs(Write, Refused),
        Required,
        |r| r.to(resources::capture_payment),
    ),
    route(
        "POST",
        "/payments/{id}/void",
        Needs(Write, Refused),
        Required,
        |r| r.to(resources::void_payment),
    ),
    route("GET", "/refunds/{id}", Needs(Read, Refused), Unused, |r| {
        r.to(resources::get_refund)
    }),
    route("GET", "/disputes", Needs(Read, Refused), Unused, |r| {
        r.to(lists::disputes)
    }),
    route("GET", "/disputes/{id}", Needs(Read, Refused), Unused, |r| {
        r.to(resources::get_dispute)
    }),
    route(
        "GET",
        "/customers/{customer_id}/balance",
        Needs(Read, Owning(CustomerInPath)),
        Unused,
        |r| r.to(balances::get_balance),
    ),
    route(
        "POST",
        "/customers/{customer_id}/balance/credits",
        Needs(Write, Refused),
        Required,
        |r| r.to(balances::credit),
    ),
    route(
        "POST",
        "/customers/{customer_id}/balance/debits",
        Needs(Write, Refused),
        Required,
        |r| r.to(balances::debit),
    ),
    route(
        "POST",
        "/customers/{customer_id}/balance/holds",
        Needs(Write, Refused),
        Required,
        |r| r.to(balances::hold),
    ),
    route(
        "GET",
        "/customers/{customer_id}/balance/transactions",
        Needs(Read, Owning(CustomerInPath)),
        Unused,
        |r| r.to(balances::list_transactions),
    ),
    route(
        "GET",
        "/balance_transactions/{id}",
        Needs(Read, Refused),
        Unused,
        |r| r.to(balances::get_transaction),
    ),
    route(
        "GET",
        "/balance_holds/{id}",
        Needs(Read, Refused),
        Unused,
        |r| r.to(balances::get_hold),
    ),
    route(
        "POST",
        "/balance_holds/{id}/capture",
        Needs(Write, Refused),
        Required,
        |r| r.to(balances::capture),
    ),
    route(
        "POST",
        "/balance_holds/{id}/release",
        Needs(Write, Refused),
        Required,
        |r| r.to(balances::release),
    ),
    // Stock is the merchant's: a customer's token neither counts it nor
    // reads it (it reserves stock only through its own orders).
    route("GET", "/inventory", Needs(Read, Refused), Unused, |r| {
        r.to(inventory::list)
    }),
    route(
        "GET",
        "/inventory/{sku}",
        Needs(Read, Refused),
        Unused,
        |r| r.to(inventory::get_item),
    ),
    route(
        "POST",
        "/inventory/{sku}/adjustments",
        Needs(Write, Refused),
        Required,
        |r| r.to(inventory::adjust),
    ),
    route(
        "GET",
        "/orders/{id}/events",
        Needs(Read, Refused),
        Unused,
        |r| r.to(events::order_trail),
    ),
    route(
        "GET",
        "/payments/{id}/events",
        Needs(Read, Refused),
        Unused,
        |r| r.to(events::payment_trail),
    ),
    route(
        "GET",
        "/refunds/{id}/events",
        Needs(Read, Refused),
        Unused,
        |r| r.to(events::refund_trail),
    ),
    route("GET", "/events", Needs(Read, Refused), Unused, |r| {
        r.to(events::list_events)
    }),
    route("GET", "/events/{id}", Needs(Read, Refused), Unused, |r| {
        r.to(events::get_event)
    }),
    route(
        "POST",
        "/events/{id}/redeliver",
        Needs(Admin, Refused),
        Exempt(DEDUPLICATED_DELIVERY),
        |r| r.to(events::redeliver),
    ),
    route(
        "GET",
        "/webhook_endpoints",
        Needs(Admin, Refused),
        Unused,
        |r| r.to(webhook_endpoints::list),
    ),
    route(
        "POST",
        "/webhook_endpoints",
        Needs(Admin, Refused),
        Required,
        |r| r.to(webhook_endpoints::create),
    ),
    route(
        "DELETE",
        "/webhook_endpoints/{id}",
        Needs(Admin, Refused),
        Unused,
        |r| r.to(webhook_endpoints::delete),
    ),
    route(
        "POST",
        "/webhooks/{provider}",
        Public,
        Exempt(SIGNED_EVENT),
        |r| r.to(inbound::receive),
    ),
    route("GET", "/api_keys", Needs(Admin, Refused), Unused, |r| {
        r.to(api_keys::list)
    }),
    route("POST", "/api_keys", Needs(Admin, Refused), Required, |r| {
        r.to(api_keys::create)
    }),
    route(
        "DELETE",
        "/api_keys/{id}",
        Needs(Admin, Refused),
        Unused,
        |r| r.to(api_keys::revoke),
    ),
    route("GET", "/audit_events", Needs(Admin, Refused), Unused, |r| {
        r.to(api_keys::audit_events)
    }),
    route("GET", "/healthz", Public, Unused, |r| r.to(ops::healthz)),
    route("GET", "/readyz", Public, Unused, |r| r.to(ops::readyz)),
    route("GET", "/metrics", Public, Unused, |r| r.to(ops::metrics)),
    route("GET", "/openapi.yaml", Public, Unused, |r| {
        r.to(ops::openapi)
    }),
];

/// The route of `pattern` (as actix matched it) and `method` (`HEAD` as
/// `GET`).
pub fn find(pattern: &str, method: &str) -> Option<&'static Route> {
    let method = if method == "HEAD" { "GET" } else { method };
    ROUTES
        .iter()
        .find(|r| r.path == pattern && r.method == method)
}

/// Who may call `pattern` with `method` (`HEAD` as `GET`). A route
/// missing from the table (none is routed) needs `admin` and refuses
/// customers: the safe side.
pub fn access(pattern: &str, method: &str) -> Access {
    find(pattern, method).map_or(Needs(Admin, Refused), |r| r.access)
}

/// Body fields a customer's token may not send (`403 insufficient_scope`
/// naming the field, before the key is claimed), by method and route:
/// what they choose is the merchant's. The redirects of the
/// merchant-branded checkout and of a payment's authentication would
/// let a token send the shop's customers anywhere with the shop's name on
/// the way; an order's `metadata` is where merchants keep their own
/// references and fulfilment hints, which a customer must not write.
pub const MERCHANT_FIELDS: &[(&str, &str, &[&str])] = &[
    ("POST", "/orders", &["metadata"]),
    (
        "POST",
        "/orders/{id}/checkout",
        &["success_url", "cancel_url"],
    ),
    ("POST", "/payments", &["return_url"]),
];

/// The body fields of `method` `pattern` a customer's token may not send.
pub fn merchant_fields(pattern: &str, method: &str) -> &'static [&'static str] {
    MERCHANT_FIELDS
        .iter()
        .find(|(m, p, _)| *m == method && *p == pattern)
        .map_or(&[], |(_, _, fields)| fields)
}

/// The paths of [`ROUTES`], each once, in order.
pub fn paths() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for route in ROUTES {
        if !out.contains(&route.path) {
            out.push(route.path);
        }
    }
    out
}

/// The methods `path` answers, as an `Allow` header lists them.
pub fn allow(path: &str) -> String {
    ROUTES
        .iter()
        .filter(|r| r.path == path)
        .map(|r| r.method)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_and_method_is_declared_once() {
        let mut seen = std::collections::BTreeSet::new();
        for route in ROUTES {
            assert!(seen.insert((route.path, route.method)), "{route:?} twice");
            assert!(
                ["GET", "POST", "DELETE"].contains(&route.method),
                "{route:?}"
            );
        }
    }

    #[test]
    fn every_post_takes_a_key_or_says_why_not_and_nothing_else_takes_one() {
        for route in ROUTES {
            match (route.method, route.key) {
                ("POST", Required) => {}
                ("POST", Exempt(why)) => assert!(!why.is_empty(), "{route:?}"),
                ("POST", Unused) => panic!("{route:?}: a POST must take a key or say why not"),
                (_, Unused) => {}
                (_, key) => panic!("{route:?} is not a POST but says {key:?}"),
            }
        }
    }

    /// The customers' column of the table (issue 47): a customer's token
    /// reaches orders and payments, and how each route checks that what
    /// it touches is the customer's own fits the route's shape; every
    /// other route refuses it, and nothing `admin` ever lets one in.
    #[test]
    fn customers_reach_only_what_they_own_and_each_route_says_how() {
        let mut owning = Vec::new();
        for route in ROUTES {
            let Needs(scope, customers) = route.access else {
                continue;
            };
            let Owning(how) = customers else {
                continue;
            };
            assert_ne!(scope, Admin, "{route:?}: a customer never gets admin");
            let fits = match how {
                OrderInPath => route.path.starts_with("/orders/{id}"),
                PaymentInPath => route.path.starts_with("/payments/{id}"),
                CustomerInBody | OrderInBody => route.method == "POST" && !route.path.contains('{'),
                OwnList => route.method == "GET" && !route.path.contains('{'),
                CustomerInPath => {
                    route.method == "GET" && route.path.starts_with("/customers/{customer_id}/")
                }
            };
            assert!(fits, "{route:?} cannot check ownership as {how:?}");
            // A body's ownership is checked where the body is read, by
            // the one handler that reads it (`money_command`).
            if matches!(how, CustomerInBody | OrderInBody) {
                assert_eq!(route.key, Required, "{route:?}");
            }
            owning.push((route.method, route.path));
        }
        owning.sort();
        let mut expected = vec![
            ("GET", "/orders"),
            ("POST", "/orders"),
            ("GET", "/orders/{id}"),
            ("POST", "/orders/{id}/cancel"),
            ("GET", "/orders/{id}/payments"),
            ("POST", "/orders/{id}/checkout"),
            ("GET", "/payments"),
            ("POST", "/payments"),
            ("GET", "/payments/{id}"),
            ("GET", "/customers/{customer_id}/balance"),
            ("GET", "/customers/{customer_id}/balance/transactions"),
        ];
        expected.sort();
        assert_eq!(owning, expected);
        assert_eq!(access("/no/such/route", "GET"), Needs(Admin, Refused));
        assert_eq!(access("/orders", "HEAD"), Needs(Read, Owning(OwnList)));
    }

    /// The merchant's fields are refused on routes a customer may call
    /// with a body, where `money_command` checks them.
    #[test]
    fn merchant_fields_name_customer_routes_with_a_body() {
        for (method, path, fields) in MERCHANT_FIELDS {
            let route = find(path, method).expect("a route");
            assert!(matches!(route.access, Needs(Write, Owning(_))), "{route:?}");
            assert_eq!(route.key, Required, "{route:?}");
            assert!(!fields.is_empty());
        }
    }
}
