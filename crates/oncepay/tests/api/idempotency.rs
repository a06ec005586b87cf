//! Contract section 4, rule by rule, against the real server and database.

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn a_repeat_is_replayed_byte_for_byte_and_marked() {
    let app = spawn_app().await;
    let first = app.post("/orders", "key-1", &order_body()).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    assert!(first.headers().get("idempotent-replayed").is_none());
    let location = first.headers()["location"].clone();
    let first_body = first.bytes().await.expect("body");

    let again = app.post("/orders", "key-1", &order_body()).await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.headers()["location"], location);
    assert_eq!(again.bytes().await.expect("body"), first_body);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn reordered_keys_and_other_spacing_replay() {
    let app = spawn_app().await;
    let compact = r#"{"customer_id":"c","currency":"USD","items":[{"sku":"a","quantity":1,"unit_amount":5}]}"#;
    let spaced = "{ \"items\" : [ { \"unit_amount\" : 5, \"sku\" : \"a\", \"quantity\" : 1 } ],\n  \"currency\": \"USD\", \"customer_id\": \"c\" }";
    let a = app
        .post_raw("/orders", Some("k"), Some(&app.key), compact.into())
        .await;
    assert_eq!(a.status(), StatusCode::CREATED);
    let b = app
        .post_raw("/orders", Some("k"), Some(&app.key), spaced.into())
        .await;
    assert_eq!(b.status(), StatusCode::CREATED);
    assert_eq!(b.headers()["idempotent-replayed"], "true");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn same_key_with_another_body_or_endpoint_is_409_and_executes_nothing() {
    let app = spawn_app().await;
    assert_eq!(
        app.post("/orders", "k", &order_body()).await.status(),
        StatusCode::CREATED
    );
    let mut other = order_body();
    other["customer_id"] = json!("someone-else");
    let r = app.post("/orders", "k", &other).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(json_of(r).await["code"], "idempotency_key_reused");

    let order_id = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "k",
            &json!({"order_id": order_id, "payment_method": "tok_visa"}),
        )
        .await;
    assert_eq!(json_of(r).await["code"], "idempotency_key_reused");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 0);
}

#[tokio::test]
async fn missing_and_malformed_keys_are_400() {
    let app = spawn_app().await;
    let body = order_body().to_string().into_bytes();
    let r = app
        .post_raw("/orders", None, Some(&app.key), body.clone())
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["code"], "idempotency_key_missing");
    let long = "k".repeat(256);
    for bad in ["", "two words", "\"unterminated", "\"\"", long.as_str()] {
        let r = app
            .post_raw("/orders", Some(bad), Some(&app.key), body.clone())
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "key {bad:?}");
        assert_eq!(
            json_of(r).await["code"],
            "idempotency_key_invalid",
            "key {bad:?}"
        );
    }
    // A key in the URL is never read.
    let r = app
        .post_raw("/orders?idempotency_key=abc", None, Some(&app.key), body)
        .await;
    assert_eq!(json_of(r).await["code"], "idempotency_key_missing");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
}

#[tokio::test]
async fn a_quoted_key_is_the_same_key_as_a_bare_one() {
    let app = spawn_app().await;
    assert_eq!(
        app.post("/orders", "abc-123", &order_body()).await.status(),
        StatusCode::CREATED
    );
    let r = app.post("/orders", "\"abc-123\"", &order_body()).await;
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn two_merchants_with_one_key_do_not_meet() {
    let app = spawn_app().await;
    let other = app.other_merchant_key().await;
    let body = order_body().to_string().into_bytes();
    let a = app
        .post_raw("/orders", Some("shared"), Some(&app.key), body.clone())
        .await;
    let b = app
        .post_raw("/orders", Some("shared"), Some(&other), body)
        .await;
    assert_eq!(a.status(), StatusCode::CREATED);
    assert_eq!(b.status(), StatusCode::CREATED);
    assert!(b.headers().get("idempotent-replayed").is_none());
    assert_ne!(json_of(a).await["id"], json_of(b).await["id"]);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 2);
}

