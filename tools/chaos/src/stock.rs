//! Stock's invariants (ReserveInventory on the ledger), checked by
//! counting after the soak: the stock accounts and their transfers, the
//! orders that reserved, what `GET /inventory/{sku}` shows and what the
//! clients were told. Never oversold; reserved is the open reservations;
//! every paid order's stock (reserved or not) converted, sold or reported
//! short; every unit on hand, reserved, or sold to a paid order.

use std::collections::HashMap;

use serde_json::{json, Value};
use sqlx::{PgPool, Row};

use crate::clients::{Clients, Intent, STOCK_AT_START, STOCK_PLANS, STOCK_SKUS, UNRESERVED_STOCK};
use crate::outbox::{count as scalar, Check};

/// Counts every SKU in before the soak, as a warehouse would.
pub async fn count_in(clients: &Clients, run: &str) -> Result<(), String> {
    for sku in 0..STOCK_SKUS {
        let (status, body) = clients
            .post(
                &format!("/inventory/stock-{sku}/adjustments"),
                &format!("count-in-{run}-{sku}"),
                &json!({"quantity": STOCK_AT_START, "reason": "counted in"}),
            )
            .await?;
        if status != 201 {
            return Err(format!("counting stock-{sku} in: {status} {body}"));
        }
    }
    Ok(())
}

/// Each SKU's `held` is the sum of its open reservations (read in one
/// statement): (SKUs, breaches).
pub async fn reserved_is_open_reservations(db: &PgPool) -> (u64, u64) {
    let skus = scalar(
        db,
        "SELECT count(*) FROM ledger_account WHERE ledger = 'stock' AND kind = 'holder'",
    )
    .await;
    let breaches = scalar(
        db,
        "SELECT count(*) FROM ledger_account a
          WHERE a.ledger = 'stock' AND a.kind = 'holder'
            AND a.held <> COALESCE((SELECT sum(o.amount) FROM ledger_open_pending o
                                     WHERE o.account_id = a.id), 0)",
    )
    .await;
    (skus, breaches)
}

/// On hand never below zero and never less than reserved, after any stock
/// transfer (the totals each recorded) or now.
async fn never_oversold(db: &PgPool) -> Check {
    let transfers = scalar(
        db,
        "SELECT count(*) FROM ledger_transfer WHERE ledger = 'stock'",
    )
    .await;
    let breaches = scalar(
        db,
        "SELECT (SELECT count(*) FROM ledger_transfer
                  WHERE ledger = 'stock'
                    AND (posted_after < 0 OR held_after < 0 OR held_after > posted_after))
              + (SELECT count(*) FROM ledger_account
                  WHERE ledger = 'stock' AND kind = 'holder'
                    AND (posted < 0 OR held < 0 OR held > posted))",
    )
    .await;
    (
        "no oversell: on hand never below zero nor below reserved (after any stock transfer, and now)",
        transfers,
        breaches,
    )
}

