//! What must hold after the soak, whatever the interleaving, checked by
//! counting: the provider's ledger against the database against what the
//! clients were told. One function per invariant; a missing value is a
//! breach, never a zero.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::{PgPool, Row};

use crate::clients::{Clients, Intent};
use crate::Faults;

/// The printed table and whether every invariant held.
pub struct Report {
    /// Markdown tables: invariants, faults, retries.
    pub text: String,
    /// No breach anywhere.
    pub ok: bool,
}

/// One invariant's row.
struct Row3 {
    name: &'static str,
    checked: u64,
    breaches: u64,
}

fn row(name: &'static str, checked: u64, breaches: u64) -> Row3 {
    Row3 {
        name,
        checked,
        breaches,
    }
}

/// A payment attempt as stored, with its refunds summed.
struct Payment {
    order_id: String,
    status: String,
    amount: i64,
    /// What it captured (an automatic payment: all of it once succeeded).
    amount_captured: i64,
    refunded_amount: i64,
    committed: i64,
    refunded: i64,
    /// Its provider: `balance` moves a customer's balance, not a card.
    provider: String,
    /// Of `refunded`, what went to the customer's balance (every refund
    /// of a balance payment, and refunds with `destination: balance`).
    to_balance: i64,
    /// What the ledger credited for its refunds.
    credited: i64,
}

impl Payment {
    /// What may be refunded: what was captured (a failed attempt's stray
    /// charge is refunded whole as an incident).
    fn cap(&self) -> i64 {
        if self.status == "succeeded" {
            self.amount_captured
        } else {
            self.amount
        }
    }

    /// Whether the card provider holds it (not the balance ledger).
    fn at_card_provider(&self) -> bool {
        self.provider != "balance"
    }
}

/// Everything the invariants look at, read once.
struct Facts {
    /// Provider charges by our attempt id (their idempotency key).
    charge_by_key: HashMap<String, Value>,
    /// Provider charges grouped by order.
    charges_by_order: HashMap<String, Vec<Value>>,
    /// Provider refunds by our refund id.
    refund_by_key: HashMap<String, Value>,
    payments: HashMap<String, Payment>,
    /// Order id → status.
    orders: HashMap<String, String>,
    /// Refund id → (status, incident).
    refunds: HashMap<String, (String, bool)>,
    /// Attempt ids with a recorded `charge_on_failed_attempt` incident, and
    /// the refund that returns the money.
    incidents: HashMap<String, String>,
    /// Orders one of whose refunds failed after it succeeded: paid again.
    reversed_orders: HashSet<String>,
    keys_with_more_than_one_effect: Option<u64>,
    ledger: Value,
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// The facts, from the provider's books (the sandbox's ledger, or
/// Stripe's books in its shape: `crate::stripe::ledger`) and the database.
async fn facts(db: &PgPool, ledger: &Value) -> Result<Facts, String> {
    let ledger = ledger.clone();
    let list = |name: &str| ledger[name].as_array().cloned().unwrap_or_default();
    let mut charges_by_order: HashMap<String, Vec<Value>> = HashMap::new();
    let mut charge_by_key = HashMap::new();
    for c in list("charges") {
        charges_by_order
            .entry(text(&c["order_id"]))
            .or_default()
            .push(c.clone());
        charge_by_key.insert(text(&c["idempotency_key"]), c);
    }
    let refund_by_key = list("refunds")
        .into_iter()
        .map(|r| (text(&r["idempotency_key"]), r))
        .collect();
    let q = |sql: &'static str| async move {
        sqlx::query(sql)
            .fetch_all(db)
            .await
            .map_err(|e| e.to_string())
    };
    let mut payments = HashMap::new();
    for r in q("SELECT p.id::text AS id, p.order_id::text AS order_id, p.status, p.amount, p.amount_captured,
                p.refunded_amount, p.provider,
                COALESCE((SELECT sum(amount) FROM refund r WHERE r.payment_id = p.id AND r.status <> 'failed'), 0)::bigint AS committed,
                COALESCE((SELECT sum(amount) FROM refund r WHERE r.payment_id = p.id AND r.status = 'succeeded'), 0)::bigint AS refunded,
                COALESCE((SELECT sum(amount) FROM refund r WHERE r.payment_id = p.id AND r.status = 'succeeded'
                             AND (r.destination = 'balance' OR p.provider = 'balance')), 0)::bigint AS to_balance,
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t JOIN refund r ON r.id = t.refund_id
                           WHERE r.payment_id = p.id AND t.code = 'refund'), 0)::bigint AS credited
           FROM payment_attempt p").await? {
        let get = |c: &str| r.try_get::<String, _>(c).map_err(|e| e.to_string());
        let num = |c: &str| r.try_get::<i64, _>(c).map_err(|e| e.to_string());
        payments.insert(
            get("id")?,
            Payment {
                order_id: get("order_id")?,
                status: get("status")?,
                amount: num("amount")?,
                amount_captured: num("amount_captured")?,
                refunded_amount: num("refunded_amount")?,
                committed: num("committed")?,
                refunded: num("refunded")?,
                provider: get("provider")?,
                to_balance: num("to_balance")?,
                credited: num("credited")?,
            },
        );
    }
    let pairs = |rows: Vec<sqlx::postgres::PgRow>| -> Result<HashMap<String, String>, String> {
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0).map_err(|e| e.to_string())?,
                    r.try_get::<String, _>(1).map_err(|e| e.to_string())?,
                ))
            })
            .collect()
    };
    let orders = pairs(q("SELECT id::text, status FROM orders").await?)?;
    let incidents = pairs(
        q("SELECT payment_id::text, refund_id::text FROM incident WHERE kind = 'charge_on_failed_attempt'")
            .await?,
    )?;
    let reversed_orders = q("SELECT DISTINCT p.order_id::text FROM incident i
                               JOIN payment_attempt p ON p.id = i.payment_id
                              WHERE i.kind = 'refund_failed_after_success'")
    .await?
    .iter()
    .map(|r| r.try_get::<String, _>(0).map_err(|e| e.to_string()))
    .collect::<Result<_, _>>()?;
    let mut refunds = HashMap::new();
    for r in q("SELECT id::text, status, incident FROM refund").await? {
        refunds.insert(
            r.try_get::<String, _>(0).map_err(|e| e.to_string())?,
            (
                r.try_get::<String, _>(1).map_err(|e| e.to_string())?,
                r.try_get::<bool, _>(2).map_err(|e| e.to_string())?,
            ),
        );
    }
    Ok(Facts {
        keys_with_more_than_one_effect: ledger["totals"]["keys_with_more_than_one_effect"].as_u64(),
        charge_by_key,
        charges_by_order,
        refund_by_key,
        payments,
        orders,
        refunds,
        incidents,
        reversed_orders,
        ledger,
    })
}

