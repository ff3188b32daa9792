//! Provider Events copied onto consumer objects (#39.2), for the bindings that ask
//! (`spec.providerEvents`: types, a reasons allowlist; default off).
//!
//! While a binding of the API asks, the worker watches the provider's Events about the API's
//! kind — everywhere for a ClusterBinding, else only in the asking Bindings' namespaces. An Event is copied when it regards a provider copy this worker syncs, marked as its
//! consumer object's (the copy's consumer-object UID), whose UID is the one the Event names (read
//! fresh), of a type and reason the object's binding wants, and the object is not paused. The
//! copy keeps the reason, names the Connection as its source, caps its message; it carries no
//! reference to any other provider object. Each provider Event is copied once — the consumer
//! Event's name derives from the provider Event's UID, so a restart never copies it twice — and a
//! chatty provider is rate-limited per object and per worker. Everything is counted in
//! `kbind_provider_events_total{api,result}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Event as ProviderEvent;
use k8s_openapi::api::events::v1::Event as ConsumerEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kbind_shared::api::ProviderEvents;
use kbind_shared::cache::Instance;
use kbind_shared::keys;
use kbind_shared::ownership::Owner;
use kbind_shared::rate::Bucket;
use kbind_shared::resolve::EventsScope;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use sha2::Digest;

use super::state::Worker;

/// Copies per consumer object: at most this many at once …
const OBJECT_BURST: f64 = 5.0;
/// … then one every this many seconds.
const OBJECT_REFILL_SECONDS: f64 = 10.0;
/// Copies per worker (all its objects): at most this many at once …
const WORKER_BURST: f64 = 50.0;
/// … then this many a second.
const WORKER_PER_SECOND: f64 = 10.0;
/// Provider Events remembered as copied (or refused) at most; past it the oldest are forgotten
/// (a forgotten one is still never copied twice: its consumer Event's name is taken).
const REMEMBERED: usize = 20_000;
/// The longest note (the API server's own limit for an Event's note, in bytes).
pub(super) const MAX_NOTE_BYTES: usize = 1024;
/// The longest reason and action (the API server's limit).
const MAX_WORD: usize = 128;

/// What becomes of a provider Event that a binding wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// Copy it.
    Copy,
    /// Already copied (or refused): the provider updated it, or the watch listed it again.
    Duplicate,
    /// Its object, or the worker, had too many copies lately: dropped.
    RateLimited,
}

/// Every `result` of `kbind_provider_events_total`: the [`Admit`] labels, and what else becomes
/// of a provider Event (its object paused, an Event older than the copy, a failed write, a
/// failed watch).
pub(super) const RESULTS: [&str; 7] = [
    "mirrored",
    "duplicate",
    "rate_limited",
    "paused",
    "stale",
    "error",
    "watch_error",
];

impl Admit {
    fn label(self) -> &'static str {
        match self {
            Admit::Copy => "mirrored",
            Admit::Duplicate => "duplicate",
            Admit::RateLimited => "rate_limited",
        }
    }
}

/// Which provider Events were copied, and how fast copies go: the pure half of the mirror.
#[derive(Debug)]
pub(super) struct Throttle {
    objects: HashMap<String, Bucket>,
    worker: Bucket,
    /// Provider Event UIDs seen, with when.
    seen: HashMap<String, Instant>,
}

impl Throttle {
    pub(super) fn new(now: Instant) -> Self {
        Throttle {
            objects: HashMap::new(),
            worker: Bucket::full(WORKER_BURST, now),
            seen: HashMap::new(),
        }
    }

    /// Whether to copy the provider Event `event_uid` onto the consumer object `object_uid` now.
    pub(super) fn admit(&mut self, now: Instant, object_uid: &str, event_uid: &str) -> Admit {
        if self.seen.contains_key(event_uid) {
            return Admit::Duplicate;
        }
        self.forget_some(now);
        self.seen.insert(event_uid.to_owned(), now);
        let object = self
            .objects
            .entry(object_uid.to_owned())
            .or_insert_with(|| Bucket::full(OBJECT_BURST, now));
        // The object's token first: a chatty object never uses up the worker's.
        if !object.take(now, OBJECT_BURST, 1.0 / OBJECT_REFILL_SECONDS) {
            return Admit::RateLimited;
        }
        if !self.worker.take(now, WORKER_BURST, WORKER_PER_SECOND) {
            return Admit::RateLimited;
        }
        Admit::Copy
    }

