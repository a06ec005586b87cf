//! Prometheus metrics (contract section 8). One registry per process,
//! passed explicitly so that two servers in one test binary never mix counts.

use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry,
    TextEncoder,
};

/// Every metric oncepay exports.
pub struct Metrics {
    registry: Registry,
    /// HTTP requests by route pattern, method and status.
    pub http_requests: IntCounterVec,
    /// HTTP latency by route pattern and method.
    pub http_latency: HistogramVec,
    /// Idempotency outcomes: executed, replayed, key_reused, in_flight, resumed, released.
    pub idempotency: IntCounterVec,
    /// Payment transitions by target status and by what caused them.
    pub payment_transitions: IntCounterVec,
    /// Refund transitions by target status and by what caused them.
    pub refund_transitions: IntCounterVec,
    /// Webhook outcomes: processed, duplicate, bad_signature, ignored, unknown_charge.
    pub webhooks: IntCounterVec,
    /// Provider calls by operation and outcome.
    pub provider_calls: IntCounterVec,
    /// Provider call latency by operation.
    pub provider_latency: HistogramVec,
    /// Reconciler work by kind (payment, refund, command) and outcome.
    pub reconciler: IntCounterVec,
    /// Expired idempotency records deleted by the sweeper.
    pub swept: IntCounter,
    /// Money the provider moved that our books did not expect, by kind.
    pub incidents: IntCounterVec,
    /// Payments and refunds that stayed pending past the alarm threshold, by kind.
    pub pending_alarms: IntCounterVec,
    /// Age in seconds of the oldest pending payment or refund, by kind
    /// (0 when none is pending), as of the last reconciler pass.
    pub oldest_pending: GaugeVec,
    /// Provider reads made to confirm an inbound event, by result
    /// (confirmed, unconfirmed, mismatch).
    pub webhook_confirmations: IntCounterVec,
    /// Events written to the outbox, by type.
    pub events_written: IntCounterVec,
    /// Attempts to deliver an event to a merchant's endpoint, by outcome
    /// (delivered, retrying, gave_up, gone, refused_address).
    pub deliveries: IntCounterVec,
    /// Age in seconds of the oldest event not yet delivered to an endpoint
    /// that still wants it (0 when none), as of the delivery worker's last look.
    pub oldest_undelivered: prometheus::Gauge,
    /// Requests refused by a merchant's rate limit.
    pub rate_limited: IntCounter,
    /// Provider answers refusing our credentials (`401`, `403`), by
    /// provider and operation: a credential outage, never a decline.
    pub provider_auth_refused: IntCounterVec,
    /// Requests being handled now.
    pub in_flight: prometheus::IntGauge,
    /// Database pool connections by pool and state (`idle`, `in_use`), as
    /// of the last scrape.
    pub pool_connections: prometheus::IntGaugeVec,
    /// Each pool's largest size.
    pub pool_max: prometheus::IntGaugeVec,
    /// How long the last scrape waited to acquire a connection of each
    /// pool: what a request would wait right now (a saturated pool shows
    /// here before requests time out).
    pub pool_acquire: GaugeVec,
    /// When the reconciler last finished a pass (Unix seconds; 0: never).
    pub reconciler_last_pass: prometheus::Gauge,
    /// Rows deleted past `ONCEPAY_EVENT_RETENTION`, by table.
    pub retention_deleted: IntCounterVec,
    /// Provider objects the books reconciliation looked at, by outcome.
    pub books_objects: IntCounterVec,
    /// When this process last finished a books run (Unix seconds; 0: never).
    pub books_last_run: prometheus::Gauge,
    /// New orders per statement (`store::order_batch`): how much natural
    /// batching shares a commit.
    pub order_batch_rows: prometheus::Histogram,
    /// New orders waiting for a batch writer now.
    pub orders_queued: prometheus::IntGauge,
    /// Writes per transaction of a payment's group commit
    /// (`store::group_commit`): how many shared one commit.
    pub group_commit_statements: prometheus::Histogram,
    /// Writes per statement of the group commit: how many requests' writes
    /// of one kind shared one multi-row statement.
    pub group_commit_rows: prometheus::Histogram,
    /// Statements waiting for a group-commit writer.
    pub group_commit_queued: prometheus::IntGauge,
    /// Disputes reaching a status, by provider and status (counted once
    /// per dispute and status, when oncepay applies it).
    pub disputes: IntCounterVec,
    /// Disputes waiting for the merchant's evidence (`needs_response`)
    /// whose deadline is within 72 hours or past, read at each scrape.
    pub disputes_evidence_due_soon: prometheus::IntGauge,
    /// Disputes read from a provider in a status its adapter does not
    /// know (stored with its provider status, held open), by provider:
    /// counted at each read, for the alert that has the status mapped.
    pub dispute_statuses_unrecognised: IntCounterVec,
    /// A group-commit statement's time from its queueing until a writer
    /// took it (`until="taken"`) and until it was answered, its group
    /// committed (`until="answered"`): how much of a payment's latency is
    /// waiting for a writer rather than the database's work.
    pub group_commit_seconds: HistogramVec,
    /// A command's last write after its stored answer (a reserving
    /// order's reservation), from its start to its commit's end, by
    /// command: the wait for the lock that write takes and its hold. On
    /// one SKU, the rest of an order's transaction never waits for
    /// another order.
    pub last_write_hold_seconds: HistogramVec,
}

