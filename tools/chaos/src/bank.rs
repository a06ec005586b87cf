//! What a customer's bank and card do after the money moved, while the
//! faults go on: a charge is disputed (a chargeback: the bank takes the
//! money back while the provider reviews), the dispute is won or lost
//! later, and a refund the provider paid fails afterwards (the card was
//! closed or expired; the money is the merchant's again). oncepay hears of
//! each only through the provider's events, hints it confirms by reading
//! the provider; the invariants then hold it to the provider's word.
//!
//! With Stripe, a third of the bank's refund failures, dispute openings
//! and dispute moves are made with their webhook dropped (the layer holds
//! the change, no event is ever sent): only the books pass, which reads
//! back what webhooks carry (`oncepay reconcile` at the end of the soak),
//! can apply them here.
//!
//! The bank disputes only charges of intents that never refund on their
//! own (`i % 4` of 1 or 3, see `clients.rs`), so that what it measures is
//! oncepay's rule and not a race with a client: once the dispute is seen,
//! a refund of the disputed amount must be refused (`409
//! payment_disputed`), and a refund that got through before oncepay heard
//! of it must be refused by the provider (`charge_disputed`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sqlx::{PgPool, Row};
use tokio::sync::Mutex;

use crate::clients::Clients;
use crate::stripe;

/// The provider side the bank acts through.
pub enum Side<'a> {
    /// The sandbox: its own endpoints open, close and fail, and it sends
    /// (and retries) their webhooks itself.
    Sandbox {
        /// The sandbox's base URL (not through the fault proxy).
        base: String,
    },
    /// localstripe behind the Stripe layer: the layer holds disputes and
    /// refunds that failed later, and the bank delivers Stripe's signed
    /// events itself, retried as Stripe retries an endpoint that does not
    /// answer `2xx`, sometimes twice.
    Stripe {
        /// The stack.
        stack: &'a stripe::Stack,
        /// The serve processes' own addresses (events do not go through
        /// the lossy proxies: Stripe retries what is not acknowledged).
        webhooks: Vec<String>,
    },
}

/// One dispute the bank opened, as the provider holds it.
#[derive(Debug, Clone)]
pub struct Dispute {
    /// The provider's id (`dp_…`).
    pub id: String,
    /// Our payment's id.
    pub payment_id: String,
    /// The disputed amount.
    pub amount: i64,
    /// The payment's amount.
    pub payment_amount: i64,
    /// The provider's status now: `needs_response`, `under_review`, `won`
    /// or `lost`.
    pub status: &'static str,
    /// The refund tried once the dispute was seen has its answer.
    pub tried: bool,
}

/// A refund the bank made fail after it succeeded.
#[derive(Debug, Clone)]
pub struct FailedLater {
    /// Our refund's id.
    pub refund_id: String,
    /// The provider's id of it.
    pub provider_id: String,
    /// Its payment's id.
    pub payment_id: String,
    /// When the bank failed it.
    pub failed_at: chrono::DateTime<chrono::Utc>,
    /// The answer to refunding its amount again once it read `failed`
    /// (`None`: not tried, it never read `failed` in time), and when it
    /// came.
    pub refunded_again: Option<(u16, chrono::DateTime<chrono::Utc>)>,
}

/// A refund tried on a disputed payment.
#[derive(Debug, Clone)]
pub struct Try {
    /// Whether the payment showed its dispute when the refund was sent.
    pub dispute_seen: bool,
    /// The answer's status and problem code.
    pub answer: (u16, String),
}

/// What the bank did, shared with its tasks.
#[derive(Default)]
pub struct Record {
    /// Every dispute opened.
    pub disputes: Vec<Dispute>,
    /// Every refund failed later.
    pub failed: Vec<FailedLater>,
    /// Every refund tried on a disputed payment.
    pub tries: Vec<Try>,
    /// Actions by name, counted for the fault table.
    pub actions: BTreeMap<&'static str, u64>,
    /// Provider events the bank delivered, and retries of them.
    pub delivered: (u64, u64),
    /// Disputes opened or moved with their webhook dropped (Stripe): the
    /// provider's ids, each once.
    pub dropped_disputes: std::collections::BTreeSet<String>,
    /// Refunds failed later with their webhook dropped (Stripe): our ids.
    pub dropped_refunds: std::collections::BTreeSet<String>,
    /// What went wrong in the bank's own work (not oncepay's).
    pub errors: Vec<String>,
}

