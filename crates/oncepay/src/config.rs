//! Configuration from environment variables.
//!
//! Every setting has a default that works on a developer machine with a local
//! PostgreSQL; a bad value stops the process at start with an error naming the
//! variable, rather than surfacing later as odd behaviour.

pub mod variables;

use std::net::SocketAddr;
use std::time::Duration;

use crate::provider::stripe::SecretKey as StripeSecretKey;
pub use crate::provider::stripe::StripeConfig;
pub use crate::webhooks::DEV_WEBHOOK_SECRET;

/// Why a configuration value was refused, naming the variable.
#[derive(Debug, thiserror::Error)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub var: &'static str,
    /// The value it had.
    pub value: String,
    /// What was expected instead.
    pub reason: String,
}

/// Reads variables through a lookup function so tests can supply their own
/// environment without touching the process's.
pub struct Env<F: Fn(&str) -> Option<String>> {
    lookup: F,
}

impl Env<fn(&str) -> Option<String>> {
    /// The process environment.
    pub fn process() -> Self {
        Env {
            lookup: |name| std::env::var(name).ok(),
        }
    }
}

impl<F: Fn(&str) -> Option<String>> Env<F> {
    /// An environment backed by `lookup` (used by tests).
    pub fn from_fn(lookup: F) -> Self {
        Env { lookup }
    }