    /// Bounds what is remembered: past [`REMEMBERED`] Events, the older half goes; objects whose
    /// bucket has refilled are forgotten (a new bucket is full too).
    fn forget_some(&mut self, now: Instant) {
        if self.seen.len() >= REMEMBERED {
            let mut times: Vec<Instant> = self.seen.values().copied().collect();
            times.sort_unstable();
            let cut = times[times.len() / 2];
            self.seen.retain(|_, at| *at > cut);
        }
        if self.objects.len() >= REMEMBERED {
            let refilled = Duration::from_secs_f64(OBJECT_BURST * OBJECT_REFILL_SECONDS);
            self.objects
                .retain(|_, b| now.saturating_duration_since(b.last_used()) < refilled);
        }
    }
}

/// The consumer's copy of a provider Event, before it is addressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Copied {
    pub(super) type_: String,
    pub(super) reason: String,
    pub(super) action: String,
    pub(super) note: String,
}

/// The copy of `event` when `wanted` asks for its type and reason: the reason kept, the note
/// saying it comes from the provider of `connection` and who there reported it, capped at
/// [`MAX_NOTE_BYTES`], control characters and URL credentials removed. Events about Secrets are
/// never copied.
pub(super) fn copy_of(
    event: &ProviderEvent,
    wanted: &ProviderEvents,
    connection: &str,
) -> Option<Copied> {
    let type_ = event.type_.as_deref().unwrap_or("Normal");
    let reason = event.reason.as_deref().unwrap_or_default();
    if reason.is_empty() || !wanted.wants(type_, reason) {
        return None;
    }
    let regarding = &event.involved_object;
    if regarding.kind.as_deref() == Some("Secret") {
        return None;
    }
    let reporter = event
        .reporting_component
        .as_deref()
        .filter(|c| !c.is_empty())
        .or_else(|| event.source.as_ref().and_then(|s| s.component.as_deref()))
        .unwrap_or("the provider");
    let message = kbind_shared::redact::remote(event.message.as_deref().unwrap_or_default());
    let note = format!(
        "from the provider of Connection {connection} ({}): {message}",
        kbind_shared::redact::remote(reporter)
    );
    Some(Copied {
        type_: type_.to_owned(),
        reason: cut_bytes(&kbind_shared::redact::remote(reason), MAX_WORD),
        action: cut_bytes(
            &kbind_shared::redact::remote(event.action.as_deref().unwrap_or("ProviderEvent")),
            MAX_WORD,
        ),
        note: cut_bytes(&note, MAX_NOTE_BYTES),
    })
}

/// `text` cut to at most `max` bytes on a character boundary (with `…` when cut).
fn cut_bytes(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let ellipsis = '…'.len_utf8();
    let mut end = max.saturating_sub(ellipsis);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// The consumer Event's name for the copy of the provider Event `event_uid` about `object`: the
/// same every time, so that a second copy is refused as existing.
pub(super) fn event_name(object: &str, event_uid: &str) -> String {
    let digest = sha2::Sha256::digest(event_uid.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let prefix: String = object.chars().take(200).collect();
    format!("{prefix}.kbind-{hex}")
}

/// Runs while the worker runs: watches the provider's Events where a binding of the API asks
/// for them — cluster-wide for a ClusterBinding, else in each asking Binding's namespace only —
/// and copies what [`copy_of`] and the [`Throttle`] let through. The watches follow the bindings.
pub(super) async fn mirror(worker: Arc<Worker>) {
    // A burst of binding changes (a namespace user's flood of Bindings) is one look at the scope.
    let api = worker.spec.api.clone();
    let mut bindings = worker
        .ctx
        .binding_changes()
        .filter(move |touched| std::future::ready(touched.concerns_api(&api)))
        .ready_chunks(1024)
        .boxed();
    let mut throttle = Throttle::new(Instant::now());
    let scope = || {
        let scope = worker
            .ctx
            .provider_events_scope(&worker.spec.connection, &worker.spec.api);
        in_boundary(&worker, scope)
    };
    // In a boundary "everywhere" is where the consumer's objects are: looked at again now and then.
    let mut recheck = tokio::time::interval(Duration::from_secs(5));
    loop {
        let watching = scope();
        let Some(mut events) = watch(&worker, &watching) else {
            if bindings.next().await.is_none() {
                return futures::future::pending().await;
            }
            continue;
        };
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(event)) => handle(&worker, &mut throttle, &event).await,
                    Some(Err(e)) => {
                        worker.count_events("watch_error");
                        tracing::debug!(api = %worker.spec.api, error = %e, "provider Events watch");
                    }
                    None => break,
                },
                change = bindings.next() => {
                    if change.is_none() {
                        return futures::future::pending().await;
                    }
                    if scope() != watching {
                        break;
                    }
                }
                _ = recheck.tick(), if worker.spec.namespaces.boundary().is_some() => {
                    if scope() != watching {
                        break;
                    }
                }
            }
        }
    }
}

