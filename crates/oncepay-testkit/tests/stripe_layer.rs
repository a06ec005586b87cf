//! The Stripe layer against a real localstripe: what the Stripe adapter's
//! tests will stand on. Each rule of Stripe the layer adds is shown by
//! counting what reached localstripe and what it holds.

use std::time::Duration;

use oncepay_testkit::localstripe::{self, LocalStripe};
use oncepay_testkit::stripe_layer::{Call, StripeFault, StripeLayer};
use serde_json::Value;

const KEY: &str = "sk_test_oncepay";

/// localstripe and the layer in front of it, or `None` (a loud skip) where
/// localstripe is not installed and not required.
async fn stack() -> Option<(LocalStripe, StripeLayer)> {
    if !localstripe::available() {
        assert!(
            std::env::var_os("ONCEPAY_REQUIRE_LOCALSTRIPE").is_none(),
            "ONCEPAY_REQUIRE_LOCALSTRIPE is set but {} is missing (make localstripe)",
            localstripe::python().display()
        );
        eprintln!("SKIPPED: no localstripe (make localstripe installs it)");
        return None;
    }
    let stripe = LocalStripe::start().await.expect("localstripe starts");
    let layer = StripeLayer::start(stripe.url()).expect("layer starts");
    Some((stripe, layer))
}

async fn post(
    base: &str,
    path: &str,
    key: Option<&str>,
    form: &str,
) -> Result<(u16, Value, bool), reqwest::Error> {
    let mut req = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(KEY)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(form.to_string());
    if let Some(key) = key {
        req = req.header("Idempotency-Key", key);
    }
    let r = req.send().await?;
    let status = r.status().as_u16();
    let replayed = r.headers().contains_key("idempotent-replayed");
    let body = r.json().await.unwrap_or(Value::Null);
    Ok((status, body, replayed))
}

/// The PaymentIntents localstripe holds.
async fn intents(stripe: &LocalStripe) -> Vec<Value> {
    let list: Value = reqwest::Client::new()
        .get(format!("{}/v1/payment_intents?limit=100", stripe.url()))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    list["data"].as_array().cloned().unwrap_or_default()
}

const INTENT: &str =
    "amount=1500&currency=eur&payment_method=pm_card_visa&metadata[oncepay_attempt_id]=a1";

#[tokio::test]
async fn a_key_replays_its_first_answer_and_refuses_other_parameters() {
    let Some((stripe, layer)) = stack().await else {
        return;
    };
    let (status, first, replayed) = post(layer.url(), "/v1/payment_intents", Some("k1"), INTENT)
        .await
        .expect("create");
    assert_eq!((status, replayed), (200, false), "{first}");
    assert_eq!(first["status"], "requires_confirmation");
    assert_eq!(first["metadata"]["oncepay_attempt_id"], "a1");
    let (status, again, replayed) = post(layer.url(), "/v1/payment_intents", Some("k1"), INTENT)
        .await
        .expect("repeat");
    assert_eq!((status, replayed), (200, true));
    assert_eq!(again["id"], first["id"], "the same intent");
    let (status, refused, _) = post(
        layer.url(),
        "/v1/payment_intents",
        Some("k1"),
        "amount=1600&currency=eur&payment_method=pm_card_visa",
    )
    .await
    .expect("other parameters");
    assert_eq!(status, 400);
    assert_eq!(refused["error"]["type"], "idempotency_error");
    assert_eq!(layer.forwarded(Call::CreateIntent), 1);
    assert_eq!(
        intents(&stripe).await.len(),
        1,
        "one intent at the provider"
    );
}

#[tokio::test]
async fn a_repeat_while_the_first_is_in_flight_is_409_and_the_first_still_lands() {
    let Some((stripe, layer)) = stack().await else {
        return;
    };
    layer.set(Call::CreateIntent, StripeFault::Stall);
    let base = layer.url().to_string();
    let first =
        tokio::spawn(async move { post(&base, "/v1/payment_intents", Some("k2"), INTENT).await });
    let held =
        oncepay_testkit::ready::until(Duration::from_secs(10), || async { layer.stalled() == 1 })
            .await;
    assert!(held.is_ok(), "the first is in flight");
    let (status, body, _) = post(layer.url(), "/v1/payment_intents", Some("k2"), INTENT)
        .await
        .expect("repeat");
    assert_eq!(status, 409);
    assert_eq!(body["error"]["code"], "idempotency_key_in_use");
    layer.heal();
    let (status, _, _) = first.await.expect("joined").expect("first");
    assert_eq!(status, 200);
    assert_eq!(intents(&stripe).await.len(), 1);
}