impl Facts {
    fn charge_of(&self, attempt: &str) -> Option<&Value> {
        self.charge_by_key.get(attempt)
    }

    /// Whether the provider holds this attempt's charge as taken (a
    /// manual one: captured).
    fn charged(&self, attempt: &str) -> bool {
        self.charge_of(attempt)
            .is_some_and(|c| c["status"] == "succeeded" || c["status"] == "captured")
    }

    /// Whether the attempt's charge went back as an incident refund, whole.
    fn returned_as_incident(&self, attempt: &str) -> bool {
        let Some(refund) = self.incidents.get(attempt) else {
            return false;
        };
        let refund_done = self
            .refund_by_key
            .get(refund)
            .is_some_and(|r| r["status"] == "succeeded" && r["refunds"] == 1);
        let whole = self
            .charge_of(attempt)
            .is_some_and(|c| c["amount_refunded"] == c["amount"]);
        refund_done && whole
    }
}

fn one_charge_per_succeeded_payment(f: &Facts) -> Row3 {
    let mut breaches = 0;
    let succeeded: Vec<&String> = f
        .payments
        .iter()
        .filter(|(_, p)| p.status == "succeeded" && p.at_card_provider())
        .map(|(id, _)| id)
        .collect();
    for id in &succeeded {
        breaches += u64::from(!f.charged(id));
    }
    row(
        "a succeeded payment has its charge at the provider",
        succeeded.len() as u64,
        breaches,
    )
}

fn no_decline_the_provider_charged(f: &Facts) -> Row3 {
    let failed: Vec<&String> = f
        .payments
        .iter()
        .filter(|(_, p)| p.status == "failed")
        .map(|(id, _)| id)
        .collect();
    let breaches = failed
        .iter()
        .filter(|id| f.charged(id) && !f.returned_as_incident(id))
        .count();
    row(
        "no payment declined that the provider charged (unless refunded as an incident)",
        failed.len() as u64,
        breaches as u64,
    )
}