/// Each SKU's on hand is what was counted in, less what was counted out,
/// converted and sold late, by its transfers; `GET /inventory/{sku}` says
/// the same, with nothing reserved once everything settled.
async fn on_hand_is_its_movements(db: &PgPool, clients: &Clients) -> Result<Check, String> {
    let rows = sqlx::query(
        "SELECT a.unit, a.posted, a.held,
                COALESCE(sum(CASE t.code WHEN 'adjustment_in' THEN t.amount
                                         WHEN 'adjustment_out' THEN -t.amount
                                         WHEN 'conversion' THEN -t.amount
                                         WHEN 'sale' THEN -t.amount ELSE 0 END), 0)::bigint
           FROM ledger_account a
           LEFT JOIN ledger_transfer t ON t.holder_account_id = a.id
          WHERE a.ledger = 'stock' AND a.kind = 'holder'
          GROUP BY a.unit, a.posted, a.held",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut breaches = 0;
    for r in &rows {
        let err = |e: sqlx::Error| e.to_string();
        let sku: String = r.try_get(0).map_err(err)?;
        let (posted, held, moved): (i64, i64, i64) = (
            r.try_get(1).map_err(err)?,
            r.try_get(2).map_err(err)?,
            r.try_get(3).map_err(err)?,
        );
        let shown = clients.get(&format!("/inventory/{sku}")).await;
        let ok = posted == moved
            && held == 0
            && shown.as_ref().is_some_and(|item| {
                item["on_hand"] == posted && item["reserved"] == 0 && item["available"] == posted
            });
        if !ok {
            eprintln!(
                "breach: {sku} on hand {posted} (held {held}), its movements {moved}, shown {shown:?}"
            );
        }
        breaches += u64::from(!ok);
    }
    Ok((
        "each SKU's on hand is its adjustments less its conversions and sales (rows and API agree)",
        rows.len() as u64,
        breaches,
    ))
}

/// Every (order, tracked SKU) pair, whether the order reserved or not:
/// an order paid (a succeeded payment, captured whole or in part) has its
/// units converted, sold, or reported short, adding up to what it asked
/// (issue 54: a paid order that reserved nothing takes them too), and
/// none of its reservations open; an order never paid (awaiting payment,
/// cancelled, its authorization voided or expired) has nothing converted,
/// sold or short, and an open reservation only while it awaits payment
/// or is authorized.
async fn paid_orders_converted_or_short(db: &PgPool) -> Result<Check, String> {
    let rows = sqlx::query(
        "WITH pairs AS (
            SELECT o.id AS order_id, a.unit
              FROM orders o
              JOIN LATERAL (SELECT DISTINCT q.sku FROM jsonb_to_recordset(o.items) q(sku text)) i
                ON true
              JOIN ledger_account a ON a.merchant_id = o.merchant_id AND a.ledger = 'stock'
                                   AND a.kind = 'holder' AND a.unit = i.sku)
         SELECT p.order_id::text, p.unit, o.status,
                EXISTS (SELECT 1 FROM payment_attempt a
                         WHERE a.order_id = o.id AND a.status = 'succeeded') AS paid,
                (SELECT COALESCE(sum(q.quantity), 0) FROM jsonb_to_recordset(o.items)
                     q(sku text, quantity bigint) WHERE q.sku = p.unit)::bigint AS asked,
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t
                           WHERE t.order_id = o.id AND t.unit = p.unit AND t.ledger = 'stock'
                             AND t.code = 'conversion'), 0)::bigint AS converted,
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t
                           WHERE t.order_id = o.id AND t.unit = p.unit AND t.ledger = 'stock'
                             AND t.code = 'sale'), 0)::bigint AS sold,
                COALESCE((SELECT sum((f->>'missing')::bigint)
                            FROM jsonb_array_elements(o.stock_shortfall) f
                           WHERE f->>'sku' = p.unit), 0)::bigint AS missing,
                (SELECT count(*) FROM ledger_transfer t
                   JOIN ledger_open_pending op ON op.pending_id = t.id
                  WHERE t.order_id = o.id AND t.unit = p.unit) AS open
           FROM pairs p JOIN orders o ON o.id = p.order_id",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut breaches = 0;
    for r in &rows {
        let err = |e: sqlx::Error| e.to_string();
        let id: String = r.try_get(0).map_err(err)?;
        let sku: String = r.try_get(1).map_err(err)?;
        let order_status: String = r.try_get(2).map_err(err)?;
        let paid: bool = r.try_get(3).map_err(err)?;
        let (asked, converted, sold, missing, open): (i64, i64, i64, i64, i64) = (
            r.try_get(4).map_err(err)?,
            r.try_get(5).map_err(err)?,
            r.try_get(6).map_err(err)?,
            r.try_get(7).map_err(err)?,
            r.try_get(8).map_err(err)?,
        );
        let ok = match paid {
            true => open == 0 && converted + sold + missing == asked,
            false => {
                converted == 0
                    && sold == 0
                    && missing == 0
                    && (open == 0
                        || (open == 1
                            && matches!(order_status.as_str(), "awaiting_payment" | "authorized")))
            }
        };
        if !ok {
            eprintln!(
                "breach: order {id} ({order_status}, paid: {paid}) asked {asked} of {sku}: converted {converted}, sold {sold}, missing {missing}, open reservations {open}"
            );
        }
        breaches += u64::from(!ok);
    }
    Ok((
        "every paid order's tracked SKUs converted, sold or reported short, reserved or not (the unpaid ones took nothing)",
        rows.len() as u64,
        breaches,
    ))
}

