//! Orders, auth, validation and hostile input (contract sections 2 and 3).

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

#[tokio::test]
async fn an_order_is_created_with_location_and_read_back() {
    let app = spawn_app().await;
    let r = app.post("/orders", "k", &order_body()).await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let location = r.headers()["location"].to_str().expect("ascii").to_string();
    let created = json_of(r).await;
    assert_eq!(
        location,
        format!("/orders/{}", created["id"].as_str().expect("id"))
    );
    assert_eq!(created["amount"], 2 * 1250 + 300);
    assert_eq!(created["status"], "awaiting_payment");
    assert_eq!(created["metadata"]["channel"], "web");
    let id = uuid::Uuid::parse_str(created["id"].as_str().expect("id")).expect("uuid");
    assert_eq!(id.get_version_num(), 7, "ids are UUID v7");
    let read = json_of(app.get(&location).await).await;
    assert_eq!(read, created);
}

#[tokio::test]
async fn missing_or_unknown_api_keys_are_401() {
    let app = spawn_app().await;
    let body = order_body().to_string().into_bytes();
    for key in [None, Some("opk_not_a_real_key")] {
        let r = app.post_raw("/orders", Some("k"), key, body.clone()).await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(json_of(r).await["code"], "unauthorized");
    }
    let r = app
        .http
        .get(format!("{}/orders/{}", app.base, uuid::Uuid::now_v7()))
        .send()
        .await
        .expect("sent");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
}

