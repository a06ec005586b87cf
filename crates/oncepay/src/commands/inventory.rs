//! `POST /inventory/{sku}/adjustments` (AdjustInventory): stock counted in
//! or out, on the ledger (`store::ledger`) as a balance credit or debit
//! is (`commands::balances`). One step through the engine: the transfer,
//! its event, its audit record and the stored answer commit in one
//! transaction; the transfer also carries the key
//! (`ledger_transfer_one_per_key`), so after the record expired the same
//! key finds the adjustment it made instead of making another. Removing
//! more than is available is the key's answer, `409 insufficient_stock`,
//! replayed even after stock arrives.

use serde::Serialize;
use serde_json::json;
use uuid::Uuid;

use super::{
    json_response, AppContext, At, Command, CommandError, CommandInput, NoRecoveryPoint, Run, Step,
};
use crate::audit::{Action, Actor};
use crate::domain::event::{Cause, EventType};
use crate::domain::inventory::{self, Short, StockItem};
use crate::domain::ledger::stock::Code;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store;
use crate::store::ledger::{NewTransfer, Transfer, TransferError, TransferKey};

/// `409 insufficient_stock`, with each SKU short: `skus: [{sku,
/// requested, available}]`.
pub fn insufficient_stock(short: &[Short]) -> Problem {
    let names: Vec<&str> = short.iter().map(|s| s.sku.as_str()).collect();
    Problem::new(
        ProblemCode::InsufficientStock,
        format!(
            "not enough stock available of {}; nothing was reserved or changed",
            names.join(", ")
        ),
    )
    .with_member("skus", json!(short))
}

/// A SKU from the path: the order's rule for a SKU.
pub fn sku(raw: &str) -> Result<String, Problem> {
    inventory::sku("sku", raw).map_err(|v| Problem::invalid_field("sku", &v.message))
}

/// The object of `inventory.adjusted`: the item as it became, and the
/// adjustment that made it so.
#[derive(Debug, Serialize)]
struct Adjusted<'a> {
    #[serde(flatten)]
    item: &'a StockItem,
    adjustment: AdjustmentView<'a>,
}

#[derive(Debug, Serialize)]
struct AdjustmentView<'a> {
    id: Uuid,
    quantity: i64,
    reason: Option<&'a str>,
}

/// `POST /inventory/{sku}/adjustments` `{quantity, reason?}`.
pub struct AdjustInventory {
    sku: String,
    quantity: i64,
    reason: Option<String>,
    actor: Actor,
}

