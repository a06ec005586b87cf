//! Provider events arriving by webhook, after their signature was verified:
//! deduplicated by `(provider, event id)` with the payload kept, and applied
//! through the same forward-only settlement as everything else. The dedup
//! row and the effect commit in one transaction.

use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use crate::commands::settle::{self, Cause};
use crate::commands::AppContext;
use crate::domain::payment::Transition;
use crate::idempotency::store_problem;
use crate::problem::Problem;
use crate::provider::ProviderObject;
use crate::store::{self, StoreError};

#[derive(Deserialize)]
struct Envelope {
    #[serde(rename = "type")]
    event_type: String,
    data: Data,
}

#[derive(Deserialize)]
struct Data {
    object: Value,
}

/// What an event does to a charge or refund: the object's state and our key.
#[derive(Deserialize)]
struct Object {
    #[serde(flatten)]
    state: ProviderObject,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// Applies one verified event; returns its outcome label
/// (`processed`, `duplicate`, `ignored`, `unknown_charge`).
pub async fn apply(
    ctx: &AppContext,
    provider: &str,
    header_id: Option<&str>,
    body: &[u8],
) -> Result<&'static str, Problem> {
    let payload: Value = serde_json::from_slice(body)
        .map_err(|_| Problem::new(400, "malformed_json", "the event is not JSON"))?;
    // A signed event of a shape we do not know is still kept and answered
    // 200 (never lost): it is recorded as ignored, for a person to look at.
    let envelope: Envelope = serde_json::from_value(payload.clone()).unwrap_or(Envelope {
        event_type: "unrecognised".into(),
        data: Data {
            object: Value::Null,
        },
    });
    let event_id = payload
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| header_id.map(str::to_string))
        .ok_or_else(|| Problem::invalid_field("id", "is required"))?;
    apply_parsed(ctx, provider, &event_id, &envelope, &payload)
        .await
        .map_err(store_problem)
}

async fn apply_parsed(
    ctx: &AppContext,
    provider: &str,
    event_id: &str,
    envelope: &Envelope,
    payload: &Value,
) -> Result<&'static str, StoreError> {
    let mut tx = ctx.pool.begin().await?;
    if !store::webhooks::record(&mut tx, provider, event_id, &envelope.event_type, payload).await? {
        tx.commit().await?;
        return Ok("duplicate");
    }
    let kind = envelope.event_type.split('.').next().unwrap_or_default();
    let object: Option<Object> = serde_json::from_value(envelope.data.object.clone()).ok();
    let outcome = match (kind, object) {
        ("charge", Some(object)) => {
            let key = object
                .idempotency_key
                .as_deref()
                .and_then(|k| Uuid::parse_str(k).ok());
            match store::payments::find_by_charge(&mut tx, provider, &object.state.id, key).await? {
                None => "unknown_charge",
                Some(attempt) => {
                    let (_, t) = settle::payment(
                        &mut tx,
                        &ctx.metrics,
                        (attempt.id, attempt.order_id),
                        &object.state,
                        Cause::Webhook,
                    )
                    .await?;
                    label(t)
                }
            }
        }
        ("refund", Some(object)) => {
            let key = object
                .idempotency_key
                .as_deref()
                .and_then(|k| Uuid::parse_str(k).ok());
            match store::refunds::find_by_provider_id(&mut tx, &object.state.id, key).await? {
                None => "unknown_charge",
                Some(refund) => {
                    let (_, t) = settle::refund(
                        &mut tx,
                        &ctx.metrics,
                        refund.id,
                        &object.state,
                        Cause::Webhook,
                    )
                    .await?;
                    label(t)
                }
            }
        }
        _ => "ignored",
    };
    store::webhooks::set_outcome(&mut tx, provider, event_id, outcome).await?;
    tx.commit().await?;
    if outcome == "unknown_charge" {
        tracing::warn!(event_type = %envelope.event_type, "webhook for an unknown charge stored");
    }
    Ok(outcome)
}

fn label(t: Transition) -> &'static str {
    match t {
        Transition::Advance(_) | Transition::Unchanged => "processed",
        Transition::Ignored => "ignored",
    }
}
