//! Operational endpoints, request ids and log hygiene.

use std::process::Stdio;

use reqwest::StatusCode;
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::helpers::*;

#[tokio::test]
async fn health_readiness_metrics_and_openapi_are_served() {
    let app = spawn_app().await;
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
    assert_eq!(app.get("/readyz").await.status(), StatusCode::OK);
    app.post("/orders", "k", &order_body()).await;
    app.post("/orders", "k", &order_body()).await;
    let metrics = app.get("/metrics").await.text().await.expect("text");
    assert!(
        metrics.contains(
            "oncepay_http_requests_total{method=\"POST\",route=\"/orders\",status=\"201\"} 2"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("oncepay_http_request_duration_seconds_bucket"));
    assert!(metrics.contains("oncepay_idempotency_total{outcome=\"executed\"} 1"));
    assert!(metrics.contains("oncepay_idempotency_total{outcome=\"replayed\"} 1"));
    let doc = app.get("/openapi.yaml").await;
    assert_eq!(doc.headers()["content-type"], "text/yaml; charset=utf-8");
    let text = doc.text().await.expect("text");
    assert!(text.starts_with("openapi: 3.1"));
    for needle in [
        "Idempotency-Key",
        "Idempotent-Replayed",
        "/payments/{id}/refunds",
        "idempotency_key_in_flight",
    ] {
        assert!(text.contains(needle), "openapi.yaml lacks {needle}");
    }
}

#[tokio::test]
async fn request_ids_are_echoed_or_generated() {
    let app = spawn_app().await;
    let r = app
        .http
        .get(format!("{}/healthz", app.base))
        .header("X-Request-Id", "req-123")
        .send()
        .await
        .expect("sent");
    assert_eq!(r.headers()["x-request-id"], "req-123");
    let r = app.get("/nowhere").await;
    let generated = r.headers()["x-request-id"].to_str().expect("ascii");
    assert!(uuid::Uuid::parse_str(generated).is_ok());
}

/// Runs the real binaries with logging at debug, sends an API key, card
/// tokens and signed webhooks through them, and greps every log line.
/// Reads a child's stderr and stdout to their ends on tasks of their own.
fn drain(
    child: &mut tokio::process::Child,
) -> (
    tokio::task::JoinHandle<String>,
    tokio::task::JoinHandle<String>,
) {
    fn reader(
        pipe: Option<impl tokio::io::AsyncRead + Unpin + Send + 'static>,
    ) -> tokio::task::JoinHandle<String> {
        tokio::spawn(async move {
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text).await;
            }
            text
        })
    }
    (reader(child.stderr.take()), reader(child.stdout.take()))
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    let db_url = fresh_database_url();
    oncepay::store::prepare_database(&db_url)
        .await
        .expect("migrate");
    let db = sqlx::PgPool::connect(&db_url).await.expect("pool");
    let api_key = oncepay::api_keys::create(&db, "logs").await.expect("key");
    let serve_port = free_port();
    let sandbox_port = free_port();
    let bin = env!("CARGO_BIN_EXE_oncepay");
    let spawn = |sub: &str, env: Vec<(&str, String)>| {
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg(sub)
            .env("ONCEPAY_LOG", "debug")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("spawn")
    };
    let mut sandbox = spawn(
        "sandbox",
        vec![
            ("ONCEPAY_SANDBOX_BIND", format!("127.0.0.1:{sandbox_port}")),
            (
                "ONCEPAY_SANDBOX_WEBHOOK_URL",
                format!("http://127.0.0.1:{serve_port}/webhooks/sandbox"),
            ),
            ("ONCEPAY_SANDBOX_ASYNC_DELAY", "100ms".into()),
        ],
    );
    let mut serve = spawn(
        "serve",
        vec![
            ("DATABASE_URL", db_url.clone()),
            ("ONCEPAY_BIND", format!("127.0.0.1:{serve_port}")),
            (
                "ONCEPAY_PROVIDER_URL",
                format!("http://127.0.0.1:{sandbox_port}"),
            ),
        ],
    );
    // Both processes log at debug level: their pipes are read from the
    // start, or a process blocks on a full pipe (64 KiB) as soon as a
    // loaded machine slows the test down, and the test waits for ever.
    let serve_logs = drain(&mut serve);
    let sandbox_logs = drain(&mut sandbox);
    let base = format!("http://127.0.0.1:{serve_port}");
    let http = reqwest::Client::new();
    oncepay_testkit::ready::until_ready(
        &format!("{base}/readyz"),
        std::time::Duration::from_secs(10),
    )
    .await
    .expect("serve is ready");
    let post = |path: &str, idem: &str, body: serde_json::Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", idem)
            .json(&body)
            .send()
    };
    let order = json_of(
        post("/orders", "idem-secret-1", order_body())
            .await
            .expect("order"),
    )
    .await;
    for (i, token) in ["tok_visa+drop", "tok_async"].iter().enumerate() {
        let order = if i == 0 {
            order.clone()
        } else {
            json_of(
                post("/orders", "idem-secret-2", order_body())
                    .await
                    .expect("o"),
            )
            .await
        };
        post(
            "/payments",
            &format!("idem-pay-{i}"),
            json!({"order_id": order["id"], "payment_method": token}),
        )
        .await
        .expect("pay");
    }
    // A card: tokenized at the provider as the checkout page does, paid
    // with its token; and the same number sent to oncepay directly.
    let card = "4242 4242 4242 4242";
    let token: serde_json::Value = http
        .post(format!("http://127.0.0.1:{sandbox_port}/v1/tokens"))
        .form(&[
            ("card[number]", card),
            ("card[exp_month]", "12"),
            ("card[exp_year]", "2040"),
            ("card[cvc]", "123"),
        ])
        .send()
        .await
        .expect("tokenize")
        .json()
        .await
        .expect("a token");
    let carded = json_of(
        post("/orders", "idem-card-order", order_body())
            .await
            .expect("o"),
    )
    .await;
    let paid = post(
        "/payments",
        "idem-card-pay",
        json!({"order_id": carded["id"], "payment_method": token["id"]}),
    )
    .await
    .expect("pay");
    assert_eq!(paid.status(), 201);
    let refused = post(
        "/payments",
        "idem-card-raw",
        json!({"order_id": carded["id"], "payment_method": card}),
    )
    .await
    .expect("pay");
    assert_eq!(refused.status(), 422);
    let refused = refused.text().await.expect("body");
    assert!(
        refused.contains("payment_method") && !refused.contains("4242"),
        "{refused}"
    );
    let stored = stored_text(&db).await;
    assert!(
        !stored.contains("4242"),
        "a card number was stored: {stored}"
    );
    // A forged webhook too: its bad signature must not be echoed.
    http.post(format!("{base}/webhooks/sandbox"))
        .header("webhook-id", "evt_forged")
        .header(
            "webhook-timestamp",
            chrono::Utc::now().timestamp().to_string(),
        )
        .header("webhook-signature", "v1,Zm9yZ2VkLXNpZ25hdHVyZQ==")
        .body("{}")
        .send()
        .await
        .expect("forged");
    // A row that no longer reads (a damaged order): 500, and its cause
    // logged once, by the request middleware, with the request's id.
    let damaged = json_of(
        post("/orders", "idem-damaged", order_body())
            .await
            .expect("order"),
    )
    .await;
    sqlx::query("UPDATE orders SET items = '{\"not\": \"a list\"}' WHERE id = $1::uuid")
        .bind(damaged["id"].as_str().expect("id"))
        .execute(&db)
        .await
        .expect("damage");
    let r = http
        .get(format!(
            "{base}/orders/{}",
            damaged["id"].as_str().expect("id")
        ))
        .bearer_auth(&api_key)
        .header("X-Request-Id", "req-damaged-row")
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), reqwest::StatusCode::INTERNAL_SERVER_ERROR);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "internal_error");
    assert!(
        !problem.to_string().contains("storage failure"),
        "the cause is the log's, never the client's: {problem}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let mut logs = String::new();
    for (child, (err, out)) in [(&mut serve, serve_logs), (&mut sandbox, sandbox_logs)] {
        let pid = child.id().expect("pid").to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait()).await;
        for drained in [err, out] {
            logs += &drained.await.expect("the logs' reader");
        }
    }
    assert!(
        logs.contains("request finished"),
        "logs were captured: {logs}"
    );
    let failed: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("req-damaged-row") && l.contains("storage failure"))
        .collect();
    assert_eq!(
        failed.len(),
        1,
        "the cause is logged once, with the request id: {failed:#?}"
    );
    assert!(failed[0].contains("request failed"), "{}", failed[0]);
    // Log lines from inside a command carry the request's id too (the
    // dropped charge made the provider client log a retry).
    let retry_line = logs
        .lines()
        .find(|l| l.contains("retrying with the same key"))
        .expect("a retry was logged");
    assert!(retry_line.contains("request_id="), "{retry_line}");
    let secret_b64 = oncepay::config::DEV_WEBHOOK_SECRET.trim_start_matches("whsec_");
    for secret in [
        api_key.as_str(),
        "tok_visa",
        "tok_async",
        "Zm9yZ2VkLXNpZ25hdHVyZQ",
        secret_b64,
        "oncepay-development-webhook-secret",
        "idem-secret-1",
        "v1,",
        "4242424242424242",
        "4242 4242",
    ] {
        assert!(!logs.contains(secret), "{secret:?} appeared in the logs");
    }
}

