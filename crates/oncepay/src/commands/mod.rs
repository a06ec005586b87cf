//! Money commands, each a [`Command`] run through the idempotency engine by
//! [`run`] (from a request) or [`resume`] (from the reconciler, after a
//! crash).
//!
//! A command is a step machine: it declares its recovery points as an enum
//! ([`RecoveryPoint`]) and answers one question, "from here, what is the
//! next step?" ([`Command::step`]). The driver here owns the loop: it
//! records each finished step in the step's own transaction, under the
//! claim's fencing token, and stores the response with the last step's
//! writes. A command never sees the claim, so it cannot forget a step
//! record, write after losing its lease, or complete outside the engine.
//! The driver also decides, once for all commands, what is kept, what frees
//! the key and what waits.

pub mod api_keys;
pub mod balances;
pub mod captures;
pub mod checkout;
pub mod fast_path;
pub mod gate;
pub mod inventory;
pub mod local_runs;
pub mod orders;
pub mod payments;
pub mod provider_amounts;
pub mod provider_keys;
pub mod refunds;
pub mod settle;
pub mod webhook_endpoints;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::idempotency::persistence::{Lease, RecordId, StoredResponse};
use crate::idempotency::{
    store_problem, BoxedWrite, Claim, Claiming, ClaimingCompleted, Completed, Completing, Engine,
    IdempotentRequest, NextAction, STARTED,
};
use crate::metrics::Metrics;
use crate::problem::Problem;
use crate::provider::Providers;
use crate::store::{Corrupt, StoreError};

/// What commands, handlers and workers share.
pub struct AppContext {
    /// The database.
    pub pool: PgPool,
    /// The idempotency engine.
    pub engine: Engine,
    /// The payment providers, by name; new payments go to the current one.
    pub providers: Providers,
    /// Counters and histograms every path reports to (`/metrics`).
    pub metrics: Arc<Metrics>,
    /// Statements of payments and provider webhooks that arrive together,
    /// committed together.
    pub group_commit:
        Arc<crate::store::group_commit::GroupCommit<crate::store::payments::PaymentWrite>>,
    /// New orders that arrive together, written in one statement.
    pub order_batcher: Arc<crate::store::order_batch::OrderBatcher>,
    /// How long a payment or refund stays pending before the reconciler asks.
    pub reconcile_after: Duration,
    /// How long a payment or refund may stay pending before it raises an
    /// alarm, and when this process last looked for such rows.
    pub pending_alarm: PendingAlarm,
    /// How long a balance hold lasts when its request names no
    /// `expires_in` (`ONCEPAY_BALANCE_HOLD_TTL`).
    pub balance_hold_ttl: Duration,
    /// How long an order's stock stays reserved awaiting payment
    /// (`ONCEPAY_STOCK_RESERVATION_TTL`).
    pub stock_reservation_ttl: Duration,
    /// How many unpaid orders holding stock a customer's token may have at
    /// once (`ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS`).
    pub stock_customer_open_orders: i64,
    /// How long a payment may wait for its customer (`next_action`) before
    /// the reconciler gives up on it (`ONCEPAY_ACTION_TIMEOUT`).
    pub action_timeout: Duration,
    /// How long before a hold's deadline its reminder event is written
    /// (`ONCEPAY_CAPTURE_REMINDER`).
    pub capture_reminder: Duration,
    /// How long a provider event that would settle a charge waits for the
    /// command still executing on it (`ONCEPAY_WEBHOOK_COMMAND_WAIT`).
    pub webhook_command_wait: Duration,
    /// Commands executing in this process, for webhooks waiting on them.
    pub local_runs: local_runs::LocalRuns,
    /// Hosted checkout pages.
    pub checkout: CheckoutSettings,
    /// How long events (and their deliveries) are kept.
    pub event_retention: Duration,
    /// Closed while a gap in the database's history is reconciled with
    /// the providers' books (`books::restore_guard`).
    pub books_gate: gate::Gate,
}

