//! The checkout page a customer would trust, in real Chromium: a card form
//! whose number goes to the provider's tokenization and never to oncepay,
//! 3-D Secure at the bank and back, the way back to the shop, three
//! languages, and axe-core finding no WCAG 2.2 AA violation at each step,
//! at 1280 and 390 pixels wide. Every test counts charges in the sandbox's
//! ledger.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::checkout::{enter_token, screenshot_path, PATIENCE, STATUS};
use crate::helpers::*;
use oncepay_testkit::browser::{self, Browser};

/// A headless Chromium of that size, or a loud skip where none is
/// installed (and axe-core, which `make axe` installs).
async fn browser_of(width: u32, height: u32) -> Option<Browser> {
    if !browser::available() {
        eprintln!("SKIPPED: no chromium and chromedriver (.ci/run installs them)");
        return None;
    }
    if !browser::axe_script().exists() {
        assert!(
            std::env::var_os("ONCEPAY_REQUIRE_AXE").is_none(),
            "ONCEPAY_REQUIRE_AXE is set but axe-core is missing (make axe)"
        );
        eprintln!("SKIPPED: no axe-core (make axe installs it)");
        return None;
    }
    Some(
        Browser::start(width, height)
            .await
            .expect("chromium starts"),
    )
}

/// A checkout session for `order` with `body`; returns (session id, url).
async fn session(app: &TestApp, order: &str, body: Value) -> (String, String) {
    let r = app
        .post(
            &format!("/orders/{order}/checkout"),
            &uuid::Uuid::new_v4().to_string(),
            &body,
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let s = json_of(r).await;
    (
        s["id"].as_str().unwrap().to_string(),
        s["url"].as_str().unwrap().to_string(),
    )
}

async fn type_card(browser: &Browser, number: &str, exp: &str, cvc: &str) {
    for (id, text) in [
        ("#card-number", number),
        ("#card-exp", exp),
        ("#card-cvc", cvc),
    ] {
        let input = browser.find(id).await.expect("card field");
        browser.clear(&input).await.expect("clear");
        browser.type_into(&input, text).await.expect("type");
    }
}

async fn click(browser: &Browser, css: &str) {
    let element = browser.find(css).await.expect(css);
    browser.click(&element).await.expect("click");
}

/// No WCAG 2.2 AA violation on the page as it is now.
async fn accessible(browser: &Browser, moment: &str) {
    let violations = browser.axe().await.expect("axe runs");
    assert!(violations.is_empty(), "{moment}: {violations:#?}");
}

async fn location(browser: &Browser) -> String {
    browser
        .eval("return window.location.href;", json!([]))
        .await
        .expect("location")
        .as_str()
        .unwrap_or_default()
        .to_string()
}

async fn wait_location(browser: &Browser, part: &str) -> String {
    oncepay_testkit::ready::until_some(PATIENCE, || async {
        let here = location(browser).await;
        here.contains(part).then_some(here)
    })
    .await
    .unwrap_or_else(|_| panic!("the browser never reached {part}"))
}

/// The shop's pages the customer is sent back to: any path answers 200.
async fn shop() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let page =
                    "<!doctype html><html lang=\"en\"><title>Shop</title><p>Thank you</p></html>";
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    base
}

fn succeeded_charges(charges: &[Value]) -> usize {
    charges
        .iter()
        .filter(|c| c["status"] == "succeeded")
        .count()
}

