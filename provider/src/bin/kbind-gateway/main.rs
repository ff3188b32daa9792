//! `kbind-gateway`: the provider's front door for consumers (#52). It runs **on a provider**,
//! as many replicas as wanted, all active: a consumer authenticates with a token the provider's
//! API server knows, binds an Export it is allowed to bind, and picks its bundle up once. Its
//! only state, the pickups, lives in the provider's API server.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kbind_provider::gateway::{self, Gateway, Settings};
use kbind_shared::api::catalog::{Collection, Export};
use kbind_shared::cli::CommonArgs;
use kbind_shared::process;
use kube::Api;
use kube::runtime::{reflector, watcher};

const PROGRAM: &str = "kbind-gateway";

#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// kbind's gateway: runs on a PROVIDER cluster and lets consumers bind its Exports — log in with
/// a token the provider's API server knows, bind, pick the bundle up once.
#[derive(Parser, Debug)]
#[command(
    name = "kbind-gateway",
    version,
    about,
    mut_arg("kubeconfig", |a| a.help("Kubeconfig of the PROVIDER cluster the gateway serves [default: in-cluster, else $KUBECONFIG, else ~/.kube/config]")),
    mut_arg("namespace", |a| a.help("The gateway's own namespace: where its pickups are recorded [default: $POD_NAMESPACE, else kbind]")),
    mut_arg("metrics_auth", |a| a.help("Serve `/metrics` only to a bearer token the provider API server authenticates and allows to `get` the non-resource URL `/metrics`")),
    mut_arg("identity", |a| a.hide(true)),
    mut_arg("provider_secret_namespaces", |a| a.hide(true)),
    mut_arg("allow_insecure_providers", |a| a.hide(true)),
)]
struct Args {
    #[command(flatten)]
    common: CommonArgs,

    /// Where the gateway's API listens.
    #[arg(long, env = "KBIND_BIND_ADDRESS", default_value = "0.0.0.0:8443")]
    bind_address: SocketAddr,

    /// The TLS certificate (PEM, with its chain) the API is served with; read again when it
    /// changes.
    #[arg(long, env = "KBIND_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,

    /// The certificate's private key (PEM).
    #[arg(long, env = "KBIND_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,

