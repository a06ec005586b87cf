//! The outbox's invariants, checked by counting after the soak: every
//! state change wrote exactly one event (derived independently, from where
//! each object ended up), every event reached the merchant's receiver,
//! signed, in its object's sequence.

use std::collections::{BTreeMap, HashMap, HashSet};

use oncepay::standard_webhooks::WebhookSecret;
use oncepay_testkit::receiver::Received;
use serde_json::Value;
use sqlx::{PgPool, Row};

/// One invariant's name, how many things it checked and how many broke it.
pub type Check = (&'static str, u64, u64);

/// A count for an invariant; unreadable is a breach (`u64::MAX`), never a
/// zero.
pub async fn count(db: &PgPool, sql: &'static str) -> u64 {
    sqlx::query_scalar::<_, i64>(sql)
        .fetch_one(db)
        .await
        .map_or(u64::MAX, |n| n.max(0) as u64)
}

/// An object's events as stored: `(sequence, type)` in sequence order.
type Trail = Vec<(i32, String)>;

/// The events an object must have, given where it ended up.
pub enum Expected {
    /// Exactly these types, in this order.
    Exact(Vec<String>),
    /// A walk whose number of steps depends on the provider's timing (an
    /// order whose refund failed after it succeeded, a dispute): it starts
    /// with `first`, ends with `last` when given, every step is one of
    /// `steps` (or `first` or `last`), and no type follows itself.
    Walk {
        first: String,
        steps: Vec<String>,
        last: Option<String>,
    },
    /// An order that reserved stock: `order.stock_reserved` first, then
    /// `base` among its other events, `order.stock_released` a number of
    /// times in `released`, and `order.stock_shortfall` once if `short`.
    WithStock {
        base: Box<Expected>,
        reserved: bool,
        released: std::ops::RangeInclusive<usize>,
        short: bool,
    },
}

/// The events of an order's stock.
const STOCK_EVENTS: [&str; 3] = [
    "order.stock_reserved",
    "order.stock_released",
    "order.stock_shortfall",
];

impl Expected {
    fn holds(&self, got: &[&String]) -> bool {
        match self {
            Expected::Exact(types) => got == types.iter().collect::<Vec<_>>(),
            Expected::Walk { first, steps, last } => {
                let allowed =
                    |t: &String| t == first || steps.contains(t) || last.as_ref() == Some(t);
                got.first() == Some(&first)
                    && last.as_ref().is_none_or(|l| got.last() == Some(&l))
                    && got.iter().all(|t| allowed(t))
                    && got.windows(2).all(|w| w[0] != w[1])
            }
            Expected::WithStock {
                base,
                reserved,
                released,
                short,
            } => {
                let count = |name: &str| got.iter().filter(|t| t.as_str() == name).count();
                let others: Vec<&String> = got
                    .iter()
                    .copied()
                    .filter(|t| !STOCK_EVENTS.contains(&t.as_str()))
                    .collect();
                (!*reserved || got.first().map(|t| t.as_str()) == Some("order.stock_reserved"))
                    && count("order.stock_reserved") == usize::from(*reserved)
                    && released.contains(&count("order.stock_released"))
                    && count("order.stock_shortfall") == usize::from(*short)
                    && base.holds(&others)
            }
        }
    }

    /// How many changes it stands for (a walk: as many as were made).
    fn changes(&self, trail: usize) -> usize {
        match self {
            Expected::Exact(types) => types.len(),
            Expected::Walk { .. } | Expected::WithStock { .. } => trail.max(1),
        }
    }
}

/// The event types each object must have, in order, given where it ended
/// up: the state changes it went through.
async fn expected(db: &PgPool) -> Result<HashMap<String, Expected>, String> {
    let q = |sql: &'static str| async move {
        sqlx::query(sql)
            .fetch_all(db)
            .await
            .map_err(|e| e.to_string())
    };
    let get = |r: &sqlx::postgres::PgRow, i: usize| -> Result<String, String> {
        r.try_get::<String, _>(i).map_err(|e| e.to_string())
    };
    let mut out = HashMap::new();
    for r in q(concat!(
        "SELECT p.id::text, p.status, (p.action_required_at IS NOT NULL)::text, ",
        was_authorized!("p"),
        "::text, (p.capture_reminded_at IS NOT NULL)::text FROM payment_attempt p"
    ))
    .await?
    {
        let status = get(&r, 1)?;
        let mut types = vec!["payment.pending".to_string()];
        // It waited for its customer at the bank (3-D Secure).
        if get(&r, 2)? == "true" {
            types.push("payment.requires_action".to_string());
        }
        // A manual payment was authorized (`was_authorized!`), and maybe
        // reminded of its deadline, before it was captured or voided.
        if get(&r, 3)? == "true" {
            types.push("payment.requires_capture".to_string());
            if get(&r, 4)? == "true" {
                types.push("payment.capture_deadline_approaching".to_string());
            }
        }
        if status != "pending" && status != "requires_capture" {
            types.push(format!("payment.{status}"));
        }
        out.insert(get(&r, 0)?, Expected::Exact(types));
    }
    // A refund that failed after it succeeded (its incident says so) told
    // the merchant both.
    for r in q("SELECT id::text, status,
                       EXISTS (SELECT 1 FROM incident i WHERE i.refund_id = refund.id
                                  AND i.kind = 'refund_failed_after_success')::text
                  FROM refund")
    .await?
    {
        let status = get(&r, 1)?;
        let types = match (status.as_str(), get(&r, 2)? == "true") {
            ("pending", _) => vec![],
            ("failed", true) => vec!["refund.succeeded".to_string(), "refund.failed".to_string()],
            _ => vec![format!("refund.{status}")],
        };
        out.insert(get(&r, 0)?, Expected::Exact(types));
    }
    // An order was paid if one of its attempts succeeded; a paid order
    // was cancelled or refunded after that. One whose refund failed after
    // it succeeded may have gone back to paid, and on (refunded again).
    // An order paid by a manual payment was authorized first.
    for r in q(concat!(
        "SELECT o.id::text, o.status,
                       EXISTS (SELECT 1 FROM payment_attempt p
                                WHERE p.order_id = o.id AND p.status = 'succeeded')::text,
                       EXISTS (SELECT 1 FROM incident i JOIN payment_attempt p ON p.id = i.payment_id
                                WHERE p.order_id = o.id
                                  AND i.kind = 'refund_failed_after_success')::text,
                       EXISTS (SELECT 1 FROM payment_attempt p
                                WHERE p.order_id = o.id AND ",
        was_authorized!("p"),
        ")::text
                  FROM orders o"
    ))
    .await?
    {
        let (status, paid) = (get(&r, 1)?, get(&r, 2)? == "true");
        let authorized = get(&r, 4)? == "true";
        if get(&r, 3)? == "true" {
            out.insert(
                get(&r, 0)?,
                Expected::Walk {
                    first: if authorized {
                        "order.authorized".into()
                    } else {
                        "order.paid".into()
                    },
                    steps: vec![
                        "order.paid".into(),
                        "order.refunded".into(),
                        "order.cancelled".into(),
                    ],
                    last: Some(format!("order.{status}")),
                },
            );
            continue;
        }
        let mut types = Vec::new();
        if authorized {
            types.push("order.authorized".to_string());
        }
        if paid {
            types.push("order.paid".to_string());
        }
        if status == "cancelled" || status == "refunded" {
            types.push(format!("order.{status}"));
        }
        out.insert(get(&r, 0)?, Expected::Exact(types));
    }
    // A balance transaction (credit, debit, payment, refund) told the
    // merchant once; a hold was created, then captured, released or
    // expired (its resolution is a transfer of its own, told as the
    // hold's event).
    for r in q("SELECT t.id::text, t.phase,
                       (t.holder_account_id = t.credit_account_id)::text,
                       COALESCE((SELECT CASE r.phase WHEN 'post' THEN 'captured'
                                     ELSE CASE r.code WHEN 'hold_expiry' THEN 'expired' ELSE 'released' END END
                                   FROM ledger_transfer r WHERE r.pending_id = t.id), '')
                  FROM ledger_transfer t
                 WHERE t.ledger = 'balance' AND t.phase IN ('single', 'pending')")
    .await?
    {
        let types = match get(&r, 1)?.as_str() {
            "single" if get(&r, 2)? == "true" => vec!["balance.credited".to_string()],
            "single" => vec!["balance.debited".to_string()],
            _ => {
                let mut types = vec!["balance_hold.created".to_string()];
                let resolution = get(&r, 3)?;
                if !resolution.is_empty() {
                    types.push(format!("balance_hold.{resolution}"));
                }
                types
            }
        };
        out.insert(get(&r, 0)?, Expected::Exact(types));
    }
    // Stock counted in or out told the merchant once (`inventory.adjusted`,
    // the adjustment's object); reservations, conversions and late sales
    // are told as their order's events.
    for r in q("SELECT id::text FROM ledger_transfer
                 WHERE ledger = 'stock' AND code IN ('adjustment_in', 'adjustment_out')")
    .await?
    {
        out.insert(
            get(&r, 0)?,
            Expected::Exact(vec!["inventory.adjusted".to_string()]),
        );
    }
    // An order that reserved stock told it first, then its own changes in
    // their order, with a release for each batch of its reservations
    // voided (a cancel, a void or expiry of its authorization, an expiry:
    // each SKU's may be voided by another writer; a renewal, which
    // reserves the same units again at once, is no release) and a
    // shortfall if it was paid short, reserving or not.
    for r in q("SELECT o.id::text,
                       (SELECT count(*) FROM ledger_transfer p JOIN ledger_transfer v ON v.pending_id = p.id
                         WHERE p.order_id = o.id AND p.ledger = 'stock' AND v.phase = 'void'
                           AND v.code <> 'renewal')::text,
                       (o.stock_shortfall <> '[]'::jsonb)::text,
                       (o.stock_reserved_until IS NOT NULL)::text
                  FROM orders o
                 WHERE o.stock_reserved_until IS NOT NULL OR o.stock_shortfall <> '[]'::jsonb")
    .await?
    {
        let id = get(&r, 0)?;
        let voided: usize = get(&r, 1)?.parse().unwrap_or(usize::MAX);
        let reserved = get(&r, 3)? == "true";
        let base = match out.remove(&id) {
            Some(Expected::Exact(types)) => Expected::Exact(types),
            Some(walk) => walk,
            None => Expected::Exact(Vec::new()),
        };
        out.insert(
            id,
            Expected::WithStock {
                base: Box::new(base),
                reserved,
                released: voided.min(1)..=voided,
                short: get(&r, 2)? == "true",
            },
        );
    }
    // A dispute opened, may have been updated (under review), and closed
    // once won or lost.
    for r in q("SELECT id::text, status FROM dispute").await? {
        let closed = matches!(get(&r, 1)?.as_str(), "won" | "lost");
        out.insert(
            get(&r, 0)?,
            Expected::Walk {
                first: "dispute.created".into(),
                steps: vec!["dispute.updated".into()],
                last: closed.then(|| "dispute.closed".into()),
            },
        );
    }
    Ok(out)
}

async fn stored(db: &PgPool) -> Result<(HashMap<String, Trail>, HashSet<String>), String> {
    let rows = sqlx::query(
        "SELECT object_id::text, sequence, type, id::text FROM event ORDER BY object_id, sequence",
    )
    .fetch_all(db)
    .await
    .map_err(|e| e.to_string())?;
    let mut trails: HashMap<String, Trail> = HashMap::new();
    let mut ids = HashSet::new();
    for r in rows {
        let object: String = r.try_get(0).map_err(|e| e.to_string())?;
        let sequence: i32 = r.try_get(1).map_err(|e| e.to_string())?;
        let kind: String = r.try_get(2).map_err(|e| e.to_string())?;
        ids.insert(r.try_get::<String, _>(3).map_err(|e| e.to_string())?);
        trails.entry(object).or_default().push((sequence, kind));
    }
    Ok((trails, ids))
}

/// Every state change has exactly one event, in sequence 1, 2, 3...
fn one_event_per_change(
    expected: &HashMap<String, Expected>,
    trails: &HashMap<String, Trail>,
) -> Check {
    let mut changes = 0;
    let mut breaches = 0;
    for (object, types) in expected {
        let trail = trails.get(object).cloned().unwrap_or_default();
        changes += types.changes(trail.len());
        let in_sequence = trail
            .iter()
            .enumerate()
            .all(|(i, (seq, _))| usize::try_from(*seq).ok() == Some(i + 1));
        let got: Vec<&String> = trail.iter().map(|(_, t)| t).collect();
        if !in_sequence || !types.holds(&got) {
            breaches += 1;
        }
    }
    // Events of objects that do not exist are breaches too.
    breaches += trails.keys().filter(|o| !expected.contains_key(*o)).count();
    (
        "every state change has exactly one event (in sequence)",
        changes as u64,
        breaches as u64,
    )
}

/// Every event was accepted by the receiver at least once, and it got
/// nothing that is not an event.
fn every_event_delivered(ids: &HashSet<String>, received: &[Received]) -> Check {
    let accepted: HashSet<&str> = received
        .iter()
        .filter(|r| (200..300).contains(&r.answered))
        .map(|r| r.id.as_str())
        .collect();
    let missing = ids
        .iter()
        .filter(|id| !accepted.contains(id.as_str()))
        .count();
    let phantom = received.iter().filter(|r| !ids.contains(&r.id)).count();
    (
        "every event reached the merchant's receiver (and nothing else did)",
        ids.len() as u64,
        (missing + phantom) as u64,
    )
}

/// Every delivery is signed with the endpoint's secret, and every copy of
/// an event carries the same body.
fn signed_and_identical(secret: &WebhookSecret, received: &[Received]) -> Check {
    let mut first: HashMap<&str, &[u8]> = HashMap::new();
    let mut breaches = 0;
    for r in received {
        let now = r.timestamp.parse().unwrap_or(0);
        let valid = secret
            .verify(
                Some(&r.id),
                Some(&r.timestamp),
                Some(&r.signature),
                &r.body,
                now,
            )
            .is_ok();
        let same = *first.entry(r.id.as_str()).or_insert(&r.body) == &r.body[..];
        if !valid || !same {
            breaches += 1;
        }
    }
    (
        "every delivery signed, every copy of an event identical",
        received.len() as u64,
        breaches,
    )
}

/// Per object, the receiver first accepted its events in sequence order.
fn delivered_in_sequence(received: &[Received]) -> Check {
    let mut next: BTreeMap<String, i64> = BTreeMap::new();
    let mut seen: HashSet<&str> = HashSet::new();
    let (mut checked, mut breaches) = (0u64, 0u64);
    for r in received.iter().filter(|r| (200..300).contains(&r.answered)) {
        if !seen.insert(r.id.as_str()) {
            continue;
        }
        checked += 1;
        let Ok(body) = serde_json::from_slice::<Value>(&r.body) else {
            breaches += 1;
            continue;
        };
        // An adjustment's event carries the item, its object the
        // adjustment within it.
        let object = body["data"]["object"]["id"]
            .as_str()
            .or_else(|| body["data"]["object"]["adjustment"]["id"].as_str())
            .unwrap_or_default()
            .to_string();
        let sequence = body["sequence"].as_i64().unwrap_or(-1);
        let expected = next.entry(object).or_insert(1);
        if sequence != *expected {
            breaches += 1;
        }
        *expected = sequence + 1;
    }
    (
        "no event reached the receiver out of its object's sequence",
        checked,
        breaches,
    )
}

/// What the merchant's receiver got, and the secret it verifies with.
pub struct Receipts {
    /// Every delivery, in arrival order.
    pub received: Vec<Received>,
    /// The endpoint's signing secret.
    pub secret: WebhookSecret,
}

/// The outbox's rows of the invariant table.
pub async fn check(db: &PgPool, receipts: &Receipts) -> Result<Vec<Check>, String> {
    let (received, secret) = (&receipts.received[..], &receipts.secret);
    let expected = expected(db).await?;
    let (trails, ids) = stored(db).await?;
    Ok(vec![
        one_event_per_change(&expected, &trails),
        every_event_delivered(&ids, received),
        signed_and_identical(secret, received),
        delivered_in_sequence(received),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trail(types: &[&str]) -> Vec<String> {
        types.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn a_dispute_walks_from_created_to_closed_once_closed() {
        let closed = Expected::Walk {
            first: "dispute.created".into(),
            steps: vec!["dispute.updated".into()],
            last: Some("dispute.closed".into()),
        };
        let holds = |types: &[&str]| closed.holds(&trail(types).iter().collect::<Vec<_>>());
        assert!(holds(&["dispute.created", "dispute.closed"]));
        assert!(holds(&[
            "dispute.created",
            "dispute.updated",
            "dispute.closed"
        ]));
        assert!(!holds(&["dispute.created"]), "closed, but no event said so");
        assert!(!holds(&[
            "dispute.created",
            "dispute.closed",
            "dispute.closed"
        ]));
        assert!(!holds(&["dispute.updated", "dispute.closed"]));
    }

    #[test]
    fn an_order_whose_refund_failed_later_may_go_back_to_paid() {
        let paid = Expected::Walk {
            first: "order.paid".into(),
            steps: vec!["order.refunded".into(), "order.cancelled".into()],
            last: Some("order.paid".into()),
        };
        let holds = |types: &[&str]| paid.holds(&trail(types).iter().collect::<Vec<_>>());
        assert!(holds(&["order.paid"]), "a partial refund reversed");
        assert!(holds(&["order.paid", "order.refunded", "order.paid"]));
        assert!(holds(&["order.paid", "order.cancelled", "order.paid"]));
        assert!(!holds(&["order.paid", "order.refunded"]));
        assert!(
            !holds(&["order.paid", "order.paid"]),
            "one change, one event"
        );
    }
}
