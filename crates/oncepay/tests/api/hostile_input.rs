//! Input an attacker would send (issue 22's classes): U+0000 in every
//! string an endpoint reads, the same number in two notations, fractions
//! that must not be rounded, a webhook URL with control characters, a
//! signed provider event holding NUL, a body that stops arriving, and a
//! request head the HTTP parser refuses. Each is answered with a problem
//! document naming what is wrong, never a `500`, and changes nothing.

use std::time::Duration;

use proptest::prelude::*;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use uuid::Uuid;

use crate::helpers::*;

/// The served `openapi.yaml` as JSON (PyYAML, which schemathesis brings
/// and `make test` installs, reads it: no YAML crate in the build).
async fn openapi(app: &TestApp) -> Value {
    let text = app
        .http
        .get(format!("{}/openapi.yaml", app.base))
        .send()
        .await
        .expect("get")
        .text()
        .await
        .expect("text");
    let mut child = tokio::process::Command::new("python3")
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(text.as_bytes()).await.expect("write");
    drop(stdin);
    let out = child.wait_with_output().await.expect("python3 ran");
    assert!(
        out.status.success(),
        "PyYAML reads openapi.yaml (python3 -m pip install pyyaml)"
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// Follows a local `$ref`.
/// An operation's parameters, each `$ref` resolved.
fn parameters<'a>(doc: &'a Value, op: &'a Value) -> Vec<&'a Value> {
    op.get("parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| resolve(doc, p))
        .collect()
}

fn resolve<'a>(doc: &'a Value, v: &'a Value) -> &'a Value {
    match v.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.trim_start_matches('#');
            resolve(doc, doc.pointer(pointer).expect("a $ref that resolves"))
        }
        None => v,
    }
}

/// Ids of real objects, so that a request reaches as deep as it can.
struct Fixtures {
    order: String,
    payment: String,
    refund: String,
    token: String,
    event: String,
    endpoint: String,
}

impl Fixtures {
    async fn make(app: &TestApp) -> Fixtures {
        let paid = app.create_order().await;
        let (_, payment) = app.pay(&paid, "tok_visa").await;
        let payment = payment["id"].as_str().expect("payment").to_string();
        let refund = json_of(
            app.post(
                &format!("/payments/{payment}/refunds"),
                "fixture-refund",
                &json!({"amount": 1}),
            )
            .await,
        )
        .await["id"]
            .as_str()
            .expect("refund")
            .to_string();
        let order = app.create_order().await;
        let session = json_of(
            app.post(
                &format!("/orders/{order}/checkout"),
                "fixture-checkout",
                &json!({}),
            )
            .await,
        )
        .await;
        let token = session["url"]
            .as_str()
            .and_then(|u| u.rsplit('/').next())
            .expect("token")
            .to_string();
        let endpoint = json_of(
            app.post(
                "/webhook_endpoints",
                "fixture-endpoint",
                &json!({"url": "http://127.0.0.1:9/hook", "events": ["*"]}),
            )
            .await,
        )
        .await["id"]
            .as_str()
            .expect("endpoint")
            .to_string();
        let events = json_of(app.get("/events").await).await;
        let event = events["data"][0]["id"]
            .as_str()
            .expect("an event")
            .to_string();
        Fixtures {
            order,
            payment,
            refund,
            token,
            event,
            endpoint,
        }
    }

    /// A real value for a path parameter of `path`.
    fn path_param(&self, path: &str, name: &str) -> String {
        match (name, path.split('/').nth(1).unwrap_or_default()) {
            ("token", _) => self.token.clone(),
            ("provider", _) => "sandbox".into(),
            (_, "orders") => self.order.clone(),
            (_, "payments") => self.payment.clone(),
            (_, "refunds") => self.refund.clone(),
            (_, "events") => self.event.clone(),
            (_, "webhook_endpoints") => self.endpoint.clone(),
            _ => Uuid::now_v7().to_string(),
        }
    }
}

/// A plausible value of a schema, so that the one field made hostile is
/// what the service must refuse.
fn sample(doc: &Value, schema: &Value, name: &str, fx: &Fixtures) -> Value {
    let schema = resolve(doc, schema);
    match name {
        "order_id" => return json!(fx.order),
        "currency" => return json!("EUR"),
        "payment_method" => return json!("tok_visa"),
        "url" => return json!("http://127.0.0.1:9/hook"),
        _ => {}
    }
    if let Some(first) = schema
        .get("examples")
        .and_then(|e| e.get(0))
        .or_else(|| schema.get("example"))
        .or_else(|| schema.get("enum").and_then(|e| e.get(0)))
    {
        return first.clone();
    }
    if let Some(one) = schema.get("oneOf").or_else(|| schema.get("anyOf")) {
        return sample(doc, &one[0], name, fx);
    }
    let ty = match schema.get("type") {
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null")
            .to_string(),
        Some(Value::String(t)) => t.clone(),
        _ if schema.get("properties").is_some() => "object".into(),
        _ => "null".into(),
    };
    match ty.as_str() {
        "object" => {
            let mut out = serde_json::Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, v) in props {
                    out.insert(k.clone(), sample(doc, v, k, fx));
                }
            } else if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object())
            {
                out.insert("k".into(), sample(doc, extra, "k", fx));
            }
            Value::Object(out)
        }
        "array" => json!([sample(
            doc,
            schema.get("items").unwrap_or(&Value::Null),
            name,
            fx
        )]),
        "integer" | "number" => json!(schema
            .get("minimum")
            .and_then(Value::as_i64)
            .unwrap_or(1)
            .max(1)),
        "boolean" => json!(true),
        "string" => json!("x"),
        _ => Value::Null,
    }
}