    /// Serve plain HTTP instead of TLS (only behind something that terminates TLS: tokens and
    /// kubeconfigs cross this port).
    #[arg(
        long,
        env = "KBIND_PLAIN_HTTP",
        default_value_t = false,
        conflicts_with = "tls_cert_file"
    )]
    plain_http: bool,

    /// The provider's name, as consumers see it.
    #[arg(long, env = "KBIND_PROVIDER_NAME", default_value = "provider")]
    provider_name: String,

    /// The provider's API server as consumers reach it (the bundles' kubeconfigs) [default: the
    /// gateway's kubeconfig's].
    #[arg(long, env = "KBIND_PROVIDER_SERVER")]
    provider_server: Option<String>,

    /// A bundle's credential lifetime (kbind renews it before it ends), at least 600.
    #[arg(long, env = "KBIND_CREDENTIAL_SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(i64).range(600..))]
    credential_seconds: i64,

    /// Binds each caller may make per minute, per replica.
    #[arg(long, env = "KBIND_BINDS_PER_MINUTE", default_value_t = 10)]
    binds_per_minute: u32,

    /// Logins (token reviews) per second, all callers together, per replica: a flood of made-up
    /// tokens costs the provider's API server at most this much.
    #[arg(long, env = "KBIND_TOKEN_REVIEWS_PER_SECOND", default_value_t = 100)]
    token_reviews_per_second: u32,

    /// Log browsers in with this OpenID Connect issuer (authorization code with PKCE); without
    /// it, callers authenticate with bearer tokens only.
    #[arg(long, env = "KBIND_OIDC_ISSUER", requires_all = ["oidc_client_secret_file", "external_url"])]
    oidc_issuer: Option<String>,

    /// The gateway's client ID at the issuer.
    #[arg(long, env = "KBIND_OIDC_CLIENT_ID", default_value = "kbind-gateway")]
    oidc_client_id: String,

    /// A file holding its client secret (a Secret's mount).
    #[arg(long, env = "KBIND_OIDC_CLIENT_SECRET_FILE")]
    oidc_client_secret_file: Option<PathBuf>,

    /// The claim naming the user.
    #[arg(long, env = "KBIND_OIDC_USERNAME_CLAIM", default_value = "email")]
    oidc_username_claim: String,

    /// Put before the claim's value: the username your RBAC rules name.
    #[arg(long, env = "KBIND_OIDC_USERNAME_PREFIX", default_value = "oidc:")]
    oidc_username_prefix: String,

    /// The gateway's URL as browsers reach it (the identity provider returns them to
    /// `<url>/callback`).
    #[arg(long, env = "KBIND_EXTERNAL_URL")]
    external_url: Option<String>,

    /// How long a login session lasts.
    #[arg(long, env = "KBIND_SESSION_SECONDS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(60..=3600))]
    session_seconds: u64,

    /// Logins started per second, all browsers together, per replica (each costs a record in the
    /// provider's API server until it finishes or expires).
    #[arg(long, env = "KBIND_LOGINS_PER_SECOND", default_value_t = 5)]
    logins_per_second: u32,

    /// How long a bind's pickup URL may be used (once), at most 3600.
    #[arg(long, env = "KBIND_PICKUP_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pickup_seconds: u64,

    /// Testing only: pretend the host's clock is off by this much (e.g. `+6h`, `-6h`). Records
    /// are judged by the API server's clock, so no verdict on one changes.
    #[arg(long, env = "KBIND_HOST_CLOCK_OFFSET", hide = true, value_parser = kbind_provider::clock::parse_offset, default_value = "0s")]
    host_clock_offset: jiff::SignedDuration,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let common = args.common.clone();
    process::main(PROGRAM, &common, |started| run(args, started)).await
}