/// Every unit is on hand, reserved, or sold to an order that was paid or
/// captured (issue 54), by the ledger at the end, per SKU: what was
/// counted in less what was counted out is what is on hand plus what was
/// converted or sold to paid orders; nothing was converted or sold to an
/// order never paid; and what is reserved is the open reservations of
/// orders that may still be paid (awaiting payment, or authorized).
async fn every_unit_accounted_for(db: &PgPool) -> Result<Check, String> {
    let rows = sqlx::query(
        "SELECT a.unit, a.posted, a.held,
                COALESCE((SELECT sum(CASE t.code WHEN 'adjustment_in' THEN t.amount
                                                 ELSE -t.amount END)
                            FROM ledger_transfer t
                           WHERE t.holder_account_id = a.id
                             AND t.code IN ('adjustment_in', 'adjustment_out')), 0)::bigint,
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t
                           WHERE t.holder_account_id = a.id AND t.code IN ('conversion', 'sale')
                             AND EXISTS (SELECT 1 FROM payment_attempt p
                                          WHERE p.order_id = t.order_id
                                            AND p.status = 'succeeded')), 0)::bigint,
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t
                           WHERE t.holder_account_id = a.id AND t.code IN ('conversion', 'sale')
                             AND NOT EXISTS (SELECT 1 FROM payment_attempt p
                                              WHERE p.order_id = t.order_id
                                                AND p.status = 'succeeded')), 0)::bigint,
                COALESCE((SELECT sum(op.amount) FROM ledger_open_pending op
                            JOIN ledger_transfer t ON t.id = op.pending_id
                            JOIN orders o ON o.id = t.order_id
                           WHERE op.account_id = a.id
                             AND o.status IN ('awaiting_payment', 'authorized')), 0)::bigint
           FROM ledger_account a
          WHERE a.ledger = 'stock' AND a.kind = 'holder'",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut breaches = 0;
    for r in &rows {
        let err = |e: sqlx::Error| e.to_string();
        let sku: String = r.try_get(0).map_err(err)?;
        let (on_hand, reserved, counted, sold_paid, sold_unpaid, held_for_live): (
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
        ) = (
            r.try_get(1).map_err(err)?,
            r.try_get(2).map_err(err)?,
            r.try_get(3).map_err(err)?,
            r.try_get(4).map_err(err)?,
            r.try_get(5).map_err(err)?,
            r.try_get(6).map_err(err)?,
        );
        let ok = counted == on_hand + sold_paid && sold_unpaid == 0 && reserved == held_for_live;
        if !ok {
            eprintln!(
                "breach: {sku}: counted {counted} = on hand {on_hand} + sold to paid orders {sold_paid}? sold to unpaid orders {sold_unpaid}; reserved {reserved}, by orders that may still pay {held_for_live}"
            );
        }
        breaches += u64::from(!ok);
    }
    Ok((
        "every unit is on hand, reserved, or sold to an order that was paid or captured (by the ledger)",
        rows.len() as u64,
        breaches,
    ))
}

/// An order refused for stock created nothing (the orders are exactly the
/// ones answered `201`), and its refusal named a SKU short of what it
/// asked.
async fn refused_orders_created_nothing(db: &PgPool, intents: &[Intent]) -> Check {
    let orders = scalar(db, "SELECT count(*) FROM orders").await;
    let created = intents.iter().filter(|i| i.order_id.is_some()).count() as u64;
    let refused: Vec<&Value> = intents
        .iter()
        .filter_map(|i| i.stock_refused.as_ref())
        .collect();
    let mut breaches = u64::from(orders != created);
    for body in &refused {
        let named = body["skus"].as_array().is_some_and(|skus| {
            !skus.is_empty()
                && skus.iter().all(|s| {
                    s["requested"].as_i64().unwrap_or(0)
                        > s["available"].as_i64().unwrap_or(i64::MAX)
                })
        });
        breaches += u64::from(!named);
    }
    (
        "an order refused for stock created nothing (409 insufficient_stock names the short SKUs)",
        refused.len() as u64 + 1,
        breaches,
    )
}

