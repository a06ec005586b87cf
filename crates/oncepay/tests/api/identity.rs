//! Identity from the shop's own sign-in (issue 47): bearer tokens its
//! identity provider issues, checked against its JWKS. The keys and tokens
//! are PyJWT's and cryptography's (`identity_mint.py`), never oncepay's;
//! the JWKS is served by a local HTTP server that counts its hits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, HttpResponse};
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::*;
use oncepay::http::routes::{Access, Customers, Ownership};
use oncepay::identity::token::Algorithms;

pub(crate) const ISSUER: &str = "https://id.shop-a.example";
const AUDIENCE: &str = "oncepay-shop-a";

/// The venv's Python (`make pyjwt`), or `ONCEPAY_PYJWT_PYTHON`.
fn python() -> PathBuf {
    match std::env::var_os("ONCEPAY_PYJWT_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/pyjwt-venv/bin/python")
        }
    }
}

/// Whether PyJWT can run here; where it cannot and the run does not
/// require it (`ONCEPAY_REQUIRE_PYJWT`, set by `.ci/run`), a loud skip.
pub(crate) fn pyjwt_or_skip() -> bool {
    if python().exists() {
        return true;
    }
    assert!(
        std::env::var_os("ONCEPAY_REQUIRE_PYJWT").is_none(),
        "ONCEPAY_REQUIRE_PYJWT is set but {} is missing (make pyjwt)",
        python().display()
    );
    eprintln!("SKIPPED: no PyJWT (make pyjwt installs it)");
    false
}

/// Runs `identity_mint.py` with `request`.
async fn mint(request: Value) -> Value {
    use tokio::io::AsyncWriteExt as _;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/api/identity_mint.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(request.to_string().as_bytes())
        .await
        .expect("request written");
    drop(stdin);
    let out = child.wait_with_output().await.expect("minted");
    assert!(
        out.status.success(),
        "identity_mint.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON from identity_mint.py")
}

/// A key pair PyJWT made, and its public JWK (with `kid` and `alg`).
#[derive(Clone)]
pub(crate) struct Key {
    alg: &'static str,
    kid: String,
    private_pem: String,
    public_pem: String,
    jwk: Value,
}

pub(crate) async fn keys(algs: &[&'static str]) -> Vec<Key> {
    let made = mint(json!({ "keygen": algs })).await;
    algs.iter()
        .zip(made.as_array().expect("keys"))
        .map(|(alg, k)| {
            let kid = format!("{}-{}", alg.to_lowercase(), Uuid::new_v4().simple());
            let mut jwk = k["jwk"].clone();
            jwk["kid"] = json!(kid);
            jwk["alg"] = json!(alg);
            jwk["use"] = json!("sig");
            Key {
                alg,
                kid,
                private_pem: k["private_pem"].as_str().expect("pem").to_string(),
                public_pem: k["public_pem"].as_str().expect("pem").to_string(),
                jwk,
            }
        })
        .collect()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims of a customer (or `role`) `sub`, valid for five minutes.
pub(crate) fn claims(sub: &str, role: &str) -> Value {
    json!({
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": sub,
        "roles": [role],
        "iat": now(),
        "exp": now() + 300,
    })
}

/// One token to sign: `key` signs as its own `alg` under its own `kid`,
/// unless `alg`/`kid` say otherwise.
struct Sign<'a> {
    key: &'a Key,
    claims: Value,
    alg: Option<&'static str>,
    kid: Option<String>,
    /// The header's `typ` (PyJWT's own `JWT` unless said; `null` leaves
    /// it out).
    typ: Option<Value>,
}

impl<'a> Sign<'a> {
    fn new(key: &'a Key, claims: Value) -> Sign<'a> {
        Sign {
            key,
            claims,
            alg: None,
            kid: None,
            typ: None,
        }
    }
}

async fn sign_all(requests: Vec<Sign<'_>>) -> Vec<String> {
    let batch: Vec<Value> = requests
        .iter()
        .map(|r| {
            let alg = r.alg.unwrap_or(r.key.alg);
            let pem = if alg == "HS256" {
                &r.key.public_pem
            } else {
                &r.key.private_pem
            };
            let mut headers = json!({"kid": r.kid.clone().unwrap_or_else(|| r.key.kid.clone())});
            if let Some(typ) = &r.typ {
                headers["typ"] = typ.clone();
            }
            json!({
                "alg": alg,
                "key": pem,
                "headers": headers,
                "claims": r.claims,
            })
        })
        .collect();
    mint(json!({ "sign": batch }))
        .await
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_str().expect("token").to_string())
        .collect()
}

pub(crate) async fn sign(key: &Key, claims: Value) -> String {
    sign_all(vec![Sign::new(key, claims)]).await.remove(0)
}

/// The identity provider's JWKS endpoint: serves `keys`, counts hits,
/// can be taken down.
pub(crate) struct Idp {
    shared: Arc<IdpShared>,
    url: String,
}

struct IdpShared {
    keys: Mutex<Vec<Value>>,
    hits: AtomicUsize,
    down: AtomicBool,
}

async fn serve_jwks(shared: web::Data<IdpShared>) -> HttpResponse {
    shared.hits.fetch_add(1, Ordering::SeqCst);
    if shared.down.load(Ordering::SeqCst) {
        return HttpResponse::ServiceUnavailable().finish();
    }
    let keys = shared
        .keys
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    HttpResponse::Ok()
        .content_type("application/json")
        .body(json!({ "keys": keys }).to_string())
}

impl Idp {
    pub(crate) fn start(keys: &[&Key]) -> Idp {
        let shared = Arc::new(IdpShared {
            keys: Mutex::new(keys.iter().map(|k| k.jwk.clone()).collect()),
            hits: AtomicUsize::new(0),
            down: AtomicBool::new(false),
        });
        let addr = oncepay_testkit::loopback_http::serve(shared.clone(), serve_jwks)
            .expect("the JWKS server starts");
        Idp {
            shared,
            url: format!("http://{addr}/.well-known/jwks.json"),
        }
    }

    fn publish(&self, keys: &[&Key]) {
        *self.shared.keys.lock().unwrap_or_else(|p| p.into_inner()) =
            keys.iter().map(|k| k.jwk.clone()).collect();
    }

    fn hits(&self) -> usize {
        self.shared.hits.load(Ordering::SeqCst)
    }

    fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }
}

/// Merchant `name` trusts `idp` as `issuer` for `AUDIENCE` (as `oncepay
/// merchant identity` sets it).
pub(crate) async fn trust(app: &TestApp, name: &str, issuer: &str, idp: &Idp) {
    trust_with(app, name, issuer, idp, None, Algorithms::ALL).await;
}

