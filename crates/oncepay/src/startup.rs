//! Wiring `oncepay serve`: migrate, open the pool, build the provider client
//! and the engine, start the HTTP server and the background workers, and stop
//! them all gracefully.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use std::time::Duration;

use actix_http::body::BoxBody;
use actix_http::error::DispatchError;
use actix_http::{HttpService, KeepAlive};
use actix_service::{fn_service, ServiceFactoryExt as _};
use actix_web::dev::AppConfig;
use actix_web::middleware::from_fn;
use actix_web::{web, App};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::commands::AppContext;
use crate::config::ServeConfig;
use crate::events;
use crate::http::wire::ProblemIo;
use crate::http::{self, AppState};
use crate::idempotency::{Engine, EngineConfig};
use crate::metrics::Metrics;
use crate::provider::sandbox::Sandbox;
use crate::provider::stripe::Stripe;
use crate::provider::{PaymentProvider, Providers};
use crate::store;
use crate::workers;

/// Why the service could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Migrations failed.
    #[error(transparent)]
    Migrate(#[from] store::migrate::MigrateError),
    /// The pool could not be configured.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The address could not be bound.
    #[error("cannot listen: {0}")]
    Io(#[from] std::io::Error),
    /// The provider client could not be built.
    #[error(transparent)]
    Provider(#[from] crate::provider::call::BuildError),
    /// The provider settings do not name a configured provider.
    #[error("{0}")]
    Config(String),
    /// The webhook delivery client could not be built.
    #[error("cannot build the webhook delivery client: {0}")]
    Deliveries(#[from] reqwest::Error),
}

/// A built, not yet running, service.
pub struct Application {
    addr: SocketAddr,
    server: actix_web::dev::Server,
    ctx: Arc<AppContext>,
    workers: Vec<JoinHandle<()>>,
    stop_workers: watch::Sender<bool>,
}

/// The registry of providers: the sandbox (always: its rows and the
/// default), and Stripe when its key is set.
fn providers(
    config: &ServeConfig,
    metrics: &Arc<Metrics>,
    pool: &sqlx::PgPool,
) -> Result<Providers, StartError> {
    let public = config
        .provider_public_url
        .as_deref()
        .unwrap_or(&config.provider_url);
    let mut all: Vec<Arc<dyn PaymentProvider>> = vec![Arc::new(Sandbox::new(
        (&config.provider_url, public),
        config.webhook_secret.clone(),
        (config.provider_timeout, config.idempotency_lease),
        metrics.clone(),
    )?)];
    if let Some(stripe) = &config.stripe {
        all.push(Arc::new(Stripe::new(
            stripe.clone(),
            config.idempotency_lease,
            metrics.clone(),
        )?));
    }
    // Always there: a payment names it with `payment_method: "balance"`.
    all.push(Arc::new(crate::provider::balance::Balance::new(
        pool.clone(),
        metrics.clone(),
    )));
    Providers::new(all, &config.provider).ok_or_else(|| {
        StartError::Config(format!(
            "ONCEPAY_PROVIDER={} is not configured",
            config.provider
        ))
    })
}

/// `serve` with Stripe and no webhook secret: every Stripe webhook is
/// refused, so what only a webhook tells waits for the books pass. Said
/// once at start, naming what is lost and for how long, since it looks
/// like it works (payments still settle by the reconciler's reads).
fn warn_without_stripe_webhooks(config: &ServeConfig) {
    let Some(stripe) = &config.stripe else {
        return;
    };
    if stripe.webhook_secrets.is_some() {
        return;
    }
    let every = config.books.interval.as_secs();
    let every = match every {
        s if s >= 3600 && s.is_multiple_of(3600) => format!("{}h", s / 3600),
        s if s >= 60 && s.is_multiple_of(60) => format!("{}m", s / 60),
        s => format!("{s}s"),
    };
    tracing::warn!(
        books_interval = %every,
        "ONCEPAY_STRIPE_WEBHOOK_SECRET is not set: every Stripe webhook is refused (401). \
         Payments and refunds still settle by the reconciler's reads, but a refund that fails \
         after it succeeded and a dispute opened or moved at Stripe are learned only by the \
         books pass, up to ONCEPAY_BOOKS_INTERVAL ({every}) later, while a dispute's evidence \
         deadline runs; set the webhook endpoint's signing secret (required in production)"
    );
}

/// Everything commands and workers share, for `serve` and for the CLI
/// commands that act like it (`oncepay reconcile`); `bound_url` is the
/// checkout's base when `ONCEPAY_PUBLIC_URL` is unset.
pub fn context(config: &ServeConfig, bound_url: String) -> Result<Arc<AppContext>, StartError> {
    let pool = store::pool(&config.database_url, config.db_pool_size)?;
    let claims = store::claims_pool(&config.database_url, (config.db_pool_size / 2).max(2))?;
    let metrics = Arc::new(Metrics::new());
    metrics.know_providers(crate::provider::NAMES);
    let providers = providers(config, &metrics, &pool)?;
    let engine = Engine::new(
        pool.clone(),
        claims,
        EngineConfig {
            ttl: config.idempotency_ttl,
            wait: config.idempotency_wait,
            lease: config.idempotency_lease,
            replay_cache_entries: config.replay_cache_entries,
        },
        metrics.clone(),
    );
    let order_batcher = Arc::new(store::order_batch::OrderBatcher::new(
        pool.clone(),
        store::order_batch::BatchConfig {
            max: config.order_batch_max,
            writers: config.order_batch_writers,
        },
        metrics.clone(),
    ));
    let group_commit = Arc::new(store::group_commit::GroupCommit::new(
        pool.clone(),
        store::group_commit::GroupConfig {
            max: config.group_commit_max,
            writers: config.group_commit_writers,
        },
        metrics.clone(),
    ));
    Ok(Arc::new(AppContext {
        pool,
        group_commit,
        engine,
        providers,
        metrics,
        order_batcher,
        reconcile_after: config.reconcile_after,
        pending_alarm: crate::commands::PendingAlarm::new(config.pending_alarm),
        action_timeout: config.action_timeout,
        balance_hold_ttl: config.balance_hold_ttl,
        stock_reservation_ttl: config.stock_reservation_ttl,
        stock_customer_open_orders: config.stock_customer_open_orders,
        capture_reminder: config.capture_reminder,
        webhook_command_wait: config.webhook_command_wait,
        local_runs: Default::default(),
        event_retention: config.event_retention,
        checkout: crate::commands::CheckoutSettings {
            ttl: config.checkout_ttl,
            public_url: config.public_url.clone().unwrap_or(bound_url),
        },
        books_gate: Default::default(),
    }))
}

/// How the restore guard looks: a gap starts a lease (and a minute for the
/// provider's answers) before the last sight, since a command in flight
/// then may have reached the provider without its rows surviving.
fn guard_settings(config: &ServeConfig) -> crate::books::GuardSettings {
    crate::books::GuardSettings {
        margin: config.idempotency_lease + std::time::Duration::from_secs(60),
        policy: config.books.orphan_policy,
    }
}

/// Spawns `pass` with its own clone of the context every `interval` until
/// `stopped` (`workers::every`).
fn spawn_every<F, Fut>(
    name: &'static str,
    interval: std::time::Duration,
    stopped: watch::Receiver<bool>,
    ctx: &Arc<AppContext>,
    pass: F,
) -> JoinHandle<()>
where
    F: Fn(Arc<AppContext>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let ctx = ctx.clone();
    tokio::spawn(workers::every(name, interval, stopped, move || {
        pass(ctx.clone())
    }))
}

/// The background workers of `serve`, each a pass repeated on its
/// interval; a failed pass is logged and the next one tries again.
fn spawn_workers(
    config: &ServeConfig,
    ctx: &Arc<AppContext>,
    stopped: watch::Receiver<bool>,
) -> Result<Vec<JoinHandle<()>>, StartError> {
    let (guard, books) = (guard_settings(config), config.books);
    let webhooks = &config.merchant_webhooks;
    let deliverer = Arc::new(events::deliveries::Deliverer::new(
        webhooks.schedule.clone(),
        webhooks.timeout,
        webhooks.allow_private,
    )?);
    let five_seconds = std::time::Duration::from_secs(5);
    Ok(vec![
        spawn_every(
            "deliveries",
            webhooks.interval,
            stopped.clone(),
            ctx,
            move |ctx| {
                let deliverer = deliverer.clone();
                async move {
                    if let Err(e) = events::deliveries::pass(&ctx, &deliverer).await {
                        tracing::warn!(error = %e, "delivery pass failed; retrying next interval");
                    }
                }
            },
        ),
        spawn_every(
            "delivery-gauge",
            five_seconds,
            stopped.clone(),
            ctx,
            |ctx| async move {
                if let Err(e) = events::deliveries::measure(&ctx).await {
                    tracing::debug!(error = %e, "could not measure undelivered events");
                }
            },
        ),
        spawn_every(
            "reconciler",
            config.reconcile_interval,
            stopped.clone(),
            ctx,
            |ctx| async move {
                if let Err(e) = workers::reconciler::pass(&ctx).await {
                    tracing::warn!(error = %e, "reconciler pass failed; retrying next interval");
                }
            },
        ),
        spawn_every(
            "restore-guard",
            std::time::Duration::from_secs(2),
            stopped.clone(),
            ctx,
            move |ctx| async move {
                if let Err(e) = crate::books::restore_guard(&ctx, guard).await {
                    tracing::warn!(error = %e, "restore guard failed; retrying");
                }
            },
        ),
        spawn_every(
            "books",
            books.interval,
            stopped.clone(),
            ctx,
            move |ctx| async move {
                let pass = crate::books::scheduled_pass(
                    &ctx,
                    books.window,
                    books.orphan_policy,
                    books.read_back_limit,
                );
                if let Err(e) = pass.await {
                    tracing::warn!(error = %e, "books reconciliation failed; the next pass resumes it");
                }
            },
        ),
        spawn_every(
            "sweeper",
            config.sweep_interval,
            stopped,
            ctx,
            |ctx| async move {
                match workers::sweeper::sweep(&ctx).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "swept expired idempotency records"),
                    Err(e) => tracing::warn!(error = %e, "sweep failed; retrying next interval"),
                }
                match workers::sweeper::expire_holds(&ctx).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(holders = n, "voided balance holds past their expiry"),
                    Err(e) => {
                        tracing::warn!(error = %e, "hold expiry failed; retrying next interval")
                    }
                }
                match workers::sweeper::expire_reservations(&ctx).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        orders = n,
                        "released stock reservations past their deadline"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "reservation expiry failed; retrying next interval")
                    }
                }
                match workers::sweeper::authorizations(&ctx).await {
                    Ok(h) if h == workers::sweeper::Holds::default() => {}
                    Ok(h) => tracing::info!(
                        voided = h.voided,
                        captured = h.captured,
                        unknown = h.unknown,
                        reminded = h.reminded,
                        "ended holds past their deadline or asked to be voided"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "hold sweep failed; retrying next interval")
                    }
                }
                match workers::sweeper::retention(&ctx).await {
                    Ok(d) if d.events == 0 => {}
                    Ok(d) => tracing::info!(
                        events = d.events,
                        deliveries = d.deliveries,
                        attempts = d.attempts,
                        "deleted events past ONCEPAY_EVENT_RETENTION"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "retention sweep failed; retrying next interval")
                    }
                }
            },
        ),
    ])
}

