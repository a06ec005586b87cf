//! The transfers scenario (issue 45): balance debits of 64 customers of
//! one merchant at once, each connection its own customer (credited
//! beforehand), every request a new key; against the same SQL on each
//! customer's own account alone, in the same run. Every debit of the
//! service has the merchant's system account `balance_spent` on its other
//! side: the ratio says whether that one hot account serializes them
//! (issue 45's bar: at least 0.8× the floor without it). The same SQL
//! *with* the merchant's account, run by pgbench too, tells the database's
//! share of any gap from the service's.

use std::sync::Arc;

use serde_json::json;

use crate::harness::{count, measure_floor, quiesce, verdict, Bench};
use crate::load::MakeRequest;
use crate::report::Row;
use crate::{cpu, floor, load};

/// How many customers (one per connection).
pub const CUSTOMERS: usize = 64;

/// What each customer is credited beforehand, and each debit takes.
const CREDIT: i64 = 100_000_000_000;
const DEBIT: i64 = 100;

/// The bar: transfers of one merchant's customers at least this
/// share of the same SQL without the merchant's account.
pub const BAR: f64 = 0.8;

fn customer(conn: usize) -> String {
    format!("cus_xfer_{}", conn % CUSTOMERS)
}

/// transfers: 64 customers of one merchant debited at once.
pub async fn transfers(b: &Bench<'_>) -> Result<Row, String> {
    let d = b.args.duration;
    let customers: Vec<String> = (0..CUSTOMERS).map(customer).collect();
    eprintln!("transfers: crediting {CUSTOMERS} customers beforehand ...");
    for (i, who) in customers.iter().enumerate() {
        let answer = b
            .client
            .post(format!("{}/customers/{who}/balance/credits", b.stack.base))
            .bearer_auth(&b.stack.api_key)
            .header("Idempotency-Key", format!("xfer-credit-{i}"))
            .json(&json!({"amount": CREDIT, "currency": "EUR"}))
            .send()
            .await
            .map_err(|e| format!("crediting {who}: {e}"))?;
        if answer.status().as_u16() != 201 {
            let status = answer.status();
            let body = answer.text().await.unwrap_or_default();
            return Err(format!("crediting {who} answered {status}: {body}"));
        }
    }
    let make: MakeRequest = {
        let (base, key) = (b.stack.base.clone(), b.stack.api_key.clone());
        Arc::new(move |client, conn, n| {
            client
                .post(format!(
                    "{base}/customers/{}/balance/debits",
                    customer(conn)
                ))
                .bearer_auth(&key)
                .header("Idempotency-Key", format!("debit-{conn}-{n}"))
                .json(&json!({"amount": DEBIT, "currency": "EUR"}))
        })
    };
    let before = debits(b).await?;
    eprintln!("transfers: {CUSTOMERS} connections, one customer each, {d:?} ...");
    quiesce(b).await;
    let meter = cpu::Meter::start(b.stack.watched());
    let outcome = load::run(CUSTOMERS, d, make).await;
    let spent = meter.stop().await;
    b.sample_rss();
    let ok = outcome.count(201) as i64;
    let made = debits(b).await? - before;
    // What the debits took, by the customers' rows and by the merchant's
    // account derived from its transfers: the same, and nothing negative.
    let (taken, spent_side): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT ($1 * count(*) - sum(posted))::bigint FROM ledger_account
                  WHERE kind = 'holder' AND owner LIKE 'cus_xfer_%'),
                (SELECT COALESCE(sum(amount), 0)::bigint FROM ledger_transfer
                  WHERE code = 'debit' AND holder LIKE 'cus_xfer_%')",
    )
    .bind(CREDIT)
    .fetch_one(b.db)
    .await
    .map_err(|e| e.to_string())?;
    let check = verdict(
        made == ok && taken == spent_side && taken == ok * DEBIT,
        format!(
            "{made} debit transfers for {ok} answers 201; the customers' rows lost {taken}, the merchant's account gained {spent_side}"
        ),
    );
    let mut row = Row {
        cpu: Some(spent.per(ok as f64)),
        ..Row::closed_loop("transfers", CUSTOMERS, outcome, check)
    };
    if !b.args.no_floor {
        floor::prepare_transfer_customers(b.db, b.merchant, &customers).await?;
        eprintln!("  floor (pgbench, each customer's own account) ...");
        quiesce(b).await;
        let own = floor::transfer_script(&b.fixture, false);
        row.floor = Some(measure_floor(b.stack, &own, CUSTOMERS, d).await?);
        eprintln!("  the same SQL with the merchant's account (pgbench) ...");
        quiesce(b).await;
        let shared = floor::transfer_script(&b.fixture, true);
        row.with_merchant_account = Some(measure_floor(b.stack, &shared, CUSTOMERS, d).await?);
    }
    Ok(row)
}

async fn debits(b: &Bench<'_>) -> Result<i64, String> {
    count(
        b.db,
        "SELECT count(*) FROM ledger_transfer WHERE code = 'debit' AND holder LIKE 'cus_xfer_%'",
    )
    .await
}

/// The report's lines on issue 45's bar: the service against the floor
/// on each customer's own account, and the database alone with and
/// without the merchant's account.
pub fn verdict_line(row: &Row) -> Option<String> {
    if row.scenario != "transfers" {
        return None;
    }
    let (clients, own) = row.floor?;
    let rate = row.outcome.rate();
    let ratio = rate / own.tps;
    let mut line = format!(
        "\ntransfers (issue 45): {rate:.0} debits/s with {} customers of one merchant, p99 {:.2} ms, against {:.0} tx/s of the same SQL on each customer's own account ({clients} connections, no merchant account): **{ratio:.2}×** (bar ≥ {BAR}×: {}).",
        row.connections,
        row.outcome.ms(0.99),
        own.tps,
        if ratio >= BAR { "met" } else { "not met" },
    );
    if let Some((_, shared)) = row.with_merchant_account {
        line += &format!(
            " The same SQL with the merchant's `balance_spent` on the other side, as the service writes it: {:.0} tx/s, {:.2}× the floor without it (the database's own cost of the shared account); the service {:.2}× of it.",
            shared.tps,
            shared.tps / own.tps,
            rate / shared.tps
        );
    }
    Some(line + "\n")
}