/// As [`trust`], with `--token-type` and `--algorithms`.
async fn trust_with(
    app: &TestApp,
    name: &str,
    issuer: &str,
    idp: &Idp,
    token_type: Option<&str>,
    algorithms: Algorithms,
) {
    let outcome = oncepay::store::identity::set(
        &app.db,
        name,
        oncepay::store::identity::NewIdentity {
            issuer,
            jwks_url: &idp.url,
            audience: AUDIENCE,
            roles_claim: "roles",
            token_type,
            algorithms,
        },
        &oncepay::audit::Actor::cli(),
    )
    .await
    .expect("identity set");
    assert_eq!(outcome, oncepay::store::identity::SetOutcome::Set);
}

/// A service whose key sets may be refetched every `min_refresh`.
async fn app_with_refresh(min_refresh: &str) -> TestApp {
    spawn_app_with(Options::default().serve("ONCEPAY_JWKS_MIN_REFRESH", min_refresh)).await
}

impl TestApp {
    pub(crate) async fn call_as(
        &self,
        bearer: &str,
        method: Method,
        path: &str,
        idem: Option<&str>,
        body: Option<&Value>,
    ) -> reqwest::Response {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(bearer);
        if let Some(idem) = idem {
            req = req.header("Idempotency-Key", idem);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        req.send().await.expect("request sent")
    }

    async fn get_as(&self, bearer: &str, path: &str) -> reqwest::Response {
        self.call_as(bearer, Method::GET, path, None, None).await
    }

    async fn order_as(&self, bearer: &str, customer: &str) -> reqwest::Response {
        let mut body = order_body();
        body["customer_id"] = json!(customer);
        // An order's metadata is the merchant's, never a customer's.
        body.as_object_mut().expect("object").remove("metadata");
        let idem = Uuid::new_v4().to_string();
        self.call_as(bearer, Method::POST, "/orders", Some(&idem), Some(&body))
            .await
    }

    /// What a refused request must leave as it was.
    async fn everything(&self) -> Vec<i64> {
        let mut counts = Vec::new();
        for table in [
            "orders",
            "payment_attempt",
            "refund",
            "checkout_session",
            "idempotency_record",
            "event",
            "webhook_endpoint",
            "api_key",
            "audit_event",
        ] {
            counts.push(self.count(&format!("SELECT count(*) FROM {table}")).await);
        }
        counts.push(
            self.count("SELECT count(*) FROM orders WHERE status <> 'awaiting_payment'")
                .await,
        );
        counts
    }
}

/// `401 invalid_token` with the challenge header, a detail that says
/// `why` and never repeats the token.
async fn assert_invalid_token(r: reqwest::Response, token: &str, case: &str, why: &str) {
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{case}");
    let challenge = r
        .headers()
        .get("www-authenticate")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert_eq!(challenge, r#"Bearer error="invalid_token""#, "{case}");
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "invalid_token", "{case}: {problem}");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(why), "{case}: {detail}");
    for part in token.split('.').filter(|p| p.len() > 8) {
        assert!(
            !detail.contains(part),
            "{case}: the detail echoes the token"
        );
    }
}

#[tokio::test]
async fn each_algorithm_is_accepted_from_a_jwks() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let all = keys(&["RS256", "PS256", "ES256", "EdDSA"]).await;
    let idp = Idp::start(&all.iter().collect::<Vec<_>>());
    trust(&app, "merchant-a", ISSUER, &idp).await;
    for key in &all {
        let customer = format!("cus-{}", key.alg.to_lowercase());
        let token = sign(key, claims(&customer, "customer")).await;
        let r = app.order_as(&token, &customer).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{}", key.alg);
        let order = json_of(r).await;
        assert_eq!(order["customer_id"], customer.as_str());
        let r = app
            .get_as(
                &token,
                &format!("/orders/{}", order["id"].as_str().unwrap()),
            )
            .await;
        assert_eq!(r.status(), StatusCode::OK, "{}", key.alg);
    }
    // One fetch served every algorithm's key.
    assert_eq!(idp.hits(), 1);
}

