//! The ledger's edges (issue 54): the service's transfer keys apart from
//! its clients' (a client's Idempotency-Key can never take a key the
//! service will use; a key found on another transfer is an incident,
//! never reused), totals that change only through a transfer (refused by
//! the database to the service's own role), and `oncepay ledger check`
//! holding the ledger against payments and refunds.

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use crate::inventory::{count, id, key, ledger_holds, levels, order_of, order_with, pay};

async fn credit(app: &TestApp, customer: &str, amount: i64) {
    let r = app
        .post(
            &format!("/customers/{customer}/balance/credits"),
            &key(),
            &json!({"amount": amount, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

async fn balance(app: &TestApp, customer: &str) -> Value {
    json_of(
        app.get(&format!("/customers/{customer}/balance?currency=EUR"))
            .await,
    )
    .await
}

/// A client's adjustment sent under the key the service will use for an
/// order's sale (`sale:<order>:<sku>`): before issue 54 the sale found
/// the key taken and the payment could never settle; the keys now live in
/// spaces of their own.
#[tokio::test]
async fn a_clients_key_never_takes_a_key_the_service_will_use() {
    let app = spawn_app().await;
    let r = app
        .post(
            "/inventory/book/adjustments",
            &key(),
            &json!({"quantity": 1}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let (status, order) = order_with(&app, &key(), &order_of(&[("book", 1)], false)).await;
    assert_eq!(status, StatusCode::CREATED, "{order}");
    let r = app
        .post(
            "/inventory/book/adjustments",
            &format!("sale:{}:book", id(&order)),
            &json!({"quantity": 1}),
        )
        .await;
    assert_eq!(
        r.status(),
        StatusCode::CREATED,
        "the client's key is its own"
    );
    assert_eq!(levels(&app, "book").await, (2, 0, 2));
    let payment = pay(&app, &id(&order), json!({"payment_method": "tok_visa"})).await;
    assert_eq!(payment["status"], "succeeded", "{payment}");
    let now = json_of(app.get(&format!("/orders/{}", id(&order))).await).await;
    assert_eq!(now["status"], "paid");
    assert_eq!(now["stock_shortfall"], json!([]), "{now}");
    assert_eq!(levels(&app, "book").await, (1, 0, 1), "sold once");
    assert_eq!(
        count(
            &app,
            &format!(
                "SELECT count(*) FROM ledger_transfer WHERE code = 'sale' AND order_id = '{}'",
                id(&order)
            )
        )
        .await,
        1
    );
    ledger_holds(&app).await;
}

/// A transfer found under the key of a payment from a balance that is not
/// that payment's transfer (another amount): it is not taken for the
/// payment (which would have called the failed payment charged and
/// refunded it), but recorded once as a `ledger_key_conflict` incident.
#[tokio::test]
async fn a_service_key_found_on_another_transfer_is_an_incident_never_reused() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_RECONCILE_AFTER", "100ms")).await;
    let order_id = app.create_order().await;
    credit(&app, "cus_42", 100).await;
    let (status, failed) = app.pay(&order_id, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{failed}");
    assert_eq!(failed["failure_code"], "insufficient_funds");
    let payment_id = Uuid::parse_str(failed["id"].as_str().unwrap()).unwrap();
    // Another transfer under that payment's key: 1 cent, not 2,800.
    let planted = sqlx::query(
        "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                credit_account_id, amount, phase, code, holder_account_id, holder, payment_id,
                idempotency_key, key_space)
         SELECT gen_random_uuid(), a.merchant_id, 'balance', 'EUR', a.id, s.id, 1, 'single',
                'payment', a.id, a.owner, $1, 'payment:' || $1::text, 'service'
           FROM ledger_account a JOIN ledger_account s
             ON s.merchant_id = a.merchant_id AND s.ledger = 'balance' AND s.unit = 'EUR'
            AND s.kind = 'system' AND s.owner = 'payments'
          WHERE a.ledger = 'balance' AND a.owner = 'cus_42'",
    )
    .bind(payment_id)
    .execute(&app.db)
    .await
    .expect("a transfer under the payment's key");
    assert_eq!(planted.rows_affected(), 1);
    let found = oncepay_testkit::ready::until(std::time::Duration::from_secs(15), || async {
        oncepay::workers::reconciler::pass(&app.ctx).await.ok();
        app.count("SELECT count(*) FROM incident WHERE kind = 'ledger_key_conflict'")
            .await
            > 0
    })
    .await;
    assert!(found.is_ok(), "no incident recorded");
    // Once, however many reads found it.
    oncepay::workers::reconciler::pass(&app.ctx).await.ok();
    assert_eq!(
        app.count("SELECT count(*) FROM incident").await,
        1,
        "only the key's incident: no charge taken for the failed payment"
    );
    assert_eq!(app.count("SELECT count(*) FROM refund").await, 0);
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "failed"
    );
}

/// Totals change only through a transfer, for every role, the service's
/// own included; the open holds are the transfers' own list.
#[tokio::test]
async fn ledger_totals_change_only_through_transfers() {
    let app = spawn_app().await;
    credit(&app, "cus_1", 500).await;
    let r = app
        .post(
            "/customers/cus_1/balance/holds",
            &key(),
            &json!({"amount": 100, "currency": "EUR"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    for sql in [
        "UPDATE ledger_account SET posted = posted + 100 WHERE owner = 'cus_1'",
        "UPDATE ledger_account SET held = 0 WHERE owner = 'cus_1'",
        "INSERT INTO ledger_account (id, merchant_id, ledger, unit, kind, owner, posted)
         SELECT gen_random_uuid(), merchant_id, 'balance', 'USD', 'holder', 'cus_1', 100
           FROM ledger_account LIMIT 1",
        "TRUNCATE ledger_account CASCADE",
        "DELETE FROM ledger_open_pending",
        "TRUNCATE ledger_open_pending",
        // A transfer naming another holder than its account's owner.
        "INSERT INTO ledger_transfer (id, merchant_id, ledger, unit, debit_account_id,
                credit_account_id, amount, phase, code, holder_account_id, holder)
         SELECT gen_random_uuid(), a.merchant_id, 'balance', 'EUR', s.id, a.id, 1, 'single',
                'credit', a.id, 'cus_2'
           FROM ledger_account a JOIN ledger_account s
             ON s.merchant_id = a.merchant_id AND s.ledger = 'balance' AND s.kind = 'system'
            AND s.unit = 'EUR' AND s.owner = 'credit_issued'
          WHERE a.owner = 'cus_1'",
    ] {
        let e = sqlx::query(sql)
            .execute(&app.db)
            .await
            .expect_err("refused");
        let text = e.to_string();
        assert!(
            text.contains("ledger transfer") || text.contains("append-only"),
            "{sql}: {text}"
        );
    }
    let b = balance(&app, "cus_1").await;
    assert_eq!(
        (&b["posted"], &b["held"], &b["available"]),
        (&json!(500), &json!(100), &json!(400)),
        "{b}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM ledger_open_pending").await,
        1
    );
}

/// `oncepay ledger check` holds the ledger against the payments it stands
/// for: a balance payment whose attempt is no longer succeeded (rows
/// changed behind the service's back) is a breach.
#[tokio::test]
async fn ledger_check_holds_the_ledger_against_payments() {
    let app = spawn_app().await;
    credit(&app, "cus_42", 3000).await;
    let order_id = app.create_order().await;
    let (status, paid) = app.pay(&order_id, "balance").await;
    assert_eq!(status, StatusCode::CREATED, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    let lines = oncepay::store::ledger::check(&app.db, None)
        .await
        .expect("check runs");
    assert!(lines.iter().all(|l| l.holds()), "{lines:?}");
    sqlx::query(
        "UPDATE payment_attempt SET status = 'failed', amount_captured = 0,
                failure_code = 'edited' WHERE id = $1::uuid",
    )
    .bind(paid["id"].as_str().unwrap())
    .execute(&app.db)
    .await
    .expect("an edit behind the service's back");
    let lines = oncepay::store::ledger::check(&app.db, None)
        .await
        .expect("check runs");
    let eur = lines
        .iter()
        .find(|l| l.ledger == "balance" && l.unit == "EUR")
        .expect("the EUR balance line");
    assert_eq!(eur.unmatched, 1, "{eur:?}");
    assert!(!eur.holds());
}

/// A balance hold's life is in the audit trail with its actor: created,
/// captured, released (issue 54: only credits and debits were).
#[tokio::test]
async fn balance_holds_are_audited_with_their_actor() {
    let app = spawn_app().await;
    credit(&app, "cus_1", 1000).await;
    let mut holds = Vec::new();
    for _ in 0..2 {
        let r = app
            .post(
                "/customers/cus_1/balance/holds",
                &key(),
                &json!({"amount": 100, "currency": "EUR"}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED);
        holds.push(json_of(r).await["id"].as_str().unwrap().to_string());
    }
    for (hold, action) in holds.iter().zip(["capture", "release"]) {
        let r = app
            .post(
                &format!("/balance_holds/{hold}/{action}"),
                &key(),
                &json!({}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{action}");
    }
    let audit = json_of(app.get("/audit_events?limit=100").await).await;
    let of_holds: Vec<(String, String)> = audit["data"]
        .as_array()
        .expect("audit")
        .iter()
        .filter(|e| e["target_type"] == "balance_hold")
        .inspect(|e| assert_eq!(e["actor_type"], "api_key", "{e}"))
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["target_id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (action, hold) in [
        ("balance_hold.created", &holds[0]),
        ("balance_hold.created", &holds[1]),
        ("balance_hold.captured", &holds[0]),
        ("balance_hold.released", &holds[1]),
    ] {
        assert!(
            of_holds.contains(&(action.to_string(), hold.clone())),
            "{action} {hold}: {audit}"
        );
    }
    assert_eq!(of_holds.len(), 4, "{audit}");
}