async fn run(args: Args, started: process::Started) -> Result<(), String> {
    let process::Started {
        shutdown,
        metrics,
        client,
        readiness,
    } = started;
    if args.tls_cert_file.is_none() && !args.plain_http {
        return Err(
            "a TLS certificate is required (--tls-cert-file and --tls-key-file), or --plain-http behind a TLS terminator"
                .into(),
        );
    }
    let config = process::config(&args.common).await?;
    let namespace = args.common.namespace();
    let (exports, writer) = reflector::store();
    kbind_shared::cache::observe(
        writer,
        Api::<Export>::all(client.clone()),
        watcher::Config::default(),
        shutdown.clone(),
        watch_errors("Exports"),
    );
    let (collections, writer) = reflector::store();
    kbind_shared::cache::observe(
        writer,
        Api::<Collection>::all(client.clone()),
        watcher::Config::default(),
        shutdown.clone(),
        watch_errors("Collections"),
    );
    let settings = Settings {
        provider_name: args.provider_name.clone(),
        server: args.provider_server.clone(),
        expiration_seconds: args.credential_seconds,
        binds_per_minute: args.binds_per_minute,
        pickup_ttl: std::time::Duration::from_secs(args.pickup_seconds),
        reviews_per_second: args.token_reviews_per_second,
        session_ttl: std::time::Duration::from_secs(args.session_seconds),
        logins_per_second: args.logins_per_second,
        host_clock_offset: args.host_clock_offset,
    };
    let oidc = match &args.oidc_issuer {
        Some(issuer) => {
            let secret_file = args
                .oidc_client_secret_file
                .as_ref()
                .ok_or("--oidc-client-secret-file is required with --oidc-issuer")?;
            let secret = std::fs::read_to_string(secret_file)
                .map_err(|e| format!("cannot read {}: {e}", secret_file.display()))?
                .trim()
                .to_owned();
            let external = args
                .external_url
                .as_deref()
                .ok_or("--external-url is required with --oidc-issuer")?
                .trim_end_matches('/');
            let oidc = gateway::oidc::Oidc::discover(gateway::oidc::Settings {
                issuer: issuer.clone(),
                client_id: args.oidc_client_id.clone(),
                client_secret: secret,
                redirect_uri: format!("{external}/callback"),
                username_claim: args.oidc_username_claim.clone(),
                username_prefix: args.oidc_username_prefix.clone(),
            })
            .await?;
            tracing::info!(%issuer, "logging browsers in with OpenID Connect");
            Some(oidc)
        }
        None => None,
    };
    let gateway = Arc::new(Gateway::new(
        client,
        config,
        settings,
        &namespace,
        exports.clone(),
        collections.clone(),
        metrics,
        oidc,
    ));
    tokio::spawn(gateway::collect(
        gateway.records().clone(),
        shutdown.clone(),
    ));
    let router = gateway::router(gateway);
    let served = match (&args.tls_cert_file, &args.tls_key_file) {
        (Some(cert), Some(key)) => {
            let listener = gateway::tls::Listener::bind(
                args.bind_address,
                cert.clone(),
                key.clone(),
                shutdown.clone(),
            )
            .await?;
            let at = axum::serve::Listener::local_addr(&listener).map_err(|e| e.to_string())?;
            tracing::info!(address = %at, %namespace, "kbind-gateway serving (TLS)");
            tokio::spawn(ready_when_synced(exports, collections, readiness));
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        _ => {
            let listener = tokio::net::TcpListener::bind(args.bind_address)
                .await
                .map_err(|e| format!("cannot listen on {}: {e}", args.bind_address))?;
            let at = listener.local_addr().map_err(|e| e.to_string())?;
            tracing::info!(address = %at, %namespace, "kbind-gateway serving (plain HTTP)");
            tokio::spawn(ready_when_synced(exports, collections, readiness));
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
    };
    served.map_err(|e| format!("the gateway's server failed: {e}"))?;
    tracing::info!("kbind-gateway stopped");
    Ok(())
}

/// A cache observer logging its watch's errors (the catalog stays unready, or stale, until the
/// watch works: the operator reads why here).
fn watch_errors<K>(
    what: &'static str,
) -> impl Fn(Result<&watcher::Event<K>, &watcher::Error>) + Send + 'static {
    move |event| {
        if let Err(error) = event {
            tracing::warn!(%error, "cannot watch the catalog's {what}; retrying");
        }
    }
}

/// Ready once the catalog is known.
async fn ready_when_synced(
    exports: reflector::Store<Export>,
    collections: reflector::Store<Collection>,
    readiness: process::Readiness,
) {
    let _ = exports.wait_until_ready().await;
    let _ = collections.wait_until_ready().await;
    readiness.set(true);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_speaks_of_the_provider_and_lists_no_consumer_side_flag() {
        use clap::CommandFactory;
        let help = Args::command().render_long_help().to_string();
        assert!(
            help.contains("Kubeconfig of the PROVIDER cluster"),
            "{help}"
        );
        for consumer_side in [
            "consumer cluster",
            "--provider-secret-namespaces",
            "--allow-insecure-providers",
        ] {
            assert!(!help.contains(consumer_side), "{consumer_side}: {help}");
        }
    }

    #[test]
    fn tls_or_an_explicit_plain_http() {
        let args = Args::try_parse_from(["kbind-gateway"]).unwrap();
        assert!(!args.plain_http && args.tls_cert_file.is_none());
        assert!(Args::try_parse_from(["kbind-gateway", "--tls-cert-file=c"]).is_err());
        assert!(
            Args::try_parse_from([
                "kbind-gateway",
                "--plain-http",
                "--tls-cert-file=c",
                "--tls-key-file=k"
            ])
            .is_err()
        );
        assert!(Args::try_parse_from(["kbind-gateway", "--credential-seconds=60"]).is_err());
    }
}