#[tokio::test]
async fn every_bad_token_is_401_invalid_token_and_consumes_nothing() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256", "RS256", "EdDSA"]).await;
    let (own, rsa, other) = (&made[0], &made[1], &made[2]);
    let idp = Idp::start(&[own, rsa]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    // Merchant B trusts its own identity provider, with its own key.
    oncepay::api_keys::create(&app.db, "merchant-b")
        .await
        .expect("merchant b");
    let idp_b = Idp::start(&[other]);
    trust(&app, "merchant-b", "https://id.shop-b.example", &idp_b).await;

    let good = claims("alice", "customer");
    let with = |change: Value| {
        let mut c = good.clone();
        for (k, v) in change.as_object().expect("object") {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let cases: Vec<(&str, &str, Sign<'_>)> = vec![
        (
            "expired",
            "expired",
            Sign::new(own, with(json!({"exp": now() - 120}))),
        ),
        (
            "not yet valid",
            "not valid yet",
            Sign::new(own, with(json!({"nbf": now() + 300}))),
        ),
        (
            "issued in the future",
            "future",
            Sign::new(own, with(json!({"iat": now() + 600}))),
        ),
        (
            "wrong issuer",
            "issuer",
            Sign::new(own, with(json!({"iss": "https://id.evil.example"}))),
        ),
        (
            "wrong audience",
            "aud",
            Sign::new(own, with(json!({"aud": "someone-else"}))),
        ),
        (
            "no expiry",
            "exp",
            Sign::new(own, with(json!({"exp": null}))),
        ),
        (
            "no subject",
            "sub",
            Sign::new(own, with(json!({"sub": null}))),
        ),
        // What PostgreSQL cannot store is refused, never a 500.
        (
            "NUL in a seller's sub",
            "sub",
            Sign::new(own, with(json!({"sub": "staff\u{0}", "roles": ["seller"]}))),
        ),
        (
            "NUL in the issuer",
            "issuer",
            Sign::new(own, with(json!({"iss": format!("{ISSUER}\u{0}")}))),
        ),
        (
            "unknown kid",
            "kid",
            Sign {
                kid: Some("no-such-kid".into()),
                ..Sign::new(own, good.clone())
            },
        ),
        (
            "alg none",
            "alg",
            Sign {
                alg: Some("none"),
                ..Sign::new(own, good.clone())
            },
        ),
        (
            "HS256 signed with the public key",
            "alg",
            Sign {
                alg: Some("HS256"),
                ..Sign::new(rsa, good.clone())
            },
        ),
        // Another merchant's issuer's key, claiming this issuer: under its
        // own kid (not in this issuer's set) and under this issuer's kid
        // (whose key does not verify it).
        (
            "another merchant's key",
            "kid",
            Sign::new(other, good.clone()),
        ),
        (
            "another merchant's key under this issuer's kid",
            "alg",
            Sign {
                alg: Some("EdDSA"),
                kid: Some(own.kid.clone()),
                ..Sign::new(other, good.clone())
            },
        ),
        (
            "a key of its own alg under another key's kid",
            "alg",
            Sign {
                kid: Some(own.kid.clone()),
                ..Sign::new(rsa, good.clone())
            },
        ),
    ];
    let names: Vec<(&str, &str)> = cases.iter().map(|(n, why, _)| (*n, *why)).collect();
    let mut tokens = sign_all(cases.into_iter().map(|(_, _, s)| s).collect()).await;
    // A tampered payload: a valid token whose payload now names another
    // customer, the signature left as it was.
    let valid = sign(own, good.clone()).await;
    let parts: Vec<&str> = valid.split('.').collect();
    let forged_payload = URL_SAFE_NO_PAD.encode(with(json!({"sub": "mallory"})).to_string());
    tokens.push(format!("{}.{forged_payload}.{}", parts[0], parts[2]));
    let names: Vec<(&str, &str)> = names
        .into_iter()
        .chain([("tampered payload", "signature")])
        .collect();

    let before = app.everything().await;
    for ((name, why), token) in names.iter().zip(&tokens) {
        let idem = format!("bad-token-{}", Uuid::new_v4());
        let mut body = order_body();
        body["customer_id"] = json!("alice");
        let r = app
            .call_as(token, Method::POST, "/orders", Some(&idem), Some(&body))
            .await;
        assert_invalid_token(r, token, name, why).await;
        let r = app.get_as(token, "/orders").await;
        assert_invalid_token(r, token, name, why).await;
    }
    assert_eq!(
        app.everything().await,
        before,
        "a refused token wrote nothing"
    );
    // The valid token works, so every refusal above was the token's.
    let r = app.order_as(&valid, "alice").await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_key_rotation_is_followed_without_a_restart() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = app_with_refresh("300ms").await;
    let made = keys(&["ES256", "ES256"]).await;
    let (old, new) = (&made[0], &made[1]);
    let idp = Idp::start(&[old]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let old_token = sign(old, claims("alice", "customer")).await;
    let new_token = sign(new, claims("alice", "customer")).await;
    assert_eq!(
        app.get_as(&old_token, "/orders").await.status(),
        StatusCode::OK
    );
    // The provider publishes the new key and removes the old one.
    idp.publish(&[new]);
    let followed = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        app.get_as(&new_token, "/orders").await.status() == StatusCode::OK
    })
    .await;
    assert!(followed.is_ok(), "the new key was never fetched");
    let r = app.get_as(&old_token, "/orders").await;
    assert_invalid_token(r, &old_token, "the removed key", "kid").await;
}

#[tokio::test]
async fn forged_kids_fetch_the_jwks_at_most_once_per_interval() {
    if !pyjwt_or_skip() {
        return;
    }
    let min_refresh = Duration::from_secs(2);
    let app = app_with_refresh("2s").await;
    let made = keys(&["EdDSA"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let forged: Vec<String> = sign_all(
        (0..40)
            .map(|i| Sign {
                kid: Some(format!("forged-{i}")),
                ..Sign::new(key, claims("alice", "customer"))
            })
            .collect(),
    )
    .await;
    let burst = |tokens: Vec<String>| {
        let app = &app;
        async move {
            let answers =
                futures_all(tokens.iter().map(|t| app.get_as(t, "/orders")).collect()).await;
            for r in answers {
                assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
            }
        }
    };
    // A cold cache: forty forged kids at once make one fetch.
    burst(forged.clone()).await;
    assert_eq!(idp.hits(), 1, "one fetch for the whole burst");
    // The real key was in that fetch: no more.
    let good = sign(key, claims("alice", "customer")).await;
    assert_eq!(app.get_as(&good, "/orders").await.status(), StatusCode::OK);
    burst(forged.clone()).await;
    assert_eq!(idp.hits(), 1, "no fetch within the interval");
    // The next interval allows one more, whatever the burst.
    tokio::time::sleep(min_refresh).await;
    burst(forged).await;
    assert_eq!(idp.hits(), 2, "one fetch in the next interval");
}

/// Runs futures at once (no ordering between them) and returns their
/// outputs in order.
async fn futures_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut pinned: Vec<std::pin::Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = pinned.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    done.into_iter()
        .map(|d| d.expect("every future ran"))
        .collect()
}

#[tokio::test]
async fn an_identity_provider_that_is_down_leaves_cached_keys_working() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = app_with_refresh("300ms").await;
    let made = keys(&["RS256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let token = sign(key, claims("alice", "customer")).await;
    assert_eq!(app.get_as(&token, "/orders").await.status(), StatusCode::OK);
    assert_eq!(idp.hits(), 1);
    idp.set_down(true);
    // Past the set's freshness, a request tries to refresh it, fails, and
    // is still served with the key held.
    let tried = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        let ok = app.get_as(&token, "/orders").await.status() == StatusCode::OK;
        assert!(
            ok,
            "a cached key stopped working while the provider was down"
        );
        idp.hits() >= 2
    })
    .await;
    assert!(tried.is_ok(), "the stale set was never refreshed");
    assert_eq!(app.get_as(&token, "/orders").await.status(), StatusCode::OK);
    // A provider down before any key of it is held: not the token's fault,
    // so not a 401 that would sign the user out.
    oncepay::api_keys::create(&app.db, "merchant-b")
        .await
        .expect("merchant b");
    let idp_b = Idp::start(&[key]);
    idp_b.set_down(true);
    trust(&app, "merchant-b", "https://id.shop-b.example", &idp_b).await;
    let mut b_claims = claims("carol", "customer");
    b_claims["iss"] = json!("https://id.shop-b.example");
    let b_token = sign(key, b_claims).await;
    let r = app.get_as(&b_token, "/orders").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_of(r).await["code"], "service_unavailable");
}

