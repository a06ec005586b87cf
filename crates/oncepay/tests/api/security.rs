//! Secure by default: no public secret on a public address, no order moved
//! on a webhook the provider does not confirm, and response headers fit for
//! payment data.

use std::process::Stdio;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay::http::routes::Access;

/// Starts `oncepay <subcommand>` on `0.0.0.0:PORT` and returns whether it
/// became ready, or its exit status and standard error if it stopped.
async fn start_public(
    subcommand: &str,
    port_var: &str,
    ready: &str,
    env: &[(&str, String)],
) -> Result<(), (Option<i32>, String)> {
    let port = free_port();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.arg(subcommand)
        .env(port_var, format!("0.0.0.0:{port}"))
        .env_remove("ONCEPAY_WEBHOOK_SECRET")
        .env("ONCEPAY_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = std::sync::Mutex::new(cmd.spawn().expect("spawn oncepay"));
    let client = reqwest::Client::new();
    // Whichever comes first: the process stops, or it answers ready.
    let outcome = oncepay_testkit::ready::until_some(Duration::from_secs(10), || async {
        let exited = child.lock().expect("child").try_wait().expect("wait");
        if let Some(status) = exited {
            return Some(Err(status.code()));
        }
        let up = client
            .get(format!("http://127.0.0.1:{port}{ready}"))
            .send()
            .await;
        up.is_ok_and(|r| r.status().is_success()).then_some(Ok(()))
    })
    .await
    .unwrap_or_else(|_| panic!("oncepay {subcommand} neither started nor stopped"));
    let mut child = child.into_inner().expect("child");
    match outcome {
        Ok(()) => Ok(()),
        Err(code) => {
            let mut err = String::new();
            if let Some(mut stderr) = child.stderr.take() {
                use tokio::io::AsyncReadExt;
                let _ = stderr.read_to_string(&mut err).await;
            }
            Err((code, err))
        }
    }
}

#[tokio::test]
async fn the_development_secret_is_refused_on_a_public_address() {
    let db = vec![("DATABASE_URL", fresh_database_url())];
    for (subcommand, port_var, ready) in [
        ("serve", "ONCEPAY_BIND", "/readyz"),
        ("sandbox", "ONCEPAY_SANDBOX_BIND", "/healthz"),
    ] {
        let (code, stderr) = start_public(subcommand, port_var, ready, &db)
            .await
            .expect_err("must refuse to start");
        assert_ne!(code, Some(0), "{subcommand}: {stderr}");
        assert!(
            stderr.contains("ONCEPAY_WEBHOOK_SECRET"),
            "{subcommand}: {stderr}"
        );
        assert!(
            !stderr.contains(oncepay::config::DEV_WEBHOOK_SECRET),
            "never echoed"
        );
        // Naming the public secret explicitly changes nothing.
        let mut env = db.clone();
        env.push((
            "ONCEPAY_WEBHOOK_SECRET",
            oncepay::config::DEV_WEBHOOK_SECRET.to_string(),
        ));
        assert!(start_public(subcommand, port_var, ready, &env)
            .await
            .is_err());
        // A secret of one's own starts it.
        let mut env = db.clone();
        env.push((
            "ONCEPAY_WEBHOOK_SECRET",
            "whsec_c29tZS1vdGhlci1zZWNyZXQta2V5LW9mLW91cnM=".to_string(),
        ));
        start_public(subcommand, port_var, ready, &env)
            .await
            .unwrap_or_else(|(c, e)| panic!("{subcommand} with a secret: {c:?} {e}"));
    }
}

async fn deliver_signed(app: &TestApp, event: &Value) -> Value {
    let r = post_signed_webhook(app, event).await;
    assert_eq!(r.status(), StatusCode::OK);
    json_of(r).await
}

fn succeeded_event(event_id: &str, charge: &Value, payment_id: &str) -> Value {
    json!({
        "id": event_id,
        "type": "charge.succeeded",
        "data": {"object": {
            "id": charge["id"], "object": "charge", "idempotency_key": payment_id,
            "status": "succeeded", "amount": charge["amount"], "currency": "EUR",
        }},
    })
}

#[tokio::test]
async fn a_signed_success_the_provider_does_not_confirm_changes_nothing() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
            .sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "1s")
            .serve("ONCEPAY_RECONCILE_AFTER", "0s"),
    )
    .await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async_declined").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let payment_id = payment["id"].as_str().expect("id");
    let charge = wait_for_charge_status(&app, payment_id, "pending").await;

    // Validly signed (the secret leaked), but the provider holds it pending.
    let answer = deliver_signed(&app, &succeeded_event("evt_forged", &charge, payment_id)).await;
    assert_eq!(answer["outcome"], "unconfirmed");
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "pending"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "awaiting_payment"
    );

    // A wrong amount, a wrong currency: a mismatch, no provider read needed.
    let mut wrong_amount = succeeded_event("evt_amount", &charge, payment_id);
    wrong_amount["data"]["object"]["amount"] = json!(1);
    assert_eq!(
        deliver_signed(&app, &wrong_amount).await["outcome"],
        "mismatch"
    );
    let mut wrong_currency = succeeded_event("evt_currency", &charge, payment_id);
    wrong_currency["data"]["object"]["currency"] = json!("USD");
    assert_eq!(
        deliver_signed(&app, &wrong_currency).await["outcome"],
        "mismatch"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM webhook_event WHERE outcome = 'mismatch' AND detail IS NOT NULL"
        )
        .await,
        2
    );
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE outcome = 'unconfirmed'")
            .await,
        1
    );
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "pending"
    );

    // The provider declines it; the reconciler settles from its answer.
    wait_for_charge_status(&app, payment_id, "failed").await;
    sqlx::query("UPDATE payment_attempt SET next_check_at = now()")
        .execute(&app.db)
        .await
        .expect("due");
    oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("pass");
    assert_eq!(
        app.status_of(&format!("/payments/{payment_id}")).await,
        "failed"
    );
    assert_eq!(
        app.status_of(&format!("/orders/{order_id}")).await,
        "awaiting_payment"
    );
    let metrics = app.ctx.metrics.render();
    assert!(metrics.contains("oncepay_webhook_confirmations_total{result=\"unconfirmed\"} 1"));
    assert!(metrics.contains("oncepay_webhook_confirmations_total{result=\"mismatch\"} 2"));
}