#[tokio::test]
async fn another_merchants_resources_are_404_everywhere() {
    let app = spawn_app().await;
    let order_id = app.create_order().await;
    let (_, payment) = app.pay(&order_id, "tok_visa").await;
    let payment_id = payment["id"].as_str().expect("id").to_string();
    let refund = json_of(
        app.post(
            &format!("/payments/{payment_id}/refunds"),
            "r",
            &json!({"amount": 100}),
        )
        .await,
    )
    .await;
    let refund_id = refund["id"].as_str().expect("id").to_string();

    let other = app.other_merchant_key().await;
    let get = |path: String| {
        let http = app.http.clone();
        let url = format!("{}{path}", app.base);
        let key = other.clone();
        async move { http.get(url).bearer_auth(key).send().await.expect("sent") }
    };
    let mine = [
        format!("/orders/{order_id}"),
        format!("/orders/{order_id}/payments"),
        format!("/payments/{payment_id}"),
        format!("/refunds/{refund_id}"),
    ];
    let missing = uuid::Uuid::now_v7();
    for path in mine {
        let theirs = get(path.clone()).await;
        assert_eq!(theirs.status(), StatusCode::NOT_FOUND, "{path}");
        let nonexistent = get(path
            .replace(&order_id, &missing.to_string())
            .replace(&payment_id, &missing.to_string())
            .replace(&refund_id, &missing.to_string()))
        .await;
        // Exactly as if it did not exist: same status, same body.
        assert_eq!(json_of(theirs).await, json_of(nonexistent).await, "{path}");
    }
    let post = |path: String, body: Value| {
        let http = app.http.clone();
        let url = format!("{}{path}", app.base);
        let key = other.clone();
        async move {
            http.post(url)
                .bearer_auth(key)
                .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
                .json(&body)
                .send()
                .await
                .expect("sent")
        }
    };
    assert_eq!(
        post(format!("/orders/{order_id}/cancel"), json!({}))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        post(format!("/payments/{payment_id}/refunds"), json!({}))
            .await
            .status(),
        StatusCode::NOT_FOUND
    );
    let r = post(
        "/payments".into(),
        json!({"order_id": order_id, "payment_method": "tok_visa"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.count("SELECT count(*) FROM refund").await, 1);
}

#[tokio::test]
async fn an_unpaid_order_cancels_and_stays_cancelled() {
    let app = spawn_app().await;
    let id = app.create_order().await;
    let r = app
        .post(&format!("/orders/{id}/cancel"), "c1", &json!({}))
        .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(json_of(r).await["status"], "cancelled");
    let again = app
        .post(&format!("/orders/{id}/cancel"), "c2", &json!({}))
        .await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    assert_eq!(json_of(again).await["code"], "order_not_cancellable");
    let (status, body) = app.pay(&id, "tok_visa").await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["code"], "order_not_payable");
}

/// Rule violations are 422 and shape errors 400, each naming its field.
#[tokio::test]
async fn each_invalid_field_is_named() {
    let app = spawn_app().await;
    let with = |f: &dyn Fn(&mut Value)| {
        let mut b = order_body();
        f(&mut b);
        b
    };
    let cases: Vec<(Value, u16, &str)> = vec![
        (with(&|b| b["currency"] = json!("usd")), 422, "currency"),
        (with(&|b| b["currency"] = json!("XYZ")), 422, "currency"),
        (with(&|b| b["currency"] = json!(978)), 400, "currency"),
        (with(&|b| b["customer_id"] = json!("")), 422, "customer_id"),
        (
            with(&|b| b["customer_id"] = json!("x".repeat(65))),
            422,
            "customer_id",
        ),
        (
            with(&|b| {
                b.as_object_mut().map(|o| o.remove("customer_id"));
            }),
            400,
            "customer_id",
        ),
        (with(&|b| b["items"] = json!([])), 422, "items"),
        (with(&|b| b["items"] = json!("many")), 400, "items"),
        (
            with(&|b| b["items"][0]["quantity"] = json!(0)),
            422,
            "items[0].quantity",
        ),
        (
            with(&|b| b["items"][1]["quantity"] = json!(10001)),
            422,
            "items[1].quantity",
        ),
        (
            with(&|b| b["items"][0]["quantity"] = json!(1.5)),
            400,
            "items[0].quantity",
        ),
        (
            with(&|b| b["items"][0]["quantity"] = json!("2")),
            400,
            "items[0].quantity",
        ),
        (
            with(&|b| b["items"][0]["unit_amount"] = json!(-1)),
            422,
            "items[0].unit_amount",
        ),
        (
            with(&|b| b["items"][0]["sku"] = json!(null)),
            400,
            "items[0].sku",
        ),
        (
            with(&|b| b["items"] = json!([{"sku": "a", "quantity": 1, "unit_amount": 0}])),
            422,
            "items",
        ),
        (
            with(&|b| {
                b["items"] =
                    json!([{"sku": "a", "quantity": 10000, "unit_amount": 1_000_000_000_000i64}])
            }),
            422,
            "items",
        ),
        (
            with(&|b| b["items"][0]["unit_amount"] = json!(1e300)),
            422,
            "items[0].unit_amount",
        ),
        (
            with(&|b| b["metadata"] = json!({"k": 5})),
            400,
            "metadata.k",
        ),
        (
            with(&|b| {
                b["metadata"] =
                    Value::Object((0..21).map(|i| (format!("k{i}"), json!("v"))).collect())
            }),
            422,
            "metadata",
        ),
        (with(&|b| b["unexpected"] = json!(1)), 400, "unexpected"),
        (json!([1, 2]), 400, "body"),
    ];
    for (i, (body, status, field)) in cases.into_iter().enumerate() {
        let r = app.post("/orders", &format!("case-{i}"), &body).await;
        assert_eq!(r.status().as_u16(), status, "case {i}: {body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let problem = json_of(r).await;
        assert_eq!(problem["field"], field, "case {i}: {problem}");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(field)),
            "case {i}: {problem}"
        );
        for member in ["type", "title", "status", "detail", "code"] {
            assert!(!problem[member].is_null(), "case {i} lacks {member}");
        }
    }
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record").await,
        0
    );
}

