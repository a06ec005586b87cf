//! Reconciliation against the provider's books: every charge and refund
//! oncepay sent carries a trace of where it came from (`provider::trace`),
//! so after the database lost rows (a restore from backup, an asynchronous
//! failover, a bug) the provider's lists rebuild them.
//!
//! For every provider object created in the window:
//! - our row exists and agrees → matched (a pending row is settled forward
//!   by the same rules as a webhook, `commands::settle`);
//! - our row disagrees (amount, currency, object, or a status a pending row
//!   does not explain) → a `books_mismatch` incident, logged at error;
//! - we have no row → [`adoption`] decides: rebuild it (the attempt or
//!   refund with its own id, its state, its order's state, its events and
//!   the completed idempotency record, so the client's retry with its key
//!   gets the answer it would have had), or, for a charge no order of ours
//!   can own, an `orphan_charge` incident and, by `ONCEPAY_ORPHAN_POLICY`,
//!   a refund (the default) or a hold for a person;
//! - then our succeeded rows the provider does not list (60 s inside the
//!   window's edges, its consistency allowance) → `missing_at_provider`.
//!
//! One process at a time across the fleet (an advisory lock); a run stores
//! its phase and high-water mark as it goes, so a run cut off by a crash is
//! resumed by the next one, and re-examining an object is harmless.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::commands::Command as _;
use chrono::{DateTime, TimeZone, Utc};
use uuid::Uuid;

use crate::commands::settle::{self, Cause};
use crate::commands::AppContext;
use crate::domain::adoption::{adoption, agreement, Adoption, Agreement};
use crate::domain::payment::PaymentStatus;
use crate::idempotency::RecordId;
use crate::provider::trace::{adopted_key, unhex, Trace};
use crate::provider::{
    BookEntry, CallOutcome, PaymentProvider, ProviderObject, RefundRequest, SubjectKind,
};
use crate::store::books::{self as sql, BooksIncident, Counts, Phase, Run};
use crate::store::payments::{InsertAttemptError, NewAttempt};
use crate::store::refunds::{InsertRefundError, NewRefund};
use crate::store::{self, StoreError};

/// How long after its creation an object must be listed by the provider
/// before its absence is an incident (and how far inside the window's
/// start a row must be): clocks and a provider's list lag a little.
pub(crate) const CONSISTENCY_DELAY: Duration = Duration::from_secs(60);

pub use crate::domain::adoption::OrphanPolicy;

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// `oncepay reconcile`.
    Cli,
    /// The background pass in `serve`.
    Schedule,
    /// The restore guard, over a gap in the database's history.
    Restore,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Cli => "cli",
            Trigger::Schedule => "schedule",
            Trigger::Restore => "restore",
        }
    }
}

/// Why a run could not finish.
#[derive(Debug, thiserror::Error)]
pub enum BooksError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The provider's list could not be read; the run resumes later.
    #[error("reading {provider}'s books: {reason}")]
    Provider {
        /// Which provider.
        provider: String,
        /// What went wrong.
        reason: String,
    },
}

impl From<sqlx::Error> for BooksError {
    fn from(e: sqlx::Error) -> Self {
        BooksError::Store(e.into())
    }
}

/// The key of the refund of an orphan charge: derived from the charge, so
/// every pass (and every process) asks for the same refund.
pub(crate) fn orphan_refund_id(provider: &str, charge_id: &str) -> Uuid {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("oncepay orphan {provider} {charge_id}"));
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Only report what would be done.
    pub dry_run: bool,
    /// What to do with orphans.
    pub policy: OrphanPolicy,
    /// What started it.
    pub trigger: Trigger,
}

/// A window's end in a provider's whole seconds: an object created in the
/// window's last, partial second is in it.
fn unix_ceil(t: DateTime<Utc>) -> i64 {
    t.timestamp() + i64::from(t.timestamp_subsec_nanos() > 0)
}

fn at(unix: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(unix, 0).single().unwrap_or_else(Utc::now)
}

