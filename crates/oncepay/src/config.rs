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
pub use crate::standard_webhooks::DEV_WEBHOOK_SECRET;

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

    /// A duration that must not be zero (a stock reservation of no time
    /// would reserve nothing).
    fn positive_duration(
        &self,
        var: &'static str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        self.get(var, default, |v| match parse_duration(v)? {
            d if d.is_zero() => Err("must be longer than zero".to_string()),
            d => Ok(d),
        })
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
        use crate::provider::{sandbox, NAMES};
        self.get("ONCEPAY_PROVIDER", sandbox::NAME.to_string(), |v| {
            if NAMES.contains(&v) {
                Ok(v.to_string())
            } else {
                Err(format!("expected one of {}", NAMES.join(", ")))
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
            timeout: self.duration("ONCEPAY_STRIPE_TIMEOUT", Duration::from_secs(30))?,
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
    pub fn webhook_secret(&self) -> Result<crate::standard_webhooks::WebhookSecret, ConfigError> {
        self.get(
            "ONCEPAY_WEBHOOK_SECRET",
            crate::standard_webhooks::WebhookSecret::dev(),
            |v| crate::standard_webhooks::WebhookSecret::parse(v).map_err(|e| e.to_string()),
        )
    }

    /// `ONCEPAY_WEBHOOK_SECRET` for a process listening on `bind`: the public
    /// development secret is refused anywhere but on a loopback address,
    /// because anyone who has read the source could sign events with it.
    fn webhook_secret_for(
        &self,
        bind: SocketAddr,
        bind_var: &'static str,
    ) -> Result<crate::standard_webhooks::WebhookSecret, ConfigError> {
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

    /// How fresh the identity providers' key sets are kept: at least
    /// `ONCEPAY_JWKS_MIN_REFRESH` (also the least time between two fetches
    /// of one set), at most `ONCEPAY_JWKS_MAX_AGE`; used at most
    /// `ONCEPAY_JWKS_STALE_MAX` past that while no fetch succeeds.
    fn jwks_bounds(&self) -> Result<crate::identity::JwksBounds, ConfigError> {
        let min_refresh = self.duration("ONCEPAY_JWKS_MIN_REFRESH", Duration::from_secs(30))?;
        let max_age = self.duration("ONCEPAY_JWKS_MAX_AGE", Duration::from_secs(3600))?;
        let stale_max = self.duration("ONCEPAY_JWKS_STALE_MAX", Duration::from_secs(86_400))?;
        if min_refresh < Duration::from_millis(100) {
            // Zero would let forged `kid`s fetch the set on every request.
            return Err(ConfigError {
                var: "ONCEPAY_JWKS_MIN_REFRESH",
                value: format!("{min_refresh:?}"),
                reason: "must be at least 100ms".into(),
            });
        }
        if max_age < min_refresh {
            return Err(ConfigError {
                var: "ONCEPAY_JWKS_MAX_AGE",
                value: format!("{max_age:?}"),
                reason: "must not be shorter than ONCEPAY_JWKS_MIN_REFRESH".into(),
            });
        }
        Ok(crate::identity::JwksBounds {
            min_refresh,
            max_age,
            stale_max,
        })
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
            jwks: self.jwks_bounds()?,
            balance_hold_ttl: self
                .duration("ONCEPAY_BALANCE_HOLD_TTL", Duration::from_secs(900))?,
            stock_reservation_ttl: self
                .positive_duration("ONCEPAY_STOCK_RESERVATION_TTL", Duration::from_secs(900))?,
            stock_customer_open_orders: self.number(
                "ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS",
                3i64,
                1,
                1000,
            )?,
            capture_reminder: self
                .duration("ONCEPAY_CAPTURE_REMINDER", Duration::from_secs(86_400))?,
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
                read_back_limit: self.number(
                    "ONCEPAY_BOOKS_READ_BACK_LIMIT",
                    1000usize,
                    1,
                    100_000,
                )?,
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
            auth_failure_rate_limit: crate::rate_limit::Limit::new(
                self.number(
                    "ONCEPAY_AUTH_FAILURE_RATE_LIMIT_PER_SECOND",
                    10i64,
                    0,
                    1_000_000,
                )?,
                self.number("ONCEPAY_AUTH_FAILURE_RATE_LIMIT_BURST", 50i64, 1, 1_000_000)?,
            ),
            writers_fitted: None,
        };
        fit_writers_to_pool(config)
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
            capture_window: self.duration(
                "ONCEPAY_SANDBOX_CAPTURE_WINDOW",
                Duration::from_secs(7 * 86_400),
            )?,
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

/// The pool's connections no writer may take: the revocation listener
/// keeps one for the life of the process
/// (`api_keys::listen_for_revocations`); the books reconciliation holds
/// its lock on a second while it works on a third (`books::reconcile`);
/// and requests, the reconciler, the sweeper and the deliveries need that
/// third (and wait for it while the books run on it).
pub const POOL_RESERVED: u32 = 3;

/// The smallest `ONCEPAY_DB_POOL_SIZE` that works: [`POOL_RESERVED`], with
/// no writer (new orders and a payment's writes then each go alone on
/// their request's connection, as with `ONCEPAY_ORDER_BATCH_MAX=1` and
/// `ONCEPAY_GROUP_COMMIT_MAX=1`).
pub const MIN_DB_POOL_SIZE: u32 = POOL_RESERVED;

/// Writers given up so that they fit `ONCEPAY_DB_POOL_SIZE`: what was
/// asked and what runs (`serve` logs it once, as a warning, at start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritersFitted {
    /// `ONCEPAY_DB_POOL_SIZE`.
    pub pool: u32,
    /// `ONCEPAY_ORDER_BATCH_WRITERS`: asked (0 with `ONCEPAY_ORDER_BATCH_MAX=1`), used.
    pub order_batch_writers: (usize, usize),
    /// `ONCEPAY_GROUP_COMMIT_WRITERS`: asked (0 with `ONCEPAY_GROUP_COMMIT_MAX=1`), used.
    pub group_commit_writers: (usize, usize),
}

impl WritersFitted {
    /// The warning `serve` logs: the variables, the values used, why, and
    /// the pool size that would keep what was asked.
    pub fn warning(&self) -> String {
        let kinds = [
            (
                "ONCEPAY_ORDER_BATCH_WRITERS",
                self.order_batch_writers,
                "ONCEPAY_ORDER_BATCH_MAX",
                "new orders are",
            ),
            (
                "ONCEPAY_GROUP_COMMIT_WRITERS",
                self.group_commit_writers,
                "ONCEPAY_GROUP_COMMIT_MAX",
                "a payment's writes are",
            ),
        ];
        let used: Vec<String> = kinds
            .iter()
            .map(|(var, (asked, used), max, _)| match asked {
                0 => format!("{var} unused ({max}=1)"),
                _ => format!("{var}={used} (asked {asked})"),
            })
            .collect();
        let mut text = format!(
            "ONCEPAY_DB_POOL_SIZE={} leaves room for {} writer(s) beside the {POOL_RESERVED} \
             connections the revocation listener, the books lock and the requests need: {}",
            self.pool,
            self.pool.saturating_sub(POOL_RESERVED),
            used.join(", ")
        );
        for (_, (asked, used), max, what) in kinds {
            if used == 0 && asked > 0 {
                text += &format!("; {what} written each alone, as with {max}=1");
            }
        }
        let keep =
            POOL_RESERVED as usize + self.order_batch_writers.0 + self.group_commit_writers.0;
        text += &format!("; ONCEPAY_DB_POOL_SIZE={keep} would keep every writer asked");
        text
    }
}

/// Which writers fit in `room` connections, given `order` batch writers
/// and `group` group-commit writers asked: one of the more numerous kind
/// is given up at a time, an order writer first when they are as many (a
/// payment makes two or three group-commit writes, an order one batched
/// write).
pub fn writers_that_fit(room: usize, order: usize, group: usize) -> (usize, usize) {
    let (mut order, mut group) = (order, group);
    while order + group > room {
        if group > order {
            group -= 1;
        } else {
            order -= 1;
        }
    }
    (order, group)
}

/// The writers of create-order's batches and of group commit each keep a
/// pooled connection while they are busy
/// (`store::writers::WriterConnection`): a pool with no connection left
/// beside them would leave every other statement waiting for one to idle,
/// which under steady load never happens. So the writers are fitted to
/// the pool, not the other way round (a pool behind PgBouncer or of a
/// small managed database is small): beside [`POOL_RESERVED`] connections,
/// as many as fit; a kind left with none writes each alone on its
/// request's connection. Below [`MIN_DB_POOL_SIZE`] nothing works, and the
/// pool is refused.
fn fit_writers_to_pool(mut config: ServeConfig) -> Result<ServeConfig, ConfigError> {
    if config.db_pool_size < MIN_DB_POOL_SIZE {
        return Err(ConfigError {
            var: "ONCEPAY_DB_POOL_SIZE",
            value: config.db_pool_size.to_string(),
            reason: format!(
                "must be at least {MIN_DB_POOL_SIZE}: the revocation listener keeps one \
                 connection, the books reconciliation holds its lock on a second while it \
                 works on a third, and requests need that third too (the writers of \
                 ONCEPAY_ORDER_BATCH_WRITERS and ONCEPAY_GROUP_COMMIT_WRITERS take only what \
                 is left)"
            ),
        });
    }
    let asked = |max: usize, writers: usize| if max > 1 { writers } else { 0 };
    let order = asked(config.order_batch_max, config.order_batch_writers);
    let group = asked(config.group_commit_max, config.group_commit_writers);
    let room = (config.db_pool_size - POOL_RESERVED) as usize;
    let (order_used, group_used) = writers_that_fit(room, order, group);
    if (order_used, group_used) == (order, group) {
        return Ok(config);
    }
    if order_used < order {
        config.order_batch_writers = order_used;
        if order_used == 0 {
            config.order_batch_max = 1;
        }
    }
    if group_used < group {
        config.group_commit_writers = group_used;
        if group_used == 0 {
            config.group_commit_max = 1;
        }
    }
    config.writers_fitted = Some(WritersFitted {
        pool: config.db_pool_size,
        order_batch_writers: (order, order_used),
        group_commit_writers: (group, group_used),
    });
    Ok(config)
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
    pub webhook_secret: crate::standard_webhooks::WebhookSecret,
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
    /// Writers given up to fit `db_pool_size` (then `order_batch_writers`
    /// and `group_commit_writers` are what fits, and a kind left with none
    /// has its `_max` at 1), for `serve` to say so at start.
    pub writers_fitted: Option<WritersFitted>,
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
    /// How fresh merchants' identity providers' key sets are kept
    /// (`ONCEPAY_JWKS_MIN_REFRESH`, `ONCEPAY_JWKS_MAX_AGE`).
    pub jwks: crate::identity::JwksBounds,
    /// `ONCEPAY_BALANCE_HOLD_TTL`: how long a balance hold lasts when its
    /// request names no `expires_in` (15 minutes).
    pub balance_hold_ttl: Duration,
    /// `ONCEPAY_STOCK_RESERVATION_TTL`: how long an order's stock stays
    /// reserved (`reserve_stock`) awaiting payment (15 minutes).
    pub stock_reservation_ttl: Duration,
    /// `ONCEPAY_STOCK_CUSTOMER_OPEN_ORDERS`: how many unpaid orders
    /// holding stock a customer's token may have at once.
    pub stock_customer_open_orders: i64,
    /// How long before a hold's `capture_before` its
    /// `payment.capture_deadline_approaching` is written
    /// (`ONCEPAY_CAPTURE_REMINDER`, 24 h).
    pub capture_reminder: Duration,
    /// How long a provider event that would settle a charge waits for the
    /// command still executing on it (see `inbound`).
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
    /// Each client address's limit on credentials that authenticate
    /// nobody (unknown API keys, tokens of issuers no merchant trusts);
    /// `None`: unlimited.
    pub auth_failure_rate_limit: Option<crate::rate_limit::Limit>,
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
    pub webhook_secret: crate::standard_webhooks::WebhookSecret,
    /// Off: no webhook is sent (the reconciler must settle everything).
    pub webhooks_enabled: bool,
    /// How long a `tok_async` charge stays pending.
    pub async_delay: Duration,
    /// How long an authorized charge (`capture: false`) can be captured
    /// before it expires (`ONCEPAY_SANDBOX_CAPTURE_WINDOW`, 7 d).
    pub capture_window: Duration,
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
    /// At most how many succeeded refunds, and how many open disputes,
    /// each pass reads again from each provider
    /// (`ONCEPAY_BOOKS_READ_BACK_LIMIT`, 1000): with no more than that in
    /// the last 30 days, each is read every pass.
    pub read_back_limit: usize,
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
        let err = env(&[("ONCEPAY_DB_POOL_SIZE", "2")])
            .serve_config()
            .expect_err("a pool too small to work at all is refused");
        assert!(err.to_string().contains("ONCEPAY_DB_POOL_SIZE"), "{err}");
        assert!(err.to_string().contains("at least 3"), "{err}");
        for zero in ["ONCEPAY_IDEMPOTENCY_TTL", "ONCEPAY_IDEMPOTENCY_LEASE"] {
            let err = env(&[(zero, "0")])
                .serve_config()
                .expect_err("zero is refused");
            assert!(err.to_string().contains(zero), "{err}");
        }
    }

    /// A small pool (PgBouncer, a managed database with few connections)
    /// is served with fewer writers, said once; the pool is never refused
    /// for the writers' sake, only below what works at all.
    #[test]
    fn writers_shrink_to_fit_a_small_pool() {
        let writers = |cfg: &ServeConfig| {
            (
                cfg.order_batch_writers,
                cfg.order_batch_max,
                cfg.group_commit_writers,
                cfg.group_commit_max,
            )
        };
        // The defaults (8 connections, 1 + 2 writers) fit as they are.
        let cfg = env(&[]).serve_config().expect("defaults");
        assert_eq!(writers(&cfg), (1, 64, 2, 16));
        assert_eq!(cfg.writers_fitted, None);
        let cfg = env(&[("ONCEPAY_DB_POOL_SIZE", "6")])
            .serve_config()
            .expect("3 + 3 writers");
        assert_eq!(cfg.writers_fitted, None);
        // 5: room for two writers, one of each kind.
        let cfg = env(&[("ONCEPAY_DB_POOL_SIZE", "5")])
            .serve_config()
            .expect("fewer writers");
        assert_eq!(writers(&cfg), (1, 64, 1, 16));
        let fitted = cfg.writers_fitted.expect("said");
        assert_eq!(fitted.group_commit_writers, (2, 1));
        let warning = fitted.warning();
        for said in [
            "ONCEPAY_DB_POOL_SIZE=5",
            "ONCEPAY_GROUP_COMMIT_WRITERS=1 (asked 2)",
            "ONCEPAY_ORDER_BATCH_WRITERS=1 (asked 1)",
            "ONCEPAY_DB_POOL_SIZE=6 would keep",
        ] {
            assert!(warning.contains(said), "{said}: {warning}");
        }
        // 4: room for one, the payments' group commit's.
        let cfg = env(&[("ONCEPAY_DB_POOL_SIZE", "4")])
            .serve_config()
            .expect("fewer writers");
        assert_eq!(writers(&cfg), (0, 1, 1, 16));
        let warning = cfg.writers_fitted.expect("said").warning();
        assert!(
            warning.contains("ONCEPAY_ORDER_BATCH_WRITERS=0 (asked 1)"),
            "{warning}"
        );
        assert!(
            warning
                .contains("new orders are written each alone, as with ONCEPAY_ORDER_BATCH_MAX=1"),
            "{warning}"
        );
        // 3, the smallest that works: no writer, each write alone on its
        // request's connection.
        let cfg = env(&[("ONCEPAY_DB_POOL_SIZE", "3")])
            .serve_config()
            .expect("a pool of three works");
        assert_eq!(writers(&cfg), (0, 1, 0, 1));
        let warning = cfg.writers_fitted.expect("said").warning();
        for said in [
            "ONCEPAY_DB_POOL_SIZE=3 leaves room for 0 writer(s)",
            "ONCEPAY_ORDER_BATCH_WRITERS=0 (asked 1)",
            "ONCEPAY_GROUP_COMMIT_WRITERS=0 (asked 2)",
            "ONCEPAY_GROUP_COMMIT_MAX=1",
        ] {
            assert!(warning.contains(said), "{said}: {warning}");
        }
        // A kind turned off asks for no connection.
        let cfg = env(&[
            ("ONCEPAY_DB_POOL_SIZE", "4"),
            ("ONCEPAY_ORDER_BATCH_MAX", "1"),
            ("ONCEPAY_GROUP_COMMIT_WRITERS", "1"),
        ])
        .serve_config()
        .expect("one writer, one connection for it");
        assert_eq!(cfg.writers_fitted, None);
        // What was asked is kept when the pool has room for it.
        let cfg = env(&[
            ("ONCEPAY_DB_POOL_SIZE", "20"),
            ("ONCEPAY_ORDER_BATCH_WRITERS", "4"),
            ("ONCEPAY_GROUP_COMMIT_WRITERS", "8"),
        ])
        .serve_config()
        .expect("room for all");
        assert_eq!(writers(&cfg), (4, 64, 8, 16));
        for small in ["0", "1", "2"] {
            let err = env(&[("ONCEPAY_DB_POOL_SIZE", small)])
                .serve_config()
                .expect_err("below what works");
            assert!(err.to_string().contains("ONCEPAY_DB_POOL_SIZE"), "{err}");
        }
    }

    #[test]
    fn the_writers_that_fit_give_up_the_more_numerous_kind_first() {
        assert_eq!(writers_that_fit(5, 1, 2), (1, 2));
        assert_eq!(writers_that_fit(2, 1, 2), (1, 1));
        assert_eq!(writers_that_fit(1, 1, 2), (0, 1));
        assert_eq!(writers_that_fit(0, 1, 2), (0, 0));
        assert_eq!(writers_that_fit(3, 4, 4), (1, 2));
        assert_eq!(writers_that_fit(3, 0, 8), (0, 3));
        assert_eq!(writers_that_fit(0, 0, 0), (0, 0));
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
