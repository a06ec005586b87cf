//! Customer balances on the ledger: credits, debits, holds and their
//! capture, release and expiry, over HTTP; the refusals kept and replayed;
//! concurrent requests counted in rows; the database's own refusals.

use std::time::Duration;

use oncepay_testkit::ready;
use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;

fn key() -> String {
    Uuid::new_v4().to_string()
}

async fn credit(app: &TestApp, customer: &str, amount: i64) -> Value {
    let r = app
        .post(
            &format!("/customers/{customer}/balance/credits"),
            &key(),
            &json!({"amount": amount, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    json_of(r).await
}

async fn balance(app: &TestApp, customer: &str) -> Value {
    let r = app
        .get(&format!("/customers/{customer}/balance?currency=EUR"))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    json_of(r).await
}

async fn hold(app: &TestApp, customer: &str, amount: i64, expires_in: Option<i64>) -> Value {
    let mut body = json!({"amount": amount, "currency": "EUR"});
    if let Some(s) = expires_in {
        body["expires_in"] = json!(s);
    }
    let r = app
        .post(
            &format!("/customers/{customer}/balance/holds"),
            &key(),
            &body,
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    json_of(r).await
}

fn triple(v: &Value) -> (i64, i64, i64) {
    (
        v["posted"].as_i64().expect("posted"),
        v["held"].as_i64().expect("held"),
        v["available"].as_i64().expect("available"),
    )
}

async fn events_of(app: &TestApp, object_id: &str) -> Vec<String> {
    let page = json_of(
        app.get(&format!("/events?object_id={object_id}&limit=100"))
            .await,
    )
    .await;
    let mut types: Vec<String> = page["data"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["type"].as_str().expect("type").to_string())
        .collect();
    types.reverse();
    types
}

async fn ledger_holds(app: &TestApp) {
    let lines = oncepay::store::ledger::check(&app.db, None)
        .await
        .expect("the check runs");
    for line in &lines {
        assert!(line.holds(), "{line:?}");
    }
}

#[tokio::test]
async fn credits_and_debits_move_the_balance_once_with_their_events_and_audit() {
    let app = spawn_app().await;
    // A customer whose balance never moved: zeros, not 404.
    assert_eq!(triple(&balance(&app, "cus_new").await), (0, 0, 0));
    let b = balance(&app, "cus_new").await;
    assert_eq!(b["customer_id"], "cus_new");
    assert_eq!(b["currency"], "EUR");

    let path = "/customers/cus_1/balance/credits";
    let body = json!({"amount": 1000, "currency": "EUR", "description": "goodwill"});
    let first = app.post(path, "credit-1", &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let location = first
        .headers()
        .get("location")
        .expect("a Location")
        .to_str()
        .expect("ascii")
        .to_string();
    let first_bytes = first.bytes().await.expect("body");
    let credit: Value = serde_json::from_slice(&first_bytes).expect("json");
    assert_eq!(
        location,
        format!(
            "/balance_transactions/{}",
            credit["id"].as_str().expect("id")
        )
    );
    assert_eq!(credit["type"], "credit");
    assert_eq!(credit["amount"], 1000);
    assert_eq!(credit["customer_id"], "cus_1");
    assert_eq!(credit["currency"], "EUR");
    assert_eq!(credit["description"], "goodwill");
    assert_eq!(triple(&credit["balance"]), (1000, 0, 1000));
    for absent in ["payment_id", "refund_id", "hold_id"] {
        assert!(credit[absent].is_null(), "{absent}");
    }

    // A replay: the same bytes, marked; the balance unmoved.
    let replay = app.post(path, "credit-1", &body).await;
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(
        replay
            .headers()
            .get("idempotent-replayed")
            .map(|v| v.as_bytes()),
        Some(&b"true"[..])
    );
    assert_eq!(replay.bytes().await.expect("body"), first_bytes);
    // The same key for another body, and no key at all.
    let reused = app
        .post(path, "credit-1", &json!({"amount": 5, "currency": "EUR"}))
        .await;
    assert_eq!(reused.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(reused).await["code"], "idempotency_key_reused");
    let keyless = app
        .post_raw(
            path,
            None,
            Some(&app.key),
            json!({"amount": 5, "currency": "EUR"})
                .to_string()
                .into_bytes(),
        )
        .await;
    assert_eq!(keyless.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(keyless).await["code"], "idempotency_key_missing");

    let debits = "/customers/cus_1/balance/debits";
    let r = app
        .post(
            debits,
            "debit-1",
            &json!({"amount": 300, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let debit = json_of(r).await;
    assert_eq!(debit["type"], "debit");
    assert_eq!(triple(&debit["balance"]), (700, 0, 700));
    let again = app
        .post(
            debits,
            "debit-1",
            &json!({"amount": 300, "currency": "EUR"}),
        )
        .await;
    assert_eq!(again.status(), StatusCode::CREATED);
    assert_eq!(json_of(again).await, debit);
    assert_eq!(triple(&balance(&app, "cus_1").await), (700, 0, 700));

    // Reads: found; another merchant's and a non-UUID are 404.
    let id = debit["id"].as_str().expect("id");
    let read = json_of(app.get(&format!("/balance_transactions/{id}")).await).await;
    assert_eq!(read, debit);
    let other = app.other_merchant_key().await;
    let theirs = app
        .http
        .get(format!("{}/balance_transactions/{id}", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("sent");
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        json_of(theirs).await["code"],
        "balance_transaction_not_found"
    );
    let theirs = app
        .http
        .get(format!("{}/customers/cus_1/balance?currency=EUR", app.base))
        .bearer_auth(&other)
        .send()
        .await
        .expect("sent");
    assert_eq!(triple(&json_of(theirs).await), (0, 0, 0), "merchant-scoped");
    let bad = app.get("/balance_transactions/not-a-uuid").await;
    assert_eq!(bad.status(), StatusCode::NOT_FOUND);

    // One event per transaction, none for the replays.
    assert_eq!(
        events_of(&app, credit["id"].as_str().expect("id")).await,
        ["balance.credited"]
    );
    assert_eq!(events_of(&app, id).await, ["balance.debited"]);
    // The audit trail names the API key for both.
    let audit = json_of(app.get("/audit_events?limit=100").await).await;
    let actions: Vec<&Value> = audit["data"]
        .as_array()
        .expect("audit")
        .iter()
        .filter(|e| e["target_type"] == "balance_transaction")
        .collect();
    assert_eq!(actions.len(), 2, "{audit}");
    assert!(actions.iter().all(|e| e["actor_type"] == "api_key"));
    assert!(actions
        .iter()
        .any(|e| e["action"] == "balance.credited" && e["change"]["amount"] == 1000));
    assert!(actions
        .iter()
        .any(|e| e["action"] == "balance.debited" && e["target_id"] == id));
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_transfer").await,
        2,
        "one transfer per key"
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_debit_refused_for_funds_is_kept_and_replayed_even_after_a_credit() {
    let app = spawn_app().await;
    credit(&app, "cus_2", 100).await;
    let path = "/customers/cus_2/balance/debits";
    let body = json!({"amount": 500, "currency": "EUR"});
    let refused = app.post(path, "debit-k", &body).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let first = refused.bytes().await.expect("body");
    let problem: Value = serde_json::from_slice(&first).expect("json");
    assert_eq!(problem["code"], "insufficient_funds");
    assert_eq!(problem["available"], 100);

    credit(&app, "cus_2", 1000).await;
    let replay = app.post(path, "debit-k", &body).await;
    assert_eq!(replay.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(replay.headers().contains_key("idempotent-replayed"));
    assert_eq!(replay.bytes().await.expect("body"), first);
    assert_eq!(triple(&balance(&app, "cus_2").await), (1100, 0, 1100));

    // A new attempt takes a new key.
    let fresh = app.post(path, "debit-k2", &body).await;
    assert_eq!(fresh.status(), StatusCode::CREATED);
    assert_eq!(triple(&balance(&app, "cus_2").await), (600, 0, 600));

    // A refused hold, likewise.
    let holds = "/customers/cus_2/balance/holds";
    let too_much = json!({"amount": 601, "currency": "EUR"});
    let r = app.post(holds, "hold-k", &too_much).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["available"], 600);
    credit(&app, "cus_2", 1).await;
    let r = app.post(holds, "hold-k", &too_much).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "replayed");
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_open_pending").await,
        0
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn bad_input_is_refused_before_the_key_is_claimed() {
    let app = spawn_app().await;
    let path = "/customers/cus_3/balance/credits";
    for (body, status, field) in [
        (json!({"amount": 0, "currency": "EUR"}), 422, "amount"),
        (json!({"amount": 5, "currency": "eur"}), 422, "currency"),
        (json!({"amount": 5}), 400, "currency"),
        (json!({"amount": 5, "currency": "EUR", "x": 1}), 400, "x"),
        (json!({"amount": "5", "currency": "EUR"}), 400, "amount"),
    ] {
        let r = app.post(path, "same-key", &body).await;
        assert_eq!(r.status().as_u16(), status, "{body}");
        assert_eq!(json_of(r).await["field"], field, "{body}");
    }
    let long = "c".repeat(65);
    let r = app
        .post(
            &format!("/customers/{long}/balance/credits"),
            &key(),
            &json!({"amount": 5, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["field"], "customer_id");
    let r = app
        .post(
            "/customers/cus_3/balance/holds",
            &key(),
            &json!({"amount": 5, "currency": "EUR", "expires_in": 0}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = app.get("/customers/cus_3/balance").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "currency is required");
    let r = app.get("/customers/cus_3/balance?currency=EUR&x=1").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // The key was never claimed: it still works.
    let r = app
        .post(path, "same-key", &json!({"amount": 5, "currency": "EUR"}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(app.count("SELECT count(*) FROM ledger_transfer").await, 1);
}

#[tokio::test]
async fn a_hold_counts_until_captured_or_released_once() {
    let app = spawn_app().await;
    credit(&app, "cus_4", 1000).await;
    let placed = app
        .post(
            "/customers/cus_4/balance/holds",
            "hold-1",
            &json!({"amount": 400, "currency": "EUR", "description": "cart 7"}),
        )
        .await;
    assert_eq!(placed.status(), StatusCode::CREATED);
    let h = json_of(placed).await;
    let id = h["id"].as_str().expect("id").to_string();
    assert_eq!(h["status"], "held");
    assert_eq!(h["amount"], 400);
    assert_eq!(h["captured_amount"], 0);
    assert_eq!(h["customer_id"], "cus_4");
    assert_eq!(triple(&balance(&app, "cus_4").await), (1000, 400, 600));
    // The default lifetime is ONCEPAY_BALANCE_HOLD_TTL, 15 minutes.
    let created =
        chrono::DateTime::parse_from_rfc3339(h["created_at"].as_str().expect("t")).expect("time");
    let expires =
        chrono::DateTime::parse_from_rfc3339(h["expires_at"].as_str().expect("t")).expect("time");
    let ttl = (expires - created).num_seconds();
    assert!((899..=901).contains(&ttl), "{ttl}");

    // What the hold holds cannot be spent.
    let r = app
        .post(
            "/customers/cus_4/balance/debits",
            &key(),
            &json!({"amount": 700, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["available"], 600);

    let capture = format!("/balance_holds/{id}/capture");
    let r = app.post(&capture, "cap-big", &json!({"amount": 401})).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["code"], "amount_exceeds_hold");
    let r = app.post(&capture, "cap-big", &json!({"amount": 401})).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "kept");

    let r = app.post(&capture, "cap-1", &json!({"amount": 300})).await;
    assert_eq!(r.status(), StatusCode::OK);
    let first = r.bytes().await.expect("body");
    let captured: Value = serde_json::from_slice(&first).expect("json");
    assert_eq!(captured["status"], "captured");
    assert_eq!(captured["captured_amount"], 300);
    // The rest (100) returned: posted 700, nothing held.
    assert_eq!(triple(&balance(&app, "cus_4").await), (700, 0, 700));
    let replay = app.post(&capture, "cap-1", &json!({"amount": 300})).await;
    assert_eq!(replay.status(), StatusCode::OK);
    assert_eq!(replay.bytes().await.expect("body"), first);

    for (path, body) in [
        (capture.clone(), json!({})),
        (format!("/balance_holds/{id}/release"), json!({})),
    ] {
        let r = app.post(&path, &key(), &body).await;
        assert_eq!(r.status(), StatusCode::CONFLICT, "{path}");
        let p = json_of(r).await;
        assert_eq!(p["code"], "hold_not_active");
        assert_eq!(p["hold_status"], "captured");
    }
    assert_eq!(
        json_of(app.get(&format!("/balance_holds/{id}")).await).await,
        captured
    );

    // A second hold, released.
    let h2 = hold(&app, "cus_4", 200, None).await;
    let id2 = h2["id"].as_str().expect("id").to_string();
    assert_eq!(triple(&balance(&app, "cus_4").await), (700, 200, 500));
    let r = app
        .post(
            &format!("/balance_holds/{id2}/release"),
            "rel-1",
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let released = json_of(r).await;
    assert_eq!(released["status"], "released");
    assert_eq!(released["captured_amount"], 0);
    assert_eq!(triple(&balance(&app, "cus_4").await), (700, 0, 700));

    // Not found: unknown, another merchant's, not a UUID.
    let r = app
        .post(
            &format!("/balance_holds/{}/release", Uuid::now_v7()),
            &key(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "balance_hold_not_found");
    let other = app.other_merchant_key().await;
    let r = app
        .post_raw(
            &format!("/balance_holds/{id2}/release"),
            Some(&key()),
            Some(&other),
            b"{}".to_vec(),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        app.get("/balance_holds/nope").await.status(),
        StatusCode::NOT_FOUND
    );

    // The transactions, newest first, each with the balance after it.
    let list = json_of(
        app.get("/customers/cus_4/balance/transactions?limit=100")
            .await,
    )
    .await;
    let types: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|t| t["type"].as_str().expect("type"))
        .collect();
    assert_eq!(
        types,
        ["hold_release", "hold", "hold_capture", "hold", "credit"]
    );
    let capture_tx = &list["data"][2];
    assert_eq!(capture_tx["amount"], 300);
    assert_eq!(capture_tx["hold_id"], id.as_str());
    assert_eq!(triple(&capture_tx["balance"]), (700, 0, 700));
    assert_eq!(triple(&list["data"][3]["balance"]), (1000, 400, 600));

    assert_eq!(
        events_of(&app, &id).await,
        ["balance_hold.created", "balance_hold.captured"]
    );
    assert_eq!(
        events_of(&app, &id2).await,
        ["balance_hold.created", "balance_hold.released"]
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_hold_past_its_expiry_stops_counting_at_once_and_is_swept_once() {
    let app = spawn_app().await;
    credit(&app, "cus_5", 500).await;
    let h = hold(&app, "cus_5", 300, Some(1)).await;
    let id = h["id"].as_str().expect("id").to_string();
    assert_eq!(triple(&balance(&app, "cus_5").await), (500, 300, 200));
    // Waits for the clock, not for another request.
    let expired = ready::until_some(Duration::from_secs(10), || async {
        let h = json_of(app.get(&format!("/balance_holds/{id}")).await).await;
        (h["status"] == "expired").then_some(h)
    })
    .await
    .expect("the hold reads expired once past expires_at");
    assert_eq!(expired["updated_at"], expired["expires_at"]);
    // Before any sweep: it no longer counts, and cannot be captured.
    assert_eq!(triple(&balance(&app, "cus_5").await), (500, 0, 500));
    let r = app
        .post(&format!("/balance_holds/{id}/capture"), &key(), &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let p = json_of(r).await;
    assert_eq!(p["code"], "hold_not_active");
    assert_eq!(p["hold_status"], "expired");

    // The capture's refusal rolled back the expiry it found; the sweep
    // writes it, once.
    oncepay::workers::sweeper::expire_holds(&app.ctx)
        .await
        .expect("sweep");
    oncepay::workers::sweeper::expire_holds(&app.ctx)
        .await
        .expect("sweep again");
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_transfer WHERE code = 'hold_expiry'")
            .await,
        1
    );
    assert_eq!(
        events_of(&app, &id).await,
        ["balance_hold.created", "balance_hold.expired"]
    );
    let after = json_of(app.get(&format!("/balance_holds/{id}")).await).await;
    assert_eq!(after["status"], "expired");
    // Spending the whole balance now works.
    let r = app
        .post(
            "/customers/cus_5/balance/debits",
            &key(),
            &json!({"amount": 500, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_hold_expiring_while_its_captures_race_the_sweep_has_one_outcome() {
    let app = spawn_app().await;
    credit(&app, "cus_6", 1000).await;
    for round in 0..3 {
        let h = hold(&app, "cus_6", 100, Some(1)).await;
        let id = Uuid::parse_str(h["id"].as_str().expect("id")).expect("uuid");
        // Waits for the database's clock to near the hold's expiry, then
        // captures and sweeps fire together until one resolves it.
        let near = ready::until(Duration::from_secs(5), || async {
            sqlx::query_scalar::<_, bool>(
                "SELECT expires_at - statement_timestamp() <= interval '20 milliseconds'
                   FROM ledger_transfer WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&app.db)
            .await
            .unwrap_or(false)
        })
        .await;
        assert!(near.is_ok());
        let mut captured = 0;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..4 {
                let request = app
                    .http
                    .post(format!("{}/balance_holds/{id}/capture", app.base))
                    .bearer_auth(&app.key)
                    .header("Idempotency-Key", Uuid::new_v4().to_string())
                    .json(&json!({}));
                tasks.spawn(async move { request.send().await.expect("sent").status() });
            }
            let ctx = app.ctx.clone();
            let sweep = tokio::spawn(async move {
                oncepay::workers::sweeper::expire_holds(&ctx).await.ok();
            });
            while let Some(status) = tasks.join_next().await {
                match status.expect("task") {
                    StatusCode::OK => captured += 1,
                    StatusCode::CONFLICT => {}
                    other => panic!("{other}"),
                }
            }
            sweep.await.expect("sweep");
            let resolutions = sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM ledger_transfer WHERE pending_id = $1",
            )
            .bind(id)
            .fetch_one(&app.db)
            .await
            .expect("count");
            assert!(
                resolutions <= 1,
                "round {round}: resolved {resolutions} times"
            );
            if resolutions == 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: never resolved"
            );
        }
        assert!(captured <= 1, "round {round}: captured {captured} times");
        let status = app.status_of(&format!("/balance_holds/{id}")).await;
        let expiries = sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM ledger_transfer WHERE pending_id = $1 AND code = 'hold_expiry'",
        )
        .bind(id)
        .fetch_one(&app.db)
        .await
        .expect("count");
        match captured {
            1 => assert_eq!((status.as_str(), expiries), ("captured", 0)),
            _ => assert_eq!((status.as_str(), expiries), ("expired", 1)),
        }
        // No capture after its expiry, by the database's clock.
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM ledger_transfer c JOIN ledger_transfer p ON p.id = c.pending_id
                  WHERE p.id = '{id}' AND c.phase = 'post' AND c.created_at >= p.expires_at"
            ))
            .await,
            0
        );
    }
    ledger_holds(&app).await;
}

/// Fires `bodies` at once, each to its path under its own key; returns
/// the statuses.
async fn fire(app: &TestApp, requests: Vec<(String, Value)>) -> Vec<StatusCode> {
    let mut tasks = tokio::task::JoinSet::new();
    for (path, body) in requests {
        let request = app
            .http
            .post(format!("{}{path}", app.base))
            .bearer_auth(&app.key)
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&body);
        tasks.spawn(async move { request.send().await.expect("sent").status() });
    }
    let mut statuses = Vec::new();
    while let Some(s) = tasks.join_next().await {
        statuses.push(s.expect("task"));
    }
    statuses
}

#[tokio::test]
async fn concurrent_debits_and_holds_against_a_balance_covering_k_of_them_exactly_k_succeed() {
    let app = spawn_app().await;
    credit(&app, "cus_7", 1000).await;
    // 24 requests of 100 each (12 debits, 12 holds) against 1000: ten fit.
    let mut requests = Vec::new();
    for i in 0..24 {
        let kind = if i % 2 == 0 { "debits" } else { "holds" };
        requests.push((
            format!("/customers/cus_7/balance/{kind}"),
            json!({"amount": 100, "currency": "EUR"}),
        ));
    }
    let statuses = fire(&app, requests).await;
    let ok = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNPROCESSABLE_ENTITY)
        .count();
    assert_eq!((ok, refused), (10, 14), "{statuses:?}");
    let b = balance(&app, "cus_7").await;
    assert_eq!(b["available"], 0);
    let (posted, held, _) = triple(&b);
    // Rows: the credit and ten transfers; debits and holds as answered.
    assert_eq!(app.count("SELECT count(*) FROM ledger_transfer").await, 11);
    let debits = app
        .count("SELECT count(*) FROM ledger_transfer WHERE code = 'debit'")
        .await;
    let holds = app
        .count("SELECT count(*) FROM ledger_transfer WHERE code = 'hold'")
        .await;
    assert_eq!(debits + holds, 10);
    assert_eq!((posted, held), (1000 - 100 * debits, 100 * holds));
    assert_eq!(
        app.count(
            "SELECT count(*) FROM ledger_account
              WHERE posted < 0 OR held < 0 OR held > posted"
        )
        .await,
        0
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM event WHERE type IN ('balance.debited', 'balance_hold.created')"
        )
        .await,
        10
    );
    ledger_holds(&app).await;
}

#[tokio::test]
async fn concurrent_captures_and_releases_of_one_hold_have_one_outcome() {
    let app = spawn_app().await;
    credit(&app, "cus_8", 1000).await;
    let h = hold(&app, "cus_8", 600, None).await;
    let id = h["id"].as_str().expect("id").to_string();
    let mut requests = Vec::new();
    for i in 0..16 {
        let verb = if i % 2 == 0 { "capture" } else { "release" };
        requests.push((format!("/balance_holds/{id}/{verb}"), json!({})));
    }
    let statuses = fire(&app, requests).await;
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let conflicts = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((ok, conflicts), (1, 15), "{statuses:?}");
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM ledger_transfer WHERE pending_id = '{id}'"
        ))
        .await,
        1
    );
    let status = app.status_of(&format!("/balance_holds/{id}")).await;
    let expected = match status.as_str() {
        "captured" => (400, 0, 400),
        "released" => (1000, 0, 1000),
        other => panic!("{other}"),
    };
    assert_eq!(triple(&balance(&app, "cus_8").await), expected);
    assert_eq!(events_of(&app, &id).await.len(), 2);
    ledger_holds(&app).await;
}

#[tokio::test]
async fn transactions_page_newest_first_with_cursors_and_a_currency_filter() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for amount in [1, 2, 3] {
        ids.push(credit(&app, "cus_9", amount).await["id"].clone());
    }
    let r = app
        .post(
            "/customers/cus_9/balance/credits",
            &key(),
            &json!({"amount": 4, "currency": "USD"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let usd = json_of(r).await;
    credit(&app, "someone_else", 9).await;

    let page = json_of(
        app.get("/customers/cus_9/balance/transactions?limit=2")
            .await,
    )
    .await;
    assert_eq!(page["has_more"], true);
    assert_eq!(page["data"][0]["id"], usd["id"]);
    assert_eq!(page["data"][1]["id"], ids[2]);
    let next = json_of(
        app.get(&format!(
            "/customers/cus_9/balance/transactions?limit=2&starting_after={}",
            ids[2].as_str().expect("id")
        ))
        .await,
    )
    .await;
    assert_eq!(next["has_more"], false);
    assert_eq!(next["data"][0]["id"], ids[1]);
    assert_eq!(next["data"][1]["id"], ids[0]);
    let eur = json_of(
        app.get("/customers/cus_9/balance/transactions?currency=EUR")
            .await,
    )
    .await;
    assert_eq!(eur["data"].as_array().expect("data").len(), 3);
    let usd_page = json_of(
        app.get("/customers/cus_9/balance/transactions?currency=USD")
            .await,
    )
    .await;
    assert_eq!(usd_page["data"].as_array().expect("data").len(), 1);
    for bad in ["currency=eur", "limit=0", "status=held", "customer_id=x"] {
        let r = app
            .get(&format!("/customers/cus_9/balance/transactions?{bad}"))
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let none = json_of(app.get("/customers/nobody/balance/transactions").await).await;
    assert_eq!(none["data"], json!([]));
}

#[tokio::test]
async fn the_database_refuses_edits_negative_balances_and_second_resolutions() {
    let app = spawn_app().await;
    let c = credit(&app, "cus_10", 100).await;
    let h = hold(&app, "cus_10", 40, None).await;
    let id = c["id"].as_str().expect("id");
    for sql in [
        format!("UPDATE ledger_transfer SET amount = 1 WHERE id = '{id}'"),
        format!("DELETE FROM ledger_transfer WHERE id = '{id}'"),
        "TRUNCATE ledger_transfer CASCADE".to_string(),
        "DELETE FROM ledger_account".to_string(),
        "UPDATE ledger_account SET owner = 'x'".to_string(),
        // A transfer above what the customer has, written behind the
        // service's back: the account's CHECK refuses it.
        format!(
            "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                    credit_account_id, amount, phase, code, holder_account_id, holder)
             SELECT gen_random_uuid(), t.merchant_id, t.ledger, t.unit, t.credit_account_id,
                    t.debit_account_id, 61, 'single', 'debit', t.holder_account_id, t.holder
               FROM ledger_transfer t WHERE t.id = '{id}'"
        ),
        // The hold posted above itself, then twice.
        format!(
            "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                    credit_account_id, amount, phase, pending_id, code, holder_account_id, holder)
             SELECT gen_random_uuid(), t.merchant_id, t.ledger, t.unit, t.debit_account_id,
                    t.credit_account_id, 41, 'post', t.id, 'hold_capture', t.holder_account_id,
                    t.holder
               FROM ledger_transfer t WHERE t.id = '{}'",
            h["id"].as_str().expect("id")
        ),
    ] {
        let refused = sqlx::query(&sql).execute(&app.db).await;
        assert!(refused.is_err(), "refused: {sql}");
    }
    let post = format!(
        "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                credit_account_id, amount, phase, pending_id, code, holder_account_id, holder)
         SELECT gen_random_uuid(), t.merchant_id, t.ledger, t.unit, t.debit_account_id,
                t.credit_account_id, 40, 'post', t.id, 'hold_capture', t.holder_account_id,
                t.holder
           FROM ledger_transfer t WHERE t.id = '{}'",
        h["id"].as_str().expect("id")
    );
    sqlx::query(&post).execute(&app.db).await.expect("one post");
    let twice = sqlx::query(&post).execute(&app.db).await;
    assert!(
        twice
            .as_ref()
            .err()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.constraint())
            == Some("ledger_transfer_resolved_once"),
        "{twice:?}"
    );
    assert_eq!(triple(&balance(&app, "cus_10").await), (60, 0, 60));
    ledger_holds(&app).await;
}

/// Runs `oncepay ledger check` with the service's environment.
async fn ledger_check(app: &TestApp, args: &[&str]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.args(["ledger", "check"])
        .args(args)
        .env("ONCEPAY_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in &app.serve_env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("oncepay ledger check runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test]
async fn ledger_check_prints_a_line_per_merchant_and_unit_and_fails_on_a_breach() {
    let app = spawn_app().await;
    credit(&app, "cus_11", 500).await;
    let r = app
        .post(
            "/customers/cus_11/balance/credits",
            &key(),
            &json!({"amount": 7, "currency": "USD"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    hold(&app, "cus_11", 100, None).await;
    let (ok, out) = ledger_check(&app, &[]).await;
    assert!(ok, "{out}");
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("merchant-a\t"))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(
        lines[0].contains("\tEUR\t") && lines[0].ends_with("\tok"),
        "{out}"
    );
    assert!(
        lines[1].contains("\tUSD\t") && lines[1].ends_with("\tok"),
        "{out}"
    );
    let (ok, out) = ledger_check(&app, &["--merchant", "merchant-a"]).await;
    assert!(ok, "{out}");
    let (ok, out) = ledger_check(&app, &["--merchant", "nobody"]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("no merchant named"), "{out}");

    // A holder's row changed behind the ledger's back, by someone who
    // could set the database's guard aside (its owner, with DDL): the
    // check finds it.
    let mut conn = app.db.acquire().await.expect("a connection");
    for sql in [
        "ALTER TABLE ledger_account DISABLE TRIGGER ledger_account_guard",
        "UPDATE ledger_account SET posted = posted + 1 WHERE owner = 'cus_11' AND unit = 'EUR'",
        "ALTER TABLE ledger_account ENABLE TRIGGER ledger_account_guard",
    ] {
        sqlx::query(sql)
            .execute(&mut *conn)
            .await
            .expect("an owner may");
    }
    drop(conn);
    let (ok, out) = ledger_check(&app, &[]).await;
    assert!(!ok, "{out}");
    assert!(out.contains("BREACH"), "{out}");
    assert!(out.contains("breaks its rules"), "{out}");
}

#[tokio::test]
async fn paying_with_the_balance_succeeds_at_once_or_fails_and_its_refund_credits_it_back() {
    let app = spawn_app().await;
    // order_body: cus_42, EUR, 2800.
    let order_id = app.create_order().await;
    let (status, failed) = app.pay(&order_id, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{failed}");
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["failure_code"], "insufficient_funds");
    assert_eq!(failed["provider"], "balance");
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "awaiting_payment"
    );

    credit(&app, "cus_42", 3000).await;
    let (status, paid) = app.pay(&order_id, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    assert_eq!(app.status_of(&format!("/orders/{order_id}")).await, "paid");
    assert_eq!(triple(&balance(&app, "cus_42").await), (200, 0, 200));
    let list = json_of(app.get("/customers/cus_42/balance/transactions").await).await;
    let payment_tx = &list["data"][0];
    assert_eq!(payment_tx["type"], "payment");
    assert_eq!(payment_tx["amount"], 2800);
    assert_eq!(payment_tx["payment_id"], paid["id"]);
    assert_eq!(
        events_of(&app, payment_tx["id"].as_str().expect("id")).await,
        ["balance.debited"]
    );

    // A refund of it goes back to the balance, once.
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app.post(&path, "refund-1", &json!({"amount": 800})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "succeeded");
    let again = app.post(&path, "refund-1", &json!({"amount": 800})).await;
    assert_eq!(json_of(again).await, refund);
    assert_eq!(triple(&balance(&app, "cus_42").await), (1000, 0, 1000));
    let list = json_of(app.get("/customers/cus_42/balance/transactions").await).await;
    assert_eq!(list["data"][0]["type"], "refund");
    assert_eq!(list["data"][0]["refund_id"], refund["id"]);
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_transfer WHERE code IN ('payment', 'refund')")
            .await,
        2
    );
    // The hosted checkout never spends store credit.
    let other = app.create_order().await;
    let url = app.checkout_url(&other).await;
    let r = app.pay_on_page(&url, &key(), "balance").await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    ledger_holds(&app).await;
}

#[tokio::test]
async fn a_card_payment_refunded_to_the_balance_credits_the_customer_within_the_cap() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (_, paid) = app.pay(&order_id, "tok_visa").await;
    assert_eq!(paid["status"], "succeeded");
    let path = format!("/payments/{}/refunds", paid["id"].as_str().expect("id"));
    let r = app
        .post(
            &path,
            &key(),
            &json!({"amount": 500, "destination": "elsewhere"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let r = app
        .post(
            &path,
            "to-balance",
            &json!({"amount": 500, "destination": "balance"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let refund = json_of(r).await;
    assert_eq!(refund["status"], "succeeded");
    assert_eq!(refund["destination"], "balance");
    assert_eq!(triple(&balance(&app, "cus_42").await), (500, 0, 500));
    // Nothing went back to the card.
    assert_eq!(app.ledger().await["totals"]["refunds"], 0);
    let replay = app
        .post(
            &path,
            "to-balance",
            &json!({"amount": 500, "destination": "balance"}),
        )
        .await;
    assert_eq!(json_of(replay).await, refund);
    // It counts against the payment's cap like any refund.
    let r = app
        .post(
            &path,
            &key(),
            &json!({"amount": 2301, "destination": "balance"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(json_of(r).await["code"], "refund_exceeds_payment");
    let r = app.post(&path, &key(), &json!({"amount": 2300})).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["destination"], "original");
    assert_eq!(app.ledger().await["totals"]["refunds"], 1);
    assert_eq!(triple(&balance(&app, "cus_42").await), (500, 0, 500));
    ledger_holds(&app).await;
}

#[tokio::test]
async fn after_its_record_expired_a_key_finds_the_transfer_it_made() {
    let app = spawn_app().await;
    let path = "/customers/cus_12/balance/credits";
    let body = json!({"amount": 250, "currency": "EUR"});
    let r = app.post(path, "old-key", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let first = json_of(r).await;
    // The sweeper deleted the record (24 h later); the transfer keeps the key.
    sqlx::query("DELETE FROM idempotency_record WHERE idempotency_key = 'old-key'")
        .execute(&app.db)
        .await
        .expect("deleted");
    let r = app.post(path, "old-key", &body).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["id"], first["id"], "the same transaction");
    assert_eq!(triple(&balance(&app, "cus_12").await), (250, 0, 250));
    // Another movement under that key is refused, not made.
    sqlx::query("DELETE FROM idempotency_record WHERE idempotency_key = 'old-key'")
        .execute(&app.db)
        .await
        .expect("deleted");
    let r = app
        .post(path, "old-key", &json!({"amount": 999, "currency": "EUR"}))
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "idempotency_key_reused");
    assert_eq!(app.count("SELECT count(*) FROM ledger_transfer").await, 1);
}
