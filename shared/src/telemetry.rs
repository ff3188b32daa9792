//! Logging set-up shared by both programs.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// Starts logging to stderr. `RUST_LOG`, when set, wins over `--log-level`.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(env),
        _ => EnvFilter::try_new(level),
    }
    .map_err(|e| format!("invalid --log-level/RUST_LOG filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| format!("cannot start logging: {e}"))
}