#[tokio::test]
async fn a_card_pays_through_the_form_and_axe_finds_nothing_at_either_width() {
    for (width, height, name) in [(1280, 900, "desktop"), (390, 844, "phone")] {
        let Some(browser) = browser_of(width, height).await else {
            return;
        };
        let app = spawn_app().await;
        let order = app.create_order().await;
        let (_, url) = session(&app, &order, json!({})).await;
        browser.goto(&url).await.expect("open");
        browser
            .wait_attribute(STATUS, "data-status", "idle", PATIENCE)
            .await
            .expect("idle");
        for attr in ["cc-number", "cc-exp", "cc-csc"] {
            assert!(
                browser
                    .attribute(&format!("[autocomplete=\"{attr}\"]"), "id")
                    .await
                    .expect("attr")
                    .is_some(),
                "{attr}"
            );
        }
        assert!(browser
            .attribute("#test-mode", "role")
            .await
            .expect("banner")
            .is_some());
        accessible(&browser, &format!("{name}: ready")).await;
        browser
            .screenshot(&screenshot_path(&format!("card-{name}-idle")))
            .await
            .expect("screenshot");
        // A mistyped number is caught on the page, next to its field.
        type_card(&browser, "4242 4242 4242 4241", "1240", "123").await;
        click(&browser, "#pay").await;
        browser
            .wait_attribute("#card-number", "aria-invalid", "true", PATIENCE)
            .await
            .expect("the number is refused on the page");
        accessible(&browser, &format!("{name}: a field in error")).await;
        assert_eq!(app.ledger().await["totals"]["charges"], 0);

        type_card(&browser, "4242424242424242", "12/40", "123").await;
        let shown = browser
            .eval(
                "return document.getElementById('card-number').value;",
                json!([]),
            )
            .await
            .expect("value");
        assert_eq!(shown, "4242 4242 4242 4242", "formatted as typed");
        assert_eq!(
            browser
                .attribute("#card-number", "data-brand")
                .await
                .expect("brand")
                .as_deref(),
            Some("visa")
        );
        click(&browser, "#pay").await;
        browser
            .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
            .await
            .expect("succeeded");
        accessible(&browser, &format!("{name}: paid")).await;
        browser
            .screenshot(&screenshot_path(&format!("card-{name}-paid")))
            .await
            .expect("screenshot");
        let charges = app.charges_for(&order).await;
        assert_eq!(charges.len(), 1);
        let method: String = sqlx::query_scalar("SELECT payment_method FROM payment_attempt")
            .fetch_one(&app.db)
            .await
            .expect("attempt");
        assert!(method.starts_with("tok_"), "oncepay got a token: {method}");
        // Nowhere in oncepay's database, nor in the provider's books.
        let stored = stored_text(&app.db).await;
        let ledger = app.ledger().await.to_string();
        for place in [&stored, &ledger] {
            assert!(
                !place.contains("4242424242424242") && !place.contains("4242 4242"),
                "{place}"
            );
        }
        // Reopened, the paid link shows the receipt with its payment.
        browser.reload().await.expect("reload");
        browser
            .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
            .await
            .expect("receipt");
        let id = browser
            .eval(
                "return document.getElementById('receipt-id').textContent;",
                json!([]),
            )
            .await
            .expect("id");
        assert!(
            !id.as_str().unwrap_or_default().is_empty(),
            "the receipt names its payment"
        );
        browser.quit().await;
    }
}

#[tokio::test]
async fn a_declined_card_then_another_card_pays_once() {
    let Some(browser) = browser_of(390, 844).await else {
        return;
    };
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({})).await;
    browser.goto(&url).await.expect("open");
    type_card(&browser, "4000 0000 0000 0002", "1240", "123").await;
    click(&browser, "#pay").await;
    browser
        .wait_attribute(STATUS, "data-status", "failed", PATIENCE)
        .await
        .expect("declined");
    accessible(&browser, "declined").await;
    type_card(&browser, "4242 4242 4242 4242", "1240", "123").await;
    click(&browser, "#pay").await;
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded");
    let charges = app.charges_for(&order).await;
    assert_eq!(charges.len(), 2);
    assert_eq!(succeeded_charges(&charges), 1, "one charge");
    browser.quit().await;
}

