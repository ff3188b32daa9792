//! What the benchmarks read off the processes and API servers they run: a process's memory and
//! CPU from `/proc`, kbind's request counters, the writes an API server served, and the arithmetic
//! that turns two readings into a figure.

use std::collections::BTreeMap;

use kube::Client;

use crate::kbind::{apiserver_writes, counter_by};

/// A `/proc/<pid>/status` field given in kB (`"VmRSS:"`, `"VmHWM:"`), in MiB; 0 when unknown.
pub fn status_mib(pid: Option<u32>, field: &str) -> f64 {
    pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or_default()
}

/// Resident memory now, in MiB.
pub fn rss_mib(pid: Option<u32>) -> f64 {
    status_mib(pid, "VmRSS:")
}

/// Resident memory of the process's own (anonymous) pages, in MiB: its RSS without the pages of
/// its program file, which replicas of one program on one machine share.
pub fn anon_rss_mib(pid: Option<u32>) -> f64 {
    status_mib(pid, "RssAnon:")
}

/// The most resident memory the process has had, in MiB.
pub fn peak_rss_mib(pid: Option<u32>) -> f64 {
    status_mib(pid, "VmHWM:")
}

/// CPU time a process has used (user and system), in seconds.
pub fn cpu_seconds(pid: Option<u32>) -> f64 {
    let stat = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .unwrap_or_default();
    // Fields after the command (which is in parentheses and may hold spaces): state is the 3rd
    // field, utime and stime the 14th and 15th, in clock ticks (100 per second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i - 3)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_default()
    };
    (ticks(14) + ticks(15)) / 100.0
}

/// [`kbind_requests_by`] of the program whose `/metrics` is at `address` (empty when it does not
/// answer).
pub async fn kbind_requests_at(address: &str) -> BTreeMap<String, f64> {
    let text = crate::kbind::http_get(address, "/metrics")
        .await
        .map(|(_, t)| t)
        .unwrap_or_default();
    kbind_requests_by(&text)
}

/// `kbind_api_requests_total` in a program's `/metrics` text, by `"<cluster> <verb>"`.
pub fn kbind_requests_by(metrics: &str) -> BTreeMap<String, f64> {
    counter_by(metrics, "kbind_api_requests_total", &["cluster", "verb"])
        .into_iter()
        .map(|([cluster, verb], n)| (format!("{cluster} {verb}"), n))
        .collect()
}

/// What grew from `before` to `after`, by how much.
pub fn grown(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(key, n)| {
            let delta = n - before.get(key).copied().unwrap_or_default();
            (delta > 0.0).then(|| (key.clone(), delta))
        })
        .collect()
}

/// Per minute, what grew from `before` to `after` over `seconds`.
pub fn per_minute(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    seconds: u64,
) -> BTreeMap<String, f64> {
    grown(before, after)
        .into_iter()
        .map(|(key, delta)| (key, delta * 60.0 / seconds.max(1) as f64))
        .collect()
}

/// The writes to `example.org` objects (the synced ones) both API servers have served so far,
/// consumer first; empty where a server's `/metrics` cannot be read.
pub async fn object_writes(consumer: &Client, provider: &Client) -> [BTreeMap<String, u64>; 2] {
    let only = |w: BTreeMap<String, u64>| {
        w.into_iter()
            .filter(|(k, _)| k.contains("example.org/"))
            .collect()
    };
    [
        only(apiserver_writes(consumer).await.unwrap_or_default()),
        only(apiserver_writes(provider).await.unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    #[test]
    fn only_what_grew_counts_and_per_minute_scales_it() {
        let before = counts(&[("consumer get", 10.0), ("provider list", 4.0)]);
        let after = counts(&[
            ("consumer get", 16.0),
            ("provider list", 4.0),
            ("provider watch", 2.0),
        ]);
        assert_eq!(
            grown(&before, &after),
            counts(&[("consumer get", 6.0), ("provider watch", 2.0)])
        );
        assert_eq!(
            per_minute(&before, &after, 30),
            counts(&[("consumer get", 12.0), ("provider watch", 4.0)])
        );
        assert_eq!(
            per_minute(&before, &after, 0).len(),
            2,
            "no division by zero"
        );
    }

    #[test]
    fn this_process_has_memory_and_an_unknown_one_reads_zero() {
        let me = Some(std::process::id());
        // Read in this order, other test threads allocating meanwhile: the high-water mark, read
        // last, is at least any RSS read before it.
        let (rss, anon) = (rss_mib(me), anon_rss_mib(me));
        let peak = peak_rss_mib(me);
        assert!(rss > 0.0);
        assert!(peak >= rss, "peak {peak} < rss {rss}");
        assert!(anon > 0.0 && anon <= peak, "anon {anon}, peak {peak}");
        assert_eq!(rss_mib(None), 0.0);
        assert!(cpu_seconds(me) >= 0.0);
    }
}