/// The alarm threshold (`ONCEPAY_PENDING_ALARM`), and when this process
/// last looked for rows past it.
///
/// The look is the dearest statement of a reconciler pass: it reads
/// every row pending since `payment_attempt` was last vacuumed (its
/// partial index keeps an entry for each, live or not, and a bitmap scan
/// reads them all). At 1,000 payments a second that was 21 ms of
/// PostgreSQL; made at every pass (2 s), it doubled every other second's
/// p99, and pay held 1,211 req/s with it against 1,327 without
/// (BENCHMARKS.md, tenth round). A look is therefore due a thirtieth of
/// the threshold after the last one: an alarm fires at most that late (30
/// s of the default 15 minutes), and the oldest-pending gauge is at most
/// that old.
#[derive(Debug)]
pub struct PendingAlarm {
    after: std::time::Duration,
    looked: std::sync::Mutex<Option<std::time::Instant>>,
}

impl PendingAlarm {
    /// How many looks the threshold spans.
    const LOOKS_PER_THRESHOLD: u32 = 30;

    /// Rows pending longer than `after` raise the alarm.
    pub fn new(after: std::time::Duration) -> Self {
        PendingAlarm {
            after,
            looked: std::sync::Mutex::new(None),
        }
    }

    /// The threshold.
    pub fn after(&self) -> std::time::Duration {
        self.after
    }

    /// True when the last look was at least a thirtieth of the threshold
    /// ago, or there was none.
    pub(crate) fn due(&self) -> bool {
        let spacing = self.after / Self::LOOKS_PER_THRESHOLD;
        let looked = *self.looked.lock().unwrap_or_else(|p| p.into_inner());
        looked.is_none_or(|at| at.elapsed() >= spacing)
    }

    /// A look was made (and answered): the next is due a spacing later. A
    /// look that failed is not counted, so the next pass looks again.
    pub(crate) fn looked_now(&self) {
        *self.looked.lock().unwrap_or_else(|p| p.into_inner()) = Some(std::time::Instant::now());
    }
}

/// Settings of hosted checkout pages.
#[derive(Debug, Clone)]
pub struct CheckoutSettings {
    /// How long a checkout token works (`ONCEPAY_CHECKOUT_TTL`).
    pub ttl: Duration,
    /// The service's address as customers' browsers reach it
    /// (`ONCEPAY_PUBLIC_URL`), the base of checkout URLs.
    pub public_url: String,
}

/// A command's input as stored in its idempotency record: the id from the
/// path (if the endpoint has one) and the parsed body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommandInput {
    /// The `{id}` of the path, for commands on an existing resource.
    pub path_id: Option<Uuid>,
    /// A path parameter that is not a UUID (`{customer_id}`), for
    /// commands on what the merchant names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_text: Option<String>,
    /// The request body.
    pub body: Value,
    /// Who sent it, for commands that write the audit trail (absent in
    /// records made before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<crate::audit::Actor>,
}

/// Why a command did not complete.
#[derive(Debug)]
pub enum CommandError {
    /// A business rejection (`409 order_not_payable`, `404`...): it is the
    /// command's result, stored and replayed like a success.
    Reject(Problem),
    /// Storage failed. Effect-free, the key is freed; otherwise the record
    /// waits for a retry or the reconciler to resume it.
    Store(StoreError),
}

impl From<StoreError> for CommandError {
    fn from(e: StoreError) -> Self {
        CommandError::Store(e)
    }
}

impl From<sqlx::Error> for CommandError {
    fn from(e: sqlx::Error) -> Self {
        CommandError::Store(e.into())
    }
}

/// A point a command can be resumed from: the step before it finished and
/// was recorded. Stored by name in the idempotency record.
pub trait RecoveryPoint: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Every point of the command.
    const ALL: &'static [Self];

    /// The name stored in the record.
    fn as_str(self) -> &'static str;

    /// The point a stored name means.
    fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|p| p.as_str() == name)
    }
}

