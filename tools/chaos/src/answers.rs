//! Stripe as it answers (issue 55): three invariants, checked by counting
//! after the soak, that hold oncepay to what it does when the provider
//! refuses a capture, replays a `500` it saved under a key, and sends no
//! webhook for a change only a webhook carries (`docs/chaos.md`, "Stripe
//! as it answers"):
//!
//! - every capture final within the settle time after the faults stop: no
//!   capture row `pending`, none with a refusal's confirming read left
//!   (`decline_check_at`), and each as the provider holds it: `succeeded`
//!   here is a capture the provider made under the row's key, `failed`
//!   here is none under it (the sandbox's captures carry the row's id as
//!   their key, Stripe's `oncepay_<id>_capture`, as the Stripe layer saw
//!   them);
//! - no payment the customer approved reads `authentication_expired`: a
//!   3-D Secure customer who pressed approve, where the provider took the
//!   approval (its books show the charge approved: not failed, nor still
//!   waiting), has an automatic payment `succeeded`, a manual one
//!   `requires_capture`, `succeeded` or `voided` (an approval at the last
//!   moment, released by oncepay's give-up: `void_reason: abandoned`),
//!   never `failed` and never `authentication_expired`;
//! - every refund reversal and dispute at the provider is applied here: each
//!   refund the provider shows failed after it succeeded is `failed` here
//!   with its `refund_failed_after_success` incident, and each dispute the
//!   provider holds is here in the provider's status and amount — those
//!   whose webhook was dropped too (with Stripe a third of the bank's
//!   changes go without one: only the books pass, `oncepay reconcile` at
//!   the end of the soak, can apply them).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::Value;
use sqlx::{PgPool, Row};

use crate::bank::Record;
use crate::clients::Intent;
use crate::outbox::Check;

/// What the provider holds of what only webhooks carry, read at the end.
pub struct AtProvider {
    /// Where it was read, for the table.
    pub source: &'static str,
    /// The provider's ids of the refunds it shows failed after they
    /// succeeded.
    pub reversed: Vec<String>,
    /// Its disputes: the provider's id, status and amount.
    pub disputes: Vec<(String, String, i64)>,
}