/// JSON pointers of every string leaf and every object key in `v`
/// (a key is marked with a trailing `#key`).
fn string_places(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::String(_) => out.push(at),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                string_places(item, format!("{at}/{i}"), out);
            }
        }
        Value::Object(map) => {
            for (k, item) in map {
                out.push(format!("{at}/{k}#key"));
                string_places(item, format!("{at}/{k}"), out);
            }
        }
        _ => {}
    }
}

/// `body` with `hostile` at `place` (a leaf, or a key).
fn with_hostile(body: &Value, place: &str, hostile: &str) -> Value {
    let mut body = body.clone();
    if let Some(pointer) = place.strip_suffix("#key") {
        let (parent, key) = pointer.rsplit_once('/').expect("a key's parent");
        let map = body
            .pointer_mut(parent)
            .and_then(Value::as_object_mut)
            .expect("an object");
        let value = map.remove(key).expect("the key");
        map.insert(format!("{key}{hostile}"), value);
    } else if let Some(slot) = body.pointer_mut(place) {
        *slot = json!(hostile);
    }
    body
}

/// Where one request puts the hostile string.
#[derive(Debug, Clone)]
enum Place {
    Path(String),
    Query(String),
    Body(String),
}

/// One operation of the document and one place in it.
#[derive(Debug, Clone)]
struct Probe {
    method: Method,
    path: String,
    place: Place,
    body: Option<Value>,
    authenticated: bool,
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// Every place of every operation in `openapi.yaml` where a client can
/// put a string: path and query parameters, and body strings and keys.
fn probes(doc: &Value, fx: &Fixtures) -> Vec<Probe> {
    let mut out = Vec::new();
    let paths = doc["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for (method, op) in item.as_object().expect("path item") {
            let Ok(method) = method.to_uppercase().parse::<Method>() else {
                continue;
            };
            let params = parameters(doc, op);
            let authenticated = op.get("security") != Some(&json!([]));
            let body = op
                .pointer("/requestBody/content/application~1json/schema")
                .map(|s| sample(doc, s, "", fx));
            let probe = |place| Probe {
                method: method.clone(),
                path: path.clone(),
                place,
                body: body.clone(),
                authenticated,
            };
            for p in &params {
                let name = p["name"].as_str().expect("name").to_string();
                match p["in"].as_str() {
                    Some("path") => out.push(probe(Place::Path(name))),
                    // A DELETE with a real id would delete it: only its
                    // path is made hostile.
                    Some("query") if method != Method::DELETE => {
                        out.push(probe(Place::Query(name)))
                    }
                    _ => {}
                }
            }
            if let Some(body) = &body {
                let mut places = Vec::new();
                string_places(body, String::new(), &mut places);
                out.extend(places.into_iter().map(|p| probe(Place::Body(p))));
            }
        }
    }
    out
}

