//! Building kube clients with kbind's request accounting
//! (`kbind_api_requests_total{cluster,verb,code}`) and bounded timeouts.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::ClientBuilder;
use kube::{Client, Config};
use prometheus::IntCounterVec;
use tower::{Layer, Service};

/// The Kubernetes verb of a request, from its method and, for GETs, its query.
pub fn verb<B>(request: &Request<B>) -> &'static str {
    match *request.method() {
        Method::GET => {
            let query = request.uri().query().unwrap_or_default();
            if query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1")
            {
                "watch"
            } else {
                "get"
            }
        }
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// Counts every request by cluster, verb and response code (`error` when no response came).
#[derive(Clone)]
pub struct RequestMetricsLayer {
    counter: IntCounterVec,
    cluster: String,
}

impl RequestMetricsLayer {
    /// Counts into `counter` (labels `cluster`, `verb`, `code`) under this cluster label.
    pub fn new(counter: IntCounterVec, cluster: impl Into<String>) -> Self {
        Self {
            counter,
            cluster: cluster.into(),
        }
    }
}

impl<S> Layer<S> for RequestMetricsLayer {
    type Service = RequestMetrics<S>;
    fn layer(&self, inner: S) -> Self::Service {
        RequestMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RequestMetricsLayer`] wraps around the client's stack.
#[derive(Clone)]
pub struct RequestMetrics<S> {
    inner: S,
    layer: RequestMetricsLayer,
}

impl<S, B, RB> Service<Request<B>> for RequestMetrics<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let verb = verb(&request);
        let layer = self.layer.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let result = response.await;
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(_) => "error".to_owned(),
            };
            layer
                .counter
                .with_label_values(&[layer.cluster.as_str(), verb, code.as_str()])
                .inc();
            result
        })
    }
}

/// Connect and read timeouts for clients kbind builds, so that an unreachable provider is
/// reported promptly instead of hanging a reconcile.
pub fn bound_timeouts(config: &mut Config) {
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(RESPONSE_TIMEOUT);
}

/// How long a request other than a watch waits for its response from a provider.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// The read timeout of a client that watches: longer than the 290 s a kube-runtime watch asks the
/// API server to keep it open, so that a quiet watch is not cut and opened again every
/// [`RESPONSE_TIMEOUT`] (which at 200 APIs cost 400 watch requests a minute at rest). Requests
/// other than watches are bounded by [`ResponseTimeoutLayer`] instead.
pub const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(295);

/// [`bound_timeouts`] for a client that also watches: use it with [`build_watching`].
pub fn bound_timeouts_watching(config: &mut Config) {
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(WATCH_READ_TIMEOUT);
}

/// The `User-Agent` kbind's programs send: the program's name and kbind's version (e.g.
/// `kbind-syncer/0.1.0`), so that an API server's audit log and request metrics tell kbind's
/// requests apart from everyone else's (kube's client sends none of its own).
pub fn user_agent() -> String {
    let program = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "kbind".into());
    format!("{program}/{}", env!("CARGO_PKG_VERSION"))
}

/// Adds [`user_agent`] to `config`'s headers unless it has one.
fn identify(config: &mut Config) {
    if config
        .headers
        .iter()
        .any(|(name, _)| name == http::header::USER_AGENT)
    {
        return;
    }
    if let Ok(value) = http::HeaderValue::from_str(&user_agent()) {
        config.headers.push((http::header::USER_AGENT, value));
    }
}

/// [`build`], every request but a watch bounded by [`RESPONSE_TIMEOUT`]: for a config with
/// [`bound_timeouts_watching`].
pub fn build_watching(
    mut config: Config,
    cluster: &str,
    counter: Option<&IntCounterVec>,
) -> Result<Client, kube::Error> {
    identify(&mut config);
    let builder =
        ClientBuilder::try_from(config)?.with_layer(&ResponseTimeoutLayer(RESPONSE_TIMEOUT));
    Ok(match counter {
        Some(counter) => builder
            .with_layer(&RequestMetricsLayer::new(counter.clone(), cluster))
            .build(),
        None => builder.build(),
    })
}

/// Fails a request other than a watch whose response has not begun within the given time.
#[derive(Clone, Copy, Debug)]
pub struct ResponseTimeoutLayer(pub Duration);

impl<S> Layer<S> for ResponseTimeoutLayer {
    type Service = ResponseTimeout<S>;
    fn layer(&self, inner: S) -> Self::Service {
        ResponseTimeout {
            inner,
            after: self.0,
        }
    }
}

/// The service [`ResponseTimeoutLayer`] wraps around the client's stack.
#[derive(Clone, Debug)]
pub struct ResponseTimeout<S> {
    inner: S,
    after: Duration,
}

impl<S, B, RB> Service<Request<B>> for ResponseTimeout<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, tower::BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let watch = verb(&request) == "watch";
        let after = self.after;
        let response = self.inner.call(request);
        Box::pin(async move {
            if watch {
                return response.await.map_err(Into::into);
            }
            match tokio::time::timeout(after, response).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => Err(format!("no response within {after:?}").into()),
            }
        })
    }
}

/// A client for `config` whose requests are counted under `cluster` (`consumer` or a Connection
/// name). Watches keep their own, longer timeouts inside kube.
pub fn build(
    mut config: Config,
    cluster: &str,
    counter: Option<&IntCounterVec>,
) -> Result<Client, kube::Error> {
    identify(&mut config);
    let builder = ClientBuilder::try_from(config)?;
    Ok(match counter {
        Some(counter) => builder
            .with_layer(&RequestMetricsLayer::new(counter.clone(), cluster))
            .build(),
        None => builder.build(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kbinds_requests_name_the_program_and_version() {
        let agent = user_agent();
        let (program, version) = agent.split_once('/').unwrap();
        assert!(!program.is_empty(), "{agent}");
        assert_eq!(version, env!("CARGO_PKG_VERSION"));
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        identify(&mut config);
        identify(&mut config);
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(agents, [agent]);
    }

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    #[tokio::test]
    async fn only_requests_other_than_watches_time_out() {
        // A server that never answers.
        let silent = tower::service_fn(|_: Request<()>| {
            std::future::pending::<Result<Response<()>, std::convert::Infallible>>()
        });
        let mut bounded = ResponseTimeoutLayer(Duration::from_millis(20)).layer(silent);
        let get = bounded.call(request(Method::GET, "/api/v1/namespaces/kube-system"));
        let error = get.await.expect_err("a GET gives up");
        assert!(error.to_string().contains("no response within"), "{error}");
        let watch = bounded.call(request(Method::GET, "/api/v1/secrets?watch=true"));
        assert!(
            tokio::time::timeout(Duration::from_millis(200), watch)
                .await
                .is_err(),
            "a watch is left to its own, longer timeouts"
        );
    }

    #[test]
    fn verbs_follow_kubernetes_terms() {
        assert_eq!(
            verb(&request(Method::GET, "/api/v1/namespaces/kube-system")),
            "get"
        );
        assert_eq!(
            verb(&request(
                Method::GET,
                "/api/v1/secrets?watch=true&resourceVersion=1"
            )),
            "watch"
        );
        assert_eq!(verb(&request(Method::POST, "/api/v1/namespaces")), "create");
        assert_eq!(verb(&request(Method::PUT, "/x")), "update");
        assert_eq!(verb(&request(Method::PATCH, "/x")), "patch");
        assert_eq!(verb(&request(Method::DELETE, "/x")), "delete");
    }
}
