//! The hosted checkout page: its API over HTTP, then the page itself in a
//! real headless Chromium (Debian's `chromium` and `chromium-driver`, which
//! `.ci/run` installs), against the real server and sandbox. Each browser
//! test counts charges in the sandbox's ledger.

use std::path::PathBuf;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use oncepay_testkit::browser::{self, Browser};

/// A fresh order, its checkout page open in `browser`, `token` typed into
/// the card field; returns the order id and the Pay button.
async fn checkout_with(app: &TestApp, browser: &Browser, token: &str) -> (String, String) {
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    browser.goto(&url).await.expect("open");
    enter_token(browser, token).await;
    (order_id, browser.find("#pay").await.expect("button"))
}

/// Opens "Use a test token" (a customer's click) and replaces the token.
pub(crate) async fn enter_token(browser: &Browser, token: &str) {
    if browser
        .attribute("#test-token", "open")
        .await
        .expect("disclosure")
        .is_none()
    {
        let summary = browser.find("#test-token summary").await.expect("summary");
        browser.click(&summary).await.expect("open the disclosure");
    }
    let input = browser.find("#payment_method").await.expect("input");
    browser.clear(&input).await.expect("clear");
    browser.type_into(&input, token).await.expect("type");
}

pub(crate) fn screenshot_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/checkout-screenshots")
        .join(format!("{name}.png"))
}

/// A phone-sized headless Chromium, or a loud skip where none is installed.
async fn phone() -> Option<Browser> {
    if !browser::available() {
        eprintln!(
            "SKIPPED: no /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver; .ci/run does)"
        );
        return None;
    }
    Some(Browser::start(390, 844).await.expect("chromium starts"))
}

pub(crate) const STATUS: &str = "#status";
pub(crate) const PATIENCE: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_checkout_session_is_made_once_per_key_and_only_for_a_payable_order() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let path = format!("/orders/{order_id}/checkout");
    let first = app.post(&path, "co-1", &json!({})).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_body = first.bytes().await.expect("body");
    let again = app.post(&path, "co-1", &json!({})).await;
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(again.bytes().await.expect("body"), first_body);
    let session: Value = serde_json::from_slice(&first_body).expect("json");
    let url = session["url"].as_str().expect("url");
    assert!(
        url.starts_with(&format!("{}/checkout/cs_", app.base)),
        "{url}"
    );
    assert!(session["expires_at"].is_string());
    // Only the token's hash is stored.
    let token = url.rsplit('/').next().expect("token");
    assert_eq!(token.len(), 3 + 64);
    assert_eq!(app.count("SELECT count(*) FROM checkout_session").await, 1);
    let leaked = sqlx::query_scalar::<_, i64>(
        "SELECT count(*) FROM checkout_session WHERE encode(token_hash, 'escape') LIKE '%' || $1 || '%'",
    )
    .bind(token)
    .fetch_one(&app.db)
    .await
    .expect("count");
    assert_eq!(leaked, 0);
    // A paid order gets none.
    let (_, _) = app.pay(&order_id, "tok_visa").await;
    let refused = app.post(&path, "co-2", &json!({})).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(refused).await["code"], "order_not_payable");
}

#[tokio::test]
async fn unknown_and_expired_tokens_show_a_clear_page_and_pay_nothing() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let session = app.checkout(&order_id).await;
    let url = session["url"].as_str().expect("url").to_string();
    let unknown = app
        .http
        .get(format!("{}/checkout/cs_{}", app.base, "0".repeat(64)))
        .send()
        .await
        .expect("get");
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    assert!(unknown.text().await.expect("html").contains("not valid"));
    let live = app.http.get(&url).send().await.expect("get");
    assert_eq!(live.status(), StatusCode::OK);
    let h = live.headers().clone();
    assert!(h["content-security-policy"]
        .to_str()
        .expect("csp")
        .contains("default-src 'none'"));
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["referrer-policy"], "no-referrer");
    let page = live.text().await.expect("html");
    assert!(page.contains("id=\"payment_method\""));
    assert!(page.contains("28.00 EUR"), "the total in EUR's minor units");

    sqlx::query("UPDATE checkout_session SET expires_at = now() - interval '1 second'")
        .execute(&app.db)
        .await
        .expect("expire");
    let expired = app.http.get(&url).send().await.expect("get");
    assert_eq!(expired.status(), StatusCode::GONE);
    let pay = app.pay_on_page(&url, "k", "tok_visa").await;
    assert_eq!(pay.status(), StatusCode::GONE);
    assert_eq!(json_of(pay).await["code"], "checkout_expired");
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 0);
}