#[tokio::test]
async fn three_d_secure_goes_to_the_bank_and_back_to_the_shop_charging_once() {
    let Some(browser) = browser_of(1280, 900).await else {
        return;
    };
    let app = spawn_app().await;
    let shop = shop().await;
    // Approved at the bank: back on the page, then to the shop's success URL.
    let order = app.create_order().await;
    let (session_id, url) = session(
        &app,
        &order,
        json!({
            "success_url": format!("{shop}/done?session={{CHECKOUT_SESSION_ID}}"),
            "cancel_url": format!("{shop}/cart"),
        }),
    )
    .await;
    browser.goto(&url).await.expect("open");
    type_card(&browser, "4000 0027 6000 3184", "1240", "123").await;
    accessible(&browser, "a 3-D Secure card typed, at 1280").await;
    assert_eq!(
        browser
            .attribute("#cancel", "href")
            .await
            .expect("cancel")
            .as_deref(),
        Some(format!("{shop}/cart").as_str())
    );
    type_card(&browser, "4000 0027 6000 3184", "1240", "123").await;
    click(&browser, "#pay").await;
    wait_location(&browser, "/v1/authenticate/").await;
    // A second tab meanwhile: paying there is the same waiting payment.
    let first = browser.tab().await.expect("tab");
    let second = browser.new_tab().await.expect("new tab");
    browser.switch_to(&second).await.expect("switch");
    browser.goto(&url).await.expect("open again");
    enter_token(&browser, "tok_visa").await;
    click(&browser, "#pay").await;
    wait_location(&browser, "/v1/authenticate/").await;
    browser.switch_to(&first).await.expect("back");
    click(&browser, "#approve").await;
    let back = wait_location(&browser, "/done?session=").await;
    assert!(back.ends_with(&format!("session={session_id}")), "{back}");
    let charges = app.charges_for(&order).await;
    assert_eq!(charges.len(), 1, "one charge");
    assert_eq!(succeeded_charges(&charges), 1);
    assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");

    // Declined at the bank: back on the page, failed, and a new card pays.
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({})).await;
    browser.goto(&url).await.expect("open");
    type_card(&browser, "4000 0027 6000 3184", "1240", "123").await;
    click(&browser, "#pay").await;
    wait_location(&browser, "/v1/authenticate/").await;
    click(&browser, "#decline").await;
    wait_location(&browser, "/checkout/").await;
    browser
        .wait_attribute(STATUS, "data-status", "failed", PATIENCE)
        .await
        .expect("failed");
    accessible(&browser, "declined at the bank, at 1280").await;
    // A reload at that moment: the declined intent is over (its key was
    // forgotten), so the page offers a new payment and sends nothing.
    browser.reload().await.expect("reload");
    browser
        .wait_attribute(STATUS, "data-status", "idle", PATIENCE)
        .await
        .expect("ready for another card after a reload");
    assert_eq!(
        app.charges_for(&order).await.len(),
        1,
        "a reload sends nothing"
    );
    // Then another card, Pay pressed twice: one more charge, succeeded.
    type_card(&browser, "4242 4242 4242 4242", "1240", "123").await;
    browser
        .eval(
            "const pay = document.getElementById('pay'); pay.click(); pay.click(); return true;",
            json!([]),
        )
        .await
        .expect("a double click");
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("succeeded");
    accessible(&browser, "paid after a decline, at 1280").await;
    let charges = app.charges_for(&order).await;
    assert_eq!((charges.len(), succeeded_charges(&charges)), (2, 1));
    browser.quit().await;
}

#[tokio::test]
async fn an_abandoned_authentication_expires_and_the_page_says_so() {
    let Some(browser) = browser_of(390, 844).await else {
        return;
    };
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_ACTION_TIMEOUT", "2s")
            .serve("ONCEPAY_RECONCILE_AFTER", "300ms")
            .serve("ONCEPAY_RECONCILE_INTERVAL", "300ms"),
    )
    .await;
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({})).await;
    browser.goto(&url).await.expect("open");
    type_card(&browser, "4000 0027 6000 3184", "1240", "123").await;
    click(&browser, "#pay").await;
    wait_location(&browser, "/v1/authenticate/").await;
    // The customer comes back without acting at the bank.
    browser.goto(&url).await.expect("back");
    browser
        .wait_attribute(STATUS, "data-status", "authenticating", PATIENCE)
        .await
        .expect("waiting for the bank");
    accessible(&browser, "waiting for the bank").await;
    assert!(
        browser
            .attribute("#checkout", "hidden")
            .await
            .expect("form")
            .is_none()
            && browser
                .attribute("#pay", "aria-busy")
                .await
                .expect("busy")
                .is_some(),
        "no way to pay again while it waits"
    );
    browser
        .wait_attribute(STATUS, "data-status", "failed", Duration::from_secs(40))
        .await
        .expect("expired");
    let text = browser
        .eval(
            "return document.getElementById('status').textContent;",
            json!([]),
        )
        .await
        .expect("text");
    assert!(
        text.as_str().unwrap_or_default().contains("authentication"),
        "{text}"
    );
    assert_eq!(app.ledger().await["totals"]["charges_succeeded"], 0);
    browser.quit().await;
}

