//! Logging set-up shared by both programs.

use tracing_subscriber::EnvFilter;

use crate::cli::LogFormat;

/// kube's client logs every non-JSON error body (such as the plain 404 of an API group a
/// cluster does not serve, which identity lookups meet on every reconcile) as a warning, and every
/// failed request as an error, on every retry; kbind reports those errors itself, once per change.
const QUIET_KUBE_CLIENT: &str = "kube_client::client=error,kube_client::client::builder=off";

/// The filter for `--log-level`/`RUST_LOG`: the user's directives, plus [`QUIET_KUBE_CLIENT`]
/// unless they say something about `kube_client` themselves.
pub fn filter_directives(user: &str) -> String {
    if user.contains("kube_client") {
        user.to_owned()
    } else {
        format!("{user},{QUIET_KUBE_CLIENT}")
    }
}

/// Starts logging to stderr. `RUST_LOG`, when set, wins over `--log-level`.
pub fn init_logging(format: LogFormat, level: &str) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(filter_directives(&env)),
        _ => EnvFilter::try_new(filter_directives(level)),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_client_noise_is_quiet_unless_asked_for() {
        assert_eq!(
            filter_directives("info"),
            "info,kube_client::client=error,kube_client::client::builder=off"
        );
        assert_eq!(
            filter_directives("debug,kube_client=trace"),
            "debug,kube_client=trace"
        );
    }
}
