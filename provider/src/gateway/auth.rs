//! Who is calling, and may they bind this Export — the gateway's Kubernetes authenticator: a
//! bearer token the provider's API server authenticates (TokenReview: ServiceAccount tokens, and
//! users of whatever authenticators the API server trusts — OIDC, certificates' tokens, webhooks),
//! and an explicit rule for binding, checked with a SubjectAccessReview: the verb **`bind`** on the
//! Export (`exports.catalog.kbind.io`, by name). Nothing grants it by default, so nobody binds
//! until the provider's admins say who may bind what.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kbind_shared::metrics_auth::{MAX_TOKEN_BYTES, ReviewBudget, bearer};
use kube::api::PostParams;
use kube::{Api, Client};

/// Why a call is refused before it does anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403.
    #[error("{0}")]
    Forbidden(String),
    /// 429.
    #[error("{0}")]
    Throttled(String),
    /// 503: the API server did not answer the review.
    #[error("{0}")]
    Unavailable(String),
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    /// Its username, as the API server names it (a Grant's consumer identity).
    pub username: String,
    /// The rest of what the API server said of it (groups, uid, extra), for the access review.
    pub user: UserInfo,
}

/// The API group of the catalog.
pub const CATALOG_GROUP: &str = "catalog.kbind.io";
/// The verb on an Export that lets a caller bind it.
pub const BIND_VERB: &str = "bind";

/// Authenticates and authorizes callers against the provider's API server. Token reviews of all
/// callers together are bounded per second ([`ReviewBudget`]): a flood of made-up tokens costs
/// the API server at most that.
pub struct Authenticator {
    client: Client,
    budget: ReviewBudget,
}

impl Authenticator {
    /// Reviews with `client` (the gateway's own: `create` on `tokenreviews` and
    /// `subjectaccessreviews`), at most `per_second` token reviews a second.
    pub fn new(client: Client, per_second: u32) -> Self {
        Self {
            client,
            budget: ReviewBudget::per_second(per_second),
        }
    }

    /// Who the `Authorization` header's bearer token is.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Denied> {
        let Some(token) = bearer(authorization) else {
            return Err(Denied::Unauthenticated(
                "a bearer token is required (Authorization: Bearer <token>)".into(),
            ));
        };
        if token.len() > MAX_TOKEN_BYTES {
            return Err(Denied::Unauthenticated(
                "the bearer token is too long".into(),
            ));
        }
        if !self.budget.take(Instant::now()) {
            return Err(Denied::Throttled(
                "too many logins right now; try again in a second".into(),
            ));
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                ..Default::default()
            },
            ..Default::default()
        };
        let status = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Denied::Unavailable(format!("cannot review the token: {}", kind(&e))))?
            .status
            .unwrap_or_default();
        caller(status.authenticated, status.user)
    }

    /// Whether `caller` may bind the Export `export`.
    pub async fn may_bind(&self, caller: &Caller, export: &str) -> Result<(), Denied> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(caller.username.clone()),
                groups: caller.user.groups.clone(),
                uid: caller.user.uid.clone(),
                extra: caller.user.extra.clone(),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(CATALOG_GROUP.into()),
                    resource: Some("exports".into()),
                    verb: Some(BIND_VERB.into()),
                    name: Some(export.into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let status = Api::<SubjectAccessReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| Denied::Unavailable(format!("cannot review access: {}", kind(&e))))?
            .status;
        let allowed = status.is_some_and(|s| s.allowed && s.denied != Some(true));
        if allowed {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "{} may not bind Export {export} (grant the verb \"bind\" on exports.{CATALOG_GROUP} \"{export}\")",
                caller.username
            )))
        }
    }
}

/// An API error's class only: a review's error must not echo what was reviewed.
fn kind(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => format!("{} {}", status.code, status.reason),
        _ => "the provider API server did not answer".into(),
    }
}

/// The caller a TokenReview's answer names, if it authenticated someone.
pub fn caller(authenticated: Option<bool>, user: Option<UserInfo>) -> Result<Caller, Denied> {
    let user = user.unwrap_or_default();
    let username = user.username.clone().unwrap_or_default();
    if authenticated != Some(true) || username.is_empty() {
        return Err(Denied::Unauthenticated(
            "the bearer token is not valid for this provider".into(),
        ));
    }
    Ok(Caller { username, user })
}

/// Binds per caller in a sliding minute, kept in memory per replica (each replica allows up to
/// this much: a bound, not a quota), for at most [`Rate::CAPACITY`] callers.
pub struct Rate {
    per_minute: u32,
    seen: Mutex<HashMap<String, (Instant, u32)>>,
}

impl Rate {
    /// Callers remembered at most; past it, windows that ended are dropped, then all.
    pub const CAPACITY: usize = 10_000;
    const WINDOW: Duration = Duration::from_secs(60);

    /// `per_minute` binds per caller.
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one of `caller`'s binds at `now`; refused past its budget for the minute.
    pub fn take(&self, caller: &str, now: Instant) -> Result<(), Denied> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.len() >= Self::CAPACITY && !seen.contains_key(caller) {
            seen.retain(|_, (start, _)| now.duration_since(*start) < Self::WINDOW);
            if seen.len() >= Self::CAPACITY {
                seen.clear();
            }
        }
        let entry = seen.entry(caller.to_owned()).or_insert((now, 0));
        if now.duration_since(entry.0) >= Self::WINDOW {
            *entry = (now, 0);
        }
        if entry.1 >= self.per_minute {
            let wait = Self::WINDOW.saturating_sub(now.duration_since(entry.0));
            return Err(Denied::Throttled(format!(
                "{caller} made {} binds this minute; try again in {}s",
                self.per_minute,
                wait.as_secs().max(1)
            )));
        }
        entry.1 += 1;
        Ok(())
    }

    /// Callers remembered now.
    pub fn len(&self) -> usize {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Option<UserInfo> {
        Some(UserInfo {
            username: Some(name.into()),
            ..Default::default()
        })
    }

    #[test]
    fn only_an_authenticated_named_user_is_a_caller() {
        for (authenticated, who, ok) in [
            (Some(true), user("alice"), true),
            (Some(true), user(""), false),
            (Some(true), None, false),
            (Some(false), user("alice"), false),
            (None, user("alice"), false),
        ] {
            let got = caller(authenticated, who.clone());
            assert_eq!(got.is_ok(), ok, "{authenticated:?} {who:?}");
            if let Err(e) = got {
                assert!(matches!(e, Denied::Unauthenticated(_)));
            }
        }
    }

    #[test]
    fn each_caller_has_its_own_budget_per_minute() {
        let rate = Rate::new(3);
        let start = Instant::now();
        for _ in 0..3 {
            rate.take("alice", start).unwrap();
        }
        let refused = rate
            .take("alice", start + Duration::from_secs(20))
            .unwrap_err();
        assert!(
            refused.to_string().contains("try again in 40s"),
            "{refused}"
        );
        // Another caller is not slowed by alice.
        rate.take("bob", start).unwrap();
        // A minute later alice may bind again.
        rate.take("alice", start + Duration::from_secs(60)).unwrap();
    }

    #[test]
    fn the_callers_remembered_are_bounded() {
        let rate = Rate::new(1);
        let start = Instant::now();
        for i in 0..Rate::CAPACITY + 10 {
            rate.take(&i.to_string(), start).unwrap();
        }
        assert!(rate.len() <= Rate::CAPACITY);
        // A caller at its budget within a full map is still refused.
        let last = (Rate::CAPACITY + 9).to_string();
        assert!(rate.take(&last, start).is_err());
    }
}