    fn get<T>(
        &self,
        var: &'static str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        match (self.lookup)(var) {
            None => Ok(default),
            Some(value) if value.trim().is_empty() => Ok(default),
            Some(value) => parse(value.trim()).map_err(|reason| ConfigError {
                var,
                // A secret, or a URL that may carry a password, is never echoed.
                value: if var.contains("SECRET") || var == "DATABASE_URL" {
                    "<redacted>".into()
                } else {
                    value
                },
                reason,
            }),
        }
    }

    fn string(&self, var: &'static str, default: &str) -> Result<String, ConfigError> {
        self.get(var, default.to_string(), |v| Ok(v.to_string()))
    }

    fn duration(&self, var: &'static str, default: Duration) -> Result<Duration, ConfigError> {
        self.get(var, default, parse_duration)
    }

    fn addr(&self, var: &'static str, default: &str) -> Result<SocketAddr, ConfigError> {
        let fallback = default.parse().map_err(|_| ConfigError {
            var,
            value: default.into(),
            reason: "bad built-in default".into(),
        })?;
        self.get(var, fallback, |v| {
            v.parse()
                .map_err(|_| "expected host:port, e.g. 127.0.0.1:8080".to_string())
        })
    }

    fn number<T: std::str::FromStr + PartialOrd + Copy + std::fmt::Display>(
        &self,
        var: &'static str,
        default: T,
        min: T,
        max: T,
    ) -> Result<T, ConfigError> {
        self.get(var, default, |v| match v.parse::<T>() {
            Ok(n) if n >= min && n <= max => Ok(n),
            _ => Err(format!("expected a number from {min} to {max}")),
        })
    }

    fn flag(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        self.get(var, default, |v| match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err("expected on/off (or true/false, 1/0)".into()),
        })
    }

    fn url(&self, var: &'static str, default: &str) -> Result<String, ConfigError> {
        self.get(var, default.to_string(), |v| {
            if (v.starts_with("http://") || v.starts_with("https://")) && v.len() > 8 {
                Ok(v.trim_end_matches('/').to_string())
            } else {
                Err("expected an http:// or https:// URL".into())
            }
        })
    }

    /// `ONCEPAY_PROVIDER_URL`: the sandbox's address.
    fn provider_url(&self) -> Result<String, ConfigError> {
        self.url("ONCEPAY_PROVIDER_URL", "http://127.0.0.1:8081")
    }

    /// `ONCEPAY_PROVIDER`: where new payments go.
    fn provider(&self) -> Result<String, ConfigError> {
        use crate::provider::{sandbox, stripe};
        self.get("ONCEPAY_PROVIDER", sandbox::NAME.to_string(), |v| {
            if [sandbox::NAME, stripe::NAME].contains(&v) {
                Ok(v.to_string())
            } else {
                Err("expected sandbox or stripe".into())
            }
        })
    }

    /// Stripe's settings, if `ONCEPAY_STRIPE_SECRET_KEY` is set; required
    /// when `provider` is `stripe`.
    fn stripe(&self, provider: &str) -> Result<Option<StripeConfig>, ConfigError> {
        let secret_key = self.get("ONCEPAY_STRIPE_SECRET_KEY", None, |v| {
            StripeSecretKey::parse(v).map(Some).map_err(str::to_string)
        })?;
        let Some(secret_key) = secret_key else {
            if provider == crate::provider::stripe::NAME {
                return Err(ConfigError {
                    var: "ONCEPAY_STRIPE_SECRET_KEY",
                    value: String::new(),
                    reason: "required when ONCEPAY_PROVIDER=stripe".into(),
                });
            }
            return Ok(None);
        };
        let publishable_key = self.get("ONCEPAY_STRIPE_PUBLISHABLE_KEY", None, |v| {
            crate::provider::stripe::PublishableKey::parse(v, &secret_key)
                .map(Some)
                .map_err(str::to_string)
        })?;
        // With live keys the checkout page has no test-token field: without
        // Elements its customers could not pay at all.
        if publishable_key.is_none() && secret_key.is_live() {
            return Err(ConfigError {
                var: "ONCEPAY_STRIPE_PUBLISHABLE_KEY",
                value: String::new(),
                reason: "required with a live secret key (the checkout's card form)".into(),
            });
        }
        Ok(Some(StripeConfig {
            secret_key,
            publishable_key,
            api_base: self.url("ONCEPAY_STRIPE_API_BASE", "https://api.stripe.com")?,
            webhook_secrets: self.get("ONCEPAY_STRIPE_WEBHOOK_SECRET", None, |v| {
                crate::provider::stripe::WebhookSecrets::parse(v)
                    .map(Some)
                    .map_err(str::to_string)
            })?,
        }))
    }

    /// `DATABASE_URL`, used by every subcommand that touches the database.
    pub fn database_url(&self) -> Result<String, ConfigError> {
        self.get(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/oncepay".to_string(),
            |v| {
                if v.starts_with("postgres://") || v.starts_with("postgresql://") {
                    Ok(v.to_string())
                } else {
                    Err("expected a postgres:// URL".into())
                }
            },
        )
    }

    /// `ONCEPAY_WEBHOOK_SECRET`, checked to be `whsec_` + base64.
    pub fn webhook_secret(&self) -> Result<crate::webhooks::WebhookSecret, ConfigError> {
        self.get(
            "ONCEPAY_WEBHOOK_SECRET",
            crate::webhooks::WebhookSecret::dev(),
            |v| crate::webhooks::WebhookSecret::parse(v).map_err(|e| e.to_string()),
        )
    }

    /// `ONCEPAY_WEBHOOK_SECRET` for a process listening on `bind`: the public
    /// development secret is refused anywhere but on a loopback address,
    /// because anyone who has read the source could sign events with it.
    fn webhook_secret_for(
        &self,
        bind: SocketAddr,
        bind_var: &'static str,
    ) -> Result<crate::webhooks::WebhookSecret, ConfigError> {
        let secret = self.webhook_secret()?;
        if secret.is_development() && !bind.ip().is_loopback() {
            return Err(ConfigError {
                var: "ONCEPAY_WEBHOOK_SECRET",
                value: "<the public development secret>".into(),
                reason: format!(
                    "{bind_var} is {bind}, which is not a loopback address; set ONCEPAY_WEBHOOK_SECRET \
                     to a secret of your own (whsec_ followed by the base64 of at least 16 random \
                     bytes, e.g. \"whsec_$(head -c 32 /dev/urandom | base64)\")"
                ),
            });
        }
        Ok(secret)
    }

    /// Everything `oncepay serve` needs.
    pub fn serve_config(&self) -> Result<ServeConfig, ConfigError> {
        let idempotency_ttl =
            self.duration("ONCEPAY_IDEMPOTENCY_TTL", Duration::from_secs(86_400))?;
        let lease = self.duration("ONCEPAY_IDEMPOTENCY_LEASE", Duration::from_secs(30))?;
        for (var, value) in [
            ("ONCEPAY_IDEMPOTENCY_TTL", idempotency_ttl),
            ("ONCEPAY_IDEMPOTENCY_LEASE", lease),
        ] {
            // Zero would break "exactly one of N duplicates executes": every
            // record would be expired (or its lease lost) as it is written.
            if value < Duration::from_millis(100) {
                return Err(ConfigError {
                    var,
                    value: format!("{value:?}"),
                    reason: "must be at least 100ms".into(),
                });
            }
        }
        let bind = self.addr("ONCEPAY_BIND", "127.0.0.1:8080")?;
        let provider = self.provider()?;
        let config = ServeConfig {
            database_url: self.database_url()?,
            bind,
            stripe: self.stripe(&provider)?,
            provider,
            provider_url: self.provider_url()?,
            provider_public_url: match (self.lookup)("ONCEPAY_PROVIDER_PUBLIC_URL") {
                Some(v) if !v.trim().is_empty() => {
                    Some(self.url("ONCEPAY_PROVIDER_PUBLIC_URL", "")?)
                }
                _ => None,
            },
            webhook_secret: self.webhook_secret_for(bind, "ONCEPAY_BIND")?,
            idempotency_ttl,
            idempotency_wait: self.duration("ONCEPAY_IDEMPOTENCY_WAIT", Duration::from_secs(2))?,
            idempotency_lease: lease,
            replay_cache_entries: self.number(
                "ONCEPAY_REPLAY_CACHE_ENTRIES",
                10_000usize,
                0,
                10_000_000,
            )?,
            order_batch_max: self.number("ONCEPAY_ORDER_BATCH_MAX", 64usize, 1, 1000)?,
            group_commit_max: self.number("ONCEPAY_GROUP_COMMIT_MAX", 16usize, 1, 1000)?,
            auth_cache_ttl: self.duration("ONCEPAY_AUTH_CACHE_TTL", Duration::from_secs(30))?,
            provider_timeout: self.duration("ONCEPAY_PROVIDER_TIMEOUT", Duration::from_secs(5))?,
            db_pool_size: self.number("ONCEPAY_DB_POOL_SIZE", 8u32, 1, 1000)?,
            order_batch_writers: self.number("ONCEPAY_ORDER_BATCH_WRITERS", 1usize, 1, 1000)?,
            group_commit_writers: self.number("ONCEPAY_GROUP_COMMIT_WRITERS", 2usize, 1, 1000)?,
            db_start_timeout: self.duration("ONCEPAY_DB_START_TIMEOUT", Duration::from_secs(60))?,
            http_workers: self.number("ONCEPAY_HTTP_WORKERS", default_workers(), 1, 256)?,
            max_body_bytes: self.number("ONCEPAY_MAX_BODY_BYTES", 65_536usize, 1_024, 16 << 20)?,
            header_timeout: self.duration("ONCEPAY_HEADER_TIMEOUT", Duration::from_secs(5))?,
            body_timeout: self.duration("ONCEPAY_BODY_TIMEOUT", Duration::from_secs(10))?,
            slow_bodies_per_client: self.number(
                "ONCEPAY_SLOW_BODIES_PER_CLIENT",
                32usize,
                1,
                1_000_000,
            )?,
            reconcile_interval: self
                .duration("ONCEPAY_RECONCILE_INTERVAL", Duration::from_secs(2))?,
            reconcile_after: self.duration("ONCEPAY_RECONCILE_AFTER", Duration::from_secs(10))?,
            pending_alarm: self.duration("ONCEPAY_PENDING_ALARM", Duration::from_secs(900))?,
            action_timeout: self.duration("ONCEPAY_ACTION_TIMEOUT", Duration::from_secs(3600))?,
            webhook_command_wait: self
                .duration("ONCEPAY_WEBHOOK_COMMAND_WAIT", Duration::from_millis(250))?,
            checkout_ttl: self.duration("ONCEPAY_CHECKOUT_TTL", Duration::from_secs(3600))?,
            public_url: match (self.lookup)("ONCEPAY_PUBLIC_URL") {
                Some(v) if !v.trim().is_empty() => Some(self.url("ONCEPAY_PUBLIC_URL", "")?),
                _ => None,
            },
            sweep_interval: self.duration("ONCEPAY_SWEEP_INTERVAL", Duration::from_secs(60))?,
            event_retention: self
                .duration("ONCEPAY_EVENT_RETENTION", Duration::from_secs(30 * 86_400))?,
            books: BooksConfig {
                interval: self.duration("ONCEPAY_BOOKS_INTERVAL", Duration::from_secs(3600))?,
                window: self.duration("ONCEPAY_BOOKS_WINDOW", Duration::from_secs(26 * 3600))?,
                orphan_policy: self.get(
                    "ONCEPAY_ORPHAN_POLICY",
                    crate::domain::adoption::OrphanPolicy::Refund,
                    |v| {
                        crate::domain::adoption::OrphanPolicy::parse(v)
                            .ok_or_else(|| "expected refund or hold".to_string())
                    },
                )?,
            },
            shutdown_timeout: self.duration("ONCEPAY_SHUTDOWN_TIMEOUT", Duration::from_secs(30))?,
            merchant_webhooks: MerchantWebhooks {
                schedule: self.get(
                    "ONCEPAY_WEBHOOK_SCHEDULE",
                    crate::domain::event::RetrySchedule::standard(),
                    |v| {
                        crate::domain::event::RetrySchedule::parse(v, parse_duration).map_err(|e| {
                            format!("expected comma-separated durations (5s,5m,30m,...): {e}")
                        })
                    },
                )?,
                timeout: self.duration("ONCEPAY_WEBHOOK_TIMEOUT", Duration::from_secs(10))?,
                allow_private: self.flag("ONCEPAY_WEBHOOK_ALLOW_PRIVATE", false)?,
                interval: self.duration("ONCEPAY_WEBHOOK_INTERVAL", Duration::from_millis(250))?,
            },
            rate_limit: crate::rate_limit::Limit::new(
                self.number("ONCEPAY_RATE_LIMIT_PER_SECOND", 100i64, 0, 1_000_000)?,
                self.number("ONCEPAY_RATE_LIMIT_BURST", 200i64, 1, 1_000_000)?,
            ),
            checkout_rate_limit: crate::rate_limit::Limit::new(
                self.number("ONCEPAY_CHECKOUT_RATE_LIMIT_PER_SECOND", 2i64, 0, 1_000_000)?,
                self.number("ONCEPAY_CHECKOUT_RATE_LIMIT_BURST", 20i64, 1, 1_000_000)?,
            ),
            checkout_address_rate_limit: crate::rate_limit::Limit::new(
                self.number(
                    "ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_PER_SECOND",
                    20i64,
                    0,
                    1_000_000,
                )?,
                self.number(
                    "ONCEPAY_CHECKOUT_ADDRESS_RATE_LIMIT_BURST",
                    100i64,
                    1,
                    1_000_000,
                )?,
            ),
        };
        pool_outlasts_writers(&config)?;
        Ok(config)
    }

    /// Everything `oncepay sandbox` needs.
    pub fn sandbox_config(&self) -> Result<SandboxConfig, ConfigError> {
        let rate = |var| {
            self.get(var, 0.0f64, |v| match v.parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                _ => Err("expected a probability from 0 to 1".into()),
            })
        };
        let bind = self.addr("ONCEPAY_SANDBOX_BIND", "127.0.0.1:8081")?;
        Ok(SandboxConfig {
            bind,
            webhook_url: self.url(
                "ONCEPAY_SANDBOX_WEBHOOK_URL",
                "http://127.0.0.1:8080/webhooks/sandbox",
            )?,
            webhook_secret: self.webhook_secret_for(bind, "ONCEPAY_SANDBOX_BIND")?,
            webhooks_enabled: self.flag("ONCEPAY_SANDBOX_WEBHOOKS", true)?,
            async_delay: self.duration("ONCEPAY_SANDBOX_ASYNC_DELAY", Duration::from_secs(2))?,
            public_url: match (self.lookup)("ONCEPAY_SANDBOX_PUBLIC_URL") {
                Some(v) if !v.trim().is_empty() => {
                    Some(self.url("ONCEPAY_SANDBOX_PUBLIC_URL", "")?)
                }
                _ => None,
            },
            faults: FaultRates {
                delay: self.duration("ONCEPAY_SANDBOX_DELAY", Duration::ZERO)?,
                delay_rate: rate("ONCEPAY_SANDBOX_DELAY_RATE")?,
                error_rate: rate("ONCEPAY_SANDBOX_ERROR_RATE")?,
                drop_rate: rate("ONCEPAY_SANDBOX_DROP_RATE")?,
                duplicate_webhooks: self.number(
                    "ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS",
                    1u32,
                    1,
                    20,
                )?,
                reorder_webhooks: self.flag("ONCEPAY_SANDBOX_REORDER_WEBHOOKS", false)?,
                forget_trace: self.flag("ONCEPAY_SANDBOX_FORGET_TRACE", false)?,
            },
        })
    }

    /// `ONCEPAY_LOG` (an `EnvFilter` directive) and `ONCEPAY_LOG_FORMAT`.
    pub fn log_config(&self) -> Result<(String, LogFormat), ConfigError> {
        let filter = self.string("ONCEPAY_LOG", "info,sqlx=warn")?;
        let format = self.get("ONCEPAY_LOG_FORMAT", LogFormat::Text, |v| match v {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err("expected text or json".into()),
        })?;
        Ok((filter, format))
    }
}