/// The card form is the provider's: the page names it, loads its script
/// before its own (which finds `window.oncepayCard` set) and lets the card
/// go to the provider's tokenization; both scripts are served as the
/// page's assets are. A provider without a card form here has no script.
#[tokio::test]
async fn the_page_loads_its_providers_card_form_before_its_own_script() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    let page = app.http.get(&url).send().await.expect("get");
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .expect("csp")
        .to_string();
    assert!(
        policy.contains("script-src 'self'; ")
            && policy.contains("connect-src 'self' http://127.0.0.1:")
            && !policy.contains("frame-src"),
        "the card goes to the sandbox's origin, and nothing else is allowed: {policy}"
    );
    let html = page.text().await.expect("html");
    assert!(
        html.contains("data-card=\"tokenize\" data-tokenize=\"http://127.0.0.1:"),
        "{html}"
    );
    let card = html
        .find("<script src=\"/checkout/assets/card_sandbox.js\" defer></script>")
        .expect("the sandbox's card script");
    let own = html
        .find("<script src=\"/checkout/assets/checkout.js\" defer></script>")
        .expect("the page's script");
    assert!(card < own, "the card form's script runs first");
    for (asset, says) in [
        ("card_sandbox.js", "window.oncepayCard ="),
        ("checkout.js", "window.oncepayCard("),
    ] {
        let r = app
            .http
            .get(format!("{}/checkout/assets/{asset}", app.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
        assert_eq!(
            r.headers()["content-type"],
            "text/javascript; charset=utf-8",
            "{asset}"
        );
        assert_eq!(r.headers()["cache-control"], "no-cache", "{asset}");
        assert!(r.text().await.expect("script").contains(says), "{asset}");
    }
    // Stripe is not configured here.
    let r = app
        .http
        .get(format!("{}/checkout/assets/card_stripe.js", app.base))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "not_found");
}

#[tokio::test]
async fn a_token_answers_for_its_own_order_only() {
    let app = spawn_app().await;
    let mine = app.create_order().await;
    let other = app.create_order().await;
    let url = app.checkout_url(&mine).await;
    // The browser cannot name another order: the body takes no order id.
    let r = app
        .http
        .post(format!("{url}/payments"))
        .header("Idempotency-Key", "k1")
        .json(&json!({"payment_method": "tok_visa", "order_id": other}))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = app.pay_on_page(&url, "k2", "tok_visa").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["order_id"], mine.as_str());
    assert_eq!(
        app.status_of(&format!("/orders/{other}")).await,
        "awaiting_payment"
    );
}

#[tokio::test]
async fn double_clicks_and_enter_mashing_charge_once() {
    let Some(browser) = phone().await else { return };
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    browser.goto(&url).await.expect("open");
    browser
        .wait_attribute(STATUS, "data-status", "idle", PATIENCE)
        .await
        .expect("idle");
    browser
        .screenshot(&screenshot_path("idle"))
        .await
        .expect("screenshot");
    enter_token(&browser, "tok_visa+delay=1500").await;
    let input = browser.find("#payment_method").await.expect("input");
    let pay = browser.find("#pay").await.expect("button");
    for _ in 0..5 {
        // Later clicks may meet a page that has already succeeded.
        let _ = browser.click(&pay).await;
    }
    for _ in 0..5 {
        let _ = browser.type_into(&input, "\u{E007}").await;
    }
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded");
    browser
        .screenshot(&screenshot_path("succeeded"))
        .await
        .expect("screenshot");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1, "one charge");
    assert_eq!(charges[0]["charges"], 1);
    assert_eq!(app.count("SELECT count(*) FROM payment_attempt").await, 1);
    assert_eq!(
        browser
            .eval("return window.sessionStorage.length;", json!([]))
            .await
            .expect("eval"),
        0,
        "the key is forgotten after success"
    );
    assert_eq!(
        browser.attribute("#receipt", "hidden").await.expect("attr"),
        None,
        "a receipt, and no Pay button"
    );
    // Every request the page made went to its own origin.
    let foreign = browser
        .eval(
            "return performance.getEntriesByType('resource').map(function (e) { return e.name; })
               .filter(function (n) { return n.indexOf(location.origin + '/') !== 0; });",
            json!([]),
        )
        .await
        .expect("eval");
    assert_eq!(foreign, json!([]));
    browser.quit().await;
}