#[tokio::test]
async fn a_decline_is_a_card_error_and_the_intent_is_kept() {
    let Some((stripe, layer)) = stack().await else {
        return;
    };
    // localstripe declines this card when it is charged.
    let (status, pm, _) = post(
        layer.url(),
        "/v1/payment_methods",
        None,
        "type=card&card[number]=4000000000000341&card[exp_month]=12&card[exp_year]=2034&card[cvc]=123",
    )
    .await
    .expect("payment method");
    assert_eq!(status, 200, "{pm}");
    let form = format!(
        "amount=900&currency=eur&payment_method={}",
        pm["id"].as_str().expect("pm id")
    );
    let (_, intent, _) = post(layer.url(), "/v1/payment_intents", Some("k3"), &form)
        .await
        .expect("create");
    let id = intent["id"].as_str().expect("id");
    let confirm = format!("/v1/payment_intents/{id}/confirm");
    let (status, declined, _) = post(layer.url(), &confirm, Some("k3-confirm"), "")
        .await
        .expect("confirm");
    assert_eq!(status, 402);
    assert_eq!(declined["error"]["type"], "card_error");
    assert_eq!(declined["error"]["code"], "card_declined");
    assert_eq!(declined["error"]["decline_code"], "generic_decline");
    let (status, again, replayed) = post(layer.url(), &confirm, Some("k3-confirm"), "")
        .await
        .expect("repeat");
    assert_eq!(
        (status, replayed),
        (402, true),
        "the decline replayed, not retried"
    );
    assert_eq!(again, declined);
    assert_eq!(layer.forwarded(Call::Confirm), 1);
    let held = intents(&stripe).await;
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["status"], "requires_payment_method");
}

#[tokio::test]
async fn faults_before_the_provider_leave_the_key_free_and_a_lost_answer_is_replayed() {
    let Some((stripe, layer)) = stack().await else {
        return;
    };
    for (fault, status, code) in [
        (StripeFault::LockTimeout, 429, Some("lock_timeout")),
        (StripeFault::RateLimited, 429, Some("rate_limit")),
        (
            StripeFault::ServerError {
                should_retry: Some(true),
            },
            500,
            None,
        ),
        (StripeFault::Unauthorized, 401, None),
    ] {
        layer.set(Call::CreateIntent, fault.clone());
        let (got, body, _) = post(layer.url(), "/v1/payment_intents", Some("k4"), INTENT)
            .await
            .expect("sent");
        assert_eq!(got, status, "{fault:?}: {body}");
        if let Some(code) = code {
            assert_eq!(body["error"]["code"], code);
        }
    }
    assert!(
        intents(&stripe).await.is_empty(),
        "nothing reached the provider"
    );
    // The answer is lost after the effect; the retry with the key gets it.
    layer.set(Call::CreateIntent, StripeFault::DropAfterEffect);
    let lost = post(layer.url(), "/v1/payment_intents", Some("k4"), INTENT).await;
    assert!(lost.is_err(), "no answer");
    layer.heal();
    let (status, intent, replayed) = post(layer.url(), "/v1/payment_intents", Some("k4"), INTENT)
        .await
        .expect("retry");
    assert_eq!((status, replayed), (200, true));
    let held = intents(&stripe).await;
    assert_eq!(held.len(), 1, "one intent");
    assert_eq!(held[0]["id"], intent["id"]);
}

#[tokio::test]
async fn stripe_should_retry_is_sent_both_ways() {
    let Some((_stripe, layer)) = stack().await else {
        return;
    };
    for retry in [true, false] {
        layer.set(
            Call::Confirm,
            StripeFault::ServerError {
                should_retry: Some(retry),
            },
        );
        let r = reqwest::Client::new()
            .post(format!("{}/v1/payment_intents/pi_x/confirm", layer.url()))
            .bearer_auth(KEY)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status().as_u16(), 500);
        assert_eq!(
            r.headers()["stripe-should-retry"],
            if retry { "true" } else { "false" }
        );
    }
}

/// A `500` Stripe saved before any effect: replayed, with its
/// `Stripe-Should-Retry`, to every repeat of the key; the intent stays
/// unconfirmed; a new key gets through (review N4).
#[tokio::test]
async fn a_500_saved_under_a_key_is_replayed_and_only_a_new_key_gets_through() {
    let Some((stripe, layer)) = stack().await else {
        return;
    };
    let (status, intent, _) = post(layer.url(), "/v1/payment_intents", Some("k7"), INTENT)
        .await
        .expect("create");
    assert_eq!(status, 200, "{intent}");
    let confirm = format!(
        "/v1/payment_intents/{}/confirm",
        intent["id"].as_str().expect("id")
    );
    layer.set_times(
        Call::Confirm,
        StripeFault::ErrorSaved {
            should_retry: Some(false),
        },
        1,
    );
    let send = |key: &'static str| {
        let url = format!("{}{confirm}", layer.url());
        async move {
            let r = reqwest::Client::new()
                .post(url)
                .bearer_auth(KEY)
                .header("content-type", "application/x-www-form-urlencoded")
                .header("Idempotency-Key", key)
                .body("")
                .send()
                .await
                .expect("sent");
            let retry = r
                .headers()
                .get("stripe-should-retry")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let replayed = r.headers().contains_key("idempotent-replayed");
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (status, retry, replayed, body)
        }
    };
    for (n, replayed) in [(1, false), (2, true), (3, true)] {
        let (status, retry, was_replayed, body) = send("k8").await;
        assert_eq!(status, 500, "try {n}: {body}");
        assert_eq!(body["error"]["type"], "api_error");
        assert_eq!(retry.as_deref(), Some("false"), "try {n}");
        assert_eq!(was_replayed, replayed, "try {n}");
    }
    assert_eq!(
        layer.forwarded(Call::Confirm),
        0,
        "nothing reached the provider"
    );
    assert_eq!(intents(&stripe).await[0]["status"], "requires_confirmation");
    let (status, _, replayed, confirmed) = send("k9").await;
    assert_eq!((status, replayed), (200, false), "{confirmed}");
    assert_eq!(confirmed["status"], "succeeded");
    assert_eq!(layer.forwarded(Call::Confirm), 1);
}