#[tokio::test]
async fn a_validation_error_leaves_the_key_usable() {
    let app = spawn_app().await;
    let mut bad = order_body();
    bad["currency"] = json!("EURO");
    assert_eq!(
        app.post("/orders", "k", &bad).await.status(),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let r = app
        .post_raw("/orders", Some("k"), Some(&app.key), b"{not json".to_vec())
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = app.post("/orders", "k", &order_body()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record").await,
        1
    );
}

#[tokio::test]
async fn business_rejections_are_kept_and_replayed() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    assert_eq!(app.pay(&order_id, "tok_visa").await.0, StatusCode::CREATED);
    let body = json!({"order_id": order_id, "payment_method": "tok_visa"});
    let first = app.post("/payments", "again", &body).await;
    assert_eq!(first.status(), StatusCode::CONFLICT);
    let first_body = first.bytes().await.expect("body");
    let repeat = app.post("/payments", "again", &body).await;
    assert_eq!(repeat.status(), StatusCode::CONFLICT);
    assert_eq!(repeat.headers()["idempotent-replayed"], "true");
    assert_eq!(repeat.bytes().await.expect("body"), first_body);
    let v: serde_json::Value = serde_json::from_slice(&first_body).expect("json");
    assert_eq!(v["code"], "order_not_payable");
}

#[tokio::test]
async fn a_storm_of_concurrent_duplicates_executes_once() {
    let app = spawn_app().await;
    storm(
        &[&app.base],
        &app.key,
        "/orders",
        "storm",
        &order_body(),
        100,
    )
    .await;
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn a_duplicate_waits_for_the_first_and_replays_it() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+delay=600"});
    // The duplicate leaves once the first is executing (its record says
    // so), whichever request the scheduler then runs first.
    let (first, second) = tokio::join!(app.post("/payments", "slow", &body), async {
        app.wait_for_record("slow", "state = 'executing'").await;
        app.post("/payments", "slow", &body).await
    });
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(second.status(), StatusCode::CREATED);
    let replayed = [&first, &second]
        .iter()
        .filter(|r| r.headers().get("idempotent-replayed").is_some())
        .count();
    assert_eq!(replayed, 1, "one executed, one replayed");
    assert_eq!(
        first.bytes().await.expect("a"),
        second.bytes().await.expect("b")
    );
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 1);
    assert_eq!(app.ledger().await["totals"]["charges"], 1);
}

#[tokio::test]
async fn a_duplicate_past_the_wait_gets_409_in_flight_with_retry_after() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_IDEMPOTENCY_WAIT", "200ms")).await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+delay=1500"});
    let (first, second) = tokio::join!(app.post("/payments", "slow", &body), async {
        app.wait_for_record("slow", "state = 'executing'").await;
        app.post("/payments", "slow", &body).await
    });
    assert_eq!(second.status(), StatusCode::CONFLICT);
    assert!(second.headers().contains_key("retry-after"));
    assert_eq!(json_of(second).await["code"], "idempotency_key_in_flight");
    assert_eq!(first.status(), StatusCode::CREATED);
    let again = app.post("/payments", "slow", &body).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
}

