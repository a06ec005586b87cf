//! API keys: list, rotate with an overlap, revoke — a revocation that
//! takes effect in every process before it answers, although each caches
//! keys for an hour — and key creation, exactly once per Idempotency-Key
//! like every `POST` that creates something.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use oncepay::http::routes::Key;

async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    key: &str,
) -> reqwest::Response {
    http.request(method, url)
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn keys_are_listed_rotated_with_an_overlap_and_revoked() {
    let app = spawn_app().await;
    let r = app
        .http
        .post(format!("{}/api_keys", app.base))
        .bearer_auth(&app.key)
        .header("Idempotency-Key", "rotate-1")
        .json(&json!({"expire_current_in_seconds": 3600}))
        .send()
        .await
        .expect("create");
    assert_eq!(r.status(), StatusCode::CREATED);
    let created: Value = json_of(r).await;
    let new_key = created["key"].as_str().expect("key").to_string();
    assert!(new_key.starts_with("opk_"));
    // Both work during the overlap; the old one now has an expiry.
    for key in [&app.key, &new_key] {
        let r = call(
            &app.http,
            reqwest::Method::GET,
            &format!("{}/api_keys", app.base),
            key,
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let list = json_of(
        call(
            &app.http,
            reqwest::Method::GET,
            &format!("{}/api_keys", app.base),
            &new_key,
        )
        .await,
    )
    .await;
    let keys = list["data"].as_array().expect("data");
    assert_eq!(keys.len(), 2);
    assert!(
        keys.iter().all(|k| k.get("key").is_none()),
        "never the key itself"
    );
    assert_eq!(
        keys.iter().filter(|k| k["expires_at"].is_string()).count(),
        1
    );
    assert!(keys.iter().all(|k| k["last_used_at"].is_string()));
    // Revoking the old key: it stops at once, the new one goes on.
    let old_id = keys
        .iter()
        .find(|k| k["expires_at"].is_string())
        .and_then(|k| k["id"].as_str())
        .expect("old key")
        .to_string();
    let r = call(
        &app.http,
        reqwest::Method::DELETE,
        &format!("{}/api_keys/{old_id}", app.base),
        &new_key,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(json_of(r).await["revoked_at"].is_string());
    let r = call(
        &app.http,
        reqwest::Method::GET,
        &format!("{}/orders", app.base),
        &app.key,
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let again = call(
        &app.http,
        reqwest::Method::DELETE,
        &format!("{}/api_keys/{old_id}", app.base),
        &new_key,
    )
    .await;
    assert_eq!(again.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(again).await["code"], "api_key_not_found");
    // Another merchant cannot revoke this merchant's key.
    let other = app.other_merchant_key().await;
    let new_id = created["id"].as_str().expect("id");
    let r = call(
        &app.http,
        reqwest::Method::DELETE,
        &format!("{}/api_keys/{new_id}", app.base),
        &other,
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

/// A key's id, as `GET /api_keys` names it.
async fn key_id(db: &sqlx::PgPool, key: &str) -> String {
    sqlx::query_scalar("SELECT id::text FROM api_key WHERE key_hash = $1")
        .bind(&oncepay::api_keys::hash(key)[..])
        .fetch_one(db)
        .await
        .expect("id")
}

/// What the load saw: each request's send time and answer.
type Seen = std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, StatusCode)>>>;

/// Requests with `key` to `base` in a loop, recording each, until `stop`.
fn load(
    http: &reqwest::Client,
    base: &str,
    key: &str,
    seen: &Seen,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (http, url, key, seen, stop) = (
        http.clone(),
        format!("{base}/orders?limit=1"),
        key.to_string(),
        seen.clone(),
        stop.clone(),
    );
    tokio::spawn(async move {
        while !*stop.borrow() {
            let sent = std::time::Instant::now();
            let status = call(&http, reqwest::Method::GET, &url, &key).await.status();
            seen.lock().expect("seen").push((sent, status));
        }
    })
}

#[tokio::test]
async fn a_revoked_key_fails_in_every_process_from_the_moment_its_revocation_answers() {
    let (db_url, db, admin) = migrated_database_with_key().await;
    // Each process trusts a verified key for an hour: only the revocation
    // itself can make it forget.
    let mut env = serve_env(&db_url, "http://127.0.0.1:9");
    env.push(("ONCEPAY_AUTH_CACHE_TTL", "1h".into()));
    let a = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let b = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let http = reqwest::Client::new();
    for round in 0..3 {
        let victim = oncepay::api_keys::create(&db, "merchant-a")
            .await
            .expect("key");
        let id = key_id(&db, &victim).await;
        // Load on both processes with the key, four clients each.
        let seen: Seen = Default::default();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let tasks: Vec<_> = [&a.base, &b.base]
            .iter()
            .flat_map(|base| (0..4).map(|_| load(&http, base, &victim, &seen, &stopped)))
            .collect();
        // Both processes have accepted (and cached) it before it is revoked.
        let accepted = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
            seen.lock()
                .expect("seen")
                .iter()
                .filter(|(_, s)| *s == StatusCode::OK)
                .count()
                >= 40
        })
        .await;
        assert!(accepted.is_ok(), "round {round}: the key works before");
        let revoker = [&a.base, &b.base][round % 2];
        let other = [&a.base, &b.base][(round + 1) % 2];
        let r = call(
            &http,
            reqwest::Method::DELETE,
            &format!("{revoker}/api_keys/{id}"),
            &admin,
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        let answered = std::time::Instant::now();
        // The very next request, to the other process.
        let r = call(
            &http,
            reqwest::Method::GET,
            &format!("{other}/orders"),
            &victim,
        )
        .await;
        assert_eq!(
            r.status(),
            StatusCode::UNAUTHORIZED,
            "round {round}: the other process accepted the key right after its revocation answered"
        );
        // The load goes on until it has sent plenty after the answer.
        let enough = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
            seen.lock()
                .expect("seen")
                .iter()
                .filter(|(sent, _)| *sent > answered)
                .count()
                >= 200
        })
        .await;
        stop.send(true).expect("stop");
        for task in tasks {
            task.await.expect("load");
        }
        assert!(enough.is_ok(), "round {round}: the load kept going");
        let seen = seen.lock().expect("seen");
        let after: Vec<_> = seen.iter().filter(|(sent, _)| *sent > answered).collect();
        let accepted_after = after.iter().filter(|(_, s)| *s != StatusCode::UNAUTHORIZED);
        assert_eq!(
            accepted_after.count(),
            0,
            "round {round}: of {} requests sent after the revocation answered, some were not refused",
            after.len()
        );
    }
    // Other keys go on working in both processes.
    for base in [&a.base, &b.base] {
        let r = call(
            &http,
            reqwest::Method::GET,
            &format!("{base}/orders"),
            &admin,
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    // Each process acknowledged every revocation.
    let behind: i64 =
        sqlx::query_scalar("SELECT count(*) FROM key_cache_process WHERE applied < 3")
            .fetch_one(&db)
            .await
            .expect("acks");
    assert_eq!(behind, 0);
}

/// A process that stalls (a VM pause, a stop signal) while a key is
/// revoked cannot acknowledge it: the revocation waits for it no longer
/// than its cache can be trusted, and when it wakes it verifies the key
/// from the database instead of answering from its cache.
#[tokio::test]
async fn a_process_stalled_through_a_revocation_does_not_accept_the_key_when_it_wakes() {
    let (db_url, db, admin) = migrated_database_with_key().await;
    let victim = oncepay::api_keys::create(&db, "merchant-a")
        .await
        .expect("key");
    let id = key_id(&db, &victim).await;
    let mut env = serve_env(&db_url, "http://127.0.0.1:9");
    env.push(("ONCEPAY_AUTH_CACHE_TTL", "1h".into()));
    let a = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let b = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    // A fresh connection for every request: one kept alive across the
    // stall may have been closed by B's keep-alive timer meanwhile, which
    // says nothing about its cache.
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    // B has cached the key (its listener answering, so its cache is used).
    let cached = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        let acked: i64 = sqlx::query_scalar("SELECT count(*) FROM key_cache_process")
            .fetch_one(&db)
            .await
            .expect("listeners");
        acked == 2
            && call(
                &http,
                reqwest::Method::GET,
                &format!("{}/orders", b.base),
                &victim,
            )
            .await
            .status()
                == StatusCode::OK
    })
    .await;
    assert!(cached.is_ok());
    let signal = |sig: &str, pid: u32| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    let pid = b.process.id().expect("pid");
    signal("-STOP", pid);
    let started = std::time::Instant::now();
    let r = call(
        &http,
        reqwest::Method::DELETE,
        &format!("{}/api_keys/{id}", a.base),
        &admin,
    )
    .await;
    let waited = started.elapsed();
    signal("-CONT", pid);
    assert_eq!(r.status(), StatusCode::OK);
    let r = call(
        &http,
        reqwest::Method::GET,
        &format!("{}/orders", b.base),
        &victim,
    )
    .await;
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "the stalled process answered from its cache"
    );
    // It waited for the stalled process to go stale, and no longer than
    // the documented bound.
    assert!(
        waited >= oncepay::api_keys::LISTENER_STALE - Duration::from_secs(2)
            && waited <= oncepay::api_keys::REVOCATION_WAIT + Duration::from_secs(2),
        "the revocation took {waited:?}"
    );
}

#[tokio::test]
async fn a_retried_key_creation_makes_one_key_and_replays_it() {
    let app = spawn_app().await;
    let create = |idem: Option<&str>, body: Value| {
        let mut request = app
            .http
            .post(format!("{}/api_keys", app.base))
            .bearer_auth(&app.key)
            .json(&body);
        if let Some(idem) = idem {
            request = request.header("Idempotency-Key", idem);
        }
        request.send()
    };
    let live = || app.count("SELECT count(*) FROM api_key WHERE revoked_at IS NULL");
    let r = create(None, json!({"scopes": ["read"]}))
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_of(r).await["code"], "idempotency_key_missing");
    assert_eq!(live().await, 1, "nothing made without a key");
    // The first answer is lost; the client retries with the same key.
    let first = create(Some("mint-1"), json!({"scopes": ["read"]}))
        .await
        .expect("post");
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.bytes().await.expect("body");
    let retry = create(Some("mint-1"), json!({"scopes": ["read"]}))
        .await
        .expect("post");
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
    assert_eq!(
        retry.bytes().await.expect("body"),
        first_body,
        "byte for byte"
    );
    assert_eq!(live().await, 2, "one key made for two sends");
    // The replayed key is the one that was made, and it works.
    let made: Value = serde_json::from_slice(&first_body).expect("json");
    let new_key = made["key"].as_str().expect("key");
    let r = call(
        &app.http,
        reqwest::Method::GET,
        &format!("{}/orders", app.base),
        new_key,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    // The same key with another body is refused and makes nothing.
    let r = create(Some("mint-1"), json!({"scopes": ["read", "write"]}))
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(r).await["code"], "idempotency_key_reused");
    assert_eq!(live().await, 2);
    // Concurrent duplicates: one key, and every answer names it.
    let sends: Vec<_> = (0..8)
        .map(|_| {
            let request = app
                .http
                .post(format!("{}/api_keys", app.base))
                .bearer_auth(&app.key)
                .header("Idempotency-Key", "mint-2")
                .json(&json!({}));
            tokio::spawn(request.send())
        })
        .collect();
    let mut keys = std::collections::BTreeSet::new();
    for send in sends {
        let r = send.await.expect("task").expect("post");
        if r.status() == StatusCode::CREATED {
            keys.insert(json_of(r).await["key"].as_str().expect("key").to_string());
        } else {
            // A duplicate still waiting when the first finished is told so.
            assert_eq!(r.status(), StatusCode::CONFLICT);
        }
    }
    assert_eq!(keys.len(), 1, "every answer names the one key made");
    assert_eq!(live().await, 3, "eight concurrent sends, one key");
}

/// Every `POST` that creates something requires an Idempotency-Key:
/// generated from the route table, so a new route is held to it too.
#[tokio::test]
async fn every_post_that_creates_something_requires_an_idempotency_key() {
    let app = spawn_app().await;
    let mut checked = 0;
    for route in oncepay::http::ROUTES {
        // The route table says which routes take a key (and why a POST
        // takes none: `http::routes`' own test holds every POST to it).
        if route.key != Key::Required {
            continue;
        }
        let path = route.path;
        let url = if path.contains("{token}") {
            let order = app.create_order().await;
            format!("{}/payments", app.checkout_url(&order).await)
        } else {
            let concrete = path.replace("{id}", &uuid::Uuid::now_v7().to_string());
            format!("{}{concrete}", app.base)
        };
        let r = app
            .http
            .post(url)
            .bearer_auth(&app.key)
            .json(&json!({}))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "POST {path}");
        assert_eq!(
            json_of(r).await["code"],
            "idempotency_key_missing",
            "POST {path}"
        );
        checked += 1;
    }
    // Every POST but those the table exempts (saying why) was checked.
    let posts = oncepay::http::ROUTES
        .iter()
        .filter(|r| r.method == "POST" && !matches!(r.key, Key::Exempt(_)))
        .count();
    assert_eq!(checked, posts);
}

