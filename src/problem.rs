//! RFC 9457 problem details: the one shape of every error oncepay returns.
//!
//! A `Problem` is built wherever an error is decided (input parsing, a
//! command's business rule, the idempotency engine) and turned into a
//! response in one place (`crate::http`). Its `code` is stable and
//! machine-readable; `detail` names the field when one is at fault.

use serde::Serialize;

/// An error answer, ready to serialise as `application/problem+json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// A URI reference naming the problem type (`/problems/{code}`).
    #[serde(rename = "type")]
    pub type_uri: String,
    /// A short, human-readable summary of the type.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, naming the field if one is at fault.
    pub detail: String,
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// The field at fault, as a JSON path, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// Seconds to wait before retrying (also sent as `Retry-After`).
    #[serde(skip)]
    pub retry_after: Option<u32>,
}

impl Problem {
    /// A problem with the given status, code and detail.
    pub fn new(status: u16, code: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            type_uri: format!("/problems/{code}"),
            title: title_of(code),
            status,
            detail: detail.into(),
            code,
            field: None,
            retry_after: None,
        }
    }

    /// Names the field at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Asks the client to retry after `seconds`.
    pub fn retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// The serialised body.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// `400 invalid_field` for a field of the wrong shape.
    pub fn invalid_field(field: impl Into<String>, what: &str) -> Self {
        let field = field.into();
        Problem::new(400, "invalid_field", format!("{field}: {what}")).with_field(field)
    }

    /// `422 validation_failed` for a rule a well-formed field breaks.
    pub fn rule(violation: crate::domain::RuleViolation) -> Self {
        Problem::new(422, "validation_failed", violation.to_string()).with_field(violation.field)
    }

    /// `404` for a resource that does not exist for this merchant.
    pub fn not_found(code: &'static str, what: &str) -> Self {
        Problem::new(404, code, format!("no {what} with this id"))
    }

    /// `500` for a failure we could not classify; nothing about it is revealed.
    pub fn internal() -> Self {
        Problem::new(
            500,
            "internal_error",
            "an internal error occurred; retrying with the same Idempotency-Key is safe",
        )
    }

    /// `503` when the database or provider is unreachable.
    pub fn unavailable(what: &str) -> Self {
        Problem::new(
            503,
            "service_unavailable",
            format!("{what} is unavailable; retry with the same Idempotency-Key"),
        )
        .retry_after(1)
    }
}

fn title_of(code: &str) -> &'static str {
    match code {
        "idempotency_key_missing" => "Idempotency-Key header required",
        "idempotency_key_invalid" => "Idempotency-Key header malformed",
        "idempotency_key_reused" => "Idempotency-Key reused with another request",
        "idempotency_key_in_flight" => "A request with this Idempotency-Key is still executing",
        "malformed_json" => "Malformed JSON body",
        "invalid_field" => "Field of the wrong shape",
        "validation_failed" => "Request breaks a rule",
        "payload_too_large" => "Request body too large",
        "unauthorized" => "Missing or unknown API key",
        "webhook_signature_invalid" => "Webhook signature invalid",
        "order_not_found" => "Order not found",
        "payment_not_found" => "Payment not found",
        "refund_not_found" => "Refund not found",
        "not_found" => "Not found",
        "method_not_allowed" => "Method not allowed",
        "order_not_payable" => "Order is not payable",
        "order_not_cancellable" => "Order cannot be cancelled",
        "payment_in_progress" => "A payment for this order is in progress",
        "payment_not_refundable" => "Payment is not refundable",
        "refund_exceeds_payment" => "Refund exceeds what is left of the payment",
        "refund_in_progress" => "A refund for this payment is in progress",
        "service_unavailable" => "Service temporarily unavailable",
        "unsupported_provider" => "Unknown webhook provider",
        _ => "Internal error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_as_rfc9457_with_code() {
        let p = Problem::invalid_field("items[0].sku", "must be a string");
        let v: serde_json::Value = serde_json::from_slice(&p.body()).expect("json");
        assert_eq!(v["type"], "/problems/invalid_field");
        assert_eq!(v["status"], 400);
        assert_eq!(v["code"], "invalid_field");
        assert_eq!(v["field"], "items[0].sku");
        assert!(v["detail"]
            .as_str()
            .is_some_and(|d| d.contains("items[0].sku")));
        assert!(v["title"].as_str().is_some_and(|t| !t.is_empty()));
    }
}
