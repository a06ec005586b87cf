//! The idempotency engine (contract section 4): every money command goes
//! through it, so the rules live in one place.
//!
//! The protocol, decided by the database so that any number of processes
//! agree:
//! 1. [`Engine::begin`] claims `(merchant, key)` (a command that makes one
//!    write and calls nobody first tries [`Engine::execute_in_one`]: claim,
//!    effect and response in one statement, when the key is new). The first request gets
//!    [`NextAction::Execute`] with a [`Claim`] holding a lease; a repeat of a
//!    completed request gets [`NextAction::Replay`]; a repeat while the first
//!    still executes waits (polling, holding no connection while it sleeps)
//!    and then replays, or is refused as in flight; another request with the
//!    same key is refused as reused.
//! 2. The command driver (`crate::commands`) records each finished step
//!    with [`Claim::record_step`] in the same transaction as the step's
//!    writes, and stores the response with [`Claim::complete`] (or
//!    [`Claim::complete_fenced`]) with the last writes. Only these make a
//!    [`Completed`]; commands never hold the claim. The one-statement
//!    forms take a [`FastWrite`], which the engine hands a fence only it
//!    makes ([`fast_write`]).
//! 3. If the process dies, the lease expires and the next retry (or the
//!    reconciler) takes the claim over and resumes from the last recorded
//!    step: a step recorded as finished is never run again.

pub mod fast_write;
pub mod fingerprint;
pub mod key;
pub mod persistence;
pub mod replay_cache;

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use tokio::time::Instant;
use uuid::Uuid;

pub use fast_write::{
    BoxedWrite, Claiming, ClaimingCompleted, Completing, FastWrite, Fence, Intent, Written,
};
pub use fingerprint::Fingerprint;
pub use key::IdempotencyKey;

pub(crate) use crate::idempotency::persistence::STARTED;
use crate::idempotency::persistence::{self as records, ClaimOutcome, Lease, NewRecord};
pub use crate::idempotency::persistence::{RecordId, StoredResponse};
use crate::metrics::Metrics;
use crate::problem::{Problem, ProblemCode};
use crate::store::StoreError;
use replay_cache::{Cached, ReplayCache};

/// Settings of the engine.
#[derive(Debug, Clone, Copy)]
pub struct EngineConfig {
    /// How long records are kept (`ONCEPAY_IDEMPOTENCY_TTL`).
    pub ttl: Duration,
    /// How long a duplicate waits for the first (`ONCEPAY_IDEMPOTENCY_WAIT`).
    pub wait: Duration,
    /// How long an executing command owns its record (`ONCEPAY_IDEMPOTENCY_LEASE`).
    pub lease: Duration,
    /// Completed records answered from memory (`ONCEPAY_REPLAY_CACHE_ENTRIES`, 0: off).
    pub replay_cache_entries: usize,
}

/// Claims keys, replays responses and hands out leases.
#[derive(Clone)]
pub struct Engine {
    /// Effects: the rejections the engine stores itself.
    pool: PgPool,
    /// Claims, lease takeovers and releases (see `store::claims_pool`).
    claims: PgPool,
    config: EngineConfig,
    metrics: Arc<Metrics>,
    cache: Arc<ReplayCache>,
}

/// One money command as the engine sees it.
pub struct IdempotentRequest {
    /// The merchant and the client's key.
    pub id: RecordId,
    /// SHA-256 over method, path and canonical body.
    pub fingerprint: Fingerprint,
    /// Which command runs, so that another process can resume it.
    pub command: &'static str,
    /// The command's parsed input, stored for resumption.
    pub input: Value,
}

/// What the caller must do next.
#[derive(Debug)]
pub enum NextAction {
    /// Run the command, starting after `claim.recovery_point()`.
    Execute(Claim),
    /// Send this stored response again, marked as replayed.
    Replay(StoredResponse),
}

/// The right to execute one command, held through a lease in the database.
#[derive(Debug)]
pub struct Claim {
    id: RecordId,
    lease: Lease,
    /// When a fresh record was claimed (before the insert, so no later than
    /// the database's own clock): its expiry is at least this plus the TTL.
    fresh_since: Option<Instant>,
    /// When this process took the lease (before the statement that took
    /// it, so no later than the database's clock): the lease lasts at
    /// least until this plus its length, and the command's provider calls
    /// end within their share of it (`provider::call::ending_by`).
    leased_at: Instant,
}

