//! Waiting for a condition on a real cluster, with a deadline and a useful failure message.

use std::future::Future;
use std::time::{Duration, Instant};

use kube::Api;

/// Polls `check` every 100 ms until it returns `Ok(Some(v))`, for at most `limit`. `Ok(None)` and
/// `Err` both mean "not yet"; the last reason is reported when time runs out.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let last = match check().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => "condition not met".to_owned(),
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "timed out after {limit:?} waiting for {what}: {last}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`eventually`] for tests: waits at most `limit_secs` and panics with the reason on timeout.
pub async fn wait_for<T, F, Fut>(what: &str, limit_secs: u64, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, String>>,
{
    eventually(what, Duration::from_secs(limit_secs), check)
        .await
        .unwrap()
}

/// Whether `api` has no object called `name` (for a [`wait_for`] check).
pub async fn absent<K>(api: &Api<K>, name: &str) -> Result<bool, String>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    Ok(api
        .get_opt(name)
        .await
        .map_err(|e| e.to_string())?
        .is_none())
}

/// Waits, at most `limit_secs`, until `api` has no object called `name`; panics on timeout.
pub async fn wait_gone<K>(api: &Api<K>, name: &str, what: &str, limit_secs: u64)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    wait_for(what, limit_secs, || async {
        Ok(absent(api, name).await?.then_some(()))
    })
    .await
}
