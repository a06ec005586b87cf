//! The `oncepay` binary: dispatches the subcommands of contract section 1.
//! Errors end here, as `anyhow` errors with their context, printed once and
//! turned into a non-zero exit.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use oncepay::cli::{ApiKeyCommand, Cli, Command, LedgerCommand, MerchantCommand, PointInTime};
use oncepay::config::Env;

/// The process environment, as every subcommand reads it.
type ProcessEnv = Env<fn(&str) -> Option<String>>;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("oncepay: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(command: Command) -> anyhow::Result<()> {
    let env = Env::process();
    let (filter, format) = env.log_config()?;
    oncepay::telemetry::init(&filter, format);
    match command {
        Command::Migrate => {
            let url = env.database_url()?;
            let applied = oncepay::store::prepare_database(&url)
                .await
                .context("migrating the database")?;
            println!("applied {} migration(s)", applied.len());
        }
        Command::ApiKey(command) => api_key(&env, command).await?,
        Command::Merchant(command) => merchant(&env, command).await?,
        Command::Ledger(LedgerCommand::Check { merchant }) => {
            ledger_check(&env, merchant.as_deref()).await?
        }
        Command::Reconcile {
            since,
            until,
            dry_run,
        } => reconcile(&env, since, until, dry_run).await?,
        Command::Serve => {
            let config = env.serve_config()?;
            let app = oncepay::startup::Application::build(config)
                .await
                .context("starting oncepay serve")?;
            app.run_until_stopped().await?;
        }
        Command::Sandbox => {
            let config = env.sandbox_config()?;
            oncepay::sandbox_server::run(config)
                .await
                .context("running the sandbox")?;
        }
    }
    Ok(())
}

/// `oncepay api-key create|list|revoke`.
async fn api_key(env: &ProcessEnv, command: ApiKeyCommand) -> anyhow::Result<()> {
    match command {
        ApiKeyCommand::Create { merchant, scope } => {
            let url = env.database_url()?;
            oncepay::store::prepare_database(&url)
                .await
                .context("migrating the database")?;
            let pool = oncepay::store::pool(&url, 1)?;
            let actor = oncepay::audit::Actor::cli();
            let key = oncepay::api_keys::create_scoped(&pool, &merchant, scope, &actor)
                .await
                .context("creating the API key")?;
            println!(
            "API key for merchant {merchant:?} with scopes {} (shown once; only its hash is stored):",
            scope.names().join(",")
        );
            println!("{key}");
        }
        ApiKeyCommand::List { merchant } => {
            let url = env.database_url()?;
            oncepay::store::prepare_database(&url)
                .await
                .context("migrating the database")?;
            let pool = oncepay::store::pool(&url, 1)?;
            let keys = oncepay::store::merchants::list_keys_by_name(&pool, &merchant)
                .await
                .context("listing keys")?;
            println!("id\tprefix\tscopes\tcreated\tlast used\texpires\trevoked");
            let at = |t: Option<chrono::DateTime<chrono::Utc>>| {
                t.map(|t| t.to_rfc3339()).unwrap_or_else(|| "-".into())
            };
            for k in keys {
                println!(
                    "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                    k.id,
                    k.prefix,
                    k.scopes.join(","),
                    k.created_at.to_rfc3339(),
                    at(k.last_used_at),
                    at(k.expires_at),
                    at(k.revoked_at)
                );
            }
        }
        ApiKeyCommand::Revoke { id } => {
            let url = env.database_url()?;
            let pool = oncepay::store::pool(&url, 1)?;
            let actor = oncepay::audit::Actor::cli();
            match oncepay::api_keys::revoke(&pool, None, id, &actor)
                .await
                .context("revoking the key")?
            {
                Some((k, _)) => println!("revoked {} ({})", k.id, k.prefix),
                None => anyhow::bail!("no live API key with id {id}"),
            }
        }
    }
    Ok(())
}

