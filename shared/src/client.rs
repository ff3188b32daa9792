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
    config.read_timeout = Some(Duration::from_secs(30));
}

/// A client for `config` whose requests are counted under `cluster` (`consumer` or a Connection
/// name). Watches keep their own, longer timeouts inside kube.
pub fn build(
    config: Config,
    cluster: &str,
    counter: Option<&IntCounterVec>,
) -> Result<Client, kube::Error> {
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

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
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