/// `serve` with Stripe and no `ONCEPAY_STRIPE_WEBHOOK_SECRET` says at
/// start, once, what is lost without Stripe's webhooks (a refund failing
/// after it succeeded, a dispute opened or moved) and how long until the
/// books pass applies it (`ONCEPAY_BOOKS_INTERVAL`); with the secret set it
/// says nothing of the kind.
#[tokio::test]
async fn serve_with_stripe_and_no_webhook_secret_warns_what_is_lost() {
    let db_url = fresh_database_url();
    let mut logs = Vec::new();
    for secret in [None, Some(STRIPE_WEBHOOK_SECRET)] {
        let port = free_port();
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
        cmd.arg("serve")
            .env("DATABASE_URL", &db_url)
            .env("ONCEPAY_BIND", format!("127.0.0.1:{port}"))
            .env("ONCEPAY_STRIPE_SECRET_KEY", STRIPE_KEY)
            // Never called: the warning is said before anything is asked.
            .env("ONCEPAY_STRIPE_API_BASE", "http://127.0.0.1:9")
            .env("ONCEPAY_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(secret) = secret {
            cmd.env("ONCEPAY_STRIPE_WEBHOOK_SECRET", secret);
        }
        let mut serve = cmd.spawn().expect("spawn");
        let (err, out) = drain(&mut serve);
        oncepay_testkit::ready::until_ready(
            &format!("http://127.0.0.1:{port}/readyz"),
            std::time::Duration::from_secs(30),
        )
        .await
        .expect("serve is ready");
        let pid = serve.id().expect("pid").to_string();
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), serve.wait()).await;
        logs.push(err.await.expect("stderr") + &out.await.expect("stdout"));
    }
    let warning = |logs: &str| {
        logs.lines()
            .find(|l| l.contains("ONCEPAY_STRIPE_WEBHOOK_SECRET is not set"))
            .map(str::to_string)
    };
    let line = warning(&logs[0]).unwrap_or_else(|| panic!("no warning in:\n{}", logs[0]));
    for said in [
        "every Stripe webhook is refused",
        "a refund that fails after it succeeded",
        "a dispute opened or moved",
        "ONCEPAY_BOOKS_INTERVAL (1h)",
        "required in production",
    ] {
        assert!(line.contains(said), "{said:?} is not in: {line}");
    }
    assert!(line.contains("WARN"), "{line}");
    assert_eq!(warning(&logs[1]), None, "with the secret: {}", logs[1]);
}

