//! Customer balances on the ledger (`store::ledger`): `POST
//! /customers/{customer_id}/balance/credits` (CreditBalance), `.../debits`
//! (ChargeBalance), `.../holds`, and `POST /balance_holds/{id}/capture`,
//! `/release`.
//!
//! Each is one step through the engine: the transfer, its event, its
//! audit record and the stored answer commit in one transaction, so the
//! transfer's id is recorded with the key that made it, and a crash leaves
//! both or neither. The transfer also carries the key
//! (`ledger_transfer_one_per_key`): after the record has expired, the same
//! key still finds the transfer it made instead of making another. A
//! refusal for funds is the command's answer, kept and replayed like a
//! success: a later credit does not turn an old key's `422` into a debit.

use serde_json::json;
use uuid::Uuid;

use super::{
    json_response, AppContext, At, Command, CommandError, CommandInput, NoRecoveryPoint, Run, Step,
};
use crate::audit::{Action, Actor};
use crate::domain::event::{Cause, EventType};
use crate::domain::ledger::balance::Code;
use crate::domain::ledger::{self, AccountRef, HoldRefusal, HoldStatus, Phase, Resolve};
use crate::domain::money::{Amount, Currency};
use crate::domain::RuleViolation;
use crate::idempotency::StoredResponse;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store;
use crate::store::balances::{self, BalanceHold, BalanceTransaction};
use crate::store::ledger::{NewTransfer, Transfer, TransferError, TransferKey};

/// The longest description kept with a transaction or hold.
const DESCRIPTION_MAX: usize = 500;

/// The longest a hold may last: 30 days.
pub const MAX_HOLD_SECONDS: i64 = 30 * 86_400;

/// A customer id from the path: 1 to 64 characters, none U+0000.
pub fn customer_id(raw: &str) -> Result<String, Problem> {
    crate::domain::order::chars_between(
        "customer_id",
        raw,
        1,
        crate::domain::order::limits::CUSTOMER_ID_MAX,
    )
    .map_err(|v| Problem::invalid_field("customer_id", &v.message))?;
    Ok(raw.to_string())
}

/// What credit, debit and hold read from their body.
struct Movement {
    customer_id: String,
    currency: Currency,
    amount: Amount,
    description: Option<String>,
}

impl Movement {
    fn parse<'a>(input: &'a CommandInput, extra: &[&str]) -> Result<(Movement, Obj<'a>), Problem> {
        let customer = input
            .path_text
            .as_deref()
            .ok_or_else(|| Problem::invalid_field("customer_id", "is required"))?;
        let customer_id = customer_id(customer)?;
        let body = Obj::root(&input.body)?;
        let mut allowed = vec!["amount", "currency", "description"];
        allowed.extend_from_slice(extra);
        body.only(&allowed)?;
        let amount = body.integer("amount")?;
        let currency = body.string("currency")?;
        let description = body.opt_string("description")?;
        let amount = Amount::try_from(amount)
            .map_err(|e| Problem::rule(RuleViolation::new("amount", e.to_string())))?;
        let currency = Currency::try_from(currency.as_str())
            .map_err(|e| Problem::rule(RuleViolation::new("currency", e.to_string())))?;
        if let Some(d) = &description {
            crate::domain::order::chars_between("description", d, 0, DESCRIPTION_MAX)
                .map_err(Problem::rule)?;
        }
        Ok((
            Movement {
                customer_id,
                currency,
                amount,
                description,
            },
            body,
        ))
    }

    fn account(&self, merchant_id: Uuid) -> AccountRef {
        balances::account(merchant_id, &self.customer_id, self.currency.as_str())
    }
}

/// `422 insufficient_funds` for `requested`, with what was available.
pub fn insufficient(requested: i64, available: i64) -> Problem {
    Problem::beyond(
        ProblemCode::InsufficientFunds,
        "amount",
        requested,
        available,
        "available on the balance",
    )
    .with_member("available", json!(available))
}