/// `scope` as the worker's credential can watch it: in a boundary (#51) the credential reads only
/// the boundary's namespaces, so "everywhere" is every namespace the consumer has objects of the
/// API in.
fn in_boundary(worker: &Worker, scope: EventsScope) -> EventsScope {
    match scope {
        EventsScope::Everywhere if worker.spec.namespaces.boundary().is_some() => {
            EventsScope::Namespaces(
                worker
                    .consumer_objects
                    .state()
                    .iter()
                    .filter_map(|o| o.metadata.namespace.clone())
                    .collect(),
            )
        }
        scope => scope,
    }
}

/// The provider's Events about the API's kind in `scope` (consumer namespaces, mapped into the
/// boundary), as one stream; `None` for nowhere.
fn watch(
    worker: &Worker,
    scope: &EventsScope,
) -> Option<futures::stream::BoxStream<'static, Result<ProviderEvent, watcher::Error>>> {
    let config = watcher::Config::default().fields(&format!(
        "involvedObject.kind={}",
        worker.spec.resource.kind
    ));
    let of = |api: Api<ProviderEvent>| {
        watcher(api, config.clone())
            .default_backoff()
            .applied_objects()
            .boxed()
    };
    match scope {
        EventsScope::Nowhere => None,
        EventsScope::Everywhere => Some(of(Api::all(worker.provider.clone()))),
        EventsScope::Namespaces(namespaces) => Some(
            futures::stream::select_all(
                namespaces
                    .iter()
                    .filter_map(|ns| worker.spec.namespaces.provider(ns).ok())
                    .map(|ns| of(Api::namespaced(worker.provider.clone(), &ns))),
            )
            .boxed(),
        ),
    }
}

/// One provider Event: copied when everything in the module's description holds.
async fn handle(worker: &Worker, throttle: &mut Throttle, event: &ProviderEvent) {
    let regarding = &event.involved_object;
    let (Some(name), Some(regarding_uid), Some(event_uid)) = (
        regarding.name.as_deref(),
        regarding.uid.as_deref(),
        event.metadata.uid.as_deref(),
    ) else {
        return;
    };
    // The provider's namespace, as the consumer names it (in a boundary: only its own).
    let namespace = match regarding.namespace.as_deref().filter(|n| !n.is_empty()) {
        Some(provider) => match worker.spec.namespaces.consumer(provider) {
            Some(consumer) => Some(consumer),
            None => return,
        },
        None => None,
    };
    let mut reference = ObjectRef::<Instance>::new_with(name, worker.dyntype.clone());
    if let Some(namespace) = namespace {
        reference = reference.within(namespace);
    }
    // Only objects this worker syncs, whose provider copy is theirs.
    let Some(object) = worker.consumer_objects.get(&reference) else {
        return;
    };
    let object_uid = object.uid().unwrap_or_default();
    let Some(copy) = worker.provider_copy(&object) else {
        return;
    };
    if copy.owner(&object_uid) != Owner::Ours {
        return;
    }
    let Some(resolution) = worker
        .ctx
        .resolve(&worker.spec.connection, &worker.spec.api, namespace)
        .filter(|r| r.is_bound())
    else {
        return;
    };
    let Some(wanted) = &resolution.provider_events else {
        return;
    };
    let Some(copied) = copy_of(event, wanted, &worker.spec.connection) else {
        return;
    };
    let paused = resolution.suspended
        || object
            .annotations()
            .get(keys::PAUSED_ANNOTATION)
            .map(String::as_str)
            == Some(keys::TRUE);
    if paused {
        worker.count_events("paused");
        return;
    }
    let admitted = throttle.admit(Instant::now(), &object_uid, event_uid);
    if admitted != Admit::Copy {
        worker.count_events(admitted.label());
        return;
    }
    // The Event must be about the copy that exists now, not an earlier one of the same name.
    if !about_current_copy(worker, namespace, name, regarding_uid).await || worker.fence().is_err()
    {
        return;
    }
    let consumer_event = consumer_event(
        worker,
        &object,
        namespace,
        event_name(name, event_uid),
        copied,
    );
    publish(worker, namespace, &consumer_event).await;
}

