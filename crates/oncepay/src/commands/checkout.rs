//! `POST /orders/{id}/checkout`: a hosted checkout session for an order
//! awaiting payment. One step, through the engine like every command that
//! creates something: a repeat with the key answers the same session.

use serde_json::json;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{
    json_response, AppContext, At, Command, CommandError, CommandInput, NoRecoveryPoint, Run, Step,
};
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store;

/// Every checkout token starts with this.
pub(crate) const TOKEN_PREFIX: &str = "cs_";

/// A new checkout token: `cs_` + 64 hex digits (244 random bits from the
/// operating system's secure source). Only its hash is stored.
pub(crate) fn new_token() -> String {
    let mut token = String::from(TOKEN_PREFIX);
    for _ in 0..2 {
        token.push_str(&Uuid::new_v4().simple().to_string());
    }
    token
}

/// The stored form of a token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Open a checkout page for an order.
pub struct CreateCheckout {
    order_id: Uuid,
    way_back: WayBack,
    /// `manual`: the page authorizes only; its payments are held.
    capture_method: crate::domain::payment::CaptureMethod,
}

pub use crate::domain::checkout::WayBack;

/// The placeholder a `success_url` may hold, replaced by the session's id
/// (as Stripe Checkout does).
pub(crate) const SESSION_ID_PLACEHOLDER: &str = "{CHECKOUT_SESSION_ID}";

/// A URL the customer's browser is sent to: absolute `https://`, or
/// `http://` on a loopback host (development); never `javascript:`,
/// `data:` or any other scheme. oncepay never fetches it, so the rules on
/// addresses of outbound webhooks do not apply.
pub(crate) fn way_back_url(field: &str, text: &str) -> Result<String, Problem> {
    use crate::domain::RuleViolation;
    let refuse = |why: &str| Problem::rule(RuleViolation::new(field, why));
    if text.len() > 2048 || text.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(refuse(
            "must be at most 2048 characters, without white space or control characters",
        ));
    }
    let url = reqwest::Url::parse(&text.replace(SESSION_ID_PLACEHOLDER, "cs"))
        .map_err(|_| refuse("must be an absolute https:// URL"))?;
    let host = url.host_str().unwrap_or_default();
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    let scheme_ok = url.scheme() == "https" || (url.scheme() == "http" && loopback);
    if !scheme_ok || host.is_empty() || !url.username().is_empty() || url.password().is_some() {
        return Err(refuse(
            "must be an absolute https:// URL (http:// only on a loopback host), without a user name or password",
        ));
    }
    Ok(text.to_string())
}

/// The page's language: `en`, `ru` or `zh` (a region, `ru-RU`, is its
/// language); `auto` (or none): the browser's.
fn locale(text: &str) -> Result<Option<&'static str>, Problem> {
    let base = text.split(['-', '_']).next().unwrap_or_default();
    match base.to_ascii_lowercase().as_str() {
        "auto" if text.eq_ignore_ascii_case("auto") => Ok(None),
        "en" => Ok(Some("en")),
        "ru" => Ok(Some("ru")),
        "zh" => Ok(Some("zh")),
        _ => Err(Problem::rule(crate::domain::RuleViolation::new(
            "locale",
            "must be en, ru, zh (or a region of them, as ru-RU), or auto",
        ))),
    }
}

impl Command for CreateCheckout {
    const KIND: super::CommandKind = super::CommandKind::CreateCheckout;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let order_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::OrderNotFound, "order"))?;
        let body = Obj::root(&input.body)?;
        body.only(&["success_url", "cancel_url", "locale", "capture_method"])?;
        let url = |name: &str| {
            body.opt_string(name)?
                .map(|u| way_back_url(name, &u))
                .transpose()
        };
        let way_back = WayBack {
            success_url: url("success_url")?,
            cancel_url: url("cancel_url")?,
            locale: body
                .opt_string("locale")?
                .map(|l| locale(&l))
                .transpose()?
                .flatten(),
        };
        let capture_method = super::captures::capture_method_field(&body)?;
        Ok(CreateCheckout {
            order_id,
            way_back,
            capture_method,
        })
    }

    fn check(&self, ctx: &AppContext) -> Result<(), Problem> {
        let manual = self.capture_method == crate::domain::payment::CaptureMethod::Manual;
        if manual && !ctx.providers.current().captures_later() {
            return Err(Problem::rule(crate::domain::RuleViolation::new(
                "capture_method",
                "manual is not supported by the current provider",
            )));
        }
        Ok(())
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let mut tx = ctx.pool.begin().await?;
        let order = super::lock_order(&mut tx, run.merchant_id, self.order_id).await?;
        super::ensure_payable(&order, "gets a checkout page")?;
        // A page whose Pay could only fail is not made.
        super::provider_amounts::provider_takes(
            ctx.providers.current().as_ref(),
            order.amount,
            &order.currency,
            super::provider_amounts::Movement::Charge,
        )
        .map_err(CommandError::Reject)?;
        let (id, token) = (Uuid::now_v7(), new_token());
        let ttl_ms = i64::try_from(ctx.checkout.ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at = store::checkout::insert(
            &mut tx,
            (id, run.merchant_id, order.id),
            &token_hash(&token),
            ttl_ms,
            (&self.way_back, self.capture_method),
        )
        .await?;
        let body = json!({
            "id": id,
            "order_id": order.id,
            "url": format!("{}/checkout/{token}", ctx.checkout.public_url),
            "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "success_url": self.way_back.success_url,
            "cancel_url": self.way_back.cancel_url,
            "locale": self.way_back.locale,
            "capture_method": self.capture_method,
        });
        let response = json_response(201, &body, None)?;
        Ok(Step::Complete { tx, response })
    }
}
