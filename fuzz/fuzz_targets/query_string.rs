//! Query strings, as the list endpoints read them: the middleware's check
//! for `%00` on the raw string, actix-web's extractor
//! (`web::Query<HashMap<String, String>>`, serde_urlencoded), then each
//! list's parameters (`http::lists::page_request`).
//!
//! Properties, for any query string (the bytes, as UTF-8):
//! - no panic, time and memory bounded;
//! - the same string gets the same answers;
//! - the middleware misses no NUL: if a decoded name or value holds U+0000
//!   (and the raw string holds none, which the HTTP parser refuses), the
//!   middleware refused the request, `400 invalid_field` naming the
//!   parameter (its detail says it is a query parameter), and the name it
//!   gives holds no NUL itself (it is written `\u0000`);
//! - a list refuses with `400 invalid_field` naming a field, or accepts a
//!   page request within its rules: 1 to 100 rows, a status the list has,
//!   a customer id of 1 to 64 characters without NUL, only parameters the
//!   list knows, and `limit` and `status` as sent.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use oncepay::fuzzing::{query_lists, query_map, query_nul};

/// The parameters every list takes.
const COMMON: &[&str] = &[
    "limit",
    "starting_after",
    "ending_before",
    "customer_id",
    "created_gte",
    "created_lte",
];

/// Each route's own parameters (as `http::lists` and the handlers say).
fn own_parameters(route: &str) -> &'static [&'static str] {
    match route {
        "/orders" => &["status"],
        "/payments" => &["status", "order_id"],
        "/refunds" => &["status", "payment_id"],
        "/disputes" => &["status", "payment_id"],
        "/events" => &["type", "object_id"],
        "/audit_events" => &["action"],
        other => panic!("a list this target does not know: {other}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };

    let nul = query_nul(query);
    assert_eq!(nul, query_nul(query), "the same string, another answer");
    if let Some(p) = &nul {
        assert_eq!((p.status, p.code), (400, "invalid_field"));
        assert!(p.detail.contains("query parameter"), "{p:?}");
        let field = p.field.as_deref().expect("names the parameter");
        assert!(
            query.contains('\0') || !field.contains('\0'),
            "the name given holds a NUL: {field:?}"
        );
    }

    let Some(map) = query_map(query) else {
        return;
    };
    assert_eq!(Some(&map), query_map(query).as_ref());
    let decoded_nul = map
        .iter()
        .any(|(k, v)| k.contains('\0') || v.contains('\0'));
    if decoded_nul && !query.contains('\0') {
        assert!(
            nul.is_some(),
            "{query:?} decodes to a NUL ({map:?}), and the middleware lets it by"
        );
    }

    for (route, page) in query_lists(&map) {
        check_page(route, &map, page);
    }
});

fn check_page(
    route: &str,
    map: &HashMap<String, String>,
    page: Result<oncepay::store::pages::PageRequest, oncepay::problem::Problem>,
) {
    let page = match page {
        Ok(page) => page,
        Err(p) => {
            assert_eq!((p.status, p.code), (400, "invalid_field"), "{route}: {p:?}");
            assert!(p.field.is_some(), "{route}: names no field: {p:?}");
            return;
        }
    };
    assert!(
        (1..=100).contains(&page.limit),
        "{route}: limit {}",
        page.limit
    );
    if let Some(sent) = map.get("limit") {
        assert_eq!(sent.parse::<i64>().ok(), Some(page.limit), "{route}");
    }
    for name in map.keys() {
        assert!(
            COMMON.contains(&name.as_str()) || own_parameters(route).contains(&name.as_str()),
            "{route} accepts a parameter it does not know: {name:?}"
        );
    }
    if let Some(status) = &page.status {
        assert!(
            statuses(route).contains(&status.as_str()),
            "{route}: status {status:?}"
        );
        assert_eq!(map.get("status"), Some(status), "{route}");
    }
    if let Some(customer) = &page.customer_id {
        let chars = customer.chars().count();
        assert!(
            (1..=64).contains(&chars),
            "{route}: customer id of {chars} characters"
        );
        assert!(!customer.contains('\0'), "{route}: a customer id with NUL");
    }
}

/// The statuses a list filters by (none: it takes no `status`).
fn statuses(route: &str) -> &'static [&'static str] {
    match route {
        "/orders" => &["awaiting_payment", "authorized", "paid", "refunded", "cancelled"],
        "/payments" => &["pending", "requires_capture", "succeeded", "failed", "voided"],
        "/refunds" => &["pending", "succeeded", "failed"],
        "/disputes" => &["needs_response", "under_review", "won", "lost"],
        _ => &[],
    }
}