fn one_captured_charge_per_order(f: &Facts) -> Row3 {
    let breaches = f
        .charges_by_order
        .values()
        .filter(|charges| {
            charges
                .iter()
                .filter(|c| c["status"] == "succeeded" || c["status"] == "captured")
                .filter(|c| !f.returned_as_incident(&text(&c["idempotency_key"])))
                .count()
                > 1
        })
        .count();
    row(
        "no order with more than one captured charge (extras refunded as incidents)",
        f.charges_by_order.len() as u64,
        breaches as u64,
    )
}

fn one_effect_per_provider_key(f: &Facts) -> Row3 {
    let keys = (f.charge_by_key.len() + f.refund_by_key.len()) as u64;
    // Unreadable is a breach, never a zero.
    let breaches = f.keys_with_more_than_one_effect.unwrap_or(keys.max(1));
    row("no provider key with more than one effect", keys, breaches)
}

/// Every charge and refund the provider made belongs to a row we hold:
/// a commit lost in a failover would leave money moved for a key we no
/// longer know (and a retry would then make a second attempt).
fn every_provider_effect_has_its_row(f: &Facts) -> Row3 {
    let charges = f
        .charge_by_key
        .keys()
        .filter(|k| !f.payments.contains_key(*k))
        .count();
    let refunds = f
        .refund_by_key
        .keys()
        .filter(|k| !f.refunds.contains_key(*k))
        .count();
    row(
        "every provider charge and refund has its row here (no lost commit)",
        (f.charge_by_key.len() + f.refund_by_key.len()) as u64,
        (charges + refunds) as u64,
    )
}

fn refunds_within_payment(f: &Facts) -> Row3 {
    let mut breaches = 0;
    for (id, p) in &f.payments {
        let at_provider = f.charge_of(id).and_then(|c| c["amount_refunded"].as_i64());
        let to_card = p.refunded_amount - p.to_balance;
        let provider_agrees = !p.at_card_provider()
            || (at_provider.unwrap_or(0) == to_card && (at_provider.is_some() || to_card == 0));
        let ok = p.committed <= p.cap()
            && p.refunded == p.refunded_amount
            && provider_agrees
            && p.credited == p.to_balance;
        breaches += u64::from(!ok);
    }
    row(
        "refunds never exceed what was captured (db, provider and balance ledger agree)",
        f.payments.len() as u64,
        breaches,
    )
}

fn no_cancelled_order_with_money_captured(f: &Facts) -> Row3 {
    let cancelled: HashSet<&String> = f
        .orders
        .iter()
        .filter(|(_, s)| *s == "cancelled")
        .map(|(id, _)| id)
        .collect();
    let mut breaches = 0;
    for (id, p) in &f.payments {
        if p.status == "succeeded" && cancelled.contains(&p.order_id) {
            let at_provider = f.charge_of(id).and_then(|c| c["amount_refunded"].as_i64());
            let returned = match p.at_card_provider() {
                true => at_provider.unwrap_or(0) + p.credited,
                false => p.credited,
            };
            breaches +=
                u64::from(p.refunded_amount != p.amount_captured || returned != p.amount_captured);
        }
    }
    row(
        "no cancelled order with money captured",
        cancelled.len() as u64,
        breaches,
    )
}

fn every_incident_accounted_for(f: &Facts) -> Row3 {
    // Every failed attempt the provider charged has an incident, and every
    // incident's refund returned the whole charge.
    let mut breaches = 0;
    for (id, p) in &f.payments {
        if p.status == "failed" && f.charged(id) {
            breaches += u64::from(!f.incidents.contains_key(id));
        }
    }
    for (attempt, refund) in &f.incidents {
        let stored = f.refunds.get(refund);
        let ok = stored.is_some_and(|(s, incident)| s == "succeeded" && *incident)
            && f.returned_as_incident(attempt);
        breaches += u64::from(!ok);
    }
    row(
        "every incident accounted for (recorded, and its refund paid once)",
        f.incidents.len() as u64,
        breaches,
    )
}

