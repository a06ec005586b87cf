//! `POST /api_keys`: a merchant mints a key (and may expire the calling
//! one after an overlap). One step through the engine like every command
//! that creates something: a client that lost the answer retries with its
//! key and gets the same key back, never a second live key it never saw
//! (the stored answer keeps the key until the idempotency key expires, as
//! a webhook endpoint's secret is kept; see openapi.yaml).

use serde_json::json;

use super::{
    json_response, AppContext, At, Command, CommandError, CommandInput, NoRecoveryPoint, Run, Step,
};
use crate::api_keys::Scopes;
use crate::domain::RuleViolation;
use crate::input::Obj;
use crate::problem::{Problem, ProblemCode};
use crate::store;

/// The longest overlap a rotation may give the old key: a week.
pub(crate) const MAX_OVERLAP_SECONDS: i64 = 7 * 86_400;

/// Mint an API key.
pub struct CreateApiKey {
    /// The scopes asked for; the calling key's when absent.
    scopes: Option<Scopes>,
    /// With a value, the calling key stops working this many milliseconds
    /// from now.
    expire_current_ms: Option<i64>,
    actor: crate::audit::Actor,
}

impl CreateApiKey {
    /// The scopes the new key gets when the caller has `calling`: the ones
    /// asked for, never more than the caller's (`403 insufficient_scope`).
    pub fn scopes_within(&self, calling: Scopes) -> Result<Scopes, Problem> {
        let scopes = self.scopes.unwrap_or(calling);
        match scopes.first_outside(calling) {
            None => Ok(scopes),
            Some(beyond) => Err(Problem::new(
                ProblemCode::InsufficientScope,
                format!(
                    "scopes: the calling key lacks `{}`, so it cannot give it",
                    beyond.as_str()
                ),
            )
            .with_field("scopes")),
        }
    }

    /// Whether the calling key is to expire.
    pub fn expires_current(&self) -> bool {
        self.expire_current_ms.is_some()
    }
}

impl Command for CreateApiKey {
    const KIND: super::CommandKind = super::CommandKind::CreateApiKey;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&["expire_current_in_seconds", "scopes"])?;
        let scopes = match body.has("scopes") {
            false => None,
            true => {
                let names = body.strings("scopes")?;
                Some(
                    Scopes::parse(names.iter().map(String::as_str))
                        .map_err(|e| Problem::rule(RuleViolation::new("scopes", e)))?,
                )
            }
        };
        let expire_current_ms = match body.opt_integer("expire_current_in_seconds")? {
            None => None,
            Some(n) if (0..=i128::from(MAX_OVERLAP_SECONDS)).contains(&n) => Some(n as i64 * 1000),
            Some(_) => {
                return Err(Problem::rule(RuleViolation::new(
                    "expire_current_in_seconds",
                    format!("must be from 0 to {MAX_OVERLAP_SECONDS}"),
                )))
            }
        };
        let actor = input
            .actor
            .clone()
            .ok_or_else(|| Problem::internal_from("an API key created without its actor"))?;
        Ok(CreateApiKey {
            scopes,
            expire_current_ms,
            actor,
        })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let mut tx = ctx.pool.begin().await?;
        // The calling key, read again here rather than carried in the
        // record: a resumed command sees the same key the request did.
        let calling = match uuid::Uuid::parse_str(&self.actor.id) {
            Ok(key_id) => store::merchants::calling_key(&mut tx, run.merchant_id, key_id).await?,
            Err(_) => None,
        };
        let Some((calling_hash, calling_scopes)) = calling else {
            return Err(CommandError::Reject(Problem::new(
                ProblemCode::Unauthorized,
                "the calling API key no longer exists",
            )));
        };
        let scopes = self
            .scopes_within(calling_scopes)
            .map_err(CommandError::Reject)?;
        let key = crate::api_keys::generate();
        let hash = crate::api_keys::hash(&key);
        let new = store::merchants::NewKey {
            hash: &hash,
            prefix: &key[..crate::api_keys::PREFIX.len() + 6],
            scopes,
        };
        let expire = self.expire_current_ms.map(|ms| (&calling_hash, ms));
        let (info, _announced) =
            store::merchants::add_key_for(&mut tx, run.merchant_id, &new, expire, &self.actor)
                .await?;
        let mut body = json!(info);
        body["key"] = json!(key);
        let response = json_response(201, &body, None)?;
        Ok(Step::Complete { tx, response })
    }
}
