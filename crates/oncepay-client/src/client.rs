//! The client and its intents.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::error::{ApiError, Error};
use crate::model::{
    ApiKeyInfo, BalanceHold, BalanceTransaction, CheckoutOptions, CheckoutSession, CustomerBalance,
    EventRecord, ListQuery, NewOrder, Order, Page, Payment, Refund, Status, WebhookEndpoint,
};
use crate::retry::{decide, retry_after, Decision, RetryPolicy};
use crate::store::{
    now_unix, Closed, Command, IntentRecord, IntentStore, MemoryStore, StoredRequest,
};

/// One try of a request, as reported to an observer (for logs, or the
/// example's terminal output).
#[derive(Debug, Clone)]
pub struct AttemptReport {
    /// The intent's name (empty for a read).
    pub intent: String,
    /// The idempotency key sent (empty for a read).
    pub key: String,
    /// `POST /payments`, `GET /payments/…`.
    pub request: String,
    /// 1-based.
    pub attempt: u32,
    /// What came back: `201`, `202`, `201, Idempotent-Replayed: true` (the
    /// first answer, replayed), `timed out`, `503 (retrying)`, …
    pub outcome: String,
}

type Observer = Arc<dyn Fn(&AttemptReport) + Send + Sync>;

/// Builds a [`Client`].
pub struct ClientBuilder {
    base: String,
    api_key: String,
    policy: RetryPolicy,
    store: Arc<dyn IntentStore>,
    observer: Option<Observer>,
    prune_after: Duration,
}

impl ClientBuilder {
    /// Closed intents older than this are forgotten when the client is
    /// built (default 24 h, the service's default key TTL: past it a repeat
    /// would execute anew anyway). Set it to the service's
    /// `ONCEPAY_IDEMPOTENCY_TTL`.
    pub fn prune_after(mut self, ttl: Duration) -> Self {
        self.prune_after = ttl;
        self
    }

    /// Where intents are kept (default: in memory, lost with the process;
    /// give a [`crate::FileStore`] to survive a crash).
    pub fn store(mut self, store: impl IntentStore + 'static) -> Self {
        self.store = Arc::new(store);
        self
    }

    /// The retry policy (see [`RetryPolicy`]).
    pub fn policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// Called after every try of every request.
    ///
    /// ```
    /// let client = oncepay_client::Client::builder("http://127.0.0.1:8080", "opk_x")
    ///     .on_attempt(|a| eprintln!("{} try {}: {}", a.request, a.attempt, a.outcome))
    ///     .build();
    /// assert!(client.is_ok());
    /// ```
    pub fn on_attempt(mut self, observer: impl Fn(&AttemptReport) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The client. Prunes closed intents past [`ClientBuilder::prune_after`].
    pub fn build(self) -> Result<Client, Error> {
        self.store.prune(self.prune_after)?;
        let http = reqwest::Client::builder()
            .timeout(self.policy.attempt_timeout)
            .connect_timeout(self.policy.attempt_timeout.min(Duration::from_secs(2)))
            .build()
            .map_err(|e| Error::Build(e.to_string()))?;
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                base: self.base.trim_end_matches('/').to_string(),
                api_key: self.api_key,
                policy: self.policy,
                store: self.store,
                observer: self.observer,
            }),
        })
    }
}

struct Inner {
    http: reqwest::Client,
    base: String,
    api_key: String,
    policy: RetryPolicy,
    store: Arc<dyn IntentStore>,
    observer: Option<Observer>,
}

/// The oncepay client. Cheap to clone; share one per process.
///
/// ```no_run
/// use oncepay_client::{Client, FileStore, LineItem, NewOrder};
/// # async fn demo() -> Result<(), oncepay_client::Error> {
/// let client = Client::builder("http://127.0.0.1:8080", "opk_…")
///     .store(FileStore::open("./intents")?)
///     .build()?;
/// let order = client
///     .intent("create order 123")
///     .create_order(&NewOrder::new("cus_1", "EUR", vec![LineItem { sku: "book".into(), quantity: 1, unit_amount: 2500 }]))
///     .await?;
/// let payment = client.intent("pay order 123").pay(order.id, "tok_visa").await?;
/// println!("{:?}", payment.status);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// A final HTTP answer: status, body and request id.
struct Answer {
    status: u16,
    body: Value,
}