#[tokio::test]
async fn a_reload_mid_payment_resumes_with_the_same_key() {
    let Some(browser) = phone().await else { return };
    let app = spawn_app().await;
    let (order_id, pay) = checkout_with(&app, &browser, "tok_visa+delay=3000").await;
    browser.click(&pay).await.expect("click");
    let key = browser
        .eval(
            "return JSON.parse(sessionStorage.getItem(sessionStorage.key(0))).key;",
            json!([]),
        )
        .await
        .expect("stored key");
    browser.reload().await.expect("reload");
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded after the reload");
    let attempts: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM payment_attempt")
        .fetch_all(&app.db)
        .await
        .expect("keys");
    assert_eq!(attempts.len(), 1, "one attempt");
    assert!(
        attempts[0].ends_with(key.as_str().expect("key")),
        "the same key: {attempts:?} / {key}"
    );
    assert_eq!(app.charges_for(&order_id).await.len(), 1);
    browser.quit().await;
}

#[tokio::test]
async fn a_lost_answer_moves_to_checking_then_succeeded() {
    let Some(browser) = phone().await else { return };
    // No webhooks: only the reconciler, run below, learns the outcome.
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_RECONCILE_AFTER", "0s")
            .sandbox("ONCEPAY_SANDBOX_WEBHOOKS", "off"),
    )
    .await;
    // The provider charges and every answer to oncepay is lost: the
    // outcome is unknown, and the page must not offer to pay again.
    let (order_id, pay) = checkout_with(&app, &browser, "tok_visa+drop=10").await;
    browser.click(&pay).await.expect("click");
    browser
        .wait_attribute(STATUS, "data-status", "checking", PATIENCE)
        .await
        .expect("checking");
    assert_eq!(
        browser.attribute("#pay", "aria-busy").await.expect("attr"),
        Some("true".into())
    );
    browser
        .screenshot(&screenshot_path("checking"))
        .await
        .expect("screenshot");
    // The reconciler learns the outcome; the page, polling, shows it.
    oncepay::workers::reconciler::pass(&app.ctx)
        .await
        .expect("reconcile");
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(charges.len(), 1);
    assert_eq!(charges[0]["charges"], 1);
    browser.quit().await;
}

#[tokio::test]
async fn a_decline_allows_a_new_attempt_with_a_new_key() {
    let Some(browser) = phone().await else { return };
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    browser.goto(&url).await.expect("open");
    enter_token(&browser, "tok_declined").await;
    let pay = browser.find("#pay").await.expect("button");
    browser.click(&pay).await.expect("click");
    browser
        .wait_attribute(STATUS, "data-status", "failed", PATIENCE)
        .await
        .expect("failed");
    let text = browser
        .eval(
            "return document.getElementById('status').textContent;",
            json!([]),
        )
        .await
        .expect("text");
    assert!(
        text.as_str().unwrap_or_default().contains("declined"),
        "{text}"
    );
    browser
        .screenshot(&screenshot_path("failed"))
        .await
        .expect("screenshot");
    enter_token(&browser, "tok_visa").await;
    browser.click(&pay).await.expect("click");
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded");
    let keys: Vec<String> = sqlx::query_scalar("SELECT idempotency_key FROM payment_attempt")
        .fetch_all(&app.db)
        .await
        .expect("keys");
    assert_eq!(keys.len(), 2, "two attempts");
    assert_ne!(keys[0], keys[1], "two keys");
    let charges = app.charges_for(&order_id).await;
    assert_eq!(
        charges
            .iter()
            .filter(|c| c["status"] == "succeeded")
            .count(),
        1,
        "one charge"
    );
    browser.quit().await;
}

#[tokio::test]
async fn two_tabs_paying_at_once_charge_once_and_both_show_it() {
    let Some(browser) = phone().await else { return };
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    let first = browser.tab().await.expect("tab");
    browser.goto(&url).await.expect("open");
    let second = browser.new_tab().await.expect("tab");
    browser.goto(&url).await.expect("open");
    for tab in [&first, &second] {
        browser.switch_to(tab).await.expect("switch");
        enter_token(&browser, "tok_visa+delay=1000").await;
        browser
            .click(&browser.find("#pay").await.expect("button"))
            .await
            .expect("click");
    }
    for tab in [&first, &second] {
        browser.switch_to(tab).await.expect("switch");
        browser
            .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
            .await
            .expect("both tabs end succeeded");
    }
    let charges = app.charges_for(&order_id).await;
    assert_eq!(
        charges
            .iter()
            .filter(|c| c["status"] == "succeeded")
            .count(),
        1,
        "one charge"
    );
    browser.quit().await;
}