/// A customer's order (and, with `paid`, its payment).
async fn customer_order(
    app: &TestApp,
    token: &str,
    customer: &str,
    paid: bool,
) -> (String, Option<String>) {
    let r = app.order_as(token, customer).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let order = json_of(r).await["id"].as_str().unwrap().to_string();
    if !paid {
        return (order, None);
    }
    let idem = Uuid::new_v4().to_string();
    let body = json!({"order_id": order, "payment_method": "tok_visa"});
    let r = app
        .call_as(token, Method::POST, "/payments", Some(&idem), Some(&body))
        .await;
    assert!(r.status().is_success(), "{}", r.status());
    let payment = json_of(r).await["id"].as_str().unwrap().to_string();
    (order, Some(payment))
}

#[tokio::test]
async fn a_customer_reaches_only_its_own_and_another_customers_objects_are_404() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let bob = sign(key, claims("bob", "customer")).await;
    let (bob_open, _) = customer_order(&app, &bob, "bob", false).await;
    let (bob_paid, bob_payment) = customer_order(&app, &bob, "bob", true).await;
    let bob_payment = bob_payment.expect("a payment");
    let (alice_open, _) = customer_order(&app, &alice, "alice", false).await;
    let (_, alice_payment) = customer_order(&app, &alice, "alice", true).await;
    app.reconciled_to(&json!(alice_payment.expect("a payment")), "succeeded")
        .await;
    // The merchant's key sees both; bob's paid order is paid.
    app.reconciled_to(&json!(bob_payment), "succeeded").await;

    let mut checked = 0;
    for route in oncepay::http::ROUTES {
        let Access::Needs(_, customers) = route.access else {
            continue;
        };
        let method = Method::from_bytes(route.method.as_bytes()).expect("method");
        let idem = format!("cross-{}", Uuid::new_v4());
        let before = app.everything().await;
        match customers {
            Customers::Refused => {
                let path = route.path.replace("{id}", &bob_payment);
                let r = app
                    .call_as(&alice, method.clone(), &path, Some(&idem), Some(&json!({})))
                    .await;
                let status = r.status();
                let problem = json_of(r).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{route:?}: {problem}");
                assert_eq!(problem["code"], "insufficient_scope", "{route:?}");
            }
            Customers::Owning(how) => {
                let (path, body, expected, code) = match how {
                    Ownership::OrderInPath => (
                        route.path.replace("{id}", &bob_open),
                        json!({}),
                        StatusCode::NOT_FOUND,
                        "order_not_found",
                    ),
                    Ownership::PaymentInPath => (
                        route.path.replace("{id}", &bob_payment),
                        json!({}),
                        StatusCode::NOT_FOUND,
                        "payment_not_found",
                    ),
                    Ownership::CustomerInBody => {
                        let mut body = order_body();
                        body["customer_id"] = json!("bob");
                        (
                            route.path.to_string(),
                            body,
                            StatusCode::FORBIDDEN,
                            "not_owner",
                        )
                    }
                    Ownership::OrderInBody => (
                        route.path.to_string(),
                        json!({"order_id": bob_open, "payment_method": "tok_visa"}),
                        StatusCode::NOT_FOUND,
                        "order_not_found",
                    ),
                    Ownership::CustomerInPath => (
                        route.path.replace("{customer_id}", "bob") + "?currency=EUR",
                        json!({}),
                        StatusCode::FORBIDDEN,
                        "not_owner",
                    ),
                    Ownership::OwnList => {
                        // Forced to its own rows; asking for another's gets none.
                        let own = json_of(app.get_as(&alice, route.path).await).await;
                        let data = own["data"].as_array().expect("a page");
                        assert!(!data.is_empty(), "{route:?}: alice's own rows");
                        for row in data {
                            let order = row
                                .get("order_id")
                                .or_else(|| row.get("id"))
                                .and_then(Value::as_str)
                                .unwrap();
                            assert!(
                                ![bob_open.as_str(), bob_paid.as_str()].contains(&order),
                                "{route:?} shows bob's {row}"
                            );
                        }
                        let other = json_of(
                            app.get_as(&alice, &format!("{}?customer_id=bob", route.path))
                                .await,
                        )
                        .await;
                        assert_eq!(other["data"], json!([]), "{route:?}");
                        checked += 1;
                        continue;
                    }
                };
                let r = app
                    .call_as(&alice, method.clone(), &path, Some(&idem), Some(&body))
                    .await;
                let status = r.status();
                let problem = json_of(r).await;
                assert_eq!(status, expected, "{route:?}: {problem}");
                assert_eq!(problem["code"], code, "{route:?}");
            }
        }
        assert_eq!(
            app.everything().await,
            before,
            "{route:?} changed something"
        );
        checked += 1;
    }
    let guarded = oncepay::http::ROUTES
        .iter()
        .filter(|r| matches!(r.access, Access::Needs(..)))
        .count();
    assert_eq!(
        checked, guarded,
        "every route that takes a caller was checked"
    );
    // Bob's objects are as they were; alice's own answer as usual.
    assert_eq!(
        app.status_of(&format!("/orders/{bob_open}")).await,
        "awaiting_payment"
    );
    assert_eq!(app.status_of(&format!("/orders/{bob_paid}")).await, "paid");
    let r = app.get_as(&alice, &format!("/orders/{alice_open}")).await;
    assert_eq!(r.status(), StatusCode::OK);
    // Its own balance and its transactions: zeros, an empty page.
    let own = app
        .get_as(&alice, "/customers/alice/balance?currency=EUR")
        .await;
    assert_eq!(own.status(), StatusCode::OK);
    let own = json_of(own).await;
    assert_eq!(
        (own["customer_id"].clone(), own["available"].clone()),
        (json!("alice"), json!(0))
    );
    let own = app
        .get_as(&alice, "/customers/alice/balance/transactions")
        .await;
    assert_eq!(own.status(), StatusCode::OK);
    assert_eq!(json_of(own).await["data"], json!([]));
    let r = app
        .call_as(
            &alice,
            Method::POST,
            &format!("/orders/{alice_open}/checkout"),
            Some(&Uuid::new_v4().to_string()),
            Some(&json!({})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // A customer cancels its unpaid order, never a paid one (that refunds).
    let r = app
        .call_as(
            &bob,
            Method::POST,
            &format!("/orders/{bob_paid}/cancel"),
            Some(&Uuid::new_v4().to_string()),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.count("SELECT count(*) FROM refund").await, 0);
    let r = app
        .call_as(
            &bob,
            Method::POST,
            &format!("/orders/{bob_open}/cancel"),
            Some(&Uuid::new_v4().to_string()),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn two_customers_and_a_merchant_key_racing_one_idempotency_key_get_three_outcomes() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["PS256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let bob = sign(key, claims("bob", "customer")).await;
    let shared_key = "one-key-for-everyone";
    let body_for = |customer: &str| {
        let mut body = order_body();
        body["customer_id"] = json!(customer);
        body.as_object_mut().expect("object").remove("metadata");
        body
    };
    let (a, b, m) = (body_for("alice"), body_for("bob"), body_for("alice"));
    // The merchant's key sends alice's very body under the same key:
    // neither replays the other.
    let callers = [(&alice, &a), (&bob, &b), (&app.key, &m)];
    let answers = futures_all(
        callers
            .iter()
            .map(|(bearer, body)| {
                app.call_as(
                    bearer,
                    Method::POST,
                    "/orders",
                    Some(shared_key),
                    Some(body),
                )
            })
            .collect(),
    )
    .await;
    let mut ids = Vec::new();
    for r in answers {
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(r.headers().get("idempotent-replayed").is_none());
        ids.push(json_of(r).await["id"].as_str().unwrap().to_string());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3, "three independent orders");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 3);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record").await,
        3,
        "three records, one per principal"
    );
    // Each repeat replays its own principal's answer.
    let r = app
        .call_as(&alice, Method::POST, "/orders", Some(shared_key), Some(&a))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    let replayed = json_of(r).await;
    assert_eq!(replayed["customer_id"], "alice");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 3);
}