/// The label values each labelled counter is known to take, exported at 0
/// from the first scrape: an alert on an increase then reads 0, not "no
/// data", until something happens (and "no data" means a broken exporter).
const KNOWN_LABELS: &[(&str, &[&[&str]])] = &[
    (
        "incidents",
        &[&[
            "charge_on_failed_attempt",
            "refund_on_failed_refund",
            "orphan_charge",
            "books_mismatch",
            "missing_at_provider",
            "refund_failed_after_success",
        ]],
    ),
    (
        "books_objects",
        &[&[
            "matched",
            "adopted",
            "refunded",
            "held",
            "mismatched",
            "missing",
            "reversed",
            "disputes",
        ]],
    ),
    ("pending_alarms", &[&["payment", "refund"]]),
    (
        "deliveries",
        &[&[
            "delivered",
            "retrying",
            "gave_up",
            "gone",
            "refused_address",
        ]],
    ),
    (
        "webhook_confirmations",
        &[&["confirmed", "unconfirmed", "mismatch", "deferred"]],
    ),
    (
        "webhooks",
        &[&[
            "processed",
            "duplicate",
            "ignored",
            "unknown_charge",
            "unconfirmed",
            "mismatch",
            "rejected",
            "bad_signature",
        ]],
    ),
    (
        "idempotency",
        &[&[
            "executed",
            "replayed",
            "key_reused",
            "in_flight",
            "resumed",
            "released",
        ]],
    ),
    (
        "transitions",
        &[
            &[
                "pending",
                "succeeded",
                "failed",
                "requires_capture",
                "voided",
            ],
            &["command", "webhook", "reconciler"],
        ],
    ),
    (
        "provider_calls",
        &[
            &[
                "open_charge",
                "charge",
                "find_charge",
                "refund",
                "find_refund",
                "probe",
                "abandon",
                "list_books",
                "list_disputes",
                "find_dispute",
                "capture",
                "find_capture",
                "void",
            ],
            &[
                "succeeded",
                "pending",
                "requires_capture",
                "voided",
                "failed",
                "not_found",
                "unknown",
                "our_bug",
            ],
        ],
    ),
    (
        "retention_deleted",
        &[&["event", "webhook_delivery", "webhook_attempt"]],
    ),
    (
        "reconciler",
        &[
            &[
                "command", "payment", "refund", "decline", "recovery", "capture", "hold",
            ],
            &[
                "resumed",
                "freed",
                "settled",
                "still_pending",
                "confirmed",
                "unconfirmed",
                "rechecked",
                "error",
            ],
        ],
    ),
];