#[tokio::test]
async fn an_event_naming_another_charge_is_a_mismatch() {
    let app = spawn_app_with(
        Options::default()
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off")
            .sandbox("ONCEPAY_SANDBOX_ASYNC_DELAY", "100ms"),
    )
    .await;
    // Two orders: the event for the second names the first one's charge.
    let first = app.create_order().await;
    let (_, paid) = app.pay(&first, "tok_visa").await;
    let paid_charge =
        wait_for_charge_status(&app, paid["id"].as_str().expect("id"), "succeeded").await;
    let second = app.create_order().await;
    let (_, pending) = app.pay(&second, "tok_async").await;
    let pending_id = pending["id"].as_str().expect("id");
    let own = wait_for_charge_status(&app, pending_id, "succeeded").await;
    // The pending attempt learns its own charge id from the provider first.
    sqlx::query("UPDATE payment_attempt SET provider_charge_id = $1 WHERE id = $2::uuid")
        .bind(own["id"].as_str().expect("charge id"))
        .bind(pending_id)
        .execute(&app.db)
        .await
        .expect("charge id");
    let event = succeeded_event("evt_other", &paid_charge, pending_id);
    // Found by its key, but naming a charge that is not its own.
    let mut event = event;
    event["data"]["object"]["amount"] = own["amount"].clone();
    assert_eq!(deliver_signed(&app, &event).await["outcome"], "mismatch");
    assert_eq!(
        json_of(app.get(&format!("/payments/{pending_id}")).await).await["status"],
        "pending"
    );
}

#[tokio::test]
async fn a_genuine_sandbox_webhook_still_settles_a_payment_on_its_own() {
    // Webhooks on, the reconciler slowed to once an hour: only the webhook
    // (confirmed by one provider read) can settle it.
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (status, payment) = app.pay(&order_id, "tok_async").await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let id = payment["id"].as_str().expect("id");
    app.poll_until(&format!("/payments/{id}"), |p| p["status"] == "succeeded")
        .await;
    assert_eq!(
        json_of(app.get(&format!("/orders/{order_id}")).await).await["status"],
        "paid"
    );
    let metrics = app.ctx.metrics.render();
    // Summed over every series of the prefix (each outcome is its own).
    let value = |prefix: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next())
            .filter_map(|v| v.parse::<u64>().ok())
            .sum()
    };
    let reads = value("oncepay_provider_calls_total{operation=\"find_charge\"");
    let confirmed = value("oncepay_webhook_confirmations_total{result=\"confirmed\"}");
    println!("a tok_async payment settled by webhook cost {reads} provider read(s), {confirmed} confirmation(s)");
    assert_eq!(confirmed, 1, "one state-changing event, one confirmation");
    assert_eq!(reads, 1, "the pending event and duplicates cost no read");
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE confirmed_at IS NOT NULL")
            .await,
        1
    );
}

#[tokio::test]
async fn responses_carry_no_banner_and_are_never_cached_or_sniffed() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (_, payment) = app.pay(&order_id, "tok_visa").await;
    let id = payment["id"].as_str().expect("id");
    for r in [
        app.get(&format!("/payments/{id}")).await,
        app.get(&format!("/orders/{order_id}")).await,
        app.get("/nowhere").await,
        app.post("/orders", "k", &json!({})).await,
    ] {
        let h = r.headers();
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["cache-control"], "no-store");
        assert!(h.get("server").is_none(), "no server banner");
    }
}