/// Nothing a client sends makes the service panic or answer 500.
#[tokio::test]
async fn hostile_input_never_panics_or_500s() {
    let app = spawn_app().await;
    let huge_string = format!("{{\"customer_id\":\"{}\"}}", "x".repeat(60_000));
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"null".to_vec(),
        b"42".to_vec(),
        b"\"text\"".to_vec(),
        b"{".to_vec(),
        b"{\"customer_id\": }".to_vec(),
        vec![0xff, 0xfe, 0xfd, 0x00],
        b"{\"customer_id\":\"\xff\xfe\"}".to_vec(),
        b"customer_id=1&currency=EUR".to_vec(),
        b"{\"items\":[{\"sku\":\"a\",\"quantity\":1e400,\"unit_amount\":1}]}".to_vec(),
        b"{\"customer_id\":\"c\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"a\",\"quantity\":99999999999999999999999999,\"unit_amount\":99999999999999999999}]}".to_vec(),
        b"{\"customer_id\":\"c\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"a\",\"quantity\":-9223372036854775808,\"unit_amount\":1}]}".to_vec(),
        b"{\"customer_id\":\"\\u0000\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"\\ud800\",\"quantity\":1,\"unit_amount\":1}]}".to_vec(),
        // U+0000 alone in an otherwise valid order: PostgreSQL cannot store it.
        b"{\"customer_id\":\"c\\u0000\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"a\",\"quantity\":1,\"unit_amount\":1}]}".to_vec(),
        b"{\"customer_id\":\"c\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"a\\u0000\",\"quantity\":1,\"unit_amount\":1}],\"metadata\":{\"k\":\"\\u0000\"}}".to_vec(),
        huge_string.into_bytes(),
        deep.into_bytes(),
        vec![b'{'; 70_000],
    ];
    let paths = [
        "/orders",
        "/payments",
        &format!("/orders/{}/cancel", uuid::Uuid::now_v7()),
        &format!("/payments/{}/refunds", uuid::Uuid::now_v7()),
    ];
    for path in paths {
        for (i, body) in bodies.iter().enumerate() {
            let r = app
                .post_raw(path, Some(&format!("h-{i}")), Some(&app.key), body.clone())
                .await;
            let status = r.status().as_u16();
            assert!(
                (400..500).contains(&status),
                "{path} body {i}: status {status}"
            );
            let problem = json_of(r).await;
            assert!(problem["code"].is_string(), "{path} body {i}");
        }
    }
    // The server is still healthy afterwards.
    assert_eq!(app.get("/healthz").await.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let app = spawn_app().await;
    let body = vec![b' '; 65_537];
    let r = app
        .post_raw("/orders", Some("big"), Some(&app.key), body)
        .await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(json_of(r).await["code"], "payload_too_large");
    // The key stays free.
    assert_eq!(
        app.post("/orders", "big", &order_body()).await.status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn a_chunked_body_over_the_limit_is_413_too() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_app().await;
    let addr = app.base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /orders HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: chunked\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        app.key
    );
    stream.write_all(head.as_bytes()).await.expect("head");
    // No Content-Length: the limit can only be found while reading.
    let chunk = vec![b' '; 16_384];
    for _ in 0..5 {
        let sent = async {
            stream
                .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                .await?;
            stream.write_all(&chunk).await?;
            stream.write_all(b"\r\n").await
        };
        if sent.await.is_err() {
            break; // the server answered and closed early: fine
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    // The key stays free.
    assert_eq!(
        app.post("/orders", "chunked", &order_body()).await.status(),
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let app = spawn_app().await;
    let r = app.get("/nowhere").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "not_found");
    let r = app.get("/webhooks/sandbox").await;
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(json_of(r).await["code"], "method_not_allowed");
    let r = app.get("/orders/not-a-uuid").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_of(r).await["code"], "order_not_found");
}

/// Waits until all `n` orders sent reached the batcher: queued, or taken
/// by a writer (and counted in the batch-size histogram).
async fn until_batched(app: &TestApp, n: f64) {
    let metrics = &app.ctx.metrics;
    oncepay_testkit::ready::until(std::time::Duration::from_secs(30), || async {
        metrics.order_batch_rows.get_sample_sum() + metrics.orders_queued.get() as f64 >= n
    })
    .await
    .expect("every order reached the batcher");
}

#[tokio::test]
async fn orders_that_arrive_together_share_a_statement_and_each_gets_its_own_answer() {
    let app = std::sync::Arc::new(spawn_app().await);
    let held = hold_inserts(&app, "orders").await;
    // 48 keys, the first four sent five times each: 64 requests at once.
    let keys: Vec<String> = (0..48).map(|i| format!("together-{i}")).collect();
    let sent: Vec<String> = keys
        .iter()
        .cloned()
        .chain((0..4).flat_map(|i| std::iter::repeat_n(keys[i].clone(), 4)))
        .collect();
    let mut requests = tokio::task::JoinSet::new();
    for key in sent.clone() {
        let app = app.clone();
        requests.spawn(async move {
            let r = app.post("/orders", &key, &order_body()).await;
            (key, r.status(), json_of(r).await)
        });
    }
    until_batched(&app, sent.len() as f64).await;
    held.rollback().await.expect("release");
    let mut answers: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    while let Some(done) = requests.join_next().await {
        let (key, status, body) = done.expect("request");
        assert_eq!(status, StatusCode::CREATED, "{key}: {body}");
        answers.entry(key).or_default().push(body);
    }
    for (key, bodies) in &answers {
        assert!(
            bodies.iter().all(|b| b == &bodies[0]),
            "{key}: every repeat got the first answer: {bodies:?}"
        );
        let stored: uuid::Uuid = sqlx::query_scalar(
            "SELECT resource_id FROM idempotency_record WHERE idempotency_key = $1",
        )
        .bind(key)
        .fetch_one(&app.db)
        .await
        .expect("record");
        assert_eq!(bodies[0]["id"], stored.to_string(), "{key}: its own order");
    }
    assert_eq!(answers.len(), 48);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 48);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record").await,
        48
    );
    // Each of the 64 requests went through the batcher once, and the 64
    // took at most one statement per writer while the inserts were held,
    // and one for all that queued meanwhile.
    let batches = &app.ctx.metrics.order_batch_rows;
    let writers = app.ctx.order_batcher.writers() as u64;
    assert!(writers < 32, "{writers} writers leave no batch to share");
    assert_eq!(batches.get_sample_sum(), 64.0);
    assert!(
        batches.get_sample_count() <= writers + 1,
        "{} statements for 64 orders, with {writers} writers",
        batches.get_sample_count()
    );
}

