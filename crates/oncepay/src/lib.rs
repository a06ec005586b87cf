//! oncepay: a payments microservice whose one promise is *one intent, one
//! effect*. See docs/architecture.md for the map of modules; in short:
//!
//! - [`http`] — routes and thin handlers;
//! - [`commands`] — money commands as recorded steps, run through
//! - [`idempotency`] — the engine that claims keys, replays and resumes;
//! - [`domain`] — business rules and state machines, free of I/O;
//! - [`store`] — all SQL;
//! - [`provider`] — the payment provider trait and its HTTP client;
//! - [`sandbox_server`] — the stand-alone sandbox provider (the server;
//!   its adapter is [`provider::sandbox`]);
//! - [`workers`] — the reconciler and the sweeper;
//! - [`events`] — outbound: events written with the changes they report
//!   (the outbox) and their delivery to merchants' endpoints;
//! - [`inbound`] — inbound: provider webhook events, verified and applied;
//! - [`standard_webhooks`] — the signing scheme both directions use;
//! - [`books`] — reconciliation against the providers' books, and the
//!   restore guard.

// Every public item says why it exists.
#![warn(missing_docs)]

pub mod api_keys;
pub mod audit;
pub mod balances;
pub mod books;
pub mod cli;
pub mod commands;
pub mod config;
pub mod domain;
pub mod events;
pub mod http;
pub mod idempotency;
pub mod identity;
pub mod inbound;
pub mod input;
pub mod inventory;
pub mod metrics;
pub mod problem;
pub mod process_metrics;
pub mod provider;
pub mod rate_limit;
pub mod sandbox_server;
pub mod standard_webhooks;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod workers;

/// Entry points for the fuzz targets in `fuzz/` (`cargo fuzz`, see
/// docs/fuzzing.md): the parsers of what a stranger sends, reachable without
/// a server, a runtime or a database. Not an API: nothing else uses it.
#[doc(hidden)]
pub mod fuzzing {
    use std::collections::HashMap;

    use serde_json::Value;

    use crate::http::lists::{
        page_request, FilterKind, ListSpec, DISPUTE_SPEC, PAYMENT_SPEC, REFUND_SPEC,
    };
    use crate::problem::Problem;
    use crate::provider::Event;
    use crate::store::pages::PageRequest;

    /// `input::json`'s nesting limit.
    pub const JSON_MAX_DEPTH: usize = crate::input::json::MAX_DEPTH;
    /// The longest `Idempotency-Key`, in characters.
    pub const IDEMPOTENCY_KEY_MAX_LEN: usize = crate::idempotency::key::MAX_KEY_LEN;
    /// How far a Standard Webhooks timestamp may be from our clock.
    pub const STANDARD_WEBHOOKS_TOLERANCE_SECS: i64 =
        crate::standard_webhooks::TIMESTAMP_TOLERANCE_SECS;

    /// The middleware's check of the raw query string for `%00`.
    pub fn query_nul(query: &str) -> Option<Problem> {
        crate::http::middleware::nul_in_query(query)
    }

    /// The query string as the list handlers' extractor
    /// (`web::Query<HashMap<String, String>>`) decodes it; `None` where it
    /// refuses it (answered `400 invalid_field`).
    pub fn query_map(query: &str) -> Option<HashMap<String, String>> {
        actix_web::web::Query::<HashMap<String, String>>::from_query(query)
            .ok()
            .map(actix_web::web::Query::into_inner)
    }

    fn event_types() -> Vec<&'static str> {
        crate::domain::event::EventType::ALL
            .iter()
            .map(|t| t.as_str())
            .collect()
    }

    fn audit_actions() -> Vec<&'static str> {
        crate::audit::Action::ALL
            .iter()
            .map(|a| a.as_str())
            .collect()
    }

    // The lists whose specs are written inside their handlers, as they are
    // written there (payments and refunds are the lists module's own).
    const ORDERS_SPEC: ListSpec = ListSpec {
        statuses: &[
            "awaiting_payment",
            "authorized",
            "paid",
            "refunded",
            "cancelled",
        ],
        filters: &[],
    };
    const EVENTS_SPEC: ListSpec = ListSpec {
        statuses: &[],
        filters: &[
            ("type", FilterKind::OneOf(event_types)),
            ("object_id", FilterKind::Id),
        ],
    };
    const AUDIT_SPEC: ListSpec = ListSpec {
        statuses: &[],
        filters: &[("action", FilterKind::OneOf(audit_actions))],
    };

    /// Each list endpoint's reading of decoded query parameters, by route.
    pub fn query_lists(
        query: &HashMap<String, String>,
    ) -> Vec<(&'static str, Result<PageRequest, Problem>)> {
        [
            ("/orders", &ORDERS_SPEC),
            ("/payments", &PAYMENT_SPEC),
            ("/refunds", &REFUND_SPEC),
            ("/disputes", &DISPUTE_SPEC),
            ("/events", &EVENTS_SPEC),
            ("/audit_events", &AUDIT_SPEC),
        ]
        .into_iter()
        .map(|(route, spec)| (route, page_request(query, spec)))
        .collect()
    }

    /// What `http::wire` makes of the start of a response stream.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum WireHead {
        /// An answer passed through: head and body, this many bytes.
        Forward(u64),
        /// The HTTP parser's own bare answer, replaced.
        Replace {
            /// The bare head's length.
            head_len: usize,
            /// Its status.
            status: u16,
            /// Whether it is an HTTP/1.0 answer.
            http10: bool,
        },
        /// Not a head it can frame: the rest of the stream passes through.
        Unknown,
    }

    /// `http::wire`'s reading of a response head at the start of `buf`.
    pub fn wire_classify(buf: &[u8]) -> WireHead {
        use crate::http::wire::{classify, Head};
        match classify(buf) {
            Head::Forward(n) => WireHead::Forward(n),
            Head::Replace {
                head_len,
                status,
                http10,
            } => WireHead::Replace {
                head_len,
                status,
                http10,
            },
            Head::Unknown => WireHead::Unknown,
        }
    }

    /// The path of the first string or key of an inbound event holding
    /// U+0000 (such an event is recorded `rejected`).
    pub fn event_nul_at(payload: &Value) -> Option<String> {
        crate::inbound::nul_at(payload, &mut String::new())
    }

    /// The event as it is stored when it holds U+0000.
    pub fn event_without_nul(payload: &Value) -> Value {
        crate::inbound::without_nul(payload)
    }

    /// The sandbox adapter's reading of a verified event.
    pub fn sandbox_event(payload: &Value) -> Event {
        crate::provider::sandbox::parse_event(payload)
    }

    /// The Stripe adapter's reading of a verified event.
    pub fn stripe_event(payload: &Value) -> Event {
        crate::provider::stripe::classify::event(payload)
    }
}
