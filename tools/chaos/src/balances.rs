//! Customer balances' invariants (the double-entry ledger), checked by
//! counting after the soak: the ledger's rows, `oncepay ledger check` run
//! as an operator would, and what the clients were told. No balance ever
//! below zero, the ledger sums to zero, one transfer per key, a hold
//! resolved once and never captured once expired.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::{PgPool, Row};

use crate::clients::Intent;
use crate::outbox::{count as scalar, Check};

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// No holder went below zero or held more than it had, after any transfer
/// (the totals each transfer recorded) or now (the rows).
async fn never_negative(db: &PgPool) -> Check {
    let transfers = scalar(db, "SELECT count(*) FROM ledger_transfer").await;
    let breaches = scalar(
        db,
        "SELECT (SELECT count(*) FROM ledger_transfer
                  WHERE posted_after < 0 OR held_after < 0 OR held_after > posted_after)
              + (SELECT count(*) FROM ledger_account
                  WHERE kind = 'holder' AND (posted < 0 OR held < 0 OR held > posted))",
    )
    .await;
    (
        "no balance below zero, after any transfer or now",
        transfers,
        breaches,
    )
}

/// `oncepay ledger check`, run as an operator would: its lines (one per
/// merchant and currency) and whether it passed.
pub struct LedgerCheck {
    /// Its standard output.
    pub output: String,
    /// The transfers it checked, over every line it printed.
    lines: u64,
    /// Lines marked BREACH, or 1 if it failed without one.
    breaches: u64,
}