/// Proof that a command's response was stored with its last writes. Only
/// a [`Claim`] makes one, by storing the response under its fence: a
/// command cannot claim to be done without the record saying so.
#[derive(Debug)]
pub struct Completed(StoredResponse);

impl Completed {
    /// The stored response.
    pub fn into_response(self) -> StoredResponse {
        self.0
    }
}

impl Claim {
    /// A claim taken over by the reconciler, whose statement started at
    /// `leased_at`.
    pub fn resumed(id: RecordId, lease: Lease, leased_at: Instant) -> Claim {
        Claim {
            id,
            lease,
            fresh_since: None,
            leased_at,
        }
    }

    /// When this process took the lease (see the field).
    pub fn leased_at(&self) -> Instant {
        self.leased_at
    }

    /// The last step the command recorded (`started` if none).
    pub fn recovery_point(&self) -> &str {
        &self.lease.recovery_point
    }

    /// The resource an earlier step created, if any.
    pub fn resource_id(&self) -> Option<Uuid> {
        self.lease.resource_id
    }

    /// The merchant the command runs for.
    pub fn merchant_id(&self) -> Uuid {
        self.id.merchant_id
    }

    /// The client's idempotency key.
    pub fn key(&self) -> &str {
        &self.id.key
    }

    /// The fingerprint of the request that holds the claim.
    pub fn fingerprint(&self) -> &[u8] {
        &self.lease.fingerprint
    }

    /// A short hash of the key, for logs: it tells retries of one intent
    /// apart without writing the client's key down.
    pub fn key_hash(&self) -> String {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(self.id.key.as_bytes());
        crate::provider::trace::hex(&digest[..6])
    }

    /// The command's name as stored.
    pub fn command(&self) -> &str {
        &self.lease.command
    }

    /// The command's input as stored.
    pub fn input(&self) -> &Value {
        &self.lease.request
    }

    /// True while no effect has been recorded: failing now frees the key.
    pub fn is_effect_free(&self) -> bool {
        self.lease.recovery_point == STARTED
    }

    /// Completes the claim with `write`, a statement that makes the
    /// command's effect and stores `response` together under the fence.
    /// `None`: the statement wrote nothing (see [`FastWrite::write`]).
    pub async fn complete_fenced(
        &self,
        response: StoredResponse,
        write: BoxedWrite<Completing, ()>,
    ) -> Result<Option<Completed>, StoreError> {
        let fence = Completing {
            fence: self.fence(),
            response: response.clone(),
        };
        let written = write.write(fence).await?;
        Ok(written.map(|()| Completed(response)))
    }

    /// Our lease on the record, for a statement to write under.
    fn fence(&self) -> Fence {
        Fence {
            id: self.id.clone(),
            token: self.lease.token,
        }
    }

    /// Records that a step finished, inside the step's own transaction.
    pub async fn record_step(
        &mut self,
        tx: &mut PgConnection,
        point: &str,
        resource_id: Uuid,
    ) -> Result<(), StoreError> {
        records::record_step(tx, &self.id, self.lease.token, point, Some(resource_id)).await?;
        self.lease.recovery_point = point.to_string();
        self.lease.resource_id = Some(resource_id);
        Ok(())
    }

    /// Stores the response, inside the command's last transaction.
    pub async fn complete(
        &self,
        tx: &mut PgConnection,
        response: StoredResponse,
    ) -> Result<Completed, StoreError> {
        records::complete(tx, &self.id, self.lease.token, &response).await?;
        Ok(Completed(response))
    }
}