impl Client {
    /// A builder for the API at `base` (`http://127.0.0.1:8080`) with a
    /// merchant's API key.
    pub fn builder(base: &str, api_key: &str) -> ClientBuilder {
        ClientBuilder {
            base: base.to_string(),
            api_key: api_key.to_string(),
            policy: RetryPolicy::default(),
            store: Arc::new(MemoryStore::default()),
            observer: None,
            prune_after: Duration::from_secs(86_400),
        }
    }

    /// The intent called `name` ("pay order 123"): one business intent, one
    /// idempotency key, whatever happens. The key is made at the intent's
    /// first command and stored before that command is sent; every retry and
    /// every later resumption sends the same key.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// // A double click, a retry after a crash: the same intent, one charge.
    /// let payment = client.intent(&format!("pay order {order_id}")).pay(order_id, "tok_visa").await?;
    /// # Ok(()) }
    /// ```
    pub fn intent(&self, name: &str) -> Intent {
        Intent {
            client: self.clone(),
            name: name.to_string(),
        }
    }

    /// The intents without a final answer, e.g. after a restart.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client) -> Result<(), oncepay_client::Error> {
    /// for open in client.open_intents()? {
    ///     let outcome = client.resume(&open).await;
    ///     println!("{}: {:?}", open.name, outcome.is_ok());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn open_intents(&self) -> Result<Vec<IntentRecord>, Error> {
        Ok(self.inner.store.open()?)
    }

    /// Finishes an open intent: sends its stored request again with its
    /// key (following a pending payment or refund as the first send would)
    /// and returns the final body.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// for open in client.open_intents()? {
    ///     let body = client.resume(&open).await?;
    ///     println!("{} ended {}", open.name, body["status"]);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn resume(&self, record: &IntentRecord) -> Result<Value, Error> {
        let intent = self.intent(&record.name);
        intent.run(record.request.clone()).await
    }

    /// Forgets intents closed more than `older_than` ago (use the service's
    /// `ONCEPAY_IDEMPOTENCY_TTL`, 24 h by default). Returns how many.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let pruned = client.prune(std::time::Duration::from_secs(86_400))?;
    /// # Ok(()) }
    /// ```
    pub fn prune(&self, older_than: Duration) -> Result<usize, Error> {
        Ok(self.inner.store.prune(older_than)?)
    }

    /// `GET /orders/{id}` (a safe read, retried).
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let order = client.get_order(order_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_order(&self, id: Uuid) -> Result<Order, Error> {
        self.read(&format!("/orders/{id}")).await
    }

    /// `GET /payments/{id}` (a safe read, retried).
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let payment = client.get_payment(payment_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_payment(&self, id: Uuid) -> Result<Payment, Error> {
        self.read(&format!("/payments/{id}")).await
    }

    /// `GET /orders/{id}/payments`: the order's attempts, oldest first.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let attempts = client.list_payments(order_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn list_payments(&self, order_id: Uuid) -> Result<Vec<Payment>, Error> {
        self.read(&format!("/orders/{order_id}/payments")).await
    }

    /// `GET /refunds/{id}` (a safe read, retried).
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let refund = client.get_refund(payment_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn get_refund(&self, id: Uuid) -> Result<Refund, Error> {
        self.read(&format!("/refunds/{id}")).await
    }

    /// `GET /orders`: a page of orders, newest first.
    pub async fn list_orders(&self, query: &ListQuery) -> Result<Page<Order>, Error> {
        self.read(&format!("/orders{}", query.to_query())).await
    }

    /// `GET /payments`: a page of payment attempts, newest first
    /// ([`ListQuery::order_id`]: one order's, paged).
    pub async fn list_payments_page(&self, query: &ListQuery) -> Result<Page<Payment>, Error> {
        self.read(&format!("/payments{}", query.to_query())).await
    }

    /// `GET /refunds`: a page of refunds, newest first.
    pub async fn list_refunds(&self, query: &ListQuery) -> Result<Page<Refund>, Error> {
        self.read(&format!("/refunds{}", query.to_query())).await
    }

    /// `GET /events`: a page of events, newest first.
    pub async fn list_events(&self, query: &ListQuery) -> Result<Page<EventRecord>, Error> {
        self.read(&format!("/events{}", query.to_query())).await
    }

    /// `GET /events/{id}`: the event with its deliveries and every attempt
    /// (as JSON: for a person looking into a delivery).
    pub async fn get_event(&self, id: &str) -> Result<Value, Error> {
        self.read(&format!("/events/{id}")).await
    }

    /// `GET /customers/{customer_id}/balance?currency=`: zeros for a
    /// customer whose balance never moved.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client) -> Result<(), oncepay_client::Error> {
    /// let balance = client.get_balance("cus_1", "EUR").await?;
    /// println!("{} available", balance.available);
    /// # Ok(()) }
    /// ```
    pub async fn get_balance(
        &self,
        customer_id: &str,
        currency: &str,
    ) -> Result<CustomerBalance, Error> {
        let query = serde_urlencoded::to_string([("currency", currency)]).unwrap_or_default();
        self.read(&format!(
            "/customers/{}/balance?{query}",
            path_segment(customer_id)
        ))
        .await
    }

    /// `GET /customers/{customer_id}/balance/transactions`: a page, newest
    /// first, of one currency when `currency` is given.
    pub async fn list_balance_transactions(
        &self,
        customer_id: &str,
        currency: Option<&str>,
        query: &ListQuery,
    ) -> Result<Page<BalanceTransaction>, Error> {
        let mut q = query.to_query();
        if let Some(currency) = currency {
            let pair = serde_urlencoded::to_string([("currency", currency)]).unwrap_or_default();
            q = if q.is_empty() {
                format!("?{pair}")
            } else {
                format!("{q}&{pair}")
            };
        }
        self.read(&format!(
            "/customers/{}/balance/transactions{q}",
            path_segment(customer_id)
        ))
        .await
    }

    /// `GET /balance_transactions/{id}`.
    pub async fn get_balance_transaction(&self, id: Uuid) -> Result<BalanceTransaction, Error> {
        self.read(&format!("/balance_transactions/{id}")).await
    }

    /// `GET /balance_holds/{id}`: its status now (past `expires_at` it
    /// reads `expired`).
    pub async fn get_balance_hold(&self, id: Uuid) -> Result<BalanceHold, Error> {
        self.read(&format!("/balance_holds/{id}")).await
    }

    /// `GET /webhook_endpoints` (never their secrets).
    pub async fn list_webhook_endpoints(&self) -> Result<Page<WebhookEndpoint>, Error> {
        self.read("/webhook_endpoints").await
    }

    /// `DELETE /webhook_endpoints/{id}`; its pending deliveries are
    /// cancelled. Retried (deleting twice is deleting once).
    pub async fn delete_webhook_endpoint(&self, id: Uuid) -> Result<(), Error> {
        self.remove(&format!("/webhook_endpoints/{id}")).await
    }

    /// `GET /api_keys` (never the keys).
    pub async fn list_api_keys(&self) -> Result<Page<ApiKeyInfo>, Error> {
        self.read("/api_keys").await
    }

    /// `DELETE /api_keys/{id}`: revoked in every process at once. Retried
    /// (revoking twice is revoking once).
    pub async fn revoke_api_key(&self, id: Uuid) -> Result<(), Error> {
        self.remove(&format!("/api_keys/{id}")).await
    }

    fn report(&self, intent: &str, key: &str, request: &str, attempt: u32, outcome: String) {
        if let Some(observer) = &self.inner.observer {
            observer(&AttemptReport {
                intent: intent.into(),
                key: key.into(),
                request: request.into(),
                attempt,
                outcome,
            });
        }
    }

    /// Sends one request until a final answer or the deadline: `Ok` for a
    /// final answer (2xx or a final 4xx), [`NoAnswer`] when none came in
    /// time, or at once when the TLS handshake failed (a try that would
    /// only fail the same way again).
    async fn exchange(
        &self,
        build: impl Fn() -> reqwest::RequestBuilder,
        label: &str,
        intent: (&str, &str),
        deadline: Instant,
    ) -> Result<(Answer, Option<String>), NoAnswer> {
        let policy = self.inner.policy;
        let mut last = ("no try made".to_string(), None);
        let mut maybe_sent = false;
        for n in 0u32.. {
            let sent = build().send().await;
            let this_sent_nothing = sent.as_ref().err().is_some_and(reqwest::Error::is_connect);
            let (reason, after, request_id) = match sent {
                Err(e) => {
                    let failure = TryFailure::of(&e);
                    maybe_sent |= !failure.not_sent;
                    if failure.permanent {
                        self.report(
                            intent.0,
                            intent.1,
                            label,
                            n + 1,
                            format!("{} (nothing sent; not retried)", failure.reason),
                        );
                        return Err(NoAnswer {
                            last: failure.reason,
                            request_id: None,
                            maybe_sent,
                        });
                    }
                    (failure.reason, None, None)
                }
                Ok(response) => {
                    // An answer came: the request was sent.
                    maybe_sent = true;
                    let status = response.status().as_u16();
                    let request_id = response
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_string);
                    let after = retry_after(response.headers());
                    let replayed = response
                        .headers()
                        .get("idempotent-replayed")
                        .is_some_and(|v| v.as_bytes() == b"true");
                    match response.bytes().await {
                        Err(e) => (TryFailure::of(&e).reason, None, request_id),
                        Ok(bytes) => {
                            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            let code = body["code"].as_str();
                            match decide(status, code, after) {
                                Decision::Final => {
                                    let outcome = if replayed {
                                        format!("{status}, Idempotent-Replayed: true")
                                    } else {
                                        status.to_string()
                                    };
                                    self.report(intent.0, intent.1, label, n + 1, outcome);
                                    return Ok((Answer { status, body }, request_id));
                                }
                                Decision::Retry { reason, after } => (reason, after, request_id),
                            }
                        }
                    }
                }
            };
            self.report(
                intent.0,
                intent.1,
                label,
                n + 1,
                if this_sent_nothing {
                    format!("{reason} (nothing sent; retrying, same key)")
                } else {
                    format!("{reason} (retrying, same key)")
                },
            );
            last = (reason, request_id);
            let pause = policy.pause(n, after);
            if Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        Err(NoAnswer {
            last: last.0,
            request_id: last.1,
            maybe_sent,
        })
    }

    async fn remove(&self, path: &str) -> Result<(), Error> {
        let deadline = Instant::now() + self.inner.policy.deadline;
        let url = format!("{}{path}", self.inner.base);
        let build = || {
            self.inner
                .http
                .delete(&url)
                .bearer_auth(&self.inner.api_key)
        };
        match self
            .exchange(build, &format!("DELETE {path}"), ("", ""), deadline)
            .await
        {
            Ok((answer, request_id)) if answer.status >= 400 => Err(problem(&answer, request_id)),
            Ok(_) => Ok(()),
            Err(none) => Err(Error::Unavailable {
                path: path.into(),
                last: none.last,
            }),
        }
    }

    async fn read<T: DeserializeOwned>(&self, path: &str) -> Result<T, Error> {
        let deadline = Instant::now() + self.inner.policy.deadline;
        let url = format!("{}{path}", self.inner.base);
        let build = || self.inner.http.get(&url).bearer_auth(&self.inner.api_key);
        match self
            .exchange(build, &format!("GET {path}"), ("", ""), deadline)
            .await
        {
            Ok((answer, request_id)) => decode(answer, request_id),
            Err(none) => Err(Error::Unavailable {
                path: path.into(),
                last: none.last,
            }),
        }
    }
}

/// No final answer from [`Client::exchange`].
struct NoAnswer {
    /// What the last try met.
    last: String,
    /// The `X-Request-Id` of the last answer, if one came.
    request_id: Option<String>,
    /// Some try may have sent the request (it got an answer, or failed
    /// after connecting). False: every try failed before a byte of it left.
    maybe_sent: bool,
}

/// What one failed try proves.
#[derive(Debug)]
struct TryFailure {
    /// What it met, for the error and the observer.
    reason: String,
    /// It failed while connecting, TCP or the TLS handshake: the request is
    /// written only on a connection that is up, so none of it was sent.
    not_sent: bool,
    /// The TLS handshake was refused (by the server's answer, or by our
    /// check of its certificate): another try would meet the same.
    permanent: bool,
}

impl TryFailure {
    fn of(e: &reqwest::Error) -> TryFailure {
        let causes = causes(e);
        // The innermost cause says it best ("Connection refused",
        // "received corrupt message of type InvalidContentType").
        let detail = causes
            .last()
            .map(|c| c.to_string())
            .unwrap_or_else(|| e.to_string());
        let io_kind = |kind: std::io::ErrorKind| {
            causes.iter().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == kind)
            })
        };
        let https = e.url().is_some_and(|u| u.scheme() == "https");
        let at = e
            .url()
            .map(|u| {
                format!(
                    "{}:{}",
                    u.host_str().unwrap_or("?"),
                    u.port_or_known_default().unwrap_or(443)
                )
            })
            .unwrap_or_else(|| "the server".into());
        if e.is_connect() {
            // rustls reports a handshake it refuses as `InvalidData`; the
            // TCP connection was up, but nothing of the request was sent.
            if https && io_kind(std::io::ErrorKind::InvalidData) {
                let not_tls = [
                    "corrupt message",
                    "InvalidContentType",
                    "unexpected message",
                ]
                .iter()
                .any(|m| detail.contains(m));
                let reason = if not_tls {
                    format!(
                        "the TLS handshake with {at} failed: the server there does not speak TLS \
                         ({detail}); is the URL meant to be http://?"
                    )
                } else {
                    format!("the TLS handshake with {at} failed ({detail})")
                };
                return TryFailure {
                    reason,
                    not_sent: true,
                    permanent: true,
                };
            }
            let reason = if https && io_kind(std::io::ErrorKind::UnexpectedEof) {
                format!("{at} closed the connection during the TLS handshake ({detail})")
            } else if e.is_timeout() {
                format!("timed out connecting to {at}")
            } else {
                format!("could not connect to {at} ({detail})")
            };
            return TryFailure {
                reason,
                not_sent: true,
                permanent: false,
            };
        }
        let reason = if e.is_timeout() {
            "timed out".into()
        } else {
            "connection lost before the answer".into()
        };
        TryFailure {
            reason,
            not_sent: false,
            permanent: false,
        }
    }
}