#[tokio::test]
async fn a_seller_acts_as_a_write_key_and_never_as_admin() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["EdDSA"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let mut seller_claims = claims("staff-7", "seller");
    seller_claims["roles"] = json!(["seller", "admin"]);
    let seller = sign(key, seller_claims).await;
    // Any customer's order, and reads of what customers may not read.
    let r = app.order_as(&seller, "anyone").await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(
        app.get_as(&seller, "/refunds").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        app.get_as(&seller, "/events").await.status(),
        StatusCode::OK
    );
    for (method, path) in [
        (Method::GET, "/api_keys"),
        (Method::GET, "/audit_events"),
        (Method::POST, "/webhook_endpoints"),
        (Method::POST, "/api_keys"),
    ] {
        let r = app
            .call_as(
                &seller,
                method.clone(),
                path,
                Some("seller-admin"),
                Some(&json!({})),
            )
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{method} {path}");
        assert_eq!(json_of(r).await["code"], "insufficient_scope");
    }
    // A token with no role oncepay knows may call nothing.
    let mut nobody = claims("guest", "customer");
    nobody["roles"] = json!(["viewer"]);
    let nobody = sign(key, nobody).await;
    let r = app.get_as(&nobody, "/orders").await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn events_and_audit_rows_name_who_acted() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let (order, payment) = customer_order(&app, &alice, "alice", true).await;
    let payment = payment.expect("payment");
    // The payment's first event was written by alice's request.
    let trail = json_of(app.get(&format!("/payments/{payment}/events")).await).await;
    let first = &trail["data"][0];
    assert_eq!(
        first["actor"],
        json!({"type": "customer", "sub": "alice", "issuer": ISSUER}),
        "{first}"
    );
    // A merchant key's change names the key.
    let other = app.create_order().await;
    let r = app
        .post(
            &format!("/orders/{other}/cancel"),
            &Uuid::new_v4().to_string(),
            &json!({}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    let trail = json_of(app.get(&format!("/orders/{other}/events")).await).await;
    let cancelled = &trail["data"][0];
    assert_eq!(cancelled["actor"]["type"], "api_key", "{cancelled}");
    assert!(cancelled["actor"]["id"].is_string());
    // Setting the identity provider was audited, as the CLI.
    let audit = json_of(app.get("/audit_events").await).await;
    let set = audit["data"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row["action"] == "merchant.identity_changed")
        .cloned()
        .expect("the identity change is in the trail");
    assert_eq!(set["actor_type"], "cli");
    assert_eq!(set["change"]["after"]["issuer"], ISSUER);
    let _ = order;
}

#[tokio::test]
async fn the_cli_sets_shows_and_removes_a_merchants_identity_provider() {
    let app = spawn_app().await;
    let db_url = app
        .serve_env
        .iter()
        .find(|(n, _)| *n == "DATABASE_URL")
        .map(|(_, v)| v.clone())
        .expect("database url");
    let run = |args: Vec<&str>| {
        let db_url = db_url.clone();
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        async move {
            let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"))
                .args(&args)
                .env("DATABASE_URL", db_url)
                .env("ONCEPAY_LOG", "warn")
                .output()
                .await
                .expect("oncepay runs");
            (
                out.status.success(),
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            )
        }
    };
    let (ok, text) = run(vec![
        "merchant",
        "identity",
        "--merchant",
        "merchant-a",
        "--issuer",
        ISSUER,
        "--jwks-url",
        "https://id.shop-a.example/jwks.json",
        "--audience",
        AUDIENCE,
        "--roles-claim",
        "https://shop-a.example/roles",
        "--token-type",
        "at+jwt",
        "--algorithms",
        "ES256,EdDSA",
    ])
    .await;
    assert!(ok, "{text}");
    let (ok, text) = run(vec!["merchant", "show", "--merchant", "merchant-a"]).await;
    assert!(ok, "{text}");
    assert!(text.contains(ISSUER) && text.contains(AUDIENCE), "{text}");
    assert!(text.contains("https://shop-a.example/roles"), "{text}");
    assert!(text.contains("identity.token_type: at+jwt"), "{text}");
    assert!(text.contains("identity.algorithms: ES256,EdDSA"), "{text}");
    // One issuer, one merchant.
    oncepay::api_keys::create(&app.db, "merchant-b")
        .await
        .expect("b");
    let (ok, text) = run(vec![
        "merchant",
        "identity",
        "--merchant",
        "merchant-b",
        "--issuer",
        ISSUER,
        "--jwks-url",
        "https://id.shop-a.example/jwks.json",
        "--audience",
        AUDIENCE,
    ])
    .await;
    assert!(!ok, "{text}");
    // Plain http only to loopback.
    let (ok, _) = run(vec![
        "merchant",
        "identity",
        "--merchant",
        "merchant-b",
        "--issuer",
        "https://b.example",
        "--jwks-url",
        "http://b.example/jwks.json",
        "--audience",
        AUDIENCE,
    ])
    .await;
    assert!(!ok);
    let (ok, text) = run(vec![
        "merchant",
        "identity",
        "--merchant",
        "merchant-a",
        "--remove",
    ])
    .await;
    assert!(ok, "{text}");
    let (ok, text) = run(vec!["merchant", "show", "--merchant", "merchant-a"]).await;
    assert!(ok && text.contains("identity: none"), "{text}");
    assert_eq!(
        app.count("SELECT count(*) FROM audit_event WHERE action = 'merchant.identity_changed' AND actor_type = 'cli'")
            .await,
        2
    );
}

// The security review of issue 47: each defect's test over HTTP.

/// Merchant `name`'s own rate limit: `per_second`, `burst`.
async fn own_limit(app: &TestApp, name: &str, per_second: i64, burst: i64) {
    assert!(oncepay::store::merchants::set_rate_limit(
        &app.db,
        name,
        oncepay::rate_limit::Limit::new(per_second, burst),
        &oncepay::audit::Actor::cli(),
    )
    .await
    .expect("rate limit set"));
}

/// Sends `n` requests (`call(i)` is the i-th) and counts those admitted
/// (any answer but `429`), with the most a `per_second`/`burst` limit may
/// admit in the time they took.
async fn admitted<F, Fut>(n: usize, per_second: u64, burst: u64, call: F) -> (u64, u64)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = reqwest::Response>,
{
    let started = std::time::Instant::now();
    let mut admitted = 0;
    for i in 0..n {
        let r = call(i).await;
        if r.status() == StatusCode::TOO_MANY_REQUESTS {
            assert!(r.headers().get("retry-after").is_some());
            assert_eq!(json_of(r).await["code"], "rate_limited");
        } else {
            admitted += 1;
        }
    }
    let most = burst + per_second * (started.elapsed().as_secs() + 1);
    (admitted, most)
}

#[tokio::test]
async fn a_token_counts_against_its_merchants_own_limit_in_the_bucket_of_its_keys() {
    if !pyjwt_or_skip() {
        return;
    }
    // A generous process default: the merchant's own, stricter limit is
    // the one its tokens must be held to.
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_RATE_LIMIT_PER_SECOND", "1000")
            .serve("ONCEPAY_RATE_LIMIT_BURST", "1000"),
    )
    .await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let seller = sign(key, claims("staff-1", "seller")).await;
    own_limit(&app, "merchant-a", 1, 3).await;
    // A key verified after the change, so it carries the merchant's limit.
    let api_key = oncepay::api_keys::create(&app.db, "merchant-a")
        .await
        .expect("key");
    // Tokens alone.
    let (n, most) = admitted(8, 1, 3, |_| app.get_as(&alice, "/orders")).await;
    assert!(n <= most, "a customer token: {n} admitted, at most {most}");
    tokio::time::sleep(Duration::from_secs(4)).await; // the bucket refills
                                                      // Keys and tokens alternating share one bucket: no kind of caller
                                                      // starts it over.
    let (n, most) = admitted(12, 1, 3, |i| {
        let bearer = match i % 3 {
            0 => &api_key,
            1 => &alice,
            _ => &seller,
        };
        app.get_as(bearer, "/orders")
    })
    .await;
    assert!(n <= most, "keys and tokens: {n} admitted, at most {most}");
}

#[tokio::test]
async fn a_customers_requests_for_objects_it_does_not_own_are_throttled() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let bob = sign(key, claims("bob", "customer")).await;
    let (bob_order, _) = customer_order(&app, &bob, "bob", false).await;
    own_limit(&app, "merchant-a", 1, 3).await;
    // Each `404` costs an ownership query: probing ids is throttled like
    // any other request, before the query.
    let (n, most) = admitted(10, 1, 3, |i| {
        let path = if i % 2 == 0 {
            format!("/orders/{}", Uuid::new_v4())
        } else {
            format!("/orders/{bob_order}")
        };
        let (app, alice) = (&app, &alice);
        async move { app.get_as(alice, &path).await }
    })
    .await;
    assert!(n <= most, "{n} probes answered, at most {most}");
}