/// Declares a command's recovery points: an enum, each variant with the
/// name stored in the record, and its [`RecoveryPoint`] implementation.
macro_rules! recovery_points {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $crate::commands::RecoveryPoint for $name {
            const ALL: &'static [Self] = &[$($name::$variant,)+];

            fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }
    };
}
pub(crate) use recovery_points;

/// For a command of one step: it has no recovery point.
#[derive(Debug, Clone, Copy)]
pub enum NoRecoveryPoint {}

impl RecoveryPoint for NoRecoveryPoint {
    const ALL: &'static [Self] = &[];

    fn as_str(self) -> &'static str {
        match self {}
    }
}

/// Where a command stands when asked for its next step.
#[derive(Debug)]
pub enum At<P, M> {
    /// Nothing recorded yet: the first step.
    Start,
    /// `point` was recorded, with the resource its step created. `memo` is
    /// what that step handed on when it ran in this process; `None` after a
    /// crash or a takeover, when the step must read what it needs.
    After {
        /// The recorded point.
        point: P,
        /// The resource the recorded step created.
        resource: Uuid,
        /// What the recorded step handed on, if it ran here.
        memo: Option<M>,
    },
}

/// What a step did, for the driver to finish.
pub enum Step<P, M> {
    /// The step's writes are in `tx`: the driver records `point` (with the
    /// resource the step created) in `tx`, commits, and asks for the next.
    Record {
        /// The step's open transaction.
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        /// The point reached.
        point: P,
        /// The resource the step created.
        resource: Uuid,
        /// Handed to the next step in this process.
        memo: M,
    },
    /// The last step's writes are in `tx`: the driver stores `response` in
    /// `tx` and commits.
    Complete {
        /// The last step's open transaction.
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        /// The answer to store and send.
        response: StoredResponse,
    },
    /// As [`Step::Complete`], with one more write after the stored answer:
    /// the driver stores `response` in `tx`, then runs `last` in `tx`,
    /// then commits. For a step whose last write takes a lock many
    /// requests contend for (a flash sale's stock row), so that lock is
    /// held by that write and the commit alone. If `last` fails, nothing
    /// of `tx` is kept, the answer included; a rejection is then the
    /// key's answer as from any step.
    CompleteThenLast {
        /// The last step's open transaction.
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        /// The answer to store and send, if `last` succeeds.
        response: StoredResponse,
        /// The write that comes after the answer's.
        last: Box<dyn LastWrite>,
    },
    /// The command's effect and its completion in one statement (one round
    /// trip, one commit), which the engine runs under its fence.
    CompleteInOne {
        /// The answer to store and send.
        response: StoredResponse,
        /// The statement (see `fast_path`).
        write: BoxedWrite<Completing, ()>,
        /// If the statement may find the rows it was computed from moved
        /// (and then writes nothing): the memo the driver asks for this
        /// step again with. `None`: writing nothing means the lease is lost.
        otherwise: Option<M>,
    },
}

/// The write a step makes after its stored answer, in the same
/// transaction ([`Step::CompleteThenLast`]).
pub trait LastWrite: Send {
    /// Makes the write in `conn` (the step's transaction).
    fn write<'c>(
        self: Box<Self>,
        conn: &'c mut sqlx::PgConnection,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), CommandError>> + Send + 'c>>;
}

/// What [`Command::first_step_claiming`] finds: the step to write with the
/// claim, or `None` for the full protocol.
pub type FirstStepClaiming<P, M> = Result<Option<ClaimingStep<P, M>>, StoreError>;

/// A command's first step, to be written with the claim of its key in one
/// statement (see [`Command::first_step_claiming`]).
pub struct ClaimingStep<P, M> {
    /// The point the record starts at: the step is done once written.
    pub point: P,
    /// The resource the step creates.
    pub resource: Uuid,
    /// The statement (see `fast_path`); it hands on what the step does.
    pub write: BoxedWrite<Claiming, M>,
}

