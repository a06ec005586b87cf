//! Keys that can do only what they need, and who did what: scopes checked
//! on every endpoint (generated from the route table, so a new route cannot
//! be forgotten), and the audit trail of administrative actions, by API and
//! by the CLI, in the same transaction as the change.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay::api_keys::{Scope, Scopes};
use oncepay::http::routes::Access;

impl TestApp {
    /// A key of merchant A with these scopes.
    async fn key_with(&self, scopes: &[&str]) -> String {
        let scopes = Scopes::parse(scopes.iter().copied()).expect("scopes");
        oncepay::api_keys::create_scoped(
            &self.db,
            "merchant-a",
            scopes,
            &oncepay::audit::Actor::cli(),
        )
        .await
        .expect("key")
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        idem: &str,
        body: &Value,
    ) -> reqwest::Response {
        self.http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", idem)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    async fn audit(&self, key: &str, query: &str) -> Vec<Value> {
        let r = self
            .call(
                Method::GET,
                &format!("/audit_events{query}"),
                key,
                "-",
                &json!(null),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK);
        json_of(r).await["data"].as_array().expect("data").clone()
    }
}

#[tokio::test]
async fn every_endpoint_refuses_a_key_without_its_scope_and_consumes_nothing() {
    let app = spawn_app().await;
    let keys = [
        (Scope::Read, app.key_with(&["read"]).await),
        (Scope::Write, app.key_with(&["write"]).await),
        (Scope::Admin, app.key_with(&["admin"]).await),
    ];
    let mut checked = 0;
    for route in oncepay::http::ROUTES {
        let (path, method) = (&route.path, route.method);
        let Access::Needs(needed, _) = &route.access else {
            continue;
        };
        let concrete = path.replace("{id}", &Uuid::new_v4().to_string());
        let body = if *path == "/orders" {
            order_body()
        } else {
            json!({})
        };
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        for (scope, key) in &keys {
            let idem = format!("refused-{}", Uuid::new_v4());
            let idem = if scope == needed {
                idem.replace("refused", "allowed")
            } else {
                idem
            };
            let r = app.call(method.clone(), &concrete, key, &idem, &body).await;
            let status = r.status();
            let problem: Value = r.json().await.unwrap_or(Value::Null);
            let refused =
                status == StatusCode::FORBIDDEN && problem["code"] == "insufficient_scope";
            assert_eq!(
                refused,
                scope != needed,
                "{method} {path} with a {} key: {status} {problem}",
                scope.as_str()
            );
            if refused {
                assert!(
                    problem["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains(needed.as_str())),
                    "the refusal names the scope: {problem}"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 3 * 25, "{checked} checks");
    // Nothing a refused request sent was kept: no idempotency record, no
    // audit row, and only the allowed POST /orders made an order.
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record WHERE idempotency_key LIKE 'refused-%'")
            .await,
        0
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    // Of the allowed admin calls (unknown ids, empty bodies), only
    // POST /api_keys changed something, and it is in the trail.
    assert_eq!(
        app.count("SELECT count(*) FROM audit_event WHERE actor_type = 'api_key'")
            .await,
        1
    );
    assert_eq!(
        app.count("SELECT count(*) FROM audit_event WHERE actor_type = 'api_key' AND action = 'api_key.created'").await,
        1
    );
}

#[tokio::test]
async fn a_key_gives_no_more_than_it_has_and_old_keys_keep_every_scope() {
    let app = spawn_app().await;
    let admin_only = app.key_with(&["admin"]).await;
    let r = app
        .call(
            Method::POST,
            "/api_keys",
            &admin_only,
            "key-1",
            &json!({"scopes": ["read", "admin"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "insufficient_scope");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("read")),
        "{problem}"
    );
    // By default a new key has the creating key's scopes.
    let r = app
        .call(Method::POST, "/api_keys", &admin_only, "key-2", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["scopes"], json!(["admin"]));
    // A key with every scope gives a read-only one, which reads and does
    // nothing else.
    let r = app
        .call(
            Method::POST,
            "/api_keys",
            &app.key,
            "key-11",
            &json!({"scopes": ["read"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let reader = json_of(r).await["key"].as_str().expect("key").to_string();
    assert_eq!(
        app.call(Method::GET, "/orders", &reader, "-", &json!(null))
            .await
            .status(),
        StatusCode::OK
    );
    let r = app
        .call(Method::POST, "/orders", &reader, "o1", &order_body())
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = app
        .call(
            Method::POST,
            "/api_keys",
            &app.key,
            "key-12",
            &json!({"scopes": ["root"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // A key stored before scopes existed (no scopes given) has every one.
    let old = oncepay::api_keys::generate();
    sqlx::query(
        "INSERT INTO api_key (key_hash, merchant_id, key_prefix)
         SELECT $1, id, 'opk_old' FROM merchant WHERE name = 'merchant-a'",
    )
    .bind(&oncepay::api_keys::hash(&old)[..])
    .execute(&app.db)
    .await
    .expect("an old key");
    for (method, path) in [
        (Method::GET, "/orders"),
        (Method::GET, "/api_keys"),
        (Method::GET, "/audit_events"),
    ] {
        assert_eq!(
            app.call(method, path, &old, "-", &json!(null))
                .await
                .status(),
            StatusCode::OK,
            "{path}"
        );
    }
    assert_eq!(
        app.call(Method::POST, "/orders", &old, "o2", &order_body())
            .await
            .status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn administrative_actions_by_api_are_audited_per_merchant() {
    let app = spawn_app().await;
    let admin = app.key_with(&["read", "write", "admin"]).await;
    let admin_id: String = sqlx::query_scalar("SELECT id::text FROM api_key WHERE key_hash = $1")
        .bind(&oncepay::api_keys::hash(&admin)[..])
        .fetch_one(&app.db)
        .await
        .expect("id");
    // A key made, then a rotation (a new key, this one given an end).
    let r = app
        .call(
            Method::POST,
            "/api_keys",
            &admin,
            "key-3",
            &json!({"scopes": ["read"]}),
        )
        .await;
    let made = json_of(r).await;
    let r = app
        .call(
            Method::POST,
            "/api_keys",
            &admin,
            "key-4",
            &json!({"expire_current_in_seconds": 600}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = app
        .call(
            Method::DELETE,
            &format!("/api_keys/{}", made["id"].as_str().expect("id")),
            &admin,
            "-",
            &json!(null),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let r = app
        .call(
            Method::POST,
            "/webhook_endpoints",
            &admin,
            "we1",
            &json!({"url": "http://127.0.0.1:9/hook", "events": ["*"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let endpoint = json_of(r).await;
    // Its secret is never in the trail.
    let secret = endpoint["secret"].as_str().expect("secret").to_string();
    let order = app.create_order().await;
    app.pay(&order, "tok_visa").await;
    let events = json_of(app.get("/events?limit=1").await).await;
    let event_id = events["data"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{events}"))
        .to_string();
    let r = app
        .call(
            Method::POST,
            &format!("/events/{event_id}/redeliver"),
            &admin,
            "-",
            &json!(null),
        )
        .await;
    assert_eq!(r.status(), StatusCode::ACCEPTED);
    let r = app
        .call(
            Method::DELETE,
            &format!(
                "/webhook_endpoints/{}",
                endpoint["id"].as_str().expect("id")
            ),
            &admin,
            "-",
            &json!(null),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // Refused changes write nothing.
    let r = app
        .call(
            Method::DELETE,
            &format!("/api_keys/{}", Uuid::new_v4()),
            &admin,
            "-",
            &json!(null),
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = app
        .call(
            Method::POST,
            "/webhook_endpoints",
            &admin,
            "we2",
            &json!({"url": "ftp://x", "events": ["*"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);

    let trail = app.audit(&admin, "?limit=100").await;
    let by_api: Vec<&Value> = trail
        .iter()
        .filter(|e| e["actor_type"] == "api_key")
        .collect();
    let actions: Vec<&str> = by_api
        .iter()
        .rev()
        .map(|e| e["action"].as_str().expect("action"))
        .collect();
    assert_eq!(
        actions,
        [
            "api_key.created",
            "api_key.created",
            "api_key.rotated",
            "api_key.revoked",
            "webhook_endpoint.created",
            "event.redelivered",
            "webhook_endpoint.deleted",
        ]
    );
    for e in &by_api {
        assert_eq!(e["actor"], admin_id.as_str(), "{e}");
        assert!(
            e["request_id"].as_str().is_some_and(|r| !r.is_empty()),
            "{e}"
        );
    }
    assert_eq!(by_api[0]["target_id"], endpoint["id"]);
    let text = serde_json::to_string(&trail).expect("json");
    assert!(!text.contains(&secret), "no webhook secret in the trail");
    assert!(!text.contains(&admin), "no key in the trail");
    // Filtered by action.
    let revoked = app.audit(&admin, "?action=api_key.revoked").await;
    assert_eq!(revoked.len(), 1);
    assert_eq!(revoked[0]["target_id"], made["id"]);
    // Another merchant sees none of it.
    let other = app.other_merchant_key().await;
    let theirs = app.audit(&other, "").await;
    assert!(
        theirs.iter().all(|e| e["actor_type"] == "cli"),
        "{theirs:?}"
    );
    // Nothing in oncepay can rewrite the trail, nor can a stray statement.
    for sql in [
        "UPDATE audit_event SET action = 'x'",
        "DELETE FROM audit_event",
    ] {
        let refused = sqlx::query(sql).execute(&app.db).await;
        assert!(refused.is_err(), "{sql} must fail");
    }
}

#[tokio::test]
async fn an_action_and_its_audit_row_commit_together_or_not_at_all() {
    let app = spawn_app().await;
    let victim = app.key_with(&["read"]).await;
    let victim_id: Uuid = sqlx::query_scalar("SELECT id FROM api_key WHERE key_hash = $1")
        .bind(&oncepay::api_keys::hash(&victim)[..])
        .fetch_one(&app.db)
        .await
        .expect("id");
    // The audit insert fails (a trigger made for this test): the
    // revocation it belongs to must not happen either.
    sqlx::query(
        "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN RAISE EXCEPTION 'audit refused for the test'; END $$",
    )
    .execute(&app.db)
    .await
    .expect("function");
    sqlx::query(
        "CREATE TRIGGER refuse_audit BEFORE INSERT ON audit_event FOR EACH ROW EXECUTE FUNCTION refuse_audit()",
    )
    .execute(&app.db)
    .await
    .expect("trigger");
    let r = app
        .call(
            Method::DELETE,
            &format!("/api_keys/{victim_id}"),
            &app.key,
            "-",
            &json!(null),
        )
        .await;
    assert!(r.status().is_server_error(), "{}", r.status());
    let revoked: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT revoked_at FROM api_key WHERE id = $1")
            .bind(victim_id)
            .fetch_one(&app.db)
            .await
            .expect("row");
    assert_eq!(revoked, None, "no audit row, no revocation");
    assert_eq!(
        app.call(Method::GET, "/orders", &victim, "-", &json!(null))
            .await
            .status(),
        StatusCode::OK,
        "the key still works"
    );
}

#[tokio::test]
async fn cli_actions_are_audited_with_the_os_user() {
    let (db_url, db, key) = migrated_database_with_key().await;
    let cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_oncepay"))
            .args(args)
            .env("DATABASE_URL", &db_url)
            .env("USER", "ops-alice")
            .env("ONCEPAY_LOG", "warn")
            .output()
            .expect("oncepay runs")
    };
    let out = cli(&[
        "api-key",
        "create",
        "--merchant",
        "merchant-a",
        "--scope",
        "read,write",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(printed.contains("read,write"), "{printed}");
    let new_key = printed.lines().last().expect("the key").trim().to_string();
    let id: Uuid = sqlx::query_scalar("SELECT id FROM api_key WHERE key_hash = $1")
        .bind(&oncepay::api_keys::hash(&new_key)[..])
        .fetch_one(&db)
        .await
        .expect("stored");
    let scopes: Vec<String> = sqlx::query_scalar("SELECT scopes FROM api_key WHERE id = $1")
        .bind(id)
        .fetch_one(&db)
        .await
        .expect("scopes");
    assert_eq!(scopes, ["read", "write"]);
    let out = cli(&[
        "merchant",
        "rate-limit",
        "--merchant",
        "merchant-a",
        "--per-second",
        "50",
        "--burst",
        "100",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["api-key", "revoke", "--id", &id.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<(String, String, String, String, Value)> = sqlx::query_as(
        "SELECT actor_type, actor, action, target_id, change FROM audit_event ORDER BY id",
    )
    .fetch_all(&db)
    .await
    .expect("trail");
    let by_alice: Vec<_> = rows.iter().filter(|r| r.1 == "ops-alice").collect();
    let actions: Vec<&str> = by_alice.iter().map(|r| r.2.as_str()).collect();
    assert_eq!(
        actions,
        [
            "api_key.created",
            "merchant.rate_limit_changed",
            "api_key.revoked"
        ]
    );
    assert!(by_alice.iter().all(|r| r.0 == "cli"));
    assert_eq!(by_alice[0].3, id.to_string());
    assert_eq!(
        by_alice[1].4["after"],
        json!({"per_second": 50, "burst": 100})
    );
    // The trail as the merchant's admin key reads it.
    let listed: Value = reqwest::Client::new()
        .get(format!(
            "{}/audit_events",
            spawn_app_with(Options {
                database_url: Some(db_url.clone()),
                ..Options::default()
            })
            .await
            .base
        ))
        .bearer_auth(&key)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert!(
        listed["data"].as_array().is_some_and(|d| d.len() >= 3),
        "{listed}"
    );
}
