//! RFC 9457 problem details: the one shape of every error oncepay returns.
//!
//! A `Problem` is built wherever an error is decided (input parsing, a
//! command's business rule, the idempotency engine) and turned into a
//! response in one place (`crate::http`). Its `code` is stable and
//! machine-readable; `detail` names the field when one is at fault.

use serde::Serialize;

/// Declares [`ProblemCode`] from one table: every code with its status and
/// title, so a code can never be sent with the wrong status.
macro_rules! problem_codes {
    ($($variant:ident = $code:literal, $status:literal, $title:literal;)*) => {
        /// Every stable `code` oncepay answers with. `openapi.yaml` lists the
        /// same set (a test checks that they agree).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ProblemCode {
            $(
                #[doc = $title]
                $variant,
            )*
        }

        impl ProblemCode {
            /// Every code, in the table's order.
            pub const ALL: &'static [ProblemCode] = &[$(ProblemCode::$variant,)*];

            /// The code as sent in the body.
            pub fn as_str(self) -> &'static str {
                match self { $(ProblemCode::$variant => $code,)* }
            }

            /// The HTTP status this code is always sent with.
            pub fn status(self) -> u16 {
                match self { $(ProblemCode::$variant => $status,)* }
            }

            /// The problem type's short title.
            pub fn title(self) -> &'static str {
                match self { $(ProblemCode::$variant => $title,)* }
            }
        }
    };
}

problem_codes! {
    IdempotencyKeyMissing = "idempotency_key_missing", 400, "Idempotency-Key header required";
    IdempotencyKeyInvalid = "idempotency_key_invalid", 400, "Idempotency-Key header malformed";
    IdempotencyKeyReused = "idempotency_key_reused", 409, "Idempotency-Key reused with another request";
    IdempotencyKeyInFlight = "idempotency_key_in_flight", 409, "A request with this Idempotency-Key is still executing";
    MalformedJson = "malformed_json", 400, "Malformed JSON body";
    MalformedRequest = "malformed_request", 400, "Malformed HTTP request";
    RequestHeadTooLarge = "request_header_fields_too_large", 431, "Request head too large";
    InvalidField = "invalid_field", 400, "Field of the wrong shape";
    ValidationFailed = "validation_failed", 422, "Request breaks a rule";
    PayloadTooLarge = "payload_too_large", 413, "Request body too large";
    RequestTimeout = "request_timeout", 408, "Request not received in time";
    Unauthorized = "unauthorized", 401, "Missing or unknown API key";
    InsufficientScope = "insufficient_scope", 403, "The credentials lack the scope this needs";
    InvalidToken = "invalid_token", 401, "Bearer token not accepted";
    NotOwner = "not_owner", 403, "A customer acts only for itself";
    WebhookSignatureInvalid = "webhook_signature_invalid", 401, "Webhook signature invalid";
    UnsupportedProvider = "unsupported_provider", 404, "Unknown webhook provider";
    NotFound = "not_found", 404, "Not found";
    MethodNotAllowed = "method_not_allowed", 405, "Method not allowed";
    OrderNotFound = "order_not_found", 404, "Order not found";
    PaymentNotFound = "payment_not_found", 404, "Payment not found";
    RefundNotFound = "refund_not_found", 404, "Refund not found";
    DisputeNotFound = "dispute_not_found", 404, "Dispute not found";
    BalanceTransactionNotFound = "balance_transaction_not_found", 404, "Balance transaction not found";
    BalanceHoldNotFound = "balance_hold_not_found", 404, "Balance hold not found";
    InsufficientFunds = "insufficient_funds", 422, "The balance does not cover this";
    HoldNotActive = "hold_not_active", 409, "The hold is no longer held";
    InsufficientStock = "insufficient_stock", 409, "Not enough stock available";
    ReservationLimitReached = "reservation_limit_reached", 409, "Too many unpaid orders hold stock";
    InventoryItemNotFound = "inventory_item_not_found", 404, "SKU not tracked";
    AmountExceedsHold = "amount_exceeds_hold", 422, "The capture exceeds the hold";
    OrderNotPayable = "order_not_payable", 409, "Order is not payable";
    OrderNotCancellable = "order_not_cancellable", 409, "Order cannot be cancelled";
    PaymentInProgress = "payment_in_progress", 409, "A payment for this order is in progress";
    PaymentNotRefundable = "payment_not_refundable", 409, "Payment is not refundable";
    PaymentDisputed = "payment_disputed", 409, "Payment is disputed";
    RefundExceedsPayment = "refund_exceeds_payment", 422, "Refund exceeds what is left of the payment";
    AmountNotSupportedByProvider = "amount_not_supported_by_provider", 422, "The provider cannot take this amount";
    RefundInProgress = "refund_in_progress", 409, "A refund for this payment is in progress";
    PaymentNotCapturable = "payment_not_capturable", 409, "Payment cannot be captured";
    AmountExceedsCapturable = "amount_exceeds_capturable", 422, "Amount exceeds what the payment can capture";
    AuthorizationExpired = "authorization_expired", 409, "The payment's authorization expired";
    CaptureRefused = "capture_refused", 402, "The provider refused the capture";
    PaymentNotVoidable = "payment_not_voidable", 409, "Payment cannot be voided";
    CheckoutNotFound = "checkout_not_found", 404, "Checkout not found";
    ApiKeyNotFound = "api_key_not_found", 404, "API key not found";
    CheckoutExpired = "checkout_expired", 410, "Checkout expired";
    ConfirmationUnavailable = "confirmation_unavailable", 503, "The provider could not confirm the event now";
    RateLimited = "rate_limited", 429, "Too many requests";
    EventNotFound = "event_not_found", 404, "Event not found";
    WebhookEndpointNotFound = "webhook_endpoint_not_found", 404, "Webhook endpoint not found";
    InternalError = "internal_error", 500, "Internal error";
    ServiceUnavailable = "service_unavailable", 503, "Service temporarily unavailable";
    RestoreReconciliation = "restore_reconciliation", 503, "Reconciling with the provider's books after a restore";
}

