//! The `oncepay` binary: dispatches the subcommands of contract section 1.

use std::process::ExitCode;

use oncepay::cli::{self, Invocation};
use oncepay::config::Env;

#[tokio::main]
async fn main() -> ExitCode {
    let invocation = match cli::parse(std::env::args().skip(1)) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("oncepay: {e}");
            return ExitCode::from(2);
        }
    };
    match run(invocation).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            eprintln!("oncepay: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(invocation: Invocation) -> Result<(), String> {
    let env = Env::process();
    let (filter, format) = env.log_config().map_err(|e| e.to_string())?;
    oncepay::telemetry::init(&filter, format);
    match invocation {
        Invocation::Help => {
            print!("{}", cli::USAGE);
            Ok(())
        }
        Invocation::Version => {
            println!("oncepay {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Invocation::Migrate => {
            let url = env.database_url().map_err(|e| e.to_string())?;
            let applied = oncepay::store::prepare_database(&url)
                .await
                .map_err(|e| e.to_string())?;
            println!("applied {} migration(s)", applied.len());
            Ok(())
        }
        Invocation::CreateApiKey { merchant } => {
            let url = env.database_url().map_err(|e| e.to_string())?;
            oncepay::store::prepare_database(&url)
                .await
                .map_err(|e| e.to_string())?;
            let pool = oncepay::store::pool(&url, 1).map_err(|e| e.to_string())?;
            let key = oncepay::api_keys::create(&pool, &merchant)
                .await
                .map_err(|e| e.to_string())?;
            println!("API key for merchant {merchant:?} (shown once; only its hash is stored):");
            println!("{key}");
            Ok(())
        }
        Invocation::Serve => {
            let config = env.serve_config().map_err(|e| e.to_string())?;
            let app = oncepay::startup::Application::build(config)
                .await
                .map_err(|e| e.to_string())?;
            app.run_until_stopped().await.map_err(|e| e.to_string())
        }
        Invocation::Sandbox => {
            let config = env.sandbox_config().map_err(|e| e.to_string())?;
            oncepay::sandbox::run(config)
                .await
                .map_err(|e| e.to_string())
        }
    }
}