/// The bank.
pub struct Bank<'a> {
    side: Side<'a>,
    provider: &'static str,
    db: PgPool,
    clients: Arc<Clients>,
    http: reqwest::Client,
    /// What it did.
    pub record: Arc<Mutex<Record>>,
    work: tokio::task::JoinSet<()>,
    next: usize,
}

impl<'a> Bank<'a> {
    /// A bank acting through `side` on `db`'s payments, refunding through
    /// `clients` as the merchant would.
    pub fn new(side: Side<'a>, db: PgPool, clients: Arc<Clients>) -> Bank<'a> {
        let provider = match side {
            Side::Sandbox { .. } => "sandbox",
            Side::Stripe { .. } => "stripe",
        };
        Bank {
            side,
            provider,
            db,
            clients,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap_or_default(),
            record: Arc::default(),
            work: tokio::task::JoinSet::new(),
            next: 0,
        }
    }

    /// One thing a bank or a card does: opens a dispute, moves or closes
    /// one, or fails a refund that succeeded.
    pub async fn act(&mut self) {
        let done = match fastrand::u8(0..10) {
            0..=3 => self.open().await,
            4..=6 => self.decide().await,
            _ => self.fail_a_refund().await,
        };
        let mut record = self.record.lock().await;
        match done {
            Ok(Some(name)) => *record.actions.entry(name).or_insert(0) += 1,
            Ok(None) => {}
            Err(e) => record.errors.push(e),
        }
    }

    /// Waits for every event delivery and refund the bank started (call
    /// once the faults have stopped).
    pub async fn finish(&mut self) {
        while self.work.join_next().await.is_some() {}
    }

    fn serial(&mut self) -> usize {
        self.next += 1;
        self.next
    }

    /// Disputes a succeeded charge nobody refunds: the whole of it, or
    /// half.
    async fn open(&mut self) -> Result<Option<&'static str>, String> {
        let taken: Vec<String> = {
            let record = self.record.lock().await;
            record
                .disputes
                .iter()
                .map(|d| d.payment_id.clone())
                .collect()
        };
        let row = sqlx::query(
            "SELECT p.id::text, p.provider_charge_id, p.amount_captured, p.currency::text
               FROM payment_attempt p JOIN orders o ON o.id = p.order_id
              WHERE p.status = 'succeeded' AND p.provider = $1
                AND p.provider_charge_id IS NOT NULL
                AND NOT EXISTS (SELECT 1 FROM refund r WHERE r.payment_id = p.id)
                AND o.customer_id ~ '^chaos-[0-9]+$'
                AND substring(o.customer_id FROM 7)::bigint % 4 IN (1, 3)
                AND p.id::text <> ALL($2)
              ORDER BY random() LIMIT 1",
        )
        .bind(self.provider)
        .bind(&taken)
        .fetch_optional(&self.db)
        .await
        .map_err(|e| format!("bank: choosing a charge: {e}"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = |i: usize| row.try_get::<String, _>(i).map_err(|e| e.to_string());
        let (payment_id, charge, currency) = (get(0)?, get(1)?, get(3)?);
        let payment_amount: i64 = row.try_get(2).map_err(|e| e.to_string())?;
        let amount = if fastrand::u8(0..3) == 0 {
            (payment_amount / 2).max(1)
        } else {
            payment_amount
        };
        let mut dropped = false;
        let id = match &self.side {
            Side::Sandbox { base } => {
                let opened = self
                    .http
                    .post(format!("{base}/v1/charges/{charge}/disputes"))
                    .json(&json!({"amount": amount}))
                    .send()
                    .await
                    .map_err(|e| format!("bank: opening a sandbox dispute: {e}"))?;
                if opened.status().as_u16() != 201 {
                    return Err(format!(
                        "bank: the sandbox answered {} to a dispute",
                        opened.status()
                    ));
                }
                let dispute: Value = opened.json().await.map_err(|e| e.to_string())?;
                text(&dispute["id"])
            }
            Side::Stripe { stack, .. } => {
                let latest = stack.latest_charge(&charge).await?;
                let dispute = stack.layer.open_dispute(
                    (&charge, &latest),
                    (amount, &currency),
                    "fraudulent",
                    "needs_response",
                );
                let id = text(&dispute["id"]);
                if drops_the_webhook() {
                    dropped = true;
                } else {
                    self.deliver(&dispute, "charge.dispute.created");
                    // A copy, as Stripe may send one event twice.
                    if fastrand::u8(0..4) == 0 {
                        self.deliver(&dispute, "charge.dispute.funds_withdrawn");
                    }
                }
                id
            }
        };
        if dropped {
            self.record.lock().await.dropped_disputes.insert(id.clone());
        }
        self.record.lock().await.disputes.push(Dispute {
            id: id.clone(),
            payment_id: payment_id.clone(),
            amount,
            payment_amount,
            status: "needs_response",
            tried: false,
        });
        // The merchant tries to refund it all once the dispute shows.
        let (clients, record, key) = (
            self.clients.clone(),
            self.record.clone(),
            format!("bank-refund-{}-{}", std::process::id(), self.serial()),
        );
        self.work.spawn(async move {
            let path = format!("/payments/{payment_id}");
            let deadline = Instant::now() + Duration::from_secs(20);
            let mut seen = false;
            while Instant::now() < deadline {
                if clients
                    .get(&path)
                    .await
                    .is_some_and(|p| !p["dispute"].is_null())
                {
                    seen = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            let answer = clients
                .post(
                    &format!("{path}/refunds"),
                    &key,
                    &json!({"amount": payment_amount}),
                )
                .await;
            let answer = match answer {
                Ok((status, body)) => (status, text(&body["code"])),
                Err(e) => (0, e),
            };
            let mut record = record.lock().await;
            record.tries.push(Try {
                dispute_seen: seen,
                answer,
            });
            if let Some(d) = record.disputes.iter_mut().find(|d| d.id == id) {
                d.tried = true;
            }
        });
        Ok(Some(if dropped {
            "charge disputed (chargeback), webhook dropped"
        } else {
            "charge disputed (chargeback)"
        }))
    }

    /// Moves an open dispute on: under review (Stripe only: the sandbox
    /// goes straight to its decision), or won, or lost.
    async fn decide(&mut self) -> Result<Option<&'static str>, String> {
        let open: Vec<Dispute> = {
            let record = self.record.lock().await;
            record
                .disputes
                .iter()
                .filter(|d| d.tried && !matches!(d.status, "won" | "lost"))
                .cloned()
                .collect()
        };
        if open.is_empty() {
            return Ok(None);
        }
        let d = &open[fastrand::usize(0..open.len())];
        let review = matches!(self.side, Side::Stripe { .. })
            && d.status == "needs_response"
            && fastrand::bool();
        let status = if review {
            "under_review"
        } else if fastrand::bool() {
            "won"
        } else {
            "lost"
        };
        let mut dropped = false;
        match &self.side {
            Side::Sandbox { base } => {
                let closed = self
                    .http
                    .post(format!("{base}/v1/disputes/{}/close", d.id))
                    .json(&json!({"outcome": status}))
                    .send()
                    .await
                    .map_err(|e| format!("bank: closing a sandbox dispute: {e}"))?;
                if !closed.status().is_success() {
                    return Err(format!(
                        "bank: the sandbox answered {} to a close",
                        closed.status()
                    ));
                }
            }
            Side::Stripe { stack, .. } => {
                let dispute = stack
                    .layer
                    .set_dispute_status(&d.id, status)
                    .ok_or_else(|| format!("bank: the layer lost dispute {}", d.id))?;
                let kind = if review {
                    "charge.dispute.updated"
                } else {
                    "charge.dispute.closed"
                };
                if drops_the_webhook() {
                    dropped = true;
                } else {
                    self.deliver(&dispute, kind);
                    if status == "won" {
                        self.deliver(&dispute, "charge.dispute.funds_reinstated");
                    }
                }
            }
        }
        let mut record = self.record.lock().await;
        if let Some(kept) = record.disputes.iter_mut().find(|k| k.id == d.id) {
            kept.status = status;
        }
        if dropped {
            record.dropped_disputes.insert(d.id.clone());
        }
        Ok(Some(match (status, dropped) {
            ("under_review", false) => "dispute under review",
            ("under_review", true) => "dispute under review, webhook dropped",
            ("won", false) => "dispute won (money reinstated)",
            ("won", true) => "dispute won (money reinstated), webhook dropped",
            (_, false) => "dispute lost",
            (_, true) => "dispute lost, webhook dropped",
        }))
    }

    /// Fails a refund the provider paid (the card was closed), then, once
    /// oncepay shows it failed, refunds the amount again as the merchant
    /// would.
    async fn fail_a_refund(&mut self) -> Result<Option<&'static str>, String> {
        let row = sqlx::query(
            "SELECT r.id::text, r.provider_refund_id, r.payment_id::text, r.amount
               FROM refund r JOIN payment_attempt p ON p.id = r.payment_id
              WHERE r.status = 'succeeded' AND NOT r.incident AND p.provider = $1
                AND r.provider_refund_id IS NOT NULL AND r.destination = 'original'
              ORDER BY random() LIMIT 1",
        )
        .bind(self.provider)
        .fetch_optional(&self.db)
        .await
        .map_err(|e| format!("bank: choosing a refund: {e}"))?;
        let Some(row) = row else {
            return Ok(None);
        };
        let get = |i: usize| row.try_get::<String, _>(i).map_err(|e| e.to_string());
        let (refund_id, provider_id, payment_id) = (get(0)?, get(1)?, get(2)?);
        let amount: i64 = row.try_get(3).map_err(|e| e.to_string())?;
        {
            let record = self.record.lock().await;
            if record.failed.iter().any(|f| f.refund_id == refund_id) {
                return Ok(None);
            }
        }
        let failed_at = chrono::Utc::now();
        let mut dropped = false;
        match &self.side {
            Side::Sandbox { base } => {
                let failed = self
                    .http
                    .post(format!("{base}/v1/refunds/{provider_id}/fail"))
                    .json(&json!({"failure_code": "expired_or_canceled_card"}))
                    .send()
                    .await
                    .map_err(|e| format!("bank: failing a sandbox refund: {e}"))?;
                if !failed.status().is_success() {
                    return Err(format!(
                        "bank: the sandbox answered {} to a refund's failure",
                        failed.status()
                    ));
                }
            }
            Side::Stripe { stack, .. } => {
                stack
                    .layer
                    .fail_refund(&provider_id, "expired_or_canceled_card");
                if drops_the_webhook() {
                    dropped = true;
                } else {
                    let refund = stack.refund(&provider_id).await?;
                    // Every shape item 7 of the issue names: the endpoint's
                    // API version decides which one a merchant gets.
                    let kind = match fastrand::u8(0..3) {
                        0 => "refund.failed",
                        1 => "refund.updated",
                        _ => "charge.refund.updated",
                    };
                    self.deliver(&refund, kind);
                }
            }
        }
        {
            let mut record = self.record.lock().await;
            record.failed.push(FailedLater {
                refund_id: refund_id.clone(),
                provider_id: provider_id.clone(),
                payment_id: payment_id.clone(),
                failed_at,
                refunded_again: None,
            });
            if dropped {
                record.dropped_refunds.insert(refund_id.clone());
            }
        }
        let (clients, record, key) = (
            self.clients.clone(),
            self.record.clone(),
            format!("bank-again-{}-{}", std::process::id(), self.serial()),
        );
        self.work.spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                let failed = clients
                    .get(&format!("/refunds/{refund_id}"))
                    .await
                    .is_some_and(|r| r["status"] == "failed");
                if failed {
                    let answer = clients
                        .post(
                            &format!("/payments/{payment_id}/refunds"),
                            &key,
                            &json!({"amount": amount}),
                        )
                        .await
                        .map_or((0, String::new()), |(status, body)| {
                            (status, body.to_string())
                        });
                    if answer.0 != 201 && answer.0 != 202 {
                        eprintln!("bank: refunding {refund_id}'s amount again: {answer:?}");
                    }
                    let answer = answer.0;
                    let mut record = record.lock().await;
                    if let Some(f) = record.failed.iter_mut().find(|f| f.refund_id == refund_id) {
                        f.refunded_again = Some((answer, chrono::Utc::now()));
                    }
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Ok(Some(if dropped {
            "refund failed after it succeeded (card closed), webhook dropped"
        } else {
            "refund failed after it succeeded (card closed)"
        }))
    }

    /// Delivers Stripe's signed event `kind` carrying `object` to a serve
    /// process, retried until acknowledged (Stripe retries for days).
    fn deliver(&mut self, object: &Value, kind: &str) {
        let Side::Stripe { webhooks, .. } = &self.side else {
            return;
        };
        let event = json!({
            "id": format!("evt_bank_{:016x}", fastrand::u64(..)),
            "object": "event",
            "type": kind,
            "created": chrono::Utc::now().timestamp(),
            "data": {"object": object},
        });
        let (webhooks, http, record) = (webhooks.clone(), self.http.clone(), self.record.clone());
        let kind = kind.to_string();
        let copies = if fastrand::u8(0..5) == 0 { 2 } else { 1 };
        self.work.spawn(async move {
            let body = event.to_string();
            for _ in 0..copies {
                let started = Instant::now();
                let mut pause = Duration::from_millis(200);
                loop {
                    let url = &webhooks[fastrand::usize(0..webhooks.len())];
                    let signature = oncepay::provider::stripe::signature::sign(
                        stripe::WEBHOOK_SECRET,
                        chrono::Utc::now().timestamp(),
                        body.as_bytes(),
                    );
                    let sent = http
                        .post(format!("{url}/webhooks/stripe"))
                        .header("Stripe-Signature", signature)
                        .header("content-type", "application/json")
                        .body(body.clone())
                        .send()
                        .await;
                    if sent.is_ok_and(|r| r.status().is_success()) {
                        record.lock().await.delivered.0 += 1;
                        break;
                    }
                    record.lock().await.delivered.1 += 1;
                    if started.elapsed() > Duration::from_secs(240) {
                        record
                            .lock()
                            .await
                            .errors
                            .push(format!("bank: {kind} not acknowledged in 240 s"));
                        return;
                    }
                    tokio::time::sleep(pause.mul_f64(0.5 + fastrand::f64() / 2.0)).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        });
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Whether this change at Stripe goes without its webhook (a third of
/// them): the event is never sent, as when an endpoint was disabled or
/// Stripe's retries ran out; only the books' read-back can apply it.
fn drops_the_webhook() -> bool {
    fastrand::u8(0..3) == 0
}

/// One invariant's name, how many things it checked and how many broke it.
pub type Check = crate::outbox::Check;

/// A payment's money as stored.
struct Money {
    amount: i64,
    refunded: i64,
    lost: i64,
}

/// The bank's rows of the invariant table, against the database and the
/// provider's books (`ledger`, in the sandbox ledger's shape).
pub async fn check(db: &PgPool, ledger: &Value, record: &Record) -> Result<Vec<Check>, String> {
    let q = |sql: &'static str| async move {
        sqlx::query(sql)
            .fetch_all(db)
            .await
            .map_err(|e| e.to_string())
    };
    let err = |e: sqlx::Error| e.to_string();
    let mut money: BTreeMap<String, Money> = BTreeMap::new();
    for r in q("SELECT p.id::text, p.amount_captured,
                       COALESCE((SELECT sum(amount) FROM refund r
                                  WHERE r.payment_id = p.id AND r.status = 'succeeded'), 0)::bigint,
                       COALESCE((SELECT sum(amount) FROM dispute d
                                  WHERE d.payment_id = p.id AND d.status = 'lost'), 0)::bigint
                  FROM payment_attempt p WHERE p.status = 'succeeded'")
    .await?
    {
        money.insert(
            r.try_get(0).map_err(err)?,
            Money {
                amount: r.try_get(1).map_err(err)?,
                refunded: r.try_get(2).map_err(err)?,
                lost: r.try_get(3).map_err(err)?,
            },
        );
    }
    // What the provider refunded of each charge, by our attempt id.
    let at_provider: BTreeMap<String, i64> = ledger["charges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            (
                text(&c["idempotency_key"]),
                c["amount_refunded"].as_i64().unwrap_or(i64::MAX),
            )
        })
        .collect();
    let provider_refunded = |payment: &str| at_provider.get(payment).copied().unwrap_or(0);

    let refunds = q("SELECT r.id::text, r.status,
                            EXISTS (SELECT 1 FROM incident i WHERE i.refund_id = r.id
                                       AND i.kind = 'refund_failed_after_success')
                       FROM refund r")
    .await?;
    let mut refund_status: BTreeMap<String, (String, bool)> = BTreeMap::new();
    for r in &refunds {
        refund_status.insert(
            r.try_get(0).map_err(err)?,
            (r.try_get(1).map_err(err)?, r.try_get(2).map_err(err)?),
        );
    }
    let pending = refund_status
        .values()
        .filter(|(s, _)| s == "pending")
        .count();

    let mut failed_later = 0;
    for f in &record.failed {
        let here = refund_status
            .get(&f.refund_id)
            .is_some_and(|(s, incident)| s == "failed" && *incident);
        let again = match f.refunded_again {
            None | Some((201 | 202, _)) => true,
            // Refused as over what is left: right only if, between the
            // failure and this refund, another refund of the payment (the
            // client's own, racing the bank's) took the room back.
            Some((422, at)) => {
                let taken: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM refund
                      WHERE payment_id = $1::uuid AND id <> $2::uuid
                        AND created_at BETWEEN $3 AND $4",
                )
                .bind(&f.payment_id)
                .bind(&f.refund_id)
                .bind(f.failed_at)
                .bind(at)
                .fetch_one(db)
                .await
                .map_err(err)?;
                taken > 0
            }
            Some(_) => false,
        };
        if !(here && again) {
            eprintln!(
                "breach: refund {} of payment {} failed later: here {:?}, refunded again {:?}",
                f.refund_id,
                f.payment_id,
                refund_status.get(&f.refund_id),
                f.refunded_again
            );
            failed_later += 1;
        }
    }

    let mut stored_disputes: BTreeMap<String, (String, String, i64)> = BTreeMap::new();
    for r in q("SELECT provider_dispute_id, status, payment_id::text, amount FROM dispute").await? {
        stored_disputes.insert(
            r.try_get(0).map_err(err)?,
            (
                r.try_get(1).map_err(err)?,
                r.try_get(2).map_err(err)?,
                r.try_get(3).map_err(err)?,
            ),
        );
    }
    let disputes_differing = record
        .disputes
        .iter()
        .filter(|d| {
            stored_disputes.get(&d.id)
                != Some(&(d.status.to_string(), d.payment_id.clone(), d.amount))
        })
        .count();

    let holding: Vec<&Dispute> = record
        .disputes
        .iter()
        .filter(|d| d.status != "won")
        .collect();
    let disputed_refunded = holding
        .iter()
        .filter(|d| {
            let here = money.get(&d.payment_id).map_or(i64::MAX, |m| m.refunded);
            here + d.amount > d.payment_amount
                || provider_refunded(&d.payment_id) + d.amount > d.payment_amount
        })
        .count();

    let seen: Vec<&Try> = record.tries.iter().filter(|t| t.dispute_seen).collect();
    let not_refused = seen
        .iter()
        .filter(|t| t.answer != (409, "payment_disputed".to_string()))
        .count();

    let beyond_lost = money
        .iter()
        .filter(|(id, m)| {
            let cap = m.amount - m.lost;
            m.refunded > cap || provider_refunded(id) > cap
        })
        .count();

    Ok(vec![
        (
            "every refund final within the settle time after the faults stop",
            refund_status.len() as u64,
            pending as u64,
        ),
        (
            "every refund the provider failed later is failed here, with its incident, and refundable again",
            record.failed.len() as u64,
            failed_later as u64,
        ),
        (
            "every dispute the provider holds is here, in the provider's status",
            record.disputes.len() as u64,
            disputes_differing as u64,
        ),
        (
            "no disputed amount refunded (open or lost disputes; db and provider)",
            holding.len() as u64,
            disputed_refunded as u64,
        ),
        (
            "a refund of a disputed amount is refused (409 payment_disputed) once the dispute shows",
            seen.len() as u64,
            not_refused as u64,
        ),
        (
            "refunds never exceed captured minus lost disputes (db and provider)",
            money.len() as u64,
            beyond_lost as u64,
        ),
        (
            "the bank's own actions all went through",
            record.actions.values().sum::<u64>() + record.errors.len() as u64,
            record.errors.len() as u64,
        ),
    ])
}

/// The bank's lines of the fault table.
pub fn table(record: &Record) -> String {
    let mut out = String::new();
    for (name, n) in &record.actions {
        out += &format!("| bank: {name} | {n} |\n");
    }
    let tried = record.tries.len();
    let unseen = record.tries.iter().filter(|t| !t.dispute_seen).count();
    out += &format!("| bank: refunds tried on disputed payments (dispute not yet shown) | {tried} ({unseen}) |\n");
    let again = record
        .failed
        .iter()
        .filter(|f| f.refunded_again.is_some())
        .count();
    out += &format!("| bank: refunds failed later, then refunded again | {again} |\n");
    let (delivered, retried) = record.delivered;
    if delivered + retried > 0 {
        out += &format!(
            "| bank: Stripe events delivered (deliveries retried) | {delivered} ({retried}) |\n"
        );
    }
    for e in record.errors.iter().take(5) {
        eprintln!("{e}");
    }
    out
}
