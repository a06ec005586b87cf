//! The business rules, free of I/O: what a valid order is, and the one-way
//! state machines of orders, payment attempts and refunds. Storage and HTTP
//! call into this module; it calls into nothing.

pub mod adoption;
pub mod card;
pub mod checkout;
pub mod dispute;
pub mod event;
pub mod inventory;
pub mod ledger;
pub mod money;
pub mod order;
pub mod origin;
pub mod payment;
pub mod principal;
pub mod refund;
pub mod scopes;
pub mod settlement;

/// A request that is well formed but breaks a business rule (answered `422`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RuleViolation {
    /// The field at fault, as a JSON path (`items[2].quantity`).
    pub field: String,
    /// What the rule is.
    pub message: String,
}

impl RuleViolation {
    /// A violation of `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}