/// Sends one probe with `hostile` in its place; the answer must be a `4xx`
/// problem document with a request id.
async fn send(app: &TestApp, fx: &Fixtures, probe: &Probe, hostile: &str) {
    let mut path = probe.path.clone();
    let names: Vec<String> = path
        .split('{')
        .skip(1)
        .filter_map(|s| s.split('}').next())
        .map(str::to_string)
        .collect();
    for name in names {
        let value = match &probe.place {
            Place::Path(p) if *p == name => percent(hostile),
            _ => fx.path_param(&probe.path, &name),
        };
        path = path.replace(&format!("{{{name}}}"), &value);
    }
    if let Place::Query(name) = &probe.place {
        path = format!("{path}?{name}={}", percent(hostile));
    }
    let mut req = app
        .http
        .request(probe.method.clone(), format!("{}{path}", app.base))
        .header("Idempotency-Key", Uuid::new_v4().to_string());
    if probe.authenticated {
        req = req.bearer_auth(&app.key);
    }
    let body = match (&probe.place, &probe.body) {
        (Place::Body(place), Some(body)) => Some(with_hostile(body, place, hostile)),
        (_, body) => body.clone(),
    };
    if let Some(body) = body {
        req = req
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    let r = req.send().await.expect("sent");
    let status = r.status();
    let request_id = r.headers().get("x-request-id").cloned();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = r.text().await.unwrap_or_default();
    let what = format!(
        "{} {path} with {:?} at {:?}",
        probe.method, hostile, probe.place
    );
    assert!(
        status.is_client_error(),
        "{what}: {status} {text} (a string PostgreSQL cannot store must be refused)"
    );
    assert!(request_id.is_some(), "{what}: no X-Request-Id");
    // The checkout page itself answers a browser with an HTML page.
    if probe.method == Method::GET
        && probe.path == "/checkout/{token}"
        && !matches!(probe.place, Place::Query(_))
    {
        assert!(
            content_type.starts_with("text/html"),
            "{what}: {content_type}"
        );
        return;
    }
    assert_eq!(content_type, "application/problem+json", "{what}: {text}");
    let problem: Value = serde_json::from_str(&text).expect("problem json");
    assert!(problem["code"].is_string(), "{what}: {text}");
}

/// A string holding U+0000 among other characters a client may send:
/// control characters, DEL, C1, non-BMP, quotes and backslashes.
fn hostile_string() -> impl Strategy<Value = String> {
    let piece = "[a-z\\x01-\\x1f\\x7f\\u{80}-\\u{9f}\"\\\\/%&=?#é\\u{1F600}]{0,6}";
    (piece, piece).prop_map(|(a, b)| format!("{a}\u{0}{b}"))
}

#[test]
fn nul_in_any_string_of_any_endpoint_is_refused_never_a_500() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let app = rt.block_on(spawn_app());
    let fx = rt.block_on(Fixtures::make(&app));
    let doc = rt.block_on(openapi(&app));
    let probes = probes(&doc, &fx);
    let counted = |app: &TestApp| {
        rt.block_on(async {
            (
                app.count("SELECT count(*) FROM orders").await,
                app.count("SELECT count(*) FROM payment_attempt").await,
                app.count("SELECT count(*) FROM refund").await,
                app.count("SELECT count(*) FROM webhook_endpoint").await,
                app.count("SELECT count(*) FROM webhook_event").await,
                app.count("SELECT count(*) FROM dispute").await,
                app.count("SELECT count(*) FROM ledger_transfer").await,
                app.count("SELECT count(*) FROM payment_capture").await,
            )
        })
    };
    let before = counted(&app);
    // Every place once with the plainest hostile string ...
    for probe in &probes {
        rt.block_on(send(&app, &fx, probe, "a\u{0}b"));
    }
    // ... then random places with generated strings.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let places = probes.len();
    runner
        .run(&(0..places, hostile_string()), |(i, hostile)| {
            rt.block_on(send(&app, &fx, &probes[i], &hostile));
            Ok(())
        })
        .expect("every hostile request refused with a problem document");
    assert_eq!(counted(&app), before, "nothing was written");
    println!(
        "{} places in {} operations, each with U+0000, then 128 generated strings",
        places,
        doc["paths"].as_object().map_or(0, |p| p
            .values()
            .map(|i| i.as_object().map_or(0, |o| o.len()))
            .sum::<usize>())
    );
    assert!(
        places >= 40,
        "the document's operations yield {places} places"
    );
    // The document's operations are the route table's (a unit test of
    // `http` holds them equal), so every route was probed where it reads
    // strings.
    let methods = ["get", "post", "put", "patch", "delete"];
    let operations: usize = doc["paths"].as_object().map_or(0, |p| {
        p.values()
            .filter_map(Value::as_object)
            .flat_map(|o| o.keys())
            .filter(|k| methods.contains(&k.as_str()))
            .count()
    });
    let routed = oncepay::http::ROUTES.len();
    assert_eq!(
        operations, routed,
        "every route of the route table is in the document"
    );
}

/// Values a query parameter's schema rules out (besides U+0000), read
/// from the schema: out of range, not an integer, not an id, not a time,
/// not one of the values, too short, too long.
fn bad_values(doc: &Value, schema: &Value) -> Vec<String> {
    let schema = resolve(doc, schema);
    let mut out = Vec::new();
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        let bad = "not_one_of_them".to_string();
        assert!(!values.contains(&json!(bad)));
        out.push(bad);
    }
    if schema["type"] == "integer" {
        if let Some(min) = schema.get("minimum").and_then(Value::as_i64) {
            out.push((min - 1).to_string());
        }
        if let Some(max) = schema.get("maximum").and_then(Value::as_i64) {
            out.push((max + 1).to_string());
        }
        out.extend(["ten", "1.5", "", "-"].map(String::from));
    }
    match schema.get("format").and_then(Value::as_str) {
        Some("uuid") => out.extend(["nope", "", "0190a1b2"].map(String::from)),
        Some("date-time") => {
            out.extend(["yesterday", "2024-13-01T00:00:00Z", ""].map(String::from))
        }
        _ => {}
    }
    if schema.get("minLength").and_then(Value::as_u64) == Some(1) {
        out.push(String::new());
    }
    if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
        out.push("x".repeat(max as usize + 1));
    }
    out
}