impl AtProvider {
    /// Stripe's, from the layer that holds them (localstripe has neither).
    pub fn stripe(stack: &crate::stripe::Stack) -> AtProvider {
        let disputes = stack
            .disputes()
            .iter()
            .map(|d| {
                (
                    text(&d["id"]),
                    text(&d["status"]),
                    d["amount"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        AtProvider {
            source: "read from the Stripe layer",
            reversed: stack.reversed_refunds(),
            disputes,
        }
    }

    /// The sandbox's, as the bank made it change them (each acknowledged
    /// by the sandbox's own endpoint).
    pub fn sandbox(record: &Record) -> AtProvider {
        AtProvider {
            source: "as the bank made the sandbox change them",
            reversed: record
                .failed
                .iter()
                .map(|f| f.provider_id.clone())
                .collect(),
            disputes: record
                .disputes
                .iter()
                .map(|d| (d.id.clone(), d.status.to_string(), d.amount))
                .collect(),
        }
    }
}

/// What the books pass at the end (`oncepay reconcile`) did, from its runs'
/// reports (`books_run`).
pub struct BooksPass {
    /// Provider objects that matched our rows.
    pub matched: i64,
    /// Rows rebuilt from the provider's books.
    pub adopted: i64,
    /// Orphan charges refunded.
    pub refunded: i64,
    /// Disagreements recorded as incidents.
    pub mismatched: i64,
    /// Our succeeded rows the provider does not list.
    pub missing: i64,
    /// Refunds found failed after they succeeded, and applied.
    pub reversed: i64,
    /// Disputes read back that changed what we held.
    pub disputes: i64,
}

/// Runs `oncepay reconcile --since <since>` with the serve processes'
/// environment `env` (its provider calls given time: a list of the whole
/// soak is long), again while another process holds the books or the
/// provider does not answer; then reads what its runs did.
pub async fn books_pass(
    bin: &std::path::Path,
    env: &[(String, String)],
    db: &PgPool,
    since: chrono::DateTime<chrono::Utc>,
) -> Result<BooksPass, String> {
    let since = since.to_rfc3339();
    let mut last = String::new();
    let mut done = false;
    for _ in 0..10 {
        let out = tokio::process::Command::new(bin)
            .args(["reconcile", "--since", since.as_str()])
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("ONCEPAY_STRIPE_TIMEOUT", "60s")
            .env("ONCEPAY_PROVIDER_TIMEOUT", "60s")
            .env("ONCEPAY_IDEMPOTENCY_LEASE", "300s")
            .env("ONCEPAY_BOOKS_READ_BACK_LIMIT", "100000")
            .env("ONCEPAY_LOG", "warn")
            .output()
            .await
            .map_err(|e| format!("running oncepay reconcile: {e}"))?;
        if out.status.success() {
            done = true;
            break;
        }
        last = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if !done {
        return Err(format!("oncepay reconcile did not finish: {last}"));
    }
    let r = sqlx::query(
        "SELECT COALESCE(sum(matched), 0)::bigint, COALESCE(sum(adopted), 0)::bigint,
                COALESCE(sum(refunded), 0)::bigint, COALESCE(sum(mismatched), 0)::bigint,
                COALESCE(sum(missing), 0)::bigint, COALESCE(sum(reversed), 0)::bigint,
                COALESCE(sum(disputes), 0)::bigint
           FROM books_run WHERE trigger = 'cli' AND NOT dry_run",
    )
    .fetch_one(db)
    .await
    .map_err(|e| format!("reading the books pass's report: {e}"))?;
    let n = |i: usize| r.try_get::<i64, _>(i).map_err(|e| e.to_string());
    Ok(BooksPass {
        matched: n(0)?,
        adopted: n(1)?,
        refunded: n(2)?,
        mismatched: n(3)?,
        missing: n(4)?,
        reversed: n(5)?,
        disputes: n(6)?,
    })
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

fn err(e: sqlx::Error) -> String {
    e.to_string()
}

/// The provider's captures' keys (the ledger's `captures`).
fn capture_keys(ledger: &Value) -> HashSet<String> {
    ledger["captures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["idempotency_key"].as_str())
        .map(str::to_string)
        .collect()
}

/// Every capture row final, and as the provider holds it.
async fn every_capture_final(db: &PgPool, ledger: &Value) -> Result<Check, String> {
    let rows = sqlx::query(
        "SELECT c.id::text, c.status, c.decline_check_at IS NOT NULL, c.failure_code, p.provider
           FROM payment_capture c JOIN payment_attempt p ON p.id = c.payment_id",
    )
    .fetch_all(db)
    .await
    .map_err(err)?;
    let keys = capture_keys(ledger);
    let captured_there =
        |id: &str| keys.contains(id) || keys.contains(&format!("oncepay_{id}_capture"));
    let (mut checked, mut breaches) = (0u64, 0u64);
    for r in &rows {
        let id: String = r.try_get(0).map_err(err)?;
        let status: String = r.try_get(1).map_err(err)?;
        let confirming: bool = r.try_get(2).map_err(err)?;
        let code: Option<String> = r.try_get(3).map_err(err)?;
        let provider: String = r.try_get(4).map_err(err)?;
        // A balance payment's hold is the ledger's, not a provider's.
        if provider == "balance" {
            continue;
        }
        checked += 1;
        let there = captured_there(&id);
        let ok = !confirming
            && match status.as_str() {
                "succeeded" => there,
                "failed" => !there,
                _ => false,
            };
        if !ok {
            eprintln!(
                "breach: capture {id} is {status} ({code:?}, confirming read left: {confirming}); the provider {} a capture under its key",
                if there { "holds" } else { "holds no" }
            );
            breaches += 1;
        }
    }
    Ok((
        "every capture final within the settle time after the faults stop",
        checked,
        breaches,
    ))
}

/// A payment as stored, for the approvals.
#[derive(Debug)]
struct Stored {
    status: String,
    failure_code: Option<String>,
    capture_method: String,
    void_reason: Option<String>,
}

/// What the customers who pressed approve came to.
#[derive(Default)]
struct Approvals {
    /// Approvals the bank's page took.
    pressed: u64,
    /// Of those, approvals the provider took in time.
    taken: u64,
    /// Of those, holds released by oncepay's give-up (`abandoned`).
    released_as_abandoned: u64,
}

/// No payment whose customer's approval the provider took reads
/// `authentication_expired` (nor failed at all).
async fn no_approved_payment_expired(
    db: &PgPool,
    ledger: &Value,
    intents: &[Intent],
) -> Result<(Check, Approvals), String> {
    let at_provider: HashMap<String, String> = ledger["charges"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| (text(&c["idempotency_key"]), text(&c["status"])))
        .collect();
    let approved: Vec<String> = intents
        .iter()
        .filter(|i| i.approved)
        .filter_map(|i| i.payment_answers.first())
        .map(|a| text(&a["id"]))
        .collect();
    let rows = sqlx::query(
        "SELECT id::text, status, failure_code, capture_method, void_reason
           FROM payment_attempt WHERE id::text = ANY($1)",
    )
    .bind(&approved)
    .fetch_all(db)
    .await
    .map_err(err)?;
    let mut stored: HashMap<String, Stored> = HashMap::new();
    for r in &rows {
        stored.insert(
            r.try_get(0).map_err(err)?,
            Stored {
                status: r.try_get(1).map_err(err)?,
                failure_code: r.try_get(2).map_err(err)?,
                capture_method: r.try_get(3).map_err(err)?,
                void_reason: r.try_get(4).map_err(err)?,
            },
        );
    }
    let mut seen = Approvals {
        pressed: approved.len() as u64,
        ..Approvals::default()
    };
    let mut breaches = 0u64;
    for id in &approved {
        // The provider's word on whether the approval came in time: a
        // charge cancelled first (oncepay's give-up) failed there, and one
        // never approved still waits.
        let there = at_provider.get(id).map(String::as_str);
        let taken = there.is_some_and(|s| !matches!(s, "failed" | "pending" | "unconfirmed"));
        if !taken {
            continue;
        }
        seen.taken += 1;
        let ok = match stored.get(id) {
            None => false,
            Some(p) => {
                let status = p.status.as_str();
                if status == "voided" && p.void_reason.as_deref() == Some("abandoned") {
                    seen.released_as_abandoned += 1;
                }
                let allowed = match p.capture_method.as_str() {
                    "manual" => matches!(status, "requires_capture" | "succeeded" | "voided"),
                    _ => status == "succeeded",
                };
                allowed && p.failure_code.as_deref() != Some("authentication_expired")
            }
        };
        if !ok {
            eprintln!(
                "breach: payment {id}, approved by its customer (the provider shows {there:?}), is stored {:?}",
                stored.get(id)
            );
            breaches += 1;
        }
    }
    Ok((
        (
            "no payment the customer approved reads authentication_expired",
            seen.taken,
            breaches,
        ),
        seen,
    ))
}

/// What of the provider's reversals and disputes is applied here, and of
/// those whose webhook was dropped.
#[derive(Default)]
struct Applied {
    /// Reversals, and of them those whose webhook was dropped.
    reversed: (u64, u64),
    /// Disputes, and of them those with a webhook dropped.
    disputes: (u64, u64),
}

/// Every refund reversal and dispute at the provider is applied here.
async fn every_reversal_and_dispute_applied(
    db: &PgPool,
    at: &AtProvider,
    record: &Record,
) -> Result<(Check, Applied), String> {
    let mut refunds: HashMap<String, (String, String, bool)> = HashMap::new();
    for r in sqlx::query(
        "SELECT r.provider_refund_id, r.id::text, r.status,
                EXISTS (SELECT 1 FROM incident i WHERE i.refund_id = r.id
                           AND i.kind = 'refund_failed_after_success')
           FROM refund r WHERE r.provider_refund_id IS NOT NULL",
    )
    .fetch_all(db)
    .await
    .map_err(err)?
    {
        refunds.insert(
            r.try_get(0).map_err(err)?,
            (
                r.try_get(1).map_err(err)?,
                r.try_get(2).map_err(err)?,
                r.try_get(3).map_err(err)?,
            ),
        );
    }
    let mut disputes: HashMap<String, (String, i64)> = HashMap::new();
    for r in sqlx::query("SELECT provider_dispute_id, status, amount FROM dispute")
        .fetch_all(db)
        .await
        .map_err(err)?
    {
        disputes.insert(
            r.try_get(0).map_err(err)?,
            (r.try_get(1).map_err(err)?, r.try_get(2).map_err(err)?),
        );
    }
    let mut applied = Applied::default();
    let mut breaches = 0u64;
    for provider_id in &at.reversed {
        let here = refunds.get(provider_id);
        let dropped = here.is_some_and(|(ours, _, _)| record.dropped_refunds.contains(ours));
        let ok = here.is_some_and(|(_, status, incident)| status == "failed" && *incident);
        if ok {
            applied.reversed.0 += 1;
            applied.reversed.1 += u64::from(dropped);
        } else {
            eprintln!(
                "breach: refund {provider_id} failed at the provider after it succeeded (webhook dropped: {dropped}); here {here:?}"
            );
            breaches += 1;
        }
    }
    for (id, status, amount) in &at.disputes {
        let here = disputes.get(id);
        let dropped = record.dropped_disputes.contains(id);
        let ok = here.is_some_and(|(s, a)| s == status && a == amount);
        if ok {
            applied.disputes.0 += 1;
            applied.disputes.1 += u64::from(dropped);
        } else {
            eprintln!(
                "breach: dispute {id} is {status} for {amount} at the provider (a webhook dropped: {dropped}); here {here:?}"
            );
            breaches += 1;
        }
    }
    Ok((
        (
            "every refund reversal and dispute at the provider is applied here",
            (at.reversed.len() + at.disputes.len()) as u64,
            breaches,
        ),
        applied,
    ))
}

/// One count of the table; unreadable is `-1`.
async fn scalar(db: &PgPool, sql: &'static str) -> i64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(db)
        .await
        .unwrap_or(-1)
}

/// The three invariants' rows, and their lines of the fault table.
pub async fn check(
    db: &PgPool,
    ledger: &Value,
    intents: &[Intent],
    record: &Record,
    at: &AtProvider,
    books: Option<&BooksPass>,
) -> Result<(Vec<Check>, String), String> {
    let captures = every_capture_final(db, ledger).await?;
    let (approvals, seen) = no_approved_payment_expired(db, ledger, intents).await?;
    let (applied_row, applied) = every_reversal_and_dispute_applied(db, at, record).await?;

    let mut lines: Vec<(String, i64)> = Vec::new();
    let refused = sqlx::query(
        "SELECT COALESCE(failure_code, '?'), count(*) FROM payment_capture
          WHERE status = 'failed' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(db)
    .await
    .unwrap_or_default();
    for r in refused {
        let code: String = r.try_get(0).unwrap_or_default();
        let n: i64 = r.try_get(1).unwrap_or(-1);
        lines.push((format!("capture rows failed here (refused): {code}"), n));
    }
    let won = |prefix: &str, what: &str| {
        intents
            .iter()
            .filter(|i| {
                i.hold_answers.iter().any(|(w, key, status, _)| {
                    *w == what && key.starts_with(prefix) && *status == 200
                })
            })
            .count() as i64
    };
    lines.extend([
        (
            "captures refused, then captured again under a new key".to_string(),
            won("recapture-", "capture"),
        ),
        (
            "captures refused, then the hold voided".into(),
            won("void-refused-", "void"),
        ),
        (
            "payment attempts confirmed again under a new key (a saved 500 proved unconfirmed)"
                .into(),
            scalar(
                db,
                "SELECT count(*) FROM payment_attempt WHERE provider_key_generation > 0",
            )
            .await,
        ),
        (
            "refunds sent again under a new key (a saved 500 proved unmade)".into(),
            scalar(
                db,
                "SELECT count(*) FROM refund WHERE provider_key_generation > 0",
            )
            .await,
        ),
        (
            "3-D Secure approvals the bank's page took".into(),
            seen.pressed as i64,
        ),
        (
            "3-D Secure approvals the provider took in time".into(),
            seen.taken as i64,
        ),
        (
            "approved holds released by oncepay's give-up (voided, abandoned)".into(),
            seen.released_as_abandoned as i64,
        ),
        (
            format!(
                "refunds failed after they succeeded at the provider ({})",
                at.source
            ),
            at.reversed.len() as i64,
        ),
        (
            "refunds failed at the provider: failed here, with their incident".into(),
            applied.reversed.0 as i64,
        ),
        (
            "refunds failed at the provider with their webhook dropped: failed here, with their incident".into(),
            applied.reversed.1 as i64,
        ),
        (
            format!("disputes at the provider ({})", at.source),
            at.disputes.len() as i64,
        ),
        (
            "disputes at the provider: here in its status".into(),
            applied.disputes.0 as i64,
        ),
        (
            "disputes at the provider with a webhook dropped: here in its status".into(),
            applied.disputes.1 as i64,
        ),
        (
            "bank: refund failures made with their webhook dropped".into(),
            record.dropped_refunds.len() as i64,
        ),
        (
            "bank: disputes opened or moved with a webhook dropped".into(),
            record.dropped_disputes.len() as i64,
        ),
    ]);
    if let Some(b) = books {
        lines.extend([
            (
                "books pass at the end (oncepay reconcile): refunds read back failed, applied"
                    .to_string(),
                b.reversed,
            ),
            (
                "books pass at the end: disputes read back that changed what was held".into(),
                b.disputes,
            ),
            (
                "books pass at the end: provider objects matched".into(),
                b.matched,
            ),
            ("books pass at the end: rows adopted".into(), b.adopted),
            (
                "books pass at the end: orphan charges refunded".into(),
                b.refunded,
            ),
            (
                "books pass at the end: mismatches (incidents)".into(),
                b.mismatched,
            ),
            (
                "books pass at the end: missing at the provider (incidents)".into(),
                b.missing,
            ),
        ]);
    }
    let mut out = "\n| Stripe as it answers (issue 55) | count |\n|---|---:|\n".to_string();
    for (name, n) in lines {
        out += &format!("| {name} | {n} |\n");
    }
    Ok((vec![captures, approvals, applied_row], out))
}