/// The writers of create-order's batches and of group commit each keep a
/// pooled connection while they are busy
/// (`store::writers::WriterConnection`): a pool no larger than all of them
/// would leave every other statement waiting for one to idle, which under
/// steady load never happens.
fn pool_outlasts_writers(config: &ServeConfig) -> Result<(), ConfigError> {
    let writers = |max: usize, writers: usize| if max > 1 { writers } else { 0 };
    let held = writers(config.order_batch_max, config.order_batch_writers)
        + writers(config.group_commit_max, config.group_commit_writers);
    if config.db_pool_size as usize <= held {
        return Err(ConfigError {
            var: "ONCEPAY_DB_POOL_SIZE",
            value: config.db_pool_size.to_string(),
            reason: format!(
                "must exceed the writers that keep a connection while busy \
                 (ONCEPAY_ORDER_BATCH_WRITERS + ONCEPAY_GROUP_COMMIT_WRITERS: {held})"
            ),
        });
    }
    Ok(())
}

fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
}

pub use crate::telemetry::LogFormat;

/// Settings of `oncepay serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// PostgreSQL connection URL.
    pub database_url: String,
    /// Address the API listens on.
    pub bind: SocketAddr,
    /// Where new payments go (`ONCEPAY_PROVIDER`: `sandbox` or `stripe`).
    pub provider: String,
    /// Stripe, if configured.
    pub stripe: Option<StripeConfig>,
    /// Base URL of the sandbox (`ONCEPAY_PROVIDER_URL`).
    pub provider_url: String,
    /// How customers' browsers reach the sandbox (its tokenization and
    /// bank page) (`ONCEPAY_PROVIDER_PUBLIC_URL`); `None`: `provider_url`.
    pub provider_public_url: Option<String>,
    /// Verifies inbound webhooks.
    pub webhook_secret: crate::webhooks::WebhookSecret,
    /// How long idempotency records are kept.
    pub idempotency_ttl: Duration,
    /// How long a duplicate waits for the first request before `409 in_flight`.
    pub idempotency_wait: Duration,
    /// How long an executing command owns its record before another process may resume it.
    pub idempotency_lease: Duration,
    /// How many completed records each process answers from memory.
    pub replay_cache_entries: usize,
    /// The most new orders one statement inserts (`store::order_batch`).
    pub order_batch_max: usize,
    /// The most statements of payments and provider webhooks one commit
    /// holds (`store::group_commit`).
    pub group_commit_max: usize,
    /// How many batches of new orders run at once, each on a pooled
    /// connection.
    pub order_batch_writers: usize,
    /// How many groups of payment statements run at once, each on a
    /// pooled connection.
    pub group_commit_writers: usize,
    /// How long a verified API key is trusted without asking the database.
    pub auth_cache_ttl: Duration,
    /// Per-request timeout of provider calls.
    pub provider_timeout: Duration,
    /// Largest number of database connections per process.
    pub db_pool_size: u32,
    /// How long `serve` waits at start for a writable database (a failover
    /// may be under way) before giving up.
    pub db_start_timeout: Duration,
    /// Number of HTTP worker threads.
    pub http_workers: usize,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// How long a request head may take to arrive before `408`
    /// (`ONCEPAY_HEADER_TIMEOUT`).
    pub header_timeout: Duration,
    /// How long a request body may take to arrive before `408`
    /// (`ONCEPAY_BODY_TIMEOUT`).
    pub body_timeout: Duration,
    /// Bodies one client address may be slow to send at once before `429`
    /// (`ONCEPAY_SLOW_BODIES_PER_CLIENT`).
    pub slow_bodies_per_client: usize,
    /// How often the reconciler looks for work.
    pub reconcile_interval: Duration,
    /// How long a payment or refund stays pending before the reconciler asks the provider.
    pub reconcile_after: Duration,
    /// How long a payment or refund may stay pending before an alarm (error
    /// log, counter) is raised for it.
    pub pending_alarm: Duration,
    /// How long a payment may wait for its customer (3-D Secure) before
    /// the reconciler fails it as `authentication_expired`, having asked
    /// the provider first (`ONCEPAY_ACTION_TIMEOUT`, 1 h).
    pub action_timeout: Duration,
    /// How long a provider event that would settle a charge waits for the
    /// command still executing on it (see `provider_events`).
    pub webhook_command_wait: Duration,
    /// How long a checkout page's token works.
    pub checkout_ttl: Duration,
    /// How browsers reach the service (`ONCEPAY_PUBLIC_URL`); `None`: the
    /// bound address.
    pub public_url: Option<String>,
    /// How often expired idempotency records are swept.
    pub sweep_interval: Duration,
    /// How long events, their deliveries and attempts are kept
    /// (`ONCEPAY_EVENT_RETENTION`, 30 days, as Stripe keeps events).
    pub event_retention: Duration,
    /// The books reconciliation.
    pub books: BooksConfig,
    /// How long SIGTERM waits for in-flight requests.
    pub shutdown_timeout: Duration,
    /// Outbound webhooks to merchants' endpoints.
    pub merchant_webhooks: MerchantWebhooks,
    /// Every merchant's rate limit unless it has its own; `None`: unlimited.
    pub rate_limit: Option<crate::rate_limit::Limit>,
    /// Each checkout session's rate limit; `None`: unlimited.
    pub checkout_rate_limit: Option<crate::rate_limit::Limit>,
    /// Each client address's rate limit on the checkout; `None`: unlimited.
    pub checkout_address_rate_limit: Option<crate::rate_limit::Limit>,
}