#[tokio::test]
async fn lists_are_filtered_by_created_and_paged_as_stripe_pages_them() {
    let Some((_stripe, layer)) = stack().await else {
        return;
    };
    for key in ["c1", "c2", "c3"] {
        let (status, _, _) = post(layer.url(), "/v1/payment_intents", Some(key), INTENT)
            .await
            .expect("created");
        assert_eq!(status, 200);
    }
    let list = |query: String| {
        let url = format!("{}/v1/payment_intents?{query}", layer.url());
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(KEY)
                .send()
                .await
                .expect("list")
                .json::<Value>()
                .await
                .expect("json")
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|o| o["id"].as_str().expect("id").to_string())
            .collect()
    };
    // A window that holds them all, two at a time.
    let first = list(format!(
        "limit=2&created[gte]={}&created[lt]={}",
        now - 60,
        now + 60
    ))
    .await;
    assert_eq!(ids(&first).len(), 2);
    assert_eq!(first["has_more"], true);
    let after = ids(&first)[1].clone();
    let second = list(format!(
        "limit=2&created[gte]={}&created[lt]={}&starting_after={after}",
        now - 60,
        now + 60
    ))
    .await;
    assert_eq!(ids(&second).len(), 1);
    assert_eq!(second["has_more"], false);
    // A window before them: nothing.
    let before = list(format!("limit=100&created[lt]={}", now - 3600)).await;
    assert!(ids(&before).is_empty());
    assert_eq!(before["has_more"], false);
    assert_eq!(layer.filtered_lists(), 3);
}

/// Disputes, which localstripe lacks, are listed by the layer as Stripe
/// lists them (Disputes API, "List all disputes"): filtered by `created`
/// and `payment_intent`, newest first, paged with `starting_after` and
/// `has_more`, each as `GET /v1/disputes/{id}` shows it now; a cursor
/// naming no dispute is a `400`. Nothing reaches localstripe, so none is
/// needed.
#[tokio::test]
async fn disputes_are_listed_as_stripe_lists_them() {
    let layer = StripeLayer::start("http://127.0.0.1:9").expect("layer starts");
    let mut opened = Vec::new();
    for intent in ["pi_a", "pi_b", "pi_a"] {
        let dispute = layer.open_dispute(
            (intent, "ch_x"),
            (1000, "eur"),
            "fraudulent",
            "needs_response",
        );
        opened.push(dispute["id"].as_str().expect("id").to_string());
    }
    let list = |query: String| {
        let url = format!("{}/v1/disputes?{query}", layer.url());
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(KEY)
                .send()
                .await
                .expect("list");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.expect("json"))
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs() as i64;
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|o| o["id"].as_str().expect("id").to_string())
            .collect()
    };
    let window = format!("created[gte]={}&created[lt]={}", now - 60, now + 60);
    let (status, first) = list(format!("limit=2&{window}")).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "list");
    assert_eq!(ids(&first).len(), 2);
    assert_eq!(first["has_more"], true);
    let created: Vec<i64> = first["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|d| d["created"].as_i64().expect("created"))
        .collect();
    assert!(created[0] >= created[1], "newest first: {created:?}");
    let after = ids(&first)[1].clone();
    let (_, second) = list(format!("limit=2&{window}&starting_after={after}")).await;
    assert_eq!(ids(&second).len(), 1);
    assert_eq!(second["has_more"], false);
    let mut all = [ids(&first), ids(&second)].concat();
    all.sort();
    opened.sort();
    assert_eq!(all, opened);
    // By PaymentIntent.
    let (_, of_a) = list(format!("limit=100&payment_intent=pi_a&{window}")).await;
    assert_eq!(ids(&of_a).len(), 2);
    // A window before them: nothing.
    let (_, before) = list(format!("created[lt]={}", now - 3600)).await;
    assert!(ids(&before).is_empty());
    assert_eq!(before["has_more"], false);
    // A dispute that moved is listed as it is now.
    layer
        .set_dispute_status(&opened[0], "under_review")
        .expect("the dispute");
    let (_, moved) = list(format!("limit=100&{window}")).await;
    let shown = moved["data"]
        .as_array()
        .expect("data")
        .iter()
        .find(|d| d["id"] == opened[0].as_str())
        .cloned()
        .expect("listed");
    assert_eq!(shown["status"], "under_review");
    let (status, refused) = list("starting_after=dp_nowhere".to_string()).await;
    assert_eq!(status, 400, "{refused}");
    assert_eq!(refused["error"]["type"], "invalid_request_error");
}