fn answers_match_storage(f: &Facts, intents: &[Intent]) -> (Row3, Row3) {
    let (mut checked, mut breaches) = (0, 0);
    let (mut fwd_checked, mut fwd_breaches) = (0, 0);
    for intent in intents {
        if let Some(first) = intent.payment_answers.first() {
            checked += 1;
            let same = intent.payment_answers.iter().all(|a| a == first);
            let stored = f
                .payments
                .get(&text(&first["id"]))
                .map(|p| p.status.as_str());
            let consistent = match (first["status"].as_str().unwrap_or_default(), stored) {
                (_, None) => false,
                ("pending", Some(s)) => s != "pending",
                // Authorized, then captured or voided.
                ("requires_capture", Some(s)) => {
                    matches!(s, "requires_capture" | "succeeded" | "voided")
                }
                (a, Some(s)) => a == s,
            };
            if !(same && consistent) {
                breaches += 1;
                eprintln!(
                    "breach: payment answers {:?} (all the same: {same}), stored {stored:?}",
                    intent
                        .payment_answers
                        .iter()
                        .map(|a| (text(&a["id"]), text(&a["status"])))
                        .collect::<Vec<_>>()
                );
            }
            fwd_checked += 1;
            let forward = moved_forward(&intent.payment_statuses, stored);
            fwd_breaches += u64::from(!forward);
        }
        if let Some(first) = intent.refund_answers.first() {
            checked += 1;
            let exists = f.refunds.contains_key(&text(&first["id"]));
            if !exists || intent.refund_answers.iter().any(|a| a != first) {
                breaches += 1;
                eprintln!(
                    "breach: refund answers {:?} (stored: {exists})",
                    intent.refund_answers
                );
            }
        }
        for (status, body) in &intent.cancel_answers {
            checked += 1;
            let id = text(&body["id"]);
            let order = f.orders.get(&id);
            // A refund of a cancelled order that failed later made it paid
            // again, and the merchant may have refunded it since.
            let reversed = f.reversed_orders.contains(&id);
            let ok = match status {
                200 => order.is_some_and(|s| s == "cancelled" || reversed),
                202 => order.is_some_and(|s| s == "cancelled" || s == "paid" || reversed),
                409 => body["code"].is_string(),
                _ => false,
            };
            if !ok {
                breaches += 1;
                eprintln!("breach: cancel answered {status} {body}, the order is {order:?}");
            }
        }
    }
    (
        row(
            "every answer a client received matches what is stored",
            checked,
            breaches,
        ),
        row(
            "states only moved forward (as clients saw them)",
            fwd_checked,
            fwd_breaches,
        ),
    )
}

/// Whether the statuses a client saw, in order, only moved forward
/// (`pending`, then `requires_capture` for a manual payment, then one
/// final status) and end where the payment is stored, or before it.
fn moved_forward(seen: &[String], stored: Option<&str>) -> bool {
    let rank = |s: &str| match s {
        "pending" => 0,
        "requires_capture" => 1,
        _ => 2,
    };
    let finals: Vec<&String> = seen.iter().filter(|s| rank(s) == 2).collect();
    let in_order = seen.windows(2).all(|w| rank(&w[0]) <= rank(&w[1]));
    let one_final = finals.windows(2).all(|w| w[0] == w[1]);
    let at_storage = match (seen.last().map(String::as_str), stored) {
        (_, None) => false,
        (None | Some("pending"), Some(_)) => true,
        (Some("requires_capture"), Some(s)) => rank(s) >= 1,
        (Some(last), Some(s)) => last == s,
    };
    in_order && one_final && at_storage
}

/// What sending every intent again after its key expired did.
pub struct Expiry {
    resent: u64,
    breaches: u64,
}

/// Effects (payment attempts, refunds, captures and balance transfers)
/// made by each client key. A cancel's refund carries its key as
/// `cancel:<key>`.
async fn effects_by_key(db: &PgPool) -> Result<HashMap<String, i64>, String> {
    let rows = sqlx::query(
        "SELECT key, count(*) FROM (
             SELECT idempotency_key AS key FROM payment_attempt
             UNION ALL
             SELECT regexp_replace(idempotency_key, '^cancel:', '') FROM refund
              WHERE idempotency_key IS NOT NULL
             UNION ALL
             SELECT idempotency_key FROM payment_capture
             UNION ALL
             SELECT idempotency_key FROM ledger_transfer
              WHERE idempotency_key IS NOT NULL) k
          GROUP BY key",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    rows.iter()
        .map(|r| {
            Ok((
                r.try_get::<String, _>(0).map_err(|e| e.to_string())?,
                r.try_get::<i64, _>(1).map_err(|e| e.to_string())?,
            ))
        })
        .collect()
}

