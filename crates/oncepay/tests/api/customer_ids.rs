//! Customer ids a URL must percent-encode (issue 54): a customer's
//! ownership is decided on exactly the id the route's handler reads, on
//! every route a customer's token may call. The look-alike of a customer
//! is another customer whose `sub` is the first one's id as a URL spells
//! it (`alice%2Bshop@x.io` for `alice+shop@x.io`): a check that compared
//! the path's raw spelling with the `sub` let it read the first one's
//! balance, while the first one, whose id holds `/`, `%` or `+`, could not
//! read its own.

use std::collections::BTreeSet;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::identity::{claims, keys, pyjwt_or_skip, sign, trust, Idp, ISSUER};
use oncepay::http::routes::{Access, Customers};

/// Customers whose ids hold what a path or a query must encode: `+`, `/`,
/// `%`, a space, letters outside ASCII.
const IDS: &[&str] = &[
    "alice+shop@x.io",
    "team/alice",
    "100%real",
    "jo ana",
    "Zoë-Ωmega",
];

/// `text` with every byte but RFC 3986's unreserved ones percent-encoded:
/// a spelling no server may read as anything but `text`.
fn encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The look-alike's id: `text` as a client writes it into a path when it
/// encodes only what must be (`%`, `/`, `+`, a space, non-ASCII), leaving
/// `@` and the rest as they are. Sent back as a path segment it decodes
/// to `text`.
fn lookalike(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_graphic() && !b"%/+".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// What a customer owns, made with the merchant's key.
struct Owned {
    id: &'static str,
    /// An unpaid order (read, checkout).
    open: String,
    /// An unpaid order to cancel.
    to_cancel: String,
    /// An unpaid order to pay.
    to_pay: String,
    /// A paid order and its payment.
    paid: String,
    payment: String,
}

async fn owned(app: &TestApp, id: &'static str) -> Owned {
    let order = move || async move {
        let mut body = order_body();
        body["customer_id"] = json!(id);
        let r = app
            .post("/orders", &Uuid::new_v4().to_string(), &body)
            .await;
        assert_eq!(r.status(), StatusCode::CREATED, "{id}");
        json_of(r).await["id"].as_str().expect("id").to_string()
    };
    let (open, to_cancel, to_pay, paid) =
        (order().await, order().await, order().await, order().await);
    let (status, payment) = app.pay(&paid, "tok_visa").await;
    assert!(status.is_success(), "{id}: {status} {payment}");
    let r = app
        .post(
            &format!("/customers/{}/balance/credits", encoded(id)),
            &Uuid::new_v4().to_string(),
            &json!({"amount": 700, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED, "{id}");
    assert_eq!(
        json_of(r).await["customer_id"],
        id,
        "the merchant's key credits {id}"
    );
    Owned {
        id,
        open,
        to_cancel,
        to_pay,
        paid,
        payment: payment["id"].as_str().expect("payment id").to_string(),
    }
}

/// Sends one request and returns its status and JSON body.
async fn call(
    app: &TestApp,
    bearer: &str,
    method: Method,
    path: &str,
    body: Option<&Value>,
) -> (StatusCode, Value) {
    let idem = (method == Method::POST).then(|| Uuid::new_v4().to_string());
    let r = app
        .call_as(bearer, method, path, idem.as_deref(), body)
        .await;
    let status = r.status();
    (status, json_of(r).await)
}

#[tokio::test]
async fn every_customer_route_decides_ownership_on_the_id_its_handler_reads() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let mut customers = Vec::new();
    for &id in IDS {
        let look = lookalike(id);
        assert_ne!(look, id, "{id} needs encoding");
        let owner = sign(key, claims(id, "customer")).await;
        let other = sign(key, claims(&look, "customer")).await;
        customers.push((owned(&app, id).await, owner, look, other));
    }

    let mut walked = BTreeSet::new();
    for route in oncepay::http::ROUTES {
        let Access::Needs(_, Customers::Owning(_)) = route.access else {
            continue;
        };
        let method = Method::from_bytes(route.method.as_bytes()).expect("method");
        for (own, owner, look, other) in &customers {
            let id = own.id;
            let case = format!("{route:?} as {id:?} and as {look:?}");
            let mine = |row: &Value| {
                let order = row
                    .get("order_id")
                    .or_else(|| row.get("id"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                [&own.open, &own.to_cancel, &own.to_pay, &own.paid].contains(&&order)
            };
            let by_id = |object: &str| route.path.replace("{id}", object);
            match (route.method, route.path) {
                ("GET", "/orders") | ("GET", "/payments") => {
                    let path = format!("{}?customer_id={}", route.path, encoded(id));
                    let (status, page) = call(&app, owner, method.clone(), &path, None).await;
                    assert_eq!(status, StatusCode::OK, "{case}: {page}");
                    let rows = page["data"].as_array().expect("a page");
                    assert!(!rows.is_empty(), "{case}: the owner's own rows");
                    assert!(rows.iter().all(mine), "{case}: {page}");
                    for path in [path.as_str(), route.path] {
                        let (status, page) = call(&app, other, method.clone(), path, None).await;
                        assert_eq!(status, StatusCode::OK, "{case}: {page}");
                        assert_eq!(page["data"], json!([]), "{case}: {path}");
                    }
                }
                ("POST", "/orders") => {
                    let mut body = order_body();
                    body["customer_id"] = json!(id);
                    body.as_object_mut().expect("object").remove("metadata");
                    let (status, problem) =
                        call(&app, other, method.clone(), route.path, Some(&body)).await;
                    assert_eq!(status, StatusCode::FORBIDDEN, "{case}: {problem}");
                    assert_eq!(problem["code"], "not_owner", "{case}");
                    let (status, order) =
                        call(&app, owner, method.clone(), route.path, Some(&body)).await;
                    assert_eq!(status, StatusCode::CREATED, "{case}: {order}");
                    assert_eq!(order["customer_id"], id, "{case}");
                }
                ("GET", "/orders/{id}")
                | ("GET", "/orders/{id}/payments")
                | ("POST", "/orders/{id}/cancel")
                | ("POST", "/orders/{id}/checkout") => {
                    let (order, expected) = match route.path {
                        "/orders/{id}" => (&own.open, StatusCode::OK),
                        "/orders/{id}/payments" => (&own.paid, StatusCode::OK),
                        "/orders/{id}/cancel" => (&own.to_cancel, StatusCode::OK),
                        _ => (&own.open, StatusCode::CREATED),
                    };
                    let body = (route.method == "POST").then(|| json!({}));
                    let path = by_id(order.as_str());
                    let (status, problem) =
                        call(&app, other, method.clone(), &path, body.as_ref()).await;
                    assert_eq!(status, StatusCode::NOT_FOUND, "{case}: {problem}");
                    assert_eq!(problem["code"], "order_not_found", "{case}");
                    let (status, answer) =
                        call(&app, owner, method.clone(), &path, body.as_ref()).await;
                    assert_eq!(status, expected, "{case}: {answer}");
                }
                ("POST", "/payments") => {
                    let body = json!({"order_id": own.to_pay, "payment_method": "tok_visa"});
                    let (status, problem) =
                        call(&app, other, method.clone(), route.path, Some(&body)).await;
                    assert_eq!(status, StatusCode::NOT_FOUND, "{case}: {problem}");
                    assert_eq!(problem["code"], "order_not_found", "{case}");
                    let (status, payment) =
                        call(&app, owner, method.clone(), route.path, Some(&body)).await;
                    assert!(status.is_success(), "{case}: {status} {payment}");
                }
                ("GET", "/payments/{id}") => {
                    let path = by_id(own.payment.as_str());
                    let (status, problem) = call(&app, other, method.clone(), &path, None).await;
                    assert_eq!(status, StatusCode::NOT_FOUND, "{case}: {problem}");
                    assert_eq!(problem["code"], "payment_not_found", "{case}");
                    let (status, payment) = call(&app, owner, method.clone(), &path, None).await;
                    assert_eq!(status, StatusCode::OK, "{case}: {payment}");
                }
                ("GET", "/customers/{customer_id}/balance")
                | ("GET", "/customers/{customer_id}/balance/transactions") => {
                    let at = |segment: &str| {
                        let path = route.path.replace("{customer_id}", segment);
                        if path.ends_with("/balance") {
                            path + "?currency=EUR"
                        } else {
                            path
                        }
                    };
                    // The look-alike writes its own `sub` as the segment,
                    // which decodes to the owner's id: refused.
                    let (status, problem) =
                        call(&app, other, method.clone(), &at(look.as_str()), None).await;
                    assert_eq!(status, StatusCode::FORBIDDEN, "{case}: {problem}");
                    assert_eq!(problem["code"], "not_owner", "{case}");
                    // The owner, by that very URL and fully encoded: its own.
                    for segment in [look.clone(), encoded(id)] {
                        let (status, answer) =
                            call(&app, owner, method.clone(), &at(segment.as_str()), None).await;
                        assert_eq!(status, StatusCode::OK, "{case} at {segment}: {answer}");
                        if route.path.ends_with("/balance") {
                            assert_eq!(answer["customer_id"], id, "{case}");
                            assert_eq!(answer["available"], 700, "{case}: {answer}");
                        } else {
                            let rows = answer["data"].as_array().expect("a page");
                            assert!(!rows.is_empty(), "{case}: the credit");
                            for row in rows {
                                assert_eq!(row["customer_id"], id, "{case}: {row}");
                            }
                        }
                    }
                    // The look-alike's own balance, by its own id encoded:
                    // an id holding `%` is readable by its owner too.
                    let (status, answer) = call(
                        &app,
                        other,
                        method.clone(),
                        &at(encoded(look).as_str()),
                        None,
                    )
                    .await;
                    assert_eq!(status, StatusCode::OK, "{case}: {answer}");
                    if route.path.ends_with("/balance") {
                        assert_eq!(answer["customer_id"], look.as_str(), "{case}");
                        assert_eq!(answer["available"], 0, "{case}: {answer}");
                    } else {
                        assert_eq!(answer["data"], json!([]), "{case}");
                    }
                }
                _ => panic!(
                    "{route:?}: a customer may call it, so this test must call it (add its case)"
                ),
            }
        }
        walked.insert((route.method, route.path));
    }
    let owning: BTreeSet<(&str, &str)> = oncepay::http::ROUTES
        .iter()
        .filter(|r| matches!(r.access, Access::Needs(_, Customers::Owning(_))))
        .map(|r| (r.method, r.path))
        .collect();
    assert_eq!(walked, owning, "every route a customer may call was walked");
    assert!(walked.len() >= 11, "{walked:?}");
}