/// Requests the service has answered on the checkout's own routes (the
/// page, its status and its payments; not the static assets).
async fn checkout_requests(app: &TestApp) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    text.lines()
        .filter(|l| {
            l.starts_with("oncepay_http_requests_total{") && l.contains("route=\"/checkout/{token}")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test]
async fn an_order_that_can_no_longer_be_paid_ends_the_page_with_a_bounded_number_of_requests() {
    let Some(browser) = phone().await else { return };
    let app = spawn_app().await;
    // Cancelled while the page is open.
    let order_id = app.create_order().await;
    let url = app.checkout_url(&order_id).await;
    browser.goto(&url).await.expect("open");
    browser
        .wait_attribute(STATUS, "data-status", "idle", PATIENCE)
        .await
        .expect("idle");
    let r = app
        .post(&format!("/orders/{order_id}/cancel"), "cancel", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    enter_token(&browser, "tok_visa").await;
    browser
        .click(&browser.find("#pay").await.expect("button"))
        .await
        .expect("click");
    browser
        .wait_attribute(STATUS, "data-status", "closed", PATIENCE)
        .await
        .expect("a final state");
    let text = browser
        .eval(
            "return document.getElementById('status').textContent;",
            json!([]),
        )
        .await
        .expect("text");
    assert_eq!(text, "This order can no longer be paid.");
    // The page stays open for a minute; whatever it sends is counted.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let sent = checkout_requests(&app).await;
    println!("checkout requests in 60 s with the page open on a cancelled order: {sent}");
    assert!(
        sent <= 6,
        "the page, one payment, one status read at most: {sent}"
    );
    browser
        .screenshot(&screenshot_path("closed"))
        .await
        .expect("screenshot");
    // A reload (the key of the click is still stored) ends at once too.
    browser.reload().await.expect("reload");
    browser
        .wait_attribute(STATUS, "data-status", "closed", PATIENCE)
        .await
        .expect("closed after a reload");
    assert!(
        browser
            .attribute("#checkout", "hidden")
            .await
            .expect("attr")
            .is_some(),
        "no Pay button"
    );
    // Paid elsewhere and refunded in full while a second page was open.
    let other = app.create_order().await;
    let url = app.checkout_url(&other).await;
    browser.goto(&url).await.expect("open");
    browser
        .wait_attribute(STATUS, "data-status", "idle", PATIENCE)
        .await
        .expect("idle");
    let (_, payment) = app.pay(&other, "tok_visa").await;
    let refund = app
        .post(
            &format!("/payments/{}/refunds", payment["id"].as_str().expect("id")),
            "refund-all",
            &json!({}),
        )
        .await;
    assert_eq!(refund.status(), StatusCode::CREATED);
    assert_eq!(app.status_of(&format!("/orders/{other}")).await, "refunded");
    enter_token(&browser, "tok_visa").await;
    let before = checkout_requests(&app).await;
    browser
        .click(&browser.find("#pay").await.expect("button"))
        .await
        .expect("click");
    browser
        .wait_attribute(STATUS, "data-status", "closed", PATIENCE)
        .await
        .expect("a refunded order can no longer be paid either");
    let sent = checkout_requests(&app).await - before;
    assert!(sent <= 3, "one payment and one status read: {sent}");
    assert_eq!(app.charges_for(&other).await.len(), 1, "charged once");
    browser.quit().await;
}

#[tokio::test]
async fn the_public_checkout_is_rate_limited_per_session_and_per_client_address() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_CHECKOUT_RATE_LIMIT_PER_SECOND", "1")
            .serve("ONCEPAY_CHECKOUT_RATE_LIMIT_BURST", "5")
            .serve("ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_PER_SECOND", "1")
            .serve("ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_BURST", "12"),
    )
    .await;
    let mut urls = Vec::new();
    for _ in 0..3 {
        let order = app.create_order().await;
        urls.push(app.checkout_url(&order).await);
    }
    let status = |url: &str| {
        let url = format!("{url}/status?key=k");
        let http = app.http.clone();
        async move { http.get(url).send().await.expect("sent") }
    };
    // A session's burst, then its own limit.
    for i in 0..5 {
        assert_eq!(status(&urls[0]).await.status(), StatusCode::OK, "{i}");
    }
    let limited = status(&urls[0]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(limited.headers().contains_key("retry-after"));
    assert!(limited.headers().contains_key("x-request-id"));
    assert_eq!(json_of(limited).await["code"], "rate_limited");
    // Another session is not affected by the first one's limit ...
    for i in 0..5 {
        assert_eq!(status(&urls[1]).await.status(), StatusCode::OK, "{i}");
    }
    // ... but the address's own limit (12 at once) covers every session.
    assert_eq!(
        status(&urls[1]).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let third = status(&urls[2]).await;
    assert_eq!(
        third.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "a fresh session from the same address"
    );
    // Merchants' own API is not limited by the checkout's limits.
    assert_eq!(app.get("/orders").await.status(), StatusCode::OK);
}