fn rejected(e: TransferError, requested: i64, available: i64) -> CommandError {
    match e {
        TransferError::Insufficient => CommandError::Reject(insufficient(requested, available)),
        TransferError::Store(e) => CommandError::Store(e),
        other => CommandError::Store(other.into()),
    }
}

/// A request whose key already made a transfer (its record expired since):
/// that transfer answers, if the request asks for the same movement.
fn made_before(
    transfer: &Transfer,
    account: &AccountRef,
    code: Code,
    amount: i64,
) -> Result<(), CommandError> {
    if transfer.holder_account_id == account.id()
        && transfer.code == code.as_str()
        && transfer.amount == amount
    {
        return Ok(());
    }
    Err(CommandError::Reject(Problem::new(
        ProblemCode::IdempotencyKeyReused,
        "this Idempotency-Key made another balance transaction; use a new key",
    )))
}

/// Credit, debit or hold: one transfer between the customer's account
/// and the merchant's system account of `code`.
async fn move_balance(
    ctx: &AppContext,
    run: Run<'_>,
    movement: &Movement,
    code: Code,
    expires_in: Option<i64>,
    actor: Option<&Actor>,
) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
    let account = movement.account(run.merchant_id);
    let (phase, holder_is_debit, system) = code.shape();
    let system = account.system(system);
    let amount = movement.amount.minor_units();
    let mut tx = ctx.pool.begin().await?;
    if let Some(before) =
        store::ledger::by_key(&mut tx, run.merchant_id, TransferKey::Client(run.key)).await?
    {
        made_before(&before, &account, code, amount)?;
        return respond(tx, ctx, &before, code).await;
    }
    let (locked, totals) =
        crate::balances::lock_and_expire(&mut tx, &ctx.metrics, &account, &system, Cause::Command)
            .await?;
    if holder_is_debit {
        totals
            .after_debit(phase, amount, 0)
            .map_err(|_| CommandError::Reject(insufficient(amount, totals.available())))?;
    }
    let expires_at = expires_in.map(|s| locked.now + chrono::Duration::seconds(s));
    let transfer = store::ledger::insert(
        &mut tx,
        &NewTransfer {
            id: Uuid::now_v7(),
            holder: &account,
            other: &system,
            holder_is_debit,
            amount,
            phase,
            pending_id: None,
            expires_at,
            code: code.as_str(),
            description: movement.description.as_deref(),
            payment_id: None,
            refund_id: None,
            order_id: None,
            key: Some(TransferKey::Client(run.key)),
        },
    )
    .await
    .map_err(|e| rejected(e, amount, totals.available()))?;
    if let Some(actor) = actor {
        let action = match code {
            Code::Credit => Action::BalanceCredited,
            Code::Hold => Action::BalanceHoldCreated,
            _ => Action::BalanceDebited,
        };
        store::audit::record(
            &mut tx,
            run.merchant_id,
            actor,
            action,
            &transfer.id.to_string(),
            json!({
                "customer_id": movement.customer_id,
                "currency": movement.currency.as_str(),
                "amount": amount,
            }),
        )
        .await?;
    }
    match code {
        Code::Hold => {
            crate::balances::hold_event(
                &mut tx,
                &ctx.metrics,
                &transfer,
                EventType::BalanceHoldCreated,
                Cause::Command,
            )
            .await?;
        }
        _ => {
            let event_type = match holder_is_debit {
                true => EventType::BalanceDebited,
                false => EventType::BalanceCredited,
            };
            let view = BalanceTransaction::from(&transfer);
            crate::events::ledger_changed(
                &mut tx,
                &ctx.metrics,
                run.merchant_id,
                event_type,
                view.id,
                &view,
                Cause::Command,
            )
            .await?;
        }
    }
    respond(tx, ctx, &transfer, code).await
}