/// Expires every completed key (as the TTL passing would), lets the
/// sweepers delete them, sends every money command of every intent again
/// with its original key and body, and counts any key that now has a second
/// effect: payments and refunds must be protected by their own keys. (A
/// command whose first answer was a rejection made no effect; executing
/// anew after expiry is its first, as the contract says.)
pub async fn after_expiry(
    db: &PgPool,
    clients: &Arc<Clients>,
    intents: &[Intent],
) -> Result<Expiry, String> {
    let count = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(db)
            .await
            .map_err(|e| e.to_string())
    };
    let before = effects_by_key(db).await?;
    sqlx::query(
        "UPDATE idempotency_record SET expires_at = now() - interval '1 second'
          WHERE state = 'completed'",
    )
    .execute(db)
    .await
    .map_err(|e| e.to_string())?;
    for _ in 0..120 {
        if count("SELECT count(*) FROM idempotency_record WHERE expires_at < now()").await? == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let mut work = tokio::task::JoinSet::new();
    for intent in intents {
        for (path, key, body) in intent.sent.clone() {
            let (clients, gate) = (clients.clone(), gate.clone());
            let original = intent.originals.get(&key).cloned();
            work.spawn(async move {
                let _permit = gate.acquire_owned().await;
                let answer = clients.post(&path, &key, &body).await;
                // A 2xx after expiry may only be the effect the key made
                // (a key whose first answer was a refusal made none: its
                // first effect may come now, and the count below sees a
                // second one).
                match answer {
                    Ok((200..=299, value)) => {
                        let same = original.is_none_or(|o| o == text(&value["id"]))
                            || path.ends_with("/cancel");
                        u64::from(!same)
                    }
                    Ok(_) => 0,
                    Err(_) => 1,
                }
            });
        }
    }
    let (mut resent, mut breaches) = (0, 0);
    while let Some(done) = work.join_next().await {
        resent += 1;
        breaches += done.map_err(|e| e.to_string())?;
    }
    let after = effects_by_key(db).await?;
    for intent in intents {
        for (_, key, _) in &intent.sent {
            let (was, is) = (
                before.get(key).copied().unwrap_or(0),
                after.get(key).copied().unwrap_or(0),
            );
            breaches += u64::from(is > 1 || (was > 0 && is != was));
        }
    }
    Ok(Expiry { resent, breaches })
}

fn nothing_left_open(counts: [i64; 4]) -> (Row3, Row3) {
    let [attempts, refunds, pending, executing] = counts;
    (
        row(
            "no payment or refund left pending",
            (attempts + refunds).unsigned_abs(),
            if pending < 0 {
                u64::MAX
            } else {
                pending as u64
            },
        ),
        row(
            "no idempotency record left executing",
            attempts.unsigned_abs(),
            if executing < 0 {
                u64::MAX
            } else {
                executing as u64
            },
        ),
    )
}

/// What the soak did and saw, for the checks.
pub struct Soak<'a> {
    /// What the customers' banks and cards did.
    pub bank: &'a crate::bank::Record,
    /// What each intent saw.
    pub intents: &'a [Intent],
    /// The faults injected.
    pub faults: &'a Faults,
    /// The clients (their retry counts).
    pub clients: &'a Clients,
    /// The re-send after every key expired.
    pub expiry: &'a Expiry,
    /// How long the soak ran, and how long settling took.
    pub times: (Duration, Duration),
    /// What the merchant's receiver got.
    pub webhooks: &'a crate::outbox::Receipts,
    /// `oncepay ledger check`, run at the end.
    pub ledger_check: &'a crate::balances::LedgerCheck,
    /// Stock reserved against open reservations when the faults stopped:
    /// (SKUs, breaches).
    pub reserved_at_the_end: (u64, u64),
    /// What the provider holds of what only webhooks carry (refunds failed
    /// after they succeeded, disputes), read at the end.
    pub at_provider: &'a crate::answers::AtProvider,
    /// With Stripe: what the books pass at the end did.
    pub books_pass: Option<&'a crate::answers::BooksPass>,
}