/// What a step may know of the execution it belongs to: whose it is and
/// under which key. Deliberately not the claim.
#[derive(Debug, Clone, Copy)]
pub struct Run<'a> {
    /// The merchant the command runs for.
    pub merchant_id: Uuid,
    /// The client's idempotency key.
    pub key: &'a str,
    /// The request's fingerprint.
    pub fingerprint: &'a [u8],
}

/// Declares every command the engine runs, once: each kind's variant, the
/// name stored in its idempotency record (never changed: stored records
/// hold it) and the [`Command`] that runs it. [`CommandKind`], its `ALL`,
/// its names and the dispatch of [`resume`] all come from this one list,
/// so a new command cannot be left out of resume after a crash; a const
/// check holds each command's own `KIND` to its line.
macro_rules! command_kinds {
    ($($(#[$meta:meta])* $variant:ident = $name:literal => $command:ty,)+) => {
        /// Every command the engine runs, by the name stored in its
        /// idempotency record (tokio's mini-redis `enum Command`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum CommandKind {
            $($(#[$meta])* $variant,)+
        }

        impl CommandKind {
            /// Every kind.
            pub const ALL: &'static [CommandKind] = &[$(CommandKind::$variant,)+];

            /// The name stored in the record.
            pub const fn name(self) -> &'static str {
                match self {
                    $(CommandKind::$variant => $name,)+
                }
            }

            /// The name of the command [`resume`] runs for this kind
            /// (its [`Command::NAME`]).
            pub const fn resumed_as(self) -> &'static str {
                match self {
                    $(CommandKind::$variant => <$command as Command>::NAME,)+
                }
            }
        }

        $(const _: () = assert!(
            matches!(<$command as Command>::KIND, CommandKind::$variant),
            concat!("the command of ", stringify!($variant), " names another kind")
        );)+

        /// Runs a stored command of `kind` to its end.
        async fn resume_kind(
            kind: CommandKind,
            ctx: &AppContext,
            claim: &mut Claim,
            input: &CommandInput,
        ) -> Result<StoredResponse, Drive> {
            match kind {
                $(CommandKind::$variant => resume_as::<$command>(ctx, claim, input).await,)+
            }
        }
    };
}

command_kinds! {
    /// `POST /orders`.
    CreateOrder = "create_order" => orders::CreateOrder,
    /// `POST /orders/{id}/cancel`.
    CancelOrder = "cancel_order" => orders::CancelOrder,
    /// `POST /payments` (and the checkout page's payments).
    CreatePayment = "create_payment" => payments::CreatePayment,
    /// `POST /payments/{id}/refunds`.
    CreateRefund = "create_refund" => refunds::CreateRefund,
    /// `POST /orders/{id}/checkout`.
    CreateCheckout = "create_checkout" => checkout::CreateCheckout,
    /// `POST /webhook_endpoints`.
    CreateWebhookEndpoint = "create_webhook_endpoint" => webhook_endpoints::CreateWebhookEndpoint,
    /// `POST /api_keys`.
    CreateApiKey = "create_api_key" => api_keys::CreateApiKey,
    /// `POST /customers/{customer_id}/balance/credits`.
    CreditBalance = "credit_balance" => balances::CreditBalance,
    /// `POST /customers/{customer_id}/balance/debits`.
    ChargeBalance = "charge_balance" => balances::ChargeBalance,
    /// `POST /customers/{customer_id}/balance/holds`.
    CreateBalanceHold = "create_balance_hold" => balances::CreateBalanceHold,
    /// `POST /balance_holds/{id}/capture`.
    CaptureBalanceHold = "capture_balance_hold" => balances::CaptureBalanceHold,
    /// `POST /balance_holds/{id}/release`.
    ReleaseBalanceHold = "release_balance_hold" => balances::ReleaseBalanceHold,
    /// `POST /payments/{id}/capture`.
    CapturePayment = "capture_payment" => captures::CapturePayment,
    /// `POST /payments/{id}/void`.
    VoidPayment = "void_payment" => captures::VoidPayment,
    /// `POST /inventory/{sku}/adjustments`.
    AdjustInventory = "adjust_inventory" => inventory::AdjustInventory,
}

impl CommandKind {
    /// The kind a stored name names, if any.
    pub fn parse(name: &str) -> Option<CommandKind> {
        CommandKind::ALL.iter().copied().find(|k| k.name() == name)
    }
}

/// One money command.
pub trait Command: Sized + Send + Sync {
    /// Which command this is (see [`CommandKind`]).
    const KIND: CommandKind;
    /// Stored in the record so any process can resume it.
    const NAME: &'static str = Self::KIND.name();

    /// The command's recovery points, in the order its steps reach them.
    type Point: RecoveryPoint;

    /// What a step hands on to the next when both run in one process.
    type Memo: Send;

    /// Parses input: `400` for shape, `422` for rules. Runs before any claim,
    /// so a refused request never touches the key.
    fn parse(input: &CommandInput) -> Result<Self, Problem>;

    /// Rules that depend on this process's configuration (a payment
    /// method in the current provider's form), checked after [`parse`]
    /// and before any claim, for a request only: a resumed command was
    /// checked when it was accepted.
    ///
    /// [`parse`]: Command::parse
    fn check(&self, _ctx: &AppContext) -> Result<(), Problem> {
        Ok(())
    }

    /// The whole command as one statement that also claims its key, for a
    /// command that makes one write and calls nobody (see
    /// [`Engine::execute_in_one`](crate::idempotency::Engine::execute_in_one)):
    /// the response and the statement. `None` (the default): steps only.
    fn in_one(
        &self,
        _ctx: &AppContext,
    ) -> Option<(StoredResponse, BoxedWrite<ClaimingCompleted, ()>)> {
        None
    }

    /// The first step with the claim of its key, as one statement (see
    /// [`Engine::claim_with_step`](crate::idempotency::Engine::claim_with_step)),
    /// for the common case of a new key whose step would succeed. `None`
    /// (the default): the engine's full protocol runs, and the step with
    /// it; so it does when the statement writes nothing.
    fn first_step_claiming(
        &self,
        _ctx: &AppContext,
        _merchant_id: Uuid,
    ) -> impl Future<Output = FirstStepClaiming<Self::Point, Self::Memo>> + Send {
        async { Ok(None) }
    }

    /// The next step from `at`. A business rejection is
    /// `Err(CommandError::Reject)`, stored and replayed like an answer.
    fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        at: At<Self::Point, Self::Memo>,
    ) -> impl Future<Output = Result<Step<Self::Point, Self::Memo>, CommandError>> + Send;
}