/// Runs `oncepay ledger check` on the soak's database.
pub async fn ledger_check(bin: &std::path::Path, db_url: &str) -> Result<LedgerCheck, String> {
    let out = tokio::process::Command::new(bin)
        .args(["ledger", "check"])
        .env("DATABASE_URL", db_url)
        .env("ONCEPAY_LOG", "warn")
        .output()
        .await
        .map_err(|e| format!("running oncepay ledger check: {e}"))?;
    let output = String::from_utf8_lossy(&out.stdout).to_string();
    // What it checked: the transfers of every merchant and currency (the
    // fifth column).
    let lines = output
        .lines()
        .skip(1)
        .filter_map(|l| l.split('\t').nth(4)?.parse::<u64>().ok())
        .sum();
    let marked = output.lines().filter(|l| l.ends_with("BREACH")).count() as u64;
    let breaches = match out.status.success() {
        true => marked,
        false => marked.max(1),
    };
    if !out.status.success() {
        eprintln!(
            "oncepay ledger check failed: {}{}",
            output,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(LedgerCheck {
        output,
        lines,
        breaches,
    })
}

/// One transfer per key, and every key a client was answered `201` for
/// names the transfer (or hold) it made.
async fn one_transfer_per_key(db: &PgPool, intents: &[Intent]) -> Result<Check, String> {
    let rows = sqlx::query(
        "SELECT idempotency_key, count(*), min(id::text)
           FROM ledger_transfer WHERE idempotency_key IS NOT NULL GROUP BY idempotency_key",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut by_key: HashMap<String, (i64, String)> = HashMap::new();
    for r in rows {
        let err = |e: sqlx::Error| e.to_string();
        by_key.insert(
            r.try_get(0).map_err(err)?,
            (r.try_get(1).map_err(err)?, r.try_get(2).map_err(err)?),
        );
    }
    let mut breaches = by_key.values().filter(|(n, _)| *n > 1).count() as u64;
    let mut checked = by_key.len() as u64;
    for intent in intents {
        for (key, status, body) in &intent.balance_answers {
            if *status != 201 {
                continue;
            }
            checked += 1;
            let made = by_key.get(key);
            if made.is_none_or(|(n, id)| *n != 1 || id != text(&body["id"])) {
                eprintln!("breach: balance key {key} answered {body}, made {made:?}");
                breaches += 1;
            }
        }
    }
    Ok(("one balance transfer per key", checked, breaches))
}

/// A hold is resolved once (captured, released or expired), and no client
/// was told both a capture and a release of it.
async fn hold_resolved_once(db: &PgPool, intents: &[Intent]) -> Check {
    let holds = scalar(
        db,
        "SELECT count(*) FROM ledger_transfer WHERE phase = 'pending'",
    )
    .await;
    let mut breaches = scalar(
        db,
        "SELECT count(*) FROM (SELECT pending_id FROM ledger_transfer
                                WHERE pending_id IS NOT NULL
                                GROUP BY pending_id HAVING count(*) > 1) twice",
    )
    .await;
    for intent in intents {
        let mut resolved: HashMap<&str, Vec<&str>> = HashMap::new();
        for (_, status, body) in &intent.balance_answers {
            if *status == 200 {
                resolved
                    .entry(text(&body["id"]))
                    .or_default()
                    .push(text(&body["status"]));
            }
        }
        for outcomes in resolved.values() {
            breaches += u64::from(outcomes.iter().any(|o| *o != outcomes[0]));
        }
    }
    ("no hold resolved twice", holds, breaches)
}

/// No hold was captured at or after its expiry.
async fn no_expired_hold_captured(db: &PgPool) -> Check {
    let posts = scalar(
        db,
        "SELECT count(*) FROM ledger_transfer WHERE phase = 'post'",
    )
    .await;
    let breaches = scalar(
        db,
        "SELECT count(*) FROM ledger_transfer t JOIN ledger_transfer p ON p.id = t.pending_id
          WHERE t.phase = 'post' AND t.created_at >= p.expires_at",
    )
    .await;
    ("no expired hold captured", posts, breaches)
}

/// Every hold past its expiry was resolved (the sweeper's, within a
/// minute; the soak settles long after the last hold's expiry).
async fn no_hold_left_past_expiry(db: &PgPool) -> Check {
    let holds = scalar(
        db,
        "SELECT count(*) FROM ledger_transfer WHERE phase = 'pending'",
    )
    .await;
    let breaches = scalar(
        db,
        "SELECT count(*) FROM ledger_open_pending WHERE expires_at < now() - interval '60 seconds'",
    )
    .await;
    (
        "every hold past its expiry reads expired (swept within a minute)",
        holds,
        breaches,
    )
}

/// A balance payment moved the balance once: a succeeded one by one
/// transfer of its amount, a failed one (insufficient funds) not at all.
async fn balance_payments_moved_once(db: &PgPool) -> Result<Check, String> {
    let rows = sqlx::query(
        "SELECT p.status, p.amount,
                (SELECT count(*) FROM ledger_transfer t WHERE t.payment_id = p.id AND t.code = 'payment'),
                COALESCE((SELECT sum(t.amount) FROM ledger_transfer t
                           WHERE t.payment_id = p.id AND t.code = 'payment'), 0)::bigint
           FROM payment_attempt p WHERE p.provider = 'balance'",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut breaches = 0;
    for r in &rows {
        let err = |e: sqlx::Error| e.to_string();
        let status: String = r.try_get(0).map_err(err)?;
        let amount: i64 = r.try_get(1).map_err(err)?;
        let (n, moved): (i64, i64) = (r.try_get(2).map_err(err)?, r.try_get(3).map_err(err)?);
        let ok = match status.as_str() {
            "succeeded" => n == 1 && moved == amount,
            _ => n == 0,
        };
        breaches += u64::from(!ok);
    }
    Ok((
        "a balance payment moved the balance once (failed: not at all)",
        rows.len() as u64,
        breaches,
    ))
}

/// Every balance answer a client got matches what is stored, and the
/// repeats of a key (a refused debit sent again after a credit included)
/// are identical.
async fn answers_match(db: &PgPool, intents: &[Intent]) -> Result<Check, String> {
    let resolutions = sqlx::query(
        "SELECT p.id::text, t.phase, t.code FROM ledger_transfer p
           JOIN ledger_transfer t ON t.pending_id = p.id",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut resolved: HashMap<String, (String, String)> = HashMap::new();
    for r in resolutions {
        let err = |e: sqlx::Error| e.to_string();
        resolved.insert(
            r.try_get(0).map_err(err)?,
            (r.try_get(1).map_err(err)?, r.try_get(2).map_err(err)?),
        );
    }
    let (mut checked, mut breaches) = (0u64, 0u64);
    for intent in intents {
        let mut by_key: HashMap<&str, Vec<(u16, &Value)>> = HashMap::new();
        for (key, status, body) in &intent.balance_answers {
            by_key.entry(key).or_default().push((*status, body));
        }
        for answers in by_key.values() {
            checked += 1;
            let same = answers.iter().all(|a| a == &answers[0]);
            let (status, body) = answers[0];
            let stored = resolved.get(text(&body["id"]));
            let ok = same
                && match (status, text(&body["status"])) {
                    (201, _) => body["id"].is_string(),
                    (200, "captured") => stored.is_some_and(|(phase, _)| phase == "post"),
                    (200, "released") => stored
                        .is_some_and(|(phase, code)| phase == "void" && code == "hold_release"),
                    (422, _) => body["code"] == "insufficient_funds" && body["available"].is_i64(),
                    (409, _) => body["code"] == "hold_not_active",
                    _ => false,
                };
            if !ok {
                eprintln!("breach: balance answers {answers:?}, stored {stored:?}");
            }
            breaches += u64::from(!ok);
        }
    }
    Ok((
        "every balance answer matches what is stored (a refused debit's key replays its 422)",
        checked,
        breaches,
    ))
}

/// The balances' rows of the invariant table.
pub async fn check(
    db: &PgPool,
    intents: &[Intent],
    ledger_check: &LedgerCheck,
) -> Result<Vec<Check>, String> {
    Ok(vec![
        never_negative(db).await,
        (
            "the ledger sums to zero, every account equals its transfers (oncepay ledger check)",
            ledger_check.lines,
            ledger_check.breaches,
        ),
        one_transfer_per_key(db, intents).await?,
        hold_resolved_once(db, intents).await,
        no_expired_hold_captured(db).await,
        no_hold_left_past_expiry(db).await,
        balance_payments_moved_once(db).await?,
        answers_match(db, intents).await?,
    ])
}

/// What the balance intents did, and the ledger's transfers by code, for
/// the fault table.
pub async fn table(db: &PgPool, intents: &[Intent]) -> String {
    let mut moves: std::collections::BTreeMap<&str, u64> = Default::default();
    for intent in intents {
        for m in &intent.balance_moves {
            *moves.entry(m).or_insert(0) += 1;
        }
    }
    let mut out = "\n| balance command sent (or transfer made) | count |\n|---|---:|\n".to_string();
    for (m, n) in moves {
        out += &format!("| sent: {m} | {n} |\n");
    }
    let refused: u64 = intents
        .iter()
        .flat_map(|i| &i.balance_answers)
        .filter(|(_, status, _)| *status == 422)
        .count() as u64;
    out += &format!("| answered 422 insufficient_funds (repeats included) | {refused} |\n");
    let rows =
        sqlx::query("SELECT code, count(*) FROM ledger_transfer WHERE ledger = 'balance' GROUP BY code ORDER BY code")
            .fetch_all(db)
            .await
            .unwrap_or_default();
    for r in rows {
        let code: String = r.try_get(0).unwrap_or_default();
        let n: i64 = r.try_get(1).unwrap_or(-1);
        out += &format!("| transfers: {code} | {n} |\n");
    }
    out
}