/// Settings of outbound webhooks (merchant notifications).
#[derive(Debug, Clone)]
pub struct MerchantWebhooks {
    /// The waits between attempts (`ONCEPAY_WEBHOOK_SCHEDULE`).
    pub schedule: crate::domain::event::RetrySchedule,
    /// Per-attempt timeout (`ONCEPAY_WEBHOOK_TIMEOUT`).
    pub timeout: Duration,
    /// Endpoints on loopback or private addresses allowed
    /// (`ONCEPAY_WEBHOOK_ALLOW_PRIVATE`): for development and tests only.
    pub allow_private: bool,
    /// How often the delivery worker looks for due deliveries
    /// (`ONCEPAY_WEBHOOK_INTERVAL`).
    pub interval: Duration,
}

/// Faults injected at random into charge and refund requests, set at start.
#[derive(Debug, Clone, Default)]
pub struct FaultRates {
    /// How long a delayed answer waits (`ONCEPAY_SANDBOX_DELAY`).
    pub delay: Duration,
    /// Share of requests answered late (`ONCEPAY_SANDBOX_DELAY_RATE`).
    pub delay_rate: f64,
    /// Share answered `500` before any effect (`ONCEPAY_SANDBOX_ERROR_RATE`).
    pub error_rate: f64,
    /// Share whose effect happens but whose answer is lost (`ONCEPAY_SANDBOX_DROP_RATE`).
    pub drop_rate: f64,
    /// How many times each webhook is delivered (`ONCEPAY_SANDBOX_DUPLICATE_WEBHOOKS`).
    pub duplicate_webhooks: u32,
    /// Deliver each charge's events in reverse order (`ONCEPAY_SANDBOX_REORDER_WEBHOOKS`).
    pub reorder_webhooks: bool,
    /// Keep only the order id of the metadata oncepay sends, as a provider
    /// without metadata would (`ONCEPAY_SANDBOX_FORGET_TRACE`): the books
    /// reconciliation can then rebuild nothing (`make chaos-restore`'s
    /// mutation run).
    pub forget_trace: bool,
}

