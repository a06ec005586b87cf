//! Structured logs through `tracing`. Nothing here or elsewhere logs headers
//! or bodies, so no API key, card token or webhook secret reaches a log.

use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable, one line per event.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// Installs the global subscriber (once; later calls do nothing).
pub fn init(filter: &str, format: LogFormat) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let _ = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
}

tokio::task_local! {
    /// The `X-Request-Id` of the request a task works for, so that what a
    /// request changes can name it (an event's trail) without every
    /// function between the handler and the store passing it along.
    static REQUEST_ID: std::sync::Arc<str>;
}

/// Runs `work` as part of the request `request_id`.
pub(crate) async fn with_request_id<F: std::future::Future>(
    request_id: std::sync::Arc<str>,
    work: F,
) -> F::Output {
    REQUEST_ID.scope(request_id, work).await
}

/// The request the current task works for; `None` in background work.
pub fn request_id() -> Option<std::sync::Arc<str>> {
    REQUEST_ID.try_with(|id| id.clone()).ok()
}
