//! `kubectl kbind login --gateway <url>`: logs the command line in through the gateway's
//! OpenID Connect login. The browser logs in at the identity provider; the gateway hands the
//! session to this command — redirecting the browser to a one-shot listener on loopback, or
//! (`--paste`, where no browser runs beside the command) showing a code to paste — and the
//! command redeems it with a verifier only it holds (its S256 challenge started the login), so a
//! code that leaks is worth nothing. The session is kept in `sessions.json` of kbind's
//! configuration directory (`KBIND_CONFIG_DIR`, else `$XDG_CONFIG_HOME/kbind`, else
//! `~/.config/kbind`), readable by its owner only; `catalog` and `bind` use it when no token is
//! given.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::gateway::{Gateway, refused};

/// How long the browser may take to come back.
const WAIT: Duration = Duration::from_secs(300);

/// A kept session.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Kept {
    pub session: String,
    pub csrf_token: String,
    pub username: String,
    pub expires_at: String,
}

/// kbind's configuration directory.
fn config_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("KBIND_CONFIG_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(dir).join("kbind"));
    }
    std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".config/kbind"))
        .ok_or_else(|| "no HOME: set KBIND_CONFIG_DIR".into())
}

fn sessions_file() -> Result<PathBuf, String> {
    Ok(config_dir()?.join("sessions.json"))
}

/// The kept sessions, by gateway URL.
pub fn sessions() -> BTreeMap<String, Kept> {
    sessions_file()
        .ok()
        .and_then(|path| std::fs::read(path).ok())
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// The kept session for `gateway`, unless it ended.
pub fn session_for(gateway: &str) -> Option<Kept> {
    let kept = sessions().remove(gateway.trim_end_matches('/'))?;
    let ends: jiff::Timestamp = kept.expires_at.parse().ok()?;
    (ends > jiff::Timestamp::now()).then_some(kept)
}

fn keep(gateway: &str, kept: Kept) -> Result<PathBuf, String> {
    let path = sessions_file()?;
    let mut all = sessions();
    all.insert(gateway.trim_end_matches('/').to_owned(), kept);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_vec_pretty(&all).map_err(|e| e.to_string())?;
    write_private(&path, &text)?;
    Ok(path)
}

#[cfg(unix)]
fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    file.write_all(bytes)
        .map_err(|e| format!("write {}: {e}", path.display()))
}

#[cfg(not(unix))]
fn write_private(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(path, bytes).map_err(|e| format!("write {}: {e}", path.display()))
}

/// A fresh verifier (256 random bits, base64url) and its S256 challenge.
pub fn verifier() -> Result<(String, String), String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| format!("no randomness: {e}"))?;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let verifier = b64.encode(bytes);
    let challenge = b64.encode(sha2::Sha256::digest(verifier.as_bytes()));
    Ok((verifier, challenge))
}

/// The `code` of a loopback callback's request line (`GET /callback?code=… HTTP/1.1`).
pub fn callback_code(request_line: &str) -> Option<String> {
    let mut parts = request_line.split_whitespace();
    let (Some("GET"), Some(target)) = (parts.next(), parts.next()) else {
        return None;
    };
    let query = target.strip_prefix("/callback?")?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "code")
        .map(|(_, v)| v.into_owned())
        .filter(|c| !c.is_empty() && c.len() <= 128)
}

/// Waits for the browser's one request to `/callback` on `listener` and answers it.
async fn wait_for_browser(listener: tokio::net::TcpListener) -> Result<String, String> {
    loop {
        let (mut stream, _) = listener
            .accept()
            .await
            .map_err(|e| format!("the loopback listener: {e}"))?;
        let mut buffer = vec![0u8; 8192];
        let mut read = 0;
        while read < buffer.len() {
            let n = stream.read(&mut buffer[read..]).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            read += n;
            if buffer[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buffer[..read]).into_owned();
        let code = head.lines().next().and_then(callback_code);
        let (status, page) = match &code {
            Some(_) => (
                "200 OK",
                "Logged in to kbind. You can close this tab and go back to the command line.",
            ),
            None => ("404 Not Found", "Not the login's callback."),
        };
        let page = format!(
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kbind login</title></head><body><main><p>{page}</p></main></body></html>"
        );
        let _ = stream
            .write_all(
                format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nCache-Control: no-store\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                    page.len()
                )
                .as_bytes(),
            )
            .await;
        if let Some(code) = code {
            return Ok(code);
        }
    }
}

/// Logs in at `gateway`: prints the URL to open (and opens it unless `open` is off), takes the
/// handed-over code (loopback, or pasted), redeems it, and keeps the session. Returns the
/// username and where the session is kept.
pub async fn login(
    gateway: &Gateway,
    paste: bool,
    open: bool,
) -> Result<(String, PathBuf), String> {
    let (verifier, challenge) = verifier()?;
    let code = if paste {
        let url = format!("{}/login?cli=paste&challenge={challenge}", gateway.url());
        eprintln!(
            "Open this URL in a browser and log in:\n\n    {url}\n\nthen paste the code it shows here:"
        );
        let read = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).map(|_| line)
        });
        let line = tokio::time::timeout(WAIT, read)
            .await
            .map_err(|_| "no code was pasted within 5 minutes".to_owned())?
            .map_err(|e| format!("read the code: {e}"))?
            .map_err(|e| format!("read the code: {e}"))?;
        line.trim().to_owned()
    } else {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|e| format!("cannot listen on loopback for the browser: {e}"))?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let url = format!("{}/login?cli={port}&challenge={challenge}", gateway.url());
        eprintln!("Log in in your browser:\n\n    {url}\n");
        if open {
            // Best effort: where no browser opens, the URL above is there to copy.
            let _ = std::process::Command::new("xdg-open")
                .arg(&url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn();
        }
        tokio::time::timeout(WAIT, wait_for_browser(listener))
            .await
            .map_err(|_| "the browser did not come back within 5 minutes".to_owned())??
    };
    let answer = gateway
        .call(
            "POST",
            "/api/session/handoff",
            "application/json",
            Some(&json!({ "code": code, "verifier": verifier })),
        )
        .await?;
    if answer.code != 200 {
        return Err(refused(&answer));
    }
    let kept: Kept = serde_json::from_str(&answer.body)
        .map_err(|e| format!("the gateway's session answer: {e}"))?;
    let username = kept.username.clone();
    let path = keep(gateway.url(), kept)?;
    Ok((username, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callback_yields_its_code_and_nothing_else_does() {
        for (line, code) in [
            ("GET /callback?code=abc HTTP/1.1", Some("abc")),
            ("GET /callback?x=1&code=a%2Bb HTTP/1.1", Some("a+b")),
            ("GET /favicon.ico HTTP/1.1", None),
            ("POST /callback?code=abc HTTP/1.1", None),
            ("GET /callback?code= HTTP/1.1", None),
            ("", None),
        ] {
            assert_eq!(callback_code(line).as_deref(), code, "{line}");
        }
    }

    #[test]
    fn a_verifier_is_fresh_and_its_challenge_is_s256() {
        let (v1, c1) = verifier().unwrap();
        let (v2, _) = verifier().unwrap();
        assert_ne!(v1, v2);
        assert_eq!(v1.len(), 43);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        assert_eq!(c1, b64.encode(sha2::Sha256::digest(v1.as_bytes())));
    }
}
