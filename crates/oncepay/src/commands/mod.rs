//! Money commands, each a [`Command`] run through the idempotency engine by
//! [`run`] (from a request) or [`resume`] (from the reconciler, after a
//! crash). A command is written as recorded steps; the driver here decides,
//! once for all commands, what is kept, what frees the key and what waits.

pub mod orders;
pub mod payments;
pub mod refunds;
pub mod settle;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;
use uuid::Uuid;

use crate::idempotency::{store_problem, Claim, Completed, Engine, IdempotentRequest, NextAction};
use crate::metrics::Metrics;
use crate::problem::Problem;
use crate::provider::PaymentProvider;
use crate::store::idempotency::{Lease, RecordId, StoredResponse};
use crate::store::StoreError;

/// What commands, handlers and workers share.
pub struct AppContext {
    /// The database.
    pub pool: PgPool,
    /// The idempotency engine.
    pub engine: Engine,
    /// The payment provider.
    pub provider: Arc<dyn PaymentProvider>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// How long a payment or refund stays pending before the reconciler asks.
    pub reconcile_after: Duration,
    /// How long a payment or refund may stay pending before it raises an alarm.
    pub pending_alarm: Duration,
}

/// A command's input as stored in its idempotency record: the id from the
/// path (if the endpoint has one) and the parsed body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CommandInput {
    /// The `{id}` of the path, for commands on an existing resource.
    pub path_id: Option<Uuid>,
    /// The request body.
    pub body: Value,
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

/// One money command.
pub trait Command: Sized + Send + Sync {
    /// Stored in the record so any process can resume it.
    const NAME: &'static str;

    /// Parses input: `400` for shape, `422` for rules. Runs before any claim,
    /// so a refused request never touches the key.
    fn parse(input: &CommandInput) -> Result<Self, Problem>;

    /// Runs the command from `claim.recovery_point()`, recording each
    /// finished step and storing the response with its last writes.
    fn execute(
        &self,
        ctx: &AppContext,
        claim: &mut Claim,
    ) -> impl Future<Output = Result<Completed, CommandError>> + Send;
}

/// A command's answer and whether it was replayed.
pub struct Answer {
    /// Status, body and `Location`.
    pub response: StoredResponse,
    /// True for a repeat answered from the record.
    pub replayed: bool,
}

/// Runs a parsed command for a request, through the idempotency engine.
pub async fn run<C: Command>(
    ctx: &AppContext,
    id: RecordId,
    fingerprint: crate::idempotency::Fingerprint,
    input: &CommandInput,
    command: &C,
) -> Result<Answer, Problem> {
    let request = IdempotentRequest {
        id,
        fingerprint,
        command: C::NAME,
        input: serde_json::to_value(input).map_err(|_| Problem::internal())?,
    };
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
            NextAction::Execute(mut claim) => match drive(ctx, &mut claim, command).await {
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

/// Executes a claimed command and applies the keep/free rules.
async fn drive<C: Command>(
    ctx: &AppContext,
    claim: &mut Claim,
    command: &C,
) -> Result<StoredResponse, Drive> {
    // One span per execution: which command, which key (hashed: keys may
    // carry a client's own identifiers), and where it starts from.
    let span = tracing::info_span!(
        "command",
        command = C::NAME,
        key_hash = %claim.key_hash(),
        recovery_point = %claim.recovery_point(),
    );
    let executed = tracing::Instrument::instrument(command.execute(ctx, claim), span).await;
    match executed {
        Ok(Completed(response)) => Ok(response),
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

/// Parses a stored input back into its command and drives it: how the
/// reconciler finishes a command whose process died.
pub async fn resume(ctx: &AppContext, id: RecordId, lease: Lease) -> Result<(), Problem> {
    let mut claim = Claim::resumed(id, lease);
    let input: CommandInput =
        serde_json::from_value(claim.input().clone()).map_err(|_| Problem::internal())?;
    let outcome = match claim.command() {
        orders::CreateOrder::NAME => {
            resume_as::<orders::CreateOrder>(ctx, &mut claim, &input).await
        }
        orders::CancelOrder::NAME => {
            resume_as::<orders::CancelOrder>(ctx, &mut claim, &input).await
        }
        payments::CreatePayment::NAME => {
            resume_as::<payments::CreatePayment>(ctx, &mut claim, &input).await
        }
        refunds::CreateRefund::NAME => {
            resume_as::<refunds::CreateRefund>(ctx, &mut claim, &input).await
        }
        other => {
            tracing::error!(command = other, "cannot resume an unknown command");
            return Err(Problem::internal());
        }
    };
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
    drive(ctx, claim, &command).await
}

/// Serialises a resource as a stored response.
pub fn json_response<T: Serialize>(
    status: u16,
    value: &T,
    location: Option<String>,
) -> Result<StoredResponse, CommandError> {
    let body = serde_json::to_vec(value).map_err(|e| {
        CommandError::Store(StoreError::Corrupt(format!("serialising a response: {e}")))
    })?;
    Ok(StoredResponse {
        status,
        body,
        location,
    })
}
