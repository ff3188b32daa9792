//! Authentication of `/metrics` scrapes (`--metrics-auth`, off by default), the way
//! kube-rbac-proxy does it: a scrape carries a bearer token; the consumer API server says who it
//! is (TokenReview) and whether that identity may `get` the non-resource URL `/metrics`
//! (SubjectAccessReview). Verdicts are remembered per token digest — an allowed one for a minute,
//! a refusal for 10 s (a grant takes effect soon) — at most [`Verdicts::CAPACITY`] of them, so a
//! scraper every few seconds costs two reviews a minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::Digest;

use crate::sync::Locked;

/// What a scrape is answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Served.
    Allowed,
    /// 401: no token, or the API server does not know it.
    Unauthenticated(String),
    /// 403: known, not allowed to `get` `/metrics`.
    Forbidden(String),
    /// 429: more unknown tokens than [`ReviewBudget::PER_SECOND`] in a second — nobody can make
    /// kbind flood its API server with reviews.
    Throttled,
}

/// How many token reviews (a TokenReview and a SubjectAccessReview each) may start per second:
/// remembered verdicts cost none, so a scraper never meets it, and a flood of made-up tokens
/// costs the API server at most this much.
pub struct ReviewBudget {
    per_second: u32,
    window: Mutex<Option<(Instant, u32)>>,
}

impl Default for ReviewBudget {
    fn default() -> Self {
        Self::per_second(Self::PER_SECOND)
    }
}

impl ReviewBudget {
    /// Reviews per second of `/metrics` scrapes.
    pub const PER_SECOND: u32 = 10;

    /// A budget of `per_second` reviews.
    pub fn per_second(per_second: u32) -> Self {
        Self {
            per_second,
            window: Mutex::new(None),
        }
    }

    /// Whether a review may start at `now`.
    pub fn take(&self, now: Instant) -> bool {
        let mut window = self.window.locked();
        match &mut *window {
            Some((start, used)) if now.duration_since(*start) < Duration::from_secs(1) => {
                if *used >= self.per_second {
                    return false;
                }
                *used += 1;
            }
            _ => *window = Some((now, 1)),
        }
        true
    }
}

/// The longest bearer token reviewed (a service account token is about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The bearer token of an `Authorization` header value, if it is one.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The verdict from the API server's two answers (`access` only asked when authenticated).
pub fn verdict(
    authentication: &TokenReviewStatus,
    access: Option<&SubjectAccessReviewStatus>,
) -> Verdict {
    let user = authentication
        .user
        .as_ref()
        .and_then(|u| u.username.clone())
        .unwrap_or_default();
    if authentication.authenticated != Some(true) || user.is_empty() {
        return Verdict::Unauthenticated(
            "the bearer token is not valid for the consumer cluster".into(),
        );
    }
    match access {
        Some(access) if access.allowed && access.denied != Some(true) => Verdict::Allowed,
        _ => Verdict::Forbidden(format!(
            "{} may not get /metrics (grant nonResourceURLs [\"/metrics\"] verbs [\"get\"])",
            crate::redact::remote(&user)
        )),
    }
}

/// Remembered verdicts by token digest.
#[derive(Default)]
pub struct Verdicts(Mutex<HashMap<[u8; 32], (Verdict, Instant)>>);

impl Verdicts {
    /// How long an allowed verdict is remembered.
    pub const TTL: Duration = Duration::from_secs(60);
    /// How long a refusal is remembered.
    pub const REFUSAL_TTL: Duration = Duration::from_secs(10);

    fn ttl(verdict: &Verdict) -> Duration {
        match verdict {
            Verdict::Allowed => Self::TTL,
            _ => Self::REFUSAL_TTL,
        }
    }
    /// How many verdicts are remembered at most.
    pub const CAPACITY: usize = 1024;

    fn key(token: &str) -> [u8; 32] {
        sha2::Sha256::digest(token.as_bytes()).into()
    }

    /// The remembered verdict for `token`, unless expired at `now`.
    pub fn get(&self, token: &str, now: Instant) -> Option<Verdict> {
        let verdicts = self.0.locked();
        let (verdict, at) = verdicts.get(&Self::key(token))?;
        (now.duration_since(*at) < Self::ttl(verdict)).then(|| verdict.clone())
    }

    /// Remembers `verdict` for `token` at `now` (expired ones dropped first; emptied when full).
    pub fn put(&self, token: &str, verdict: Verdict, now: Instant) {
        let mut verdicts = self.0.locked();
        verdicts.retain(|_, (verdict, at)| now.duration_since(*at) < Self::ttl(verdict));
        if verdicts.len() >= Self::CAPACITY {
            verdicts.clear();
        }
        verdicts.insert(Self::key(token), (verdict, now));
    }
}

/// Authenticates scrapes against the consumer API server.
pub struct MetricsAuth {
    client: Client,
    verdicts: Verdicts,
    budget: ReviewBudget,
}