#[tokio::test]
async fn a_customer_token_cannot_choose_the_checkouts_and_payments_redirects() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let (order, _) = customer_order(&app, &alice, "alice", false).await;
    let checkout = format!("/orders/{order}/checkout");
    let cases = [
        (
            checkout.as_str(),
            json!({"success_url": "https://phish.example/ok"}),
            "success_url",
        ),
        (
            checkout.as_str(),
            json!({"cancel_url": "https://phish.example/no"}),
            "cancel_url",
        ),
        (
            "/payments",
            json!({"order_id": order, "payment_method": "tok_visa", "return_url": "https://phish.example/back"}),
            "return_url",
        ),
    ];
    for (path, body, field) in cases {
        let before = app.everything().await;
        let idem = Uuid::new_v4().to_string();
        let r = app
            .call_as(&alice, Method::POST, path, Some(&idem), Some(&body))
            .await;
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{field}");
        let problem = json_of(r).await;
        assert_eq!(problem["code"], "insufficient_scope", "{field}: {problem}");
        assert_eq!(problem["field"], field, "{problem}");
        assert_eq!(app.everything().await, before, "{field}: something changed");
        // Nothing consumed: the key serves the request without the field.
        let mut without = body.clone();
        without.as_object_mut().unwrap().remove(field);
        let r = app
            .call_as(&alice, Method::POST, path, Some(&idem), Some(&without))
            .await;
        assert!(r.status().is_success(), "{field}: {}", r.status());
    }
    // The merchant's key chooses them.
    let idem = Uuid::new_v4().to_string();
    let (order_b, _) = customer_order(&app, &alice, "alice", false).await;
    let r = app
        .call_as(
            &app.key,
            Method::POST,
            &format!("/orders/{order_b}/checkout"),
            Some(&idem),
            Some(&json!({"success_url": "https://shop.example/ok", "cancel_url": "https://shop.example/no"})),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn keys_held_past_jwks_stale_max_are_dropped_while_the_provider_is_down() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_JWKS_MIN_REFRESH", "300ms")
            .serve("ONCEPAY_JWKS_STALE_MAX", "1s"),
    )
    .await;
    let made = keys(&["RS256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let token = sign(key, claims("alice", "customer")).await;
    assert_eq!(app.get_as(&token, "/orders").await.status(), StatusCode::OK);
    idp.set_down(true);
    // A key the provider may have removed is not trusted for ever: past
    // its freshness and ONCEPAY_JWKS_STALE_MAX it is dropped, and the
    // answer is the one given when no key is held.
    let dropped = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        app.get_as(&token, "/orders").await.status() == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(
        dropped.is_ok(),
        "a stale key kept working past ONCEPAY_JWKS_STALE_MAX"
    );
    let r = app.get_as(&token, "/orders").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json_of(r).await["code"], "service_unavailable");
    // The provider back: its keys work again.
    idp.set_down(false);
    let back = oncepay_testkit::ready::until(Duration::from_secs(10), || async {
        app.get_as(&token, "/orders").await.status() == StatusCode::OK
    })
    .await;
    assert!(back.is_ok(), "the keys never came back");
}