/// Reconciles `[from, until)` of every configured provider's books. A run
/// of a provider cut off earlier is finished first. `None` when another
/// process holds the books lock (nothing was done); otherwise this run's
/// report per provider.
pub async fn reconcile(
    ctx: &AppContext,
    window: (DateTime<Utc>, DateTime<Utc>),
    options: Options,
) -> Result<Option<Vec<Run>>, BooksError> {
    let mut lock = ctx.pool.acquire().await?;
    if !options.dry_run {
        let got: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(sql::BOOKS_LOCK)
            .fetch_one(&mut *lock)
            .await?;
        if !got {
            return Ok(None);
        }
    }
    let mut reports = Vec::new();
    let mut result = Ok(());
    for provider in ctx.providers.all() {
        match reconcile_provider(ctx, provider.as_ref(), window, options).await {
            Ok(run) => reports.push(run),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if !options.dry_run {
        // A connection that cannot unlock is closed, which unlocks.
        let unlocked = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(sql::BOOKS_LOCK)
            .execute(&mut *lock)
            .await;
        if unlocked.is_err() {
            lock.detach();
        }
    }
    result.map(|()| Some(reports))
}

async fn reconcile_provider(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    window: (DateTime<Utc>, DateTime<Utc>),
    options: Options,
) -> Result<Run, BooksError> {
    let mut conn = ctx.pool.acquire().await?;
    if !options.dry_run {
        if let Some(open) = sql::open_run(&mut conn, provider.name()).await? {
            tracing::warn!(run = %open.id, phase = ?open.phase, position = %open.position, "resuming a books run that was cut off");
            drop(conn);
            finish(ctx, provider, open, options).await?;
            conn = ctx.pool.acquire().await?;
        }
    }
    let run = sql::start_run(
        &mut conn,
        provider.name(),
        options.trigger.as_str(),
        options.dry_run,
        window,
    )
    .await?;
    drop(conn);
    finish(ctx, provider, run, options).await
}

/// Walks a run's phases from where it stands.
async fn finish(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    mut run: Run,
    options: Options,
) -> Result<Run, BooksError> {
    let started = Instant::now();
    loop {
        let next = match run.phase {
            Phase::Charges => {
                walk(ctx, provider, &mut run, SubjectKind::Charge, options).await?;
                Phase::Refunds
            }
            Phase::Refunds => {
                walk(ctx, provider, &mut run, SubjectKind::Refund, options).await?;
                Phase::Missing
            }
            Phase::Missing => {
                let counts = missing(ctx, provider, &run, options).await?;
                record(ctx, &counts);
                run.counts += counts;
                let mut conn = ctx.pool.acquire().await?;
                sql::advance(&mut conn, run.id, Phase::Done, run.window_until, counts).await?;
                Phase::Done
            }
            Phase::Done => break,
        };
        if next != Phase::Done {
            let mut conn = ctx.pool.acquire().await?;
            sql::advance(&mut conn, run.id, next, run.window_from, Counts::default()).await?;
            run.position = run.window_from;
        }
        run.phase = next;
    }
    let mut conn = ctx.pool.acquire().await?;
    let run = sql::run_by_id(&mut conn, run.id).await?.unwrap_or(run);
    let c = run.counts;
    tracing::info!(
        run = %run.id, provider = %run.provider, trigger = %run.trigger, dry_run = run.dry_run,
        from = %run.window_from, until = %run.window_until,
        matched = c.matched, adopted = c.adopted, refunded = c.refunded, held = c.held,
        mismatched = c.mismatched, missing = c.missing,
        seconds = started.elapsed().as_secs_f64(),
        "books reconciled"
    );
    if !run.dry_run {
        ctx.metrics
            .books_last_run
            .set(Utc::now().timestamp() as f64);
    }
    Ok(run)
}

fn record(ctx: &AppContext, c: &Counts) {
    for (outcome, n) in [
        ("matched", c.matched),
        ("adopted", c.adopted),
        ("refunded", c.refunded),
        ("held", c.held),
        ("mismatched", c.mismatched),
        ("missing", c.missing),
    ] {
        if n > 0 {
            ctx.metrics
                .books_objects
                .with_label_values(&[outcome])
                .inc_by(n as u64);
        }
    }
}

fn provider_error(provider: &dyn PaymentProvider, reason: String) -> BooksError {
    BooksError::Provider {
        provider: provider.name().to_string(),
        reason,
    }
}

/// One phase: the provider's `kind` objects from the run's position to the
/// window's end, page by page, storing the high-water mark after each.
async fn walk(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &mut Run,
    kind: SubjectKind,
    options: Options,
) -> Result<(), BooksError> {
    let window = (run.position.timestamp(), unix_ceil(run.window_until));
    let mut after: Option<String> = None;
    loop {
        let page = provider
            .list_books(kind, window, after.as_deref())
            .await
            .map_err(|e| provider_error(provider, e))?;
        let started = Instant::now();
        let mut counts = Counts::default();
        for entry in &page.entries {
            counts += examine(ctx, provider, entry, options).await?;
        }
        // A list oldest first (the sandbox's, localstripe's) resumes from
        // the last creation time handled; another keeps the mark where it
        // is, and a resumed run reads those objects again (harmlessly).
        let ascending = page
            .entries
            .windows(2)
            .all(|w| w[0].created <= w[1].created);
        if let (true, Some(last)) = (ascending, page.entries.last()) {
            run.position = run.position.max(at(last.created));
        }
        record(ctx, &counts);
        run.counts += counts;
        let phase = run.phase;
        let mut conn = ctx.pool.acquire().await?;
        sql::advance(&mut conn, run.id, phase, run.position, counts).await?;
        drop(conn);
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
        // Paced: at most half of the time is spent on the books, so the
        // pass never competes with payments. A restore's gap is urgent:
        // money commands wait for it.
        if options.trigger != Trigger::Restore {
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

async fn examine(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    options: Options,
) -> Result<Counts, BooksError> {
    // An object that carries no trace is not oncepay's (or predates it).
    let Some(trace) = &entry.trace else {
        return Ok(Counts::default());
    };
    match entry.kind {
        SubjectKind::Charge => examine_charge(ctx, provider, entry, trace, options).await,
        SubjectKind::Refund => examine_refund(ctx, provider, entry, trace, options).await,
    }
}

/// A row settled from the provider's state: matched, or a contradiction
/// (an incident the settlement recorded).
fn settled(contradicted: bool) -> Counts {
    if contradicted {
        one(|c| c.mismatched += 1)
    } else {
        one(|c| c.matched += 1)
    }
}

/// How a row's final status and the provider's disagree, for a person.
fn disagreement(what: &str, id: Uuid, ours: PaymentStatus, entry: &BookEntry) -> String {
    format!(
        "{what} {id} is {} here and {} at the provider",
        ours.as_str(),
        entry.state.status.as_str()
    )
}

fn one(f: impl FnOnce(&mut Counts)) -> Counts {
    let mut c = Counts::default();
    f(&mut c);
    c
}

async fn mismatch(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    (merchant_id, payment_id, refund_id): (Uuid, Option<Uuid>, Option<Uuid>),
    detail: &str,
    options: Options,
) -> Result<Counts, BooksError> {
    if !options.dry_run {
        let mut conn = ctx.pool.acquire().await?;
        let new = sql::record_incident(
            &mut conn,
            &BooksIncident {
                kind: "books_mismatch",
                merchant_id,
                payment_id,
                refund_id,
                provider: provider.name(),
                provider_object_id: &entry.state.id,
                amount: entry.amount,
                detail,
                resolution: None,
            },
        )
        .await?;
        if new {
            ctx.metrics
                .incidents
                .with_label_values(&["books_mismatch"])
                .inc();
            tracing::error!(
                provider = provider.name(), object = %entry.state.id, ?payment_id, ?refund_id,
                %detail, "INCIDENT: the provider's books disagree with ours"
            );
        }
    }
    Ok(one(|c| c.mismatched += 1))
}

async fn examine_charge(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut conn = ctx.pool.acquire().await?;
    let ours = store::payments::by_id(&mut conn, trace.payment_id).await?;
    drop(conn);
    let Some(ours) = ours else {
        return adopt_charge(ctx, provider, entry, trace, options).await;
    };
    let ids = (ours.merchant_id, Some(ours.id), None);
    let recorded_other = ours
        .provider_charge_id
        .as_deref()
        .is_some_and(|id| id != entry.state.id);
    if ours.amount != entry.amount
        || !ours.currency.eq_ignore_ascii_case(&entry.currency)
        || recorded_other
        || ours.provider != provider.name()
    {
        let detail = format!(
            "attempt {} holds {} {} ({:?}); the provider's {} is {} {}",
            ours.id,
            ours.amount,
            ours.currency,
            ours.provider_charge_id,
            entry.state.id,
            entry.amount,
            entry.currency
        );
        return mismatch(ctx, provider, entry, ids, &detail, options).await;
    }
    match agreement(ours.status, entry.state.status) {
        Agreement::Agree => Ok(one(|c| c.matched += 1)),
        // Forward from pending, or a charge on a failed attempt (whose
        // money rule records the incident and refunds it): the webhook's
        // rules, applied by the one function that applies them.
        Agreement::Settle { contradicted } => {
            if !options.dry_run {
                let mut tx = ctx.pool.begin().await?;
                let owners = (ours.id, ours.order_id);
                let cause = Cause::Reconciler;
                settle::payment(&mut tx, &ctx.metrics, owners, &entry.state, cause).await?;
                tx.commit().await?;
            }
            Ok(settled(contradicted))
        }
        Agreement::Disagree => {
            let detail = disagreement("attempt", ours.id, ours.status, entry);
            mismatch(ctx, provider, entry, ids, &detail, options).await
        }
    }
}

/// The stored key and fingerprint a rebuilt row and record get: the key's
/// hash stands for the key (`None`: the object predates the trace).
fn rebuilt_origin(trace: &Trace) -> (Option<String>, Option<Vec<u8>>) {
    (
        trace.origin.key_sha256.as_deref().map(adopted_key),
        trace.origin.fingerprint.as_deref().and_then(unhex),
    )
}

async fn adopt_charge(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
) -> Result<Counts, BooksError> {
    let mut tx = ctx.pool.begin().await?;
    let order = store::orders::lock(&mut tx, trace.merchant_id, trace.order_id).await?;
    let live = match &order {
        Some(o) => store::payments::live_attempt(&mut tx, o.id)
            .await?
            .is_some(),
        None => false,
    };
    let decided = adoption(
        order.as_ref(),
        live,
        entry.state.status,
        (entry.amount, &entry.currency),
    );
    let order = match (decided, order) {
        (Adoption::Ignore, _) => return Ok(Counts::default()),
        (Adoption::Orphan(why), _) => {
            drop(tx);
            return orphan(ctx, provider, entry, trace, why, options).await;
        }
        (Adoption::Adopt, Some(order)) => order,
        (Adoption::Adopt, None) => return Ok(Counts::default()),
    };
    if options.dry_run {
        return Ok(one(|c| c.adopted += 1));
    }
    let (key, fingerprint) = rebuilt_origin(trace);
    let stored_key = key
        .clone()
        .unwrap_or_else(|| format!("adopted attempt {}", trace.payment_id));
    let new = NewAttempt {
        id: trace.payment_id,
        merchant_id: trace.merchant_id,
        order_id: order.id,
        idempotency_key: &stored_key,
        fingerprint: fingerprint.as_deref(),
        amount: entry.amount,
        currency: &order.currency,
        provider: provider.name(),
        // Never charged again: the provider's object is recorded.
        payment_method: "adopted",
        now: at(entry.created),
        check_after: ctx.reconcile_after,
        return_url: None,
    };
    let attempt = match store::payments::insert(&mut tx, &new).await {
        Ok(a) => a,
        // A client's new attempt got there first: the next pass sees an
        // order with a live attempt, and an orphan.
        Err(InsertAttemptError::KeyUsed | InsertAttemptError::LiveAttemptExists) => {
            return Ok(Counts::default())
        }
        Err(InsertAttemptError::Store(e)) => return Err(e.into()),
    };
    crate::events::payment_changed(&mut tx, &ctx.metrics, &attempt, Cause::Reconciler).await?;
    let (payment, _) = settle::payment(
        &mut tx,
        &ctx.metrics,
        (attempt.id, order.id),
        &entry.state,
        Cause::Reconciler,
    )
    .await?;
    if let (Some(key), Some(fingerprint)) = (key, fingerprint) {
        let response = crate::commands::payments::payment_response(&payment);
        let origin = (trace.merchant_id, key, fingerprint);
        let command = crate::commands::payments::CreatePayment::NAME;
        rebuild_record(ctx, &mut tx, origin, command, response).await?;
    }
    tx.commit().await?;
    tracing::warn!(
        payment_id = %payment.id, order_id = %order.id, provider = provider.name(),
        charge = %entry.state.id, status = payment.status.as_str(),
        "adopted a charge from the provider's books: its rows were lost"
    );
    Ok(one(|c| c.adopted += 1))
}

/// The completed idempotency record of a rebuilt row, under its key's
/// hash (it takes the key when the client presents it), with the answer
/// the command gives for the row as it now is.
async fn rebuild_record(
    ctx: &AppContext,
    tx: &mut sqlx::PgConnection,
    (merchant_id, key, fingerprint): (Uuid, String, Vec<u8>),
    command: &str,
    response: Result<crate::idempotency::StoredResponse, crate::commands::CommandError>,
) -> Result<(), StoreError> {
    let response = response.map_err(command_store_error)?;
    let id = RecordId { merchant_id, key };
    let ttl = ctx.engine.config().ttl;
    crate::idempotency::persistence::insert_rebuilt(tx, &id, &fingerprint, command, &response, ttl)
        .await?;
    Ok(())
}

fn command_store_error(e: crate::commands::CommandError) -> StoreError {
    match e {
        crate::commands::CommandError::Store(e) => e,
        crate::commands::CommandError::Reject(p) => store::Corrupt::Broken(p.detail).into(),
    }
}

/// A charge no order of ours can own: recorded once, then refunded (with a
/// key derived from the charge, so asking again is safe) or held.
async fn orphan(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    why: &str,
    options: Options,
) -> Result<Counts, BooksError> {
    if entry.state.status == PaymentStatus::Pending {
        tracing::warn!(charge = %entry.state.id, %why, "an orphan charge is still pending; a later pass decides");
        return Ok(Counts::default());
    }
    let mut conn = ctx.pool.acquire().await?;
    let seen = sql::orphan_resolution(&mut conn, provider.name(), &entry.state.id).await?;
    drop(conn);
    match seen.as_ref().and_then(Option::as_deref) {
        Some("refunded" | "held" | "refund_failed") => return Ok(one(|c| c.matched += 1)),
        _ if options.dry_run => {
            return Ok(match options.policy {
                OrphanPolicy::Refund => one(|c| c.refunded += 1),
                OrphanPolicy::Hold => one(|c| c.held += 1),
            })
        }
        _ => {}
    }
    if seen.is_none() {
        let mut conn = ctx.pool.acquire().await?;
        let detail = format!("a charge for order {}: {why}", trace.order_id);
        let resolution = match options.policy {
            OrphanPolicy::Refund => "refund_pending",
            OrphanPolicy::Hold => "held",
        };
        sql::record_incident(
            &mut conn,
            &BooksIncident {
                kind: "orphan_charge",
                merchant_id: trace.merchant_id,
                payment_id: None,
                refund_id: None,
                provider: provider.name(),
                provider_object_id: &entry.state.id,
                amount: entry.amount,
                detail: &detail,
                resolution: Some(resolution),
            },
        )
        .await?;
        ctx.metrics
            .incidents
            .with_label_values(&["orphan_charge"])
            .inc();
        tracing::error!(
            provider = provider.name(), charge = %entry.state.id, order_id = %trace.order_id,
            amount = entry.amount, %why, policy = ?options.policy,
            "INCIDENT: the provider holds a charge no order of ours can own"
        );
    }
    if options.policy == OrphanPolicy::Hold {
        return Ok(one(|c| c.held += 1));
    }
    let refund_id = orphan_refund_id(provider.name(), &entry.state.id);
    // What the merchant refunded before the rows were lost stays refunded;
    // the rest goes back.
    let left = entry.amount - entry.refunded;
    if left <= 0 {
        let mut conn = ctx.pool.acquire().await?;
        sql::resolve_orphan(&mut conn, provider.name(), &entry.state.id, "refunded").await?;
        return Ok(one(|c| c.matched += 1));
    }
    let request = RefundRequest {
        idempotency_key: refund_id,
        charge_id: entry.state.id.clone(),
        amount: left,
        currency: entry.currency.clone(),
        trace: Trace {
            refund_id: Some(refund_id),
            reason: Some("oncepay: orphan charge".into()),
            ..trace.clone()
        },
    };
    let resolution = match provider.refund(&request).await {
        CallOutcome::Known(ProviderObject {
            status: PaymentStatus::Succeeded,
            ..
        }) => "refunded",
        CallOutcome::Known(ProviderObject {
            status: PaymentStatus::Failed,
            failure_code,
            ..
        }) => {
            tracing::error!(charge = %entry.state.id, ?failure_code, "the refund of an orphan charge failed; a person must look");
            "refund_failed"
        }
        other => {
            tracing::warn!(charge = %entry.state.id, outcome = ?other, "the refund of an orphan charge is not known yet; the next pass asks again");
            return Ok(Counts::default());
        }
    };
    let mut conn = ctx.pool.acquire().await?;
    sql::resolve_orphan(&mut conn, provider.name(), &entry.state.id, resolution).await?;
    Ok(if resolution == "refunded" {
        one(|c| c.refunded += 1)
    } else {
        one(|c| c.mismatched += 1)
    })
}

async fn examine_refund(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    options: Options,
) -> Result<Counts, BooksError> {
    let Some(refund_id) = trace.refund_id else {
        return Ok(Counts::default());
    };
    let mut conn = ctx.pool.acquire().await?;
    let ours = store::refunds::by_id(&mut conn, refund_id).await?;
    let payment = store::payments::by_id(&mut conn, trace.payment_id).await?;
    drop(conn);
    let ids = (trace.merchant_id, Some(trace.payment_id), Some(refund_id));
    let (Some(ours), Some(payment)) = (ours, payment.clone()) else {
        return match payment {
            Some(payment) => adopt_refund(ctx, provider, entry, trace, &payment, options).await,
            // The refund of a charge we have no row for: an orphan's (ours,
            // or one the merchant made before the rows were lost); the
            // orphan's incident accounts for the charge.
            None => Ok(one(|c| c.matched += 1)),
        };
    };
    if ours.amount != entry.amount
        || ours.payment_id != payment.id
        || ours
            .provider_refund_id
            .as_deref()
            .is_some_and(|id| id != entry.state.id)
    {
        let detail = format!(
            "refund {} holds {} ({:?}); the provider's {} is {}",
            ours.id, ours.amount, ours.provider_refund_id, entry.state.id, entry.amount
        );
        return mismatch(ctx, provider, entry, ids, &detail, options).await;
    }
    match agreement(ours.status, entry.state.status) {
        Agreement::Agree => Ok(one(|c| c.matched += 1)),
        Agreement::Settle { contradicted } => {
            if !options.dry_run {
                let mut tx = ctx.pool.begin().await?;
                let cause = Cause::Reconciler;
                settle::refund(&mut tx, &ctx.metrics, ours.id, &entry.state, cause).await?;
                tx.commit().await?;
            }
            Ok(settled(contradicted))
        }
        Agreement::Disagree => {
            let detail = disagreement("refund", ours.id, ours.status, entry);
            mismatch(ctx, provider, entry, ids, &detail, options).await
        }
    }
}

async fn adopt_refund(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    entry: &BookEntry,
    trace: &Trace,
    payment: &crate::domain::payment::Payment,
    options: Options,
) -> Result<Counts, BooksError> {
    let refund_id = trace.refund_id.unwrap_or_default();
    let ids = (payment.merchant_id, Some(payment.id), Some(refund_id));
    let mut tx = ctx.pool.begin().await?;
    store::orders::lock_by_id(&mut tx, payment.order_id).await?;
    let payment = store::payments::lock(&mut tx, payment.id)
        .await?
        .ok_or_else(|| store::Corrupt::vanished("payment", payment.id))?;
    let committed = store::refunds::committed_sum(&mut tx, payment.id).await?;
    let moves_money = entry.state.status != PaymentStatus::Failed;
    if payment.status != PaymentStatus::Succeeded
        || (moves_money && committed + entry.amount > payment.amount)
    {
        drop(tx);
        let detail = format!(
            "a refund of {} for payment {} ({}, {} of {} committed) that we have no row for",
            entry.amount,
            payment.id,
            payment.status.as_str(),
            committed,
            payment.amount
        );
        return mismatch(ctx, provider, entry, ids, &detail, options).await;
    }
    if options.dry_run {
        return Ok(one(|c| c.adopted += 1));
    }
    let (key, fingerprint) = rebuilt_origin(trace);
    let new = NewRefund {
        id: refund_id,
        merchant_id: payment.merchant_id,
        payment_id: payment.id,
        amount: entry.amount,
        reason: trace.reason.as_deref(),
        idempotency_key: key.as_deref(),
        fingerprint: fingerprint.as_deref(),
        cancels_order: trace.cancels_order,
        incident: false,
        now: at(entry.created),
        check_after: ctx.reconcile_after,
    };
    let refund = match store::refunds::insert(&mut tx, &new).await {
        Ok(r) => r,
        Err(InsertRefundError::KeyUsed) => return Ok(Counts::default()),
        Err(InsertRefundError::Store(e)) => return Err(e.into()),
    };
    crate::events::refund_changed(
        &mut tx,
        &ctx.metrics,
        &refund,
        payment.order_id,
        Cause::Reconciler,
    )
    .await?;
    let (refund, _) = settle::refund(
        &mut tx,
        &ctx.metrics,
        refund.id,
        &entry.state,
        Cause::Reconciler,
    )
    .await?;
    // A cancellation's answer is its order, which `POST /orders/{id}/cancel`
    // gives again on its own; a refund's record is rebuilt.
    if let (Some(key), Some(fingerprint), false) = (key, fingerprint, trace.cancels_order) {
        let response = crate::commands::refunds::refund_response(&refund);
        let origin = (payment.merchant_id, key, fingerprint);
        let command = crate::commands::refunds::CreateRefund::NAME;
        rebuild_record(ctx, &mut tx, origin, command, response).await?;
    }
    tx.commit().await?;
    tracing::warn!(
        refund_id = %refund.id, payment_id = %payment.id, provider = provider.name(),
        refund = %entry.state.id, status = refund.status.as_str(),
        "adopted a refund from the provider's books: its rows were lost"
    );
    Ok(one(|c| c.adopted += 1))
}

/// Our succeeded charges and refunds in the window (inside its edges by
/// [`CONSISTENCY_DELAY`]) that the provider does not list: each an
/// incident. The provider's ids are listed afresh, so a resumed run needs
/// nothing from the run it resumes.
async fn missing(
    ctx: &AppContext,
    provider: &dyn PaymentProvider,
    run: &Run,
    options: Options,
) -> Result<Counts, BooksError> {
    let edge = chrono::Duration::from_std(CONSISTENCY_DELAY).unwrap_or_default();
    let inner = (run.window_from + edge, run.window_until - edge);
    if inner.0 >= inner.1 {
        return Ok(Counts::default());
    }
    let window = (
        run.window_from.timestamp(),
        run.window_until.timestamp() + 1,
    );
    let mut counts = Counts::default();
    for (kind, refunds) in [(SubjectKind::Charge, false), (SubjectKind::Refund, true)] {
        let mut listed = HashSet::new();
        let mut after: Option<String> = None;
        loop {
            let page = provider
                .list_books(kind, window, after.as_deref())
                .await
                .map_err(|e| provider_error(provider, e))?;
            listed.extend(page.entries.into_iter().map(|e| e.state.id));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for held in sql::succeeded_in(&ctx.pool, provider.name(), refunds, inner).await? {
            if listed.contains(&held.provider_object_id) {
                continue;
            }
            counts.missing += 1;
            if options.dry_run {
                continue;
            }
            let detail = format!(
                "our succeeded {} {} is not in the provider's books",
                if refunds { "refund" } else { "payment" },
                held.refund_id.unwrap_or(held.payment_id)
            );
            let mut conn = ctx.pool.acquire().await?;
            let new = sql::record_incident(
                &mut conn,
                &BooksIncident {
                    kind: "missing_at_provider",
                    merchant_id: held.merchant_id,
                    payment_id: Some(held.payment_id),
                    refund_id: held.refund_id,
                    provider: provider.name(),
                    provider_object_id: &held.provider_object_id,
                    amount: held.amount,
                    detail: &detail,
                    resolution: None,
                },
            )
            .await?;
            if new {
                ctx.metrics
                    .incidents
                    .with_label_values(&["missing_at_provider"])
                    .inc();
                tracing::error!(provider = provider.name(), object = %held.provider_object_id, %detail, "INCIDENT: a row of ours is missing from the provider's books");
            }
        }
    }
    Ok(counts)
}

pub use crate::commands::gate::Gate;

/// How the restore guard looks at the database.
#[derive(Debug, Clone, Copy)]
pub struct GuardSettings {
    /// How far before the last sight a gap starts: commands in flight then
    /// may have reached the provider without their rows surviving.
    pub margin: Duration,
    /// What to do with orphans found in the gap.
    pub policy: OrphanPolicy,
}

/// Stores that this process saw the database on its current timeline and
/// sets the gate: closed (returning the gap's start) while a gap is open.
pub(crate) async fn observe(
    ctx: &AppContext,
    settings: GuardSettings,
) -> Result<Option<DateTime<Utc>>, BooksError> {
    let now = sql::current_lineage(&ctx.pool).await?;
    let lineage = sql::observe_lineage(&ctx.pool, now, settings.margin).await?;
    let timeline = lineage.timeline;
    let Some(gap_from) = lineage.gap_from else {
        ctx.books_gate.set_closed(false);
        return Ok(None);
    };
    if !ctx.books_gate.is_closed() {
        tracing::error!(%gap_from, timeline, "the database went back in time (a restore or a failover): money commands wait until the providers' books are reconciled from the gap's start");
    }
    ctx.books_gate.set_closed(true);
    Ok(Some(gap_from))
}

/// One look of the restore guard (at start and every few seconds): stores
/// that this process saw the database on its current timeline; if the
/// timeline moved since the last sight (a restore, or a failover), the gap
/// from that sight is reconciled with the providers' books before the gate
/// opens. Every process closes its gate while a gap is open; the one that
/// holds the books lock reconciles it.
pub(crate) async fn restore_guard(
    ctx: &AppContext,
    settings: GuardSettings,
) -> Result<(), BooksError> {
    let Some(gap_from) = observe(ctx, settings).await? else {
        return Ok(());
    };
    let options = Options {
        dry_run: false,
        policy: settings.policy,
        trigger: Trigger::Restore,
    };
    let until = Utc::now() + chrono::Duration::seconds(2);
    match reconcile(ctx, (gap_from, until), options).await? {
        Some(_) => {
            sql::close_gap(&ctx.pool, gap_from).await?;
            ctx.books_gate.set_closed(false);
            tracing::warn!(%gap_from, "the gap is reconciled; money commands run again");
        }
        None => tracing::info!("another process is reconciling; waiting"),
    }
    Ok(())
}

/// The background pass in `serve` (`ONCEPAY_BOOKS_INTERVAL`): the last
/// `window` of every provider's books; does nothing while another process
/// reconciles.
pub(crate) async fn scheduled_pass(
    ctx: &AppContext,
    window: Duration,
    policy: OrphanPolicy,
) -> Result<(), BooksError> {
    let until = Utc::now();
    let from = until - chrono::Duration::from_std(window).unwrap_or_default();
    let options = Options {
        dry_run: false,
        policy,
        trigger: Trigger::Schedule,
    };
    if reconcile(ctx, (from, until), options).await?.is_none() {
        tracing::debug!("another process is reconciling the books");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_refunded_under_one_key() {
        let a = orphan_refund_id("sandbox", "ch_1");
        assert_eq!(a, orphan_refund_id("sandbox", "ch_1"));
        assert_ne!(a, orphan_refund_id("sandbox", "ch_2"));
        assert_ne!(a, orphan_refund_id("stripe", "ch_1"));
    }
}