/// An error answer, ready to serialise as `application/problem+json`
/// (its `type` is `/problems/{code}`, see [`Problem::type_uri`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// A short, human-readable summary of the type.
    pub title: &'static str,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong with this request, naming the field if one is at fault.
    pub detail: String,
    /// Stable, machine-readable code.
    pub code: &'static str,
    /// The field at fault, as a JSON path, when there is one.
    pub field: Option<String>,
    /// Seconds to wait before retrying (also sent as `Retry-After`).
    pub retry_after: Option<u32>,
    /// What caused it, for the log only: never sent. The request
    /// middleware logs it once, with the request's id (`http::middleware`).
    /// (Boxed: a `Problem` travels in every `Result` of the request path.)
    pub cause: Option<Box<String>>,
    /// RFC 9457 extension members a client acts on (the currency a
    /// provider cannot take, the amount that was available), after the
    /// standard ones. (Boxed, like `cause`.)
    pub members: Option<Box<Vec<(&'static str, serde_json::Value)>>>,
}

impl Serialize for Problem {
    /// RFC 9457's members and `code`; never `retry_after` (a header) nor
    /// `cause` (the log's).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("type", &self.type_uri())?;
        map.serialize_entry("title", self.title)?;
        map.serialize_entry("status", &self.status)?;
        map.serialize_entry("detail", &self.detail)?;
        map.serialize_entry("code", self.code)?;
        if let Some(field) = &self.field {
            map.serialize_entry("field", field)?;
        }
        for (name, value) in self.members.iter().flat_map(|m| m.iter()) {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl Problem {
    /// A problem with the code's status and title, and this detail.
    pub fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        Problem {
            title: code.title(),
            status: code.status(),
            detail: detail.into(),
            code: code.as_str(),
            field: None,
            retry_after: None,
            cause: None,
            members: None,
        }
    }

    /// Adds the extension member `name` (RFC 9457 section 3.2).
    pub fn with_member(mut self, name: &'static str, value: serde_json::Value) -> Self {
        self.members
            .get_or_insert_with(Default::default)
            .push((name, value));
        self
    }

    /// Keeps what caused it (logged once, never answered).
    pub fn caused_by(mut self, cause: impl std::fmt::Display) -> Self {
        self.cause = Some(Box::new(cause.to_string()));
        self
    }

    /// `500`, keeping its cause for the log.
    pub fn internal_from(cause: impl std::fmt::Display) -> Self {
        Problem::internal().caused_by(cause)
    }

    /// A URI reference naming the problem type.
    pub fn type_uri(&self) -> String {
        format!("/problems/{}", self.code)
    }

    /// A money request beyond what may be taken, in the one style every
    /// money error follows (issue 54): `detail` names the field, what was
    /// asked and the most allowed (`amount: 1600 asked, at most 1067 left
    /// to refund on this payment`), with `field` and the members
    /// `requested` and `allowed` for a program.
    pub fn beyond(
        code: ProblemCode,
        field: &str,
        requested: i64,
        allowed: i64,
        of_what: &str,
    ) -> Self {
        Problem::new(
            code,
            format!("{field}: {requested} asked, at most {allowed} {of_what}"),
        )
        .with_field(field)
        .with_member("requested", serde_json::json!(requested))
        .with_member("allowed", serde_json::json!(allowed))
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
        Problem::new(ProblemCode::InvalidField, format!("{field}: {what}")).with_field(field)
    }

    /// `422 validation_failed` for a rule a well-formed field breaks.
    pub fn rule(violation: crate::domain::RuleViolation) -> Self {
        Problem::new(ProblemCode::ValidationFailed, violation.to_string())
            .with_field(violation.field)
    }

    /// `404` for a resource that does not exist for this merchant.
    pub fn not_found(code: ProblemCode, what: &str) -> Self {
        Problem::new(code, format!("no {what} with this id"))
    }

    /// `500` for a failure we could not classify; nothing about it is revealed.
    pub fn internal() -> Self {
        Problem::new(
            ProblemCode::InternalError,
            "an internal error occurred; retrying with the same Idempotency-Key is safe",
        )
    }

    /// `503` when the database or provider is unreachable.
    pub fn unavailable(what: &str) -> Self {
        Problem::new(
            ProblemCode::ServiceUnavailable,
            format!("{what} is unavailable; retry with the same Idempotency-Key"),
        )
        .retry_after(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_codes_are_the_ones_openapi_documents() {
        // The `code` enum of the Problem schema, read from the document.
        let doc = crate::http::OPENAPI;
        let start = doc
            .find("        code:\n          type: string\n          enum:\n")
            .expect("the Problem schema lists its codes");
        let documented: std::collections::BTreeSet<&str> = doc[start..]
            .lines()
            .skip(3)
            .map_while(|l| l.strip_prefix("            - "))
            .map(str::trim)
            .collect();
        let served: std::collections::BTreeSet<&str> =
            ProblemCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(documented, served);
    }

    #[test]
    fn every_code_has_one_status_and_a_title() {
        for code in ProblemCode::ALL {
            let p = Problem::new(*code, "x");
            assert!((400..600).contains(&p.status), "{code:?}");
            assert!(!p.title.is_empty());
            assert_eq!(p.type_uri(), format!("/problems/{}", code.as_str()));
        }
    }

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