impl Application {
    /// Migrates, binds `config.bind` (port 0 picks a free port) and starts
    /// the background workers.
    pub async fn build(config: ServeConfig) -> Result<Application, StartError> {
        if let Some(fitted) = &config.writers_fitted {
            tracing::warn!(
                db_pool_size = fitted.pool,
                order_batch_writers = fitted.order_batch_writers.1,
                group_commit_writers = fitted.group_commit_writers.1,
                "{}",
                fitted.warning()
            );
        }
        warn_without_stripe_webhooks(&config);
        let applied =
            store::prepare_database_patiently(&config.database_url, config.db_start_timeout)
                .await?;
        if !applied.is_empty() {
            tracing::info!(migrations = ?applied, "applied migrations");
        }
        let listener = TcpListener::bind(config.bind)?;
        let addr = listener.local_addr()?;
        let ctx = context(&config, format!("http://{addr}"))?;
        // Before any request: a database that went back in time closes the
        // gate until the books are reconciled (the guard worker does that).
        if let Err(e) = crate::books::observe(&ctx, guard_settings(&config)).await {
            tracing::warn!(error = %e, "could not read the database's lineage; the guard retries");
        }
        let keys = Arc::new(crate::api_keys::KeyCache::new(config.auth_cache_ttl));
        let state = web::Data::new(AppState {
            ctx: ctx.clone(),
            body_limits: http::BodyLimits::new(
                config.max_body_bytes,
                config.body_timeout,
                config.slow_bodies_per_client,
            ),
            keys: keys.clone(),
            identity: Arc::new(
                crate::identity::Verifier::new(
                    ctx.pool.clone(),
                    config.merchant_webhooks.allow_private,
                    config.jwks,
                    config.auth_cache_ttl,
                )
                .map_err(|e| StartError::Config(format!("cannot build the JWKS client: {e}")))?,
            ),
            rate_limits: crate::rate_limit::RateLimits::new(config.rate_limit),
            auth_failures: crate::rate_limit::RateLimits::new(config.auth_failure_rate_limit),
            checkout_limits: http::CheckoutLimits::new(
                config.checkout_rate_limit,
                config.checkout_address_rate_limit,
            ),
            webhook_allow_private: config.merchant_webhooks.allow_private,
            runtime: tokio::runtime::Handle::current(),
        });
        // actix-web's `HttpServer::listen`, spelled out so that each
        // connection's stream can be wrapped (`http::wire`): the same
        // settings, the same graceful shutdown.
        let (header_timeout, metrics) = (config.header_timeout, ctx.metrics.clone());
        let builder = actix_server::Server::build()
            .workers(config.http_workers)
            .shutdown_timeout(config.shutdown_timeout.as_secs().max(1));
        let draining = builder.graceful_shutdown_signal();
        let server = builder
            .listen(format!("oncepay-http-{addr}"), listener, move || {
                let (state, draining, metrics) = (state.clone(), draining.clone(), metrics.clone());
                let app = App::new()
                    .wrap(from_fn(http::observe))
                    .app_data(state)
                    .app_data(web::QueryConfig::default().error_handler(|err, _| {
                        let problem = crate::problem::Problem::new(
                            crate::problem::ProblemCode::InvalidField,
                            format!("query string: {err}"),
                        );
                        actix_web::error::InternalError::from_response(
                            err,
                            actix_web::ResponseError::error_response(&problem),
                        )
                        .into()
                    }))
                    .configure(http::routes);
                let app = actix_service::map_config(app, move |()| {
                    AppConfig::__priv_test_new(false, addr.to_string(), addr)
                });
                let h1 = HttpService::<ProblemIo<TcpStream>, _, BoxBody>::build()
                    .keep_alive(KeepAlive::default())
                    .client_request_timeout(header_timeout)
                    .client_disconnect_timeout(Duration::from_secs(1))
                    .h1_allow_half_closed(true)
                    .local_addr(addr)
                    .graceful_shutdown_signal(move || {
                        let draining = draining.clone();
                        async move { draining.notified().await }
                    })
                    .h1(app);
                fn_service(move |io: TcpStream| {
                    let peer = io.peer_addr().ok();
                    let io = ProblemIo::new(io, peer, metrics.clone());
                    std::future::ready(Ok::<_, DispatchError>((io, peer)))
                })
                .and_then(h1)
            })?
            .run();

        let (stop_workers, stopped) = watch::channel(false);
        let revocations = tokio::spawn(crate::api_keys::listen_for_revocations(
            ctx.pool.clone(),
            keys,
            stopped.clone(),
        ));
        let mut workers = spawn_workers(&config, &ctx, stopped)?;
        workers.push(revocations);
        Ok(Application {
            addr,
            server,
            ctx,
            workers,
            stop_workers,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Commands, pool and metrics (tests use it to drive workers directly).
    pub fn context(&self) -> Arc<AppContext> {
        self.ctx.clone()
    }

    /// Serves until SIGTERM/SIGINT: in-flight requests finish, then the
    /// workers stop.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        tracing::info!(addr = %self.addr, "oncepay serving");
        let result = self.server.await;
        let _ = self.stop_workers.send(true);
        for worker in self.workers {
            let _ = worker.await;
        }
        self.ctx.pool.close().await;
        tracing::info!("oncepay stopped");
        result
    }
}