/// Settings of `oncepay sandbox`.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Address the sandbox listens on.
    pub bind: SocketAddr,
    /// Where signed webhooks are posted.
    pub webhook_url: String,
    /// Signs outbound webhooks.
    pub webhook_secret: crate::webhooks::WebhookSecret,
    /// Off: no webhook is sent (the reconciler must settle everything).
    pub webhooks_enabled: bool,
    /// How long a `tok_async` charge stays pending.
    pub async_delay: Duration,
    /// Faults injected at random into every request.
    pub faults: FaultRates,
    /// How customers' browsers reach the sandbox, for its authentication
    /// page (`ONCEPAY_SANDBOX_PUBLIC_URL`); `None`: the bound address.
    pub public_url: Option<String>,
}

/// The books reconciliation's settings (`crate::books`).
#[derive(Debug, Clone, Copy)]
pub struct BooksConfig {
    /// How often `serve` reconciles (`ONCEPAY_BOOKS_INTERVAL`, 1 h).
    pub interval: Duration,
    /// Over how much of the recent past (`ONCEPAY_BOOKS_WINDOW`, 26 h: a
    /// day and the provider's slowest settlement).
    pub window: Duration,
    /// What is done with a charge no order can own
    /// (`ONCEPAY_ORPHAN_POLICY`: `refund`, the default, or `hold`).
    pub orphan_policy: crate::domain::adoption::OrphanPolicy,
}

