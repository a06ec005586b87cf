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
pub const TOKEN_PREFIX: &str = "cs_";

/// A new checkout token: `cs_` + 64 hex digits (244 random bits from the
/// operating system's secure source). Only its hash is stored.
pub fn new_token() -> String {
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
}

impl Command for CreateCheckout {
    const NAME: &'static str = "create_checkout";
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let order_id = input
            .path_id
            .ok_or_else(|| Problem::not_found(ProblemCode::OrderNotFound, "order"))?;
        Obj::root(&input.body)?.only(&[])?;
        Ok(CreateCheckout { order_id })
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
        let (id, token) = (Uuid::now_v7(), new_token());
        let ttl_ms = i64::try_from(ctx.checkout.ttl.as_millis()).unwrap_or(i64::MAX);
        let expires_at = store::checkout::insert(
            &mut tx,
            id,
            run.merchant_id,
            order.id,
            &token_hash(&token),
            ttl_ms,
        )
        .await?;
        let body = json!({
            "id": id,
            "order_id": order.id,
            "url": format!("{}/checkout/{token}", ctx.checkout.public_url),
            "expires_at": expires_at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        });
        let response = json_response(201, &body, None)?;
        Ok(Step::Complete { tx, response })
    }
}