impl Command for AdjustInventory {
    const KIND: super::CommandKind = super::CommandKind::AdjustInventory;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let sku = sku(input
            .path_text
            .as_deref()
            .ok_or_else(|| Problem::invalid_field("sku", "is required"))?)?;
        let body = Obj::root(&input.body)?;
        body.only(&["quantity", "reason"])?;
        let quantity = inventory::adjustment(body.integer("quantity")?).map_err(Problem::rule)?;
        let reason = body.opt_string("reason")?;
        if let Some(r) = &reason {
            crate::domain::order::chars_between("reason", r, 0, inventory::REASON_MAX)
                .map_err(Problem::rule)?;
        }
        let actor = input
            .actor
            .clone()
            .ok_or_else(|| Problem::internal_from("an inventory adjustment without its actor"))?;
        Ok(AdjustInventory {
            sku,
            quantity,
            reason,
            actor,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let stock = store::inventory::account(run.merchant_id, &self.sku);
        let code = match self.quantity > 0 {
            true => Code::AdjustmentIn,
            false => Code::AdjustmentOut,
        };
        let (phase, holder_is_debit, system) = code.shape();
        let other = stock.system(system);
        let amount = self.quantity.abs();
        let mut tx = ctx.pool.begin().await?;
        if let Some(before) =
            store::ledger::by_key(&mut tx, run.merchant_id, TransferKey::Client(run.key)).await?
        {
            if before.holder_account_id != stock.id()
                || before.code != code.as_str()
                || before.amount != amount
            {
                return Err(CommandError::Reject(Problem::new(
                    ProblemCode::IdempotencyKeyReused,
                    "this Idempotency-Key made another stock movement; use a new key",
                )));
            }
            return respond(tx, &self.sku, &before);
        }
        // The first adjustment starts tracking the SKU: its stock account
        // and both system accounts its transfers meet are made here.
        let sold = stock.system(Code::Reservation.shape().2);
        store::ledger::ensure(&mut tx, &[&stock, &other, &sold]).await?;
        let (locked, voids) =
            crate::inventory::lock(&mut tx, run.merchant_id, [self.sku.as_str()], None).await?;
        let totals = locked
            .get(&self.sku)
            .map(|s| s.totals)
            .ok_or_else(|| store::Corrupt::vanished("stock account", stock.id()))?;
        let short = || {
            CommandError::Reject(insufficient_stock(&[Short {
                sku: self.sku.clone(),
                requested: amount,
                available: totals.available(),
            }]))
        };
        if holder_is_debit && totals.after_debit(phase, amount, 0).is_err() {
            return Err(short());
        }
        let transfer = store::ledger::insert(
            &mut tx,
            &NewTransfer {
                id: Uuid::now_v7(),
                holder: &stock,
                other: &other,
                holder_is_debit,
                amount,
                phase,
                pending_id: None,
                expires_at: None,
                code: code.as_str(),
                description: self.reason.as_deref(),
                payment_id: None,
                refund_id: None,
                order_id: None,
                key: Some(TransferKey::Client(run.key)),
            },
        )
        .await
        .map_err(|e| match e {
            TransferError::Insufficient => short(),
            other => CommandError::Store(other.into()),
        })?;
        crate::inventory::announce_released(&mut tx, &ctx.metrics, &voids, Cause::Command).await?;
        store::audit::record(
            &mut tx,
            run.merchant_id,
            &self.actor,
            Action::InventoryAdjusted,
            &self.sku,
            json!({"sku": self.sku, "quantity": self.quantity, "reason": self.reason}),
        )
        .await?;
        let item = item_after(&self.sku, &transfer);
        let adjusted = Adjusted {
            item: &item,
            adjustment: AdjustmentView {
                id: transfer.id,
                quantity: self.quantity,
                reason: self.reason.as_deref(),
            },
        };
        crate::events::ledger_changed(
            &mut tx,
            &ctx.metrics,
            run.merchant_id,
            EventType::InventoryAdjusted,
            transfer.id,
            &adjusted,
            Cause::Command,
        )
        .await?;
        respond(tx, &self.sku, &transfer)
    }
}

/// The item right after `transfer` (its live reservations as the
/// transfer's holder totals hold them: overdue ones were voided first).
fn item_after(sku: &str, transfer: &Transfer) -> StockItem {
    StockItem::of(sku, transfer.after.balance(0), transfer.created_at)
}

/// The `201` with the item as the adjustment left it.
fn respond(
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    sku: &str,
    transfer: &Transfer,
) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
    let item = item_after(sku, transfer);
    let location = format!("/inventory/{}", urlencoding_path(sku));
    let response = json_response(201, &item, Some(location))?;
    Ok(Step::Complete { tx, response })
}

/// A SKU as one path segment: everything but unreserved characters
/// percent-encoded.
fn urlencoding_path(sku: &str) -> String {
    let mut out = String::with_capacity(sku.len());
    for b in sku.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sku_is_one_path_segment() {
        assert_eq!(urlencoding_path("book-1_a.b~"), "book-1_a.b~");
        assert_eq!(urlencoding_path("a/b c"), "a%2Fb%20c");
        assert_eq!(urlencoding_path("é"), "%C3%A9");
    }

    #[test]
    fn a_shortage_names_each_sku() {
        let p = insufficient_stock(&[Short {
            sku: "book".into(),
            requested: 3,
            available: 1,
        }]);
        assert_eq!(p.status, 409);
        let body: serde_json::Value = serde_json::from_slice(&p.body()).expect("json");
        assert_eq!(body["code"], "insufficient_stock");
        assert_eq!(
            body["skus"],
            json!([{"sku": "book", "requested": 3, "available": 1}])
        );
    }
}
