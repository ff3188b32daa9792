//! A real browser for the tests: Debian's Chromium, headless, driven over WebDriver through
//! Debian's `chromedriver` — never a downloaded browser. `scripts/test` installs both packages
//! when it may (root with apt); without them a browser test fails and says what to install.

use std::path::PathBuf;

use crate::TestEnv;
use crate::cluster::free_port;

/// Debian's binaries.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium under WebDriver, stopped with the environment (its driver is one of the
/// environment's processes).
pub struct Browser {
    /// The WebDriver session.
    pub client: fantoccini::Client,
}

/// Starts `chromedriver` as one of `env`'s processes and a headless Chromium session through it
/// (its profile in the env's directory; certificates the test made itself accepted).
pub async fn start_browser(env: &mut TestEnv) -> Result<Browser, String> {
    for binary in [CHROMIUM, CHROMEDRIVER] {
        if !std::path::Path::new(binary).is_file() {
            return Err(format!(
                "{binary} is missing: install Debian's chromium and chromium-driver (scripts/test does, as root)"
            ));
        }
    }
    let port = free_port();
    env.start_process(
        "chromedriver",
        &PathBuf::from(CHROMEDRIVER),
        &[format!("--port={port}"), "--allowed-ips=127.0.0.1".into()],
        &[],
        false,
    )?;
    let url = format!("http://127.0.0.1:{port}");
    let profile = env.dir().join("chromium-profile");
    let capabilities: serde_json::Map<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,960", "--no-first-run", "--disable-extensions",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }))
        .map_err(|e| e.to_string())?;
    let started = std::time::Instant::now();
    loop {
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        match fantoccini::ClientBuilder::new(connector)
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => return Ok(Browser { client }),
            Err(e) if started.elapsed() > std::time::Duration::from_secs(30) => {
                return Err(format!("no WebDriver session from {url}: {e}"));
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(300)).await,
        }
    }
}