#[tokio::test]
async fn a_row_the_database_refuses_fails_only_its_own_request_of_a_batch() {
    let app = std::sync::Arc::new(spawn_app().await);
    // A fault no input can cause: the database refuses one customer.
    sqlx::query("ALTER TABLE orders ADD CONSTRAINT no_poison CHECK (customer_id <> 'poison')")
        .execute(&app.db)
        .await
        .expect("constraint");
    let body = |customer: &str| {
        let mut body = order_body();
        body["customer_id"] = json!(customer);
        body
    };
    let held = hold_inserts(&app, "orders").await;
    let mut requests = tokio::task::JoinSet::new();
    for i in 0..24 {
        let app = app.clone();
        let customer = if i % 6 == 0 { "poison" } else { "cus_fine" };
        let body = body(customer);
        requests.spawn(async move {
            let key = format!("mixed-{i}");
            let r = app.post("/orders", &key, &body).await;
            (key, customer, r.status())
        });
    }
    until_batched(&app, 24.0).await;
    held.rollback().await.expect("release");
    let mut refused = Vec::new();
    while let Some(done) = requests.join_next().await {
        let (key, customer, status) = done.expect("request");
        if customer == "poison" {
            assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{key}");
            refused.push(key);
        } else {
            assert_eq!(status, StatusCode::CREATED, "{key}");
        }
    }
    assert_eq!(refused.len(), 4);
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 20);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_record WHERE idempotency_key LIKE 'mixed-%'")
            .await,
        20,
        "a refused row left its key free"
    );
    // Its key was free: once the database takes it, the retry creates it.
    sqlx::query("ALTER TABLE orders DROP CONSTRAINT no_poison")
        .execute(&app.db)
        .await
        .expect("drop");
    for key in refused {
        let r = app.post("/orders", &key, &body("poison")).await;
        assert_eq!(r.status(), StatusCode::CREATED, "{key} retried");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 24);
}

/// Create-order's batch writer keeps its connection between batches; a
/// database restart or a failover cuts it. Orders sent together right
/// after the cut are answered `503` with `Retry-After` or created, the
/// writer closes the broken connection, and every client's retries with
/// its key end in one order, the same one each time. One writer, so that
/// every batch meets the same connection.
#[tokio::test]
async fn a_batch_writer_whose_connection_was_cut_takes_a_new_one_and_each_key_gets_one_order() {
    let app = std::sync::Arc::new(
        spawn_app_with(Options::default().serve("ONCEPAY_ORDER_BATCH_WRITERS", "1")).await,
    );
    app.create_order().await;
    app.cut_service_connections().await;
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..8 {
        let app = app.clone();
        clients.spawn(async move {
            let key = format!("after-the-cut-{i}");
            let mut refused = 0;
            loop {
                let r = app.post("/orders", &key, &order_body()).await;
                let status = r.status();
                let retry_after = r.headers().contains_key("retry-after");
                let body = json_of(r).await;
                if status == StatusCode::CREATED {
                    let again = json_of(app.post("/orders", &key, &order_body()).await).await;
                    assert_eq!(again["id"], body["id"], "{key}: the retry replays");
                    return body["id"].as_str().expect("id").to_string();
                }
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{key}: {body}");
                assert!(retry_after, "{key}: 503 without Retry-After");
                refused += 1;
                assert!(refused <= 10, "{key}: still refused after {refused} tries");
            }
        });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(id) = clients.join_next().await {
        ids.insert(id.expect("client"));
    }
    assert_eq!(ids.len(), 8);
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        9,
        "one order per key, and the first"
    );
}