/// `oncepay merchant set|rate-limit|identity|show`.
async fn merchant(env: &ProcessEnv, command: MerchantCommand) -> anyhow::Result<()> {
    match command {
        MerchantCommand::Set {
            merchant,
            display_name,
        } => {
            let url = env.database_url()?;
            let pool = oncepay::store::pool(&url, 1)?;
            let actor = oncepay::audit::Actor::cli();
            let shown = (!display_name.is_empty()).then_some(display_name.as_str());
            if !oncepay::store::merchants::set_display_name(&pool, &merchant, shown, &actor)
                .await
                .context("setting the display name")?
            {
                anyhow::bail!("no merchant named {merchant:?}");
            }
            println!("{merchant}: customers see {:?}", shown.unwrap_or(&merchant));
        }
        MerchantCommand::RateLimit {
            merchant,
            per_second,
            burst,
            default: _,
        } => {
            let url = env.database_url()?;
            let pool = oncepay::store::pool(&url, 1)?;
            let limit = per_second
                .zip(burst)
                .and_then(|(r, b)| oncepay::rate_limit::Limit::new(r.into(), b.into()));
            let actor = oncepay::audit::Actor::cli();
            if !oncepay::store::merchants::set_rate_limit(&pool, &merchant, limit, &actor)
                .await
                .context("setting the rate limit")?
            {
                anyhow::bail!("no merchant named {merchant:?}");
            }
            match limit {
                Some(l) => println!("{merchant}: {} requests/s, burst {}", l.per_second, l.burst),
                None => println!("{merchant}: the process default rate limit"),
            }
        }
        MerchantCommand::Identity {
            merchant,
            issuer,
            jwks_url,
            audience,
            roles_claim,
            token_type,
            algorithms,
            remove: _,
        } => {
            let url = env.database_url()?;
            oncepay::store::prepare_database(&url)
                .await
                .context("migrating the database")?;
            let pool = oncepay::store::pool(&url, 1)?;
            let actor = oncepay::audit::Actor::cli();
            use oncepay::store::identity::{self, NewIdentity, SetOutcome};
            match (issuer, jwks_url, audience) {
                (Some(issuer), Some(jwks_url), Some(audience)) => {
                    let new = NewIdentity {
                        issuer: &issuer,
                        jwks_url: &jwks_url,
                        audience: &audience,
                        roles_claim: &roles_claim,
                        token_type: token_type.as_deref(),
                        algorithms,
                    };
                    match identity::set(&pool, &merchant, new, &actor)
                        .await
                        .context("setting the identity provider")?
                    {
                        SetOutcome::Set => println!(
                            "{merchant}: trusts tokens of {issuer} for {audience} (keys: {jwks_url}; roles claim: {roles_claim}; token type: {}; algorithms: {})",
                            token_type.as_deref().unwrap_or("JWT, at+jwt or none"),
                            algorithms.names().join(","),
                        ),
                        SetOutcome::NoMerchant => anyhow::bail!("no merchant named {merchant:?}"),
                        SetOutcome::IssuerTaken => {
                            anyhow::bail!("another merchant already trusts the issuer {issuer:?}")
                        }
                    }
                }
                _ => match identity::remove(&pool, &merchant, &actor)
                    .await
                    .context("removing the identity provider")?
                {
                    Some(true) => println!("{merchant}: trusts no identity provider"),
                    Some(false) => println!("{merchant}: had no identity provider"),
                    None => anyhow::bail!("no merchant named {merchant:?}"),
                },
            }
        }
        MerchantCommand::Show { merchant } => {
            let url = env.database_url()?;
            oncepay::store::prepare_database(&url)
                .await
                .context("migrating the database")?;
            let pool = oncepay::store::pool(&url, 1)?;
            let Some(found) = oncepay::store::identity::of_merchant(&pool, &merchant)
                .await
                .context("reading the merchant")?
            else {
                anyhow::bail!("no merchant named {merchant:?}");
            };
            println!("merchant: {merchant}");
            match found {
                Some(identity) => {
                    println!("identity.issuer: {}", identity.issuer);
                    println!("identity.jwks_url: {}", identity.jwks_url);
                    println!("identity.audience: {}", identity.audience);
                    println!("identity.roles_claim: {}", identity.roles_claim);
                    println!(
                        "identity.token_type: {}",
                        identity
                            .token_type
                            .as_deref()
                            .unwrap_or("(JWT, at+jwt or none)")
                    );
                    println!(
                        "identity.algorithms: {}",
                        identity.algorithms.names().join(",")
                    );
                }
                None => println!("identity: none"),
            }
        }
    }
    Ok(())
}