/// Checks every invariant against the provider's books (`ledger`, in the
/// sandbox ledger's shape) and prints the tables.
pub async fn check(db: &PgPool, ledger: &Value, soak: &Soak<'_>) -> Result<Report, String> {
    let Soak {
        bank,
        intents,
        faults,
        clients,
        expiry,
        times: (soak_time, settle_time),
        webhooks,
        ledger_check,
        reserved_at_the_end,
        at_provider,
        books_pass,
    } = *soak;
    let f = facts(db, ledger).await?;
    let scalar = |sql: &'static str| async move {
        // Unreadable is a breach: -1 never passes a check.
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(db)
            .await
            .unwrap_or(-1)
    };
    let counts = [
        scalar("SELECT count(*) FROM payment_attempt").await,
        scalar("SELECT count(*) FROM refund").await,
        scalar(
            "SELECT (SELECT count(*) FROM payment_attempt WHERE status = 'pending')
                  + (SELECT count(*) FROM refund WHERE status = 'pending')",
        )
        .await,
        scalar("SELECT count(*) FROM idempotency_record WHERE state = 'executing'").await,
    ];
    let (answers, forward) = answers_match_storage(&f, intents);
    let (pending, executing) = nothing_left_open(counts);
    let gave_up = intents.iter().filter(|i| i.gave_up.is_some()).count() as u64;
    if gave_up > 0 {
        for i in intents.iter().filter_map(|i| i.gave_up.as_ref()).take(5) {
            eprintln!("gave up: {i}");
        }
    }
    let mut rows = vec![
        one_charge_per_succeeded_payment(&f),
        no_decline_the_provider_charged(&f),
        one_captured_charge_per_order(&f),
        one_effect_per_provider_key(&f),
        every_provider_effect_has_its_row(&f),
        answers,
        forward,
        refunds_within_payment(&f),
        no_cancelled_order_with_money_captured(&f),
        every_incident_accounted_for(&f),
        row(
            "no intent paid out twice when sent again after its key expired",
            expiry.resent,
            expiry.breaches,
        ),
        pending,
        executing,
        row(
            "intents finished by their clients (no give-up)",
            intents.len() as u64,
            gave_up,
        ),
    ];
    for (name, checked, breaches) in crate::outbox::check(db, webhooks).await? {
        rows.push(row(name, checked, breaches));
    }
    for (name, checked, breaches) in crate::bank::check(db, ledger, bank).await? {
        rows.push(row(name, checked, breaches));
    }
    for (name, checked, breaches) in crate::holds::check(db, ledger, intents).await? {
        rows.push(row(name, checked, breaches));
    }
    let (answered, answers_table) =
        crate::answers::check(db, ledger, intents, bank, at_provider, books_pass).await?;
    for (name, checked, breaches) in answered {
        rows.push(row(name, checked, breaches));
    }
    for (name, checked, breaches) in crate::balances::check(db, intents, ledger_check).await? {
        rows.push(row(name, checked, breaches));
    }
    for (name, checked, breaches) in
        crate::stock::check(db, clients, intents, reserved_at_the_end).await?
    {
        rows.push(row(name, checked, breaches));
    }
    let ok = rows.iter().all(|r| r.breaches == 0);
    let mut out = format!(
        "\n{} intents in {soak_time:.1?} (+{settle_time:.1?} to settle); {} payments, {} refunds, {} incidents.\n\n",
        intents.len(),
        counts[0],
        counts[1],
        f.incidents.len(),
    );
    out += "| invariant | checked | breaches |\n|---|---:|---:|\n";
    for r in &rows {
        out += &format!("| {} | {} | {} |\n", r.name, r.checked, r.breaches);
    }
    out += &fault_table(db, &f, faults, intents).await;
    out += &crate::bank::table(bank);
    out += &answers_table;
    out += &crate::holds::table(db, intents).await;
    out += &crate::balances::table(db, intents).await;
    out += &crate::stock::table(db, intents).await;
    out += &format!(
        "\n`oncepay ledger check` at the end:\n\n```\n{}```\n",
        ledger_check.output
    );
    out += "\n| client retry (same key) | count |\n|---|---:|\n";
    for (reason, n) in &clients.retries.lock().await.by_reason {
        out += &format!("| {reason} | {n} |\n");
    }
    out += if ok {
        "\nAll invariants hold.\n"
    } else {
        "\nINVARIANT BREACHED.\n"
    };
    Ok(Report { text: out, ok })
}