/// Parses `500ms`, `2s`, `5m`, `24h`, `7d` (a bare number means seconds).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("expected a duration like 500ms, 2s, 5m, 24h or 7d, got {text:?}");
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number.parse().map_err(|_| bad())?;
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3_600.0,
        "d" => 86_400.0,
        _ => return Err(bad()),
    };
    let seconds = value * scale;
    if !seconds.is_finite() || !(0.0..=1e9).contains(&seconds) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Env<impl Fn(&str) -> Option<String>> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_fn(move |k| map.get(k).cloned())
    }

    #[test]
    fn durations_parse_in_every_unit() {
        assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("5y").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn defaults_work_without_any_variable() {
        let cfg = env(&[]).serve_config().expect("defaults are valid");
        assert_eq!(cfg.bind.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.idempotency_ttl, Duration::from_secs(86_400));
        assert_eq!(cfg.idempotency_wait, Duration::from_secs(2));
        assert!(cfg.database_url.ends_with("/oncepay"));
        let sandbox = env(&[]).sandbox_config().expect("defaults are valid");
        assert_eq!(sandbox.bind.to_string(), "127.0.0.1:8081");
        assert_eq!(
            sandbox.webhook_url,
            "http://127.0.0.1:8080/webhooks/sandbox"
        );
    }

    #[test]
    fn a_bad_value_names_its_variable() {
        let err = env(&[("ONCEPAY_IDEMPOTENCY_WAIT", "forever")])
            .serve_config()
            .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_IDEMPOTENCY_WAIT"));
        let err = env(&[("ONCEPAY_BIND", "localhost")])
            .serve_config()
            .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_BIND"));
        let err = env(&[("ONCEPAY_PROVIDER", "paypal")])
            .serve_config()
            .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_PROVIDER"));
        let err = env(&[("ONCEPAY_PROVIDER", "stripe")])
            .serve_config()
            .expect_err("Stripe needs its key");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_SECRET_KEY"));
        let err = env(&[
            ("ONCEPAY_PROVIDER", "stripe"),
            ("ONCEPAY_STRIPE_SECRET_KEY", "pk_live_abcdef"),
        ])
        .serve_config()
        .expect_err("a publishable key cannot charge");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_SECRET_KEY"));
        assert!(!err.to_string().contains("pk_live_abcdef"), "never echoed");
        let err = env(&[("ONCEPAY_STRIPE_SECRET_KEY", "sk_live_abc")])
            .serve_config()
            .expect_err("live keys need the card form's key");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_PUBLISHABLE_KEY"));
        let err = env(&[
            ("ONCEPAY_STRIPE_SECRET_KEY", "sk_live_abc"),
            ("ONCEPAY_STRIPE_PUBLISHABLE_KEY", "pk_test_abc"),
        ])
        .serve_config()
        .expect_err("a test page for a live account");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_PUBLISHABLE_KEY"));
        let live = env(&[
            ("ONCEPAY_STRIPE_SECRET_KEY", "sk_live_abc"),
            ("ONCEPAY_STRIPE_PUBLISHABLE_KEY", "pk_live_abc"),
        ])
        .serve_config()
        .expect("live keys of one mode");
        assert_eq!(
            live.stripe.and_then(|s| s.publishable_key).map(|k| k.0),
            Some("pk_live_abc".to_string())
        );
        let err = env(&[
            ("ONCEPAY_STRIPE_SECRET_KEY", "sk_test_abc"),
            ("ONCEPAY_STRIPE_API_BASE", "api.stripe.com"),
        ])
        .serve_config()
        .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_API_BASE"));
        let err = env(&[
            ("ONCEPAY_STRIPE_SECRET_KEY", "sk_test_abc"),
            ("ONCEPAY_STRIPE_WEBHOOK_SECRET", "secret"),
        ])
        .serve_config()
        .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_STRIPE_WEBHOOK_SECRET"));
        let stripe = env(&[
            ("ONCEPAY_PROVIDER", "stripe"),
            ("ONCEPAY_STRIPE_SECRET_KEY", "sk_test_abc"),
        ])
        .serve_config()
        .expect("valid");
        let stripe = stripe.stripe.expect("configured");
        assert_eq!(stripe.api_base, "https://api.stripe.com");
        assert!(!format!("{stripe:?}").contains("sk_test_abc"));
        let err = env(&[("ONCEPAY_WEBHOOK_SECRET", "plain")])
            .serve_config()
            .expect_err("must be refused");
        assert!(err.to_string().contains("ONCEPAY_WEBHOOK_SECRET"));
        assert!(
            !err.to_string().contains("plain"),
            "a secret is never echoed"
        );
        let err = env(&[("ONCEPAY_DB_POOL_SIZE", "3")])
            .serve_config()
            .expect_err("a pool the writers would fill is refused");
        assert!(err.to_string().contains("ONCEPAY_DB_POOL_SIZE"), "{err}");
        env(&[
            ("ONCEPAY_DB_POOL_SIZE", "3"),
            ("ONCEPAY_GROUP_COMMIT_MAX", "1"),
        ])
        .serve_config()
        .expect("without group commit its writers hold nothing");
        for zero in ["ONCEPAY_IDEMPOTENCY_TTL", "ONCEPAY_IDEMPOTENCY_LEASE"] {
            let err = env(&[(zero, "0")])
                .serve_config()
                .expect_err("zero is refused");
            assert!(err.to_string().contains(zero), "{err}");
        }
    }

    #[test]
    fn the_development_secret_stays_on_loopback() {
        let ok = env(&[("ONCEPAY_BIND", "127.0.0.1:8080")]).serve_config();
        assert!(ok.is_ok());
        let ok = env(&[("ONCEPAY_BIND", "[::1]:8080")]).serve_config();
        assert!(ok.is_ok());
        for (var, config) in [
            (
                "ONCEPAY_BIND",
                env(&[("ONCEPAY_BIND", "0.0.0.0:8080")])
                    .serve_config()
                    .err(),
            ),
            (
                "ONCEPAY_SANDBOX_BIND",
                env(&[("ONCEPAY_SANDBOX_BIND", "0.0.0.0:8081")])
                    .sandbox_config()
                    .err(),
            ),
            (
                "ONCEPAY_BIND",
                env(&[
                    ("ONCEPAY_BIND", "10.1.2.3:8080"),
                    ("ONCEPAY_WEBHOOK_SECRET", DEV_WEBHOOK_SECRET),
                ])
                .serve_config()
                .err(),
            ),
        ] {
            let err = config.expect("refused").to_string();
            assert!(err.contains("ONCEPAY_WEBHOOK_SECRET"), "{err}");
            assert!(err.contains(var), "{err}");
            assert!(!err.contains(DEV_WEBHOOK_SECRET), "never echoed: {err}");
        }
        let own = "whsec_c29tZW90aGVyc2VjcmV0a2V5MTIz";
        let cfg = env(&[
            ("ONCEPAY_BIND", "0.0.0.0:8080"),
            ("ONCEPAY_WEBHOOK_SECRET", own),
        ])
        .serve_config();
        assert!(cfg.is_ok());
    }
}