/// A command's answer and whether it was replayed.
pub struct Answer {
    /// Status, body and `Location`.
    pub response: StoredResponse,
    /// True for a repeat answered from the record.
    pub replayed: bool,
}

/// Runs a parsed command for a request, through the idempotency engine;
/// the events its changes write name the input's actor.
pub async fn run<C: Command>(
    ctx: &AppContext,
    id: RecordId,
    fingerprint: crate::idempotency::Fingerprint,
    input: &CommandInput,
    command: &C,
) -> Result<Answer, Problem> {
    crate::audit::acting_as(
        input.actor.clone(),
        run_acting(ctx, id, fingerprint, input, command),
    )
    .await
}

async fn run_acting<C: Command>(
    ctx: &AppContext,
    id: RecordId,
    fingerprint: crate::idempotency::Fingerprint,
    input: &CommandInput,
    command: &C,
) -> Result<Answer, Problem> {
    command.check(ctx)?;
    let request = IdempotentRequest {
        id,
        fingerprint,
        command: C::NAME,
        input: serde_json::to_value(input).map_err(Problem::internal_from)?,
    };
    // A repeat answerable from memory was answered by the caller before
    // it came here (`http::resources::run_command`, on the HTTP runtime):
    // the replay cache is asked once per request.
    if ctx.books_gate.is_closed() {
        return Err(gate::gate_closed());
    }
    if let Some((response, write)) = command.in_one(ctx) {
        if let Some(response) = ctx.engine.execute_in_one(&request, response, write).await? {
            return Ok(Answer {
                response,
                replayed: false,
            });
        }
    }
    let first = command
        .first_step_claiming(ctx, request.id.merchant_id)
        .await
        .map_err(store_problem)?;
    if let Some(first) = first {
        let claimed = ctx
            .engine
            .claim_with_step(&request, first.point.as_str(), first.resource, first.write)
            .await?;
        if let Some((mut claim, memo)) = claimed {
            match drive(ctx, &mut claim, command, Some(memo)).await {
                Ok(response) => {
                    ctx.engine.remember(&claim, request.fingerprint, &response);
                    return Ok(Answer {
                        response,
                        replayed: false,
                    });
                }
                // Another process resumed it: wait for its answer below.
                Err(Drive::LeaseLost) => {}
                Err(Drive::Failed(problem)) => return Err(problem),
            }
        }
    }
    // A lost lease means another process resumed this command: go back to
    // waiting, which ends in its replay. Bounded, in case leases flap.
    for _ in 0..3 {
        match ctx.engine.begin(&request).await? {
            NextAction::Replay(response) => {
                return Ok(Answer {
                    response,
                    replayed: true,
                })
            }
            NextAction::Execute(mut claim) => match drive(ctx, &mut claim, command, None).await {
                Ok(response) => {
                    ctx.engine.remember(&claim, request.fingerprint, &response);
                    return Ok(Answer {
                        response,
                        replayed: false,
                    });
                }
                Err(Drive::LeaseLost) => continue,
                Err(Drive::Failed(problem)) => return Err(problem),
            },
        }
    }
    Err(crate::idempotency::in_flight())
}

