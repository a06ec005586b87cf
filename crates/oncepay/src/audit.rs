//! The audit trail: who did which administrative action, written in the
//! same transaction as the change (`store::audit`), never with a secret.
//! Payments, refunds and orders have their own trail (the outbox's events);
//! this one is for what changes how a merchant's account behaves.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Who acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// `api_key`, `cli`, `customer` or `seller`.
    pub kind: ActorKind,
    /// The key's id, the OS user who ran the `oncepay` CLI, or a token's
    /// `sub`.
    pub id: String,
    /// The request, for an action by API.
    pub request_id: Option<String>,
    /// A token's issuer (absent for a key or the CLI, and in records
    /// stored before tokens existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
}

/// The kinds of actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    /// A request authenticated by an API key.
    ApiKey,
    /// The `oncepay` command line.
    Cli,
    /// A customer signed in at the merchant's identity provider.
    Customer,
    /// A seller (the merchant's staff) signed in at its identity provider.
    Seller,
}

impl ActorKind {
    /// As stored.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::ApiKey => "api_key",
            ActorKind::Cli => "cli",
            ActorKind::Customer => "customer",
            ActorKind::Seller => "seller",
        }
    }
}

impl Actor {
    /// A request authenticated by key `key_id`.
    pub fn key(key_id: Uuid, request_id: Option<String>) -> Actor {
        Actor {
            kind: ActorKind::ApiKey,
            id: key_id.to_string(),
            request_id,
            issuer: None,
        }
    }

    /// A request authenticated by a token of `issuer` for `sub`, acting
    /// as `kind` (`Customer` or `Seller`).
    pub fn token(kind: ActorKind, sub: &str, issuer: &str, request_id: Option<String>) -> Actor {
        Actor {
            kind,
            id: sub.to_string(),
            request_id,
            issuer: Some(issuer.to_string()),
        }
    }

    /// The member `actor` of an event or an audit row:
    /// `{"type": "api_key", "id"}` for a key, `{"type": "customer" |
    /// "seller", "sub", "issuer"}` for a token, `{"type": "cli", "id"}`.
    pub fn member(&self) -> serde_json::Value {
        match self.kind {
            ActorKind::Customer | ActorKind::Seller => serde_json::json!({
                "type": self.kind.as_str(),
                "sub": self.id,
                "issuer": self.issuer,
            }),
            ActorKind::ApiKey | ActorKind::Cli => serde_json::json!({
                "type": self.kind.as_str(),
                "id": self.id,
            }),
        }
    }

    /// The operator running the `oncepay` CLI here (`$USER`, else
    /// `$LOGNAME`, else the numeric user id).
    pub fn cli() -> Actor {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(numeric_user);
        Actor {
            kind: ActorKind::Cli,
            id: user,
            request_id: None,
            issuer: None,
        }
    }
}

tokio::task_local! {
    /// Who asked for the command a task runs, so that the events its
    /// change writes name them (`events::build`) without every function
    /// between the command and the outbox passing it along.
    static ACTING: Option<Actor>;
}

/// Runs `work` on behalf of `actor` (a command's stored actor: a resumed
/// command's events name who asked for it, too).
pub(crate) async fn acting_as<F: std::future::Future>(actor: Option<Actor>, work: F) -> F::Output {
    ACTING.scope(actor, work).await
}

/// Who the current task acts for; `None` in background work and for
/// changes nobody authenticated asked for.
pub(crate) fn acting() -> Option<Actor> {
    ACTING.try_with(Clone::clone).ok().flatten()
}

fn numeric_user() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().next().map(|u| format!("uid {u}")))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The administrative actions recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// A key was made.
    ApiKeyCreated,
    /// A key was given an end (rotation: a new key, the old one expiring).
    ApiKeyRotated,
    /// A key was revoked.
    ApiKeyRevoked,
    /// A merchant's own rate limit was set or cleared.
    RateLimitChanged,
    /// The name customers see on the checkout page was set or cleared.
    DisplayNameChanged,
    /// A webhook endpoint was registered.
    WebhookEndpointCreated,
    /// A webhook endpoint was deleted.
    WebhookEndpointDeleted,
    /// An event was queued for delivery again.
    EventRedelivered,
    /// The merchant's identity provider was set, changed or removed.
    IdentityChanged,
    /// A customer's balance was credited (store credit given).
    BalanceCredited,
    /// A customer's balance was debited.
    BalanceDebited,
    /// A SKU's stock was adjusted (counted in or out).
    InventoryAdjusted,
    /// A hold was placed on a customer's balance.
    BalanceHoldCreated,
    /// A balance hold was captured.
    BalanceHoldCaptured,
    /// A balance hold was released.
    BalanceHoldReleased,
}

impl Action {
    /// As stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::ApiKeyCreated => "api_key.created",
            Action::ApiKeyRotated => "api_key.rotated",
            Action::ApiKeyRevoked => "api_key.revoked",
            Action::RateLimitChanged => "merchant.rate_limit_changed",
            Action::DisplayNameChanged => "merchant.display_name_changed",
            Action::WebhookEndpointCreated => "webhook_endpoint.created",
            Action::WebhookEndpointDeleted => "webhook_endpoint.deleted",
            Action::EventRedelivered => "event.redelivered",
            Action::IdentityChanged => "merchant.identity_changed",
            Action::BalanceCredited => "balance.credited",
            Action::BalanceDebited => "balance.debited",
            Action::InventoryAdjusted => "inventory.adjusted",
            Action::BalanceHoldCreated => "balance_hold.created",
            Action::BalanceHoldCaptured => "balance_hold.captured",
            Action::BalanceHoldReleased => "balance_hold.released",
        }
    }

    /// What kind of object the action is on.
    pub fn target_type(self) -> &'static str {
        match self {
            Action::ApiKeyCreated | Action::ApiKeyRotated | Action::ApiKeyRevoked => "api_key",
            Action::RateLimitChanged | Action::DisplayNameChanged | Action::IdentityChanged => {
                "merchant"
            }
            Action::WebhookEndpointCreated | Action::WebhookEndpointDeleted => "webhook_endpoint",
            Action::EventRedelivered => "event",
            Action::BalanceCredited | Action::BalanceDebited => "balance_transaction",
            Action::InventoryAdjusted => "inventory",
            Action::BalanceHoldCreated
            | Action::BalanceHoldCaptured
            | Action::BalanceHoldReleased => "balance_hold",
        }
    }

    /// Every action.
    pub const ALL: [Action; 15] = [
        Action::ApiKeyCreated,
        Action::ApiKeyRotated,
        Action::ApiKeyRevoked,
        Action::RateLimitChanged,
        Action::DisplayNameChanged,
        Action::WebhookEndpointCreated,
        Action::WebhookEndpointDeleted,
        Action::EventRedelivered,
        Action::IdentityChanged,
        Action::BalanceCredited,
        Action::BalanceDebited,
        Action::InventoryAdjusted,
        Action::BalanceHoldCreated,
        Action::BalanceHoldCaptured,
        Action::BalanceHoldReleased,
    ];
}