impl Engine {
    /// An engine over the shared pool.
    pub fn new(
        pool: PgPool,
        claims: PgPool,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Engine {
        Engine {
            pool,
            claims,
            cache: Arc::new(ReplayCache::new(config.replay_cache_entries)),
            config,
            metrics,
        }
    }

    /// The pool of claims (its size is exported with the main pool's).
    pub fn claims_pool(&self) -> &PgPool {
        &self.claims
    }

    /// The engine's settings.
    pub fn config(&self) -> EngineConfig {
        self.config
    }

    /// Answers a repeat of a completed command from memory, touching no
    /// database: `Ok(Some)` replays, `Err` is a key reused with another
    /// request, `Ok(None)` means the database must decide ([`Engine::begin`]).
    pub fn replay_from_memory(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
    ) -> Result<Option<StoredResponse>, Problem> {
        match self.cache.get(id, fingerprint) {
            Cached::Replay(response) => {
                self.metrics.idempotency("replayed");
                Ok(Some(StoredResponse::clone(&response)))
            }
            Cached::Mismatch => {
                self.metrics.idempotency("key_reused");
                Err(key_reused())
            }
            Cached::Unknown => Ok(None),
        }
    }

    /// The record a request would insert.
    fn new_record<'a>(&self, request: &'a IdempotentRequest) -> NewRecord<'a> {
        NewRecord {
            id: &request.id,
            fingerprint: request.fingerprint.as_bytes(),
            command: request.command,
            request: &request.input,
            lease: self.config.lease,
            ttl: self.config.ttl,
        }
    }

    /// What a record the request's statement inserts keeps of it.
    fn intent(&self, request: &IdempotentRequest) -> Intent {
        Intent {
            fingerprint: request.fingerprint,
            command: request.command,
            input: request.input.clone(),
            ttl: self.config.ttl,
        }
    }

    /// The fast path of a command that makes one write and calls nobody
    /// (create-order): claim, effect and stored response in one statement,
    /// one round trip and one synchronous commit, if the key is new.
    /// `Ok(None)`: the key has a record already (a repeat, a request in
    /// flight, an expired record, another request): nothing was written,
    /// and the caller goes through [`Engine::begin`], which decides.
    pub async fn execute_in_one(
        &self,
        request: &IdempotentRequest,
        response: StoredResponse,
        write: BoxedWrite<ClaimingCompleted, ()>,
    ) -> Result<Option<StoredResponse>, Problem> {
        let fence = ClaimingCompleted {
            id: request.id.clone(),
            intent: self.intent(request),
            response: response.clone(),
        };
        let since = Instant::now();
        if write.write(fence).await.map_err(store_problem)?.is_none() {
            return Ok(None);
        }
        self.metrics.idempotency("executed");
        // Written by this process after `since`: it lives at least the TTL
        // from then.
        self.cache.put(
            request.id.clone(),
            request.fingerprint,
            Arc::new(response.clone()),
            self.config.ttl.saturating_sub(since.elapsed()),
        );
        Ok(Some(response))
    }

    /// The fast path of a command whose first step makes one write before
    /// it calls anyone (a payment: the attempt, before the charge): the
    /// claim, the step's effect and its recovery point in one statement,
    /// one round trip and one synchronous commit, if the key is new and
    /// the step's preconditions hold. `Ok(Some)`: the claim, already at
    /// `point` with `resource`, for the driver to go on from, and what the
    /// step hands on. `Ok(None)`: nothing was written, and the caller goes
    /// through [`Engine::begin`].
    pub async fn claim_with_step<T>(
        &self,
        request: &IdempotentRequest,
        point: &'static str,
        resource: Uuid,
        write: BoxedWrite<Claiming, T>,
    ) -> Result<Option<(Claim, T)>, Problem> {
        let token = Uuid::new_v4();
        let fence = Claiming {
            fence: Fence {
                id: request.id.clone(),
                token,
            },
            intent: self.intent(request),
            lease: self.config.lease,
            point,
        };
        let claimed_at = Instant::now();
        let Some(handed_on) = write.write(fence).await.map_err(store_problem)? else {
            return Ok(None);
        };
        self.metrics.idempotency("executed");
        let claim = Claim {
            id: request.id.clone(),
            lease: Lease {
                token,
                recovery_point: point.to_string(),
                resource_id: Some(resource),
                command: request.command.to_string(),
                request: request.input.clone(),
                fingerprint: request.fingerprint.as_bytes().to_vec(),
            },
            fresh_since: Some(claimed_at),
            leased_at: claimed_at,
        };
        Ok(Some((claim, handed_on)))
    }

    /// Claims the request's key and says what to do; see the module docs.
    /// The replay cache was asked already ([`Engine::replay_from_memory`],
    /// by the HTTP layer before the request left its runtime): here the
    /// database decides.
    pub async fn begin(&self, request: &IdempotentRequest) -> Result<NextAction, Problem> {
        let deadline = Instant::now() + self.config.wait;
        let mut pause = Duration::from_millis(5);
        let new = self.new_record(request);
        loop {
            let claimed_at = Instant::now();
            if let Some(lease) = records::insert_or_reclaim(&self.claims, &new)
                .await
                .map_err(store_problem)?
            {
                self.metrics.idempotency("executed");
                return Ok(NextAction::Execute(Claim {
                    id: request.id.clone(),
                    lease,
                    fresh_since: Some(claimed_at),
                    leased_at: claimed_at,
                }));
            }
            let outcome = records::load_live(
                &self.claims,
                &request.id,
                request.fingerprint.as_bytes(),
                self.config.lease,
                self.config.ttl,
            )
            .await
            .map_err(store_problem)?;
            match outcome {
                // Deleted between our two statements (freed or swept): claim again.
                None => continue,
                Some(ClaimOutcome::Mismatch) => {
                    self.metrics.idempotency("key_reused");
                    return Err(key_reused());
                }
                Some(ClaimOutcome::Completed(response, lives_on)) => {
                    self.metrics.idempotency("replayed");
                    self.cache.put(
                        request.id.clone(),
                        request.fingerprint,
                        Arc::new(response.clone()),
                        lives_on,
                    );
                    return Ok(NextAction::Replay(response));
                }
                Some(ClaimOutcome::TookOver(lease)) => {
                    self.metrics.idempotency("resumed");
                    tracing::warn!(
                        recovery_point = %lease.recovery_point,
                        "resuming a command whose lease expired"
                    );
                    return Ok(NextAction::Execute(Claim {
                        id: request.id.clone(),
                        lease,
                        fresh_since: None,
                        leased_at: claimed_at,
                    }));
                }
                Some(ClaimOutcome::Executing) => {
                    let now = Instant::now();
                    if now >= deadline {
                        self.metrics.idempotency("in_flight");
                        return Err(in_flight());
                    }
                    // Sleep without holding a connection; back off so that
                    // many waiters do not hammer the database.
                    tokio::time::sleep(pause.min(deadline - now)).await;
                    pause = (pause * 2).min(Duration::from_millis(100));
                }
            }
        }
    }

    /// Remembers a command's stored response for the repeats that will
    /// follow. Only for records this process created: their expiry is
    /// known to be no earlier than the claim time plus the TTL.
    pub fn remember(&self, claim: &Claim, fingerprint: Fingerprint, response: &StoredResponse) {
        if let Some(since) = claim.fresh_since {
            let lives_on = self.config.ttl.saturating_sub(since.elapsed());
            self.cache.put(
                claim.id.clone(),
                fingerprint,
                Arc::new(response.clone()),
                lives_on,
            );
        }
    }

    /// Frees the key of a command that failed before recording any effect,
    /// so that a retry executes it again. Best effort: if the database is
    /// away, the lease expiring frees it too.
    pub async fn release(&self, claim: &Claim) {
        if !claim.is_effect_free() {
            return;
        }
        match records::release(&self.claims, &claim.id, claim.lease.token).await {
            Ok(true) => self.metrics.idempotency("released"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not free an idempotency key; its lease will")
            }
        }
    }

    /// Stores a business rejection as the command's response, in a
    /// transaction of its own (the rejection wrote nothing else).
    pub async fn complete_rejected(
        &self,
        claim: &Claim,
        problem: &Problem,
    ) -> Result<StoredResponse, StoreError> {
        let response = StoredResponse {
            status: problem.status,
            body: problem.body(),
            location: None,
        };
        let mut tx = self.pool.begin().await?;
        let done = claim.complete(&mut tx, response).await?;
        tx.commit().await?;
        Ok(done.into_response())
    }
}

/// `409 idempotency_key_reused`.
fn key_reused() -> Problem {
    Problem::new(ProblemCode::IdempotencyKeyReused,
        "this Idempotency-Key was used with another request (other body or endpoint); use a new key for a new intent",
    )
}

/// `409 idempotency_key_in_flight` with `Retry-After`.
pub fn in_flight() -> Problem {
    Problem::new(
        ProblemCode::IdempotencyKeyInFlight,
        "a request with this Idempotency-Key is still executing; retry after the indicated time",
    )
    .retry_after(1)
}

/// Maps a storage failure to the client's answer, keeping its cause: the
/// request middleware logs it once, with the request's id.
pub(crate) fn store_problem(e: StoreError) -> Problem {
    match e {
        StoreError::Unavailable(ref cause) => Problem::unavailable("the database").caused_by(cause),
        StoreError::LeaseLost => in_flight(),
        other => Problem::internal_from(format_args!("storage failure: {other}")),
    }
}

impl From<StoreError> for Problem {
    fn from(e: StoreError) -> Problem {
        store_problem(e)
    }
}