enum Drive {
    LeaseLost,
    Failed(Problem),
}

/// Executes a claimed command step by step and applies the keep/free rules;
/// `memo` is what a step already run in this process handed on.
async fn drive<C: Command>(
    ctx: &AppContext,
    claim: &mut Claim,
    command: &C,
    memo: Option<C::Memo>,
) -> Result<StoredResponse, Drive> {
    // One span per execution: which command, which key (hashed: keys may
    // carry a client's own identifiers), and where it starts from.
    let span = tracing::info_span!(
        "command",
        command = C::NAME,
        key_hash = %claim.key_hash(),
        recovery_point = %claim.recovery_point(),
    );
    // No provider call outlives the lease: together they end with its
    // share (`provider::call`), and recording what they answered fits in
    // the rest, before another process may take the command over.
    let calls_end =
        claim.leased_at() + crate::provider::call::share_of_lease(ctx.engine.config().lease);
    let executed = tracing::Instrument::instrument(
        crate::provider::call::ending_by(calls_end, steps(ctx, claim, command, memo)),
        span,
    )
    .await;
    match executed {
        Ok(done) => Ok(done.into_response()),
        Err(CommandError::Reject(problem)) => {
            match ctx.engine.complete_rejected(claim, &problem).await {
                Ok(response) => Ok(response),
                Err(StoreError::LeaseLost) => Err(Drive::LeaseLost),
                Err(e) => {
                    ctx.engine.release(claim).await;
                    Err(Drive::Failed(store_problem(e)))
                }
            }
        }
        Err(CommandError::Store(StoreError::LeaseLost)) => Err(Drive::LeaseLost),
        Err(CommandError::Store(e)) => {
            // Effect-free failures free the key; the rest wait for a resume.
            ctx.engine.release(claim).await;
            Err(Drive::Failed(store_problem(e)))
        }
    }
}

