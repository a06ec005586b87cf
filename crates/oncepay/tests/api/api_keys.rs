//! API keys: list, rotate with an overlap, revoke — and a revocation that
//! takes effect in every process at once, although each caches keys for an
//! hour.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

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

#[tokio::test]
async fn a_revocation_reaches_every_process_at_once() {
    let (db_url, db, key) = migrated_database_with_key().await;
    let spare = oncepay::api_keys::create(&db, "merchant-a")
        .await
        .expect("key");
    // Each process trusts a verified key for an hour: only the
    // notification can make it forget.
    let mut env = serve_env(&db_url, "http://127.0.0.1:9");
    env.push(("ONCEPAY_AUTH_CACHE_TTL", "1h".into()));
    let a = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let b = spawn_binary("serve", "ONCEPAY_BIND", &env).await;
    let http = reqwest::Client::new();
    for base in [&a.base, &b.base] {
        let r = call(&http, reqwest::Method::GET, &format!("{base}/orders"), &key).await;
        assert_eq!(r.status(), StatusCode::OK, "cached in {base}");
    }
    let id: String = sqlx::query_scalar("SELECT id::text FROM api_key WHERE key_prefix = $1")
        .bind(&key[..10])
        .fetch_one(&db)
        .await
        .expect("id");
    let r = call(
        &http,
        reqwest::Method::DELETE,
        &format!("{}/api_keys/{id}", a.base),
        &spare,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let refused = oncepay_testkit::ready::until(Duration::from_secs(5), || async {
        call(
            &http,
            reqwest::Method::GET,
            &format!("{}/orders", b.base),
            &key,
        )
        .await
        .status()
            == StatusCode::UNAUTHORIZED
    })
    .await;
    assert!(refused.is_ok(), "the other process forgot the revoked key");
    let r = call(
        &http,
        reqwest::Method::GET,
        &format!("{}/orders", b.base),
        &spare,
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK, "other keys go on working");
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