#[tokio::test]
async fn a_customer_cancelling_its_paid_order_is_refused_and_consumes_nothing() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let (paid, _) = customer_order(&app, &alice, "alice", true).await;
    let (open, _) = customer_order(&app, &alice, "alice", false).await;
    let before = app.everything().await;
    let idem = Uuid::new_v4().to_string();
    let r = app
        .call_as(
            &alice,
            Method::POST,
            &format!("/orders/{paid}/cancel"),
            Some(&idem),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(json_of(r).await["code"], "insufficient_scope");
    assert_eq!(app.everything().await, before, "the refusal was stored");
    // The key is still free: it cancels the unpaid order.
    let r = app
        .call_as(
            &alice,
            Method::POST,
            &format!("/orders/{open}/cancel"),
            Some(&idem),
            None,
        )
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["status"], "cancelled");
}

#[tokio::test]
async fn claims_that_do_not_fit_an_integer_are_still_enforced() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let mut far = claims("alice", "customer");
    far["nbf"] = json!(1e20);
    let token = sign(key, far).await;
    assert_invalid_token(
        app.get_as(&token, "/orders").await,
        &token,
        "nbf 1e20",
        "not valid yet",
    )
    .await;
    let mut fractional = claims("alice", "customer");
    fractional["nbf"] = json!(now() as f64 + 600.5);
    let token = sign(key, fractional).await;
    assert_invalid_token(
        app.get_as(&token, "/orders").await,
        &token,
        "nbf fractional",
        "not valid yet",
    )
    .await;
    let mut expired = claims("alice", "customer");
    expired["exp"] = json!(now() as f64 - 600.5);
    let token = sign(key, expired).await;
    assert_invalid_token(
        app.get_as(&token, "/orders").await,
        &token,
        "exp fractional",
        "expired",
    )
    .await;
    let mut negative = claims("alice", "customer");
    negative["exp"] = json!(-1);
    let token = sign(key, negative).await;
    let r = app.get_as(&token, "/orders").await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "exp -1");
}

#[tokio::test]
async fn a_customer_token_cannot_set_an_orders_metadata() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    let mut body = order_body();
    body["customer_id"] = json!("alice");
    body["metadata"] = json!({"fulfilment": "skip-payment-check"});
    let before = app.everything().await;
    let idem = Uuid::new_v4().to_string();
    let r = app
        .call_as(&alice, Method::POST, "/orders", Some(&idem), Some(&body))
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "insufficient_scope", "{problem}");
    assert_eq!(problem["field"], "metadata", "{problem}");
    assert_eq!(app.everything().await, before, "something changed");
    body.as_object_mut().unwrap().remove("metadata");
    let r = app
        .call_as(&alice, Method::POST, "/orders", Some(&idem), Some(&body))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    // The merchant's key sets it.
    let mut body = order_body();
    body["metadata"] = json!({"fulfilment": "warehouse-2"});
    let idem = Uuid::new_v4().to_string();
    let r = app
        .call_as(&app.key, Method::POST, "/orders", Some(&idem), Some(&body))
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
}

// Issue 54: the edges of authentication.

#[tokio::test]
async fn a_tokens_scheme_is_case_insensitive_and_its_403_is_titled_for_a_token() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let alice = sign(key, claims("alice", "customer")).await;
    // RFC 7235: `bearer` is `Bearer`.
    for scheme in ["bearer", "BEARER"] {
        let r = app
            .http
            .get(format!("{}/orders", app.base))
            .header("Authorization", format!("{scheme} {alice}"))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), StatusCode::OK, "{scheme}");
    }
    // A customer's refusal no longer speaks of an API key; same code.
    let r = app.get_as(&alice, "/refunds").await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let problem = json_of(r).await;
    assert_eq!(problem["code"], "insufficient_scope", "{problem}");
    assert_eq!(
        problem["title"], "The credentials lack the scope this needs",
        "{problem}"
    );
}

#[tokio::test]
async fn a_token_of_another_kind_is_refused_and_a_merchant_may_require_one_type() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let typed = |typ: Value| Sign {
        typ: Some(typ),
        ..Sign::new(key, claims("alice", "customer"))
    };
    let types = [
        json!("JWT"),
        json!(null),
        json!("at+jwt"),
        json!("application/AT+JWT"),
        json!("logout+jwt"),
        json!("secevent+jwt"),
        json!("application/dpop+jwt"),
        json!(["JWT"]),
    ];
    let tokens = sign_all(types.iter().map(|t| typed(t.clone())).collect()).await;
    // By default a sign-in's tokens: `JWT`, `at+jwt` or no `typ`; a
    // logout token, a security event or a DPoP proof the same provider
    // signed with the same key is not one.
    for (typ, token) in types.iter().zip(&tokens) {
        let r = app.get_as(token, "/orders").await;
        match typ.as_str() {
            Some("JWT" | "at+jwt" | "application/AT+JWT") | None if !typ.is_array() => {
                assert_eq!(r.status(), StatusCode::OK, "typ {typ}")
            }
            _ => assert_invalid_token(r, token, &format!("typ {typ}"), "typ").await,
        }
    }
    // `--token-type at+jwt`: that type only.
    trust_with(
        &app,
        "merchant-a",
        ISSUER,
        &idp,
        Some("at+jwt"),
        Algorithms::ALL,
    )
    .await;
    for (typ, token) in types.iter().zip(&tokens) {
        let r = app.get_as(token, "/orders").await;
        match typ.as_str() {
            Some("at+jwt" | "application/AT+JWT") => {
                assert_eq!(r.status(), StatusCode::OK, "typ {typ}")
            }
            _ => assert_invalid_token(r, token, &format!("typ {typ} with at+jwt"), "typ").await,
        }
    }
    // The CLI's own flag, shown back.
    let shown = oncepay::store::identity::of_merchant(&app.db, "merchant-a")
        .await
        .expect("read")
        .flatten()
        .expect("an identity provider");
    assert_eq!(shown.token_type.as_deref(), Some("at+jwt"));
}