/// Every combination of the label value lists.
fn combinations(lists: &[&[&str]]) -> Vec<Vec<String>> {
    lists.iter().fold(vec![Vec::new()], |acc, values| {
        acc.iter()
            .flat_map(|prefix| {
                values.iter().map(move |v| {
                    let mut next = prefix.clone();
                    next.push((*v).to_string());
                    next
                })
            })
            .collect()
    })
}

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
            // Names are unique constants: registration cannot collide.
            let _ = registry.register(Box::new(c.clone()));
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
                labels,
            )
            .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
            let _ = registry.register(Box::new(h.clone()));
            h
        };
        let swept = IntCounter::new(
            "oncepay_sweeper_deleted_total",
            "Expired idempotency records deleted by the sweeper",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(swept.clone()));
        let rate_limited = IntCounter::new(
            "oncepay_rate_limited_total",
            "Requests answered 429 by a merchant's rate limit",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(rate_limited.clone()));
        let float_gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = GaugeVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        let oldest_pending = float_gauge_vec(
            "oncepay_oldest_pending_seconds",
            "Age of the oldest pending payment or refund, by kind",
            &["kind"],
        );
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = prometheus::IntGaugeVec::new(Opts::new(name, help), labels)
                .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        let gauge = |name: &str, help: &str| {
            let g = prometheus::Gauge::new(name, help)
                .unwrap_or_else(|e| panic!("metric {name} is malformed: {e}"));
            let _ = registry.register(Box::new(g.clone()));
            g
        };
        let disputes_evidence_due_soon = prometheus::IntGauge::new(
            "oncepay_disputes_evidence_due_soon",
            "Disputes needing the merchant's evidence within 72 hours (or past due), read at each scrape",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(disputes_evidence_due_soon.clone()));
        let in_flight = prometheus::IntGauge::new(
            "oncepay_http_requests_in_flight",
            "HTTP requests being handled now",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(in_flight.clone()));
        let build_info = prometheus::IntGaugeVec::new(
            Opts::new(
                "oncepay_build_info",
                "The running build: version and commit",
            ),
            &["version", "commit"],
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        build_info
            .with_label_values(&[
                env!("CARGO_PKG_VERSION"),
                option_env!("ONCEPAY_GIT_COMMIT").unwrap_or("unknown"),
            ])
            .set(1);
        let _ = registry.register(Box::new(build_info));
        let oldest_undelivered = prometheus::Gauge::new(
            "oncepay_webhook_oldest_undelivered_seconds",
            "Age of the oldest event waiting for delivery to a merchant endpoint",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(oldest_undelivered.clone()));
        let order_batch_rows = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "oncepay_order_batch_rows",
                "New orders inserted per statement (natural batching)",
            )
            .buckets(vec![
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
            ]),
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(order_batch_rows.clone()));
        let orders_queued = prometheus::IntGauge::new(
            "oncepay_order_batch_queued",
            "New orders waiting for a batch writer",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(orders_queued.clone()));
        let group_commit_statements = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "oncepay_group_commit_statements",
                "Writes of payments and provider webhooks per shared commit (group commit)",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(group_commit_statements.clone()));
        let group_commit_rows = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "oncepay_group_commit_rows",
                "Writes of payments and provider webhooks per statement of the group commit (one kind's writes share one statement)",
            )
            .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(group_commit_rows.clone()));
        let group_commit_queued = prometheus::IntGauge::new(
            "oncepay_group_commit_queued",
            "Statements waiting for a group-commit writer",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(group_commit_queued.clone()));
        let metrics = Metrics {
            order_batch_rows,
            orders_queued,
            group_commit_statements,
            group_commit_rows,
            group_commit_queued,
            provider_auth_refused: counter(
                "oncepay_provider_auth_refused_total",
                "Provider answers refusing oncepay's credentials (401, 403), by provider and operation",
                &["provider", "operation"],
            ),
            in_flight,
            pool_connections: gauge_vec(
                "oncepay_db_pool_connections",
                "Database pool connections by pool and state (idle, in_use)",
                &["pool", "state"],
            ),
            pool_max: gauge_vec(
                "oncepay_db_pool_max_connections",
                "The largest size of each database pool",
                &["pool"],
            ),
            pool_acquire: float_gauge_vec(
                "oncepay_db_pool_acquire_seconds",
                "How long the last scrape waited to acquire a connection, by pool",
                &["pool"],
            ),
            reconciler_last_pass: gauge(
                "oncepay_reconciler_last_pass_timestamp_seconds",
                "When this process's reconciler last finished a pass (Unix seconds; 0: never)",
            ),
            retention_deleted: counter(
                "oncepay_retention_deleted_total",
                "Rows deleted past ONCEPAY_EVENT_RETENTION, by table",
                &["table"],
            ),
            books_objects: counter(
                "oncepay_books_objects_total",
                "Provider objects the books reconciliation looked at, by outcome",
                &["outcome"],
            ),
            books_last_run: gauge(
                "oncepay_books_last_run_timestamp_seconds",
                "When this process last finished a books reconciliation run (Unix seconds; 0: never)",
            ),
            incidents: counter(
                "oncepay_incidents_total",
                "Money the provider moved that oncepay did not expect, by kind",
                &["kind"],
            ),
            pending_alarms: counter(
                "oncepay_pending_alarms_total",
                "Payments and refunds pending past ONCEPAY_PENDING_ALARM, by kind",
                &["kind"],
            ),
            oldest_pending,
            oldest_undelivered,
            events_written: counter(
                "oncepay_events_total",
                "Events written to the outbox, by type",
                &["type"],
            ),
            deliveries: counter(
                "oncepay_webhook_deliveries_total",
                "Delivery attempts to merchant endpoints, by outcome",
                &["outcome"],
            ),
            webhook_confirmations: counter(
                "oncepay_webhook_confirmations_total",
                "Provider reads confirming inbound events, by result",
                &["result"],
            ),
            http_requests: counter(
                "oncepay_http_requests_total",
                "HTTP requests by route, method and status",
                &["route", "method", "status"],
            ),
            http_latency: histogram(
                "oncepay_http_request_duration_seconds",
                "HTTP request latency by route and method",
                &["route", "method"],
            ),
            idempotency: counter(
                "oncepay_idempotency_total",
                "Idempotency outcomes (executed, replayed, key_reused, in_flight, resumed, released)",
                &["outcome"],
            ),
            payment_transitions: counter(
                "oncepay_payment_transitions_total",
                "Payment attempts reaching a status, by cause",
                &["status", "cause"],
            ),
            refund_transitions: counter(
                "oncepay_refund_transitions_total",
                "Refunds reaching a status, by cause",
                &["status", "cause"],
            ),
            webhooks: counter(
                "oncepay_webhooks_total",
                "Inbound webhook outcomes",
                &["outcome"],
            ),
            provider_calls: counter(
                "oncepay_provider_calls_total",
                "Provider calls by operation and outcome",
                &["operation", "outcome"],
            ),
            provider_latency: histogram(
                "oncepay_provider_call_duration_seconds",
                "Provider call latency by operation",
                &["operation"],
            ),
            group_commit_seconds: histogram(
                "oncepay_group_commit_seconds",
                "A group-commit statement's time since it was queued, until a writer took it and until it was answered",
                &["until"],
            ),
            last_write_hold_seconds: histogram(
                "oncepay_last_write_hold_seconds",
                "A command's last write after its stored answer (a reservation), from its start to its commit: its wait for the lock that write takes and its hold",
                &["command"],
            ),
            disputes: counter(
                "oncepay_disputes_total",
                "Disputes reaching a status, by provider and status",
                &["provider", "status"],
            ),
            disputes_evidence_due_soon,
            dispute_statuses_unrecognised: counter(
                "oncepay_dispute_statuses_unrecognised_total",
                "Disputes read from a provider in a status oncepay does not know (stored, held open), by provider",
                &["provider"],
            ),
            reconciler: counter(
                "oncepay_reconciler_total",
                "Reconciler work by kind and outcome",
                &["kind", "outcome"],
            ),
            swept,
            rate_limited,
            registry,
        };
        metrics.initialise_known_labels();
        metrics
    }

    /// The series labelled by provider, at 0 for every provider oncepay
    /// speaks (`provider::NAMES`, which startup hands in: the metrics
    /// import nothing of the providers, which import them).
    pub fn know_providers(&self, providers: &[&str]) {
        const CALLS: &[&str] = &[
            "open_charge",
            "charge",
            "find_charge",
            "refund",
            "find_refund",
            "probe",
            "abandon",
            "find_dispute",
            "capture",
            "find_capture",
            "void",
        ];
        const DISPUTES: &[&str] = &["needs_response", "under_review", "won", "lost"];
        for provider in providers {
            for call in CALLS {
                self.provider_auth_refused
                    .with_label_values(&[provider, call]);
            }
            for status in DISPUTES {
                self.disputes.with_label_values(&[provider, status]);
            }
            self.dispute_statuses_unrecognised
                .with_label_values(&[provider]);
        }
    }

    fn initialise_known_labels(&self) {
        for (family, lists) in KNOWN_LABELS {
            let counters: &[&IntCounterVec] = match *family {
                "incidents" => &[&self.incidents],
                "pending_alarms" => &[&self.pending_alarms],
                "deliveries" => &[&self.deliveries],
                "webhook_confirmations" => &[&self.webhook_confirmations],
                "webhooks" => &[&self.webhooks],
                "idempotency" => &[&self.idempotency],
                "transitions" => &[&self.payment_transitions, &self.refund_transitions],
                "provider_calls" => &[&self.provider_calls],
                "retention_deleted" => &[&self.retention_deleted],
                "books_objects" => &[&self.books_objects],
                "reconciler" => &[&self.reconciler],
                other => unreachable!("no counter family {other}"),
            };
            for labels in combinations(lists) {
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                for counter in counters {
                    counter.with_label_values(&labels);
                }
            }
        }
        for kind in ["payment", "refund"] {
            self.oldest_pending.with_label_values(&[kind]);
        }
    }

    /// Times one acquisition from each pool (at most a second: a pool
    /// that gives none in a second reads 1), for the scrape about to be
    /// rendered.
    pub async fn probe_pools(&self, pools: &[(&str, &sqlx::PgPool)]) {
        for (name, pool) in pools {
            let started = std::time::Instant::now();
            let waited =
                match tokio::time::timeout(std::time::Duration::from_secs(1), pool.acquire()).await
                {
                    Ok(Ok(conn)) => {
                        let waited = started.elapsed().as_secs_f64();
                        drop(conn);
                        waited
                    }
                    _ => 1.0,
                };
            self.pool_acquire.with_label_values(&[name]).set(waited);
        }
        self.observe_pools(pools);
    }

    /// Notes the pools' sizes, for the scrape about to be rendered.
    pub fn observe_pools(&self, pools: &[(&str, &sqlx::PgPool)]) {
        for (name, pool) in pools {
            let size = i64::from(pool.size());
            let idle = i64::try_from(pool.num_idle()).unwrap_or(i64::MAX);
            self.pool_connections
                .with_label_values(&[name, "idle"])
                .set(idle);
            self.pool_connections
                .with_label_values(&[name, "in_use"])
                .set((size - idle).max(0));
            self.pool_max
                .with_label_values(&[name])
                .set(i64::from(pool.options().get_max_connections()));
        }
    }

    /// Counts one idempotency outcome.
    pub fn idempotency(&self, outcome: &str) {
        self.idempotency.with_label_values(&[outcome]).inc();
    }

    /// Counts a payment attempt reaching `status` (created `pending`,
    /// settled), by what moved it.
    pub fn payment_transition(&self, status: &str, cause: &str) {
        self.payment_transitions
            .with_label_values(&[status, cause])
            .inc();
    }

    /// The Prometheus text exposition of every metric, and of the
    /// process's own (`process_*`, read from `/proc` at each scrape).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .is_err()
        {
            return String::new();
        }
        let mut text = String::from_utf8(out).unwrap_or_default();
        text.push_str(&crate::process_metrics::render());
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    /// Every outcome a provider event can have is exported from the first
    /// scrape, so an alert on one never waits for its first occurrence.
    #[test]
    fn every_event_outcome_is_exported_at_zero() {
        let text = super::Metrics::new().render();
        for outcome in crate::domain::event::EventOutcome::ALL {
            let line = format!(
                "oncepay_webhooks_total{{outcome=\"{}\"}} 0",
                outcome.as_str()
            );
            assert!(text.contains(&line), "{line}");
        }
    }
}