/// The `201` of a credit, debit (the transaction) or hold (the hold).
async fn respond(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    _ctx: &AppContext,
    transfer: &Transfer,
    code: Code,
) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
    let response = match code {
        Code::Hold => {
            let pending = store::ledger::pending(
                &mut tx,
                transfer.merchant_id,
                ledger::Ledger::Balance,
                transfer.id,
            )
            .await?
            .ok_or_else(|| store::Corrupt::vanished("balance hold", transfer.id))?;
            let hold = BalanceHold::of(&pending);
            json_response(201, &hold, Some(format!("/balance_holds/{}", hold.id)))?
        }
        _ => {
            let view = BalanceTransaction::from(transfer);
            json_response(
                201,
                &view,
                Some(format!("/balance_transactions/{}", view.id)),
            )?
        }
    };
    Ok(Step::Complete { tx, response })
}

fn actor_of(input: &CommandInput) -> Result<Actor, Problem> {
    input
        .actor
        .clone()
        .ok_or_else(|| Problem::internal_from("a balance command without its actor"))
}

/// `POST /customers/{customer_id}/balance/credits`: store credit given.
pub struct CreditBalance {
    movement: Movement,
    actor: Actor,
}

impl Command for CreditBalance {
    const KIND: super::CommandKind = super::CommandKind::CreditBalance;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let (movement, _) = Movement::parse(input, &[])?;
        Ok(CreditBalance {
            movement,
            actor: actor_of(input)?,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        move_balance(
            ctx,
            run,
            &self.movement,
            Code::Credit,
            None,
            Some(&self.actor),
        )
        .await
    }
}

/// `POST /customers/{customer_id}/balance/debits`: the balance charged.
pub struct ChargeBalance {
    movement: Movement,
    actor: Actor,
}

impl Command for ChargeBalance {
    const KIND: super::CommandKind = super::CommandKind::ChargeBalance;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let (movement, _) = Movement::parse(input, &[])?;
        Ok(ChargeBalance {
            movement,
            actor: actor_of(input)?,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        move_balance(
            ctx,
            run,
            &self.movement,
            Code::Debit,
            None,
            Some(&self.actor),
        )
        .await
    }
}

/// `POST /customers/{customer_id}/balance/holds`: a hold, counted against
/// what is available until captured, released or expired.
pub struct CreateBalanceHold {
    movement: Movement,
    /// Seconds; `ONCEPAY_BALANCE_HOLD_TTL` when absent.
    expires_in: Option<i64>,
    actor: Actor,
}

impl Command for CreateBalanceHold {
    const KIND: super::CommandKind = super::CommandKind::CreateBalanceHold;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let (movement, body) = Movement::parse(input, &["expires_in"])?;
        let expires_in = match body.opt_integer("expires_in")? {
            None => None,
            Some(n) if (1..=i128::from(MAX_HOLD_SECONDS)).contains(&n) => Some(n as i64),
            Some(_) => {
                return Err(Problem::rule(RuleViolation::new(
                    "expires_in",
                    format!("must be from 1 to {MAX_HOLD_SECONDS} seconds"),
                )))
            }
        };
        Ok(CreateBalanceHold {
            movement,
            expires_in,
            actor: actor_of(input)?,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let ttl = i64::try_from(ctx.balance_hold_ttl.as_secs()).unwrap_or(MAX_HOLD_SECONDS);
        let expires_in = self.expires_in.unwrap_or(ttl);
        move_balance(
            ctx,
            run,
            &self.movement,
            Code::Hold,
            Some(expires_in),
            Some(&self.actor),
        )
        .await
    }
}

/// `POST /balance_holds/{id}/capture` and `/release`: the hold resolved,
/// once (`ledger_transfer_resolved_once`).
pub struct ResolveBalanceHold<const CAPTURE: bool> {
    hold_id: Uuid,
    amount: Option<i64>,
    actor: Actor,
}

/// `POST /balance_holds/{id}/capture` `{amount?}`.
pub type CaptureBalanceHold = ResolveBalanceHold<true>;
/// `POST /balance_holds/{id}/release`.
pub type ReleaseBalanceHold = ResolveBalanceHold<false>;

fn hold_not_found() -> Problem {
    Problem::not_found(ProblemCode::BalanceHoldNotFound, "balance hold")
}

fn refusal(e: HoldRefusal) -> Problem {
    match e {
        HoldRefusal::NotActive(status) => Problem::new(
            ProblemCode::HoldNotActive,
            format!(
                "the hold is {}; only a held hold can be resolved",
                status.as_str()
            ),
        )
        .with_member("hold_status", json!(status.as_str())),
        HoldRefusal::ExceedsHold { requested, held } => Problem::beyond(
            ProblemCode::AmountExceedsHold,
            "amount",
            requested,
            held,
            "held",
        ),
    }
}

impl<const CAPTURE: bool> ResolveBalanceHold<CAPTURE> {
    fn parse_input(input: &CommandInput) -> Result<Self, Problem> {
        let hold_id = input.path_id.ok_or_else(hold_not_found)?;
        let body = Obj::root(&input.body)?;
        if !CAPTURE {
            body.only(&[])?;
            return Ok(ResolveBalanceHold {
                hold_id,
                amount: None,
                actor: actor_of(input)?,
            });
        }
        body.only(&["amount"])?;
        let amount = body
            .opt_integer("amount")?
            .map(|n| {
                Amount::try_from(n)
                    .map(Amount::minor_units)
                    .map_err(|e| Problem::rule(RuleViolation::new("amount", e.to_string())))
            })
            .transpose()?;
        Ok(ResolveBalanceHold {
            hold_id,
            amount,
            actor: actor_of(input)?,
        })
    }

