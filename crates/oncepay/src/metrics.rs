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
        let oldest_pending = GaugeVec::new(
            Opts::new(
                "oncepay_oldest_pending_seconds",
                "Age of the oldest pending payment or refund, by kind",
            ),
            &["kind"],
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(oldest_pending.clone()));
        let oldest_undelivered = prometheus::Gauge::new(
            "oncepay_webhook_oldest_undelivered_seconds",
            "Age of the oldest event waiting for delivery to a merchant endpoint",
        )
        .unwrap_or_else(|e| panic!("metric is malformed: {e}"));
        let _ = registry.register(Box::new(oldest_undelivered.clone()));
        Metrics {
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
            reconciler: counter(
                "oncepay_reconciler_total",
                "Reconciler work by kind and outcome",
                &["kind", "outcome"],
            ),
            swept,
            rate_limited,
            registry,
        }
    }

    /// Counts one idempotency outcome.
    pub fn idempotency(&self, outcome: &str) {
        self.idempotency.with_label_values(&[outcome]).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .is_err()
        {
            return String::new();
        }
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