/// The step loop: asks the command for its next step from the recorded
/// point, records it or completes, until completed.
async fn steps<C: Command>(
    ctx: &AppContext,
    claim: &mut Claim,
    command: &C,
    mut memo: Option<C::Memo>,
) -> Result<Completed, CommandError> {
    // Held until the last write committed or the command failed: a webhook
    // waiting here for this command is woken when this returns.
    let mut executing = claim.resource_id().map(|r| ctx.local_runs.enter(r));
    loop {
        let at = match (claim.recovery_point(), claim.resource_id()) {
            (STARTED, _) => At::Start,
            (name, Some(resource)) => At::After {
                point: C::Point::parse(name).ok_or_else(|| {
                    StoreError::from(Corrupt::Broken(format!(
                        "{} cannot resume at {name}",
                        C::NAME
                    )))
                })?,
                resource,
                memo: memo.take(),
            },
            (name, None) => {
                return Err(StoreError::from(Corrupt::Broken(format!(
                    "{} recorded {name} without a resource",
                    C::NAME
                )))
                .into())
            }
        };
        let run = Run {
            merchant_id: claim.merchant_id(),
            key: claim.key(),
            fingerprint: claim.fingerprint(),
        };
        match command.step(ctx, run, at).await? {
            Step::Record {
                mut tx,
                point,
                resource,
                memo: next,
            } => {
                claim.record_step(&mut tx, point.as_str(), resource).await?;
                tx.commit().await?;
                if executing.is_none() {
                    executing = Some(ctx.local_runs.enter(resource));
                }
                tracing::debug!(point = point.as_str(), "step recorded");
                memo = Some(next);
            }
            Step::Complete { mut tx, response } => {
                let done = claim.complete(&mut tx, response).await?;
                tx.commit().await?;
                return Ok(done);
            }
            Step::CompleteThenLast {
                mut tx,
                response,
                last,
            } => {
                let done = claim.complete(&mut tx, response).await?;
                let started = std::time::Instant::now();
                last.write(&mut tx).await?;
                tx.commit().await?;
                ctx.metrics
                    .last_write_hold_seconds
                    .with_label_values(&[C::NAME])
                    .observe(started.elapsed().as_secs_f64());
                return Ok(done);
            }
            Step::CompleteInOne {
                response,
                write,
                otherwise,
            } => match claim.complete_fenced(response, write).await? {
                Some(done) => return Ok(done),
                None => match otherwise {
                    Some(next) => {
                        tracing::debug!(
                            "rows moved under the one-statement write; again under locks"
                        );
                        memo = Some(next);
                    }
                    None => return Err(StoreError::LeaseLost.into()),
                },
            },
        }
    }
}

/// Parses a stored input back into its command and drives it: how the
/// reconciler finishes a command whose process died, under the lease it
/// took over at `leased_at`.
pub async fn resume(
    ctx: &AppContext,
    id: RecordId,
    lease: Lease,
    leased_at: tokio::time::Instant,
) -> Result<(), Problem> {
    let mut claim = Claim::resumed(id, lease, leased_at);
    let input: CommandInput = serde_json::from_value(claim.input().clone()).map_err(|e| {
        Problem::internal_from(format_args!(
            "the stored input of {} no longer parses: {e}",
            claim.command()
        ))
    })?;
    let Some(kind) = CommandKind::parse(claim.command()) else {
        return Err(Problem::internal_from(format_args!(
            "cannot resume an unknown command {:?}",
            claim.command()
        )));
    };
    // A resumed command's events name who asked for it, as they would
    // have had it finished in its request.
    let outcome = crate::audit::acting_as(
        input.actor.clone(),
        resume_kind(kind, ctx, &mut claim, &input),
    )
    .await;
    match outcome {
        Ok(_) | Err(Drive::LeaseLost) => Ok(()),
        Err(Drive::Failed(problem)) => Err(problem),
    }
}

async fn resume_as<C: Command>(
    ctx: &AppContext,
    claim: &mut Claim,
    input: &CommandInput,
) -> Result<StoredResponse, Drive> {
    let command = C::parse(input).map_err(Drive::Failed)?;
    drive(ctx, claim, &command, None).await
}