#[tokio::test]
async fn the_page_speaks_russian_and_chinese() {
    let Some(browser) = browser_of(390, 844).await else {
        return;
    };
    let app = spawn_app().await;
    for (locale, pay, name) in [("ru", "Оплатить", "russian"), ("zh", "支付", "chinese")]
    {
        let order = app.create_order().await;
        let (_, url) = session(&app, &order, json!({"locale": locale})).await;
        browser.goto(&url).await.expect("open");
        assert_eq!(
            browser
                .attribute("html", "lang")
                .await
                .expect("lang")
                .as_deref(),
            Some(locale)
        );
        let button = browser
            .eval(
                "return document.getElementById('pay').textContent;",
                json!([]),
            )
            .await
            .expect("button");
        assert!(
            button.as_str().unwrap_or_default().starts_with(pay),
            "{button}"
        );
        accessible(&browser, name).await;
        browser
            .screenshot(&screenshot_path(&format!("checkout-{name}")))
            .await
            .expect("screenshot");
        type_card(&browser, "4242 4242 4242 4242", "1240", "123").await;
        click(&browser, "#pay").await;
        browser
            .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
            .await
            .expect("succeeded");
        accessible(&browser, &format!("{name}: paid")).await;
    }
    browser.quit().await;
}

/// The id of the element that has the keyboard's focus.
async fn focused(browser: &Browser) -> String {
    browser
        .eval(
            "return document.activeElement ? document.activeElement.id : '';",
            json!([]),
        )
        .await
        .expect("focus")
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_keyboard_alone_pays_and_mashing_pay_on_the_way_to_the_bank_charges_once() {
    let Some(browser) = browser_of(390, 844).await else {
        return;
    };
    let app = spawn_app().await;
    let shop = shop().await;
    // Keyboard only: type, Tab to the next field, Enter to pay.
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({"cancel_url": format!("{shop}/cart")})).await;
    browser.goto(&url).await.expect("open");
    let number = browser.find("#card-number").await.expect("number");
    browser.click(&number).await.expect("focus");
    const TAB: &str = "\u{E004}";
    const ENTER: &str = "\u{E007}";
    browser
        .type_into(&number, &format!("4242424242424242{TAB}"))
        .await
        .expect("type");
    assert_eq!(focused(&browser).await, "card-exp");
    let exp = browser.find("#card-exp").await.expect("exp");
    browser
        .type_into(&exp, &format!("1240{TAB}"))
        .await
        .expect("type");
    assert_eq!(focused(&browser).await, "card-cvc");
    let cvc = browser.find("#card-cvc").await.expect("cvc");
    browser
        .type_into(&cvc, &format!("123{ENTER}"))
        .await
        .expect("type");
    browser
        .wait_attribute(STATUS, "data-status", "succeeded", PATIENCE)
        .await
        .expect("paid by keyboard");
    assert_eq!(app.charges_for(&order).await.len(), 1);

    // Five clicks on Pay with a card its bank must confirm: one payment,
    // one charge, and the customer at the bank.
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({"cancel_url": format!("{shop}/cart")})).await;
    browser.goto(&url).await.expect("open");
    type_card(&browser, "4000 0027 6000 3184", "1240", "123").await;
    let pay = browser.find("#pay").await.expect("pay");
    for _ in 0..5 {
        let _ = browser.click(&pay).await;
    }
    wait_location(&browser, "/v1/authenticate/").await;
    // Back without acting, then a reload: still the one waiting payment.
    browser.goto(&url).await.expect("back");
    browser
        .wait_attribute(STATUS, "data-status", "authenticating", PATIENCE)
        .await
        .expect("waiting for the bank");
    browser.reload().await.expect("reload");
    browser
        .wait_attribute(STATUS, "data-status", "authenticating", PATIENCE)
        .await
        .expect("still waiting after a reload");
    assert_eq!(app.charges_for(&order).await.len(), 1, "one charge");
    assert_eq!(
        app.count("SELECT count(*) FROM payment_attempt WHERE status = 'pending'")
            .await,
        1
    );

    // The customer gives up: the cancel link goes back to the shop.
    let order = app.create_order().await;
    let (_, url) = session(&app, &order, json!({"cancel_url": format!("{shop}/cart")})).await;
    browser.goto(&url).await.expect("open");
    click(&browser, "#cancel").await;
    wait_location(&browser, &format!("{shop}/cart")).await;
    assert_eq!(app.charges_for(&order).await.len(), 0);
    browser.quit().await;
}

