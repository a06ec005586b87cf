//! Who may call a route: each route of [`super::routes::ROUTES`] says it
//! (a route cannot be declared without it). Checked in `authenticate`,
//! before anything is read or written and before the `Idempotency-Key` is
//! looked at: a refused request consumes nothing.

use crate::api_keys::Scope;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No API key (checkout pages, provider webhooks, health, metrics, the
    /// OpenAPI document): they authenticate otherwise, or not at all.
    Public,
    /// A key with this scope.
    Needs(Scope),
}

/// The scope a request to `pattern` with `method` needs (`HEAD` as `GET`);
/// `None` for a public route. A route missing from the table (none is
/// routed) needs `admin`: the safe side.
pub fn required(pattern: &str, method: &str) -> Option<Scope> {
    match super::routes::find(pattern, method).map(|r| r.access) {
        Some(Access::Public) => None,
        Some(Access::Needs(scope)) => Some(scope),
        None => Some(Scope::Admin),
    }
}
