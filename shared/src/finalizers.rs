//! Adding and removing one finalizer on any object: a merge patch of the whole list guarded by
//! the resourceVersion it was computed from, so a concurrent change answers 409 and the caller
//! retries from fresh facts instead of dropping another controller's finalizer.

use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

/// Whether `meta` carries `finalizer`.
pub fn has(meta: &ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

/// The finalizer list with `finalizer` present (`present`) or absent; `None` when it already is.
pub fn toggled(meta: &ObjectMeta, finalizer: &str, present: bool) -> Option<Vec<String>> {
    if has(meta, finalizer) == present {
        return None;
    }
    let mut list: Vec<String> = meta
        .finalizers
        .iter()
        .flatten()
        .filter(|f| *f != finalizer)
        .cloned()
        .collect();
    if present {
        list.push(finalizer.to_owned());
    }
    Some(list)
}

/// The merge patch that sets `finalizers` on the object `meta` describes, guarded by its
/// resourceVersion.
pub fn patch(meta: &ObjectMeta, finalizers: &[String]) -> serde_json::Value {
    json!({ "metadata": { "finalizers": finalizers, "resourceVersion": meta.resource_version } })
}

/// Adds (`present`) or removes `finalizer` on `object` through `api` when needed. An object gone
/// meanwhile needs nothing. Returns whether it wrote.
pub async fn set<K>(
    api: &Api<K>,
    object: &K,
    finalizer: &str,
    present: bool,
) -> Result<bool, kube::Error>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let Some(list) = toggled(object.meta(), finalizer, present) else {
        return Ok(false);
    };
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch(object.meta(), &list)),
        )
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(finalizers: &[&str]) -> ObjectMeta {
        ObjectMeta {
            finalizers: Some(finalizers.iter().map(|f| (*f).to_owned()).collect()),
            resource_version: Some("7".into()),
            ..Default::default()
        }
    }

    #[test]
    fn toggled_changes_only_the_one_finalizer() {
        // (finalizers, present?) → new list, None when nothing changes
        type Case<'a> = (&'a [&'a str], bool, Option<&'a [&'a str]>);
        let cases: [Case; 5] = [
            (&[], true, Some(&["k"])),
            (&["a"], true, Some(&["a", "k"])),
            (&["a", "k"], true, None),
            (&["a", "k", "b"], false, Some(&["a", "b"])),
            (&["a"], false, None),
        ];
        for (have, present, want) in cases {
            let want = want.map(|w| w.iter().map(|f| (*f).to_owned()).collect::<Vec<_>>());
            assert_eq!(
                toggled(&meta(have), "k", present),
                want,
                "{have:?} {present}"
            );
        }
        assert_eq!(
            patch(&meta(&["a"]), &["a".into()]),
            json!({ "metadata": { "finalizers": ["a"], "resourceVersion": "7" } })
        );
    }
}