/// The merchant's order, row-locked (step 1 of every command on an order),
/// or the `404` the command answers.
pub(crate) async fn lock_order(
    tx: &mut sqlx::PgConnection,
    merchant_id: Uuid,
    order_id: Uuid,
) -> Result<crate::domain::order::Order, CommandError> {
    crate::store::orders::lock(tx, merchant_id, order_id)
        .await?
        .ok_or_else(|| {
            CommandError::Reject(Problem::not_found(
                crate::problem::ProblemCode::OrderNotFound,
                "order",
            ))
        })
}

/// `409 order_not_payable` unless the order awaits payment; `what` says
/// what only such an order gets ("can be paid").
pub(crate) fn ensure_payable(
    order: &crate::domain::order::Order,
    what: &str,
) -> Result<(), CommandError> {
    if order.status.is_payable() {
        return Ok(());
    }
    Err(CommandError::Reject(Problem::new(
        crate::problem::ProblemCode::OrderNotPayable,
        format!(
            "the order is {}; only an order awaiting payment {what}",
            order.status.as_str()
        ),
    )))
}

/// Serialises a resource as a stored response.
pub(crate) fn json_response<T: Serialize>(
    status: u16,
    value: &T,
    location: Option<String>,
) -> Result<StoredResponse, CommandError> {
    let body = serde_json::to_vec(value).map_err(|e| {
        CommandError::Store(
            Corrupt::Json {
                what: "a response",
                source: e,
            }
            .into(),
        )
    })?;
    Ok(StoredResponse {
        status,
        body,
        location,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_kind_is_found_by_its_stored_name() {
        for &kind in CommandKind::ALL {
            assert_eq!(CommandKind::parse(kind.name()), Some(kind));
            // Resume runs the command that stores this name.
            assert_eq!(kind.resumed_as(), kind.name(), "{kind:?}");
        }
        // The names stored by every version so far: records in flight
        // across a deploy must still resume.
        assert_eq!(orders::CreateOrder::NAME, "create_order");
        assert_eq!(orders::CancelOrder::NAME, "cancel_order");
        assert_eq!(payments::CreatePayment::NAME, "create_payment");
        assert_eq!(refunds::CreateRefund::NAME, "create_refund");
        assert_eq!(checkout::CreateCheckout::NAME, "create_checkout");
        assert_eq!(
            webhook_endpoints::CreateWebhookEndpoint::NAME,
            "create_webhook_endpoint"
        );
        assert_eq!(api_keys::CreateApiKey::NAME, "create_api_key");
        assert_eq!(balances::CreditBalance::NAME, "credit_balance");
        assert_eq!(balances::ChargeBalance::NAME, "charge_balance");
        assert_eq!(balances::CreateBalanceHold::NAME, "create_balance_hold");
        assert_eq!(balances::CaptureBalanceHold::NAME, "capture_balance_hold");
        assert_eq!(balances::ReleaseBalanceHold::NAME, "release_balance_hold");
        assert_eq!(captures::CapturePayment::NAME, "capture_payment");
        assert_eq!(captures::VoidPayment::NAME, "void_payment");
        assert_eq!(CommandKind::parse("refund_everything"), None);
    }

    fn round_trip<P: RecoveryPoint + PartialEq>() {
        assert!(!P::ALL.is_empty());
        for point in P::ALL {
            assert_eq!(P::parse(point.as_str()), Some(*point));
            assert_ne!(point.as_str(), STARTED, "`started` means no point");
        }
        assert_eq!(P::parse("no_such_point"), None);
    }

    #[test]
    fn recovery_points_are_stored_by_name_and_read_back() {
        round_trip::<payments::PaymentPoint>();
        round_trip::<refunds::RefundPoint>();
        round_trip::<orders::CancelPoint>();
        round_trip::<captures::CapturePoint>();
        round_trip::<captures::VoidPoint>();
        assert!(NoRecoveryPoint::ALL.is_empty());
    }
}