#[tokio::test]
async fn an_expired_lease_is_taken_over_and_no_finished_step_runs_again() {
    // The first executor loses its lease while the provider still holds
    // its charge (answered after 1.5 s): a retry takes the command over,
    // resumes after step 1 (no second attempt row), looks the charge up
    // with the same provider key (no second charge), and the first
    // executor's late commit is refused by the fencing token, so it replays
    // the winner's answer instead. A slow provider can no longer make a
    // command outlive its lease (its calls end within three quarters of
    // it: issue 55, item 5), so the lease is ended here as a process
    // stalled past it would find it, by its expiry in the database.
    // Webhooks are off: otherwise the charge's webhook settles the attempt
    // first and the resumed command rightly skips the provider call
    // altogether.
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_IDEMPOTENCY_LEASE", "3s")
            .serve("ONCEPAY_IDEMPOTENCY_WAIT", "3s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    let order_id = app.create_order().await;
    let body = json!({"order_id": order_id, "payment_method": "tok_visa+delay=1500"});
    let (first, second) = tokio::join!(app.post("/payments", "lease", &body), async {
        // The charge is at the provider, its answer delayed: the lease
        // ends now.
        let charged = oncepay_testkit::ready::until(std::time::Duration::from_secs(10), || async {
            app.charges_for(&order_id).await.len() == 1
        })
        .await;
        assert!(charged.is_ok(), "the charge reached the provider");
        sqlx::query(
            "UPDATE idempotency_record SET lease_expires_at = now() - interval '1 millisecond'
              WHERE idempotency_key = 'lease' AND state = 'executing'",
        )
        .execute(&app.db)
        .await
        .expect("the lease ends");
        app.post("/payments", "lease", &body).await
    });
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(second.status(), StatusCode::CREATED);
    assert_eq!(
        first.headers()["idempotent-replayed"],
        "true",
        "the slow executor lost its lease"
    );
    assert!(
        second.headers().get("idempotent-replayed").is_none(),
        "the retry executed"
    );
    let (a, b) = (json_of(first).await, json_of(second).await);
    assert_eq!(a, b);
    assert_eq!(a["status"], "succeeded");
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 1);
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["charges"], 1);
    assert_eq!(ledger["charges"][0]["charges"], 1);
    assert_eq!(
        ledger["charges"][0]["requests"], 1,
        "the resumed command looked the charge up instead of sending it again"
    );
}

#[tokio::test]
async fn the_sweeper_deletes_expired_records_and_keeps_live_ones() {
    // Time passes here by editing `expires_at` in the database, which the
    // in-memory replay cache (tied to the real clock) cannot see: turn it off.
    let app = spawn_app_with(Options::default().serve("ONCEPAY_REPLAY_CACHE_ENTRIES", "0")).await;
    app.post("/orders", "old", &order_body()).await;
    app.post("/orders", "live", &order_body()).await;
    sqlx::query("UPDATE idempotency_record SET expires_at = now() - interval '1 second' WHERE idempotency_key = 'old'")
        .execute(&app.db)
        .await
        .expect("age the record");
    let deleted = oncepay::workers::sweeper::sweep(&app.ctx)
        .await
        .expect("sweep");
    assert_eq!(deleted, 1);
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM idempotency_record")
        .fetch_all(&app.db)
        .await
        .expect("keys");
    assert_eq!(keys, vec!["live".to_string()]);
    // After expiry the key is free again: it executes anew.
    let r = app.post("/orders", "old", &order_body()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert!(r.headers().get("idempotent-replayed").is_none());
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 3);
}

#[tokio::test]
async fn an_expired_record_is_reclaimed_even_before_the_sweeper_runs() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_IDEMPOTENCY_TTL", "300ms")).await;
    let first = json_of(app.post("/orders", "k", &order_body()).await).await;
    app.wait_for_record("k", "expires_at < now()").await;
    let second = app.post("/orders", "k", &order_body()).await;
    assert!(second.headers().get("idempotent-replayed").is_none());
    let second = json_of(second).await;
    assert_ne!(second["id"], first["id"]);
    // Reclaimed, the key runs the engine's full protocol; its record still
    // names the order it made, as a batched create's does.
    let named: Option<uuid::Uuid> = sqlx::query_scalar(
        "SELECT resource_id FROM idempotency_record WHERE idempotency_key = 'k'",
    )
    .fetch_one(&app.db)
    .await
    .expect("record");
    assert_eq!(
        named.map(|id| id.to_string()),
        second["id"].as_str().map(String::from)
    );
}