/// Every byte of `text` percent-encoded: the same name as a client that
/// encodes everything spells it.
fn percent_all(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// Issue 48: the `field` of a query parameter's problem is the parameter's
/// name, as bare as every other problem's (it used to be `"query parameter
/// limit"` for a NUL); `detail` is where the prose says it is a query
/// parameter. Every query parameter of every `GET` in `openapi.yaml`, with
/// U+0000 in its value, in its name, after another parameter, under a name
/// spelled in percent-escapes, and, on the lists, with each value its
/// schema rules out.
#[tokio::test]
async fn a_query_parameters_problem_names_it_by_its_bare_name() {
    let app = spawn_app().await;
    let doc = openapi(&app).await;
    let (mut nul_probes, mut bad_probes, mut lists) = (0, 0, 0);
    for (path, item) in doc["paths"].as_object().expect("paths") {
        let Some(op) = item.get("get") else {
            continue;
        };
        let params: Vec<&Value> = parameters(&doc, op)
            .into_iter()
            .filter(|p| p["in"] == "query")
            .collect();
        if params.is_empty() {
            continue;
        }
        let names: Vec<&str> = params
            .iter()
            .map(|p| p["name"].as_str().expect("name"))
            .collect();
        // A list reads `limit`; the answer to a NUL comes before routing,
        // so any id fills a path parameter.
        let list = names.contains(&"limit");
        lists += usize::from(list);
        let mut route = path.clone();
        while let Some(start) = route.find('{') {
            let end = start + route[start..].find('}').expect("a closed {");
            route.replace_range(start..=end, &Uuid::now_v7().to_string());
        }
        let authenticated = op.get("security") != Some(&json!([]));
        let get = |query: String| {
            let (app, route) = (&app, route.clone());
            async move {
                let mut req = app.http.get(format!("{}{route}?{query}", app.base));
                if authenticated {
                    req = req.bearer_auth(&app.key);
                }
                let r = req.send().await.expect("sent");
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                let what = format!("GET {route}?{query}: {status} {text}");
                assert_eq!(status, StatusCode::BAD_REQUEST, "{what}");
                let problem: Value = serde_json::from_str(&text).expect("problem json");
                assert_eq!(problem["code"], "invalid_field", "{what}");
                (problem, what)
            }
        };
        for p in &params {
            let name = p["name"].as_str().expect("name");
            // Another parameter first, so the one at fault is not merely
            // the first.
            let before = if list && name != "limit" {
                "limit=5&"
            } else {
                ""
            };
            let cases = [
                (format!("{name}=a%00b"), name.to_string()),
                (format!("{name}=%00"), name.to_string()),
                (format!("{before}{name}=x%00"), name.to_string()),
                (format!("{}=a%00b", percent_all(name)), name.to_string()),
                (format!("{before}{name}%00=1"), format!("{name}\\u0000")),
            ];
            for (query, field) in cases {
                let (problem, what) = get(query).await;
                assert_eq!(problem["field"], json!(field), "{what}");
                let detail = problem["detail"].as_str().unwrap_or_default();
                assert!(
                    detail.contains(&format!("query parameter {field}")),
                    "{what}: the detail says it is a query parameter"
                );
                assert!(detail.contains("U+0000"), "{what}");
                nul_probes += 1;
            }
            if !list {
                continue;
            }
            for bad in bad_values(&doc, &p["schema"]) {
                for query in [
                    format!("{name}={}", percent(&bad)),
                    format!("{before}{name}={}", percent(&bad)),
                    format!("{}={}", percent_all(name), percent(&bad)),
                ] {
                    let (problem, what) = get(query).await;
                    assert_eq!(problem["field"], json!(name), "{what}");
                    bad_probes += 1;
                }
            }
        }
        if list {
            // A parameter the list does not read is named as sent.
            let (problem, what) = get(format!("{}=1", percent_all("colour"))).await;
            assert_eq!(problem["field"], "colour", "{what}");
        }
    }
    println!(
        "{nul_probes} probes with U+0000, {bad_probes} with other values ruled out, {lists} lists"
    );
    assert!(lists >= 5, "the five lists: {lists}");
    assert!(
        nul_probes >= 5 * 30,
        "every query parameter of every list, five ways: {nul_probes}"
    );
    assert!(bad_probes > 0);
}

#[tokio::test]
async fn a_signed_provider_event_holding_nul_is_recorded_as_rejected_once() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let (_, payment) = app.pay(&order, "tok_visa").await;
    let charge = payment["provider_charge_id"].as_str().expect("charge");
    let bad = [
        json!({"id": "evt_nul\u{0}1", "type": "charge.succeeded",
               "data": {"object": {"id": charge, "status": "succeeded"}}}),
        json!({"id": "evt_nul_2", "type": "charge.failed",
               "data": {"object": {"id": format!("{charge}\u{0}"), "status": "failed"}}}),
        json!({"id": "evt_nul_3", "type": "charge.failed",
               "data": {"object": {"id": charge, "status": "failed", "failure_message": "no\u{0}pe"}}}),
        json!({"id": "evt_nul_4", "type": "charge.succeeded", "extra\u{0}": "x",
               "data": {"object": {"id": charge, "status": "succeeded"}}}),
    ];
    for (i, event) in bad.iter().enumerate() {
        for delivery in ["first", "again"] {
            // A header cannot carry U+0000: the event's own id does.
            let (id, ts, body) = (
                format!("evt_header_{i}"),
                chrono::Utc::now().timestamp(),
                event.to_string(),
            );
            let signature =
                oncepay::standard_webhooks::WebhookSecret::dev().sign(&id, ts, body.as_bytes());
            let r = app
                .http
                .post(format!("{}/webhooks/sandbox", app.base))
                .header("webhook-id", &id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", signature)
                .body(body)
                .send()
                .await
                .expect("sent");
            let status = r.status();
            let body = json_of(r).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{delivery} delivery of {event}: accepted, so never retried: {body}"
            );
            let expected = if delivery == "first" {
                "rejected"
            } else {
                "duplicate"
            };
            assert_eq!(body["outcome"], expected, "{event}");
        }
    }
    assert_eq!(
        app.count("SELECT count(*) FROM webhook_event WHERE outcome = 'rejected' AND detail LIKE '%U+0000%'").await,
        4,
        "each kept, with why"
    );
    assert_eq!(
        app.status_of(&format!(
            "/payments/{}",
            payment["id"].as_str().expect("id")
        ))
        .await,
        "succeeded"
    );
    let metrics = app
        .http
        .get(format!("{}/metrics", app.base))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("oncepay_webhooks_total{outcome=\"rejected\"} 4")),
        "counted: {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("oncepay_webhooks_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn a_number_is_read_by_its_value_in_any_notation_and_never_rounded() {
    let app = spawn_app().await;
    let body = |quantity: &str, unit: &str| {
        format!(
            r#"{{"customer_id":"cus_1","currency":"EUR","items":[{{"sku":"a","quantity":{quantity},"unit_amount":{unit}}}]}}"#
        )
        .into_bytes()
    };
    let first = app
        .post_raw("/orders", Some("n-1"), Some(&app.key), body("2", "1250"))
        .await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first = json_of(first).await;
    for (quantity, unit) in [("2.0", "1250"), ("2e0", "1.25e3"), ("20e-1", "1250.000")] {
        let again = app
            .post_raw("/orders", Some("n-1"), Some(&app.key), body(quantity, unit))
            .await;
        assert_eq!(
            again.status(),
            StatusCode::CREATED,
            "{quantity} {unit}: the same request"
        );
        assert_eq!(again.headers()["idempotent-replayed"], "true");
        assert_eq!(json_of(again).await, first);
    }
    for (quantity, unit, field) in [
        ("2", "10000000000.00000001", "items[0].unit_amount"),
        ("2.5", "1250", "items[0].quantity"),
        ("2", "1250e-2", "items[0].unit_amount"),
    ] {
        let r = app
            .post_raw(
                "/orders",
                Some(&format!("n-{quantity}-{unit}")),
                Some(&app.key),
                body(quantity, unit),
            )
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{quantity} {unit}");
        let problem = json_of(r).await;
        assert_eq!(problem["field"], field);
        assert_eq!(problem["code"], "invalid_field");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
}

#[tokio::test]
async fn a_webhook_url_with_control_characters_is_refused_and_urls_are_stored_as_called() {
    let app = spawn_app().await;
    for (i, url) in [
        "http://127.0.0.1:9/a\nb",
        "http://127.0.0.1:9/a\tb",
        "http://127.0.0.1:9/\u{7f}",
        " http://127.0.0.1:9/",
    ]
    .iter()
    .enumerate()
    {
        let r = app
            .post(
                "/webhook_endpoints",
                &format!("url-{i}"),
                &json!({"url": url, "events": ["*"]}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{url:?}");
        let problem = json_of(r).await;
        assert_eq!(problem["field"], "url");
        assert!(problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("control characters"));
    }
    let r = app
        .post(
            "/webhook_endpoints",
            "url-ok",
            &json!({"url": "HTTP://127.0.0.1:9/a/../hooks", "events": ["*"]}),
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(json_of(r).await["url"], "http://127.0.0.1:9/hooks");
    let listed = json_of(app.get("/webhook_endpoints").await).await;
    assert_eq!(
        listed["data"][0]["url"], "http://127.0.0.1:9/hooks",
        "listed as it will be called"
    );
    assert_eq!(app.count("SELECT count(*) FROM webhook_endpoint").await, 1);
}

#[tokio::test]
async fn a_merchant_key_can_never_meet_a_checkout_pages_key() {
    let app = spawn_app().await;
    let order = app.create_order().await;
    let session = json_of(
        app.post(&format!("/orders/{order}/checkout"), "co", &json!({}))
            .await,
    )
    .await;
    let url = session["url"].as_str().expect("url").to_string();
    let session_id = session["id"].as_str().expect("id");
    // Every way a merchant could spell the page's key, used first.
    for key in [
        format!("checkout:{session_id}:k"),
        format!("checkout_{session_id}_k"),
        "k".into(),
    ] {
        let other = app.create_order().await;
        let r = app
            .post(
                "/payments",
                &key,
                &json!({"order_id": other, "payment_method": "tok_declined"}),
            )
            .await;
        assert_eq!(r.status(), StatusCode::CREATED, "{key}");
    }
    let r = app.pay_on_page(&url, "k", "tok_visa").await;
    assert_eq!(r.status(), StatusCode::CREATED, "the page's key is its own");
    let payment = json_of(r).await;
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["order_id"], order.as_str());
}

/// Opens a raw connection and sends `bytes`, then waits for the answer
/// (at most `patience`).
async fn raw_exchange(base: &str, bytes: &[u8], patience: Duration) -> (Duration, String) {
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let started = std::time::Instant::now();
    stream.write_all(bytes).await.expect("write");
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(patience, stream.read_to_end(&mut answer)).await;
    (
        started.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408_within_the_deadline() {
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_BODY_TIMEOUT", "1s")
            .serve("ONCEPAY_SLOW_BODIES_PER_CLIENT", "3"),
    )
    .await;
    let head = "POST /webhooks/sandbox HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\"".to_string();
    let (waited, answer) = raw_exchange(&app.base, head.as_bytes(), Duration::from_secs(30)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("x-request-id:"),
        "{answer}"
    );
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}, and the connection closed"
    );
    // One address holds at most three slow bodies at once; the fourth is
    // refused at once, and a prompt request from it still works. (A long
    // deadline here, so the three are still waited for when the fourth comes.)
    let app = spawn_app_with(
        Options::default()
            .serve("ONCEPAY_BODY_TIMEOUT", "60s")
            .serve("ONCEPAY_SLOW_BODIES_PER_CLIENT", "3"),
    )
    .await;
    // Four slow bodies at once from one address: whichever the server
    // meets last is refused at once, the other three are waited for.
    let mut at_once = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (base, head) = (app.base.clone(), head.clone());
        at_once.spawn(
            async move { raw_exchange(&base, head.as_bytes(), Duration::from_secs(3)).await },
        );
    }
    let answers = at_once.join_all().await;
    let refused: Vec<&String> = answers
        .iter()
        .map(|(_, answer)| answer)
        .filter(|answer| !answer.is_empty())
        .collect();
    assert_eq!(refused.len(), 1, "one of four refused: {answers:?}");
    assert!(refused[0].starts_with("HTTP/1.1 429"), "{}", refused[0]);
    assert!(
        refused[0].contains("\"code\":\"rate_limited\""),
        "{}",
        refused[0]
    );
    assert_eq!(app.get("/orders").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_head_the_parser_refuses_is_answered_with_a_problem_and_a_request_id() {
    let app = spawn_app_with(Options::default().serve("ONCEPAY_HEADER_TIMEOUT", "1s")).await;
    let cases: [(&str, &[u8], u16, &str); 5] = [
        (
            "control character in a header",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Evil: a\x01b\r\n\r\n",
            400,
            "malformed_request",
        ),
        (
            "malformed request line",
            b"GET /healthz HTTP/9\r\n\r\n",
            400,
            "malformed_request",
        ),
        (
            "NUL in the path",
            b"GET /he\x00althz HTTP/1.1\r\nHost: x\r\n\r\n",
            400,
            "malformed_request",
        ),
        (
            "a head that never ends",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n",
            408,
            "request_timeout",
        ),
        (
            "a good request, then garbage on the same connection",
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /x HTTP/1.1\r\nBad\x01: y\r\n\r\n",
            400,
            "malformed_request",
        ),
    ];
    for (what, bytes, status, code) in cases {
        let (_, answer) = raw_exchange(&app.base, bytes, Duration::from_secs(10)).await;
        // The last answer on the connection is the parser's.
        let last = answer
            .rfind("HTTP/1.1 ")
            .map_or(answer.as_str(), |at| &answer[at..]);
        assert!(
            last.starts_with(&format!("HTTP/1.1 {status} ")),
            "{what}: {answer}"
        );
        assert!(
            last.contains("content-type: application/problem+json"),
            "{what}: {answer}"
        );
        assert!(last.contains("x-request-id: "), "{what}: {answer}");
        let body = last.split("\r\n\r\n").nth(1).unwrap_or_default();
        let problem: Value =
            serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: {answer}"));
        assert_eq!(problem["status"], status, "{what}");
        assert_eq!(problem["code"], code, "{what}");
        if what.starts_with("a good request") {
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            assert_eq!(answer.matches("HTTP/1.1 ").count(), 2, "{answer}");
        }
    }
    // Ordinary requests, keep-alive included, are untouched.
    for _ in 0..3 {
        assert_eq!(app.get("/orders").await.status(), StatusCode::OK);
    }
    let head = app
        .http
        .head(format!("{}/healthz", app.base))
        .send()
        .await
        .expect("head");
    assert!(head.headers().contains_key("x-request-id"));
    assert_eq!(
        app.get("/orders").await.status(),
        StatusCode::OK,
        "after a HEAD on the same pool"
    );
}

/// Issue 48: a client pointed at `https://` on this plain-HTTP port sends
/// a TLS handshake. It is answered with a problem document its TLS stack
/// reads as "not TLS", and the server logs it once, at `INFO`: it used to
/// be refused by the HTTP parser, which actix-http logs at `ERROR`
/// (`stream error: request parse error`), once per try of the client.
#[tokio::test]
async fn a_tls_handshake_on_the_plain_port_is_answered_and_logged_once_not_as_an_error() {
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncBufReadExt;
    let (db_url, _db, _key) = migrated_database_with_key().await;
    let sandbox = spawn_binary("sandbox", "ONCEPAY_SANDBOX_BIND", &[]).await;
    let port = free_port();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_oncepay"));
    cmd.arg("serve")
        .env("ONCEPAY_LOG", "info")
        .env("ONCEPAY_BIND", format!("127.0.0.1:{port}"))
        // Nothing else to say while the test listens.
        .env("ONCEPAY_RECONCILE_INTERVAL", "1h")
        .env("ONCEPAY_SWEEP_INTERVAL", "1h")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in serve_env(&db_url, &sandbox.base) {
        cmd.env(k, v);
    }
    let mut serve = cmd.spawn().expect("spawn oncepay serve");
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut stderr = tokio::io::BufReader::new(serve.stderr.take().expect("stderr")).lines();
    let kept = lines.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            kept.lock().expect("lines").push(line);
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    oncepay_testkit::ready::until_ready(&format!("{base}/readyz"), Duration::from_secs(20))
        .await
        .expect("serve starts");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = lines.lock().expect("lines").len();

    // A real TLS client (rustls, through reqwest), once.
    let tls = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    let err = tls
        .get(format!("https://127.0.0.1:{port}/healthz"))
        .send()
        .await
        .expect_err("no TLS on this port");
    assert!(err.is_connect(), "failed in the handshake: {err:?}");
    // The bytes of a ClientHello's start, by hand: what comes back.
    let mut hello = vec![0x16, 0x03, 0x01, 0x00, 0x40, 0x01];
    hello.resize(5 + 0x40, 0);
    let (_, answer) = raw_exchange(&base, &hello, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 400 "), "{answer}");
    assert!(
        answer.contains("content-type: application/problem+json"),
        "{answer}"
    );
    assert!(answer.contains("x-request-id: "), "{answer}");
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    let problem: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{answer}"));
    assert_eq!(problem["code"], "malformed_request");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("TLS handshake") && d.contains("http://")),
        "{problem}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let said: Vec<String> = lines.lock().expect("lines")[before..].to_vec();
    assert!(
        said.iter().all(|l| !l.contains("ERROR")),
        "nothing at ERROR: {said:#?}"
    );
    assert_eq!(said.len(), 2, "one line a handshake: {said:#?}");
    for line in &said {
        assert!(line.contains(" INFO "), "{line}");
        assert!(line.contains("TLS handshake"), "{line}");
        assert!(line.contains("request_id="), "{line}");
    }
    // The port still serves HTTP.
    let ok = reqwest::get(format!("{base}/healthz")).await.expect("get");
    assert_eq!(ok.status(), StatusCode::OK);
    serve.start_kill().expect("SIGKILL");
    let _ = serve.wait().await;
    let _ = reader.await;
}

/// `oncepay serve` in a mount namespace of its own whose `/etc/hosts` is
/// `hosts` (bind-mounted), so the test decides what every name resolves
/// to, and can change it while the service runs (DNS rebinding).
async fn serve_with_hosts(
    hosts: &std::path::Path,
    env: &[(&str, String)],
) -> (tokio::process::Child, String) {
    let port = free_port();
    let mut cmd = tokio::process::Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount --bind \"$ONCEPAY_TEST_HOSTS\" /etc/hosts && exec \"$ONCEPAY_TEST_BIN\" serve")
        .env("ONCEPAY_TEST_HOSTS", hosts)
        .env("ONCEPAY_TEST_BIN", env!("CARGO_BIN_EXE_oncepay"))
        .env("ONCEPAY_BIND", format!("127.0.0.1:{port}"))
        .env("ONCEPAY_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd
        .spawn()
        .expect("unshare (util-linux) runs oncepay serve in its own mount namespace");
    let base = format!("http://127.0.0.1:{port}");
    oncepay_testkit::ready::until_ready(&format!("{base}/readyz"), Duration::from_secs(20))
        .await
        .unwrap_or_else(|e| panic!("oncepay serve under unshare (root needed): {e}"));
    (child, base)
}

#[tokio::test]
async fn a_name_that_turns_private_after_registration_is_refused_at_delivery() {
    use oncepay_testkit::receiver::{Policy, Receiver};
    let (db_url, db, key) = migrated_database_with_key().await;
    let sandbox = spawn_binary("sandbox", "ONCEPAY_SANDBOX_BIND", &[]).await;
    let receiver = Receiver::start(Policy::Accept).expect("receiver");
    let port = receiver
        .url()
        .trim_start_matches("http://127.0.0.1:")
        .split('/')
        .next()
        .expect("port")
        .to_string();
    let dir = std::env::temp_dir().join(format!("oncepay-hosts-{}", Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("dir");
    let hosts = dir.join("hosts");
    // Public at registration: 93.184.216.34 (a documented public address;
    // nothing is ever sent to it, only resolved). The other name is private.
    std::fs::write(
        &hosts,
        "127.0.0.1 localhost\n93.184.216.34 hooks.rebind.test\n10.1.2.3 inside.rebind.test\n",
    )
    .expect("hosts");
    let mut env = serve_env(&db_url, &sandbox.base);
    env.retain(|(k, _)| *k != "ONCEPAY_WEBHOOK_ALLOW_PRIVATE");
    env.push(("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", "false".into()));
    env.push(("ONCEPAY_WEBHOOK_SCHEDULE", "100ms,100ms".into()));
    env.push(("ONCEPAY_WEBHOOK_INTERVAL", "50ms".into()));
    let (_serve, base) = serve_with_hosts(&hosts, &env).await;
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{base}{path}"))
            .bearer_auth(&key)
            .header("Idempotency-Key", Uuid::new_v4().to_string())
            .json(&body)
            .send()
    };
    let refused = post(
        "/webhook_endpoints",
        json!({"url": format!("http://inside.rebind.test:{port}/hook"), "events": ["*"]}),
    )
    .await
    .expect("sent");
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem = json_of(refused).await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("10.1.2.3"),
        "{problem}"
    );
    let registered = post(
        "/webhook_endpoints",
        json!({"url": format!("http://hooks.rebind.test:{port}/hook"), "events": ["*"]}),
    )
    .await
    .expect("sent");
    assert_eq!(
        registered.status(),
        StatusCode::CREATED,
        "public when registered"
    );
    // The name now answers loopback, where the receiver listens: had the
    // guard not resolved again at delivery, the receiver would get it.
    std::fs::write(&hosts, "127.0.0.1 localhost\n127.0.0.1 hooks.rebind.test\n").expect("rebind");
    let order = json_of(post("/orders", order_body()).await.expect("order")).await;
    let paid = post(
        "/payments",
        json!({"order_id": order["id"], "payment_method": "tok_visa"}),
    )
    .await
    .expect("pay");
    assert_eq!(paid.status(), StatusCode::CREATED);
    let refused = oncepay_testkit::ready::until(Duration::from_secs(15), || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM webhook_attempt WHERE error LIKE '%hooks.rebind.test is 127.0.0.1%'",
        )
        .fetch_one(&db)
        .await
        .unwrap_or(0)
            >= 2
    })
    .await;
    assert!(
        refused.is_ok(),
        "every delivery to the rebound name is refused, naming it"
    );
    assert!(receiver.received().is_empty(), "nothing reached 127.0.0.1");
    let _ = std::fs::remove_dir_all(&dir);
}