/// `e` and its causes, outermost first. An `io::Error`'s `source` skips
/// the error it wraps (TLS errors arrive wrapped so), so it is looked into.
fn causes<'a>(
    e: &'a (dyn std::error::Error + 'static),
) -> Vec<&'a (dyn std::error::Error + 'static)> {
    let mut out: Vec<&'a (dyn std::error::Error + 'static)> = Vec::new();
    let mut next = Some(e);
    while let Some(error) = next {
        out.push(error);
        if out.len() > 32 {
            break;
        }
        next = match error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        };
    }
    out
}

fn problem(answer: &Answer, request_id: Option<String>) -> Error {
    Error::Api(ApiError {
        status: answer.status,
        code: answer.body["code"]
            .as_str()
            .unwrap_or("unknown")
            .to_string(),
        detail: answer.body["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        request_id,
    })
}

fn decode<T: DeserializeOwned>(answer: Answer, request_id: Option<String>) -> Result<T, Error> {
    if answer.status >= 400 {
        return Err(problem(&answer, request_id));
    }
    serde_json::from_value(answer.body).map_err(|e| Error::Decode(e.to_string()))
}

/// One business intent and its key; see [`Client::intent`]. Each intent
/// sends one request: asking it for another is [`Error::IntentReused`].
pub struct Intent {
    client: Client,
    name: String,
}

impl Intent {
    /// `POST /orders`; the created order.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// use oncepay_client::{LineItem, NewOrder};
    /// let items = vec![LineItem { sku: "book".into(), quantity: 1, unit_amount: 2500 }];
    /// let order = client.intent("order 123").create_order(&NewOrder::new("cus_1", "EUR", items)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_order(&self, order: &NewOrder) -> Result<Order, Error> {
        let body = serde_json::to_value(order).map_err(|e| Error::Decode(e.to_string()))?;
        let answer = self
            .run(StoredRequest {
                command: Command::CreateOrder,
                path: "/orders".into(),
                body,
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /payments`: pays the order with a provider token. A decline is
    /// a `failed` payment (final, never retried). A payment still `pending`
    /// at the deadline is returned as such: poll it, or resume the intent
    /// later; it is never a failure.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// use oncepay_client::Status;
    /// let payment = client.intent(&format!("pay {order_id}")).pay(order_id, "tok_visa").await?;
    /// match payment.status {
    ///     Status::Succeeded => println!("paid"),
    ///     Status::Failed => println!("declined: {:?}; a new intent may try another card", payment.failure_code),
    ///     Status::Pending => println!("not known yet: poll {} or resume later", payment.id),
    ///     // Only a payment made with `authorize` is held, then captured or voided.
    ///     Status::RequiresCapture | Status::Voided => unreachable!("pay captures at once"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn pay(&self, order_id: Uuid, payment_method: &str) -> Result<Payment, Error> {
        let answer = self
            .run(StoredRequest {
                command: Command::Pay,
                path: "/payments".into(),
                body: json!({"order_id": order_id, "payment_method": payment_method}),
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /payments` with `capture_method: manual`: the card is
    /// authorized and held (`requires_capture`) until [`Intent::capture`]
    /// or [`Intent::void`].
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let held = client.intent("authorize order 123").authorize(order_id, "tok_visa").await?;
    /// # Ok(()) }
    /// ```
    pub async fn authorize(&self, order_id: Uuid, payment_method: &str) -> Result<Payment, Error> {
        let answer = self
            .run(StoredRequest {
                command: Command::PayManual,
                path: "/payments".into(),
                body: json!({"order_id": order_id, "payment_method": payment_method, "capture_method": "manual"}),
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /payments/{id}/capture`: `amount` (default: all that is
    /// capturable), once per payment. One intent, one key: a retry of a
    /// capture whose answer was lost is the same capture, never a second.
    /// A capture the provider has not answered yet is polled until the
    /// payment is `succeeded` (or `voided`: the hold expired first), and
    /// returned still `requires_capture` at the deadline.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let paid = client.intent("ship order 123").capture(payment_id, Some(1500)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn capture(&self, payment_id: Uuid, amount: Option<i64>) -> Result<Payment, Error> {
        let body = match amount {
            Some(amount) => json!({ "amount": amount }),
            None => json!({}),
        };
        let answer = self
            .run(StoredRequest {
                command: Command::Capture,
                path: format!("/payments/{payment_id}/capture"),
                body,
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /payments/{id}/void`: releases the hold (`voided`).
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let released = client.intent("release order 123").void(payment_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn void(&self, payment_id: Uuid) -> Result<Payment, Error> {
        let answer = self
            .run(StoredRequest {
                command: Command::Void,
                path: format!("/payments/{payment_id}/void"),
                body: json!({}),
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /payments/{id}/refunds`: `amount` (default: what is left) and
    /// a reason. Pending at the deadline is returned as pending.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let refund = client.intent("refund 1000 of order 123").refund(payment_id, Some(1000), Some("damaged")).await?;
    /// # Ok(()) }
    /// ```
    pub async fn refund(
        &self,
        payment_id: Uuid,
        amount: Option<i64>,
        reason: Option<&str>,
    ) -> Result<Refund, Error> {
        let mut body = json!({});
        if let Some(amount) = amount {
            body["amount"] = json!(amount);
        }
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        let answer = self
            .run(StoredRequest {
                command: Command::Refund,
                path: format!("/payments/{payment_id}/refunds"),
                body,
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /orders/{id}/cancel`: the order (`cancelled`, or still `paid`
    /// while its refund settles).
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid, payment_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// let order = client.intent("cancel order 123").cancel(order_id).await?;
    /// # Ok(()) }
    /// ```
    pub async fn cancel(&self, order_id: Uuid) -> Result<Order, Error> {
        let answer = self
            .run(StoredRequest {
                command: Command::Cancel,
                path: format!("/orders/{order_id}/cancel"),
                body: json!({}),
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /orders/{id}/checkout`: a hosted checkout page for the order.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client, order_id: uuid::Uuid) -> Result<(), oncepay_client::Error> {
    /// use oncepay_client::CheckoutOptions;
    /// let options = CheckoutOptions { success_url: Some("https://shop.example/thanks?s={CHECKOUT_SESSION_ID}".into()), ..Default::default() };
    /// let session = client.intent(&format!("checkout {order_id}")).create_checkout(order_id, &options).await?;
    /// println!("send the customer to {}", session.url);
    /// # Ok(()) }
    /// ```
    pub async fn create_checkout(
        &self,
        order_id: Uuid,
        options: &CheckoutOptions,
    ) -> Result<CheckoutSession, Error> {
        let body = serde_json::to_value(options).map_err(|e| Error::Decode(e.to_string()))?;
        let answer = self
            .run(StoredRequest {
                command: Command::CreateCheckout,
                path: format!("/orders/{order_id}/checkout"),
                body,
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /webhook_endpoints`: your receiver at `url` gets these event
    /// types; the answer (and only it, and its replays) holds the signing
    /// secret for [`crate::webhooks::Verifier`].
    pub async fn create_webhook_endpoint(
        &self,
        url: &str,
        events: &[&str],
    ) -> Result<WebhookEndpoint, Error> {
        let answer = self
            .run(StoredRequest {
                command: Command::CreateWebhookEndpoint,
                path: "/webhook_endpoints".into(),
                body: json!({"url": url, "events": events}),
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// `POST /customers/{customer_id}/balance/credits`: store credit given
    /// (CreditBalance), once per intent.
    ///
    /// ```no_run
    /// # async fn demo(client: oncepay_client::Client) -> Result<(), oncepay_client::Error> {
    /// let credit = client.intent("goodwill for ticket 88").credit_balance("cus_1", 500, "EUR", Some("sorry")).await?;
    /// println!("now {}", credit.balance.available);
    /// # Ok(()) }
    /// ```
    pub async fn credit_balance(
        &self,
        customer_id: &str,
        amount: i64,
        currency: &str,
        description: Option<&str>,
    ) -> Result<BalanceTransaction, Error> {
        let body = move_body(amount, currency, description);
        let path = format!("/customers/{}/balance/credits", path_segment(customer_id));
        self.send_as(Command::CreditBalance, path, body).await
    }

    /// `POST /customers/{customer_id}/balance/debits` (ChargeBalance). A
    /// balance that does not cover it is [`Error::Api`] with code
    /// `insufficient_funds`: final for this intent (its key answers the
    /// same even after a credit); a new attempt is a new intent.
    pub async fn debit_balance(
        &self,
        customer_id: &str,
        amount: i64,
        currency: &str,
        description: Option<&str>,
    ) -> Result<BalanceTransaction, Error> {
        let body = move_body(amount, currency, description);
        let path = format!("/customers/{}/balance/debits", path_segment(customer_id));
        self.send_as(Command::DebitBalance, path, body).await
    }

    /// `POST /customers/{customer_id}/balance/holds`: holds `amount` for
    /// `expires_in` seconds (the service's default when `None`).
    pub async fn hold_balance(
        &self,
        customer_id: &str,
        amount: i64,
        currency: &str,
        expires_in: Option<i64>,
    ) -> Result<BalanceHold, Error> {
        let mut body = move_body(amount, currency, None);
        if let Some(seconds) = expires_in {
            body["expires_in"] = json!(seconds);
        }
        let path = format!("/customers/{}/balance/holds", path_segment(customer_id));
        self.send_as(Command::HoldBalance, path, body).await
    }

    /// `POST /balance_holds/{id}/capture`: all of it, or `amount` of it
    /// (the rest is released).
    pub async fn capture_hold(
        &self,
        hold_id: Uuid,
        amount: Option<i64>,
    ) -> Result<BalanceHold, Error> {
        let body = match amount {
            Some(amount) => json!({"amount": amount}),
            None => json!({}),
        };
        let path = format!("/balance_holds/{hold_id}/capture");
        self.send_as(Command::CaptureHold, path, body).await
    }

    /// `POST /balance_holds/{id}/release`.
    pub async fn release_hold(&self, hold_id: Uuid) -> Result<BalanceHold, Error> {
        let path = format!("/balance_holds/{hold_id}/release");
        self.send_as(Command::ReleaseHold, path, json!({})).await
    }

    /// `POST /payments/{id}/refunds` with `destination: balance`: the
    /// amount (default: what is left) goes to the order's customer's
    /// balance instead of the card.
    pub async fn refund_to_balance(
        &self,
        payment_id: Uuid,
        amount: Option<i64>,
        reason: Option<&str>,
    ) -> Result<Refund, Error> {
        let mut body = json!({"destination": "balance"});
        if let Some(amount) = amount {
            body["amount"] = json!(amount);
        }
        if let Some(reason) = reason {
            body["reason"] = json!(reason);
        }
        let path = format!("/payments/{payment_id}/refunds");
        self.send_as(Command::Refund, path, body).await
    }

    async fn send_as<T: DeserializeOwned>(
        &self,
        command: Command,
        path: String,
        body: Value,
    ) -> Result<T, Error> {
        let answer = self
            .run(StoredRequest {
                command,
                path,
                body,
            })
            .await?;
        serde_json::from_value(answer).map_err(|e| Error::Decode(e.to_string()))
    }

    /// The intent's record: made (with a new key) and stored before the
    /// first send, or found; and whether it was found (made earlier, so an
    /// earlier call may have sent it).
    fn record(&self, request: &StoredRequest) -> Result<(IntentRecord, bool), Error> {
        let store = &self.client.inner.store;
        let (record, opened_before) = match store.load(&self.name)? {
            Some(record) => (record, true),
            None => {
                let key = Uuid::new_v4().to_string();
                let stored = store.insert_new(IntentRecord {
                    name: self.name.clone(),
                    key: key.clone(),
                    created_at: now_unix(),
                    request: request.clone(),
                    closed: None,
                })?;
                // Another caller's record won the insert: it may be sending.
                let theirs = stored.key != key;
                (stored, theirs)
            }
        };
        if record.request != *request {
            return Err(Error::IntentReused(self.name.clone()));
        }
        Ok((record, opened_before))
    }

    /// Sends the intent's request until a final answer, follows a pending
    /// payment or refund until it settles or the deadline, closes the
    /// intent on a final answer, and returns the final body.
    async fn run(&self, request: StoredRequest) -> Result<Value, Error> {
        let (record, opened_before) = self.record(&request)?;
        let started = Instant::now();
        if let Some(closed) = &record.closed {
            let answer = Answer {
                status: closed.status,
                body: closed.body.clone(),
            };
            return decode::<Value>(answer, None);
        }
        let inner = &self.client.inner;
        let deadline = started + inner.policy.deadline;
        let url = format!("{}{}", inner.base, request.path);
        let build = || {
            inner
                .http
                .post(&url)
                .bearer_auth(&inner.api_key)
                .header("Idempotency-Key", &record.key)
                .json(&request.body)
        };
        let label = format!("POST {}", request.path);
        let (answer, request_id) = match self
            .client
            .exchange(build, &label, (&self.name, &record.key), deadline)
            .await
        {
            Ok(answer) => answer,
            // Every try failed before a byte left: not sent, not unknown.
            Err(none) if !none.maybe_sent => {
                return Err(Error::NotSent {
                    intent: self.name.clone(),
                    key: record.key.clone(),
                    reason: none.last,
                    opened_before,
                })
            }
            Err(none) => {
                return Err(Error::OutcomeUnknown {
                    intent: self.name.clone(),
                    key: record.key.clone(),
                    last: none.last,
                    request_id: none.request_id,
                    elapsed: started.elapsed(),
                })
            }
        };
        let answer = self.follow(answer, &request, deadline).await;
        let settled = answer.status >= 400 || !waits(&request, &answer);
        if settled {
            let mut closed = record.clone();
            closed.closed = Some(Closed {
                at: now_unix(),
                status: answer.status,
                body: answer.body.clone(),
            });
            inner.store.update(&closed)?;
        }
        decode(answer, request_id)
    }

    /// A `202 pending` payment or refund is polled (a safe read) with
    /// backoff until it is final or the deadline passes; the last state
    /// read is the answer.
    async fn follow(&self, answer: Answer, request: &StoredRequest, deadline: Instant) -> Answer {
        let resource = match request.command {
            Command::Pay | Command::PayManual | Command::Capture | Command::Void => "payments",
            Command::Refund => "refunds",
            _ => return answer,
        };
        let (true, Some(id)) = (waits(request, &answer), answer.body["id"].as_str()) else {
            return answer;
        };
        // A capture or void ends when the payment does; a payment when it
        // is known (a hold is known: 201).
        let ends = |status: Option<Status>| match request.command {
            Command::Capture | Command::Void => status.is_some_and(Status::is_final),
            _ => status.is_some_and(|s| s != Status::Pending),
        };
        let done_status = match request.command {
            Command::Capture | Command::Void => 200,
            _ => 201,
        };
        let path = format!("/{resource}/{id}");
        // It waits for the customer (3-D Secure): polling cannot help until
        // they act; the caller sends them to `next_action.url` and resumes
        // the intent later. One read says where it stands now (a replayed
        // answer is the payment as it was first answered).
        if !answer.body["next_action"].is_null() {
            return match self.client.read::<Value>(&path).await {
                Ok(latest) => {
                    let settled = serde_json::from_value::<Status>(latest["status"].clone())
                        .is_ok_and(Status::is_final);
                    Answer {
                        status: if settled { 201 } else { answer.status },
                        body: latest,
                    }
                }
                Err(_) => answer,
            };
        }
        let mut current = answer;
        let policy = self.client.inner.policy;
        for n in 0u32.. {
            let pause = policy.pause(n, None).max(Duration::from_millis(50));
            if Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
            if let Ok(latest) = self.client.read::<Value>(&path).await {
                let status: Option<Status> = serde_json::from_value(latest["status"].clone()).ok();
                current = Answer {
                    status: current.status,
                    body: latest,
                };
                if ends(status) {
                    // A settled payment reads as its creation would have
                    // (201), a settled capture or void as theirs (200).
                    current.status = done_status;
                    break;
                }
            }
        }
        current
    }
}

/// The body of a credit, debit or hold.
fn move_body(amount: i64, currency: &str, description: Option<&str>) -> Value {
    let mut body = json!({"amount": amount, "currency": currency});
    if let Some(d) = description {
        body["description"] = json!(d);
    }
    body
}

/// A customer id as one path segment: everything but RFC 3986's
/// unreserved characters percent-encoded.
fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Whether an answer leaves its intent waiting for the outcome: a payment
/// or refund `pending`, or a capture or void answered `202` (the payment
/// still `requires_capture` while the provider's answer is not known).
fn waits(request: &StoredRequest, answer: &Answer) -> bool {
    match request.command {
        Command::Capture | Command::Void => {
            answer.status == 202 && answer.body["status"].as_str() == Some("requires_capture")
        }
        _ => answer.body["status"].as_str() == Some("pending"),
    }
}
