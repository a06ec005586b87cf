//! `POST /webhook_endpoints`: a merchant names where its events go. One
//! step, through the engine like every command that creates something: a
//! retry with the key answers the same endpoint, with the same secret
//! (the stored answer keeps it until the key expires; see openapi.yaml).

use serde_json::json;
use uuid::Uuid;

use super::{
    json_response, AppContext, At, Command, CommandError, CommandInput, NoRecoveryPoint, Run, Step,
};
use crate::domain::event::EventType;
use crate::domain::RuleViolation;
use crate::input::Obj;
use crate::problem::Problem;
use crate::standard_webhooks::WebhookSecret;
use crate::store;

/// The most endpoints' worth of types one endpoint may list (every type,
/// once, or `*`).
const MAX_TYPES: usize = 20;

/// Register a webhook endpoint.
pub struct CreateWebhookEndpoint {
    /// The URL, checked for shape here; its addresses are checked by the
    /// handler (that needs DNS) before the command runs.
    pub url: String,
    events: Vec<String>,
    actor: crate::audit::Actor,
}

impl Command for CreateWebhookEndpoint {
    const KIND: super::CommandKind = super::CommandKind::CreateWebhookEndpoint;
    type Point = NoRecoveryPoint;
    type Memo = ();

    fn parse(input: &CommandInput) -> Result<Self, Problem> {
        let body = Obj::root(&input.body)?;
        body.only(&["url", "events"])?;
        // Stored (and listed) as the URL the deliveries will call: the
        // parser's normal form (lower-case scheme and host, dot segments
        // resolved), not the text as sent.
        let url = crate::events::outbound::parse_url(&body.string("url")?)
            .map_err(|e| Problem::rule(RuleViolation::new("url", e.to_string())))?
            .to_string();
        let mut events = body.strings("events")?;
        if events.is_empty() || events.len() > MAX_TYPES {
            return Err(Problem::rule(RuleViolation::new(
                "events",
                "must list 1 to 20 event types (or \"*\" for all)",
            )));
        }
        if let Some((i, unknown)) = events
            .iter()
            .enumerate()
            .find(|(_, t)| t.as_str() != "*" && EventType::parse(t).is_none())
        {
            let known: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
            return Err(Problem::rule(RuleViolation::new(
                format!("events[{i}]"),
                format!(
                    "{unknown:?} is not an event type; known: *, {}",
                    known.join(", ")
                ),
            )));
        }
        events.sort();
        events.dedup();
        let actor = input.actor.clone().unwrap_or_else(|| crate::audit::Actor {
            kind: crate::audit::ActorKind::ApiKey,
            id: "unrecorded".into(),
            request_id: None,
            issuer: None,
        });
        Ok(CreateWebhookEndpoint { url, events, actor })
    }

    async fn step(
        &self,
        ctx: &AppContext,
        run: Run<'_>,
        _at: At<NoRecoveryPoint, ()>,
    ) -> Result<Step<NoRecoveryPoint, ()>, CommandError> {
        let secret = WebhookSecret::generate();
        let mut tx = ctx.pool.begin().await?;
        let endpoint = store::webhook_endpoints::insert(
            &mut tx,
            Uuid::now_v7(),
            run.merchant_id,
            &self.url,
            &self.events,
            secret.key(),
        )
        .await?;
        store::audit::record(
            &mut tx,
            run.merchant_id,
            &self.actor,
            crate::audit::Action::WebhookEndpointCreated,
            &endpoint.id.to_string(),
            json!({"url": endpoint.url, "events": endpoint.events}),
        )
        .await?;
        let mut body = json!(endpoint);
        body["secret"] = json!(secret.to_whsec());
        let location = format!("/webhook_endpoints/{}", endpoint.id);
        let response = json_response(201, &body, Some(location))?;
        Ok(Step::Complete { tx, response })
    }
}
