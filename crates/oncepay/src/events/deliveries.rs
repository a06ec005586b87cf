//! The delivery worker of every `oncepay serve` process: sends outbox
//! events to merchants' endpoints, signed with the Standard Webhooks
//! scheme (`webhook-id` is the event id on every attempt, so receivers
//! deduplicate), and retries failures on the configured schedule.
//!
//! Deliveries are claimed in the database (`SKIP LOCKED`, a lease), so N
//! processes share the work, and a delivery whose process was killed is
//! due again when its lease ends: at least once, never lost. A receiver may
//! see an event twice (a retry after a lost answer, or a takeover), always
//! with the same id.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use tokio::task::JoinSet;

use crate::commands::AppContext;
use crate::domain::event::{RetrySchedule, Verdict};
use crate::events::outbound;
use crate::standard_webhooks::WebhookSecret;
use crate::store::deliveries::{AttemptResult, Claimed, Next};
use crate::store::{self, StoreError};

/// Deliveries claimed (and sent concurrently) per round.
pub(crate) const BATCH: i64 = 32;

/// What the worker needs.
pub struct Deliverer {
    client: outbound::Client,
    schedule: RetrySchedule,
    lease: Duration,
}

impl Deliverer {
    /// A worker with its HTTP client; a claim lasts the request `timeout`
    /// plus a margin, so a live process's attempt ends before another may
    /// take its delivery over.
    pub fn new(
        schedule: RetrySchedule,
        timeout: Duration,
        allow_private: bool,
    ) -> Result<Deliverer, reqwest::Error> {
        Ok(Deliverer {
            client: outbound::Client::new(timeout, allow_private)?,
            schedule,
            lease: timeout * 2 + Duration::from_secs(5),
        })
    }
}

/// Claims and sends due deliveries, round after round while rounds are
/// full; returns how many were attempted.
pub async fn pass(ctx: &Arc<AppContext>, deliverer: &Arc<Deliverer>) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        let claimed = store::deliveries::claim(&ctx.pool, BATCH, deliverer.lease).await?;
        let round = claimed.len();
        let mut sending = JoinSet::new();
        for delivery in claimed {
            let (ctx, deliverer) = (ctx.clone(), deliverer.clone());
            sending.spawn(async move { attempt(&ctx, &deliverer, delivery).await });
        }
        while sending.join_next().await.is_some() {}
        total += round;
        if round < BATCH as usize {
            return Ok(total);
        }
    }
}

/// One attempt of one delivery, recorded whatever happens.
async fn attempt(ctx: &AppContext, deliverer: &Deliverer, claimed: Claimed) {
    let body = match serde_json::to_vec(&claimed.event.delivered()) {
        Ok(body) => body,
        Err(e) => {
            tracing::error!(event_id = %claimed.event.id, error = %e, "event not serialisable; left for the lease to expire");
            return;
        }
    };
    let id = claimed.event.id.to_string();
    let timestamp = Utc::now().timestamp();
    let signature = WebhookSecret::from_key(claimed.secret_key.clone()).sign(&id, timestamp, &body);
    let started = Instant::now();
    let sent = deliverer
        .client
        .post(
            &claimed.url,
            [
                ("webhook-id", id),
                ("webhook-timestamp", timestamp.to_string()),
                ("webhook-signature", signature),
            ],
            body,
        )
        .await;
    let latency = started.elapsed();
    let failed = u32::try_from(claimed.attempts).unwrap_or(0) + 1;
    let (next, outcome) = match Verdict::of(sent.status) {
        Verdict::Delivered => (Next::Delivered, "delivered"),
        Verdict::Gone => (Next::GiveUp, "gone"),
        Verdict::Retry => match deliverer.schedule.next_wait(failed, fastrand::f64()) {
            Some(wait) if sent.refused => (Next::RetryAfter(wait), "refused_address"),
            Some(wait) => (Next::RetryAfter(wait), "retrying"),
            None => (Next::GiveUp, "gave_up"),
        },
    };
    let result = AttemptResult {
        status: sent.status,
        latency,
        error: sent.error.as_deref(),
    };
    match store::deliveries::record(&ctx.pool, &claimed, &result, next).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(event_id = %claimed.event.id, endpoint_id = %claimed.endpoint_id, "delivery taken over by another process while this attempt ran")
        }
        Err(e) => {
            tracing::warn!(event_id = %claimed.event.id, error = %e, "could not record a delivery attempt; it is due again when its lease ends")
        }
    }
    ctx.metrics.deliveries.with_label_values(&[outcome]).inc();
    match outcome {
        "delivered" => {
            tracing::debug!(event_id = %claimed.event.id, endpoint_id = %claimed.endpoint_id, "event delivered")
        }
        "gone" => {
            tracing::warn!(endpoint_id = %claimed.endpoint_id, "receiver answered 410 Gone; endpoint disabled");
            if let Err(e) = store::webhook_endpoints::disable(
                &ctx.pool,
                claimed.endpoint_id,
                "the receiver answered 410 Gone",
            )
            .await
            {
                tracing::warn!(endpoint_id = %claimed.endpoint_id, error = %e, "could not disable an endpoint that answered 410");
            }
        }
        "gave_up" => tracing::error!(
            event_id = %claimed.event.id,
            endpoint_id = %claimed.endpoint_id,
            attempts = failed,
            "delivery given up after the last scheduled attempt; POST /events/{{id}}/redeliver sends it again"
        ),
        _ => tracing::info!(
            event_id = %claimed.event.id,
            endpoint_id = %claimed.endpoint_id,
            status = sent.status,
            error = sent.error.as_deref().unwrap_or_default(),
            attempt = failed,
            "delivery attempt failed; retrying on the schedule"
        ),
    }
}

/// Updates the oldest-undelivered gauge.
pub async fn measure(ctx: &AppContext) -> Result<(), StoreError> {
    let age = store::deliveries::oldest_pending_age(&ctx.pool).await?;
    ctx.metrics.oldest_undelivered.set(age);
    Ok(())
}