    async fn resolve(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let (code, event_type) = match CAPTURE {
            true => (Code::HoldCapture, EventType::BalanceHoldCaptured),
            false => (Code::HoldRelease, EventType::BalanceHoldReleased),
        };
        let mut tx = ctx.pool.begin().await?;
        let Some(pending) = store::ledger::pending(
            &mut tx,
            run.merchant_id,
            ledger::Ledger::Balance,
            self.hold_id,
        )
        .await?
        else {
            return Err(CommandError::Reject(hold_not_found()));
        };
        if let Some(before) =
            store::ledger::by_key(&mut tx, run.merchant_id, TransferKey::Client(run.key)).await?
        {
            if before.pending_id != Some(self.hold_id) || before.code != code.as_str() {
                return Err(CommandError::Reject(Problem::new(
                    ProblemCode::IdempotencyKeyReused,
                    "this Idempotency-Key made another balance transaction; use a new key",
                )));
            }
            return hold_answer(tx, pending.transfer.id, run.merchant_id).await;
        }
        let p = &pending.transfer;
        let account = balances::account(run.merchant_id, &p.holder, &p.unit);
        let (_, _, system) = code.shape();
        let system = account.system(system);
        crate::balances::lock_and_expire(&mut tx, &ctx.metrics, &account, &system, Cause::Command)
            .await?;
        // Read again under the lock: a release, capture or expiry that
        // committed while this waited decides the answer.
        let pending = store::ledger::pending(
            &mut tx,
            run.merchant_id,
            ledger::Ledger::Balance,
            self.hold_id,
        )
        .await?
        .ok_or_else(|| store::Corrupt::vanished("balance hold", self.hold_id))?;
        let hold = BalanceHold::of(&pending);
        let how = match CAPTURE {
            true => Resolve::Capture(self.amount),
            false => Resolve::Release,
        };
        let (phase, amount) = ledger::resolve(hold.status(), hold.amount, how)
            .map_err(|e| CommandError::Reject(refusal(e)))?;
        debug_assert!(matches!(phase, Phase::Post | Phase::Void));
        let transfer = store::ledger::insert(
            &mut tx,
            &NewTransfer {
                id: Uuid::now_v7(),
                holder: &account,
                other: &system,
                holder_is_debit: true,
                amount,
                phase,
                pending_id: Some(self.hold_id),
                expires_at: None,
                code: code.as_str(),
                description: None,
                payment_id: None,
                refund_id: None,
                order_id: None,
                key: Some(TransferKey::Client(run.key)),
            },
        )
        .await
        .map_err(|e| refused_resolution(e, &hold, amount))?;
        crate::balances::hold_event(&mut tx, &ctx.metrics, &transfer, event_type, Cause::Command)
            .await?;
        let action = match CAPTURE {
            true => Action::BalanceHoldCaptured,
            false => Action::BalanceHoldReleased,
        };
        store::audit::record(
            &mut tx,
            run.merchant_id,
            &self.actor,
            action,
            &self.hold_id.to_string(),
            json!({
                "customer_id": hold.customer_id,
                "currency": hold.currency,
                "amount": amount,
            }),
        )
        .await?;
        hold_answer(tx, self.hold_id, run.merchant_id).await
    }
}

/// The answer to a hold's resolution the database refused, as `hold`
/// read a moment before: a capture whose statement began at or after the
/// hold's deadline is refused by the trigger's clock
/// (`ledger_post_before_expiry`) though the read found it held, and the
/// answer (kept and replayed under the key) says what the database
/// decided: `expired`.
fn refused_resolution(e: TransferError, hold: &BalanceHold, amount: i64) -> CommandError {
    match e {
        TransferError::PendingExpired => {
            CommandError::Reject(refusal(HoldRefusal::NotActive(HoldStatus::Expired)))
        }
        // Under the holder's lock nothing else resolves it; the database
        // holds the rule anyway.
        TransferError::AlreadyResolved => {
            CommandError::Reject(refusal(HoldRefusal::NotActive(hold.status())))
        }
        TransferError::ExceedsPending => CommandError::Reject(refusal(HoldRefusal::ExceedsHold {
            requested: amount,
            held: hold.amount,
        })),
        other => rejected(other, amount, 0),
    }
}

/// The `200` with the hold as it now is.
async fn hold_answer(
    mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
    hold_id: Uuid,
    merchant_id: Uuid,
) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
    let pending = store::ledger::pending(&mut tx, merchant_id, ledger::Ledger::Balance, hold_id)
        .await?
        .ok_or_else(|| store::Corrupt::vanished("balance hold", hold_id))?;
    let response: StoredResponse = json_response(200, &BalanceHold::of(&pending), None)?;
    Ok(Step::Complete { tx, response })
}

impl Command for CaptureBalanceHold {
    const KIND: super::CommandKind = super::CommandKind::CaptureBalanceHold;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        Self::parse_input(input)
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        self.resolve(ctx, run).await
    }
}

impl Command for ReleaseBalanceHold {
    const KIND: super::CommandKind = super::CommandKind::ReleaseBalanceHold;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        Self::parse_input(input)
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        self.resolve(ctx, run).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held() -> BalanceHold {
        let now = chrono::Utc::now();
        BalanceHold {
            id: Uuid::now_v7(),
            customer_id: "cus_1".into(),
            currency: "EUR".into(),
            amount: 500,
            captured_amount: 0,
            status: "held",
            expires_at: now,
            created_at: now,
            updated_at: now,
        }
    }

    fn problem(e: CommandError) -> serde_json::Value {
        match e {
            CommandError::Reject(p) => serde_json::from_slice(&p.body()).expect("json"),
            other => panic!("not a refusal: {other:?}"),
        }
    }

    /// A capture read the hold held, then the database refused it for its
    /// deadline (the statement began at or after it): the answer says
    /// what the database decided, never the stale read.
    #[test]
    fn a_capture_refused_for_the_deadline_says_expired() {
        let p = problem(refused_resolution(
            TransferError::PendingExpired,
            &held(),
            500,
        ));
        assert_eq!(p["code"], "hold_not_active");
        assert_eq!(p["hold_status"], "expired");
        let p = problem(refused_resolution(
            TransferError::ExceedsPending,
            &held(),
            600,
        ));
        assert_eq!(p["code"], "amount_exceeds_hold");
        assert_eq!(p["field"], "amount");
        assert_eq!((&p["requested"], &p["allowed"]), (&json!(600), &json!(500)));
    }
}