impl MetricsAuth {
    /// Reviews with `client` (the process's consumer client: it needs `create` on
    /// `tokenreviews` and `subjectaccessreviews`, e.g. the `system:auth-delegator` ClusterRole).
    pub fn new(client: Client) -> Self {
        Self {
            client,
            verdicts: Verdicts::default(),
            budget: ReviewBudget::default(),
        }
    }

    /// The verdict for a scrape with this `Authorization` header value.
    pub async fn check(&self, authorization: Option<&str>) -> Verdict {
        let Some(token) = bearer(authorization) else {
            return Verdict::Unauthenticated("a bearer token is required".into());
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Verdict::Unauthenticated("the bearer token is too long".into());
        }
        if let Some(known) = self.verdicts.get(token, Instant::now()) {
            return known;
        }
        if !self.budget.take(Instant::now()) {
            return Verdict::Throttled;
        }
        match self.review(token).await {
            Ok(verdict) => {
                self.verdicts.put(token, verdict.clone(), Instant::now());
                verdict
            }
            // Not remembered: the next scrape asks again.
            Err(e) => Verdict::Unauthenticated(format!(
                "cannot review the token: {}",
                crate::redact::remote(&e.to_string())
            )),
        }
    }

    async fn review(&self, token: &str) -> Result<Verdict, kube::Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..Default::default()
            },
            ..Default::default()
        };
        let authentication = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await?
            .status
            .unwrap_or_default();
        if !matches!(verdict(&authentication, None), Verdict::Forbidden(_)) {
            return Ok(verdict(&authentication, None));
        }
        let user = authentication.user.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some("/metrics".into()),
                    verb: Some("get".into()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let access = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &access)
            .await?
            .status;
        Ok(verdict(&authentication, access.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::authentication::v1::UserInfo;

    fn authenticated(user: Option<&str>) -> TokenReviewStatus {
        TokenReviewStatus {
            authenticated: Some(user.is_some()),
            user: user.map(|u| UserInfo {
                username: Some(u.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn access(allowed: bool, denied: Option<bool>) -> SubjectAccessReviewStatus {
        SubjectAccessReviewStatus {
            allowed,
            denied,
            ..Default::default()
        }
    }

    #[test]
    fn only_a_known_identity_allowed_to_get_metrics_is_served() {
        for (header, token) in [
            (None, None),
            (Some(""), None),
            (Some("Basic abc"), None),
            (Some("Bearer "), None),
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
        ] {
            assert_eq!(bearer(header), token, "{header:?}");
        }
        let prometheus = authenticated(Some("system:serviceaccount:monitoring:prometheus"));
        for (review, answer, expected) in [
            (authenticated(None), None, "401"),
            (authenticated(Some("")), None, "401"),
            (prometheus.clone(), None, "403"),
            (prometheus.clone(), Some(access(false, None)), "403"),
            (prometheus.clone(), Some(access(true, Some(true))), "403"),
            (prometheus.clone(), Some(access(true, None)), "200"),
        ] {
            let got = match verdict(&review, answer.as_ref()) {
                Verdict::Allowed => "200",
                Verdict::Unauthenticated(_) => "401",
                Verdict::Forbidden(why) => {
                    assert!(why.contains("may not get /metrics"), "{why}");
                    "403"
                }
                Verdict::Throttled => "429",
            };
            assert_eq!(got, expected, "{review:?} {answer:?}");
        }
    }

    #[test]
    fn reviews_are_rate_bounded() {
        let budget = ReviewBudget::default();
        let start = Instant::now();
        let granted = (0..50).filter(|_| budget.take(start)).count();
        assert_eq!(granted, ReviewBudget::PER_SECOND as usize);
        assert!(!budget.take(start + Duration::from_millis(999)));
        assert!(budget.take(start + Duration::from_secs(1)));
        let wide = ReviewBudget::per_second(100);
        assert_eq!((0..150).filter(|_| wide.take(start)).count(), 100);
    }

    #[test]
    fn verdicts_are_remembered_for_a_minute_by_digest_and_bounded() {
        let verdicts = Verdicts::default();
        let start = Instant::now();
        verdicts.put("t", Verdict::Allowed, start);
        assert_eq!(verdicts.get("t", start), Some(Verdict::Allowed));
        assert_eq!(verdicts.get("u", start), None);
        assert_eq!(verdicts.get("t", start + Verdicts::TTL), None);
        let no = Verdict::Forbidden("no".into());
        verdicts.put("f", no.clone(), start);
        assert_eq!(verdicts.get("f", start), Some(no));
        assert_eq!(verdicts.get("f", start + Verdicts::REFUSAL_TTL), None);
        for i in 0..Verdicts::CAPACITY + 5 {
            verdicts.put(&i.to_string(), Verdict::Allowed, start);
        }
        assert!(verdicts.0.locked().len() <= Verdicts::CAPACITY);
        // No token is kept, only its digest.
        assert!(verdicts.0.locked().keys().all(|k| k.len() == 32));
    }
}