/// The compose files cannot be run here (no Docker engine): they are kept
/// correct by reading, and by this test, which parses them and checks what
/// a first `docker compose up` would trip on.
#[test]
fn the_compose_files_parse_and_hold_together() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let check = r#"
import re, sys, yaml
readme = open('README.md').read()
documented = set(re.findall(r'^\| `(ONCEPAY_[A-Z0-9_]+)`', readme, re.M))
problems = []
for name in ['docker-compose.yml', 'docker-compose.ha.yml']:
    doc = yaml.safe_load(open(name))
    services = doc['services']
    volumes = set((doc.get('volumes') or {}).keys())
    configs = set((doc.get('configs') or {}).keys())
    for sname, s in services.items():
        deps = s.get('depends_on') or {}
        for dep in (deps if isinstance(deps, (list, dict)) else []):
            if dep not in services:
                problems.append(f'{name}: {sname} depends on unknown {dep}')
        for v in s.get('volumes') or []:
            source = v.split(':')[0]
            if not source.startswith(('.', '/')) and source not in volumes:
                problems.append(f'{name}: {sname} mounts undeclared volume {source}')
        for c in s.get('configs') or []:
            if c['source'] not in configs:
                problems.append(f'{name}: {sname} uses undeclared config {c["source"]}')
        for p in s.get('ports') or []:
            if not str(p).startswith('127.0.0.1:'):
                problems.append(f'{name}: {sname} publishes {p} beyond loopback')
        for var in (s.get('environment') or {}):
            if var.startswith('ONCEPAY_') and var not in documented:
                problems.append(f'{name}: {sname} sets {var}, which the README does not list')
        inline = ((s.get('build') or {}).get('dockerfile_inline') or '')
        if s.get('image') == 'oncepay:local' and 'ca-certificates' not in inline:
            problems.append(f'{name}: {sname} image has no CA roots (Stripe is https)')
    serve = services['oncepay']['environment']
    for var in ['ONCEPAY_PUBLIC_URL', 'ONCEPAY_PROVIDER', 'ONCEPAY_STRIPE_SECRET_KEY']:
        if var not in serve:
            problems.append(f'{name}: oncepay does not set {var}')
if 'target/' not in open('.dockerignore').read():
    problems.append('.dockerignore does not keep target/ out of the build context')
print('\n'.join(problems))
sys.exit(1 if problems else 0)
"#;
    python_passes(root, &["-c", check]);
}

/// No two modules of the service import each other, directly or round a
/// loop (`tools/module_cycles.py` reads every `crate::`, `super::` and
/// imported-module path): each concern can be read, tested and moved on
/// its own.
#[test]
fn the_service_has_no_import_cycle_between_its_modules() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    python_passes(root, &["tools/module_cycles.py", "crates/oncepay/src"]);
}
