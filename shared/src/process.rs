//! Process plumbing both programs share: the consumer client, the probe and metrics servers,
//! and shutdown on SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use kube::config::KubeConfigOptions;
use kube::{Client, Config};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::cli::{BindAddress, CommonArgs};
use crate::metrics::Metrics;

/// Whether the process is ready (`/readyz`). Liveness (`/healthz`) is the process answering.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready or not.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::Relaxed);
    }

    /// Whether the process is ready.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// What both programs have once started: the shutdown signal, metrics, the consumer client (its
/// API server answering) and the probe and metrics endpoints serving.
pub struct Started {
    /// Cancelled on SIGTERM/SIGINT.
    pub shutdown: CancellationToken,
    /// The process's metrics.
    pub metrics: Metrics,
    /// The consumer cluster.
    pub client: Client,
    /// `/readyz`.
    pub readiness: Readiness,
}

/// The start-up both programs share.
pub async fn start(args: &CommonArgs) -> Result<Started, String> {
    let shutdown = shutdown_on_signals();
    let metrics = Metrics::new();
    let client = consumer_client(args, &metrics).await?;
    wait_for_apiserver(&client, Duration::from_secs(30)).await?;
    let readiness = Readiness::default();
    serve_endpoints(
        args.metrics_bind_address,
        args.health_probe_bind_address,
        metrics.clone(),
        args.metrics_auth
            .then(|| Arc::new(crate::metrics_auth::MetricsAuth::new(client.clone()))),
        readiness.clone(),
        shutdown.clone(),
    )
    .await?;
    Ok(Started {
        shutdown,
        metrics,
        client,
        readiness,
    })
}

/// A program's `main`: logging per `args`, the shared [`start`], then `run`; an error is printed
/// and exits non-zero.
pub async fn main<F, Fut>(program: &str, args: &CommonArgs, run: F) -> std::process::ExitCode
where
    F: FnOnce(Started) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    if let Err(e) = crate::telemetry::init_logging(args.log_format, &args.log_level) {
        eprintln!("{program}: {e}");
        return std::process::ExitCode::FAILURE;
    }
    let outcome = match start(args).await {
        Ok(started) => run(started).await,
        Err(e) => Err(e),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{program}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A client for the consumer cluster: `--kubeconfig`/`--context` if given, else in-cluster, else
/// `$KUBECONFIG`, else `~/.kube/config`.
pub async fn consumer_client(args: &CommonArgs, metrics: &Metrics) -> Result<Client, String> {
    let config = config(args).await?;
    crate::client::build(config, "consumer", Some(&metrics.api_requests_total))
        .map_err(|e| format!("cannot build a client for the consumer cluster: {e}"))
}

/// The configuration [`consumer_client`] connects with (the cluster the process runs against).
pub async fn config(args: &CommonArgs) -> Result<Config, String> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    Ok(match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read kubeconfig {}: {e}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| format!("cannot use kubeconfig {}: {e}", path.display()))?
        }
        None if args.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| format!("cannot use kubeconfig context {:?}: {e}", args.context))?,
        None => Config::infer()
            .await
            .map_err(|e| format!("cannot find a consumer cluster configuration: {e}"))?,
    })
}

/// Waits until the API server answers, for at most `limit`.
pub async fn wait_for_apiserver(client: &Client, limit: Duration) -> Result<(), String> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match client.apiserver_version().await {
            Ok(_) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(format!(
                    "the consumer API server did not answer within {limit:?}: {}",
                    crate::identity::describe_error(&e)
                ));
            }
            Err(e) => {
                // The root cause (DNS, refused, TLS) is what an operator acts on, not the
                // outermost "client error (Connect)".
                let error = crate::identity::describe_error(&e);
                tracing::warn!(%error, "consumer API server not reachable yet; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown signal received");
        cancel.cancel();
    });
    token
}

#[cfg(unix)]
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() {
    let _ = tokio::signal::ctrl_c().await;
}

/// Binds the metrics and probe endpoints (failing at once if an address is taken) and serves them
/// until `shutdown`; with `auth`, `/metrics` is served only to the scrapes it allows. Returns the
/// bound addresses (metrics, probes), useful with port 0.
pub async fn serve_endpoints(
    metrics_address: BindAddress,
    probe_address: BindAddress,
    metrics: Metrics,
    auth: Option<Arc<crate::metrics_auth::MetricsAuth>>,
    readiness: Readiness,
    shutdown: CancellationToken,
) -> Result<(Option<SocketAddr>, Option<SocketAddr>), String> {
    let metrics_router = Router::new()
        .route("/metrics", get(render_metrics))
        .with_state((metrics, auth));
    let probe_router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(readiness);
    let metrics_at = serve(metrics_address, "metrics", metrics_router, shutdown.clone()).await?;
    let probes_at = serve(probe_address, "health probe", probe_router, shutdown).await?;
    Ok((metrics_at, probes_at))
}

async fn serve(
    address: BindAddress,
    what: &str,
    router: Router,
    shutdown: CancellationToken,
) -> Result<Option<SocketAddr>, String> {
    let BindAddress::Listen(address) = address else {
        return Ok(None);
    };
    let listener = TcpListener::bind(address)
        .await
        .map_err(|e| format!("cannot listen on {address} for {what}: {e}"))?;
    let bound = listener
        .local_addr()
        .map_err(|e| format!("{what} listener: {e}"))?;
    tracing::info!(address = %bound, "serving {what} endpoint");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "endpoint server failed");
        }
    });
    Ok(Some(bound))
}

async fn render_metrics(
    State((metrics, auth)): State<(Metrics, Option<Arc<crate::metrics_auth::MetricsAuth>>)>,
    headers: axum::http::HeaderMap,
) -> (StatusCode, String) {
    use crate::metrics_auth::Verdict;
    if let Some(auth) = auth {
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        match auth.check(header).await {
            Verdict::Allowed => {}
            Verdict::Unauthenticated(why) => return (StatusCode::UNAUTHORIZED, why + "\n"),
            Verdict::Forbidden(why) => return (StatusCode::FORBIDDEN, why + "\n"),
            Verdict::Throttled => {
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    "too many token reviews; try again in a second\n".into(),
                );
            }
        }
    }
    (StatusCode::OK, metrics.render())
}

async fn ready(State(readiness): State<Readiness>) -> (StatusCode, &'static str) {
    if readiness.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
