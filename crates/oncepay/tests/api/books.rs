//! Reconciliation against the provider's books (`oncepay reconcile`, the
//! restore guard): rows the database lost are rebuilt from the provider's
//! metadata, orphans are refunded once, disagreements become incidents.
//! Rows are "lost" the way a restore loses them: everything written from
//! the moment the attempt was created is deleted.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::Row;
use uuid::Uuid;

use crate::helpers::{json_of, spawn_app, TestApp};
use oncepay_testkit::ready;

/// Deletes what a restore to just before `payment_id`'s attempt would
/// lose: the attempt, its refunds, their events and idempotency records,
/// provider events received since, and the order's move to paid.
pub(crate) async fn lose_payment(app: &TestApp, payment_id: &str) {
    let id = Uuid::parse_str(payment_id).unwrap();
    let mut tx = app.db.begin().await.unwrap();
    let row = sqlx::query("SELECT order_id, created_at FROM payment_attempt WHERE id = $1")
        .bind(id)
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let order: Uuid = row.get("order_id");
    let since: chrono::DateTime<chrono::Utc> = row.get("created_at");
    // Locks in the service's order (order, then payment, then refund), so
    // a webhook settling the same rows meanwhile waits instead of a
    // deadlock.
    for sql in [
        "SELECT 1 FROM orders WHERE id = $2 AND $1::uuid IS NOT NULL AND $3::timestamptz IS NOT NULL FOR UPDATE",
        "SELECT 1 FROM payment_attempt WHERE id = $1 AND order_id = $2 AND $3::timestamptz IS NOT NULL FOR UPDATE",
        "DELETE FROM idempotency_record WHERE resource_id = $1
            OR resource_id IN (SELECT id FROM refund WHERE payment_id = $1)",
        "DELETE FROM event WHERE order_id = $2 AND created_at >= $3",
        "DELETE FROM webhook_event WHERE received_at >= $3",
        "DELETE FROM refund WHERE payment_id = $1",
        "DELETE FROM payment_capture WHERE payment_id = $1",
        "DELETE FROM payment_attempt WHERE id = $1",
        "UPDATE orders SET status = 'awaiting_payment' WHERE id = $2",
    ] {
        sqlx::query(sql)
            .bind(id)
            .bind(order)
            .bind(since)
            .execute(&mut *tx)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    tx.commit().await.unwrap();
}

/// Runs `oncepay reconcile` with the service's environment; returns
/// whether it succeeded, with its output.
pub(crate) async fn reconcile(app: &TestApp, args: &[&str]) -> (bool, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.arg("reconcile")
        .args(args)
        .env("ONCEPAY_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in &app.serve_env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("oncepay reconcile runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The report's row of the sandbox: matched, adopted, refunded, held,
/// mismatched, missing.
fn sandbox_counts(report: &str) -> [i64; 6] {
    counts(report, "sandbox")
}

/// The report's row of `provider`.
pub(crate) fn counts(report: &str, provider: &str) -> [i64; 6] {
    let line = report
        .lines()
        .find(|l| l.starts_with(&format!("{provider}\t")))
        .unwrap_or_else(|| panic!("no {provider} row in:\n{report}"));
    let n: Vec<i64> = line
        .split('\t')
        .skip(1)
        .take(6)
        .map(|v| v.parse().expect("a count"))
        .collect();
    [n[0], n[1], n[2], n[3], n[4], n[5]]
}

/// The report's `reversed` and `disputes` of `provider`: what reading
/// back what only webhooks carry applied.
pub(crate) fn read_back_counts(report: &str, provider: &str) -> (i64, i64) {
    let line = report
        .lines()
        .find(|l| l.starts_with(&format!("{provider}\t")))
        .unwrap_or_else(|| panic!("no {provider} row in:\n{report}"));
    let n: Vec<i64> = line
        .split('\t')
        .skip(7)
        .take(2)
        .map(|v| v.parse().expect("a count"))
        .collect();
    (n[0], n[1])
}

async fn pay_with_key(app: &TestApp, order: &str, key: &str, token: &str) -> (StatusCode, Value) {
    let r = app
        .post(
            "/payments",
            key,
            &json!({"order_id": order, "payment_method": token}),
        )
        .await;
    (r.status(), json_of(r).await)
}

#[tokio::test]
async fn a_charge_whose_rows_were_lost_is_adopted_and_the_clients_retry_gets_its_answer() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (status, paid) = pay_with_key(&app, &order, "pay-key-1", "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    let payment = paid["id"].as_str().unwrap().to_string();
    let refund = app
        .post(
            &format!("/payments/{payment}/refunds"),
            "refund-key-1",
            &json!({"amount": 500, "reason": "one pen returned"}),
        )
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    let refund = json_of(refund).await;
    lose_payment(&app, &payment).await;
    assert_eq!(app.get(&format!("/payments/{payment}")).await.status(), 404);

    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    let [_, adopted, refunded, _, mismatched, missing] = sandbox_counts(&report);
    assert_eq!(
        (adopted, refunded, mismatched, missing),
        (2, 0, 0, 0),
        "{report}"
    );

    // The client retries with its keys: the very payment and refund.
    let (status, again) = pay_with_key(&app, &order, "pay-key-1", "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again["id"], paid["id"]);
    assert_eq!(again["status"], "succeeded");
    assert_eq!(again["provider_charge_id"], paid["provider_charge_id"]);
    let r = app
        .post(
            &format!("/payments/{payment}/refunds"),
            "refund-key-1",
            &json!({"amount": 500, "reason": "one pen returned"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let again = json_of(r).await;
    assert_eq!(
        (&again["id"], &again["status"]),
        (&refund["id"], &refund["status"])
    );
    assert_eq!(again["reason"], "one pen returned");
    // Another body under the key is still refused as a reused key.
    let (status, refused) = pay_with_key(&app, &order, "pay-key-1", "tok_declined").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(refused["code"], "idempotency_key_reused");

    // The order and the books agree again: paid, one charge, one refund.
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
    assert_eq!(
        json_of(app.get(&format!("/payments/{payment}")).await).await["refunded_amount"],
        500
    );
    let ledger = app.ledger().await;
    assert_eq!(app.charges_for(&order).await.len(), 1);
    assert_eq!(ledger["totals"]["refunds"], 1);
    // Its events are written again for the merchant.
    let events = app
        .count(&format!(
            "SELECT count(*) FROM event WHERE object_id = '{payment}' AND type = 'payment.succeeded'"
        ))
        .await;
    assert_eq!(events, 1);

    // A second run finds everything in place.
    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok);
    assert_eq!(sandbox_counts(&report), [2, 0, 0, 0, 0, 0], "{report}");
}

/// A manual payment of a new order, held: `(order, payment)`.
async fn held(app: &TestApp) -> (String, Value) {
    let order = app.create_order().await;
    let r = app
        .post(
            "/payments",
            "hold-key",
            &json!({"order_id": order, "payment_method": "tok_visa", "capture_method": "manual"}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let held = json_of(r).await;
    assert_eq!(held["status"], "requires_capture");
    (order, held)
}

#[tokio::test]
async fn an_authorization_whose_rows_were_lost_is_adopted_as_a_hold_never_captured() {
    let app = spawn_app().await;
    let (order, held) = held(&app).await;
    let payment = held["id"].as_str().unwrap().to_string();
    lose_payment(&app, &payment).await;
    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    assert_eq!(sandbox_counts(&report)[1], 1, "adopted: {report}");
    let adopted = json_of(app.get(&format!("/payments/{payment}")).await).await;
    assert_eq!(adopted["status"], "requires_capture", "{adopted}");
    assert_eq!(adopted["capture_method"], "manual");
    assert_eq!(adopted["capture_before"], held["capture_before"]);
    assert_eq!(
        app.status_of(&format!("/orders/{order}")).await,
        "authorized"
    );
    let ledger = app.ledger().await;
    assert!(
        ledger["captures"].as_array().unwrap().is_empty(),
        "never captured blindly: {ledger}"
    );
    assert_eq!(ledger["charges"][0]["status"], "authorized");
    // The merchant captures it as any hold.
    let r = app
        .post(&format!("/payments/{payment}/capture"), "cap", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(app.ledger().await["captures"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn an_authorization_whose_order_is_gone_is_voided_not_captured_nor_refunded() {
    let app = spawn_app().await;
    let (order, held) = held(&app).await;
    let payment = held["id"].as_str().unwrap().to_string();
    lose_payment(&app, &payment).await;
    for sql in [
        "DELETE FROM event WHERE order_id = $1",
        "DELETE FROM idempotency_record WHERE resource_id = $1",
        "DELETE FROM orders WHERE id = $1",
    ] {
        sqlx::query(sql)
            .bind(Uuid::parse_str(&order).unwrap())
            .execute(&app.db)
            .await
            .unwrap();
    }
    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    let ledger = app.ledger().await;
    assert_eq!(ledger["charges"][0]["status"], "voided", "{ledger}");
    assert!(ledger["captures"].as_array().unwrap().is_empty());
    assert_eq!(ledger["totals"]["refunds"], 0);
    let resolution: String = sqlx::query_scalar(
        "SELECT resolution FROM incident WHERE kind = 'orphan_charge' AND provider_object_id = $1",
    )
    .bind(held["provider_charge_id"].as_str().unwrap())
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(resolution, "voided");
}

#[tokio::test]
async fn a_charge_whose_order_is_gone_is_refunded_once_as_an_incident() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (status, paid) = app.pay(&order, "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    let payment = paid["id"].as_str().unwrap().to_string();
    lose_payment(&app, &payment).await;
    for sql in [
        "DELETE FROM checkout_session WHERE order_id = $1",
        "DELETE FROM event WHERE order_id = $1",
        "DELETE FROM idempotency_record WHERE resource_id = $1",
        "DELETE FROM orders WHERE id = $1",
    ] {
        sqlx::query(sql)
            .bind(Uuid::parse_str(&order).unwrap())
            .execute(&app.db)
            .await
            .unwrap();
    }

    let (ok, dry) = reconcile(&app, &["--since", "1h", "--dry-run"]).await;
    assert!(ok, "{dry}");
    assert_eq!(sandbox_counts(&dry)[2], 1, "the dry run says: {dry}");
    assert_eq!(
        app.ledger().await["totals"]["refunds"],
        0,
        "a dry run moves nothing"
    );

    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    assert_eq!(sandbox_counts(&report)[2], 1, "{report}");
    let (ok, again) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok);
    assert_eq!(sandbox_counts(&again)[2], 0, "{again}");

    let ledger = app.ledger().await;
    let refunds = ledger["refunds"].as_array().unwrap();
    assert_eq!(refunds.len(), 1, "refunded once: {ledger}");
    assert_eq!(refunds[0]["charge"], paid["provider_charge_id"]);
    assert_eq!(refunds[0]["amount"], paid["amount"]);
    assert_eq!(refunds[0]["status"], "succeeded");
    let incident = sqlx::query(
        "SELECT resolution, amount FROM incident WHERE kind = 'orphan_charge' AND provider_object_id = $1",
    )
    .bind(paid["provider_charge_id"].as_str().unwrap())
    .fetch_one(&app.db)
    .await
    .unwrap();
    assert_eq!(incident.get::<String, _>("resolution"), "refunded");
    assert_eq!(
        incident.get::<i64, _>("amount"),
        paid["amount"].as_i64().unwrap()
    );
}

#[tokio::test]
async fn rows_that_disagree_with_the_books_and_rows_the_books_lack_are_incidents() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, paid) = app.pay(&order, "tok_visa").await;
    let payment = Uuid::parse_str(paid["id"].as_str().unwrap()).unwrap();
    sqlx::query(
        "UPDATE payment_attempt SET amount = amount - 1, amount_captured = amount_captured - 1
          WHERE id = $1",
    )
    .bind(payment)
    .execute(&app.db)
    .await
    .unwrap();
    // A succeeded row whose charge the provider never made.
    let other = app.create_order().await;
    sqlx::query(
        "INSERT INTO payment_attempt (id, merchant_id, order_id, idempotency_key, amount, currency,
             status, provider, payment_method, provider_charge_id, next_check_at, created_at, updated_at)
         SELECT $1, merchant_id, id, 'k-ghost', amount, currency, 'succeeded', 'sandbox', 'tok_visa',
                'ch_ghost', now(), now() - interval '10 minutes', now()
           FROM orders WHERE id = $2",
    )
    .bind(Uuid::now_v7())
    .bind(Uuid::parse_str(&other).unwrap())
    .execute(&app.db)
    .await
    .unwrap();

    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    let [_, adopted, _, _, mismatched, missing] = sandbox_counts(&report);
    assert_eq!((adopted, mismatched, missing), (0, 1, 1), "{report}");
    let kinds = |kind: &'static str| {
        let db = app.db.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT count(*) FROM incident WHERE kind = $1")
                .bind(kind)
                .fetch_one(&db)
                .await
                .unwrap()
        }
    };
    assert_eq!(kinds("books_mismatch").await, 1);
    assert_eq!(kinds("missing_at_provider").await, 1);
    // Seen again, recorded once.
    let (ok, _) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok);
    assert_eq!(kinds("books_mismatch").await, 1);
    assert_eq!(kinds("missing_at_provider").await, 1);
    let metrics = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("oncepay_books_objects_total{outcome=\"adopted\"}"));
}

/// Orders paid and then lost, so that a run has work on every object.
async fn lost_payments(app: &TestApp, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let order = app.create_order().await;
        let (status, paid) = app.pay(&order, "tok_visa").await;
        assert_eq!(status, StatusCode::CREATED);
        ids.push(paid["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        lose_payment(app, id).await;
    }
    ids
}

#[tokio::test]
async fn a_run_cut_off_by_a_crash_is_resumed_from_its_high_water_mark() {
    let app = spawn_app().await;
    // Three pages of the sandbox's list (100 a page).
    let lost = lost_payments(&app, 230).await;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.args(["reconcile", "--since", "1h"])
        .env("ONCEPAY_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in &app.serve_env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    // Killed once its first page is stored, not before.
    let first_page = ready::until(Duration::from_secs(60), || async {
        app.count("SELECT count(*) FROM books_run WHERE adopted >= 100 AND finished_at IS NULL")
            .await
            == 1
    })
    .await;
    child.kill().await.unwrap();
    assert!(first_page.is_ok(), "the first page was never stored");
    let cut =
        sqlx::query("SELECT id, phase, position > window_from AS moved, adopted FROM books_run")
            .fetch_one(&app.db)
            .await
            .unwrap();
    let run: Uuid = cut.get("id");
    assert!(cut.get::<bool, _>("moved"), "the high-water mark moved");
    assert!(cut.get::<i64, _>("adopted") < 230, "it was cut off");

    let (ok, report) = reconcile(&app, &["--since", "1h"]).await;
    assert!(ok, "{report}");
    // The cut run was finished (not started again beside itself), then a
    // new run found everything in place.
    let resumed =
        sqlx::query("SELECT finished_at IS NOT NULL AS done, adopted FROM books_run WHERE id = $1")
            .bind(run)
            .fetch_one(&app.db)
            .await
            .unwrap();
    assert!(resumed.get::<bool, _>("done"));
    assert_eq!(resumed.get::<i64, _>("adopted"), 230);
    assert_eq!(sandbox_counts(&report)[1], 0, "{report}");
    assert_eq!(app.count("SELECT count(*) FROM books_run").await, 2);
    let rebuilt = app
        .count("SELECT count(*) FROM payment_attempt WHERE status = 'succeeded'")
        .await;
    assert_eq!(rebuilt, lost.len() as i64);
}

#[tokio::test]
async fn two_processes_never_reconcile_at_once_and_each_orphan_is_refunded_once() {
    let app = spawn_app().await;
    let lost = lost_payments(&app, 12).await;
    // Their orders are paid again by other attempts: each lost charge is
    // an orphan, refunded by whichever process reconciles.
    for id in &lost {
        let order: Uuid = sqlx::query_scalar(
            "SELECT o.id FROM orders o WHERE o.status = 'awaiting_payment' LIMIT 1",
        )
        .fetch_one(&app.db)
        .await
        .unwrap();
        let (status, _) = app.pay(&order.to_string(), "tok_visa").await;
        assert_eq!(status, StatusCode::CREATED, "{id}");
    }
    let (a, b) = tokio::join!(
        reconcile(&app, &["--since", "1h"]),
        reconcile(&app, &["--since", "1h"])
    );
    for (ok, text) in [&a, &b] {
        assert!(
            *ok || text.contains("another process is reconciling"),
            "{text}"
        );
    }
    let refunded: i64 = [&a, &b]
        .iter()
        .filter(|(ok, _)| *ok)
        .map(|(_, t)| sandbox_counts(t)[2])
        .sum();
    assert_eq!(refunded, 12, "{a:?} {b:?}");
    let ledger = app.ledger().await;
    assert_eq!(ledger["totals"]["refunds"], 12, "each orphan refunded once");
    assert_eq!(ledger["totals"]["keys_with_more_than_one_effect"], 0);
    // Runs that did run never overlapped.
    let overlapping = app
        .count(
            "SELECT count(*) FROM books_run a JOIN books_run b ON a.id < b.id
              WHERE NOT a.dry_run AND NOT b.dry_run
                AND a.started_at < b.finished_at AND b.started_at < a.finished_at",
        )
        .await;
    assert_eq!(overlapping, 0);
}

#[tokio::test]
async fn after_the_database_went_back_in_time_money_waits_for_the_books_and_reads_do_not() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, paid) = pay_with_key(&app, &order, "before-restore", "tok_visa").await;
    let payment = paid["id"].as_str().unwrap().to_string();
    // Let the guard record the database's lineage, then "restore": the
    // rows since the payment are gone and the stored timeline is not the
    // database's any more.
    ready::until(Duration::from_secs(10), || async {
        app.count("SELECT count(*) FROM database_lineage").await == 1
    })
    .await
    .unwrap();
    lose_payment(&app, &payment).await;
    // Hold the books lock, as a reconciliation under way elsewhere would.
    let mut holder = app.db.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(oncepay::store::books::BOOKS_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("UPDATE database_lineage SET timeline = timeline + 1000")
        .execute(&app.db)
        .await
        .unwrap();
    let closed = ready::until(Duration::from_secs(10), || async {
        app.create_order_status().await == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(closed.is_ok(), "money commands never waited");
    let refused = app
        .post(
            "/orders",
            &Uuid::new_v4().to_string(),
            &crate::helpers::order_body(),
        )
        .await;
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(json_of(refused).await["code"], "restore_reconciliation");
    // Reads keep working.
    assert_eq!(app.get(&format!("/orders/{order}")).await.status(), 200);

    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(oncepay::store::books::BOOKS_LOCK)
        .execute(&mut *holder)
        .await
        .unwrap();
    let open = ready::until(Duration::from_secs(20), || async {
        app.create_order_status().await == StatusCode::CREATED
    })
    .await;
    assert!(open.is_ok(), "money commands never resumed");
    // The gap was reconciled first: the lost payment is back, and the
    // client's retry gets it.
    let (status, again) = pay_with_key(&app, &order, "before-restore", "tok_visa").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(again["id"], paid["id"]);
    assert_eq!(app.charges_for(&order).await.len(), 1);
    assert_eq!(
        app.count(
            "SELECT count(*) FROM books_run WHERE trigger = 'restore' AND finished_at IS NOT NULL"
        )
        .await,
        1
    );
}

impl TestApp {
    async fn create_order_status(&self) -> StatusCode {
        self.post(
            "/orders",
            &Uuid::new_v4().to_string(),
            &crate::helpers::order_body(),
        )
        .await
        .status()
    }
}