async fn fault_table(db: &PgPool, f: &Facts, faults: &Faults, intents: &[Intent]) -> String {
    let scalar = |sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_one(db)
            .await
            .unwrap_or(-1)
    };
    let stripe = f.ledger["provider"] == "stripe";
    let provider = |name: &str| f.ledger["totals"]["faults"][name].as_u64().unwrap_or(0);
    let events = scalar("SELECT count(*) FROM webhook_event").await;
    let delivered = f.ledger["totals"]["webhooks_delivered"]
        .as_i64()
        .unwrap_or(0);
    let mut rows: Vec<(String, i64)> = vec![
        (
            "serve process SIGKILLed and restarted".into(),
            faults.kills as i64,
        ),
        (
            "PostgreSQL crashed (immediate stop) and restarted".into(),
            faults.pg_crashes as i64,
        ),
        (
            "PostgreSQL restarted (fast stop)".into(),
            faults.pg_restarts as i64,
        ),
        (
            "service connections terminated (pg_terminate_backend)".into(),
            faults.terminations as i64,
        ),
        (
            "client answer lost after the request reached oncepay (TCP)".into(),
            faults.lost_answers as i64,
        ),
    ];
    if !stripe {
        rows.extend([
            (
                "provider 5xx before charging (sandbox)".into(),
                provider("error_5xx") as i64,
            ),
            (
                "provider charged, answer lost (sandbox)".into(),
                provider("dropped_response") as i64,
            ),
            (
                "provider answered past the client timeout (sandbox)".into(),
                provider("delayed_response") as i64,
            ),
        ]);
    }
    let by = if stripe {
        "Stripe layer"
    } else {
        "fault proxy"
    };
    for (name, n) in &faults.provider {
        rows.push((format!("spell: {name} ({by})"), *n as i64));
    }
    if let Some(layer) = &faults.stripe_layer {
        rows.extend([
            (
                "Stripe calls that met a spell (Stripe layer)".to_string(),
                layer.faulted as i64,
            ),
            (
                "Stripe calls forwarded to localstripe (Stripe layer)".into(),
                layer.forwarded as i64,
            ),
            (
                "Stripe repeats answered from the saved answer (idempotency key)".into(),
                layer.replayed as i64,
            ),
            (
                "Stripe captures refused (a spell's refusal, or no longer capturable)".into(),
                layer.captures_refused as i64,
            ),
            (
                "PaymentIntents left unconfirmed (no money moved)".into(),
                f.charge_by_key
                    .values()
                    .filter(|c| c["status"] == "unconfirmed")
                    .count() as i64,
            ),
            (
                "attempts with more than one PaymentIntent".into(),
                f.ledger["totals"]["attempts_with_more_than_one_payment_intent"]
                    .as_i64()
                    .unwrap_or(-1),
            ),
        ]);
    }
    if stripe {
        rows.extend([
            (
                "webhook events localstripe sent (once each, never retried)".to_string(),
                delivered,
            ),
            (
                "webhook events oncepay received from Stripe".into(),
                scalar("SELECT count(*) FROM webhook_event WHERE provider = 'stripe'").await,
            ),
        ]);
    } else {
        rows.push((
            "webhook deliveries beyond the first (duplicates)".to_string(),
            (delivered - events).max(0),
        ));
    }
    rows.extend([
        (
            "webhook events confirmed by a provider read".to_string(),
            scalar("SELECT count(*) FROM webhook_event WHERE confirmed_at IS NOT NULL").await,
        ),
        (
            "webhook events the provider did not confirm (unconfirmed)".into(),
            scalar("SELECT count(*) FROM webhook_event WHERE outcome = 'unconfirmed'").await,
        ),
        (
            "webhook events contradicting our books (mismatch)".into(),
            scalar("SELECT count(*) FROM webhook_event WHERE outcome = 'mismatch'").await,
        ),
        (
            "incidents: charges on failed attempts, refunded".into(),
            f.incidents.len() as i64,
        ),
    ]);
    for done in crate::clients::BANK {
        rows.push((
            format!("3-D Secure customer at the bank: {done}"),
            intents.iter().filter(|i| i.bank == Some(done)).count() as i64,
        ));
    }
    let mut out = "\n| fault injected or observed | count |\n|---|---:|\n".to_string();
    for (name, n) in rows {
        out += &format!("| {name} | {n} |\n");
    }
    out
}