#[tokio::test]
async fn an_rsa_key_naming_no_alg_verifies_one_algorithm() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["RS256"]).await;
    let mut bare = made[0].clone();
    bare.jwk.as_object_mut().expect("a JWK").remove("alg");
    let idp = Idp::start(&[&bare]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let as_alg = |alg: &'static str| Sign {
        alg: Some(alg),
        ..Sign::new(&bare, claims("alice", "customer"))
    };
    let tokens = sign_all(vec![as_alg("RS256"), as_alg("PS256")]).await;
    let (rs256, ps256) = (&tokens[0], &tokens[1]);
    // One RSA key, one algorithm: RS256 by default, never PS256 as well.
    assert_eq!(app.get_as(rs256, "/orders").await.status(), StatusCode::OK);
    let r = app.get_as(ps256, "/orders").await;
    assert_invalid_token(
        r,
        ps256,
        "PS256 by an alg-less key",
        "not a key for the token's alg",
    )
    .await;
    // A provider that signs with PS256 only says so: then PS256, and
    // RS256 is refused before any key is looked at.
    let pss = Algorithms::parse(["PS256"]).expect("algorithms");
    trust_with(&app, "merchant-a", ISSUER, &idp, None, pss).await;
    assert_eq!(app.get_as(ps256, "/orders").await.status(), StatusCode::OK);
    let r = app.get_as(rs256, "/orders").await;
    assert_invalid_token(r, rs256, "RS256 with --algorithms PS256", "signs with").await;
}

#[tokio::test]
async fn a_flood_of_tokens_of_an_unknown_issuer_costs_no_query_each() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let stranger = |issuer: &str| {
        let mut c = claims("alice", "customer");
        c["iss"] = json!(issuer);
        Sign::new(key, c)
    };
    let tokens = sign_all(vec![
        stranger("https://id.stranger.example"),
        stranger("https://id.another-stranger.example"),
    ])
    .await;
    let (seen, unseen) = (&tokens[0], &tokens[1]);
    // The first token of an unknown issuer costs the query that finds no
    // merchant trusting it.
    let r = app.get_as(seen, "/orders").await;
    assert_invalid_token(r, seen, "an unknown issuer", "issuer").await;
    // No query can read merchant_identity while this lock is held: a
    // flood of the same issuer is still answered at once, from memory.
    let mut lock = app.db.begin().await.expect("begin");
    sqlx::query("LOCK TABLE merchant_identity IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock");
    for i in 0..50 {
        let r = tokio::time::timeout(Duration::from_secs(5), app.get_as(seen, "/orders"))
            .await
            .unwrap_or_else(|_| {
                panic!("token {i} of a known-unknown issuer waited for the database")
            });
        assert_invalid_token(r, seen, "the flood", "issuer").await;
    }
    // An issuer not seen yet is asked about: it waits for the lock, so
    // the answers above did not come from the database.
    let asked =
        tokio::time::timeout(Duration::from_millis(500), app.get_as(unseen, "/orders")).await;
    assert!(
        asked.is_err(),
        "an unseen issuer was answered without a query"
    );
    lock.rollback().await.expect("unlock");
    let r = app.get_as(unseen, "/orders").await;
    assert_invalid_token(r, unseen, "the unseen issuer", "issuer").await;
    // A trusted issuer's tokens were never in the way.
    let good = sign(key, claims("alice", "customer")).await;
    assert_eq!(app.get_as(&good, "/orders").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn tokens_of_unknown_issuers_are_rate_limited_by_address() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND", "1")
            .serve("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_BURST", "5"),
    )
    .await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let mut c = claims("alice", "customer");
    c["iss"] = json!("https://id.stranger.example");
    let stranger = sign(key, c).await;
    let good = sign(key, claims("alice", "customer")).await;
    // Credentials that authenticate someone count nothing.
    for _ in 0..20 {
        assert_eq!(app.get_as(&good, "/orders").await.status(), StatusCode::OK);
    }
    let first = app.get_as(&stranger, "/orders").await;
    assert_invalid_token(first, &stranger, "the first stranger", "issuer").await;
    // Then the address is held to its limit of failures, as for unknown
    // API keys (`security::unknown_api_keys_are_rate_limited_by_address`).
    let (n, most) = admitted(30, 1, 5, |_| app.get_as(&stranger, "/orders")).await;
    assert!(n <= most, "{n} failures answered, at most {most}");
    assert!(n < 30, "no failure was refused: {n} of 30 answered");
}

/// GHSA-h395-gr6q-cpjc (CVE-2026-25537; jsonwebtoken before 10.3.0, and
/// the workspace keeps 9.3 for its ring backend): a standard claim of the
/// wrong JSON type (`"nbf": "99999999999"`) parses as absent, so
/// `validate_nbf` and `validate_exp` skip it. oncepay requires `iss`,
/// `aud` and `sub` (the library refuses them absent or mistyped) and
/// checks `exp`, `nbf` and `iat` itself as JSON numbers: every mistyped
/// claim below, each in a token signed by the trusted key, is refused.
#[tokio::test]
async fn jsonwebtokens_claim_type_confusion_is_closed() {
    if !pyjwt_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let made = keys(&["ES256"]).await;
    let key = &made[0];
    let idp = Idp::start(&[key]);
    trust(&app, "merchant-a", ISSUER, &idp).await;
    let cases = [
        // The advisory's own: a far future `nbf` as a string.
        ("nbf", json!("99999999999"), "nbf"),
        ("nbf", json!([99_999_999_999i64]), "nbf"),
        ("nbf", json!({"at": 99_999_999_999i64}), "nbf"),
        ("nbf", json!(true), "nbf"),
        ("nbf", json!(null), "nbf"),
        ("exp", json!("1"), "exp"),
        ("exp", json!(null), "exp"),
        ("exp", json!([now() + 300]), "exp"),
        ("iat", json!("99999999999"), "iat"),
        ("aud", json!(7), "aud"),
        ("aud", json!({"aud": AUDIENCE}), "aud"),
        ("sub", json!(5), "sub"),
        ("sub", json!(["alice"]), "sub"),
        ("iss", json!([ISSUER]), "iss"),
    ];
    let signs = cases
        .iter()
        .map(|(claim, value, _)| {
            let mut c = claims("alice", "customer");
            c[*claim] = value.clone();
            Sign::new(key, c)
        })
        .collect();
    let tokens = sign_all(signs).await;
    for ((claim, value, _), token) in cases.iter().zip(&tokens) {
        let case = format!("{claim}: {value}");
        let r = app.get_as(token, "/orders").await;
        // Refused, whichever check names it first (a claim of the wrong
        // type may fail the token's decoding before its own check).
        assert_invalid_token(r, token, &case, "").await;
    }
    // The same token with its claims well typed is accepted: each refusal
    // was the mistyped claim's.
    let good = sign(key, claims("alice", "customer")).await;
    assert_eq!(app.get_as(&good, "/orders").await.status(), StatusCode::OK);
}