/// With Stripe the card form is Stripe Elements: Stripe.js from Stripe's
/// origin, allowed by the page's policy and nothing else. It cannot load
/// on these machines (no internet), so the page must say so and still pay
/// in test mode with a PaymentMethod id, through 3-D Secure at the bank
/// (localstripe's `_authenticate`, behind the test layer's bank page) and
/// back to the shop. With live keys the raw field does not exist.
#[tokio::test]
async fn with_stripe_the_page_is_elements_and_three_d_secure_returns_to_the_shop() {
    if !localstripe_or_skip() {
        return;
    }
    let app = spawn_app_with(
        Options::default()
            .provider(Provider::Stripe)
            .serve("ONCEPAY_STRIPE_PUBLISHABLE_KEY", "pk_test_oncepay"),
    )
    .await;
    let shop = shop().await;
    let order = app.create_order().await;
    let (session_id, url) = session(
        &app,
        &order,
        json!({"success_url": format!("{shop}/done?session={{CHECKOUT_SESSION_ID}}")}),
    )
    .await;
    let page = reqwest::get(&url).await.expect("page");
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        policy.contains("script-src 'self' https://js.stripe.com;")
            && policy.contains("frame-src https://js.stripe.com https://hooks.stripe.com;")
            && policy.contains("connect-src 'self' https://api.stripe.com;"),
        "{policy}"
    );
    let html = page.text().await.unwrap();
    for part in [
        "id=\"card-element\"",
        "data-stripe-key=\"pk_test_oncepay\"",
        "data-stripe-js=\"https://js.stripe.com/v3/\"",
        "<script src=\"/checkout/assets/card_stripe.js\" defer></script>",
        "id=\"test-token\"",
        "id=\"test-mode\"",
    ] {
        assert!(html.contains(part), "{part} in {html}");
    }
    assert!(
        !html.contains("card-number") && !html.contains("card_sandbox.js"),
        "no card field of oncepay's own"
    );

    if let Some(browser) = browser_of(1280, 900).await {
        browser.goto(&url).await.expect("open");
        browser
            .wait_attribute("#card-element", "data-state", "unavailable", PATIENCE)
            .await
            .expect("Stripe.js cannot load here, and the page says so");
        accessible(&browser, "Stripe Elements unavailable, at 1280").await;
        let card = crate::stripe::stripe_card(&app, "4000002760003184").await;
        enter_token(&browser, &card).await;
        click(&browser, "#pay").await;
        wait_location(&browser, "/_bank/pi_").await;
        click(&browser, "#approve").await;
        let back = wait_location(&browser, "/done?session=").await;
        assert!(back.ends_with(&format!("session={session_id}")), "{back}");
        assert_eq!(app.status_of(&format!("/orders/{order}")).await, "paid");
        assert_eq!(app.charges_at_provider(&order).await, (1, 1));
        browser.quit().await;
    }

    // Live keys: Elements only, no test banner, no raw field.
    let live = spawn_app_with(
        Options::default()
            .provider(Provider::Stripe)
            .serve("ONCEPAY_STRIPE_SECRET_KEY", "sk_live_oncepay")
            .serve("ONCEPAY_STRIPE_PUBLISHABLE_KEY", "pk_live_oncepay"),
    )
    .await;
    let order = live.create_order().await;
    let (_, url) = session(&live, &order, json!({})).await;
    let html = reqwest::get(&url).await.unwrap().text().await.unwrap();
    assert!(
        html.contains("data-stripe-key=\"pk_live_oncepay\""),
        "{html}"
    );
    for absent in ["payment_method", "test-token", "test-mode"] {
        assert!(!html.contains(absent), "no {absent} with live keys: {html}");
    }
}
