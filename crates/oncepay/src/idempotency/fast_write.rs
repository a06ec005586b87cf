//! The fast path's one seam: a command's write made in the same statement
//! as its idempotency record's (one round trip, one commit), which the
//! engine runs under a fence only it can make.
//!
//! A [`FastWrite`] is handed one of three fences, each what the statement
//! must do to the record for the engine's guarantees to hold:
//!
//! - [`Claiming`]: insert the record under a new lease, already at the
//!   command's first recovery point ([`Engine::claim_with_step`]);
//! - [`Completing`]: complete the record held under our lease with the
//!   response ([`Claim::complete_fenced`]);
//! - [`ClaimingCompleted`]: insert the record completed with the response
//!   at once ([`Engine::execute_in_one`]).
//!
//! The fences' fields are private to the engine: a command builds the
//! statement, never the record's side of it, so it still cannot claim,
//! complete or write under a lease it does not hold.
//!
//! [`Engine::claim_with_step`]: super::Engine::claim_with_step
//! [`Engine::execute_in_one`]: super::Engine::execute_in_one
//! [`Claim::complete_fenced`]: super::Claim::complete_fenced

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use serde_json::Value;
use uuid::Uuid;

use super::{Fingerprint, RecordId, StoredResponse};
use crate::store::StoreError;

/// A command's write made in one statement with the write of its
/// idempotency record, that the engine's fence says.
pub trait FastWrite: Send {
    /// What the statement must do to the record: [`Claiming`],
    /// [`Completing`] or [`ClaimingCompleted`].
    type Fence;

    /// What the statement hands on once written (`()` for a statement
    /// that completes the command).
    type Output;

    /// Makes the write under `fence`, all of it or nothing: `Ok(None)`
    /// when it wrote nothing (the key has a record, the lease is lost, or
    /// the rows the statement was computed from have moved).
    fn write(self: Box<Self>, fence: Self::Fence) -> Written<Self::Output>;
}

/// What [`FastWrite::write`] returns.
pub type Written<T> = Pin<Box<dyn Future<Output = Result<Option<T>, StoreError>> + Send>>;

/// A [`FastWrite`] as a command hands it to the driver.
pub type BoxedWrite<F, T> = Box<dyn FastWrite<Fence = F, Output = T>>;

/// Our lease on a record: the record and the fencing token every write
/// under the lease presents.
#[derive(Debug)]
pub struct Fence {
    pub(super) id: RecordId,
    pub(super) token: Uuid,
}

impl Fence {
    /// The record.
    pub fn record(&self) -> &RecordId {
        &self.id
    }

    /// The fencing token.
    pub fn token(&self) -> Uuid {
        self.token
    }
}

/// What a record a statement inserts keeps of its request (to replay it,
/// to refuse the key with another request, to resume the command), and how
/// long it lives.
#[derive(Debug)]
pub struct Intent {
    pub(super) fingerprint: Fingerprint,
    pub(super) command: &'static str,
    pub(super) input: Value,
    pub(super) ttl: Duration,
}

impl Intent {
    /// The request's fingerprint.
    pub fn fingerprint(&self) -> &[u8] {
        self.fingerprint.as_bytes()
    }

    /// The command's name.
    pub fn command(&self) -> &'static str {
        self.command
    }

    /// The command's input.
    pub fn input(&self) -> &Value {
        &self.input
    }

    /// How long the record lives.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

/// A command's first step written with the claim of its key: the
/// statement inserts the record under [`Claiming::fence`], `executing` at
/// [`Claiming::point`], unless the key has a record (one adopted from the
/// provider's books included).
#[derive(Debug)]
pub struct Claiming {
    pub(super) fence: Fence,
    pub(super) intent: Intent,
    pub(super) lease: Duration,
    pub(super) point: &'static str,
}

impl Claiming {
    /// The record and our new lease's token.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// What the record keeps of the request.
    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// How long the lease lasts.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The recovery point the record starts at: the step is done once
    /// written.
    pub fn point(&self) -> &'static str {
        self.point
    }
}

/// A command's last write: the statement completes the record held under
/// [`Completing::fence`] with [`Completing::response`], only while the
/// lease is ours.
#[derive(Debug)]
pub struct Completing {
    pub(super) fence: Fence,
    pub(super) response: StoredResponse,
}

impl Completing {
    /// The record and our lease's token.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The response to store.
    pub fn response(&self) -> &StoredResponse {
        &self.response
    }
}

/// A whole command in one statement: the statement inserts the record
/// completed with [`ClaimingCompleted::response`] (no lease: nothing is
/// left to execute), unless the key has a record.
#[derive(Debug)]
pub struct ClaimingCompleted {
    pub(super) id: RecordId,
    pub(super) intent: Intent,
    pub(super) response: StoredResponse,
}

impl ClaimingCompleted {
    /// The record.
    pub fn record(&self) -> &RecordId {
        &self.id
    }

    /// What the record keeps of the request.
    pub fn intent(&self) -> &Intent {
        &self.intent
    }

    /// The response to store.
    pub fn response(&self) -> &StoredResponse {
        &self.response
    }
}