/// Every adjustment answer matches its key's repeats and the rule:
/// `201` with the item, or `409 insufficient_stock` for a removal.
fn adjustment_answers(intents: &[Intent]) -> Check {
    let (mut checked, mut breaches) = (0u64, 0u64);
    for intent in intents {
        for (_, status, body) in &intent.adjustments {
            checked += 1;
            let ok = match status {
                201 => {
                    body["on_hand"].is_i64()
                        && body["available"].as_i64() <= body["on_hand"].as_i64()
                }
                409 => body["code"] == "insufficient_stock",
                _ => false,
            };
            breaches += u64::from(!ok);
        }
    }
    (
        "every stock adjustment answered by the rule",
        checked,
        breaches,
    )
}

/// The stock rows of the invariant table.
pub async fn check(
    db: &PgPool,
    clients: &Clients,
    intents: &[Intent],
    reserved_at_the_end: (u64, u64),
) -> Result<Vec<Check>, String> {
    let (skus, now) = reserved_is_open_reservations(db).await;
    Ok(vec![
        never_oversold(db).await,
        (
            "each SKU's reserved is its open reservations (when the faults stopped, and settled)",
            reserved_at_the_end.0 + skus,
            reserved_at_the_end.1.saturating_add(now),
        ),
        on_hand_is_its_movements(db, clients).await?,
        paid_orders_converted_or_short(db).await?,
        every_unit_accounted_for(db).await?,
        refused_orders_created_nothing(db, intents).await,
        adjustment_answers(intents),
    ])
}

/// What the orders reserving stock did, and how their reservations ended,
/// for the fault table.
pub async fn table(db: &PgPool, intents: &[Intent]) -> String {
    let mut out = "\n| order reserving stock | count |\n|---|---:|\n".to_string();
    let mut plans: HashMap<&str, u64> = HashMap::new();
    for i in intents.iter().filter(|i| i.order_id.is_some()) {
        if let Some(plan) = i.stock {
            *plans.entry(plan).or_insert(0) += 1;
        }
    }
    let mut seen = Vec::new();
    for plan in STOCK_PLANS.into_iter().chain([UNRESERVED_STOCK]) {
        if seen.contains(&plan) {
            continue;
        }
        seen.push(plan);
        out += &format!(
            "| created, then its customer {plan} | {} |\n",
            plans.get(plan).unwrap_or(&0)
        );
    }
    let refused = intents.iter().filter(|i| i.stock_refused.is_some()).count();
    out += &format!("| refused 409 insufficient_stock (nothing created) | {refused} |\n");
    let adjusted = intents.iter().flat_map(|i| &i.adjustments).count();
    let refused_out = intents
        .iter()
        .flat_map(|i| &i.adjustments)
        .filter(|(_, status, _)| *status == 409)
        .count();
    out += &format!("| stock adjustments (removals refused) | {adjusted} ({refused_out}) |\n");
    let rows = sqlx::query(
        "SELECT code, count(*), sum(amount)::bigint FROM ledger_transfer
          WHERE ledger = 'stock' GROUP BY code ORDER BY code",
    )
    .fetch_all(db)
    .await
    .unwrap_or_default();
    for r in rows {
        let code: String = r.try_get(0).unwrap_or_default();
        let n: i64 = r.try_get(1).unwrap_or(-1);
        let units: i64 = r.try_get(2).unwrap_or(-1);
        out += &format!("| stock transfers: {code} (pieces) | {n} ({units}) |\n");
    }
    let short = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM orders WHERE stock_shortfall <> '[]'::jsonb",
    )
    .fetch_one(db)
    .await
    .unwrap_or(-1);
    out += &format!("| orders paid short (stock_shortfall) | {short} |\n");
    out
}