/// The consumer's Event `name` about `object` (in `namespace`), copied from the provider's.
fn consumer_event(
    worker: &Worker,
    object: &Instance,
    namespace: Option<&str>,
    name: String,
    copied: Copied,
) -> ConsumerEvent {
    ConsumerEvent {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.unwrap_or("default").to_owned()),
            ..Default::default()
        },
        event_time: Some(MicroTime(jiff::Timestamp::now())),
        type_: Some(copied.type_),
        reason: Some(copied.reason),
        action: Some(copied.action),
        note: Some(copied.note),
        reporting_controller: Some(keys::EVENT_COMPONENT.into()),
        reporting_instance: Some(format!("connection/{}", worker.spec.connection))
            .map(|i| cut_bytes(&i, MAX_WORD)),
        regarding: Some(object.object_ref(&worker.dyntype)),
        ..Default::default()
    }
}

/// Whether the provider copy `namespace/name` that exists now has the UID an Event regards (a
/// fresh read), counting why not.
async fn about_current_copy(
    worker: &Worker,
    namespace: Option<&str>,
    name: &str,
    regarding_uid: &str,
) -> bool {
    let api = match worker.provider_api(namespace) {
        Ok(api) => api,
        Err(_) => return false,
    };
    match api.get_opt(name).await {
        Ok(Some(current)) if current.uid().as_deref() == Some(regarding_uid) => true,
        Ok(_) => {
            worker.count_events("stale");
            false
        }
        Err(e) => {
            worker.count_events("error");
            tracing::debug!(api = %worker.spec.api, error = %e, "read the provider copy an Event regards");
            false
        }
    }
}

/// Creates the copied Event on the consumer (in `default` for a cluster-scoped object); one
/// created already under its name is a duplicate.
async fn publish(worker: &Worker, namespace: Option<&str>, event: &ConsumerEvent) {
    let api =
        Api::<ConsumerEvent>::namespaced(worker.ctx.client.clone(), namespace.unwrap_or("default"));
    match api.create(&PostParams::default(), event).await {
        Ok(_) => worker.count_events(Admit::Copy.label()),
        Err(kube::Error::Api(s)) if s.code == 409 => worker.count_events("duplicate"),
        Err(e) => {
            worker.count_events("error");
            tracing::debug!(api = %worker.spec.api, error = %e, "copy a provider Event");
        }
    }
}