#[tokio::test]
async fn a_rotated_key_stops_at_its_expiry_in_every_process() {
    let (db_url, db, key) = migrated_database_with_key().await;
    // Each process trusts a verified key for an hour: only the key's own
    // expiry can end it.
    let mut env = serve_env(&db_url, "http://127.0.0.1:9");
    env.push(("ONCEPAY_AUTH_CACHE_TTL", "1h".into()));
    let a = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let b = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{}/api_keys", a.base))
        .bearer_auth(&key)
        .header("Idempotency-Key", "rotate-2")
        .json(&json!({"expire_current_in_seconds": 2}))
        .send()
        .await
        .expect("rotate");
    assert_eq!(r.status(), StatusCode::CREATED);
    let expires_at: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT expires_at FROM api_key WHERE key_prefix = $1")
            .bind(&key[..10])
            .fetch_one(&db)
            .await
            .expect("expiry");
    // Within the overlap both processes accept (and so cache) the old key.
    for base in [&a.base, &b.base] {
        let r = call(&http, reqwest::Method::GET, &format!("{base}/orders"), &key).await;
        assert_eq!(r.status(), StatusCode::OK, "still in its overlap at {base}");
    }
    // Ask both processes until well past the expiry: after it, never accepted.
    let until = expires_at + chrono::Duration::milliseconds(1500);
    let mut refused_after_expiry = 0;
    while chrono::Utc::now() < until {
        for base in [&a.base, &b.base] {
            let sent = chrono::Utc::now();
            let status = call(&http, reqwest::Method::GET, &format!("{base}/orders"), &key)
                .await
                .status();
            if sent > expires_at {
                assert_eq!(
                    status,
                    StatusCode::UNAUTHORIZED,
                    "{base} accepted the old key {} ms after its expiry",
                    (sent - expires_at).num_milliseconds()
                );
                refused_after_expiry += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused_after_expiry > 0);
}