/// The `WWW-Authenticate` header of `r` (empty if none).
fn challenge(r: &reqwest::Response) -> String {
    r.headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// RFC 7235 asks a `WWW-Authenticate` challenge of every `401` (issue
/// 54): missing credentials and unknown keys had none, only a refused
/// token did. Every route that takes a caller is called without one.
#[tokio::test]
async fn every_401_carries_a_bearer_challenge() {
    let app = spawn_app().await;
    let mut checked = 0;
    for route in oncepay::http::ROUTES {
        if route.access == Access::Public {
            continue;
        }
        let path = route.path.replace("{id}", &Uuid::new_v4().to_string());
        let method = Method::from_bytes(route.method.as_bytes()).expect("method");
        let r = app
            .http
            .request(method, format!("{}{path}", app.base))
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&json!({}))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{route:?}");
        assert_eq!(challenge(&r), r#"Bearer realm="oncepay""#, "{route:?}");
        assert_eq!(json_of(r).await["code"], "unauthorized", "{route:?}");
        checked += 1;
    }
    assert!(checked >= 25, "{checked} routes");
    // Credentials that authenticate nobody, in every form.
    let unknown_key = format!("opk_{}", "0".repeat(64));
    for (authorization, code, expected) in [
        (
            format!("Bearer {unknown_key}"),
            "unauthorized",
            r#"Bearer realm="oncepay""#,
        ),
        (
            "Basic dXNlcjpwYXNz".to_string(),
            "unauthorized",
            r#"Bearer realm="oncepay""#,
        ),
        (
            "Bearer ".to_string(),
            "unauthorized",
            r#"Bearer realm="oncepay""#,
        ),
        (
            "Bearer not.a.token".to_string(),
            "invalid_token",
            r#"Bearer error="invalid_token""#,
        ),
    ] {
        let r = app
            .http
            .get(format!("{}/orders", app.base))
            .header("Authorization", &authorization)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{authorization}");
        assert_eq!(challenge(&r), expected, "{authorization}");
        assert_eq!(json_of(r).await["code"], code, "{authorization}");
    }
}

/// The authentication scheme is case-insensitive (RFC 7235 section 2.1):
/// `bearer` was refused (issue 54).
#[tokio::test]
async fn the_bearer_scheme_is_matched_whatever_its_case() {
    let app = spawn_app().await;
    for scheme in ["bearer", "BEARER", "bEaReR", "Bearer "] {
        let authorization = format!("{scheme} {}", app.key);
        let r = app
            .http
            .get(format!("{}/orders", app.base))
            .header("Authorization", &authorization)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::OK, "{scheme:?}");
        let r = app
            .http
            .post(format!("{}/orders", app.base))
            .header("Authorization", &authorization)
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&order_body())
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::CREATED, "{scheme:?}");
    }
    // Another scheme, or none, is still no credential.
    for authorization in [format!("Bearerx {}", app.key), app.key.clone()] {
        let r = app
            .http
            .get(format!("{}/orders", app.base))
            .header("Authorization", authorization)
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
}

/// `403 insufficient_scope` is titled for any credential, not an API key
/// alone (a customer's token gets it too; issue 54); its `code` is the
/// same.
#[tokio::test]
async fn insufficient_scope_is_titled_for_any_credential() {
    let app = spawn_app().await;
    let read_only = oncepay::api_keys::create_scoped(
        &app.db,
        "merchant-a",
        oncepay::api_keys::Scopes::parse(["read"]).expect("scopes"),
        &oncepay::audit::Actor::cli(),
    )
    .await
    .expect("key");
    let r = app
        .http
        .get(format!("{}/api_keys", app.base))
        .bearer_auth(&read_only)
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "insufficient_scope");
    assert_eq!(
        problem["title"],
        "The credentials lack the scope this needs"
    );
}

/// Unknown API keys from one address are held to
/// `ONCEPAY_AUTH_FAILURE_RATE_LIMIT_*` (each costs a database query and
/// has no merchant whose limit could count it): past the burst, `429`
/// with `Retry-After` before the next key is looked up. Keys that
/// authenticate someone count nothing.
#[tokio::test]
async fn unknown_api_keys_are_rate_limited_by_address() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND", "1")
            .serve("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_BURST", "5"),
    )
    .await;
    for _ in 0..20 {
        assert_eq!(app.get("/orders").await.status(), StatusCode::OK);
    }
    let started = std::time::Instant::now();
    let (mut unauthorized, mut limited) = (0u64, 0u64);
    for i in 0..30 {
        let r = app
            .http
            .get(format!("{}/orders", app.base))
            .bearer_auth(format!("opk_{i:064}"))
            .send()
            .await
            .expect("sent");
        match r.status() {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(r.headers().get("retry-after").is_some());
                assert_eq!(json_of(r).await["code"], "rate_limited");
                limited += 1;
            }
            other => panic!("an unknown key answered {other}"),
        }
    }
    let most = 5 + started.elapsed().as_secs() + 1;
    assert!(
        unauthorized <= most,
        "{unauthorized} unknown keys looked up, at most {most}"
    );
    assert!(limited > 0, "no unknown key was refused before its lookup");
}