impl Worker {
    fn count_events(&self, result: &str) {
        self.ctx
            .metrics
            .provider_events_total
            .with_label_values(&[self.spec.api.as_str(), result])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kbind_shared::api::ProviderEventType;
    use serde_json::json;

    #[test]
    fn every_admission_is_a_known_result() {
        for admit in [Admit::Copy, Admit::Duplicate, Admit::RateLimited] {
            assert!(RESULTS.contains(&admit.label()), "{admit:?}");
        }
    }

    #[test]
    fn each_provider_event_is_copied_once_and_a_chatty_object_is_slowed() {
        let start = Instant::now();
        let mut t = Throttle::new(start);
        assert_eq!(t.admit(start, "o1", "e1"), Admit::Copy);
        assert_eq!(
            t.admit(start, "o1", "e1"),
            Admit::Duplicate,
            "the same Event again"
        );
        // A burst of five per object, then one every ten seconds.
        for i in 2..=5 {
            assert_eq!(t.admit(start, "o1", &format!("e{i}")), Admit::Copy);
        }
        assert_eq!(t.admit(start, "o1", "e6"), Admit::RateLimited);
        assert_eq!(
            t.admit(start, "o1", "e6"),
            Admit::Duplicate,
            "a dropped Event stays dropped"
        );
        // Another object is not slowed by o1.
        assert_eq!(t.admit(start, "o2", "f1"), Admit::Copy);
        let later = start + Duration::from_secs(10);
        assert_eq!(t.admit(later, "o1", "e7"), Admit::Copy);
        assert_eq!(t.admit(later, "o1", "e8"), Admit::RateLimited);
    }

    #[test]
    fn many_objects_share_the_workers_budget() {
        let start = Instant::now();
        let mut t = Throttle::new(start);
        let copied = (0..200)
            .filter(|i| t.admit(start, &format!("o{i}"), &format!("e{i}")) == Admit::Copy)
            .count();
        assert_eq!(copied, WORKER_BURST as usize);
        let second = start + Duration::from_secs(1);
        let more = (200..300)
            .filter(|i| t.admit(second, &format!("o{i}"), &format!("e{i}")) == Admit::Copy)
            .count();
        assert_eq!(more, WORKER_PER_SECOND as usize);
    }

    #[test]
    fn what_is_remembered_is_bounded() {
        let start = Instant::now();
        let mut t = Throttle::new(start);
        for i in 0..(REMEMBERED + 10) {
            let at = start + Duration::from_millis(i as u64);
            t.admit(at, &format!("o{i}"), &format!("e{i}"));
        }
        assert!(t.seen.len() <= REMEMBERED, "{}", t.seen.len());
        assert!(t.objects.len() <= REMEMBERED + 10);
    }

    fn event(type_: &str, reason: &str, kind: &str, message: &str) -> ProviderEvent {
        serde_json::from_value(json!({
            "metadata": { "name": "w1.1", "namespace": "team-a", "uid": "e-1" },
            "involvedObject": { "kind": kind, "name": "w1", "namespace": "team-a", "uid": "p-1" },
            "related": { "kind": "Secret", "name": "db-password" },
            "type": type_,
            "reason": reason,
            "action": "Provision",
            "reportingComponent": "db-operator",
            "message": message,
        }))
        .unwrap()
    }

    #[test]
    fn only_wanted_types_and_reasons_are_copied_with_a_bounded_note_naming_the_connection() {
        let warnings = ProviderEvents {
            types: vec![ProviderEventType::Warning],
            reasons: Vec::new(),
        };
        let allowlist = ProviderEvents {
            types: vec![ProviderEventType::Warning, ProviderEventType::Normal],
            reasons: vec!["QuotaExceeded".into()],
        };
        let copied = copy_of(
            &event("Warning", "QuotaExceeded", "Widget", "no room\nleft"),
            &warnings,
            "east",
        )
        .unwrap();
        assert_eq!(
            copied,
            Copied {
                type_: "Warning".into(),
                reason: "QuotaExceeded".into(),
                action: "Provision".into(),
                note: "from the provider of Connection east (db-operator): no room left".into(),
            }
        );
        for (e, wanted, copy) in [
            (event("Normal", "Created", "Widget", "x"), &warnings, false),
            (
                event("Normal", "QuotaExceeded", "Widget", "x"),
                &allowlist,
                true,
            ),
            (event("Warning", "Other", "Widget", "x"), &allowlist, false),
            (
                event("Warning", "QuotaExceeded", "Secret", "x"),
                &warnings,
                false,
            ),
            (event("Warning", "", "Widget", "x"), &warnings, false),
        ] {
            assert_eq!(copy_of(&e, wanted, "east").is_some(), copy, "{e:?}");
        }
        let huge = copy_of(
            &event("Warning", &"R".repeat(300), "Widget", &"é".repeat(5000)),
            &warnings,
            "east",
        )
        .unwrap();
        assert!(huge.note.len() <= MAX_NOTE_BYTES, "{}", huge.note.len());
        assert!(huge.note.ends_with('…'));
        assert!(huge.reason.len() <= MAX_WORD);
        let credentials = copy_of(
            &event(
                "Warning",
                "Failed",
                "Widget",
                "GET https://admin:hunter2@db.example/ failed",
            ),
            &warnings,
            "east",
        )
        .unwrap();
        assert!(
            !credentials.note.contains("hunter2"),
            "{}",
            credentials.note
        );
    }

    #[test]
    fn a_copys_name_is_stable_and_valid() {
        let a = event_name("w1", "e-1");
        assert_eq!(a, event_name("w1", "e-1"));
        assert_ne!(a, event_name("w1", "e-2"));
        assert!(
            a.starts_with("w1.kbind-") && a.len() == "w1.kbind-".len() + 16,
            "{a}"
        );
        assert!(event_name(&"a".repeat(253), "e").len() <= 253);
    }
}
