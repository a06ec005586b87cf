//! Per-merchant rate limits: a `429` with `Retry-After` and a problem body,
//! decided before the idempotency engine, so a limited request leaves its
//! key free; a merchant's own limit overrides the default.

use std::time::Duration;

use oncepay_testkit::ready;
use reqwest::StatusCode;

use crate::helpers::*;

#[tokio::test]
async fn a_limited_request_is_429_and_leaves_its_key_usable() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_RATE_LIMIT_PER_SECOND", "1")
            .serve("ONCEPAY_RATE_LIMIT_BURST", "3"),
    )
    .await;
    let mut limited = None;
    for i in 0..10 {
        let r = app.post("/orders", &format!("k-{i}"), &order_body()).await;
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some((i, r));
            break;
        }
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let (i, r) = limited.expect("the burst of 3 runs out");
    assert!(i >= 3, "the burst is admitted");
    let retry_after: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "rate_limited");
    assert_eq!(problem["status"], 429);
    let key = format!("k-{i}");
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM idempotency_record WHERE idempotency_key = '{key}'"
        ))
        .await,
        0,
        "nothing was written for the limited request"
    );
    // Another merchant is not held back, and one with its own higher limit
    // is not either.
    let other = app.other_merchant_key().await;
    let r = app
        .post_raw(
            "/orders",
            Some("b-1"),
            Some(&other),
            order_body().to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(oncepay::store::merchants::set_rate_limit(
        &app.db,
        "merchant-b",
        oncepay::rate_limit::Limit::new(1000, 1000),
        &oncepay::audit::Actor::cli(),
    )
    .await
    .expect("set"));
    let fresh_key = oncepay::api_keys::create(&app.db, "merchant-b")
        .await
        .expect("key");
    for n in 0..20 {
        let r = app
            .post_raw(
                "/orders",
                Some(&format!("b-own-{n}")),
                Some(&fresh_key),
                order_body().to_string().into_bytes(),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED, "request {n}");
    }

    // The same key, retried when told, creates the order once.
    let created = ready::until_some(Duration::from_secs(10), || async {
        let r = app.post("/orders", &key, &order_body()).await;
        (r.status() == StatusCode::CREATED).then_some(())
    })
    .await;
    assert!(created.is_ok(), "the key was free for the retry");
    let r = app.post("/orders", &key, &order_body()).await;
    if r.status() != StatusCode::TOO_MANY_REQUESTS {
        assert_eq!(r.headers()["idempotent-replayed"], "true");
    }
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM idempotency_record WHERE idempotency_key = '{key}'"
        ))
        .await,
        1
    );
}