/// `oncepay ledger check`: one line per merchant, ledger and unit, and a
/// failure when any breaks a rule.
async fn ledger_check(env: &ProcessEnv, merchant: Option<&str>) -> anyhow::Result<()> {
    let url = env.database_url()?;
    let pool = oncepay::store::pool(&url, 1).context("connecting to the database")?;
    let lines = oncepay::store::ledger::check(&pool, merchant)
        .await
        .context("checking the ledger")?;
    if let Some(name) = merchant {
        if lines.is_empty() && !oncepay::store::ledger::merchant_exists(&pool, name).await? {
            anyhow::bail!("no merchant named {name:?}");
        }
    }
    println!(
        "merchant\tledger\tunit\taccounts\ttransfers\tsum\tpending\tmismatched\tnegative\tbad_holds\tunmatched\tverdict"
    );
    let mut breaches = 0;
    for l in &lines {
        let verdict = if l.holds() { "ok" } else { "BREACH" };
        breaches += usize::from(!l.holds());
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            l.merchant,
            l.ledger,
            l.unit,
            l.accounts,
            l.transfers,
            l.posted_sum,
            l.pending_sum,
            l.totals_mismatched,
            l.negative,
            l.bad_resolutions,
            l.unmatched,
            verdict
        );
    }
    anyhow::ensure!(
        breaches == 0,
        "the ledger breaks its rules in {breaches} merchant unit(s)"
    );
    Ok(())
}

/// `oncepay reconcile`: the books of every configured provider over a
/// window, printed as a table.
async fn reconcile(
    env: &ProcessEnv,
    since: PointInTime,
    until: Option<PointInTime>,
    dry_run: bool,
) -> anyhow::Result<()> {
    let now = chrono::Utc::now();
    let window = (since.resolve(now), until.map_or(now, |u| u.resolve(now)));
    anyhow::ensure!(
        window.0 < window.1,
        "--since must be before --until ({} is not before {})",
        window.0.to_rfc3339(),
        window.1.to_rfc3339()
    );
    let config = env.serve_config()?;
    oncepay::store::prepare_database(&config.database_url)
        .await
        .context("migrating the database")?;
    let ctx = oncepay::startup::context(&config, String::new())?;
    let options = oncepay::books::Options {
        dry_run,
        policy: config.books.orphan_policy,
        trigger: oncepay::books::Trigger::Cli,
        read_back: config.books.read_back_limit,
    };
    let Some(runs) = oncepay::books::reconcile(&ctx, window, options).await? else {
        anyhow::bail!("another process is reconciling the books now; try again when it finishes");
    };
    println!(
        "books {} {} .. {}{}",
        if dry_run {
            "to reconcile"
        } else {
            "reconciled"
        },
        window.0.to_rfc3339(),
        window.1.to_rfc3339(),
        if dry_run {
            " (dry run: nothing changed)"
        } else {
            ""
        }
    );
    println!(
        "provider\tmatched\tadopted\trefunded\theld\tmismatched\tmissing\treversed\tdisputes\trun"
    );
    for run in runs {
        let c = run.counts;
        println!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}",
            run.provider,
            c.matched,
            c.adopted,
            c.refunded,
            c.held,
            c.mismatched,
            c.missing,
            c.reversed,
            c.disputes,
            run.id
        );
    }
    Ok(())
}
